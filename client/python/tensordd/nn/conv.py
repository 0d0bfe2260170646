"""tensordd.nn.conv -- Conv1d, Conv2d and ConvTranspose2d."""

from __future__ import annotations

import math

from . import functional as F
from .module import Module, Parameter, _uniform


class Conv2d(Module):
    """2-D convolution with stride, padding, dilation and groups (``torch.nn.Conv2d``); weights
    drawn as torch's default (kaiming uniform)."""
    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1,
                 groups=1, bias=True, device=None):
        super().__init__()
        kh, kw = F._pair(kernel_size)
        self.in_channels, self.out_channels = in_channels, out_channels
        self.kernel_size, self.stride, self.padding = (kh, kw), stride, padding
        self.dilation, self.groups = dilation, groups
        fan_in = in_channels // groups * kh * kw
        bound = 1 / math.sqrt(fan_in) if fan_in else 0
        self.weight = Parameter(_uniform((out_channels, in_channels // groups, kh, kw), bound),
                                device=device)
        self.bias = Parameter(_uniform((out_channels,), bound), device=device) if bias else None

    def forward(self, x):
        """The layer applied to its input (what calling the module does)."""
        return F.conv2d(x, self.weight, self.bias, self.stride, self.padding, self.dilation,
                        self.groups)

    def extra_repr(self):
        """The layer's settings as repr shows them (torch's hook)."""
        return f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, " \
               f"stride={self.stride}, padding={self.padding}"


class Conv1d(Module):
    """1-D convolution with stride, padding ("same", "valid" too), dilation and groups
    (``torch.nn.Conv1d``); weights drawn as torch's default (kaiming uniform)."""
    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1,
                 groups=1, bias=True, device=None):
        super().__init__()
        k = F._single(kernel_size)
        self.in_channels, self.out_channels = in_channels, out_channels
        self.kernel_size, self.stride, self.padding = (k,), stride, padding
        self.dilation, self.groups = dilation, groups
        fan_in = in_channels // groups * k
        bound = 1 / math.sqrt(fan_in) if fan_in else 0
        self.weight = Parameter(_uniform((out_channels, in_channels // groups, k), bound),
                                device=device)
        self.bias = Parameter(_uniform((out_channels,), bound), device=device) if bias else None

    def forward(self, x):
        """The layer applied to its input (what calling the module does)."""
        return F.conv1d(x, self.weight, self.bias, self.stride, self.padding, self.dilation,
                        self.groups)

    def extra_repr(self):
        """The layer's settings as repr shows them (torch's hook)."""
        return f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, " \
               f"stride={self.stride}, padding={self.padding}"


class ConvTranspose2d(Module):
    """2-D transposed convolution with stride, padding, output_padding, groups and dilation
    (``torch.nn.ConvTranspose2d``); weight [in, out/groups, kh, kw] drawn as torch's default."""
    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0,
                 output_padding=0, groups=1, bias=True, dilation=1, device=None):
        super().__init__()
        kh, kw = F._pair(kernel_size)
        self.in_channels, self.out_channels = in_channels, out_channels
        self.kernel_size, self.stride, self.padding = (kh, kw), stride, padding
        self.output_padding, self.groups, self.dilation = output_padding, groups, dilation
        fan_in = out_channels // groups * kh * kw  # torch's: weight.size(1) * kernel
        bound = 1 / math.sqrt(fan_in) if fan_in else 0
        self.weight = Parameter(_uniform((in_channels, out_channels // groups, kh, kw), bound),
                                device=device)
        self.bias = Parameter(_uniform((out_channels,), bound), device=device) if bias else None

    def forward(self, x):
        """The layer applied to its input (what calling the module does)."""
        return F.conv_transpose2d(x, self.weight, self.bias, self.stride, self.padding,
                                  self.output_padding, self.groups, self.dilation)

    def extra_repr(self):
        """The layer's settings as repr shows them (torch's hook)."""
        return f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, " \
               f"stride={self.stride}"
