"""scaled_dot_product_attention, einsum and interpolate against torch 1.13.

torch 1.13 has no F.scaled_dot_product_attention, so the oracle is torch 2.x's definition
written out: softmax(q @ k^T * scale + mask) @ v, the mask a masked_fill of -inf where a bool
mask is False (or above the diagonal for is_causal) or added when float. Forward values and
the gradients of sum(out * w) (w random) are compared with torch autograd's through that
formula, rtol 1e-5 and the case's atol, on cpu:0 and ref:0, or on cuda:0 when TDD_GPU_ARGS
is set (the GPU suites). Dropout is checked by its statistics and by its seed: the same seed
draws the same weights, forward and backward.
"""

from __future__ import annotations

import math
import zlib

import numpy as np
import pytest

import tensordd
import tensordd.nn.functional as TF
from conftest import Daemon
from test_torch_arg_forms import (  # noqa: F401 (fd and s are fixtures)
    DEVICES, GPU_ARGS, check_case_matches_torch, const, f32, fd, s)

torch = pytest.importorskip("torch")
F = torch.nn.functional


def bmask(*shape, p=0.7):
    return lambda rng: rng.random(shape) < p


def torch_sdpa(q, k, v, mask=None, causal=False, scale=None):
    """torch 2.x's scaled_dot_product_attention, dropout aside, as its documentation writes it."""
    L, S = q.shape[-2], k.shape[-2]
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    att = q @ k.transpose(-2, -1) * scale
    if causal:
        att = att.masked_fill(~torch.ones(L, S, dtype=torch.bool).tril(), float("-inf"))
    if mask is not None:
        att = att.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else att + mask
    return torch.softmax(att, dim=-1) @ v


class Case:
    def __init__(self, name, inputs, fn, tfn, grads=None, atol=1e-5):
        self.name, self.inputs, self.fn, self.tfn = name, inputs, fn, tfn
        self.grads = grads or []  # indices of the inputs that require grad
        self.atol = atol


def _sdpa(**kw):
    return lambda s, *t: TF.scaled_dot_product_attention(*t, **kw)


def _tsdpa(**kw):
    tkw = {"causal": kw.get("is_causal", False), "scale": kw.get("scale")}
    return lambda *t: torch_sdpa(*t, **tkw)


SDPA = [
    ("plain", [f32(2, 3, 4, 8), f32(2, 3, 4, 8), f32(2, 3, 4, 8)], {}, [0, 1, 2]),
    ("l_ne_s_ev", [f32(2, 5, 4), f32(2, 7, 4), f32(2, 7, 3)], {}, [0, 1, 2]),
    ("causal", [f32(2, 6, 4), f32(2, 6, 4), f32(2, 6, 5)], {"is_causal": True}, [0, 1, 2]),
    ("causal_l_lt_s", [f32(3, 5), f32(6, 5), f32(6, 2)], {"is_causal": True}, [0, 1, 2]),
    ("scale", [f32(1, 4, 3), f32(1, 5, 3), f32(1, 5, 3)], {"scale": 0.3}, [0, 1, 2]),
    ("batch_broadcast", [f32(2, 1, 4, 3), f32(1, 3, 5, 3), f32(5, 2)], {}, [0, 1, 2]),
    ("bool_mask", [f32(2, 4, 3), f32(2, 6, 3), f32(2, 6, 3), bmask(4, 6)], {}, [0, 1, 2]),
    ("bool_mask_batched", [f32(2, 2, 3, 4), f32(2, 2, 5, 4), f32(2, 2, 5, 4), bmask(2, 1, 3, 5)],
     {}, [0, 1, 2]),
    ("float_mask", [f32(2, 4, 3), f32(2, 5, 3), f32(2, 5, 2), f32(4, 5)], {}, [0, 1, 2, 3]),
    ("float_mask_row", [f32(3, 4, 3), f32(3, 5, 3), f32(3, 5, 2), f32(5)], {}, [0, 1, 2, 3]),
    ("mask_grows_batch", [f32(4, 3), f32(5, 3), f32(5, 2), f32(2, 4, 5)], {}, [0, 1, 2, 3]),
    # a row that attends nothing: NaN out, as softmax over -inf; its q gradient is masked_fill's
    ("fully_masked_row", [f32(3, 2), f32(4, 2), f32(4, 2),
                          const(np.array([[True, False, True, True], [False] * 4,
                                          [True, True, False, False]]))], {}, [0, 1]),
    ("empty_keys", [f32(2, 3, 4), f32(2, 0, 4), f32(2, 0, 2)], {}, []),
    # past the GPU kernel's tiles: keys over several 32-key tiles, E over a warp's 32 lanes,
    # a causal row ending inside a tile, and more value columns than one pass of its block
    ("many_keys_wide_e", [f32(2, 3, 40), f32(2, 70, 40), f32(2, 70, 6), bmask(3, 70)], {},
     [0, 1, 2]),
    ("causal_many_keys", [f32(1, 70, 5), f32(1, 70, 5), f32(1, 70, 3)], {"is_causal": True},
     [0, 1, 2]),
    ("wide_values", [f32(1, 2, 4), f32(1, 5, 4), f32(1, 5, 1030)], {}, [2]),
]

