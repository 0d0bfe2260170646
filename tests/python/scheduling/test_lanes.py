"""Device lanes: one session's long kernels do not hold up another session's ops.

A cpu/ref device runs each session's work on one of --device-lanes worker threads
(session id % lanes), in that session's order, in a queue of its own that the lane
serves in turn with its other sessions' (test_chunked_kernels.py checks the turns). The
checks are about order, not time: session A queues a long chain of matmuls;
session B then runs a tiny op and asks the daemon how many tasks are still
pending. B is answered while A's chain still runs, with one lane or several.
Results do not depend on lanes.
"""

from __future__ import annotations

import numpy as np
import pytest

import tensordd
from tensordd.session import _Call

CHAIN = 150  # matmuls of N x N queued by session A (~0.3-1 s of one core)
N = 320


def pending_tasks(sess) -> int:
    """StatsReply.tasks_pending: tasks queued on a lane or running."""
    req = sess._new_request()
    req.stats.SetInParent()
    resp, _ = sess._roundtrip(req, _Call("stats"))
    return resp.stats.tasks_pending


def queue_chain(a):
    rng = np.random.default_rng(7)
    x = a.tensor((rng.standard_normal((N, N)) / np.sqrt(N)).astype(np.float32))
    y = x
    for _ in range(CHAIN):
        y = y @ x
    a.stats()  # a round trip on the loop: every matmul before it has been read and queued
    return y


def run(start_daemon, lanes):
    d = start_daemon("--device-lanes", str(lanes))
    a = tensordd.connect(d.endpoint, timeout=120)
    b = tensordd.connect(d.endpoint, timeout=120)
    try:
        y = queue_chain(a)
        relu = b.tensor([-1.0, 2.0, -3.0, 4.0]).relu().numpy()
        left = pending_tasks(b)
        return relu, left, y.numpy()
    finally:
        a.close(raise_errors=False)
        b.close(raise_errors=False)


def test_one_lane_serves_sessions_in_turn(start_daemon):
    relu, left, _ = run(start_daemon, 1)
    np.testing.assert_array_equal(relu, [0.0, 2.0, 0.0, 4.0])
    assert left > 0, "B's op waited for every one of A's matmuls on a single lane"


def test_lanes_let_a_small_op_pass_a_long_chain(start_daemon):
    relu, left, _ = run(start_daemon, 4)
    np.testing.assert_array_equal(relu, [0.0, 2.0, 0.0, 4.0])
    assert left > 0, "B's op waited for every one of A's matmuls: the sessions share a queue"


def test_results_do_not_depend_on_lanes(start_daemon):
    _, _, y1 = run(start_daemon, 1)
    _, _, y4 = run(start_daemon, 4)
    np.testing.assert_array_equal(y1, y4)  # same kernels, same order within the session


def test_many_sessions_on_few_lanes_stay_correct(start_daemon):
    """More sessions than lanes share them; each still sees its own results in order."""
    d = start_daemon("--device-lanes", "2")
    sessions = [tensordd.connect(d.endpoint, timeout=120) for _ in range(5)]
    try:
        outs = []
        for i, s in enumerate(sessions):
            t = s.tensor(np.full((64, 64), float(i + 1), np.float32))
            for _ in range(5):
                t = (t @ t) * (1.0 / 64.0 / (i + 1))  # stays i + 1 everywhere
            outs.append(t)
        for i, t in enumerate(outs):
            np.testing.assert_allclose(t.numpy(), np.full((64, 64), float(i + 1)), rtol=1e-5)
    finally:
        for s in sessions:
            s.close(raise_errors=False)


def test_lanes_is_a_checked_option(start_daemon):
    import subprocess

    from conftest import TDD_BIN

    r = subprocess.run([TDD_BIN, "--device-lanes", "0"], capture_output=True, text=True,
                       timeout=20)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "device-lanes" in r.stderr
