#!/usr/bin/env bash
# run.sh -- the GPU suites on a real GPU (a few minutes on one H200): the normal nvcc build,
# then the same suites `make test-emu` runs on the emulator (tests/gpu/suites.sh: the
# conformance table on cuda:0 held to ref, the pytest op, gradient and double-backward
# checks on cuda:0 against PyTorch, the grad_replace mismatch matrix with GPU devices (cuda:1 cases need a
# second GPU), sessions interleaving on cuda:0 each on a CUDA stream of its own, a memfd
# upload to cuda:0 (one copy from the mapping), the ResNet and
# small-transformer steps on cuda:0 held to torch's, process groups on cuda:0 across 2 and 3
# daemons (all-reduce, broadcast, all-gather staged through host memory over Gloo; NCCL is
# probed, not used), and the
# digits training on cuda:0
# held to 95% test accuracy), then
# bench/gpu_check.sh (every op the cuda backend claims vs ref:0, remote sgemm vs cuBLAS,
# remote add vs cudaMemcpy). The emulator-only fault injections are skipped here.
#
#   bash tests/gpu/run.sh            BUILD=build/gpu by default; JOBS=$(nproc)
#
# Not runnable on a machine without a GPU: it says so and exits 2.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build/gpu}
JOBS=${JOBS:-$(nproc)}
PY=${PY:-/usr/bin/python3}

if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "gpu: no GPU here (nvidia-smi -L failed); run make test-emu for the emulated suites" >&2
    exit 2
fi
nvidia-smi -L
make --no-print-directory -j"$JOBS" BUILD="$BUILD" "$BUILD/tensordd" "$BUILD/tdctl" \
    "$BUILD/tests/gpu_conformance" "$BUILD/python/tensordd/tensordd_pb2.py"
start=$(date +%s)
BUILD=$BUILD PY=$PY TDD_GPU_ARGS="" bash tests/gpu/suites.sh
BUILD=$BUILD bash bench/gpu_check.sh --quick
echo "gpu: suites and benchmarks in $(($(date +%s) - start)) s"
