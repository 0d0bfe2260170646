"""Graph capture on the tensordd torch device, in the manner of ``torch.cuda.graph``.

    g = tensordd.torch.Graph()
    with tensordd.torch.graph(g):            # records the step (and runs it once)
        loss = step(static_x, static_y)      # forward, backward, opt.step()
    for x, y in batches:
        static_x.copy_(x); static_y.copy_(y)
        g.replay()                           # the whole step: one message
    print(loss.item())                       # the latest replay's loss

It rests on the daemon's graphs (tensordd.graph: GraphBegin, GraphEnd, Replay). Every
request the block sends is recorded; the storages of tensors made before the block
that it reads (parameters, optimizer state, static inputs) become the graph's inputs,
named at GraphEnd; a replay gives each the storage's handle *now*. A storage the block
writes holds, after it, a handle the graph binds again at every replay: its value is
the latest replay's, and the next replay reads it (through the input slot of the
storage's handle before the block) - a parameter updated by ``opt.step()`` carries from
one replay to the next, as the static tensors of a CUDA graph do.

Unlike CUDA's, the capture runs the step (the daemon runs what it records): after the
block, the step has run once. As with CUDA's, Python runs only at capture: numbers
computed on the host (a learning rate, a CPU scalar tensor's value) are constants of
the graph, and what the block cannot record raises RuntimeError naming it: reading a
value (``.item()``, ``.cpu()``, ``bool()``, ``print``), copying host data to the
device, random fills (drawn on the host). Make optimizer state before capturing (a few
eager steps first, as torch.cuda.graph's documentation says: an SGD momentum buffer
made inside the block would be made again, not carried, by every replay). An
optimizer whose state keeps a CPU tensor for a device parameter (Adam's step count) is
refused at its step(): it computes on the host from it.
"""

from __future__ import annotations

import functools
import importlib

import torch

_STEP_HOOK = torch.optim.Optimizer._optimizer_step_code


class _Capture:
    """What a capture in progress has seen."""

    def __init__(self, session, first_id):
        self.session = session
        self.first_id = first_id
        self.inputs = {}  # id(storage) -> (storage, its handle before the block)
        self.written = {}  # id(storage) -> storage
        self.keep = []  # constants the graph reads (strided views' indices)
        self.refused = None

    def read(self, st):
        if id(st) not in self.inputs and id(st) not in self.written:
            if st.dev.session is not self.session:
                self.refuse(f"reading a tensor of another session ({st.dev.tdev})")
            h = st.h
            if h._handle < self.first_id:
                self.inputs[id(st)] = (st, h, tuple(st.shape))

    def wrote(self, st):
        if id(st) not in self.written:
            self.written[id(st)] = st

    def refuse(self, what):
        msg = (f"tensordd.torch: {what} while a graph is being captured: a replay could not "
               f"do it (as with torch.cuda.graph, do it outside the capture)")
        if self.refused is None:
            self.refused = msg
        raise RuntimeError(msg)


def _host_state_check(opt):
    """Run by torch after every optimizer step (Optimizer._optimizer_step_code) while a
    graph is captured: an optimizer whose state for a parameter on the device holds a CPU
    tensor (Adam's and AdamW's step count, torch 1.13's capturable=True being CUDA-only)
    computes on the host from it, which a replay would not do again."""
    from . import _cap

    if _cap is None:
        return
    for group in opt.param_groups:
        for p in group["params"]:
            if p.device.type != "privateuseone":
                continue
            for k, v in opt.state.get(p, {}).items():
                if isinstance(v, torch.Tensor) and v.device.type == "cpu":
                    _cap.refuse(f"{type(opt).__name__}.step() reading its state {k!r} on the "
                                f"host (a CPU tensor: what it computes from it would stay "
                                f"the captured step's)")


_as_cuda = [0]  # > 0 while a capturable Adam/AdamW step runs on device tensors


def _capturable(fn):
    """torch 1.13's capturable Adam/AdamW asserts ``param.is_cuda``; for this device's
    tensors it runs with DaemonTensor.is_cuda true during the call (its ops are the
    device's: pow, sqrt, div, addcdiv_ on the step count's 1-element tensor)."""

    @functools.wraps(fn)
    def run(params, *args, **kwargs):
        from . import DaemonTensor

        if not (kwargs.get("capturable") and params and isinstance(params[0], DaemonTensor)):
            return fn(params, *args, **kwargs)
        _as_cuda[0] += 1
        try:
            return fn(params, *args, **kwargs)
        finally:
            _as_cuda[0] -= 1

    run._tensordd = True
    return run


