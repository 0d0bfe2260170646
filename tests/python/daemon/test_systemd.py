"""systemd: the units verify and are hardened; readiness, status and stopping reach
$NOTIFY_SOCKET (Type=notify); sockets passed by socket activation are served; the
token comes from $CREDENTIALS_DIRECTORY (LoadCredential=)."""

import os
import re
import shutil
import socket
import subprocess
import tempfile
import time

import numpy as np
import pytest
import tensordd

from conftest import TDD_BIN
from daemonproc import Proc

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
DEPLOY = os.path.join(ROOT, "deploy")
ANALYZE = shutil.which("systemd-analyze")


def units_with_binary(tmp_path):
    """The units as installed with this build's daemon at ExecStart (verify checks that
    the command exists); otherwise unchanged."""
    for name in ("tensordd.service", "tensordd.socket"):
        text = open(os.path.join(DEPLOY, name)).read()
        text = text.replace("/usr/local/bin/tensordd", os.path.abspath(TDD_BIN))
        (tmp_path / name).write_text(text)
    return [str(tmp_path / "tensordd.service"), str(tmp_path / "tensordd.socket")]


def test_units_verify(tmp_path):
    if not ANALYZE:
        pytest.skip("systemd-analyze is not installed (Debian package systemd)")
    r = subprocess.run([ANALYZE, "verify", "--man=no", *units_with_binary(tmp_path)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stderr.strip() == "", r.stderr  # no warnings either


def test_service_is_type_notify_with_gpu_devices_and_credential():
    text = open(os.path.join(DEPLOY, "tensordd.service")).read()
    keys = [ln.split("=", 1) for ln in text.splitlines() if re.match(r"^[A-Z]\w+=", ln)]
    d = {}
    for k, v in keys:
        d.setdefault(k, []).append(v)
    assert d["Type"] == ["notify"]
    assert d["LoadCredential"] == ["token:/etc/tensordd/token"]
    allowed = " ".join(d["DeviceAllow"])
    for dev in ("/dev/nvidiactl", "/dev/nvidia-uvm", "char-nvidia-frontend"):
        assert dev in allowed, allowed
    assert d["DevicePolicy"] == ["closed"]
    assert "PrivateDevices" not in d  # it would hide /dev/nvidia*


def test_security_exposure_is_at_most_3():
    if not ANALYZE:
        pytest.skip("systemd-analyze is not installed (Debian package systemd)")
    r = subprocess.run([ANALYZE, "security", "--offline=yes", "--no-pager",
                        os.path.join(DEPLOY, "tensordd.service")],
                       capture_output=True, text=True, timeout=60)
    m = re.search(r"Overall exposure level for tensordd\.service: (\d+\.\d)", r.stdout)
    if not m and "offline" in r.stderr:
        pytest.skip(f"systemd-analyze security --offline unsupported: {r.stderr.strip()}")
    assert m, r.stdout + r.stderr
    assert float(m.group(1)) <= 3.0, r.stdout


def notify_listener(tmp_path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    path = str(tmp_path / "notify.sock")
    s.bind(path)
    s.settimeout(1.0)
    return s, path


def wait_message(sock, pred, seconds=20.0):
    """Notification datagrams until pred(msg) holds (bounded): returns them all."""
    got = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            msg = sock.recv(4096).decode()
        except socket.timeout:
            continue
        got.append(msg)
        if pred(msg):
            return got
    raise AssertionError(f"no matching notification in {seconds}s: {got}")


def test_ready_status_and_stopping_are_notified(tmp_path):
    sock, path = notify_listener(tmp_path)
    try:
        with Proc(["--listen", "tcp://127.0.0.1:0"], env={"NOTIFY_SOCKET": path}) as d:
            first = wait_message(sock, lambda m: "READY=1" in m)[-1]
            assert "STATUS=serving 0 sessions" in first, first
            with tensordd.connect(d.endpoint, timeout=10) as s:
                s.sync()
                wait_message(sock, lambda m: "STATUS=serving 1 session" in m)
            d.proc.send_signal(15)
            msgs = wait_message(sock, lambda m: "STOPPING=1" in m)
            assert "STATUS=draining" in msgs[-1]
            assert d.proc.wait(30) == 0, d.log()
    finally:
        sock.close()


def test_no_notify_socket_no_messages():
    with Proc(["--listen", "tcp://127.0.0.1:0"]) as d:
        with tensordd.connect(d.endpoint, timeout=10) as s:
            s.sync()
    assert d.proc.returncode == 0, d.log()


def test_socket_activation_serves_inherited_sockets(tmp_path):
    tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    tcp.bind(("127.0.0.1", 0))
    tcp.listen(16)
    upath = str(tmp_path / "act.sock")
    unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    unix.bind(upath)
    unix.listen(16)
    port = tcp.getsockname()[1]
    # fds 3 and 4, LISTEN_PID the daemon's own pid (bash's, kept by exec), as systemd does;
    # the --listen given is replaced by the inherited sockets
    script = (f'exec 3<&{tcp.fileno()} 4<&{unix.fileno()}; '
              f'LISTEN_PID=$$ LISTEN_FDS=2 exec "$0" --listen tcp://127.0.0.1:0')
    err = tempfile.NamedTemporaryFile(prefix="tdd-act-", mode="w+")
    proc = subprocess.Popen(["bash", "-c", script, TDD_BIN], stdout=subprocess.PIPE,
                            stderr=err, text=True, pass_fds=(tcp.fileno(), unix.fileno()))
    try:
        tcp.close()
        unix.close()
        lines = [proc.stdout.readline() for _ in range(2)]
        assert lines == [f"listening on tcp://127.0.0.1:{port}\n",
                         f"listening on unix://{upath}\n"], lines + [open(err.name).read()]
        for ep in (f"tcp://127.0.0.1:{port}", f"unix://{upath}"):
            with tensordd.connect(ep, timeout=10) as s:
                assert float(s.tensor(np.arange(3, dtype=np.float32)).sum().numpy()) == 3.0
        proc.send_signal(15)
        assert proc.wait(30) == 0
        log = open(err.name).read()  # not err's own offset: the daemon shares it
        assert "fd://3 from systemd" in log and "replace the 1 configured" in log, log
        assert os.path.exists(upath)  # systemd's socket file: the daemon leaves it
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        err.close()


def test_token_from_credentials_directory(tmp_path):
    creds = tmp_path / "creds"
    creds.mkdir()
    (creds / "token").write_text("credtoken\n")
    (creds / "token").chmod(0o400)
    with Proc(["--listen", "tcp://127.0.0.1:0"], env={"CREDENTIALS_DIRECTORY": str(creds)}) as d:
        with pytest.raises(tensordd.UnauthenticatedError):
            with tensordd.connect(d.endpoint, timeout=10) as s:
                s.sync()
        with tensordd.connect(d.endpoint, token="credtoken", timeout=10) as s:
            s.sync()
    assert d.proc.returncode == 0, d.log()
