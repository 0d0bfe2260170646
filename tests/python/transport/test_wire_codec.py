"""The Python client's fast codec (tensordd._codec: pure Python, and the accelerator's C, which
compiles proto/wirecodec.h as the daemon and libtensordd do) against python protobuf, on
random messages of every type the .proto has, found by walking its descriptors (a message or
a field added to the .proto is covered without an edit here):

  - encoders: every Request body at random; where the message is a form one of the codec's
    encoders writes (fast_encoders below), its bytes are protobuf's SerializeToString;
  - decoder: every message type serialised, as a Response body where it is one and alone,
    then mutated; the reply decoder declines it (None) or decodes what protobuf decodes, and
    never takes what protobuf rejects."""
import random
import warnings

import pytest
from google.protobuf.descriptor import FieldDescriptor as FD
from google.protobuf.message import DecodeError

from tensordd import _codec
from tensordd import tensordd_pb2 as pb

try:
    from tensordd import _speedups
except ImportError:  # not built: the pure-Python encoders are checked still
    _speedups = None

EDGES = [0, 1, 127, 128, 16383, 16384, 2**21, 2**32 - 1, 2**35, 2**63 - 1, 2**63, 2**64 - 1]


def _messages():
    """Every message type of the .proto, nested ones too."""
    out = []

    def walk(d):
        out.append(d)
        for n in d.nested_types:
            walk(n)
    for d in pb.DESCRIPTOR.message_types_by_name.values():
        walk(d)
    return out


def _scalar(f, r):
    """A random value of f's type, often an edge one."""
    t = f.type
    if t == FD.TYPE_ENUM:
        values = [v.number for v in f.enum_type.values]
        return r.choice(values) if r.random() < 0.9 else r.randrange(-2**31, 2**31)
    if t == FD.TYPE_BOOL:
        return r.random() < 0.5
    if t == FD.TYPE_STRING:
        return r.choice(["", "cpu", "cuda", "é", "x" * r.randrange(1, 40)])
    if t == FD.TYPE_BYTES:
        return bytes(r.randrange(256) for _ in range(r.randrange(0, 20)))
    if t in (FD.TYPE_DOUBLE, FD.TYPE_FLOAT):
        return r.choice([0.0, 1.5, -2.0])
    if t in (FD.TYPE_INT32, FD.TYPE_SINT32, FD.TYPE_SFIXED32):
        return r.choice([0, 1, -1, 2**31 - 1, -2**31, r.randrange(-2**31, 2**31)])
    if t in (FD.TYPE_INT64, FD.TYPE_SINT64, FD.TYPE_SFIXED64):
        return r.choice([0, 1, -1, 2**62, r.randrange(-2**63, 2**63)])
    if t in (FD.TYPE_UINT32, FD.TYPE_FIXED32):
        return r.choice([0, 1, 127, 128, 2**32 - 1, r.randrange(2**32)])
    return r.choice(EDGES + [r.randrange(2**64)])


def _fill(msg, r, depth=0):
    """Random fields of msg (each set or not; a oneof keeps its last member), nested to 3."""
    for f in msg.DESCRIPTOR.fields:
        if r.random() < 0.5:
            continue
        _set(msg, f, r, depth)


def _set(msg, f, r, depth):
    if f.type == FD.TYPE_MESSAGE:
        if depth >= 3:
            return
        if f.label == FD.LABEL_REPEATED:
            for _ in range(r.choice([0, 1, 2])):
                _fill(getattr(msg, f.name).add(), r, depth + 1)
        else:
            sub = getattr(msg, f.name)
            sub.SetInParent()
            _fill(sub, r, depth + 1)
    elif f.label == FD.LABEL_REPEATED:
        getattr(msg, f.name).extend(_scalar(f, r) for _ in range(r.choice([0, 1, 2, 3, 9])))
    else:
        setattr(msg, f.name, _scalar(f, r))


def _set_fields(msg):
    return {f.name: v for f, v in msg.ListFields()}


def _attrs_bytes(op):
    """Op.attrs as the caller hands them to the encoder (already encoded, keys included)."""
    out = pb.Op()
    out.attrs.extend(op.attrs)
    return out.SerializeToString()


def fast_encoders(impl):
    """The codec's request encoders of one implementation, each as a function of a protobuf
    Request: the message's bytes, or None when the message is not a form that encoder writes
    (another body, a field it does not write set, a value it always writes left at default)."""
    frame_op, frame_download, frame_release = impl[1], impl[2], impl[3]

    def unframe(frame):
        return frame[16:]

    def op(req, b):
        s = _set_fields(b)
        if set(s) - {"op", "inputs", "outputs", "attrs"} or "op" not in s or \
                "inputs" not in s or len(b.outputs) != 1:
            return None
        extra = _attrs_bytes(b) if b.attrs else b""
        return unframe(frame_op(req.id, b.op, list(b.inputs), b.outputs[0], extra))

    def download(req, b):
        if set(_set_fields(b)) != {"handle"}:
            return None
        return unframe(frame_download(req.id, b.handle))

    def release(req, b):
        if set(_set_fields(b)) - {"handles"}:
            return None
        return unframe(frame_release(req.id, list(b.handles)))

    def backward(req, b):
        if set(_set_fields(b)) != {"loss", "grads", "pipelined"}:
            return None
        return unframe(_codec.frame_backward(req.id, b.loss, b.grads))

    def optimizer_step(req, b):
        if set(_set_fields(b)) != {"optimizer", "grads", "pipelined"}:
            return None
        return unframe(_codec.frame_optimizer_step(req.id, b.optimizer, b.grads))

    def upload(req, b):
        s = _set_fields(b)
        if set(s) - {"handle", "dtype", "shape", "device", "requires_grad"} or \
                "handle" not in s or "dtype" not in s or not 0 < b.dtype < 128 or \
                min(b.shape, default=0) < 0:
            return None  # (its arguments: a numpy array's dtype and dimensions)
        dev = pb.Upload(device=b.device).SerializeToString() if b.HasField("device") else b""
        return unframe(_codec.frame_upload(req.id, b.handle, b.dtype, list(b.shape), dev,
                                           b.requires_grad, 0))
    return {"op": op, "download": download, "release": release, "backward": backward,
            "optimizer_step": optimizer_step, "upload": upload}


