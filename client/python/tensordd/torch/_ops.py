"""The aten ops of the tensordd torch device: how each one runs in the daemon.

Every aten op below autograd arrives at :func:`dispatch` with DaemonTensor
arguments. It is, in this order:

* a *special* op (copies between host and daemon, reading a value, random fills,
  factories): a handler of its own;
* a *mapped* op (``@impl``): torch's meta kernel runs first on meta tensors of the
  arguments' sizes and strides (which raises torch's own error for a shape, dtype
  or argument the op refuses, at the call) and gives the outputs' sizes and dtypes;
  then the mapping sends the daemon ops;
* a *view* (the schema says its output aliases its input): the meta kernel gives
  the view's size, stride and offset, and the output shares the input's storage;
* an *in-place* (``add_``) or *out=* form of a mapped op: the mapped op's result is
  written into the tensor's storage;
* an op torch decomposes (``torch._decomp``) into other aten ops: the decomposition;
* anything else: NotImplementedError naming the op.

``python -m tensordd.torch`` prints the table of what maps to what.
"""

from __future__ import annotations

import math
import numbers

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from . import (DaemonTensor, _contig_strides, _download, _dt, _empty, _new, _prod, _value,
               _write)
from ..tensor import Tensor as _DTensor

aten = torch.ops.aten

# op overload -> (function, the daemon ops it sends)
_IMPL: dict = {}
_HANDLERS: dict = {}
_SPECIAL: dict = {}


def impl(*ops, uses: str = ""):
    def deco(fn):
        for op in ops:
            _IMPL[op] = (fn, uses)
        return fn
    return deco


def special(*ops, uses: str = ""):
    def deco(fn):
        for op in ops:
            _SPECIAL[op] = (fn, uses)
        return fn
    return deco


class _Out:
    """An output whose size and dtype the mapping gives (ops without a meta kernel)."""

    __slots__ = ("v", "size", "dtype")

    def __init__(self, v, size, dtype):
        self.v = v
        self.size = tuple(size)
        self.dtype = dtype


class _Ctx:
    __slots__ = ("dev", "s", "d", "out", "margs")

    def __init__(self, dev, out, margs):
        self.dev = dev
        self.s = dev.session
        self.d = dev.ddev
        self.out = out
        self.margs = margs

    def op(self, name, *ins, **attrs):
        # list attributes as tuples: the session encodes a tuple of ints once and reuses
        # the bytes (a list goes through protobuf at every call)
        for k, v in attrs.items():
            if type(v) is list:
                attrs[k] = tuple(v)
        return self.s._op(name, *ins, **attrs)

    def create(self, name, shape, dtype, **attrs):
        return self.s._op(name, shape=[int(x) for x in shape], device=self.d, dtype=_dt(dtype),
                         **attrs)

    def full(self, shape, value, dtype):
        return self.s._op("full", shape=[int(x) for x in shape], value=_num(value, dtype),
                         device=self.d, dtype=_dt(dtype))

    def scalar(self, value, dtype):
        return self.full((), value, dtype)


def _num(x, dtype):
    """A Python number for an attribute, int for an integral dtype."""
    if isinstance(x, torch.Tensor):
        x = x.item()
    if dtype is not None and not dtype.is_floating_point and dtype != torch.bool:
        if isinstance(x, (bool, numbers.Integral)) or float(x).is_integer():
            return int(x)
    if isinstance(x, bool):
        return int(x) if dtype is None or not dtype.is_floating_point else float(x)
    if isinstance(x, numbers.Integral) and (dtype is None or not dtype.is_floating_point):
        return int(x)
    return float(x)


def _dtype_of(v):
    """The torch dtype of a daemon value (set from torch's metadata) or a number."""
    if isinstance(v, _DTensor):
        return _TORCH_DT.get(v._dtype)
    if isinstance(v, bool):
        return torch.bool
    if isinstance(v, numbers.Integral):
        return torch.int64
    return torch.float32


_TORCH_DT = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
             "bfloat16": torch.bfloat16, "int32": torch.int32, "int64": torch.int64,
             "bool": torch.bool, "uint8": torch.uint8, "int8": torch.int8,
             "int16": torch.int16}


def _cast(c, v, dtype):
    """v (a daemon value) as dtype; a no-op when it already is."""
    if not isinstance(v, _DTensor):
        return v
    if v._dtype is not None and _TORCH_DT.get(v._dtype) == dtype:
        return v
    out = c.s._op("cast", v, dtype=_dt(dtype))
    out._dtype = _dt(dtype)
    out._shape = v._shape
    return out


def _tensor(c, v, dtype):
    """v as a daemon tensor of dtype (a number becomes a 0-d tensor)."""
    if isinstance(v, _DTensor):
        return _cast(c, v, dtype)
    return c.scalar(v, dtype)


def _shape(v) -> tuple:
    return tuple(v._shape)


def _dims(dim, ndim):
    if dim is None:
        return None
    if isinstance(dim, int):
        dim = [dim]
    dim = [d % ndim if ndim else 0 for d in dim]
    return dim or None


# ---------------------------------------------------------------- dispatch

_DEVICE_ERR = ("Expected all tensors to be on the same device, but found at least two "
               "devices, {} and {}!")


def _meta_of(a: DaemonTensor, view: bool = False):
    size, stride, off = a._geo
    if view and off:
        base = torch.empty((a._st.numel,), dtype=a.dtype, device="meta")
        return base.as_strided(size, stride, off)
    return torch.empty_strided(size, stride, dtype=a.dtype, device="meta")


class _Prep:
    """One pass over an op's arguments (a flat tuple, lists of tensors one level down,
    kwargs): the device, the daemon values, and a signature of what torch's meta kernel
    sees (sizes, strides and dtypes; ints as they are; floats by type) that keys the
    cache of its outputs."""

    __slots__ = ("dev", "other", "sig", "tensors")

    def __init__(self):
        self.dev = None
        self.other = None
        self.sig = []
        self.tensors = False

    def value(self, a):
        if isinstance(a, DaemonTensor):
            d = a._st.dev
            if self.dev is None:
                self.dev = d
            elif d is not self.dev:
                raise RuntimeError(_DEVICE_ERR.format(self.dev.tdev, d.tdev))
            g = a._geo
            self.sig.append((g[0], g[1], a.dtype))
            return _value(a)
        if isinstance(a, (list, tuple)):
            if a and isinstance(a[0], torch.Tensor) or any(isinstance(x, torch.Tensor)
                                                           for x in a):
                self.sig.append(len(a))
                return type(a)(self.value(x) for x in a)
            self.sig.append(tuple(a))
            return a
        if isinstance(a, torch.Tensor):
            if a.dim() == 0 and a.device.type == "cpu":  # a host scalar, as with CUDA
                self.sig.append(("host", a.dtype))
                return a.item()
            self.other = self.other or a.device
            self.sig.append(("other", id(a)))
            return a
        if isinstance(a, float):
            self.sig.append(float)
        else:
            try:
                hash(a)
                self.sig.append(a)
            except TypeError:
                self.sig.append(("unhashable", id(a)))
        return a


def _meta_arg(a):
    if isinstance(a, DaemonTensor):
        return _meta_of(a)
    if isinstance(a, (list, tuple)) and any(isinstance(x, torch.Tensor) for x in a):
        return type(a)(_meta_arg(x) for x in a)
    if isinstance(a, torch.Tensor) and a.dim() == 0 and a.device.type == "cpu":
        return torch.empty((), dtype=a.dtype, device="meta")
    return a


def _prepare(args, kwargs):
    """(device, signature, value args, value kwargs)."""
    p = _Prep()
    vargs = tuple(p.value(a) for a in args)
    if kwargs:
        vkwargs = {}
        for k, v in kwargs.items():
            p.sig.append(k)
            vkwargs[k] = p.value(v)
    else:
        vkwargs = kwargs
    if p.other is not None:
        raise RuntimeError(_DEVICE_ERR.format(p.dev.tdev if p.dev else "privateuseone",
                                              p.other))
    return p.dev, tuple(p.sig), vargs, vkwargs


# (op, signature) -> (meta outputs, meta args): torch's meta kernel runs once per signature
_META_CACHE: dict = {}
_META_CACHE_MAX = 8192


def _metas(func, sig, args, kwargs, oop=None):
    """The meta outputs (of oop, when given: an in-place op's out-of-place form) and the
    meta args; func's own meta kernel runs first (its checks)."""
    key = (func, sig)
    got = _META_CACHE.get(key)
    if got is not None:
        return got
    margs = tuple(_meta_arg(a) for a in args)
    mkwargs = {k: _meta_arg(v) for k, v in kwargs.items()} if kwargs else {}
    out = _meta_call(func, margs, mkwargs)
    if oop is not None:
        out = _meta_call(oop, margs, mkwargs)
    if len(_META_CACHE) >= _META_CACHE_MAX:
        _META_CACHE.clear()
    got = _META_CACHE[key] = (out, margs)
    return got


def _meta_call(func, margs, mkwargs):
    try:
        return func(*margs, **mkwargs)
    except NotImplementedError:
        return None  # no meta kernel: the mapping says the outputs' sizes


