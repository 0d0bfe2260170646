"""pixel_shuffle and pixel_unshuffle against torch 1.13's F.pixel_shuffle / F.pixel_unshuffle.

Forward values (element moves: exact, every dtype) and the input gradient of sum(out * g) (g
random; each op's backward is the other op, the op schema's grad column) compared with torch's,
on cpu:0 and ref:0, or on cuda:0 when TDD_GPU_ARGS is set (make test-emu, tests/gpu/run.sh).
Forms: [N, C r^2, H, W], unbatched [C r^2, H, W], two leading dims, factor 1, a permuted
(strided) input, float64 and int64. What torch refuses is refused, saying why.
"""

from __future__ import annotations

import numpy as np
import pytest

import tensordd
from test_torch_arg_forms import DEVICES, fd, s  # noqa: F401 (fixtures)

torch = pytest.importorskip("torch")
F = torch.nn.functional
TF = tensordd.nn.functional

# (name, shuffle's input shape, factor, dtype)
FORMS = [
    ("batched_r2", (2, 12, 3, 4), 2, np.float32),
    ("unbatched_r3", (9, 2, 3), 3, np.float64),
    ("two_leading_dims", (2, 3, 8, 2, 3), 2, np.float32),
    ("factor_1", (2, 3, 4, 5), 1, np.float32),
    ("int64", (1, 8, 3, 3), 2, np.int64),
]


def _input(shape, dt, seed):
    rng = np.random.default_rng(seed)
    if dt == np.int64:
        return rng, rng.integers(-2**40, 2**40, shape).astype(dt)
    return rng, rng.uniform(-2, 2, shape).astype(dt)


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("form", FORMS, ids=[f[0] for f in FORMS])
@pytest.mark.parametrize("fn", ["pixel_shuffle", "pixel_unshuffle"])
def test_values_and_gradient_match_torch(s, dev, form, fn):
    name, shape, r, dt = form
    rng, x = _input(shape, dt, sum(map(ord, name + fn)))
    if fn == "pixel_unshuffle":  # its input: the shuffle's output
        x = F.pixel_shuffle(torch.tensor(x), r).numpy()
    floats = dt != np.int64
    tx = torch.tensor(x, requires_grad=floats)
    ty = getattr(F, fn)(tx, r)
    X = s.tensor(x, device=dev, requires_grad=floats)
    y = getattr(TF, fn)(X, r)
    assert tuple(y.shape) == tuple(ty.shape) and y.dtype == dt, name
    np.testing.assert_array_equal(y.numpy(), ty.detach().numpy(), err_msg=f"{fn} {name}")
    if not floats:
        return
    g = rng.uniform(-1, 1, tuple(ty.shape)).astype(dt)
    (ty * torch.tensor(g)).sum().backward()
    grads = (y * s.tensor(g, device=dev)).sum().backward()
    np.testing.assert_array_equal(grads.get(X).numpy(), tx.grad.numpy(),
                                  err_msg=f"{fn} {name}: input gradient")


@pytest.mark.parametrize("dev", DEVICES)
def test_strided_input(s, dev):
    x = np.random.default_rng(1).uniform(-1, 1, (2, 4, 6, 8)).astype(np.float32)
    want = F.pixel_shuffle(torch.tensor(x).permute(0, 3, 1, 2), 2)
    got = TF.pixel_shuffle(s.tensor(x, device=dev).permute(0, 3, 1, 2), 2)
    np.testing.assert_array_equal(got.numpy(), want.numpy())
    want = F.pixel_unshuffle(torch.tensor(x).permute(0, 3, 1, 2), 2)
    got = TF.pixel_unshuffle(s.tensor(x, device=dev).permute(0, 3, 1, 2), 2)
    np.testing.assert_array_equal(got.numpy(), want.numpy())


@pytest.mark.parametrize("dev", DEVICES)
def test_refuses_what_torch_refuses(s, dev):
    x = s.tensor(np.ones((1, 6, 4, 4), np.float32), device=dev)
    with pytest.raises(tensordd.Error, match="channels"):  # 6 channels, r^2 = 4
        TF.pixel_shuffle(x, 2).numpy()
    with pytest.raises(tensordd.Error, match="height and width"):  # 4 rows, r = 3
        TF.pixel_unshuffle(x, 3).numpy()
    with pytest.raises(tensordd.Error, match="upscale_factor"):
        TF.pixel_shuffle(x, 0).numpy()
    with pytest.raises(tensordd.Error, match="downscale_factor"):
        s.op("pixel_unshuffle", x).numpy()
    with pytest.raises(tensordd.Error, match="at least 3 dims"):
        TF.pixel_shuffle(s.tensor(np.ones((4, 4), np.float32), device=dev), 2).numpy()
