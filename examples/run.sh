#!/usr/bin/env bash
# run.sh -- `make run`: start a daemon on a free loopback port, drive a real
# session over the wire with the Python examples, stop the daemon.
#
#   BUILD  build directory holding tensordd (default: build)
#   PY     the Python interpreter (default: /usr/bin/python3)
#
# Exits non-zero if the daemon fails to start, an example fails, or the
# daemon does not exit 0 on SIGTERM. A trap kills the daemon on any exit.
set -euo pipefail

BUILD=${BUILD:-build}
PY=${PY:-/usr/bin/python3}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DAEMON="$BUILD/tensordd"
[[ "$DAEMON" = /* ]] || DAEMON="$ROOT/$DAEMON"

if [[ ! -x "$DAEMON" ]]; then
    echo "run: $DAEMON not built (make BUILD=$BUILD)" >&2
    exit 1
fi

workdir=$(mktemp -d "${TMPDIR:-/tmp}/tensordd-run.XXXXXX")
pid=""
cleanup() {
    if [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null; then
        kill -KILL "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    fi
    rm -rf "$workdir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Port 0: the daemon picks a free port and prints the one it got.
"$DAEMON" --listen tcp://127.0.0.1:0 --cpu-devices 2 >"$workdir/out" 2>"$workdir/err" &
pid=$!

endpoint=""
for _ in $(seq 1 200); do  # up to 20 s
    endpoint=$(sed -n 's/.*listening on \(tcp:\/\/[^ ]*\).*/\1/p' "$workdir/out" | head -n1)
    [[ -n "$endpoint" ]] && break
    if ! kill -0 "$pid" 2>/dev/null; then
        echo "run: the daemon exited before listening:" >&2
        cat "$workdir/err" >&2
        exit 1
    fi
    sleep 0.1
done
if [[ -z "$endpoint" ]]; then
    echo "run: the daemon did not print 'listening on' within 20 s" >&2
    cat "$workdir/err" >&2
    exit 1
fi
echo "run: tensordd listening on $endpoint (pid $pid)"

status=0
# The C client first: a small fixed session through libtensordd.
SESSION="$BUILD/examples/session"
[[ "$SESSION" = /* ]] || SESSION="$ROOT/$SESSION"
if [[ -x "$SESSION" ]]; then
    echo "run: examples/session.c (libtensordd)"
    if ! "$SESSION" "$endpoint"; then
        echo "run: examples/session failed" >&2
        status=1
    fi
fi
# the package, and the tensordd_pb2 that make generated into the build directory
PYGEN_DIR="$BUILD/python"
[[ "$PYGEN_DIR" = /* ]] || PYGEN_DIR="$ROOT/$PYGEN_DIR"
export PYTHONPATH="$ROOT/client/python:$PYGEN_DIR${PYTHONPATH:+:$PYTHONPATH}"
for script in quickstart.py grad_replace.py train_digits.py train_torchstyle.py; do
    [[ $status -eq 0 ]] || break
    [[ -f "$ROOT/examples/$script" ]] || continue
    echo "run: examples/$script"
    if ! "$PY" "$ROOT/examples/$script" "$endpoint"; then
        echo "run: examples/$script failed" >&2
        status=1
        break
    fi
done

kill -TERM "$pid"
daemon_rc=0
wait "$pid" || daemon_rc=$?
pid=""
if [[ $daemon_rc -ne 0 ]]; then
    echo "run: the daemon exited with $daemon_rc on SIGTERM" >&2
    tail -n 20 "$workdir/err" >&2
    status=1
fi
exit $status
