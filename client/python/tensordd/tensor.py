"""tensor -- Tensor: a handle to a tensor living in the daemon.

Every method sends one asynchronous op (named as in PyTorch) and returns the
output Tensor at once; nothing waits for the daemon until a value is needed
(``numpy()``, ``item()``, ``shape`` of an op's output, ``backward()``).
A Tensor's handle is released when the Python object dies: the id is queued
and goes out in one batched Release with the session's next request.
"""

from __future__ import annotations

import collections
import numbers
import sys

import numpy as np

from ._codec import numpy as _numpy_c
from ._codec import op as _op_c
from .device import HINT, Device, DeviceSpecError
from .dtypes import DTYPES, bf16_bits_to_f32, canonical_name, dtype_name

__all__ = ["Tensor", "REPR_SUMMARY_THRESHOLD", "REPR_EDGE_ITEMS"]

# repr/str download tensors of at most this many elements; larger ones are
# summarised as torch does, REPR_EDGE_ITEMS at each end of every longer dim (only
# those are gathered and downloaded).
REPR_SUMMARY_THRESHOLD = 1000
REPR_EDGE_ITEMS = 3
REPR_LINE_WIDTH = 80

# What max(dim)/min(dim) return, as torch.return_types.max: (values, indices).
MaxMin = collections.namedtuple("MaxMin", ["values", "indices"])

_UNSET = object()


def _dims(args) -> list:
    """(2, 3) from f(2, 3) or f((2, 3))."""
    if len(args) == 1 and isinstance(args[0], (tuple, list)):
        args = args[0]
    return [int(a) for a in args]


def _is_int(x) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def _is_scalar(x) -> bool:
    return isinstance(x, numbers.Number) and not isinstance(x, (bool, np.bool_))


