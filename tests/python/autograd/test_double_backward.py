"""Double backward: backward(create_graph=True) and
tensordd.autograd.grad against torch 1.13's torch.autograd.grad(..., create_graph=True)
on CPU, the same computation on the same random inputs on both sides.

- the sweep: every gradient case of test_grad_torch.py (each op with a backward
  formula, its argument forms, views, broadcasting, reuse) differentiated twice: the
  first gradients g_i of loss = sum(op(x) * w) with create_graph, then the
  Hessian-vector product d/dx_j sum_i <g_i, v_i> for random v_i, on cpu:0 in float32
  and float64 and on ref:0 in float64 (in the GPU suites CUDA_SWEEP's cases on cuda:0 in
  float32, kept few: the emulator runs each kernel on the host; a case whose passes need
  an op or dtype the cuda backend declines, typed, is skipped there);
- a WGAN-GP gradient penalty ||grad_x D(x)||: its value and its gradient to D's
  parameters (with tanh in float32 on cuda:0 too), through grad() and through
  backward(create_graph=True) + Gradients.get;
- Hessian-vector products of MLP losses (linear, relu/tanh/gelu/sigmoid,
  softmax/log_softmax, cross_entropy, mse_loss, layer_norm, conv2d);
- grad-of: non-leaf inputs, allow_unused, several outputs with grad_outputs;
- what is refused: a formula the daemon cannot differentiate (a typed
  UNSUPPORTED_OP naming the op, no gradients bound, the session goes on), an input
  that does not require grad (NOT_TRACKED), a parameter updated in place between the
  two passes (the version counter), a second pass through a freed graph;
- memory: the session's bytes return to where they were once the graphs are dropped.

Tolerances (assert_allclose, |got - want| <= atol + rtol * |want|), scaled by
sqrt(k) as in test_grad_torch.py (k: terms summed into one element):
  float64: rtol 1e-9, atol 1e-11 (two passes of chained ops, each rounded);
  float32: rtol 1e-4, atol 1e-4 (a second derivative cancels more than a first).
"""

from __future__ import annotations

import gc
import math
import zlib

import numpy as np
import pytest

import tensordd
import tensordd.nn.functional as TF
from gpusuite import CUDA, declines_skip, host_and_cuda
from helpers import require_autodiff
from test_grad_torch import CASES

torch = pytest.importorskip("torch")
FN = torch.nn.functional
agrad = tensordd.autograd.grad

TOLS = {"float32": (1e-4, 1e-4), "float64": (1e-9, 1e-11)}


@pytest.fixture
def ad(session):
    require_autodiff(session)
    return session


@pytest.fixture
def dad(device_session):
    """ad on the test's device."""
    require_autodiff(device_session)
    return device_session


def _tol(dtype, k=1):
    rtol, atol = TOLS[dtype]
    scale = max(1.0, math.sqrt(k))
    return rtol * scale, atol * scale


def _np(t):
    # clone: torch 1.13 answers some zero gradients (sgn's, abs's second derivative) with
    # a ZeroTensor, whose numpy() reads memory it does not own
    return None if t is None else t.detach().clone().numpy()


# ---------------------------------------------------------------- the sweep

def _sweep_params():
    out = []
    for c in CASES:
        if c.xfail:
            continue  # no first-order formula: nothing to differentiate twice
        for device, dtype in (("cpu:0", "float32"), ("cpu:0", "float64"), ("ref:0", "float64")):
            out.append(pytest.param(c, device, dtype, id=f"{c.name}-{device}-{dtype}"))
    return out


SWEEP = _sweep_params()
# The sweep's cases on cuda:0 (float32).
CUDA_SWEEP = ("tanh", "sigmoid", "gelu", "mul-bcast", "div-bcast", "matmul-2d-2d",
              "softmax-dim1", "log_softmax-dim-1", "logsumexp-dim1", "cross_entropy-mean",
              "mse_loss-mean", "layer_norm-affine", "mlp")


def _device_sweep():
    """SWEEP on the host devices, CUDA_SWEEP on cuda:0 (the GPU suites)."""
    return host_and_cuda(SWEEP, [pytest.param(c, CUDA, "float32", id=f"{c.name}-{CUDA}-float32")
                                 for c in CASES if c.name in CUDA_SWEEP])


