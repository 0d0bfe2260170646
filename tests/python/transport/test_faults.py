"""Faults on the wire: a proxy (faultproxy.py) between the client and the daemon drops
the connection at byte N (either way), stalls it, delays it, splits every write into
single bytes, or truncates a frame.

Under each fault every call ends in a result or a typed error (CLOSED, IO or TIMEOUT;
never a hang, never PROTOCOL_ERROR), nothing the daemon computes changes (the same
steps through a slow or fragmented link give bit-identical parameters), and the
daemon's accounting returns to its baseline: the session is freed with its handles
and memory.
"""
from __future__ import annotations

import time

import numpy as np
import pytest

import tensordd
from faultproxy import FaultProxy

LOST = ("CLOSED", "IO", "TIMEOUT")


def train(s, steps=3):
    """A few SGD steps of a small MLP, with a download per step; returns the parameters."""
    rng = np.random.default_rng(0)
    init = [(rng.standard_normal((16, 32)) * 0.2).astype(np.float32), np.zeros(32, np.float32),
            (rng.standard_normal((32, 4)) * 0.2).astype(np.float32), np.zeros(4, np.float32)]
    params = [s.tensor(a, requires_grad=True) for a in init]
    w1, b1, w2, b2 = params
    opt = tensordd.optim.SGD(params, lr=0.1)
    for k in range(steps):
        x = s.tensor(rng.standard_normal((64, 16)).astype(np.float32))
        y = s.tensor(rng.integers(0, 4, 64))
        loss = s.op("cross_entropy", (x @ w1 + b1).relu() @ w2 + b2, y)
        opt.step(loss.backward())
        loss.item()
    return [p.numpy() for p in params]


def accounting(endpoint):
    """sessions, handles and bytes in use, seen from a fresh session (which counts 1)."""
    with tensordd.connect(endpoint, timeout=20) as o:
        st = o.stats()
    mem = sum(m["bytes_in_use"] for m in st["memory"].values())
    return st["sessions"], st["handles"], mem


def settle(endpoint, want, timeout=20.0):
    """Polls the daemon's accounting until it equals want (bounded)."""
    deadline = time.monotonic() + timeout
    got = accounting(endpoint)
    while got != want and time.monotonic() < deadline:
        time.sleep(0.05)
        got = accounting(endpoint)
    assert got == want, f"accounting {got} did not return to {want}"


@pytest.fixture
def fdaemon(start_daemon):
    return start_daemon("--cpu-devices", "1")


def test_single_bytes_and_delays_change_nothing(fdaemon):
    with tensordd.connect(fdaemon.endpoint, timeout=60) as s:
        want = train(s)
    for mode, kw in (("bytes", {}), ("delay", {"delay": 0.001})):
        with FaultProxy(fdaemon.port, mode, **kw) as p:
            with tensordd.connect(p.endpoint, timeout=60) as s:
                got = train(s)
        for w, g in zip(want, got):
            np.testing.assert_array_equal(w, g, err_msg=mode)


def session_bytes(port):
    with FaultProxy(port, "pass") as p:
        with tensordd.connect(p.endpoint, timeout=60) as s:
            train(s)
        time.sleep(0.1)
        return p.up, p.down


@pytest.mark.parametrize("direction", ["up", "down"])
def test_a_connection_dropped_anywhere_is_typed_and_frees_everything(fdaemon, direction):
    base = accounting(fdaemon.endpoint)
    up, down = session_bytes(fdaemon.port)
    total = up if direction == "up" else down
    # in the Hello, in a frame header, mid-payload of an upload or a download, near the end
    for at in sorted({5, 20, total // 5, total // 3, total // 2, (3 * total) // 4, total - 3}):
        with FaultProxy(fdaemon.port, "drop", at=at, direction=direction) as p:
            with pytest.raises(tensordd.Error) as e:
                with tensordd.connect(p.endpoint, timeout=20) as s:
                    train(s)
            assert p.fired.is_set()
        assert e.value.code in LOST, f"drop at byte {at} {direction}: {e.value!r}"
        settle(fdaemon.endpoint, base)


def test_a_truncated_frame_is_typed_and_frees_everything(fdaemon):
    base = accounting(fdaemon.endpoint)
    up, _ = session_bytes(fdaemon.port)
    for at in (3, 17, up // 2):  # inside the Hello's header, its message, a later frame
        with FaultProxy(fdaemon.port, "truncate", at=at) as p:
            with pytest.raises(tensordd.Error) as e:
                with tensordd.connect(p.endpoint, timeout=20) as s:
                    train(s)
        assert e.value.code in LOST, f"truncated at {at}: {e.value!r}"
        settle(fdaemon.endpoint, base)


def test_a_stalled_link_times_out_and_the_daemon_frees_the_session(start_daemon):
    d = start_daemon("--cpu-devices", "1", "--idle-timeout", "2")
    base = accounting(d.endpoint)
    up, _ = session_bytes(d.port)
    with FaultProxy(d.port, "stall", at=up // 2) as p:
        with pytest.raises(tensordd.Error) as e:
            s = tensordd.connect(p.endpoint, timeout=3)
            try:
                train(s)
            finally:
                s.close(raise_errors=False)
        assert e.value.code == "TIMEOUT", repr(e.value)
        # the proxy still holds the daemon's side open and silent: its idle timeout ends it
        settle(d.endpoint, base, timeout=30)
