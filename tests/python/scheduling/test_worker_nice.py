"""--worker-nice: the device workers, and the compute threads they start, run at a lower
priority than the loop thread, so on a machine whose cores are all busy with kernels the
loop thread (which answers small requests itself) and the clients get a core first.

Checked through /proc/PID/task/TID/stat's nice field (the 19th), not through timings:
the main (loop) thread keeps the daemon's nice value, every lane worker has the option's,
and a compute thread a worker starts for a big kernel inherits the worker's."""

import os
import subprocess

import numpy as np
import pytest

import tensordd


def nice_of_threads(pid: int) -> dict:
    """{tid: nice} for every thread of pid."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except FileNotFoundError:  # the thread ended meanwhile
            continue
        out[int(tid)] = int(fields[16])  # field 19 of stat; fields[0] is field 3 (state)
    return out


def lane_count(d) -> int:
    """Devices with lanes: the workers are not named, so count them from the devices the
    daemon serves (every cpu, ref and cuda device gets --device-lanes lanes, sim one)."""
    with tensordd.connect(d.endpoint, timeout=60) as s:
        return len([dev for dev in s.devices() if dev.backend != "sim"])


@pytest.mark.parametrize("nice", [None, "0", "7"])
def test_workers_run_at_the_worker_nice_value(start_daemon, nice):
    args = ["--device-lanes", "3", "--threads", "2"]
    if nice is not None:
        args += ["--worker-nice", nice]
    want = 10 if nice is None else int(nice)  # 10 is the default
    d = start_daemon(*args)
    pid = d.proc.pid
    base = os.getpriority(os.PRIO_PROCESS, pid)  # the daemon's own (the loop thread's)
    lowered = min(base + want, 19)  # (the test itself may run niced)
    before = nice_of_threads(pid)
    assert before[pid] == base
    lanes = 3 * lane_count(d)
    assert lanes >= 3
    if lowered == base:
        assert all(v == base for v in before.values()), before
    else:
        assert sum(v == lowered for v in before.values()) == lanes, before
    # a kernel big enough for two threads: its lane's worker starts a compute thread
    with tensordd.connect(d.endpoint, timeout=60) as s:
        a = s.tensor(np.ones((512, 512), np.float32))
        np.testing.assert_array_equal((a @ a).numpy()[:2, :2], np.full((2, 2), 512.0))
    after = nice_of_threads(pid)
    new = {t: v for t, v in after.items() if t not in before}
    assert new, "no compute thread was started for the 512x512 matmul"
    assert all(v == lowered for v in new.values()), new
    assert after[pid] == base


def test_worker_nice_out_of_range_is_refused():
    r = subprocess.run([os.environ.get("TDD_BIN", "build/tensordd"), "--worker-nice", "20"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode != 0 and "worker-nice" in r.stderr, (r.returncode, r.stderr)
