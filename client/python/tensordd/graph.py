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
dropped tensors are held back: those of tensors the block made are sent at its end,
recorded (each replay frees again what it made and the client dropped); those of
tensors made before it after it (a recorded one would free, on the next replay, what
is gone already).

``step.add_inputs(*tensors)`` inside the block names more inputs, found while recording:
tensors made before the block that the recorded requests read (GraphEnd's inputs). A
replay then takes the capture's inputs followed by these.
"""
from __future__ import annotations

import itertools

from . import errors as _errors


class Graph:
    """A recorded request sequence (see the module's text)."""

    def __init__(self, session, inputs):
        self._session = session
        self._inputs = list(inputs)  # the recorded input Tensors (kept alive)
        self._handle = None
        self._keep = ()
        self._late = []  # add_inputs(): sent with GraphEnd

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
        first = next(s._handles)  # ids from here on are bound by the graph's requests
        s._handles = itertools.count(first)
        self._first_id = first
        req = s._new_request()
        req.graph_begin.inputs.extend(t._handle for t in self._inputs)
        s._send(req, _errors_call("graph_begin"))
        s._capturing = True
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        s = self._session
        if not s._open:
            s._capturing = False
            return
        handle = s._new_handle()
        req = s._new_request()
        req.graph_end.graph = handle
        req.graph_end.inputs.extend(t._handle for t in self._late)
        # Releases held back: those of ids the block bound go out before GraphEnd, recorded
        # (each replay frees again what it bound and the client dropped); those of tensors
        # made before the block after it (a recorded one would free, on the next replay,
        # what is gone already).
        held = s._pending_release
        s._pending_release = [h for h in held if h >= self._first_id]
        s._capturing = False
        s._emit_releases()
        s._pending_release = [h for h in held if h < self._first_id]
        s._capturing = True
        try:
            s._roundtrip(req, _errors_call("graph_end", [t._handle for t in self._late],
                                           outputs=(handle,)))
        except _errors.Error:
            s._release_later(handle)  # bound to a failed placeholder
            if exc_type is None:
                raise
            return
        finally:
            s._capturing = False
        # a replay substitutes every use of them: their dtype, shape and device suffice
        self._inputs += [_Spec(t.shape, t.dtype, t.device) for t in self._late]
        self._late = []
        self._handle = handle

    def add_inputs(self, *tensors) -> None:
        """Inside the block: tensors of this session, made before it, that the recorded
        requests read and that a replay replaces (after the capture's own inputs)."""
        s = self._session
        if not s._capturing:
            raise RuntimeError("add_inputs() is for inside the capture block")
        for t in tensors:
            if getattr(t, "_session", None) is not s:
                raise TypeError(f"graph inputs must be Tensors of this session, got {t!r}")
            t.shape  # noqa: B018 -- dtype, shape and device known (replays check them)
        self._late.extend(tensors)

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


class _Spec:
    """What a replay needs of an input named by add_inputs(): dtype, shape, device."""

    __slots__ = ("shape", "dtype", "device")

    def __init__(self, shape, dtype, device):
        self.shape = tuple(shape)
        self.dtype = dtype
        self.device = device


def _errors_call(what, handles=(), outputs=()):
    from .session import _Call

    return _Call(what, handles, outputs=outputs)
