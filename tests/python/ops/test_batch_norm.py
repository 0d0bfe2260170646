"""batch_norm, conv1d and conv_transpose2d against torch 1.13: F.batch_norm's forms
and nn.BatchNorm1d/2d; F.conv1d/nn.Conv1d and F.conv_transpose2d/nn.ConvTranspose2d.

Forward values, the running stats the daemon updates in place, and the gradients of
sum(out * g) (g random) are compared with torch's, on cpu:0 and ref:0, or on cuda:0 when
TDD_GPU_ARGS is set (the GPU suites: make test-emu, tests/gpu/run.sh). Tolerances: float32
rtol 1e-4, atol 1e-4 (the daemon works the statistics in double, torch in float); float64
1e-10. Edge forms: C = 1, a batch of 1 in eval mode, no affine, a bias without a weight, no
running stats, momentum=None (the cumulative average), [N, C] and [N, C, L] inputs. The
convolutions: stride, padding (conv1d's "same"/"valid"), dilation, groups, bias, unbatched
inputs, conv_transpose2d's output_padding (also >= stride, below dilation); float32 rtol/atol
1e-4. Double backward (create_graph) through each op against torch.autograd.grad's.
"""

from __future__ import annotations


import numpy as np
import pytest

import tensordd
from test_torch_arg_forms import DEVICES, fd, s  # noqa: F401 (fixtures)

torch = pytest.importorskip("torch")
F = torch.nn.functional
TF = tensordd.nn.functional

TOL = {np.float32: 1e-4, np.float64: 1e-10}


def close(got, want, dt, what):
    tol = TOL[dt]
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=tol, atol=tol,
                               err_msg=what)


# (name, x shape, stats, weight, bias, training, momentum, dtype)
FORMS = [
    ("train_4d_affine", (4, 3, 5, 2), True, True, True, True, 0.1, np.float32),
    ("train_2d_plain", (6, 4), True, False, False, True, 0.3, np.float32),
    ("train_3d_weight_only", (3, 2, 7), True, True, False, True, 0.1, np.float64),
    ("train_c1", (5, 1, 3, 3), True, True, True, True, 0.5, np.float32),
    ("train_no_stats_affine", (4, 3, 2, 2), False, True, True, True, 0.1, np.float32),
    ("train_bias_only", (4, 3, 2), True, False, True, True, 0.1, np.float32),
    ("eval_4d_affine", (2, 3, 4, 4), True, True, True, False, 0.1, np.float32),
    ("eval_batch_of_1", (1, 5, 3, 2), True, True, True, False, 0.1, np.float32),
    ("eval_2d_batch_of_1_plain", (1, 4), True, False, False, False, 0.1, np.float64),
]


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("form", FORMS, ids=[f[0] for f in FORMS])
def test_batch_norm_forms(s, dev, form):
    name, shape, stats, has_w, has_b, training, momentum, dt = form
    rng = np.random.default_rng(abs(hash(name)) % 2**32)
    C = shape[1]
    x = rng.uniform(-2, 2, shape).astype(dt)
    w = rng.uniform(0.5, 1.5, C).astype(dt)
    b = rng.uniform(-1, 1, C).astype(dt)
    rm = rng.uniform(-0.5, 0.5, C).astype(dt)
    rv = rng.uniform(0.5, 2.0, C).astype(dt)
    g = rng.uniform(-1, 1, shape).astype(dt)

    tx = torch.tensor(x, requires_grad=True)
    tw = torch.tensor(w, requires_grad=True) if has_w else None
    tb = torch.tensor(b, requires_grad=True) if has_b else None
    trm, trv = (torch.tensor(rm), torch.tensor(rv)) if stats else (None, None)
    ty = F.batch_norm(tx, trm, trv, tw, tb, training=training, momentum=momentum, eps=1e-5)
    (ty * torch.tensor(g)).sum().backward()

    X = s.tensor(x, device=dev, requires_grad=True)
    W = s.tensor(w, device=dev, requires_grad=True) if has_w else None
    B = s.tensor(b, device=dev, requires_grad=True) if has_b else None
    RM, RV = (s.tensor(rm, device=dev), s.tensor(rv, device=dev)) if stats else (None, None)
    Y = TF.batch_norm(X, RM, RV, W, B, training=training, momentum=momentum, eps=1e-5)
    close(Y.numpy(), ty.detach().numpy(), dt, f"{name}: forward")
    if stats:
        close(RM.numpy(), trm.numpy(), dt, f"{name}: running_mean")
        close(RV.numpy(), trv.numpy(), dt, f"{name}: running_var")
    grads = (Y * s.tensor(g, device=dev)).sum().backward()
    close(grads.get(X).numpy(), tx.grad.numpy(), dt, f"{name}: input grad")
    if has_w:
        close(grads.get(W).numpy(), tw.grad.numpy(), dt, f"{name}: weight grad")
    if has_b:
        close(grads.get(B).numpy(), tb.grad.numpy(), dt, f"{name}: bias grad")


