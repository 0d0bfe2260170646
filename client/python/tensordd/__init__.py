"""tensordd -- the Python client of the tensordd remote tensor daemon.

    import numpy as np
    import tensordd

    with tensordd.connect("tcp://127.0.0.1:7070") as s:
        a = s.tensor(np.ones((2, 3), np.float32))
        b = s.tensor(np.arange(6, dtype=np.float32).reshape(3, 2))
        print((a @ b).relu().numpy())

Ops are asynchronous: they return a Tensor at once and errors surface at the
next synchronising call (numpy(), sync(), backward(), ...) as a typed
:class:`tensordd.Error` naming the call that failed.

The session last opened by :func:`connect` (or entered with ``with``) is the
*default session*: the module-level calls (``tensordd.tensor``,
``tensordd.zeros``, ``tensordd.no_grad``, ... and :mod:`tensordd.nn`'s layers)
run on it, so torch code that keeps to tensordd's ops ports with its imports
changed and a session opened (in-place updates of parameters outside the
optimizers, and ops the daemon lacks, need edits)."""

import os as _os
import pkgutil as _pkgutil


def _find_generated():
    """Makes ``tensordd.tensordd_pb2`` importable.

    An installed package (``pip install ./client/python``) holds it: protoc wrote it
    into the build at install time. From the source tree, ``make`` writes it into the
    build directory (``$(BUILD)/python/tensordd/``), never into client/python: the
    package then takes in every ``tensordd/`` directory on sys.path
    (``PYTHONPATH=client/python:build/py/python``), and, failing that, the default
    build directory's (``build/python``).
    """
    global __path__
    __path__ = _pkgutil.extend_path(__path__, __name__)
    if any(_os.path.isfile(_os.path.join(d, "tensordd_pb2.py")) for d in __path__):
        return
    tree = _os.path.join(_os.path.dirname(_os.path.abspath(__file__)), "..", "..", "..",
                         "build", "python", "tensordd")
    if _os.path.isfile(_os.path.join(tree, "tensordd_pb2.py")):
        __path__.append(_os.path.normpath(tree))
        return
    raise ImportError(
        "tensordd: the generated module tensordd_pb2 is missing. Install the package "
        "(pip install ./client/python generates it), or, in the source tree, run make and "
        "put its build directory on the path: PYTHONPATH=client/python:build/python "
        "(make BUILD=DIR: DIR/python)", name="tensordd.tensordd_pb2")


_find_generated()

from . import errors as _errors  # noqa: E402 (after the generated module is found)
from .autograd import Gradients  # noqa: E402
from .device import Device, DeviceSpecError
from .dtypes import DTYPES as _DTYPES
from .dtypes import DType
from .errors import Error, error_class  # noqa: F401 (re-exported)
from .session import (DEFAULT_ENDPOINT, PROTOCOL_VERSION, Session, connect, default_session,
                      set_default_session)
from .tensor import Tensor
from .multi import MultiSession, connect_many  # noqa: E402 (after session and tensor)
from . import optim  # noqa: E402 (after Tensor: optim imports it)
from . import nn  # noqa: E402,F401 (torch.nn's place: tensordd.nn after `import tensordd`)
from . import parallel  # noqa: E402,F401 (tensordd.parallel after `import tensordd`)

from ._version import __version__  # noqa: E402,F401

# One exception class per wire ErrorCode (generated from the .proto enum).
for _name in _errors.__all__:
    globals()[_name] = getattr(_errors, _name)

# The dtypes as module attributes: tensordd.float32 == "float32".
float32 = _DTYPES["float32"]
float64 = _DTYPES["float64"]
float16 = _DTYPES["float16"]
bfloat16 = _DTYPES["bfloat16"]
int32 = _DTYPES["int32"]
int64 = _DTYPES["int64"]
int16 = _DTYPES["int16"]
int8 = _DTYPES["int8"]
uint8 = _DTYPES["uint8"]
bool = _DTYPES["bool"]  # noqa: A001 (torch's name)
float = float32  # noqa: A001 (torch's aliases)
double = float64
half = float16
long = int64
int = int32  # noqa: A001
short = int16


# ---- module-level calls on the default session (torch's spelling)

def tensor(data, dtype=None, device="cpu:0", requires_grad=None) -> Tensor:
    """:meth:`Session.tensor` on the default session (``torch.tensor``); a
    tensor that requires grad switches the session to the torch idiom
    (``retain_grads``: backward() fills ``.grad``)."""
    s = default_session()
    t = s.tensor(data, device=device, requires_grad=requires_grad, dtype=dtype)
    if t._requires_grad:
        s.retain_grads = True
    return t


