"""tensordd.nn.normalization -- LayerNorm, BatchNorm1d and BatchNorm2d."""

from __future__ import annotations

import numpy as np

from ..session import default_session
from . import functional as F
from .module import Module, Parameter


class LayerNorm(Module):
    """Layer normalisation over the last dims, with an affine weight and bias
    (``torch.nn.LayerNorm``)."""
    def __init__(self, normalized_shape, eps: float = 1e-5, elementwise_affine: bool = True,
                 device=None):
        super().__init__()
        shape = (normalized_shape,) if isinstance(normalized_shape, int) \
            else tuple(normalized_shape)
        self.normalized_shape, self.eps = shape, eps
        if elementwise_affine:
            self.weight = Parameter(np.ones(shape, np.float32), device=device)
            self.bias = Parameter(np.zeros(shape, np.float32), device=device)
        else:
            self.weight = self.bias = None

    def forward(self, x):
        """The layer applied to its input (what calling the module does)."""
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self):
        """The layer's settings as repr shows them (torch's hook)."""
        return f"{self.normalized_shape}, eps={self.eps}"


class _BatchNorm(Module):
    """Batch normalisation over dim 1 (torch's _BatchNorm): an affine weight and bias, and
    running_mean, running_var and num_batches_tracked as buffers that train() mode updates
    (in place, in the daemon); eval() mode normalises with the running stats."""
    _dims = ()

    def __init__(self, num_features: int, eps: float = 1e-5, momentum=0.1, affine: bool = True,
                 track_running_stats: bool = True, device=None, dtype=None):
        super().__init__()
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        self.affine, self.track_running_stats = affine, track_running_stats
        dev = device or "cpu:0"
        if affine:
            self.weight = Parameter(np.ones(num_features, np.float32), device=dev)
            self.bias = Parameter(np.zeros(num_features, np.float32), device=dev)
        else:
            self.weight = self.bias = None
        if track_running_stats:
            s = default_session()
            self.register_buffer("running_mean", s.tensor(np.zeros(num_features, np.float32),
                                                          device=dev))
            self.register_buffer("running_var", s.tensor(np.ones(num_features, np.float32),
                                                         device=dev))
            self.register_buffer("num_batches_tracked", s.tensor(np.array(0, np.int64),
                                                                 device=dev))
            object.__setattr__(self, "_tracked", 0)  # num_batches_tracked's value, on the host
        else:
            self.register_buffer("running_mean", None)
            self.register_buffer("running_var", None)
            self.register_buffer("num_batches_tracked", None)
        if dtype is not None:
            self.to(dtype=dtype)

    def _set_buffer(self, name, value):
        super()._set_buffer(name, value)
        if name == "num_batches_tracked":
            object.__setattr__(self, "_tracked", int(np.asarray(_numpy(value))))
            object.__setattr__(self, "_nbt_at", self._tracked)

    def _sync_tracked(self):
        # num_batches_tracked counts on the host; its tensor is made when it is looked at
        nbt = self._buffers.get("num_batches_tracked")
        if nbt is not None and getattr(self, "_nbt_at", 0) != self._tracked:
            self._buffers["num_batches_tracked"] = nbt.session.tensor(
                np.array(self._tracked, np.int64), device=nbt.device)
            object.__setattr__(self, "_nbt_at", self._tracked)

    def __getattr__(self, name):
        if name == "num_batches_tracked":
            self._sync_tracked()
        return super().__getattr__(name)

    def named_buffers(self, prefix: str = ""):
        """(dotted name, Tensor) of every buffer here and below, as torch names them."""
        self._sync_tracked()
        return super().named_buffers(prefix)

    def _state_members(self, prefix):
        self._sync_tracked()
        return super()._state_members(prefix)

    def forward(self, x):
        """The layer applied to its input (what calling the module does)."""
        if len(x.shape) not in self._dims:
            raise ValueError(f"{type(self).__name__}: expected {' or '.join(map(str, self._dims))}"
                             f"-D input (got {len(x.shape)}-D input)")
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats:
            object.__setattr__(self, "_tracked", self._tracked + 1)
            if self.momentum is None:  # a cumulative moving average
                factor = 1.0 / self._tracked
        use_batch = self.training or self.running_mean is None
        track = not self.training or self.track_running_stats
        return F.batch_norm(x, self.running_mean if track else None,
                            self.running_var if track else None, self.weight, self.bias,
                            use_batch, factor, self.eps)

    def extra_repr(self):
        """The layer's settings as repr shows them (torch's hook)."""
        return f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, " \
               f"affine={self.affine}, track_running_stats={self.track_running_stats}"


def _numpy(value):
    return value.detach().cpu().numpy() if hasattr(value, "detach") else value


class BatchNorm1d(_BatchNorm):
    """Batch normalisation of [N, C] or [N, C, L] inputs (``torch.nn.BatchNorm1d``)."""
    _dims = (2, 3)


class BatchNorm2d(_BatchNorm):
    """Batch normalisation of [N, C, H, W] inputs (``torch.nn.BatchNorm2d``)."""
    _dims = (4,)
