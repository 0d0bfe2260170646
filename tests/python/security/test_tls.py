"""TLS between clients and the daemon.

Certificates are made here at run time with the openssl CLI: a CA, a server
certificate for 127.0.0.1/localhost, a client certificate from the same CA, and
a second CA with its own client certificate (never trusted by the daemon).
Round trips from Python and from C (tdctl over libtensordd) are checked against
numpy; mutual TLS accepts the CA's client and rejects no certificate and the
other CA's; a client trusting the wrong CA refuses the daemon; plaintext to a
TLS port and TLS to a plaintext port are typed errors, not hangs.
"""

from __future__ import annotations

import os
import shutil
import socket
import ssl
import struct
import subprocess
import tempfile
import time

import numpy as np
import pytest

from conftest import TDCTL_BIN, TDD_BIN, Daemon
from helpers import frame, hello

import tensordd
from tensordd import tensordd_pb2 as pb

if shutil.which("openssl") is None:
    pytest.skip("the openssl command is needed to make test certificates", allow_module_level=True)

T = 20  # seconds: the bound on every connect and call


def _openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _ca(d, name):
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
             "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.pem", "-days", "2",
             "-subj", f"/CN={name}", cwd=d)


def _leaf(d, name, ca, ext, subj=None):
    with open(os.path.join(d, f"{name}.ext"), "w") as f:
        f.write(ext)
    _openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
             "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj",
             subj or f"/CN={name}", cwd=d)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
             "-CAcreateserial", "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext",
             cwd=d)


@pytest.fixture(scope="module")
def pki():
    with tempfile.TemporaryDirectory(prefix="tddtls") as d:
        _ca(d, "ca")
        _ca(d, "otherca")
        _leaf(d, "server", "ca", "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
                                 "extendedKeyUsage=serverAuth\n")
        _leaf(d, "elsewhere", "ca", "subjectAltName=DNS:elsewhere.example\n"
                                    "extendedKeyUsage=serverAuth\n")
        _leaf(d, "client", "ca", "extendedKeyUsage=clientAuth\n")
        _leaf(d, "intruder", "otherca", "extendedKeyUsage=clientAuth\n")
        # two clients of the same CA whose subjects agree on their first 200 characters
        long_ous = "".join(f"/OU={c * 60}" for c in "abc")
        for who in ("alice", "mallory"):
            _leaf(d, who, "ca", "extendedKeyUsage=clientAuth\n", f"{long_ous}/CN={who}")
        yield lambda name: os.path.join(d, name)


def _tls_endpoint(d):
    for line in d.output:
        if "listening on tls://" in line:
            return line.split("listening on", 1)[1].split()[0]
    raise AssertionError(f"no tls:// listener in {d.output}")


@pytest.fixture(scope="module")
def tls_daemon(pki):
    """Plain tcp:// (the fixture's) and tls:// on loopback, no client certificates."""
    d = Daemon("--cpu-devices", "1", "--listen", "tls://127.0.0.1:0", "--tls-cert",
               pki("server.pem"), "--tls-key", pki("server.key"))
    d.tls = _tls_endpoint(d)
    yield d
    assert d.stop() == 0, d.log()


@pytest.fixture(scope="module")
def mtls_daemon(pki):
    d = Daemon("--cpu-devices", "1", "--listen", "tls://127.0.0.1:0", "--tls-cert",
               pki("server.pem"), "--tls-key", pki("server.key"), "--tls-client-ca",
               pki("ca.pem"))
    d.tls = _tls_endpoint(d)
    yield d
    assert d.stop() == 0, d.log()


def _round_trip(s, n):
    rng = np.random.default_rng(n)
    a = rng.standard_normal(n).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    got = (s.tensor(a) * s.tensor(b) + 1).numpy()
    np.testing.assert_allclose(got, a * b + 1, rtol=1e-6)


def tdctl(*args):
    p = subprocess.run([TDCTL_BIN, "--timeout", str(T * 1000), *args], capture_output=True,
                       text=True, timeout=T * 3)
    return p.returncode, p.stdout, p.stderr


# ---------------------------------------------------------------- round trips