# einsum: torch's grammar (implicit output, '...', diagonals, size-1 broadcast, 3 operands)
EINSUM = [
    ("ij,jk->ik", [(3, 4), (4, 5)]), ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("...ij,...jk->...ik", [(2, 1, 3, 4), (5, 4, 2)]), ("i,i->", [(4,), (4,)]),
    ("ij->ji", [(3, 4)]), ("ij->", [(3, 4)]), ("ii->i", [(3, 3)]), ("ij,jk", [(3, 4), (4, 5)]),
    ("bhld,bhsd->bhls", [(2, 2, 3, 4), (2, 2, 5, 4)]), ("ijk,jil->kl", [(2, 3, 4), (3, 2, 5)]),
    ("i,j->ij", [(3,), (4,)]), ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)]),
    ("zA,Ba", [(2, 3), (4, 5)]), ("ij,ij->ij", [(3, 1), (1, 4)]), ("...ij,jk", [(5, 2, 3), (3, 4)]),
    ("ij...,jk", [(2, 3, 5), (3, 4)]), ("iij->ij", [(3, 3, 2)]), ("ii", [(3, 3)]),
    ("b i , b i -> b", [(3, 4), (3, 4)]), ("i,i,i->i", [(3,), (3,), (3,)]),
    ("ab,cd->", [(2, 3), (4, 5)]), ("ij,j->i", [(0, 3), (3,)]), ("...i,...i->i", [(2, 3), (3,)]),
]

# interpolate: nearest / (bi)linear, align_corners, size or scale_factor, up and down
INTERP = [
    ("nearest_size", (2, 3, 4, 5), {"size": (7, 3)}),
    ("nearest_x2", (1, 2, 3, 4), {"scale_factor": 2}),
    ("nearest_sf", (1, 2, 5, 4), {"scale_factor": (1.5, 0.7)}),
    ("nearest_3d", (2, 3, 5), {"size": 8}),
    ("nearest_3d_sf_down", (2, 2, 9), {"scale_factor": 0.4}),
    ("bilinear_size", (2, 2, 4, 5), {"size": (7, 9), "mode": "bilinear"}),
    ("bilinear_align", (1, 3, 4, 3), {"size": (6, 7), "mode": "bilinear", "align_corners": True}),
    ("bilinear_sf", (1, 2, 3, 4), {"scale_factor": 2, "mode": "bilinear"}),
    ("bilinear_down", (2, 1, 7, 6), {"size": (3, 4), "mode": "bilinear"}),
    ("bilinear_sf_align", (1, 1, 5, 4), {"scale_factor": (1.7, 2.5), "mode": "bilinear",
                                         "align_corners": True}),
    ("bilinear_to_1", (1, 2, 4, 4), {"size": (1, 3), "mode": "bilinear", "align_corners": True}),
    ("linear_3d", (2, 3, 5), {"size": 9, "mode": "linear"}),
    ("linear_3d_align_sf", (1, 2, 4), {"scale_factor": 2.5, "mode": "linear",
                                       "align_corners": True}),
]

