"""tensordd.torch -- a PyTorch device whose tensors live in the daemon.

    import torch, tensordd.torch
    dev = tensordd.torch.device("tcp://127.0.0.1:7070", "cpu:0")   # the one line
    model = torchvision.models.resnet18(num_classes=10).to(dev)
    loss = F.cross_entropy(model(x.to(dev)), y.to(dev)); loss.backward(); opt.step()
    print(loss.item())

``dev`` is a real ``torch.device`` (``privateuseone:N``); its tensors are real
``torch.Tensor`` objects (:class:`DaemonTensor`, a wrapper subclass) whose values
are daemon handles on a daemon device (``cpu:0``, ``cuda:0``, ...). Torch's own
autograd, optimizers, schedulers, ``nn.utils``, ``state_dict``/``torch.save`` run
above; every aten op below autograd arrives at :meth:`DaemonTensor.__torch_dispatch__`
and runs in the daemon (:mod:`tensordd.torch._ops` maps each one; ``python -m
tensordd.torch`` prints the table). An aten op without a mapping raises
NotImplementedError naming it, at the call.

Semantics as CUDA's: ops are pipelined (nothing waits for the daemon until a value
is read: ``.item()``, ``.cpu()``, ``bool(t)``, ``print(t)``) and the daemon's errors
surface there as typed :class:`tensordd.Error`; what the client can know locally
(shapes, dtypes, devices: torch's meta kernels run on every call) raises at the call.

Storage model: the daemon has no in-place ops, so a tensor's storage is a client
object holding the daemon handle of its current contents (immutable in the
daemon). Views share the storage object and read it through their size, stride
and offset (reshape/permute/slice/expand/index_select in the daemon); an in-place
op computes its result and rebinds the storage to it (through a cat or a
scatter_add for a part of the storage), so every view sees the update.
"""

from __future__ import annotations

import os
import threading

import numpy as np
import torch

from ..device import Device
from ..session import Session, connect

__all__ = ["device", "DaemonTensor", "session_of", "daemon_device_of", "coverage",
           "coverage_table", "synchronize", "Graph", "graph"]

_DT_NAMES = {torch.float32: "float32", torch.float64: "float64", torch.float16: "float16",
             torch.bfloat16: "bfloat16", torch.int32: "int32", torch.int64: "int64",
             torch.bool: "bool", torch.uint8: "uint8", torch.int8: "int8",
             torch.int16: "int16"}


def _dt(dtype) -> str:
    name = _DT_NAMES.get(dtype)
    if name is None:
        raise TypeError(f"tensordd.torch: dtype {dtype} has no daemon dtype "
                        f"(supported: {', '.join(str(d) for d in _DT_NAMES)})")
    return name


class _Dev:
    """One torch device index: a session and a daemon device."""

    __slots__ = ("index", "session", "ddev", "tdev", "_idx_cache", "owns")

    def __init__(self, index: int, session: Session, ddev: Device, owns: bool):
        self.index = index
        self.session = session
        self.ddev = ddev
        self.tdev = torch.device("privateuseone", index)
        self._idx_cache: dict = {}
        self.owns = owns

    def index_of(self, numel: int, size, stride, off: int, mask: bool = False):
        """The flat storage indices (an int64 daemon tensor) of a strided view, and
        with mask the bool mask of the storage elements it covers; cached."""
        key = (numel, size, stride, off, mask)
        got = self._idx_cache.get(key)
        if got is not None:
            if _cap is not None:
                _cap.keep.append(got)  # a constant the graph reads: kept while it lives
            return got
        base = np.arange(numel, dtype=np.int64)
        span = off + sum((s - 1) * st for s, st in zip(size, stride) if s > 0)
        if off < 0 or span >= numel or any(st < 0 for st in stride):
            raise RuntimeError(f"tensordd.torch: a view (size {list(size)}, stride "
                               f"{list(stride)}, offset {off}) outside its storage of "
                               f"{numel} elements")
        idx = np.lib.stride_tricks.as_strided(base[off:], shape=size,
                                              strides=[8 * s for s in stride]).reshape(-1)
        s = self.session
        if _cap is not None:
            _cap.refuse(f"a strided view's index (size {list(size)}, stride {list(stride)}) "
                        f"seen the first time (run the step once before capturing it)")
        idx_t = s.tensor(np.ascontiguousarray(idx), device=self.ddev)
        if mask:
            m = np.zeros(numel, dtype=np.bool_)
            m[idx] = True
            got = (idx_t, s.tensor(m, device=self.ddev))
        else:
            got = idx_t
        if len(self._idx_cache) > 512:
            self._idx_cache.clear()
        self._idx_cache[key] = got
        return got