class Tensor:
    """A tensor in the daemon, named by a session-scoped handle id.

    Create tensors with :meth:`Session.tensor` or the creation calls of the
    session (``zeros``, ``randn``, ...); never construct them directly.
    """

    # numpy defers to our reflected operators (ndarray + Tensor -> TypeError,
    # never an object array of Tensors).
    __array_ufunc__ = None

    __slots__ = ("_session", "_handle", "_shape", "_dtype", "_device", "_requires_grad",
                 "_leaf", "_grad", "__weakref__")

    def __init__(self, session, handle: int, shape=None, dtype=None, device=None,
                 requires_grad=None, leaf=None):
        self._session = session
        self._handle = handle
        self._shape = shape
        self._dtype = dtype
        self._device = device
        self._requires_grad = requires_grad
        # A leaf that requires grad (an upload or creation op with
        # requires_grad): a parameter. None where unknown.
        self._leaf = leaf if leaf is not None else (True if requires_grad else None)
        self._grad = _UNSET  # (grad epoch, Tensor or None) once read or set

    def __del__(self):
        # Session._release_later, inlined: this runs once per tensor dropped.
        try:
            st = self._session._state  # (its SessionState: what _open and the rest delegate to)
            if st.open:
                st.pending_release.append(self._handle)
        except AttributeError:  # (no session: never fully constructed)
            pass

    # ------------------------------------------------------------ metadata

    def _set_info(self, info) -> None:
        """Caches the metadata of a TensorInfo answer."""
        self._shape = tuple(info.shape)
        self._dtype = dtype_name(info.dtype)
        self._device = Device._from_proto(info.device)
        self._requires_grad = bool(info.requires_grad)

    def _ensure_info(self) -> None:
        if self._shape is None or self._dtype is None or self._device is None \
                or self._requires_grad is None:
            self._session._describe_tensor(self)

    @property
    def handle(self) -> int:
        """The session-scoped handle id (as named in error messages: ``#3``)."""
        return self._handle

    @property
    def session(self):
        """The :class:`Session` this tensor's handle belongs to."""
        return self._session

    @property
    def shape(self) -> tuple:
        """The shape; for an op's output, asked from the daemon once (Describe)."""
        if self._shape is None:
            self._session._describe_tensor(self)
        return self._shape

    @property
    def dtype(self) -> str:
        """The dtype: a :class:`tensordd.DType` (``tensordd.float32``), which is the
        str ``"float32"`` and compares equal to numpy's and torch's."""
        if self._dtype is None:
            self._session._describe_tensor(self)
        return DTYPES.get(self._dtype, self._dtype)

    @property
    def is_floating_point_dtype(self) -> bool:
        """Whether the dtype is float32, float64, float16 or bfloat16."""
        return self.dtype in ("float32", "float64", "float16", "bfloat16")

    def is_floating_point(self) -> bool:
        """Whether the dtype is a floating point one (as torch)."""
        return self.is_floating_point_dtype

    @property
    def is_leaf(self) -> bool:
        """True for tensors created by the user (uploads, creation ops), as in torch;
        False for op outputs that require grad."""
        if not self.requires_grad:
            return True
        return bool(self._leaf)

    @property
    def device(self) -> Device:
        """The :class:`Device` the tensor lives on (asked from the daemon once for an op's output).
        """
        if self._device is None:
            self._session._describe_tensor(self)
        return self._device

    @property
    def requires_grad(self) -> bool:
        """Whether autodiff tracks this tensor (leaf with requires_grad, or derived from one)."""
        if self._requires_grad is None:
            self._session._describe_tensor(self)
        return self._requires_grad

    @property
    def ndim(self) -> int:
        """The number of dims (``len(t.shape)``)."""
        return len(self.shape)

    def dim(self) -> int:
        """The number of dims (``len(t.shape)``)."""
        return len(self.shape)

    def size(self, dim=None):
        """The shape, or one of its sizes."""
        return self.shape if dim is None else self.shape[dim]

    def numel(self) -> int:
        """The number of elements."""
        return int(np.prod(self.shape, dtype=np.int64))

    def __len__(self) -> int:
        """The size of dim 0 (the shape is asked from the daemon once if unknown).

        A 0-d tensor has no len() (as torch's). This is also where
        ``torch.as_tensor(t)``/``torch.tensor(t)`` stop on torch 1.13: they take
        only torch tensors, ndarrays (not the array protocol) and sequences, and
        walk a sequence down to its 0-d items, which are sequences too (the class
        has ``__getitem__``) without a length. The message says what works.
        """
        if not self.shape:
            raise TypeError("len() of a 0-d tensor (for torch: t.torch(), torch.from_dlpack(t) "
                            "or torch.as_tensor(np.asarray(t)))")
        return self.shape[0]

    def __iter__(self):
        """The sub-tensors along dim 0, ``len(self)`` of them (as torch)."""
        if not self.shape:
            raise TypeError("iteration over a 0-d tensor")
        for i in range(self.shape[0]):
            yield self[i]

    def _brief(self) -> str:
        """The handle and what is known without asking the daemon."""
        parts = [f"#{self._handle}"]
        if self._shape is not None:
            parts.append(f"shape={self._shape}")
        if self._dtype is not None:
            parts.append(f"dtype={self._dtype}")
        if self._device is not None:
            parts.append(f"device={self._device}")
        if self._requires_grad:
            parts.append("requires_grad=True")
        return f"tensordd.Tensor({', '.join(parts)})"

    def __repr__(self) -> str:
        """torch's form: ``tensor([1., 2.], device='cpu:0', dtype=tensordd.float32)``,
        with ``requires_grad=True`` where it is set; ``str()`` is the same.

        The values are downloaded when asked for (a synchronising call, as torch's
        repr of a CUDA tensor). Tensors of more than 1000 elements are summarised as
        torch does (three items at each end of every dim): only those corners are
        gathered in the daemon and downloaded, whatever the tensor's size.

        repr never raises for the session's sake (debuggers, loggers and assertion
        messages call it) and never loses an error:

        * a failure of this tensor (poisoned, a failed op) is shown in the text,
          ``tensor(<POISONED: ...>, ...)``;
        * a pending asynchronous failure of an *earlier* request, which the daemon
          hands to whichever synchronising request comes first, is kept by the
          session and raised by the next synchronising call (``sync()``,
          ``numpy()``, ``backward()``, ...) exactly as if repr had not run; the
          values are then downloaded again;
        * a closed session, or a repr evaluated while the session is inside a round
          trip (a debugger stopped in the client), shows the handle and the
          metadata known without asking the daemon.
        """
        session = self._session
        if session is None or session.closed:
            return f"{self._brief()[:-1]}, session closed)"
        if session._busy:
            return f"{self._brief()[:-1]}, values not shown: the session is mid-call)"
        from .errors import Error

        start = session._next_request_id()
        body = None
        try:
            shape, dtype, device = self.shape, self.dtype, self.device
            rg = self.requires_grad
            n = int(np.prod(shape, dtype=np.int64))
            src, cut = self, None
            if n > REPR_SUMMARY_THRESHOLD:
                src, cut = self._corners(shape)
            # Earlier failures already kept for the next sync stay kept (this download
            # must not raise them); a pending one this download reads joins them.
            held, session._deferred = session._deferred, []
            try:
                for attempt in (0, 1):
                    try:
                        arr = src.numpy()
                        break
                    except Error as e:
                        if attempt == 0 and e.request_id and e.request_id < start \
                                and not session.closed:
                            held.append(e)  # an earlier request's: raised at the next sync
                            continue
                        raise
            finally:
                session._deferred = held + session._deferred
            body = _format_values(arr, cut)
        except Error as e:
            if session.closed:
                return f"{self._brief()[:-1]}, session closed: {e})"
            return f"{self._brief()[:-1]}, <{e}>)"
        except Exception as e:  # a repr must not raise (debuggers)
            return f"{self._brief()[:-1]}, <repr failed: {type(e).__name__}: {e}>)"
        extra = f", device='{device}', dtype={dtype!r}"
        if rg:
            extra += ", requires_grad=True"
        return f"tensor({body}{extra})"

    __str__ = __repr__

    def _corners(self, shape):
        """(a tensor of the first and last REPR_EDGE_ITEMS along every dim longer than
        twice that, [whether each dim was cut]): one index_select per cut dim."""
        session = self._session
        out = self.detach() if self.requires_grad else self
        cut = []
        for d, size in enumerate(shape):
            k = REPR_EDGE_ITEMS
            if size > 2 * k:
                idx = np.concatenate([np.arange(k), np.arange(size - k, size)]).astype(np.int64)
                out = session._op("index_select", out, session.tensor(idx, device=self.device),
                                 dim=d)
                cut.append(True)
            else:
                cut.append(False)
        return out, cut

    def __format__(self, spec: str) -> str:
        if spec:  # f"{t:.3f}": a one-element tensor's value, as torch
            return format(self.item(), spec)
        return str(self)

    # Tensors define ==, so identity hashing must be asked for (as torch does).
    __hash__ = object.__hash__

    # ------------------------------------------------------------ values

    def numpy(self) -> np.ndarray:
        """Downloads the tensor into a new numpy array (synchronising).

        bfloat16 is widened to float32 (numpy has no bfloat16)."""
        session = self._session
        if _numpy_c is not None:  # the accelerator: Session._download in one call
            try:
                arr = _numpy_c(session._state, session, self)
            except BaseException as e:
                session._download_failed(e, self._handle)
            if arr is not None:
                return session._download_answer(self, arr) if type(arr) is int else arr
        return session._download(self)

    def torch(self):
        """The values as a new torch tensor of the same dtype (bfloat16 included),
        on torch's CPU, outside torch's autograd. Needs torch installed."""
        import torch

        if self.dtype == "bfloat16":
            bits = self._session._download(self, raw=True)
            return torch.from_numpy(bits.view(np.int16)).view(torch.bfloat16)
        return torch.from_numpy(self.numpy())

    def __dlpack__(self, stream=None):
        """DLPack export of the downloaded values (``torch.from_dlpack(t)``,
        ``np.from_dlpack(t)``): a host copy, made when called."""
        if self.dtype == "bfloat16":  # numpy has no bfloat16: torch's own export
            return self.torch().__dlpack__()
        return self.numpy().__dlpack__()

    def __dlpack_device__(self):
        return (1, 0)  # kDLCPU: the values are exported from the host

    def cpu(self):
        """This tensor on cpu:0 (self if already there), as torch's ``.cpu()``."""
        return self.to("cpu:0")

    def tolist(self):
        """The values as nested Python lists (downloads; synchronising)."""
        return self.numpy().tolist()

    def item(self):
        """The value of a one-element tensor as a Python number."""
        arr = self.numpy()
        if arr.size != 1:
            raise ValueError(f"item() needs a tensor with one element, got shape {arr.shape}")
        return arr.reshape(()).item()

    def _one(self, what: str):
        arr = self.numpy()
        if arr.size != 1:
            raise RuntimeError(f"{what} of a Tensor with {arr.size} elements (shape "
                               f"{arr.shape}) is ambiguous: it needs exactly one")
        return arr.reshape(()).item()

    def __float__(self) -> float:
        return float(self._one("float()"))

    def __int__(self) -> int:
        return int(self._one("int()"))

    def __bool__(self) -> bool:
        return bool(self._one("Boolean value"))

    def __index__(self) -> int:
        """A one-element integer tensor as an index (``range(t)``, ``[...][t]``)."""
        if self.dtype not in ("int32", "int64", "bool"):
            raise TypeError(f"only integer tensors of a single element can be converted "
                            f"to an index (dtype {self.dtype})")
        return int(self._one("__index__()"))

    def __array__(self, dtype=None, copy=None):
        """numpy's array protocol: ``np.asarray(t)`` downloads the values."""
        arr = self.numpy()
        return arr if dtype is None else arr.astype(dtype, copy=False)

    # ------------------------------------------------------------ plumbing

    def _op(self, name: str, *others, **attrs) -> "Tensor":
        if not others and not attrs:  # what Session.op does for one tensor input
            if _op_c is not None:  # (the accelerator: Session._op_fast in one call)
                s = self._session
                out = _op_c(s._state, s, name, [self._handle])
                if out is not None:
                    return out
            return self._session._op_fast(name, [self._handle])
        return self._session._op(name, self, *others, **attrs)

    def _unary(self, name: str) -> "Tensor":
        """_op(name) without further inputs or attributes (no argument packing)."""
        if _op_c is not None:  # (the accelerator: Session._op_fast in one call)
            s = self._session
            out = _op_c(s._state, s, name, [self._handle])
            if out is not None:
                return out
        return self._session._op_fast(name, [self._handle])

    def _binary(self, name: str, other) -> "Tensor":
        """A tensor op, or its scalar form (one input and the attribute other): an int
        stays an int, so an integer tensor keeps its dtype (``int64 + 1`` is int64, as
        in torch); a float makes an integer tensor's result float32."""
        if isinstance(other, Tensor):
            return self._session._op(name, self, other)
        if _is_scalar(other):
            return self._session._op(name, self, other=int(other) if _is_int(other)
                                    else float(other))
        return NotImplemented

    # ------------------------------------------------------------ operators

    def __add__(self, other):
        return self._binary("add", other)

    def __radd__(self, other):
        return self._binary("add", other)

    def __sub__(self, other):
        return self._binary("sub", other)

    def __rsub__(self, other):  # s - t == (-t) + s
        if _is_scalar(other):
            return self.neg()._binary("add", other)
        return NotImplemented

    def __mul__(self, other):
        return self._binary("mul", other)

    def __rmul__(self, other):
        return self._binary("mul", other)

    def __truediv__(self, other):
        return self._binary("div", other)

    def __rtruediv__(self, other):  # s / t == reciprocal(t) * s
        if _is_scalar(other):
            return self.reciprocal()._binary("mul", other)
        return NotImplemented

    def __matmul__(self, other):
        if isinstance(other, Tensor):
            return self._session._op("matmul", self, other)
        return NotImplemented

    def __pow__(self, exponent):
        return self.pow(exponent)

    def __rpow__(self, base):
        """``2 ** t``: a 0-d tensor of base (t's float dtype, or t's int dtype for an
        int base and int t; float32 for a float base and int t) raised to t."""
        if not _is_scalar(base):
            return NotImplemented
        dt = self.dtype
        if not self.is_floating_point_dtype and not isinstance(base, (int, np.integer)):
            dt = "float32"
        b = self._session.tensor(np.array(base), device=self.device, dtype=dt)
        return self._session._op("pow", b, self)

    def __floordiv__(self, other):
        return self.floor_divide(other)

    def __rfloordiv__(self, other):
        if not _is_scalar(other):
            return NotImplemented
        return self._full_like_scalar(other).floor_divide(self)

    def __mod__(self, other):
        return self.remainder(other)

    def __rmod__(self, other):
        if not _is_scalar(other):
            return NotImplemented
        return self._full_like_scalar(other).remainder(self)

    def __and__(self, other):
        return self._logical("logical_and", "&", other)

    __rand__ = __and__

    def __or__(self, other):
        return self._logical("logical_or", "|", other)

    __ror__ = __or__

    def __xor__(self, other):
        return self._logical("logical_xor", "^", other)

    __rxor__ = __xor__

    def __invert__(self):
        if self.dtype != "bool":
            raise TypeError(f"~ is supported on bool tensors only (the daemon has no bitwise "
                            f"ops for {self.dtype}); use logical_not() or arithmetic")
        return self._unary("logical_not")

    def _logical(self, op: str, sym: str, other):
        if isinstance(other, (bool, np.bool_)):
            other = self._session.tensor(np.array(bool(other)), device=self.device)
        if not isinstance(other, Tensor):
            return NotImplemented
        if self.dtype != "bool" or other.dtype != "bool":
            raise TypeError(f"{sym} is supported on bool tensors only (got {self.dtype} and "
                            f"{other.dtype}: the daemon has no bitwise integer ops)")
        return self._session._op(op, self, other)

    def _full_like_scalar(self, value) -> "Tensor":
        """A 0-d tensor holding value, of self's dtype (float32 for a float value and
        an integer self), on self's device."""
        dt = self.dtype
        if not self.is_floating_point_dtype and isinstance(value, (float, np.floating)):
            dt = "float32"
        return self._session.tensor(np.array(value), device=self.device, dtype=dt)

    def floor_divide(self, other):
        """``self // other``: floor(self / other); integer inputs give an integer
        result of the promoted dtype, as torch (computed through float division,
        so exact only while the quotient fits a float's mantissa)."""
        q = self._binary("div", other)
        if q is NotImplemented:
            return q
        q = q.floor()
        other_int = (isinstance(other, Tensor) and not other.is_floating_point_dtype) or \
            isinstance(other, (int, np.integer))
        if not self.is_floating_point_dtype and other_int:
            dt = self.dtype
            if isinstance(other, Tensor) and other.dtype == "int64":
                dt = "int64"
            q = q._op("cast", dtype=dt)
        return q

    def remainder(self, other):
        """Python's/torch's modulus (the sign of the divisor)."""
        return self._binary("remainder", other)

    # ---- in-place forms: the daemon has no in-place ops, so these compute the
    # result and rebind this Tensor object to it (other Tensor objects viewing
    # the same data do not change). A leaf that requires grad (a parameter)
    # is refused: update parameters with an optimizer.

    def _assign(self, out: "Tensor", what: str) -> "Tensor":
        if out is NotImplemented:
            raise TypeError(f"unsupported operand for {what}")
        if self._leaf and self._requires_grad:
            raise RuntimeError(
                f"{what}: a leaf Tensor that requires grad (#{self._handle}) cannot be "
                f"modified in place (the daemon has no in-place ops and rebinding it would "
                f"detach it from its optimizer); use tensordd.optim, or t = t.detach() first")
        session = self._session
        session._release_later(self._handle)
        self._handle = out._handle
        self._shape, self._dtype, self._device = out._shape, out._dtype, out._device
        self._requires_grad, self._leaf = out._requires_grad, out._leaf
        self._grad = _UNSET
        out._session = None  # its handle now belongs to self
        return self

    def __iadd__(self, other):
        return self._assign(self._binary("add", other), "+=")

    def __isub__(self, other):
        return self._assign(self._binary("sub", other), "-=")

    def __imul__(self, other):
        return self._assign(self._binary("mul", other), "*=")

    def __itruediv__(self, other):
        return self._assign(self._binary("div", other), "/=")

    def add_(self, other, alpha=1):
        """In place (rebinding, see above): self += alpha * other."""
        if alpha != 1:
            other = other * alpha
        return self._assign(self._binary("add", other), "add_")

    def sub_(self, other, alpha=1):
        """In place (rebinding, see above): self -= alpha * other. Refused on a parameter."""
        if alpha != 1:
            other = other * alpha
        return self._assign(self._binary("sub", other), "sub_")

    def mul_(self, other):
        """In place (this object is rebound to the result, see the in-place forms above): self *
        other. Refused on a parameter."""
        return self._assign(self._binary("mul", other), "mul_")

    def div_(self, other):
        """In place (this object is rebound to the result, see the in-place forms above): self /
        other. Refused on a parameter."""
        return self._assign(self._binary("div", other), "div_")

    def clamp_(self, min=None, max=None):  # noqa: A002
        """In place (this object is rebound to the result, see the in-place forms above):
        clamp(min, max). Refused on a parameter."""
        return self._assign(self.clamp(min, max), "clamp_")

    def relu_(self):
        """In place (this object is rebound to the result, see the in-place forms above): relu().
        Refused on a parameter."""
        return self._assign(self.relu(), "relu_")

    def zero_(self):
        """In place (this object is rebound to the result, see the in-place forms above): zeros.
        Refused on a parameter."""
        return self._assign(self.mul(0), "zero_")

    def fill_(self, value):
        """In place (this object is rebound to the result, see the in-place forms above): value
        everywhere. Refused on a parameter."""
        return self._assign(self.mul(0).add(value), "fill_")

    def requires_grad_(self, requires_grad: bool = True) -> "Tensor":
        """Makes this tensor a leaf that requires grad (or stops tracking it).

        The daemon cannot flip the flag of a live tensor: the values are
        downloaded and uploaded again with the flag (a round trip and the
        bytes both ways) and this object is rebound to the new handle.
        """
        requires_grad = bool(requires_grad)
        self._session.retain_grads = True
        if self.requires_grad == requires_grad and (self._leaf or not requires_grad):
            return self
        if not requires_grad:
            if self._leaf is not True:
                raise RuntimeError("requires_grad_(False) on a non-leaf tensor: use detach()")
        if requires_grad and not self.is_floating_point_dtype:
            raise RuntimeError(f"only floating point tensors can require gradients "
                               f"(dtype {self.dtype})")
        session = self._session
        if self.dtype == "bfloat16":
            data = bf16_bits_to_f32(session._download(self, raw=True))
        else:
            data = self.numpy()
        new = session.tensor(data, device=self.device, dtype=self.dtype,
                             requires_grad=requires_grad)
        session._release_later(self._handle)
        self._handle = new._handle
        self._requires_grad, self._leaf = requires_grad, True
        self._grad = _UNSET
        new._session = None
        return self

    def __neg__(self):
        return self._unary("neg")

    def __pos__(self):
        return self

    def __abs__(self):
        return self._unary("abs")

    def __eq__(self, other):
        return self._binary("eq", other)

    def __ne__(self, other):
        return self._binary("ne", other)

    def __lt__(self, other):
        return self._binary("lt", other)

    def __le__(self, other):
        return self._binary("le", other)

    def __gt__(self, other):
        return self._binary("gt", other)

    def __ge__(self, other):
        return self._binary("ge", other)

    # ------------------------------------------------------------ arithmetic

    def add(self, other):
        """``self + other`` (a Tensor, broadcast, or a number), as ``torch.add``."""
        return self._binary("add", other)

    def sub(self, other):
        """``self - other`` (a Tensor, broadcast, or a number), as ``torch.sub``."""
        return self._binary("sub", other)

    def mul(self, other):
        """``self * other`` (a Tensor, broadcast, or a number), as ``torch.mul``."""
        return self._binary("mul", other)

    def div(self, other):
        """``self / other`` (a Tensor, broadcast, or a number), as ``torch.div``."""
        return self._binary("div", other)

    def matmul(self, other: "Tensor") -> "Tensor":
        """Matrix product with torch.matmul's broadcasting rules (``self @ other``)."""
        return self._session._op("matmul", self, other)

    def mm(self, other: "Tensor") -> "Tensor":
        """2-D matrix product (``torch.mm``)."""
        return self._session._op("matmul", self, other)

    def bmm(self, other: "Tensor") -> "Tensor":
        """Batched matrix product of (b, n, m) and (b, m, p) tensors."""
        return self._session._op("bmm", self, other)

    def pow(self, exponent):
        """self ** exponent: a scalar exponent (attr) or a tensor of exponents."""
        if isinstance(exponent, Tensor):
            return self._session._op("pow", self, exponent)
        return self._op("pow", other=float(exponent))

    def maximum(self, other: "Tensor") -> "Tensor":
        """Elementwise maximum of two tensors (``torch.maximum``; NaN propagates)."""
        return self._session._op("maximum", self, other)

    def minimum(self, other: "Tensor") -> "Tensor":
        """Elementwise minimum of two tensors (``torch.minimum``; NaN propagates)."""
        return self._session._op("minimum", self, other)

    def eq(self, other):
        """``self == other`` elementwise: a bool tensor (``torch.eq``)."""
        return self._binary("eq", other)

    def ne(self, other):
        """``self != other`` elementwise: a bool tensor (``torch.ne``)."""
        return self._binary("ne", other)

    def lt(self, other):
        """``self < other`` elementwise: a bool tensor (``torch.lt``)."""
        return self._binary("lt", other)

    def le(self, other):
        """``self <= other`` elementwise: a bool tensor (``torch.le``)."""
        return self._binary("le", other)

    def gt(self, other):
        """``self > other`` elementwise: a bool tensor (``torch.gt``)."""
        return self._binary("gt", other)

    def ge(self, other):
        """``self >= other`` elementwise: a bool tensor (``torch.ge``)."""
        return self._binary("ge", other)

    def clamp(self, min=None, max=None):  # noqa: A002 (PyTorch's argument names)
        """Values limited to [min, max] (either may be None), as ``torch.clamp``."""
        return self._op("clamp", min=None if min is None else float(min),
                        max=None if max is None else float(max))

    def masked_fill(self, mask: "Tensor", value) -> "Tensor":
        """self with value where mask (bool, broadcastable) is true."""
        return self._session._op("masked_fill", self, mask, value=value)

    def where(self, condition: "Tensor", other: "Tensor") -> "Tensor":
        """Elements of self where condition holds, else of other (``torch.where(c, self, other)``)."""
        return self._session._op("where", condition, self, other)

    # ------------------------------------------------------------ elementwise

    def neg(self):
        """Elementwise negation (``torch.neg``); an asynchronous op."""
        return self._unary("neg")

    def abs(self):
        """Elementwise absolute value (``torch.abs``); an asynchronous op."""
        return self._unary("abs")

    def relu(self):
        """Elementwise rectified linear unit max(x, 0) (``torch.relu``); an asynchronous op."""
        return self._unary("relu")

    def gelu(self):
        """Elementwise GELU (``torch.nn.functional.gelu``, exact erf form unless
        approximate='tanh')."""
        return self._unary("gelu")

    def sigmoid(self):
        """Elementwise logistic sigmoid (``torch.sigmoid``); an asynchronous op."""
        return self._unary("sigmoid")

    def tanh(self):
        """Elementwise hyperbolic tangent (``torch.tanh``); an asynchronous op."""
        return self._unary("tanh")

    def exp(self):
        """Elementwise exponential (``torch.exp``); an asynchronous op."""
        return self._unary("exp")

    def log(self):
        """Elementwise natural logarithm (``torch.log``); an asynchronous op."""
        return self._unary("log")

    def sqrt(self):
        """Elementwise square root (``torch.sqrt``); an asynchronous op."""
        return self._unary("sqrt")

    def rsqrt(self):
        """Elementwise 1 / sqrt(x) (``torch.rsqrt``); an asynchronous op."""
        return self._unary("rsqrt")

    def reciprocal(self):
        """Elementwise reciprocal 1 / x (``torch.reciprocal``); an asynchronous op."""
        return self._unary("reciprocal")

    def square(self):
        """Elementwise square (``torch.square``); an asynchronous op."""
        return self._unary("square")

    def sin(self):
        """Elementwise sine (``torch.sin``); an asynchronous op."""
        return self._unary("sin")

    def cos(self):
        """Elementwise cosine (``torch.cos``); an asynchronous op."""
        return self._unary("cos")

    def sign(self):
        """Elementwise sign (-1, 0 or 1) (``torch.sign``); an asynchronous op."""
        return self._unary("sign")

    def log1p(self):
        """Elementwise log(1 + x) (``torch.log1p``); an asynchronous op."""
        return self._unary("log1p")

    def expm1(self):
        """Elementwise exp(x) - 1 (``torch.expm1``); an asynchronous op."""
        return self._unary("expm1")

    def floor(self):
        """Elementwise floor (``torch.floor``); an asynchronous op."""
        return self._unary("floor")

    def ceil(self):
        """Elementwise ceiling (``torch.ceil``); an asynchronous op."""
        return self._unary("ceil")

    def round(self):
        """Elementwise rounding to the nearest integer, halves to even (``torch.round``); an
        asynchronous op."""
        return self._unary("round")

    def silu(self):
        """Elementwise SiLU x * sigmoid(x) (``torch.silu``); an asynchronous op."""
        return self._unary("silu")

    def leaky_relu(self, negative_slope: float = 0.01):
        """Elementwise leaky ReLU: x, or negative_slope * x below 0 (``F.leaky_relu``)."""
        return self._op("leaky_relu", negative_slope=float(negative_slope))

    def softplus(self, beta: float = 1.0, threshold: float = 20.0):
        """Elementwise softplus log(1 + exp(beta x)) / beta, linear past threshold
        (``F.softplus``)."""
        return self._op("softplus", beta=float(beta), threshold=float(threshold))

    def logical_not(self):
        """Elementwise logical negation (``torch.logical_not``); an asynchronous op."""
        return self._unary("logical_not")

    # ------------------------------------------------------------ reductions

    def sum(self, dim=None, keepdim: bool = False):
        """Sum of all elements, or over dim (an int or a tuple of ints)."""
        if dim is None:
            out = self._op("sum")
            out._shape = ()  # (known: backward() of it needs no round trip to check it)
            return out
        return self._op("sum", dim=_dim_attr(dim), keepdim=keepdim)

    def mean(self, dim=None, keepdim: bool = False):
        """Mean of all elements, or over dim (an int or a tuple of ints), as ``torch.mean``."""
        if dim is None:
            out = self._op("mean")
            out._shape = ()
            return out
        return self._op("mean", dim=_dim_attr(dim), keepdim=keepdim)

    def amax(self, dim=None, keepdim: bool = False):
        """Maximum of all elements, or over dim (an int or a tuple of ints), as ``torch.amax``."""
        return self._op("amax", dim=_dim_attr(dim), keepdim=keepdim if dim is not None else None)

    def amin(self, dim=None, keepdim: bool = False):
        """Minimum of all elements, or over dim (an int or a tuple of ints), as ``torch.amin``."""
        return self._op("amin", dim=_dim_attr(dim), keepdim=keepdim if dim is not None else None)

    def max(self, dim=None, keepdim: bool = False):
        """As torch: the largest element (0-d); with dim, ``(values, indices)``
        along it; with a Tensor, the elementwise maximum."""
        if isinstance(dim, Tensor):
            return self.maximum(dim)
        if dim is None:
            return self.amax()
        return MaxMin(self.amax(int(dim), keepdim), self.argmax(int(dim), keepdim))

    def min(self, dim=None, keepdim: bool = False):
        """As torch: the smallest element; with dim, ``(values, indices)``; with a
        Tensor, the elementwise minimum."""
        if isinstance(dim, Tensor):
            return self.minimum(dim)
        if dim is None:
            return self.amin()
        return MaxMin(self.amin(int(dim), keepdim), self.argmin(int(dim), keepdim))

    def argmax(self, dim=None, keepdim: bool = False):
        """Index of the largest element (of the flattened tensor, or along dim), as
        ``torch.argmax``."""
        return self._op("argmax", dim=dim, keepdim=keepdim if dim is not None else None)

    def argmin(self, dim=None, keepdim: bool = False):
        """Index of the smallest element (of the flattened tensor, or along dim), as
        ``torch.argmin``."""
        return self._op("argmin", dim=dim, keepdim=keepdim if dim is not None else None)

    def prod(self, dim=None, keepdim: bool = False):
        """Product of all elements, or over dim (an int or a tuple of ints), as ``torch.prod``."""
        return self._op("prod", dim=_dim_attr(dim), keepdim=keepdim if dim is not None else None)

    def var(self, dim=None, keepdim: bool = False, unbiased: bool = True):
        """Variance over all elements or dim (unbiased: divided by n - 1), as ``torch.var``.
        ``x.var(False)`` is torch's ``var(unbiased)`` form."""
        if isinstance(dim, bool):
            dim, unbiased = None, dim
        return self._op("var", dim=_dim_attr(dim), keepdim=keepdim if dim is not None else None,
                        unbiased=unbiased)

    def std(self, dim=None, keepdim: bool = False, unbiased: bool = True):
        """Standard deviation over all elements or dim (unbiased: n - 1), as ``torch.std``.
        ``x.std(False)`` is torch's ``std(unbiased)`` form."""
        if isinstance(dim, bool):
            dim, unbiased = None, dim
        return self._op("std", dim=_dim_attr(dim), keepdim=keepdim if dim is not None else None,
                        unbiased=unbiased)

    def logsumexp(self, dim, keepdim: bool = False):
        """log(sum(exp(x))) over dim, computed stably (``torch.logsumexp``)."""
        return self._op("logsumexp", dim=_dim_attr(dim), keepdim=keepdim)

    def cumsum(self, dim: int):
        """Cumulative sum along dim (``torch.cumsum``)."""
        return self._op("cumsum", dim=int(dim))

    def multinomial(self, num_samples: int, replacement: bool = False) -> "Tensor":
        """int64 category draws from the rows of this tensor's non-negative weights
        (``torch.multinomial``), from the session's random stream."""
        return self.session._op("multinomial", self, num_samples=int(num_samples),
                               replacement=bool(replacement))

    def softmax(self, dim: int):
        """Softmax along dim (``torch.softmax``)."""
        return self._op("softmax", dim=int(dim))

    def log_softmax(self, dim: int):
        """Log of the softmax along dim, computed stably (``torch.log_softmax``)."""
        return self._op("log_softmax", dim=int(dim))

    # ------------------------------------------------------------ shape

    def reshape(self, *shape):
        """A tensor of the same data with a new shape (one entry may be -1)."""
        return self._op("reshape", shape=_dims(shape))

    def view(self, *shape):
        """The same data with a new shape (one entry may be -1); needs a viewable layout, as
        ``torch.Tensor.view``."""
        return self._op("view", shape=_dims(shape))

    def transpose(self, dim0: int, dim1: int):
        """dim0 and dim1 swapped (a view), as ``torch.transpose``."""
        return self._op("transpose", dim0=int(dim0), dim1=int(dim1))

    def permute(self, *dims):
        """The dims reordered (a view), as ``torch.permute``."""
        return self._op("permute", dims=_dims(dims))

    def t(self):
        """The transpose of a 2-D tensor (``transpose(0, 1)``)."""
        return self.transpose(0, 1)

    @property
    def T(self):  # noqa: N802 (PyTorch's name)
        """The transpose of a 2-D tensor (``t.T``)."""
        return self.t()

    def flatten(self, start_dim: int = 0, end_dim: int = -1):
        """The dims start_dim..end_dim merged into one (``torch.flatten``)."""
        return self._op("flatten", start_dim=int(start_dim), end_dim=int(end_dim))

    def unsqueeze(self, dim: int):
        """A new dim of size 1 at dim (``torch.unsqueeze``)."""
        return self._op("unsqueeze", dim=int(dim))

    def squeeze(self, dim=None):
        """Dims of size 1 removed (all, or only dim), as ``torch.squeeze``."""
        return self._op("squeeze", dim=dim)

    def expand(self, *sizes):
        """A view broadcast to sizes (-1 keeps a size), as ``torch.Tensor.expand``."""
        return self._op("expand", shape=_dims(sizes))

    def contiguous(self):
        """A tensor with the same values laid out densely in C order (``torch.Tensor.contiguous``).
        """
        return self._unary("contiguous")

    def clone(self):
        """A copy with storage of its own (``torch.clone``); autodiff tracks it."""
        return self._unary("clone")

    def split(self, split_size, dim: int = 0) -> tuple:
        """Pieces of split_size along dim (the last may be smaller), or pieces of
        the sizes listed. Needs the size of dim (a Describe if not yet known)."""
        if isinstance(split_size, (list, tuple)):
            sizes = [int(k) for k in split_size]
            return self._session._op("split", self, split_sizes=sizes, dim=int(dim),
                                    num_outputs=len(sizes))
        size, step = self.shape[dim], int(split_size)
        if step <= 0:
            raise ValueError("split_size must be positive")
        count = max(1, -(-size // step))
        return _as_tuple(self._session._op("split", self, split_size=step, dim=int(dim),
                                          num_outputs=count))

    def chunk(self, chunks: int, dim: int = 0) -> tuple:
        """Up to `chunks` pieces along dim, as torch.chunk (sizes ceil(n / chunks))."""
        if int(chunks) <= 0:
            raise ValueError("chunks must be positive")
        size = self.shape[dim]
        step = max(1, -(-size // int(chunks)))
        count = max(1, -(-size // step))
        return _as_tuple(self._session._op("chunk", self, chunks=int(chunks), dim=int(dim),
                                          num_outputs=count))

    def tril(self, diagonal: int = 0):
        """The lower triangle (from diagonal down), the rest zero (``torch.tril``)."""
        return self._op("tril", diagonal=int(diagonal))

    def triu(self, diagonal: int = 0):
        """The upper triangle (from diagonal up), the rest zero (``torch.triu``)."""
        return self._op("triu", diagonal=int(diagonal))

    def gather(self, dim: int, index: "Tensor") -> "Tensor":
        """Values along dim at the positions of index (``torch.gather``; any integer
        dtype, sent as int64)."""
        return self._session._op("gather", self, _as_index(index), dim=int(dim))

    def index_select(self, dim: int, index: "Tensor") -> "Tensor":
        """The entries of index (a 1-D integer tensor) along dim (``torch.index_select``)."""
        return self._session._op("index_select", self, _as_index(index), dim=int(dim))

    def __getitem__(self, key):
        """Indexing as in PyTorch (and numpy): ints, slices (negative steps too),
        None, Ellipsis, and one advanced index: a list or array of ints, an
        integer Tensor (index_select), or a bool mask (list, array or Tensor;
        selects like ``t[mask]``, the mask's values are downloaded).

        Int indices are checked against the real shape (asked from the daemon
        once when not yet known): out of range is an IndexError, as in torch.
        """
        key = key if isinstance(key, tuple) else (key,)
        simple = all(k is None or isinstance(k, slice) for k in key)
        shape = self._shape
        if shape is None and not simple:
            shape = self.shape  # one Describe; the outputs' shapes are derived locally
        shape = None if shape is None else list(shape)
        if any(k is Ellipsis for k in key):
            at = key.index(Ellipsis)
            if Ellipsis in key[at + 1:]:
                raise IndexError("an index can only have a single ellipsis")
            used = sum(k is not None for k in key) - 1
            key = key[:at] + (slice(None),) * (len(shape) - used) + key[at + 1:]
        if shape is not None and sum(k is not None for k in key) > len(shape):
            raise IndexError(f"too many indices for tensor of dimension {len(shape)}")
        advanced = [k for k in key if isinstance(k, (Tensor, list, np.ndarray))]
        if len(advanced) > 1:
            raise IndexError("only one advanced index (list, array, index or mask tensor) "
                             "per indexing expression is supported")
        out, d = self, 0
        for k in key:
            if k is None:
                out, d = out.unsqueeze(d), d + 1
                if shape is not None:
                    shape.insert(d - 1, 1)
                    out._meta_from(self, shape)
            elif isinstance(k, slice):
                if k != slice(None):
                    out = out._slice(d, k, shape)
                d += 1
            elif _is_int(k):
                n = shape[d]
                i = int(k)
                if not -n <= i < n:
                    raise IndexError(f"index {i} is out of bounds for dimension {d} with size {n}")
                i %= n
                out = out._op("slice", dim=d, start=i, stop=i + 1)
                out = out._op("squeeze", dim=d)
                del shape[d]
                out._meta_from(self, shape)
            elif isinstance(k, (Tensor, list, np.ndarray)):
                out, d = out._advanced(d, k, shape)
            elif isinstance(k, (bool, np.bool_)):
                raise TypeError("indexing with a Python bool is not supported")
            else:
                raise TypeError(f"unsupported index {k!r} (ints, slices, None, Ellipsis, "
                                f"int lists/arrays/Tensors, bool masks)")
        return out

    def flip(self, *dims) -> "Tensor":
        """The elements in reverse order along dims (``torch.flip``; what a
        negative-step slice means in numpy): an index_select per dim."""
        dims = _dims(dims)
        shape = list(self.shape)
        out = self
        for d in dims:
            d = d % len(shape) if shape else d
            idx = self._session.tensor(np.arange(shape[d] - 1, -1, -1, dtype=np.int64),
                                       device=self.device)
            out = self._session._op("index_select", out, idx, dim=d)
            out._meta_from(self, shape)
        return out

    def _meta_from(self, src: "Tensor", shape) -> None:
        """Sets the metadata an indexing step derived (shape None: unknown)."""
        self._shape = None if shape is None else tuple(shape)
        self._dtype = src._dtype
        self._device = src._device

    def _slice(self, d: int, k: slice, shape) -> "Tensor":
        start, stop, step = k.start, k.stop, k.step
        for v in (start, stop, step):
            if v is not None and not _is_int(v):
                raise TypeError(f"slice indices must be integers or None, got {v!r}")
        if step is not None and int(step) == 0:
            raise ValueError("slice step cannot be zero")
        if step is not None and int(step) < 0:
            # numpy's meaning (torch refuses it): the selected indices, in that order,
            # through one index_select
            if shape is None:
                shape = list(self.shape)
            idx = np.arange(shape[d], dtype=np.int64)[k]
            out = self._session._op("index_select", self,
                                   self._session.tensor(idx, device=self.device), dim=d)
            shape[d] = len(idx)
            out._meta_from(self, shape)
            return out
        out = self._op("slice", dim=d, start=None if start is None else int(start),
                       stop=None if stop is None else int(stop),
                       step=None if step is None else int(step))
        if shape is not None:
            shape[d] = len(range(*k.indices(shape[d])))
        out._meta_from(self, shape)
        return out

    def _advanced(self, d: int, k, shape):
        """One advanced index at dim d: (output, next dim)."""
        session = self._session
        if isinstance(k, Tensor):
            if k.dtype == "bool":
                mask = k.numpy()
            else:
                ishape = list(k.shape)
                if len(ishape) == 1:
                    out = session._op("index_select", self, k, dim=d)
                else:
                    flat = k.reshape(-1)
                    out = session._op("index_select", self, flat, dim=d)
                    out = out.reshape(*shape[:d], *ishape, *shape[d + 1:])
                shape[d:d + 1] = ishape
                out._meta_from(self, shape)
                return out, d + len(ishape)
        else:
            mask = np.asarray(k)
            if mask.dtype != np.bool_:
                if mask.size == 0:
                    mask = mask.astype(np.int64)
                if not np.issubdtype(mask.dtype, np.integer):
                    raise IndexError(f"index lists must hold ints or bools, got {mask.dtype}")
                n = shape[d]
                if mask.size and (mask.max() >= n or mask.min() < -n):
                    bad = mask[(mask >= n) | (mask < -n)].flat[0]
                    raise IndexError(f"index {bad} is out of bounds for dimension {d} "
                                     f"with size {n}")
                idx = (mask.astype(np.int64) % n) if n else mask.astype(np.int64)
                it = session.tensor(idx.reshape(-1), device=self.device)
                out = session._op("index_select", self, it, dim=d)
                if idx.ndim != 1:
                    out = out.reshape(*shape[:d], *idx.shape, *shape[d + 1:])
                shape[d:d + 1] = list(idx.shape)
                out._meta_from(self, shape)
                return out, d + idx.ndim
        # a bool mask over dims d .. d + mask.ndim
        m = mask.ndim
        if tuple(shape[d:d + m]) != mask.shape:
            raise IndexError(f"the shape of the mask {mask.shape} does not match the shape "
                             f"of the indexed tensor {tuple(shape)} at dim {d}")
        flat = np.flatnonzero(mask).astype(np.int64)
        merged = int(np.prod(mask.shape, dtype=np.int64))
        src = self
        if m != 1:
            src = self.reshape(*shape[:d], merged, *shape[d + m:])
        it = session.tensor(flat, device=self.device)
        out = session._op("index_select", src, it, dim=d)
        shape[d:d + m] = [len(flat)]
        out._meta_from(self, shape)
        return out, d + 1

    # ------------------------------------------------------------ devices, dtypes, autodiff

    def to(self, target=None, *, device=None, dtype=None):
        """A copy on another device (``t.to("cpu:1")``) and/or of another dtype
        (``t.to(dtype="float64")``, or ``t.to("float64")``).

        Moving a tracked tensor keeps it in the autodiff graph. Returns self
        when nothing would change.
        """
        other = _other_daemon(self, target if target is not None else device)
        if other is not None:
            session, dev = other
            if session is self._session:  # "alias/cpu:1" naming this tensor's own daemon
                return self.to(dev if dev is not None else self.device, dtype=dtype)
            out = self if dtype is None else self.to(dtype=dtype)
            return out._session._transfer(out, session, dev)  # daemon to daemon
        if target is not None:
            if isinstance(target, Tensor):  # t.to(other): other's dtype and device
                dtype, device = target.dtype, target.device
            elif _is_dtype(target):
                dtype = target
            else:
                try:
                    device = Device.parse(target)
                except (TypeError, ValueError):
                    raise DeviceSpecError(f"to({target!r}): neither a device nor a dtype: "
                                          f"{HINT}") from None
        out = self
        if dtype is not None:
            name = canonical_name(dtype)  # TypeError at once for a non-dtype
            if self._dtype != name:
                out = out._op("cast", dtype=name)
        if device is not None:
            dev = Device.parse(device)
            if out._device != dev:
                out = self._session._to_device(out, dev)
        return out

    def float(self):
        """This tensor as float32 (self if it is already), as ``torch.Tensor.float``."""
        return self.to(dtype="float32")

    def double(self):
        """This tensor as float64 (self if it is already), as ``torch.Tensor.double``."""
        return self.to(dtype="float64")

    def half(self):
        """This tensor as float16 (self if it is already), as ``torch.Tensor.half``."""
        return self.to(dtype="float16")

    def bfloat16(self):
        """This tensor as bfloat16 (self if it is already), as ``torch.Tensor.bfloat16``."""
        return self.to(dtype="bfloat16")

    def long(self):
        """This tensor as int64 (self if it is already), as ``torch.Tensor.long``."""
        return self.to(dtype="int64")

    def int(self):
        """This tensor as int32 (self if it is already), as ``torch.Tensor.int``."""
        return self.to(dtype="int32")

    def bool(self):
        """This tensor as bool (self if it is already), as ``torch.Tensor.bool``."""
        return self.to(dtype="bool")

    def type_as(self, other: "Tensor"):
        """This tensor cast to other's dtype (``torch.Tensor.type_as``)."""
        return self.to(dtype=other.dtype)

    @property
    def grad(self):
        """The gradient of this tensor from the ``backward()`` calls since the
        last ``zero_grad`` (summed over them, as torch accumulates), or None.

        A handle, asked from the daemon's Gradients the first time it is read
        (one round trip per backward); its values are downloaded only when
        read (``.numpy()``). Assigning sets it for the next ``opt.step()``.
        """
        session = self._session
        session.retain_grads = True
        epoch = session._grad_epoch
        if self._grad is not _UNSET and self._grad[0] == epoch:
            return self._grad[1]
        g = None
        for grads in session._grad_sets:
            part = grads._get_or_none(self)
            if part is not None:
                g = part if g is None else g + part
        self._grad = (epoch, g)
        return g

    @grad.setter
    def grad(self, value):
        if value is not None and not isinstance(value, Tensor):
            raise TypeError(f"grad must be a Tensor or None, got {type(value).__name__}")
        session = self._session
        session.retain_grads = True
        self._grad = (session._grad_epoch, value)
        session._grad_overrides[self._handle] = self

    def detach(self):
        """A tensor sharing the data, outside the autodiff graph."""
        return self._unary("detach")

    def backward(self, grad: "Tensor | None" = None, retain_graph: "bool | None" = None,
                 create_graph: bool = False, inputs=None):
        """Runs the backward pass of self in the daemon; returns the Gradients.

        grad is the gradient of self (None: self must hold one element and
        its gradient is 1). retain_graph defaults to create_graph; with
        create_graph the gradients are differentiable again (tensordd.autograd
        has grad()). inputs: only these tensors' gradients (synchronising).
        Without inputs it is pipelined (``session.pipeline_steps``): its
        errors surface at the next synchronising call, such as ``loss.item()``.
        """
        from .autograd import backward

        return backward(self, grad=grad, retain_graph=retain_graph, create_graph=create_graph,
                        inputs=inputs)


def _element_strings(arr: np.ndarray) -> list:
    """Each value of arr as torch prints it, padded to one width: floats with 4
    decimals, or as ``1.`` when all are integral (numpy's formatter)."""
    opts = {}
    if arr.dtype.kind == "f":
        finite = arr[np.isfinite(arr)]
        integral = finite.size == 0 or bool(np.all(finite == np.round(finite)))
        opts = {"precision": 4, "floatmode": "maxprec" if integral else "fixed"}
    text = np.array2string(arr.reshape(-1), separator=",", threshold=sys.maxsize,
                           max_line_width=sys.maxsize, **opts)
    return [x.strip() for x in text[1:-1].split(",")] if arr.size else []


def _format_values(arr: np.ndarray, cut=None) -> str:
    """The body of torch's repr for arr; cut[d]: dim d holds only its first and last
    REPR_EDGE_ITEMS (a summary), shown with ``...`` between them."""
    if cut is None or not any(cut):
        opts = {}
        if arr.dtype.kind == "f":
            finite = arr[np.isfinite(arr)]
            integral = finite.size == 0 or bool(np.all(finite == np.round(finite)))
            opts = {"precision": 4, "floatmode": "maxprec" if integral else "fixed"}
        return np.array2string(arr, separator=", ", prefix="tensor(", threshold=sys.maxsize,
                               max_line_width=REPR_LINE_WIDTH, **opts)
    elems = _element_strings(arr)
    width = max(len(e) for e in elems)
    elems = [e.rjust(width) for e in elems]
    ndim, k = arr.ndim, REPR_EDGE_ITEMS
    strides = [int(np.prod(arr.shape[d + 1:], dtype=np.int64)) for d in range(ndim)]

    def rec(d: int, base: int) -> str:
        indent = " " * (len("tensor(") + d + 1)
        n = arr.shape[d]
        if d == ndim - 1:
            items = elems[base:base + n]
            if cut[d]:
                items = items[:k] + [" ..."] + items[k:]
            # torch's count: (line width - the vector's indent) // (width + ", ")
            per_line = max(1, (REPR_LINE_WIDTH - len("tensor(") - d) // (width + 2))
            lines = [", ".join(items[i:i + per_line]) for i in range(0, len(items), per_line)]
            return "[" + (",\n" + indent).join(lines) + "]"
        parts = [rec(d + 1, base + i * strides[d]) for i in range(n)]
        if cut[d]:
            parts = parts[:k] + ["..."] + parts[k:]
        return "[" + ("," + "\n" * (ndim - d - 1) + indent).join(parts) + "]"

    return rec(0, 0)


def _as_tuple(x) -> tuple:
    return x if isinstance(x, tuple) else (x,)


def _dim_attr(dim):
    """dim as an int list attribute (None stays None: all dims)."""
    if dim is None:
        return None
    if isinstance(dim, (tuple, list)):
        return [int(d) for d in dim]
    return [int(dim)]


def _other_daemon(t, target):
    """(session, device or None) when target names a daemon rather than a device: a
    Session, or "alias/cpu:0" / "ENDPOINT/cpu:0" of the tensordd.connect_many client t's
    session belongs to; else None."""
    if target is None or isinstance(target, (Tensor, Device)):
        return None
    if hasattr(target, "_transfer") and hasattr(target, "peer_endpoint"):  # a Session
        return target, None
    if isinstance(target, str) and "/" in target:
        multi = getattr(t._session, "_multi", None)
        if multi is None:
            raise DeviceSpecError(f"to({target!r}): a device on another daemon needs a client "
                                  "of several daemons (tensordd.connect_many)")
        return multi._resolve(target)
    return None


def _is_dtype(x) -> bool:
    if isinstance(x, Device):
        return False
    return canonical_name(x, strict=False) is not None


def _as_index(t):
    """An integer index tensor narrower than int64 (uint8, int8, int16, int32) cast to
    int64, the daemon's index dtype; anything else as it is (the daemon judges it)."""
    if isinstance(t, Tensor) and t.dtype in ("uint8", "int8", "int16", "int32"):
        return t.to(dtype="int64")
    return t
