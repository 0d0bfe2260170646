#!/usr/bin/env bash
# gpu_check.sh -- for a machine with a GPU (a few minutes on an H200): builds with CUDA, starts
# the daemon, runs bench/gpu_check.c (cuda:0 vs ref:0 for every op the cuda backend claims;
# remote sgemm 4096^2 vs direct cuBLAS; remote add vs cudaMemcpy D2D) and prints ratios.
#
#   bash bench/gpu_check.sh [--quick]        BUILD=build/gpu by default
#
# Compiles gpu_check.c with the Makefile's own flags (read back from make, not copied here).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build/gpu}
JOBS=${JOBS:-$(nproc)}

make --no-print-directory -j"$JOBS" BUILD="$BUILD" "$BUILD/tensordd" "$BUILD/libtensordd.a"

mkvar() { make -s --no-print-directory BUILD="$BUILD" --eval 'print-%: ; @echo $($*)' "print-$1"; }
if [ "$(mkvar HAVE_CUDA)" != 1 ]; then
    echo "gpu_check: the Makefile found no nvcc; nothing to check" >&2
    exit 2
fi
# The daemon opens cuBLAS at run time; this check calls it directly as its baseline.
# shellcheck disable=SC2046
$(mkvar CC) $(mkvar CPPFLAGS) $(mkvar CUDA_CPPFLAGS) $(mkvar CFLAGS) bench/gpu_check.c \
    "$BUILD/libtensordd.a" $(pkg-config --libs libprotobuf-c) -lssl -lcrypto $(mkvar CUDA_LIBS) -lcublas -lm -pthread \
    -o "$BUILD/gpu_check"

if [ "${GPU_CHECK_BUILD_ONLY:-0}" = 1 ]; then
    echo "gpu_check: built $BUILD/gpu_check (not run)"
    exit 0
fi

log=$(mktemp)
"$BUILD/tensordd" --listen tcp://127.0.0.1:0 >"$log" 2>&1 &
pid=$!
trap 'kill -TERM $pid 2>/dev/null; wait $pid 2>/dev/null; rm -f "$log"' EXIT
endpoint=
for _ in $(seq 100); do
    endpoint=$(sed -n 's/^listening on \(tcp:\/\/.*\)$/\1/p' "$log" | head -1)
    [ -n "$endpoint" ] && break
    kill -0 $pid 2>/dev/null || break
    sleep 0.1
done
if [ -z "$endpoint" ]; then
    echo "gpu_check: the daemon did not start:" >&2
    cat "$log" >&2
    exit 2
fi
grep -iE "cuda|device" "$log" || true
rc=0
"$BUILD/gpu_check" "$endpoint" "$@" || rc=$?
echo "--- daemon log (errors/warnings)"
grep -iE "error|warn|cuda" "$log" | tail -20 || true
exit $rc
