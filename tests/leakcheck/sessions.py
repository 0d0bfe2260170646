#!/usr/bin/env python3
"""sessions.py -- a scripted set of sessions against a daemon built with
LeakSanitizer (make leakcheck), then SIGTERM: the daemon must exit 0 with no leak
report, and so must every tdctl run (libtensordd under the same sanitizer).

    sessions.py TENSORDD TDCTL

The set: training steps (ops, backward, SGD and Adam) over TCP, a Unix socket and
TLS; typed errors (unknown op, shape mismatch, released handle); a graph left
unreleased at close; abrupt ends (mid-upload, mid-download, with queued work, before
Hello, garbage, a TLS handshake cut short, a refused client certificate); tdctl over
each endpoint kind. Every step is bounded; the script fails on the first surprise.
"""

from __future__ import annotations

import os
import signal
import socket
import ssl
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..", "..", "client", "python")]

import tensordd  # noqa: E402
from tensordd import tensordd_pb2 as pb  # noqa: E402
from tensordd.optim import SGD, Adam  # noqa: E402

T = 30
MAGIC = 0x01444454


def say(*a):
    print("leakcheck:", *a, flush=True)


def openssl(d, *args):
    subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True, timeout=60)


def make_pki(d):
    for ca in ("ca", "otherca"):
        openssl(d, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                "-nodes", "-keyout", f"{ca}.key", "-out", f"{ca}.pem", "-days", "1", "-subj",
                f"/CN={ca}")
    for name, ca, ext in (("server", "ca", "subjectAltName=IP:127.0.0.1\n"),
                          ("client", "ca", "extendedKeyUsage=clientAuth\n"),
                          ("intruder", "otherca", "extendedKeyUsage=clientAuth\n")):
        with open(os.path.join(d, f"{name}.ext"), "w") as f:
            f.write(ext)
        openssl(d, "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}")
        openssl(d, "x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey",
                f"{ca}.key", "-CAcreateserial", "-out", f"{name}.pem", "-days", "1", "-extfile",
                f"{name}.ext")


def frame(req, payload=b"", claim=None):
    m = req.SerializeToString()
    n = len(payload) if claim is None else claim
    return struct.pack("<IIQ", MAGIC, len(m), n) + m + payload


def hello_frame():
    return frame(pb.Request(id=1, hello=pb.Hello(min_version=1, max_version=1,
                                                 client_name="leakcheck")))


def train(s, steps=3):
    rng = np.random.default_rng(0)
    x = s.tensor(rng.standard_normal((16, 8)).astype(np.float32))
    y = s.tensor(rng.standard_normal((16, 4)).astype(np.float32))
    w1 = s.tensor(rng.standard_normal((8, 16)).astype(np.float32), requires_grad=True)
    w2 = s.tensor(rng.standard_normal((16, 4)).astype(np.float32), requires_grad=True)
    for opt in (SGD([w1, w2], lr=0.01), Adam([w1, w2], lr=0.01)):
        for _ in range(steps):
            opt.zero_grad()
            loss = (((x @ w1).relu() @ w2 - y) ** 2).mean()
            loss.backward()
            opt.step()
        assert np.isfinite(loss.numpy()).all()
    # typed errors, the session survives each
    for bad in (lambda: s.op("no_such_op", x).numpy(), lambda: (x @ y).numpy()):
        try:
            bad()
            raise AssertionError("expected a typed error")
        except tensordd.Error:
            pass
    # a graph kept alive at close (freed with the session)
    keep = (x @ w1).sum()
    keep.backward(retain_graph=True)
    s.sync()


def cut(s):
    """Drops the session's connection under it (what a network failure does)."""
    sock = s._conn.sock
    sock = getattr(sock, "_s", sock)  # a TLS connection's socket
    sock.shutdown(socket.SHUT_RDWR)


def resume_and_expiry(ep, kw):
    # resumed: the work after the cut finds the session, its tensors and graph
    s = tensordd.connect(ep, timeout=T, resume=30, **kw)
    x = s.tensor(np.arange(1000, dtype=np.float32), requires_grad=True)
    y = x * 2
    s.sync()
    cut(s)
    got = (y + 1).numpy()
    assert np.array_equal(got, np.arange(1000, dtype=np.float32) * 2 + 1)
    y.sum().backward()
    assert s._conn.resumes >= 1, "the session was not resumed"
    s.close()
    # expired: held for a second, never claimed, then freed by the daemon
    s = tensordd.connect(ep, timeout=T, resume=1, **kw)
    s.tensor(np.ones(1 << 16, np.float32)) * 3
    s.sync()
    s._conn._resumer = None  # this client gives up at once
    cut(s)
    try:
        s.sync()
    except tensordd.Error:
        pass


def raw_tcp(ep):
    host, port = ep[len("tcp://"):].rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=T)


def recv_some(sk):
    try:
        return sk.recv(1 << 16)
    except OSError:
        return b""


