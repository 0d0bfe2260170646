"""GEMMs on cuda:0 through cublasGemmEx: float16 and bfloat16 matmul, bmm and linear take
their operands as they are and sum in float32 (no widening copies), equal to PyTorch's on
the CPU computed in float32 and rounded once (within one unit in the last place where the
float32 sums' order differs); --cuda-tf32 makes float32 GEMMs TF32 (inputs rounded to 10
mantissa bits, as torch.backends.cuda.matmul.allow_tf32), off by default.

Runs only when TDD_GPU_ARGS is set (see gpusuite.py). On the emulated build the emulator's
cuBLAS computes GemmEx in float32 and its profile names the calls."""

from __future__ import annotations

import numpy as np
import pytest

import tensordd
from gpusuite import (GPU_ARGS, only_with_gpu, profile_kernels, profile_size,
                      start_profiled_gpu_daemon, profiled_fixtures)

pytestmark = only_with_gpu
EMU = GPU_ARGS is not None and "--emu-gpus" in GPU_ARGS
torch = pytest.importorskip("torch")

DTYPES = {"float16": (torch.float16, 10), "bfloat16": (torch.bfloat16, 7)}


daemon, s = profiled_fixtures("gemm")


def within_one_ulp(ours, want, bits):
    """Every element within one unit in the last place of want (bits mantissa bits), and
    nearly all equal: only where the float32 sums' order tips a rounding."""
    ours, want = ours.astype(np.float64), want.astype(np.float64)
    ulp = np.exp2(np.floor(np.log2(np.maximum(np.abs(want), 2.0 ** -14))) - bits)
    assert np.all(np.abs(ours - want) <= ulp), np.max(np.abs(ours - want) / ulp)
    assert np.mean(ours == want) >= 0.97, np.mean(ours == want)


CASES = [
    ("matmul", [(37, 64), (64, 29)], {}),
    ("matmul", [(3, 17, 40), (40, 9)], {}),  # broadcast batch: strided-batched
    ("bmm", [(4, 13, 33), (4, 33, 21)], {}),
    ("linear", [(19, 48), (23, 48), (23,)], {}),  # y = x W^T + b: the bias summed in f32
]


@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("op,shapes,kw", CASES, ids=[c[0] + str(i) for i, c in enumerate(CASES)])
def test_half_gemm_sums_in_float32_and_rounds_once(daemon, s, dtype, op, shapes, kw):
    tdt, bits = DTYPES[dtype]
    rng = np.random.default_rng(len(shapes) + sum(map(len, shapes)))
    ts = [torch.from_numpy(rng.standard_normal(sh).astype(np.float32)).to(tdt) for sh in shapes]
    ins = [s.tensor(t.float().numpy(), device="cuda:0").to(dtype=dtype) for t in ts]
    s.tensor(np.zeros(1, np.float32), device="cuda:0").numpy()  # the casts in have run
    at = profile_size(daemon)
    y = s.op(op, *ins, **kw)
    got = y.to(dtype="float32").numpy()
    f = [t.float() for t in ts]
    want32 = {"matmul": lambda: torch.matmul(f[0], f[1]),
              "bmm": lambda: torch.bmm(f[0], f[1]),
              "linear": lambda: torch.nn.functional.linear(*f)}[op]()
    want = want32.to(tdt).float().numpy()
    assert y.dtype == dtype
    within_one_ulp(got, want, bits)
    if EMU:  # one GemmEx, no widening or narrowing copies: the one cast is the test's own
        names = profile_kernels(daemon, at)
        assert [k for k in names if k.startswith("cublas")] == ["cublasGemmEx"], names
        assert sum("cast" in k for k in names) == 1, names


def tf32(x):
    """float32 -> TF32 as the tensor cores round: 10 mantissa bits, ties away from zero."""
    b = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    b = ((b + 0x1000) & 0xFFFFE000).astype(np.uint32)
    return b.view(np.float32)


def f32_gemm(s):
    rng = np.random.default_rng(5)
    a = rng.standard_normal((33, 70)).astype(np.float32)
    b = rng.standard_normal((70, 18)).astype(np.float32)
    got = (s.tensor(a, device="cuda:0") @ s.tensor(b, device="cuda:0")).numpy()
    full = a.astype(np.float64) @ b.astype(np.float64)
    rounded = tf32(a).astype(np.float64) @ tf32(b).astype(np.float64)
    return got, full, rounded


def test_float32_gemms_are_full_float32_by_default(s):
    got, full, rounded = f32_gemm(s)
    np.testing.assert_allclose(got, full, rtol=1e-5, atol=1e-5)
    assert np.max(np.abs(rounded - full)) > 1e-3  # (TF32 would be told apart)


def test_cuda_tf32_makes_float32_gemms_tf32(tmp_path):
    d = start_profiled_gpu_daemon(tmp_path, "--cuda-tf32")
    try:
        with tensordd.connect(d.endpoint, timeout=120) as s:
            got, full, rounded = f32_gemm(s)
            np.testing.assert_allclose(got, rounded, rtol=1e-5, atol=1e-5)
            assert np.max(np.abs(got - full)) > 1e-3
            if EMU:
                at = profile_size(d)
                x = s.tensor(np.ones((4, 8), np.float32), device="cuda:0")
                (x @ x.T).numpy()
                assert profile_kernels(d, at) == ["cublasSgemm (TF32)"]
    finally:
        assert d.stop() == 0, d.log()
