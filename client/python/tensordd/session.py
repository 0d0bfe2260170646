"""session -- connect() and Session: one connection, one daemon session.

Requests come in two kinds (docs/protocol.md, section 3):

* fire-and-forget (ops, uploads, releases, ToDevice, SetGradMode,
  OptimizerCreate): sent with ``want_reply=false``, buffered, answered by
  nothing. A failure poisons the outputs and is reported later;
* synchronising (Hello, Sync, Download, Describe, ListDevices, Stats,
  Backward, Grad*, OptimizerStep, Goodbye): the write buffer is flushed and
  exactly one Response with the same id comes back. Its Error, if any, may
  name an earlier request: the session's first asynchronous failure.

The client allocates every handle id and request id (from 1, never reused),
so ops return their output Tensor at once, before the daemon has run them.
The session remembers a short description of recent requests to say, in an
error, which call failed ("op matmul(#3, #4)").
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import socket
import sys

import numpy as np
from google.protobuf.message import DecodeError

from . import tensordd_pb2 as pb
from ._codec import append_op as _append_op
from ._codec import download as _download_c
from ._codec import op as _op_c
from ._codec import encode_op as _encode_op  # noqa: F401 (tests hold it to protobuf's)
from ._codec import frame_download as _frame_download
from ._codec import frame_op as _frame_op
from ._codec import frame_release as _frame_release
from ._codec import frame_upload as _frame_upload
from ._codec import parse_tensor_reply as _parse_tensor_reply
from ._codec import set_download_types as _set_download_types
from ._wire_keys import K_UPLOAD_DEVICE
from ._codec import set_numpy_types as _set_numpy_types
from ._codec import set_op_types as _set_op_types
from ._wire import WRITE_HIGH_WATER, ZERO_COPY_THRESHOLD, Connection, FrameError, _byte_view
from .device import Device
from .dtypes import bf16_bits_to_f32, dtype_name, f32_to_bf16_bits, to_numpy, to_wire
from .errors import Error, InvalidArgumentError, error_from_proto, local_error
from .tensor import _UNSET as _GRAD_UNSET
from .tensor import Tensor

__all__ = ["connect", "Session", "PROTOCOL_VERSION", "default_session", "set_default_session",
           "DEFAULT_ENDPOINT"]

PROTOCOL_VERSION = 1
MIN_VERSION = PROTOCOL_VERSION
MAX_VERSION = PROTOCOL_VERSION
CLIENT_NAME = "tensordd-python"
DEFAULT_DEVICE = "cpu:0"
DEFAULT_ENDPOINT = "tcp://127.0.0.1:7070"

# The session module-level calls (tensordd.tensor, tensordd.nn.Linear, ...) use.
_default = None


def default_session() -> "Session":
    """The default session: the one last opened by :func:`connect` (or entered with
    ``with``, or set by :func:`set_default_session`), if it is still open.

    Module-level calls (``tensordd.zeros``, ``tensordd.no_grad``, ``tensordd.nn``
    layers) run on it. Raises ConnectionClosedError when there is none.
    """
    if _default is None or not _default._open:
        raise local_error("CLOSED", "no open default session: call tensordd.connect() first "
                                    "(or tensordd.set_default_session(s))")
    return _default


def set_default_session(session: "Session | None") -> None:
    """Makes session the default one (None: no default)."""
    global _default
    if session is not None and not isinstance(session, Session):
        raise TypeError(f"expected a Session, got {type(session).__name__}")
    _default = session


def _read_token_file(path: str) -> str:
    """The token on the first line of path (as tensordd --token-file reads it)."""
    try:
        with open(path, encoding="utf-8") as f:
            line = f.readline()
    except OSError as e:
        raise local_error("UNAUTHENTICATED", f"cannot read token file {path}: {e}") from e
    token = line.rstrip("\r\n")
    if not token:
        raise local_error("UNAUTHENTICATED", f"token file {path}: no token on its first line")
    return token

# Released handles wait for a synchronising request, a large upload or this
# many of them, then go out as one Release.
_RELEASE_BATCH = 256
# How many request descriptions the session keeps for error messages.
_CALL_MEMORY = 1 << 16
_CALL_TRIM = 2 * _CALL_MEMORY
# The requests the daemon answers with the session's pending error, if any
# (synchronising: dispatch.c's REQ_SYNC rows, docs/protocol.md section 3).
_SYNC_BODIES = frozenset({"download", "sync", "backward", "grad", "grad_remove", "grad_replace",
                          "optimizer_step", "goodbye", "optimizer_state",
                          "optimizer_load_state", "graph_end", "transfer_send"})
# Codes after which the daemon closes the connection.
_FATAL = {"PROTOCOL_ERROR", "FRAME_TOO_LARGE", "VERSION_MISMATCH", "UNAUTHENTICATED"}


def connect(endpoint: str | None = None, token: str | None = None, timeout: float | None = None,
            *, token_file: str | None = None, ca_file: str | None = None,
            cert: str | None = None, key: str | None = None, verify: bool = True,
            resume: float | None = None, memfd: bool = True,
            memfd_threshold: int = 1 << 20) -> "Session":
    """Opens a session with the daemon at endpoint; it becomes the default session.

    Args:
        endpoint: ``"tcp://host:port"`` or ``"unix:///path/to/socket"``;
            None: ``$TENSORDD_ENDPOINT``, else ``tcp://127.0.0.1:7070`` (as tdctl).
        token: the daemon's auth token, if it requires one. None: read from
            token_file, else from the file ``$TENSORDD_TOKEN_FILE`` names (its
            first line), else no token.
        token_file: a file holding the token on its first line.
        ca_file, cert, key, verify (``tls://`` endpoints only): the CA
            certificates (PEM) that signed the daemon's certificate (default: the
            system's); this client's certificate and key (PEM) when the daemon asks
            for one (mutual TLS); verify=False skips checking the daemon's
            certificate (testing only).
        timeout: seconds for connecting and for each blocking call
            (None: wait forever). A call that times out raises
            :class:`tensordd.TimedOutError` and leaves the session unusable.
        resume: seconds the daemon should hold the session after the connection
            drops (capped by its --max-resume-window; None or 0: off, the session ends
            with its connection). With it, a call that finds the connection lost
            reconnects (a few tries, with backoff, within the window), resumes the
            session and sends again what the daemon had not applied; only when that
            fails does it raise :class:`tensordd.ConnectionLostError`. A resumable
            session left without close() (the process exits) is held by the daemon
            for the window before it is freed.
        memfd, memfd_threshold: on a ``unix://`` endpoint (the daemon's host), tensors
            of memfd_threshold bytes or more are uploaded, and downloaded when the
            client knows their size (uploads, tensors downloaded or described before),
            as sealed memfds passed over the socket (SCM_RIGHTS) instead of through
            it: the daemon maps an upload as the tensor's storage, and a download
            comes back as a mapping, not a copy through the socket. memfd=False turns it off; a
            daemon that refuses (``--max-conn-fds 0``) turns it off for the session,
            which then sends through the socket. Off with resume (a resumable
            session's answers are kept to be sent again; a file descriptor cannot be).

    Raises:
        VersionMismatchError, UnauthenticatedError: the daemon refused the Hello
            (UnauthenticatedError also: a TLS certificate was refused either way).
        ProtocolError: a TLS handshake with a plaintext listener, or the reverse.
        ConnectionClosedError / IOFailureError: the daemon could not be reached.
    """
    global _default
    if endpoint is None:
        endpoint = os.environ.get("TENSORDD_ENDPOINT") or DEFAULT_ENDPOINT
    if token is None:
        token_file = token_file or os.environ.get("TENSORDD_TOKEN_FILE") or None
        if token_file:
            token = _read_token_file(token_file)
    try:
        conn = Connection(endpoint, timeout, ca_file=ca_file, cert=cert, key=key, verify=verify)
    except socket.timeout:
        raise local_error("TIMEOUT", f"connecting to {endpoint} timed out") from None
    except OSError as e:
        raise local_error("IO", f"cannot connect to {endpoint}: {e}") from e
    session = Session(conn, endpoint, token, resume=resume)
    session._memfd = (bool(memfd) and conn.unix and not resume and hasattr(os, "memfd_create")
                      and "memfd" in session.features)
    session.memfd_threshold = int(memfd_threshold)
    _default = session
    return session


class _Call:
    """A description of a request for error messages, formatted only when needed:
    ``what(#in, ...) -> #out, ... suffix``."""

    __slots__ = ("what", "handles", "outputs", "suffix")

    def __init__(self, what: str, handles=(), suffix: str = "", outputs=()):
        self.what = what
        self.handles = handles
        self.outputs = outputs
        self.suffix = suffix

    def __str__(self) -> str:
        text = f"{self.what}({_fmt_handles(self.handles)})" if self.handles else self.what
        if self.outputs:
            text += f" -> {_fmt_handles(self.outputs)}"
        return f"{text} {self.suffix}" if self.suffix else text


def _as_call(call) -> _Call:
    """A _Call from a request description: the hot paths keep a plain tuple
    (what, handles, outputs) and leave the formatting to an error, if any."""
    if isinstance(call, _Call):
        return call
    if len(call) == 2:  # (what, handles)
        return _Call(call[0], call[1])
    if len(call) == 5:  # an upload of the fast path
        _, handle, name, shape, dev = call
        return _Call(f"upload #{handle}", suffix=f"{name}{tuple(shape)} on {dev}")
    name, inputs, out = call  # an op of the fast path
    return _Call("op " + name, tuple(inputs), outputs=(out,))


# Devices named by replies: immutable, so one object per (backend, ordinal) is shared.
_DEVICES: dict = {}


def _device(backend: str, ordinal: int) -> Device:
    """The Device a reply names (as Device._from_proto reads it: "?" for no backend)."""
    dev = _DEVICES.get((backend, ordinal))
    if dev is None:
        dev = _DEVICES[(backend, ordinal)] = Device._from_proto(
            pb.Device(backend=backend, ordinal=ordinal))
    return dev


# Upload's fast path (Session.tensor of a small numpy array): numpy dtype -> (wire DType,
# its name), filled for the native dtypes tensordd takes as they are met; device
# spelling -> (Device, the encoded Upload.device field).
_UPLOAD_DTYPES: dict = {}
_UPLOAD_DEVICES: dict = {}


def _upload_device(device):
    """(Device, Upload.device encoded with its tag) for a device spelling (cached)."""
    try:
        return _UPLOAD_DEVICES[device]
    except (KeyError, TypeError):  # (TypeError: an unhashable spelling)
        pass
    dev = Device.parse(device)
    msg = pb.Device()
    dev._to_proto(msg)
    raw = msg.SerializeToString()
    out = (dev, K_UPLOAD_DEVICE + bytes((len(raw),)) + raw) if len(raw) < 0x80 else (dev, None)
    if isinstance(device, (str, Device)):
        if len(_UPLOAD_DEVICES) >= 256:  # (many spellings: bounded, like _ATTR_BYTES)
            _UPLOAD_DEVICES.clear()
        _UPLOAD_DEVICES[device] = out
    return out


def _upload_dtype(dt: np.dtype):
    """(wire, name) of a numpy dtype that is sent as it is, or None."""
    got = _UPLOAD_DTYPES.get(dt)
    if got is None:
        try:
            wire = to_wire(dt)
        except TypeError:
            return None
        if not dt.isnative or wire == pb.DTYPE_BF16:
            return None
        got = _UPLOAD_DTYPES[dt] = (wire, dtype_name(wire))
    return got


# Op attributes encoded once (Op.attrs entries, tag and length included), keyed by
# (name, type, value): 1, True and 1.0 encode differently and compare equal, hence the
# type; a zero float also by its sign. Bounded: emptied when full.
_ATTR_BYTES: dict = {}
_ATTR_BYTES_MAX = 4096


def _attr_bytes(attrs: dict):
    """attrs (not None values) as the end of an Op message, or None when one of them
    is of a kind left to protobuf (lists, numpy scalars, NaN, ...)."""
    parts = []
    for name, value in attrs.items():
        t = type(value)
        if value is None:
            continue
        if t is int or t is bool or t is str:
            key = (name, t, value)
        elif t is float:
            if value != value:
                return None
            key = (name, t, value, math.copysign(1.0, value)) if value == 0.0 else (name, t, value)
        elif t is tuple and all(type(v) is int for v in value):
            key = (name, t, value)
        else:
            return None
        enc = _ATTR_BYTES.get(key)
        if enc is None:
            op = pb.Op()
            _set_attr(op.attrs.add(), name, value)
            if len(_ATTR_BYTES) >= _ATTR_BYTES_MAX:
                _ATTR_BYTES.clear()
            enc = _ATTR_BYTES[key] = op.SerializeToString()
        parts.append(enc)
    return b"".join(parts)


# Ops whose output is 0-d without a dim (reductions) or with a reduction other than
# "none" (losses): the client sets the shape, so that backward() can check its loss
# without a round trip (autograd._check_loss).
_SCALAR_OUT = frozenset({"sum", "mean", "cross_entropy", "nll_loss", "mse_loss",
                         "binary_cross_entropy_with_logits"})


def _scalar_out(name: str, attrs: dict) -> bool:
    if name in ("sum", "mean"):
        return attrs.get("dim") is None
    return attrs.get("reduction", "mean") != "none"


def _fmt_handles(handles) -> str:
    if len(handles) > 8:
        return f"#{handles[0]}, ... {len(handles)} handles"
    return ", ".join(f"#{h}" for h in handles)


class Session:
    """A session with tensordd. Use :func:`connect` to open one.

    A context manager: leaving the ``with`` block closes the session, which
    releases everything it holds in the daemon.
    """

    def __init__(self, conn: Connection, endpoint: str, token: str | None,
                 resume: float | None = None):
        self._conn = conn
        # Same-host zero copy (connect's memfd): on, the threshold, and whether the daemon
        # has taken a memfd upload yet (the first one waits for its answer: a refusal
        # turns memfd off and the tensor goes through the socket).
        self._memfd = False
        self.memfd_threshold = 1 << 20
        self._memfd_checked = False
        self._token = token or ""
        self._resume_token = b""
        self.endpoint = endpoint
        #: where other daemons reach this one (a push to it, tensordd.multi): the endpoint
        #: unless set (a client behind a proxy or NAT sees the daemon at another address)
        self.peer_endpoint = endpoint
        self._multi = None  # the tensordd.multi.MultiSession this session is part of
        self._op_outputs = None  # op name -> (num_outputs, outputs_with), from ListOps
        self._ids = itertools.count(1)
        self._handles = itertools.count(1)
        self._calls: dict[int, _Call] = {}
        self._pending_release: list[int] = []
        self._capturing = False  # a graph is being recorded (graph.py): releases wait
        self._open = True
        self._grad_enabled = True
        self._closed_why = "the session is closed"
        # Gradients of the backward() calls since the last zero_grad (the torch idiom).
        self._grad_sets: list = []
        self._grad_epoch = 0  # bumped by backward() and zero_grad(): p.grad caches expire
        self._grad_overrides: dict = {}  # handle -> Tensor whose .grad was assigned
        # Whether backward() keeps its Gradients for .grad/step() (the torch
        # idiom). Off until the session is used that way (an Optimizer,
        # tensordd.nn, zero_grad, .grad, requires_grad_, tensordd.tensor(...,
        # requires_grad=True)), so the Gradients API releases as it always did.
        self.retain_grads = False
        self._unkept_backward = False  # a backward ran while retain_grads was off
        # backward() and Optimizer.step() go out pipelined (Backward.pipelined): no
        # round trip each; their errors surface at the next synchronising call (a
        # download, sync(), .grad), first error first. False: each waits for its answer.
        self.pipeline_steps = True
        # Asynchronous failures that repr() read while downloading (the daemon hands
        # a pending error to the first synchronising request, once): kept here and
        # raised by the next synchronising calls instead, as if repr had not run.
        self._deferred: list = []
        self._busy = False  # inside a round trip (a debugger's repr must not start one)
        hello = self._new_request()
        h = hello.hello
        h.min_version = MIN_VERSION
        h.max_version = MAX_VERSION
        h.token = token or ""
        h.client_name = CLIENT_NAME
        if resume:
            h.resume_window = max(1, int(resume))
        try:
            resp, _ = self._roundtrip(hello, _Call("hello"))
        except BaseException:
            self._shutdown()
            raise
        if resp.WhichOneof("body") != "hello":
            self._shutdown()
            raise local_error("PROTOCOL_ERROR", f"expected a HelloReply, got {resp.WhichOneof('body')}")
        self.version = resp.hello.version
        #: what the daemon does beyond protocol version 1 (HelloReply.features)
        self.features = frozenset(resp.hello.features)
        # A daemon that predates them would answer pipelined steps (and wait for a
        # memfd upload's bytes): use them only where the daemon names them.
        self.pipeline_steps = "pipelined_steps" in self.features
        self.server = resp.hello.server
        self.session_id = resp.hello.session_id
        self.note = resp.hello.note
        #: the seconds the daemon holds this session after a lost connection (0: none)
        self.resume_window = resp.hello.resume_window
        if resp.hello.resume_window and resp.hello.resume_token:
            self._resume_token = resp.hello.resume_token
            conn.enable_resume(resp.hello.resume_window, self._resume_hello, self._shutdown)

    def _resume_hello(self, conn: Connection, last_received: int) -> int:
        """Resumes this session on conn's fresh socket (_wire.Connection._recover): a Hello
        with the resume token; returns the id of the last request the daemon applied."""
        req = pb.Request()
        req.id = next(self._ids)
        h = req.hello
        h.min_version = MIN_VERSION
        h.max_version = MAX_VERSION
        h.token = self._token
        h.client_name = CLIENT_NAME
        h.resume_window = self.resume_window
        h.resume_token = self._resume_token
        h.last_received = last_received
        conn.write(req.SerializeToString())
        conn.flush()
        raw, _ = conn.read_frame_head()
        try:
            resp = pb.Response.FromString(raw)
        except DecodeError as e:
            raise local_error("PROTOCOL_ERROR", f"undecodable resume answer: {e}") from e
        if resp.WhichOneof("body") == "error":
            raise error_from_proto(resp.error, "resume")
        if resp.WhichOneof("body") != "hello" or not resp.hello.resumed:
            raise local_error("CONNECTION_LOST", "the daemon did not resume the session")
        return resp.hello.last_applied

    # ================================================================ lifecycle

    def __enter__(self) -> "Session":
        set_default_session(self)
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(raise_errors=exc_type is None)

    def __del__(self):
        # No Goodbye round trip from a finaliser: closing the socket is enough
        # for the daemon to free the session.
        if getattr(self, "_open", False):
            self._shutdown()

    @property
    def closed(self) -> bool:
        """Whether the session is closed (by close(), the daemon, or a broken connection)."""
        return not self._open

    def close(self, raise_errors: bool = True) -> None:
        """Says Goodbye and closes the connection; the daemon frees the session.

        If the daemon answers the Goodbye with an error (an asynchronous
        failure still pending), it is raised unless raise_errors is False;
        the session is closed either way. Closing twice is harmless.
        """
        if not self._open:
            return
        self._pending_release.clear()  # the daemon frees everything anyway
        req = self._new_request()
        req.goodbye.SetInParent()
        try:
            self._roundtrip(req, _Call("goodbye"))
        except Error:
            if raise_errors:
                raise
        finally:
            self._shutdown()

    def _shutdown(self, why: str | None = None) -> None:
        if why and self._open:
            self._closed_why = why
        self._open = False
        self._pending_release.clear()
        self._conn.close()

    def __repr__(self) -> str:
        state = f"session {self.session_id}" if self._open else "closed"
        return f"<tensordd.Session {self.endpoint} {state}>"

    # ================================================================ plumbing

    def _new_request(self) -> "pb.Request":
        """An empty Request; its id is given when it is queued (ids follow wire order)."""
        return pb.Request()

    def _new_handle(self) -> int:
        return next(self._handles)

    def _next_request_id(self) -> int:
        """The id the next request will get (none is used up)."""
        nxt = next(self._ids)
        self._ids = itertools.count(nxt)  # ids are consecutive: put it back
        return nxt

    def _reserve_handles(self, n: int) -> int:
        """The first of n consecutive fresh handle ids (a request that binds a range)."""
        first = next(self._handles)
        self._handles = itertools.count(first + max(n, 1))
        return first

    def _release_later(self, handle: int) -> None:
        """Queues a handle for the next Release batch (called from __del__)."""
        if self._open:
            self._pending_release.append(handle)

    def _emit_releases(self) -> None:
        if not self._pending_release or self._capturing:
            return
        handles, self._pending_release = self._pending_release, []
        rid = next(self._ids)
        self._calls[rid] = ("release", handles)
        self._conn.write_frame(_frame_release(rid, handles), rid)

    def _check_open(self) -> None:
        if not self._open:
            raise local_error("CLOSED", self._closed_why)

    def _describe(self, request_id: int) -> str | None:
        call = self._calls.get(request_id)
        return str(_as_call(call)) if call is not None else None

    def _send(self, req: "pb.Request", call: _Call, payload=None) -> None:
        """Queues a fire-and-forget request.

        Releases due are queued first when this request will put bytes on
        the wire anyway (a large payload) or enough of them have piled up.
        """
        self._check_open()
        if len(self._pending_release) >= _RELEASE_BATCH or (
                payload is not None and payload.nbytes >= ZERO_COPY_THRESHOLD):
            self._emit_releases()
        req.id = next(self._ids)
        self._write(req.id, req.SerializeToString(), call, payload)

    def _write(self, rid: int, msg: bytes, call: _Call, payload=None) -> None:
        """Queues request rid, encoded as msg."""
        self._calls[rid] = call
        try:
            self._conn.write(msg, payload, rid)
        except (OSError, FrameError) as e:
            self._fail_io(e, call)
        except BaseException:  # interrupted mid-frame: the stream is unusable
            self._shutdown(f"the session was interrupted while sending {call}")
            raise

    def _send_frame(self, rid: int, frame: bytes, call) -> None:
        """Queues request rid, a whole frame encoded by hand (_codec), described by call."""
        if not self._open:
            raise local_error("CLOSED", self._closed_why)
        if len(self._pending_release) >= _RELEASE_BATCH:
            self._emit_releases()
        self._calls[rid] = call
        try:
            self._conn.write_frame(frame, rid)
        except (OSError, FrameError) as e:
            self._fail_io(e, _as_call(call))
        except BaseException:  # interrupted mid-frame: the stream is unusable
            self._shutdown(f"the session was interrupted while sending {_as_call(call)}")
            raise

    def _op_fast(self, name: str, inputs: list, extra: bytes = b"") -> "Tensor":
        """op() for the common case (tensor inputs, one output, no attributes or
        attributes already encoded as extra), its Request encoded by hand: what
        SerializeToString would give, at a fraction of the cost per op
        (tests/python/transport/test_wire_fastpath.py and test_speedups.py hold the two equal).
        The call's description is kept as a tuple, formatted only when an error
        names it. With the accelerator, all of it in one call in the common case."""
        if _op_c is not None:
            t = _op_c(self, name, inputs, extra)
            if t is not None:
                return t
        if not self._open:
            raise local_error("CLOSED", self._closed_why)
        if len(self._pending_release) >= _RELEASE_BATCH:
            self._emit_releases()
        out = next(self._handles)
        rid = next(self._ids)
        self._calls[rid] = call = (name, inputs, out)
        conn = self._conn
        try:
            if conn._journal is None:  # (resume on: the frame goes to the journal too)
                if (_append_op(conn._wbuf, rid, name, inputs, out, extra) if extra else
                        _append_op(conn._wbuf, rid, name, inputs, out)) >= WRITE_HIGH_WATER:
                    conn.flush()
            else:
                conn.write_frame(_frame_op(rid, name, inputs, out, extra), rid)
        except (OSError, FrameError) as e:
            self._fail_io(e, _as_call(call))
        except BaseException:  # interrupted mid-frame: the stream is unusable
            self._shutdown(f"the session was interrupted while sending {_as_call(call)}")
            raise
        return Tensor(self, out)

    def _roundtrip(self, req: "pb.Request", call: _Call) -> tuple["pb.Response", int]:
        """Sends a synchronising request and reads its Response.

        Returns (response, payload length); the payload is left in the stream
        for the caller (only Download has one). Raises the typed Error the
        response carries, naming the call that failed.
        """
        self._check_open()
        if self._deferred and req.WhichOneof("body") in _SYNC_BODIES:
            raise self._deferred.pop(0)  # the daemon would have answered this request with it
        self._emit_releases()
        req.id = next(self._ids)
        self._calls[req.id] = call
        self._busy = True
        try:
            try:
                self._conn.write(req.SerializeToString(), None, req.id)
                self._conn.flush()
            except (OSError, FrameError) as e:
                self._fail_io(e, call)
            try:
                raw, payload_len = self._conn.read_frame_head()
            except (OSError, FrameError) as e:
                self._fail_io(e, call)
        except Error:
            raise
        except BaseException:
            # KeyboardInterrupt & co. between request and reply: the reply
            # would answer the next call; refuse further calls instead.
            self._shutdown(f"the session was interrupted during {call}")
            raise
        finally:
            self._busy = False
        return self._reply(raw, req.id, payload_len, call)

    def _reply(self, raw, rid: int, payload_len: int, call) -> tuple["pb.Response", int]:
        """The Response raw answering request rid (checked; an error raised)."""
        try:
            resp = pb.Response.FromString(raw)
        except DecodeError as e:
            self._shutdown()
            raise local_error("PROTOCOL_ERROR", f"undecodable response: {e}", str(call)) from e
        # An error may come with another id (0: the daemon's last word before
        # closing); anything else must answer this request.
        body = resp.WhichOneof("body")
        if resp.id == 0 and body != "error":
            # The daemon's goodbye when it shuts down (SIGTERM): Response{id 0, ok}.
            self._shutdown("the daemon closed the session (it is shutting down)")
            raise local_error("CLOSED", "the daemon closed the session (it is shutting down)",
                              str(call))
        if resp.id != rid and body != "error":
            self._shutdown()
            raise local_error("PROTOCOL_ERROR",
                              f"got a reply to request #{resp.id} while waiting for #{rid}",
                              str(call))
        if body == "error":
            if payload_len:
                try:
                    self._conn.skip(payload_len)
                except (OSError, FrameError) as e:
                    self._fail_io(e, call)
            self._raise_error(resp.error)
        self._forget_calls()
        return resp, payload_len

    def _raise_error(self, err: "pb.Error"):
        exc = error_from_proto(err, self._describe(err.request_id))
        call = self._calls.get(err.request_id)
        # A transfer's target refused the source (its token, say): this session goes on.
        pushed = isinstance(call, _Call) and call.what == "transfer_send"
        if exc.code in _FATAL and not pushed:
            self._shutdown(f"the daemon closed the session after {exc}")
        raise exc

    def _forget_calls(self) -> None:
        """Keeps the call memory bounded: at least the last _CALL_MEMORY requests, at
        most twice that (ids are ascending, so are the keys). The oldest go all at once,
        the dict rebuilt: deleting them one by one from its front left holes that every
        later pass walked over again (tens of microseconds per round trip)."""
        calls = self._calls
        if len(calls) >= _CALL_TRIM:
            self._calls = dict(itertools.islice(calls.items(), len(calls) - _CALL_MEMORY,
                                                None))

    def _fail_io(self, exc: BaseException, call: _Call):
        """The connection broke: raise the daemon's last word if it left one."""
        if isinstance(exc, socket.timeout):
            self._shutdown()
            raise local_error("TIMEOUT", "the daemon did not answer in time", str(call)) from exc
        final = self._salvage_final_error() if isinstance(exc, OSError) and self._open else None
        self._shutdown(f"connection lost: {exc}")
        if final is not None and final.code == pb.OK:
            final = None
        if final is not None:
            raise error_from_proto(final, self._describe(final.request_id)) from exc
        if isinstance(exc, FrameError):
            raise local_error("PROTOCOL_ERROR", str(exc), str(call)) from exc
        raise local_error("CLOSED", f"connection lost: {exc}", str(call)) from exc

    def _salvage_final_error(self):
        """After a failed write: the Error the daemon sent before closing, if any."""
        try:
            self._conn.sock.settimeout(0.5)
            for _ in range(64):  # replies still in the stream come first
                raw, n = self._conn.read_frame_head()
                if n:
                    self._conn.skip(n)
                resp = pb.Response.FromString(raw)
                if resp.WhichOneof("body") == "error":
                    return resp.error
                if resp.id == 0:  # the daemon's goodbye (shutting down)
                    return None
        except Exception:
            return None
        return None

    # ================================================================ tensors

    def tensor(self, data, device=DEFAULT_DEVICE, requires_grad: bool | None = None,
               dtype=None) -> "Tensor":
        """Uploads data to a new tensor on device.

        data is a numpy array (its dtype is kept, like ``torch.from_numpy``), a
        torch tensor (dtype kept, bfloat16 included; detached and moved to the
        host first; its ``requires_grad`` is kept unless requires_grad says
        otherwise) or anything numpy.asarray accepts (Python floats then become
        float32 and ints int64, like ``torch.tensor``). dtype is any dtype
        spelling (``"bfloat16"``, ``tensordd.float16``, ``np.int32``,
        ``torch.float64``). The bytes are sent from the array's own buffer;
        the upload is asynchronous but has left the process (or been copied)
        when this returns, so the array may be modified afterwards.
        """
        if type(data) is np.ndarray and dtype is None:
            fast = self._upload_fast(data, device, requires_grad)
            if fast is not None:
                return fast
        if isinstance(data, Tensor):
            raise TypeError("data is already a Tensor; use .to(device) or .detach()")
        want = to_wire(dtype) if dtype is not None else None
        dev = Device.parse(device)
        wire = None
        if _is_torch_tensor(data):
            if requires_grad is None:
                requires_grad = bool(data.requires_grad)
            arr, wire = _torch_to_numpy(data)
        elif isinstance(data, (np.ndarray, np.generic)):
            arr = np.asarray(data)
        else:
            arr = np.asarray(data)
            if arr.dtype == np.float64 and want is None:
                arr = arr.astype(np.float32)
        if wire is None:
            wire = to_wire(arr.dtype)
        if want is not None and want != wire:
            if wire == pb.DTYPE_BF16:
                arr = bf16_bits_to_f32(arr)
            if want == pb.DTYPE_BF16:
                arr = f32_to_bf16_bits(arr.astype(np.float32))
            else:
                arr = arr.astype(to_numpy(want))
            wire = want
        if not arr.dtype.isnative:
            arr = arr.astype(arr.dtype.newbyteorder("="))
        if not arr.flags.c_contiguous:
            arr = np.array(arr, order="C")  # (ascontiguousarray would make 0-d 1-d)
        requires_grad = bool(requires_grad)
        req = self._new_request()
        up = req.upload
        up.handle = self._new_handle()
        up.dtype = wire
        up.shape.extend(arr.shape)
        dev._to_proto(up.device)
        up.requires_grad = requires_grad
        call = _Call(f"upload #{up.handle}", suffix=f"{dtype_name(wire)}{tuple(arr.shape)} on {dev}")
        if self._memfd and arr.nbytes >= self.memfd_threshold:
            if self._upload_fd(req, arr, call):
                return Tensor(self, up.handle, shape=tuple(arr.shape), dtype=dtype_name(wire),
                              device=dev, requires_grad=requires_grad)
            up.handle = self._new_handle()  # refused: through the socket, as a new handle
            up.payload_fd = False
            req.want_reply = False
            call = _Call(f"upload #{up.handle}",
                         suffix=f"{dtype_name(wire)}{tuple(arr.shape)} on {dev}")
        self._send(req, call, arr)
        return Tensor(self, up.handle, shape=tuple(arr.shape), dtype=dtype_name(wire),
                      device=dev, requires_grad=requires_grad)

    def _upload_fast(self, arr: np.ndarray, device, requires_grad) -> "Tensor | None":
        """tensor() of a small C-contiguous numpy array of a dtype sent as it is: the
        frame encoded by hand (test_wire_fastpath.py holds it to protobuf's) and the
        bytes copied into the write buffer; None when the general path must run."""
        wd = _upload_dtype(arr.dtype)
        nbytes = arr.nbytes
        conn = self._conn
        if (wd is None or nbytes >= ZERO_COPY_THRESHOLD or not arr.flags.c_contiguous
                or not self._open or conn._journal is not None
                or (self._memfd and nbytes >= self.memfd_threshold)):
            return None
        dev, dev_bytes = _upload_device(device)
        if dev_bytes is None:
            return None
        if len(self._pending_release) >= _RELEASE_BATCH:
            self._emit_releases()
        rg = bool(requires_grad)
        handle = next(self._handles)
        rid = next(self._ids)
        shape = arr.shape
        self._calls[rid] = ("upload", handle, wd[1], shape, dev)
        try:
            wbuf = conn._wbuf
            wbuf += _frame_upload(rid, handle, wd[0], shape, dev_bytes, rg, nbytes)
            if nbytes:
                wbuf += _byte_view(arr)
            if len(wbuf) >= WRITE_HIGH_WATER:
                conn.flush()
        except (OSError, FrameError) as e:
            self._fail_io(e, _as_call(self._calls[rid]))
        except BaseException:  # interrupted mid-frame: the stream is unusable
            self._shutdown(f"the session was interrupted while sending "
                           f"{_as_call(self._calls[rid])}")
            raise
        return Tensor(self, handle, shape=shape, dtype=wd[1], device=dev, requires_grad=rg)

    def _upload_fd(self, req: "pb.Request", arr: np.ndarray, call: _Call) -> bool:
        """Sends Upload req with arr's bytes in a new sealed memfd. The first one of the
        session waits for its answer: False when the daemon refused the fd (memfd is then
        off for the session, and the refused handle released)."""
        fd = _memfd_of(arr)
        up = req.upload
        up.payload_fd = True
        probe = not self._memfd_checked
        self._check_open()
        self._emit_releases()
        req.id = next(self._ids)
        req.want_reply = probe
        self._calls[req.id] = call
        try:
            try:
                self._conn.send_with_fd(req.SerializeToString(), fd, req.id)
            finally:
                os.close(fd)
            if probe:
                raw, plen = self._conn.read_frame_head()
        except (OSError, FrameError) as e:
            self._fail_io(e, call)
        if not probe:
            return True
        try:
            self._reply(raw, req.id, plen, call)
        except InvalidArgumentError as e:
            if e.argument != "payload_fd":
                raise
            self._memfd = False
            self._release_later(up.handle)  # the placeholder the refusal bound
            return False
        self._memfd_checked = True
        return True

    def _download_fd(self, t: "Tensor"):
        """t's values through a memfd the daemon sends (Download.as_fd), mapped
        copy-on-write; None when the daemon refuses to pass fds (memfd is then off)."""
        conn = self._conn
        req = self._new_request()
        req.download.handle = t._handle
        req.download.as_fd = True
        req.download.fd_min_bytes = self.memfd_threshold  # (small ones: through the socket)
        call = _Call(f"download #{t._handle}")
        conn.want_fds += 1
        try:
            resp, payload_len = self._roundtrip(req, call)
        except InvalidArgumentError as e:
            if e.argument != "as_fd":
                raise
            self._memfd = False
            return None
        finally:
            conn.want_fds -= 1
        if resp.WhichOneof("body") != "tensor":
            self._skip_payload(payload_len, call)
            raise local_error("PROTOCOL_ERROR",
                              f"download answered with {resp.WhichOneof('body')}", str(call))
        info = resp.tensor
        shape = tuple(info.shape)
        t._shape = shape
        t._dtype = dtype_name(info.dtype)
        t._device = _device(info.device.backend, info.device.ordinal)
        t._requires_grad = bool(info.requires_grad)
        np_dtype = to_numpy(info.dtype)
        if not info.payload_fd:  # (a device tensor, a strided view: the bytes follow)
            arr = np.empty(shape, dtype=np_dtype)
            if arr.nbytes != payload_len:
                self._skip_payload(payload_len, call)
                raise local_error("PROTOCOL_ERROR", f"payload of {payload_len} bytes for "
                                  f"{arr.nbytes}", str(call))
            try:
                conn.read_into(arr)
            except (OSError, FrameError) as e:
                self._fail_io(e, call)
            return arr
        fd = conn.take_fd()
        if fd < 0:
            self._shutdown("a download's memfd did not come")
            raise local_error("PROTOCOL_ERROR", "the answer said payload_fd but no file "
                              "descriptor came with it", str(call))
        try:
            return _map_memfd(fd, info.fd_offset, shape, np_dtype)
        except (OSError, ValueError) as e:
            raise local_error("IO", f"mapping the download's memfd: {e}", str(call)) from e
        finally:
            os.close(fd)

    def op(self, name: str, *tensors: "Tensor", num_outputs: int | None = None, **kwargs):
        """Runs the op `name` (PyTorch's names) on tensors, asynchronously.

        Keyword arguments become op attributes (int, float, bool, str, lists
        of ints or floats; None is left out), except ``dtype`` (creation ops
        and casts), ``device`` (where creation ops run), ``requires_grad``
        (creation ops) and ``num_outputs`` (ops with several results).
        Returns the output Tensor, or a tuple of Tensors for an op with several
        outputs (``topk``, ``sort``, ``max`` with ``dim``...): how many comes from the
        daemon's op table (ListOps, asked once per session, at the first op called
        without ``num_outputs``). ``split`` and ``chunk`` make one output per piece,
        which only their inputs tell: pass ``num_outputs`` for them.
        """
        if num_outputs is None:
            # (a closed session asks nothing: _op raises the call's own error, or CLOSED)
            num_outputs = self._num_outputs(name, kwargs) if self._open else 1
        return self._op(name, *tensors, num_outputs=num_outputs, **kwargs)

    def _num_outputs(self, name: str, attrs: dict) -> int:
        table = self._op_outputs
        if table is None:
            self._list_ops()
            table = self._op_outputs
        n, with_attr = table.get(name, (1, ""))
        if n == 0:
            raise ValueError(f"op {name}: makes one output per piece, which depends on its "
                             f"inputs: pass num_outputs")
        return n + 1 if with_attr and attrs.get(with_attr) else n

    def _op(self, name: str, *tensors: "Tensor", num_outputs: int = 1, dtype=None,
            device=None, requires_grad: bool = False, **attrs):
        """op() with num_outputs given (1 by default): the client's own calls."""
        try:
            inputs = [t._handle for t in tensors if t._session is self]
        except AttributeError:
            inputs = ()
        if (len(inputs) == len(tensors) and inputs and num_outputs == 1
                and dtype is None and device is None and not requires_grad):
            if not attrs:
                out = self._op_fast(name, inputs)
                if name in _SCALAR_OUT:
                    out._shape = ()
                return out
            extra = _attr_bytes(attrs)
            if extra is not None:
                out = self._op_fast(name, inputs, extra)
                if name in _SCALAR_OUT and _scalar_out(name, attrs):
                    out._shape = ()
                return out
        inputs = tuple(inputs)
        if len(inputs) != len(tensors):
            for t in tensors:
                if not isinstance(t, Tensor):
                    raise TypeError(f"op {name}: inputs must be Tensors, got {type(t).__name__}")
            if self._multi is not None:  # daemons of one client: as between devices
                self._multi._mismatch(name, tensors)
            raise ValueError(f"op {name}: an input belongs to another session")
        req = pb.Request()
        o = req.op
        o.op = name
        o.inputs.extend(inputs)
        if num_outputs == 1:
            outputs = (next(self._handles),)
        else:
            outputs = tuple(next(self._handles) for _ in range(num_outputs))
        o.outputs.extend(outputs)
        if attrs:
            for key, value in attrs.items():
                if value is not None:
                    _set_attr(o.attrs.add(), key, value)
        dev = None
        if device is not None or not tensors:
            dev = Device.parse(DEFAULT_DEVICE if device is None else device)
            dev._to_proto(o.device)
        if dtype is not None:
            o.dtype = to_wire(dtype)
        if requires_grad:
            o.requires_grad = True
        # The inputs are alive (referenced by `tensors`) while the op is queued,
        # so a Release of theirs can only come after it.
        self._send(req, _Call("op " + name, inputs, outputs=outputs))
        out = tuple(Tensor(self, h, device=dev) for h in outputs)
        if num_outputs == 1 and name in _SCALAR_OUT and tensors and _scalar_out(name, attrs):
            out[0]._shape = ()
        return out[0] if num_outputs == 1 else out

    # ---- creation ops

    def _create(self, name, shape, device, dtype, requires_grad, **attrs) -> "Tensor":
        return self._op(name, shape=_shape_arg(shape), device=device or DEFAULT_DEVICE,
                       dtype=dtype, requires_grad=requires_grad, **attrs)

    def zeros(self, *shape, device=None, dtype=None, requires_grad=False) -> "Tensor":
        """A tensor of zeros: ``zeros(2, 3)`` or ``zeros((2, 3))``."""
        return self._create("zeros", shape, device, dtype, requires_grad)

    def ones(self, *shape, device=None, dtype=None, requires_grad=False) -> "Tensor":
        """A tensor of ones."""
        return self._create("ones", shape, device, dtype, requires_grad)

    def full(self, shape, fill_value, device=None, dtype=None, requires_grad=False) -> "Tensor":
        """A tensor filled with fill_value; as in PyTorch, an int value gives
        int64, a bool bool and a float float32 unless dtype says otherwise."""
        return self._create("full", (shape,), device, dtype, requires_grad,
                            value=_number(fill_value, "fill_value"))

    def randn(self, *shape, device=None, dtype=None, requires_grad=False) -> "Tensor":
        """Standard normal samples (the daemon's per-session random stream)."""
        return self._create("randn", shape, device, dtype, requires_grad)

    def rand(self, *shape, device=None, dtype=None, requires_grad=False) -> "Tensor":
        """Uniform samples in [0, 1)."""
        return self._create("rand", shape, device, dtype, requires_grad)

    def arange(self, start, end=None, step=1, device=None, dtype=None,
               requires_grad=False) -> "Tensor":
        """Values from start to end (exclusive) by step; ``arange(n)`` is 0..n-1.

        All-int arguments give int64, any float gives float32 (PyTorch's rule).
        """
        if end is None:
            start, end = 0, start
        return self._op("arange", start=_number(start, "start"), end=_number(end, "end"),
                       step=_number(step, "step"), device=device or DEFAULT_DEVICE,
                       dtype=dtype, requires_grad=requires_grad)

    def cat(self, tensors, dim: int = 0) -> "Tensor":
        """Concatenation along an existing dim (``torch.cat``)."""
        return self._op("cat", *tensors, dim=int(dim))

    def stack(self, tensors, dim: int = 0) -> "Tensor":
        """Stacking along a new dim (``torch.stack``)."""
        return self._op("stack", *tensors, dim=int(dim))

    # ================================================================ session calls

    def sync(self) -> None:
        """Waits until every earlier request has run; raises the first error since the last sync."""
        req = self._new_request()
        req.sync.SetInParent()
        self._roundtrip(req, _Call("sync"))

    def capture(self, *inputs: "Tensor") -> "Graph":
        """``with s.capture(x, y) as g:`` records the block's requests as a graph that
        ``g.replay(x2, y2)`` runs again in one message (see :mod:`tensordd.graph`)."""
        from .graph import Graph

        return Graph(self, inputs)

    def flush(self) -> None:
        """Sends buffered requests now, without waiting for anything."""
        self._check_open()
        self._emit_releases()
        try:
            self._conn.flush()
        except OSError as e:
            self._fail_io(e, _Call("flush"))

    def devices(self) -> list:
        """The daemon's devices, as a list of :class:`Device`."""
        return [Device._from_proto(info.device) for info in self._list_devices()]

    def device_info(self) -> list:
        """The daemon's devices with names and memory: a list of dicts. "failed" is True
        for a device a fault took out of service (a sticky CUDA error), "status" says why."""
        return [{"device": Device._from_proto(i.device), "name": i.name,
                 "memory_total": i.memory_total, "memory_used": i.memory_used,
                 "failed": i.failed, "status": i.status}
                for i in self._list_devices()]

    def _list_devices(self):
        req = self._new_request()
        req.list_devices.SetInParent()
        resp, _ = self._roundtrip(req, _Call("list_devices"))
        return resp.devices.devices

    def _list_ops(self):
        req = self._new_request()
        req.list_ops.SetInParent()
        resp, _ = self._roundtrip(req, _Call("list_ops"))
        self._op_outputs = {o.name: (o.num_outputs, o.outputs_with) for o in resp.ops.ops}
        return resp.ops

    def list_ops(self) -> dict:
        """The daemon's op table (ListOps), by op name: {"kind", "inputs", "min_inputs",
        "max_inputs", "num_outputs", "outputs_with", "attrs": {name: {"type", "required",
        "default", "bounds"}}}: what a client needs to call an op without a list of its own
        (num_outputs 0: one output per piece, as split and chunk make)."""
        return {o.name: {"kind": o.kind, "inputs": o.inputs, "min_inputs": o.min_inputs,
                         "max_inputs": o.max_inputs, "num_outputs": o.num_outputs,
                         "outputs_with": o.outputs_with,
                         "attrs": {a.name: {"type": a.type, "required": a.required,
                                            "default": a.default_value, "bounds": a.bounds}
                                   for a in o.attrs}}
                for o in self._list_ops().ops}

    def stats(self) -> dict:
        """The daemon's counters (StatsReply) as a dict.

        Keys: sessions, handles, bytes_received, bytes_sent, requests,
        tensors_alive, uptime_ms (ints); errors ({code name: count});
        memory ({"cpu:0": {"bytes_in_use", "peak_bytes"}}); session_list
        (a list of dicts with session_id, peer, client_name, handles,
        bytes_in_use, requests).
        """
        req = self._new_request()
        req.stats.SetInParent()
        resp, _ = self._roundtrip(req, _Call("stats"))
        s = resp.stats
        return {
            "sessions": s.sessions,
            "handles": s.handles,
            "bytes_received": s.bytes_received,
            "bytes_sent": s.bytes_sent,
            "requests": s.requests,
            "tensors_alive": s.tensors_alive,
            "uptime_ms": s.uptime_ms,
            "errors": {_code_name(e.code): e.count for e in s.errors},
            "memory": {str(Device._from_proto(m.device)): {"bytes_in_use": m.bytes_in_use,
                                                          "peak_bytes": m.peak_bytes}
                       for m in s.memory},
            "session_list": [{"session_id": x.session_id, "peer": x.peer,
                              "client_name": x.client_name, "handles": x.handles,
                              "bytes_in_use": x.bytes_in_use, "requests": x.requests,
                              "memory_limit": x.memory_limit}
                             for x in s.session_list],
        }

    # ---- grad mode

    @property
    def grad_enabled(self) -> bool:
        """Whether ops on tracked tensors are recorded for backward."""
        return self._grad_enabled

    def set_grad_enabled(self, enabled: bool) -> "_GradMode":
        """Turns graph recording on or off for the session (SetGradMode), at once; as
        torch's, the result also works as a context manager that restores the previous
        mode on leaving: ``with s.set_grad_enabled(False): ...``."""
        mode = _GradMode(self, self._grad_enabled)
        self._set_grad_mode(enabled)
        return mode

    def _set_grad_mode(self, enabled) -> None:
        enabled = bool(enabled)
        if enabled == self._grad_enabled:
            return
        req = self._new_request()
        req.set_grad_mode.enabled = enabled
        self._send(req, _Call(f"set_grad_mode(enabled={enabled})"))
        self._grad_enabled = enabled

    @contextlib.contextmanager
    def no_grad(self):
        """A ``with`` block in which ops record no autodiff graph (like torch.no_grad)."""
        previous = self._grad_enabled
        self._set_grad_mode(False)
        try:
            yield
        finally:
            if self._open:
                self._set_grad_mode(previous)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Forgets the gradients of every backward() so far: every ``.grad`` of
        this session reads None again (the Gradients handles are released).
        What ``optimizer.zero_grad()`` calls; set_to_none is accepted for
        torch's signature (the gradients are always dropped, never zero-filled)."""
        self.retain_grads = True
        self._unkept_backward = False
        for g in self._grad_sets:
            g.release()
        self._grad_sets = []
        self._grad_overrides = {}
        self._grad_epoch += 1

    # ---- used by Tensor and friends

    def _download(self, t: "Tensor", raw: bool = False) -> np.ndarray:
        """t's values; bfloat16 widened to float32 unless raw (then uint16 bits).

        The round trip of _roundtrip, with the Download encoded by hand and, with the
        accelerator, its plain answer decoded without a protobuf message."""
        if not self._open:
            raise local_error("CLOSED", self._closed_why)
        if self._deferred:
            raise self._deferred.pop(0)  # the daemon would have answered this request with it
        # (a size the client does not know: the socket, whose small answers are cheaper)
        if self._memfd and t._shape is not None and _nbytes_of(t) >= self.memfd_threshold:
            arr = self._download_fd(t)
            if arr is not None:
                if t._dtype == "bfloat16" and not raw:
                    arr = bf16_bits_to_f32(arr)
                return arr
        h = t._handle
        rel = self._pending_release
        if rel and not self._capturing:  # (_emit_releases: they go out with it)
            self._pending_release = []
            rrid = next(self._ids)
            self._calls[rrid] = ("release", rel)
        else:
            rrid = 0
        rid = next(self._ids)
        call = self._calls[rid] = ("download", (h,))
        conn = self._conn
        self._busy = True
        try:
            try:
                # the accelerator's round trip on a plain socket (None: not one)
                got = _download_c(conn, rid, h, rrid, rel) if _download_c is not None else None
                if got is None:
                    if rrid:
                        conn.write_frame(_frame_release(rrid, rel), rrid)
                    conn.send_frame(_frame_download(rid, h), rid)
                    got = True
            except BlockingIOError:  # (the kernel's timeout, as _wire says it)
                self._fail_io(socket.timeout("timed out"), _as_call(call))
            except (OSError, FrameError) as e:
                self._fail_io(e, _as_call(call))
        except Error:
            raise
        except BaseException:
            self._shutdown(f"the session was interrupted during {_as_call(call)}")
            raise
        finally:
            self._busy = False
        if got is True:  # (else the answer, its payload read into an array)
            return self._download_answer(t, rid, raw)
        arr, wire, shape, backend, ordinal, rgrad = got
        t._shape = shape
        t._dtype = _DTYPE_NAMES.get(wire) or dtype_name(wire)
        t._device = _DEVICES.get((backend, ordinal)) or _device(backend, ordinal)
        t._requires_grad = rgrad
        if len(self._calls) >= _CALL_TRIM:
            self._forget_calls()
        if wire == _BF16 and not raw:
            arr = bf16_bits_to_f32(arr)
        return arr

    def _download_failed(self, exc: BaseException, h: int):
        """What _download raises when its round trip fails with exc (the accelerator's
        Tensor.numpy path): a typed error, the session closed where it would be."""
        call = _Call("download", (h,))
        self._busy = False
        if isinstance(exc, BlockingIOError):  # (the kernel's timeout, as _wire says it)
            self._fail_io(socket.timeout("timed out"), call)
        if isinstance(exc, (OSError, FrameError)):
            self._fail_io(exc, call)
        if not isinstance(exc, Error):
            self._shutdown(f"the session was interrupted during {call}")
        raise exc

    def _download_answer(self, t: "Tensor", rid: int, raw: bool = False) -> np.ndarray:
        """The rest of _download once Download rid is sent: its answer read and checked."""
        call = self._calls.get(rid) or ("download", (t._handle,))
        conn = self._conn
        self._busy = True
        try:
            try:
                raw_msg, payload_len = conn.read_frame_head()
            except (OSError, FrameError) as e:
                self._fail_io(e, _as_call(call))
        except Error:
            raise
        except BaseException:
            self._shutdown(f"the session was interrupted during {_as_call(call)}")
            raise
        finally:
            self._busy = False
        plain = _parse_tensor_reply(raw_msg) if _parse_tensor_reply is not None else None
        if plain is not None and plain[0] == rid:
            _, _, wire, shape, backend, ordinal, rgrad = plain
            if len(self._calls) >= _CALL_TRIM:
                self._forget_calls()
        else:  # protobuf's decoding, and every check of _roundtrip
            call = _as_call(call)
            resp, payload_len = self._reply(raw_msg, rid, payload_len, call)
            if resp.WhichOneof("body") != "tensor":
                self._skip_payload(payload_len, call)
                raise local_error("PROTOCOL_ERROR",
                                  f"download answered with {resp.WhichOneof('body')}", str(call))
            info = resp.tensor
            wire, shape = info.dtype, tuple(info.shape)
            backend, ordinal, rgrad = info.device.backend, info.device.ordinal, info.requires_grad
        try:
            t._shape = shape
            t._dtype = _DTYPE_NAMES.get(wire) or dtype_name(wire)
            t._device = _DEVICES.get((backend, ordinal)) or _device(backend, ordinal)
            t._requires_grad = bool(rgrad)
            np_dtype = _NP_DTYPES.get(wire)
            if np_dtype is None:
                np_dtype = _NP_DTYPES[wire] = to_numpy(wire)
            arr = np.empty(shape, dtype=np_dtype)
            bad = arr.nbytes != payload_len
        except Exception as e:  # never leave the payload in the stream
            call = _as_call(call)
            self._skip_payload(payload_len, call)
            self._shutdown(f"undecodable download: {e}")
            raise local_error("PROTOCOL_ERROR", f"undecodable download: {e}", str(call)) from e
        if bad:
            call = _as_call(call)
            self._skip_payload(payload_len, call)
            raise local_error("PROTOCOL_ERROR",
                              f"payload of {payload_len} bytes for a {dtype_name(wire)}"
                              f"{shape} tensor ({arr.nbytes} bytes)", str(call))
        self._busy = True  # the payload is still in the stream
        try:
            conn.read_into(arr)
        except (OSError, FrameError) as e:
            self._fail_io(e, _as_call(call))
        except BaseException:
            self._shutdown(f"the session was interrupted during {_as_call(call)}")
            raise
        finally:
            self._busy = False
        if wire == _BF16 and not raw:  # widen the bit patterns to float32
            arr = bf16_bits_to_f32(arr)
        return arr

    def _skip_payload(self, n: int, call) -> None:
        try:
            self._conn.skip(n)
        except (OSError, FrameError) as e:
            self._fail_io(e, call)

    def _describe_tensor(self, t: "Tensor") -> None:
        req = self._new_request()
        req.describe.handle = t._handle
        resp, _ = self._roundtrip(req, _Call("describe", (t._handle,)))
        if resp.WhichOneof("body") == "tensor":
            t._set_info(resp.tensor)

    def _to_device(self, t: "Tensor", device: Device) -> "Tensor":
        req = self._new_request()
        td = req.to_device
        td.input = t._handle
        td.output = self._new_handle()
        device._to_proto(td.device)
        self._send(req, _Call("to_device", (t._handle,), f"-> {device} as #{td.output}"))
        return Tensor(self, td.output, shape=t._shape, dtype=t._dtype, device=device)


    def _transfer(self, t: "Tensor", target: "Session", device=None) -> "Tensor":
        """t (on this session's daemon) copied to target's daemon, daemon to daemon: the
        target issues a one-time capability (TransferAccept), this daemon pushes the bytes
        to target.peer_endpoint with target's token (TransferSend, synchronising). Lands
        in target's device (cpu:0 by default; a device that is not host memory gets it
        through the target's cpu:0)."""
        dev = Device.parse(device if device is not None else "cpu:0")
        src = t if t.device.backend in _HOST_BACKENDS else t.to("cpu:0")
        land = dev if dev.backend in _HOST_BACKENDS else Device("cpu", 0)
        req = target._new_request()
        ta = req.transfer_accept
        ta.handle = target._new_handle()
        ta.dtype = to_wire(src.dtype)
        ta.shape.extend(src.shape)
        land._to_proto(ta.device)
        resp, _ = target._roundtrip(req, _Call("transfer_accept", (), f"#{ta.handle} on {land}"))
        capability = resp.transfer_capability.capability
        req = self._new_request()
        ts = req.transfer_send
        ts.tensor = src._handle
        ts.endpoint = target.peer_endpoint
        ts.token = target._token
        ts.capability = capability
        self._roundtrip(req, _Call("transfer_send", (src._handle,), f"-> {target.peer_endpoint}"))
        out = Tensor(target, ta.handle, shape=tuple(src.shape), dtype=src._dtype, device=land)
        return out if land == dev else out.to(dev)


class _GradMode:
    """What set_grad_enabled returns: the mode is already set; leaving a ``with`` block
    restores the one before (torch.set_grad_enabled's two uses)."""

    __slots__ = ("_session", "_previous")

    def __init__(self, session: "Session", previous: bool):
        self._session = session
        self._previous = previous

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._session._open:
            self._session._set_grad_mode(self._previous)

    def __repr__(self) -> str:
        return f"set_grad_enabled(previous={self._previous})"


_HOST_BACKENDS = frozenset({"cpu", "ref"})  # host-memory devices: a transfer's ends
_BF16 = pb.DTYPE_BF16
_NP_DTYPES: dict = {}  # wire dtype -> the numpy dtype its payload is read into
for _w in pb.DType.values():  # (filled ahead: the accelerator reads this dict, never fills it)
    try:
        _NP_DTYPES[_w] = np.dtype(to_numpy(_w))
    except (TypeError, ValueError, KeyError):
        pass
del _w
_DTYPE_NAMES = {w: dtype_name(w) for w in pb.DType.values() if w}  # wire dtype -> its DType
if _set_download_types is not None:  # (the accelerator reads into _NP_DTYPES' dtypes)
    _set_download_types(socket.socket, np.empty, _NP_DTYPES)
if _set_op_types is not None:
    _set_op_types(Tensor, _RELEASE_BATCH, WRITE_HIGH_WATER, _GRAD_UNSET)
if _set_numpy_types is not None:
    _set_numpy_types(_DTYPE_NAMES, dtype_name, _DEVICES, _device, _CALL_TRIM, _BF16,
                     bf16_bits_to_f32)


def _memfd_of(arr: np.ndarray) -> int:
    """A new memfd holding arr's bytes (C order), sealed against shrinking, growing and
    writing, as the daemon requires of an Upload's payload_fd."""
    import fcntl
    fd = os.memfd_create("tensordd-upload", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        view = memoryview(arr.reshape(-1).view(np.uint8))
        n = view.nbytes
        off = 0
        while off < n:
            off += os.write(fd, view[off:])
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS,
                    fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _map_memfd(fd: int, offset: int, shape, np_dtype) -> np.ndarray:
    """The array in memfd fd from byte offset on, mapped copy-on-write (writes to it stay
    in this process)."""
    import mmap
    itemsize = np.dtype(np_dtype).itemsize
    count = 1
    for d in shape:
        count *= int(d)
    n = count * itemsize
    if n == 0:
        return np.empty(shape, dtype=np_dtype)
    if offset + n > os.fstat(fd).st_size:
        raise ValueError(f"the memfd holds {os.fstat(fd).st_size} bytes, not {offset + n}")
    start = offset - offset % mmap.ALLOCATIONGRANULARITY
    mm = mmap.mmap(fd, offset - start + n, flags=mmap.MAP_PRIVATE,
                   prot=mmap.PROT_READ | mmap.PROT_WRITE, offset=start)
    return np.frombuffer(mm, dtype=np_dtype, count=count, offset=offset - start).reshape(shape)


def _nbytes_of(t: "Tensor") -> int:
    """t's size in bytes from what the client knows (its shape and dtype)."""
    n = 1
    for d in t._shape:
        n *= int(d)
    try:
        return n * np.dtype(to_numpy(to_wire(t._dtype))).itemsize
    except (TypeError, ValueError, KeyError):
        return n * 8


def _is_torch_tensor(x) -> bool:
    """Whether x is a torch.Tensor (torch is never imported for the check)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def _torch_to_numpy(t):
    """(host numpy array, wire dtype) of a torch tensor: detached, on the host;
    bfloat16 as its uint16 bit patterns."""
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous()
    torch = sys.modules["torch"]
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16), pb.DTYPE_BF16
    arr = t.numpy()
    return arr, to_wire(arr.dtype)


def _code_name(code: int) -> str:
    try:
        return pb.ErrorCode.Name(code)
    except ValueError:
        return f"UNKNOWN({code})"


def _shape_arg(shape) -> list:
    """(2, 3) from zeros(2, 3), zeros((2, 3)) or zeros([2, 3])."""
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = shape[0]
    elif len(shape) == 1 and isinstance(shape[0], np.ndarray):
        shape = shape[0].tolist()
    return [_as_int(d, "shape") for d in shape]


def _number(v, what: str):
    """v as a Python bool, int or float (numpy scalars included)."""
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    if isinstance(v, (int, np.integer)):
        return int(v)
    if isinstance(v, (float, np.floating)):
        return float(v)
    raise TypeError(f"{what}: expected a number, got {v!r}")


def _as_int(v, what: str) -> int:
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        raise TypeError(f"{what}: expected an int, got {v!r}")
    return int(v)


def _set_attr(attr: "pb.Attr", name: str, value) -> None:
    """Fills a protobuf Attr from a Python value (bool before int: bool is an int)."""
    attr.name = name
    if isinstance(value, (bool, np.bool_)):
        attr.b = bool(value)
    elif isinstance(value, (int, np.integer)):
        attr.i = int(value)
    elif isinstance(value, (float, np.floating)):
        attr.f = float(value)
    elif isinstance(value, str):
        attr.s = value
    elif isinstance(value, Device):
        attr.s = str(value)
    elif isinstance(value, (list, tuple, np.ndarray)):
        items = list(value.tolist() if isinstance(value, np.ndarray) else value)
        if any(isinstance(v, (bool, np.bool_)) for v in items):
            raise TypeError(f"attribute {name}: lists of bools are not supported")
        if all(isinstance(v, (int, np.integer)) for v in items):
            attr.ints.v.extend(int(v) for v in items)
            if not items:
                attr.ints.SetInParent()
        elif all(isinstance(v, (int, float, np.integer, np.floating)) for v in items):
            attr.floats.v.extend(float(v) for v in items)
        else:
            raise TypeError(f"attribute {name}: lists must hold only ints or only numbers")
    else:
        raise TypeError(f"attribute {name}: unsupported value {value!r} "
                        f"(int, float, bool, str or a list of ints/floats)")