def test_python_round_trip_small_and_large(tls_daemon, pki):
    with tensordd.connect(tls_daemon.tls, ca_file=pki("ca.pem"), timeout=T) as s:
        _round_trip(s, 7)
        _round_trip(s, 3 << 20)  # 12 MiB each way: payloads stream through TLS records
        # many small ops pipelined, then one sync
        x = s.tensor(np.arange(4, dtype=np.float32))
        for _ in range(200):
            x = x + 1
        np.testing.assert_array_equal(x.numpy(), np.arange(4, dtype=np.float32) + 200)


def test_python_localhost_name_verifies(tls_daemon, pki):
    port = tls_daemon.tls.rsplit(":", 1)[1]
    with tensordd.connect(f"tls://localhost:{port}", ca_file=pki("ca.pem"), timeout=T) as s:
        _round_trip(s, 5)


def test_tdctl_round_trip(tls_daemon, pki, tmp_path):
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    np.save(tmp_path / "a.npy", a)
    rc, out, err = tdctl("--endpoint", tls_daemon.tls, "--ca-file", pki("ca.pem"), "apply",
                         "mul", str(tmp_path / "a.npy"), str(tmp_path / "a.npy"), "-o",
                         str(tmp_path / "out.npy"))
    assert rc == 0, err
    np.testing.assert_array_equal(np.load(tmp_path / "out.npy"), a * a)
    rc, out, err = tdctl("--endpoint", tls_daemon.tls, "--ca-file", pki("ca.pem"), "devices")
    assert rc == 0 and "cpu:0" in out, err


def test_plain_listener_still_serves(tls_daemon):
    with tensordd.connect(tls_daemon.endpoint, timeout=T) as s:
        _round_trip(s, 1 << 16)


# ---------------------------------------------------------------- verification

def test_client_refuses_daemon_signed_by_another_ca(tls_daemon, pki):
    with pytest.raises(tensordd.UnauthenticatedError, match="verif"):
        tensordd.connect(tls_daemon.tls, ca_file=pki("otherca.pem"), timeout=T)
    rc, out, err = tdctl("--endpoint", tls_daemon.tls, "--ca-file", pki("otherca.pem"), "devices")
    assert rc == 3 and "failed verification" in err, (rc, err)


def test_client_refuses_a_name_not_in_the_certificate(pki):
    """A daemon whose certificate (from the trusted CA) names another host."""
    d = Daemon("--cpu-devices", "1", "--listen", "tls://127.0.0.1:0", "--tls-cert",
               pki("elsewhere.pem"), "--tls-key", pki("elsewhere.key"))
    try:
        ep = _tls_endpoint(d)
        with pytest.raises(tensordd.UnauthenticatedError, match="verif"):
            tensordd.connect(ep, ca_file=pki("ca.pem"), timeout=T)
        rc, out, err = tdctl("--endpoint", ep, "--ca-file", pki("ca.pem"), "devices")
        assert rc == 3 and "failed verification" in err, (rc, err)
    finally:
        assert d.stop() == 0, d.log()


def test_tls_options_on_a_plain_endpoint_are_refused(tls_daemon, pki):
    with pytest.raises(ValueError, match="tls://"):
        tensordd.connect(tls_daemon.endpoint, ca_file=pki("ca.pem"), timeout=T)
    rc, out, err = tdctl("--endpoint", tls_daemon.endpoint, "--ca-file", pki("ca.pem"), "devices")
    assert rc == 2 and "tls://" in err, (rc, err)
    rc, out, err = tdctl("--endpoint", tls_daemon.tls, "--ca-file", pki("nothere.pem"), "devices")
    assert rc == 2 and "nothere.pem" in err, (rc, err)
    with pytest.raises(ValueError, match="nothere.pem"):
        tensordd.connect(tls_daemon.tls, ca_file=pki("nothere.pem"), timeout=T)


# ---------------------------------------------------------------- mutual TLS

