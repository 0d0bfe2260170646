"""Memory that released handles and closed sessions held goes back to the system.

A session that binds 10^5 small tensors grows the daemon by ~50 MB (each handle: its value,
storage header, smallest device block and handle-table slots). Once it releases them, or
closes, that memory goes back to the caching pools, and, as it passes --trim-released, to
the system: the daemon's resident set (/proc/PID/status VmRSS) falls back near where it was
before. The idle trim (--pool-trim) is pushed out of the way (an hour) so that it is the
release that gives the memory back, as it must on a daemon whose other sessions keep the
pools busy. Memory figures only, with wide margins; nothing here is timed.
"""

import os
import time

import numpy as np
import pytest

import tensordd

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs /proc")

HANDLES = 100_000


def rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def settled(pid: int, below: int, wait_s: float = 10.0) -> int:
    """pid's RSS once it is under below, or after wait_s (the trim runs on the pools'
    threads a moment after the last release)."""
    deadline = time.monotonic() + wait_s
    r = rss(pid)
    while r >= below and time.monotonic() < deadline:
        time.sleep(0.1)
        r = rss(pid)
    return r


def grow(d, close: bool):
    """(RSS before, at the peak, after the handles went) of a session that bound HANDLES
    tensors, then released them one by one (close=False) or closed with them bound."""
    other = tensordd.connect(d.endpoint)  # another session stays open throughout
    s = tensordd.connect(d.endpoint)
    x = s.tensor(np.ones(4, np.float32))
    x.relu().numpy()  # warm: the first op's own allocations are not the handles'
    s.sync()
    r0 = rss(d.proc.pid)
    keep = [x.relu() for _ in range(HANDLES)]
    s.sync()
    r1 = rss(d.proc.pid)
    if close:
        s.close()
        keep.clear()
    else:
        keep.clear()
        s.sync()
    assert other.tensor(np.ones(3, np.float32)).relu().numpy().tolist() == [1.0, 1.0, 1.0]
    r2 = settled(d.proc.pid, r0 + (r1 - r0) // 4)
    if not close:
        s.close()
    other.close()
    return r0, r1, r2


@pytest.mark.parametrize("close", [False, True], ids=["released", "session_closed"])
def test_released_handles_go_back_to_the_system(start_daemon, close):
    d = start_daemon("--pool-trim", "3600")
    r0, r1, r2 = grow(d, close)
    grown = r1 - r0
    assert grown > HANDLES * 100, f"{HANDLES} handles grew the daemon by {grown} bytes only"
    # measured: 0.3-0.7 MB of 52 MB left
    assert r2 - r0 < grown // 4, (
        f"RSS {r0 / 1e6:.1f} MB before, {r1 / 1e6:.1f} MB with {HANDLES} handles, "
        f"{r2 / 1e6:.1f} MB after they went")


def test_without_the_trim_the_memory_stays(start_daemon):
    """The control: --trim-released 0 and no idle trim keep it (so the test above sees the
    trim, not something else giving the memory back)."""
    d = start_daemon("--pool-trim", "3600", "--trim-released", "0")
    s = tensordd.connect(d.endpoint)
    x = s.tensor(np.ones(4, np.float32))
    x.relu().numpy()
    r0 = rss(d.proc.pid)
    keep = [x.relu() for _ in range(HANDLES)]
    s.sync()
    r1 = rss(d.proc.pid)
    keep.clear()
    s.sync()
    time.sleep(1.0)
    r2 = rss(d.proc.pid)
    s.close()
    # measured: all of it (glibc keeps the freed small blocks, the pool its cached ones)
    assert r2 - r0 > (r1 - r0) // 2, (r0, r1, r2)