@pytest.mark.parametrize("dev", DEVICES)
def test_running_stats_accumulate(s, dev):
    """Three training batches then eval: the running stats follow torch's every step."""
    rng = np.random.default_rng(3)
    rm, rv = torch.zeros(3), torch.ones(3)
    RM, RV = s.tensor(np.zeros(3, np.float32), device=dev), s.tensor(np.ones(3, np.float32),
                                                                        device=dev)
    for step in range(3):
        x = rng.normal(step, 1 + step, (5, 3, 2)).astype(np.float32)
        F.batch_norm(torch.tensor(x), rm, rv, training=True, momentum=0.25)
        TF.batch_norm(s.tensor(x, device=dev), RM, RV, training=True, momentum=0.25)
        close(RM.numpy(), rm.numpy(), np.float32, f"step {step}: running_mean")
        close(RV.numpy(), rv.numpy(), np.float32, f"step {step}: running_var")


@pytest.mark.parametrize("dev", DEVICES)
def test_running_stats_under_replay(s, dev):
    """A captured training forward, replayed on two more batches: each replay updates the
    running stats in place again, as three torch forwards do."""
    rng = np.random.default_rng(8)
    xs = [rng.standard_normal((4, 3, 2)).astype(np.float32) for _ in range(3)]
    rm, rv = torch.zeros(3), torch.ones(3)
    for x in xs:
        F.batch_norm(torch.tensor(x), rm, rv, training=True)
    RM, RV = s.tensor(np.zeros(3, np.float32), device=dev), s.tensor(np.ones(3, np.float32),
                                                                        device=dev)
    X = s.tensor(xs[0], device=dev)
    with s.capture(X) as step:
        TF.batch_norm(X, RM, RV, training=True)
    for x in xs[1:]:
        step.replay(s.tensor(x, device=dev))
    close(RM.numpy(), rm.numpy(), np.float32, "running_mean")
    close(RV.numpy(), rv.numpy(), np.float32, "running_var")


@pytest.mark.parametrize("dev", DEVICES)
def test_inplace_update_of_saved_stats_fails_backward(s, dev):
    """An eval forward saves the running stats; a training forward updates them in place;
    the first one's backward is then a typed error, as for any saved tensor updated in place.
    (torch 1.13 does not count batch_norm's running-stat updates: its backward silently
    reads the updated stats.) Without the second forward, the backward runs."""
    rng = np.random.default_rng(4)
    x = rng.normal(size=(4, 2, 3)).astype(np.float32)
    X = s.tensor(x, device=dev, requires_grad=True)
    RM, RV = s.tensor(np.zeros(2, np.float32), device=dev), s.tensor(np.ones(2, np.float32),
                                                                        device=dev)
    TF.batch_norm(X, RM, RV, training=False).sum().backward().get(X).numpy()
    y = TF.batch_norm(X, RM, RV, training=False)
    TF.batch_norm(s.tensor(x, device=dev), RM, RV, training=True)
    with pytest.raises(tensordd.InvalidArgumentError, match="modified by an inplace operation"):
        y.sum().backward().get(X).numpy()  # the backward's error surfaces at the next sync


