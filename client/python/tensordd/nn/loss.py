"""tensordd.nn.loss -- The losses: MSELoss, CrossEntropyLoss, BCEWithLogitsLoss."""

from __future__ import annotations

from . import functional as F
from .module import Module


class MSELoss(Module):
    """Mean squared error (``torch.nn.MSELoss``)."""
    def __init__(self, reduction: str = "mean"):
        super().__init__()
        self.reduction = reduction

    def forward(self, input, target):  # noqa: A002
        """The layer applied to its input (what calling the module does)."""
        return F.mse_loss(input, target, self.reduction)


class CrossEntropyLoss(Module):
    """Cross entropy of logits and class indices (``torch.nn.CrossEntropyLoss``)."""
    def __init__(self, reduction: str = "mean", ignore_index: int = -100,
                 label_smoothing: float = 0.0):
        super().__init__()
        self.reduction, self.ignore_index = reduction, ignore_index
        self.label_smoothing = label_smoothing

    def forward(self, input, target):  # noqa: A002
        """The layer applied to its input (what calling the module does)."""
        return F.cross_entropy(input, target, self.reduction, self.ignore_index,
                               self.label_smoothing)


class BCEWithLogitsLoss(MSELoss):
    """Binary cross entropy of logits, computed stably (``torch.nn.BCEWithLogitsLoss``)."""
    def forward(self, input, target):  # noqa: A002
        """The layer applied to its input (what calling the module does)."""
        return F.binary_cross_entropy_with_logits(input, target, self.reduction)
