"""Each error class raised from a real daemon answer, with its typed detail,
the failing call named, and the session still usable afterwards (except the
protocol-level errors, which end the connection by design)."""

from __future__ import annotations

import gc
import itertools
import socket
import struct
import subprocess

import numpy as np
import pytest

import tensordd
from conftest import TDD_BIN
from helpers import require_autodiff
from tensordd import tensordd_pb2 as pb


def ones(session, *shape, device="cpu:0"):
    return session.tensor(np.ones(shape, np.float32), device=device)


def assert_usable(session):
    a = ones(session, 2)
    np.testing.assert_array_equal((a + a).numpy(), [2, 2])


def test_unknown_handle(session):
    ghost = tensordd.Tensor(session, 987654)
    with pytest.raises(tensordd.UnknownHandleError) as info:
        ghost.numpy()
    e = info.value
    assert e.handle == 987654 and e.code == "UNKNOWN_HANDLE"
    assert "download(#987654)" in str(e)
    # as an op input (asynchronous: reported at the next sync, naming the op)
    out = ghost + ones(session, 1)
    with pytest.raises(tensordd.UnknownHandleError) as info:
        session.sync()
    assert info.value.handle == 987654 and "op add(#987654" in str(info.value)
    del out
    assert_usable(session)


def test_released_handle_is_unknown(session):
    a = ones(session, 3)
    handle = a.handle
    del a  # queued for release
    ghost = tensordd.Tensor(session, handle)
    with pytest.raises(tensordd.UnknownHandleError) as info:
        ghost.numpy()
    assert info.value.handle == handle


def test_shape_mismatch(session):
    # (2, 3) and (4, 5) cannot broadcast either, whatever the op set becomes
    a, b = ones(session, 2, 3), ones(session, 4, 5)
    c = a + b
    with pytest.raises(tensordd.ShapeMismatchError) as info:
        session.sync()
    e = info.value
    assert {e.expected, e.got} == {(2, 3), (4, 5)}
    assert e.request_id > 0 and f"op add(#{a.handle}, #{b.handle}) -> #{c.handle}" in str(e)
    assert_usable(session)


def test_matmul_inner_dimension_mismatch(session):
    a, b = ones(session, 2, 3), ones(session, 4, 5)
    _c = a @ b
    with pytest.raises(tensordd.ShapeMismatchError) as info:
        session.sync()
    assert "op matmul" in str(info.value) and info.value.got == (4, 5)


def test_download_of_a_failed_output_reports_the_typed_first_error(session):
    a, b = ones(session, 2, 3), ones(session, 4, 5)
    with pytest.raises(tensordd.ShapeMismatchError) as info:
        (a @ b).numpy()
    # the root cause with its typed detail, not just POISONED
    assert info.value.got == (4, 5) and "op matmul" in str(info.value)


def test_device_mismatch(session):
    a, b = ones(session, 2, device="cpu:0"), ones(session, 2, device="cpu:1")
    _c = a + b
    with pytest.raises(tensordd.DeviceMismatchError) as info:
        session.sync()
    e = info.value
    assert (e.target, e.grad) == ("cpu:0", "cpu:1")
    assert isinstance(e.target, tensordd.Device) and (e.target_index, e.grad_index) == (0, 1)
    assert "op add" in str(e)
    assert_usable(session)


def test_backend_mismatch(session):
    a, b = ones(session, 2, 2, device="cpu:0"), ones(session, 2, 2, device="ref:0")
    _c = a @ b
    with pytest.raises(tensordd.BackendMismatchError) as info:
        session.sync()
    e = info.value
    assert (e.target, e.grad) == ("cpu:0", "ref:0") and "op matmul" in str(e)
    assert_usable(session)


def test_unsupported_op(session):
    a = ones(session, 2)
    session.op("frobnicate", a)
    with pytest.raises(tensordd.UnsupportedOpError) as info:
        session.sync()
    assert "frobnicate" in str(info.value) and f"op frobnicate(#{a.handle})" in str(info.value)
    assert_usable(session)


def test_invalid_argument_arity(session):
    a = ones(session, 2)
    session.op("relu", a, a, a)
    with pytest.raises(tensordd.InvalidArgumentError):
        session.sync()
    assert_usable(session)


def test_unsupported_dtype(session):
    a = session.tensor(np.ones((2, 2), bool))
    _c = a @ a
    with pytest.raises(tensordd.UnsupportedDTypeError) as info:
        session.sync()
    assert info.value.code == "UNSUPPORTED_DTYPE"
    assert_usable(session)