def test_cuda_sweep_cases_exist():
    assert set(CUDA_SWEEP) <= {c.name for c in CASES if not c.xfail}


@pytest.mark.parametrize("c,device,dtype", _device_sweep())
def test_hvp_matches_torch(dad, c, device, dtype):
    with declines_skip(device):
        _check_hvp(dad, c, device, dtype)


def _check_hvp(ad, c, device, dtype):
    rng = np.random.default_rng(zlib.crc32(f"dbl/{c.name}/{dtype}".encode()))
    arrays = [(make(rng, dtype), g) for make, g in c.inputs]
    ts = [ad.tensor(a, device=device, requires_grad=g) for a, g in arrays]
    tts = [torch.tensor(a, requires_grad=g) for a, g in arrays]
    leaves = [i for i, (_, g) in enumerate(arrays) if g]

    tout = c.tfn(*tts)
    w = rng.uniform(0.5, 1.5, tuple(tout.shape)).astype(str(tout.dtype).replace("torch.", ""))
    tloss = (tout * torch.from_numpy(w)).sum()
    tg = torch.autograd.grad(tloss, [tts[i] for i in leaves], create_graph=True)
    vs = [rng.uniform(-1.0, 1.0, tuple(tts[i].shape)).astype(dtype) for i in leaves]
    ts2 = sum((g * torch.from_numpy(v)).sum() for g, v in zip(tg, vs))
    if ts2.requires_grad:
        th = torch.autograd.grad(ts2, [tts[i] for i in leaves], allow_unused=True)
    else:
        th = (None,) * len(leaves)

    out = c.fn(ad, *ts)
    loss = (out * ad.tensor(w, device=device)).sum()
    g = agrad(loss, [ts[i] for i in leaves], create_graph=True)
    s2 = None
    for gi, v in zip(g, vs):
        term = (gi * ad.tensor(v, device=device)).sum()
        s2 = term if s2 is None else s2 + term
    if s2.requires_grad:
        h = agrad(s2, [ts[i] for i in leaves], allow_unused=True)
    else:
        h = (None,) * len(leaves)

    rtol, atol = _tol("float32" if tout.dtype == torch.float32 else dtype, c.k)
    what = f"{c.name} {dtype} on {device}"
    for n, (a, b) in enumerate(zip(g, tg)):
        np.testing.assert_allclose(a.numpy(), _np(b), rtol=rtol, atol=atol,
                                   err_msg=f"{what}: first gradient {n}")
    for n, (a, b) in enumerate(zip(h, th)):
        shape = tuple(tts[leaves[n]].shape)
        want = np.zeros(shape) if b is None else _np(b)
        got = np.zeros(shape) if a is None else a.numpy()
        if a is not None:
            assert a.device == device and a.dtype == dtype, what
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol,
                                   err_msg=f"{what}: Hessian-vector product {n}")


def test_sweep_covers_the_ops():
    """The sweep's count, stated: the op-table ops it differentiates twice."""
    ops = {c.name.split("-")[0] for c in CASES if not c.xfail}
    assert len(SWEEP) == 3 * sum(1 for c in CASES if not c.xfail)
    # the ops named by the sweep's cases (composites such as "mlp" count once)
    assert len(ops) >= 60, sorted(ops)


# ---------------------------------------------------------------- argument forms, attention, batch_norm

def _arg_form_cases():
    """The gradient cases of test_torch_arg_forms.py and test_attention.py (their inputs made
    float64 here), and batch_norm's forms: (id, makers, grads, fn, tfn)."""
    import importlib
    TF = tensordd.nn.functional
    out = []
    for name in ("test_torch_arg_forms", "test_attention"):
        mod = importlib.import_module(name)
        out += [(c.name, c.inputs, c.grads, c.fn, c.tfn) for c in mod.CASES if c.grads]

    def bn(training, stats, affine):
        def fn(s, x, w, b, rm, rv):
            return TF.batch_norm(x, rm if stats else None, rv if stats else None,
                                 w if affine else None, b if affine else None,
                                 training=training, momentum=0.1, eps=1e-5)

        def tfn(x, w, b, rm, rv):
            return FN.batch_norm(x, rm if stats else None, rv if stats else None,
                                 w if affine else None, b if affine else None,
                                 training=training, momentum=0.1, eps=1e-5)
        return fn, tfn

    mk = [lambda rng: rng.uniform(-2, 2, (4, 3, 2, 2)), lambda rng: rng.uniform(0.5, 1.5, 3),
          lambda rng: rng.uniform(-1, 1, 3), lambda rng: rng.uniform(-0.5, 0.5, 3),
          lambda rng: rng.uniform(0.5, 2.0, 3)]
    for tag, training, stats, affine in (("train_affine", True, True, True),
                                         ("train_plain_no_stats", True, False, False),
                                         ("eval_affine", False, True, True)):
        out.append((f"batch_norm_{tag}", mk, [0, 1, 2] if affine else [0], *bn(training, stats,
                                                                               affine)))
    return out


