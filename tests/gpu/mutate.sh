#!/usr/bin/env bash
# mutate.sh -- shows that the emulated suites catch kernel bugs (the mutation check).
#
# Breaks a copy of backends/cuda/kernels.cu in three ways (and a fourth), builds the emulated conformance
# runner from each copy (build/emu-mutant; the tree is never touched), runs the reduction
# and row-op cases on cuda:0 and expects failures:
#   sync     block_reduce without the __syncthreads between writing the warps' partials
#            and warp 0 reading them
#   stride   reduce_block's block-strided loop steps blockDim.x + 1 (an off-by-one)
#   shuffle  warp_reduce's butterfly exchanges with lane ^ (s >> 1) instead of lane ^ s
#            (lane ^ (s + 1) would not do: 17, 9, 5, 3, 2 still span the 32 lanes, so that
#            "mutant" sums correctly)
#   oob      (a fourth) fill_kernel stores to y[i + 1]: the last thread writes past the
#            buffer, which the guard page after every emulated allocation turns into
#            cudaErrorIllegalAddress (and y[0] keeps the NaN poison of fresh memory)
# and three a plain run of the emulator could not see before its memory checks:
#   atomic   scatter_add's f32 atomicAdd is a plain +=: race mode (TDD_EMU_CHECK=1) reports
#            two threads' unordered read and write of one output element
#   bf16rz   every f32 -> bf16 store truncates (__float2bfloat16_rz) instead of rounding to
#            nearest even: the casts to bf16 are held bit-exact to ref
#   linspace linspace's loop runs to i <= n: the f32 store one past the end lands in the
#            16-byte slack of the allocation, which the exact-size bounds check faults
# Exit 0 when every mutant fails the suite, 1 when one survives.
set -uo pipefail
cd "$(dirname "$0")/../.."
tmp=build/emu-mutant/src # a fixed path: the build's dependency files name it
mkdir -p "$tmp"
rm -f build/emu-mutant/obj/backends/cuda/kernels.emu.[od]
OPS="sum mean prod amax amin var std logsumexp argmax argmin softmax log_softmax cumsum"
survivors=0
CHECK= # set: the mutant's run is in race mode

mutate() { # name, old text, new text[, all: every occurrence]
    /usr/bin/python3 - "$tmp/kernels.cu" "$2" "$3" "${4:-}" <<'PY' || exit 1
import sys
path, old, new = sys.argv[1], sys.argv[2].replace("\\n", "\n"), sys.argv[3].replace("\\n", "\n")
src = open("backends/cuda/kernels.cu").read()
if src.count(old) < 1 or (src.count(old) > 1 and sys.argv[4] != "all"):
    sys.exit(f"mutate.sh: the text to break occurs {src.count(old)} times in kernels.cu")
open(path, "w").write(src.replace(old, new))
PY
    echo "== mutant '$1': $(diff <(cat backends/cuda/kernels.cu) "$tmp/kernels.cu" | grep '^[<>]' | tr -s ' ' | tr '\n' ' ')"
    make --no-print-directory emu EMU_BUILD=build/emu-mutant EMU_KERNELS="$tmp/kernels.cu" \
        >"$tmp/build.log" 2>&1 || { cat "$tmp/build.log"; exit 1; }
    env TDD_EMU_GPUS=1 ${CHECK:+TDD_EMU_CHECK=1} build/emu-mutant/tests/gpu_conformance $OPS \
        >"$tmp/out" 2>&1
    local rc=$?
    grep -m 1 'faulted' "$tmp/out"
    grep -m 3 'FAIL' "$tmp/out"
    tail -n 1 "$tmp/out"
    if [ $rc -eq 0 ]; then
        echo "== mutant '$1' SURVIVED"
        survivors=$((survivors + 1))
    else
        echo "== mutant '$1' killed: $(grep -c '^FAIL' "$tmp/out") failing cases"
    fi
}

mutate sync '        sh[warp] = v;\n    __syncthreads();\n' '        sh[warp] = v;\n'
mutate stride 'for (int64_t r = lo + threadIdx.x; r < hi; r += blockDim.x)' \
    'for (int64_t r = lo + threadIdx.x; r < hi; r += blockDim.x + 1)'
mutate shuffle 'v = r_comb(comb, v, __shfl_xor_sync(0xffffffffu, v, s));' \
    'v = r_comb(comb, v, __shfl_xor_sync(0xffffffffu, v, s >> 1));'
OPS="zeros ones full eye pad"
mutate oob '        y[i] = v;\n}' '        y[i + 1] = v;\n}'
OPS="scatter_add"
CHECK=1 mutate atomic 'atomicAdd((float *)yp + yo, ((const float *)sp)[so]);' \
    '((float *)yp)[yo] += ((const float *)sp)[so];'
CHECK=
OPS="cast add mul"
mutate bf16rz '__float2bfloat16_rn(' '__float2bfloat16_rz(' all
OPS="linspace"
mutate linspace 'for (int64_t i = gtid(); i < n; i += gstride())\n        y[i] =\n' \
    'for (int64_t i = gtid(); i <= n; i += gstride())\n        y[i] =\n'
[ $survivors -eq 0 ]