_devices: list = []
# The graph being captured (tensordd.torch._graph), or None; _epoch changes when one
# begins, so that no value derived before it (the caches of _value and flat) is read
# inside it: the graph's inputs are then the storages' own handles.
_cap = None
_epoch = 0
_sessions: dict = {}  # endpoint -> Session this module opened
_lock = threading.Lock()


def device(endpoint=None, daemon_device=None, **connect_kwargs) -> torch.device:
    """The torch device for daemon_device ("cpu:0", "cuda:1", ...; None:
    ``$TENSORDD_DEVICE``, else "cpu:0") of the daemon at endpoint (a
    ``tcp://``/``unix://``/``tls://`` address, None for ``$TENSORDD_ENDPOINT`` or the
    default; or an open :class:`tensordd.Session`).

    One session per endpoint is opened and shared by its devices (connect_kwargs:
    :func:`tensordd.connect`'s token, timeout, ...). Returns
    ``torch.device("privateuseone", N)``; the same (endpoint, device) gives the same N.
    """
    _register()
    if daemon_device is None:
        daemon_device = os.environ.get("TENSORDD_DEVICE") or "cpu:0"
    ddev = Device.parse(daemon_device)
    with _lock:
        if isinstance(endpoint, Session):
            session, owns = endpoint, False
        else:
            key = endpoint
            session = _sessions.get(key)
            if session is None or not session._open:
                from .. import session as _session_mod
                previous = _session_mod._default
                session = connect(endpoint, **connect_kwargs)
                _session_mod._default = previous  # (the device's session is not the default)
                _sessions[key] = session
            owns = True
        for d in _devices:
            if d.session is session and d.ddev == ddev:
                return d.tdev
        if ddev not in session.devices():
            raise ValueError(f"tensordd.torch: the daemon at {session.endpoint} has no device "
                             f"{ddev} (it has {', '.join(map(str, session.devices()))})")
        d = _Dev(len(_devices), session, ddev, owns)
        _devices.append(d)
        return d.tdev


def _dev_of(tdev) -> _Dev:
    tdev = torch.device(tdev)
    i = tdev.index or 0
    if tdev.type != "privateuseone" or i >= len(_devices):
        raise RuntimeError(f"tensordd.torch: {tdev} is not a device made by "
                           f"tensordd.torch.device()")
    return _devices[i]


def session_of(t) -> Session:
    """The tensordd Session behind a DaemonTensor (or a torch device)."""
    return (t._st.dev if isinstance(t, DaemonTensor) else _dev_of(t)).session


def daemon_device_of(t) -> Device:
    """The daemon device (``Device('cpu:0')``) behind a DaemonTensor or a torch device."""
    return (t._st.dev if isinstance(t, DaemonTensor) else _dev_of(t)).ddev


def synchronize(dev=None) -> None:
    """Waits for every op sent so far (``torch.cuda.synchronize``); raises the first
    asynchronous error. dev: a torch device (None: every session in use)."""
    sessions = [_dev_of(dev).session] if dev is not None else \
        list({id(d.session): d.session for d in _devices}.values())
    for s in sessions:
        if s._open:
            s.sync()


# ---------------------------------------------------------------- storage and tensors

