"""Process groups on cuda devices: collectives staged through host memory over Gloo (the
daemon copies each bucket-sized piece device -> host on the device's worker, runs Gloo's
collective, copies the result back). Held to numpy and to a single daemon's training run
on the combined batch; broadcast and all-gather bit for bit; a killed rank typed; a cuda
group given a tensor of another device typed.

Runs only when TDD_GPU_ARGS is set (tests/gpu/suites.sh: the emulated build with
`--emu-gpus 2` in make test-emu, or a real GPU in tests/gpu/run.sh). The ranks' daemons run
in network namespaces of their own, or on loopback, as in test_parallel.py."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest

import tensordd
from tensordd import parallel
from gpusuite import GPU_ARGS, only_with_gpu
from test_parallel import (TOKEN, RankDaemon, _check_data_parallel, _data_parallel_run, _digits,
                           _single_run, hosts_fixture, run_ranks, store_fixture)

pytestmark = only_with_gpu
RANKS = 3
DEV = "cuda:0"


store = store_fixture("tdd-cuda-groups-")
hosts = hosts_fixture(RANKS, "test_cuda_parallel: ranks' daemons")


def start(hosts, store, n, *extra):
    return [RankDaemon(hosts, k, [*(GPU_ARGS or "").split(), "--cpu-devices", "1",
                                  "--group-store-dir", store, "--group-timeout", "2",
                                  "--token-file", os.path.join(store, ".token"), *extra])
            for k in range(n)]


@pytest.fixture(scope="module")
def daemons(hosts, store):
    """One daemon per rank; 4 KiB buckets (the least), so tensors are staged in pieces."""
    ds = start(hosts, store, RANKS, "--group-bucket-bytes", "4K")
    yield ds
    for d in ds:
        rc = d.stop()
        assert rc == 0, f"daemon exited with {rc}:\n{d.log()}"


def connect_all(daemons):
    ss = parallel.connect_many([d.endpoint for d in daemons], timeout=120, token=TOKEN)
    if DEV not in [str(x) for x in ss[0].devices()]:
        for s in ss:
            s.close(raise_errors=False)
        pytest.skip(f"the daemon serves no {DEV}")
    return ss


@pytest.fixture
def sessions(daemons):
    ss = connect_all(daemons)
    yield ss
    for s in ss:
        s.close(raise_errors=False)


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("op", ["sum", "avg", "max"])
def test_all_reduce_on_cuda_matches_numpy(sessions, world, op):
    ss = sessions[:world]
    pg = parallel.init_process_group(ss, device=DEV)
    rng = np.random.default_rng(world * 10 + len(op))
    # 3000 float32 (12 KB) crosses three 4 KiB pieces; small ones share a piece; a dtype
    # run ends a piece; an empty tensor and a 0-d one
    shapes = [(3, 5), (3000,), (7,), (0, 3), (2, 3, 4), ()]
    dtypes = [np.float32, np.float32, np.float64, np.float64, np.float64, np.float32]
    if op != "avg":
        shapes.append((9,))
        dtypes.append(np.int64)
    data = [[(rng.standard_normal(sh) * 100).astype(dt) for sh, dt in zip(shapes, dtypes)]
            for _ in ss]
    ts = [[s.tensor(a, device=DEV) for a in arrs] for s, arrs in zip(ss, data)]
    pg.all_reduce(ts, op)
    for k in range(len(shapes)):
        stack = np.stack([data[r][k] for r in range(world)])
        want = {"sum": stack.sum(0), "avg": stack.sum(0) / world, "max": stack.max(0)}[op]
        want = np.asarray(want, dtype=stack.dtype)
        for r in range(world):
            got = ts[r][k].numpy()
            assert got.dtype == want.dtype and got.shape == want.shape
            if op == "max" or dtypes[k] == np.int64:
                np.testing.assert_array_equal(got, want)
            else:  # Gloo's order of additions: float reassociation only
                np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-3)
        assert all(np.array_equal(ts[0][k].numpy(), ts[r][k].numpy()) for r in range(world))


def test_broadcast_and_all_gather_on_cuda_bit_exact(sessions):
    pg = parallel.init_process_group(sessions, device=DEV)
    rng = np.random.default_rng(7)
    data = [[rng.standard_normal((40, 50)).astype(np.float32), np.arange(5) * (r + 1)]
            for r in range(RANKS)]
    ts = [[s.tensor(a, device=DEV) for a in arrs] for s, arrs in zip(sessions, data)]
    pg.broadcast(ts, root=2)
    for r in range(RANKS):
        np.testing.assert_array_equal(ts[r][0].numpy(), data[2][0])
        np.testing.assert_array_equal(ts[r][1].numpy(), data[2][1])
    # a transposed view (laid out densely on the device first), 2400 bytes a rank: pieces
    # of 4 KiB / 4 = 1 KiB; and a float32 tensor of 4000 bytes
    mats = [rng.standard_normal((15, 20)).astype(np.float64) for _ in range(RANKS)]
    gathered = pg.all_gather([s.tensor(m, device=DEV).T for s, m in zip(sessions, mats)])
    want = np.stack([m.T for m in mats])
    for g in gathered:
        assert tuple(g.shape) == (RANKS, 20, 15) and str(g.device) == DEV
        np.testing.assert_array_equal(g.numpy(), want)
    vecs = [rng.standard_normal(1000).astype(np.float32) for _ in range(RANKS)]
    gathered = pg.all_gather([s.tensor(v, device=DEV) for s, v in zip(sessions, vecs)])
    for g in gathered:
        np.testing.assert_array_equal(g.numpy(), np.stack(vecs))


def test_cuda_group_logs_the_staged_path(daemons, sessions):
    parallel.init_process_group(sessions, device=DEV)
    sessions[0].sync()
    log = daemons[0].log()
    assert f"on {DEV}; collectives staged through host memory over Gloo (NCCL not used" in log
    assert "NCCL collectives" not in log


# ---------------------------------------------------------------- gradients, training

# the digits shards, initial weights and loss of test_parallel's data-parallel run
STEPS, BATCH = 3, 48  # (BATCH as test_parallel's: its helpers slice by it)


@pytest.mark.parametrize("world", [2, 3])
def test_data_parallel_on_cuda_matches_one_daemon(daemons, world):
    """Gradients all-reduced (avg, in 4 KiB pieces: w1's 8 KB gradient spans two) on
    cuda:0 of each daemon; the oracle is one daemon on cuda:0 stepping on the whole
    batch."""
    x, y = _digits(STEPS * BATCH)
    want = _single_run(daemons[0].endpoint, x, y, device=DEV, steps=STEPS)
    got = _data_parallel_run(connect_all(daemons[:world]), x, y, device=DEV, steps=STEPS)
    _check_data_parallel(got, want)


# ---------------------------------------------------------------- typed errors

def test_cuda_group_takes_only_its_device(sessions):
    s0 = sessions[0]
    pg = parallel.init_process_group(sessions, device=DEV)
    g0 = pg.groups[0]
    cpu = s0.tensor(np.ones(2, np.float32), device="cpu:0")
    with pytest.raises(tensordd.BackendMismatchError, match="cuda:0.*cpu:0"):
        g0.all_reduce(cpu)
    with pytest.raises(tensordd.BackendMismatchError):
        g0.all_gather(cpu)
    if "cuda:1" in [str(d) for d in s0.devices()]:
        other = s0.tensor(np.ones(2, np.float32), device="cuda:1")
        with pytest.raises(tensordd.DeviceMismatchError, match="cuda:0.*cuda:1"):
            g0.broadcast(other)
    # none reached the other ranks: the group still works
    ts = [s.tensor(np.full(2, float(r)), device=DEV) for r, s in enumerate(sessions)]
    pg.all_reduce([[t] for t in ts], "sum")
    np.testing.assert_array_equal(ts[1].numpy(), np.full(2, 3.0))


def test_killed_rank_on_cuda_gives_the_others_a_typed_error(hosts, store):
    ds = start(hosts, store, 3)
    try:
        ss = connect_all(ds)
        pg = parallel.init_process_group(ss, device=DEV)
        ts = [s.tensor(np.ones(1 << 16, np.float32), device=DEV) for s in ss]
        pending = threading.Event()

        def rank(r):
            def call():
                pending.set()
                pg.groups[r].all_reduce(ts[r])
            return call

        def killer():
            pending.wait(30)
            ds[2].kill()  # rank 2 dies while ranks 0 and 1 are in the all-reduce

        k = threading.Thread(target=killer, daemon=True)
        k.start()
        res = run_ranks([rank(0), rank(1)])
        k.join(30)
        for e in res:
            assert isinstance(e, tensordd.TimedOutError), e
            assert "process group" in e.message
        for r in (0, 1):
            with pytest.raises(tensordd.TimedOutError, match="broken"):
                pg.groups[r].all_reduce(ts[r])
            # the session and its device go on
            t = ss[r].tensor(np.arange(4.0), device=DEV)
            np.testing.assert_array_equal((t * 2.0).numpy(), np.arange(4.0) * 2)
        for s in ss[:2]:
            s.close()
        for d in ds[:2]:
            assert d.stop() == 0, d.log()
    finally:
        for d in ds:
            d.kill()


@pytest.mark.skipif("--emu-gpus" not in (GPU_ARGS or ""),
                    reason="the emulator's fault injection (TDD_EMU_STICKY_LAUNCH)")
def test_failed_device_copy_is_typed_and_breaks_the_group(hosts, store, monkeypatch):
    """Rank 0's cuda:0 faults (its first kernel launch raises a sticky error), so its copy
    to the host fails inside the collective: rank 0 gets DEVICE_UNAVAILABLE, rank 1 (left
    waiting in Gloo) TIMEOUT, and both groups are broken; the sessions go on."""
    monkeypatch.setenv("TDD_EMU_STICKY_LAUNCH", "1")
    ds = start(hosts, store, 1)
    monkeypatch.delenv("TDD_EMU_STICKY_LAUNCH")
    ds.append(RankDaemon(hosts, 1, [*(GPU_ARGS or "").split(), "--cpu-devices", "1",
                                    "--group-store-dir", store, "--group-timeout", "2",
                                    "--token-file", os.path.join(store, ".token")]))
    try:
        ss = connect_all(ds)
        pg = parallel.init_process_group(ss, device=DEV)
        ts = [s.tensor(np.full(8, r + 1.0, np.float32), device=DEV) for r, s in enumerate(ss)]
        with pytest.raises(tensordd.DeviceError):
            (ts[0] * 2.0).numpy()  # the fault
        res = run_ranks([lambda r=r: pg.groups[r].all_reduce(ts[r]) for r in range(2)])
        assert isinstance(res[0], tensordd.DeviceUnavailableError), res
        assert "process group" in res[0].message and "copy from cuda:0" in res[0].message
        assert isinstance(res[1], tensordd.TimedOutError), res
        for r in range(2):
            with pytest.raises(tensordd.Error, match="broken"):
                pg.groups[r].all_reduce(ts[r])
        # the sessions go on: rank 0 on its cpu, rank 1 on its cuda:0
        np.testing.assert_array_equal((ss[0].tensor(np.arange(3.0)) * 2.0).numpy(),
                                      np.arange(3.0) * 2)
        np.testing.assert_array_equal((ss[1].tensor(np.arange(3.0), device=DEV) * 2.0).numpy(),
                                      np.arange(3.0) * 2)
        for s in ss:
            s.close(raise_errors=False)
        for d in ds:
            assert d.stop() == 0, d.log()
    finally:
        for d in ds:
            d.kill()
