"""tensordd.optim.rmsprop -- RMSprop."""

from __future__ import annotations

from .optimizer import Optimizer, _check


class RMSprop(Optimizer):
    """RMSprop (``torch.optim.RMSprop``): the gradient divided by the root of a
    running mean of its square (``alpha`` its smoothing); ``centered`` subtracts
    the squared running mean of the gradient; ``momentum`` > 0 keeps a buffer."""

    kind = "rmsprop"
    _OPTIONS = ("lr", "alpha", "eps", "weight_decay", "momentum", "centered", "maximize",
                "foreach")

    def __init__(self, params, lr: float = 1e-2, alpha: float = 0.99, eps: float = 1e-8,
                 weight_decay: float = 0.0, momentum: float = 0.0, centered: bool = False,
                 maximize: bool = False):
        _check(learning_rate=lr, epsilon=eps, momentum=momentum, weight_decay=weight_decay,
               alpha=alpha)
        super().__init__(params, lr=float(lr), alpha=float(alpha), eps=float(eps),
                         weight_decay=float(weight_decay), momentum=float(momentum),
                         centered=bool(centered), maximize=bool(maximize))
