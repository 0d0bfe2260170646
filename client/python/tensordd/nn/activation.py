"""tensordd.nn.activation -- The activations: ReLU, GELU, SiLU, Tanh, Sigmoid, LeakyReLU, Softmax, LogSoftmax."""

from __future__ import annotations

from . import functional as F
from .module import Module


class _Act(Module):
    fn = None

    def forward(self, x):
        return type(self).fn(x)


class ReLU(_Act):
    """ReLU activation (``torch.nn.ReLU``)."""
    def __init__(self, inplace: bool = False):
        super().__init__()

    fn = staticmethod(F.relu)


class GELU(_Act):
    """GELU activation (``torch.nn.GELU``)."""
    fn = staticmethod(F.gelu)


class SiLU(_Act):
    """SiLU activation (``torch.nn.SiLU``)."""
    fn = staticmethod(F.silu)


class Tanh(_Act):
    """Tanh activation (``torch.nn.Tanh``)."""
    fn = staticmethod(F.tanh)


class Sigmoid(_Act):
    """Sigmoid activation (``torch.nn.Sigmoid``)."""
    fn = staticmethod(F.sigmoid)


class LeakyReLU(Module):
    """Leaky ReLU activation (``torch.nn.LeakyReLU``)."""
    def __init__(self, negative_slope: float = 0.01, inplace: bool = False):
        super().__init__()
        self.negative_slope = negative_slope

    def forward(self, x):
        """The layer applied to its input (what calling the module does)."""
        return F.leaky_relu(x, self.negative_slope)


class Softmax(Module):
    """Softmax along dim (``torch.nn.Softmax``)."""
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        """The layer applied to its input (what calling the module does)."""
        return x.softmax(self.dim)


class LogSoftmax(Softmax):
    """Log-softmax along dim (``torch.nn.LogSoftmax``)."""
    def forward(self, x):
        """The layer applied to its input (what calling the module does)."""
        return x.log_softmax(self.dim)
