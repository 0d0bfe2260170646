"""tensordd.nn.flatten -- Flatten."""

from __future__ import annotations

from .module import Module


class Flatten(Module):
    """Flattens dims start_dim..end_dim (``torch.nn.Flatten``)."""
    def __init__(self, start_dim: int = 1, end_dim: int = -1):
        super().__init__()
        self.start_dim, self.end_dim = start_dim, end_dim

    def forward(self, x):
        """The layer applied to its input (what calling the module does)."""
        return x.flatten(self.start_dim, self.end_dim)
