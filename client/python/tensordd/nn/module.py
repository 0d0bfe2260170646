"""tensordd.nn.module -- Module, Parameter and the containers (Sequential, ModuleList);
the generator the layers' initial values are drawn from (init_seed)."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from ..session import default_session
from ..tensor import Tensor


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


def _normal(shape):
    return _rng.standard_normal(shape).astype(np.float32)


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