class _Storage:
    """A tensor storage: the daemon handle of its current contents (``h``, a value of
    shape ``shape``; None until first read or written) and a version bumped by each
    write. The daemon values are never modified: a write rebinds ``h``."""

    __slots__ = ("dev", "dtype", "numel", "h", "shape", "version", "_flat")

    def __init__(self, dev: _Dev, dtype, numel: int, h=None, shape=None):
        self.dev = dev
        self.dtype = dtype
        self.numel = numel
        self.h = h
        self.shape = shape
        self.version = 0
        self._flat = None
        if _cap is not None and h is not None:
            _cap.wrote(self)  # made by the graph: a replay binds its handle again

    def value(self):
        if self.h is None:  # (torch.empty: never read before being written, usually)
            self.h = self.dev.session._op("zeros", shape=[self.numel], device=self.dev.ddev,
                                         dtype=_dt(self.dtype))
            self.shape = (self.numel,)
        elif _cap is not None:
            _cap.read(self)
        return self.h

    def flat(self):
        f = self._flat
        if f is not None and f[0] == self.version and f[2] == _epoch:
            return f[1]
        h = self.value()
        v = h if len(self.shape) == 1 else self.dev.session._op("reshape", h, shape=(-1,))
        self._flat = (self.version, v, _epoch)
        return v

    def set(self, v, shape) -> None:
        if _cap is not None:
            _cap.wrote(self)
        self.h = v
        self.shape = tuple(shape)
        self.version += 1
        self._flat = None


def _contig_strides(size) -> tuple:
    st, acc = [], 1
    for s in reversed(size):
        st.append(acc)
        acc *= max(s, 1)
    return tuple(reversed(st))


def _is_contig(size, stride) -> bool:
    acc = 1
    for s, st in zip(reversed(size), reversed(stride)):
        if s != 1:
            if st != acc:
                return False
            acc *= s
    return True


def _perm_of(size, stride):
    """The storage order of a permuted dense view (perm[j]: the view dim at storage
    position j), or None."""
    perm = sorted(range(len(size)), key=lambda i: -stride[i])
    if _is_contig([size[p] for p in perm], [stride[p] for p in perm]):
        return perm
    return None


def _prod(xs) -> int:
    n = 1
    for x in xs:
        n *= x
    return n


class DaemonTensor(torch.Tensor):
    """A torch tensor on a tensordd device: a view (size, stride, offset) of a
    :class:`_Storage` whose contents are a daemon handle."""

    __torch_function__ = torch._C._disabled_torch_function_impl

    @staticmethod
    def __new__(cls, st: _Storage, size, stride, offset: int = 0, requires_grad=False):
        r = torch.Tensor._make_wrapper_subclass(cls, size, strides=stride,
                                                storage_offset=offset, dtype=st.dtype,
                                                device=st.dev.tdev,
                                                requires_grad=requires_grad)
        r._st = st
        r._geo = (tuple(size), tuple(stride), offset)
        r._vc = None
        return r

    @property
    def is_cuda(self):
        # False, but during a capturable Adam/AdamW step (tensordd.torch._graph): torch
        # 1.13 asserts is_cuda there, and its capturable path is what a replay needs
        from ._graph import _as_cuda
        return _as_cuda[0] > 0

    def __repr__(self, *, tensor_contents=None):
        try:
            host = self.detach().cpu()
        except Exception as e:  # noqa: BLE001 (a repr never raises)
            return f"DaemonTensor(<unreadable: {e}>, device='{self.device}')"
        text = repr(host)
        suffix = f", device='{self.device}'"
        if text.endswith(")"):
            return text[:-1] + suffix + ")"
        return text + suffix

    def numpy(self, *args, **kwargs):
        """Refused, as for a CUDA tensor: ``t.cpu().numpy()`` downloads the values."""
        raise TypeError(f"can't convert {self.device} device type tensor to numpy. Use "
                        f"Tensor.cpu() to copy the tensor to host memory first.")

    def __deepcopy__(self, memo):
        # torch's copies __dict__, which holds the session; the copy shares the daemon
        # value (values are never modified in the daemon)
        got = memo.get(id(self))
        if got is not None:
            return got
        with torch.no_grad():
            new = self.clone()
        if getattr(self, "_is_param", False):
            new = torch.nn.Parameter(new, self.requires_grad)
        elif self.requires_grad:
            new.requires_grad_(True)
        memo[id(self)] = new
        return new

    def __reduce_ex__(self, proto):
        # pickled (torch.save, copy, multiprocessing) as its values on the host
        host = self.detach().cpu()
        if isinstance(self, torch.nn.Parameter) or getattr(self, "_is_param", False):
            host = torch.nn.Parameter(host, self.requires_grad)
        return host.__reduce_ex__(proto)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return _ops.dispatch(func, args, kwargs or {})


