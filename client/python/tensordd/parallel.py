"""parallel -- several daemons: one session per daemon, process groups, collectives run by
the daemons (on Gloo), and data-parallel training.

A process group joins one session on each of world_size daemons; the daemons then
all-reduce, broadcast and all-gather their sessions' tensors among themselves, over
their own connections (the bytes never pass through this client)::

    sessions = tensordd.parallel.connect_many(["tcp://gpu1:7070", "tcp://gpu2:7070"])
    pg = tensordd.parallel.init_process_group(sessions)     # rank i: sessions[i]
    params = [[s.tensor(w, requires_grad=True) for w in init] for s in sessions]
    tensordd.parallel.broadcast_parameters(pg, params)       # rank 0's values everywhere
    grads = [loss.backward() for loss in losses]             # one per rank
    tensordd.parallel.all_reduce_gradients(pg, grads, params, op="avg")

The ranks meet one of two ways. By default their daemons' addresses travel through this
client (``rendezvous="client"``: GroupCreate answers with a rank's addresses, GroupConnect
hands every rank's to each): nothing is shared but the client. With
``rendezvous="store"`` they meet in Gloo's file store, each daemon started with
``--group-store-dir DIR`` (one host: any directory; several hosts: a shared
filesystem). Either way each daemon listens for its peers on ``--group-address``
(default 127.0.0.1: set an address the others reach). A collective is synchronising: every rank must call
it, with the same tensor shapes and dtypes (else every rank gets SHAPE_MISMATCH or
DTYPE_MISMATCH and the group stays usable). A rank that dies, or does not take part
within the daemons' ``--group-timeout``, gives the others TimedOutError and breaks the
group (make a new one); the sessions go on.

When one script drives every rank, the ProcessGroup methods issue each rank's call from
a thread of their own (each call blocks until all ranks joined). A script per rank (one
process per host) uses :func:`create_group` and the :class:`Group` it returns.
"""

from __future__ import annotations

import concurrent.futures
import uuid

import numpy as np

from . import tensordd_pb2 as pb
from .autograd import Gradients
from .device import Device
from .session import Session, _Call, connect
from .tensor import Tensor

__all__ = ["connect_many", "create_group", "prepare_group", "Group", "ProcessGroup", "init_process_group",
           "broadcast_parameters", "all_reduce_gradients", "DataParallel"]

_OPS = {"sum": pb.REDUCE_SUM, "avg": pb.REDUCE_AVG, "mean": pb.REDUCE_AVG, "max": pb.REDUCE_MAX}


def connect_many(endpoints, **kwargs) -> list[Session]:
    """One session per endpoint (rank i: endpoints[i]); kwargs as :func:`tensordd.connect`.
    If one cannot be opened, those already open are closed and the error raised. The
    default session is left as it was."""
    from . import session as _session

    before = _session._default
    sessions: list[Session] = []
    try:
        for ep in endpoints:
            sessions.append(connect(ep, **kwargs))
    except BaseException:
        for s in sessions:
            s.close(raise_errors=False)
        raise
    finally:
        _session._default = before
    return sessions


def _op(op: str) -> int:
    try:
        return _OPS[op]
    except KeyError:
        raise ValueError(f"unknown reduce op {op!r} (sum, avg, max)") from None


def _tensors(session, tensors, what: str) -> list[Tensor]:
    out = list(tensors)
    for t in out:
        if not isinstance(t, Tensor):
            raise TypeError(f"{what}: expected Tensors, got {type(t).__name__}")
        if t._session is not session:
            raise ValueError(f"{what}: tensor #{t._handle} belongs to another session")
    return out


