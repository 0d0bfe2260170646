"""Helpers shared by the daemon tests."""

from __future__ import annotations

import socket
import struct

import pytest

import tensordd
from tensordd import tensordd_pb2 as pb

_known: dict = {}


def require_ops(session, *names: str) -> None:
    """Skips the test if the daemon does not know one of the ops yet.

    The op set grows over time (first add sub mul div matmul sum relu); a
    test of a later op skips, with the op named, until the daemon serves it.
    Probing sends the op with no inputs: only an unknown name answers
    UNSUPPORTED_OP (an arity or attribute complaint means the op exists).
    """
    missing = []
    for name in names:
        if name not in _known:
            session.op(name, num_outputs=1)
            try:
                session.sync()
                _known[name] = True
            except tensordd.UnsupportedOpError:
                _known[name] = False
            except tensordd.Error:
                _known[name] = True
        if not _known[name]:
            missing.append(name)
    if missing:
        pytest.skip(f"daemon does not serve op(s) yet: {', '.join(missing)}")


def autodiff_served(session) -> bool:
    """Whether the daemon answers Backward (False while autodiff is a stub)."""
    if "<backward>" not in _known:
        x = session.tensor([1.0], requires_grad=True)
        try:
            x.sum().backward()
            _known["<backward>"] = True
        except tensordd.UnsupportedOpError:
            _known["<backward>"] = False
        except tensordd.Error:
            _known["<backward>"] = True
    return _known["<backward>"]


def require_autodiff(session) -> None:
    if not autodiff_served(session):
        pytest.skip("daemon answers UNSUPPORTED_OP to Backward: autodiff not served yet")


# ---- raw protocol frames, for tests that talk to the daemon without the client

MAGIC = 0x01444454


def frame(req, payload=b""):
    m = req.SerializeToString()
    return struct.pack("<IIQ", MAGIC, len(m), len(payload)) + m + payload


def hello(rid=1, name="hostile", token=""):
    return frame(pb.Request(id=rid, hello=pb.Hello(min_version=1, max_version=1,
                                                   client_name=name, token=token)))


def raw(endpoint, timeout=10):
    host, port = endpoint[len("tcp://"):].rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=timeout)


def read_frame(sock):
    """One Response (and its payload); None at EOF."""
    hdr = sock.recv(16, socket.MSG_WAITALL)
    if len(hdr) < 16:
        return None
    magic, mlen, plen = struct.unpack("<IIQ", hdr)
    assert magic == MAGIC
    msg = sock.recv(mlen, socket.MSG_WAITALL) if mlen else b""
    r = pb.Response()
    r.ParseFromString(msg)
    left = plen
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        assert chunk, "EOF inside a payload"
        left -= len(chunk)
    return r
