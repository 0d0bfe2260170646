"""multi -- one client over several daemons: devices named "alias/cpu:0" or
"ENDPOINT/cpu:0", tensors moved between daemons daemon to daemon.

    with tensordd.connect_many(["tcp://10.0.0.2:7070", "tcp://10.0.0.3:7070"],
                               aliases=["a", "b"], token=TOKEN) as m:
        x = m.tensor(np.ones(4, np.float32), device="a/cpu:0")
        y = x.to("b/cpu:0")      # pushed by daemon a straight to daemon b
        (x + y)                  # DeviceMismatchError: a/cpu:0 and b/cpu:0

Each daemon has its own session (m["a"], m[0]); a tensor belongs to one of them, as
with tensordd.connect. An op whose inputs live on two daemons raises
:class:`tensordd.DeviceMismatchError` naming both, as between two devices of one daemon.
"""

from __future__ import annotations

from .device import Device, DeviceSpecError
from .errors import local_error
from .session import Session, connect

__all__ = ["MultiSession", "connect_many"]


def connect_many(endpoints, aliases=None, *, peer_endpoints=None, **kwargs) -> "MultiSession":
    """Opens a session with each daemon of endpoints; kwargs as :func:`tensordd.connect`
    (token, timeout, TLS files, ...: the same for every daemon).

    Args:
        aliases: a name per endpoint ("a" -> devices "a/cpu:0"); the endpoints name
            them too ("tcp://10.0.0.2:7070/cpu:0").
        peer_endpoints: where the daemons reach each other, per endpoint, when that is
            not where this client reaches them (a proxy, NAT, a Kubernetes Service).

    If one cannot be opened, those already open are closed and the error raised. The
    default session is left as it was.
    """
    from . import session as _session

    endpoints = list(endpoints)
    if not endpoints:
        raise ValueError("connect_many: no endpoints")
    aliases = list(aliases) if aliases is not None else [None] * len(endpoints)
    peers = list(peer_endpoints) if peer_endpoints is not None else endpoints
    if len(aliases) != len(endpoints) or len(peers) != len(endpoints):
        raise ValueError("connect_many: one alias and one peer endpoint per endpoint")
    names = set()
    for name in [a for a in aliases if a is not None] + endpoints:
        if not isinstance(name, str) or not name or name in names:
            raise ValueError(f"connect_many: alias or endpoint {name!r} empty or given twice")
        names.add(name)
    for a in aliases:
        if a is not None and ("/" in a or ":" in a):
            raise ValueError(f"connect_many: alias {a!r} may not hold '/' or ':'")
    before = _session._default
    sessions: list[Session] = []
    try:
        for ep, peer in zip(endpoints, peers):
            s = connect(ep, **kwargs)
            s.peer_endpoint = peer
            sessions.append(s)
    except BaseException:
        for s in sessions:
            s.close(raise_errors=False)
        raise
    finally:
        _session._default = before
    return MultiSession(sessions, aliases)


