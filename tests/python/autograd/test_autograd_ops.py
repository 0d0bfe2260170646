"""Gradients of every differentiable op the daemon serves, computed by the
daemon's backward pass, against PyTorch autograd on the same inputs: float32
on cpu:0 (rtol 1e-4, atol 1e-5) and float64 on ref:0 (rtol 1e-9, atol 1e-11),
with broadcasting and non-contiguous (transposed) inputs. Also optimizers
over many steps against torch.optim, to float32 rounding."""

from __future__ import annotations

import numpy as np
import pytest

import tensordd
from helpers import require_autodiff

torch = pytest.importorskip("torch")


@pytest.fixture
def ad(session):
    require_autodiff(session)
    return session


def rnd(seed, *shape):
    return np.random.default_rng(seed).uniform(-1.5, 1.5, shape)


def pos(seed, *shape):
    return np.random.default_rng(seed).uniform(0.3, 2.0, shape)


# (name, input arrays, daemon fn(session, *ts), torch fn(*ts)); each fn returns
# a tensor whose weighted sum is the loss.
CASES = [
    ("add-broadcast", lambda: [rnd(1, 3, 4), rnd(2, 4)], lambda s, a, b: a + b,
     lambda a, b: a + b),
    ("sub-alpha", lambda: [rnd(1, 3, 4), rnd(2, 3, 1)],
     lambda s, a, b: s.op("sub", a, b, alpha=2.5), lambda a, b: torch.sub(a, b, alpha=2.5)),
    ("mul-div", lambda: [rnd(1, 2, 3, 4), pos(2, 3, 1)], lambda s, a, b: a * b / (b + 1.0),
     lambda a, b: a * b / (b + 1.0)),
    ("pow", lambda: [pos(1, 3, 4), rnd(2, 4)], lambda s, a, b: a ** b + a ** 2.5,
     lambda a, b: a ** b + a ** 2.5),
    ("remainder", lambda: [rnd(31, 3, 4) * 3, pos(32, 4)],
     lambda s, a, b: s.op("remainder", a, b) + s.op("remainder", a, other=0.7),
     lambda a, b: torch.remainder(a, b) + torch.remainder(a, 0.7)),
    ("max-min", lambda: [rnd(1, 3, 4), rnd(2, 4)],
     lambda s, a, b: a.maximum(b) * 2 + a.minimum(b), lambda a, b: torch.maximum(a, b) * 2 +
     torch.minimum(a, b)),
    ("unary", lambda: [rnd(3, 3, 4)],
     lambda s, a: a.exp().tanh() + a.sigmoid() * a.sin() + a.abs().sqrt() + a.cos().square(),
     lambda a: a.exp().tanh() + a.sigmoid() * a.sin() + a.abs().sqrt() + a.cos().square()),
    ("activations", lambda: [rnd(4, 3, 4)],
     lambda s, a: a.relu() + s.op("leaky_relu", a, negative_slope=0.1) + s.op("silu", a) +
     s.op("softplus", a, beta=2.0) + s.op("gelu", a) + s.op("gelu", a, approximate="tanh") +
     a.clamp(-0.5, 0.5),
     lambda a: a.relu() + torch.nn.functional.leaky_relu(a, 0.1) + torch.nn.functional.silu(a) +
     torch.nn.functional.softplus(a, beta=2.0) + torch.nn.functional.gelu(a) +
     torch.nn.functional.gelu(a, approximate="tanh") + a.clamp(-0.5, 0.5)),
    ("log-family", lambda: [pos(5, 3, 4)],
     lambda s, a: a.log() + s.op("log1p", a) + s.op("expm1", a) + a.rsqrt() + a.reciprocal(),
     lambda a: a.log() + a.log1p() + a.expm1() + a.rsqrt() + a.reciprocal()),
    ("reductions", lambda: [rnd(6, 3, 4, 2)],
     lambda s, a: (s.op("sum", a, dim=[0, 2], keepdim=True) * s.op("mean", a, dim=1,
                                                                   keepdim=True)),
     lambda a: a.sum(dim=[0, 2], keepdim=True) * a.mean(dim=1, keepdim=True)),
    ("reductions2", lambda: [rnd(7, 3, 4)],
     lambda s, a: s.op("amax", a, dim=1) + s.op("var", a, dim=1) + s.op("std", a, dim=1) +
     s.op("logsumexp", a, dim=1) + s.op("prod", a, dim=1),
     lambda a: a.amax(1) + a.var(1) + a.std(1) + a.logsumexp(1) + a.prod(1)),
    ("prod-with-zeros", lambda: [np.array([[1.5, 0.0, 2.0, -1.0], [0.5, -2.0, 3.0, 1.0],
                                           [0.0, 2.0, 0.0, 1.5]])],
     lambda s, a: s.op("prod", a, dim=1) + s.op("prod", a, dim=0).sum() + s.op("prod", a),
     lambda a: a.prod(1) + a.prod(0).sum() + a.prod()),
    ("softmax", lambda: [rnd(8, 3, 5)],
     lambda s, a: s.op("softmax", a, dim=1) * 3 + s.op("log_softmax", a, dim=0),
     lambda a: a.softmax(1) * 3 + a.log_softmax(0)),
    ("matmul-1d-2d-batched", lambda: [rnd(9, 2, 3, 4), rnd(10, 4, 5), rnd(11, 4)],
     lambda s, a, b, v: (a @ b).sum() + (a @ v).sum() + (v @ b).sum() + (v @ v),
     lambda a, b, v: (a @ b).sum() + (a @ v).sum() + (v @ b).sum() + (v @ v)),
    ("linear", lambda: [rnd(12, 5, 3), rnd(13, 4, 3), rnd(14, 4)],
     lambda s, x, w, b: s.op("linear", x, w, b),
     lambda x, w, b: torch.nn.functional.linear(x, w, b)),
    ("views", lambda: [rnd(15, 2, 3, 4)],
     lambda s, a: s.op("permute", a, dims=[2, 0, 1]).reshape(4, 6)[1:3] *
     s.op("expand", s.op("unsqueeze", s.op("sum", a), dim=0), shape=[6]),
     lambda a: a.permute(2, 0, 1).reshape(4, 6)[1:3] * a.sum().unsqueeze(0).expand(6)),
    ("more-views", lambda: [rnd(33, 2, 3, 4), rnd(34, 2, 4, 3)],
     lambda s, a, b: s.op("bmm", s.op("contiguous", s.op("transpose", a, dim0=1, dim1=2)),
                          s.op("transpose", b, dim0=1, dim1=2)).sum() +
     s.op("flatten", s.op("clone", a), start_dim=1).sum(dim=1).sum() +
     (s.op("sum_to", s.op("unsqueeze", a, dim=0), shape=[3, 1]) *
      s.op("squeeze", s.op("view", b, shape=[1, 24]), dim=0).sum()).sum() +
     s.op("split", a, split_sizes=[1, 3], dim=2, num_outputs=2)[1].tanh().sum() +
     s.op("cumsum", b, dim=1).square().sum(),
     lambda a, b: torch.bmm(a.transpose(1, 2).contiguous(), b.transpose(1, 2)).sum() +
     a.clone().flatten(1).sum(1).sum() +
     (a.unsqueeze(0).sum(dim=(0, 1, 3)).reshape(3, 1) * b.view(1, 24).squeeze(0).sum()).sum() +
     a.split([1, 3], dim=2)[1].tanh().sum() + b.cumsum(1).square().sum()),
    ("pad-crop", lambda: [rnd(45, 3, 5)],
     lambda s, a: s.op("pad", a, pad=[-1, 2, 1, -2]) * 1.5,
     lambda a: torch.nn.functional.pad(a, [-1, 2, 1, -2]) * 1.5),
    ("losses", lambda: [rnd(16, 4, 5), rnd(17, 4, 5)],
     lambda s, x, y: s.op("mse_loss", x, y) +
     s.op("cross_entropy", x, s.tensor(np.array([1, 0, -100, 4]), device=x.device),
          label_smoothing=0.2) +
     s.op("binary_cross_entropy_with_logits", x, y.sigmoid()),
     lambda x, y: torch.nn.functional.mse_loss(x, y) +
     torch.nn.functional.cross_entropy(x, torch.tensor([1, 0, -100, 4]), label_smoothing=0.2) +
     torch.nn.functional.binary_cross_entropy_with_logits(x, y.sigmoid())),
    ("layer_norm", lambda: [rnd(18, 3, 4), rnd(19, 4), rnd(20, 4)],
     lambda s, x, w, b: s.op("layer_norm", x, w, b, normalized_shape=[4]),
     lambda x, w, b: torch.nn.functional.layer_norm(x, [4], w, b)),
    ("conv2d", lambda: [rnd(22, 2, 3, 7, 6), rnd(23, 4, 3, 3, 2), rnd(24, 4)],
     lambda s, x, w, b: s.op("conv2d", x, w, b, stride=[2, 1], padding=[1, 0], dilation=[1, 2]),
     lambda x, w, b: torch.nn.functional.conv2d(x, w, b, (2, 1), (1, 0), (1, 2))),
    ("conv2d-unbatched-stride3", lambda: [rnd(25, 2, 8, 7), rnd(26, 3, 2, 3, 3)],
     lambda s, x, w: s.op("conv2d", x, w, stride=3, padding=1),
     lambda x, w: torch.nn.functional.conv2d(x, w, None, 3, 1)),
    ("conv2d-stride-dilation", lambda: [rnd(27, 1, 2, 10, 9), rnd(28, 3, 2, 2, 3)],
     lambda s, x, w: s.op("conv2d", x, w, stride=[3, 2], padding=[0, 1], dilation=[2, 1]),
     lambda x, w: torch.nn.functional.conv2d(x, w, None, (3, 2), (0, 1), (2, 1))),
    ("conv2d-groups", lambda: [rnd(35, 2, 6, 7, 6), rnd(36, 4, 3, 3, 2), rnd(37, 4)],
     lambda s, x, w, b: s.op("conv2d", x, w, b, stride=2, padding=1, groups=2),
     lambda x, w, b: torch.nn.functional.conv2d(x, w, b, 2, 1, 1, 2)),
    ("conv2d-depthwise", lambda: [rnd(38, 1, 3, 6, 6), rnd(39, 3, 1, 3, 3)],
     lambda s, x, w: s.op("conv2d", x, w, padding=1, groups=3),
     lambda x, w: torch.nn.functional.conv2d(x, w, None, 1, 1, 1, 3)),
    ("avg_pool2d", lambda: [rnd(29, 2, 3, 7, 6)],
     lambda s, x: s.op("avg_pool2d", x, kernel_size=[3, 2], stride=[2, 2], padding=[1, 1]) +
     s.op("avg_pool2d", x, kernel_size=[3, 2], stride=2, padding=1, count_include_pad=False),
     lambda x: torch.nn.functional.avg_pool2d(x, (3, 2), (2, 2), (1, 1)) +
     torch.nn.functional.avg_pool2d(x, (3, 2), 2, 1, count_include_pad=False)),
    ("avg_pool2d-ceil", lambda: [rnd(46, 2, 2, 7, 8)],
     lambda s, x: s.op("avg_pool2d", x, kernel_size=3, stride=2, padding=1, ceil_mode=True) +
     s.op("avg_pool2d", x, kernel_size=3, stride=2, padding=1, ceil_mode=True,
          count_include_pad=False),
     lambda x: torch.nn.functional.avg_pool2d(x, 3, 2, 1, ceil_mode=True) +
     torch.nn.functional.avg_pool2d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False)),
    ("avg_pool2d-ceil-nopad", lambda: [rnd(47, 1, 2, 6, 5)],
     lambda s, x: s.op("avg_pool2d", x, kernel_size=[2, 3], stride=[3, 2], ceil_mode=True),
     lambda x: torch.nn.functional.avg_pool2d(x, (2, 3), (3, 2), ceil_mode=True)),
    ("max_pool2d-ceil", lambda: [rnd(48, 1, 2, 7, 6)],
     lambda s, x: s.op("max_pool2d", x, kernel_size=2, stride=2, ceil_mode=True),
     lambda x: torch.nn.functional.max_pool2d(x, 2, 2, ceil_mode=True)),
    ("max_pool2d", lambda: [rnd(21, 2, 3, 6, 5)],
     lambda s, x: s.op("max_pool2d", x, kernel_size=[3, 2], stride=[2, 1], padding=[1, 1]),
     lambda x: torch.nn.functional.max_pool2d(x, (3, 2), (2, 1), (1, 1))),
]


