"""Process groups across daemons (GroupCreate, AllReduce, Broadcast, AllGather on Gloo) and
tensordd.parallel's data-parallel training: results against numpy and against a
single-daemon run on the combined batch; a lost rank and bad arguments, typed.

The ranks' daemons run as separate hosts would: each in a network namespace of its own
(`ip netns`, a veth pair to a bridge, an address the test assigns; Gloo's connections go
over those interfaces), when this process may make them (root). Otherwise they run on
distinct loopback ports of this host. Either way they meet in a temporary
--group-store-dir, and the output says which was used."""

from __future__ import annotations

import os
import queue
import re
import subprocess
import tempfile
import threading
import time

import numpy as np
import pytest

import tensordd
from conftest import TDD_BIN
from tensordd import parallel
from tensordd import tensordd_pb2 as pb

TIMEOUT_S = "2"  # --group-timeout of the daemons: a missing rank fails the others after it
TOKEN = "test-parallel-token"  # daemons beyond loopback need one
RANKS = 3


def _ip(*args, ns=None):
    cmd = (["ip", "netns", "exec", ns, "ip"] if ns else ["ip"]) + list(args)
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if r.returncode:
        raise OSError(f"{' '.join(cmd)}: {r.stderr.strip()}")


class Hosts:
    """Where rank k's daemons run: network namespace k, joined to the others by a bridge
    in this namespace (rank k at 10.A.B.(k+2), this namespace at .1), or, when namespaces
    cannot be made, 127.0.0.1. close() removes what was made."""

    def __init__(self, n):
        self.ns, self.addrs, self.made_links = [], [], []
        tag = str(os.getpid())[-6:]
        self.bridge = f"tdb{tag}"
        a, b = 100 + os.getpid() % 100, os.getpid() // 100 % 250
        try:
            if os.geteuid() != 0:
                raise OSError("not root")
            taken = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True,
                                   text=True, timeout=30).stdout
            if f" 10.{a}.{b}." in taken:
                raise OSError(f"10.{a}.{b}.0/24 is in use here")
            _ip("link", "add", self.bridge, "type", "bridge")
            self.made_links.append(self.bridge)
            _ip("addr", "add", f"10.{a}.{b}.1/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            for k in range(n):
                ns, host, inner = f"tdd{tag}r{k}", f"tdh{tag}r{k}", f"tdn{tag}r{k}"
                _ip("netns", "add", ns)
                self.ns.append(ns)
                _ip("link", "add", host, "type", "veth", "peer", "name", inner)
                _ip("link", "set", inner, "netns", ns)
                _ip("link", "set", host, "master", self.bridge, "up")
                _ip("addr", "add", f"10.{a}.{b}.{k + 2}/24", "dev", inner, ns=ns)
                _ip("link", "set", inner, "up", ns=ns)
                _ip("link", "set", "lo", "up", ns=ns)
                self.addrs.append(f"10.{a}.{b}.{k + 2}")
            self.how = (f"{n} network namespaces ({', '.join(self.ns)}) joined by bridge "
                        f"{self.bridge}, ranks at {', '.join(self.addrs)}")
        except (OSError, subprocess.TimeoutExpired) as e:
            self.close()
            self.ns, self.addrs = [], ["127.0.0.1"] * n
            self.how = (f"no network namespaces ({e}): distinct loopback ports of this host")

    def close(self):
        for ns in self.ns:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
        for link in self.made_links:
            subprocess.run(["ip", "link", "del", link], capture_output=True, timeout=30)
        self.made_links = []


class RankDaemon:
    """A daemon of rank k: in namespace k (or on loopback), listening on its address."""

    def __init__(self, hosts, k, args):
        addr = hosts.addrs[k]
        prefix = ["ip", "netns", "exec", hosts.ns[k]] if hosts.ns else []
        self.args = prefix + [TDD_BIN, "--listen", f"tcp://{addr}:0", "--group-address",
                              addr, *args]
        self.stderr = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(self.args, stdout=subprocess.PIPE, stderr=self.stderr,
                                     text=True, bufsize=1)  # ip netns exec execs the daemon
        self.output, lines = [], queue.Queue()

        def pump():
            for line in self.proc.stdout:
                self.output.append(line)
                lines.put(line)
            lines.put(None)

        threading.Thread(target=pump, daemon=True).start()
        self.endpoint, deadline = None, time.monotonic() + 20
        while self.endpoint is None:
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                self.kill()
                pytest.fail(f"{self.args}: no 'listening on' within 20 s:\n{self.log()}")
            if line is None:
                pytest.fail(f"{self.args} exited {self.proc.wait()}:\n{self.log()}")
            if line.startswith("listening on tcp://"):
                self.endpoint = line.split()[2]

    def log(self):
        self.stderr.seek(0)
        return "stdout:\n" + "".join(self.output) + "stderr:\n" + self.stderr.read()[-4000:]

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.proc.returncode

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def store_fixture(prefix):
    """A module's group store directory, holding the daemons' token file (.token)."""

    @pytest.fixture(scope="module")
    def store():
        with tempfile.TemporaryDirectory(prefix=prefix) as d:
            with open(os.path.join(d, ".token"), "w") as f:
                f.write(TOKEN + "\n")
            os.chmod(os.path.join(d, ".token"), 0o600)
            yield d

    return store


def hosts_fixture(n, label):
    """A module's n hosts (namespaces, or loopback), announced as "label in ..." even
    when output is captured."""

    @pytest.fixture(scope="module")
    def hosts(pytestconfig):
        h = Hosts(n)
        tr = pytestconfig.pluginmanager.get_plugin("terminalreporter")
        capman = pytestconfig.pluginmanager.get_plugin("capturemanager")
        if tr is not None and capman is not None:
            with capman.global_and_fixture_disabled():
                tr.write_line(f"\n{label} in {h.how}")
        yield h
        h.close()

    return hosts


store = store_fixture("tdd-groups-")
hosts = hosts_fixture(RANKS, "test_parallel: ranks' daemons")


def start(hosts, store, n, *extra):
    return [RankDaemon(hosts, k, ["--cpu-devices", "2", "--group-store-dir", store,
                                  "--group-timeout", TIMEOUT_S, "--token-file",
                                  os.path.join(store, ".token"), *extra]) for k in range(n)]


def connect_all(daemons):
    return parallel.connect_many([d.endpoint for d in daemons], timeout=60, token=TOKEN)


@pytest.fixture(scope="module")
def daemons(hosts, store):
    """One daemon per rank; small buckets, so an all-reduce's tensors span several."""
    ds = start(hosts, store, RANKS, "--group-bucket-bytes", "8K")
    yield ds
    for d in ds:
        rc = d.stop()
        assert rc == 0, f"daemon exited with {rc}:\n{d.log()}"
    assert os.listdir(store) == [".token"]  # every rendezvous directory was removed


@pytest.fixture
def sessions(daemons):
    ss = connect_all(daemons)
    yield ss
    for s in ss:
        s.close(raise_errors=False)


def run_ranks(fns):
    """Each fn on a thread (a collective blocks until every rank called it): results or
    the exceptions raised, in rank order. Bounded: a thread still running is a failure."""
    out = [None] * len(fns)

    def one(i):
        try:
            out[i] = fns[i]()
        except BaseException as e:  # noqa: BLE001 -- returned to the test
            out[i] = e

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(len(fns))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
        assert not t.is_alive(), "a collective did not return"
    return out


# ---------------------------------------------------------------- results against numpy

@pytest.mark.parametrize("op", ["sum", "avg", "max"])
def test_all_reduce_matches_numpy(sessions, op):
    pg = parallel.init_process_group(sessions, rendezvous="store")  # Gloo's file store
    rng = np.random.default_rng(1)
    # several tensors and dtypes: packed into 8 KiB buckets, one alone (16 KiB), dtype runs
    shapes = [(3, 5), (4096,), (7,), (0, 3), (2, 3, 4), ()]
    dtypes = [np.float32, np.float32, np.float64, np.float64, np.float64, np.float32]
    if op != "avg":
        shapes.append((9,))
        dtypes.append(np.int64)
    data = [[(rng.standard_normal(sh) * 100).astype(dt) for sh, dt in zip(shapes, dtypes)]
            for _ in sessions]
    ts = [[s.tensor(a) for a in arrs] for s, arrs in zip(sessions, data)]
    pg.all_reduce(ts, op)
    for k in range(len(shapes)):
        stack = np.stack([data[r][k] for r in range(3)])
        want = {"sum": stack.sum(0), "avg": stack.sum(0) / 3, "max": stack.max(0)}[op]
        want = np.asarray(want, dtype=stack.dtype)  # (numpy promotes 0-d float32 / 3)
        for r in range(3):
            got = ts[r][k].numpy()
            assert got.dtype == want.dtype and got.shape == want.shape
            if op == "max" or dtypes[k] == np.int64:
                np.testing.assert_array_equal(got, want)
            else:  # the order of Gloo's additions is its own: float reassociation only
                np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-3)
        # every rank holds the same bits
        assert all(np.array_equal(ts[0][k].numpy(), ts[r][k].numpy()) for r in range(3))


