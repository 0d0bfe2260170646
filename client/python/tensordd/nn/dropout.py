"""tensordd.nn.dropout -- Dropout."""

from __future__ import annotations

from . import functional as F
from .module import Module


class Dropout(Module):
    """Dropout in train() mode, the identity in eval() mode."""

    def __init__(self, p: float = 0.5, inplace: bool = False):
        super().__init__()
        self.p = p

    def forward(self, x):
        """The layer applied to its input (what calling the module does)."""
        return F.dropout(x, self.p, self.training)