def _weights(shape):
    return np.random.default_rng(99).uniform(0.5, 1.5, shape)


@pytest.mark.parametrize("device,dtype,rtol,atol",
                         [("cpu:0", np.float32, 1e-4, 1e-5), ("ref:0", np.float64, 1e-9, 1e-11)])
@pytest.mark.parametrize("name,make,fn,tfn", CASES, ids=[c[0] for c in CASES])
def test_op_gradients_match_torch(ad, device, dtype, rtol, atol, name, make, fn, tfn):
    arrays = [a.astype(dtype) for a in make()]
    ts = [ad.tensor(a, device=device, requires_grad=True) for a in arrays]
    out = fn(ad, *ts)
    w = _weights(out.shape).astype(dtype)
    loss = (out * ad.tensor(w, device=device)).sum()
    grads = loss.backward()

    tt = [torch.tensor(a, requires_grad=True) for a in arrays]
    tout = tfn(*tt)
    (tout * torch.tensor(w)).sum().backward()
    np.testing.assert_allclose(loss.numpy(), (tout * torch.tensor(w)).sum().detach().numpy(),
                               rtol=rtol * 10, atol=atol * 10)
    for k, (t, r) in enumerate(zip(ts, tt)):
        g = grads.get(t)
        assert g.shape == tuple(r.shape) and g.device == device
        np.testing.assert_allclose(g.numpy(), r.grad.numpy(), rtol=rtol, atol=atol,
                                   err_msg=f"{name}: input {k}")


