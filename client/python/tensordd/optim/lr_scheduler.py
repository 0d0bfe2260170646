"""lr_scheduler -- torch.optim.lr_scheduler's most used schedulers.

They change ``optimizer.param_groups[i]["lr"]`` with torch 1.13's formulas
(the same recursive forms, so the learning rates agree with torch's to the
last bit); the optimizer applies the new lr at its next ``step()``.
"""

from __future__ import annotations

import math

__all__ = ["LRScheduler", "LambdaLR", "StepLR", "MultiStepLR", "ExponentialLR",
           "CosineAnnealingLR"]


class LRScheduler:
    """Base class (torch's ``_LRScheduler``): ``step()`` once per epoch, after
    ``optimizer.step()``; ``get_last_lr()``; ``state_dict()``/``load_state_dict()``."""

    def __init__(self, optimizer, last_epoch: int = -1, verbose: bool = False):
        self.optimizer = optimizer
        if last_epoch == -1:
            for group in optimizer.param_groups:
                group.setdefault("initial_lr", group["lr"])
        else:
            for i, group in enumerate(optimizer.param_groups):
                if "initial_lr" not in group:
                    raise KeyError(f"param 'initial_lr' is not specified in param_groups[{i}] "
                                   f"when resuming an optimizer")
        self.base_lrs = [group["initial_lr"] for group in optimizer.param_groups]
        self.last_epoch = last_epoch
        self.verbose = verbose
        self._step_count = 0
        self.step()

    def get_lr(self) -> list:
        """The learning rates of the current epoch, one per param group (subclasses define it)."""
        raise NotImplementedError

    def get_last_lr(self) -> list:
        """The learning rates the last step() set, one per param group."""
        return self._last_lr

    def step(self, epoch=None) -> None:
        """Advances one epoch (``epoch`` given: jumps there, with the closed form
        where there is one) and sets each group's lr."""
        self._step_count += 1
        if epoch is None:
            self.last_epoch += 1
            values = self.get_lr()
        else:
            self.last_epoch = epoch
            closed = getattr(self, "_get_closed_form_lr", None)
            values = closed() if closed else self.get_lr()
        for group, lr in zip(self.optimizer.param_groups, values):
            group["lr"] = lr
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]

    def state_dict(self) -> dict:
        """The scheduler's state (epoch, base lrs, ...) for a checkpoint, as torch's."""
        return {k: v for k, v in self.__dict__.items() if k not in ("optimizer", "lr_lambdas")}

    def load_state_dict(self, state: dict) -> None:
        """Restores a state from :meth:`state_dict`."""
        self.__dict__.update(state)


_LRScheduler = LRScheduler


class LambdaLR(LRScheduler):
    """lr = initial lr * lr_lambda(epoch) (one function, or one per group)."""

    def __init__(self, optimizer, lr_lambda, last_epoch: int = -1, verbose: bool = False):
        n = len(optimizer.param_groups)
        if isinstance(lr_lambda, (list, tuple)):
            if len(lr_lambda) != n:
                raise ValueError(f"expected {n} lr_lambdas, got {len(lr_lambda)}")
            self.lr_lambdas = list(lr_lambda)
        else:
            self.lr_lambdas = [lr_lambda] * n
        super().__init__(optimizer, last_epoch, verbose)

    def get_lr(self) -> list:
        """The learning rates of the current epoch by torch's ``LambdaLR`` rule, one per param
        group."""
        return [base * f(self.last_epoch) for f, base in zip(self.lr_lambdas, self.base_lrs)]


class StepLR(LRScheduler):
    """lr *= gamma every step_size epochs."""

    def __init__(self, optimizer, step_size: int, gamma: float = 0.1, last_epoch: int = -1,
                 verbose: bool = False):
        self.step_size = step_size
        self.gamma = gamma
        super().__init__(optimizer, last_epoch, verbose)

    def get_lr(self) -> list:
        """The learning rates of the current epoch by torch's ``StepLR`` rule, one per param group.
        """
        if self.last_epoch == 0 or self.last_epoch % self.step_size != 0:
            return [g["lr"] for g in self.optimizer.param_groups]
        return [g["lr"] * self.gamma for g in self.optimizer.param_groups]

    def _get_closed_form_lr(self) -> list:
        return [base * self.gamma ** (self.last_epoch // self.step_size)
                for base in self.base_lrs]


class MultiStepLR(LRScheduler):
    """lr *= gamma at each epoch listed in milestones."""

    def __init__(self, optimizer, milestones, gamma: float = 0.1, last_epoch: int = -1,
                 verbose: bool = False):
        self.milestones = sorted(milestones)
        self.gamma = gamma
        super().__init__(optimizer, last_epoch, verbose)

    def get_lr(self) -> list:
        """The learning rates of the current epoch by torch's ``MultiStepLR`` rule, one per param
        group."""
        k = self.milestones.count(self.last_epoch)
        return [g["lr"] * self.gamma ** k for g in self.optimizer.param_groups]

    def _get_closed_form_lr(self) -> list:
        k = sum(1 for m in self.milestones if m <= self.last_epoch)
        return [base * self.gamma ** k for base in self.base_lrs]


class ExponentialLR(LRScheduler):
    """lr *= gamma every epoch."""

    def __init__(self, optimizer, gamma: float, last_epoch: int = -1, verbose: bool = False):
        self.gamma = gamma
        super().__init__(optimizer, last_epoch, verbose)

    def get_lr(self) -> list:
        """The learning rates of the current epoch by torch's ``ExponentialLR`` rule, one per param
        group."""
        if self.last_epoch == 0:
            return [g["lr"] for g in self.optimizer.param_groups]
        return [g["lr"] * self.gamma for g in self.optimizer.param_groups]

    def _get_closed_form_lr(self) -> list:
        return [base * self.gamma ** self.last_epoch for base in self.base_lrs]


class CosineAnnealingLR(LRScheduler):
    """Cosine annealing from the initial lr to eta_min over T_max epochs (SGDR
    without restarts), in torch's recursive form."""

    def __init__(self, optimizer, T_max: int, eta_min: float = 0.0, last_epoch: int = -1,  # noqa: N803
                 verbose: bool = False):
        self.T_max = T_max
        self.eta_min = eta_min
        super().__init__(optimizer, last_epoch, verbose)

    def get_lr(self) -> list:
        """The learning rates of the current epoch by torch's ``CosineAnnealingLR`` rule, one per
        param group."""
        groups = self.optimizer.param_groups
        if self.last_epoch == 0:
            return [g["lr"] for g in groups]
        if self._step_count == 1 and self.last_epoch > 0:
            return [self.eta_min + (base - self.eta_min) *
                    (1 + math.cos(self.last_epoch * math.pi / self.T_max)) / 2
                    for base in self.base_lrs]
        if (self.last_epoch - 1 - self.T_max) % (2 * self.T_max) == 0:
            return [g["lr"] + (base - self.eta_min) * (1 - math.cos(math.pi / self.T_max)) / 2
                    for base, g in zip(self.base_lrs, groups)]
        return [(1 + math.cos(math.pi * self.last_epoch / self.T_max)) /
                (1 + math.cos(math.pi * (self.last_epoch - 1) / self.T_max)) *
                (g["lr"] - self.eta_min) + self.eta_min for g in groups]

    def _get_closed_form_lr(self) -> list:
        return [self.eta_min + (base - self.eta_min) *
                (1 + math.cos(math.pi * self.last_epoch / self.T_max)) / 2
                for base in self.base_lrs]