def _wrap(dev, res, out):
    if isinstance(res, _Out):
        return _new(dev, res.v, res.size, res.dtype)
    if isinstance(res, (tuple, list)):
        outs = out if isinstance(out, (tuple, list)) else [None] * len(res)
        return type(res)(_wrap(dev, r, o) for r, o in zip(res, outs))
    if isinstance(res, _DTensor):
        if not isinstance(out, torch.Tensor):
            raise RuntimeError("tensordd.torch: internal: an output without its size")
        return _new(dev, res, tuple(out.shape), out.dtype)
    return res


def _compute_handler(fn):
    def h(func, args, kwargs):
        dev, sig, vargs, vkwargs = _prepare(args, kwargs)
        out, margs = _metas(func, sig, args, kwargs)
        res = fn(_Ctx(dev, out, margs), *vargs, **vkwargs)
        return _wrap(dev, res, out)
    return h


def _store(c, target: DaemonTensor, res, out_meta):
    """Writes a mapped op's result into target (in-place and out= forms)."""
    if isinstance(res, _Out):
        res = res.v
    if out_meta is not None and tuple(out_meta.shape) != tuple(target.shape):
        res = c.op("expand", res, shape=tuple(target.shape))
    res = _cast(c, res, target.dtype) if out_meta is None or out_meta.dtype != target.dtype \
        else res
    _write(target, res)


def _inplace_handler(fn, oop):
    def h(func, args, kwargs):
        dev, sig, vargs, vkwargs = _prepare(args, kwargs)
        # torch's checks of the in-place form (broadcast, cast), then the result's metas
        out, margs = _metas(func, sig, args, kwargs, oop)
        c = _Ctx(dev, out, margs)
        res = fn(c, *vargs, **vkwargs)
        _store(c, args[0], res, out)
        return args[0]
    return h


def _out_handler(fn, oop):
    def h(func, args, kwargs):
        kwargs = dict(kwargs)
        target = kwargs.pop("out")
        if not isinstance(target, DaemonTensor):
            raise NotImplementedError(f"tensordd.torch: {func} with an out= tensor not on the "
                                      f"device")
        dev, sig, vargs, vkwargs = _prepare(args, kwargs)
        out, margs = _metas(oop, sig, args, kwargs)
        if out is not None and tuple(out.shape) != tuple(target.shape):
            raise RuntimeError(f"tensordd.torch: {func}: the out= tensor has shape "
                               f"{tuple(target.shape)}, the result {tuple(out.shape)} (resize "
                               f"out= tensors before the call)")
        c = _Ctx(dev, out, margs)
        _store(c, target, fn(c, *vargs, **vkwargs), out)
        return target
    return h


_VIEW_CACHE: dict = {}


def _view_handler(func, args, kwargs):
    src = args[0]
    if len(args) > 0 and isinstance(src, DaemonTensor) and not kwargs:
        try:
            key = (func, src._geo, src._st.numel, src.dtype,
                   tuple(tuple(a) if isinstance(a, list) else a for a in args[1:]))
            hash(key)
        except TypeError:
            key = None
        if key is not None:
            geos = _VIEW_CACHE.get(key)
            if geos is None:
                out = _view_metas(func, args, kwargs)
                geos = [(tuple(m.shape), m.stride(), m.storage_offset())
                        if isinstance(m, torch.Tensor) else m for m in
                        (out if isinstance(out, (list, tuple)) else [out])]
                geos = (type(out) if isinstance(out, (list, tuple)) else None, geos)
                if len(_VIEW_CACHE) >= _META_CACHE_MAX:
                    _VIEW_CACHE.clear()
                _VIEW_CACHE[key] = geos
            kind, items = geos
            st = src._st
            res = [DaemonTensor(st, g[0], g[1], g[2]) for g in items]
            return kind(res) if kind is not None else res[0]
    return _view_slow(func, args, kwargs)


def _view_metas(func, args, kwargs):
    src = args[0]
    flat, spec = tree_flatten((args, kwargs))
    metas = []
    for a in flat:
        if isinstance(a, DaemonTensor):
            if a._st.dev is not src._st.dev:
                raise RuntimeError(_DEVICE_ERR.format(src.device, a.device))
            metas.append(_meta_of(a, view=a is src))
        elif isinstance(a, torch.Tensor):
            raise RuntimeError(_DEVICE_ERR.format(src.device, a.device))
        else:
            metas.append(a)
    margs, mkwargs = tree_unflatten(metas, spec)
    out = func(*margs, **mkwargs)
    st = src._st
    for m in (out if isinstance(out, (list, tuple)) else [out]):
        if isinstance(m, torch.Tensor) and m.dtype != st.dtype:
            raise NotImplementedError(f"tensordd.torch: the view {func} changes the dtype "
                                      f"({st.dtype} -> {m.dtype}); the daemon cannot "
                                      f"reinterpret bytes")
    return out


def _view_slow(func, args, kwargs):
    out = _view_metas(func, args, kwargs)  # checked: same device, same dtype
    st = args[0]._st

    def wrap(m):
        if not isinstance(m, torch.Tensor):
            return m
        return DaemonTensor(st, tuple(m.shape), m.stride(), m.storage_offset())

    if isinstance(out, (list, tuple)):
        return type(out)(wrap(m) for m in out)
    return wrap(out)


def _unmapped(func):
    def h(func_, args, kwargs):
        raise NotImplementedError(
            f"tensordd.torch: the aten op {func} has no mapping to the daemon's ops "
            f"(`python -m tensordd.torch` lists those that have one)")
    return h


def _is_view(func) -> bool:
    s = func._schema
    if not s.returns or not s.arguments:
        return False
    a0 = s.arguments[0].alias_info
    r0 = s.returns[0].alias_info
    return a0 is not None and not a0.is_write and r0 is not None and not r0.is_write


def _is_inplace(func) -> bool:
    s = func._schema
    name = s.name.split("::")[-1]
    return (name.endswith("_") and bool(s.arguments) and s.arguments[0].alias_info is not None
            and s.arguments[0].alias_info.is_write)


def _functional(func):
    """The out-of-place overload of an in-place or out= overload, or None."""
    s = func._schema
    name = s.name.split("::")[-1]
    ov = s.overload_name
    if name.endswith("_"):
        name = name[:-1]
    elif ov in ("out", "grad_input", "output", "values") or ov.endswith("_out"):
        ov = "default" if ov in ("out", "grad_input", "output", "values") else ov[:-4]
    else:
        return None
    packet = getattr(aten, name, None)
    if packet is None:
        return None
    try:
        return getattr(packet, ov or "default")
    except AttributeError:
        try:
            return packet.default
        except AttributeError:
            return None


def _is_out(func) -> bool:
    return any(a.name == "out" and a.alias_info is not None and a.alias_info.is_write
               for a in func._schema.arguments)


def _decomposition(func):
    from torch._decomp import decomposition_table
    return decomposition_table.get(func)


def resolve(func):
    """The handler of an aten op overload and how it runs: (handler, how, uses)."""
    if func in _SPECIAL:
        fn, uses = _SPECIAL[func]
        return fn, "host" if uses.startswith("host") else "special", uses
    if func in _IMPL:
        fn, uses = _IMPL[func]
        return _compute_handler(fn), "mapped", uses
    if _is_view(func):
        return _view_handler, "view", "storage view (reshape/permute/slice/expand/" \
                                      "index_select when read)"
    oop = _functional(func)
    if oop is not None and oop in _IMPL:
        fn, uses = _IMPL[oop]
        if _is_inplace(func):
            return _inplace_handler(fn, oop), "in-place", f"{oop} written into the storage"
        if _is_out(func):
            return _out_handler(fn, oop), "out=", f"{oop} written into out"
    dec = _decomposition(func)
    if dec is not None and func not in _NO_DECOMP:
        return _decomposed(func, dec), "decomposed", \
            "torch._decomp's decomposition into other aten ops"
    return _unmapped(func), None, ""


_NO_DECOMP: set = set()


def _decomposed(func, dec):
    def h(func_, args, kwargs):
        try:
            return dec(*args, **kwargs)
        except NotImplementedError as e:
            if str(func) in str(e):
                raise
            raise NotImplementedError(
                f"tensordd.torch: the aten op {func} has no mapping to the daemon's ops: its "
                f"decomposition reaches an op without one ({e})") from None
    return h


def dispatch(func, args, kwargs):
    h = _HANDLERS.get(func)
    if h is None:
        h = _HANDLERS[func] = resolve(func)[0]
    return h(func, args, kwargs)


# ================================================================ special ops

def _target_dev(device):
    from . import _dev_of
    return _dev_of(device)


def _upload(dev, host: torch.Tensor, dtype, what="copying host data to the device (an upload)"):
    """A CPU tensor uploaded to dev as dtype: a daemon value."""
    from . import _cap
    if _cap is not None:
        _cap.refuse(what)
    host = host.detach()
    if host.dtype != dtype:
        host = host.to(dtype)
    if not host.is_contiguous():
        host = host.contiguous()
    v = dev.session.tensor(host, device=dev.ddev, requires_grad=False)
    v._dtype = _dt(dtype)
    v._shape = tuple(host.shape)
    return v