def test_mtls_accepts_a_client_of_its_ca(mtls_daemon, pki):
    with tensordd.connect(mtls_daemon.tls, ca_file=pki("ca.pem"), cert=pki("client.pem"),
                          key=pki("client.key"), timeout=T) as s:
        _round_trip(s, 1 << 18)
    rc, out, err = tdctl("--endpoint", mtls_daemon.tls, "--ca-file", pki("ca.pem"), "--cert",
                         pki("client.pem"), "--key", pki("client.key"), "devices")
    assert rc == 0 and "cpu:0" in out, err


def test_mtls_rejects_no_certificate(mtls_daemon, pki):
    with pytest.raises(tensordd.UnauthenticatedError):
        with tensordd.connect(mtls_daemon.tls, ca_file=pki("ca.pem"), timeout=T) as s:
            s.sync()
    rc, out, err = tdctl("--endpoint", mtls_daemon.tls, "--ca-file", pki("ca.pem"), "devices")
    assert rc == 3 and "refused this client's certificate" in err, (rc, err)


def test_mtls_rejects_a_certificate_of_another_ca(mtls_daemon, pki):
    with pytest.raises(tensordd.UnauthenticatedError):
        with tensordd.connect(mtls_daemon.tls, ca_file=pki("ca.pem"), cert=pki("intruder.pem"),
                              key=pki("intruder.key"), timeout=T) as s:
            s.sync()
    rc, out, err = tdctl("--endpoint", mtls_daemon.tls, "--ca-file", pki("ca.pem"), "--cert",
                         pki("intruder.pem"), "--key", pki("intruder.key"), "devices")
    assert rc == 3 and "refused this client's certificate" in err, (rc, err)
    # the daemon serves the next good client
    with tensordd.connect(mtls_daemon.tls, ca_file=pki("ca.pem"), cert=pki("client.pem"),
                          key=pki("client.key"), timeout=T) as s:
        _round_trip(s, 3)


# ---------------------------------------------------------------- mismatches

def test_plaintext_client_on_tls_port_is_told(tls_daemon):
    plain_to_tls = "tcp://" + tls_daemon.tls[len("tls://"):]
    with pytest.raises(tensordd.ProtocolError, match="speaks TLS"):
        tensordd.connect(plain_to_tls, timeout=T)
    rc, out, err = tdctl("--endpoint", plain_to_tls, "devices")
    assert rc == 3 and "speaks TLS" in err, (rc, err)


def test_tls_client_on_plain_port_is_told(tls_daemon, pki):
    tls_to_plain = "tls://" + tls_daemon.endpoint[len("tcp://"):]
    with pytest.raises(tensordd.ProtocolError, match="TLS listener"):
        tensordd.connect(tls_to_plain, ca_file=pki("ca.pem"), timeout=T)
    rc, out, err = tdctl("--endpoint", tls_to_plain, "--ca-file", pki("ca.pem"), "devices")
    assert rc == 3 and "TLS listener" in err, (rc, err)
    assert "TLS ClientHello to a plaintext listener" in tls_daemon.log()


# ---------------------------------------------------------------- start-up

def _start_fails(*args):
    p = subprocess.run([TDD_BIN, *args], capture_output=True, text=True, timeout=T)
    return p.returncode, p.stderr


def test_tls_listener_needs_cert_and_key(pki):
    rc, err = _start_fails("--listen", "tls://127.0.0.1:0")
    assert rc == 1 and "--tls-cert" in err, err
    rc, err = _start_fails("--listen", "tls://127.0.0.1:0", "--tls-cert", pki("server.pem"),
                           "--tls-key", pki("client.key"))
    assert rc == 1 and "client.key" in err and "mismatch" in err, err
    rc, err = _start_fails("--listen", "tls://127.0.0.1:0", "--tls-cert", pki("missing.pem"),
                           "--tls-key", pki("server.key"))
    assert rc == 1 and "missing.pem" in err, err
    rc, err = _start_fails("--listen", "tcp://127.0.0.1:0", "--tls-cert", pki("server.pem"),
                           "--tls-key", pki("server.key"))
    assert rc == 1 and "tls://" in err, err


def test_beyond_loopback_needs_tls_or_token():
    # refused before anything is bound
    rc, err = _start_fails("--listen", "tcp://0.0.0.0:0")
    assert rc == 1 and "tcp://0.0.0.0:0" in err and "TLS" in err and "--insecure" in err, err