def _arg_form_params():
    try:
        return [pytest.param(c, id=c[0]) for c in _arg_form_cases()]
    except ImportError as e:  # a module of the cases missing from this tree
        return [pytest.param(None, id="arg_forms", marks=pytest.mark.skip(reason=str(e)))]


@pytest.mark.parametrize("c", _arg_form_params())
def test_hvp_of_arg_form_and_attention_ops_matches_torch(ad, c):
    """float64 on cpu:0, rtol 1e-8, atol 1e-9 (these cases' sizes sum up to ~30 terms)."""
    name, makers, req, fn, tfn = c
    rng = np.random.default_rng(zlib.crc32(f"dbl14/{name}".encode()))
    arrays = []
    for m in makers:
        a = np.asarray(m(rng))
        arrays.append(a.astype(np.float64) if a.dtype.kind == "f" else a)
    tts = [torch.tensor(a, requires_grad=i in req) for i, a in enumerate(arrays)]
    ts = [ad.tensor(a, requires_grad=i in req) for i, a in enumerate(arrays)]
    tout = tfn(*tts)
    w = rng.uniform(0.5, 1.5, tuple(tout.shape))
    tg = torch.autograd.grad((tout * torch.from_numpy(w)).nan_to_num().sum(),
                             [tts[i] for i in req], create_graph=True, allow_unused=True)
    vs = [rng.uniform(-1.0, 1.0, arrays[i].shape) for i in req]
    ts2 = sum((g * torch.from_numpy(v)).sum() for g, v in zip(tg, vs) if g is not None)
    th = torch.autograd.grad(ts2, [tts[i] for i in req], allow_unused=True) \
        if torch.is_tensor(ts2) and ts2.requires_grad else (None,) * len(req)

    out = fn(ad, *ts)
    prod = out * ad.tensor(w)
    if np.isnan(tout.detach().numpy()).any():  # (sdpa's fully masked row)
        prod = prod.masked_fill(ad.tensor(np.isnan(tout.detach().numpy())), 0.0)
    g = agrad(prod.sum(), [ts[i] for i in req], create_graph=True, allow_unused=True)
    s2 = None
    for gi, v in zip(g, vs):
        if gi is not None:
            term = (gi * ad.tensor(v)).sum()
            s2 = term if s2 is None else s2 + term
    h = agrad(s2, [ts[i] for i in req], allow_unused=True) \
        if s2 is not None and s2.requires_grad else (None,) * len(req)
    for n, (a, b, i) in enumerate(zip(g, tg, req)):
        zero = np.zeros(arrays[i].shape)
        np.testing.assert_allclose(zero if a is None else a.numpy(),
                                   zero if b is None else _np(b), rtol=1e-8, atol=1e-9,
                                   err_msg=f"{name}: first gradient {n}")
    for n, (a, b, i) in enumerate(zip(h, th, req)):
        zero = np.zeros(arrays[i].shape)
        np.testing.assert_allclose(zero if a is None else a.numpy(),
                                   zero if b is None else _np(b), rtol=1e-8, atol=1e-9,
                                   err_msg=f"{name}: Hessian-vector product {n}")


# ---------------------------------------------------------------- gradient penalty

def _disc(lib, x, p, act):
    h = lib["linear"](x, p[0], p[1])
    h = lib[act](h)
    return lib["linear"](h, p[2], p[3])


def _tlib():
    return {"linear": FN.linear, "tanh": torch.tanh, "relu": torch.relu, "gelu": FN.gelu,
            "sigmoid": torch.sigmoid, "sqrt": torch.sqrt}


