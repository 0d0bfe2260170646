"""tensordd.optim.adagrad -- Adagrad."""

from __future__ import annotations

from .optimizer import Optimizer, _check


class Adagrad(Optimizer):
    """Adagrad (``torch.optim.Adagrad``): the gradient divided by the root of the
    sum of its squares so far (starting at ``initial_accumulator_value``), at
    ``lr / (1 + (step - 1) * lr_decay)``."""

    kind = "adagrad"
    _OPTIONS = ("lr", "lr_decay", "weight_decay", "initial_accumulator_value", "eps",
                "maximize", "foreach")

    def __init__(self, params, lr: float = 1e-2, lr_decay: float = 0.0,
                 weight_decay: float = 0.0, initial_accumulator_value: float = 0.0,
                 eps: float = 1e-10, maximize: bool = False):
        _check(learning_rate=lr, lr_decay=lr_decay, weight_decay=weight_decay,
               initial_accumulator_value=initial_accumulator_value, epsilon=eps)
        super().__init__(params, lr=float(lr), lr_decay=float(lr_decay),
                         weight_decay=float(weight_decay),
                         initial_accumulator_value=float(initial_accumulator_value),
                         eps=float(eps), maximize=bool(maximize))
