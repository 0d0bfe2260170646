"""tensor -- Tensor: a handle to a tensor living in the daemon.

Every method sends one asynchronous op (named as in PyTorch) and returns the
output Tensor at once; nothing waits for the daemon until a value is needed
(``numpy()``, ``item()``, ``shape`` of an op's output, ``backward()``).
A Tensor's handle is released when the Python object dies: the id is queued
and goes out in one batched Release with the session's next request.
"""

from __future__ import annotations

import numbers

import numpy as np

from .device import Device
from .dtypes import dtype_name

__all__ = ["Tensor"]


def _dims(args) -> list:
    """(2, 3) from f(2, 3) or f((2, 3))."""
    if len(args) == 1 and isinstance(args[0], (tuple, list)):
        args = args[0]
    return [int(a) for a in args]


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
                 "__weakref__")

    def __init__(self, session, handle: int, shape=None, dtype=None, device=None,
                 requires_grad=None):
        self._session = session
        self._handle = handle
        self._shape = shape
        self._dtype = dtype
        self._device = device
        self._requires_grad = requires_grad

    def __del__(self):
        session = getattr(self, "_session", None)
        if session is not None:
            session._release_later(self._handle)

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
        return self._session

    @property
    def shape(self) -> tuple:
        """The shape; for an op's output, asked from the daemon once (Describe)."""
        if self._shape is None:
            self._session._describe_tensor(self)
        return self._shape

    @property
    def dtype(self) -> str:
        """The numpy name of the dtype ("float32")."""
        if self._dtype is None:
            self._session._describe_tensor(self)
        return self._dtype

    @property
    def device(self) -> Device:
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
        return len(self.shape)

    def dim(self) -> int:
        return len(self.shape)

    def size(self, dim=None):
        """The shape, or one of its sizes."""
        return self.shape if dim is None else self.shape[dim]

    def numel(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __repr__(self) -> str:
        # Only what is known: a repr never waits for the daemon.
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

    # Tensors define ==, so identity hashing must be asked for (as torch does).
    __hash__ = object.__hash__

    # ------------------------------------------------------------ values

    def numpy(self) -> np.ndarray:
        """Downloads the tensor into a new numpy array (synchronising)."""
        return self._session._download(self)

    def tolist(self):
        return self.numpy().tolist()

    def item(self):
        """The value of a one-element tensor as a Python number."""
        arr = self.numpy()
        if arr.size != 1:
            raise ValueError(f"item() needs a tensor with one element, got shape {arr.shape}")
        return arr.reshape(()).item()

    def __float__(self) -> float:
        return float(self.item())

    def __int__(self) -> int:
        return int(self.item())

    def __bool__(self) -> bool:
        return bool(self.item())

    def __array__(self, dtype=None):
        arr = self.numpy()
        return arr if dtype is None else arr.astype(dtype, copy=False)

    # ------------------------------------------------------------ plumbing

    def _op(self, name: str, *others, **attrs) -> "Tensor":
        return self._session.op(name, self, *others, **attrs)

    def _binary(self, name: str, other) -> "Tensor":
        """A tensor op, or its scalar form (one input and attr other=float)."""
        if isinstance(other, Tensor):
            return self._session.op(name, self, other)
        if _is_scalar(other):
            return self._session.op(name, self, other=float(other))
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
            return self._session.op("matmul", self, other)
        return NotImplemented

    def __pow__(self, exponent):
        return self.pow(exponent)

    def __neg__(self):
        return self._op("neg")

    def __pos__(self):
        return self

    def __abs__(self):
        return self._op("abs")

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
        return self._binary("add", other)

    def sub(self, other):
        return self._binary("sub", other)

    def mul(self, other):
        return self._binary("mul", other)

    def div(self, other):
        return self._binary("div", other)

    def matmul(self, other: "Tensor") -> "Tensor":
        return self._session.op("matmul", self, other)

    def mm(self, other: "Tensor") -> "Tensor":
        """2-D matrix product (``torch.mm``)."""
        return self._session.op("matmul", self, other)

    def bmm(self, other: "Tensor") -> "Tensor":
        """Batched matrix product of (b, n, m) and (b, m, p) tensors."""
        return self._session.op("bmm", self, other)

    def pow(self, exponent):
        """self ** exponent: a scalar exponent (attr) or a tensor of exponents."""
        if isinstance(exponent, Tensor):
            return self._session.op("pow", self, exponent)
        return self._op("pow", other=float(exponent))

    def maximum(self, other: "Tensor") -> "Tensor":
        return self._session.op("maximum", self, other)

    def minimum(self, other: "Tensor") -> "Tensor":
        return self._session.op("minimum", self, other)

    def eq(self, other):
        return self._binary("eq", other)

    def ne(self, other):
        return self._binary("ne", other)

    def lt(self, other):
        return self._binary("lt", other)

    def le(self, other):
        return self._binary("le", other)

    def gt(self, other):
        return self._binary("gt", other)

    def ge(self, other):
        return self._binary("ge", other)

    def clamp(self, min=None, max=None):  # noqa: A002 (PyTorch's argument names)
        return self._op("clamp", min=None if min is None else float(min),
                        max=None if max is None else float(max))

    def masked_fill(self, mask: "Tensor", value) -> "Tensor":
        """self with value where mask (bool, broadcastable) is true."""
        return self._session.op("masked_fill", self, mask, value=value)

    def where(self, condition: "Tensor", other: "Tensor") -> "Tensor":
        """Elements of self where condition holds, else of other (``torch.where(c, self, other)``)."""
        return self._session.op("where", condition, self, other)

    # ------------------------------------------------------------ elementwise

    def neg(self):
        return self._op("neg")

    def abs(self):
        return self._op("abs")

    def relu(self):
        return self._op("relu")

    def gelu(self):
        return self._op("gelu")

    def sigmoid(self):
        return self._op("sigmoid")

    def tanh(self):
        return self._op("tanh")

    def exp(self):
        return self._op("exp")

    def log(self):
        return self._op("log")

    def sqrt(self):
        return self._op("sqrt")

    def rsqrt(self):
        return self._op("rsqrt")

    def reciprocal(self):
        return self._op("reciprocal")

    def square(self):
        return self._op("square")

    def sin(self):
        return self._op("sin")

    def cos(self):
        return self._op("cos")

    def sign(self):
        return self._op("sign")

    def log1p(self):
        return self._op("log1p")

    def expm1(self):
        return self._op("expm1")

    def floor(self):
        return self._op("floor")

    def ceil(self):
        return self._op("ceil")

    def round(self):
        return self._op("round")

    def silu(self):
        return self._op("silu")

    def leaky_relu(self, negative_slope: float = 0.01):
        return self._op("leaky_relu", negative_slope=float(negative_slope))

    def softplus(self, beta: float = 1.0, threshold: float = 20.0):
        return self._op("softplus", beta=float(beta), threshold=float(threshold))

    def logical_not(self):
        return self._op("logical_not")

    # ------------------------------------------------------------ reductions

    def sum(self, dim=None, keepdim: bool = False):
        """Sum of all elements, or over dim (an int or a tuple of ints)."""
        return self._op("sum", dim=_dim_attr(dim), keepdim=keepdim if dim is not None else None)

    def mean(self, dim=None, keepdim: bool = False):
        return self._op("mean", dim=_dim_attr(dim), keepdim=keepdim if dim is not None else None)

    def amax(self, dim=None, keepdim: bool = False):
        return self._op("amax", dim=_dim_attr(dim), keepdim=keepdim if dim is not None else None)

    def amin(self, dim=None, keepdim: bool = False):
        return self._op("amin", dim=_dim_attr(dim), keepdim=keepdim if dim is not None else None)

    def argmax(self, dim=None, keepdim: bool = False):
        return self._op("argmax", dim=dim, keepdim=keepdim if dim is not None else None)

    def argmin(self, dim=None, keepdim: bool = False):
        return self._op("argmin", dim=dim, keepdim=keepdim if dim is not None else None)

    def prod(self, dim=None, keepdim: bool = False):
        return self._op("prod", dim=_dim_attr(dim), keepdim=keepdim if dim is not None else None)

    def var(self, dim=None, keepdim: bool = False, unbiased: bool = True):
        return self._op("var", dim=_dim_attr(dim), keepdim=keepdim if dim is not None else None,
                        unbiased=unbiased)

    def std(self, dim=None, keepdim: bool = False, unbiased: bool = True):
        return self._op("std", dim=_dim_attr(dim), keepdim=keepdim if dim is not None else None,
                        unbiased=unbiased)

    def logsumexp(self, dim, keepdim: bool = False):
        return self._op("logsumexp", dim=_dim_attr(dim), keepdim=keepdim)

    def cumsum(self, dim: int):
        return self._op("cumsum", dim=int(dim))

    def softmax(self, dim: int):
        return self._op("softmax", dim=int(dim))

    def log_softmax(self, dim: int):
        return self._op("log_softmax", dim=int(dim))

    # ------------------------------------------------------------ shape

    def reshape(self, *shape):
        """A tensor of the same data with a new shape (one entry may be -1)."""
        return self._op("reshape", shape=_dims(shape))

    def view(self, *shape):
        return self._op("view", shape=_dims(shape))

    def transpose(self, dim0: int, dim1: int):
        return self._op("transpose", dim0=int(dim0), dim1=int(dim1))

    def permute(self, *dims):
        return self._op("permute", dims=_dims(dims))

    def t(self):
        """The transpose of a 2-D tensor (``transpose(0, 1)``)."""
        return self.transpose(0, 1)

    @property
    def T(self):  # noqa: N802 (PyTorch's name)
        return self.t()

    def flatten(self, start_dim: int = 0, end_dim: int = -1):
        return self._op("flatten", start_dim=int(start_dim), end_dim=int(end_dim))

    def unsqueeze(self, dim: int):
        return self._op("unsqueeze", dim=int(dim))

    def squeeze(self, dim=None):
        return self._op("squeeze", dim=dim)

    def expand(self, *sizes):
        return self._op("expand", shape=_dims(sizes))

    def contiguous(self):
        return self._op("contiguous")

    def clone(self):
        return self._op("clone")

    def split(self, split_size, dim: int = 0) -> tuple:
        """Pieces of split_size along dim (the last may be smaller), or pieces of
        the sizes listed. Needs the size of dim (a Describe if not yet known)."""
        if isinstance(split_size, (list, tuple)):
            sizes = [int(k) for k in split_size]
            return self._session.op("split", self, split_sizes=sizes, dim=int(dim),
                                    num_outputs=len(sizes))
        size, step = self.shape[dim], int(split_size)
        if step <= 0:
            raise ValueError("split_size must be positive")
        count = max(1, -(-size // step))
        return _as_tuple(self._session.op("split", self, split_size=step, dim=int(dim),
                                          num_outputs=count))

    def chunk(self, chunks: int, dim: int = 0) -> tuple:
        """Up to `chunks` pieces along dim, as torch.chunk (sizes ceil(n / chunks))."""
        if int(chunks) <= 0:
            raise ValueError("chunks must be positive")
        size = self.shape[dim]
        step = max(1, -(-size // int(chunks)))
        count = max(1, -(-size // step))
        return _as_tuple(self._session.op("chunk", self, chunks=int(chunks), dim=int(dim),
                                          num_outputs=count))

    def tril(self, diagonal: int = 0):
        return self._op("tril", diagonal=int(diagonal))

    def triu(self, diagonal: int = 0):
        return self._op("triu", diagonal=int(diagonal))

    def gather(self, dim: int, index: "Tensor") -> "Tensor":
        return self._session.op("gather", self, index, dim=int(dim))

    def index_select(self, dim: int, index: "Tensor") -> "Tensor":
        return self._session.op("index_select", self, index, dim=int(dim))

    def __getitem__(self, key):
        """Basic indexing as in PyTorch: ints, slices with a positive step, None,
        Ellipsis, and a 1-D integer Tensor (index_select on that dim).
        Each index becomes a view op (slice, squeeze, unsqueeze)."""
        key = key if isinstance(key, tuple) else (key,)
        if any(k is Ellipsis for k in key):
            at = key.index(Ellipsis)
            if Ellipsis in key[at + 1:]:
                raise IndexError("an index can only have a single ellipsis")
            used = sum(k is not None for k in key) - 1
            key = key[:at] + (slice(None),) * (self.ndim - used) + key[at + 1:]
        out, d = self, 0
        for k in key:
            if k is None:
                out, d = out.unsqueeze(d), d + 1
            elif isinstance(k, Tensor):
                out, d = out.index_select(d, k), d + 1
            elif isinstance(k, slice):
                if k != slice(None):
                    start, stop, step = k.start, k.stop, k.step
                    if step is not None and int(step) <= 0:
                        raise ValueError("slice steps must be positive")
                    out = out._op("slice", dim=d, start=None if start is None else int(start),
                                  stop=None if stop is None else int(stop),
                                  step=None if step is None else int(step))
                d += 1
            elif isinstance(k, (int, np.integer)) and not isinstance(k, (bool, np.bool_)):
                i = int(k)
                if out._shape is not None:
                    if d >= len(out._shape):
                        raise IndexError(f"too many indices for a {len(out._shape)}-D tensor")
                    if not -out._shape[d] <= i < out._shape[d]:
                        raise IndexError(f"index {i} is out of bounds for dim {d} of size "
                                         f"{out._shape[d]}")
                out = out._op("slice", dim=d, start=i, stop=None if i == -1 else i + 1)
                out = out._op("squeeze", dim=d)
            else:
                raise TypeError(f"unsupported index {k!r}")
        return out

    # ------------------------------------------------------------ devices, dtypes, autodiff

    def to(self, target=None, *, device=None, dtype=None):
        """A copy on another device (``t.to("cpu:1")``) and/or of another dtype
        (``t.to(dtype="float64")``, or ``t.to("float64")``).

        Moving a tracked tensor keeps it in the autodiff graph. Returns self
        when nothing would change.
        """
        if target is not None:
            if _is_dtype(target):
                dtype = target
            else:
                device = target
        out = self
        if dtype is not None:
            if self._dtype != _dtype_name(dtype):
                out = out._op("cast", dtype=dtype)
        if device is not None:
            dev = Device.parse(device)
            if out._device != dev:
                out = self._session._to_device(out, dev)
        return out

    def float(self):
        return self.to(dtype="float32")

    def double(self):
        return self.to(dtype="float64")

    def detach(self):
        """A tensor sharing the data, outside the autodiff graph."""
        return self._op("detach")

    def backward(self, grad: "Tensor | None" = None, retain_graph: bool = False):
        """Runs the backward pass of self in the daemon; returns the Gradients.

        grad is the gradient of self (None: self must hold one element and
        its gradient is 1). Synchronising.
        """
        from .autograd import backward

        return backward(self, grad=grad, retain_graph=retain_graph)


def _as_tuple(x) -> tuple:
    return x if isinstance(x, tuple) else (x,)


def _dim_attr(dim):
    """dim as an int list attribute (None stays None: all dims)."""
    if dim is None:
        return None
    if isinstance(dim, (tuple, list)):
        return [int(d) for d in dim]
    return [int(dim)]


def _is_dtype(x) -> bool:
    if isinstance(x, Device):
        return False
    if isinstance(x, str):
        return x == "bfloat16" or _dtype_name(x) is not None
    return True


def _dtype_name(x):
    """numpy's name for x ("float32"), "bfloat16", or None if x is no dtype."""
    if isinstance(x, str) and x == "bfloat16":
        return x
    try:
        return np.dtype(x).name
    except TypeError:
        return None
