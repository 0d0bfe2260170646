"""max_pool1d and avg_pool1d against torch 1.13's F.max_pool1d / F.avg_pool1d.

Forward values, max_pool1d's indices (positions in L, as torch's) and the input gradient of
sum(out * g) (g random) are compared with torch's, on cpu:0 and ref:0, or on cuda:0 when
TDD_GPU_ARGS is set (the GPU suites: make test-emu, tests/gpu/run.sh). Forms: stride default
(= kernel_size) and explicit, padding up to kernel_size / 2, dilation (max), ceil_mode with a
partial last window, count_include_pad false (avg), unbatched [C, L] inputs, a 1-element
tuple kernel_size; float32 (rtol/atol 1e-5: a window's sum or max of at most 5 values in
double, rounded once) and float64 (1e-12). Attributes PyTorch refuses are refused with the
attribute named.
"""

from __future__ import annotations

import numpy as np
import pytest

import tensordd
from test_torch_arg_forms import DEVICES, fd, s  # noqa: F401 (fixtures)

torch = pytest.importorskip("torch")
F = torch.nn.functional
TF = tensordd.nn.functional

TOL = {np.float32: 1e-5, np.float64: 1e-12}

# (name, input shape, kwargs, dtype)
MAX_FORMS = [
    ("k3_s2_p1", (2, 3, 11), dict(kernel_size=3, stride=2, padding=1), np.float32),
    ("default_stride", (2, 4, 9), dict(kernel_size=2), np.float32),
    ("dilated_ceil", (2, 3, 10), dict(kernel_size=2, dilation=3, ceil_mode=True), np.float64),
    ("ceil_partial_window", (1, 2, 9), dict(kernel_size=4, stride=3, padding=2, ceil_mode=True),
     np.float32),
    ("unbatched_tuple_kernel", (3, 8), dict(kernel_size=(3,), stride=1, padding=1), np.float64),
]
AVG_FORMS = [
    ("k3_s2_p1", (2, 3, 11), dict(kernel_size=3, stride=2, padding=1), np.float32),
    ("default_stride", (2, 4, 9), dict(kernel_size=2), np.float64),
    ("no_pad_count", (2, 3, 9), dict(kernel_size=4, padding=2, count_include_pad=False),
     np.float32),
    ("ceil_partial_window", (1, 2, 10), dict(kernel_size=3, stride=2, padding=1, ceil_mode=True),
     np.float32),
    ("ceil_no_pad_count", (2, 2, 10),
     dict(kernel_size=4, stride=3, padding=2, ceil_mode=True, count_include_pad=False),
     np.float64),
    ("unbatched", (3, 7), dict(kernel_size=2, stride=1), np.float32),
]


def close(got, want, dt, what):
    tol = TOL[dt]
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=tol, atol=tol,
                               err_msg=what)


def run_both(s, dev, name, fn, shape, kw, dt, indices=False):
    rng = np.random.default_rng(abs(hash(name + fn)) % 2**32)
    x = rng.uniform(-2, 2, shape).astype(dt)
    tx = torch.tensor(x, requires_grad=True)
    tout = getattr(F, fn)(tx, **kw, **({"return_indices": True} if indices else {}))
    ty = tout[0] if indices else tout
    g = rng.uniform(-1, 1, ty.shape).astype(dt)
    (ty * torch.tensor(g)).sum().backward()
    X = s.tensor(x, device=dev, requires_grad=True)
    out = getattr(TF, fn)(X, **kw, **({"return_indices": True} if indices else {}))
    y = out[0] if indices else out
    assert tuple(y.shape) == tuple(ty.shape), f"{name}: output shape"
    close(y.numpy(), ty.detach().numpy(), dt, f"{name}: forward")
    if indices:
        assert out[1].dtype == np.int64
        np.testing.assert_array_equal(out[1].numpy(), tout[1].numpy(), err_msg=f"{name}: indices")
    grads = (y * s.tensor(g, device=dev)).sum().backward()
    close(grads.get(X).numpy(), tx.grad.numpy(), dt, f"{name}: input gradient")


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("form", MAX_FORMS, ids=[f[0] for f in MAX_FORMS])
def test_max_pool1d_values_and_gradient_match_torch(s, dev, form):
    name, shape, kw, dt = form
    run_both(s, dev, name, "max_pool1d", shape, kw, dt)


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("form", MAX_FORMS[:2] + MAX_FORMS[3:], ids=lambda f: f[0])
def test_max_pool1d_indices_match_torch(s, dev, form):
    name, shape, kw, dt = form
    run_both(s, dev, name, "max_pool1d", shape, kw, dt, indices=True)


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("form", AVG_FORMS, ids=[f[0] for f in AVG_FORMS])
def test_avg_pool1d_values_and_gradient_match_torch(s, dev, form):
    name, shape, kw, dt = form
    run_both(s, dev, name, "avg_pool1d", shape, kw, dt)


@pytest.mark.parametrize("dev", DEVICES)
def test_pool1d_modules_match_torch(s, dev):
    """nn.MaxPool1d / nn.AvgPool1d take torch's positional order."""
    x = np.random.default_rng(3).uniform(-2, 2, (2, 3, 10)).astype(np.float32)
    pairs = [(tensordd.nn.MaxPool1d(3, 2, 1, 1, True, True),
              torch.nn.MaxPool1d(3, 2, 1, 1, True, True)),
             (tensordd.nn.AvgPool1d(4, 3, 2, True, False), torch.nn.AvgPool1d(4, 3, 2, True, False))]
    for m, t in pairs:
        got, want = m(s.tensor(x, device=dev)), t(torch.tensor(x))
        if isinstance(want, tuple):
            np.testing.assert_array_equal(got[1].numpy(), want[1].numpy())
            got, want = got[0], want[0]
        close(got.numpy(), want.numpy(), np.float32, type(m).__name__)


@pytest.mark.parametrize("dev", DEVICES)
def test_pool1d_refuses_what_torch_refuses(s, dev):
    x = s.tensor(np.ones((2, 3, 8), np.float32), device=dev)
    # padding over half the kernel (torch: "pad should be at most half of kernel size")
    with pytest.raises(tensordd.Error, match="padding"):
        TF.max_pool1d(x, 2, padding=2).numpy()
    with pytest.raises(tensordd.Error, match="padding"):
        TF.avg_pool1d(x, 3, padding=2).numpy()
    # a 4-D input is max_pool2d's, not max_pool1d's
    x4 = s.tensor(np.ones((1, 2, 3, 8), np.float32), device=dev)
    with pytest.raises(tensordd.Error, match="input"):
        TF.max_pool1d(x4, 2).numpy()
    # avg_pool1d takes no dilation, max_pool1d no count_include_pad (torch's signatures)
    with pytest.raises(tensordd.Error, match="dilation"):
        s.op("avg_pool1d", x, kernel_size=2, dilation=2).numpy()
    with pytest.raises(tensordd.Error, match="count_include_pad"):
        s.op("max_pool1d", x, kernel_size=2, count_include_pad=False).numpy()
    # a kernel (dilated) longer than the padded input
    with pytest.raises(tensordd.Error):
        TF.max_pool1d(s.tensor(np.ones((1, 1, 3), np.float32), device=dev), 2,
                      dilation=3).numpy()