def test_resource_exhausted_output_too_large(session):
    col = session.tensor(np.ones((1 << 20, 1), np.float32))
    row = session.tensor(np.ones((1, 1 << 20), np.float32))
    _outer = col @ row  # 2**40 elements
    with pytest.raises(tensordd.ResourceExhaustedError):
        session.sync()
    assert_usable(session)


def test_device_unavailable(session):
    _t = session.tensor(np.ones(2, np.float32), device="cpu:7")
    with pytest.raises(tensordd.DeviceUnavailableError) as info:
        session.sync()
    assert "upload" in str(info.value) and "cpu:7" in str(info.value)
    assert_usable(session)


def test_handle_in_use(session):
    a = ones(session, 2)
    session._handles = itertools.count(a.handle)  # make the client reuse an id
    b = ones(session, 2)
    assert b.handle == a.handle
    with pytest.raises(tensordd.HandleInUseError):
        session.sync()
    b._session = None  # b does not own the id: keep a's handle alive
    np.testing.assert_array_equal(a.numpy(), [1, 1])


def test_released_id_is_never_rebound(session):
    a = ones(session, 2)
    old = a.handle
    del a
    gc.collect()
    session.sync()  # the release has reached the daemon
    session._handles = itertools.count(old)  # make the client reuse the released id
    b = ones(session, 2)
    assert b.handle == old
    with pytest.raises(tensordd.HandleInUseError) as info:
        session.sync()
    assert "never reused" in str(info.value)
    b._session = None  # b never owned the id
    # Using the released id says it was released, not that it never existed.
    ghost = tensordd.Tensor(session, old)
    with pytest.raises(tensordd.UnknownHandleError) as info:
        ghost.numpy()
    assert info.value.handle == old and "released" in str(info.value)
    ghost._session = None
    session._handles = itertools.count(max(old, 10**6) + 1)
    assert_usable(session)


def test_scattered_ids_are_bounded(start_daemon):
    d = start_daemon("--max-id-runs", "8")
    with tensordd.connect(d.endpoint, timeout=60) as s:
        s._handles = itertools.count(1000, 2)  # every id starts a run of its own
        kept = [ones(s, 1) for _ in range(8)]
        s.sync()
        _ninth = ones(s, 1)
        with pytest.raises(tensordd.ResourceExhaustedError) as info:
            s.sync()
        assert info.value.resource == "handle id runs"
        _ninth._session = None
        # Ids that extend an existing run still work.
        s._handles = itertools.count(kept[-1].handle + 1)
        assert_usable(s)


def test_zero_size_tensor_with_a_huge_extent_is_refused(session):
    # No element, but an extent past the element limit: strides over such shapes overflow
    # int64 once dims are large enough (found by `make fuzz`).
    empty = np.empty((0, 1 << 30, 1 << 30), np.float32)
    _t = session.tensor(empty)
    with pytest.raises(tensordd.InvalidArgumentError) as info:
        session.sync()
    assert info.value.argument == "shape"
    # A zero-size tensor of modest extent is fine.
    z = session.tensor(np.empty((0, 3), np.float32))
    assert (z + z).numpy().shape == (0, 3)
    assert_usable(session)


def test_poisoned_propagates_with_origin(session):
    a, b = ones(session, 2, 3), ones(session, 4, 5)
    bad = a + b  # fails: SHAPE_MISMATCH
    worse = bad.relu()  # consumes a poisoned handle
    # The next synchronising call reports the root cause, typed...
    with pytest.raises(tensordd.ShapeMismatchError):
        worse.numpy()
    # ...and once it has been told, the poisoned output says where it came from.
    with pytest.raises(tensordd.PoisonedError) as info:
        worse.numpy()
    e = info.value
    assert e.origin_code == "SHAPE_MISMATCH" and e.handle in (bad.handle, worse.handle)
    assert e.origin_request > 0 and e.origin_request < e.request_id
    assert session._describe(e.origin_request).startswith(f"op add(#{a.handle}, #{b.handle})")
    session.sync()
    assert_usable(session)


# ---------------------------------------------------------------- protocol level

def raw_connection(endpoint):
    host, port = endpoint[len("tcp://"):].rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=10)


def read_response(sock):
    def exact(n):
        buf = b""
        while len(buf) < n:
            chunk = sock.recv(n - len(buf))
            if not chunk:
                raise EOFError(f"closed after {len(buf)} of {n} bytes")
            buf += chunk
        return buf

    magic, msg_len, payload_len = struct.unpack("<IIQ", exact(16))
    assert magic == 0x01444454
    resp = pb.Response.FromString(exact(msg_len))
    exact(payload_len)
    return resp


def assert_closed_by_daemon(sock):
    sock.settimeout(10)
    try:
        assert sock.recv(1) == b""
    except ConnectionResetError:
        pass


