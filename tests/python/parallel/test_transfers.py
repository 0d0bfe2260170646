"""Daemon-to-daemon transfers (TransferAccept, TransferSend, TransferPush) and one client
over several daemons (tensordd.connect_many): the bytes go source to target, never through
the client, and every way a transfer can go wrong is a typed error.

The daemons run as separate hosts would, each in a network namespace of its own joined by
a bridge (test_parallel.Hosts), when this process may make them (root); otherwise on
distinct loopback ports of this host. The output says which. The client reaches each
daemon through a counting proxy (faultproxy.FaultProxy), so the bytes it moved are
counted; the daemons reach each other directly (Session.peer_endpoint), except where a
test puts a slow proxy between them to kill one mid-transfer."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time

import numpy as np
import pytest

import tensordd
from faultproxy import FaultProxy
from conftest import TDD_BIN
from tensordd import tensordd_pb2 as pb
from tensordd.session import _Call
from test_parallel import RankDaemon, hosts_fixture

TOKEN = "test-multi16-token"
MiB = 1 << 20


hosts = hosts_fixture(3, "test_transfers: daemons")


@pytest.fixture(scope="module")
def token_file():
    with tempfile.TemporaryDirectory(prefix="tdd-multi16-") as d:
        path = os.path.join(d, "token")
        with open(path, "w") as f:
            f.write(TOKEN + "\n")
        os.chmod(path, 0o600)
        yield path


def peers_of(hosts):
    """--transfer-peers for daemons on hosts: the bridge's network, or loopback."""
    net = hosts.addrs[0].rsplit(".", 1)[0] + ".0/24," if hosts.ns else ""
    return net + "127.0.0.1"


class Daemons:
    """Daemons k = 0..n-1 on hosts k, each behind a counting proxy on this host."""

    def __init__(self, hosts, token_file, n, *extra):
        self.hosts = hosts
        self.ds = []
        self.proxies = []
        if "--transfer-peers" not in extra:  # pushes reach the hosts (and bridge_proxy's)
            extra = ("--transfer-peers", peers_of(hosts), *extra)
        try:
            for k in range(n):
                d = RankDaemon(hosts, k, ["--token-file", token_file, "--cpu-devices", "2",
                                         *extra])
                self.ds.append(d)
                host, port = d.endpoint[len("tcp://"):].rsplit(":", 1)
                p = FaultProxy(int(port))
                p.target = (host, int(port))
                self.proxies.append(p)
        except BaseException:
            self.close()
            raise

    def connect(self, **kw):
        return tensordd.connect_many([p.endpoint for p in self.proxies],
                                     aliases=[chr(ord("a") + k) for k in range(len(self.ds))],
                                     peer_endpoints=[d.endpoint for d in self.ds],
                                     token=TOKEN, timeout=60, **kw)

    def traffic(self) -> int:
        return sum(p.up + p.down for p in self.proxies)

    def close(self):
        """Stops every daemon (SIGTERM); one the test did not kill must exit 0 (under
        sanitizers: no error, no leak)."""
        for p in self.proxies:
            p.stop()
        bad = []
        for d in self.ds:
            killed = d.proc.poll() is not None
            rc = d.stop()
            if not killed and rc != 0:
                bad.append(f"{d.endpoint} exited {rc}:\n{d.log()}")
        assert not bad, "\n".join(bad)


def bridge_proxy(hosts, target_endpoint, **kw):
    """A FaultProxy the daemons can reach (the bridge's address, or loopback) in front of
    target_endpoint."""
    host, port = target_endpoint[len("tcp://"):].rsplit(":", 1)
    bind = hosts.addrs[0].rsplit(".", 1)[0] + ".1" if hosts.ns else "127.0.0.1"
    p = FaultProxy(int(port), **kw)
    p.target = (host, int(port))
    old = p._lsock
    new = socket.socket()
    new.bind((bind, 0))
    new.listen(8)
    new.settimeout(0.2)
    p._lsock = new  # the accept loop takes the new socket on its next turn
    old.close()
    p.port = new.getsockname()[1]
    p.endpoint = f"tcp://{bind}:{p.port}"
    return p