def test_broadcast_and_all_gather(sessions):
    pg = parallel.init_process_group(sessions)  # addresses through the client
    rng = np.random.default_rng(2)
    data = [[rng.standard_normal((4, 6)).astype(np.float32), np.arange(5) * (r + 1)]
            for r in range(3)]
    ts = [[s.tensor(a) for a in arrs] for s, arrs in zip(sessions, data)]
    pg.broadcast(ts, root=1)
    for r in range(3):
        np.testing.assert_array_equal(ts[r][0].numpy(), data[1][0])
        np.testing.assert_array_equal(ts[r][1].numpy(), data[1][1])
    # gather a non-contiguous view: rank r's transposed matrix
    mats = [rng.standard_normal((2, 3)).astype(np.float64) for _ in range(3)]
    gathered = pg.all_gather([s.tensor(m).T for s, m in zip(sessions, mats)])
    want = np.stack([m.T for m in mats])
    for g in gathered:
        assert tuple(g.shape) == (3, 3, 2)
        np.testing.assert_array_equal(g.numpy(), want)


# ---------------------------------------------------------------- data-parallel training

def _digits(n):
    from sklearn.datasets import load_digits

    d = load_digits()
    return (d.data[:n] / 16.0).astype(np.float32), d.target[:n].astype(np.int64)