@pytest.mark.parametrize("dev", DEVICES)
def test_two_training_forwards_then_backward(s, dev):
    """The same running stats through two training forwards before one backward (a shared
    BatchNorm applied twice): training does not save them, so this works, as in torch, with
    torch's gradients and running stats."""
    rng = np.random.default_rng(6)
    x1, x2 = (rng.normal(size=(4, 3, 2)).astype(np.float32) for _ in range(2))
    w = rng.uniform(0.5, 1.5, 3).astype(np.float32)
    tw, trm, trv = torch.tensor(w, requires_grad=True), torch.zeros(3), torch.ones(3)
    tl = sum((F.batch_norm(torch.tensor(x), trm, trv, tw, training=True) ** 2 * k).sum()
             for k, x in ((1.0, x1), (2.0, x2)))
    tl.backward()
    W = s.tensor(w, device=dev, requires_grad=True)
    RM, RV = s.tensor(np.zeros(3, np.float32), device=dev), s.tensor(np.ones(3, np.float32),
                                                                        device=dev)
    ys = [(TF.batch_norm(s.tensor(x, device=dev), RM, RV, W, training=True) ** 2 * k).sum()
          for k, x in ((1.0, x1), (2.0, x2))]
    grads = (ys[0] + ys[1]).backward()
    close(grads.get(W).numpy(), tw.grad.numpy(), np.float32, "weight grad")
    close(RM.numpy(), trm.numpy(), np.float32, "running_mean")
    close(RV.numpy(), trv.numpy(), np.float32, "running_var")


@pytest.mark.parametrize("dev", DEVICES)
def test_typed_errors(s, dev):
    X1 = s.tensor(np.ones((1, 3), np.float32), device=dev)
    RM, RV = s.tensor(np.zeros(3, np.float32), device=dev), s.tensor(np.ones(3, np.float32),
                                                                        device=dev)
    with pytest.raises(tensordd.InvalidArgumentError, match="more than 1 value per channel"):
        s.op("batch_norm", X1, RM, RV, training=True).numpy()
    X = s.tensor(np.ones((2, 4), np.float32), device=dev)
    with pytest.raises(tensordd.ShapeMismatchError):
        s.op("batch_norm", X, RM, RV).numpy()
    with pytest.raises(tensordd.InvalidArgumentError, match="required in eval mode"):
        s.op("batch_norm", X).numpy()
    with pytest.raises(tensordd.InvalidArgumentError, match="without running_var"):
        s.op("batch_norm", X, s.tensor(np.zeros(4, np.float32), device=dev)).numpy()
    with pytest.raises(tensordd.Error):  # integer input
        s.op("batch_norm", s.tensor(np.ones((2, 3), np.int64), device=dev), RM, RV).numpy()


def _pair_modules(s, dev, cls, tcls, **kw):
    tensordd.nn.init_seed(0)
    m = cls(**kw)
    t = tcls(**kw)
    with torch.no_grad():
        if t.weight is not None:
            t.weight.uniform_(0.5, 1.5)
            t.bias.uniform_(-1, 1)
    m.load_state_dict({k: v.detach().numpy() for k, v in t.state_dict().items()})
    return m.to(dev), t


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("kw,cls,shape", [
    (dict(num_features=3), "BatchNorm2d", (4, 3, 3, 2)),
    (dict(num_features=3, momentum=None), "BatchNorm2d", (4, 3, 3, 2)),
    (dict(num_features=4, affine=False), "BatchNorm1d", (5, 4)),
    (dict(num_features=2, track_running_stats=False), "BatchNorm1d", (3, 2, 4)),
], ids=["bn2d", "bn2d_cumulative", "bn1d_no_affine", "bn1d_untracked"])
def test_batchnorm_modules(s, dev, kw, cls, shape):
    """Modules: three train() steps and an eval() forward; outputs, parameters' gradients,
    running stats and num_batches_tracked as torch's; state_dict names as torch's."""
    rng = np.random.default_rng(5)
    m, t = _pair_modules(s, dev, getattr(tensordd.nn, cls), getattr(torch.nn, cls), **kw)
    assert list(m.state_dict()) == list(t.state_dict())
    for step in range(3):
        x = rng.normal(0.5 * step, 1.0, shape).astype(np.float32)
        g = rng.uniform(-1, 1, shape).astype(np.float32)
        ty = t(torch.tensor(x))
        y = m(s.tensor(x, device=dev))
        close(y.numpy(), ty.detach().numpy(), np.float32, f"step {step}: forward")
        if t.weight is not None:
            t.zero_grad()
            (ty * torch.tensor(g)).sum().backward()
            grads = (y * s.tensor(g, device=dev)).sum().backward()
            close(grads.get(m.weight).numpy(), t.weight.grad.numpy(), np.float32, "weight grad")
            close(grads.get(m.bias).numpy(), t.bias.grad.numpy(), np.float32, "bias grad")
    got, want = m.state_dict(), t.state_dict()
    for k in want:
        close(got[k].numpy(), want[k].detach().numpy(), np.float32, f"state_dict {k}")
    m.eval()
    t.eval()
    x = rng.normal(size=(1,) + shape[1:]).astype(np.float32)
    close(m(s.tensor(x, device=dev)).numpy(), t(torch.tensor(x)).detach().numpy(), np.float32,
          "eval forward, batch of 1")


