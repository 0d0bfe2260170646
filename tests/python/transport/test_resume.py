"""Sessions that survive a dropped connection (docs/protocol.md, section 7 "Resume").

A client that connects with resume=SECONDS gets a resume token; when the proxy
(faultproxy.py) cuts its connection the client reconnects, resumes the session and sends
again only what the daemon had not applied. The oracle is the same training run without
cuts: the parameters must be equal bit for bit (a step applied twice, or a lost upload,
would change them). A window that runs out is CONNECTION_LOST, and the daemon frees the
session; a resume token is worth nothing without the daemon's auth token.
"""
from __future__ import annotations

import os
import socket
import struct
import time

import numpy as np
import pytest

import tensordd
from faultproxy import FaultProxy
from tensordd import tensordd_pb2 as pb
from test_faults import accounting, settle


class CutProxy(FaultProxy):
    """A pass-through proxy that cuts the connection it carries each time the bytes sent
    so far in one direction reach the next of `cuts` ((direction, offset), offsets counted
    over every connection through it): three cuts, three lost connections."""

    def __init__(self, target_port: int, cuts):
        self.cuts = sorted(cuts, key=lambda c: c[1])
        self.done = []
        super().__init__(target_port, "pass")

    def _pump(self, src, dst, up):
        direction = "up" if up else "down"
        try:
            while not self._stop.is_set():
                try:
                    data = src.recv(65536)
                except socket.timeout:
                    continue
                if not data:
                    dst.shutdown(socket.SHUT_WR)
                    return
                before = self._count(up, len(data))
                cut = next((c for c in self.cuts if c[0] == direction), None)
                if cut and before + len(data) >= cut[1]:
                    keep = max(0, cut[1] - before)
                    if keep:
                        dst.sendall(data[:keep])
                    self.cuts.remove(cut)
                    self.done.append(cut)
                    self._close_both(src, dst)
                    return
                dst.sendall(data)
        except OSError:
            self._close_both(src, dst)


SHAPES = [(64, 256), (256,), (256, 4), (4,)]


def train(s, steps=3):
    """SGD with momentum on a small MLP whose first layer is 64 KiB (its upload and its
    download are long enough to be cut in the middle); returns the parameters."""
    rng = np.random.default_rng(1)
    init = [(rng.standard_normal(sh) * 0.1).astype(np.float32) for sh in SHAPES]
    params = [s.tensor(a, requires_grad=True) for a in init]
    w1, b1, w2, b2 = params
    opt = tensordd.optim.SGD(params, lr=0.05, momentum=0.9)
    for _ in range(steps):
        x = s.tensor(rng.standard_normal((32, 64)).astype(np.float32))
        y = s.tensor(rng.integers(0, 4, 32))
        loss = s.op("cross_entropy", (x @ w1 + b1).relu() @ w2 + b2, y)
        opt.step(loss.backward())
        loss.item()
    return [p.numpy() for p in params]


@pytest.fixture
def rdaemon(start_daemon):
    return start_daemon("--cpu-devices", "1", "--max-resume-window", "30")


def bytes_of_a_run(port):
    """Bytes each way of one training run through a proxy, and the parameters."""
    with FaultProxy(port, "pass") as p:
        with tensordd.connect(p.endpoint, timeout=30, resume=30) as s:
            want = train(s)
        time.sleep(0.1)
        return p.up, p.down, want


