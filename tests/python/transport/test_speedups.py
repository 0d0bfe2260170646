"""The client's hot paths (tensordd/_codec.py, and the optional C accelerator
tensordd._speedups) against protobuf's own encoding and decoding and against numpy.

The pure-Python functions are checked always; the accelerator's where it is built
(make builds it into $(BUILD)/python/tensordd/). `make test-python` runs this file
with the accelerator and again with TENSORDD_PURE=1."""
import os
import random
import subprocess
import sys

import numpy as np
import pytest

import tensordd
from tensordd import _codec
from tensordd import tensordd_pb2 as pb
from tensordd._wire import HEADER, MAGIC

try:
    from tensordd import _speedups
except ImportError:  # not built: the pure-Python checks still run
    _speedups = None

needs_c = pytest.mark.skipif(_speedups is None, reason="tensordd._speedups is not built")

# Request ids, handles and op names are never 0 or empty (proto3 would leave them out).
EDGES = [1, 127, 128, 16383, 16384, 2**21 - 1, 2**21, 2**28, 2**35, 2**56, 2**63 - 1,
         2**63, 2**64 - 1]
NAMES = ["relu", "add", "matmul", "cross_entropy", "x" * 200, "é", "名前"]


def _u64(r):
    return r.choice(EDGES + [r.randrange(1, 2**40), r.randrange(1, 2**64)])


def _encoders():
    """(name, encode_op, frame_op, append_op, frame_download, frame_release) of each
    implementation present."""
    out = [("python", _codec.py_encode_op, _codec.py_frame_op, _codec.py_append_op,
            _codec.py_frame_download, _codec.py_frame_release)]
    if _speedups is not None:
        out.append(("c", _speedups.encode_op, _speedups.frame_op, _speedups.append_op,
                    _speedups.frame_download, _speedups.frame_release))
    return out


def _unframe(frame):
    magic, msg_len, payload_len = HEADER.unpack(frame[:16])
    assert magic == MAGIC and payload_len == 0 and msg_len == len(frame) - 16
    return frame[16:]


@pytest.mark.parametrize("impl", _encoders(), ids=lambda i: i[0])
def test_requests_are_protobufs_encoding(impl):
    _, encode_op, frame_op, append_op, frame_download, frame_release = impl
    r = random.Random(11)
    for _ in range(3000):
        rid, out = _u64(r), _u64(r)
        inputs = [_u64(r) for _ in range(r.choice([1, 1, 2, 3, 9, 40]))]
        name = r.choice(NAMES)
        req = pb.Request(id=rid)
        req.op.op = name
        req.op.inputs.extend(inputs)
        req.op.outputs.append(out)
        want = req.SerializeToString()
        assert encode_op(rid, name, inputs, out) == want
        assert _unframe(frame_op(rid, name, tuple(inputs), out)) == want
        buf = bytearray(b"queued")
        assert append_op(buf, rid, name, inputs, out) == len(buf)
        assert buf[:6] == b"queued" and _unframe(bytes(buf[6:])) == want

        handle = _u64(r)
        d = pb.Request(id=rid)
        d.download.handle = handle
        assert _unframe(frame_download(rid, handle)) == d.SerializeToString()

        handles = [_u64(r) for _ in range(r.choice([1, 2, 255, 256, 1000]))]
        rel = pb.Request(id=rid)
        rel.release.handles.extend(handles)
        assert _unframe(frame_release(rid, handles)) == rel.SerializeToString()


@needs_c
def test_accelerator_refuses_what_protobuf_cannot_encode():
    for bad in (-1, 2**64, "3", 1.5, None):
        with pytest.raises((OverflowError, TypeError)):
            _speedups.frame_op(1, "relu", [bad], 2)
        with pytest.raises((OverflowError, TypeError)):
            _speedups.frame_download(bad, 2)
        with pytest.raises((OverflowError, TypeError)):
            _speedups.frame_release(1, [1, bad])
    with pytest.raises(TypeError):
        _speedups.frame_op(1, b"relu", [1], 2)  # the op name is a str
    with pytest.raises(TypeError):
        _speedups.append_op(b"immutable", 1, "relu", [1], 2)
    with pytest.raises(TypeError):
        _speedups.frame_op(1, "relu", [1])


# ---------------------------------------------------------------- replies


def _varint(n):
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(num, wire, data):
    key = _varint(num << 3 | wire)
    if wire == 0:
        return key + _varint(data)
    return key + _varint(len(data)) + data