def _moved(src: DaemonTensor, dev, dtype):
    """src's value on dev (another daemon device or session) as dtype."""
    v = _value(src)
    sdev = src._st.dev
    c = _Ctx(sdev, None, None)
    v = _cast(c, v, dtype)
    if sdev is dev:
        return v
    if sdev.session is dev.session:
        out = v.to(dev.ddev)
        out._dtype = _dt(dtype)
        out._shape = tuple(src.shape)
        return out
    return _upload(dev, _download(src), dtype)


@special(aten.copy_.default, uses="upload / download / cast / to_device, then the write")
def _copy_(func, args, kwargs):
    dst, src = args[0], args[1]
    if isinstance(dst, DaemonTensor):
        dev = dst._st.dev
        if isinstance(src, DaemonTensor):
            v = _moved(src, dev, dst.dtype)
        else:
            host = src.detach()
            if tuple(host.shape) != tuple(dst.shape):
                host = host.expand(dst.shape)
            v = _upload(dev, host, dst.dtype)
        if tuple(src.shape) != tuple(dst.shape):
            torch.empty(dst.shape, device="meta").copy_(torch.empty(src.shape, device="meta"))
            if isinstance(src, DaemonTensor):
                v = dev.session._op("expand", v, shape=tuple(dst.shape))
        _write(dst, v)
        return dst
    host = _download(src)
    with torch.no_grad():
        dst.copy_(host)
    return dst


@special(aten._to_copy.default, uses="download / cast / to_device / upload")
def _to_copy(func, args, kwargs):
    src = args[0]
    dtype = kwargs.get("dtype") or src.dtype
    device = kwargs.get("device")
    device = torch.device(device) if device is not None else src.device
    if device.type == "privateuseone":
        dev = _target_dev(device)
        v = _moved(src, dev, dtype)
        return _new(dev, v, tuple(src.shape), dtype)
    if device.type == "cpu":
        host = _download(src)
        return host.to(dtype) if host.dtype != dtype else host
    raise NotImplementedError(f"tensordd.torch: copying to {device} (through .cpu())")


@special(aten._local_scalar_dense.default, uses="host: download")
def _local_scalar_dense(func, args, kwargs):
    return _download(args[0], ".item() (aten._local_scalar_dense)").item()


@special(aten.equal.default, uses="host: download both")
def _equal(func, args, kwargs):
    a, b = args
    return torch.equal(_download(a) if isinstance(a, DaemonTensor) else a,
                       _download(b) if isinstance(b, DaemonTensor) else b)


@special(aten.nonzero.default, uses="host: download, upload (synchronising, as CUDA's)")
def _nonzero(func, args, kwargs):
    host = torch.nonzero(_download(args[0], "torch.nonzero (its output's size is a value)"))
    dev = args[0]._st.dev
    return _new(dev, _upload(dev, host, torch.int64), host.shape, torch.int64)


def _daemon_draw(func, self, args, kwargs):
    """The value of a random fill of self drawn by the daemon (rand/randn from the
    session's random stream: a graph's replay draws again), or None for a fill it does
    not draw (random_, exponential_, a generator given)."""
    if kwargs.get("generator") is not None or not self.dtype.is_floating_point:
        return None
    d = self._st.dev
    s = d.session
    shape = [int(x) for x in self.shape]
    ft = "float32" if self.dtype in (torch.float16, torch.bfloat16) else _dt(self.dtype)

    def arg(i, name, default):
        return args[i] if len(args) > i else kwargs.get(name, default)

    if func is aten.bernoulli_.float:
        p = float(arg(1, "p", 0.5))
        v = s._op("lt", s._op("rand", shape=shape, device=d.ddev, dtype=ft), other=p)
    elif func is aten.bernoulli_.Tensor:
        p = args[1]
        if not isinstance(p, DaemonTensor):
            return None
        pv = _value(p)
        if p.dtype != torch.float32:
            pv = s._op("cast", pv, dtype=ft)
        r = s._op("rand", shape=shape, device=d.ddev, dtype=ft)
        if tuple(p.shape) != tuple(self.shape):
            pv = s._op("expand", pv, shape=shape)
        v = s._op("lt", r, pv)
    elif func is aten.uniform_.default:
        lo, hi = float(arg(1, "from", 0.0)), float(arg(2, "to", 1.0))
        v = s._op("rand", shape=shape, device=d.ddev, dtype=ft)
        if (lo, hi) != (0.0, 1.0):
            v = s._op("add", s._op("mul", v, other=hi - lo), other=lo)
    elif func is aten.normal_.default:
        mean, std = float(arg(1, "mean", 0.0)), float(arg(2, "std", 1.0))
        v = s._op("randn", shape=shape, device=d.ddev, dtype=ft)
        if (mean, std) != (0.0, 1.0):
            v = s._op("add", s._op("mul", v, other=std), other=mean)
    else:
        return None
    if func in (aten.bernoulli_.float, aten.bernoulli_.Tensor) or ft != _dt(self.dtype):
        v = s._op("cast", v, dtype=_dt(self.dtype))
    return v


def _rand_fill(fill, uses):
    def h(func, args, kwargs):
        self = args[0]
        from . import _cap
        if _cap is not None:  # inside a capture: drawn by the daemon at every replay
            v = _daemon_draw(func, self, args, kwargs)
            if v is not None:
                _write(self, v)
                return self
        host = torch.empty(tuple(self.shape), dtype=self.dtype)
        fill(host, *args[1:], **kwargs)
        _write(self, _upload(self._st.dev, host, self.dtype,
                             f"{func} (random numbers are drawn on the host, then uploaded)"))
        return self
    return h


# Random fills draw from torch's own (CPU) generator, so torch.manual_seed makes a
# run on the device draw what the same run on the CPU draws. Inside a graph capture the
# floating-point ones (dropout's bernoulli_, uniform_, normal_) are the daemon's draws.
_DAEMON_DRAWN = (aten.bernoulli_.float, aten.bernoulli_.Tensor, aten.uniform_.default,
                 aten.normal_.default)
for _op, _fill in ((aten.bernoulli_.float, lambda h, *a, **k: h.bernoulli_(*a, **k)),
                   (aten.bernoulli_.Tensor,
                    lambda h, p, **k: h.bernoulli_(_download(p) if isinstance(p, DaemonTensor)
                                                   else p, **k)),
                   (aten.normal_.default, lambda h, *a, **k: h.normal_(*a, **k)),
                   (aten.uniform_.default, lambda h, *a, **k: h.uniform_(*a, **k)),
                   (aten.random_.default, lambda h, *a, **k: h.random_(*a, **k)),
                   (getattr(aten.random_, "from"), lambda h, *a, **k: h.random_(*a, **k)),
                   (aten.random_.to, lambda h, *a, **k: h.random_(*a, **k)),
                   (aten.exponential_.default, lambda h, *a, **k: h.exponential_(*a, **k))):
    _SPECIAL[_op] = (_rand_fill(_fill, "host"),
                     "host: torch's generator, then an upload; captured: rand / randn / lt, "
                     "drawn by the daemon at each replay" if _op in _DAEMON_DRAWN else
                     "host: torch's generator, then an upload")


@special(aten.zero_.default, uses="zeros")
def _zero_(func, args, kwargs):
    self = args[0]
    d = self._st.dev
    _write(self, d.session._op("zeros", shape=tuple(self.shape), device=d.ddev,
                              dtype=_dt(self.dtype)))
    return self


@special(aten.fill_.Scalar, aten.fill_.Tensor, uses="full / expand")
def _fill_(func, args, kwargs):
    self, value = args[0], args[1]
    d = self._st.dev
    c = _Ctx(d, None, None)
    if isinstance(value, DaemonTensor):
        if value.dim() != 0:
            raise RuntimeError(f"fill_ only supports 0-dimension value tensor but got tensor "
                               f"with {value.dim()} dimensions.")
        v = c.op("expand", _cast(c, _value(value), self.dtype), shape=tuple(self.shape))
    else:
        v = c.full(self.shape, value.item() if isinstance(value, torch.Tensor) else value,
                   self.dtype)
    _write(self, v)
    return self


@special(aten.detach_.default, aten.requires_grad_.default, uses="none (metadata)")
def _detach_(func, args, kwargs):
    return args[0]


def _like(fill):
    def h(func, args, kwargs):
        self = args[0]
        dtype = kwargs.get("dtype") or self.dtype
        device = kwargs.get("device")
        device = torch.device(device) if device is not None else self.device
        if len(args) > 1 and fill == "full":
            value = args[1]
        else:
            value = 0 if fill in ("zeros", "empty") else 1
        shape = tuple(self.shape)
        if device.type != "privateuseone":
            return torch.full(shape, value, dtype=dtype, device=device)
        dev = _target_dev(device)
        if fill == "empty":
            return _empty(dev, shape, _contig_strides(shape), dtype)
        c = _Ctx(dev, None, None)
        return _new(dev, c.full(shape, value, dtype), shape, dtype)
    return h


_SPECIAL[aten.zeros_like.default] = (_like("zeros"), "full")
_SPECIAL[aten.ones_like.default] = (_like("ones"), "full")
_SPECIAL[aten.full_like.default] = (_like("full"), "full")
_SPECIAL[aten.empty_like.default] = (_like("empty"), "none until written (zeros if read)")