# (name, fn, input shape, weight shape, bias, kwargs)
CONVS = [
    ("conv1d_strided_grouped", "conv1d", (2, 4, 9), (6, 2, 3), True,
     dict(stride=2, padding=1, dilation=2, groups=2)),
    ("conv1d_same_even_kernel", "conv1d", (2, 3, 7), (4, 3, 4), True, dict(padding="same")),
    ("conv1d_valid_unbatched", "conv1d", (3, 8), (2, 3, 3), False, dict(padding="valid")),
    ("conv_t_stride_output_padding", "conv_transpose2d", (2, 4, 3, 5), (4, 3, 3, 2), True,
     dict(stride=2, padding=1, output_padding=1)),
    ("conv_t_grouped_dilated", "conv_transpose2d", (2, 4, 3, 3), (4, 2, 3, 3), True,
     dict(stride=(1, 2), padding=(0, 1), groups=2, dilation=2)),
    ("conv_t_unbatched_plain", "conv_transpose2d", (3, 4, 4), (3, 2, 2, 2), False, dict()),
    ("conv_t_output_padding_over_stride", "conv_transpose2d", (1, 2, 3, 3), (2, 1, 2, 2), True,
     dict(dilation=3, output_padding=2)),
]


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("case", CONVS, ids=[c[0] for c in CONVS])
def test_convolutions(s, dev, case):
    name, fn, xs, ws, has_b, kw = case
    rng = np.random.default_rng(len(name))
    x = rng.standard_normal(xs).astype(np.float32)
    w = rng.standard_normal(ws).astype(np.float32)
    co = ws[0] if fn == "conv1d" else ws[1] * kw.get("groups", 1)
    b = rng.standard_normal(co).astype(np.float32)
    tx, tw, tb = (torch.tensor(a, requires_grad=True) for a in (x, w, b))
    ty = getattr(F, fn)(tx, tw, tb if has_b else None, **kw)
    X, W, B = (s.tensor(a, device=dev, requires_grad=True) for a in (x, w, b))
    Y = getattr(TF, fn)(X, W, B if has_b else None, **kw)
    close(Y.numpy(), ty.detach().numpy(), np.float32, f"{name}: forward")
    g = rng.uniform(-1, 1, tuple(ty.shape)).astype(np.float32)
    (ty * torch.tensor(g)).sum().backward()
    grads = (Y * s.tensor(g, device=dev)).sum().backward()
    for T, t, what in ((X, tx, "input"), (W, tw, "weight"), (B, tb, "bias")):
        if what != "bias" or has_b:
            close(grads.get(T).numpy(), t.grad.numpy(), np.float32, f"{name}: {what} grad")


@pytest.mark.parametrize("dev", DEVICES)
def test_conv_modules(s, dev):
    """nn.Conv1d and nn.ConvTranspose2d with torch's weights give torch's outputs."""
    rng = np.random.default_rng(9)
    for cls, kw, shape in ((
            "Conv1d", dict(in_channels=4, out_channels=6, kernel_size=3, stride=2, padding=1,
                           groups=2), (2, 4, 10)),
            ("ConvTranspose2d", dict(in_channels=4, out_channels=2, kernel_size=3, stride=2,
                                     padding=1, output_padding=1), (2, 4, 3, 3))):
        t = getattr(torch.nn, cls)(**kw)
        m = getattr(tensordd.nn, cls)(**kw)
        assert tuple(m.weight.shape) == tuple(t.weight.shape)
        m.load_state_dict({k: v.detach().numpy() for k, v in t.state_dict().items()})
        m.to(dev)
        x = rng.standard_normal(shape).astype(np.float32)
        close(m(s.tensor(x, device=dev)).numpy(), t(torch.tensor(x)).detach().numpy(),
              np.float32, cls)


