#!/bin/sh
# cuda_probe.sh NVCC CUDA_HOME CACHE_DIR NVCC_FLAGS... -- can this toolkit build the cuda backend?
#
# Prints "ok", or one line saying why not. The Makefile builds the cuda backend only on
# "ok": a machine whose nvcc is present but cannot compile for our architectures, or whose
# runtime library will not link, then builds (and says it builds) the CPU-only daemon
# instead of failing. Our own kernels are not probed: once the toolkit works, a kernel that
# does not compile is our bug and fails the build. A success is cached per build
# directory and nvcc binary, so the probe's few seconds are spent once.
nvcc=$1
home=$2
dir=$3
shift 3
cache="$dir/cuda-probe.txt"
key="$nvcc $home $*"
if [ -f "$cache" ] && [ "$cache" -nt "$nvcc" ] && [ "$(sed -n 1p "$cache")" = "$key" ]; then
    sed -n 2p "$cache"
    exit 0
fi
# The line of a compiler's output that says what went wrong.
first_error() { printf '%s\n' "$1" | grep -m1 -iE 'error|fatal' || printf '%s\n' "$1" | head -n1; }
mkdir -p "$dir/cuda-probe" || exit 0
work="$dir/cuda-probe"
cat >"$work/probe.cu" <<'EOF'
__global__ void probe_kernel(float *x) { x[threadIdx.x] += 1.0f; }
extern "C" int probe_launch(float *x)
{
    probe_kernel<<<1, 32>>>(x);
    return (int)cudaGetLastError();
}
EOF
cat >"$work/main.c" <<'EOF'
#include <cuda_runtime_api.h>
int probe_launch(float *x);
int main(void)
{
    int n = 0;
    (void)cudaGetDeviceCount(&n);
    return n < 0 ? probe_launch(0) : 0;
}
EOF
if ! out=$("$nvcc" "$@" -Xcompiler -fPIC -c "$work/probe.cu" -o "$work/probe.o" 2>&1); then
    why="nvcc at $nvcc cannot compile a kernel: $(first_error "$out")"
elif ! out=$(${CC:-cc} -I"$home/include" "$work/main.c" "$work/probe.o" -L"$home/lib64" \
    -lcudart_static -ldl -lrt -lpthread -lstdc++ -o "$work/probe" 2>&1); then
    why="the CUDA runtime in $home/lib64 does not link: $(first_error "$out")"
else
    why=ok
fi
# Only a success is remembered: a failure may be a compiler that `make deps` has yet to install.
[ "$why" = ok ] && printf '%s\n%s\n' "$key" "$why" >"$cache"
echo "$why"
