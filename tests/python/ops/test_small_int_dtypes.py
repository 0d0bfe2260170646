"""uint8, int8 and int16 tensors, against torch: uploads and downloads, PyTorch's
type promotion, casts (wrapping as torch's), elementwise ops, reductions, indexing and
tdctl's .npy, on cpu:0 and ref:0 (cuda:0 when TDD_GPU_ARGS is set: make test-emu).
"""

from __future__ import annotations

import os
import subprocess

import numpy as np
import pytest

import tensordd
from conftest import TDCTL_BIN, Daemon

torch = pytest.importorskip("torch")

GPU_ARGS = os.environ.get("TDD_GPU_ARGS")
DEVICES = ["cuda:0"] if GPU_ARGS is not None else ["cpu:0", "ref:0"]
SMALL = ["uint8", "int8", "int16"]


@pytest.fixture(scope="module")
def dd():
    d = Daemon("--cpu-devices", "1", *(GPU_ARGS or "").split())
    yield d
    rc = d.stop()
    assert rc == 0, f"daemon exited with {rc} on SIGTERM:\n{d.log()}"


@pytest.fixture
def s(dd):
    sess = tensordd.connect(dd.endpoint, timeout=120)
    yield sess
    sess.close(raise_errors=False)


def arr(dtype, shape=(3, 4), seed=0):
    info = np.iinfo(dtype)
    rng = np.random.default_rng(seed)
    return rng.integers(info.min, info.max, shape, endpoint=True).astype(dtype)


def check(got, want):
    want = want.numpy() if isinstance(want, torch.Tensor) else np.asarray(want)
    assert got.dtype == want.dtype, f"dtype {got.dtype}, torch {want.dtype}"
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("dt", SMALL)
def test_round_trip(s, dev, dt):
    a = arr(dt, (2, 5))
    t = s.tensor(a, device=dev)
    assert t.numpy().dtype == np.dtype(dt)
    check(t.numpy(), a)
    z = s.tensor(np.zeros(4, np.dtype(dt)), device=dev)  # the example
    check(z.numpy(), np.zeros(4, np.dtype(dt)))


PAIRS = [("uint8", "int8"), ("uint8", "int16"), ("int8", "int16"), ("uint8", "bool"),
         ("int8", "int32"), ("uint8", "int64"), ("int16", "float32"), ("uint8", "float16"),
         ("uint8", "uint8")]


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("a_dt,b_dt", PAIRS)
@pytest.mark.parametrize("op", ["add", "mul", "sub", "maximum", "eq", "lt"])
def test_binary_promotes_as_torch(s, dev, a_dt, b_dt, op):
    if op == "sub" and "bool" in (a_dt, b_dt):
        pytest.skip("torch refuses sub on bool")
    a = arr(a_dt, (3, 4), 1) if a_dt != "bool" else np.random.default_rng(1).random((3, 4)) < .5
    b = (arr(b_dt, (4,), 2) if b_dt not in ("bool", "float32", "float16")
         else np.random.default_rng(2).random(4).astype(b_dt) * 3 if b_dt != "bool"
         else np.random.default_rng(2).random(4) < .5)
    want = getattr(torch, op)(torch.from_numpy(a), torch.from_numpy(b))
    got = s.op(op, s.tensor(a, device=dev), s.tensor(b, device=dev)).numpy()
    if want.dtype == torch.float16:
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-3)
        assert got.dtype == np.float16
    else:
        check(got, want)


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("dt", SMALL)
def test_scalar_keeps_the_small_dtype(s, dev, dt):
    a = arr(dt)
    check(s.op("add", s.tensor(a, device=dev), other=3).numpy(), torch.from_numpy(a) + 3)
    check(s.op("mul", s.tensor(a, device=dev), other=2.5).numpy(), torch.from_numpy(a) * 2.5)


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("src", SMALL + ["float32", "int64"])
@pytest.mark.parametrize("dst", SMALL)
def test_cast_wraps_as_torch(s, dev, src, dst):
    if src == "float32":  # in range of every dtype: out-of-range float casts differ in torch
        a = np.random.default_rng(3).uniform(-100, 100, 12).astype(np.float32)
        if dst == "uint8":
            a = np.abs(a)
    else:
        a = arr(src, (12,))
    want = torch.from_numpy(a).to(getattr(torch, dst))
    check(s.tensor(a, device=dev).to(dst).numpy(), want)


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("dt", SMALL)
def test_ops_torch_allows(s, dev, dt):
    a = arr(dt, (3, 4), 4)
    ta, t = torch.from_numpy(a), s.tensor(a, device=dev)
    check(s.op("sum", t, dim=1).numpy(), ta.sum(1))
    check(s.op("amax", t, dim=0).numpy(), ta.amax(0))
    check(s.op("argmax", t, dim=1).numpy(), ta.argmax(1))
    check(s.op("neg", t).numpy(), -ta)
    check(s.op("abs", t).numpy(), ta.abs())
    check(s.op("div", t, other=3).numpy(), ta / 3)
    check(s.op("transpose", t, dim0=0, dim1=1).numpy(), ta.t())
    check(s.op("cat", t, t, dim=0).numpy(), torch.cat([ta, ta]))
    idx = np.array([[0, 2], [1, 1], [3, 0]])
    check(s.op("gather", t, s.tensor(idx, device=dev), dim=1).numpy(),
          torch.gather(ta, 1, torch.from_numpy(idx)))
    check(s.op("cumsum", t, dim=1).numpy(), ta.cumsum(1))
    check(s.op("masked_fill", t, s.tensor(a > a.mean(), device=dev), value=7).numpy(),
          ta.masked_fill(torch.from_numpy(a > a.mean()), 7))
    check(s.op("zeros", shape=[2, 2], dtype=dt, device=dev).numpy(),
          torch.zeros(2, 2, dtype=getattr(torch, dt)))


def test_fill_value_must_fit(s):
    with pytest.raises(tensordd.InvalidArgumentError):
        s.op("full", shape=[2], value=300, dtype="uint8").numpy()
    with pytest.raises(tensordd.InvalidArgumentError):
        s.op("full", shape=[2], value=-1, dtype="uint8").numpy()
    check(s.op("full", shape=[2], value=-128, dtype="int8").numpy(),
          torch.full((2,), -128, dtype=torch.int8))


@pytest.mark.parametrize("dt", SMALL)
def test_tdctl_npy(dd, tmp_path, dt):
    a = arr(dt, (2, 3), 5)
    np.save(tmp_path / "a.npy", a)
    r = subprocess.run([TDCTL_BIN, "--endpoint", dd.endpoint, "apply", "add",
                        str(tmp_path / "a.npy"), str(tmp_path / "a.npy"), "-o",
                        str(tmp_path / "c.npy")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    check(np.load(tmp_path / "c.npy"), torch.from_numpy(a) + torch.from_numpy(a))


def test_small_int_dtypes_are_module_attributes(s):
    for name, tdt in (("uint8", torch.uint8), ("int8", torch.int8), ("int16", torch.int16)):
        dt = getattr(tensordd, name)
        assert dt == name and dt == tdt and dt in tensordd.__all__
        t = s.tensor([1, 2, 3], dtype=dt)
        assert t.dtype == name
        check(t.numpy(), np.array([1, 2, 3], dtype=name))
    assert tensordd.short == tensordd.int16  # torch's alias