class MultiSession:
    """Sessions with several daemons, addressed by alias or endpoint. Iterating gives the
    sessions in endpoint order (so tensordd.parallel takes it as its list of ranks)."""

    def __init__(self, sessions, aliases):
        self._sessions = list(sessions)
        self._names = {}
        for s, a in zip(self._sessions, aliases):
            s._multi = self
            self._names[s.endpoint] = s
            if a is not None:
                self._names[a] = s
        self._alias = {id(s): (a if a is not None else s.endpoint)
                       for s, a in zip(self._sessions, aliases)}

    # ---- the sessions
    def __iter__(self):
        return iter(self._sessions)

    def __len__(self) -> int:
        return len(self._sessions)

    def __getitem__(self, key) -> Session:
        if isinstance(key, int):
            return self._sessions[key]
        try:
            return self._names[key]
        except KeyError:
            raise KeyError(f"no daemon {key!r} here (aliases and endpoints: "
                           f"{', '.join(sorted(self._names))})") from None

    def name(self, session: Session) -> str:
        """The alias of session's daemon (its endpoint when it has none)."""
        return self._alias[id(session)]

    def _resolve(self, spec: str):
        """(session, Device) of "alias/cpu:0" or "ENDPOINT/cpu:0"."""
        where, _, dev = spec.rpartition("/")
        if where not in self._names:
            raise DeviceSpecError(f"device {spec!r}: no daemon {where!r} in this client "
                                  f"(aliases and endpoints: {', '.join(sorted(self._names))})")
        return self._names[where], Device.parse(dev)

    def device_name(self, t) -> str:
        """t's device as this client names it: "alias/cpu:0"."""
        return f"{self.name(t._session)}/{t.device}"

    def _mismatch(self, op: str, tensors) -> None:
        first = tensors[0]
        other = next(t for t in tensors if t._session is not first._session)
        raise local_error(
            "DEVICE_MISMATCH",
            f"op {op}: inputs on {self.device_name(first)} and {self.device_name(other)}, two "
            f"daemons; move one with .to({self.device_name(first)!r})")

    def devices(self) -> list[str]:
        """Every daemon's devices: "alias/cpu:0", ..."""
        return [f"{self.name(s)}/{d}" for s in self._sessions for d in s.devices()]

    # ---- tensors on a named device
    def tensor(self, data, device: str, **kwargs):
        """Uploads data to device ("alias/cpu:0"); kwargs as :meth:`Session.tensor`."""
        s, dev = self._resolve(device)
        return s.tensor(data, device=dev, **kwargs)

    def _create(self, method, shape, device, kwargs):
        s, dev = self._resolve(device)
        return getattr(s, method)(*shape, device=dev, **kwargs)

    def zeros(self, *shape, device: str, **kwargs):
        """Zeros on device ("alias/cpu:0"), as :meth:`Session.zeros`."""
        return self._create("zeros", shape, device, kwargs)

    def ones(self, *shape, device: str, **kwargs):
        """Ones on device ("alias/cpu:0"), as :meth:`Session.ones`."""
        return self._create("ones", shape, device, kwargs)

    def randn(self, *shape, device: str, **kwargs):
        """Normal random numbers on device ("alias/cpu:0"), as :meth:`Session.randn`."""
        return self._create("randn", shape, device, kwargs)

    def rand(self, *shape, device: str, **kwargs):
        """Uniform random numbers on device ("alias/cpu:0"), as :meth:`Session.rand`."""
        return self._create("rand", shape, device, kwargs)

    def arange(self, *args, device: str, **kwargs):
        """A range on device ("alias/cpu:0"), as :meth:`Session.arange`."""
        s, dev = self._resolve(device)
        return s.arange(*args, device=dev, **kwargs)

    def full(self, shape, fill_value, *, device: str, **kwargs):
        """fill_value everywhere on device ("alias/cpu:0"), as :meth:`Session.full`."""
        s, dev = self._resolve(device)
        return s.full(shape, fill_value, device=dev, **kwargs)

    def sync(self) -> None:
        """Every daemon's sync() (the first error raised after all were asked)."""
        first = None
        for s in self._sessions:
            try:
                s.sync()
            except Exception as e:  # noqa: BLE001 -- raised below
                first = first or e
        if first is not None:
            raise first

    def close(self, raise_errors: bool = True) -> None:
        """Closes every session (each as :meth:`Session.close`; the first error raised
        after all were closed)."""
        first = None
        for s in self._sessions:
            try:
                s.close(raise_errors=raise_errors)
            except Exception as e:  # noqa: BLE001 -- raised below
                first = first or e
        if first is not None:
            raise first

    def __enter__(self) -> "MultiSession":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(raise_errors=exc_type is None)

    def __repr__(self) -> str:
        return f"<tensordd.MultiSession {', '.join(self._alias.values())}>"
