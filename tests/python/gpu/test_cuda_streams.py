"""A CUDA stream per session: sessions interleaving work on cuda:0 get numpy's
answers, each on a stream of its own (sessions past --cuda-streams share them), and a block
a session frees is released in that session's stream order, after its own queued kernels.

Runs only when TDD_GPU_ARGS is set (see gpusuite.py). The numeric checks run on a GPU too;
which stream ran what is read from the emulator's trace (TDD_EMU_TRACE=1: a line per stream
made or destroyed and per kernel launch, naming its stream), and the deferred-stream check
needs the emulator's TDD_EMU_DEFER_STREAM (one stream's work runs only when forced), so those
run on the emulated build only. Tolerances: float32 against numpy's float64, rtol 1e-4.
"""

from __future__ import annotations

import gc
import re
import time

import numpy as np
import pytest

import tensordd

from gpusuite import GPU_ARGS, only_with_gpu
from conftest import Daemon

pytestmark = only_with_gpu
EMU = GPU_ARGS is not None and "--emu-gpus" in GPU_ARGS
RTOL, ATOL = 1e-4, 1e-5


def start(monkeypatch, *args, **env):
    if EMU:
        monkeypatch.setenv("TDD_EMU_TRACE", "1")
    for k, v in env.items():
        monkeypatch.setenv(k, str(v))
    return Daemon("--cpu-devices", "1", *(GPU_ARGS or "").split(), *args)


def stderr_of(d: Daemon) -> str:
    d.stderr.seek(0)
    return d.stderr.read()


def launch_streams(text: str, device: int = 0) -> set[int]:
    return {int(m) for m in re.findall(rf"on device {device} stream (\d+)$", text, re.M)}


def made(text: str, device: int = 0) -> list[int]:
    return [int(m) for m in re.findall(rf"stream (\d+) created on device {device} ", text)]


def destroyed(text: str, device: int = 0) -> list[int]:
    return [int(m) for m in re.findall(rf"stream (\d+) destroyed on device {device} ", text)]


def want(x, w, b, k):
    z = np.maximum(x.astype(np.float64) @ w + b, 0.0) * (k + 1)
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True), z.sum(axis=0)


def run_interleaved(d: Daemon, nsessions: int, rounds: int = 3):
    """Each session's chain issued a step at a time across the sessions, read back last."""
    rng = np.random.default_rng(11)
    sessions = [tensordd.connect(d.endpoint, timeout=120) for _ in range(nsessions)]
    try:
        data = [(rng.standard_normal((8, 16)).astype(np.float32),
                 rng.standard_normal((16, 12)).astype(np.float32),
                 rng.standard_normal(12).astype(np.float32)) for _ in range(nsessions)]
        for r in range(rounds):
            xs = [s.tensor(x, device="cuda:0") for s, (x, _, _) in zip(sessions, data)]
            ws = [s.tensor(w, device="cuda:0") for s, (_, w, _) in zip(sessions, data)]
            bs = [s.tensor(b, device="cuda:0") for s, (_, _, b) in zip(sessions, data)]
            zs = [(x @ w + b).relu() for x, w, b in zip(xs, ws, bs)]
            zs = [z * float(k + 1) for k, z in enumerate(zs)]
            ps = [z.softmax(1) for z in zs]
            sums = [z.sum(0) for z in zs]
            for k, (x, w, b) in enumerate(data):
                p, s = want(x, w, b, k)
                np.testing.assert_allclose(ps[k].numpy(), p, rtol=RTOL, atol=ATOL)
                np.testing.assert_allclose(sums[k].numpy(), s, rtol=RTOL, atol=1e-4)
            del xs, ws, bs, zs, ps, sums
            gc.collect()
    finally:
        for s in sessions:
            s.close(raise_errors=False)


def wait_for(pred, d: Daemon):
    for _ in range(200):  # bounded: 10 s
        if pred(stderr_of(d)):
            return
        time.sleep(0.05)
    pytest.fail("the daemon's trace never showed it:\n" + d.log())


def test_sessions_interleaved_on_cuda0_each_on_its_own_stream(monkeypatch):
    d = start(monkeypatch, "--cuda-streams", "4")
    try:
        run_interleaved(d, 3)
        if EMU:
            text = stderr_of(d)
            own = made(text)[0]  # the device's own stream, made at start
            used = launch_streams(text)
            assert len(used) == 3 and own not in used, (used, own)
            assert set(made(text)[1:]) == used  # made at each session's first use
            # and destroyed when the sessions end
            wait_for(lambda t: set(destroyed(t)) == used, d)
    finally:
        assert d.stop() == 0, d.log()


def test_sessions_past_the_limit_share_streams(monkeypatch):
    d = start(monkeypatch, "--cuda-streams", "2")
    try:
        run_interleaved(d, 4, rounds=2)
        if EMU:
            text = stderr_of(d)
            used = launch_streams(text)
            assert len(used) == 2 and made(text)[0] not in used, used
    finally:
        assert d.stop() == 0, d.log()


@pytest.mark.skipif(not EMU, reason="needs the emulator's deferred streams")
def test_a_deferred_sessions_frees_wait_for_its_kernels(monkeypatch):
    # Find the id the first session's stream will get: the streams made at start, plus one.
    probe = start(monkeypatch)
    at_start = len(re.findall(r"stream \d+ created on device", stderr_of(probe)))
    assert probe.stop() == 0
    d = start(monkeypatch, TDD_EMU_DEFER_STREAM=at_start + 1)
    try:
        a = tensordd.connect(d.endpoint, timeout=120)
        b = tensordd.connect(d.endpoint, timeout=120)
        rng = np.random.default_rng(3)
        x = rng.standard_normal((64, 64)).astype(np.float32)
        X = a.tensor(x, device="cuda:0")
        Y = X * 2.0
        a.sync()
        assert made(stderr_of(d))[-1] == at_start + 1  # a's stream: the deferred one
        acc = np.zeros((64, 64))
        for k in range(6):
            # a's kernels queue on its deferred stream; its temporaries are freed as it goes
            T = (X + float(k)).relu() * 0.5
            Y = Y + T
            acc += np.maximum(x.astype(np.float64) + k, 0.0) * 0.5
            del T
            gc.collect()
            a.sync()  # sends a's releases: the frees queue behind a's kernels
            # b's work meanwhile runs at once on its own stream, in fresh memory
            z = rng.standard_normal(256).astype(np.float32)
            Z = (b.tensor(z, device="cuda:0") * 3.0).exp().sum()
            np.testing.assert_allclose(Z.numpy(), np.exp(z.astype(np.float64) * 3).sum(),
                                       rtol=RTOL)
        del X
        gc.collect()
        a.sync()  # X's block is freed after every kernel of a's that reads it
        np.testing.assert_allclose(Y.numpy(), 2.0 * x + acc, rtol=RTOL, atol=ATOL)
        info = {str(i["device"]): i for i in b.device_info()}
        assert not info["cuda:0"]["failed"], info["cuda:0"]
        a.close()
        b.close()
        text = stderr_of(d)
        assert "faulted" not in text and "freed too early" not in text, d.log()
    finally:
        assert d.stop() == 0, d.log()
