"""tensordd.optim.sgd -- SGD."""

from __future__ import annotations

from .optimizer import Optimizer


class SGD(Optimizer):
    """Stochastic gradient descent with momentum, dampening, Nesterov and weight decay
    (PyTorch's ``torch.optim.SGD`` semantics)."""

    kind = "sgd"
    _OPTIONS = ("lr", "momentum", "dampening", "weight_decay", "nesterov", "maximize",
                "foreach")

    def __init__(self, params, lr: float, momentum: float = 0.0, weight_decay: float = 0.0,
                 nesterov: bool = False, dampening: float = 0.0, maximize: bool = False):
        if lr < 0 or momentum < 0 or weight_decay < 0:
            raise ValueError("lr, momentum and weight_decay must be >= 0")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")
        super().__init__(params, lr=float(lr), momentum=float(momentum),
                         weight_decay=float(weight_decay), nesterov=bool(nesterov),
                         dampening=float(dampening), maximize=bool(maximize))