@pytest.mark.parametrize("dev", DEVICES)
def test_conv_typed_errors(s, dev):
    x = s.tensor(np.ones((1, 2, 3, 3), np.float32), device=dev)
    w = s.tensor(np.ones((2, 1, 2, 2), np.float32), device=dev)
    with pytest.raises(tensordd.InvalidArgumentError, match="output_padding must be smaller"):
        TF.conv_transpose2d(x, w, stride=2, output_padding=2).numpy()
    with pytest.raises(tensordd.ShapeMismatchError):
        TF.conv_transpose2d(x, s.tensor(np.ones((3, 1, 2, 2), np.float32), device=dev)).numpy()
    x1 = s.tensor(np.ones((1, 2, 5), np.float32), device=dev)
    with pytest.raises(tensordd.InvalidArgumentError, match="stride"):
        s.op("conv1d", x1, s.tensor(np.ones((2, 2, 3), np.float32), device=dev),
             stride=[1, 2]).numpy()
    with pytest.raises(tensordd.InvalidArgumentError, match="needs stride 1"):
        TF.conv1d(x1, s.tensor(np.ones((2, 2, 3), np.float32), device=dev), stride=2,
                  padding="same").numpy()


DOUBLE = [
    ("batch_norm_train", [(4, 3, 2), (3,)],
     lambda s, dev, x, w: TF.batch_norm(x, None, None, w, None, training=True),
     lambda x, w: F.batch_norm(x, None, None, w, None, training=True)),
    ("batch_norm_eval", [(4, 3, 2), (3,)],
     lambda s, dev, x, w: TF.batch_norm(x, s.tensor(np.full(3, 0.2, np.float32), device=dev),
                                        s.tensor(np.full(3, 1.5, np.float32), device=dev), w),
     lambda x, w: F.batch_norm(x, torch.full((3,), 0.2), torch.full((3,), 1.5), w)),
    ("conv1d", [(2, 3, 6), (4, 3, 3)], lambda s, dev, x, w: TF.conv1d(x, w, padding=1),
     lambda x, w: F.conv1d(x, w, padding=1)),
    ("conv_transpose2d", [(2, 3, 3, 3), (3, 2, 3, 3)],
     lambda s, dev, x, w: TF.conv_transpose2d(x, w, stride=2, padding=1),
     lambda x, w: F.conv_transpose2d(x, w, stride=2, padding=1)),
]


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("case", DOUBLE, ids=[c[0] for c in DOUBLE])
def test_double_backward(s, dev, case):
    """A gradient penalty through each op: grad(sum(y^2), x, create_graph) then the backward
    of sum(gx^2), against torch's; rtol 1e-4, atol 1e-4 of the largest value."""
    name, shapes, fn, tfn = case
    rng = np.random.default_rng(11)
    x, w = (rng.standard_normal(sh).astype(np.float32) for sh in shapes)
    tx, tw = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    (tgx,) = torch.autograd.grad((tfn(tx, tw) ** 2).sum(), tx, create_graph=True)
    (tgx ** 2).sum().backward()
    X, W = s.tensor(x, device=dev, requires_grad=True), s.tensor(w, device=dev, requires_grad=True)
    (gx,) = tensordd.autograd.grad((fn(s, dev, X, W) ** 2).sum(), X, create_graph=True)
    grads = (gx ** 2).sum().backward()
    for T, t, what in ((X, tx, "input"), (W, tw, "weight")):
        want = t.grad.numpy()
        np.testing.assert_allclose(grads.get(T).numpy(), want, rtol=1e-4,
                                   atol=1e-4 * max(1.0, float(np.abs(want).max())),
                                   err_msg=f"{name}: second-order {what} grad")
