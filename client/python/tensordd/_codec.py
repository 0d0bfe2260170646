"""_codec -- the hot requests encoded by hand, and small replies decoded by hand.

The requests a session sends most (an op with tensor inputs, one output and no
attributes or with cached ones; a Download; a Release; a small Upload from a numpy
array; a training step's pipelined Backward and OptimizerStep) are encoded here as whole frames (header and
message) with the bytes protobuf's own SerializeToString gives; the
Response of a Download is decoded without building a protobuf message when it
is the plain ``{id, tensor{...}}`` the daemon sends.

When the optional C accelerator ``tensordd._speedups`` is importable the same
functions come from it (``ACCELERATED`` is True); ``TENSORDD_PURE=1`` in the
environment forces the pure-Python ones. Both give identical results
(tests/python/test_speedups.py holds them to protobuf's encoding and decoding).
"""

from __future__ import annotations

import os
import struct

# Every field's key as the bytes that begin it, generated from proto/tensordd.proto
# (tools/gen_wire_keys.py; build/python/tensordd/_wire_keys.py in the tree).
from ._wire_keys import (K_BACKWARD_GRADS, K_BACKWARD_LOSS, K_BACKWARD_PIPELINED,
                         K_DOWNLOAD_HANDLE, K_OP_INPUTS, K_OP_OP, K_OP_OUTPUTS,
                         K_OPTIMIZER_STEP_GRADS, K_OPTIMIZER_STEP_OPTIMIZER,
                         K_OPTIMIZER_STEP_PIPELINED, K_RELEASE_HANDLES, K_REQUEST_BACKWARD,
                         K_REQUEST_DOWNLOAD, K_REQUEST_ID, K_REQUEST_OP,
                         K_REQUEST_OPTIMIZER_STEP, K_REQUEST_RELEASE, K_REQUEST_UPLOAD,
                         K_UPLOAD_DTYPE, K_UPLOAD_HANDLE, K_UPLOAD_REQUIRES_GRAD,
                         K_UPLOAD_SHAPE)

__all__ = ["ACCELERATED", "SessionState", "append_op", "copy_into", "py_append_op", "py_copy_into", "encode_op", "frame_op", "frame_download", "frame_release",
           "frame_upload", "frame_backward", "frame_optimizer_step", "parse_tensor_reply",
           "download", "set_download_types", "op", "set_op_types", "numpy",
           "set_numpy_types", "py_encode_op", "py_frame_op",
           "py_frame_download", "py_frame_release", "py_frame_upload"]

_MAGIC = 0x01444454  # _wire.MAGIC
_pack_header = struct.Struct("<IIQ").pack


def _varint(n: int) -> bytes:
    """protobuf's base-128 varint of n >= 0."""
    if n < 0x80:
        return _SMALL_VARINTS[n]
    if n < 0x4000:
        return bytes(((n & 0x7F) | 0x80, n >> 7))
    if n < 0x200000:
        return bytes(((n & 0x7F) | 0x80, ((n >> 7) & 0x7F) | 0x80, n >> 14))
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_SMALL_VARINTS = [bytes((i,)) for i in range(0x80)]
_OP_NAMES: dict = {}  # op name -> its encoded Op.op field


def py_encode_op(rid: int, name: str, inputs, out: int, extra: bytes = b"") -> bytes:
    """Request{id: rid, op: Op{op: name, inputs, outputs: [out]}}, as protobuf encodes
    it: Request.id is field 1 (varint), Request.op field 14; Op.op field 1, Op.inputs
    field 2 and Op.outputs field 3 (packed varints). extra ends the Op message as it is
    (Op.attrs, field 4, already encoded)."""
    head = _OP_NAMES.get(name)
    if head is None:
        b = name.encode()
        head = _OP_NAMES[name] = K_OP_OP + _varint(len(b)) + b
    if len(inputs) == 1:
        ins = _varint(inputs[0])
    else:
        ins = b"".join([_varint(h) for h in inputs])
    o = _varint(out)
    body = b"".join((head, K_OP_INPUTS, _SMALL_VARINTS[len(ins)] if len(ins) < 0x80
                     else _varint(len(ins)), ins, K_OP_OUTPUTS, _SMALL_VARINTS[len(o)], o, extra))
    return b"".join((K_REQUEST_ID, _varint(rid), K_REQUEST_OP, _varint(len(body)), body))


def py_frame_op(rid: int, name: str, inputs, out: int, extra: bytes = b"") -> bytes:
    """The whole frame (16-byte header, no payload) of encode_op's request."""
    msg = py_encode_op(rid, name, inputs, out, extra)
    return _pack_header(_MAGIC, len(msg), 0) + msg


def py_frame_download(rid: int, handle: int) -> bytes:
    """The frame of Request{id: rid, download: Download{handle}} (field 13)."""
    h = _varint(handle)
    msg = b"".join((K_REQUEST_ID, _varint(rid), K_REQUEST_DOWNLOAD,
                    _SMALL_VARINTS[len(K_DOWNLOAD_HANDLE) + len(h)], K_DOWNLOAD_HANDLE, h))
    return _pack_header(_MAGIC, len(msg), 0) + msg


