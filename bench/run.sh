#!/usr/bin/env bash
# run.sh -- every benchmark, ratios against baselines of the same run, then bench/summary.py's
# table of issue 11's targets built from the RESULT lines the benchmarks printed, written to
# bench/RESULTS.md too (a full run only).
#
#   BUILD=build PY=/usr/bin/python3 bash bench/run.sh [--quick] [--runs N] [--c-runs N]
#                                     [--threads N] [--no-tls] [--results FILE]
#
#   --runs N     turns (default 3): each turn runs the C rows, then the Python rows, fresh
#                daemons each; every benchmark measures tensordd and its baseline in the
#                same turn (peers.py's training rows in alternating blocks), so a load that
#                comes and goes weighs on both; the summary gives each row's min / median /
#                max over the turns and flags a row whose spread is wider than its margin
#   --c-runs N   the C rows (bench/alloc, latency, ops, transfer, memfd) in the first N turns
#                only (default: every turn)
#   --results F  the markdown table's file (default bench/RESULTS.md; - for none)
#   --threads N  intra-op threads of the daemon that runs the Python rows (training, Python
#                client, PyTorch RPC comparisons) and of local PyTorch and PyTorch RPC's
#                server: the same on every side (default 1)
#   --quick      tiny repetitions, one run, no TLS rows: checks that every row is printed
#                (make bench-smoke), its figures mean nothing
#   --no-tls     leave out bench/tls.sh (TLS next to plaintext; no issue 11 row)
# Every daemon and server binds 127.0.0.1 (or a Unix socket) and is stopped before the end.
# Exit status: non-zero when a benchmark failed or a row of the summary is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
PY=${PY:-/usr/bin/python3}
runs=3 c_runs= threads=1 quick=0 tls=1 results=bench/RESULTS.md
while [ $# -gt 0 ]; do
    case "$1" in
    --runs) runs=$2; shift ;;
    --c-runs) c_runs=$2; shift ;;
    --threads) threads=$2; shift ;;
    --quick) quick=1 runs=1 c_runs=1 tls=0 results=- ;;
    --results) results=$2; shift ;;
    --no-tls) tls=0 ;;
    *)
        echo "usage: bench/run.sh [--quick] [--runs N] [--c-runs N] [--threads N] [--no-tls]" \
            "[--results FILE]" >&2
        exit 2
        ;;
    esac
    shift
done
c_runs=${c_runs:-$runs}
export PYTHONPATH="client/python:$BUILD/python${PYTHONPATH:+:$PYTHONPATH}"
log=$(mktemp) out=$(mktemp) fair=$(mktemp)
pid=
stop_daemon() {
    if [ -n "$pid" ]; then
        kill -TERM "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
        pid=
    fi
}
trap 'stop_daemon; rm -f "$log" "$out" "$fair"' EXIT

# start_daemon ARGS...: a daemon on a free loopback port; sets pid and ep.
start_daemon() {
    : >"$out"
    "$BUILD/tensordd" --listen tcp://127.0.0.1:0 --log-level warn "$@" >"$out" &
    pid=$!
    for _ in $(seq 200); do grep -q "listening on" "$out" && break; sleep 0.05; done
    ep=$(sed -n 's/^listening on //p' "$out" | head -1)
    if [ -z "$ep" ]; then
        echo "bench: $BUILD/tensordd did not start" >&2
        exit 1
    fi
}

failed=0
# bench NAME CMD...: one benchmark, bounded in time (its whole process group), its failure
# reported and remembered, not fatal: the summary then shows its rows as missing.
bench() {
    local name=$1 rc=0 t0=$SECONDS
    shift
    timeout -k 10 "${BENCH_TIMEOUT:-600}" "$@" || rc=$?
    if [ "$rc" != 0 ]; then
        echo "bench: $name failed (exit $rc)"
        failed=1
    fi
    echo "($name: $((SECONDS - t0)) s)"
    echo
}

have_torch=1
"$PY" -c 'import torch' 2>/dev/null || have_torch=0
q() { [ "$quick" = 1 ] && echo "$1" || echo "$2"; } # the quick value or the full one
qflag=()
[ "$quick" = 0 ] || qflag=(--quick)

c_suite() {
    # the C rows: one daemon with every core (local OpenBLAS uses them all too)
    start_daemon
    echo "daemon:  $ep (pid $pid), all cores"
    echo
    bench alloc "$BUILD/bench/alloc" "$ep" "$pid" --reps "$(q 1 9)"
    bench latency "$BUILD/bench/latency" "$ep" "${qflag[@]}"
    bench ops "$BUILD/bench/ops" "$ep" "${qflag[@]}"
    bench transfer "$BUILD/bench/transfer" "$ep" "$pid" "$(q 8 64)" --reps "$(q 1 5)"
    stop_daemon
    # same-host transfers: its own daemon (tcp:// and unix://)
    bench memfd "$BUILD/bench/memfd" "$BUILD/tensordd" "$(q 64 1024)" --reps "$(q 1 3)"
}

