#!/usr/bin/env bash
# run.sh -- the run kit for a machine with a GPU and no network, for the few minutes it is
# lent: each step below under its own time limit (8 minutes in all), its result appended to
# one file (RESULTS, $BUILD/gpu-run.txt by default), and a summary at the end. A missing
# driver, CUDA runtime, cuBLAS or torch fails its step loudly: nothing is skipped.
#
#   bash tests/gpu/run.sh             BUILD=build/gpu by default; JOBS=$(nproc)
#   bash tests/gpu/run.sh --dry-run   the steps and their time limits; runs nothing
#   bash tests/gpu/run.sh --emu       the same steps on the emulated build (build/emu): the
#                                     driver, runtime and cuBLAS steps check the emulator's,
#                                     memcheck and racecheck are its race mode (TDD_EMU_CHECK),
#                                     every limit times TIME_SCALE (default 15 there: kernels
#                                     run on the CPU)
#   bash tests/gpu/run.sh --keep-going   run every step even after one fails
#
# Steps (tests/gpu/suites.sh runs the suites themselves, as make test-emu does):
#   driver       nvidia-smi lists a GPU
#   runtime      libcudart loads and cudaGetDeviceCount finds a device
#   cublas       libcublas loads and cublasCreate succeeds on it
#   torch        $PY imports torch (the op checks compare with it)
#   build        the nvcc build: the daemon, tdctl, the conformance runner
#   conformance  the conformance table on cuda:0 held to ref
#   pytest       the cuda pytest files (ops, gradients, streams, value checks read at the
#                next sync, fused optimizer steps, f16/bf16 GemmEx and TF32, ResNet,
#                transformer, groups)
#   digits       digits training on cuda:0, held to 95% test accuracy
#   memcheck     compute-sanitizer --tool memcheck on a subset of the conformance table
#   racecheck    compute-sanitizer --tool racecheck on the same subset
#   bench        bench/gpu_check.sh --quick (every claimed op vs ref, sgemm vs cuBLAS)
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
PY=${PY:-/usr/bin/python3}
JOBS=${JOBS:-$(nproc)}
dry=0
emu=0
keep=0
for a in "$@"; do
    case $a in
    --dry-run) dry=1 ;;
    --emu) emu=1 ;;
    --keep-going) keep=1 ;;
    *)
        echo "usage: tests/gpu/run.sh [--dry-run] [--emu] [--keep-going]" >&2
        exit 2
        ;;
    esac
done
if [ $emu = 1 ]; then
    TIME_SCALE=${TIME_SCALE:-15}
    BUILD=${BUILD:-build/emu}
    export TDD_GPU_ARGS="--emu-gpus 2 --emu-gpu-memory 256M"
else
    TIME_SCALE=${TIME_SCALE:-1}
    BUILD=${BUILD:-build/gpu}
    export TDD_GPU_ARGS=""
fi
RESULTS=${RESULTS:-$BUILD/gpu-run.txt}
# The sanitizers' subset: kernels with shared memory, warp operations and atomics.
SAN_OPS="sum softmax log_softmax cumsum var argmax logsumexp scatter_add embedding_bag layer_norm"

# name, time limit (s), what it checks; 480 s in all
STEPS=(
    "driver 10 nvidia-smi lists a GPU"
    "runtime 10 libcudart loads; cudaGetDeviceCount finds a device"
    "cublas 10 libcublas loads; cublasCreate succeeds"
    "torch 20 $PY imports torch"
    "build 120 the nvcc build (daemon, tdctl, conformance runner)"
    "conformance 40 the conformance table on cuda:0 held to ref"
    "pytest 130 the cuda pytest files against PyTorch"
    "digits 40 digits training on cuda:0 to 95% test accuracy"
    "memcheck 30 compute-sanitizer memcheck: $SAN_OPS"
    "racecheck 30 compute-sanitizer racecheck: $SAN_OPS"
    "bench 40 bench/gpu_check.sh --quick"
)

if [ $dry = 1 ]; then
    total=0
    printf '%-12s %6s  %s\n' step limit what
    for s in "${STEPS[@]}"; do
        read -r name t what <<<"$s"
        printf '%-12s %5ss  %s\n' "$name" "$t" "$what"
        total=$((total + t))
    done
    printf '%-12s %5ss  (results in %s)\n' total "$total" "$RESULTS"
    [ "$TIME_SCALE" != 1 ] && echo "(each limit times $TIME_SCALE on this build)"
    exit 0
fi

# The runtime and cuBLAS themselves through ctypes (no build of ours needed).
probe() { # what: runtime | cublas
    "$PY" - "$1" <<'PY'
import ctypes, ctypes.util, sys
def load(names):
    for n in names:
        try:
            return ctypes.CDLL(n)
        except OSError:
            pass
    sys.exit(f"cannot load any of {names}")
rt = load(["libcudart.so", "libcudart.so.13", "libcudart.so.12", "/usr/local/cuda/lib64/libcudart.so"])
n = ctypes.c_int(0)
e = rt.cudaGetDeviceCount(ctypes.byref(n))
if e != 0 or n.value < 1:
    sys.exit(f"cudaGetDeviceCount: error {e}, {n.value} devices")
print(f"CUDA runtime: {n.value} device(s)")
if sys.argv[1] == "cublas":
    cb = load(["libcublas.so", "libcublas.so.13", "libcublas.so.12", "/usr/local/cuda/lib64/libcublas.so"])
    h = ctypes.c_void_p()
    s = cb.cublasCreate_v2(ctypes.byref(h))
    if s != 0:
        sys.exit(f"cublasCreate: status {s}")
    cb.cublasDestroy_v2(h)
    print("cuBLAS: handle created")
PY
}

