"""Sums and means over leading dims on cpu:0 (a bias's gradient, a sum over the batch):
the reduced elements of one output lie a row apart, and the kernel reads them row by row
for many outputs at once. Each output is still the double-precision sum of its elements
in row order, as a float input's reduction is specified (cpu_reduce.c): the float64
result is checked against numpy's sequential (cumsum) sum exactly, and against numpy's
float64 sum within float32/float64 tolerance, on daemons with 1 and 2 threads (outputs
split across threads: the same bits)."""

from __future__ import annotations

import numpy as np
import pytest

import tensordd
from conftest import Daemon

CASES = [  # shape, reduced dims, view
    ((256, 1024), (0,), "plain"),
    ((256, 10), (0,), "plain"),
    ((600, 700), (0,), "plain"),  # more outputs than one block of columns
    ((7, 5, 9), (1,), "plain"),  # outputs contiguous in runs of 9
    ((4, 8, 33), (0, 1), "plain"),  # two leading dims, one strided walk
    ((2, 3, 4, 5), (0, 2), "plain"),  # reduced dims that do not merge: two walks
    ((300, 40), (1,), "transposed"),  # a transposed view: columns of the view are rows
    ((5, 1, 7), (0, 1), "plain"),
    ((0, 5), (0,), "plain"),  # empty: sum 0, mean NaN
]
TOL = {np.float32: (1e-5, 1e-4), np.float64: (1e-12, 1e-10)}


@pytest.fixture(scope="module", params=["1", "2"], ids=lambda t: f"threads{t}")
def endpoint(request):
    d = Daemon("--threads", request.param)
    yield d.endpoint
    assert d.stop() == 0, d.log()


def sequential_sum(a, dims):
    """The double sum of each output's elements in C (row) order: numpy's cumsum is
    strictly sequential."""
    keep = [d for d in range(a.ndim) if d not in dims]
    m = np.transpose(a.astype(np.float64), list(dims) + keep)
    m = m.reshape(-1, *[a.shape[d] for d in keep])
    if m.shape[0] == 0:
        return np.zeros(m.shape[1:])
    return np.cumsum(m, axis=0)[-1]


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("shape,dims,view", CASES, ids=[f"{c[0]}-{c[1]}-{c[2]}" for c in CASES])
def test_column_sums(endpoint, dtype, shape, dims, view):
    rng = np.random.default_rng(sum(shape) + len(dims))
    a = (rng.standard_normal(shape) * 10).astype(dtype)
    with tensordd.connect(endpoint, timeout=60) as s:
        t = s.tensor(a)
        if view == "transposed":
            t, a = t.transpose(0, 1), a.T
        got_sum = s.op("sum", t, dim=list(dims)).numpy()
        got_mean = s.op("mean", t, dim=list(dims)).numpy()
    rtol, atol = TOL[dtype]
    want = a.astype(np.float64).sum(axis=dims)
    np.testing.assert_allclose(got_sum, want, rtol=rtol, atol=atol)
    count = int(np.prod([a.shape[d] for d in dims]))
    if count:
        np.testing.assert_allclose(got_mean, want / count, rtol=rtol, atol=atol)
    else:
        assert np.isnan(got_mean).all()
    assert got_sum.dtype == dtype
    if shape == (2, 3, 4, 5):
        return  # partial sums per walk, added: not one sequential sum
    if dtype == np.float64:
        np.testing.assert_array_equal(got_sum, sequential_sum(a, dims))
    else:
        np.testing.assert_array_equal(got_sum, sequential_sum(a, dims).astype(np.float32))
