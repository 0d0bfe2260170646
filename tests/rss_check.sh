#!/usr/bin/env bash
# rss_check.sh -- a 256 MiB f32 upload and download through a real daemon must be
# bit-exact, and the daemon's peak RSS must stay under 1.3x the tensor above idle.
set -euo pipefail
BUILD=${BUILD:-build}
out=$(mktemp)
"$BUILD/tensordd" --listen tcp://127.0.0.1:0 --log-level warn >"$out" &
pid=$!
trap 'kill "$pid" 2>/dev/null || true; rm -f "$out"' EXIT
for _ in $(seq 200); do grep -q "listening on" "$out" && break; sleep 0.05; done
ep=$(sed -n 's/^listening on //p' "$out" | head -1)
[ -n "$ep" ] || { echo "rss_check: daemon did not start" >&2; exit 1; }
"$BUILD/bench/transfer" "$ep" "$pid" 256 --check --reps 1
kill -TERM "$pid"
wait "$pid"