def test_training_cut_three_times_ends_with_the_uncut_parameters(rdaemon):
    base = accounting(rdaemon.endpoint)
    with tensordd.connect(rdaemon.endpoint, timeout=30) as s:
        plain = train(s)
    up, down, want = bytes_of_a_run(rdaemon.port)
    for w, p in zip(want, plain):
        np.testing.assert_array_equal(w, p)
    w1_bytes = 64 * 256 * 4
    # mid-upload of w1 (right after Hello), in the middle of the run's requests, and in
    # the download of w1 (the last downloads are w1, b1, w2, b2: w1's payload ends ~5 KiB
    # before the end)
    cuts = [("up", 200 + w1_bytes // 2), ("up", up // 2), ("down", down - 5200 - w1_bytes // 2)]
    with CutProxy(rdaemon.port, cuts) as p:
        with tensordd.connect(p.endpoint, timeout=30, resume=30) as s:
            got = train(s)
            resumes = s._conn.resumes
    assert len(p.done) == 3, f"cuts not reached: {p.cuts}"
    assert len(p._socks) // 2 == 4  # the first connection and one after each cut
    assert 1 <= resumes <= 3  # (a cut while the journal is sent again is retried within)
    for w, g in zip(want, got):
        np.testing.assert_array_equal(w, g)
    settle(rdaemon.endpoint, base)


@pytest.mark.parametrize("at", [0.1, 0.25, 0.4, 0.6, 0.75, 0.9])
def test_a_cut_anywhere_downstream_or_upstream_changes_nothing(rdaemon, at):
    up, down, want = bytes_of_a_run(rdaemon.port)
    cuts = [("up", int(up * at)), ("down", int(down * (1 - at)))]
    with CutProxy(rdaemon.port, cuts) as p:
        with tensordd.connect(p.endpoint, timeout=30, resume=30) as s:
            got = train(s)
    assert len(p.done) == 2
    for w, g in zip(want, got):
        np.testing.assert_array_equal(w, g)


class ClosingProxy(CutProxy):
    """Cuts once, then closes every new connection at once (the daemon is out of reach)."""

    def _pump(self, src, dst, up):
        if self.done:
            self._close_both(src, dst)
            return
        super()._pump(src, dst, up)


def test_an_expired_window_is_connection_lost_and_frees_the_session(start_daemon):
    d = start_daemon("--cpu-devices", "1", "--max-resume-window", "1")
    base = accounting(d.endpoint)
    with ClosingProxy(d.port, [("down", 10**9)]) as p:
        s = tensordd.connect(p.endpoint, timeout=30, resume=60)
        assert s.resume_window == 1  # capped by the daemon
        w = s.tensor(np.ones((256, 256), np.float32))
        s.sync()
        p.cuts = [("down", p.down + 100)]  # inside the next download's payload
        with pytest.raises(tensordd.Error) as e:
            w.numpy()
        assert e.value.code == "CONNECTION_LOST", repr(e.value)
        assert s.closed
    # held for its window (one second), then freed with everything it held
    settle(d.endpoint, base)


def raw_hello(port, **fields):
    """One Hello on a fresh connection; the Response."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as c:
        return hello_on(c, **fields)


def hello_on(c, **fields):
    """Sends a Hello with these fields on socket c; its Response."""
    req = pb.Request(id=1)
    req.hello.min_version = req.hello.max_version = 1
    for k, v in fields.items():
        setattr(req.hello, k, v)
    msg = req.SerializeToString()
    c.sendall(struct.pack("<IIQ", 0x01444454, len(msg), 0) + msg)
    head = b""
    while len(head) < 16:
        head += c.recv(16 - len(head))
    _, n, _ = struct.unpack("<IIQ", head)
    body = b""
    while len(body) < n:
        body += c.recv(n - len(body))
    return pb.Response.FromString(body)


def test_an_unknown_resume_token_is_connection_lost(rdaemon):
    r = raw_hello(rdaemon.port, resume_token=os.urandom(16))
    assert r.WhichOneof("body") == "error"
    assert r.error.code == pb.CONNECTION_LOST
    r = raw_hello(rdaemon.port, resume_token=b"short")
    assert r.error.code == pb.CONNECTION_LOST


def test_a_stolen_token_without_the_auth_token_is_refused(start_daemon, tmp_path):
    tok = tmp_path / "token"
    tok.write_text("s3cret\n")
    tok.chmod(0o600)
    d = start_daemon("--cpu-devices", "1", "--token-file", str(tok))
    with tensordd.connect(d.endpoint, token="s3cret", timeout=30, resume=30) as s:
        t = s.tensor(np.arange(6, dtype=np.float32))
        stolen = s._resume_token
        assert len(stolen) == 16
        for wrong in ("", "guess"):
            r = raw_hello(d.port, token=wrong, resume_token=stolen, resume_window=30)
            assert r.error.code == pb.UNAUTHENTICATED
        # the session is where it was, on its own connection
        np.testing.assert_array_equal(t.numpy(), np.arange(6, dtype=np.float32))
        assert s._conn.resumes == 0


def test_resume_off_by_default_changes_nothing(rdaemon):
    base = accounting(rdaemon.endpoint)
    with FaultProxy(rdaemon.port, "drop", at=3000) as p:
        with pytest.raises(tensordd.Error) as e:
            with tensordd.connect(p.endpoint, timeout=30) as s:
                assert s.resume_window == 0
                train(s)
    assert e.value.code in ("CLOSED", "IO")
    settle(rdaemon.endpoint, base)  # freed at once: nothing held


def test_a_resumed_session_after_goodbye_is_gone(rdaemon):
    """Goodbye frees the session at once: its token resumes nothing."""
    base = accounting(rdaemon.endpoint)
    s = tensordd.connect(rdaemon.endpoint, timeout=30, resume=30)
    s.tensor(np.zeros(4, np.float32))
    token = s._resume_token
    s.close()
    r = raw_hello(rdaemon.port, resume_token=token)
    assert r.error.code == pb.CONNECTION_LOST
    settle(rdaemon.endpoint, base)


def chain(s, n=300):
    """n pipelined ops, nothing answered between them: a + 1, + 1, ... (an op sent again
    after it was applied is HANDLE_IN_USE; one lost leaves a smaller sum)."""
    a = s.tensor(np.zeros(8, np.float32))
    for _ in range(n):
        a = a + 1
    return a.numpy()


@pytest.mark.parametrize("frac", [0.3, 0.5, 0.8])
def test_pipelined_requests_cut_upstream_are_applied_once(rdaemon, frac):
    with FaultProxy(rdaemon.port, "pass") as p:
        with tensordd.connect(p.endpoint, timeout=30, resume=30) as s:
            np.testing.assert_array_equal(chain(s), np.full(8, 300, np.float32))
        time.sleep(0.1)
        up = p.up
    with CutProxy(rdaemon.port, [("up", int(up * frac))]) as p:
        with tensordd.connect(p.endpoint, timeout=30, resume=30) as s:
            got = chain(s)
            assert s._conn.resumes == 1
    np.testing.assert_array_equal(got, np.full(8, 300, np.float32))


def test_an_optimizer_step_whose_answer_is_lost_is_not_run_again(rdaemon):
    """Cuts every answer to an OptimizerStep in turn (the daemon applied it, the client
    never heard): the step is not sent again, so the parameters equal the uncut run's."""
    def run(s, cut_step=None, proxy=None):
        p = s.tensor(np.ones(4, np.float32), requires_grad=True)
        opt = tensordd.optim.SGD([p], lr=0.5, momentum=0.9)
        for k in range(4):
            loss = (p * p).sum()
            g = loss.backward()
            if k == cut_step:
                proxy.cuts = [("down", proxy.down + 10)]  # inside the step's answer
            opt.step(g)
        return p.numpy()

    with tensordd.connect(rdaemon.endpoint, timeout=30, resume=30) as s:
        want = run(s)
    for k in range(4):
        with CutProxy(rdaemon.port, []) as px:
            with tensordd.connect(px.endpoint, timeout=30, resume=30) as s:
                got = run(s, k, px)
                assert px.done and s._conn.resumes == 1
        np.testing.assert_array_equal(got, want, err_msg=f"answer to step {k} cut")


# ---------------------------------------------------------------- TLS: the same identity

@pytest.fixture(scope="module")
def mtls(tmp_path_factory):
    """A CA, the daemon's certificate and two clients', alice and bob (openssl CLI)."""
    import shutil
    import subprocess

    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is needed to make test certificates")
    d = str(tmp_path_factory.mktemp("resume-pki"))

    def run(*args):
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True, timeout=60)

    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    run("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
        "-subj", "/CN=resume-ca")
    for name, ext in (("server", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n"),
                      ("alice", "extendedKeyUsage=clientAuth\n"),
                      ("bob", "extendedKeyUsage=clientAuth\n")):
        with open(os.path.join(d, f"{name}.ext"), "w") as f:
            f.write(ext)
        run("req", "-new", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr",
            "-subj", f"/CN={name}")
        run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext")
    return lambda name: os.path.join(d, name)


def tls_port(d):
    for line in d.output:
        if "listening on tls://" in line:
            return int(line.split("listening on tls://", 1)[1].split()[0].rsplit(":", 1)[1])
    raise AssertionError(d.output)


def test_over_mutual_tls_a_token_resumes_only_for_its_client_certificate(start_daemon, mtls):
    import ssl

    d = start_daemon("--cpu-devices", "1", "--listen", "tls://127.0.0.1:0", "--tls-cert",
                     mtls("server.pem"), "--tls-key", mtls("server.key"), "--tls-client-ca",
                     mtls("ca.pem"))
    port = tls_port(d)
    alice = {"ca_file": mtls("ca.pem"), "cert": mtls("alice.pem"), "key": mtls("alice.key")}
    with tensordd.connect(f"tls://127.0.0.1:{port}", timeout=30, resume=30, **alice) as s:
        want = train(s)
    up = down = None
    with FaultProxy(port, "pass") as p:
        with tensordd.connect(f"tls://127.0.0.1:{p.port}", timeout=30, resume=30, **alice) as s:
            train(s)
        time.sleep(0.1)
        up, down = p.up, p.down
    with CutProxy(port, [("up", up // 2), ("down", down // 3)]) as p:
        with tensordd.connect(f"tls://127.0.0.1:{p.port}", timeout=30, resume=30, **alice) as s:
            got = train(s)
            assert len(p.done) == 2 and s._conn.resumes >= 1
            # bob, with a certificate of the same CA, presents alice's token: refused
            ctx = ssl.create_default_context(cafile=mtls("ca.pem"))
            ctx.load_cert_chain(mtls("bob.pem"), mtls("bob.key"))
            with ctx.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=10),
                                 server_hostname="127.0.0.1") as c:
                r = hello_on(c, resume_token=s._resume_token)
            assert r.error.code == pb.UNAUTHENTICATED, r
            s.sync()  # alice's session is untouched
    for w, g in zip(want, got):
        np.testing.assert_array_equal(w, g)


def test_a_held_session_counts_against_max_sessions_and_its_resume_is_admitted(start_daemon):
    d = start_daemon("--cpu-devices", "1", "--max-sessions", "2", "--max-resume-window", "30")
    with FaultProxy(d.port, "pass") as p:
        a = tensordd.connect(p.endpoint, timeout=30, resume=30)
        t = a.tensor(np.arange(4, dtype=np.float32))
        a.sync()
        a._conn.sock.close()  # a's connection is lost; its next call resumes
        deadline = time.monotonic() + 20
        while "held 30s for resume" not in d.log() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "held 30s for resume" in d.log()
        # one admitted session and one held: the daemon is full
        b = tensordd.connect(d.endpoint, timeout=30)
        with pytest.raises(tensordd.ResourceExhaustedError, match="sessions"):
            tensordd.connect(d.endpoint, timeout=30)
        # a resumes into its own held slot
        np.testing.assert_array_equal(t.numpy(), np.arange(4, dtype=np.float32))
        assert a._conn.resumes == 1
        a.close()
        b.close()


# ---------------------------------------------------------------- the protocol, raw

def frame_of(req, payload=b""):
    msg = req.SerializeToString()
    return struct.pack("<IIQ", 0x01444454, len(msg), len(payload)) + msg + payload


class Raw:
    """A raw connection: frames out, frames (with payloads) in."""

    def __init__(self, port):
        self.c = socket.create_connection(("127.0.0.1", port), timeout=10)

    def send(self, req, payload=b""):
        msg = req.SerializeToString()
        self.c.sendall(struct.pack("<IIQ", 0x01444454, len(msg), len(payload)) + msg + payload)

    def exact(self, n):
        b = b""
        while len(b) < n:
            chunk = self.c.recv(n - len(b))
            assert chunk, "closed"
            b += chunk
        return b

    def recv(self):
        _, n, plen = struct.unpack("<IIQ", self.exact(16))
        return pb.Response.FromString(self.exact(n)), self.exact(plen)

    def hello(self, **fields):
        req = pb.Request(id=fields.pop("id", 1))
        req.hello.min_version = req.hello.max_version = 1
        for k, v in fields.items():
            setattr(req.hello, k, v)
        self.send(req)
        return self.recv()[0]

    def close(self):
        self.c.close()


def test_raw_resume_sends_the_missed_answer_again_and_says_what_was_applied(rdaemon):
    a = Raw(rdaemon.port)
    r = a.hello(resume_window=30)
    token, sid = r.hello.resume_token, r.hello.session_id
    assert len(token) == 16 and r.hello.resume_window == 30 and not r.hello.resumed
    data = np.arange(6, dtype=np.float32).tobytes()
    a.send(pb.Request(id=2, upload=pb.Upload(handle=1, dtype=pb.DTYPE_F32, shape=[6])), data)
    a.send(pb.Request(id=3, download=pb.Download(handle=1)))
    first, payload = a.recv()
    assert first.id == 3 and payload == data
    a.close()  # as if the answer to 3 had been lost on the way
    # the client says it received up to 2: the daemon applied 3 and sends its answer again
    b = Raw(rdaemon.port)
    r = b.hello(id=4, resume_token=token, last_received=2)
    assert r.hello.resumed and r.hello.session_id == sid and r.hello.last_applied == 3
    again, payload = b.recv()
    assert again.id == 3 and again.WhichOneof("body") == "tensor" and payload == data
    b.close()
    # received whole this time: nothing is sent again; the next answer is the next request's
    c = Raw(rdaemon.port)
    r = c.hello(id=5, resume_token=token, last_received=3)
    assert r.hello.resumed and r.hello.last_applied == 3
    c.send(pb.Request(id=6, sync=pb.Sync()))
    assert c.recv()[0].id == 6
    c.send(pb.Request(id=7, goodbye=pb.Goodbye()))
    assert c.recv()[0].id == 7
    c.close()
    # after Goodbye the token names nothing
    assert raw_hello(rdaemon.port, resume_token=token).error.code == pb.CONNECTION_LOST


def test_an_answer_sent_again_on_resume_has_the_bytes_it_was_answered_with(rdaemon):
    """Download(running_mean) is answered [0, 0, 0]; a pipelined training-mode batch_norm
    then updates running_mean in place while the connection is lost. The client resumes
    from before the Download: the answer it gets again is the one made, [0, 0, 0], not
    the tensor's bytes of now."""
    a = Raw(rdaemon.port)
    token = a.hello(resume_window=30).hello.resume_token
    x = np.array([[4, 5, 6], [5, 6, 7], [6, 7, 8], [7, 8, 9]], np.float32)  # means 5.5 6.5 7.5
    for h, arr in ((1, x), (2, np.zeros(3, np.float32)), (3, np.ones(3, np.float32))):
        a.send(pb.Request(id=1 + h, upload=pb.Upload(handle=h, dtype=pb.DTYPE_F32,
                                                     shape=arr.shape)), arr.tobytes())
    a.send(pb.Request(id=5, download=pb.Download(handle=2)))
    first, payload = a.recv()
    assert first.id == 5 and np.frombuffer(payload, np.float32).tolist() == [0, 0, 0]
    op = pb.Op(op="batch_norm", inputs=[1, 2, 3], outputs=[4],
               attrs=[pb.Attr(name="training", b=True), pb.Attr(name="momentum", f=1.0),
                      pb.Attr(name="eps", f=1e-5)])
    a.send(pb.Request(id=6, op=op))
    o = Raw(rdaemon.port)
    o.hello()
    deadline = time.monotonic() + 20
    for k in range(10**6):  # until the update has run (bounded)
        o.send(pb.Request(id=2 + k, stats=pb.Stats()))
        if o.recv()[0].stats.tasks_pending == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    o.close()
    a.close()
    b = Raw(rdaemon.port)
    r = b.hello(id=7, resume_token=token, last_received=4)
    assert r.hello.resumed and r.hello.last_applied == 6
    again, payload = b.recv()
    assert again.id == 5 and again.WhichOneof("body") == "tensor"
    assert np.frombuffer(payload, np.float32).tolist() == [0, 0, 0]
    # the update did happen: the tensor now holds the batch's means
    b.send(pb.Request(id=8, download=pb.Download(handle=2)))
    now, payload = b.recv()
    assert now.id == 8
    np.testing.assert_allclose(np.frombuffer(payload, np.float32), [5.5, 6.5, 7.5], rtol=1e-6)
    b.send(pb.Request(id=9, goodbye=pb.Goodbye()))
    assert b.recv()[0].id == 9
    b.close()


def test_a_token_presented_while_the_old_connection_lives_takes_the_session_over(rdaemon):
    """A network that went silent: the daemon still thinks the old connection alive. The
    token (with the same auth) takes the session; the old connection is closed."""
    old = Raw(rdaemon.port)
    r = old.hello(resume_window=30)
    token = r.hello.resume_token
    old.send(pb.Request(id=2, upload=pb.Upload(handle=1, dtype=pb.DTYPE_F32, shape=[2])),
             b"\0" * 8)
    old.send(pb.Request(id=3, sync=pb.Sync()))
    assert old.recv()[0].id == 3
    new = Raw(rdaemon.port)
    r = new.hello(id=4, resume_token=token, last_received=3)
    assert r.hello.resumed and r.hello.last_applied == 3
    old.c.settimeout(10)
    assert old.c.recv(64) == b""  # the daemon closed the old connection
    new.send(pb.Request(id=5, describe=pb.Describe(handle=1)))
    assert list(new.recv()[0].tensor.shape) == [2]
    new.send(pb.Request(id=6, goodbye=pb.Goodbye()))
    assert new.recv()[0].id == 6
    new.close()
    old.close()


# ---------------------------------------------------------------- every session end frees

def counters(endpoint):
    """sessions, handles, bytes in use and tensors alive, seen from a fresh session."""
    with tensordd.connect(endpoint, timeout=20) as o:
        st = o.stats()
    mem = sum(m["bytes_in_use"] for m in st["memory"].values())
    return st["sessions"], st["handles"], mem, st["tensors_alive"]


def settle_counters(endpoint, want, timeout=20.0):
    deadline = time.monotonic() + timeout
    got = counters(endpoint)
    while got != want and time.monotonic() < deadline:
        time.sleep(0.05)
        got = counters(endpoint)
    assert got == want, f"(sessions, handles, bytes, tensors) {got} did not return to {want}"


class SilentTarget:
    """A loopback listener standing in for a push's target daemon: it takes the push's
    connection, says nothing, and hangs up when told (the push then fails with IO)."""

    def __init__(self):
        self.lsock = socket.socket()
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen(4)
        self.endpoint = f"tcp://127.0.0.1:{self.lsock.getsockname()[1]}"

    def accept(self, timeout=20):
        self.lsock.settimeout(timeout)
        c, _ = self.lsock.accept()
        return c

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.lsock.close()


def wait_log(d, text, count=1, timeout=20):
    """Until the daemon has logged text count times (bounded)."""
    def seen():  # the whole log, read through a file of its own (no shared offset)
        with open(f"/proc/{d.proc.pid}/fd/2") as f:
            return f.read().count(text)

    deadline = time.monotonic() + timeout
    while seen() < count and time.monotonic() < deadline:
        time.sleep(0.02)
    assert seen() >= count, d.log()


class StalledRaw(Raw):
    """A raw connection that reads nothing, through a small receive buffer: the daemon's
    answers to it stall (the write timeout then closes it as a lost connection)."""

    def __init__(self, port):
        self.c = socket.socket()
        self.c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        self.c.settimeout(10)
        self.c.connect(("127.0.0.1", port))


@pytest.mark.parametrize("end", ["window_runs_out", "resumed_then_goodbye", "dropped_unresumable"])
def test_a_push_decided_while_its_session_is_held_is_freed_at_every_session_end(start_daemon, end):
    """TransferSend to a target that hangs up only after the client's connection was lost
    (its answers stalled past --write-timeout): the push is decided while nothing can
    collect its verdict. However the session then ends, the daemon's counters return to
    what they were, the pushed tensor included."""
    d = start_daemon("--cpu-devices", "1", "--max-resume-window", "3", "--write-timeout", "1",
                     "--max-write-queue", "1G", "--transfer-peers", "127.0.0.1")
    base = counters(d.endpoint)
    data = np.arange(256 * 256, dtype=np.float32).tobytes()
    # ListOps, whose answers (about 16 KiB each, 8 MiB in all) overfill the socket buffers:
    # few requests, so the TransferSend behind them is read well within --write-timeout of
    # the moment the answers stall, however slow the machine (150,000 Describes were not).
    # (Not Downloads: an answer with a payload pauses the session until it is written.)
    n_stall = 500
    with SilentTarget() as tgt:
        for rnd in range(2):
            a = StalledRaw(d.port)
            r = a.hello(resume_window=0 if end == "dropped_unresumable" else 3)
            token = r.hello.resume_token
            a.send(pb.Request(id=2, upload=pb.Upload(handle=1, dtype=pb.DTYPE_F32,
                                                     shape=[256, 256])), data)
            # answers that fill the socket and stall there
            stall = b"".join(frame_of(pb.Request(id=3 + k, list_ops=pb.ListOps()))
                             for k in range(n_stall))
            a.c.sendall(stall)
            push_id = 3 + n_stall
            a.send(pb.Request(id=push_id, transfer_send=pb.TransferSend(
                tensor=1, endpoint=tgt.endpoint, token="", capability=b"\x01" * 16)))
            pushed = tgt.accept()  # the push is connected and waits for Hello's answer
            if end == "dropped_unresumable":
                wait_log(d, "replies made no progress", rnd + 1)
            else:
                wait_log(d, "held 3s for resume", rnd + 1)
            pushed.close()  # the push fails now, while its session is held
            if end == "resumed_then_goodbye":
                b = Raw(d.port)
                r = b.hello(id=push_id + 1, resume_token=token, last_received=push_id)
                assert r.hello.resumed and r.hello.last_applied >= push_id - 1
                ans, _ = b.recv()  # TransferSend's verdict, on the new connection
                assert ans.id == push_id and ans.error.code == pb.IO, ans
                b.send(pb.Request(id=push_id + 2, goodbye=pb.Goodbye()))
                assert b.recv()[0].id == push_id + 2
                b.close()
            a.close()
            settle_counters(d.endpoint, base)