for _modname, _name in (("torch.optim.adam", "_single_tensor_adam"),
                        ("torch.optim.adamw", "_single_tensor_adamw")):
    _mod = importlib.import_module(_modname)  # (torch.optim deletes its submodules' names)
    if not getattr(getattr(_mod, _name), "_tensordd", False):
        setattr(_mod, _name, _capturable(getattr(_mod, _name)))


class Graph:
    """A step captured on a tensordd torch device (``torch.cuda.CUDAGraph``'s part):
    :func:`graph` records it, :meth:`replay` runs it again."""

    def __init__(self):
        self._g = None  # the native graph (tensordd.graph.Graph)
        self._session = None
        self._slots = []  # (input shape, [storages]) in GraphEnd's order
        self._written = []  # storages the graph writes
        self._keep = []

    def capture_begin(self, device=None) -> None:
        from . import _dev_of, _devices
        from .. import torch as pkg

        if pkg._cap is not None:
            raise RuntimeError("tensordd.torch: a graph is being captured already")
        if self._g is not None:
            raise RuntimeError("tensordd.torch: this Graph holds a capture already (reset() "
                               "first)")
        if device is not None:
            s = _dev_of(device).session
        else:
            sessions = {id(d.session): d.session for d in _devices if d.session._open}
            if len(sessions) != 1:
                raise ValueError("tensordd.torch.graph: name the device (graph(g, device=dev)): "
                                 f"{len(sessions)} sessions are open")
            s = next(iter(sessions.values()))
        ng = s.capture()
        ng.__enter__()
        self._g, self._session = ng, s
        pkg._epoch += 1  # nothing derived before the capture is read inside it
        pkg._cap = _Capture(s, ng._first_id)
        torch.optim.Optimizer._optimizer_step_code = _host_state_check

    def capture_end(self, exc_type=None, exc=None, tb=None) -> None:
        from .. import torch as pkg

        cap, pkg._cap = pkg._cap, None
        torch.optim.Optimizer._optimizer_step_code = _STEP_HOOK
        ng = self._g
        if cap is None or ng is None:
            raise RuntimeError("tensordd.torch: no capture in progress")
        # The storages read from before the block, by handle (two storages sharing one
        # handle share its input slot)
        slots = {}
        for st, h, shape in cap.inputs.values():
            slots.setdefault(h._handle, (h, shape, []))[2].append(st)
        ok = exc_type is None and cap.refused is None
        if ok:
            ng.add_inputs(*(h for h, _, _ in slots.values()))
        try:
            ng.__exit__(exc_type, exc, tb)
        except BaseException:
            self._g = None
            raise
        if not ok or ng._handle is None:
            self._g = None
            if exc_type is None and cap.refused is not None:
                raise RuntimeError(cap.refused)
            return
        self._slots = [(shape, sts) for _, shape, sts in slots.values()]
        self._written = list(cap.written.values())
        self._keep = cap.keep

    def replay(self) -> None:
        """Runs the captured step again: its inputs are the storages' current values
        (what ``static_x.copy_(x)`` wrote since), its outputs the tensors it wrote."""
        ng = self._g
        if ng is None:
            raise RuntimeError("tensordd.torch: the graph holds no capture")
        s = self._session
        ins = []
        for shape, sts in self._slots:
            h = sts[0].value()
            for other in sts[1:]:
                if other.value() is not h:
                    raise RuntimeError("tensordd.torch: two tensors that shared their "
                                       "storage's value at capture differ now; the graph "
                                       "reads one value for both (capture again)")
            if tuple(sts[0].shape) != shape:
                h = s._op("reshape", h, shape=tuple(shape))
            ins.append(h)
        s._emit_releases()
        ng.replay(*ins)
        for st in self._written:  # rebound in the daemon: views derived since are stale
            st.version += 1
            st._flat = None

    def reset(self) -> None:
        """Drops the capture (the daemon frees the graph)."""
        self._g = None
        self._slots = []
        self._written = []
        self._keep = []

    def __repr__(self):
        state = "captured" if self._g is not None else "empty"
        return f"<tensordd.torch.Graph {state}, {len(self._slots)} input(s)>"


class graph:
    """``with tensordd.torch.graph(g):`` captures the block into g (Graph), as
    ``torch.cuda.graph`` does; device: the torch device whose session records (None:
    the one session tensordd.torch has open)."""

    def __init__(self, g: Graph, device=None):
        if not isinstance(g, Graph):
            raise TypeError(f"tensordd.torch.graph: expected a tensordd.torch.Graph, got "
                            f"{type(g).__name__}")
        self._graph = g
        self._device = device

    def __enter__(self) -> Graph:
        self._graph.capture_begin(self._device)
        return self._graph

    def __exit__(self, exc_type, exc, tb):
        self._graph.capture_end(exc_type, exc, tb)
        return False