def _new_fill(fill):
    def h(func, args, kwargs):
        self, size = args[0], tuple(args[1])
        dtype = kwargs.get("dtype") or self.dtype
        device = kwargs.get("device")
        device = torch.device(device) if device is not None else self.device
        value = args[2] if fill == "full" else (0 if fill in ("zeros", "empty") else 1)
        if device.type != "privateuseone":
            return torch.full(size, value, dtype=dtype, device=device)
        dev = _target_dev(device)
        if fill == "empty":
            return _empty(dev, size, _contig_strides(size), dtype)
        return _new(dev, _Ctx(dev, None, None).full(size, value, dtype), size, dtype)
    return h


_SPECIAL[aten.new_zeros.default] = (_new_fill("zeros"), "full")
_SPECIAL[aten.new_ones.default] = (_new_fill("ones"), "full")
_SPECIAL[aten.new_full.default] = (_new_fill("full"), "full")
_SPECIAL[aten.new_empty.default] = (_new_fill("empty"), "none until written (zeros if read)")
_SPECIAL[aten.new_empty_strided.default] = (
    lambda func, args, kwargs: _empty(args[0]._st.dev, args[1], args[2],
                                      kwargs.get("dtype") or args[0].dtype),
    "none until written (zeros if read)")


@special(aten.clone.default, aten.lift_fresh.default, aten.lift_fresh_copy.default,
         uses="none: the same daemon value in a new storage")
def _clone(func, args, kwargs):
    src = args[0]
    return _new(src._st.dev, _value(src), tuple(src.shape), src.dtype)


@special(aten._unsafe_view.default, uses="reshape")
def _unsafe_view(func, args, kwargs):
    src, size = args[0], args[1]
    m = func(_meta_of(src), size)
    v = _value(src)
    if tuple(m.shape) != tuple(src.shape):
        v = src._st.dev.session._op("reshape", v, shape=tuple(m.shape))
    return _new(src._st.dev, v, tuple(m.shape), src.dtype)


def _arange_out(func, args, kwargs):
    out = kwargs["out"]
    host = func(*args, out=torch.empty(0, dtype=out.dtype))
    if tuple(host.shape) != tuple(out.shape):
        raise NotImplementedError(
            f"tensordd.torch: {func} into an out= tensor of another size (torch.arange(..., "
            f"device=dev) is not supported: torch.arange(...).to(dev))")
    _write(out, _upload(out._st.dev, host, out.dtype))
    return out


_SPECIAL[aten.arange.out] = (_arange_out, "host: computed, then an upload")
_SPECIAL[aten.arange.start_out] = (_arange_out, "host: computed, then an upload")


@special(aten.resize_.default, uses="none (same size only)")
def _resize_(func, args, kwargs):
    self, size = args[0], tuple(args[1])
    if tuple(self.shape) != size:
        raise NotImplementedError(f"tensordd.torch: resize_ of a {tuple(self.shape)} tensor "
                                  f"to {size}")
    return self


# ================================================================ mapped ops

def _scalar_or_tensor_binary(name):
    def fn(c, a, b, alpha=1):
        dt = c.out.dtype
        a = _tensor(c, a, dt) if not isinstance(a, _DTensor) else _cast(c, a, dt)
        if isinstance(b, _DTensor):
            b = _cast(c, b, dt)
            if alpha != 1:
                if name in ("add", "sub"):  # the daemon's alpha: one op
                    return c.op(name, a, b, alpha=_num(alpha, dt))
                b = c.op("mul", b, other=_num(alpha, dt))
            return c.op(name, a, b)
        if alpha != 1:
            b = b * alpha
        return c.op(name, a, other=_num(b, dt))
    return fn


for _name in ("add", "sub", "mul", "div"):
    _pk = getattr(aten, _name)
    impl(_pk.Tensor, _pk.Scalar, uses=_name)(_scalar_or_tensor_binary(_name))

impl(aten.maximum.default, uses="maximum")(_scalar_or_tensor_binary("maximum"))
impl(aten.minimum.default, uses="minimum")(_scalar_or_tensor_binary("minimum"))
impl(aten.remainder.Tensor, aten.remainder.Scalar, uses="remainder")(
    _scalar_or_tensor_binary("remainder"))
impl(aten.atan2.default, uses="atan2")(_scalar_or_tensor_binary("atan2"))
impl(aten.pow.Tensor_Tensor, aten.pow.Tensor_Scalar, uses="pow")(
    _scalar_or_tensor_binary("pow"))


@impl(aten.pow.Scalar, uses="full, pow")
def _pow_scalar(c, base, exp):
    dt = c.out.dtype
    return c.op("pow", c.scalar(base, dt), _cast(c, exp, dt))


@impl(aten.floor_divide.default, aten.floor_divide.Scalar, uses="div, floor, cast")
def _floor_divide(c, a, b):
    return _div_mode(c, a, b, rounding_mode="floor")


@impl(aten.all.default, aten.all.dim, uses="cast, amin")
def _all(c, a, dim=None, keepdim=False):
    a = _cast(c, a, torch.bool)
    if not _shape(a):
        return a
    return c.op("amin", a, dim=_dims(dim, len(_shape(a))), keepdim=bool(keepdim))


@impl(aten.any.default, aten.any.dim, uses="cast, amax")
def _any(c, a, dim=None, keepdim=False):
    a = _cast(c, a, torch.bool)
    if not _shape(a):
        return a
    return c.op("amax", a, dim=_dims(dim, len(_shape(a))), keepdim=bool(keepdim))


@impl(aten.rsub.Tensor, aten.rsub.Scalar, uses="sub")
def _rsub(c, a, b, alpha=1):
    dt = c.out.dtype
    a = _cast(c, a, dt)
    if alpha != 1:
        a = c.op("mul", a, other=_num(alpha, dt))
    return c.op("sub", _tensor(c, b, dt), a)


@impl(aten.div.Tensor_mode, aten.div.Scalar_mode, uses="div, floor (trunc: sign, abs)")
def _div_mode(c, a, b, rounding_mode=None):
    dt = c.out.dtype
    fdt = dt if dt.is_floating_point else torch.float64 if _dtype_of(a) == torch.int64 \
        else torch.float32
    a = _cast(c, a, fdt)
    q = c.op("div", a, _cast(c, b, fdt)) if isinstance(b, _DTensor) else \
        c.op("div", a, other=float(b))
    if rounding_mode == "floor":
        q = c.op("floor", q)
    elif rounding_mode == "trunc":
        q = c.op("mul", c.op("sign", q), c.op("floor", c.op("abs", q)))
    return _cast(c, q, dt)


def _compare(name):
    def fn(c, a, b):
        ct = torch.result_type(c.margs[0], c.margs[1])
        a = _cast(c, a, ct)
        if isinstance(b, _DTensor):
            return c.op(name, a, _cast(c, b, ct))
        return c.op(name, a, other=_num(b, ct))
    return fn


for _name in ("eq", "ne", "lt", "le", "gt", "ge"):
    _pk = getattr(aten, _name)
    impl(_pk.Tensor, _pk.Scalar, uses=_name)(_compare(_name))

for _name in ("logical_and", "logical_or", "logical_xor"):
    impl(getattr(aten, _name).default, uses=_name)(
        lambda c, a, b, _n=_name: c.op(_n, a, b))


def _bool_logical(name, what):
    def fn(c, a, b=None):
        ins = (a,) if b is None else (a, b)
        if any(isinstance(x, _DTensor) and x._dtype != "bool" for x in ins) \
                or c.out.dtype != torch.bool:
            raise NotImplementedError(f"tensordd.torch: aten {what} of integer tensors (the "
                                      f"daemon has no bitwise integer ops; bool only)")
        if b is not None and not isinstance(b, _DTensor):
            b = c.scalar(bool(b), torch.bool)
        return c.op(name, *((a,) if b is None else (a, b)))
    return fn


impl(aten.bitwise_or.Tensor, aten.__or__.Tensor, uses="logical_or (bool)")(
    _bool_logical("logical_or", "bitwise_or"))
impl(aten.bitwise_and.Tensor, aten.__and__.Tensor, uses="logical_and (bool)")(
    _bool_logical("logical_and", "bitwise_and"))
impl(aten.bitwise_xor.Tensor, aten.__xor__.Tensor, uses="logical_xor (bool)")(
    _bool_logical("logical_xor", "bitwise_xor"))
impl(aten.bitwise_not.default, uses="logical_not (bool)")(
    _bool_logical("logical_not", "bitwise_not"))


def _unary(name):
    def fn(c, a):
        dt = c.out.dtype
        if dt != torch.bool and dt.is_floating_point:
            a = _cast(c, a, dt)
        return c.op(name, a)
    return fn


for _name in ("neg", "abs", "sign", "exp", "log", "log1p", "expm1", "sqrt", "rsqrt", "sin",
              "cos", "tanh", "sigmoid", "relu", "silu", "floor", "ceil", "round",
              "reciprocal", "logical_not"):
    impl(getattr(aten, _name).default, uses=_name)(_unary(_name))

impl(aten.square.default, uses="square")(_unary("square"))