def _impls():
    out = [("python", _codec.py_frame_op, _codec.py_frame_download, _codec.py_frame_release)]
    if _speedups is not None:
        out.append(("c", _speedups.frame_op, _speedups.frame_download, _speedups.frame_release))
    return out


def _encode(encoders, req):
    if set(_set_fields(req)) - {"id", req.WhichOneof("body")} or req.id == 0:
        return None  # want_reply, a field the encoders do not write: protobuf's
    fn = encoders.get(req.WhichOneof("body"))
    return fn(req, getattr(req, req.WhichOneof("body"))) if fn else None


@pytest.mark.parametrize("impl", _impls(), ids=lambda i: i[0])
def test_every_request_body_through_the_encoders(impl):
    encoders = fast_encoders(impl)
    r = random.Random(31)
    bodies = pb.Request.DESCRIPTOR.oneofs_by_name["body"].fields
    written = {}
    for body in bodies:
        for _ in range(150):
            req = pb.Request()
            if r.random() < 0.9:
                req.id = r.choice(EDGES[1:] + [r.randrange(1, 2**64)])
            _set(req, body, r, 0)
            if r.random() < 0.3 and req.WhichOneof("body") == body.name:
                # the forms the client sends: bare bodies, all of a hot body's fields set
                sub = getattr(req, body.name)
                for f in sub.DESCRIPTOR.fields:
                    if f.type != FD.TYPE_MESSAGE and r.random() < 0.7:
                        _set(sub, f, r, 1)
            if r.random() < 0.5 and body.name in ("backward", "optimizer_step"):
                getattr(req, body.name).pipelined = True
            if req.WhichOneof("body") != body.name:
                continue
            try:
                got = _encode(encoders, req)
            except (ValueError, OverflowError, UnicodeError):
                continue  # (a value the encoder's arguments refuse, as protobuf's would)
            if got is None:
                continue
            written[body.name] = written.get(body.name, 0) + 1
            assert got == req.SerializeToString(), (impl[0], body.name, str(req))
    # every encoder wrote some (the random forms reach each of them)
    assert set(written) == set(encoders), written


def _protobuf_view(msg):
    """What parse_tensor_reply must return for msg, by protobuf: None for anything but a
    Response{id, tensor}."""
    try:
        with warnings.catch_warnings():  # (mutated bytes: an end-group tag, say)
            warnings.simplefilter("ignore", RuntimeWarning)
            back = pb.Response.FromString(msg)
    except DecodeError:
        return "rejected"
    if back.WhichOneof("body") != "tensor":
        return None
    t = back.tensor
    return (back.id, t.handle, t.dtype, tuple(t.shape), t.device.backend, t.device.ordinal,
            t.requires_grad)


def _mutate(msg, r):
    b = bytearray(msg)
    for _ in range(r.randrange(1, 4)):
        k = r.randrange(5)
        if k == 0 and b:
            b[r.randrange(len(b))] ^= 1 << r.randrange(8)
        elif k == 1 and b:
            b[r.randrange(len(b))] = r.randrange(256)
        elif k == 2:
            b.insert(r.randrange(len(b) + 1), r.randrange(256))
        elif k == 3 and b:
            del b[r.randrange(len(b)):]
        else:
            b += bytes(r.randrange(256) for _ in range(r.randrange(1, 4)))
    return bytes(b)


@pytest.mark.skipif(_speedups is None, reason="tensordd._speedups is not built")
def test_every_message_through_the_reply_decoder():
    r = random.Random(37)
    bodies = {f.message_type.full_name: f
              for f in pb.Response.DESCRIPTOR.oneofs_by_name["body"].fields}
    decoded = declined = 0
    kinds = _messages()
    assert len(kinds) > 40
    for d in kinds:
        cls = pb.__dict__.get(d.name)
        if cls is None:
            continue  # (a nested type: met inside its parent)
        for _ in range(60):
            m = cls()
            _fill(m, r)
            inner = m.SerializeToString()
            msgs = [inner]
            body = bodies.get(d.full_name)
            if body is not None:  # as the Response body it is
                resp = pb.Response()
                if r.random() < 0.8:
                    resp.id = r.choice(EDGES)
                getattr(resp, body.name).CopyFrom(m)
                msgs.append(resp.SerializeToString())
            msgs += [_mutate(x, r) for x in msgs for _ in range(2)]
            for msg in msgs:
                got = _speedups.parse_tensor_reply(msg)
                want = _protobuf_view(msg)
                if got is None:
                    declined += 1
                    continue
                decoded += 1
                assert got == want, (d.name, msg.hex(), got, want)
    assert decoded and declined