def test_protocol_error_on_bad_magic(daemon):
    with raw_connection(daemon.endpoint) as sock:
        sock.sendall(b"HTTP/1.1 GET /\r\n\r\n")
        resp = read_response(sock)
        assert resp.WhichOneof("body") == "error"
        exc = tensordd.errors.error_from_proto(resp.error)
        assert isinstance(exc, tensordd.ProtocolError)
        assert_closed_by_daemon(sock)


def test_protocol_error_when_hello_is_not_first(daemon):
    with raw_connection(daemon.endpoint) as sock:
        req = pb.Request(id=1)
        req.sync.SetInParent()
        data = req.SerializeToString()
        sock.sendall(struct.pack("<IIQ", 0x01444454, len(data), 0) + data)
        resp = read_response(sock)
        assert isinstance(tensordd.errors.error_from_proto(resp.error),
                          (tensordd.ProtocolError, tensordd.UnauthenticatedError))


def test_frame_too_large(daemon):
    with raw_connection(daemon.endpoint) as sock:
        sock.sendall(struct.pack("<IIQ", 0x01444454, 1 << 30, 0))  # 1 GiB protobuf
        resp = read_response(sock)
        exc = tensordd.errors.error_from_proto(resp.error)
        assert isinstance(exc, tensordd.FrameTooLargeError)
        assert_closed_by_daemon(sock)


def test_version_mismatch(daemon, monkeypatch):
    monkeypatch.setattr(tensordd.session, "MIN_VERSION", 7)
    monkeypatch.setattr(tensordd.session, "MAX_VERSION", 9)
    with pytest.raises(tensordd.VersionMismatchError) as info:
        tensordd.connect(daemon.endpoint, timeout=10)
    e = info.value
    assert e.server_min <= 1 <= e.server_max


def test_unauthenticated(start_daemon, tmp_path):
    token = tmp_path / "token"
    token.write_text("correct horse\n")
    token.chmod(0o600)
    d = start_daemon("--token-file", str(token))
    with pytest.raises(tensordd.UnauthenticatedError):
        tensordd.connect(d.endpoint, token="wrong", timeout=10)
    with pytest.raises(tensordd.UnauthenticatedError):
        tensordd.connect(d.endpoint, timeout=10)  # no token at all
    with pytest.raises(tensordd.UnauthenticatedError):
        tensordd.connect(d.endpoint, token="correct horse and more", timeout=10)
    with tensordd.connect(d.endpoint, token="correct horse", timeout=10) as s:
        assert_usable(s)


def test_non_loopback_listener_requires_a_token():
    r = subprocess.run([TDD_BIN, "--listen", "tcp://0.0.0.0:0", "--log-level", "error"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode != 0 and "token-file" in r.stderr


# ---------------------------------------------------------------- autodiff errors

def test_not_tracked(session):
    require_autodiff(session)
    w = session.tensor(np.ones(3, np.float32), requires_grad=True)
    plain = ones(session, 3)
    grads = (w * w).sum().backward()
    with pytest.raises(tensordd.NotTrackedError):
        grads.replace(plain, ones(session, 3))


def test_wrong_handle_kind(session):
    require_autodiff(session)
    w = session.tensor(np.ones(3, np.float32), requires_grad=True)
    (w * w).sum().backward()
    fake_grads = tensordd.Gradients(session, w.handle)  # a tensor passed as Gradients
    fake_grads._released = True  # it does not own w's handle
    with pytest.raises(tensordd.WrongHandleKindError) as info:
        fake_grads.get(w)
    assert info.value.handle == w.handle
    assert (info.value.expected, info.value.got) == ("HANDLE_GRADIENTS", "HANDLE_TENSOR")


def test_dtype_mismatch(session):
    require_autodiff(session)
    w = session.tensor(np.ones(3, np.float32), requires_grad=True)
    grads = (w * w).sum().backward()
    with pytest.raises(tensordd.DTypeMismatchError) as info:
        grads.replace(w, session.tensor(np.ones(3, np.float64)))
    assert (info.value.target, info.value.grad) == ("float32", "float64")


@pytest.mark.parametrize("numel", [300_000, 32 << 20])  # 1.2 MiB, 128 MiB
def test_frame_too_large_through_the_client(start_daemon, numel):
    d = start_daemon("--max-payload", "1M")
    s = tensordd.connect(d.endpoint, timeout=30)
    with pytest.raises(tensordd.FrameTooLargeError):
        # the daemon refuses on the header, answers once and closes: the client
        # raises its answer from the broken write (large payloads) or from the
        # next synchronising call
        s.tensor(np.ones(numel, np.float32))
        s.sync()
    assert s.closed
    with pytest.raises(tensordd.ConnectionClosedError):
        s.sync()