def vm_hwm(pid) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def accept(target, shape, dtype=pb.DTYPE_F32):
    """TransferAccept by hand: (handle, capability)."""
    req = target._new_request()
    ta = req.transfer_accept
    ta.handle = target._new_handle()
    ta.dtype = dtype
    ta.shape.extend(shape)
    resp, _ = target._roundtrip(req, _Call("transfer_accept"))
    assert len(resp.transfer_capability.capability) == 16
    return ta.handle, resp.transfer_capability.capability


def send(source, t, endpoint, token, capability):
    req = source._new_request()
    ts = req.transfer_send
    ts.tensor = t._handle
    ts.endpoint = endpoint
    ts.token = token
    ts.capability = capability
    source._roundtrip(req, _Call("transfer_send"))


def describe(session, handle):
    req = session._new_request()
    req.describe.handle = handle
    return session._roundtrip(req, _Call("describe"))[0]


# ---------------------------------------------------------------- the transfer itself

def test_256mib_daemon_to_daemon_bit_exact_small_rss_and_no_client_bytes(hosts, token_file):
    n = 64 * MiB  # int32: 256 MiB, every element its own index (a misplaced byte shows)
    ds = Daemons(hosts, token_file, 2)
    try:
        with ds.connect() as m:
            x = m.arange(n, dtype="int32", device="a/cpu:0")
            m["a"].sync()
            before = ds.traffic()
            y = x.to("b/cpu:0")
            moved = ds.traffic() - before
            assert y._session is m["b"] and y.shape == (n,) and y.dtype == "int32"
            hwm = [vm_hwm(d.proc.pid) for d in ds.ds]
            print(f"client bytes for the transfer: {moved}; daemons' VmHWM: "
                  f"{[round(h / MiB, 1) for h in hwm]} MiB for a {n * 4 / MiB:.0f} MiB tensor")
            assert moved < MiB
            for h in hwm:
                assert h <= 1.3 * n * 4
            # bit-exact, checked in daemon b against its own arange (256 MiB back through the
            # counting proxy once took longer than --write-timeout on a loaded machine)
            ref = m.arange(n, dtype="int32", device="b/cpu:0")
            assert int((y != ref).sum().item()) == 0
            np.testing.assert_array_equal(y[-4096:].numpy(),
                                          np.arange(n - 4096, n, dtype=np.int32))
    finally:
        ds.close()


def test_to_between_daemons_by_alias_session_and_endpoint(hosts, token_file):
    ds = Daemons(hosts, token_file, 3)
    try:
        with ds.connect() as m:
            src = np.arange(24, dtype=np.float64).reshape(4, 6)
            x = m.tensor(src, device="a/cpu:0")
            y = x.to("b/cpu:0")  # by alias
            z = y.t().to(m["c"])  # a strided view, by session
            w = z.to(f"{m['a'].endpoint}/cpu:1")  # by endpoint
            np.testing.assert_array_equal(y.numpy(), src)
            np.testing.assert_array_equal(z.numpy(), src.T)
            np.testing.assert_array_equal(w.numpy(), src.T)
            assert str(w.device) == "cpu:1" and w._session is m["a"]
            assert x.to("a/cpu:0") is x
            assert "b/cpu:0" in m.devices()
            # inputs on two daemons: DEVICE_MISMATCH naming both, as between devices
            with pytest.raises(tensordd.DeviceMismatchError, match=r"a/cpu:0.*b/cpu:0"):
                x + y
            with pytest.raises(tensordd.DeviceSpecError, match="no daemon"):
                x.to("nowhere/cpu:0")
            np.testing.assert_array_equal((x + y.to("a/cpu:0")).numpy(), 2 * src)
    finally:
        ds.close()


# ---------------------------------------------------------------- what goes wrong, typed

