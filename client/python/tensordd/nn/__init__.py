"""tensordd.nn -- a small torch.nn: Module, Parameter and the common layers.

A model written against ``torch.nn`` ports by changing its imports::

    import tensordd as torch            # or: from tensordd import nn, optim
    from tensordd import nn

    model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 3))

Parameters are created on the default session (the one :func:`tensordd.connect`
opened last) on ``cpu:0``; ``model.to(device)`` moves them. Initialisation
follows torch's distributions (kaiming-uniform weights, uniform biases) drawn
with numpy, so it is not bit-identical to torch's: load torch's weights with
``load_state_dict`` (torch tensors and numpy arrays are accepted) to compare.
"""

from __future__ import annotations

import math
from collections import OrderedDict

import numpy as np

from ..session import default_session
from ..tensor import Tensor
from . import functional  # noqa: F401
from . import functional as F

__all__ = ["Module", "Parameter", "Sequential", "ModuleList", "Linear", "Embedding",
           "LayerNorm", "Conv2d", "ReLU", "GELU", "SiLU", "Tanh", "Sigmoid", "LeakyReLU",
           "Identity", "Flatten", "Dropout", "Softmax", "LogSoftmax", "MaxPool2d", "AvgPool2d",
           "MSELoss", "CrossEntropyLoss", "BCEWithLogitsLoss", "functional", "init_seed",
           "BatchNorm1d", "BatchNorm2d", "AdaptiveAvgPool2d", "Conv1d", "ConvTranspose2d"]

_rng = np.random.default_rng(0)


def init_seed(seed: int) -> None:
    """Seeds the numpy generator the layers' initial values are drawn from."""
    global _rng
    _rng = np.random.default_rng(seed)


class Parameter(Tensor):
    """A leaf Tensor that requires grad and that Modules register as a parameter.

    ``Parameter(data)``: data is a tensordd Tensor (adopted if it is already a
    leaf that requires grad, else downloaded and uploaded again as one), a
    numpy array or a torch tensor (uploaded to the default session).
    """

    __slots__ = ()

    def __init__(self, data=None, requires_grad: bool = True, device=None):
        if isinstance(data, Tensor):
            # The daemon cannot turn a live tensor into a leaf: its values are
            # uploaded again (as torch's Parameter(t) would share them).
            session = data.session
            dt = data.dtype
            vals = data.float().numpy() if dt == "bfloat16" else data.numpy()
            src = session.tensor(vals, device=device or data.device, dtype=dt,
                                 requires_grad=requires_grad)
        else:
            session = default_session()
            src = session.tensor(data, device=device or "cpu:0", requires_grad=requires_grad)
        super().__init__(session, src._handle, src._shape, src._dtype, src._device,
                         bool(requires_grad), leaf=True)
        session.retain_grads = True
        src._session = None  # the handle is ours now

    def __repr__(self) -> str:
        return "Parameter containing:\n" + super().__repr__()

    __str__ = __repr__


def _uniform(shape, bound):
    return _rng.uniform(-bound, bound, size=shape).astype(np.float32)


