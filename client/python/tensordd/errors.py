"""errors -- typed exceptions, one class per protobuf ErrorCode.

Every error the daemon answers becomes an instance of the subclass of
:class:`Error` for its code, with the typed detail as attributes. The classes
are generated from the ``ErrorCode`` enum of the wire contract, so a code
added to the .proto gets its class without anyone remembering to add it;
the ones with a typed detail are written out below for their docstrings.
"""

from __future__ import annotations

from . import tensordd_pb2 as pb
from .device import Device
from .dtypes import dtype_name

__all__ = ["Error"]  # + one class per ErrorCode, appended by _build_classes()


class Error(Exception):
    """An error answered by the daemon (or raised by the client for the session).

    Attributes:
        code: the ErrorCode name, e.g. ``"SHAPE_MISMATCH"``.
        request_id: the request that failed (0 for errors raised locally);
            it may precede the request whose reply carried the error.
        message: the daemon's message.
        call: a short description of the failing call (``"op matmul(#3, #4)"``),
            or None if the client no longer remembers it.
    """

    code = "UNKNOWN"

    def __init__(self, message: str = "", request_id: int = 0, call: str | None = None,
                 code: str | None = None):
        if code is not None:
            self.code = code
        self.message = message
        self.request_id = request_id
        self.call = call
        super().__init__(self._format())

    def _format(self) -> str:
        text = f"{self.code}: {self.message}" if self.message else self.code
        if self.call and self.request_id:
            text += f" [request #{self.request_id}: {self.call}]"
        elif self.call:
            text += f" [{self.call}]"
        elif self.request_id:
            text += f" [request #{self.request_id}]"
        return text

    def _set_detail(self, detail) -> None:
        """Copies the typed detail of the proto Error onto attributes."""


class _DevicePair(Error):
    """Shared by the backend and device mismatches."""

    target: Device | None = None
    grad: Device | None = None
    target_index = 0
    grad_index = 0

    def _set_detail(self, d) -> None:
        self.target = Device._from_proto(d.target)
        self.grad = Device._from_proto(d.grad)
        self.target_index = d.target_index
        self.grad_index = d.grad_index


class BackendMismatchError(_DevicePair):
    """Two tensors that had to share a backend do not.

    ``.target`` and ``.grad`` are the two :class:`Device` s: for grad_replace
    the target tensor's and the offered gradient's; for an op the first
    input's and the first disagreeing input's (``.target_index``/``.grad_index``).
    """


class DeviceMismatchError(_DevicePair):
    """Same backend, different device ordinals; ``.target``/``.grad`` as above."""


class DTypeMismatchError(Error):
    """Dtypes differ; ``.target`` and ``.grad`` are numpy dtype names."""

    target: str | None = None
    grad: str | None = None

    def _set_detail(self, d) -> None:
        self.target = dtype_name(d.target)
        self.grad = dtype_name(d.grad)


class ShapeMismatchError(Error):
    """Shapes differ; ``.expected`` and ``.got`` are tuples."""

    expected: tuple | None = None
    got: tuple | None = None

    def _set_detail(self, d) -> None:
        self.expected = tuple(d.expected)
        self.got = tuple(d.got)


class UnknownHandleError(Error):
    """The request named a handle the session does not hold; ``.handle``."""

    handle: int | None = None

    def _set_detail(self, d) -> None:
        self.handle = d.handle


class WrongHandleKindError(Error):
    """A handle of another kind was given (e.g. a tensor as Gradients).

    ``.handle``; ``.expected`` and ``.got`` are HandleKind names
    (``"HANDLE_GRADIENTS"``).
    """

    handle: int | None = None
    expected: str | None = None
    got: str | None = None

    def _set_detail(self, d) -> None:
        self.handle = d.handle
        self.expected = _enum_name(pb.HandleKind, d.expected)
        self.got = _enum_name(pb.HandleKind, d.got)


class PoisonedError(Error):
    """An input was produced by a failed request.

    ``.handle`` is the poisoned input, ``.origin_request`` the request that
    failed first and ``.origin_code`` its ErrorCode name.
    """

    handle: int | None = None
    origin_request: int | None = None
    origin_code: str | None = None

    def _set_detail(self, d) -> None:
        self.handle = d.handle
        self.origin_request = d.origin_request
        self.origin_code = _enum_name(pb.ErrorCode, d.origin_code)


