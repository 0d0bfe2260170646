"""_wire -- framing and the socket: buffered writes, zero-copy payloads.

Every message is ``header | protobuf | raw payload`` (proto/frame.h): a
16-byte little-endian header holding the magic word ``"TDD\\x01"``, the
protobuf length (u32) and the payload length (u64).

Writes are buffered: fire-and-forget requests accumulate in one bytearray and
go out in a single ``sendall`` before the next synchronising request. Large
payloads are never copied into that buffer: they are handed to ``sendmsg``
next to it as a ``memoryview`` of the caller's array. Reads go through a
small buffer for headers and messages; a payload is received straight into
its destination with ``recv_into``.

``tls://host:port`` endpoints wrap the socket in TLS (the ``ssl`` module; TLS
1.2 or later, the daemon's certificate verified against the system's CAs or
``ca_file``, and for mutual TLS a client certificate). Payloads then stream
through the TLS layer record by record: nothing stages a whole tensor.
"""

from __future__ import annotations

import array
import collections
import os
import socket
import ssl
import struct
import time

from ._codec import copy_into as _copy_into

__all__ = [
    "HEADER",
    "HEADER_SIZE",
    "MAGIC",
    "FrameError",
    "Connection",
    "encode_header",
    "decode_header",
    "parse_endpoint",
]

MAGIC = 0x01444454  # "TDD" + protocol frame version 1, little-endian
HEADER = struct.Struct("<IIQ")
HEADER_SIZE = HEADER.size  # 16
_pack_header = HEADER.pack
_unpack_header_from = HEADER.unpack_from
_TIMEVAL = struct.Struct("@ll")  # struct timeval (SO_RCVTIMEO / SO_SNDTIMEO)

# Limits the client enforces on what it receives, before allocating anything.
MAX_MESSAGE = 64 << 20
# Payloads at least this large are sent from the caller's buffer with sendmsg
# instead of being copied into the write buffer.
ZERO_COPY_THRESHOLD = 64 << 10
# The write buffer is flushed once it grows past this, even between syncs.
WRITE_HIGH_WATER = 1 << 20
_READ_CHUNK = 64 << 10
_MAX_FDS = 8  # file descriptors one read may bring (the daemon sends one per answer)
# Resume: reconnections tried after a connection is lost, and the first wait between two
# (doubled each time, at most a second; all within the session's resume window).
RESUME_TRIES = 8
RESUME_BACKOFF = 0.05


def _response_id(msg) -> int:
    """Response.id (field 1, a varint, first when set) of an encoded Response; 0 if unset."""
    if not msg or msg[0] != 0x08:
        return 0
    n = shift = 0
    for b in msg[1:11]:
        n |= (b & 0x7F) << shift
        if b < 0x80:
            return n
        shift += 7
    return 0


def _transient(exc: BaseException) -> bool:
    """A lost connection (a reset, a close, a broken pipe), not a timeout."""
    return isinstance(exc, OSError) and not isinstance(exc, socket.timeout)


class FrameError(Exception):
    """The peer sent bytes that are not a valid frame (bad magic, sizes)."""


def encode_header(msg_len: int, payload_len: int = 0) -> bytes:
    """The 16 header bytes for a message of msg_len and a payload of payload_len."""
    return HEADER.pack(MAGIC, msg_len, payload_len)


def decode_header(data) -> tuple[int, int]:
    """(msg_len, payload_len) from 16 header bytes; FrameError if they are invalid."""
    magic, msg_len, payload_len = HEADER.unpack(data)
    if magic != MAGIC:
        raise FrameError(f"bad frame magic 0x{magic:08x} (expected 0x{MAGIC:08x})")
    if msg_len > MAX_MESSAGE:
        raise FrameError(f"response message of {msg_len} bytes exceeds {MAX_MESSAGE}")
    return msg_len, payload_len


