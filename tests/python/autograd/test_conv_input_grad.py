"""conv2d's input gradient as one conv_transpose2d (grad11): the transposed conv with the
forward's stride, padding, dilation and groups, and output_padding for the rows and
columns past the last window (inputs a strided conv does not reach to the edge). The
shapes that mapping has to get right, against torch 1.13 autograd on CPU, the same
inputs on both sides:

- first order: the gradients of sum(conv2d(x, w, b)^2 * r) to x, w and b;
- second order (create_graph): the gradient of sum(gx^2) + sum(gw^2) to x and w, which
  now runs through conv_transpose2d's own formulas;
- on cpu:0 in float32 and float64, and on ref:0 in float64.

Tolerances (assert_allclose, |got - want| <= atol + rtol * |want|), scaled by sqrt(k)
with k the terms summed into one element of the input gradient (O/groups * kh * kw):
float64 rtol 1e-9, atol 1e-11; float32 rtol 1e-4, atol 1e-4.
"""

from __future__ import annotations

import math
import zlib

import numpy as np
import pytest

import tensordd
from helpers import require_autodiff

torch = pytest.importorskip("torch")
FN = torch.nn.functional
agrad = tensordd.autograd.grad

TOLS = {"float32": (1e-4, 1e-4), "float64": (1e-9, 1e-11)}

# (name, x shape, weight shape, conv2d keyword arguments)
SHAPES = [
    ("s2-exact", (2, 3, 7, 7), (4, 3, 3, 3), dict(stride=2)),
    ("s2-short", (2, 3, 8, 8), (4, 3, 3, 3), dict(stride=2, padding=1)),
    ("s3-short2", (2, 2, 10, 9), (3, 2, 2, 2), dict(stride=3)),
    ("s2-d2-short", (1, 2, 10, 11), (3, 2, 3, 3), dict(stride=2, dilation=2)),
    ("s21-p10-rect", (2, 3, 9, 8), (5, 3, 3, 2), dict(stride=(2, 1), padding=(1, 0))),
    ("d3-p2", (2, 2, 9, 9), (3, 2, 3, 3), dict(dilation=3, padding=2)),
    ("pad-wider", (2, 3, 4, 5), (4, 3, 2, 2), dict(padding=3, stride=2)),
    ("groups2-s2", (2, 4, 9, 8), (6, 2, 3, 3), dict(stride=2, padding=1, groups=2)),
    ("depthwise-s2", (2, 4, 8, 9), (8, 1, 3, 3), dict(stride=2, groups=4)),
    ("k1-s2", (2, 3, 6, 7), (4, 3, 1, 1), dict(stride=2)),
    ("same-even-k", (2, 3, 6, 7), (4, 3, 2, 4), dict(padding="same")),
    ("unbatched-s2", (3, 9, 8), (4, 3, 3, 3), dict(stride=2, padding=1)),
]

CASES = [pytest.param(name, xs, ws, kw, dev, dt, id=f"{name}-{dev}-{dt}")
         for name, xs, ws, kw in SHAPES
         for dev, dt in (("cpu:0", "float32"), ("cpu:0", "float64"), ("ref:0", "float64"))]


@pytest.fixture
def ad(session):
    require_autodiff(session)
    return session


def _close(got, want, dtype, k):
    rtol, atol = TOLS[dtype]
    s = max(1.0, math.sqrt(k))
    np.testing.assert_allclose(got.numpy(), want.detach().numpy(), rtol=rtol * s, atol=atol * s)


@pytest.mark.parametrize("name,xs,ws,kw,device,dtype", CASES)
def test_conv2d_gradients_match_torch(ad, name, xs, ws, kw, device, dtype):
    rng = np.random.default_rng(zlib.crc32(f"cig/{name}/{dtype}".encode()))
    xa = rng.standard_normal(xs).astype(dtype)
    wa = rng.standard_normal(ws).astype(dtype)
    ba = rng.standard_normal(ws[0]).astype(dtype)
    tx, tw, tb = (torch.tensor(a, requires_grad=True) for a in (xa, wa, ba))
    ty = FN.conv2d(tx, tw, tb, **kw)
    ra = rng.uniform(0.5, 1.5, tuple(ty.shape)).astype(dtype)
    tgx, tgw, tgb = torch.autograd.grad((ty.square() * torch.tensor(ra)).sum(), [tx, tw, tb],
                                        create_graph=True)

    x, w, b = (ad.tensor(a, device=device, requires_grad=True) for a in (xa, wa, ba))
    y = ad.op("conv2d", x, w, b, **kw)
    assert tuple(y.shape) == tuple(ty.shape)
    gx, gw, gb = agrad((y.square() * ad.tensor(ra, device=device)).sum(), [x, w, b],
                       create_graph=True)
    k = ws[0] // kw.get("groups", 1) * ws[2] * ws[3]
    assert tuple(gx.shape) == xs
    _close(gx, tgx, dtype, k)
    _close(gw, tgw, dtype, xs[-1] * xs[-2] * (xs[0] if len(xs) == 4 else 1))
    _close(gb, tgb, dtype, ty.numel())

    thx, thw = torch.autograd.grad(tgx.square().sum() + tgw.square().sum(), [tx, tw])
    hx, hw = agrad(gx.square().sum() + gw.square().sum(), [x, w])
    _close(hx, thx, dtype, k * ty.shape[-1] * ty.shape[-2])
    _close(hw, thw, dtype, ty.numel())
