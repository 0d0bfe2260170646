"""tensordd.optim.optimizer -- Optimizer, the base class: one optimizer handle in the daemon per parameter
group, its steps, state_dict and load_state_dict."""

from __future__ import annotations

import contextlib

import numpy as np

from .._codec import frame_optimizer_step
from ..autograd import Gradients, backward
from ..errors import Error
from ..session import _Call, _set_attr
from ..tensor import Tensor


class Optimizer:
    """Base class: owns one optimizer handle in the daemon per parameter group.

    Two ways to drive it:

    * the daemon's own: ``opt.step(loss.backward())`` steps with that Gradients;
    * torch's: ``opt.zero_grad(); loss.backward(); opt.step()`` -- step()
      without an argument uses the gradients of the backward() calls since
      the last zero_grad (summed, as torch accumulates) and any ``p.grad``
      assigned by hand.

    params is a list of Tensors or, as in torch, of param groups (dicts with
    ``"params"`` and per-group options such as ``"lr"``); each group gets the
    defaults for the options it does not set, and its own optimizer in the
    daemon. Any option of ``param_groups[i]`` may be changed at any time (the
    schedulers of :mod:`tensordd.optim.lr_scheduler` change ``"lr"``): the next
    ``step()`` sends the options that changed with the step (OptimizerStep's
    attrs), and the daemon keeps the state. ``add_param_group`` adds a group.
    """

    kind = ""
    # the options the daemon takes for this optimizer, by torch's names; other
    # keys of a group (initial_lr, a user's own) stay on the client. None (a
    # subclass naming only its kind): every key but params and initial_lr.
    _OPTIONS = None

    def __init__(self, params, **defaults):
        params = list(params)
        if not params:
            raise ValueError("optimizer got an empty parameter list")
        groups = params if isinstance(params[0], dict) else [{"params": params}]
        self._session = None
        self.defaults = dict(defaults)
        self.hyper = dict(defaults)
        self.params = []
        self.param_groups = []
        self._handles = []
        self._sent = []  # per group: the wire options its daemon optimizer has
        self._made_with = []  # per group: the parameter handles its daemon optimizer has
        self._steps = 0
        for g in groups:
            self.add_param_group(g)
        self._session.retain_grads = True  # the torch idiom: backward() feeds step()
        self._handle = self._handles[0]

    def add_param_group(self, param_group: dict) -> None:
        """Adds a group (torch's ``add_param_group``): the options it does not
        set are the defaults; a parameter may be in one group only. Its
        optimizer is created in the daemon at once (a bad option raises here)."""
        if not isinstance(param_group, dict) or "params" not in param_group:
            raise TypeError("param groups must all be dicts with 'params'")
        ps = param_group["params"]
        ps = [ps] if isinstance(ps, Tensor) else list(ps)
        for p in ps:
            if not isinstance(p, Tensor):
                raise TypeError(f"parameters must be Tensors, got {type(p).__name__}")
            if self._session is None:
                self._session = p._session
            if p._session is not self._session:
                raise ValueError("all parameters must belong to one session")
        if not ps:
            raise ValueError("optimizer got an empty parameter list")
        seen = {id(p) for p in self.params}  # (twice in one group: the daemon refuses it)
        if any(id(p) in seen for p in ps):
            raise ValueError("some parameters appear in more than one parameter group")
        group = {**self.defaults, **{k: v for k, v in param_group.items() if k != "params"}}
        wire = self._wire_hyper(group)
        self._handles.append(self._create(ps, {k: v for k, v in wire.items()
                                               if v is not False and v is not None}))
        self._sent.append(wire)
        self._made_with.append(tuple(p._handle for p in ps))
        self.param_groups.append({"params": ps, **group})
        self.params.extend(ps)

    def _wire_hyper(self, group: dict) -> dict:
        """A group's options (torch's names) as the daemon's attributes."""
        out = {}
        keys = self._OPTIONS or [k for k in group if k not in ("params", "initial_lr")]
        for k in keys:
            v = group.get(k)
            if k not in group or (k == "foreach" and v is None):
                continue
            if k == "betas":
                out["beta1"], out["beta2"] = (float(b) for b in v)
            elif k in ("beta1", "beta2"):
                out[k] = float(v)
            elif isinstance(v, (bool, np.bool_)):
                out[k] = bool(v)
            elif isinstance(v, (int, float, np.integer, np.floating)):
                out[k] = float(v)
            else:
                out[k] = v  # the daemon says what is wrong with it
        return out

    def _create(self, params, hyper, kind=None) -> int:
        session = self._session
        kind = kind or self.kind
        req = session._new_request()
        req.want_reply = True
        c = req.optimizer_create
        c.handle = session._new_handle()
        c.kind = kind
        c.params.extend(p._handle for p in params)
        for name, value in hyper.items():
            _set_attr(c.attrs.add(), name, value)
        try:
            session._roundtrip(req, _Call(f"optimizer_create {kind}",
                                          tuple(p._handle for p in params), f"-> #{c.handle}"))
        except Error:
            # A failed create still binds the id (to a poisoned placeholder): release it.
            session._release_later(c.handle)
            raise
        return c.handle

    def __del__(self):
        session = getattr(self, "_session", None)
        if session is not None:
            for h in getattr(self, "_handles", ()):
                session._release_later(h)

    @property
    def handle(self) -> int:
        """The daemon handle of the (first group's) optimizer."""
        return self._handle

    def _step_handle(self, handle: int, grads: Gradients, attrs=None) -> None:
        session = self._session
        if session.pipeline_steps and not session._capturing and not attrs:
            # the training step's form, encoded by hand (test_step_fast_paths.py holds it to protobuf's)
            rid = next(session._ids)
            session._send_frame(rid, frame_optimizer_step(rid, handle, grads._handle),
                                ("optimizer_step", (handle, grads._handle)))
            return
        req = session._new_request()
        req.optimizer_step.optimizer = handle
        req.optimizer_step.grads = grads._handle
        for name, value in (attrs or {}).items():  # options changed since the last step
            _set_attr(req.optimizer_step.attrs.add(), name, value)
        # A step that changes options is answered: the client must know whether the
        # daemon took them (a refused one changes nothing, and would not be sent again).
        session._roundtrip(req, _Call("optimizer_step", (handle, grads._handle)))

    def step(self, grads: Gradients | None = None, closure=None) -> None:
        """Updates every parameter (pipelined unless ``session.pipeline_steps`` is
        off: errors surface at the next synchronising call; else synchronising).

        grads: a Gradients (the daemon's API); None: the torch idiom, the
        gradients of the backward() calls since zero_grad() (see the class).
        A parameter without a gradient is left unchanged, as in PyTorch.
        closure: as torch's, called first (under grad mode) if given.
        """
        loss = None
        if closure is not None:
            loss = closure()
        session = self._session
        temp = None
        if grads is None:
            grads, owned = self._collect()
            if grads is None:
                return loss
            temp = grads if owned else None
        elif not isinstance(grads, Gradients):
            raise TypeError(f"step expects Gradients, got {type(grads).__name__}")
        else:
            # The daemon's API: these gradients are used up; the session no
            # longer keeps them (or earlier ones) for .grad.
            sets = session._grad_sets
            if grads in sets:
                del sets[: sets.index(grads) + 1]
                session._grad_epoch += 1
        self._sync_params()
        try:
            for i, group in enumerate(self.param_groups):
                wire = self._wire_hyper(group)
                changed = {k: v for k, v in wire.items() if self._sent[i].get(k) != v}
                self._step_handle(self._handles[i], grads, changed)
                self._sent[i] = wire
        finally:
            if temp is not None:
                temp.release()
        self._steps += 1
        return loss

    def _collect(self):
        """(Gradients, owned) for step(): the session's one backward, or (after
        several, or with hand-set .grad) one made to hold exactly each p.grad."""
        session = self._session
        sets, overrides = session._grad_sets, session._grad_overrides
        if not sets and not overrides:
            if session._unkept_backward:
                raise RuntimeError(
                    "step() without gradients: the last backward() ran before this session "
                    "kept gradients for .grad (set session.retain_grads = True, or create "
                    "the optimizer first), or pass its Gradients: opt.step(loss.backward())")
            return None, False
        if len(sets) == 1 and not any(p._handle in overrides for p in self.params):
            # not released by step(): it still backs .grad until zero_grad
            return sets[0], False
        pairs = [(p, p.grad) for p in self.params]
        pairs = [(p, g.detach()) for p, g in pairs if g is not None]
        if not pairs:
            return None, False
        return _gradients_of(session, pairs), True

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Forgets the gradients of the backward() calls so far (``p.grad`` is
        None again). Note: the gradients live per session, so this clears them
        for every parameter of the session, not only this optimizer's."""
        self._session.zero_grad(set_to_none)

    # ---- state: torch.optim's state_dict()["state"], kept in the daemon

    _SLOTS = {"sgd": ("momentum_buffer",),
              "adam": ("exp_avg", "exp_avg_sq", "max_exp_avg_sq"),
              "adamw": ("exp_avg", "exp_avg_sq", "max_exp_avg_sq"),
              "rmsprop": ("square_avg", "momentum_buffer", "grad_avg"),
              "adagrad": ("sum",)}

    def _kept(self, group: dict) -> tuple:
        """The buffer names a group's options keep per parameter (the daemon's slots)."""
        if self.kind == "sgd":
            return ("momentum_buffer",) if group.get("momentum", 0.0) else ()
        if self.kind == "rmsprop":
            return tuple(n for n, on in (("square_avg", True),
                                         ("momentum_buffer", group.get("momentum", 0.0) > 0),
                                         ("grad_avg", group.get("centered", False))) if on)
        if self.kind == "adagrad":
            return ("sum",)
        return self._SLOTS[self.kind][:3 if group.get("amsgrad") else 2]

    def _export(self, handle: int, n: int) -> list:
        """[(step, {slot: numpy array})] of the n parameters of the daemon optimizer
        `handle` (OptimizerState: the buffers bound to new handles, downloaded, released)."""
        session = self._session
        first = session._reserve_handles(3 * n)
        req = session._new_request()
        req.optimizer_state.optimizer = handle
        req.optimizer_state.first_output = first
        resp, _ = session._roundtrip(req, _Call("optimizer_state", (handle,),
                                                f"-> #{first}..#{first + 3 * n - 1}"))
        st = resp.optimizer_state
        names = self._SLOTS[self.kind]
        bound = [Tensor(session, first + 3 * i + k) for i in range(n) for k in range(3)
                 if st.buffers[i] & (1 << k)]  # each released when dropped
        out, it = [], iter(bound)
        for i in range(n):
            bufs = {names[k]: next(it) for k in range(3) if st.buffers[i] & (1 << k)}
            out.append((int(st.steps[i]), bufs))
        return [(step, {k: t.numpy() for k, t in bufs.items()}) for step, bufs in out]

    def _import(self, handle: int, params, entries, group: dict) -> None:
        """Replaces the state of the daemon optimizer `handle` (OptimizerLoadState):
        entries is [(step, {slot: values})] per parameter; values are uploaded to the
        parameter's device and dtype (the daemon copies them)."""
        session = self._session
        kept = self._kept(group)
        uploads = []
        req = session._new_request()
        ls = req.optimizer_load_state
        ls.optimizer = handle
        for p, (step, bufs) in zip(params, entries):
            ls.steps.append(int(step))
            for k in range(3):  # three slots per parameter on the wire
                name = self._SLOTS[self.kind][k] if k < len(self._SLOTS[self.kind]) else None
                v = bufs.get(name) if step > 0 and name in kept else None
                if v is None:
                    ls.buffers.append(0)
                    continue
                if isinstance(v, Tensor) and v._session is session:
                    t = v.to(device=p.device, dtype=p.dtype)
                else:
                    if isinstance(v, Tensor):
                        v = v.numpy()
                    t = session.tensor(v, device=p.device, dtype=p.dtype, requires_grad=False)
                uploads.append(t)
                ls.buffers.append(t._handle)
        session._roundtrip(req, _Call("optimizer_load_state", (handle,)))
        del uploads  # released with the next request: the daemon holds copies

    def _group_entries(self, state: dict, first: int, params, group: dict) -> list:
        """[(step, {slot: values})] for the params of a group from a torch-layout
        ``state`` dict (keyed by the global parameter index); checked locally."""
        kept = self._kept(group)
        entries = []
        for j, p in enumerate(params):
            s = state.get(first + j)
            if s is None:
                entries.append((0, {}))
                continue
            if not isinstance(s, dict):
                raise TypeError(f"state[{first + j}] must be a dict, got {type(s).__name__}")
            unknown = [k for k in s if k != "step" and k not in self._SLOTS[self.kind]]
            if unknown:
                raise ValueError(f"state[{first + j}]: {unknown} is not {self.kind}'s state "
                                 f"(keys: step, {', '.join(self._SLOTS[self.kind])})")
            step = s.get("step")
            if step is None:  # torch's SGD keeps no step: a momentum buffer means one or more
                step = 1 if any(s.get(k) is not None for k in kept) or not kept else 0
            step = int(step.item() if hasattr(step, "item") else step)
            if step < 0:
                raise ValueError(f"state[{first + j}]: step {step} < 0")
            bufs = {}
            for name in kept:
                v = s.get(name)
                if step > 0 and v is None:
                    raise ValueError(f"state[{first + j}]: {name} missing")
                if v is not None:
                    shape = tuple(v.shape) if hasattr(v, "shape") else np.shape(v)
                    if shape != tuple(p.shape):
                        raise ValueError(f"state[{first + j}][{name!r}] has shape {shape}, "
                                         f"the parameter {tuple(p.shape)}")
                    bufs[name] = v
            entries.append((step, bufs))
        return entries

    def _sync_params(self) -> None:
        """A parameter rebound to a new handle since the daemon's optimizer was made
        (``Module.load_state_dict``, ``requires_grad_``) gets a new daemon optimizer
        for its group, with the state carried over (exported and imported)."""
        for i, group in enumerate(self.param_groups):
            ps = group["params"]
            now = tuple(p._handle for p in ps)
            if now == self._made_with[i]:
                continue
            old = self._handles[i]
            entries = self._export(old, len(ps))
            self._recreate(i, self._sent[i])
            if any(step for step, _ in entries):
                self._import(self._handles[i], ps, entries, group)
        self._handle = self._handles[0]

    def _recreate(self, i: int, wire: dict) -> None:
        """A new daemon optimizer for group i (with no state) in place of its old one."""
        ps = self.param_groups[i]["params"]
        old = self._handles[i]
        self._handles[i] = self._create(ps, {k: v for k, v in wire.items()
                                             if v is not False and v is not None})
        self._sent[i] = wire
        self._made_with[i] = tuple(p._handle for p in ps)
        self._session._release_later(old)
        self._handle = self._handles[0]

    def state_dict(self) -> dict:
        """torch's layout: ``{"state": {index: {...}}, "param_groups": [...]}``.

        ``state`` holds, for each parameter (by its index over all groups) that has
        been stepped, the optimizer's state downloaded from the daemon as numpy
        arrays: SGD ``{"momentum_buffer": array or None}``; Adam and AdamW
        ``{"step": int, "exp_avg": array, "exp_avg_sq": array}`` (and
        ``"max_exp_avg_sq"`` with amsgrad); RMSprop ``{"step": int, "square_avg":
        array}`` (and ``"momentum_buffer"``, ``"grad_avg"`` when kept); Adagrad
        ``{"step": int, "sum": array}`` for every parameter (step 0: the initial
        accumulator, as torch makes it at construction). Each group holds its options
        and its parameters' indices. One synchronising request per group and a
        download per buffer; the arrays are copies (the checkpoint is independent
        of the session, e.g. for pickle/torch.save).
        """
        groups, state, k = [], {}, 0
        for i, g in enumerate(self.param_groups):
            n = len(g["params"])
            groups.append({**{key: v for key, v in g.items() if key != "params"},
                           "params": list(range(k, k + n))})
            ps = g["params"]
            handle = self._handles[i]
            if tuple(p._handle for p in ps) != self._made_with[i]:
                self._sync_params()
                handle = self._handles[i]
            for j, (step, bufs) in enumerate(self._export(handle, n)):
                if step == 0 and self.kind == "adagrad":
                    p = ps[j]
                    state[k + j] = {"step": 0, "sum": np.full(
                        tuple(p.shape), g.get("initial_accumulator_value", 0.0),
                        np.dtype(str(p.dtype)))}
                    continue
                if step == 0:
                    continue
                if self.kind == "sgd":
                    state[k + j] = {"momentum_buffer": bufs.get("momentum_buffer")}
                else:
                    state[k + j] = {"step": step, **bufs}
            k += n
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state: dict) -> None:
        """Loads a state_dict (ours, or torch.optim's of the same optimizer: torch
        tensors are taken as they are), as torch does: each group takes the
        saved group's options (all but its params), and the per-parameter state
        is uploaded to the parameters' devices and copied into the daemon's
        optimizer (replacing what it had). A group whose options changed gets a
        new daemon optimizer first (the buffers it keeps may differ).

        Raises ValueError if the groups do not match or an entry of ``state``
        lacks a buffer or has another shape; nothing is changed then. The
        daemon checks devices, dtypes and options as well (typed errors).
        """
        groups = state.get("param_groups", [])
        if len(groups) != len(self.param_groups):
            raise ValueError(f"state_dict has {len(groups)} param groups, the optimizer "
                             f"{len(self.param_groups)}")
        for mine, theirs in zip(self.param_groups, groups):
            if len(theirs.get("params", ())) != len(mine["params"]):
                raise ValueError("a param group of the state_dict has another size")
        new_groups = [{**{k: v for k, v in theirs.items() if k != "params"},
                       "params": mine["params"]}
                      for mine, theirs in zip(self.param_groups, groups)]
        per_state = state.get("state") or {}
        # torch's state_dict keys its groups' params by index: map ours in order
        index = {}
        k = 0
        for mine, theirs in zip(self.param_groups, groups):
            for j, their_idx in enumerate(theirs.get("params", ())):
                index[k + j] = their_idx
            k += len(mine["params"])
        remapped = {mine_i: per_state[their_i] for mine_i, their_i in index.items()
                    if their_i in per_state}
        all_entries, k = [], 0
        for g in new_groups:
            all_entries.append(self._group_entries(remapped, k, g["params"], g))
            k += len(g["params"])
        self._sync_params()
        for i, g in enumerate(new_groups):
            wire = self._wire_hyper(g)
            if wire != self._sent[i]:
                self._recreate(i, wire)
            self._import(self._handles[i], g["params"], all_entries[i], g)
            self.param_groups[i].clear()
            self.param_groups[i].update(g)

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v}" for k, v in self.defaults.items())
        return f"tensordd.optim.{type(self).__name__}(#{self._handle}, {len(self.params)} params, {args})"


@contextlib.contextmanager
def _grad_mode(session, enabled: bool):
    previous = session.grad_enabled
    session.set_grad_enabled(enabled)
    try:
        yield
    finally:
        if not session.closed:
            session.set_grad_enabled(previous)


def _gradients_of(session, pairs) -> Gradients:
    """A Gradients holding exactly g for each (p, g): the backward of
    sum((p * g).sum()), with g constants (nothing is downloaded)."""
    with _grad_mode(session, True):
        loss = None
        for p, g in pairs:
            term = (p * g).sum()
            loss = term if loss is None else loss + term
    return backward(loss, _register=False)


def _check(**values) -> None:
    """torch.optim's constructor checks: each value >= 0 (NaN is not)."""
    for name, v in values.items():
        if not v >= 0:
            raise ValueError(f"Invalid {name}: {v}")
