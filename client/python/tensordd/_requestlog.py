"""_requestlog -- what a session remembers of its requests.

The client allocates every handle id and request id (from 1, never reused); the
session keeps a short description of each recent request (a _Call, or the tuple a fast
path leaves) so that an error can say which call failed ("op matmul(#3, #4)"), and
queues released handles until they go out as one Release. Session inherits this
(RequestLog, then SessionIO for the connection, then the public facade); the
accelerator (_speedups.c) reads and advances the same attributes (_ids, _handles,
_calls, _pending_release) and calls _forget_calls.
"""

from __future__ import annotations

import itertools

from . import tensordd_pb2 as pb
from ._codec import frame_release as _frame_release

# Released handles wait for a synchronising request, a large upload or this
# many of them, then go out as one Release.
_RELEASE_BATCH = 256

# How many request descriptions the session keeps for error messages.
_CALL_MEMORY = 1 << 16
_CALL_TRIM = 2 * _CALL_MEMORY


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


def _fmt_handles(handles) -> str:
    if len(handles) > 8:
        return f"#{handles[0]}, ... {len(handles)} handles"
    return ", ".join(f"#{h}" for h in handles)


class RequestLog:
    """Request and handle ids, the calls remembered for error messages, and the Release
    batch (a mixin of Session: the attributes are set by Session.__init__)."""

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

    def _describe(self, request_id: int) -> str | None:
        call = self._calls.get(request_id)
        return str(_as_call(call)) if call is not None else None

    def _forget_calls(self) -> None:
        """Keeps the call memory bounded: at least the last _CALL_MEMORY requests, at
        most twice that (ids are ascending, so are the keys). The oldest go all at once,
        the dict rebuilt: deleting them one by one from its front left holes that every
        later pass walked over again (tens of microseconds per round trip)."""
        calls = self._calls
        if len(calls) >= _CALL_TRIM:
            self._calls = dict(itertools.islice(calls.items(), len(calls) - _CALL_MEMORY,
                                                None))
