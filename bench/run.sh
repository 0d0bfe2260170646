#!/usr/bin/env bash
# run.sh -- every benchmark against one fresh daemon; ratios against baselines of the same run.
set -euo pipefail
BUILD=${BUILD:-build}
out=$(mktemp)
"$BUILD/tensordd" --listen tcp://127.0.0.1:0 --log-level warn >"$out" &
pid=$!
trap 'kill "$pid" 2>/dev/null || true; rm -f "$out"' EXIT
for _ in $(seq 200); do grep -q "listening on" "$out" && break; sleep 0.05; done
ep=$(sed -n 's/^listening on //p' "$out" | head -1)
echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(uname -sr)"
echo "daemon:  $ep (pid $pid)"
echo
for b in "$BUILD"/bench/*; do
    case "$(basename "$b")" in
    transfer) "$b" "$ep" "$pid" 64 --reps 5 ;;
    alloc) "$b" "$ep" "$pid" ;;
    memfd) "$b" "$BUILD/tensordd" 1024 --reps 3 ;; # its own daemon (tcp:// and unix://)
    *) "$b" "$ep" ;;
    esac
    echo
done
PYTHONPATH="client/python:$BUILD/python" "${PY:-/usr/bin/python3}" bench/train_step.py "$ep" "$pid"
echo
PYTHONPATH="client/python:$BUILD/python" "${PY:-/usr/bin/python3}" bench/peers.py "$ep"
echo
kill -TERM "$pid"
wait "$pid"
echo
# its own daemons, one queue per device against the default lanes
PYTHONPATH="client/python:$BUILD/python" "${PY:-/usr/bin/python3}" bench/fairness.py "$BUILD"
echo
# TLS next to plaintext, its own daemon (certificates made and thrown away by the script)
BUILD="$BUILD" bash bench/tls.sh 64