def _slib(s):
    return {"linear": lambda x, w, b: s.op("linear", x, w, b), "tanh": lambda x: x.tanh(),
            "relu": lambda x: x.relu(), "gelu": lambda x: x.gelu(),
            "sigmoid": lambda x: x.sigmoid(), "sqrt": lambda x: x.sqrt()}


def _gp_arrays(dtype, seed=3):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((5, 4)).astype(dtype)
    ps = [rng.standard_normal(sh).astype(dtype) * 0.7 for sh in ((6, 4), (6,), (1, 6), (1,))]
    return x, ps


def _gp_params():
    """Each activation in float32 and float64 on cpu:0; tanh in float32 on cuda:0."""
    return host_and_cuda(
        [pytest.param(dtype, act, "cpu:0", id=f"{dtype}-{act}-cpu:0")
         for act in ("tanh", "relu", "gelu", "sigmoid") for dtype in ("float32", "float64")],
        [pytest.param("float32", "tanh", CUDA, id=f"float32-tanh-{CUDA}")])


@pytest.mark.parametrize("dtype,act,device", _gp_params())
def test_gradient_penalty_matches_torch(dad, act, dtype, device):
    with declines_skip(device):
        _check_gradient_penalty(dad, act, dtype, device)


def _check_gradient_penalty(ad, act, dtype, device):
    x0, ps0 = _gp_arrays(dtype)
    tx = torch.tensor(x0, requires_grad=True)
    tps = [torch.tensor(p, requires_grad=True) for p in ps0]
    (tgx,) = torch.autograd.grad(_disc(_tlib(), tx, tps, act).sum(), tx, create_graph=True)
    tgp = ((tgx.square().sum(1).sqrt() - 1.0).square()).mean()
    tgrads = torch.autograd.grad(tgp, tps[:3])  # (the output bias does not reach grad_x)

    x = ad.tensor(x0, device=device, requires_grad=True)
    ps = [ad.tensor(p, device=device, requires_grad=True) for p in ps0]
    (gx,) = agrad(_disc(_slib(ad), x, ps, act).sum(), x, create_graph=True)
    assert gx.requires_grad
    gp = ((gx.square().sum(1).sqrt() - 1.0).square()).mean()
    grads = agrad(gp, ps[:3])
    rtol, atol = _tol(dtype, 6)
    np.testing.assert_allclose(gp.numpy(), _np(tgp), rtol=rtol, atol=atol)
    for n, (a, b) in enumerate(zip(grads, tgrads)):
        assert a.device == device
        np.testing.assert_allclose(a.numpy(), _np(b), rtol=rtol, atol=atol,
                                   err_msg=f"gradient penalty ({act}): parameter {n}")


def test_gradient_penalty_through_backward_and_gradients(ad):
    """The same through Tensor.backward(create_graph=True) and Gradients.get, then
    a plain backward() of the penalty plus the loss (retain_graph defaulted to True)."""
    x0, ps0 = _gp_arrays("float64", seed=11)
    tx = torch.tensor(x0, requires_grad=True)
    tps = [torch.tensor(p, requires_grad=True) for p in ps0]
    tloss = _disc(_tlib(), tx, tps, "tanh").sum()
    tloss.backward(create_graph=True)
    ttotal = tloss + (tx.grad.square().sum(1) - 1.0).square().mean()
    tgrads = torch.autograd.grad(ttotal, tps)  # (the output bias through the loss only)

    x = ad.tensor(x0, requires_grad=True)
    ps = [ad.tensor(p, requires_grad=True) for p in ps0]
    loss = _disc(_slib(ad), x, ps, "tanh").sum()
    first = loss.backward(create_graph=True)
    gx = first.get(x)
    assert gx.requires_grad
    total = loss + (gx.square().sum(1) - 1.0).square().mean()
    second = total.backward()  # the first graph was retained (create_graph's default)
    for n, (p, tp) in enumerate(zip(ps, tgrads)):
        np.testing.assert_allclose(second.get(p).numpy(), _np(tp), rtol=1e-9, atol=1e-11,
                                   err_msg=f"parameter {n}")