def parse_endpoint(endpoint: str) -> tuple[int, object]:
    """(address family, address) for "tcp://host:port", "tls://host:port" or "unix:///path"."""
    if endpoint.startswith("unix://"):
        path = endpoint[len("unix://"):]
        if not path:
            raise ValueError(f"endpoint {endpoint!r}: empty socket path")
        return socket.AF_UNIX, path
    if endpoint.startswith(("tcp://", "tls://")):
        rest = endpoint[len("tcp://"):]
        if rest.startswith("["):  # tcp://[::1]:7070
            host, sep, port = rest[1:].partition("]:")
        else:
            host, sep, port = rest.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"endpoint {endpoint!r}: expected {endpoint[:3]}://HOST:PORT")
        return socket.AF_INET, (host, int(port))
    raise ValueError(f"endpoint {endpoint!r}: expected tcp://HOST:PORT, tls://HOST:PORT or "
                     f"unix:///PATH")


# OpenSSL's reasons that mean "the peer refused our certificate" (or its absence).
_TLS_AUTH_REASONS = ("CERTIFICATE_REQUIRED", "BAD_CERTIFICATE", "UNKNOWN_CA",
                     "CERTIFICATE_UNKNOWN", "ACCESS_DENIED", "CERTIFICATE_EXPIRED",
                     "CERTIFICATE_REVOKED", "UNSUPPORTED_CERTIFICATE")


def tls_error(exc: BaseException, endpoint: str):
    """The typed tensordd error for a TLS failure: UNAUTHENTICATED when a certificate
    was refused (the daemon's by us, or ours by the daemon), PROTOCOL_ERROR else."""
    from .errors import local_error  # (import here: errors needs the generated module)

    reason = getattr(exc, "reason", None) or ""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return local_error("UNAUTHENTICATED", f"TLS: the daemon at {endpoint} failed "
                           f"verification: {exc.verify_message or exc}")
    if any(r in reason for r in _TLS_AUTH_REASONS):
        return local_error("UNAUTHENTICATED", f"TLS: the daemon at {endpoint} refused this "
                           f"client's certificate (or its absence): {reason}")
    if isinstance(exc, (ssl.SSLEOFError, ssl.SSLZeroReturnError, ConnectionResetError,
                        EOFError)) or \
            reason in ("WRONG_VERSION_NUMBER", "UNEXPECTED_EOF_WHILE_READING", "RECORD_LAYER_FAILURE"):
        return local_error("PROTOCOL_ERROR", f"TLS handshake with {endpoint} failed ({exc}): "
                           f"is it a TLS listener? A plaintext tcp:// listener closes TLS "
                           f"connections")
    return local_error("PROTOCOL_ERROR", f"TLS with {endpoint} failed: {exc}")


class _TLSSocket:
    """An ssl.SSLSocket with the socket methods Connection uses; a TLS failure
    raises tensordd's typed error (UnauthenticatedError for a refused certificate).
    sendmsg is a sendall per buffer (TLS writes records, not scatter-gather)."""

    def __init__(self, sock: ssl.SSLSocket, endpoint: str):
        self._s = sock
        self._endpoint = endpoint

    def _call(self, f, *args):
        try:
            return f(*args)
        except (ssl.SSLEOFError, ssl.SSLZeroReturnError) as e:
            # after the handshake: the connection was lost (a resumable session resumes)
            raise ConnectionResetError(f"TLS connection to {self._endpoint} lost: {e}") from e
        except ssl.SSLError as e:
            raise tls_error(e, self._endpoint) from e

    def recv(self, n):
        return self._call(self._s.recv, n)

    def recv_into(self, buf, n=0):
        return self._call(self._s.recv_into, buf, n)

    def sendall(self, data):
        return self._call(self._s.sendall, data)

    def sendmsg(self, buffers):
        total = 0
        for b in buffers:
            self._call(self._s.sendall, b)
            total += memoryview(b).nbytes
        return total

    def settimeout(self, t):
        self._s.settimeout(t)

    def close(self):
        self._s.close()


