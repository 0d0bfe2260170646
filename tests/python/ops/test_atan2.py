"""atan2(input, other), the elementwise op added from its table row (backends/elementwise.h),
against torch: forward values (broadcasting, the scalar form, integer inputs to float32,
the signed zeros and infinities of the quadrants) and the gradient of both inputs, with
torch.autograd as the oracle, on cpu:0, ref:0 and sim:0.

Tolerances: float32 rtol 1e-5, atol 1e-6 (one libm call and a few roundings); float64
rtol 1e-12, atol 1e-14."""

from __future__ import annotations

import numpy as np
import pytest

import tensordd
from helpers import require_autodiff

torch = pytest.importorskip("torch")

DEVICES = ("cpu:0", "ref:0", "sim:0")
TOLS = {"float32": (1e-5, 1e-6), "float64": (1e-12, 1e-14)}


@pytest.fixture
def s(sim_daemon):
    sess = tensordd.connect(sim_daemon.endpoint, timeout=60)
    yield sess
    sess.close(raise_errors=False)


@pytest.mark.parametrize("dtype", ("float32", "float64"))
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shapes", [((3, 4), (3, 4)), ((2, 1, 4), (3, 1)), ((5,), ()), ((0, 3), (3,))])
def test_forward_matches_torch(s, device, dtype, shapes):
    rng = np.random.default_rng(11)
    a = rng.uniform(-3, 3, shapes[0]).astype(dtype)
    b = rng.uniform(-3, 3, shapes[1]).astype(dtype)
    got = s.op("atan2", s.tensor(a, device=device), s.tensor(b, device=device)).numpy()
    want = torch.atan2(torch.from_numpy(a), torch.from_numpy(b)).numpy()
    assert got.dtype == want.dtype and got.shape == want.shape
    rtol, atol = TOLS[dtype]
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


@pytest.mark.parametrize("device", DEVICES)
def test_quadrants_zeros_and_infinities(s, device):
    v = [0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan]
    a = np.array([x for x in v for _ in v], np.float64)
    b = np.array([y for _ in v for y in v], np.float64)
    got = s.op("atan2", s.tensor(a, device=device), s.tensor(b, device=device)).numpy()
    want = torch.atan2(torch.from_numpy(a), torch.from_numpy(b)).numpy()
    num = ~np.isnan(want)  # a NaN's sign bit is libm's choice
    np.testing.assert_array_equal(np.isnan(got), ~num)
    np.testing.assert_array_equal(np.signbit(got[num]), np.signbit(want[num]))
    np.testing.assert_allclose(got, want, rtol=1e-15, atol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_scalar_form_and_integers(s, device):
    a = np.arange(-6, 6, dtype=np.int32).reshape(3, 4)
    got = s.op("atan2", s.tensor(a, device=device), other=-1.5).numpy()
    want = torch.atan2(torch.from_numpy(a), torch.tensor(-1.5)).numpy()
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    b = np.arange(12, dtype=np.int64).reshape(3, 4) - 3
    got = s.op("atan2", s.tensor(a, device=device), s.tensor(b, device=device)).numpy()
    want = torch.atan2(torch.from_numpy(a), torch.from_numpy(b)).numpy()
    assert got.dtype == want.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("dtype", ("float32", "float64"))
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shapes", [((3, 4), (3, 4)), ((2, 3, 4), (3, 1)), ((4,), (2, 4))])
def test_gradient_matches_torch(s, device, dtype, shapes):
    require_autodiff(s)
    rng = np.random.default_rng(7)
    a = rng.uniform(-2, 2, shapes[0]).astype(dtype)
    b = rng.uniform(-2, 2, shapes[1]).astype(dtype)
    ta = torch.tensor(a, requires_grad=True)
    tb = torch.tensor(b, requires_grad=True)
    tout = torch.atan2(ta, tb)
    w = rng.uniform(0.5, 1.5, tuple(tout.shape)).astype(dtype)
    (tout * torch.from_numpy(w)).sum().backward()

    x = s.tensor(a, device=device, requires_grad=True)
    y = s.tensor(b, device=device, requires_grad=True)
    out = s.op("atan2", x, y)
    grads = (out * s.tensor(w, device=device)).sum().backward()
    rtol, atol = TOLS[dtype]
    for t, tt in ((x, ta), (y, tb)):
        g = grads.get(t)
        assert tuple(g.shape) == tuple(tt.shape)
        np.testing.assert_allclose(g.numpy(), tt.grad.numpy(), rtol=rtol * 10, atol=atol * 10)


@pytest.mark.parametrize("device", DEVICES)
def test_gradient_of_scalar_form(s, device):
    require_autodiff(s)
    a = np.linspace(-2, 2, 9).astype(np.float64)
    ta = torch.tensor(a, requires_grad=True)
    torch.atan2(ta, torch.tensor(0.75, dtype=torch.float64)).sum().backward()
    x = s.tensor(a, device=device, requires_grad=True)
    grads = s.op("atan2", x, other=0.75).sum().backward()
    np.testing.assert_allclose(grads.get(x).numpy(), ta.grad.numpy(), rtol=1e-12, atol=1e-14)
