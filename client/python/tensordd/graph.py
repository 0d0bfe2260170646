"""graph -- a training step recorded once and replayed as one message.

``Session.capture(*inputs)`` records every request the block sends (ops, backward,
grad, optimizer steps, releases: each also runs as usual) into a graph the daemon
keeps; ``graph.replay(*new_inputs)`` runs the same requests again with the new
inputs in place of the recorded ones, in one fire-and-forget message::

    x, y = s.tensor(xb), s.tensor(yb)
    with s.capture(x, y) as step:
        loss = s.op("cross_entropy", model(x), y)
        opt.step(loss.backward())
    for xb, yb in batches:
        step.replay(xb, yb)          # arrays are uploaded, Tensors used as they are
    print(loss.item())               # the latest replay's loss

Tensors made inside the block name the latest replay's values afterwards (like the
static buffers of a CUDA graph). Errors follow the rules of requests sent one by one:
a failed replay poisons what its requests would have, and its first error is raised
by the next synchronising call. Downloads, ``item()`` and ``sync()`` inside the
block run but are not recorded; creating tensors from host data (uploads) or an
optimizer inside it is refused (make them before). While recording, releases of
dropped tensors are held back and sent after the block: a recorded release would
free, on replay, what the client still holds.
"""
from __future__ import annotations

from . import errors as _errors


class Graph:
    """A recorded request sequence (see the module's text)."""

    def __init__(self, session, inputs):
        self._session = session
        self._inputs = list(inputs)  # the recorded input Tensors (kept alive)
        self._handle = None
        self._keep = ()

    def __enter__(self) -> "Graph":
        s = self._session
        s._check_open()
        if s._capturing:
            raise RuntimeError("a graph is being recorded already")
        for t in self._inputs:
            if getattr(t, "_session", None) is not s:
                raise TypeError(f"capture inputs must be Tensors of this session, got {t!r}")
            t.shape  # noqa: B018 -- dtype, shape and device known (replays upload like them)
        s._emit_releases()  # earlier releases are not part of the graph
        req = s._new_request()
        req.graph_begin.inputs.extend(t._handle for t in self._inputs)
        s._send(req, _errors_call("graph_begin"))
        s._capturing = True
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        s = self._session
        s._capturing = False
        if not s._open:
            return
        handle = s._new_handle()
        req = s._new_request()
        req.graph_end.graph = handle
        try:
            s._roundtrip(req, _errors_call("graph_end", outputs=(handle,)))
        except _errors.Error:
            s._release_later(handle)  # bound to a failed placeholder
            if exc_type is None:
                raise
            return
        self._handle = handle

    def __del__(self):
        s = getattr(self, "_session", None)
        if s is not None and self._handle is not None:
            s._release_later(self._handle)

    def replay(self, *inputs) -> None:
        """Runs the graph with inputs in place of the recorded ones (same count, and
        each of the recorded input's dtype, shape and device). Arrays are uploaded
        first (in the same write); nothing is waited for."""
        s = self._session
        if self._handle is None:
            raise RuntimeError("the graph was not recorded (its capture block failed)")
        if len(inputs) != len(self._inputs):
            raise TypeError(f"the graph was recorded with {len(self._inputs)} input(s), "
                            f"{len(inputs)} given")
        tensors = []
        for given, rec in zip(inputs, self._inputs):
            if getattr(given, "_session", None) is s:
                tensors.append(given)
            else:
                t = s.tensor(given, device=rec.device, dtype=rec.dtype)
                if tuple(t.shape) != tuple(rec.shape):
                    raise ValueError(f"replay input of shape {tuple(t.shape)}; the graph's "
                                     f"is {tuple(rec.shape)}")
                tensors.append(t)
        req = s._new_request()
        req.replay.graph = self._handle
        req.replay.inputs.extend(t._handle for t in tensors)
        s._send(req, _errors_call("replay", handles=[t._handle for t in tensors]))
        self._keep = tensors  # their releases go out after the Replay that reads them


def _errors_call(what, handles=(), outputs=()):
    from .session import _Call

    return _Call(what, handles, outputs=outputs)
