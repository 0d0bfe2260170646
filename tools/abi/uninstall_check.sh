#!/usr/bin/env bash
# uninstall_check.sh prepare|verify STAGE -- around `make install` then `make uninstall`
# into the staging directory STAGE: `prepare` puts files there that are not ours (a
# program beside ours, another Python package, another man page); `verify` fails unless
# exactly those are left (plus what test-install built there itself), so uninstall
# removes everything install put down and nothing else.
set -euo pipefail

mode=$1
STAGE=$2
PREFIX=${PREFIX:-/usr/local}
PY=${PY:-/usr/bin/python3}
PYDIR=$PREFIX/lib/$($PY -c 'import sys; print("python%d.%d" % sys.version_info[:2])')/dist-packages
ours=(
    "$PREFIX/bin/not-tensordd"
    "$PREFIX/lib/libnot-tensordd.so.0"
    "$PREFIX/include/not_tensordd.h"
    "$PREFIX/share/man/man1/not-tensordd.1"
    "$PYDIR/not_tensordd/__init__.py"
)

case $mode in
prepare)
    for f in "${ours[@]}"; do
        mkdir -p "$(dirname "$STAGE$f")"
        echo "not installed by tensordd" >"$STAGE$f"
    done
    ;;
verify)
    for f in "${ours[@]}"; do
        [[ -f $STAGE$f ]] || { echo "uninstall: removed $f, which make install did not install" >&2; exit 1; }
    done
    # what test-install itself built in the stage (the session client) is not installed
    left=$(cd "$STAGE" && find . ! -type d ! -name session | sed 's|^\.||' | sort)
    want=$(printf '%s\n' "${ours[@]}" | sort)
    if [[ $left != "$want" ]]; then
        echo "uninstall: make uninstall left behind:" >&2
        comm -23 <(echo "$left") <(echo "$want") >&2
        exit 1
    fi
    echo "uninstall: removed everything make install put down, and nothing else"
    ;;
*)
    echo "usage: uninstall_check.sh prepare|verify STAGE" >&2
    exit 2
    ;;
esac
