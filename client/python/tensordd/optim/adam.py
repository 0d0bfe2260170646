"""tensordd.optim.adam -- Adam and AdamW."""

from __future__ import annotations

from .optimizer import Optimizer


class Adam(Optimizer):
    """Adam (``torch.optim.Adam``): weight decay added to the gradient (L2);
    ``amsgrad`` normalises by the largest second moment so far."""

    kind = "adam"
    _OPTIONS = ("lr", "betas", "beta1", "beta2", "eps", "weight_decay", "amsgrad", "maximize",
                "foreach")

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, amsgrad: bool = False, maximize: bool = False):
        beta1, beta2 = betas
        if lr < 0 or eps < 0 or weight_decay < 0 or not (0 <= beta1 < 1 and 0 <= beta2 < 1):
            raise ValueError("invalid Adam hyperparameters")
        # amsgrad and maximize go only when set (the daemon's defaults are off), so a
        # plain Adam's request is what it was.
        super().__init__(params, lr=float(lr), betas=(float(beta1), float(beta2)),
                         eps=float(eps), weight_decay=float(weight_decay),
                         amsgrad=bool(amsgrad), maximize=bool(maximize))


class AdamW(Adam):
    """AdamW (``torch.optim.AdamW``): decoupled weight decay, default 0.01."""

    kind = "adamw"

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2, amsgrad: bool = False, maximize: bool = False):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                         amsgrad=amsgrad, maximize=maximize)