def test_dot_grad_idiom_accumulates_like_torch(ad):
    """torch's idiom: loss.backward(create_graph=True), then x.grad is differentiable, and
    a backward of a function of it adds to x.grad (and to w.grad)."""
    x0, w0 = np.array([0.3, -1.2, 2.0]), np.array([0.5, 1.5, -0.7])
    tx, tw = torch.tensor(x0, requires_grad=True), torch.tensor(w0, requires_grad=True)
    (tx.tanh() * tw).sum().backward(create_graph=True)
    (tx.grad * tx.grad).sum().backward()

    ad.zero_grad()  # x.grad collects every backward from here on
    x, w = ad.tensor(x0, requires_grad=True), ad.tensor(w0, requires_grad=True)
    (x.tanh() * w).sum().backward(create_graph=True)
    g = x.grad
    assert g.requires_grad
    (g * g).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), _np(tx.grad), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(w.grad.numpy(), _np(tw.grad), rtol=1e-12, atol=1e-14)


# ---------------------------------------------------------------- HVPs of models

def _hvp_case(ad, build_s, build_t, arrays, params, dtype, k, device="cpu:0"):
    rng = np.random.default_rng(17)
    tin = [torch.tensor(a, requires_grad=i in params) for i, a in enumerate(arrays)]
    sin = [ad.tensor(a, device=device, requires_grad=i in params) for i, a in enumerate(arrays)]
    vs = [rng.uniform(-1, 1, arrays[i].shape).astype(dtype) for i in params]
    tloss = build_t(*tin)
    tg = torch.autograd.grad(tloss, [tin[i] for i in params], create_graph=True)
    th = torch.autograd.grad(sum((g * torch.from_numpy(v)).sum() for g, v in zip(tg, vs)),
                             [tin[i] for i in params])
    loss = build_s(ad, *sin)
    g = agrad(loss, [sin[i] for i in params], create_graph=True)
    dot = None
    for gi, v in zip(g, vs):
        term = (gi * ad.tensor(v, device=device)).sum()
        dot = term if dot is None else dot + term
    h = agrad(dot, [sin[i] for i in params])
    rtol, atol = _tol(dtype, k)
    np.testing.assert_allclose(loss.numpy(), _np(tloss), rtol=rtol, atol=atol)
    for n, (a, b) in enumerate(zip(g, tg)):
        np.testing.assert_allclose(a.numpy(), _np(b), rtol=rtol, atol=atol,
                                   err_msg=f"first gradient {n}")
    for n, (a, b) in enumerate(zip(h, th)):
        np.testing.assert_allclose(a.numpy(), _np(b), rtol=rtol, atol=atol,
                                   err_msg=f"Hessian-vector product {n}")


def _mlp_arrays(dtype, seed=5):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(sh).astype(dtype) * sc for sh, sc in
            (((8, 6), 1.0), ((7, 6), 0.5), ((7,), 0.5), ((4, 7), 0.5), ((4,), 0.5))]


MLP_HEADS = {
    "cross_entropy": (lambda s, y, t: s.op("cross_entropy", y, t),
                      lambda y, t: FN.cross_entropy(y, t)),
    "log_softmax-nll": (lambda s, y, t: s.op("nll_loss", y.log_softmax(1), t),
                        lambda y, t: FN.nll_loss(y.log_softmax(1), t)),
    "softmax-mse": (lambda s, y, t: s.op("mse_loss", y.softmax(1), s.op("one_hot", t,
                                                                       num_classes=4)
                                         .to(dtype=y.dtype)),
                    lambda y, t: FN.mse_loss(y.softmax(1), FN.one_hot(t, 4).to(y.dtype))),
}


@pytest.mark.parametrize("act", ["relu", "tanh", "gelu", "sigmoid"])
@pytest.mark.parametrize("head", sorted(MLP_HEADS))
def test_mlp_hvp_matches_torch(ad, act, head):
    dtype = "float64"
    arrays = _mlp_arrays(dtype)
    t = np.random.default_rng(1).integers(0, 4, 8)
    sh, th = MLP_HEADS[head]
    sl, tl = _slib(ad), _tlib()

    def build_s(s, x, w1, b1, w2, b2):
        return sh(s, _disc(sl, x, [w1, b1, w2, b2], act), s.tensor(t))

    def build_t(x, w1, b1, w2, b2):
        return th(_disc(tl, x, [w1, b1, w2, b2], act), torch.tensor(t))

    _hvp_case(ad, build_s, build_t, arrays, [1, 2, 3, 4], dtype, k=7)


