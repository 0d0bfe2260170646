"""dtypes -- the wire DType enum, our dtype names, numpy's and torch's, all ways.

A dtype is written as our name (``"float32"``), a module attribute
(``tensordd.float32``, a :class:`DType`, which is a ``str`` and compares equal
to its name), a numpy dtype or type (``np.float64``), a Python type
(``float``: float64 as numpy says, ``int``, ``bool``) or a torch dtype
(``torch.bfloat16``; recognised without importing torch).
"""

from __future__ import annotations

import numpy as np

from . import tensordd_pb2 as pb

__all__ = ["DType", "dtype_name", "to_wire", "to_numpy", "canonical_name", "is_dtype_like",
           "DTYPES", "f32_to_bf16_bits", "bf16_bits_to_f32"]

# Wire dtype -> name. bfloat16 has no numpy dtype: it travels as uint16 bit
# patterns and is widened to float32 on download.
_NAMES = {
    pb.DTYPE_F32: "float32",
    pb.DTYPE_F64: "float64",
    pb.DTYPE_F16: "float16",
    pb.DTYPE_BF16: "bfloat16",
    pb.DTYPE_I32: "int32",
    pb.DTYPE_I64: "int64",
    pb.DTYPE_BOOL: "bool",
    pb.DTYPE_U8: "uint8",
    pb.DTYPE_I8: "int8",
    pb.DTYPE_I16: "int16",
}
_WIRE = {name: code for code, name in _NAMES.items()}
_ITEMSIZE = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2, "int32": 4, "int64": 8,
             "bool": 1, "uint8": 1, "int8": 1, "int16": 2}


class DType(str):
    """A tensordd dtype: ``tensordd.float32`` ... ``tensordd.bool``.

    A ``str`` holding the name, so it compares (and hashes) equal to it
    (``tensordd.float32 == "float32"``); it also compares equal to the same
    numpy dtype and torch dtype (``tensordd.float64 == torch.float64``).
    """

    __slots__ = ()

    def __repr__(self) -> str:
        return f"tensordd.{str.__str__(self)}"

    def __eq__(self, other) -> bool:
        if isinstance(other, str):
            return str.__eq__(self, other)
        name = canonical_name(other, strict=False)
        return name is not None and str.__eq__(self, name)

    def __ne__(self, other) -> bool:
        return not self.__eq__(other)

    __hash__ = str.__hash__

    @property
    def itemsize(self) -> int:
        """Bytes per element."""
        return _ITEMSIZE[str(self)]

    @property
    def is_floating_point(self) -> bool:
        """Whether this dtype is a floating point one (as torch.dtype's)."""
        return str(self) in ("float32", "float64", "float16", "bfloat16")

    def __reduce__(self):
        return (DType, (str(self),))


DTYPES = {name: DType(name) for name in _WIRE}


def _torch_dtype_name(x):
    """"float32" for torch.float32 (None if x is no torch dtype); torch is never imported."""
    t = type(x)
    if t.__name__ == "dtype" and t.__module__ == "torch":
        text = str(x)
        if text.startswith("torch."):
            return text[len("torch."):]
    return None


def canonical_name(dtype, strict: bool = True):
    """Our name for any dtype spelling; None (strict=False) or TypeError if it is none."""
    if isinstance(dtype, str):
        if dtype in _WIRE:
            return dtype
        if dtype.startswith("torch.") and dtype[6:] in _WIRE:
            return dtype[6:]
    name = _torch_dtype_name(dtype)
    if name is None and not isinstance(dtype, (type(None),)):
        try:
            name = np.dtype(dtype).name if not _looks_like_device(dtype) else None
        except (TypeError, ValueError):
            name = None
    if name is None:
        if strict:
            raise TypeError(f"not a dtype: {dtype!r} (a dtype is one of {', '.join(_WIRE)}, "
                            f"e.g. tensordd.float32, 'float32', np.float32 or torch.float32)")
        return None
    if name not in _WIRE:
        if strict:
            raise TypeError(f"dtype {name} is not supported by tensordd "
                            f"(supported: {', '.join(_WIRE)})")
        return None
    return name


def _looks_like_device(x) -> bool:
    # np.dtype("cpu") raises anyway; device objects must not be taken for dtypes.
    return type(x).__name__ in ("Device", "device")


def is_dtype_like(x) -> bool:
    """Whether x names a supported dtype."""
    return canonical_name(x, strict=False) is not None


def dtype_name(wire: int) -> str:
    """DType "float32" for DTYPE_F32; "invalid" for DTYPE_INVALID or unknown values."""
    name = _NAMES.get(wire)
    return DTYPES[name] if name else "invalid"


def to_wire(dtype) -> int:
    """The wire DType for any dtype spelling (see the module docstring)."""
    return _WIRE[canonical_name(dtype)]


def to_numpy(wire: int) -> np.dtype:
    """The numpy dtype payload bytes of this wire dtype are read into."""
    if wire == pb.DTYPE_BF16:
        return np.dtype(np.uint16)
    name = _NAMES.get(wire)
    if name is None:
        raise TypeError(f"unknown wire dtype {wire}")
    return np.dtype(name)


def f32_to_bf16_bits(a) -> np.ndarray:
    """bfloat16 bit patterns (uint16) of a, rounded to nearest even (as torch does), in a's
    shape (np.ascontiguousarray makes a 0-d array 1-d)."""
    a = np.asarray(a, dtype=np.float32)
    shape = a.shape
    a = np.ascontiguousarray(a)
    u = a.view(np.uint32).astype(np.uint64)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(a), np.uint16(0x7FC0), rounded).astype(np.uint16).reshape(shape)


def bf16_bits_to_f32(bits) -> np.ndarray:
    """float32 values of bfloat16 bit patterns (exact), in bits' shape (0-d included: a
    shift that is not in place turns a 0-d array into a scalar)."""
    wide = np.asarray(bits, dtype=np.uint16).astype(np.uint32)
    wide <<= np.uint32(16)
    return wide.view(np.float32)
