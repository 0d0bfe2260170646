"""Kernels' value checks on cuda:0 (an index or class out of range, an integer power that
cannot be taken) read at the next synchronising request rather than after each kernel:
no stream synchronisation per index or loss op, the same INVALID_ARGUMENT naming the op,
told by the next Sync or download, and the session goes on.

Runs only when TDD_GPU_ARGS is set (see gpusuite.py). On the emulated build the daemon's
host waits are counted from the emulator's profile (TDD_EMU_PROFILE: a "sync" line per
cudaStreamSynchronize)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import tensordd

from gpusuite import GPU_ARGS, only_with_gpu, profiled_fixtures

pytestmark = only_with_gpu
EMU = GPU_ARGS is not None and "--emu-gpus" in GPU_ARGS
torch = pytest.importorskip("torch")


daemon, s = profiled_fixtures("checks")


def host_waits(daemon):
    """The daemon's host waits on its devices so far (emulated build), by kind."""
    n = {}
    if not os.path.exists(daemon.profile):
        return n
    with open(daemon.profile) as f:
        for line in f:
            if '"sync"' in line:
                rec = json.loads(line)
                n[rec["sync"]] = n.get(rec["sync"], 0) + 1
    return n


def total(waits):
    return sum(waits.values())


X = np.arange(12, dtype=np.float32).reshape(3, 4)
GOOD = np.array([[0, 3, 1, 2], [1, 0, 0, 3], [2, 2, 1, 0]], np.int64)
BAD = np.array([[0, 9, 1, 2], [1, 0, 0, 3], [2, 2, 1, 0]], np.int64)


def test_index_ops_issue_without_a_sync_and_sync_tells_the_error(daemon, s):
    x = s.tensor(X, device="cuda:0")
    good = s.tensor(GOOD, device="cuda:0")
    bad = s.tensor(BAD, device="cuda:0")
    labels = s.tensor(np.array([0, 1, 3], np.int64), device="cuda:0")
    s.sync()  # the uploads are done; from here on only ops are issued
    before = host_waits(daemon)
    ys = [s.op("gather", x, good, dim=1) for _ in range(6)]
    ys += [s.op("index_select", x, good[0], dim=1) for _ in range(2)]
    ys += [s.op("cross_entropy", x, labels) for _ in range(2)]
    ys.append(s.op("gather", x, bad, dim=1))
    with pytest.raises(tensordd.InvalidArgumentError) as info:
        s.sync()
    assert "gather" in str(info.value) and "cuda:0" in str(info.value)
    if EMU:  # eleven checking ops, one host wait: the Sync's
        waits = host_waits(daemon)
        assert total(waits) - total(before) == 1, (before, waits)
    s.sync()  # told once
    # the session goes on: the ops before the bad one hold torch's values
    want = torch.gather(torch.from_numpy(X), 1, torch.from_numpy(GOOD)).numpy()
    np.testing.assert_array_equal(ys[0].numpy(), want)
    ce = torch.nn.functional.cross_entropy(torch.from_numpy(X), torch.tensor([0, 1, 3]))
    np.testing.assert_allclose(ys[8].item(), ce.item(), rtol=1e-6)


def test_a_download_tells_the_error_of_an_earlier_op(s):
    x = s.tensor(X, device="cuda:0")
    bad = s.tensor(BAD, device="cuda:0")
    y = s.op("gather", x, bad, dim=1)
    z = x * 2  # a later op, fine in itself
    with pytest.raises(tensordd.InvalidArgumentError) as info:
        z.numpy()  # the first synchronising request after the gather
    assert "gather" in str(info.value)
    del y
    np.testing.assert_array_equal(z.numpy(), X * 2)  # told once; z itself is right
    good = s.tensor(GOOD, device="cuda:0")
    want = torch.gather(torch.from_numpy(X), 1, torch.from_numpy(GOOD)).numpy()
    np.testing.assert_array_equal(s.op("gather", x, good, dim=1).numpy(), want)


def test_a_class_out_of_range_is_told_by_the_loss_item(s):
    x = s.tensor(X, device="cuda:0")
    loss = s.op("cross_entropy", x, s.tensor(np.array([0, 7, 1], np.int64), device="cuda:0"))
    with pytest.raises(tensordd.InvalidArgumentError) as info:
        loss.item()
    assert "cross_entropy" in str(info.value)
    ok = s.op("nll_loss", x, s.tensor(np.array([0, 1, 3], np.int64), device="cuda:0"))
    want = torch.nn.functional.nll_loss(torch.from_numpy(X), torch.tensor([0, 1, 3]))
    np.testing.assert_allclose(ok.item(), want.item(), rtol=1e-6)


def test_another_sessions_error_is_not_told_here(daemon, s):
    other = tensordd.connect(daemon.endpoint, timeout=120)
    try:
        x = other.tensor(X, device="cuda:0")
        other.op("gather", x, other.tensor(BAD, device="cuda:0"), dim=1)
        mine = s.tensor(X, device="cuda:0")
        np.testing.assert_array_equal((mine + 1).numpy(), X + 1)
        s.sync()
        with pytest.raises(tensordd.InvalidArgumentError):
            other.sync()
    finally:
        other.close(raise_errors=False)


def test_integer_power_refused_on_the_device_is_told_at_sync(s):
    a = s.tensor(np.array([2, 3, 4], np.int64), device="cuda:0")
    e = s.tensor(np.array([1, -1, 2], np.int64), device="cuda:0")
    a.pow(e)
    with pytest.raises(tensordd.InvalidArgumentError) as info:
        s.sync()
    assert "pow" in str(info.value)
    np.testing.assert_array_equal(a.pow(s.tensor(np.array([1, 0, 2], np.int64),
                                                 device="cuda:0")).numpy(), [2, 1, 16])