def _init(seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for a, b in ((64, 32), (32, 10)):
        bound = 1.0 / np.sqrt(a)
        out += [rng.uniform(-bound, bound, (a, b)).astype(np.float32),
                rng.uniform(-bound, bound, (b,)).astype(np.float32)]
    return out


def _loss(s, ps, xb, yb):
    w1, b1, w2, b2 = ps
    return s.op("cross_entropy", (xb @ w1 + b1).relu() @ w2 + b2, yb)


STEPS, BATCH, LR = 5, 48, 0.5


def _single_run(endpoint, x, y, device="cpu:0", steps=STEPS):
    """The oracle: one daemon, one replica, stepping on the whole batch."""
    with tensordd.connect(endpoint, timeout=120, token=TOKEN) as s:
        if device not in [str(d) for d in s.devices()]:
            pytest.skip(f"the daemon serves no {device}")
        ps = [s.tensor(a, device=device, requires_grad=True) for a in _init()]
        opt = tensordd.optim.SGD(ps, lr=LR)
        for i in range(steps):
            xb = s.tensor(x[i * BATCH:(i + 1) * BATCH], device=device)
            yb = s.tensor(y[i * BATCH:(i + 1) * BATCH], device=device)
            opt.step(_loss(s, ps, xb, yb).backward())
        return [p.numpy() for p in ps]


def _data_parallel_run(ss, x, y, device="cpu:0", steps=STEPS):
    """Every replica's parameters after steps data-parallel steps over sessions ss; the
    replicas start from different values, which broadcast_parameters makes rank 0's."""
    try:
        pg = parallel.init_process_group(ss, device=device)
        dp = parallel.DataParallel(
            pg, build=lambda s, dev: [s.tensor(a, device=dev, requires_grad=True)
                                      for a in _init(seed=ss.index(s))],
            loss_fn=_loss, make_optimizer=lambda ps: tensordd.optim.SGD(ps, lr=LR),
            device=device)
        for i in range(steps):
            dp.step(x[i * BATCH:(i + 1) * BATCH], y[i * BATCH:(i + 1) * BATCH])
        return [dp.parameters(r) for r in range(len(ss))]
    finally:
        for s in ss:
            s.close(raise_errors=False)


def _check_data_parallel(got, want):
    for r in range(len(got)):
        for a, b in zip(got[r], got[0]):  # every replica took the same steps, bit for bit
            np.testing.assert_array_equal(a, b)
    # The mean of equal shards' mean losses is the batch's mean loss: the same gradient up
    # to the order of float32 additions (measured differences are about 1e-8).
    for a, b in zip(got[0], want):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    assert any(not np.allclose(a, b) for a, b in zip(want, _init()))  # training moved them


@pytest.mark.parametrize("world", [2, 3])
def test_data_parallel_matches_one_daemon_on_the_combined_batch(daemons, world):
    x, y = _digits(STEPS * BATCH)
    want = _single_run(daemons[0].endpoint, x, y)
    _check_data_parallel(_data_parallel_run(connect_all(daemons[:world]), x, y), want)


# ---------------------------------------------------------------- a lost rank

def test_killed_rank_gives_the_others_a_typed_error_and_sessions_go_on(hosts, store):
    ds = start(hosts, store, 3)
    try:
        ss = connect_all(ds)
        pg = parallel.init_process_group(ss)
        ts = [s.tensor(np.ones(1 << 16, np.float32)) for s in ss]
        pending = threading.Event()

        def rank(r):
            def call():
                pending.set()
                pg.groups[r].all_reduce(ts[r])
            return call

        threads_done = []

        def killer():
            pending.wait(30)
            ds[2].kill()  # rank 2 dies while ranks 0 and 1 are in the all-reduce
            threads_done.append(True)

        k = threading.Thread(target=killer, daemon=True)
        k.start()
        res = run_ranks([rank(0), rank(1)])
        k.join(30)
        for e in res:
            assert isinstance(e, tensordd.TimedOutError), e
            assert "process group" in e.message
        for r in (0, 1):
            # the group is broken: later collectives fail at once, typed
            with pytest.raises(tensordd.TimedOutError, match="broken"):
                pg.groups[r].all_reduce(ts[r])
            # the session goes on
            np.testing.assert_array_equal(ss[r].tensor(np.arange(4.0)).numpy(), np.arange(4.0))
        # the survivors form a new group
        pg2 = parallel.init_process_group(ss[:2])
        t2 = [s.tensor(np.full(3, r + 1.0)) for r, s in enumerate(ss[:2])]
        pg2.all_reduce([[t] for t in t2], "avg")
        np.testing.assert_array_equal(t2[1].numpy(), np.full(3, 1.5))
        for s in ss[:2]:
            s.close()
        for d in ds[:2]:  # the survivors shut down cleanly (under ASan: no leak)
            assert d.stop() == 0, d.log()
    finally:
        for d in ds:
            d.kill()


def test_missing_rank_times_out(daemons):
    ss = connect_all(daemons[:2])
    try:
        # a rank that never joins: GroupCreate answers TIMEOUT, the handle is a broken group
        with pytest.raises(tensordd.TimedOutError, match="rank 0 of 2"):
            parallel.create_group(ss[0], "never-complete", 0, 2)
        pg = parallel.init_process_group(ss)
        t = ss[0].tensor(np.ones(3, np.float32))
        # rank 1 does not take part: rank 0 times out after --group-timeout
        with pytest.raises(tensordd.TimedOutError):
            pg.groups[0].all_reduce(t)
        with pytest.raises(tensordd.TimedOutError, match="broken"):
            pg.groups[0].broadcast(t)
        np.testing.assert_array_equal(t.numpy(), np.ones(3))  # no data had moved
        ss[0].sync()
    finally:
        for s in ss:
            s.close(raise_errors=False)


def test_rank_whose_rank_0_never_comes_times_out(daemons):
    """A rank other than 0 waits in the store for rank 0's key (Gloo reads it through the
    store's wait without a timeout of its own, so its default of 30 s applied): it too
    answers TIMEOUT after --group-timeout (2 s here), well within this session's 15 s."""
    s = tensordd.connect(daemons[1].endpoint, timeout=15, token=TOKEN)
    try:
        for rank, world in [(1, 2), (2, 3)]:
            with pytest.raises(tensordd.TimedOutError, match=f"rank {rank} of {world}"):
                parallel.create_group(s, f"rank-0-never-comes-{world}", rank, world)
        s.sync()
    finally:
        s.close(raise_errors=False)


@pytest.mark.parametrize("waiting", [0, 1])
def test_rank_that_never_connects_times_out(hosts, store, waiting):
    """Addresses through the client, and one rank never sends GroupConnect: the other's
    GroupConnect answers TIMEOUT (Gloo retries a connection a few times: within about
    five --group-timeout; these daemons' is 1 s), and the group is broken."""
    ds = [RankDaemon(hosts, k, ["--group-timeout", "1", "--token-file",
                                os.path.join(store, ".token")]) for k in range(2)]
    try:
        ss = connect_all(ds)
        made = [parallel.prepare_group(s, "never-connects", r, 2) for r, s in enumerate(ss)]
        g, _ = made[waiting]
        with pytest.raises(tensordd.TimedOutError):
            g.connect([a for _, a in made])
        t = ss[waiting].tensor(np.ones(2, np.float32))
        with pytest.raises(tensordd.TimedOutError, match="broken"):
            g.all_reduce(t)
        for s in ss:
            s.close()
        for d in ds:
            assert d.stop() == 0, d.log()
    finally:
        for d in ds:
            d.kill()


def _sessions_on_every_lane(daemon, lanes):
    """Sessions of daemon until their ids cover every residue mod lanes (a session's work
    runs on lane id % lanes): one per lane, the extra ones closed."""
    picked, spare = {}, []
    for _ in range(4 * lanes):
        s = tensordd.connect(daemon.endpoint, token=TOKEN, timeout=60)
        if s.session_id % lanes in picked:
            spare.append(s)
        else:
            picked[s.session_id % lanes] = s
        if len(picked) == lanes:
            break
    for s in spare:
        s.close()
    assert len(picked) == lanes, "no session on some lane"
    return list(picked.values())


@pytest.mark.parametrize("wait", ["connect", "store", "all_reduce"])
def test_ranks_waiting_for_peers_hold_up_no_other_session(hosts, store, wait):
    """Sessions on every worker lane of a daemon each wait for a rank that never comes (a
    GroupConnect whose peer never connects, a GroupCreate through the store whose peer
    never joins, an AllReduce the other rank never calls): meanwhile another session's
    512x512 matmul (too big to run inline, so it goes to its lane's worker) completes,
    while every one of those requests is still waiting. The waits then fail typed."""
    lanes = 4
    args = ["--group-timeout", "10", "--device-lanes", str(lanes), "--group-store-dir", store,
            "--token-file", os.path.join(store, ".token")]
    v, h = RankDaemon(hosts, 0, args), RankDaemon(hosts, 1, args)
    attackers = []
    try:
        attackers = _sessions_on_every_lane(v, lanes)
        hs = tensordd.connect(h.endpoint, token=TOKEN, timeout=60)
        waits, kept = [], []  # (h's groups are kept: a released one closes its connections)
        for i, a in enumerate(attackers):
            name = f"never-{wait}-{i}"
            if wait == "store":
                waits.append(lambda a=a, name=name: parallel.create_group(a, name, 0, 2))
                continue
            g, addr = parallel.prepare_group(a, name, 0, 2)
            hg, haddr = parallel.prepare_group(hs, name, 1, 2)
            kept.append(hg)
            if wait == "connect":  # h's rank never connects
                waits.append(lambda g=g, addr=addr, haddr=haddr: g.connect([addr, haddr]))
                continue
            run_ranks([lambda: g.connect([addr, haddr]), lambda: hg.connect([addr, haddr])])
            t = a.tensor(np.ones(4, np.float32))
            waits.append(lambda g=g, t=t: g.all_reduce(t))  # h's rank never calls it
        done = [None] * len(waits)

        def one(i):
            try:
                waits[i]()
                done[i] = "returned"
            except BaseException as e:  # noqa: BLE001 -- checked below
                done[i] = e

        threads = [threading.Thread(target=one, args=(i,), daemon=True)
                   for i in range(len(waits))]
        for t in threads:
            t.start()
        time.sleep(1)  # their requests are in (the daemon answers none before a peer)
        rng = np.random.default_rng(3)
        victims = _sessions_on_every_lane(v, lanes)
        for s in victims:
            x = rng.standard_normal((512, 512)).astype(np.float32)
            y = rng.standard_normal((512, 512)).astype(np.float32)
            got = (s.tensor(x) @ s.tensor(y)).numpy()
            np.testing.assert_allclose(got, x @ y, rtol=1e-4, atol=1e-3)
        still = [d is None for d in done]
        assert all(still), f"the victims' work waited for the peers' timeouts: {done}"
        for s in victims:
            s.close()
        # the rank that never comes goes away: each wait fails typed, the daemon goes on
        hs.close(raise_errors=False)
        h.kill()
        for t in threads:
            t.join(120)
            assert not t.is_alive(), "a wait for a peer did not end"
        assert all(isinstance(d, tensordd.TimedOutError) for d in done), done
        for a in attackers:
            a.tensor(np.ones(2, np.float32)).numpy()  # the sessions go on
            a.close(raise_errors=False)
        attackers = []
        assert v.stop() == 0, v.log()
    finally:
        for a in attackers:
            a.close(raise_errors=False)
        for d in (v, h):
            d.kill()


def test_group_requests_in_flight_are_bounded(hosts, store):
    """--group-max-inflight: past that many process-group requests waiting for their peers,
    another is RESOURCE_EXHAUSTED naming the option (nothing bound but a poisoned
    placeholder); once the wait ends, groups form again."""
    d = RankDaemon(hosts, 0, ["--group-max-inflight", "1", "--group-timeout", "3",
                              "--group-store-dir", store, "--token-file",
                              os.path.join(store, ".token")])
    try:
        s0, s1 = (tensordd.connect(d.endpoint, token=TOKEN, timeout=60) for _ in range(2))
        res = [None]
        t = threading.Thread(target=lambda: res.__setitem__(0, run_ranks(
            [lambda: parallel.create_group(s0, "waits-alone", 0, 2)])[0]), daemon=True)
        t.start()
        time.sleep(0.5)  # s0's GroupCreate waits for its rank 1
        with pytest.raises(tensordd.ResourceExhaustedError, match="--group-max-inflight"):
            parallel.create_group(s1, "refused", 0, 1)
        t.join(60)
        assert isinstance(res[0], tensordd.TimedOutError), res
        g = parallel.create_group(s1, "alone", 0, 1)  # the room came back
        x = s1.tensor(np.arange(3, dtype=np.float32))
        g.all_reduce(x)
        np.testing.assert_array_equal(x.numpy(), np.arange(3, dtype=np.float32))
        for s in (s0, s1):
            s.close()
        assert d.stop() == 0, d.log()
    finally:
        d.kill()


# ---------------------------------------------------------------- bad arguments

def _group_create(s, handle, **fields):
    req = s._new_request()
    gc = req.group_create
    gc.group = handle
    for k, v in fields.items():
        setattr(gc, k, v)
    from tensordd.session import _Call

    s._roundtrip(req, _Call("group_create"))
    return gc.group


@pytest.mark.parametrize("fields, argument", [
    ({"name": "g", "rank": 0, "world_size": 0}, "world_size"),
    ({"name": "g", "rank": 2, "world_size": 2}, "rank"),
    ({"name": "g", "rank": 0, "world_size": 100000}, "world_size"),
    ({"name": "../escape", "rank": 0, "world_size": 1}, "name"),
    ({"name": "", "rank": 0, "world_size": 1}, "name"),
])
def test_group_create_bad_arguments(sessions, fields, argument):
    s = sessions[0]
    handle = s._new_handle()
    with pytest.raises(tensordd.InvalidArgumentError) as ei:
        _group_create(s, handle, **fields)
    assert ei.value.argument == argument
    # the failed request bound a poisoned placeholder: a collective on it says so
    t = s.tensor(np.ones(2, np.float32))
    with pytest.raises(tensordd.PoisonedError):
        parallel.Group(s, handle, "failed", 0, 1).all_reduce(t)
    np.testing.assert_array_equal(t.numpy(), np.ones(2, np.float32))  # the session goes on


def test_one_rank_of_a_group_per_daemon(daemons):
    ss = connect_all([daemons[0], daemons[0]])  # two sessions of one daemon
    try:
        res = run_ranks([lambda r=r: parallel.create_group(ss[r], "same-daemon", r, 2)
                         for r in range(2)])
        # whichever came second is refused; the first waits for a rank that never comes
        kinds = sorted(type(e).__name__ for e in res)
        assert kinds == ["InvalidArgumentError", "TimedOutError"], res
        bad = next(e for e in res if isinstance(e, tensordd.InvalidArgumentError))
        assert bad.argument == "name" and "one rank of a group per daemon" in bad.message
    finally:
        for s in ss:
            s.close(raise_errors=False)


def test_group_connect_bad_arguments(sessions):
    s0, s1 = sessions[:2]
    g0, a0 = parallel.prepare_group(s0, "bad-connect", 0, 2)
    g1, a1 = parallel.prepare_group(s1, "bad-connect", 1, 2)
    t = s0.tensor(np.ones(2, np.float32))
    with pytest.raises(tensordd.InvalidArgumentError, match="not connected") as ei:
        g0.all_reduce(t)  # before GroupConnect
    assert ei.value.argument == "group"
    # one address for a group of two (what a client other than this one could send)
    req = s0._new_request()
    req.group_connect.group = g0._handle
    req.group_connect.addresses.append(b"")
    from tensordd.session import _Call

    with pytest.raises(tensordd.InvalidArgumentError) as ei:
        s0._roundtrip(req, _Call("group_connect"))
    assert ei.value.argument == "addresses"
    with pytest.raises(tensordd.InvalidArgumentError, match="at most"):
        g0.connect([a0, [b"x" * 300, b"x" * 300]])  # too long to be one
    with pytest.raises(tensordd.InvalidArgumentError, match="not one"):
        g0.connect([a0, [x[:7] for x in a1]])  # a garbled address: typed, the group broken
    with pytest.raises(tensordd.InvalidArgumentError):
        g0.all_reduce(t)
    # a group formed through the store takes no GroupConnect
    pg = parallel.init_process_group(sessions, rendezvous="store")
    with pytest.raises(tensordd.InvalidArgumentError, match="store"):
        pg.groups[0].connect([a0, a1, a1])
    np.testing.assert_array_equal(t.numpy(), np.ones(2, np.float32))


def test_bad_collective_arguments(sessions):
    s0 = sessions[0]
    pg = parallel.init_process_group(sessions)
    g0 = pg.groups[0]
    other_dev = s0.tensor(np.ones(2, np.float32), device="cpu:1")
    with pytest.raises(tensordd.DeviceMismatchError):
        g0.all_reduce(other_dev)
    with pytest.raises(tensordd.InvalidArgumentError, match="contiguous"):
        g0.all_reduce(s0.tensor(np.ones((2, 3), np.float32)).T)
    with pytest.raises(tensordd.UnsupportedDTypeError):
        g0.all_reduce(s0.tensor(np.ones(2, np.int64)), "avg")
    t = s0.tensor(np.ones(2, np.float32))
    with pytest.raises(tensordd.InvalidArgumentError, match="twice"):
        g0.all_reduce([t, t])
    with pytest.raises(tensordd.InvalidArgumentError) as ei:
        g0.broadcast(t, root=3)
    assert ei.value.argument == "root"
    with pytest.raises(ValueError):
        g0.all_reduce(t, "median")
    # a tensor handle where a group is expected
    req = s0._new_request()
    req.all_reduce.group = t._handle
    req.all_reduce.tensors.append(t._handle)
    from tensordd.session import _Call

    with pytest.raises(tensordd.WrongHandleKindError):
        s0._roundtrip(req, _Call("all_reduce"))
    # gradients of a parameter the Gradients do not hold
    p = s0.tensor(np.ones(2, np.float32), requires_grad=True)
    q = s0.tensor(np.ones(2, np.float32), requires_grad=True)
    grads = (p * 2.0).sum().backward()
    with pytest.raises(tensordd.InvalidArgumentError, match="no gradient"):
        g0.all_reduce_gradients(grads, [q])
    # none of these reached the other ranks: the group still works
    ts = [s.tensor(np.full(2, float(r))) for r, s in enumerate(sessions)]
    pg.all_reduce([[x] for x in ts], "sum")
    np.testing.assert_array_equal(ts[2].numpy(), np.full(2, 3.0))


def test_ranks_that_disagree_all_fail_typed_and_the_group_goes_on(sessions):
    pg = parallel.init_process_group(sessions)
    # shapes differ on rank 1
    ts = [s.tensor(np.ones(3 + (r == 1), np.float32)) for r, s in enumerate(sessions)]
    res = run_ranks([lambda r=r: pg.groups[r].all_reduce(ts[r]) for r in range(3)])
    assert all(isinstance(e, tensordd.ShapeMismatchError) for e in res), res
    # dtypes differ on rank 2
    ts = [s.tensor(np.ones(3, np.float64 if r == 2 else np.float32))
          for r, s in enumerate(sessions)]
    res = run_ranks([lambda r=r: pg.groups[r].all_reduce(ts[r]) for r in range(3)])
    assert all(isinstance(e, tensordd.DTypeMismatchError) for e in res), res
    # different roots
    res = run_ranks([lambda r=r: pg.groups[r].broadcast(ts[r], root=min(r, 1))
                     for r in range(3)])
    assert all(isinstance(e, tensordd.InvalidArgumentError) for e in res), res
    # nothing was written, and the group still works
    np.testing.assert_array_equal(ts[0].numpy(), np.ones(3, np.float32))
    ts = [s.tensor(np.full(3, r + 1.0, np.float32)) for r, s in enumerate(sessions)]
    pg.all_reduce([[t] for t in ts], "max")
    np.testing.assert_array_equal(ts[0].numpy(), np.full(3, 3.0, np.float32))


def test_groups_need_a_store_dir(start_daemon, store):
    plain = start_daemon()
    with tensordd.connect(plain.endpoint, timeout=60) as s:
        with pytest.raises(tensordd.UnsupportedOpError, match="--group-store-dir"):
            parallel.create_group(s, "g", 0, 1)
        # without a store the addresses can still go through the client
        pg = parallel.init_process_group([s])
        t = s.tensor(np.arange(3.0))
        pg.all_reduce([[t]], "sum")
        np.testing.assert_array_equal(t.numpy(), np.arange(3.0))
    sim = start_daemon("--sim-devices", "1", "--group-store-dir", store)
    with tensordd.connect(sim.endpoint, timeout=60) as s:
        # a group of one on ref:0 works: its collectives are the identity
        g = parallel.create_group(s, "g-ref", 0, 1, device="ref:0")
        t = s.tensor(np.arange(3.0), device="ref:0")
        g.all_reduce(t, "avg")
        np.testing.assert_array_equal(t.numpy(), np.arange(3.0))
        assert pb.HANDLE_GROUP == 5


def test_device_memory_groups_are_staged_through_the_host(hosts, store):
    """sim:0's memory is not the host's, as a GPU's is not: its collectives copy each
    bucket-sized piece out on the device's worker, run Gloo on it and copy the result back
    (the path cuda groups take; test_cuda_parallel.py runs it on cuda:0). 4 KiB buckets:
    the 3000-element tensor goes in three pieces, the gathered 2400 bytes in three."""
    ds = start(hosts, store, 2, "--sim-devices", "2", "--group-bucket-bytes", "4K")
    try:
        ss = connect_all(ds)
        pg = parallel.init_process_group(ss, device="sim:0")
        rng = np.random.default_rng(5)
        data = [[rng.standard_normal(3000).astype(np.float32),
                 rng.standard_normal((2, 3)), np.arange(4) * (r + 1), np.zeros((0,))]
                for r in range(2)]
        ts = [[s.tensor(a, device="sim:0") for a in arrs] for s, arrs in zip(ss, data)]
        pg.all_reduce(ts, "sum")
        for k in range(4):
            want = data[0][k] + data[1][k]
            for r in range(2):
                got = ts[r][k].numpy()
                assert got.dtype == want.dtype and got.shape == want.shape
                np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
        pg.broadcast([[t[0]] for t in ts], root=1)
        np.testing.assert_array_equal(ts[0][0].numpy(), ts[1][0].numpy())
        mats = [rng.standard_normal((15, 20)) for _ in range(2)]
        for g in pg.all_gather([s.tensor(m, device="sim:0").T for s, m in zip(ss, mats)]):
            np.testing.assert_array_equal(g.numpy(), np.stack([m.T for m in mats]))
        other = ss[0].tensor(np.ones(2), device="sim:1")
        with pytest.raises(tensordd.DeviceMismatchError):
            pg.groups[0].all_reduce(other)
        with pytest.raises(tensordd.BackendMismatchError):
            pg.groups[0].all_reduce(ss[0].tensor(np.ones(2)))
        assert "on sim:0; collectives staged through host memory over Gloo" in ds[0].log()
        for s in ss:
            s.close()
        for d in ds:
            assert d.stop() == 0, d.log()
    finally:
        for d in ds:
            d.kill()


def test_cuda_groups_run_staged_and_say_nccl_is_not_used(start_daemon):
    """A group on a cuda device runs its collectives staged through host memory over Gloo
    (test_cuda_parallel.py holds them to numpy across daemons); NCCL is only probed, and
    the log says what the probe found and that NCCL is not used. Runs where the daemon
    serves a cuda device (the emulated build, tests/gpu/suites.sh; a real GPU,
    tests/gpu/run.sh); skipped elsewhere."""
    d = start_daemon("--emu-gpus", "1", "--emu-gpu-memory", "64M")
    with tensordd.connect(d.endpoint, timeout=60) as s:
        if "cuda:0" not in [str(x) for x in s.devices()]:
            pytest.skip("this daemon serves no cuda device (TDD_BIN=build/emu/tensordd does)")
        pg = parallel.init_process_group([s], device="cuda:0")
        t = s.tensor(np.arange(6, dtype=np.float32), device="cuda:0")
        pg.all_reduce([[t]], "avg")  # a group of one: the identity, through the host
        np.testing.assert_array_equal(t.numpy(), np.arange(6, dtype=np.float32))
        (g,) = pg.all_gather([t])
        np.testing.assert_array_equal(g.numpy(), np.arange(6, dtype=np.float32)[None])
        s.sync()
    log = d.log()
    assert "on cuda:0; collectives staged through host memory over Gloo (NCCL not used: " in log
    assert re.search(r"NCCL not used: (libnccl\.so\.2 cannot be loaded|NCCL .* loads, but "
                     r"there is no CUDA driver|NCCL .* and a CUDA driver are here, but this "
                     r"daemon does not run collectives on NCCL yet)", log), log
    print(next(line for line in log.splitlines() if "staged" in line))
    with tensordd.connect(d.endpoint, timeout=60) as s:
        pg = parallel.init_process_group([s])  # on cpu:0
        t = s.tensor(np.ones(3, np.float32), device="cuda:0")
        with pytest.raises(tensordd.BackendMismatchError):
            pg.all_reduce([[t]])
        np.testing.assert_array_equal(t.numpy(), np.ones(3, np.float32))
