"""optim -- optimizers that run in the daemon (SGD, Adam, AdamW).

An optimizer is created once with its parameters (OptimizerCreate, a round
trip, so a bad hyperparameter or a full quota raises in the constructor as in
PyTorch; the C client's td_optimizer_create is asynchronous and reports it at
the next synchronising call); its state (momentum buffers,
Adam moments, amsgrad's maxima) lives in the daemon, keyed by parameter.
``step(grads)`` reads a Gradients handle and updates the parameters in place
in one synchronising request.
"""

from __future__ import annotations

import contextlib

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

    def state_dict(self) -> dict:
        """torch's layout: ``{"state": {}, "param_groups": [...]}``; each group
        holds its hyperparameters and its parameters' indices.

        The daemon keeps the optimizer state (momentum buffers, Adam moments)
        and has no request to export it, so ``state`` is empty: a checkpoint
        restores hyperparameters and learning rates, not moments.
        """
        groups, k = [], 0
        for g in self.param_groups:
            n = len(g["params"])
            groups.append({**{key: v for key, v in g.items() if key != "params"},
                           "params": list(range(k, k + n))})
            k += n
        return {"state": {}, "param_groups": groups}

    def load_state_dict(self, state: dict) -> None:
        """Loads hyperparameters (the lr above all) from a state_dict.

        Raises ValueError if the groups do not match, if a hyperparameter other
        than the lr differs (the daemon's optimizer is created with them), or
        if ``state`` holds optimizer state the daemon could not take.
        """
        groups = state.get("param_groups", [])
        if len(groups) != len(self.param_groups):
            raise ValueError(f"state_dict has {len(groups)} param groups, the optimizer "
                             f"{len(self.param_groups)}")
        if state.get("state"):
            raise ValueError("state_dict holds optimizer state (moments, buffers): the "
                             "daemon keeps its own and cannot import it")
        for mine, theirs in zip(self.param_groups, groups):
            if len(theirs.get("params", ())) != len(mine["params"]):
                raise ValueError("a param group of the state_dict has another size")
            for k, v in theirs.items():
                if k in ("params", "lr", "initial_lr"):
                    continue
                if k in mine and mine[k] != v:
                    raise ValueError(f"hyperparameter {k}={v!r} differs from the optimizer's "
                                     f"{mine[k]!r} (only lr can change after creation)")
        for mine, theirs in zip(self.param_groups, groups):
            for k in ("lr", "initial_lr"):
                if k in theirs:
                    mine[k] = theirs[k]

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
