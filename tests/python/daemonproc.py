"""A tensordd process with its own environment and stderr file, for the operations
tests (config file, logging, metrics, systemd): started on free loopback ports, awaited
on its stdout lines (bounded), stopped with SIGTERM (then killed) when the block ends."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import tempfile
import threading
import time

from conftest import TDD_BIN

START_TIMEOUT = 20.0


class Proc:
    def __init__(self, args, env=None, stderr_path=None, expect=("listening on",), prefix=()):
        self.stderr_path = stderr_path or tempfile.mkstemp(prefix="tdd-ops-", suffix=".err")[1]
        self._own_stderr = stderr_path is None
        self._stderr_kept = None
        full_env = {k: v for k, v in os.environ.items()
                    if not k.startswith(("TENSORDD_", "JOURNAL_STREAM", "NOTIFY_SOCKET",
                                         "LISTEN_", "CREDENTIALS_DIRECTORY"))}
        full_env.update(env or {})
        self.err = open(self.stderr_path, "a")
        # prefix: a command that execs the daemon (`ip netns exec NS`)
        self.proc = subprocess.Popen([*prefix, TDD_BIN, *args], stdout=subprocess.PIPE, stderr=self.err,
                                     stdin=subprocess.DEVNULL, text=True, bufsize=1,
                                     env=full_env)
        self.stdout: list[str] = []
        lines: "queue.Queue[str | None]" = queue.Queue()

        def pump():
            for line in self.proc.stdout:
                self.stdout.append(line)
                lines.put(line)
            lines.put(None)

        threading.Thread(target=pump, daemon=True).start()
        self.endpoint = self.metrics = None
        want = list(expect)
        deadline = time.monotonic() + START_TIMEOUT
        while want:
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                self.stop()
                raise AssertionError(f"{args}: no {want} within {START_TIMEOUT}s:\n{self.log()}")
            if line is None:
                self.proc.wait()
                raise AssertionError(f"{args} exited {self.proc.returncode}:\n{self.log()}")
            for w in list(want):
                if line.startswith(w):
                    want.remove(w)
                    break
            if line.startswith("listening on tcp://") and not self.endpoint:
                self.endpoint = line.split()[2]
            if line.startswith("metrics on "):
                self.metrics = line.split()[2].rsplit("/metrics", 1)[0]

    def stderr_text(self) -> str:
        if self._stderr_kept is not None:
            return self._stderr_kept
        with open(self.stderr_path) as f:
            return f.read()

    def log(self) -> str:
        return "stdout:\n" + "".join(self.stdout) + "stderr:\n" + self.stderr_text()[-6000:]

    def stderr_lines(self) -> list[str]:
        return self.stderr_text().splitlines()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.err.close()
        return self.proc.returncode

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
        if self._own_stderr:
            self._stderr_kept = self.stderr_text()
            os.unlink(self.stderr_path)


def run(*args, env=None, timeout=30):
    """Runs the daemon to completion (--check-config, --help): CompletedProcess."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("TENSORDD_")}
    full_env.update(env or {})
    return subprocess.run([TDD_BIN, *args], capture_output=True, text=True, timeout=timeout,
                          env=full_env, stdin=subprocess.DEVNULL)