class Group:
    """One rank of a process group: a group handle in one session."""

    def __init__(self, session: Session, handle: int, name: str, rank: int, world_size: int):
        self.session = session
        self.name = name
        self.rank = rank
        self.world_size = world_size
        self._handle = handle
        self._released = False

    def __repr__(self) -> str:
        return (f"<tensordd.parallel.Group {self.name!r} rank {self.rank} of "
                f"{self.world_size} on {self.session.endpoint}>")

    def __del__(self):
        s = getattr(self, "session", None)
        if s is not None and not self._released:
            s._release_later(self._handle)

    def release(self) -> None:
        """Leaves the group (this rank's connections to the others close)."""
        if not self._released:
            self._released = True
            self.session._release_later(self._handle)

    def _call(self, req, what: str, handles=()) -> None:
        self.session._roundtrip(req, _Call(what, (self._handle, *handles)))

    def connect(self, addresses) -> None:
        """Connects a group made by :func:`prepare_group` to its peers: addresses[r] is
        what prepare_group returned on rank r (every rank's, this one's included; only
        each one's entry for this rank goes to the daemon). Returns once every rank is
        connected; TimedOutError when one does not come within --group-timeout."""
        if len(addresses) != self.world_size:
            raise ValueError(f"{len(addresses)} ranks' addresses for a group of "
                             f"{self.world_size}")
        req = self.session._new_request()
        req.group_connect.group = self._handle
        req.group_connect.addresses.extend(
            bytes(a[self.rank]) if len(a) > self.rank else b"" for a in addresses)
        self._call(req, "group_connect")

    def all_reduce(self, tensors, op: str = "sum") -> None:
        """Reduces tensors (a Tensor or a list) across the ranks, in place: op is "sum",
        "avg" (floats) or "max". Tensors must be contiguous, on the group's device."""
        if isinstance(tensors, Tensor):
            tensors = [tensors]
        ts = _tensors(self.session, tensors, "all_reduce")
        req = self.session._new_request()
        req.all_reduce.group = self._handle
        req.all_reduce.op = _op(op)
        req.all_reduce.tensors.extend(t._handle for t in ts)
        self._call(req, "all_reduce", [t._handle for t in ts])

    def all_reduce_gradients(self, grads: Gradients, params, op: str = "avg") -> None:
        """Reduces the gradient of each of params in grads across the ranks (every rank
        names the same parameters in the same order); each gradient is replaced in grads
        by the result. Packed into few collective calls by the daemon."""
        if not isinstance(grads, Gradients):
            raise TypeError(f"all_reduce_gradients: expected Gradients, got "
                            f"{type(grads).__name__}")
        ps = _tensors(self.session, params, "all_reduce_gradients")
        req = self.session._new_request()
        req.all_reduce.group = self._handle
        req.all_reduce.op = _op(op)
        req.all_reduce.grads = grads._handle
        req.all_reduce.tensors.extend(p._handle for p in ps)
        self._call(req, "all_reduce", [grads._handle])
        self.session._grad_epoch += 1  # p.grad caches read the replaced gradients anew

    def broadcast(self, tensors, root: int = 0) -> None:
        """Overwrites tensors (a Tensor or a list), in place, with rank root's."""
        if isinstance(tensors, Tensor):
            tensors = [tensors]
        ts = _tensors(self.session, tensors, "broadcast")
        req = self.session._new_request()
        req.broadcast.group = self._handle
        req.broadcast.root = int(root)
        req.broadcast.tensors.extend(t._handle for t in ts)
        self._call(req, "broadcast", [t._handle for t in ts])

    def all_gather(self, tensor: Tensor) -> Tensor:
        """A new tensor [world_size, *tensor.shape]: every rank's tensor, in rank order."""
        (t,) = _tensors(self.session, [tensor], "all_gather")
        s = self.session
        req = s._new_request()
        req.all_gather.group = self._handle
        req.all_gather.tensor = t._handle
        req.all_gather.output = s._new_handle()
        out = Tensor(s, req.all_gather.output)
        s._roundtrip(req, _Call("all_gather", (self._handle, t._handle),
                                f"-> #{req.all_gather.output}"))
        return out


def _group_create(session, name, rank, world_size, device, exchange):
    dev = Device.parse(device) if isinstance(device, str) else device
    req = session._new_request()
    g = req.group_create
    g.group = session._new_handle()
    g.name = name
    g.rank = int(rank)
    g.world_size = int(world_size)
    g.device.backend = dev.backend
    g.device.ordinal = dev.ordinal
    g.exchange = exchange
    group = Group(session, g.group, name, int(rank), int(world_size))
    resp, _ = session._roundtrip(req, _Call("group_create", (), f"-> group #{g.group} {name!r} "
                                                                f"rank {rank}/{world_size}"))
    return group, resp


def prepare_group(session: Session, name: str, rank: int, world_size: int,
                  device="cpu:0") -> tuple[Group, list[bytes]]:
    """The first step of a group whose addresses travel through the caller: returns the
    Group (not connected yet) and this rank's addresses (one per rank, opaque bytes).
    Once every rank's script has every rank's list, each calls
    ``group.connect(lists)`` (rank order)."""
    group, resp = _group_create(session, name, rank, world_size, device, True)
    return group, list(resp.group_address.addresses)


def create_group(session: Session, name: str, rank: int, world_size: int,
                 device="cpu:0") -> Group:
    """Joins session's daemon to the group name as rank of world_size, meeting the others
    in the daemons' store (--group-store-dir): returns once every rank has joined (each rank's script calls it with the same name), or raises
    TimedOutError after the daemon's --group-timeout. device: where the group's tensors
    live (on a cuda device each collective is staged through host memory over Gloo)."""
    return _group_create(session, name, rank, world_size, device, False)[0]


