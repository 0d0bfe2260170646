"""tensordd.nn.linear -- Linear and Identity."""

from __future__ import annotations

import math

from . import functional as F
from .module import Module, Parameter, _uniform


class Linear(Module):
    """y = x W^T + b; W (out, in) and b (out,) drawn from U(-1/sqrt(in), 1/sqrt(in))."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None,
                 dtype=None):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        bound = 1 / math.sqrt(in_features) if in_features else 0
        self.weight = Parameter(_uniform((out_features, in_features), bound), device=device)
        self.bias = Parameter(_uniform((out_features,), bound), device=device) if bias else None
        if dtype is not None:
            self.to(dtype=dtype)

    def forward(self, x):
        """The layer applied to its input (what calling the module does)."""
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self):
        """The layer's settings as repr shows them (torch's hook)."""
        return f"in_features={self.in_features}, out_features={self.out_features}, " \
               f"bias={self.bias is not None}"


class Identity(Module):
    """Returns its input (``torch.nn.Identity``)."""
    def forward(self, x):
        """The layer applied to its input (what calling the module does)."""
        return x
