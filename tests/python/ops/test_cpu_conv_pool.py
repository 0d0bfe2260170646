"""The cpu backend's conv2d and pooling paths (backends/cpu/cpu_nn.c, cpu_pool.c) against
the reference backend and PyTorch, at the shapes that pick each path:

- max_pool2d's 2x2 stride-2 loop (odd sizes, whole windows only), the general loop
  (ceil_mode's partial windows, padding, dilation, stride != kernel, an empty dilated
  window), a non-contiguous input (a transposed view: the general loop), planes split
  over threads; ties and NaNs (the first maximum wins, the first NaN wins);
- avg_pool2d: the 2x2 stride-2 loop (bit-equal to ref, -0.0 windows), padding with and
  without count_include_pad, ceil_mode, threads;
- conv2d: several samples in one GEMM (with and without bias, groups), blocks of samples
  (a batch larger than one block), the transposed im2col (output narrower than the
  kernel: weight gradients), stride/dilation/padding, non-contiguous input and weight;
- the conv net of bench/peers.py: forward and every parameter's gradient.

Each case runs on cpu:0 and ref:0 in float32 and float64. Tolerances
(|got - want| <= atol + rtol |want|): max_pool2d values and indices exact (bit-equal to
ref; equal to torch, except the index of a NaN: torch takes the last NaN, the daemon the
first); averages and convs: float32 rtol 1e-5 / atol 1e-6, float64 rtol 1e-10 /
atol 1e-12, scaled by sqrt(K), K the terms summed per output (window size; C_in/groups *
kh * kw); gradients of the conv net: float32 rtol/atol 1e-4, float64 1e-9 (a chain of
six ops)."""

from __future__ import annotations

import math
import zlib

import numpy as np
import pytest

import tensordd.nn.functional as TF
from helpers import require_autodiff

torch = pytest.importorskip("torch")
FN = torch.nn.functional

DEVICES = ("cpu:0", "ref:0")
DTYPES = ("float32", "float64")
TOLS = {"float32": (1e-5, 1e-6), "float64": (1e-10, 1e-12)}


def _tol(dtype, k):
    rtol, atol = TOLS[dtype]
    s = max(1.0, math.sqrt(k))
    return rtol * s, atol * s


def _rng(*parts):
    return np.random.default_rng(zlib.crc32("/".join(map(str, parts)).encode()))


# (id, input shape, attrs, transposed view of the input)
MAX_POOL = [
    ("k2-odd", (2, 3, 9, 11), {"kernel_size": 2}, False),
    ("k2-conv-net", (8, 8, 28, 28), {"kernel_size": 2}, False),
    ("k2-threads", (4, 16, 64, 64), {"kernel_size": 2}, False),
    ("k2-ceil-partial", (2, 3, 9, 11), {"kernel_size": 2, "ceil_mode": True}, False),
    ("k2-pad", (2, 3, 8, 8), {"kernel_size": 2, "padding": 1}, False),
    ("k2-transposed", (2, 3, 8, 10), {"kernel_size": 2}, True),
    ("k3-s1", (2, 2, 7, 9), {"kernel_size": 3, "stride": 1}, False),
    ("k2-s3", (2, 2, 11, 10), {"kernel_size": 2, "stride": 3}, False),
    ("k3-s2-p1-ceil", (2, 3, 10, 9),
     {"kernel_size": 3, "stride": 2, "padding": 1, "ceil_mode": True}, False),
    ("k32-dil-pad-ceil", (2, 3, 10, 9),
     {"kernel_size": [3, 2], "stride": [1, 3], "padding": 1, "dilation": [2, 1],
      "ceil_mode": True}, False),
    ("k3-s2-threads", (4, 16, 48, 40), {"kernel_size": 3, "stride": 2, "padding": 1}, False),
    ("3d-input", (5, 9, 7), {"kernel_size": 2}, False),
]