py_suite() {
    # the Python rows: a daemon with as many threads as local PyTorch gets
    start_daemon --threads "$threads"
    echo "daemon:  $ep (pid $pid), --threads $threads"
    echo
    bench py_client "$PY" bench/py_client.py "$ep" "$(q 1 3)"
    if [ "$have_torch" = 1 ]; then
        bench train_step "$PY" bench/train_step.py "$ep" "$pid"
        bench peers "$PY" bench/peers.py "$ep" --pid "$pid" --threads "$threads" "${qflag[@]}"
        bench conv_step "$PY" bench/conv_step.py "$ep" "$pid" --steps "$(q 5 50)" --blocks "$(q 1 5)"
        # the torch device: client cost per aten op; ResNet-18 and transformer steps / local
        bench torch_device "$PY" bench/torch_device.py "$ep" "$(q 1 3)" "${qflag[@]}"
        bench torch_models "$PY" bench/torch_models.py "$ep" --threads "$threads" "${qflag[@]}"
    fi
    stop_daemon
    # its own daemons, one queue per device against the default lanes
    bench fairness "$PY" bench/fairness.py "$BUILD" --reps "$(q 20 200)" --size "$(q 512 2048)" |
        tee "$fair"
    # a version of it that prints no RESULT lines: its "lanes 4" row (the default daemon) is
    # "lanes 4 <alone p50> <alone p99> <loaded p50> <loaded p99> ..." in us
    grep -q '^RESULT fairness\.' "$fair" || awk '$1 == "lanes" && $2 == "4" {
        printf "RESULT fairness.alone_p99_ms %.4f -\nRESULT fairness.p50_ms %.4f -\n", $4 / 1e3, $5 / 1e3
        printf "RESULT fairness.p99_ms %.4f <=2\n", $6 / 1e3 }' "$fair"
}

{
    trap stop_daemon EXIT # this group is a subshell of its own (the pipe into tee)
    echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(uname -sr)"
    echo "cpu:     $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)"
    # BENCH_COMMIT: the commit of a copy of the tree run outside git (a snapshot of it)
    echo "commit:  ${BENCH_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo -)$(git diff --quiet HEAD 2>/dev/null || echo ' (with uncommitted changes)')}"
    echo "command: bench/run.sh --runs $runs --c-runs $c_runs --threads $threads$(q ' --quick' '')"
    if [ "$have_torch" = 0 ]; then
        echo "torch is not installed ($PY -c 'import torch' fails): the PyTorch rows are skipped"
        for r in 'train.*' 'rpc.*' 'torch.*' alloc.faults.mlp_adam alloc.faults.mlp_sgd alloc.faults.big_mlp \
            alloc.faults.conv alloc.faults.replay; do
            echo "SKIP $r torch is not installed"
        done
    fi
    for run in $(seq "$runs"); do
        if [ "$run" -le "$c_runs" ]; then
            echo
            echo "== C rows, turn $run of $runs, $(date -u +%H:%M:%S) UTC, load average $(cut -d' ' -f1-3 /proc/loadavg)"
            echo
            c_suite
        fi
        echo
        echo "== Python rows, turn $run of $runs, $(date -u +%H:%M:%S) UTC, load average $(cut -d' ' -f1-3 /proc/loadavg)"
        echo
        py_suite
    done
    echo "== end $(date -u +%H:%M:%S) UTC, load average $(cut -d' ' -f1-3 /proc/loadavg)"
} 2>&1 | tee "$log" || failed=1
# the group's failures come back through the log
grep -q '^bench: .* failed' "$log" && failed=1

if [ "$tls" = 1 ]; then
    # TLS next to plaintext, its own daemon; no issue 11 row, so not in the summary
    echo
    BUILD="$BUILD" timeout -k 10 "${BENCH_TIMEOUT:-600}" bash bench/tls.sh 64 | grep -v '^RESULT ' ||
        { echo "bench: tls failed"; failed=1; }
fi
echo
rc=0
if [ "$results" != - ]; then
    "$PY" bench/summary.py --markdown "$results" "$log" || rc=$?
    echo "bench: table written to $results"
else
    "$PY" bench/summary.py "$log" || rc=$?
fi
[ "$failed" = 0 ] || echo "bench: a benchmark failed (above)"
[ "$failed" = 0 ] && exit "$rc"
exit 1