step_driver() {
    if [ $emu = 1 ]; then
        echo "emulated build: no driver; the emulator's self-test instead"
        "$BUILD/tests/emu_selftest" 2>/dev/null
        return
    fi
    nvidia-smi -L && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
}
step_runtime() {
    if [ $emu = 1 ]; then # the emulated runtime: the conformance runner finds cuda:0
        TDD_EMU_GPUS=1 "$BUILD/tests/gpu_conformance" full | tail -n 1
        return
    fi
    probe runtime
}
step_cublas() {
    if [ $emu = 1 ]; then # the emulated cuBLAS: a GEMM on cuda:0
        TDD_EMU_GPUS=1 "$BUILD/tests/gpu_conformance" matmul | tail -n 1
        return
    fi
    probe cublas
}
step_torch() {
    "$PY" -c 'import torch; print("torch", torch.__version__, "cuda" if torch.cuda.is_available() else "cpu only")'
}
step_build() {
    if [ $emu = 1 ]; then
        make --no-print-directory -j"$JOBS" emu
    else
        make --no-print-directory -j"$JOBS" BUILD="$BUILD" "$BUILD/tensordd" "$BUILD/tdctl" \
            "$BUILD/tests/gpu_conformance" "$BUILD/python/tensordd/tensordd_pb2.py" || return 1
        # shellcheck disable=SC2016 # make's $($*), not the shell's
        if [ "$(make -s --no-print-directory BUILD="$BUILD" --eval 'print-%: ; @echo $($*)' print-HAVE_CUDA)" != 1 ]; then
            echo "the build has no CUDA backend (no nvcc or CUDA runtime found)"
            return 1
        fi
    fi
}
step_conformance() { BUILD=$BUILD PY=$PY bash tests/gpu/suites.sh conformance; }
step_pytest() { BUILD=$BUILD PY=$PY bash tests/gpu/suites.sh pytest; }
step_digits() { BUILD=$BUILD PY=$PY bash tests/gpu/suites.sh digits; }
sanitize() { # tool
    # shellcheck disable=SC2086 # SAN_OPS is a list of ops
    if [ $emu = 1 ]; then # the emulator's checks: exact bounds always, races in race mode
        TDD_EMU_CHECK=1 TDD_EMU_SEED=$([ "$1" = racecheck ] && echo 5 || echo 4) \
            TDD_EMU_GPUS=1 "$BUILD/tests/gpu_conformance" $SAN_OPS | tail -n 1
        return
    fi
    local cs=compute-sanitizer
    command -v $cs >/dev/null || cs=/usr/local/cuda/bin/compute-sanitizer
    # shellcheck disable=SC2086
    "$cs" --tool "$1" --error-exitcode 3 "$BUILD/tests/gpu_conformance" $SAN_OPS | tail -n 20
}
step_memcheck() { sanitize memcheck; }
step_racecheck() { sanitize racecheck; }
step_bench() {
    if [ $emu = 1 ]; then
        echo "emulated build: no GPU to time; bench/gpu_check.sh runs on the GPU machine only"
        bash -n bench/gpu_check.sh
        return
    fi
    BUILD=$BUILD bash bench/gpu_check.sh --quick
}

mkdir -p "$(dirname "$RESULTS")"
{
    echo "# tests/gpu/run.sh $* -- $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname)"
    echo "# git $(git rev-parse --short HEAD 2>/dev/null || echo '?'), BUILD=$BUILD"
} >"$RESULTS"
start=$(date +%s)
failed=0
summary=()
for s in "${STEPS[@]}"; do
    read -r name t _ <<<"$s"
    t=$((t * TIME_SCALE))
    if [ $failed -gt 0 ] && [ $keep = 0 ]; then
        summary+=("$(printf '%-12s %-7s' "$name" "not run")")
        continue
    fi
    t0=$(date +%s)
    echo "gpu: $name (up to ${t}s)"
    log=$(mktemp)
    # The step in a subshell of its own under the limit; SIGKILL 5 s after SIGTERM.
    export -f "step_$name" probe sanitize 2>/dev/null
    BUILD=$BUILD PY=$PY JOBS=$JOBS emu=$emu SAN_OPS=$SAN_OPS \
        timeout -k 5 "$t" bash -c "set -o pipefail; step_$name" >"$log" 2>&1
    rc=$?
    dt=$(($(date +%s) - t0))
    verdict=pass
    [ $rc -ne 0 ] && verdict=FAIL
    [ $rc -eq 124 ] || [ $rc -eq 137 ] && verdict=TIMEOUT
    [ $verdict != pass ] && failed=$((failed + 1))
    {
        echo "## $name: $verdict in ${dt}s (limit ${t}s, exit $rc)"
        tail -n 60 "$log"
    } >>"$RESULTS"
    [ $verdict != pass ] && tail -n 20 "$log"
    rm -f "$log"
    summary+=("$(printf '%-12s %-7s %4ss of %ss' "$name" "$verdict" "$dt" "$t")")
done
{
    echo "## summary: $failed failing, $(($(date +%s) - start))s in all"
    printf '%s\n' "${summary[@]}"
} | tee -a "$RESULTS"
echo "gpu: results in $RESULTS"
[ $failed -eq 0 ]