AVG_POOL = [
    ("k2-odd", (2, 3, 9, 11), {"kernel_size": 2}, False),
    ("k2-ceil", (2, 3, 9, 11), {"kernel_size": 2, "ceil_mode": True}, False),
    ("k3-s2-p1", (2, 3, 10, 9), {"kernel_size": 3, "stride": 2, "padding": 1}, False),
    ("k3-s2-p1-excl-ceil", (2, 3, 10, 9),
     {"kernel_size": 3, "stride": 2, "padding": 1, "count_include_pad": False,
      "ceil_mode": True}, False),
    ("k32-s13", (2, 2, 11, 10), {"kernel_size": [3, 2], "stride": [1, 3]}, False),
    ("k2-transposed", (2, 3, 8, 10), {"kernel_size": 2, "padding": 1}, True),
    ("k3-threads", (4, 16, 64, 64), {"kernel_size": 3, "stride": 2, "padding": 1}, False),
]


def _input(s, rng, shape, dtype, device, transposed):
    """The input on the daemon and in torch; a transposed case uploads [.., W, H] and pools
    its transpose (a view with unit stride down the rows)."""
    if transposed:
        shape = shape[:-2] + (shape[-1], shape[-2])
    a = rng.uniform(-2, 2, shape).astype(dtype)
    x, tx = s.tensor(a, device=device), torch.from_numpy(a)
    if transposed:
        x, tx = x.transpose(-1, -2), tx.transpose(-1, -2)
    return x, tx


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cid,shape,attrs,tr", MAX_POOL, ids=[c[0] for c in MAX_POOL])
def test_max_pool2d(session, cid, shape, attrs, tr, device, dtype):
    x, tx = _input(session, _rng("max", cid, dtype), shape, dtype, device, tr)
    y, ind = session.op("max_pool2d", x, return_indices=True, num_outputs=2, **attrs)
    ty, tind = FN.max_pool2d(tx, return_indices=True, **attrs)
    what = f"max_pool2d {cid} {dtype} on {device}"
    np.testing.assert_array_equal(y.numpy(), ty.numpy(), err_msg=what)
    np.testing.assert_array_equal(ind.numpy(), tind.numpy(), err_msg=what + " indices")
    plain = session.op("max_pool2d", x, **attrs)  # the path without indices
    np.testing.assert_array_equal(plain.numpy(), ty.numpy(), err_msg=what + " (no indices)")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cid,shape,attrs,tr", AVG_POOL, ids=[c[0] for c in AVG_POOL])
def test_avg_pool2d(session, cid, shape, attrs, tr, device, dtype):
    x, tx = _input(session, _rng("avg", cid, dtype), shape, dtype, device, tr)
    y = session.op("avg_pool2d", x, **attrs)
    ty = FN.avg_pool2d(tx, **attrs)
    k = np.prod(np.broadcast_to(attrs["kernel_size"], 2))
    rtol, atol = _tol(dtype, k)
    np.testing.assert_allclose(y.numpy(), ty.numpy(), rtol=rtol, atol=atol,
                               err_msg=f"avg_pool2d {cid} {dtype} on {device}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("attrs", [{"kernel_size": 2}, {"kernel_size": 3, "stride": 1}],
                         ids=["k2", "k3-s1"])