# ---------------------------------------------------------------- streaming, abrupt ends

def test_tls_transfer_streams_without_staging(pki):
    """bench/transfer --check: the round trip is bit-exact and the daemon's peak RSS
    stays under 1.3x the tensor above idle, over TLS as over plain TCP (a daemon that
    staged a whole payload before encrypting or after decrypting would need 2x). Its
    own daemon, keeping no freed memory (--pool-cap 0), so that idle means idle."""
    exe = os.path.join(os.path.dirname(os.path.abspath(TDD_BIN)), "bench", "transfer")
    if not os.access(exe, os.X_OK):
        pytest.skip(f"{exe} not built")
    with open(TDD_BIN, "rb") as f:
        if b"__asan_init" in f.read():
            pytest.skip("RSS is not the daemon's own under AddressSanitizer (shadow, quarantine)")
    d = Daemon("--cpu-devices", "1", "--pool-cap", "0", "--listen", "tls://127.0.0.1:0",
               "--tls-cert", pki("server.pem"), "--tls-key", pki("server.key"))
    try:
        p = subprocess.run([exe, _tls_endpoint(d), str(d.proc.pid), "48", "--check", "--reps",
                            "1"], capture_output=True, text=True, timeout=120,
                           env={**os.environ, "TENSORDD_CA_FILE": pki("ca.pem")})
        assert p.returncode == 0, p.stdout + p.stderr
    finally:
        assert d.stop() == 0, d.log()


def _raw_tls(endpoint, ca, cert=None, key=None):
    ctx = ssl.create_default_context(cafile=ca)
    if cert:
        ctx.load_cert_chain(cert, key)
    host, port = endpoint[len("tls://"):].rsplit(":", 1)
    return ctx.wrap_socket(socket.create_connection((host, int(port)), timeout=T),
                           server_hostname=host)


def _recv_frame(sock):
    def exact(n):
        buf = bytearray()
        while len(buf) < n:
            chunk = sock.recv(n - len(buf))
            if not chunk:
                return None
            buf += chunk
        return bytes(buf)
    hdr = exact(16)
    assert hdr is not None
    _, mlen, plen = struct.unpack("<IIQ", hdr)
    r = pb.Response()
    r.ParseFromString(exact(mlen) if mlen else b"")
    return r, plen


def _sessions(s):
    return len(s.stats()["session_list"])


def test_abrupt_closes_mid_payload_free_the_session(tls_daemon, pki):
    with tensordd.connect(tls_daemon.tls, ca_file=pki("ca.pem"), timeout=T) as watcher:
        base = _sessions(watcher)
        n = 4 << 20  # floats
        # an upload cut a quarter of the way in
        a = _raw_tls(tls_daemon.tls, pki("ca.pem"))
        a.sendall(hello())
        assert _recv_frame(a)[0].WhichOneof("body") == "hello"
        m = pb.Request(id=2, upload=pb.Upload(handle=1, dtype=pb.DTYPE_F32,
                                              shape=[n])).SerializeToString()
        a.sendall(struct.pack("<IIQ", 0x01444454, len(m), 4 * n) + m + b"\0" * n)
        # a download whose reader leaves at once
        b = _raw_tls(tls_daemon.tls, pki("ca.pem"))
        b.sendall(hello())
        assert _recv_frame(b)[0].WhichOneof("body") == "hello"
        b.sendall(frame(pb.Request(id=2, upload=pb.Upload(handle=1, dtype=pb.DTYPE_F32,
                                                          shape=[n])), b"\1" * (4 * n)))
        b.sendall(frame(pb.Request(id=3, download=pb.Download(handle=1), want_reply=True)))
        assert _sessions(watcher) == base + 2
        a.close()
        b.close()
        for _ in range(200):  # bounded: 10 s
            if _sessions(watcher) == base:
                break
            time.sleep(0.05)
        assert _sessions(watcher) == base
        _round_trip(watcher, 1 << 20)


