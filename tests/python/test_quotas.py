"""The autodiff graph is memory a client causes, so it is charged to the session's quota
(--session-memory) like tensor storage: a graph the quota cannot hold fails the op that
would grow it with RESOURCE_EXHAUSTED, and the session keeps working once the graph is
dropped. Against a real daemon."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import tensordd
from helpers import require_autodiff

QUOTA = 1 << 20  # 1 MiB


def my_bytes(s) -> int:
    """This session's bytes_in_use as the daemon reports it (one session per daemon here)."""
    (me,) = s.stats()["session_list"]
    return me["bytes_in_use"]


def test_graph_nodes_count_against_the_session_quota(start_daemon):
    d = start_daemon("--session-memory", str(QUOTA))
    with tensordd.connect(d.endpoint, timeout=60) as s:
        require_autodiff(s)
        w = s.tensor(np.ones(4, np.float32), requires_grad=True)
        base = my_bytes(s)
        # A chain whose intermediate handles are dropped as it goes: what stays is the
        # history (nodes and the 16-byte inputs they save). 20,000 such inputs are 320 KB,
        # within the quota; the nodes are what exhausts it.
        y = w
        with pytest.raises(tensordd.ResourceExhaustedError) as info:
            for i in range(20000):
                y = y * 1.0001
                if i % 500 == 499:
                    s.sync()
            s.sync()
        assert info.value.resource == "session memory"
        assert my_bytes(s) <= QUOTA
        # Dropping the chain gives every byte back, and the session works on.
        del y
        gc.collect()
        s.sync()
        assert my_bytes(s) == base
        loss = (w * w).sum()
        g = loss.backward().get(w)
        np.testing.assert_array_equal(g.numpy(), 2 * np.ones(4, np.float32))


def test_graph_memory_is_returned_after_backward_and_release(start_daemon):
    d = start_daemon("--session-memory", str(64 << 20))
    with tensordd.connect(d.endpoint, timeout=60) as s:
        require_autodiff(s)
        x = s.tensor(np.ones((8, 8), np.float32))
        w = s.tensor(np.ones((8, 8), np.float32), requires_grad=True)
        base = my_bytes(s)
        for _ in range(3):
            loss = (x @ w).relu().sum()
            assert my_bytes(s) > base  # outputs and the graph are charged
            grads = loss.backward()
            del loss, grads
            gc.collect()
            s.sync()
            assert my_bytes(s) == base


def test_optimizer_parameter_lists_count_against_the_quota(start_daemon):
    d = start_daemon("--session-memory", str(QUOTA))
    with tensordd.connect(d.endpoint, timeout=60) as s:
        require_autodiff(s)
        # 1000 one-element parameters: 4 KB of storage. Each optimizer over them keeps a
        # parameter list of tens of KB in the daemon, which is what fills the quota.
        params = [s.tensor(np.ones(1, np.float32), requires_grad=True) for _ in range(1000)]
        s.sync()
        base = my_bytes(s)
        opts = []
        with pytest.raises(tensordd.ResourceExhaustedError) as info:
            for _ in range(200):
                opts.append(tensordd.optim.SGD(params, lr=0.1))
                s.sync()
        assert info.value.resource == "session memory"
        assert len(opts) > 1  # the first ones fit
        del opts
        gc.collect()
        s.sync()
        assert my_bytes(s) == base
        grads = (params[0] * 3).sum().backward()
        tensordd.optim.SGD(params[:1], lr=0.5).step(grads)
        np.testing.assert_allclose(params[0].numpy(), [1 - 0.5 * 3])


def test_gradients_entries_are_charged(start_daemon):
    d = start_daemon()
    with tensordd.connect(d.endpoint, timeout=60) as s:
        require_autodiff(s)
        # Zero-size leaves: their gradients hold no bytes of storage, so what the
        # Gradients object costs is its entries, which must show in the account.
        n = 500
        leaves = [s.tensor(np.empty(0, np.float32), requires_grad=True) for _ in range(n)]
        total = leaves[0].sum()
        for leaf in leaves[1:]:
            total = total + leaf.sum()
        s.sync()
        before = my_bytes(s)
        grads = total.backward()
        assert grads.get(leaves[-1]).shape == (0,)
        s.sync()
        assert my_bytes(s) - before >= n * 32
        del grads
        gc.collect()
        s.sync()
        assert my_bytes(s) == before
