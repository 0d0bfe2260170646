"""optim -- optimizers that run in the daemon (SGD, Adam, AdamW).

An optimizer is created once with its parameters (OptimizerCreate, a round
trip, so a bad hyperparameter or a full quota raises in the constructor as in
PyTorch; the C client's td_optimizer_create is asynchronous and reports it at
the next synchronising call); its state (momentum buffers,
Adam moments, amsgrad's maxima) lives in the daemon, keyed by parameter, and
``state_dict()``/``load_state_dict()`` download and upload it in torch's layout
(OptimizerState, OptimizerLoadState). ``step(grads)`` reads a Gradients handle
and updates the parameters in place in one synchronising request.
"""

from __future__ import annotations

import contextlib

import numpy as np

from ..autograd import Gradients, backward
from ..errors import Error
from ..session import _Call, _set_attr
from ..tensor import Tensor

__all__ = ["Optimizer", "SGD", "Adam", "AdamW"]


class Optimizer:
    """Base class: owns one optimizer handle in the daemon per parameter group.

    Two ways to drive it:

    * the daemon's own: ``opt.step(loss.backward())`` steps with that Gradients;
    * torch's: ``opt.zero_grad(); loss.backward(); opt.step()`` -- step()
      without an argument uses the gradients of the backward() calls since
      the last zero_grad (summed, as torch accumulates) and any ``p.grad``
      assigned by hand.

    params is a list of Tensors or, as in torch, of param groups (dicts with
    ``"params"`` and per-group hyperparameters such as ``"lr"``).
    ``param_groups[i]["lr"]`` may be changed at any time (the schedulers of
    :mod:`tensordd.optim.lr_scheduler` do): the daemon's optimizer keeps the
    lr it was created with, and a step at another lr is rescaled in place
    (the update of every optimizer here is linear in lr, so
    ``p_old + lr/lr0 * (p_stepped - p_old)`` is exactly torch's step; it costs
    one more backward and step round trip).
    """

    kind = ""

    def __init__(self, params, **hyper):
        params = list(params)
        if not params:
            raise ValueError("optimizer got an empty parameter list")
        groups = params if isinstance(params[0], dict) else [{"params": params}]
        session = None
        checked = []
        for g in groups:
            if not isinstance(g, dict) or "params" not in g:
                raise TypeError("param groups must all be dicts with 'params'")
            ps = g["params"]
            ps = [ps] if isinstance(ps, Tensor) else list(ps)
            for p in ps:
                if not isinstance(p, Tensor):
                    raise TypeError(f"parameters must be Tensors, got {type(p).__name__}")
                if session is None:
                    session = p._session
                if p._session is not session:
                    raise ValueError("all parameters must belong to one session")
            if not ps:
                raise ValueError("optimizer got an empty parameter list")
            extra = {k: v for k, v in g.items() if k != "params"}
            checked.append((ps, {**hyper, **self._wire_hyper(extra)}))
        self._session = session
        session.retain_grads = True  # the torch idiom: backward() feeds step()
        self.params = [p for ps, _ in checked for p in ps]
        self.hyper = dict(checked[0][1])
        self.param_groups = []
        self._handles = []
        self._base_lrs = []
        self._fixers = []
        self._made_with = []  # per group: the parameter handles its daemon optimizer has
        self._steps = 0
        for ps, h in checked:
            lr = h.get("lr")
            if isinstance(lr, (int, float)) and not isinstance(lr, bool) and lr >= 0:
                # the daemon's optimizer runs at base; other lrs are rescaled steps
                base = float(lr) if lr > 0 else 1.0
                self._handles.append(self._create(ps, {**h, "lr": base}))
            else:  # no lr, or one the daemon is to judge: sent as given
                base = None
                self._handles.append(self._create(ps, h))
            self._base_lrs.append(base)
            self._fixers.append(None)
            self._made_with.append(tuple(p._handle for p in ps))
            self.param_groups.append({"params": ps, **h})
        self._handle = self._handles[0]
        self.defaults = dict(hyper)

    @staticmethod
    def _wire_hyper(group: dict) -> dict:
        """A group's torch-named hyperparameters as the daemon's attributes."""
        out = dict(group)
        if "betas" in out:
            out["beta1"], out["beta2"] = (float(b) for b in out.pop("betas"))
        for k in ("lr", "momentum", "weight_decay", "dampening", "eps"):
            if k in out:
                out[k] = float(out[k])
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
            for h in getattr(self, "_fixers", ()):
                if h is not None:
                    session._release_later(h)

    @property
    def handle(self) -> int:
        """The daemon handle of the (first group's) optimizer."""
        return self._handle

    def _step_handle(self, handle: int, grads: Gradients) -> None:
        session = self._session
        req = session._new_request()
        req.optimizer_step.optimizer = handle
        req.optimizer_step.grads = grads._handle
        session._roundtrip(req, _Call("optimizer_step", (handle, grads._handle)))

    def step(self, grads: Gradients | None = None, closure=None) -> None:
        """Updates every parameter (synchronising).

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
                base = self._base_lrs[i]
                lr = group.get("lr", base)
                if base is None or lr == base:
                    self._step_handle(self._handles[i], grads)
                else:
                    self._step_rescaled(i, grads, float(lr) / base)
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

    def _step_rescaled(self, i: int, grads: Gradients, ratio: float) -> None:
        """The group's step at lr = ratio * base lr: step at the base lr, then
        move each parameter back by (1 - ratio) of its update."""
        session = self._session
        ps = self.param_groups[i]["params"]
        with _grad_mode(session, False):
            olds = [p.detach().clone() for p in ps]
        self._step_handle(self._handles[i], grads)
        with _grad_mode(session, False):
            deltas = [(p.detach() - old) * (1.0 - ratio) for p, old in zip(ps, olds)]
        if self._fixers[i] is None:  # p -= delta: plain SGD at lr 1
            self._fixers[i] = self._create(ps, {"lr": 1.0}, kind="sgd")
        fix = _gradients_of(session, list(zip(ps, deltas)))
        try:
            self._step_handle(self._fixers[i], fix)
        finally:
            fix.release()

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Forgets the gradients of the backward() calls so far (``p.grad`` is
        None again). Note: the gradients live per session, so this clears them
        for every parameter of the session, not only this optimizer's."""
        self._session.zero_grad(set_to_none)

    # ---- state: torch.optim's state_dict()["state"], kept in the daemon

    _SLOTS = {"sgd": ("momentum_buffer",),
              "adam": ("exp_avg", "exp_avg_sq", "max_exp_avg_sq"),
              "adamw": ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")}

    def _kept(self) -> tuple:
        """The buffer names this optimizer keeps per parameter (the daemon's slots)."""
        if self.kind == "sgd":
            return ("momentum_buffer",) if self.hyper.get("momentum", 0.0) else ()
        return self._SLOTS[self.kind][:3 if self.hyper.get("amsgrad") else 2]

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

    def _import(self, handle: int, params, entries) -> None:
        """Replaces the state of the daemon optimizer `handle` (OptimizerLoadState):
        entries is [(step, {slot: values})] per parameter; values are uploaded to the
        parameter's device and dtype (the daemon copies them)."""
        session = self._session
        kept = self._kept()
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

    def _group_entries(self, state: dict, first: int, params) -> list:
        """[(step, {slot: values})] for the params of a group from a torch-layout
        ``state`` dict (keyed by the global parameter index); checked locally."""
        kept = self._kept()
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
            h = {k: v for k, v in group.items() if k not in ("params", "initial_lr")}
            h = self._wire_hyper(h)
            if self._base_lrs[i] is not None:
                h["lr"] = self._base_lrs[i]
            self._handles[i] = self._create(ps, h)
            self._made_with[i] = now
            self._session._release_later(old)
            if self._fixers[i] is not None:
                self._session._release_later(self._fixers[i])
                self._fixers[i] = None
            if any(step for step, _ in entries):
                self._import(self._handles[i], ps, entries)
        self._handle = self._handles[0]

    def state_dict(self) -> dict:
        """torch's layout: ``{"state": {index: {...}}, "param_groups": [...]}``.

        ``state`` holds, for each parameter (by its index over all groups) that has
        been stepped, the optimizer's state downloaded from the daemon as numpy
        arrays: SGD ``{"momentum_buffer": array or None}``; Adam and AdamW
        ``{"step": int, "exp_avg": array, "exp_avg_sq": array}`` (and
        ``"max_exp_avg_sq"`` with amsgrad). Each group holds its hyperparameters
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
        tensors are taken as they are): the per-parameter state is uploaded to the
        parameters' devices and copied into the daemon's optimizer (replacing what
        it had), and the lr (and initial_lr) of each group are taken.

        Raises ValueError if the groups do not match, if a hyperparameter other
        than the lr differs (the daemon's optimizer is created with them), or if
        an entry of ``state`` lacks a buffer or has another shape; nothing is
        changed then. The daemon checks devices and dtypes as well (typed errors).
        """
        groups = state.get("param_groups", [])
        if len(groups) != len(self.param_groups):
            raise ValueError(f"state_dict has {len(groups)} param groups, the optimizer "
                             f"{len(self.param_groups)}")
        for mine, theirs in zip(self.param_groups, groups):
            if len(theirs.get("params", ())) != len(mine["params"]):
                raise ValueError("a param group of the state_dict has another size")
            for k, v in theirs.items():
                if k in ("params", "lr", "initial_lr"):
                    continue
                if k in mine and mine[k] != v:
                    raise ValueError(f"hyperparameter {k}={v!r} differs from the optimizer's "
                                     f"{mine[k]!r} (only lr can change after creation)")
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
        for g in self.param_groups:
            all_entries.append(self._group_entries(remapped, k, g["params"]))
            k += len(g["params"])
        self._sync_params()
        for i, g in enumerate(self.param_groups):
            self._import(self._handles[i], g["params"], all_entries[i])
        for mine, theirs in zip(self.param_groups, groups):
            for key in ("lr", "initial_lr"):
                if key in theirs:
                    mine[key] = theirs[key]

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v}" for k, v in self.hyper.items())
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