class ResourceExhaustedError(Error):
    """A quota or cap was hit; ``.resource``, ``.requested``, ``.available``."""

    resource: str | None = None
    requested: int | None = None
    available: int | None = None

    def _set_detail(self, d) -> None:
        self.resource = d.resource
        self.requested = d.requested
        self.available = d.available


class VersionMismatchError(Error):
    """No common protocol version; ``.server_min`` and ``.server_max``."""

    server_min: int | None = None
    server_max: int | None = None

    def _set_detail(self, d) -> None:
        self.server_min = d.server_min
        self.server_max = d.server_max


class InvalidArgumentError(Error):
    """A bad attribute or field; ``.argument`` names it when the daemon knows."""

    argument: str | None = None

    def _set_detail(self, d) -> None:
        self.argument = d.argument


def _enum_name(enum, value: int) -> str:
    try:
        return enum.Name(value)
    except ValueError:
        return f"UNKNOWN({value})"


class DeviceError(Error):
    """A device fault other than running out of memory (DEVICE_ERROR): the message names
    the device's own error (a CUDA error's name, e.g. cudaErrorIllegalAddress). A fault that
    leaves the device unusable marks it failed (list_devices); later work on it is
    DEVICE_UNAVAILABLE."""


# Class names that plain CamelCase would spell differently.
_CLASS_NAMES = {
    "DTYPE_MISMATCH": "DTypeMismatchError",
    "UNSUPPORTED_DTYPE": "UnsupportedDTypeError",
    "PROTOCOL_ERROR": "ProtocolError",
    "IO": "IOFailureError",  # not IOError: that is a builtin alias of OSError
    "TIMEOUT": "TimedOutError",  # not TimeoutError: a builtin
    "CLOSED": "ConnectionClosedError",
    "DEVICE_ERROR": "DeviceError",
}


def _class_name(code: str) -> str:
    return _CLASS_NAMES.get(code) or "".join(w.capitalize() for w in code.split("_")) + "Error"


_MESSAGES = {
    "PROTOCOL_ERROR": "the byte stream broke the wire protocol",
    "FRAME_TOO_LARGE": "a frame exceeded the daemon's limits",
    "UNAUTHENTICATED": "missing or wrong token",
    "HANDLE_IN_USE": "a handle id was used twice",
    "IO": "an I/O error on the connection",
    "TIMEOUT": "a blocking call timed out",
    "CLOSED": "the connection is closed",
}


def _build_classes() -> dict:
    """{ErrorCode number: class} for every code but OK, creating missing classes."""
    defined = {c.__name__: c for c in globals().values()
               if isinstance(c, type) and issubclass(c, Error) and c is not Error}
    by_code = {}
    for name, number in pb.ErrorCode.items():
        if number == pb.OK:
            continue
        cls_name = _class_name(name)
        cls = defined.get(cls_name)
        if cls is None:
            doc = _MESSAGES.get(name, name.replace("_", " ").lower()).capitalize()
            cls = type(cls_name, (Error,), {"__doc__": f"{doc} ({name}).",
                                             "__module__": __name__})
            globals()[cls_name] = cls
        cls.code = name
        by_code[number] = cls
        __all__.append(cls_name)
    return by_code


_BY_CODE = _build_classes()
_BY_NAME = {cls.code: cls for cls in _BY_CODE.values()}

# The proto field of Error.detail that carries each class's typed detail.
_DETAIL_FIELDS = {
    "backend_mismatch", "device_mismatch", "dtype_mismatch", "shape_mismatch",
    "unknown_handle", "wrong_handle_kind", "poisoned", "resource_exhausted",
    "version_mismatch", "invalid_argument",
}


def error_class(code) -> type:
    """The Error subclass for a code (number or name); Error for unknown codes."""
    if isinstance(code, str):
        return _BY_NAME.get(code, Error)
    return _BY_CODE.get(code, Error)


def error_from_proto(err: "pb.Error", call: str | None = None) -> Error:
    """The typed exception for a protobuf Error."""
    cls = _BY_CODE.get(err.code, Error)
    code = None if cls is not Error else _enum_name(pb.ErrorCode, err.code)
    exc = cls.__new__(cls)
    which = err.WhichOneof("detail")
    if which in _DETAIL_FIELDS:
        exc._set_detail(getattr(err, which))
    Error.__init__(exc, err.message, err.request_id, call, code)
    return exc


def local_error(code: str, message: str, call: str | None = None) -> Error:
    """An error the client raises itself (I/O failure, timeout, closed session)."""
    return error_class(code)(message, 0, call)
