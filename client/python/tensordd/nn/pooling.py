"""tensordd.nn.pooling -- MaxPool1d/2d, AvgPool1d/2d and AdaptiveAvgPool2d."""

from __future__ import annotations

from . import functional as F
from .module import Module


class MaxPool2d(Module):
    """2-D max pooling (``torch.nn.MaxPool2d``)."""
    def __init__(self, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False):
        super().__init__()
        self.args = (kernel_size, stride, padding, dilation, ceil_mode)

    def forward(self, x):
        """The layer applied to its input (what calling the module does)."""
        return F.max_pool2d(x, *self.args)


class AvgPool2d(Module):
    """2-D average pooling (``torch.nn.AvgPool2d``)."""
    def __init__(self, kernel_size, stride=None, padding=0):
        super().__init__()
        self.args = (kernel_size, stride, padding)

    def forward(self, x):
        """The layer applied to its input (what calling the module does)."""
        return F.avg_pool2d(x, *self.args)


class MaxPool1d(Module):
    """1-D max pooling (``torch.nn.MaxPool1d``)."""
    def __init__(self, kernel_size, stride=None, padding=0, dilation=1, return_indices=False,
                 ceil_mode=False):
        super().__init__()
        self.args = (kernel_size, stride, padding, dilation, ceil_mode, return_indices)

    def forward(self, x):
        """The layer applied to its input (what calling the module does)."""
        return F.max_pool1d(x, *self.args)


class AvgPool1d(Module):
    """1-D average pooling (``torch.nn.AvgPool1d``)."""
    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode=False,
                 count_include_pad=True):
        super().__init__()
        self.args = (kernel_size, stride, padding, ceil_mode, count_include_pad)

    def forward(self, x):
        """The layer applied to its input (what calling the module does)."""
        return F.avg_pool1d(x, *self.args)


class AdaptiveAvgPool2d(Module):
    """Adaptive 2-D average pooling to output_size (``torch.nn.AdaptiveAvgPool2d``)."""
    def __init__(self, output_size):
        super().__init__()
        self.output_size = output_size

    def forward(self, x):
        """The layer applied to its input (what calling the module does)."""
        return F.adaptive_avg_pool2d(x, self.output_size)