class SGD(Optimizer):
    """Stochastic gradient descent with momentum, dampening, Nesterov and weight decay
    (PyTorch's ``torch.optim.SGD`` semantics)."""

    kind = "sgd"

    def __init__(self, params, lr: float, momentum: float = 0.0, weight_decay: float = 0.0,
                 nesterov: bool = False, dampening: float = 0.0):
        if lr < 0 or momentum < 0 or weight_decay < 0:
            raise ValueError("lr, momentum and weight_decay must be >= 0")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")
        super().__init__(params, lr=float(lr), momentum=float(momentum),
                         weight_decay=float(weight_decay), nesterov=bool(nesterov),
                         dampening=float(dampening))


class Adam(Optimizer):
    """Adam (``torch.optim.Adam``): weight decay added to the gradient (L2);
    ``amsgrad`` normalises by the largest second moment so far."""

    kind = "adam"

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, amsgrad: bool = False):
        beta1, beta2 = betas
        if lr < 0 or eps < 0 or weight_decay < 0 or not (0 <= beta1 < 1 and 0 <= beta2 < 1):
            raise ValueError("invalid Adam hyperparameters")
        # amsgrad goes only when set (the daemon's default is off), so a plain
        # Adam's request is what it was.
        extra = {"amsgrad": True} if amsgrad else {}
        super().__init__(params, lr=float(lr), beta1=float(beta1), beta2=float(beta2),
                         eps=float(eps), weight_decay=float(weight_decay), **extra)


class AdamW(Adam):
    """AdamW (``torch.optim.AdamW``): decoupled weight decay, default 0.01."""

    kind = "adamw"

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2, amsgrad: bool = False):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                         amsgrad=amsgrad)


from . import lr_scheduler  # noqa: E402,F401 (tensordd.optim.lr_scheduler, as in torch)