def as_tensor(data, dtype=None, device="cpu:0") -> Tensor:
    """data itself if it is already a Tensor of that dtype/device, else an upload."""
    if isinstance(data, Tensor):
        return data.to(device=device if device != "cpu:0" else None, dtype=dtype)
    return tensor(data, dtype=dtype, device=device)


def from_numpy(array) -> Tensor:
    """An upload of a numpy array, its dtype kept (``torch.from_numpy``), on the default session."""
    return default_session().tensor(array)


def zeros(*shape, dtype=None, device=None, requires_grad=False) -> Tensor:
    """``torch.zeros`` on the default session (see the :class:`Session` method of the same name)."""
    return default_session().zeros(*shape, dtype=dtype, device=device,
                                   requires_grad=requires_grad)


def ones(*shape, dtype=None, device=None, requires_grad=False) -> Tensor:
    """``torch.ones`` on the default session (see the :class:`Session` method of the same name)."""
    return default_session().ones(*shape, dtype=dtype, device=device,
                                  requires_grad=requires_grad)


def full(shape, fill_value, dtype=None, device=None, requires_grad=False) -> Tensor:
    """``torch.full`` on the default session (see the :class:`Session` method of the same name)."""
    return default_session().full(shape, fill_value, dtype=dtype, device=device,
                                  requires_grad=requires_grad)


def randn(*shape, dtype=None, device=None, requires_grad=False) -> Tensor:
    """``torch.randn`` on the default session (see the :class:`Session` method of the same name)."""
    return default_session().randn(*shape, dtype=dtype, device=device,
                                   requires_grad=requires_grad)


def rand(*shape, dtype=None, device=None, requires_grad=False) -> Tensor:
    """``torch.rand`` on the default session (see the :class:`Session` method of the same name)."""
    return default_session().rand(*shape, dtype=dtype, device=device,
                                  requires_grad=requires_grad)


def multinomial(input, num_samples: int, replacement: bool = False) -> Tensor:  # noqa: A002
    """``torch.multinomial``: see :meth:`Tensor.multinomial`."""
    return input.multinomial(num_samples, replacement)


def arange(start, end=None, step=1, dtype=None, device=None, requires_grad=False) -> Tensor:
    """``torch.arange`` on the default session (see the :class:`Session` method of the same name).
    """
    return default_session().arange(start, end, step, dtype=dtype, device=device,
                                    requires_grad=requires_grad)


def cat(tensors, dim: int = 0) -> Tensor:
    """``torch.cat`` on the default session (see the :class:`Session` method of the same name)."""
    tensors = list(tensors)
    return tensors[0].session.cat(tensors, dim)


def stack(tensors, dim: int = 0) -> Tensor:
    """``torch.stack`` on the default session (see the :class:`Session` method of the same name)."""
    tensors = list(tensors)
    return tensors[0].session.stack(tensors, dim)


def where(condition: Tensor, input: Tensor, other: Tensor) -> Tensor:  # noqa: A002
    """``torch.where`` on the default session (see the :class:`Session` method of the same name)."""
    return input.where(condition, other)


def no_grad():
    """``with tensordd.no_grad():`` -- :meth:`Session.no_grad` of the default session."""
    return default_session().no_grad()


def set_grad_enabled(enabled):
    """Turns autodiff recording on or off for the default session (``torch.set_grad_enabled``):
    at once, and, used as ``with tensordd.set_grad_enabled(False):``, until the block ends."""
    return default_session().set_grad_enabled(enabled)


def is_grad_enabled():
    """Whether the default session records ops for autodiff (``torch.is_grad_enabled``)."""
    return default_session().grad_enabled


def device(spec) -> Device:
    """A :class:`Device` from ``"cpu:1"`` (torch's ``torch.device``)."""
    return Device.parse(spec)


def is_tensor(x) -> "bool":
    """Whether obj is a tensordd Tensor (``torch.is_tensor``)."""
    return isinstance(x, Tensor)


from . import nn  # noqa: E402 (uses the calls above)
from ._einsum import einsum  # noqa: E402 (torch.einsum, planned as the ops)

__all__ = ["connect", "Session", "Tensor", "Device", "DeviceSpecError", "DType", "Gradients",
           "optim", "nn", "error_class", "PROTOCOL_VERSION", "DEFAULT_ENDPOINT",
           "default_session", "set_default_session", "tensor", "as_tensor", "from_numpy",
           "zeros", "ones", "full", "randn", "rand", "arange", "cat", "stack", "where",
           "multinomial",
           "no_grad", "set_grad_enabled", "is_grad_enabled", "device", "is_tensor",
           "float32", "float64", "float16", "bfloat16", "int32", "int64", "int16", "int8",
           "uint8", "bool",
           *_errors.__all__]
__all__ += ["einsum"]
del _name
