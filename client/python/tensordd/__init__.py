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
"""

from . import errors as _errors
from . import optim
from .autograd import Gradients
from .device import Device
from .errors import Error, error_class  # noqa: F401 (re-exported)
from .session import PROTOCOL_VERSION, Session, connect
from .tensor import Tensor

__version__ = "0.1.0"

# One exception class per wire ErrorCode (generated from the .proto enum).
for _name in _errors.__all__:
    globals()[_name] = getattr(_errors, _name)

__all__ = ["connect", "Session", "Tensor", "Device", "Gradients", "optim", "error_class",
           "PROTOCOL_VERSION", *_errors.__all__]
del _name