def test_replayed_expired_and_wrongly_tokened_capabilities(hosts, token_file):
    ds = Daemons(hosts, token_file, 2, "--transfer-window", "1")
    try:
        with ds.connect() as m:
            a, b = m["a"], m["b"]
            x = a.tensor(np.arange(8, dtype=np.float32))
            h, cap = accept(b, [8])
            with pytest.raises(tensordd.UnknownHandleError):
                describe(b, h)  # nothing bound before the bytes arrived
            with pytest.raises(tensordd.UnauthenticatedError):
                send(a, x, b.peer_endpoint, "not-the-token", cap)
            # refused at Hello: the capability was not spent
            send(a, x, b.peer_endpoint, TOKEN, cap)
            assert describe(b, h).tensor.shape == [8]
            with pytest.raises(tensordd.InvalidArgumentError, match="used already") as e:
                send(a, x, b.peer_endpoint, TOKEN, cap)  # replayed
            assert e.value.argument == "capability"
            with pytest.raises(tensordd.InvalidArgumentError, match="not a capability"):
                send(a, x, b.peer_endpoint, TOKEN, bytes(16))  # never issued
            h2, cap2 = accept(b, [8])
            time.sleep(1.3)  # past --transfer-window 1
            with pytest.raises(tensordd.TimedOutError, match="expired"):
                send(a, x, b.peer_endpoint, TOKEN, cap2)
            with pytest.raises(tensordd.UnknownHandleError):
                describe(b, h2)
            h3, cap3 = accept(b, [4])  # the wrong size
            with pytest.raises(tensordd.InvalidArgumentError, match="payload"):
                send(a, x, b.peer_endpoint, TOKEN, cap3)
            with pytest.raises(tensordd.InvalidArgumentError, match="HOST:PORT") as e:
                send(a, x, "http://x", TOKEN, cap3)
            assert e.value.argument == "endpoint"
            # a target nobody listens at: IO, the source's session goes on
            dead = socket.socket()
            dead.bind(("127.0.0.1", 0))
            port = dead.getsockname()[1]
            dead.close()
            with pytest.raises(tensordd.IOFailureError, match="cannot connect"):
                send(a, x, f"tcp://127.0.0.1:{port}", TOKEN, cap3)
            np.testing.assert_array_equal(x.numpy(), np.arange(8, dtype=np.float32))
            m.sync()
    finally:
        ds.close()


class _Listener:
    """A plain TCP listener on another loopback address (not a daemon): records every
    connection it is given and the bytes sent to it, and closes it."""

    def __init__(self, host="127.0.0.2"):
        self.sock = socket.socket()
        self.sock.bind((host, 0))
        self.sock.listen(8)
        self.sock.settimeout(0.2)
        self.endpoint = f"tcp://{host}:{self.sock.getsockname()[1]}"
        self.got, self._stop = [], False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self._stop:
            try:
                c, _ = self.sock.accept()
            except OSError:
                continue
            c.settimeout(1)
            try:
                self.got.append(c.recv(4096))
            except OSError:
                self.got.append(b"")
            c.close()

    def close(self):
        self._stop = True
        self.thread.join(10)
        self.sock.close()


def test_pushes_reach_no_address_by_default(start_daemon):
    """Without --transfer-peers a daemon pushes nowhere: TransferSend is UNSUPPORTED_OP
    naming the option, and nothing connects to the endpoint the client named (a plain
    listener on another loopback address here)."""
    d = start_daemon()
    lst = _Listener()
    s = tensordd.connect(d.endpoint, timeout=60)
    try:
        x = s.tensor(np.arange(4, dtype=np.float32))
        with pytest.raises(tensordd.UnsupportedOpError, match="--transfer-peers"):
            send(s, x, lst.endpoint, "token", bytes(16))
        s.sync()  # the session goes on
    finally:
        s.close(raise_errors=False)
        lst.close()
    assert lst.got == [], f"the daemon connected to {lst.endpoint}: {lst.got}"
    help_text = subprocess.run([TDD_BIN, "--help"], capture_output=True, text=True,
                               timeout=30).stdout
    peers_help = help_text.split("--transfer-peers", 1)[1].split("\n  --", 1)[0]
    assert "default none" in " ".join(peers_help.split())