def _tls_context(ca_file, cert, key, verify) -> ssl.SSLContext:
    """The client's TLS context; ValueError naming the file when one cannot be loaded
    (a caller's mistake, not a failure to connect)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    what = f"ca_file {ca_file!r}"
    try:
        if verify:
            if ca_file:
                ctx.load_verify_locations(cafile=ca_file)
            else:
                ctx.load_default_certs()
        else:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        what = f"cert {cert!r} / key {key!r}"
        if cert:
            ctx.load_cert_chain(cert, key)
        elif key:
            raise ValueError("a client key needs its certificate (cert=...)")
    except (OSError, ssl.SSLError) as e:
        raise ValueError(f"TLS: cannot load {what}: {e}") from e
    return ctx


def _kernel_timeout(sock, timeout) -> None:
    """A plain socket's timeout kept by the kernel (SO_RCVTIMEO / SO_SNDTIMEO) on a
    blocking socket: Python's own timeouts poll() before every send and receive, two
    more system calls per round trip. A call that times out then fails with EAGAIN
    (BlockingIOError), which Connection turns into socket.timeout."""
    if timeout is None or timeout <= 0 or not hasattr(socket, "SO_RCVTIMEO"):
        sock.settimeout(timeout)
        return
    sec = int(timeout)
    tv = _TIMEVAL.pack(sec, max(int((timeout - sec) * 1e6), 1 if not sec else 0))
    try:
        sock.settimeout(None)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)
    except OSError:  # (not settable here: Python's timeouts)
        sock.settimeout(timeout)


def _timed_out() -> socket.timeout:
    return socket.timeout("timed out")


def _byte_view(buf) -> memoryview:
    """A flat unsigned-byte view of a C-contiguous buffer (no copy)."""
    mv = memoryview(buf)
    if mv.format == "B" and mv.ndim == 1:
        return mv
    if not mv.c_contiguous:
        raise ValueError("payload buffer must be C-contiguous")
    if mv.nbytes == 0:
        return memoryview(b"")
    return mv.cast("B") if mv.ndim <= 1 else mv.cast("B", (mv.nbytes,))


class Connection:
    """A connected stream socket with a write buffer and a read buffer.

    Not thread-safe: a Session is driven from one thread at a time.
    """

    def __init__(self, endpoint: str, timeout: float | None = None, *, ca_file=None,
                 cert=None, key=None, verify: bool = True):
        family, address = parse_endpoint(endpoint)
        tls = endpoint.startswith("tls://")
        if not tls and (ca_file or cert or key or not verify):
            raise ValueError(f"ca_file, cert, key and verify apply to tls:// endpoints, not "
                             f"{endpoint!r}")
        ctx = _tls_context(ca_file, cert, key, verify) if tls else None
        self._where = (endpoint, timeout, family, address, ctx)
        self.sock = self._connect()
        self._wbuf = bytearray()
        self._rbuf = bytearray()
        self._rpos = 0
        # Resume (enable_resume): the frames sent or queued that the daemon is not known
        # to have applied, as (request id, buffers), payloads by reference when read-only;
        # the id of the last response received whole; the response whose payload is
        # being read and what of it is left.
        self._journal = None
        self._resumer = None
        self._on_lost = None
        self._window = 0.0
        self._recovering = False
        self._last_received = 0
        self._cur_id = 0
        self._payload_left = 0
        self.resumes = 0  # connections resumed so far
        # Same-host zero copy (a unix:// endpoint): while want_fds, reads take the file
        # descriptors the daemon sends (a Download's memfd) into fds, oldest first.
        self.unix = family == socket.AF_UNIX and ctx is None
        self.want_fds = 0
        self.fds: list[int] = []

    def _connect(self):
        endpoint, timeout, family, address, ctx = self._where
        if family == socket.AF_UNIX:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.settimeout(timeout)
                sock.connect(address)
            except BaseException:
                sock.close()
                raise
        else:
            sock = socket.create_connection(address, timeout=timeout)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if ctx is not None:
            try:
                sock = ctx.wrap_socket(sock, server_hostname=address[0])
            except ssl.SSLError as e:
                sock.close()
                raise tls_error(e, endpoint) from e
            except (ConnectionResetError, EOFError) as e:
                sock.close()
                raise tls_error(e, endpoint) from e
            sock.settimeout(timeout)
            sock = _TLSSocket(sock, endpoint)
            sock.settimeout(timeout)
        else:
            _kernel_timeout(sock, timeout)
        return sock

    # ------------------------------------------------------------ resume

    def enable_resume(self, window: float, resumer, on_lost) -> None:
        """Resumes the session on its own when the connection is lost: resumer(conn,
        last_received) says Hello with the resume token on the fresh socket and returns
        the id of the last request the daemon applied (or raises its typed error); the
        frames after it are sent again. on_lost(why) is called before CONNECTION_LOST is
        raised (the window is gone, or RESUME_TRIES reconnections failed)."""
        self._journal = collections.deque()
        self._window = float(window)
        self._resumer = resumer
        self._on_lost = on_lost

    def _journal_add(self, rid: int, head, payload=None) -> None:
        if self._journal is None or self._recovering or not rid:
            return
        if payload is None:
            self._journal.append((rid, (bytes(head),)))
            return
        # the caller may change a writable buffer once the call returns: copy it then
        ro = payload if payload.readonly else bytes(payload)
        self._journal.append((rid, (bytes(head), ro)))

    def _acked(self, rid: int) -> None:
        """A response to request rid: the daemon applied every request up to it."""
        j = self._journal
        while j and j[0][0] <= rid:
            j.popleft()

    def _recover(self, exc: BaseException) -> None:
        """After a lost connection: a new one, the session resumed on it and the frames
        the daemon had not applied sent again; else re-raises exc (resume off, or not a
        lost connection) or raises CONNECTION_LOST."""
        if self._resumer is None or self._recovering or not _transient(exc):
            raise exc
        from .errors import Error, local_error  # (errors needs the generated module)

        self._recovering = True
        deadline = time.monotonic() + self._window
        delay = RESUME_BACKOFF
        why = f"{exc}"
        try:
            for _ in range(RESUME_TRIES):
                try:
                    self.sock.close()
                except OSError:
                    pass
                self._wbuf = bytearray()
                self._rbuf = bytearray()
                self._rpos = 0
                try:
                    self.sock = self._connect()
                    applied = self._resumer(self, self._last_received)
                    self._acked(applied)
                    for _rid, bufs in self._journal:
                        self._send_buffers(bufs)
                    self.resumes += 1
                    return
                except Error as e:  # the daemon refused: no such session, wrong identity
                    self._on_lost(f"resume refused: {e}")
                    raise
                except OSError as e:
                    why = f"{e}"
                if time.monotonic() + delay > deadline:
                    break
                time.sleep(delay)
                delay = min(delay * 2, 1.0)
            self._on_lost(f"connection lost and not resumed: {why}")
            raise local_error("CONNECTION_LOST", f"the connection was lost and could not be "
                              f"resumed within the session's window ({why})") from exc
        finally:
            self._recovering = False

    # ------------------------------------------------------------ writing

    def write(self, msg: bytes, payload=None, rid: int = 0) -> None:
        """Queues one frame (of request rid); a large payload is sent at once from its
        own buffer."""
        if payload is None:
            head = HEADER.pack(MAGIC, len(msg), 0) + msg
            self._journal_add(rid, head)
            self._wbuf += head
        else:
            view = _byte_view(payload)
            head = HEADER.pack(MAGIC, len(msg), view.nbytes) + msg
            self._journal_add(rid, head, view)
            self._wbuf += head
            if view.nbytes >= ZERO_COPY_THRESHOLD:
                try:
                    self._send_buffers([self._wbuf, view])
                    self._wbuf = bytearray()
                except OSError as e:
                    self._recover(e)  # (this frame is in the journal: sent again)
                return
            self._wbuf += view
        if len(self._wbuf) >= WRITE_HIGH_WATER:
            self.flush()

    def write_frame(self, frame, rid: int) -> None:
        """Queues one whole frame (header and message, no payload) of request rid."""
        if self._journal is not None:
            self._journal_add(rid, frame)
        wbuf = self._wbuf
        wbuf += frame
        if len(wbuf) >= WRITE_HIGH_WATER:
            self.flush()

    def send_frame(self, frame, rid: int) -> None:
        """write_frame, then flush: a synchronising request and what was queued before
        it go out in one send."""
        if self._journal is not None:
            self._journal_add(rid, frame)
        self._wbuf += frame
        self.flush()

    def flush(self) -> None:
        """Sends everything queued."""
        if self._wbuf:
            buf, self._wbuf = self._wbuf, bytearray()
            try:
                try:
                    self.sock.sendall(buf)
                except BlockingIOError:
                    raise _timed_out() from None
            except OSError as e:
                self._recover(e)

    @property
    def pending_bytes(self) -> int:
        return len(self._wbuf)

    def _send_buffers(self, buffers) -> None:
        """sendmsg until every byte of every buffer is out (handles short writes)."""
        views = [memoryview(b) for b in buffers if len(b)]
        while views:
            try:
                sent = self.sock.sendmsg(views)
            except BlockingIOError:
                raise _timed_out() from None
            while sent:
                if sent >= views[0].nbytes:
                    sent -= views[0].nbytes
                    views.pop(0)
                else:
                    views[0] = views[0][sent:]
                    sent = 0

    # ------------------------------------------------------------ reading

    def _fill(self, need: int) -> None:
        """Makes at least `need` unread bytes available in the read buffer."""
        avail = len(self._rbuf) - self._rpos
        if avail >= need:
            return
        if self._rpos:
            del self._rbuf[: self._rpos]
            self._rpos = 0
        while len(self._rbuf) < need:
            try:
                if self.want_fds:
                    chunk = self._recv_fds(max(_READ_CHUNK, need - len(self._rbuf)))
                else:
                    chunk = self.sock.recv(max(_READ_CHUNK, need - len(self._rbuf)))
            except BlockingIOError:
                raise _timed_out() from None
            if not chunk:
                raise ConnectionResetError("connection closed by the daemon")
            self._rbuf += chunk

    def _recv_fds(self, n: int) -> bytes:
        """recv that keeps the file descriptors that came with the bytes."""
        data, anc, _flags, _addr = self.sock.recvmsg(n, socket.CMSG_SPACE(4 * _MAX_FDS))
        for level, kind, raw in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                self.fds.extend(array.array("i", raw[: len(raw) - len(raw) % 4]))
        return data

    def send_with_fd(self, msg: bytes, fd: int, rid: int = 0) -> None:
        """Sends what is queued, then one frame (no payload) with fd attached to its first
        byte, in a sendmsg of its own (the daemon gives the fd to the frame that begins in
        the read it came with)."""
        self.flush()
        frame = HEADER.pack(MAGIC, len(msg), 0) + msg
        anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]).tobytes())]
        try:
            sent = self.sock.sendmsg([frame], anc)
            if sent < len(frame):
                self.sock.sendall(frame[sent:])
        except BlockingIOError:
            raise _timed_out() from None

    def take_fd(self) -> int:
        """The oldest fd received, or -1."""
        return self.fds.pop(0) if self.fds else -1

    def read_exact(self, n: int) -> bytes:
        """The next n bytes of the stream."""
        self._fill(n)
        out = bytes(self._rbuf[self._rpos: self._rpos + n])
        self._rpos += n
        return out

    def read_frame_head(self) -> tuple[bytes, int]:
        """Reads one header and its protobuf message: (message bytes, payload length).

        The payload, if any, is left in the stream for read_into/skip.
        """
        if self._journal is None:  # (resume off: nothing to track; parsed in place)
            rbuf = self._rbuf
            pos = self._rpos
            try:
                if len(rbuf) - pos < HEADER_SIZE:
                    self._fill(HEADER_SIZE)
                    pos = self._rpos
                magic, msg_len, payload_len = _unpack_header_from(rbuf, pos)
                if magic != MAGIC or msg_len > MAX_MESSAGE:
                    decode_header(bytes(rbuf[pos:pos + HEADER_SIZE]))  # (raises FrameError)
                end = pos + HEADER_SIZE + msg_len
                if len(rbuf) < end:
                    self._fill(HEADER_SIZE + msg_len)
                    pos = self._rpos
                    end = pos + HEADER_SIZE + msg_len
            except OSError as e:
                self._recover(e)  # (resume off: raises it)
                raise
            self._rpos = end
            return bytes(rbuf[pos + HEADER_SIZE:end]), payload_len
        while True:
            try:
                msg_len, payload_len = decode_header(self.read_exact(HEADER_SIZE))
                msg = self.read_exact(msg_len)
                break
            except OSError as e:
                self._recover(e)
        if self._journal is not None and not self._recovering:
            rid = _response_id(msg)
            if rid:
                self._acked(rid)
                if payload_len:
                    self._cur_id, self._payload_left = rid, payload_len
                else:
                    self._last_received = rid
        return msg, payload_len

    def _payload_done(self, n: int) -> None:
        if self._payload_left:
            self._payload_left -= min(n, self._payload_left)
            if not self._payload_left:
                self._last_received = self._cur_id

    def read_into(self, dest) -> None:
        """Fills dest (a writable C-contiguous buffer) from the stream.

        Bytes already buffered are copied first; the rest lands directly in
        dest with recv_into. On a resumed session a lost connection is resumed and
        the payload read again from the answer the daemon sends again.
        """
        if self._journal is None or self._recovering:
            got, left = _copy_into(dest, self._rbuf, self._rpos)  # (a small payload: all here)
            if left:
                self._read_into(dest)  # (copies the buffered part again, then receives)
            else:
                self._rpos += got
            return
        view = _byte_view(dest)
        start_left = self._payload_left  # of the answer's payload, before this call
        resync = False
        while True:
            try:
                if resync:  # the daemon sends the whole answer again: back to where we were
                    msg, plen = self.read_frame_head()
                    if _response_id(msg) != self._cur_id or plen < start_left:
                        from .errors import local_error

                        raise local_error("CONNECTION_LOST", "resumed, the daemon sent another "
                                          "answer than the one that was cut off")
                    self._skip_raw(plen - start_left)
                    self._payload_left = start_left
                    resync = False
                self._read_into(view)
                self._payload_done(view.nbytes)
                return
            except OSError as e:
                self._recover(e)
                resync = True

    def _skip_raw(self, n: int) -> None:
        scratch = bytearray(min(n, 1 << 20))
        while n:
            k = min(n, len(scratch))
            self._read_into(memoryview(scratch)[:k])
            n -= k

    def _read_into(self, dest) -> None:
        got, left = _copy_into(dest, self._rbuf, self._rpos)  # what is buffered first
        self._rpos += got
        if not left:
            return
        view = _byte_view(dest)
        n = view.nbytes
        while got < n:
            try:
                r = self.sock.recv_into(view[got:], n - got)
            except BlockingIOError:
                raise _timed_out() from None
            if r == 0:
                raise ConnectionResetError("connection closed by the daemon during a payload")
            got += r

    def skip(self, n: int) -> None:
        """Discards the next n bytes of the stream (an unwanted payload)."""
        scratch = bytearray(min(n, 1 << 20))
        while n:
            k = min(n, len(scratch))
            self.read_into(memoryview(scratch)[:k])
            n -= k

    def close(self) -> None:
        try:
            for fd in self.fds:
                os.close(fd)
            self.fds = []
            self.sock.close()
        finally:
            self._wbuf = bytearray()
            self._rbuf = bytearray()
            self._rpos = 0
