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

from .autograd import Gradients
from .errors import Error
from .session import _Call, _set_attr
from .tensor import Tensor

__all__ = ["Optimizer", "SGD", "Adam", "AdamW"]


class Optimizer:
    """Base class: owns an optimizer handle in the daemon."""

    kind = ""

    def __init__(self, params, **hyper):
        params = list(params)
        if not params:
            raise ValueError("optimizer got an empty parameter list")
        session = params[0]._session if isinstance(params[0], Tensor) else None
        for p in params:
            if not isinstance(p, Tensor):
                raise TypeError(f"parameters must be Tensors, got {type(p).__name__}")
            if p._session is not session:
                raise ValueError("all parameters must belong to one session")
        self.params = params
        self.hyper = dict(hyper)
        req = session._new_request()
        req.want_reply = True
        c = req.optimizer_create
        c.handle = session._new_handle()
        c.kind = self.kind
        c.params.extend(p._handle for p in params)
        for name, value in hyper.items():
            _set_attr(c.attrs.add(), name, value)
        try:
            session._roundtrip(req, _Call(f"optimizer_create {self.kind}",
                                          tuple(p._handle for p in params), f"-> #{c.handle}"))
        except Error:
            # A failed create still binds the id (to a poisoned placeholder): release it.
            session._release_later(c.handle)
            raise
        self._handle = c.handle
        self._session = session

    def __del__(self):
        session = getattr(self, "_session", None)
        if session is not None:
            session._release_later(self._handle)

    @property
    def handle(self) -> int:
        return self._handle

    def step(self, grads: Gradients) -> None:
        """Updates every parameter from grads (synchronising).

        A parameter absent from grads is left unchanged, as in PyTorch.
        """
        if not isinstance(grads, Gradients):
            raise TypeError(f"step expects Gradients, got {type(grads).__name__}")
        session = self._session
        req = session._new_request()
        req.optimizer_step.optimizer = self._handle
        req.optimizer_step.grads = grads._handle
        session._roundtrip(req, _Call("optimizer_step", (self._handle, grads._handle)))

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v}" for k, v in self.hyper.items())
        return f"tensordd.optim.{type(self).__name__}(#{self._handle}, {len(self.params)} params, {args})"


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
