"""What the cuda test files share. They run only when TDD_GPU_ARGS is set: `make test-emu`
sets it to start the emulated daemon (build/emu/tensordd --emu-gpus 2 ...), and
tests/gpu/run.sh sets it to "" on a GPU machine."""

from __future__ import annotations

import os

import pytest

import tensordd
from conftest import Daemon

GPU_ARGS = os.environ.get("TDD_GPU_ARGS")
only_with_gpu = pytest.mark.skipif(
    GPU_ARGS is None, reason="GPU suite: make test-emu, or tests/gpu/run.sh on a GPU")
# The codes a cuda case may be declined with (typed): the case is skipped, not failed.
DECLINED = ("UNSUPPORTED_OP", "UNSUPPORTED_DTYPE")


def start_gpu_daemon(cpu_devices: int = 1) -> Daemon:
    return Daemon("--cpu-devices", str(cpu_devices), *(GPU_ARGS or "").split())


def gpu_daemon_fixture(cpu_devices: int = 1):
    """A module-scoped fixture: one GPU daemon per test file, which must exit 0 on SIGTERM."""

    @pytest.fixture(scope="module")
    def gpu_daemon():
        d = start_gpu_daemon(cpu_devices)
        yield d
        rc = d.stop()
        assert rc == 0, f"daemon exited with {rc} on SIGTERM:\n{d.log()}"

    return gpu_daemon


def gpu_session_fixture(name: str):
    """A fixture called name: a session on the file's gpu_daemon, closed after the test."""

    @pytest.fixture(name=name)
    def session(gpu_daemon):
        s = tensordd.connect(gpu_daemon.endpoint, timeout=120)
        yield s
        s.close(raise_errors=False)

    return session


def declined(e: Exception) -> bool:
    """Whether e is the cuda backend declining a case (directly or as its poison's origin)."""
    if isinstance(e, tensordd.PoisonedError):
        return e.origin_code in DECLINED
    return getattr(e, "code", None) in DECLINED