def test_max_pool2d_ties_and_nans(session, attrs, dtype):
    """Few distinct values (every window has ties), +-0 and NaNs: cpu bit-equal to ref in
    values and indices (the first maximum, the first NaN); without NaNs also torch's."""
    rng = _rng("ties", attrs["kernel_size"], dtype)
    a = rng.integers(-2, 3, (3, 4, 10, 12)).astype(dtype)
    a[a == 0] = np.where(rng.random((a == 0).sum()) < 0.5, -0.0, 0.0).astype(dtype)
    want_t, want_ti = FN.max_pool2d(torch.from_numpy(a), return_indices=True, **attrs)
    nan = a.copy()
    nan.reshape(-1)[rng.choice(nan.size, nan.size // 7, replace=False)] = np.nan
    for data, tag in ((a, "ties"), (nan, "nans")):
        out = {}
        for dev in DEVICES:
            y, ind = session.op("max_pool2d", session.tensor(data, device=dev),
                                return_indices=True, num_outputs=2, **attrs)
            out[dev] = (y.numpy(), ind.numpy())
        (cy, ci), (ry, ri) = out["cpu:0"], out["ref:0"]
        what = f"{tag} {attrs} {dtype}"
        np.testing.assert_array_equal(cy.view(f"u{cy.itemsize}"), ry.view(f"u{ry.itemsize}"),
                                      err_msg=what + ": values' bits, cpu vs ref")
        np.testing.assert_array_equal(ci, ri, err_msg=what + ": indices, cpu vs ref")
        if tag == "ties":
            np.testing.assert_array_equal(cy, want_t.numpy(), err_msg=what + " vs torch")
            np.testing.assert_array_equal(ci, want_ti.numpy(), err_msg=what + " vs torch")
        else:
            assert np.isnan(cy).any() and not np.isnan(cy).all()
            flat = data.reshape(data.shape[0], data.shape[1], -1)
            picked = np.take_along_axis(flat, ci.reshape(ci.shape[0], ci.shape[1], -1), 2)
            np.testing.assert_array_equal(picked.reshape(cy.shape), cy,
                                          err_msg=what + ": the index holds the value")


@pytest.mark.parametrize("dtype", DTYPES)
def test_avg_pool2d_2x2_bits(session, dtype):
    """avg_pool2d's 2x2 stride-2 loop sums in double in the reference's order: bit-equal to
    ref, windows of four -0.0 included (their average is +0.0, as 0.0 + -0.0 is)."""
    rng = _rng("avg-bits", dtype)
    a = rng.uniform(-2, 2, (3, 4, 10, 13)).astype(dtype)
    a[:, :, :4, :6] = -0.0
    out = [session.op("avg_pool2d", session.tensor(a, device=d), kernel_size=2).numpy()
           for d in DEVICES]
    u = f"u{out[0].itemsize}"
    np.testing.assert_array_equal(out[0].view(u), out[1].view(u), err_msg=f"{dtype}: cpu vs ref")
    want = FN.avg_pool2d(torch.from_numpy(a), 2).numpy()
    np.testing.assert_allclose(out[0], want, rtol=TOLS[dtype][0] * 2, atol=TOLS[dtype][1] * 2)


def test_max_pool2d_empty_window(session):
    """kernel 2, padding 1, dilation 3 over 2x2: the one window's taps (-1 and 2) both miss
    the input. Ref and cpu give -inf and index -1 alike (torch has no such window)."""
    a = np.arange(8, dtype=np.float32).reshape(1, 2, 2, 2)
    out = [session.op("max_pool2d", session.tensor(a, device=d), kernel_size=2, padding=1,
                      dilation=3, return_indices=True, num_outputs=2) for d in DEVICES]
    for y, ind in out:
        assert y.numpy().shape == (1, 2, 1, 1)
        assert np.all(np.isneginf(y.numpy())) and np.all(ind.numpy() == -1)


# (id, x shape, w shape, bias, attrs, x transposed, w transposed)
CONV = [
    ("batch-one-gemm", (8, 8, 14, 14), (16, 8, 3, 3), True, {"padding": 1}, False, False),
    ("batch-no-bias", (8, 1, 28, 28), (8, 1, 3, 3), False, {"padding": 1}, False, False),
    ("blocks", (7, 32, 24, 24), (4, 32, 3, 3), True, {"padding": 1}, False, False),
    ("groups-batch", (5, 6, 9, 8), (6, 2, 3, 2), True,
     {"groups": 3, "stride": [2, 1], "padding": [1, 0]}, False, False),
    ("wide-kernel", (3, 4, 12, 12), (5, 4, 10, 10), True, {"padding": 1}, False, False),
    ("wide-kernel-one", (1, 8, 28, 28), (8, 8, 28, 28), False, {"padding": 1}, False, False),
    ("wide-kernel-dil-stride", (2, 3, 13, 12), (4, 3, 4, 5), False,
     {"dilation": [2, 2], "stride": [2, 3], "padding": [2, 1]}, False, False),
    ("stride2-pad", (3, 3, 11, 10), (4, 3, 3, 3), True, {"stride": 2, "padding": 1},
     False, False),
    ("x-transposed", (4, 3, 9, 10), (5, 3, 3, 3), True, {"padding": 1}, True, False),
    ("w-transposed", (4, 3, 9, 10), (5, 3, 3, 3), False, {"padding": 1}, False, True),
    ("wide-x-transposed", (3, 4, 12, 12), (5, 4, 10, 10), False, {"padding": 1}, True, False),
    ("1x1", (3, 6, 5, 7), (4, 6, 1, 1), True, {}, False, False),
    ("3d-input", (3, 9, 8), (4, 3, 3, 3), True, {"padding": 1}, False, False),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cid,xs,ws,bias,attrs,xt,wt", CONV, ids=[c[0] for c in CONV])
def test_conv2d(session, cid, xs, ws, bias, attrs, xt, wt, device, dtype):
    rng = _rng("conv", cid, dtype)
    x, tx = _input(session, rng, xs, dtype, device, xt)
    w, tw = _input(session, rng, ws, dtype, device, wt)
    args, targs = [x, w], [tx, tw]
    if bias:
        b = rng.uniform(-1, 1, ws[0]).astype(dtype)
        args.append(session.tensor(b, device=device))
        targs.append(torch.from_numpy(b))
    y = session.op("conv2d", *args, **attrs)
    ty = FN.conv2d(*targs, **attrs)
    assert tuple(y.shape) == tuple(ty.shape)
    rtol, atol = _tol(dtype, ws[1] * ws[2] * ws[3])
    np.testing.assert_allclose(y.numpy(), ty.numpy(), rtol=rtol, atol=atol,
                               err_msg=f"conv2d {cid} {dtype} on {device}")


@pytest.mark.parametrize("dtype", DTYPES)
def test_conv_net_grads(session, dtype):
    """bench/peers.py's conv net (conv, relu, max_pool, conv, relu, max_pool, linear,
    cross_entropy) on cpu:0: the loss and every parameter's gradient against torch's."""
    require_autodiff(session)
    rng = _rng("net", dtype)
    shapes = [(8, 1, 3, 3), (8,), (16, 8, 3, 3), (16,), (10, 16 * 7 * 7), (10,)]
    ps = [rng.uniform(-0.3, 0.3, s).astype(dtype) for s in shapes]
    x = rng.standard_normal((8, 1, 28, 28)).astype(dtype)
    y = rng.integers(0, 10, 8)

    def net(F, p, xx, yy):
        h = F.max_pool2d(F.relu(F.conv2d(xx, p[0], p[1], padding=1)), 2)
        h = F.max_pool2d(F.relu(F.conv2d(h, p[2], p[3], padding=1)), 2)
        return F.cross_entropy(F.linear(h.flatten(1), p[4], p[5]), yy)

    tps = [torch.tensor(p, requires_grad=True) for p in ps]
    tloss = net(FN, tps, torch.from_numpy(x), torch.from_numpy(y))
    tloss.backward()

    dps = [session.tensor(p, device="cpu:0", requires_grad=True) for p in ps]
    loss = net(TF, dps, session.tensor(x, device="cpu:0"), session.tensor(y, device="cpu:0"))
    grads = loss.backward()
    tol = 1e-4 if dtype == "float32" else 1e-9
    np.testing.assert_allclose(loss.numpy(), tloss.detach().numpy(), rtol=tol, atol=tol)
    for n, (p, tp) in enumerate(zip(dps, tps)):
        np.testing.assert_allclose(grads.get(p).numpy(), tp.grad.numpy(), rtol=tol, atol=tol,
                                   err_msg=f"{dtype}: gradient of parameter {n}")
