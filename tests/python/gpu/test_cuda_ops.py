"""The op checks of test_ops_torch.py on cuda:0 (issue 10).

Runs only when TDD_GPU_ARGS is set: `make test-emu` sets it to start the emulated
daemon (build/emu/tensordd --emu-gpus 2 ...), tests/gpu/run.sh to "" on a GPU machine.
Every op x dtype case of test_ops_torch.py and its creation cases run on cuda:0 against
PyTorch with the same tolerances; a case the cuda backend declines (UNSUPPORTED_OP or
UNSUPPORTED_DTYPE, typed) is skipped, so the summary's passed count is what cuda runs.
"""

from __future__ import annotations


import numpy as np
import pytest

import tensordd
import test_ops_torch as T

torch = pytest.importorskip("torch")

from gpusuite import gpu_daemon_fixture, only_with_gpu

pytestmark = only_with_gpu
DEV = "cuda:0"
DECLINED = (tensordd.UnsupportedOpError, tensordd.UnsupportedDTypeError)


gpu_daemon = gpu_daemon_fixture(cpu_devices=2)


@pytest.fixture
def gs(gpu_daemon):
    s = tensordd.connect(gpu_daemon.endpoint, timeout=120)
    if DEV not in [str(d) for d in s.devices()]:
        pytest.fail(f"{DEV} is not served:\n{gpu_daemon.log()}")
    yield s
    s.close(raise_errors=False)


def _run_or_skip(s, fn):
    try:
        got = fn()
        s.sync()  # a declined op answers at the next synchronising call
        return got
    except DECLINED as e:
        pytest.skip(f"cuda declines: {e.code}")
    except tensordd.PoisonedError as e:  # a composite whose inner op was declined
        if e.origin_code not in ("UNSUPPORTED_OP", "UNSUPPORTED_DTYPE"):
            raise
        pytest.skip(f"cuda declines an inner op: {e.origin_code}")


@pytest.mark.parametrize("c,dtype", T._params())
def test_op_on_cuda_matches_torch(gs, c, dtype):
    rng = np.random.default_rng(T._seed(c.name, dtype))
    arrays = [spec(rng, dtype) for spec in c.inputs]
    ts = [gs.tensor(a, device=DEV) for a in arrays]
    want = c.tfn(*[torch.from_numpy(np.array(a)) for a in arrays])
    got = _run_or_skip(gs, lambda: c.fn(gs, *ts))
    for g in T._as_list(got):
        assert g.device == DEV
    T.compare(got, want, exact=c.exact, k=c.k, what=f"{c.name} {dtype} on {DEV}")


@pytest.mark.parametrize("fn,tfn,dtype", T._create_params())
def test_creation_on_cuda_matches_torch(gs, fn, tfn, dtype):
    got = _run_or_skip(gs, lambda: fn(gs, DEV, dtype))
    want = tfn(getattr(torch, dtype))
    assert got.device == DEV
    T.compare(got, want, exact=False, k=1, what=f"creation {dtype} on {DEV}")


# Reductions whose layouts take each of the cuda backend's reduction kernels: short rows over
# the dense innermost dim (several to a warp, the last warp part-filled), outer dims with
# under 1024 dense kept outputs (a block per 32 outputs), outer dims with >= 1024 outputs (a
# thread each), long rows (a block per output, split across blocks when outputs are few);
# with each map (plain, exp-sub for logsumexp, squared deviation for var) and combine.
REDUCTION_LAYOUTS = [
    ("short_rows", (64, 10), -1),
    ("short_rows_part_warp", (5, 7, 3), -1),
    ("row_of_one", (45, 1), -1),
    ("columns", (300, 70), 0),
    ("few_columns", (300, 10), 0),
    ("columns_3d", (6, 50, 40), (0, 1)),
    ("many_columns", (5, 2000), 0),
    ("long_rows", (3, 5000), 1),
]


@pytest.mark.parametrize("name,shape,dim", REDUCTION_LAYOUTS,
                         ids=[r[0] for r in REDUCTION_LAYOUTS])
@pytest.mark.parametrize("dtype", ["float32", "float64", "int64"])
def test_reduction_layouts_on_cuda_match_torch(gs, name, shape, dim, dtype):
    rng = np.random.default_rng(len(name) * 7 + len(dtype))
    if dtype == "int64":
        a = rng.integers(-50, 50, shape).astype(np.int64)
        ops = ["sum", "amax", "amin"]
    else:
        a = rng.standard_normal(shape).astype(dtype)
        ops = ["sum", "mean", "amax", "amin", "var", "logsumexp"]
    x, tx = gs.tensor(a, device=DEV), torch.from_numpy(a)
    for op in ops:
        got = getattr(x, op)(dim)
        want = getattr(tx, op)(dim)
        T.compare(got, want, exact=dtype == "int64", k=shape[0] if dim == 0 else 8,
                  what=f"{op} over {dim} of {shape} {dtype} on {DEV}")
