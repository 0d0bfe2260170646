"""Handles are released when Tensors die: batched into one Release with the
next request, visible in the daemon's counters (Session.stats() and
`tdctl stats --json`), and the daemon's memory stays bounded."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import time

import numpy as np
import pytest

import tensordd
from conftest import TDCTL_BIN


def daemon_handles(session) -> int:
    session.sync()  # carries the pending Release batch and waits for it
    return session.stats()["handles"]


def test_handles_return_to_baseline_after_gc(session):
    base = daemon_handles(session)
    base_mem = session.stats()["memory"]["cpu:0"]["bytes_in_use"]
    ts = [session.tensor(np.ones(1024, np.float32)) for _ in range(200)]
    derived = [t + t for t in ts[:50]]
    assert daemon_handles(session) == base + 250
    del ts, derived
    gc.collect()
    assert daemon_handles(session) == base
    assert session.stats()["memory"]["cpu:0"]["bytes_in_use"] == base_mem


def test_release_is_one_batched_request(session):
    ts = [session.tensor(np.ones(4, np.float32)) for _ in range(100)]
    session.sync()
    before = session.stats()["requests"]
    del ts
    gc.collect()
    session.sync()
    # the Stats and Sync above/here, plus one Release for the hundred handles
    assert session.stats()["requests"] - before <= 3


def test_temporaries_are_released(session):
    base = daemon_handles(session)
    x = session.tensor(np.ones((8, 8), np.float32))
    y = ((x @ x).relu() + x).sum()  # three temporaries die on the way
    assert y.item() == 8 * 8 * 9
    assert daemon_handles(session) == base + 2  # x and y


def test_tdctl_stats_sees_handles_return_to_baseline(session):
    if not os.access(TDCTL_BIN, os.X_OK):
        pytest.skip(f"tdctl not built at {TDCTL_BIN} (set TDCTL_BIN)")

    def tdctl_handles() -> int:
        session.sync()
        out = subprocess.run([TDCTL_BIN, "--endpoint", session.endpoint, "stats", "--json"],
                             capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)["handles"]

    base = tdctl_handles()
    ts = [session.tensor(np.ones(256, np.float32)) for _ in range(64)]
    assert tdctl_handles() == base + 64
    del ts
    gc.collect()
    assert tdctl_handles() == base


def _rss_kib(pid: int) -> dict:
    fields = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                fields[key] = int(value.split()[0])
    return fields


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs Linux /proc")
def test_dropping_10000_tensors_of_1mib_keeps_daemon_rss_bounded(start_daemon):
    d = start_daemon()
    block = np.ones(1 << 18, np.float32)  # 1 MiB
    with tensordd.connect(d.endpoint, timeout=120) as s:
        s.tensor(block).numpy()  # warm up allocator and buffers
        s.sync()
        idle = _rss_kib(d.proc.pid)["VmRSS"]
        start = time.monotonic()
        for _ in range(10_000):
            t = s.tensor(block)
            del t  # released with the next upload
        s.sync()
        elapsed = time.monotonic() - start
        assert s.stats()["handles"] == 0
        rss = _rss_kib(d.proc.pid)
    peak_growth_mib = (rss["VmHWM"] - idle) / 1024
    print(f"\n10,000 x 1 MiB uploaded and dropped in {elapsed:.1f}s "
          f"({10_000 / 1024 / elapsed:.2f} GiB/s); daemon RSS idle {idle / 1024:.0f} MiB, "
          f"after {rss['VmRSS'] / 1024:.0f} MiB, peak growth {peak_growth_mib:.0f} MiB")
    assert peak_growth_mib < 256, f"daemon RSS grew by {peak_growth_mib:.0f} MiB"