def test_a_push_token_with_control_characters_is_refused(start_daemon):
    """The token goes out before the target has shown it is a daemon: one holding a
    control character (CR, LF: a line protocol's command) is INVALID_ARGUMENT `token`,
    and nothing connects."""
    d = start_daemon("--transfer-peers", "127.0.0.0/8")
    lst = _Listener()
    s = tensordd.connect(d.endpoint, timeout=60)
    try:
        x = s.tensor(np.arange(4, dtype=np.float32))
        for token in ("a\r\nQUIT\r\n", "a\nb", "tab\there", "del\x7f"):
            with pytest.raises(tensordd.InvalidArgumentError, match="control") as ei:
                send(s, x, lst.endpoint, token, bytes(16))
            assert ei.value.argument == "token"
        s.sync()
    finally:
        s.close(raise_errors=False)
        lst.close()
    assert lst.got == [], f"the daemon connected to {lst.endpoint}: {lst.got}"


def test_transfer_peers_limits_where_a_push_may_connect(hosts, token_file):
    """--transfer-peers: a push to an address outside the list is INVALID_ARGUMENT naming
    the option, before any connection (the capability is not spent); inside it, it lands."""
    ds = Daemons(hosts, token_file, 2, "--transfer-peers", "192.0.2.0/24, 2001:db8::/32")
    try:
        with ds.connect() as m:
            a, b = m["a"], m["b"]
            x = a.tensor(np.arange(8, dtype=np.float32))
            h, cap = accept(b, [8])
            with pytest.raises(tensordd.InvalidArgumentError, match="--transfer-peers"):
                send(a, x, b.peer_endpoint, TOKEN, cap)
            with pytest.raises(tensordd.UnknownHandleError):
                describe(b, h)
            m.sync()
    finally:
        ds.close()
    allowed = ",".join(f"{addr}/32" for addr in hosts.addrs)
    ds = Daemons(hosts, token_file, 2, "--transfer-peers", allowed)
    try:
        with ds.connect() as m:
            a, b = m["a"], m["b"]
            x = a.tensor(np.arange(8, dtype=np.float32))
            h, cap = accept(b, [8])
            send(a, x, b.peer_endpoint, TOKEN, cap)
            assert describe(b, h).tensor.shape == [8]
    finally:
        ds.close()


def _kill_when(proxy, daemon, nbytes):
    """Kills daemon once proxy forwarded nbytes upstream (bounded)."""
    def run():
        deadline = time.monotonic() + 30
        while proxy.up < nbytes and time.monotonic() < deadline:
            time.sleep(0.01)
        daemon.kill()
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_target_that_vanishes_mid_transfer(hosts, token_file):
    ds = Daemons(hosts, token_file, 2)
    m, slow = ds.connect(), None  # (closed below without raising: one daemon is killed)
    try:
        a, b = m["a"], m["b"]
        x = a.randn(4 * MiB)  # 16 MiB through a proxy at ~10 MB/s
        h, cap = accept(b, [4 * MiB])
        slow = bridge_proxy(ds.hosts, ds.ds[1].endpoint, mode="delay", delay=0.005)
        killer = _kill_when(slow, ds.ds[1], 2 * MiB)
        with pytest.raises(tensordd.IOFailureError, match="target's connection") as e:
            send(a, x, slow.endpoint, TOKEN, cap)
        killer.join(30)
        assert "of 16777216 bytes" in str(e.value)
        assert x.numpy().shape == (4 * MiB,)  # the source's session goes on
    finally:
        m.close(raise_errors=False)
        if slow:
            slow.stop()
        ds.close()