def test_layer_norm_and_conv2d_hvp_match_torch(ad):
    dtype = "float64"
    rng = np.random.default_rng(9)
    arrays = [rng.standard_normal(sh).astype(dtype) for sh in
              ((2, 3, 6, 5), (4, 3, 3, 3), (4,), (5,), (5,))]

    def build_s(s, x, w, b, lw, lb):
        y = s.op("conv2d", x, w, b, padding=1).gelu()
        return s.op("layer_norm", y, lw, lb, normalized_shape=[5]).square().mean()

    def build_t(x, w, b, lw, lb):
        y = FN.gelu(FN.conv2d(x, w, b, padding=1))
        return FN.layer_norm(y, [5], lw, lb).square().mean()

    _hvp_case(ad, build_s, build_t, arrays, [0, 1, 2, 3, 4], dtype, k=30)


# ---------------------------------------------------------------- grad-of forms

def test_grad_of_non_leaf_unused_and_several_outputs(ad):
    rng = np.random.default_rng(2)
    a0, b0 = rng.standard_normal((3, 4)), rng.standard_normal(4)
    ta, tb = torch.tensor(a0, requires_grad=True), torch.tensor(b0, requires_grad=True)
    a, b = ad.tensor(a0, requires_grad=True), ad.tensor(b0, requires_grad=True)
    th = (ta * tb).tanh()
    h = (a * b).tanh()
    # a non-leaf input: the gradient at h, not past it
    (tgh,) = torch.autograd.grad((th.exp() * 2).sum(), th)
    (gh,) = agrad((h.exp() * 2).sum(), h)
    np.testing.assert_allclose(gh.numpy(), tgh.numpy(), rtol=1e-12)
    # an unused input
    th = (ta * tb).tanh()
    c = ad.tensor(np.ones(2), requires_grad=True)
    with pytest.raises(RuntimeError, match="not used"):
        agrad(h.sum(), [a, c])
    h = (a * b).tanh()  # (that pass freed h's graph: retain_graph defaults to False)
    ga, gc_ = agrad(h.sum(), [a, c], allow_unused=True)
    assert gc_ is None
    np.testing.assert_allclose(ga.numpy(), torch.autograd.grad(th.sum(), ta)[0].numpy(),
                               rtol=1e-12)
    # several outputs, with grad_outputs
    th = (ta * tb).tanh()
    go = rng.standard_normal((3, 4))
    touts = torch.autograd.grad([th, (ta ** 2).sum()], [ta, tb],
                                grad_outputs=[torch.tensor(go), None])
    h = (a * b).tanh()
    outs = agrad([h, (a ** 2).sum()], [a, b], grad_outputs=[ad.tensor(go), None])
    for x, y in zip(outs, touts):
        np.testing.assert_allclose(x.numpy(), y.numpy(), rtol=1e-12, atol=1e-14)
    # a gradient of a gradient of a gradient (third order): d3/da3 sum(a^4) = 24 a
    (g1,) = agrad((a ** 4).sum(), a, create_graph=True)
    (g2,) = agrad(g1.sum(), a, create_graph=True)
    (g3,) = agrad(g2.sum(), a)
    np.testing.assert_allclose(g3.numpy(), 24 * a0, rtol=1e-12)


# ---------------------------------------------------------------- refusals

def test_input_not_requiring_grad_is_refused(ad):
    a = ad.tensor(np.ones(3), requires_grad=True)
    k = ad.tensor(np.ones(3))
    with pytest.raises(RuntimeError, match="does not require grad"):
        agrad((a * k).sum(), k)
    # the daemon's own check (the Backward request's inputs)
    with pytest.raises(tensordd.NotTrackedError, match="inputs\\[0\\]"):
        tensordd.autograd.backward((a * k).sum(), inputs=[k])


@pytest.mark.parametrize("k, pad, stride, dil, hw", [
    (1, 1, 1, 1, 1), (1, 2, 2, 1, 5), (2, 2, 2, 1, 5), (3, 3, 1, 1, 4), (2, 3, 1, 2, 3)])