@impl(aten.gelu.default, uses="gelu")
def _gelu(c, a, approximate="none"):
    return c.op("gelu", a, approximate=approximate)


@impl(aten.leaky_relu.default, uses="leaky_relu")
def _leaky_relu(c, a, negative_slope=0.01):
    return c.op("leaky_relu", a, negative_slope=float(negative_slope))


@impl(aten.softplus.default, uses="softplus")
def _softplus(c, a, beta=1, threshold=20):
    return c.op("softplus", a, beta=float(beta), threshold=float(threshold))


@impl(aten.clamp.default, aten.clamp_min.default, aten.hardtanh.default, uses="clamp")
def _clamp(c, a, lo=None, hi=None):
    dt = c.out.dtype
    a = _cast(c, a, dt)
    if lo is None and hi is None:
        return a
    return c.op("clamp", a, min=None if lo is None else _num(lo, dt),
                max=None if hi is None else _num(hi, dt))


@impl(aten.clamp_max.default, uses="clamp")
def _clamp_max(c, a, hi):
    return _clamp(c, a, None, hi)


@impl(aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar,
      uses="where (full for a scalar)")
def _where(c, cond, a, b):
    dt = c.out.dtype
    return c.op("where", _tensor(c, cond, torch.bool), _tensor(c, a, dt), _tensor(c, b, dt))


@impl(aten.masked_fill.Scalar, aten.masked_fill.Tensor, uses="masked_fill")
def _masked_fill(c, a, mask, value):
    dt = c.out.dtype
    if isinstance(value, _DTensor):
        return c.op("masked_fill", a, mask, _cast(c, value, dt))
    return c.op("masked_fill", a, mask, value=_num(value, dt))


@impl(aten.addcmul.default, uses="mul, add")
def _addcmul(c, a, t1, t2, value=1):
    dt = c.out.dtype
    p = c.op("mul", _cast(c, t1, dt), _cast(c, t2, dt))
    if value != 1:  # the daemon's add scales its second input: one op
        return c.op("add", _cast(c, a, dt), p, alpha=_num(value, dt))
    return c.op("add", _cast(c, a, dt), p)


@impl(aten.addcdiv.default, uses="div, add")
def _addcdiv(c, a, t1, t2, value=1):
    dt = c.out.dtype
    p = c.op("div", _cast(c, t1, dt), _cast(c, t2, dt))
    if value != 1:  # the daemon's add scales its second input: one op
        return c.op("add", _cast(c, a, dt), p, alpha=_num(value, dt))
    return c.op("add", _cast(c, a, dt), p)


@impl(aten.lerp.Scalar, uses="sub, add")
def _lerp(c, a, end, weight):
    return c.op("add", a, c.op("sub", end, a), alpha=float(weight))


# ---------------------------------------------------------------- reductions

def _reduce(name, needs_float=False):
    def fn(c, a, dim=None, keepdim=False, *, dtype=None):
        if isinstance(dim, bool):  # (sum.default's dtype would not get here)
            dim = None
        nd = len(_shape(a))
        dt = c.out.dtype
        a = _cast(c, a, dt)
        dims = _dims(dim, nd)
        if nd == 0:
            return a
        return c.op(name, a, dim=dims, keepdim=bool(keepdim))
    return fn


impl(aten.sum.dim_IntList, aten.sum.default, uses="sum")(_reduce("sum"))
impl(aten.mean.dim, aten.mean.default, uses="mean")(_reduce("mean"))
impl(aten.amax.default, uses="amax")(_reduce("amax"))
impl(aten.amin.default, uses="amin")(_reduce("amin"))
impl(aten.prod.dim_int, aten.prod.default, uses="prod")(_reduce("prod"))
impl(aten.logsumexp.default, uses="logsumexp")(_reduce("logsumexp"))


@impl(aten.max.default, uses="amax")
def _max_all(c, a):
    return c.op("amax", a) if _shape(a) else a


@impl(aten.min.default, uses="amin")
def _min_all(c, a):
    return c.op("amin", a) if _shape(a) else a


@impl(aten.max.dim, uses="max (values, indices)")
def _max_dim(c, a, dim, keepdim=False):
    return c.s._op("max", a, num_outputs=2, dim=int(dim), keepdim=bool(keepdim))


@impl(aten.min.dim, uses="min (values, indices)")
def _min_dim(c, a, dim, keepdim=False):
    return c.s._op("min", a, num_outputs=2, dim=int(dim), keepdim=bool(keepdim))


@impl(aten.argmax.default, uses="argmax")
def _argmax(c, a, dim=None, keepdim=False):
    return c.op("argmax", a, dim=dim, keepdim=bool(keepdim))


@impl(aten.argmin.default, uses="argmin")
def _argmin(c, a, dim=None, keepdim=False):
    return c.op("argmin", a, dim=dim, keepdim=bool(keepdim))


def _var(name):
    def fn(c, a, dim=None, *, correction=None, keepdim=False):
        nd = len(_shape(a))
        return c.op(name, a, dim=_dims(dim, nd), keepdim=bool(keepdim),
                    correction=1 if correction is None else correction)
    return fn


impl(aten.var.correction, uses="var")(_var("var"))
impl(aten.std.correction, uses="std")(_var("std"))


@impl(aten.cumsum.default, uses="cumsum")
def _cumsum(c, a, dim, *, dtype=None):
    return c.op("cumsum", _cast(c, a, c.out.dtype), dim=int(dim))


def _vector_norm(c, a, p, dim, keepdim):
    nd = len(_shape(a))
    dims = _dims(dim, nd)
    p = 2.0 if p is None else float(p)
    if nd == 0:
        return c.op("abs", a)
    if p == 2.0:
        return c.op("sqrt", c.op("sum", c.op("mul", a, a), dim=dims, keepdim=bool(keepdim)))
    if p == 1.0:
        return c.op("sum", c.op("abs", a), dim=dims, keepdim=bool(keepdim))
    if p == math.inf:
        return c.op("amax", c.op("abs", a), dim=dims, keepdim=bool(keepdim))
    if p == -math.inf:
        return c.op("amin", c.op("abs", a), dim=dims, keepdim=bool(keepdim))
    s = c.op("sum", c.op("pow", c.op("abs", a), other=p), dim=dims, keepdim=bool(keepdim))
    return c.op("pow", s, other=1.0 / p)


@impl(aten.norm.ScalarOpt_dim, aten.norm.Scalar, aten.norm.ScalarOpt_dim_dtype,
      uses="mul, sum, sqrt (p=2); abs, sum/amax/pow otherwise")
def _norm(c, a, p=2, dim=None, keepdim=False, *, dtype=None):
    return _vector_norm(c, _cast(c, a, c.out.dtype), p, dim, keepdim)


@impl(aten.linalg_vector_norm.default, uses="mul, sum, sqrt (ord=2); abs, sum/amax/pow")
def _linalg_vector_norm(c, a, ord=2, dim=None, keepdim=False, *, dtype=None):
    return _vector_norm(c, _cast(c, a, c.out.dtype), ord, dim, keepdim)


# ---------------------------------------------------------------- linear algebra

@impl(aten.mm.default, aten.matmul.default, aten.dot.default, aten.mv.default,
      uses="matmul")
def _mm(c, a, b):
    return c.op("matmul", a, b)


@impl(aten.bmm.default, uses="bmm")
def _bmm(c, a, b):
    return c.op("bmm", a, b)


@impl(aten.addmm.default, uses="addmm")
def _addmm(c, a, m1, m2, *, beta=1, alpha=1):
    return c.op("addmm", a, m1, m2, beta=beta, alpha=alpha)


@impl(aten.baddbmm.default, uses="baddbmm")
def _baddbmm(c, a, b1, b2, *, beta=1, alpha=1):
    return c.op("baddbmm", a, b1, b2, beta=beta, alpha=alpha)


# ---------------------------------------------------------------- shapes and indexing

@impl(aten.cat.default, uses="cat")
def _cat(c, tensors, dim=0):
    dt = c.out.dtype
    ts = [_cast(c, t, dt) for t in tensors if not (t._shape == (0,) and len(tensors) > 1)]
    if len(ts) == 1:
        return ts[0]
    while len(ts) > 16:
        ts = [c.op("cat", *ts[i:i + 16], dim=int(dim)) if len(ts[i:i + 16]) > 1 else ts[i]
              for i in range(0, len(ts), 16)]
    return c.op("cat", *ts, dim=int(dim))


@impl(aten.stack.default, uses="stack, cat")
def _stack(c, tensors, dim=0):
    dt = c.out.dtype
    ts = [_cast(c, t, dt) for t in tensors]
    if len(ts) <= 16:
        return c.op("stack", *ts, dim=int(dim))
    parts = [c.op("stack", *ts[i:i + 16], dim=int(dim)) for i in range(0, len(ts), 16)]
    nd = len(_shape(ts[0])) + 1
    return _cat(c, parts, int(dim) % nd)


@impl(aten.index_select.default, uses="index_select")
def _index_select(c, a, dim, index):
    return c.op("index_select", a, _cast(c, index, torch.int64), dim=int(dim))


