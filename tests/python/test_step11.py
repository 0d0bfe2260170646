"""The per-step fast paths of issue 11's step11 work, held to exact oracles.

* SGD on dense float32 parameters runs a four-wide loop in the daemon
  (daemon/optim.c's sgd_dense_f32): every option (weight decay, momentum,
  dampening, nesterov, maximize) must give the bits of the same update written
  in numpy float32, op for op in torch.optim's order (each float32 operation is
  correctly rounded on both sides, so equality is exact), on sizes with and
  without a tail of fewer than four elements, and with a gradient assigned by
  hand as a transposed view.
* linear's bias is copied into the output row by row (backends/cpu/cpu_blas.c's
  fill_bias): every way a bias may broadcast to the output (a row, a column, a
  strided view, a batch of rows) against numpy, with small integers so that the
  products and sums are exact.
"""

from __future__ import annotations

import numpy as np
import pytest

import tensordd

SGD_CASES = [
    dict(lr=0.1),
    dict(lr=0.05, weight_decay=0.01),
    dict(lr=0.05, momentum=0.9),
    dict(lr=0.05, momentum=0.9, dampening=0.3, weight_decay=0.02),
    dict(lr=0.05, momentum=0.8, nesterov=True),
    dict(lr=0.05, momentum=0.5, nesterov=True, weight_decay=0.1, maximize=True),
    dict(lr=0.1, maximize=True),
]


def _sgd_numpy(p, grads, lr, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False,
               maximize=False):
    """torch.optim.SGD's update in float32, one correctly rounded operation at a time."""
    f = np.float32
    p = p.copy()
    buf = None
    for g in grads:
        g = -g if maximize else g.copy()
        if weight_decay:
            g = g + f(weight_decay) * p
        if momentum:
            buf = g.copy() if buf is None else buf * f(momentum) + f(1.0 - dampening) * g
            g = g + f(momentum) * buf if nesterov else buf
        p = p + (-f(lr)) * g
    return p


@pytest.mark.parametrize("opts", SGD_CASES, ids=lambda o: ",".join(sorted(o)))
@pytest.mark.parametrize("shape", [(7,), (64, 128), (3, 5)])
def test_sgd_float32_is_torch_order_exactly(session, opts, shape):
    rng = np.random.default_rng(11)
    w0 = rng.standard_normal(shape).astype(np.float32)
    coefs = [rng.standard_normal(shape).astype(np.float32) for _ in range(3)]
    w = session.tensor(w0, requires_grad=True)
    opt = tensordd.optim.SGD([w], **opts)
    for c in coefs:
        opt.zero_grad()
        (w * session.tensor(c)).sum().backward()  # the gradient is c exactly
        opt.step()
    np.testing.assert_array_equal(w.numpy(), _sgd_numpy(w0, coefs, **opts))


@pytest.mark.parametrize("opts", [SGD_CASES[3], SGD_CASES[5]], ids=["momentum", "nesterov"])
def test_sgd_strided_gradient_takes_the_same_bits(session, opts):
    """A gradient set by hand as a transposed view: the same bits as a dense one and
    as numpy."""
    rng = np.random.default_rng(12)
    w0 = rng.standard_normal((6, 10)).astype(np.float32)
    coefs = [rng.standard_normal((10, 6)).astype(np.float32) for _ in range(3)]
    w1, w2 = (session.tensor(w0, requires_grad=True) for _ in range(2))
    o1, o2 = tensordd.optim.SGD([w1], **opts), tensordd.optim.SGD([w2], **opts)
    for c in coefs:
        w1.grad = session.tensor(c).transpose(0, 1)
        o1.step()
        w2.grad = session.tensor(np.ascontiguousarray(c.T))
        o2.step()
    want = _sgd_numpy(w0, [np.ascontiguousarray(c.T) for c in coefs], **opts)
    np.testing.assert_array_equal(w1.numpy(), want)
    np.testing.assert_array_equal(w2.numpy(), want)


@pytest.mark.parametrize("xshape,bias_of", [
    ((5, 4), lambda s: s.tensor(np.arange(3, dtype=np.float32) - 1)),  # a row [N]
    ((5, 4), lambda s: s.tensor((np.arange(5, dtype=np.float32) - 2).reshape(5, 1))),  # a column
    ((5, 4), lambda s: s.tensor(np.arange(6, dtype=np.float32) - 3)[::2]),  # strided [N]
    ((2, 5, 4), lambda s: s.tensor(np.arange(3, dtype=np.float32) * 2)),  # batch of rows
    ((2, 5, 4), lambda s: s.tensor((np.arange(10, dtype=np.float32) - 4).reshape(2, 5, 1))),
    ((5, 4), lambda s: s.tensor(np.arange(15, dtype=np.float32).reshape(5, 3))),  # full
    ((5, 4), lambda s: s.tensor(np.arange(15, dtype=np.float32).reshape(3, 5)).t()),  # full, T
], ids=["row", "column", "strided", "3d-row", "3d-column", "full", "full-transposed"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_linear_bias_layouts(session, xshape, bias_of, dtype):
    rng = np.random.default_rng(13)
    x = rng.integers(-3, 4, xshape).astype(dtype)
    w = rng.integers(-3, 4, (3, xshape[-1])).astype(dtype)
    b = bias_of(session)
    if dtype == np.float64:
        b = b.double()
    want = x @ w.T + b.numpy().astype(dtype)
    got = tensordd.nn.functional.linear(session.tensor(x), session.tensor(w), b).numpy()
    np.testing.assert_array_equal(got, want)