def test_conv2d_padding_wider_than_the_kernel_matches_torch(ad, k, pad, stride, dil, hw):
    """conv2d's input gradient is a full correlation padded by dil*(k-1) - pad; where the
    padding is wider than the dilated kernel the daemon crops instead (it was refused):
    first-order gradients, and the gradient of a gradient penalty, against torch (float64,
    rtol 1e-9, atol 1e-11)."""
    rng = np.random.default_rng(k * 100 + pad * 10 + stride)
    xa, wa = rng.standard_normal((2, 3, hw, hw)), rng.standard_normal((4, 3, k, k))
    x, w = ad.tensor(xa, requires_grad=True), ad.tensor(wa, requires_grad=True)
    tx, tw = (torch.tensor(a, requires_grad=True) for a in (xa, wa))
    kw = dict(padding=pad, stride=stride, dilation=dil)
    gx, gw = agrad(ad.op("conv2d", x, w, **kw).square().sum(), [x, w], create_graph=True)
    tgx, tgw = torch.autograd.grad(FN.conv2d(tx, tw, **kw).square().sum(), [tx, tw],
                                   create_graph=True)
    for got, want in ((gx, tgx), (gw, tgw)):
        np.testing.assert_allclose(got.numpy(), want.detach().numpy(), rtol=1e-9, atol=1e-11)
    hx, hw_ = agrad(gx.square().sum() + gw.square().sum(), [x, w])
    thx, thw = torch.autograd.grad(tgx.square().sum() + tgw.square().sum(), [tx, tw])
    np.testing.assert_allclose(hx.numpy(), thx.numpy(), rtol=1e-9, atol=1e-11)
    np.testing.assert_allclose(hw_.numpy(), thw.numpy(), rtol=1e-9, atol=1e-11)


def test_formula_without_a_derivative_is_a_typed_error(ad):
    """embedding_bag's weight gradient is an op of its own (embedding_bag_backward) with
    no formula yet: a second pass through it fails with UNSUPPORTED_OP naming it; nothing
    is bound; the session goes on, and the first-order gradient is still right."""
    rng = np.random.default_rng(4)
    wa = rng.standard_normal((5, 3))
    w = ad.tensor(wa, requires_grad=True)
    idx = ad.tensor(np.array([0, 2, 2, 4], np.int64))
    off = ad.tensor(np.array([0, 2], np.int64))
    y = TF.embedding_bag(idx, w, off, mode="sum")
    (gw,) = agrad(y.square().sum(), [w], create_graph=True)
    pen = gw.square().sum()
    ad.sync()
    gc.collect()
    before = ad.stats()["handles"]
    with pytest.raises(tensordd.UnsupportedOpError, match="embedding_bag_backward") as e:
        agrad(pen, [w])
    assert e.value.code == "UNSUPPORTED_OP"
    tw = torch.tensor(wa, requires_grad=True)
    ty = FN.embedding_bag(torch.tensor([0, 2, 2, 4]), tw, torch.tensor([0, 2]), mode="sum")
    (tg,) = torch.autograd.grad(ty.square().sum(), [tw])
    np.testing.assert_allclose(gw.numpy(), tg.numpy(), rtol=1e-12)
    del e
    gc.collect()
    ad.sync()  # (carries the releases of the failed pass's ids)
    assert ad.stats()["handles"] == before  # no Gradients left bound by the failed pass
    (h,) = agrad((w * w).sum(), w)
    np.testing.assert_allclose(h.numpy(), 2 * wa, rtol=1e-12)


def test_inplace_update_between_passes_is_refused(ad):
    """The version counter still guards the graph a create_graph pass made: an
    optimizer step on w after the first pass makes the second one fail, as in torch."""
    w0 = np.array([[1.0, -2.0], [0.5, 3.0]], np.float32)
    tw = torch.tensor(w0, requires_grad=True)
    (tg,) = torch.autograd.grad((tw * tw * tw).sum(), tw, create_graph=True)
    topt = torch.optim.SGD([tw], lr=0.1)
    tw.grad = torch.ones_like(tw)
    topt.step()
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        torch.autograd.grad(tg.sum(), tw)

    w = ad.tensor(w0, requires_grad=True)
    (g,) = agrad((w * w * w).sum(), w, create_graph=True)
    opt = tensordd.optim.SGD([w], lr=0.1)
    opt.step((w * 1.0).sum().backward())
    with pytest.raises(tensordd.InvalidArgumentError, match="modified by an inplace operation"):
        agrad(g.sum(), w)