def _random_reply(r):
    """A Response{id, tensor} in an encoding protobuf accepts: fields in any order,
    shape packed, unpacked or both, defaults left out or written."""
    rid, handle = _u64(r), _u64(r)
    dtype = r.choice([0, 1, 4, 6, 7, 10, 11, 2**31 - 1])
    shape = [r.choice([0, 1, 3, 4, 1000, 2**40, 2**64 - 1]) for _ in range(r.randrange(0, 9))]
    backend = r.choice(["cpu", "cuda", "sim", "", "é"])
    ordinal = r.choice([0, 1, 7, 2**32 - 1, 2**32 + 5])  # (uint32: protobuf keeps 32 bits)
    grad = r.choice([0, 1, 2])
    dev = []
    if backend or r.random() < 0.3:
        dev.append(_field(1, 2, backend.encode()))
    if ordinal or r.random() < 0.3:
        dev.append(_field(2, 0, ordinal))
    r.shuffle(dev)
    info = [_field(1, 0, handle), _field(2, 0, dtype), _field(5, 0, grad)]
    if r.random() < 0.8:
        info.append(_field(4, 2, b"".join(dev)))
    if shape:
        k = r.randrange(len(shape) + 1)
        head, tail = shape[:k], shape[k:]
        info.append(_field(3, 2, b"".join(_varint(v) for v in head)) if head else b"")
        info.extend(_field(3, 0, v) for v in tail)  # (order of shape values kept)
    # shape values must stay in order: shuffle only the other fields around them
    fixed = [f for f in info if f[:1] not in (b"\x18", b"\x1a")]
    shp = [f for f in info if f[:1] in (b"\x18", b"\x1a")]
    r.shuffle(fixed)
    at = r.randrange(len(fixed) + 1)
    body = b"".join(fixed[:at] + shp + fixed[at:])
    parts = [_field(1, 0, rid), _field(14, 2, body)]
    r.shuffle(parts)
    return b"".join(parts)


def _protobuf_view(msg):
    resp = pb.Response.FromString(msg)
    t = resp.tensor
    return (resp.id, t.handle, t.dtype, tuple(t.shape), t.device.backend, t.device.ordinal,
            t.requires_grad)


@needs_c
def test_plain_replies_decode_as_protobuf_decodes_them():
    r = random.Random(12)
    decoded = 0
    for _ in range(3000):
        msg = _random_reply(r)
        got = _speedups.parse_tensor_reply(msg)
        assert got is not None, msg.hex()
        assert got == _protobuf_view(msg), msg.hex()
        assert isinstance(got[6], bool) and got[6] == bool(_protobuf_view(msg)[6])
        decoded += 1
    # what the daemon sends
    resp = pb.Response(id=5)
    resp.tensor.handle = 3
    resp.tensor.dtype = pb.DTYPE_F32
    resp.tensor.shape.extend([2, 0, 7])
    resp.tensor.device.backend = "cpu"
    resp.tensor.device.ordinal = 1
    resp.tensor.requires_grad = True
    msg = resp.SerializeToString()
    assert _speedups.parse_tensor_reply(msg) == (5, 3, 1, (2, 0, 7), "cpu", 1, True)
    assert _speedups.parse_tensor_reply(bytearray(msg)) == _protobuf_view(msg)
    assert _speedups.parse_tensor_reply(memoryview(msg)) == _protobuf_view(msg)


@needs_c
def test_other_replies_are_left_to_protobuf():
    """Anything but the plain form (another body, unknown or repeated fields, a wrong
    wire type, a truncated or invalid message) gives None: protobuf then decides."""
    err = pb.Response(id=4)
    err.error.code = pb.SHAPE_MISMATCH
    err.error.message = "no"
    ok = pb.Response(id=4)
    ok.ok.SetInParent()
    good = pb.Response(id=4)
    good.tensor.shape.extend([4])
    g = good.SerializeToString()
    for msg in [
        b"",
        err.SerializeToString(),
        ok.SerializeToString(),
        pb.Response(id=4).SerializeToString(),  # no body
        g + _field(1, 0, 9),  # id twice (protobuf: the last wins)
        g + _field(14, 2, b""),  # tensor twice (protobuf merges)
        g + _field(99, 0, 1),  # an unknown field
        _field(1, 0, 4) + _field(14, 2, _field(1, 0, 3) + _field(1, 0, 4)),
        _field(1, 0, 4) + _field(14, 2, _field(6, 0, 1)),
        _field(1, 0, 4) + _field(14, 2, _field(2, 0, 2**31)),  # dtype out of int32
        _field(1, 0, 4) + _field(14, 2, _field(4, 2, _field(1, 2, b"\xff\xfe"))),  # not UTF-8
        _field(1, 0, 4) + _field(14, 2, _field(4, 2, _field(3, 0, 1))),
        _field(1, 0, 4) + _field(14, 0, 5),  # tensor as a varint
        _field(1, 0, 4) + _field(14, 2, _field(3, 2, b"\x80")),  # truncated packed value
        _field(1, 0, 4) + _field(14, 2, b"".join(_field(3, 0, 1) for _ in range(65))),
        g[:-1],
        b"\x08" + b"\xff" * 10 + b"\x02",  # an over-long varint
    ]:
        assert _speedups.parse_tensor_reply(msg) is None, msg.hex()


