#!/usr/bin/env bash
# check_layers.sh -- calls only go down: fails when a daemon object calls a function
# defined in a daemon file of a higher layer (tools/layers.txt, highest first).
#   tools/check_layers.sh OBJDIR   (OBJDIR holds daemon/*.o, e.g. build/obj)
set -euo pipefail
objdir=${1:-build/obj}
here=$(cd "$(dirname "$0")" && pwd)
layers=$here/layers.txt
root=$(cd "$here/.." && pwd)

declare -A rank name_of
r=0
while read -r lname files; do
    [[ -z $lname || $lname == \#* ]] && continue
    r=$((r + 1))
    for f in $files; do
        rank[$f]=$r
        name_of[$f]=$lname
    done
done <"$layers"

status=0
# Every daemon source must have a layer, and its object must be built.
for src in "$root"/daemon/*.c; do
    f=$(basename "$src")
    if [[ -z ${rank[$f]:-} ]]; then
        echo "check-layers: daemon/$f has no layer in tools/layers.txt" >&2
        status=1
    elif [[ ! -f $objdir/daemon/${f%.c}.o ]]; then
        echo "check-layers: $objdir/daemon/${f%.c}.o not built (make the daemon first)" >&2
        exit 2
    fi
done
[[ $status == 0 ]] || exit 1

# Which file defines each global function or object.
declare -A def
for f in "${!rank[@]}"; do
    o=$objdir/daemon/${f%.c}.o
    [[ -f $o ]] || continue
    while read -r sym; do def[$sym]=$f; done < <(nm -g --defined-only "$o" | awk '{print $3}')
done

n=0
for f in "${!rank[@]}"; do
    o=$objdir/daemon/${f%.c}.o
    [[ -f $o ]] || continue
    while read -r sym; do
        g=${def[$sym]:-}
        [[ -z $g || $g == "$f" ]] && continue
        if ((rank[$g] < rank[$f])); then
            echo "check-layers: daemon/$f (${name_of[$f]}) calls $sym, defined in daemon/$g" \
                "(${name_of[$g]}, a higher layer)" >&2
            n=$((n + 1))
        fi
    done < <(nm -u "$o" | awk '{print $2}')
done
if ((n)); then
    echo "check-layers: $n upward reference(s); layers are in tools/layers.txt" >&2
    exit 1
fi
echo "check-layers: ${#rank[@]} daemon files in $r layers, every call goes down"
