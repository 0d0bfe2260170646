"""tensordd.nn.upsampling -- Upsample."""

from __future__ import annotations

from . import functional as F
from .module import Module


class Upsample(Module):
    """F.interpolate as a layer (``torch.nn.Upsample``): size or scale_factor, mode nearest,
    linear or bilinear, align_corners for the linear modes."""

    def __init__(self, size=None, scale_factor=None, mode: str = "nearest", align_corners=None):
        super().__init__()
        self.size, self.scale_factor = size, scale_factor
        self.mode, self.align_corners = mode, align_corners

    def forward(self, x):
        """The layer applied to its input (what calling the module does)."""
        return F.interpolate(x, self.size, self.scale_factor, self.mode, self.align_corners)

    def extra_repr(self):
        """The layer's settings as repr shows them (torch's hook)."""
        what = f"size={self.size}" if self.size is not None else \
            f"scale_factor={self.scale_factor}"
        return f"{what}, mode={self.mode!r}"
