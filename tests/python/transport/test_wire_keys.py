"""The wire's field keys generated from proto/tensordd.proto (tensordd._wire_keys, which
_codec.py and session.py take their keys from) against protobuf's own encoding, for every
field of every message; and every Response body, at random, through the accelerator's reply
decoder, which must decline it or decode what protobuf decodes."""
import random
import re
import struct

import pytest

from tensordd import _wire_keys
from tensordd import tensordd_pb2 as pb
from google.protobuf.descriptor import FieldDescriptor as FD

try:
    from tensordd import _speedups
except ImportError:  # not built
    _speedups = None


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


def _upper(name):
    """protobuf-c's spelling, upper-cased (TensorInfo -> TENSOR_INFO), as the generator's."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).upper()


def _varint(n):
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _set_one(msg, f, r=None):
    """Sets field f of msg to a value that is not its default (r: a random one)."""
    rnd = r or random.Random(0)
    if f.type == FD.TYPE_MESSAGE:
        if f.label == FD.LABEL_REPEATED:
            sub = getattr(msg, f.name).add()
        else:
            sub = getattr(msg, f.name)
            sub.SetInParent()
        if r is not None:
            _fill(sub, r, 1)
        return
    if f.type == FD.TYPE_ENUM:
        values = [v.number for v in f.enum_type.values if v.number] or [1]
        v = rnd.choice(values)
    elif f.type == FD.TYPE_BOOL:
        v = True
    elif f.type == FD.TYPE_STRING:
        v = "x" * rnd.randrange(1, 20)
    elif f.type == FD.TYPE_BYTES:
        v = bytes(rnd.randrange(256) for _ in range(rnd.randrange(1, 20)))
    elif f.type in (FD.TYPE_DOUBLE, FD.TYPE_FLOAT):
        v = 1.5
    elif f.type in (FD.TYPE_INT32, FD.TYPE_SINT32, FD.TYPE_SFIXED32):
        v = rnd.choice([1, -1, 2**31 - 1])
    elif f.type in (FD.TYPE_INT64, FD.TYPE_SINT64, FD.TYPE_SFIXED64):
        v = rnd.choice([1, -1, 2**62, 300])
    elif f.type in (FD.TYPE_UINT32, FD.TYPE_FIXED32):
        v = rnd.choice([1, 127, 128, 2**32 - 1])
    else:
        v = rnd.choice([1, 127, 128, 2**64 - 1])
    if f.label == FD.LABEL_REPEATED:
        getattr(msg, f.name).append(v)
    else:
        setattr(msg, f.name, v)


def _fill(msg, r, depth):
    """Random fields of msg (a oneof keeps its last member set), nested to depth 3."""
    for f in msg.DESCRIPTOR.fields:
        if r.random() < 0.5 or (f.type == FD.TYPE_MESSAGE and depth >= 3):
            continue
        for _ in range(r.choice([1, 1, 2, 3]) if f.label == FD.LABEL_REPEATED else 1):
            _set_one(msg, f, r if f.type == FD.TYPE_MESSAGE and depth < 3 else None)


def test_every_field_has_protobufs_key():
    fields = 0
    for d in _messages():
        for f in d.fields:
            name = f"K_{_upper(d.name)}_{_upper(f.name)}"
            key = getattr(_wire_keys, name)
            assert d.containing_type is None, "a nested message: look its class up here"
            msg = getattr(pb, d.name)()
            _set_one(msg, f)
            data = msg.SerializeToString()
            # what protobuf writes first (the only field set) is the key: its field number,
            # and the wire type protobuf chose (a packed array's is length-delimited)
            v, n = _first_varint(data)
            assert v >> 3 == f.number, (name, data.hex())
            assert key == data[:n] == _varint(v), (name, data.hex(), key.hex())
            unpacked = getattr(_wire_keys, name + "_UNPACKED", None)
            if unpacked is not None:  # a packed scalar: one element alone parses too
                assert f.label == FD.LABEL_REPEATED
                one = getattr(pb, d.name).FromString(unpacked + _element(f, 1))
                assert list(getattr(one, f.name)) == [1], name
            fields += 1
    assert fields == len(_wire_keys.FIELDS)
    assert {(m, f) for m, f, _, _ in _wire_keys.FIELDS} == \
        {(d.name, f.name) for d in _messages() for f in d.fields}


def _element(f, v):
    """v as one element of f on the wire (after its unpacked key)."""
    if f.type in (FD.TYPE_DOUBLE, FD.TYPE_FLOAT):
        return struct.pack("<d" if f.type == FD.TYPE_DOUBLE else "<f", v)
    if f.type in (FD.TYPE_FIXED64, FD.TYPE_SFIXED64, FD.TYPE_FIXED32, FD.TYPE_SFIXED32):
        return v.to_bytes(8 if f.type in (FD.TYPE_FIXED64, FD.TYPE_SFIXED64) else 4, "little")
    return _varint(v)


def _first_varint(data):
    """(value, length) of the varint data begins with."""
    v = shift = i = 0
    while True:
        b = data[i]
        v |= (b & 0x7F) << shift
        shift += 7
        i += 1
        if b < 0x80:
            return v, i


@pytest.mark.skipif(_speedups is None, reason="tensordd._speedups is not built")
def test_every_response_body_through_the_reply_decoder():
    r = random.Random(21)
    decoded = declined = 0
    bodies = pb.Response.DESCRIPTOR.oneofs_by_name["body"].fields
    for body in bodies:
        for _ in range(200):
            resp = pb.Response()
            if r.random() < 0.8:
                resp.id = r.choice([1, 127, 128, 2**40, 2**64 - 1])
            _set_one(resp, body, r)
            msg = resp.SerializeToString()
            got = _speedups.parse_tensor_reply(msg)
            if got is None:
                declined += 1
                continue
            decoded += 1
            back = pb.Response.FromString(msg)
            assert back.WhichOneof("body") == "tensor", (body.name, msg.hex())
            t = back.tensor
            assert got == (back.id, t.handle, t.dtype, tuple(t.shape), t.device.backend,
                           t.device.ordinal, t.requires_grad), msg.hex()
    assert decoded and declined