def test_source_that_vanishes_mid_transfer(hosts, token_file):
    ds = Daemons(hosts, token_file, 2)
    m, slow = ds.connect(), None  # (closed below without raising: one daemon is killed)
    try:
        a, b = m["a"], m["b"]
        x = a.randn(4 * MiB)
        h, cap = accept(b, [4 * MiB])
        slow = bridge_proxy(ds.hosts, ds.ds[1].endpoint, mode="delay", delay=0.005)
        killer = _kill_when(slow, ds.ds[0], 2 * MiB)
        with pytest.raises((tensordd.ConnectionClosedError, tensordd.IOFailureError)):
            send(a, x, slow.endpoint, TOKEN, cap)
        killer.join(30)
        # the target: nothing bound, and the break is its next synchronising call's error
        deadline = time.monotonic() + 20
        while slow.up < slow.down and time.monotonic() < deadline:
            time.sleep(0.01)  # (the proxy passing the end of stream on)
        err = None
        for _ in range(200):
            try:
                b.sync()
            except tensordd.IOFailureError as e:
                err = e
                break
            time.sleep(0.05)
        assert err is not None and "broke off" in str(err), err
        with pytest.raises(tensordd.UnknownHandleError):
            describe(b, h)
        b.sync()  # reported once; the session goes on
        np.testing.assert_array_equal(b.tensor(np.ones(3)).numpy(), np.ones(3))
    finally:
        m.close(raise_errors=False)
        if slow:
            slow.stop()
        ds.close()


def test_transfer_accept_bad_arguments(hosts, token_file):
    ds = Daemons(hosts, token_file, 1, "--max-transfers", "2")
    try:
        with ds.connect() as m:
            s = m["a"]
            for shape, dtype, kind in (([-1], pb.DTYPE_F32, tensordd.InvalidArgumentError),
                                       ([2], 99, tensordd.InvalidArgumentError),
                                       ([1] * 9, pb.DTYPE_F32, tensordd.InvalidArgumentError)):
                with pytest.raises(kind):
                    accept(s, shape, dtype)
            accept(s, [1])
            accept(s, [1])
            with pytest.raises(tensordd.ResourceExhaustedError):
                accept(s, [1])  # --max-transfers 2
    finally:
        ds.close()


def _accept_until_refused(s, most):
    """TransferAccepts of one element until one is refused (at most `most`): how many
    were issued, and the refusal (None when none was)."""
    for n in range(most):
        try:
            accept(s, [1])
        except tensordd.ResourceExhaustedError as e:
            return n, e
    return most, None


def test_one_session_cannot_hold_every_transfer_capability(start_daemon):
    """A session holds at most --max-session-transfers (16) capabilities outstanding; the
    daemon's --max-transfers (256) are left to the others; a session's are forgotten when
    it ends, so the room comes back at once (not a window later)."""
    d = start_daemon()
    hog, other = (tensordd.connect(d.endpoint, timeout=60) for _ in range(2))
    try:
        n, refused = _accept_until_refused(hog, 300)
        print(f"one session: {n} capabilities, then {refused}")
        assert n == 16 and refused is not None and "--max-session-transfers" in str(refused)
        accept(other, [1])  # the others still get theirs
        other.sync()
        hog.sync()  # the refusal leaves the session going
    finally:
        hog.close(raise_errors=False)
        other.close(raise_errors=False)
    d = start_daemon("--max-transfers", "20")
    hogs = [tensordd.connect(d.endpoint, timeout=60) for _ in range(2)]
    late = tensordd.connect(d.endpoint, timeout=60)
    try:
        assert _accept_until_refused(hogs[0], 100)[0] == 16
        n, refused = _accept_until_refused(hogs[1], 100)
        assert n == 4 and "--max-transfers" in str(refused)
        with pytest.raises(tensordd.ResourceExhaustedError, match="--max-transfers"):
            accept(late, [1])
        for h in hogs:
            h.close()  # their 20 capabilities go with them
        assert _accept_until_refused(late, 100)[0] == 16
    finally:
        for x in hogs + [late]:
            x.close(raise_errors=False)


