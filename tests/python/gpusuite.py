"""What the cuda tests share. They run only when TDD_GPU_ARGS is set: `make test-emu`
sets it to start the emulated daemon (build/emu/tensordd --emu-gpus 2 ...), and
tests/gpu/run.sh sets it to "" on a GPU machine.

A test that runs the same check on every device takes the device as a parameter
(`devices(...)`) and its session from the `device_session` fixture (conftest.py)."""

from __future__ import annotations

import contextlib
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


def start_profiled_gpu_daemon(directory, *extra: str) -> Daemon:
    """A GPU daemon whose emulator writes its per-launch profile (TDD_EMU_PROFILE) to
    directory/profile.jsonl, named by the daemon's .profile (on a real GPU: no profile)."""
    prof = os.path.join(str(directory), "profile.jsonl")
    mp = pytest.MonkeyPatch()
    if GPU_ARGS is not None and "--emu-gpus" in GPU_ARGS:
        mp.setenv("TDD_EMU_PROFILE", prof)
    try:
        d = Daemon("--cpu-devices", "1", *(GPU_ARGS or "").split(), *extra)
    finally:
        mp.undo()
    d.profile = prof
    return d


def profiled_fixtures(tag: str):
    """(daemon, s): a module's profiled GPU daemon (start_profiled_gpu_daemon), which must
    exit 0 on SIGTERM, and a session on it per test. Assign them to the names `daemon` and
    `s` in the test module."""

    @pytest.fixture(scope="module", name="daemon")
    def daemon(tmp_path_factory):
        d = start_profiled_gpu_daemon(tmp_path_factory.mktemp(tag))
        yield d
        rc = d.stop()
        assert rc == 0, f"daemon exited with {rc} on SIGTERM:\n{d.log()}"

    @pytest.fixture(name="s")
    def s(daemon):
        sess = tensordd.connect(daemon.endpoint, timeout=120)
        yield sess
        sess.close(raise_errors=False)

    return daemon, s


def profile_size(daemon) -> int:
    """The profile's size now: where the next launches' records will start."""
    return os.path.getsize(daemon.profile) if os.path.exists(daemon.profile) else 0


def profile_kernels(daemon, at: int) -> list:
    """The kernel names launched since byte offset at of the daemon's profile."""
    with open(daemon.profile) as f:
        f.seek(at)
        return [line.split('"kernel": "')[1].split('"')[0] for line in f if '"kernel"' in line]


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


CUDA = "cuda:0"


def host_and_cuda(host: list, cuda: list) -> list:
    """The parameters of a test that runs on host devices and on cuda:0: `host` and `cuda`
    (pytest.params), the cuda ones marked `cuda` and skipped without TDD_GPU_ARGS. With
    it (the GPU suites) only the cuda ones are collected, so tests/gpu/suites.sh runs a
    test's cuda cases by naming the test."""
    marks = [pytest.mark.cuda, only_with_gpu]
    cuda = [pytest.param(*p.values, id=p.id, marks=[*p.marks, *marks]) for p in cuda]
    return cuda if GPU_ARGS is not None else [*host, *cuda]


def devices(*host: str) -> list:
    """The values of a `device` parameter: the host devices given (cpu:0, ref:0, sim:0),
    and cuda:0 (host_and_cuda)."""
    return host_and_cuda([pytest.param(d, id=d) for d in host], [pytest.param(CUDA, id=CUDA)])


@contextlib.contextmanager
def declines_skip(device: str, session=None):
    """On cuda a case the backend declines (typed UNSUPPORTED_OP/UNSUPPORTED_DTYPE, or a
    poison of one) is skipped, so the passed count is what cuda runs; on any other device
    it fails. The session, when given, is synced at the end: a declined op answers at the
    next synchronising call."""
    try:
        yield
        if session is not None:
            session.sync()
    except tensordd.Error as e:
        if device.startswith("cuda") and declined(e):
            pytest.skip(f"cuda declines: {e}")
        raise