class Module:
    """Base class of the layers, as torch.nn.Module: assign Parameters and
    Modules as attributes and they are registered; override ``forward``."""

    def __init__(self):
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "_buffers", OrderedDict())
        object.__setattr__(self, "training", True)

    def __setattr__(self, name, value):
        params = self.__dict__.get("_parameters")
        if params is None:
            raise AttributeError("call Module.__init__() before assigning attributes")
        if name in self.__dict__.get("_buffers", {}):
            self._buffers[name] = value
            return
        if isinstance(value, Parameter):
            params[name] = value
            self._modules.pop(name, None)
        elif isinstance(value, Module):
            self._modules[name] = value
            params.pop(name, None)
        elif name in params and value is None:
            params[name] = None
        else:
            params.pop(name, None)
            self._modules.pop(name, None)
            object.__setattr__(self, name, value)
            return
        self.__dict__.pop(name, None)

    def __getattr__(self, name):
        d = self.__dict__
        if name in d.get("_parameters", {}):
            return d["_parameters"][name]
        if name in d.get("_modules", {}):
            return d["_modules"][name]
        if name in d.get("_buffers", {}):
            return d["_buffers"][name]
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

    def register_parameter(self, name: str, param) -> None:
        """Registers param (a Parameter or None) under name."""
        self._parameters[name] = param

    def register_buffer(self, name: str, tensor, persistent: bool = True) -> None:
        """Registers tensor (a Tensor that is not a parameter: batch norm's running stats, or
        None) under name; state_dict holds it and ``to`` moves it."""
        self._buffers[name] = tensor

    def named_buffers(self, prefix: str = ""):
        """(dotted name, Tensor) of every buffer here and below, as torch names them."""
        for name, b in self._buffers.items():
            if b is not None:
                yield prefix + name, b
        for mname, m in self._modules.items():
            if m is not None:
                yield from m.named_buffers(prefix + mname + ".")

    def buffers(self, recurse: bool = True):
        """Every buffer here and below."""
        for _, b in self.named_buffers():
            yield b

    def _state_members(self, prefix):
        # torch's order: a module's parameters, its buffers, then its submodules'
        for name, p in self._parameters.items():
            yield prefix + name, p
        for name, b in self._buffers.items():
            if b is not None:
                yield prefix + name, b
        for mname, m in self._modules.items():
            if m is not None:
                yield from m._state_members(prefix + mname + ".")

    def add_module(self, name: str, module) -> None:
        """Registers module under name (as assigning it as an attribute does)."""
        self._modules[name] = module

    def forward(self, *args, **kwargs):
        """The computation; subclasses define it (``module(x)`` calls it)."""
        raise NotImplementedError(f"{type(self).__name__}.forward")

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def named_parameters(self, prefix: str = ""):
        """(dotted name, Parameter) of every parameter here and below, as torch names them."""
        seen = set()
        for name, p in self._named_members(prefix):
            if p is not None and id(p) not in seen:
                seen.add(id(p))
                yield name, p

    def _named_members(self, prefix):
        for name, p in self._parameters.items():
            yield prefix + name, p
        for mname, m in self._modules.items():
            if m is not None:
                yield from m._named_members(prefix + mname + ".")

    def parameters(self, recurse: bool = True):
        """Every Parameter here and below (each once), what optimizers take."""
        for _, p in self.named_parameters():
            yield p

    def children(self):
        """The direct submodules, in registration order."""
        return iter(m for m in self._modules.values() if m is not None)

    def modules(self):
        """This module and every submodule below it, depth first."""
        yield self
        for m in self.children():
            yield from m.modules()

    def train(self, mode: bool = True):
        """Sets training mode (Dropout active) here and below; returns self."""
        for m in self.modules():
            object.__setattr__(m, "training", bool(mode))
        return self

    def eval(self):
        """Sets evaluation mode (Dropout off) here and below; returns self."""
        return self.train(False)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Forgets the session's gradients (see :meth:`Session.zero_grad`)."""
        for p in self.parameters():
            p.session.zero_grad(set_to_none)
            return

    def state_dict(self) -> "OrderedDict":
        """{name: Tensor} of the parameters and buffers (handles; ``.numpy()`` downloads)."""
        return OrderedDict(self._state_members(""))

    def load_state_dict(self, state, strict: bool = True):
        """Sets the parameters from {name: values}: tensordd Tensors, numpy arrays
        or torch tensors (a torch state_dict loads as is). The values are uploaded
        as a new leaf that the same Parameter object then names (as torch copies in
        place): an optimizer made before keeps optimizing it, state included."""
        own = dict(self._named_members(""))
        bufs = dict(self.named_buffers())
        missing = [k for k in list(own) + list(bufs) if k not in state]
        unexpected = [k for k in state if k not in own and k not in bufs]
        if strict and (missing or unexpected):
            raise KeyError(f"load_state_dict: missing {missing}, unexpected {unexpected}")
        for name, value in state.items():
            if name not in own and name not in bufs:
                continue
            mod = self
            *path, leaf = name.split(".")
            for part in path:
                mod = mod._modules[part]
            if isinstance(value, Tensor):
                value = value.numpy()
            if name in bufs:
                mod._set_buffer(leaf, value)
                continue
            old = own[name]
            new = Parameter(_host(value), requires_grad=old.requires_grad if old is not None
                            else True, device=old.device if old is not None else None)
            if old is not None and tuple(new.shape) != tuple(old.shape):
                raise ValueError(f"load_state_dict: {name} has shape {tuple(new.shape)}, "
                                 f"the parameter {tuple(old.shape)}")
            if old is not None and old._session is new._session:
                _rebind(old, new)  # as torch's in-place copy
            else:
                mod._parameters[leaf] = new
        return missing, unexpected

    def to(self, device=None, dtype=None):
        """Moves (and/or casts) every parameter, in place as torch's: each Parameter
        object names a new leaf with the moved values (an optimizer made before keeps
        optimizing it and moves its state along at its next call); returns self."""
        for m in self.modules():
            for name, b in list(m._buffers.items()):
                if b is not None:  # floats follow dtype; integer buffers keep theirs
                    bt = dtype if b.is_floating_point() else None
                    m._buffers[name] = b.to(device=device, dtype=bt)
            for name, p in list(m._parameters.items()):
                if p is None:
                    continue
                moved = p.detach().to(device=device, dtype=dtype)
                if moved is p or (moved._handle == p._handle):
                    continue
                _rebind(p, Parameter(moved, requires_grad=p.requires_grad))
        return self

    def cpu(self):
        """Moves every parameter to cpu:0 (see :meth:`to`); returns self."""
        return self.to("cpu:0")

    def float(self):
        """Casts every parameter to float32 (see :meth:`to`); returns self."""
        return self.to(dtype="float32")

    def double(self):
        """Casts every parameter to float64 (see :meth:`to`); returns self."""
        return self.to(dtype="float64")

    def extra_repr(self) -> str:
        """The layer's settings as repr shows them (torch's hook)."""
        return ""

    def _set_buffer(self, name, value):
        old = self._buffers[name]
        self._buffers[name] = old.session.tensor(_host(value), device=old.device,
                                                 dtype=old.dtype)

    def __repr__(self) -> str:
        lines = [f"({k}): {m!r}".replace("\n", "\n  ") for k, m in self._modules.items()]
        head = f"{type(self).__name__}({self.extra_repr()}"
        return head + ")" if not lines else head + "\n  " + "\n  ".join(lines) + "\n)"