def abrupt(connect_raw):
    n = 1 << 20
    up = pb.Request(id=2, upload=pb.Upload(handle=1, dtype=pb.DTYPE_F32, shape=[n]))
    # mid-upload
    sk = connect_raw()
    sk.sendall(hello_frame())
    recv_some(sk)
    sk.sendall(frame(up, b"\0" * n, claim=4 * n))
    sk.close()
    # mid-download: upload, ask for it back, leave
    sk = connect_raw()
    sk.sendall(hello_frame())
    recv_some(sk)
    sk.sendall(frame(up, b"\1" * (4 * n)))
    sk.sendall(frame(pb.Request(id=3, download=pb.Download(handle=1), want_reply=True)))
    recv_some(sk)
    sk.close()
    # queued work, then gone
    sk = connect_raw()
    sk.sendall(hello_frame())
    recv_some(sk)
    sk.sendall(frame(pb.Request(id=2, upload=pb.Upload(handle=1, dtype=pb.DTYPE_F32,
                                                       shape=[4096])), b"\0" * 16384))
    for i in range(200):
        sk.sendall(frame(pb.Request(id=3 + i, op=pb.Op(op="relu", inputs=[1 + i],
                                                       outputs=[2 + i]))))
    sk.close()
    # before Hello; garbage
    connect_raw().close()
    sk = connect_raw()
    sk.sendall(b"GET / HTTP/1.1\r\n\r\n")
    recv_some(sk)
    sk.close()


def tdctl(tdctl_bin, *args, expect=0):
    p = subprocess.run([tdctl_bin, "--timeout", str(T * 1000), *args], capture_output=True,
                       text=True, timeout=T * 2)
    if p.returncode != expect or "Sanitizer" in p.stderr:
        raise AssertionError(f"tdctl {args}: rc {p.returncode} (expected {expect})\n{p.stderr}")


def main():
    daemon_bin, tdctl_bin = sys.argv[1], sys.argv[2]
    with tempfile.TemporaryDirectory(prefix="tddleak") as d:
        make_pki(d)
        pki = lambda n: os.path.join(d, n)  # noqa: E731
        sock_path = os.path.join(d, "d.sock")
        log = open(os.path.join(d, "daemon.log"), "w+")
        proc = subprocess.Popen(
            [daemon_bin, "--cpu-devices", "2", "--listen", "tcp://127.0.0.1:0", "--listen",
             f"unix://{sock_path}", "--listen", "tls://127.0.0.1:0", "--tls-cert",
             pki("server.pem"), "--tls-key", pki("server.key"), "--tls-client-ca", pki("ca.pem")],
            stdout=subprocess.PIPE, stderr=log, text=True)
        eps = {}
        try:
            while len(eps) < 3:
                line = proc.stdout.readline()
                if not line:
                    raise AssertionError("the daemon exited before listening")
                if "listening on" in line:
                    ep = line.split("listening on", 1)[1].split()[0]
                    eps[ep.split(":", 1)[0]] = ep
            tcp, unix, tls = eps["tcp"], eps["unix"], eps["tls"]
            good = dict(ca_file=pki("ca.pem"), cert=pki("client.pem"), key=pki("client.key"))
            for ep, kw in ((tcp, {}), (unix, {}), (tls, good)):
                with tensordd.connect(ep, timeout=T, **kw) as s:
                    train(s)
                s = tensordd.connect(ep, timeout=T, **kw)
                train(s, steps=1)
                s._conn.close()  # no Goodbye: the daemon frees it all on EOF
                resume_and_expiry(ep, kw)
                say("sessions (and a resume, an expiry) on", ep)
            abrupt(lambda: raw_tcp(tcp))
            ctx = ssl.create_default_context(cafile=pki("ca.pem"))
            ctx.load_cert_chain(pki("client.pem"), pki("client.key"))
            host, port = tls[len("tls://"):].rsplit(":", 1)
            abrupt(lambda: ctx.wrap_socket(socket.create_connection((host, int(port)), timeout=T),
                                           server_hostname=host))
            # a TLS handshake cut short; a refused client certificate
            sk = socket.create_connection((host, int(port)), timeout=T)
            sk.sendall(b"\x16\x03\x01\x00\xff\x01")
            sk.close()
            try:
                tensordd.connect(tls, ca_file=pki("ca.pem"), cert=pki("intruder.pem"),
                                 key=pki("intruder.key"), timeout=T).sync()
                raise AssertionError("the intruder was let in")
            except tensordd.UnauthenticatedError:
                pass
            say("abrupt ends")
            a = os.path.join(d, "a.npy")
            np.save(a, np.arange(6, dtype=np.float32))
            for ep, extra in ((tcp, []), (unix, []),
                              (tls, ["--ca-file", pki("ca.pem"), "--cert", pki("client.pem"),
                                     "--key", pki("client.key")])):
                tdctl(tdctl_bin, "--endpoint", ep, *extra, "apply", "add", a, a, "-o",
                      os.path.join(d, "o.npy"))
            tdctl(tdctl_bin, "--endpoint", tls, "--ca-file", pki("otherca.pem"), "devices",
                  expect=3)
            tdctl(tdctl_bin, "--endpoint", tls, "--ca-file", pki("ca.pem"), "devices", expect=3)
            say("tdctl")
            # every session gone before the daemon is stopped
            with tensordd.connect(tcp, timeout=T) as s:
                for _ in range(200):
                    if s.stats()["sessions"] == 1:
                        break
                    time.sleep(0.05)
                assert s.stats()["sessions"] == 1, s.stats()["session_list"]
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            try:
                rc = proc.wait(120)
            except subprocess.TimeoutExpired:
                proc.kill()
                rc = proc.wait()
            log.seek(0)
            text = log.read()
        if rc != 0 or "Sanitizer" in text:
            print(text[-20000:], file=sys.stderr)
            raise SystemExit(f"leakcheck: FAILED (daemon exit {rc})")
    say("no leaks: the daemon exited 0 with no sanitizer report")


if __name__ == "__main__":
    main()
