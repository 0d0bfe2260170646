"""_session_io -- a session's side of its connection (_wire.Connection).

Fire-and-forget requests are queued (_send, _write, _send_frame); a synchronising one is
written, flushed and answered by exactly one Response (_roundtrip, _reply), whose Error
is raised typed and named after the call it answers (_raise_error). A broken connection
raises the daemon's last word if it left one (_fail_io); a fatal error, an interrupt
mid-frame or a lost connection shut the session (_shutdown). Session inherits this.
"""

from __future__ import annotations

import socket

from google.protobuf.message import DecodeError

from . import tensordd_pb2 as pb
from ._requestlog import _RELEASE_BATCH, RequestLog, _as_call, _Call
from ._wire import ZERO_COPY_THRESHOLD, FrameError
from .errors import Error, error_from_proto, local_error

# The requests the daemon answers with the session's pending error, if any
# (synchronising: dispatch.c's REQ_SYNC rows, docs/protocol.md section 3).
_SYNC_BODIES = frozenset({"download", "sync", "backward", "grad", "grad_remove", "grad_replace",
                          "optimizer_step", "goodbye", "optimizer_state",
                          "optimizer_load_state", "graph_end", "transfer_send"})

# Codes after which the daemon closes the connection.
_FATAL = {"PROTOCOL_ERROR", "FRAME_TOO_LARGE", "VERSION_MISMATCH", "UNAUTHENTICATED"}


class SessionIO(RequestLog):
    """Sending requests and reading their answers (a mixin of Session: the attributes,
    _conn first, are set by Session.__init__)."""

    def _shutdown(self, why: str | None = None) -> None:
        if why and self._open:
            self._closed_why = why
        self._open = False
        self._pending_release.clear()
        self._conn.close()

    def _check_open(self) -> None:
        if not self._open:
            raise local_error("CLOSED", self._closed_why)

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