CASES = [Case(f"sdpa_{tag}", ins, _sdpa(**kw), _tsdpa(**kw), grads=gr, atol=2e-5)
         for tag, ins, kw, gr in SDPA] + [
    Case(f"einsum_{eq.replace(' ', '')}", [f32(*sh) for sh in shapes],
         (lambda eq: lambda s, *t: tensordd.einsum(eq, *t))(eq),
         (lambda eq: lambda *t: torch.einsum(eq, *t))(eq), grads=list(range(len(shapes))))
    for eq, shapes in EINSUM] + [
    Case(f"interpolate_{tag}", [f32(*shape)],
         (lambda kw: lambda s, x: TF.interpolate(x, **kw))(kw),
         (lambda kw: lambda x: F.interpolate(x, **kw))(kw), grads=[0])
    for tag, shape, kw in INTERP] + [
    Case("upsample_module", [f32(2, 3, 4, 4)],
         lambda s, x: tensordd.nn.Upsample(scale_factor=2, mode="bilinear")(x),
         lambda x: torch.nn.Upsample(scale_factor=2, mode="bilinear")(x), grads=[0])]


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("c", CASES, ids=lambda c: c.name)
def test_matches_torch(s, c, dev):
    check_case_matches_torch(s, c, dev)


def _dropout_run(dev, q, k, v, w, p):
    """One fresh daemon, one session, the same ops: the session's random stream starts at
    the same seed, so the draws must be the same."""
    d = Daemon("--cpu-devices", "1", *(GPU_ARGS or "").split())
    try:
        sess = tensordd.connect(d.endpoint, timeout=120)
        qq = sess.tensor(q, device=dev, requires_grad=True)
        kk, vv = sess.tensor(k, device=dev), sess.tensor(v, device=dev)
        out = TF.scaled_dot_product_attention(qq, kk, vv, dropout_p=p)
        again = TF.scaled_dot_product_attention(qq, kk, vv, dropout_p=p)  # the stream moved on
        g = (out * sess.tensor(w, device=dev)).sum().backward().get(qq).numpy()
        res = out.numpy(), again.numpy(), g
        sess.close(raise_errors=False)
    finally:
        assert d.stop() == 0
    return res


@pytest.mark.parametrize("dev", DEVICES[:1])
def test_sdpa_dropout_statistics_and_seed(dev):
    """Dropout on the weights: with v = I each output row is its row of weights, so the
    dropped fraction, the 1/(1-p) scale of the kept ones, the seed's reproduction (a fresh
    session on ref:0 and on dev draw the same) and the gradient through the forward's own
    draws are all visible."""
    L, S, E, p = 48, 64, 8, 0.25
    rng = np.random.default_rng(5)
    q = rng.uniform(-1, 1, (2, L, E)).astype(np.float32)
    k = rng.uniform(-1, 1, (2, S, E)).astype(np.float32)
    eye = np.eye(S, dtype=np.float32)
    w = rng.uniform(0.5, 1.5, (2, L, S)).astype(np.float32)
    tq, tk = torch.tensor(q, requires_grad=True), torch.tensor(k)
    weights = torch_sdpa(tq, tk, torch.tensor(eye)).detach().numpy()  # the softmax itself
    a, a2, g = _dropout_run(dev, q, k, eye, w, p)
    r, r2, _ = _dropout_run("ref:0", q, k, eye, w, p)
    kept = a != 0
    np.testing.assert_array_equal(kept, r != 0)  # the same seed, the same draws
    np.testing.assert_array_equal(a2 != 0, r2 != 0)
    assert (kept != (a2 != 0)).any(), "the next op drew the same weights"
    frac = 1.0 - kept.mean()
    assert abs(frac - p) < 0.02, f"dropped {frac:.3f} of the weights, p = {p}"
    np.testing.assert_allclose(a[kept], weights[kept] / (1 - p), rtol=1e-5, atol=1e-7)
    # the gradient: the explicit formula with the forward's own keep mask, in torch
    keep = torch.tensor(kept.astype(np.float32) / (1 - p))
    tout = (torch.softmax(tq @ tk.transpose(-2, -1) / math.sqrt(E), -1) * keep) @ torch.tensor(eye)
    (tout * torch.from_numpy(w)).sum().backward()
    np.testing.assert_allclose(g, tq.grad.numpy(), rtol=1e-5, atol=2e-5)