def test_a_push_to_an_ended_session_is_not_answered_closed(hosts, token_file):
    """CLOSED is never sent on the wire: a push naming a capability of a session that has
    ended finds it forgotten (INVALID_ARGUMENT `capability`)."""
    ds = Daemons(hosts, token_file, 2)
    try:
        with ds.connect() as m:
            a = m["a"]
            x = a.tensor(np.arange(4, dtype=np.float32))
            target = tensordd.connect(ds.proxies[1].endpoint, token=TOKEN, timeout=60)
            h, cap = accept(target, [4])
            target.close()
            deadline = time.monotonic() + 10
            while True:  # (the target's daemon ends the session once it read the Goodbye)
                with pytest.raises(tensordd.InvalidArgumentError) as ei:
                    send(a, x, m["b"].peer_endpoint, TOKEN, cap)
                if "not a capability" in str(ei.value) or time.monotonic() > deadline:
                    break
            assert ei.value.argument == "capability" and "not a capability" in str(ei.value)
            m.sync()
    finally:
        ds.close()


# ---------------------------------------------------------------- over TLS

def _tls_listener(d):
    for line in d.output:
        if "listening on tls://" in line:
            return line.split("listening on", 1)[1].split()[0]
    raise AssertionError(f"no tls:// listener in {d.output}")


@pytest.fixture(scope="module")
def pki():
    """A CA, another CA, and a server certificate for 127.0.0.1 signed by the first (made
    with test_tls's helpers: the openssl command)."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is needed to make test certificates")
    import test_tls
    with tempfile.TemporaryDirectory(prefix="tdd-multi16-tls-") as d:
        test_tls._ca(d, "ca")
        test_tls._ca(d, "otherca")
        test_tls._leaf(d, "server", "ca", "subjectAltName=IP:127.0.0.1\n"
                                          "extendedKeyUsage=serverAuth\n")
        yield lambda name: os.path.join(d, name)


def test_push_to_a_tls_target_checks_its_certificate(start_daemon, pki):
    """The source speaks TLS to a tls:// target, checking its certificate against
    --transfer-ca; a source that does not trust the target's CA refuses it, typed."""
    target = start_daemon("--listen", "tls://127.0.0.1:0", "--tls-cert", pki("server.pem"),
                          "--tls-key", pki("server.key"))
    trusting = start_daemon("--transfer-ca", pki("ca.pem"), "--transfer-peers", "127.0.0.1")
    wary = start_daemon("--transfer-ca", pki("otherca.pem"), "--transfer-peers", "127.0.0.1")
    m = tensordd.connect_many([trusting.endpoint, wary.endpoint, target.endpoint],
                              aliases=["src", "wary", "dst"], timeout=60,
                              peer_endpoints=[trusting.endpoint, wary.endpoint,
                                              _tls_listener(target)])
    try:
        data = np.random.default_rng(1).standard_normal((300, 1000)).astype(np.float32)
        y = m.tensor(data, device="src/cpu:0").to("dst/cpu:0")  # 1.2 MB: several records
        np.testing.assert_array_equal(y.numpy(), data)
        with pytest.raises(tensordd.UnauthenticatedError, match="certificate"):
            m.tensor(data[:2], device="wary/cpu:0").to("dst/cpu:0")
        m["wary"].sync()  # the source's session goes on
    finally:
        m.close(raise_errors=False)


def test_a_pushed_bool_tensor_is_checked_as_an_upload(hosts, token_file):
    """A pusher is a client: its bool bytes are held to 0 or 1, and nothing is bound."""
    ds = Daemons(hosts, token_file, 1)
    try:
        with ds.connect() as m:
            b = m["a"]
            h, cap = accept(b, [4], pb.DTYPE_BOOL)
            pusher = tensordd.connect(ds.proxies[0].endpoint, token=TOKEN, timeout=60)
            try:
                req = pusher._new_request()
                req.transfer_push.capability = cap
                req.want_reply = True
                pusher._send(req, _Call("transfer_push"), payload=np.array([0, 1, 2, 1], np.uint8))
                with pytest.raises(tensordd.InvalidArgumentError, match="byte 2 is 2"):
                    pusher.sync()  # (the push's own answer: an error, read first)
            finally:
                pusher.close(raise_errors=False)
            with pytest.raises(tensordd.UnknownHandleError):
                describe(b, h)
    finally:
        ds.close()