def _value(t: DaemonTensor):
    """The daemon value (a tensordd.Tensor of t's shape and dtype) of t, derived from
    its storage (cached until the storage changes)."""
    st = t._st
    vc = t._vc
    if vc is not None and vc[0] == st.version and vc[2] == _epoch:
        return vc[1]
    size, stride, off = t._geo
    v = _derive(st, size, stride, off)
    v._shape = size
    v._dtype = _dt(st.dtype)
    v._device = st.dev.ddev
    t._vc = (st.version, v, _epoch)
    return v


def _derive(st: _Storage, size, stride, off):
    n = _prod(size)
    dev = st.dev
    s = dev.session
    if n == 0:
        return s._op("zeros", shape=tuple(size), device=dev.ddev, dtype=_dt(st.dtype))
    h = st.value()
    if any(x == 0 and sz > 1 for x, sz in zip(stride, size)):  # expanded dims
        size1 = tuple(1 if x == 0 else sz for x, sz in zip(stride, size))
        v = _derive(st, size1, stride, off)
        return s._op("expand", v, shape=tuple(size))
    if off == 0 and n == st.numel:
        if _is_contig(size, stride):
            return h if size == st.shape else s._op("reshape", h, shape=tuple(size))
        perm = _perm_of(size, stride)
        if perm is not None:
            psize = tuple(size[p] for p in perm)
            v = h if psize == st.shape else s._op("reshape", h, shape=tuple(psize))
            inv = [0] * len(perm)
            for j, p in enumerate(perm):
                inv[p] = j
            return s._op("permute", v, dims=tuple(inv))
    if _is_contig(size, stride):
        v = s._op("slice", st.flat(), dim=0, start=off, stop=off + n)
        return v if len(size) == 1 else s._op("reshape", v, shape=tuple(size))
    idx = dev.index_of(st.numel, size, stride, off)
    v = s._op("index_select", st.flat(), idx, dim=0)
    return v if len(size) == 1 else s._op("reshape", v, shape=tuple(size))


def _write(t: DaemonTensor, v) -> None:
    """Stores v (a daemon value of t's shape and dtype) into t's part of its storage."""
    st = t._st
    size, stride, off = t._geo
    n = _prod(size)
    if n == 0:
        return
    v._shape = size
    v._dtype = _dt(st.dtype)
    v._device = st.dev.ddev
    s = st.dev.session
    if off == 0 and n == st.numel:
        if _is_contig(size, stride):
            st.set(v, size)
            t._vc = (st.version, v, _epoch)
            return
        perm = _perm_of(size, stride)
        if perm is not None:
            st.set(s._op("permute", v, dims=tuple(perm)), [size[p] for p in perm])
            t._vc = (st.version, v, _epoch)
            return
    if any(x == 0 and sz > 1 for x, sz in zip(stride, size)):
        raise RuntimeError("unsupported operation: more than one element of the written-to "
                           "tensor refers to a single memory location. Please clone() the "
                           "tensor before performing the operation.")
    f = st.flat()
    vf = v if len(size) == 1 else s._op("reshape", v, shape=(-1,))
    if _is_contig(size, stride):
        parts = []
        if off > 0:
            parts.append(s._op("slice", f, dim=0, start=0, stop=off))
        parts.append(vf)
        if off + n < st.numel:
            parts.append(s._op("slice", f, dim=0, start=off + n, stop=st.numel))
        new = parts[0] if len(parts) == 1 else s._op("cat", *parts, dim=0)
    else:
        idx, mask = st.dev.index_of(st.numel, size, stride, off, mask=True)
        z = s._op("zeros", shape=[st.numel], device=st.dev.ddev, dtype=_dt(st.dtype))
        new = s._op("where", mask, s._op("scatter_add", z, idx, vf, dim=0), f)
    st.set(new, (st.numel,))
    t._vc = (st.version, v, _epoch)


def _new(dev: _Dev, v, size, dtype) -> DaemonTensor:
    """A fresh contiguous DaemonTensor holding daemon value v."""
    size = tuple(size)
    v._shape = size
    v._dtype = _dt(dtype)
    v._device = dev.ddev
    st = _Storage(dev, dtype, _prod(size), v, size)
    t = DaemonTensor(st, size, _contig_strides(size), 0)
    t._vc = (0, v, _epoch)
    return t


