"""device -- Device: a backend and an ordinal, written "cpu:0"."""

from __future__ import annotations

from . import tensordd_pb2 as pb

__all__ = ["Device"]


class Device:
    """A device of the daemon: ``backend:ordinal`` ("cpu:0", "ref:0", "cuda:1").

    Devices compare equal to each other and to their text form, so
    ``t.device == "cpu:1"`` works; they are immutable and hashable.
    """

    __slots__ = ("backend", "ordinal")

    def __init__(self, backend: str, ordinal: int = 0):
        if not backend or ":" in backend:
            raise ValueError(f"invalid backend name {backend!r}")
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
        if not isinstance(text, str):
            raise TypeError(f"expected a device such as 'cpu:0', got {type(text).__name__}")
        backend, sep, ordinal = text.partition(":")
        if sep and not ordinal.isdigit():
            raise ValueError(f"invalid device {text!r}: expected BACKEND:ORDINAL such as 'cpu:0'")
        return cls(backend.strip(), int(ordinal) if sep else 0)

    @classmethod
    def _from_proto(cls, d: "pb.Device") -> "Device":
        return cls(d.backend or "?", d.ordinal)

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
            except ValueError:
                return False
        if not isinstance(other, Device):
            return NotImplemented
        return self.backend == other.backend and self.ordinal == other.ordinal

    def __hash__(self) -> int:
        return hash(str(self))

    def __reduce__(self):
        return (Device, (self.backend, self.ordinal))