def test_non_contiguous_inputs(ad):
    """Transposed, sliced and expanded views as inputs of tracked ops."""
    a = rnd(30, 4, 3).astype(np.float32)
    b = rnd(31, 4, 5).astype(np.float32)
    A = ad.tensor(a, requires_grad=True)
    B = ad.tensor(b, requires_grad=True)
    out = (A.t() @ B)[:, 1:4] * B[0:3, 0:3].t()
    grads = (out * out).sum().backward()
    ta = torch.tensor(a, requires_grad=True)
    tb = torch.tensor(b, requires_grad=True)
    tout = (ta.t() @ tb)[:, 1:4] * tb[0:3, 0:3].t()
    (tout * tout).sum().backward()
    np.testing.assert_allclose(grads.get(A).numpy(), ta.grad.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(grads.get(B).numpy(), tb.grad.numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("make,torch_make", [
    (lambda p: tensordd.optim.SGD(p, lr=0.05, momentum=0.9, dampening=0.1, weight_decay=0.01),
     lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, dampening=0.1, weight_decay=0.01)),
    (lambda p: tensordd.optim.SGD(p, lr=0.05, momentum=0.5, nesterov=True),
     lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.5, nesterov=True)),
    (lambda p: tensordd.optim.Adam(p, lr=0.02, betas=(0.8, 0.99), weight_decay=0.1),
     lambda p: torch.optim.Adam(p, lr=0.02, betas=(0.8, 0.99), weight_decay=0.1)),
    (lambda p: tensordd.optim.AdamW(p, lr=0.02, eps=1e-6, weight_decay=0.5),
     lambda p: torch.optim.AdamW(p, lr=0.02, eps=1e-6, weight_decay=0.5)),
    # amsgrad (the loop, its SSE form and the ops): beta2 0.9 lets exp_avg_sq
    # fall as the fit improves, so the maximum matters (without it these fail)
    (lambda p: tensordd.optim.Adam(p, lr=0.05, betas=(0.8, 0.9), weight_decay=0.1,
                                   amsgrad=True),
     lambda p: torch.optim.Adam(p, lr=0.05, betas=(0.8, 0.9), weight_decay=0.1, amsgrad=True)),
    (lambda p: tensordd.optim.AdamW(p, lr=0.05, betas=(0.8, 0.9), eps=1e-6, weight_decay=0.5,
                                    amsgrad=True),
     lambda p: torch.optim.AdamW(p, lr=0.05, betas=(0.8, 0.9), eps=1e-6, weight_decay=0.5,
                                 amsgrad=True)),
], ids=["sgd-dampening-wd", "sgd-nesterov", "adam-wd", "adamw", "adam-amsgrad-wd",
        "adamw-amsgrad"])