def _rebind(old: Tensor, new: Tensor) -> None:
    """The Parameter object old (held by optimizers) names new's handle and values from
    now on, as after torch's in-place copy; an optimizer made before moves its daemon
    state over at its next call (Optimizer._sync_params). new is used up."""
    old._session._release_later(old._handle)
    old._handle = new._handle
    old._shape, old._dtype, old._device = new._shape, new._dtype, new._device
    old._requires_grad = new._requires_grad
    old._grad = new._grad
    new._session = None  # its handle is old's now


def _host(value):
    """numpy values of a numpy array, list or torch tensor (torch dtype kept via Session.tensor)."""
    return value


class Sequential(Module):
    """Modules applied in order, each to the previous one's output (``torch.nn.Sequential``)."""
    def __init__(self, *modules):
        super().__init__()
        if len(modules) == 1 and isinstance(modules[0], (dict, OrderedDict)):
            for k, m in modules[0].items():
                self.add_module(k, m)
        else:
            for i, m in enumerate(modules):
                self.add_module(str(i), m)

    def forward(self, x):
        """The layer applied to its input (what calling the module does)."""
        for m in self._modules.values():
            x = m(x)
        return x

    def __getitem__(self, i):
        return list(self._modules.values())[i]

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())


class ModuleList(Module):
    """A list of modules whose parameters the owner registers (``torch.nn.ModuleList``)."""
    def __init__(self, modules=()):
        super().__init__()
        for m in modules:
            self.append(m)

    def append(self, m):
        """Adds module at the end; returns self."""
        self.add_module(str(len(self._modules)), m)
        return self

    def __getitem__(self, i):
        return list(self._modules.values())[i]

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())


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