def test_versions_tls12_served_older_refused(tls_daemon, pki):
    host, port = tls_daemon.tls[len("tls://"):].rsplit(":", 1)
    ctx = ssl.create_default_context(cafile=pki("ca.pem"))
    ctx.maximum_version = ssl.TLSVersion.TLSv1_2
    with ctx.wrap_socket(socket.create_connection((host, int(port)), timeout=T),
                         server_hostname=host) as s:
        assert s.version() == "TLSv1.2"
        assert "GCM" in s.cipher()[0] or "CHACHA20" in s.cipher()[0]
    p = subprocess.run(["openssl", "s_client", "-connect", f"{host}:{port}", "-tls1_1",
                        "-cipher", "DEFAULT@SECLEVEL=0"], input="", capture_output=True,
                       text=True, timeout=T)
    assert "alert protocol version" in p.stdout + p.stderr, p.stdout + p.stderr


def test_no_verify_connects_without_a_ca(tls_daemon):
    """verify=False / --no-verify (testing only): no CA file, the daemon's certificate
    unchecked; the default (the system's CAs) refuses this test CA's certificate."""
    with pytest.raises(tensordd.UnauthenticatedError):
        tensordd.connect(tls_daemon.tls, timeout=T)
    with tensordd.connect(tls_daemon.tls, verify=False, timeout=T) as s:
        _round_trip(s, 3)
    rc, out, err = tdctl("--endpoint", tls_daemon.tls, "--no-verify", "devices")
    assert rc == 0 and "cpu:0" in out, err
    rc, out, err = tdctl("--endpoint", tls_daemon.tls, "devices")
    assert rc == 3 and "failed verification" in err, (rc, err)


def test_resume_is_bound_to_the_whole_client_certificate(mtls_daemon, pki):
    """A session opened with one client certificate cannot be resumed with another of
    the same CA, however long a prefix their subjects share: alice's held session and
    its tensor stay out of mallory's reach (UNAUTHENTICATED), and alice resumes it."""
    def hello_resume(sock, **fields):
        sock.sendall(frame(pb.Request(id=1, hello=pb.Hello(min_version=1, max_version=1,
                                                           client_name="resumer", **fields))))
        return _recv_frame(sock)[0]

    a = _raw_tls(mtls_daemon.tls, pki("ca.pem"), pki("alice.pem"), pki("alice.key"))
    r = hello_resume(a, resume_window=30)
    assert r.WhichOneof("body") == "hello" and r.hello.resume_window == 30, r
    token = r.hello.resume_token
    data = np.arange(6, dtype=np.float32)
    a.sendall(frame(pb.Request(id=2, upload=pb.Upload(handle=1, dtype=pb.DTYPE_F32, shape=[6])),
                    data.tobytes()))
    a.sendall(frame(pb.Request(id=3, sync=pb.Sync())))
    assert _recv_frame(a)[0].WhichOneof("body") == "ok"
    a.close()  # no Goodbye: the session is held for its window

    m = _raw_tls(mtls_daemon.tls, pki("ca.pem"), pki("mallory.pem"), pki("mallory.key"))
    r = hello_resume(m, resume_token=token)
    m.close()
    assert r.WhichOneof("body") == "error" and r.error.code == pb.UNAUTHENTICATED, r

    a = _raw_tls(mtls_daemon.tls, pki("ca.pem"), pki("alice.pem"), pki("alice.key"))
    r = hello_resume(a, resume_token=token)
    assert r.WhichOneof("body") == "hello" and r.hello.resumed, r
    a.sendall(frame(pb.Request(id=4, download=pb.Download(handle=1))))
    for _ in range(4):  # (answers the daemon sends again after a resume come first)
        resp, plen = _recv_frame(a)
        if resp.id == 4:
            break
    assert resp.id == 4 and plen == data.nbytes, resp
    got = b""
    while len(got) < plen:
        chunk = a.recv(plen - len(got))
        assert chunk, "EOF inside the download"
        got += chunk
    np.testing.assert_array_equal(np.frombuffer(got, np.float32), data)
    a.sendall(frame(pb.Request(id=5, goodbye=pb.Goodbye())))
    a.close()