@pytest.mark.parametrize("foreach", [False, True], ids=["loop", "foreach"])
def test_optimizers_track_torch_for_many_steps(ad, make, torch_make, foreach):
    """20 steps with fresh gradients each time: state (momentum, moments, step
    counts for bias correction) must evolve as torch.optim's. foreach: the
    update as queued ops (the path of devices the daemon's loop cannot touch)."""
    x = rnd(40, 16, 3).astype(np.float32)
    y = rnd(41, 16, 2).astype(np.float32)
    w = rnd(42, 2, 3).astype(np.float32)
    b = rnd(43, 2).astype(np.float32)
    W = ad.tensor(w, requires_grad=True)
    Bb = ad.tensor(b, requires_grad=True)
    X, Y = ad.tensor(x), ad.tensor(y)
    opt = make([W, Bb])
    if foreach:
        # The same optimizer again with the attribute set (the classes don't
        # take it: it changes how, not what, the daemon computes).
        hyper, cls = opt.hyper, type(opt)
        opt = tensordd.optim.Optimizer.__new__(cls)
        tensordd.optim.Optimizer.__init__(opt, [W, Bb], **hyper, foreach=True)
    tw, tb = torch.tensor(w, requires_grad=True), torch.tensor(b, requires_grad=True)
    topt = torch_make([tw, tb])
    for _ in range(20):
        opt.step(ad.op("mse_loss", ad.op("linear", X, W, Bb), Y).backward())
        topt.zero_grad()
        torch.nn.functional.mse_loss(torch.nn.functional.linear(torch.tensor(x), tw, tb),
                                     torch.tensor(y)).backward()
        topt.step()
    np.testing.assert_allclose(W.numpy(), tw.detach().numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(Bb.numpy(), tb.detach().numpy(), rtol=1e-5, atol=1e-6)


def test_dropout_gradient_is_the_mask(ad):
    x = pos(50, 8, 16).astype(np.float32)
    X = ad.tensor(x, requires_grad=True)
    y = ad.op("dropout", X, p=0.25)
    g = y.sum().backward().get(X).numpy()
    kept = y.numpy() != 0
    assert 0 < kept.sum() < kept.size
    np.testing.assert_allclose(g, kept / np.float32(0.75), rtol=1e-6)
    ge = ad.op("dropout", X, p=0.25, train=False).sum().backward().get(X).numpy()
    np.testing.assert_array_equal(ge, np.ones_like(x))
