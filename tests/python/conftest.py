"""Fixtures: the real daemon (TDD_BIN), sessions on it, and a fake server.

The daemon is started on a free loopback port with two logical CPU devices,
is awaited on its "listening on ..." line (bounded), and is stopped with
SIGTERM at the end; it must exit 0. No process outlives the test run.
"""

from __future__ import annotations

import os
import queue
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "client", "python"))
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
# Tests live in one folder per subject (ops/, autograd/, client/, ...; README.md); a test
# module imports another's cases by its name (``import test_grad_torch``), whatever its
# folder, so every subject folder is on sys.path. Basenames are unique across folders.
for _subject in sorted(os.listdir(HERE)):
    if os.path.isdir(os.path.join(HERE, _subject)) and not _subject.startswith((".", "_")):
        sys.path.insert(1, os.path.join(HERE, _subject))


def _generated_path() -> None:
    """Puts the build's generated tensordd_pb2 (make writes it to $(BUILD)/python,
    never into client/python) on sys.path: the build of TDD_BIN. Made here with
    protoc, as make would, when it is missing or older than the .proto."""
    build = os.path.dirname(os.path.abspath(os.environ.get("TDD_BIN", os.path.join(
        ROOT, "build", "tensordd"))))
    out = os.path.join(build, "python", "tensordd")
    gen, proto = os.path.join(out, "tensordd_pb2.py"), os.path.join(ROOT, "proto", "tensordd.proto")
    if not os.path.isfile(gen) or os.path.getmtime(gen) < os.path.getmtime(proto):
        os.makedirs(out, exist_ok=True)
        subprocess.run(["protoc", f"--python_out={out}", f"-I{os.path.dirname(proto)}", proto],
                       check=True)
    sys.path.insert(1, os.path.dirname(out))


_generated_path()

import tensordd  # noqa: E402

try:  # the torch device's guard, before any test's backward starts torch's autograd engine
    import tensordd.torch  # noqa: E402,F401
except ImportError:
    pass
from fakeserver import FakeServer  # noqa: E402

TDD_BIN = os.environ.get("TDD_BIN", os.path.join(ROOT, "build", "tensordd"))
TDCTL_BIN = os.environ.get("TDCTL_BIN", os.path.join(ROOT, "build", "tdctl"))
START_TIMEOUT = 20.0
STOP_TIMEOUT = 20.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Daemon:
    """A tensordd process listening on a loopback port."""

    def __init__(self, *extra_args: str, env: "dict[str, str] | None" = None):
        """env: the daemon's whole environment (None: this process's)."""
        if not os.access(TDD_BIN, os.X_OK):
            pytest.skip(f"daemon binary {TDD_BIN} not built (make BUILD=... build/tensordd, "
                        f"or set TDD_BIN)")
        self.port = free_port()
        self.endpoint = f"tcp://127.0.0.1:{self.port}"
        self.stderr = tempfile.TemporaryFile(mode="w+")
        self.args = [TDD_BIN, "--listen", self.endpoint, *extra_args]
        self.proc = subprocess.Popen(self.args, stdout=subprocess.PIPE, stderr=self.stderr,
                                     text=True, bufsize=1, env=env)
        self.output: list[str] = []
        lines: "queue.Queue[str | None]" = queue.Queue()

        def pump():  # keeps draining stdout so the daemon never blocks on it
            for line in self.proc.stdout:
                self.output.append(line)
                lines.put(line)
            lines.put(None)

        threading.Thread(target=pump, daemon=True).start()
        deadline = time.monotonic() + START_TIMEOUT
        waiting = self.args.count("--listen")  # one "listening on" line per endpoint
        while waiting:
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                self.kill()
                pytest.fail(f"{self.args} did not print 'listening on' within "
                            f"{START_TIMEOUT}s:\n{self.log()}")
            if line is None:
                rc = self.proc.wait()
                pytest.fail(f"{self.args} exited with {rc} before listening:\n{self.log()}")
            if "listening on" in line:
                waiting -= 1
                printed = line.split("listening on", 1)[1].split()[0]
                if printed.startswith("tcp://"):
                    self.endpoint = printed

    def log(self) -> str:
        self.stderr.seek(0)
        return "stdout:\n" + "".join(self.output) + "stderr:\n" + self.stderr.read()[-4000:]

    def stop(self) -> int:
        """SIGTERM, then wait; returns the exit status (kills it on timeout)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.kill()
                pytest.fail(f"daemon did not exit within {STOP_TIMEOUT}s of SIGTERM")
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="session")
def daemon():
    """One daemon for the run: `--cpu-devices 2`, so cpu:0, cpu:1 and ref:0 exist."""
    d = Daemon("--cpu-devices", "2")
    yield d
    rc = d.stop()
    assert rc == 0, f"daemon exited with {rc} on SIGTERM:\n{d.log()}"


@pytest.fixture(scope="module")
def sim_daemon():
    """A daemon per test module with cpu:0, ref:0 and a simulated device sim:0."""
    d = Daemon("--cpu-devices", "1", "--sim-devices", "1")
    yield d
    rc = d.stop()
    assert rc == 0, f"daemon exited with {rc} on SIGTERM:\n{d.log()}"


@pytest.fixture
def start_daemon():
    """Starts extra daemons (own arguments) that are stopped after the test."""
    started = []

    def start(*args, env=None):
        d = Daemon(*args, env=env)
        started.append(d)
        return d

    yield start
    for d in started:
        d.kill()


@pytest.fixture
def session(daemon):
    s = tensordd.connect(daemon.endpoint, timeout=60)
    yield s
    s.close(raise_errors=False)


@pytest.fixture
def fake():
    """fake(handler=None) -> a started FakeServer, closed after the test."""
    servers = []

    def make(handler=None):
        srv = FakeServer(handler)
        servers.append(srv)
        return srv

    yield make
    for srv in servers:
        srv.close()