def py_frame_release(rid: int, handles) -> bytes:
    """The frame of Request{id: rid, release: Release{handles}} (field 15; packed)."""
    hs = b"".join([_varint(h) for h in handles])
    if hs:
        body = b"".join((K_RELEASE_HANDLES, _varint(len(hs)), hs))
    else:
        body = b""
    msg = b"".join((K_REQUEST_ID, _varint(rid), K_REQUEST_RELEASE, _varint(len(body)), body))
    return _pack_header(_MAGIC, len(msg), 0) + msg


def py_frame_upload(rid: int, handle: int, wire: int, shape, device: bytes,
                    requires_grad: bool, nbytes: int) -> bytes:
    """The header and message of Request{id: rid, upload: Upload{handle, dtype: wire,
    shape, device, requires_grad}} (field 12; Upload's fields 1-5, shape packed) for a
    payload of nbytes; device is the Device message already encoded (field 4, tag and
    length included)."""
    if shape:
        dims = b"".join([_varint(d) for d in shape])
        dims = b"".join((K_UPLOAD_SHAPE, _varint(len(dims)), dims))
    else:
        dims = b""
    body = b"".join((K_UPLOAD_HANDLE, _varint(handle), K_UPLOAD_DTYPE, _SMALL_VARINTS[wire], dims,
                     device, _UPLOAD_REQUIRES_GRAD if requires_grad else b""))
    msg = b"".join((K_REQUEST_ID, _varint(rid), K_REQUEST_UPLOAD, _varint(len(body)), body))
    return _pack_header(_MAGIC, len(msg), nbytes) + msg


_UPLOAD_REQUIRES_GRAD = K_UPLOAD_REQUIRES_GRAD + b"\x01"
_BACKWARD_PIPELINED = K_BACKWARD_PIPELINED + b"\x01"
_OPTIMIZER_STEP_PIPELINED = K_OPTIMIZER_STEP_PIPELINED + b"\x01"


def frame_backward(rid: int, loss: int, grads: int) -> bytes:
    """The frame of Request{id: rid, backward: Backward{loss, grads, pipelined: true}}
    (the training step's backward): the body's fields in number order, pipelined last."""
    body = b"".join((K_BACKWARD_LOSS, _varint(loss), K_BACKWARD_GRADS, _varint(grads),
                     _BACKWARD_PIPELINED))
    msg = b"".join((K_REQUEST_ID, _varint(rid), K_REQUEST_BACKWARD, _varint(len(body)), body))
    return _pack_header(_MAGIC, len(msg), 0) + msg


def frame_optimizer_step(rid: int, optimizer: int, grads: int) -> bytes:
    """The frame of Request{id: rid, optimizer_step: OptimizerStep{optimizer, grads,
    pipelined: true}}: the body's fields in number order, pipelined last."""
    body = b"".join((K_OPTIMIZER_STEP_OPTIMIZER, _varint(optimizer), K_OPTIMIZER_STEP_GRADS,
                     _varint(grads), _OPTIMIZER_STEP_PIPELINED))
    msg = b"".join((K_REQUEST_ID, _varint(rid), K_REQUEST_OPTIMIZER_STEP, _varint(len(body)),
                    body))
    return _pack_header(_MAGIC, len(msg), 0) + msg


def py_append_op(wbuf: bytearray, rid: int, name: str, inputs, out: int,
                 extra: bytes = b"") -> int:
    """frame_op's bytes appended to wbuf; its new length."""
    wbuf += py_frame_op(rid, name, inputs, out, extra)
    return len(wbuf)


def py_copy_into(dest, src, pos: int) -> tuple:
    """Copies src[pos:] into dest (a writable C-contiguous buffer) as far as it fits;
    returns (bytes copied, bytes of dest left to fill)."""
    view = memoryview(dest)
    if view.readonly or not view.c_contiguous:
        raise ValueError("payload buffer must be a writable C-contiguous buffer")
    if view.ndim != 1 or view.format != "B":
        view = view.cast("B") if view.nbytes else memoryview(bytearray())
    n = max(min(view.nbytes, len(src) - pos), 0)
    if n:
        view[:n] = src[pos:pos + n]
    return n, view.nbytes - n


# A session's bookkeeping, shared with the accelerator's op and numpy (tensordd/_state.py;
# the accelerator's own type when it is built).
from ._state import SessionState  # noqa: E402

encode_op = py_encode_op
frame_op = py_frame_op
append_op = py_append_op
copy_into = py_copy_into
frame_download = py_frame_download
frame_release = py_frame_release
frame_upload = py_frame_upload
# Pure Python: replies are decoded by protobuf (a hand-written decoder in Python is
# no faster than its C++ one); the accelerator decodes the plain ones itself.
parse_tensor_reply = None
# The accelerator's whole Download round trip on a plain socket (Session._download).
download = None
set_download_types = None
# ... and its whole Session._op_fast (op(state, session, ...), set_op_types).
op = None
set_op_types = None
# ... and Tensor.numpy's whole download (numpy(state, session, t), set_numpy_types).
numpy = None
set_numpy_types = None
ACCELERATED = False

if os.environ.get("TENSORDD_PURE", "") in ("", "0"):
    try:
        from ._speedups import (SessionState, append_op, copy_into,  # noqa: F811
                                download, encode_op, frame_download, frame_op,
                                frame_release, numpy, op, parse_tensor_reply,
                                set_download_types, set_numpy_types, set_op_types)
        ACCELERATED = True
    except ImportError:
        pass