@pytest.mark.parametrize("dev", DEVICES[:1])
def test_sdpa_refusals(s, dev):
    x = s.tensor(np.zeros((2, 3, 4), np.float32), device=dev)
    m = s.tensor(np.ones((3, 3), bool), device=dev)
    with pytest.raises(tensordd.InvalidArgumentError):
        TF.scaled_dot_product_attention(x, x, x, m, is_causal=True).numpy()
    with pytest.raises(tensordd.InvalidArgumentError):
        TF.scaled_dot_product_attention(x, x, x, dropout_p=1.5).numpy()
    with pytest.raises(tensordd.ShapeMismatchError):
        y = s.tensor(np.zeros((2, 3, 5), np.float32), device=dev)
        TF.scaled_dot_product_attention(x, y, y).numpy()
    with pytest.raises(tensordd.ShapeMismatchError):
        bad = s.tensor(np.ones((2, 3), bool), device=dev)  # [L, S] is [3, 3]
        TF.scaled_dot_product_attention(x, x, x, bad).numpy()
    with pytest.raises(tensordd.Error):
        i = s.tensor(np.zeros((2, 3, 4), np.int64), device=dev)
        TF.scaled_dot_product_attention(i, i, i).numpy()


@pytest.mark.parametrize("dev", DEVICES[:1])
def test_einsum_refusals(s, dev):
    a = s.tensor(np.zeros((2, 3), np.float32), device=dev)
    b = s.tensor(np.zeros((4, 5), np.float32), device=dev)
    for eq, ops in (("ij,jk->ik", (a, b)), ("ij->k", (a,)), ("ij", (a, b)), ("ijk", (a,)),
                    ("i...j...", (a,)), ("ij->ii", (a,)), ("i1", (a,))):
        with pytest.raises(tensordd.InvalidArgumentError, match="einsum"):
            tensordd.einsum(eq, *ops).numpy()
    list_form = tensordd.einsum("ij->j", [a]).numpy()  # operands as one list, as torch allows
    np.testing.assert_array_equal(list_form, np.zeros(3, np.float32))


@pytest.mark.parametrize("dev", DEVICES[:1])
def test_interpolate_refusals(s, dev):
    x = s.tensor(np.zeros((1, 2, 3, 4), np.float32), device=dev)
    for kw in ({"size": 4, "scale_factor": 2.0}, {}, {"size": (2, 2), "mode": "linear"},
               {"size": (2, 2), "mode": "bicubic"}, {"size": (2, 2), "align_corners": True},
               {"scale_factor": 0.1}, {"scale_factor": -1.0}, {"size": (2, 2, 2)}):
        with pytest.raises(tensordd.InvalidArgumentError):
            TF.interpolate(x, **kw).numpy()
    with pytest.raises(tensordd.InvalidArgumentError):
        TF.interpolate(s.tensor(np.zeros(4, np.float32), device=dev), size=2).numpy()
