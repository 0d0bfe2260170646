"""Backward ops a client sends as ops, against PyTorch's own backward (torch 1.13).

max_pool2d_backward(grad_output, input; max_pool2d's attributes) is max_pool2d's input gradient
in one kernel, and what the daemon's backward of max_pool2d runs (the op schema's grad column,
docs/ops.md). Checked against torch.ops.aten.max_pool2d_with_indices_backward (given torch's
own indices) and against torch's autograd of max_pool2d: strides, padding, dilation,
ceil_mode with a partial last window, overlapping windows where one input is the maximum of
several (its gradients are summed), ties (the first of equal maxima takes the gradient, as in
torch's CPU kernel), unbatched [C, H, W] inputs, float32 and float64; on cpu:0 and ref:0, or
on cuda:0 when TDD_GPU_ARGS is set (make test-emu, tests/gpu/run.sh). Tolerances: the kernels
add each window's gradient in the windows' order, as the reference does; float32 1e-6 and
float64 1e-12 (torch sums in its own order). A grad_output of the wrong shape or dtype is
refused, naming it.
"""

from __future__ import annotations

import numpy as np
import pytest

import tensordd
from test_torch_arg_forms import DEVICES, fd, s  # noqa: F401 (fixtures)

torch = pytest.importorskip("torch")
F = torch.nn.functional

TOL = {np.float32: 1e-6, np.float64: 1e-12}

# (name, input shape, kwargs, dtype, integer-valued input: ties)
FORMS = [
    ("k3_s2_p1", (2, 3, 9, 8), dict(kernel_size=3, stride=2, padding=1), np.float32, False),
    ("default_stride", (2, 2, 8, 6), dict(kernel_size=2), np.float64, False),
    ("overlap_s1", (1, 3, 7, 7), dict(kernel_size=3, stride=1), np.float32, False),
    ("dilated_ceil", (2, 2, 10, 9), dict(kernel_size=2, stride=2, dilation=2, ceil_mode=True),
     np.float64, False),
    ("ceil_partial", (1, 2, 9, 11), dict(kernel_size=[3, 2], stride=[2, 3], padding=[1, 1],
                                          ceil_mode=True), np.float32, False),
    ("ties", (2, 2, 6, 7), dict(kernel_size=3, stride=1, padding=1), np.float32, True),
    ("unbatched", (3, 6, 5), dict(kernel_size=2, stride=1), np.float64, False),
]


def _arrays(name, shape, dt, ties):
    rng = np.random.default_rng(sum(map(ord, name)))
    x = (rng.integers(0, 3, shape) if ties else rng.uniform(-2, 2, shape)).astype(dt)
    return rng, x


def _close(got, want, dt, what):
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=TOL[dt], atol=TOL[dt],
                               err_msg=what)


def _pair(kw, name, default):
    v = kw.get(name, default)
    return [v, v] if isinstance(v, int) else list(v)


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("form", FORMS, ids=[f[0] for f in FORMS])
def test_max_pool2d_backward_op_matches_aten(s, dev, form):
    name, shape, kw, dt, ties = form
    rng, x = _arrays(name, shape, dt, ties)
    tx = torch.tensor(x)
    ty, idx = F.max_pool2d(tx, **kw, return_indices=True)
    go = rng.uniform(-1, 1, tuple(ty.shape)).astype(dt)
    ks = _pair(kw, "kernel_size", None)
    want = torch.ops.aten.max_pool2d_with_indices_backward(
        torch.tensor(go), tx, ks, _pair(kw, "stride", ks), _pair(kw, "padding", 0),
        _pair(kw, "dilation", 1), kw.get("ceil_mode", False), idx)
    got = s.op("max_pool2d_backward", s.tensor(go, device=dev), s.tensor(x, device=dev), **kw)
    assert tuple(got.shape) == tuple(x.shape) and got.dtype == dt and got.device == dev
    _close(got.numpy(), want.numpy(), dt, f"{name} on {dev}")


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("form", FORMS, ids=[f[0] for f in FORMS])
def test_max_pool2d_gradient_matches_torch_autograd(s, dev, form):
    """The daemon's backward of max_pool2d (the schema's grad: max_pool2d_backward)."""
    name, shape, kw, dt, ties = form
    rng, x = _arrays(name, shape, dt, ties)
    tx = torch.tensor(x, requires_grad=True)
    ty = F.max_pool2d(tx, **kw)
    g = rng.uniform(-1, 1, tuple(ty.shape)).astype(dt)
    (ty * torch.tensor(g)).sum().backward()
    X = s.tensor(x, device=dev, requires_grad=True)
    y = s.op("max_pool2d", X, **kw)
    grads = (y * s.tensor(g, device=dev)).sum().backward()
    _close(grads.get(X).numpy(), tx.grad.numpy(), dt, f"{name} on {dev}")


@pytest.mark.parametrize("dev", DEVICES)
def test_max_pool2d_backward_of_strided_operands(s, dev):
    """grad_output and input as permuted views (a strided read on every backend)."""
    rng = np.random.default_rng(5)
    x = rng.uniform(-2, 2, (2, 8, 9, 3)).astype(np.float32)
    tx = torch.tensor(x).permute(0, 3, 1, 2)
    ty, idx = F.max_pool2d(tx, 3, 2, 1, return_indices=True)
    go = rng.uniform(-1, 1, (2, ty.shape[2], ty.shape[3], 3)).astype(np.float32)
    tgo = torch.tensor(go).permute(0, 3, 1, 2)
    want = torch.ops.aten.max_pool2d_with_indices_backward(tgo, tx, [3, 3], [2, 2], [1, 1],
                                                          [1, 1], False, idx)
    got = s.op("max_pool2d_backward", s.tensor(go, device=dev).permute(0, 3, 1, 2),
               s.tensor(x, device=dev).permute(0, 3, 1, 2), kernel_size=3, stride=2, padding=1)
    _close(got.numpy(), want.numpy(), np.float32, f"strided on {dev}")


@pytest.mark.parametrize("dev", DEVICES)
def test_max_pool2d_backward_refuses_a_wrong_grad_output(s, dev):
    x = s.tensor(np.ones((1, 2, 6, 6), np.float32), device=dev)
    with pytest.raises(tensordd.Error, match="grad_output"):
        s.op("max_pool2d_backward", s.tensor(np.ones((1, 2, 2, 2), np.float32), device=dev), x,
             kernel_size=2).numpy()
    with pytest.raises(tensordd.Error):
        s.op("max_pool2d_backward", s.tensor(np.ones((1, 2, 3, 3), np.float64), device=dev), x,
             kernel_size=2).numpy()
    with pytest.raises(tensordd.Error, match="kernel_size"):
        s.op("max_pool2d_backward", s.tensor(np.ones((1, 2, 3, 3), np.float32), device=dev),
             x).numpy()
