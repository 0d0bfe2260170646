"""Torch interop without a torch dependency.

torch dtypes and devices are accepted wherever ours are; s.tensor(torch
tensor) keeps the dtype (bfloat16 included), detaches and keeps
requires_grad; t.torch() and np.asarray(t) give the values; our dtypes are
module attributes equal to their names; the module-level calls run on the
default session (the one connect() opened last). torch 1.13 and numpy are the
oracles.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import tensordd

torch = pytest.importorskip("torch")


def test_dtypes_are_module_attributes_equal_to_their_names():
    for name in ["float32", "float64", "float16", "bfloat16", "int32", "int64", "bool"]:
        dt = getattr(tensordd, name)
        assert dt == name and name == dt and hash(dt) == hash(name)
        assert dt == getattr(torch, name)
        assert repr(dt) == f"tensordd.{name}"
    assert tensordd.float32 != "float64" and tensordd.float32 != torch.float64
    assert tensordd.float64 == np.float64 and tensordd.int64 == np.dtype("int64")
    assert tensordd.long == tensordd.int64 and tensordd.half == tensordd.float16


def test_tensor_dtype_is_a_dtype_object(session):
    t = session.tensor(np.ones(2, np.float64))
    assert t.dtype == tensordd.float64 and t.dtype == torch.float64 and t.dtype == "float64"
    assert (t + 1).dtype is not None and (t + 1).dtype == tensordd.float64


@pytest.mark.parametrize("tdt", ["float64", "float16", "bfloat16", "int32", "int64", "bool"])
def test_to_torch_dtype(session, tdt):
    a = session.tensor(np.array([1.0, 2.5, -3.0], np.float32))
    b = a.to(getattr(torch, tdt))
    assert b.dtype == tdt
    ref = torch.tensor([1.0, 2.5, -3.0]).to(getattr(torch, tdt))
    assert torch.equal(b.torch(), ref)


def test_to_torch_device_and_dtype_keywords(session):
    a = session.tensor(np.array([1.0, 2.0], np.float32), device="cpu:1")
    assert a.to(torch.device("cpu")).device == "cpu:0"
    assert a.to(device=torch.device("cpu", 1)).device == "cpu:1"
    assert a.to(dtype=torch.float16).dtype == "float16"
    z = session.zeros(2, 3, dtype=torch.float16)
    assert z.dtype == "float16" and z.shape == (2, 3)
    o = session.ones(2, dtype=torch.bfloat16, device=torch.device("cpu"))
    assert o.dtype == "bfloat16" and o.tolist() == [1.0, 1.0]


def test_bfloat16_by_name(session):
    t = session.tensor([1, 2], dtype="bfloat16")
    assert t.dtype == "bfloat16"
    np.testing.assert_array_equal(t.numpy(), [1.0, 2.0])
    u = session.tensor([1.1, 2.7, -3.3e5], dtype=torch.bfloat16)
    ref = torch.tensor([1.1, 2.7, -3.3e5], dtype=torch.bfloat16)
    assert torch.equal(u.torch(), ref)  # round-to-nearest-even as torch


@pytest.mark.parametrize("tdt", ["float64", "float16", "bfloat16", "int32", "int64", "bool",
                                 "float32"])
def test_tensor_from_torch_keeps_the_dtype(session, tdt):
    src = (torch.arange(6) - 2).reshape(2, 3).to(getattr(torch, tdt))
    t = session.tensor(src)
    assert t.dtype == tdt and t.shape == (2, 3)
    assert torch.equal(t.torch(), src)


def test_tensor_from_torch_detaches_and_keeps_requires_grad(session):
    w = torch.ones(3, dtype=torch.float64, requires_grad=True)
    y = w * 2  # a non-leaf with a grad_fn
    t = session.tensor(y)
    assert t.requires_grad and t.dtype == "float64"
    assert session.tensor(y, requires_grad=False).requires_grad is False
    bf = torch.ones(2, dtype=torch.bfloat16, requires_grad=True)
    tb = session.tensor(bf)
    assert tb.requires_grad and tb.dtype == "bfloat16"
    g = (tb.float() * 3).sum().backward()
    assert g.get(tb).dtype == "bfloat16"
    # a non-contiguous torch tensor
    nc = torch.arange(12.0).reshape(3, 4).t()
    np.testing.assert_array_equal(session.tensor(nc).numpy(), nc.numpy())


def test_values_out_numpy_and_torch(session):
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    t = session.tensor(x)
    np.testing.assert_array_equal(np.asarray(t), x)
    assert np.asarray(t, dtype=np.float64).dtype == np.float64
    tt = t.torch()
    assert isinstance(tt, torch.Tensor) and tt.dtype == torch.float32 and not tt.requires_grad
    assert torch.equal(torch.as_tensor(np.asarray(t)), torch.from_numpy(x))
    assert torch.equal(t.torch(), torch.from_numpy(x))
    # torch 1.13's as_tensor walks sequences down to 0-d items, which have no len():
    # the TypeError says what works (a torch that takes the array protocol just works)
    try:
        got = torch.as_tensor(t)
    except TypeError as e:
        assert "t.torch(), torch.from_dlpack(t)" in str(e)
    else:
        assert torch.equal(got, torch.from_numpy(x))


def test_module_level_calls_use_the_default_session(daemon):
    with tensordd.connect(daemon.endpoint, timeout=30) as s:
        assert tensordd.default_session() is s
        a = tensordd.tensor([1.0, 2.0], dtype=torch.float64)
        assert a.session is s and a.dtype == "float64"
        assert tensordd.zeros(2, 3).shape == (2, 3)
        assert tensordd.ones(2, dtype=tensordd.int64).tolist() == [1, 1]
        assert tensordd.arange(4).tolist() == [0, 1, 2, 3]
        assert tensordd.full((2,), 7.0).tolist() == [7.0, 7.0]
        w = tensordd.tensor([1.0, 2.0], requires_grad=True)
        with tensordd.no_grad():
            assert not (w * 2).requires_grad
        assert (w * 2).requires_grad
        assert tensordd.cat([a, a]).shape == (4,)
    with pytest.raises(tensordd.ConnectionClosedError):
        tensordd.zeros(2)


def test_torch_is_not_imported_by_the_client():
    code = ("import sys, tensordd; import numpy as np; "
            "assert tensordd.float32 == 'float32'; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    import os
    env = dict(os.environ)
    # the package and the generated module's directory (the build's, from the tree)
    env["PYTHONPATH"] = os.pathsep.join(os.path.dirname(p) for p in tensordd.__path__)
    subprocess.run([sys.executable, "-c", code], check=True, env=env)


def test_dlpack_export(session):
    x = np.arange(6, dtype=np.float64).reshape(2, 3)
    t = session.tensor(x) * 2
    assert torch.equal(torch.from_dlpack(t), torch.from_numpy(x * 2))
    np.testing.assert_array_equal(np.from_dlpack(t), x * 2)
    b = session.tensor(torch.tensor([1.5, -2.0], dtype=torch.bfloat16))
    got = torch.from_dlpack(b)
    assert got.dtype == torch.bfloat16 and got.tolist() == [1.5, -2.0]
