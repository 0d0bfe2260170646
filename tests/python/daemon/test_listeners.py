"""Listeners fail loudly and never take over another daemon's socket.

Every listen failure names the endpoint and the system's reason and exits 1
(before: a missing directory or a privileged port exited 1 with no message,
server.c hiding EACCES, which libuv also reports for a missing directory). A
live Unix socket is refused (the second daemon connects to it first; before,
it unlinked it, said "listening on", and removed the path at exit, leaving the
first daemon unreachable); only a stale one is removed. --unix-mode and
--unix-group set the socket's permission bits and group.
"""

from __future__ import annotations

import grp
import os
import signal
import socket
import stat
import subprocess
import tempfile
import time

import pytest

from conftest import TDD_BIN as _TDD_BIN

import tensordd

TIMEOUT = 20
TDD_BIN = os.path.abspath(_TDD_BIN)


def need_binary():
    if not os.access(TDD_BIN, os.X_OK):
        pytest.skip(f"daemon binary {TDD_BIN} not built")


def run_failing(*args, preexec=None, user=None):
    """Runs the daemon expecting it to exit at once; (rc, stderr)."""
    need_binary()
    cmd = [TDD_BIN, *args]
    if user is not None:
        cmd = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", *cmd]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT)
    return p.returncode, p.stdout, p.stderr


class Unix:
    """A daemon on a Unix socket, awaited on its 'listening on' line."""

    def __init__(self, path, *args):
        need_binary()
        self.path = path
        self.proc = subprocess.Popen([TDD_BIN, "--listen", f"unix://{path}", *args],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()  # bounded: the daemon prints it or exits
        if "listening on" not in line:
            self.stop()
            pytest.fail(f"daemon did not start: {line!r} {self.proc.stderr.read()}")
        # "listening on" comes before the signal handlers are installed: one round
        # trip first, so that stop()'s SIGTERM is the graceful one.
        with tensordd.connect(f"unix://{path}", timeout=10):
            pass

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(TIMEOUT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()
        self.proc.stderr.close()
        return self.proc.returncode


@pytest.fixture
def tmpdir_short():
    # Unix socket paths are limited to 107 bytes: a short directory of our own.
    with tempfile.TemporaryDirectory(prefix="tdl") as d:
        yield d


def test_missing_directory_says_so(tmpdir_short):
    ep = f"unix://{tmpdir_short}/no/such/dir/x.sock"
    rc, out, err = run_failing("--listen", ep)
    assert rc == 1
    assert "listening on" not in out
    assert ep in err and "No such file or directory" in err, err


@pytest.mark.skipif(os.geteuid() != 0 and not os.path.exists("/usr/bin/setpriv"),
                    reason="needs root (to drop to nobody) or a non-root user")
def test_privileged_port_says_permission_denied():
    if os.geteuid() == 0:
        with open("/proc/sys/net/ipv4/ip_unprivileged_port_start") as f:
            if int(f.read()) <= 80:
                pytest.skip("unprivileged users may bind port 80 on this machine")
        rc, out, err = run_failing("--listen", "tcp://127.0.0.1:80", user=65534)
    else:
        rc, out, err = run_failing("--listen", "tcp://127.0.0.1:80")
    assert rc == 1
    assert "tcp://127.0.0.1:80" in err and "permission denied" in err.lower(), err


def test_port_in_use_says_so():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        ep = f"tcp://127.0.0.1:{s.getsockname()[1]}"
        rc, out, err = run_failing("--listen", ep)
    assert rc == 1
    assert ep in err and "address already in use" in err.lower(), err


def test_bad_endpoint_is_named():
    rc, out, err = run_failing("--listen", "udp://127.0.0.1:7")
    assert rc == 1 and "udp://127.0.0.1:7" in err and "tcp://HOST:PORT" in err, err


def test_later_failure_removes_earlier_socket(tmpdir_short):
    """A start that fails on its second listener leaves no socket behind."""
    path = f"{tmpdir_short}/first.sock"
    rc, out, err = run_failing("--listen", f"unix://{path}", "--listen",
                               f"unix://{tmpdir_short}/missing/x.sock")
    assert rc == 1 and "missing/x.sock" in err, err
    assert not os.path.exists(path)


def test_live_socket_is_refused_and_kept(tmpdir_short):
    path = f"{tmpdir_short}/d.sock"
    first = Unix(path)
    try:
        rc, out, err = run_failing("--listen", f"unix://{path}")
        assert rc == 1, (out, err)
        assert "listening on" not in out
        assert f"unix://{path}" in err and "listening on it" in err, err
        # the first daemon still owns its socket and answers there
        assert stat.S_ISSOCK(os.stat(path).st_mode)
        with tensordd.connect(f"unix://{path}", timeout=10) as s:
            assert s.session_id > 0
    finally:
        assert first.stop() == 0
    assert not os.path.exists(path)  # the first removes its own socket at exit


def test_stale_socket_is_replaced(tmpdir_short):
    path = f"{tmpdir_short}/stale.sock"
    s = socket.socket(socket.AF_UNIX)
    s.bind(path)  # bound, never listening, then closed: what a killed daemon leaves
    s.close()
    d = Unix(path)
    try:
        with tensordd.connect(f"unix://{path}", timeout=10) as sess:
            assert sess.session_id > 0
    finally:
        assert d.stop() == 0


def test_non_socket_file_is_not_removed(tmpdir_short):
    path = f"{tmpdir_short}/file"
    with open(path, "w") as f:
        f.write("keep me")
    rc, out, err = run_failing("--listen", f"unix://{path}")
    assert rc == 1 and f"unix://{path}" in err and "not a socket" in err, err
    with open(path) as f:
        assert f.read() == "keep me"


def test_unix_mode_and_group(tmpdir_short):
    path = f"{tmpdir_short}/g.sock"
    gid = os.getgid()
    try:
        gid = grp.getgrnam("daemon").gr_gid if os.geteuid() == 0 else os.getgroups()[-1]
    except (KeyError, IndexError):
        pass
    group = grp.getgrgid(gid).gr_name
    d = Unix(path, "--unix-mode", "0660", "--unix-group", group)
    try:
        st = os.stat(path)
        assert stat.S_IMODE(st.st_mode) == 0o660
        assert st.st_gid == gid
    finally:
        assert d.stop() == 0


def test_unix_default_mode_is_owner_only(tmpdir_short):
    path = f"{tmpdir_short}/m.sock"
    d = Unix(path)
    try:
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    finally:
        assert d.stop() == 0


def test_unix_mode_and_group_bad_values(tmpdir_short):
    rc, out, err = run_failing("--listen", f"unix://{tmpdir_short}/b.sock", "--unix-mode", "0999")
    assert rc == 2 and "--unix-mode" in err, err
    rc, out, err = run_failing("--listen", f"unix://{tmpdir_short}/b.sock", "--unix-group",
                               "no-such-group-tdd")
    assert rc == 1 and "no-such-group-tdd" in err and "no such group" in err, err
    assert not os.path.exists(f"{tmpdir_short}/b.sock")