def _run_all(fns) -> list:
    """Runs each fn on a thread of its own; waits for all; raises the first error (by
    rank) once every call has returned, with the others in its ``rank_errors``."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(fns))) as ex:
        futs = [ex.submit(fn) for fn in fns]
        results, errors = [], []
        for rank, f in enumerate(futs):
            try:
                results.append(f.result())
            except BaseException as e:  # noqa: BLE001 -- re-raised below
                results.append(None)
                errors.append((rank, e))
    if errors:
        first = errors[0][1]
        try:
            first.rank_errors = errors
        except AttributeError:
            pass
        raise first
    return results


class ProcessGroup:
    """Every rank of a group, driven from this script: rank i is sessions[i]."""

    def __init__(self, sessions, name: str | None = None, device="cpu:0",
                 rendezvous: str = "client"):
        self.sessions = list(sessions)
        if not self.sessions:
            raise ValueError("a process group needs at least one session")
        if rendezvous not in ("client", "store"):
            raise ValueError(f"rendezvous is 'client' or 'store', not {rendezvous!r}")
        self.name = name or f"tdd-{uuid.uuid4().hex}"
        n = len(self.sessions)
        if rendezvous == "store":
            self.groups: list[Group] = _run_all([
                (lambda r=r, s=s: create_group(s, self.name, r, n, device))
                for r, s in enumerate(self.sessions)])
            return
        made = [prepare_group(s, self.name, r, n, device) for r, s in enumerate(self.sessions)]
        self.groups = [g for g, _ in made]
        addresses = [a for _, a in made]
        _run_all([(lambda g=g: g.connect(addresses)) for g in self.groups])

    @property
    def world_size(self) -> int:
        return len(self.sessions)

    def run(self, fn, *per_rank) -> list:
        """fn(rank, group, *args_of_rank) on every rank at once (a thread each); returns
        their results in rank order. per_rank: lists with one entry per rank."""
        return _run_all([(lambda r=r: fn(r, self.groups[r], *(a[r] for a in per_rank)))
                         for r in range(self.world_size)])

    def all_reduce(self, tensors_per_rank, op: str = "sum") -> None:
        self.run(lambda r, g, ts: g.all_reduce(ts, op), list(tensors_per_rank))

    def broadcast(self, tensors_per_rank, root: int = 0) -> None:
        self.run(lambda r, g, ts: g.broadcast(ts, root), list(tensors_per_rank))

    def all_gather(self, tensor_per_rank) -> list[Tensor]:
        return self.run(lambda r, g, t: g.all_gather(t), list(tensor_per_rank))

    def release(self) -> None:
        for g in self.groups:
            g.release()


def init_process_group(sessions, name: str | None = None, device="cpu:0",
                       rendezvous: str = "client") -> ProcessGroup:
    """Forms a group of the sessions' daemons (rank i: sessions[i]); name defaults to a
    fresh unique one; rendezvous: "client" (addresses through this client) or "store"
    (the daemons' --group-store-dir)."""
    return ProcessGroup(sessions, name, device, rendezvous)


def broadcast_parameters(pg: ProcessGroup, params_per_rank, root: int = 0) -> None:
    """Every rank's parameters become rank root's (in place): params_per_rank[i] lists
    rank i's, in the same order on every rank."""
    pg.broadcast(params_per_rank, root)


def all_reduce_gradients(pg: ProcessGroup, grads_per_rank, params_per_rank,
                         op: str = "avg") -> None:
    """Each rank's gradients (a Gradients per rank) of its parameters become their
    reduction across the ranks ("avg": the data-parallel mean, "sum", "max")."""
    pg.run(lambda r, g, gr, ps: g.all_reduce_gradients(gr, ps, op),
           list(grads_per_rank), list(params_per_rank))


class DataParallel:
    """Data-parallel training of one model replicated on every rank of pg.

    build(session, device) returns a replica's parameter Tensors (made the same way on
    every rank; rank 0's values are broadcast to all); loss_fn(session, params, xb, yb)
    returns the replica's mean loss on its shard; make_optimizer(params) its optimizer
    (e.g. ``lambda ps: tensordd.optim.Adam(ps, lr=1e-3)``). step(x, y) splits the batch
    into world_size equal contiguous shards (rank i: the i-th), runs forward and
    backward on every rank at once, averages the gradients in the daemons, and steps
    every replica: as one replica stepping on the whole batch (the mean of equal shards'
    means is the batch mean), up to float reassociation.
    """

    def __init__(self, pg: ProcessGroup, build, loss_fn, make_optimizer, device="cpu:0"):
        self.pg = pg
        self.device = device
        self.loss_fn = loss_fn
        self.params = [list(build(s, device)) for s in pg.sessions]
        broadcast_parameters(pg, self.params)
        self.optimizers = [make_optimizer(ps) for ps in self.params]

    def step(self, x, y) -> float:
        """One step on the batch (x, y) (arrays with the batch on axis 0, divisible by
        world_size); returns the batch's mean loss."""
        n = self.pg.world_size
        if len(x) % n or len(x) != len(y):
            raise ValueError(f"a batch of {len(x)} does not split into {n} equal shards")
        k = len(x) // n

        def one(rank, group, ps, opt):
            s = group.session
            xb = s.tensor(np.ascontiguousarray(x[rank * k:(rank + 1) * k]), device=self.device)
            yb = s.tensor(np.ascontiguousarray(y[rank * k:(rank + 1) * k]), device=self.device)
            loss = self.loss_fn(s, ps, xb, yb)
            grads = loss.backward()
            group.all_reduce_gradients(grads, ps, "avg")
            opt.step(grads)
            grads.release()
            return loss.item()

        losses = self.pg.run(one, self.params, self.optimizers)
        return float(np.mean(losses))

    def parameters(self, rank: int = 0) -> list[np.ndarray]:
        """Rank's parameters, downloaded."""
        return [p.numpy() for p in self.params[rank]]