def _empty(dev: _Dev, size, stride, dtype) -> DaemonTensor:
    size = tuple(size)
    stride = tuple(stride)
    numel = 1 + sum((s - 1) * x for s, x in zip(size, stride)) if _prod(size) else 0
    st = _Storage(dev, dtype, max(numel, 0))
    return DaemonTensor(st, size, stride, 0)


def _download(t: DaemonTensor, what: str = "reading a value (.item(), .cpu(), bool(), print)"
              ) -> torch.Tensor:
    """t's values as a CPU torch tensor (one round trip; raises the session's first
    asynchronous error)."""
    if _cap is not None:
        _cap.refuse(what)
    arr = _value(t).numpy()
    if not arr.flags.writeable or not arr.flags.c_contiguous:
        arr = np.array(arr, order="C")
    out = torch.from_numpy(arr)
    if out.dtype != t.dtype:
        out = out.to(t.dtype)
    return out.reshape(t.shape)


# ---------------------------------------------------------------- PrivateUse1 kernels

_registered = False
_lib = None


def _k_empty(size, dtype=None, layout=None, device=None, pin_memory=None,
             memory_format=None):
    dev = _dev_of(device)
    dtype = dtype or torch.get_default_dtype()
    _dt(dtype)
    size = tuple(int(x) for x in size)
    return _empty(dev, size, _contig_strides(size), dtype)


def _k_empty_strided(size, stride, dtype=None, layout=None, device=None, pin_memory=None):
    dev = _dev_of(device)
    dtype = dtype or torch.get_default_dtype()
    _dt(dtype)
    return _empty(dev, [int(x) for x in size], [int(x) for x in stride], dtype)


def _k_copy_from(src, dst, non_blocking=False):
    # copy_ where the Python key is excluded (torch.tensor(..., device=dev) builds on the
    # host, then copies with it off): torch's copy_ calls _copy_from on dst's backend
    from ._ops import _copy_
    return _copy_(torch.ops.aten.copy_.default, (dst, src), {})


# Factories whose values are a function of their arguments (and of the client's CPU
# generator, for randperm, as manual_seed seeds the initialisation's draws): made on the host
# and uploaded once, so that torch.arange(n, device=dev) works as with CUDA.
_HOST_FACTORIES = ("arange.default", "arange.start", "arange.start_step", "linspace.default",
                   "logspace.default", "eye.default", "eye.m", "randperm.default",
                   "randperm.generator", "tril_indices.default", "triu_indices.default")


def _host_factory(overload):
    def kernel(*args, **kwargs):
        device = kwargs.pop("device", None)
        kwargs.pop("pin_memory", None)
        host = overload(*args, **kwargs, device=torch.device("cpu"))
        return host.to(device)
    return kernel


def _register() -> None:
    global _registered, _lib
    if _registered:
        return
    from ._guard import install
    install()
    _lib = torch.library.Library("aten", "IMPL", "PrivateUse1")
    _lib.impl("empty.memory_format", _k_empty)
    _lib.impl("empty_strided", _k_empty_strided)
    _lib.impl("_copy_from", _k_copy_from)
    for name in _HOST_FACTORIES:
        packet, _, overload = name.partition(".")
        _lib.impl(packet if overload == "default" else name,
                  _host_factory(getattr(getattr(torch.ops.aten, packet), overload)))
    _registered = True


def coverage():
    """The aten ops this device maps: a list of (aten op, how, daemon ops)."""
    from ._ops import coverage as _cov
    return _cov()


def coverage_table() -> str:
    """coverage() as the markdown table ``python -m tensordd.torch`` prints."""
    from ._ops import coverage_table as _tab
    return _tab()


from . import _ops  # noqa: E402 (the mappings use the names above)
from ._graph import Graph, graph  # noqa: E402


# At import, not at the first device(): torch's autograd engine sizes its per-device queues
# from the registered device guards once, at the process's first backward, so the guard must
# be in place before any backward runs (a script imports this module before training).
_register()
