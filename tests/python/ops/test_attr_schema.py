"""Op attributes are checked against the op's schema before anything is queued:
an unknown attribute (a typo), one of the wrong type, or one given twice is an
InvalidArgumentError naming the attribute, the op and the attributes the op accepts, from
Python, from tdctl and for an optimizer. Before, the typo was silently ignored: sum with
keepdm=True returned the wrong shape, slice with end=64 sliced nothing."""

from __future__ import annotations

import os
import subprocess

import numpy as np
import pytest

import tensordd
from conftest import TDCTL_BIN
from tensordd import tensordd_pb2 as pb
from tensordd.session import _Call


def tensor(session, shape=(2, 3, 4)):
    n = int(np.prod(shape))
    return session.tensor(np.arange(n, dtype=np.float32).reshape(shape), device="cpu:0")


def assert_usable(session):
    a = session.tensor(np.ones(2, np.float32), device="cpu:0")
    np.testing.assert_array_equal((a + a).numpy(), [2, 2])


def refused(session, name, *inputs, **attrs):
    with pytest.raises(tensordd.InvalidArgumentError) as info:
        session.op(name, *inputs, **attrs).numpy()
    return info.value


def test_unknown_attribute_names_it_and_what_the_op_accepts(session):
    x = tensor(session)
    e = refused(session, "sum", x, dim=[0], keepdm=True)
    assert e.argument == "keepdm"
    assert "sum takes no attribute 'keepdm' (accepts: dim, keepdim)" in str(e)
    assert_usable(session)
    # the spelled-right call still works, with keepdim honoured
    assert session.op("sum", x, dim=[0], keepdim=True).numpy().shape == (1, 3, 4)


def test_slice_end_is_refused_not_ignored(session):
    x = tensor(session, (2, 3, 64))
    e = refused(session, "slice", x, dim=2, start=0, end=64)
    assert e.argument == "end"
    assert "slice takes no attribute 'end'" in str(e) and "stop" in str(e)
    out = session.op("slice", x, dim=2, start=0, stop=64).numpy()
    assert out.shape == (2, 3, 64)
    assert_usable(session)


def test_wrong_type_names_the_attribute(session):
    x = tensor(session)
    e = refused(session, "sum", x, dim="0")
    assert e.argument == "dim"
    assert "must be an int or an int list, got string" in str(e)
    # softmax's dim is one int
    e = refused(session, "softmax", x, dim=1.5)
    assert e.argument == "dim"
    e = refused(session, "gelu", x, approximate=1)
    assert e.argument == "approximate"
    assert_usable(session)


def test_attribute_of_another_op_is_refused(session):
    x = tensor(session, (1, 1, 4, 4))
    e = refused(session, "max_pool2d", x, kernel_size=2, count_include_pad=False)
    assert e.argument == "count_include_pad"
    e = refused(session, "avg_pool2d", x, kernel_size=2, dilation=1)
    assert e.argument == "dilation"
    e = refused(session, "mul", x, other=2.0, alpha=2.0)
    assert e.argument == "alpha"
    e = refused(session, "relu", x, inplace=True)
    assert "(accepts: none)" in str(e)


def test_attribute_named_twice_is_refused(session):
    x = tensor(session)
    req = pb.Request()
    o = req.op
    o.op = "softmax"
    o.inputs.append(x._handle)
    h = session._new_handle()
    o.outputs.append(h)
    for v in (0, 1):
        a = o.attrs.add()
        a.name = "dim"
        a.i = v
    session._send(req, _Call("op softmax", (x._handle,), outputs=(h,)))
    with pytest.raises(tensordd.InvalidArgumentError) as info:
        tensordd.Tensor(session, h).numpy()
    assert info.value.argument == "dim" and "twice" in str(info.value)
    assert_usable(session)


def test_creation_ops_take_dtype_and_refuse_typos(session):
    z = session.op("zeros", shape=[2, 2], dtype="int32")
    assert z.numpy().dtype == np.int32
    e = refused(session, "zeros", shape=[2], dtyp="int32")
    assert e.argument == "dtyp"
    e = refused(session, "arange", end=5, stpe=2)
    assert e.argument == "stpe"


def test_optimizer_with_an_unknown_attribute_is_refused(session):
    w = session.tensor(np.ones(3, np.float32), device="cpu:0", requires_grad=True)

    class TypoSGD(tensordd.optim.Optimizer):
        kind = "sgd"

    with pytest.raises(tensordd.InvalidArgumentError) as info:
        TypoSGD([w], lr=0.1, momentm=0.9)
    assert info.value.argument == "momentm"
    assert "momentm" in str(info.value)
    with pytest.raises(tensordd.InvalidArgumentError) as info:
        TypoSGD([w], lr="fast")
    assert info.value.argument == "lr"
    assert_usable(session)


@pytest.fixture(scope="module")
def tdctl():
    if not os.access(TDCTL_BIN, os.X_OK):
        pytest.skip(f"tdctl not built at {TDCTL_BIN}")
    return TDCTL_BIN


def test_tdctl_unknown_attribute_exits_1_naming_it(tdctl, daemon, tmp_path):
    np.save(tmp_path / "a.npy", np.arange(12, dtype=np.float32).reshape(3, 4))
    r = subprocess.run([tdctl, "--endpoint", daemon.endpoint, "apply", "sum",
                        str(tmp_path / "a.npy"), "-o", str(tmp_path / "s.npy"), "--attr",
                        "dimm=1"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1, (r.returncode, r.stderr)  # tdctl's exit code for a daemon error
    assert "INVALID_ARGUMENT" in r.stderr and "dimm" in r.stderr
    assert "accepts: dim, keepdim" in r.stderr
    assert not (tmp_path / "s.npy").exists()


def test_optimizer_refusal_lists_what_it_accepts(session):
    w = session.tensor(np.ones(3, np.float32), device="cpu:0", requires_grad=True)

    class TypoAdam(tensordd.optim.Optimizer):
        kind = "adam"

    with pytest.raises(tensordd.InvalidArgumentError) as info:
        TypoAdam([w], lr=0.1, momentum=0.9)  # SGD's, not Adam's
    assert info.value.argument == "momentum"
    assert "accepts: lr, betas" in str(info.value) and "amsgrad" in str(info.value)
    with pytest.raises(tensordd.InvalidArgumentError) as info:
        TypoAdam([w], lr=0.1, schedule="cosine")  # an unknown name with a string value
    assert info.value.argument == "schedule" and "takes no attribute" in str(info.value)
    assert_usable(session)


def test_optimizer_attribute_given_twice_is_refused(daemon):
    from test_hostile_conn import frame, hello, raw, read_frame
    from tensordd import tensordd_pb2 as pb
    c = raw(daemon.endpoint)
    c.sendall(hello())
    assert read_frame(c).WhichOneof("body") == "hello"
    c.sendall(frame(pb.Request(id=2, upload=pb.Upload(handle=1, dtype=pb.DTYPE_F32, shape=[3],
                                                      requires_grad=True)), b"\0" * 12))
    oc = pb.OptimizerCreate(handle=2, kind="sgd", params=[1],
                            attrs=[pb.Attr(name="lr", f=0.1), pb.Attr(name="lr", f=10.0)])
    c.sendall(frame(pb.Request(id=3, want_reply=True, optimizer_create=oc)))
    r = read_frame(c)
    assert r.WhichOneof("body") == "error", r
    assert r.error.code == pb.INVALID_ARGUMENT and r.error.invalid_argument.argument == "lr"
    assert "twice" in r.error.message
    c.close()