class Embedding(Module):
    """A lookup table (num_embeddings, embedding_dim) drawn from N(0, 1); ``padding_idx``'s
    row starts at zero and gets no gradient; ``max_norm`` as :func:`F.embedding`."""

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx=None,
                 max_norm=None, norm_type=2.0, scale_grad_by_freq=False, sparse=False,
                 device=None):
        super().__init__()
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        if padding_idx is not None and padding_idx < 0:
            padding_idx += num_embeddings
        if padding_idx is not None and not 0 <= padding_idx < num_embeddings:
            raise ValueError(f"Embedding: padding_idx {padding_idx} is not a row")
        if scale_grad_by_freq or sparse:
            raise NotImplementedError("Embedding: scale_grad_by_freq and sparse are not "
                                      "supported")
        self.padding_idx, self.max_norm, self.norm_type = padding_idx, max_norm, norm_type
        w = _rng.standard_normal((num_embeddings, embedding_dim)).astype(np.float32)
        if padding_idx is not None:
            w[padding_idx] = 0
        self.weight = Parameter(w, device=device)

    def forward(self, idx):
        """The layer applied to its input (what calling the module does)."""
        return F.embedding(idx, self.weight, padding_idx=self.padding_idx,
                           max_norm=self.max_norm, norm_type=self.norm_type)

    def extra_repr(self):
        """The layer's settings as repr shows them (torch's hook)."""
        return f"{self.num_embeddings}, {self.embedding_dim}"


class EmbeddingBag(Module):
    """Bags of embedding rows reduced by sum, mean or max (``torch.nn.EmbeddingBag``);
    the table drawn from N(0, 1), ``padding_idx``'s row zero."""

    def __init__(self, num_embeddings: int, embedding_dim: int, mode: str = "mean",
                 include_last_offset: bool = False, padding_idx=None, device=None):
        super().__init__()
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.mode, self.include_last_offset = mode, include_last_offset
        if padding_idx is not None and padding_idx < 0:
            padding_idx += num_embeddings
        self.padding_idx = padding_idx
        w = _rng.standard_normal((num_embeddings, embedding_dim)).astype(np.float32)
        if padding_idx is not None:
            w[padding_idx] = 0
        self.weight = Parameter(w, device=device)

    def forward(self, input, offsets=None, per_sample_weights=None):  # noqa: A002
        """The layer applied to its input (what calling the module does)."""
        return F.embedding_bag(input, self.weight, offsets, mode=self.mode,
                               per_sample_weights=per_sample_weights,
                               include_last_offset=self.include_last_offset,
                               padding_idx=self.padding_idx)

    def extra_repr(self):
        """The layer's settings as repr shows them (torch's hook)."""
        return f"{self.num_embeddings}, {self.embedding_dim}, mode={self.mode!r}"


__all__ += ["EmbeddingBag"]


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


class Identity(Module):
    """Returns its input (``torch.nn.Identity``)."""
    def forward(self, x):
        """The layer applied to its input (what calling the module does)."""
        return x


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


class Flatten(Module):
    """Flattens dims start_dim..end_dim (``torch.nn.Flatten``)."""
    def __init__(self, start_dim: int = 1, end_dim: int = -1):
        super().__init__()
        self.start_dim, self.end_dim = start_dim, end_dim

    def forward(self, x):
        """The layer applied to its input (what calling the module does)."""
        return x.flatten(self.start_dim, self.end_dim)


class Dropout(Module):
    """Dropout in train() mode, the identity in eval() mode."""

    def __init__(self, p: float = 0.5, inplace: bool = False):
        super().__init__()
        self.p = p

    def forward(self, x):
        """The layer applied to its input (what calling the module does)."""
        return F.dropout(x, self.p, self.training)


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


__all__ += ["Upsample"]


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


__all__ += ["MaxPool1d", "AvgPool1d"]


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


class AdaptiveAvgPool2d(Module):
    """Adaptive 2-D average pooling to output_size (``torch.nn.AdaptiveAvgPool2d``)."""
    def __init__(self, output_size):
        super().__init__()
        self.output_size = output_size

    def forward(self, x):
        """The layer applied to its input (what calling the module does)."""
        return F.adaptive_avg_pool2d(x, self.output_size)