def test_second_pass_through_a_freed_graph_is_refused(ad):
    """create_graph with retain_graph=False: the first graph's saved tensors are freed,
    and g's graph leads through the first one (exp's output), so a pass through either
    is refused, as torch refuses it."""
    a0 = np.array([0.5, 1.5])
    ta = torch.tensor(a0, requires_grad=True)
    (tg,) = torch.autograd.grad((ta.exp() * ta).sum(), ta, create_graph=True,
                                retain_graph=False)
    with pytest.raises(RuntimeError, match="second time"):
        torch.autograd.grad(tg.sum(), ta)

    a = ad.tensor(a0, requires_grad=True)
    y = (a.exp() * a).sum()
    (g,) = agrad(y, a, create_graph=True, retain_graph=False)
    with pytest.raises(tensordd.InvalidArgumentError, match="second time"):
        agrad(y, a)
    with pytest.raises(tensordd.InvalidArgumentError, match="second time"):
        agrad(g.sum(), a)
    # a grad-of pass runs only what leads to its inputs: h's own (freed) graph is not needed
    # for the gradient at h, as in torch; through it to a, it is refused
    h = (a * 2.0).tanh()
    agrad(h.sum(), a)
    (gh,) = agrad(h.exp().sum(), h)
    np.testing.assert_allclose(gh.numpy(), np.exp(np.tanh(2 * a0)), rtol=1e-12)
    with pytest.raises(tensordd.InvalidArgumentError, match="second time"):
        agrad(h.exp().sum(), a)
    # retained (create_graph's default), the same second derivative works
    y = (a.exp() * a).sum()
    (g,) = agrad(y, a, create_graph=True)
    (h,) = agrad(g.sum(), a)
    np.testing.assert_allclose(h.numpy(), np.exp(a0) * (a0 + 2), rtol=1e-12)


# ---------------------------------------------------------------- memory

def _bytes(s):
    for e in s.stats()["session_list"]:
        if e["session_id"] == s.session_id:
            return e["bytes_in_use"]
    raise AssertionError("own session not in the stats")


def test_graphs_of_both_passes_are_freed(ad):
    """The session's bytes (tensors, graph nodes, gradients) return to their level
    before the passes once every tensor of them is dropped."""
    rng = np.random.default_rng(8)
    ps = [ad.tensor(rng.standard_normal(sh), requires_grad=True) for sh in ((16, 8), (16,))]
    x = ad.tensor(rng.standard_normal((32, 8)))
    ad.sync()
    gc.collect()
    base = _bytes(ad)
    for _ in range(3):
        y = ad.op("linear", x, ps[0], ps[1]).tanh()
        g = agrad(y.square().mean(), ps, create_graph=True)
        pen = sum((gi * gi).sum() for gi in g)
        grads = pen.backward()
        assert grads.get(ps[0]).shape == (16, 8)
        mid = _bytes(ad)
        assert mid > base
        del y, g, pen, grads
        gc.collect()
        ad.sync()
        assert _bytes(ad) == base


def test_create_graph_pass_counts_against_the_quota(start_daemon):
    """A create_graph pass's graph is charged to --session-memory like the forward's: a
    pass the quota cannot hold fails with RESOURCE_EXHAUSTED, leaves nothing behind, and
    the first-order pass of the same graph works on. (400 forward ops take ~370 KB; their
    create_graph pass ~960 KB more: a 1 MiB quota holds the first, not both.)"""
    d = start_daemon("--session-memory", str(1 << 20))
    with tensordd.connect(d.endpoint, timeout=60) as s:
        require_autodiff(s)
        w0 = np.linspace(-0.5, 0.5, 16)
        w = s.tensor(w0.astype(np.float32), requires_grad=True)
        s.sync()
        base = _bytes(s)
        y = w
        for _ in range(200):
            y = y.tanh() * 1.01
        loss = y.sum()
        s.sync()
        forward = _bytes(s)
        with pytest.raises(tensordd.ResourceExhaustedError):
            agrad(loss, w, create_graph=True)
        gc.collect()
        s.sync()
        assert _bytes(s) == forward  # the failed pass's nodes and values are gone
        (g,) = agrad(loss, w)
        tw = torch.tensor(w0.astype(np.float32), requires_grad=True)
        ty = tw
        for _ in range(200):
            ty = ty.tanh() * 1.01
        (tg,) = torch.autograd.grad(ty.sum(), tw)
        np.testing.assert_allclose(g.numpy(), tg.numpy(), rtol=1e-4, atol=1e-6)
        del y, loss, g
        gc.collect()
        s.sync()
        assert _bytes(s) == base