# ---------------------------------------------------------------- payload copies


def _copiers():
    out = [("python", _codec.py_copy_into)]
    if _speedups is not None:
        out.append(("c", _speedups.copy_into))
    return out


@pytest.mark.parametrize("copy_into", [c[1] for c in _copiers()], ids=[c[0] for c in _copiers()])
def test_copy_into_copies_what_is_buffered(copy_into):
    src = bytearray(range(256)) * 4
    for dtype, shape in [(np.float32, (4,)), (np.int64, (3, 5)), (np.uint8, (0,)),
                         (np.float64, ()), (np.int16, (2, 3, 4))]:
        for pos in (0, 7, 1000, 1024, 2000):
            dest = np.zeros(shape, dtype)
            got, left = copy_into(dest, src, pos)
            n = min(dest.nbytes, max(len(src) - pos, 0))
            assert (got, left) == (n, dest.nbytes - n)
            want = np.zeros(dest.nbytes, np.uint8)
            want[:n] = np.frombuffer(bytes(src[pos:pos + n]), np.uint8)
            assert dest.tobytes() == want.tobytes()
    buf = bytearray(4)
    assert copy_into(memoryview(buf)[1:3], b"xyz", 1) == (2, 0) and buf == b"\0yz\0"
    with pytest.raises(ValueError):
        copy_into(np.zeros((4, 4), np.float32)[:, 1], src, 0)  # not contiguous
    with pytest.raises(ValueError):
        copy_into(b"read-only", src, 0)


# ---------------------------------------------------------------- both ways


def _mode(env_pure):
    env = dict(os.environ)
    env.pop("TENSORDD_PURE", None)
    if env_pure is not None:
        env["TENSORDD_PURE"] = env_pure
    out = subprocess.run([sys.executable, "-c", "import tensordd._codec as c; "
                          "print(c.ACCELERATED, c.frame_op.__module__)"],
                         env=env, capture_output=True, text=True, timeout=60, check=True)
    return out.stdout.split()


def test_tensordd_pure_forces_pure_python():
    assert _mode("1") == ["False", "tensordd._codec"]
    if _speedups is not None:
        assert _mode(None) == ["True", "tensordd._speedups"]
        assert _mode("0") == ["True", "tensordd._speedups"]


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "int64", "int32", "int16",
                                   "int8", "uint8", "bool"])
def test_downloads_round_trip(session, dtype):
    """Values, shape, dtype and device after a download, whichever path decoded its
    answer (the accelerator's or protobuf's: make runs this file both ways)."""
    rng = np.random.default_rng(3)
    for shape in [(), (0,), (4,), (3, 0, 2), (2, 3, 5)]:
        a = (rng.standard_normal(shape) * 50).astype(dtype)
        t = session.tensor(a)
        back = t.numpy()
        assert back.dtype == a.dtype and back.shape == a.shape
        np.testing.assert_array_equal(back, a)
        if dtype in ("float32", "float64"):
            r = t.relu()  # an op's output: its metadata comes from the download's answer
            assert r._shape is None
            np.testing.assert_array_equal(r.numpy(), np.maximum(a, 0))
            assert (r._shape, r._dtype, r._device, r._requires_grad) == (shape, dtype, "cpu:0",
                                                                         False)


def test_bfloat16_download_and_many_pipelined_ops(session):
    a = np.array([1.5, -2.0, 3.25, 0.0], np.float32)
    t = session.tensor(a, dtype="bfloat16")
    np.testing.assert_array_equal(t.relu().numpy(), np.maximum(a, 0))
    # a long pipelined chain (several write buffers, releases batched as it goes)
    x = session.tensor(np.arange(-8, 8, dtype=np.float32))
    y = x
    for _ in range(3000):
        y = y.relu().neg().neg()
    np.testing.assert_array_equal(y.numpy(), np.maximum(np.arange(-8, 8, dtype=np.float32), 0))
    with pytest.raises(tensordd.Error) as e:
        session.op("add", x, session.tensor(np.ones(3, np.float32))).numpy()
    assert e.value.code == "SHAPE_MISMATCH" and "op add(#" in str(e.value)