@impl(aten.gather.default, uses="gather")
def _gather(c, a, dim, index, *, sparse_grad=False):
    return c.op("gather", a, _cast(c, index, torch.int64), dim=int(dim))


@impl(aten.scatter_add.default, uses="scatter_add")
def _scatter_add(c, a, dim, index, src):
    return c.op("scatter_add", a, _cast(c, index, torch.int64), src, dim=int(dim))


@impl(aten.index.Tensor, uses="index_select, reshape")
def _index(c, a, indices):
    used = [(i, x) for i, x in enumerate(indices) if x is not None]
    if len(used) != 1 or not isinstance(used[0][1], _DTensor) \
            or used[0][1]._dtype not in ("int64", "int32"):
        raise NotImplementedError("tensordd.torch: aten.index with other than one integer "
                                  "index tensor (boolean masks: the daemon has no nonzero)")
    d, idx = used[0]
    flat = c.op("reshape", _cast(c, idx, torch.int64), shape=(-1,))
    out = c.op("index_select", a, flat, dim=d)
    return c.op("reshape", out, shape=tuple(c.out.shape))


@impl(aten.embedding.default, uses="embedding")
def _embedding(c, weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    return c.op("embedding", _cast(c, indices, torch.int64), weight)


@impl(aten.embedding_renorm.default,
      uses="scatter_add (rows looked up), norm, gt, logical_and, div, where, mul")
def _embedding_renorm(c, weight, indices, max_norm, norm_type):
    # nn.Embedding(max_norm=) calls embedding_renorm_ before each lookup: a looked-up row
    # whose norm_type-norm exceeds max_norm is scaled by max_norm / (norm + 1e-7) in place.
    # Every other row is multiplied by exactly 1, so its bits do not change. The in-place
    # form writes this into the weight's storage (the generic in-place rule).
    rows, dim = _shape(weight)
    dt = c.out.dtype
    flat = c.op("reshape", _cast(c, indices, torch.int64), shape=[-1])
    n = _prod(_shape(indices))
    hits = c.op("scatter_add", c.create("zeros", (rows,), dt), flat, c.full((n,), 1, dt),
                dim=0)
    norm = _vector_norm(c, weight, norm_type, [1], False)
    over = c.op("logical_and", c.op("gt", hits, other=0), c.op("gt", norm, other=float(max_norm)))
    scale = c.op("div", c.full((rows,), float(max_norm), dt), c.op("add", norm, other=1e-7))
    scale = c.op("where", over, scale, c.full((rows,), 1, dt))
    return c.op("mul", weight, c.op("reshape", scale, shape=[rows, 1]))


@impl(aten.embedding_dense_backward.default, uses="reshape, masked_fill, expand, scatter_add")
def _embedding_dense_backward(c, grad, indices, num_weights, padding_idx,
                              scale_grad_by_freq):
    if scale_grad_by_freq:
        raise NotImplementedError("tensordd.torch: embedding_dense_backward with "
                                  "scale_grad_by_freq")
    dim = _shape(grad)[-1]
    idx = c.op("reshape", _cast(c, indices, torch.int64), shape=(-1, 1))
    src = c.op("reshape", grad, shape=(-1, dim))
    if padding_idx is not None and padding_idx >= 0:
        src = c.op("masked_fill", src, c.op("eq", idx, other=int(padding_idx)), value=0.0)
    n = _prod(_shape(indices))
    idx = c.op("expand", idx, shape=(n, dim))
    z = c.create("zeros", (num_weights, dim), c.out.dtype)
    return c.op("scatter_add", z, idx, src, dim=0)


@impl(aten.tril.default, uses="tril")
def _tril(c, a, diagonal=0):
    return c.op("tril", a, diagonal=int(diagonal))


@impl(aten.triu.default, uses="triu")
def _triu(c, a, diagonal=0):
    return c.op("triu", a, diagonal=int(diagonal))


@impl(aten.constant_pad_nd.default, uses="pad")
def _pad(c, a, pad, value=0):
    return c.op("pad", a, pad=[int(p) for p in pad], value=_num(value, c.out.dtype))


@impl(aten.topk.default, uses="topk")
def _topk(c, a, k, dim=-1, largest=True, sorted=True):  # noqa: A002
    return c.s._op("topk", a, num_outputs=2, k=int(k), dim=int(dim), largest=bool(largest),
                  sorted=bool(sorted))


@impl(aten.sort.default, aten.sort.stable, uses="sort")
def _sort(c, a, dim=-1, descending=False, *, stable=None):
    return c.s._op("sort", a, num_outputs=2, dim=int(dim), descending=bool(descending))


# ---------------------------------------------------------------- nn

@impl(aten._softmax.default, uses="softmax")
def _softmax(c, a, dim, half_to_float=False):
    return c.op("softmax", a, dim=int(dim))


@impl(aten._log_softmax.default, uses="log_softmax")
def _log_softmax(c, a, dim, half_to_float=False):
    return c.op("log_softmax", a, dim=int(dim))


@impl(aten._softmax_backward_data.default, uses="mul, sum, sub")
def _softmax_backward(c, grad, out, dim, input_dtype):
    s = c.op("sum", c.op("mul", grad, out), dim=(int(dim),), keepdim=True)
    return c.op("mul", out, c.op("sub", grad, s))


@impl(aten._log_softmax_backward_data.default, uses="exp, sum, mul, sub")
def _log_softmax_backward(c, grad, out, dim, input_dtype):
    s = c.op("sum", grad, dim=(int(dim),), keepdim=True)
    return c.op("sub", grad, c.op("mul", c.op("exp", out), s))


@impl(aten.threshold_backward.default, uses="le, masked_fill")
def _threshold_backward(c, grad, a, threshold):
    return c.op("masked_fill", grad, c.op("le", a, other=float(threshold)), value=0.0)


@impl(aten.threshold.default, uses="le, masked_fill")
def _threshold(c, a, threshold, value):
    return c.op("masked_fill", a, c.op("le", a, other=float(threshold)),
                value=_num(value, c.out.dtype))


@impl(aten.sigmoid_backward.default, uses="mul, sub")
def _sigmoid_backward(c, grad, out):
    return c.op("mul", grad, c.op("mul", out, c.op("add", c.op("neg", out), other=1.0)))


@impl(aten.tanh_backward.default, uses="mul, sub")
def _tanh_backward(c, grad, out):
    return c.op("mul", grad, c.op("add", c.op("neg", c.op("mul", out, out)), other=1.0))


def _reduction_name(r: int) -> str:
    return {0: "none", 1: "mean", 2: "sum"}[int(r)]


@impl(aten.nll_loss_forward.default, uses="nll_loss, ne, cast, sum (total weight)")
def _nll_loss_forward(c, logp, target, weight, reduction, ignore_index):
    target = _cast(c, target, torch.int64)
    ins = (logp, target) if weight is None else (logp, target, weight)
    out = c.op("nll_loss", *ins, reduction=_reduction_name(reduction),
               ignore_index=int(ignore_index))
    dt = c.out[1].dtype
    valid = _cast(c, c.op("ne", target, other=int(ignore_index)), dt)
    if weight is not None:
        safe = c.op("masked_fill", target, c.op("logical_not", c.op("ne", target,
                                                                     other=int(ignore_index))),
                    value=0)
        valid = c.op("mul", valid, c.op("index_select", weight,
                                         c.op("reshape", safe, shape=(-1,)), dim=0)
                     if len(_shape(target)) <= 1 else valid)
    total = c.op("sum", valid)
    return out, total


@impl(aten.nll_loss_backward.default,
      uses="ne, masked_fill, index_select, mul, div, unsqueeze, scatter_add")
def _nll_loss_backward(c, grad, logp, target, weight, reduction, ignore_index, total_weight):
    shape = _shape(logp)
    if len(shape) > 2:
        raise NotImplementedError("tensordd.torch: nll_loss_backward of an input with more "
                                  "than 2 dims")
    dt = c.out.dtype
    target = _cast(c, target, torch.int64)
    if len(shape) == 1:
        target = c.op("reshape", target, shape=(1,))
    valid = c.op("ne", target, other=int(ignore_index))
    safe = c.op("masked_fill", target, c.op("logical_not", valid), value=0)
    w = _cast(c, valid, dt)
    if weight is not None:
        w = c.op("mul", w, c.op("index_select", weight, safe, dim=0))
    w = c.op("neg", w)
    if int(reduction) == 1:
        w = c.op("div", w, _tensor(c, total_weight, dt))
    g = _tensor(c, grad, dt)
    w = c.op("mul", w, g)
    n = 1 if len(shape) == 1 else shape[0]
    z = c.create("zeros", (n, shape[-1]), dt)
    out = c.op("scatter_add", z, c.op("unsqueeze", safe, dim=1),
               c.op("unsqueeze", c.op("expand", w, shape=(n,)), dim=1), dim=1)
    return c.op("reshape", out, shape=tuple(shape)) if len(shape) == 1 else out


@impl(aten.mse_loss.default, uses="mse_loss")
def _mse_loss(c, a, target, reduction=1):
    return c.op("mse_loss", a, target, reduction=_reduction_name(reduction))


@impl(aten.mse_loss_backward.default, uses="sub, mul, div")
def _mse_loss_backward(c, grad, a, target, reduction):
    g = c.op("mul", c.op("sub", a, target), _tensor(c, grad, c.out.dtype))
    g = c.op("mul", g, other=2.0)
    if int(reduction) == 1:
        g = c.op("div", g, other=float(max(_prod(_shape(a)), 1)))
    return g


def _spatial(x, n):
    x = list(x)
    return x * n if len(x) == 1 else x


@impl(aten.convolution.default, uses="conv2d / conv1d / conv_transpose2d")
def _convolution(c, a, w, b, stride, padding, dilation, transposed, output_padding, groups):
    nd = len(_shape(a))
    ins = (a, w) if b is None else (a, w, b)
    if transposed:
        if nd != 4:
            raise NotImplementedError("tensordd.torch: transposed convolution other than 2-d")
        return c.op("conv_transpose2d", *ins, stride=tuple(stride), padding=tuple(padding),
                    output_padding=tuple(output_padding), groups=int(groups),
                    dilation=tuple(dilation))
    name = {3: "conv1d", 4: "conv2d"}.get(nd)
    if name is None:
        raise NotImplementedError(f"tensordd.torch: a {nd - 2}-d convolution")
    return c.op(name, *ins, stride=tuple(stride), padding=tuple(padding),
                dilation=tuple(dilation), groups=int(groups))


@impl(aten.convolution_backward.default,
      uses="conv_transpose2d (input), conv2d of the transposed input and gradient "
           "(weight), sum (bias)")
def _convolution_backward(c, go, a, w, bias_sizes, stride, padding, dilation, transposed,
                          output_padding, groups, output_mask):
    if transposed:
        raise NotImplementedError("tensordd.torch: convolution_backward of a transposed "
                                  "convolution")
    dt = torch.float32 if a._dtype is None else _TORCH_DT[a._dtype]
    ashape, wshape = _shape(a), _shape(w)
    one_d = len(ashape) == 3
    if one_d:  # as 2-d with a height of 1
        a = c.op("unsqueeze", a, dim=2)
        w = c.op("unsqueeze", w, dim=2)
        go = c.op("unsqueeze", go, dim=2)
        stride, padding, dilation = [1, *stride], [0, *padding], [1, *dilation]
        ashape = (ashape[0], ashape[1], 1, ashape[2])
        wshape = (wshape[0], wshape[1], 1, wshape[2])
    n, cin, h, wd = ashape
    cout, cg, kh, kw = wshape
    stride, padding, dilation = _spatial(stride, 2), _spatial(padding, 2), _spatial(dilation, 2)
    oh = (h + 2 * padding[0] - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (wd + 2 * padding[1] - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    gi = gw = gb = None
    if output_mask[0]:
        op_h = h - ((oh - 1) * stride[0] - 2 * padding[0] + dilation[0] * (kh - 1) + 1)
        op_w = wd - ((ow - 1) * stride[1] - 2 * padding[1] + dilation[1] * (kw - 1) + 1)
        gi = c.op("conv_transpose2d", go, w, stride=stride, padding=padding,
                  output_padding=[op_h, op_w], groups=int(groups), dilation=dilation)
        if one_d:
            gi = c.op("squeeze", gi, dim=2)
        gi = _Out(gi, (n, cin, wd) if one_d else (n, cin, h, wd), dt)
    if output_mask[1]:
        og = cout // groups
        parts = []
        for g in range(groups):
            ag = a if groups == 1 else c.op("slice", a, dim=1, start=g * cg, stop=(g + 1) * cg)
            gg = go if groups == 1 else c.op("slice", go, dim=1, start=g * og,
                                             stop=(g + 1) * og)
            x = c.op("conv2d", c.op("transpose", ag, dim0=0, dim1=1),
                     c.op("transpose", gg, dim0=0, dim1=1),
                     stride=dilation, padding=padding, dilation=stride)
            x = c.op("slice", c.op("slice", x, dim=2, start=0, stop=kh), dim=3, start=0,
                     stop=kw)
            parts.append(c.op("transpose", x, dim0=0, dim1=1))
        gw = parts[0] if groups == 1 else c.op("cat", *parts, dim=0) if groups <= 16 else \
            _cat(_Ctx(c.dev, None, None), parts, 0)
        if one_d:
            gw = c.op("squeeze", gw, dim=2)
        gw = _Out(gw, (cout, cg, kw) if one_d else (cout, cg, kh, kw), dt)
    if output_mask[2]:
        gb = _Out(c.op("sum", go, dim=(0, 2, 3)), (cout,), dt)
    return gi, gw, gb


def _bn_shape(nd):
    return [1, -1] + [1] * (nd - 2)


@impl(aten.native_batch_norm.default,
      uses="mean, var, rsqrt, sub, mul, add (and the running statistics' update)")
def _native_batch_norm(c, a, w, b, running_mean, running_var, training, momentum, eps):
    shape = _shape(a)
    nd = len(shape)
    dims = [0] + list(range(2, nd))
    dt = c.out[0].dtype
    bshape = _bn_shape(nd)
    if training:
        mean = c.op("mean", a, dim=dims)
        var = c.op("var", a, dim=dims, correction=0)
        invstd = c.op("rsqrt", c.op("add", var, other=float(eps)))
        n = _prod(shape) // shape[1]
        if running_mean is not None:
            _update_running(c, running_mean, mean, momentum)
        if running_var is not None:  # (the unbiased variance)
            _update_running(c, running_var, var, momentum, float(n) / max(n - 1, 1))
    else:
        mean = running_mean
        invstd = c.op("rsqrt", c.op("add", running_var, other=float(eps)))
    # y = a * scale + shift, scale = invstd * w, shift = b - mean * scale: the [C]
    # factors first, then two passes over the input instead of four
    scale = invstd if w is None else c.op("mul", invstd, w)
    shift = c.op("mul", mean, scale)
    shift = c.op("sub", b, shift) if b is not None else c.op("mul", shift, other=-1.0)
    y = c.op("add", c.op("mul", a, c.op("reshape", scale, shape=bshape)),
             c.op("reshape", shift, shape=bshape))
    if training:
        return y, mean, invstd
    return y, c.create("zeros", (0,), dt), c.create("zeros", (0,), dt)


def _update_running(c, stat_value, batch, momentum, factor=1.0):
    """stat = (1 - momentum) * stat + momentum * factor * batch, written into the running
    statistic's DaemonTensor (found by its value: _Ctx keeps the meta args)."""
    target = _RUNNING.get(id(stat_value))
    if target is None:
        raise RuntimeError("tensordd.torch: internal: a running statistic without its tensor")
    new = c.op("add", c.op("mul", stat_value, other=1.0 - float(momentum)), batch,
               alpha=float(momentum) * factor)
    if c.out[0].dtype == target.dtype:  # all of one dtype: no cast
        new._dtype = _dt(target.dtype)
    _write(target, _cast(c, new, target.dtype))


_RUNNING: dict = {}


def _bn_handler(func, args, kwargs):
    # native_batch_norm writes the running statistics (arguments 3 and 4) in place
    h = _compute_handler(_native_batch_norm)
    keep = []
    for t in args[3:5]:
        if isinstance(t, DaemonTensor):
            v = _value(t)
            _RUNNING[id(v)] = t
            keep.append(v)
    try:
        return h(func, args, kwargs)
    finally:
        for v in keep:
            _RUNNING.pop(id(v), None)


_SPECIAL[aten.native_batch_norm.default] = (
    _bn_handler, "mean, var, rsqrt, sub, mul, add (running statistics updated in place)")


@impl(aten.native_batch_norm_backward.default, uses="sub, mul, sum, reshape")
def _native_batch_norm_backward(c, go, a, w, running_mean, running_var, save_mean,
                                save_invstd, train, eps, output_mask):
    shape = _shape(a)
    nd = len(shape)
    dims = [0] + list(range(2, nd))
    bshape = _bn_shape(nd)
    if train:
        mean, invstd = save_mean, save_invstd
    else:
        mean = running_mean
        invstd = c.op("rsqrt", c.op("add", running_var, other=float(eps)))
    mean_b = c.op("reshape", mean, shape=bshape)
    inv_b = c.op("reshape", invstd, shape=bshape)
    xhat = c.op("mul", c.op("sub", a, mean_b), inv_b)
    gb = c.op("sum", go, dim=dims)
    gw = c.op("sum", c.op("mul", go, xhat), dim=dims)
    gi = None
    if output_mask[0]:
        scale = inv_b if w is None else c.op("mul", inv_b, c.op("reshape", w, shape=bshape))
        if train:
            n = _prod(shape) // shape[1]
            t = c.op("sub", c.op("mul", go, other=float(n)), c.op("reshape", gb, shape=bshape))
            t = c.op("sub", t, c.op("mul", xhat, c.op("reshape", gw, shape=bshape)))
            gi = c.op("mul", t, c.op("mul", scale, other=1.0 / n))
        else:
            gi = c.op("mul", go, scale)
    return (gi, gw if output_mask[1] else None, gb if output_mask[2] else None)


@impl(aten.native_layer_norm.default, uses="mean, var, rsqrt, sub, mul, add")
def _native_layer_norm(c, a, normalized_shape, w, b, eps):
    nd = len(_shape(a))
    k = len(normalized_shape)
    dims = list(range(nd - k, nd))
    mean = c.op("mean", a, dim=dims, keepdim=True)
    var = c.op("var", a, dim=dims, keepdim=True, correction=0)
    rstd = c.op("rsqrt", c.op("add", var, other=float(eps)))
    y = c.op("mul", c.op("sub", a, mean), rstd)
    if w is not None:
        y = c.op("mul", y, w)
    if b is not None:
        y = c.op("add", y, b)
    return y, mean, rstd


@impl(aten.native_layer_norm_backward.default, uses="sub, mul, sum, div")
def _native_layer_norm_backward(c, go, a, normalized_shape, mean, rstd, w, b, output_mask):
    shape = _shape(a)
    nd = len(shape)
    k = len(normalized_shape)
    inner = list(range(nd - k, nd))
    outer = list(range(nd - k))
    m = _prod(shape[nd - k:])
    xhat = c.op("mul", c.op("sub", a, mean), rstd)
    g = go if w is None else c.op("mul", go, w)
    gi = gw = gb = None
    if output_mask[0]:
        s1 = c.op("sum", g, dim=inner, keepdim=True)
        s2 = c.op("sum", c.op("mul", g, xhat), dim=inner, keepdim=True)
        t = c.op("sub", c.op("sub", c.op("mul", g, other=float(m)), s1), c.op("mul", xhat, s2))
        gi = c.op("mul", t, c.op("div", rstd, other=float(m)))
    if output_mask[1] and w is not None:
        gw = c.op("sum", c.op("mul", go, xhat), dim=outer) if outer else c.op("mul", go, xhat)
    if output_mask[2] and b is not None:
        gb = c.op("sum", go, dim=outer) if outer else go
    return gi, gw, gb


@impl(aten.max_pool2d_with_indices.default, uses="max_pool2d (return_indices)")
def _max_pool2d_with_indices(c, a, kernel_size, stride=(), padding=0, dilation=1,
                             ceil_mode=False):
    stride = list(stride) if stride else list(kernel_size)
    return c.s._op("max_pool2d", a, num_outputs=2, kernel_size=tuple(kernel_size),
                  stride=stride, padding=_spatial(padding if isinstance(padding, (list, tuple))
                                                   else [padding], 2),
                  dilation=_spatial(dilation if isinstance(dilation, (list, tuple))
                                    else [dilation], 2),
                  ceil_mode=bool(ceil_mode), return_indices=True)


@impl(aten.max_pool2d_with_indices_backward.default, uses="max_pool2d_backward")
def _max_pool2d_backward(c, go, a, kernel_size, stride, padding, dilation, ceil_mode,
                         indices):
    # one kernel; it finds each window's maximum again by max_pool2d's rule, so the positions
    # are the forward's indices and indices is not sent
    return c.op("max_pool2d_backward", go, a, kernel_size=list(kernel_size),
                stride=list(stride) if stride else list(kernel_size),
                padding=_spatial(padding if isinstance(padding, (list, tuple)) else [padding], 2),
                dilation=_spatial(dilation if isinstance(dilation, (list, tuple))
                                  else [dilation], 2),
                ceil_mode=bool(ceil_mode))


@impl(aten.avg_pool2d.default, uses="avg_pool2d")
def _avg_pool2d(c, a, kernel_size, stride=(), padding=0, ceil_mode=False,
                count_include_pad=True, divisor_override=None):
    if divisor_override is not None:
        raise NotImplementedError("tensordd.torch: avg_pool2d with divisor_override")
    return c.op("avg_pool2d", a, kernel_size=tuple(kernel_size),
                stride=tuple(stride) if stride else list(kernel_size),
                padding=tuple(padding) if isinstance(padding, (list, tuple)) else [padding],
                ceil_mode=bool(ceil_mode), count_include_pad=bool(count_include_pad))


@impl(aten._adaptive_avg_pool2d.default, uses="adaptive_avg_pool2d")
def _adaptive_avg_pool2d(c, a, output_size):
    return c.op("adaptive_avg_pool2d", a, output_size=tuple(output_size))


@impl(aten._adaptive_avg_pool2d_backward.default, uses="expand, div (global pooling only)")
def _adaptive_avg_pool2d_backward(c, go, a):
    shape = _shape(a)
    if tuple(_shape(go)[-2:]) != (1, 1):
        raise NotImplementedError("tensordd.torch: adaptive_avg_pool2d backward other than "
                                  "to 1x1")
    return c.op("div", c.op("expand", go, shape=tuple(shape)),
                other=float(shape[-1] * shape[-2]))


# ================================================================ the coverage table

# the aten ops the two reference models (torchvision resnet18 with SGD, an
# nn.TransformerEncoder LM with AdamW) and the MNIST example reach, listed even when
# they run through a generic rule (views, in-place forms, decompositions)
_REFERENCE_OPS = (
    "aten._local_scalar_dense.default aten._log_softmax.default "
    "aten._log_softmax_backward_data.default aten._reshape_alias.default "
    "aten._softmax.default aten._softmax_backward_data.default aten._unsafe_view.default "
    "aten._to_copy.default aten.add.Tensor aten.add_.Tensor aten.addcdiv_.default "
    "aten.addcmul_.default aten.addmm.default aten.bernoulli_.float aten.bmm.default "
    "aten.cat.default aten.clamp.default aten.clone.default aten.convolution.default "
    "aten.convolution_backward.default aten.copy_.default aten.detach.default "
    "aten.div.Scalar aten.div.Tensor aten.div_.Scalar aten.div_.Tensor "
    "aten.embedding.default aten.embedding_dense_backward.default "
    "aten.empty.memory_format aten.empty_like.default aten.eq.Tensor aten.argmax.default "
    "aten.expand.default aten.lift_fresh.default aten.max_pool2d_with_indices.default "
    "aten.max_pool2d_with_indices_backward.default aten.mean.dim aten.mm.default "
    "aten.mul.Tensor aten.mul_.Tensor aten.mul_.Scalar aten.native_batch_norm.default "
    "aten.native_batch_norm_backward.default aten.native_layer_norm.default "
    "aten.native_layer_norm_backward.default aten.nll_loss_backward.default "
    "aten.nll_loss_forward.default aten.norm.ScalarOpt_dim aten.ones_like.default "
    "aten.reciprocal.default aten.relu.default aten.relu_.default aten.split.Tensor "
    "aten.sqrt.default aten.sqrt_.default aten.stack.default aten.sum.dim_IntList "
    "aten.sum.default aten.t.default aten.threshold_backward.default aten.transpose.int "
    "aten.view.default aten.zero_.default aten.zeros_like.default aten.add_.Scalar "
    "aten.fill_.Scalar aten.select.int aten.slice.Tensor aten.unsqueeze.default "
    "aten.squeeze.dim aten.permute.default aten.as_strided.default aten.alias.default "
    "aten.unbind.int aten.split_with_sizes.default aten.sub.Tensor aten.neg.default "
    "aten.maximum.default aten.where.self aten.masked_fill.Scalar aten.gelu.default "
    "aten.sigmoid.default aten.tanh.default aten.exp.default aten.log.default "
    "aten.normal_.default aten.uniform_.default "
    "aten.index_select.default aten.gather.default aten.scatter_add.default "
    "aten.amax.default aten.var.correction aten.linalg_vector_norm.default "
    "aten.silu_backward.default aten.leaky_relu_backward.default "
    "aten.hardtanh_backward.default aten.gelu_backward.default"
).split()


def _op_by_name(name):
    _, rest = name.split(".", 1)
    packet, _, ov = rest.partition(".")
    return getattr(getattr(aten, packet), ov or "default")


def coverage():
    """[(aten op, how, daemon ops)] for the mapped ops and the reference models' ops;
    how is mapped / view / in-place / out= / special / host / decomposed, or None
    (NotImplementedError at the call)."""
    seen = {}
    for op in list(_IMPL) + list(_SPECIAL) + [_op_by_name(n) for n in _REFERENCE_OPS]:
        name = str(op)
        if name in seen:
            continue
        _, how, uses = resolve(op)
        if how == "decomposed" and op.name().split("::")[-1] in ("gelu_backward",):
            uses += " (erf: not a daemon op, so NotImplementedError at the call)"
        seen[name] = (name, how, uses)
    seen["aten.empty.memory_format"] = ("aten.empty.memory_format", "factory",
                                        "PrivateUse1 kernel: a storage, zeros if read first")
    seen["aten.empty_strided.default"] = ("aten.empty_strided.default", "factory",
                                          "PrivateUse1 kernel: a storage, zeros if read first")
    from . import _HOST_FACTORIES
    for f in _HOST_FACTORIES:
        seen[f"aten.{f}"] = (f"aten.{f}", "factory", "PrivateUse1 kernel: made on the host "
                             "(randperm: the client's CPU generator), then an upload")
    return sorted(seen.values())


def coverage_table() -> str:
    rows = ["| aten op | how | daemon ops |", "|---|---|---|"]
    for name, how, uses in coverage():
        rows.append(f"| `{name}` | {how or 'NotImplementedError'} | {uses} |")
    return "\n".join(rows) + "\n"
