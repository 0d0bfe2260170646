"""device -- Device: a backend and an ordinal, written "cpu:0"."""

from __future__ import annotations

import re

from . import tensordd_pb2 as pb

__all__ = ["Device", "DeviceSpecError"]

_BACKEND = re.compile(r"^[a-z][a-z0-9_]*$")
# Names that are dtypes, not backends: "float8" must not become a device.
_DTYPE_LIKE = re.compile(r"^(u?int\d*|float\d*|bfloat\d*|complex\d*|bool|half|double|long|"
                         r"short|byte|char|cfloat|cdouble|qint\d*|quint\w*)$")
HINT = ("a device looks like 'cpu', 'cpu:1', 'ref:0', 'cuda:0' (or torch.device('cpu')); "
        "a dtype like 'float32', 'bfloat16', tensordd.float32, np.float64 or torch.float16")


class DeviceSpecError(TypeError, ValueError):
    """A device written wrongly: both a TypeError (as torch raises) and a ValueError."""


class Device:
    """A device of the daemon: ``backend:ordinal`` ("cpu:0", "ref:0", "cuda:1").

    Devices compare equal to each other and to their text form, so
    ``t.device == "cpu:1"`` works; they are immutable and hashable.
    """

    __slots__ = ("backend", "ordinal")

    def __init__(self, backend: str, ordinal: int = 0):
        if not isinstance(backend, str) or not _BACKEND.match(backend) \
                or _DTYPE_LIKE.match(backend):
            raise DeviceSpecError(f"invalid backend name {backend!r}: {HINT}")
        if int(ordinal) < 0:
            raise ValueError(f"invalid device ordinal {ordinal!r}")
        object.__setattr__(self, "backend", backend)
        object.__setattr__(self, "ordinal", int(ordinal))

    def __setattr__(self, name, value):
        raise AttributeError("Device is immutable")

    @classmethod
    def parse(cls, text) -> "Device":
        """A Device from "cpu:0" or "cpu" (ordinal 0); a Device is returned as is."""
        if isinstance(text, Device):
            return text
        t = type(text)
        if t.__name__ == "device" and t.__module__ == "torch":  # torch.device, torch not imported
            return cls(text.type, text.index or 0)
        if not isinstance(text, str):
            raise DeviceSpecError(f"expected a device, got {type(text).__name__} {text!r}: {HINT}")
        backend, sep, ordinal = text.partition(":")
        if sep and not ordinal.isdigit():
            raise DeviceSpecError(f"invalid device {text!r}: {HINT}")
        try:
            return cls(backend.strip(), int(ordinal) if sep else 0)
        except DeviceSpecError:
            raise DeviceSpecError(f"invalid device {text!r}: {HINT}") from None

    @classmethod
    def _from_proto(cls, d: "pb.Device") -> "Device":
        # What the daemon says is taken as it is (no validation of its names).
        dev = object.__new__(cls)
        object.__setattr__(dev, "backend", d.backend or "?")
        object.__setattr__(dev, "ordinal", int(d.ordinal))
        return dev

    def _to_proto(self, out: "pb.Device") -> None:
        out.backend = self.backend
        out.ordinal = self.ordinal

    def __str__(self) -> str:
        return f"{self.backend}:{self.ordinal}"

    def __repr__(self) -> str:
        return f"Device('{self}')"

    def __eq__(self, other) -> bool:
        if isinstance(other, str):
            try:
                other = Device.parse(other)
            except (TypeError, ValueError):
                return False
        if not isinstance(other, Device):
            return NotImplemented
        return self.backend == other.backend and self.ordinal == other.ordinal

    def __hash__(self) -> int:
        return hash(str(self))

    def __reduce__(self):
        return (Device, (self.backend, self.ordinal))
