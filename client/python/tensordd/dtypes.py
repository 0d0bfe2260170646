"""dtypes -- the wire DType enum and numpy dtypes, both ways."""

from __future__ import annotations

import numpy as np

from . import tensordd_pb2 as pb

__all__ = ["dtype_name", "to_wire", "to_numpy"]

# Wire dtype -> numpy name. bfloat16 has no numpy dtype: it travels as
# uint16 bit patterns and is widened to float32 on download.
_NAMES = {
    pb.DTYPE_F32: "float32",
    pb.DTYPE_F64: "float64",
    pb.DTYPE_F16: "float16",
    pb.DTYPE_BF16: "bfloat16",
    pb.DTYPE_I32: "int32",
    pb.DTYPE_I64: "int64",
    pb.DTYPE_BOOL: "bool",
}
_WIRE = {name: code for code, name in _NAMES.items()}


def dtype_name(wire: int) -> str:
    """"float32" for DTYPE_F32; "invalid" for DTYPE_INVALID or unknown values."""
    return _NAMES.get(wire, "invalid")


def to_wire(dtype) -> int:
    """The wire DType for a numpy dtype, a dtype name or a Python type."""
    if isinstance(dtype, str) and dtype in _WIRE:
        return _WIRE[dtype]
    try:
        name = np.dtype(dtype).name
    except TypeError:
        raise TypeError(f"not a dtype: {dtype!r}") from None
    if name not in _WIRE:
        raise TypeError(f"dtype {name} is not supported by tensordd "
                        f"(supported: {', '.join(_WIRE)})")
    return _WIRE[name]


def to_numpy(wire: int) -> np.dtype:
    """The numpy dtype payload bytes of this wire dtype are read into."""
    if wire == pb.DTYPE_BF16:
        return np.dtype(np.uint16)
    name = _NAMES.get(wire)
    if name is None:
        raise TypeError(f"unknown wire dtype {wire}")
    return np.dtype(name)
