"""The autodiff graph is memory a client causes, so it is charged to the session's quota
(--session-memory) like tensor storage: a graph the quota cannot hold fails the op that
would grow it with RESOURCE_EXHAUSTED, and the session keeps working once the graph is
dropped. Against a real daemon."""

from __future__ import annotations

import gc
import struct

import numpy as np
import pytest

import tensordd
from helpers import require_autodiff
from tensordd import tensordd_pb2 as pb
from test_resume import Raw

QUOTA = 1 << 20  # 1 MiB


def my_bytes(s) -> int:
    """This session's bytes_in_use as the daemon reports it (one session per daemon here)."""
    (me,) = s.stats()["session_list"]
    return me["bytes_in_use"]


# Two quotas: where the chain runs out decides whether the failing op's id still had room
# for a placeholder; with none, dropping it (a Release of an id never bound) is answered Ok.
@pytest.mark.parametrize("quota", [QUOTA, 4 * QUOTA])
def test_graph_nodes_count_against_the_session_quota(start_daemon, quota):
    d = start_daemon("--session-memory", str(quota))
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
        assert my_bytes(s) <= quota
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


# ---------------------------------------------------------------- recorded graphs (GraphEnd)

def padded(req, nbytes):
    """req serialised with nbytes of an unknown length-delimited field (number 1000) after
    it: a request the daemon accepts, records and packs again at that size."""
    pad = b"\x00" * nbytes
    n, length = nbytes, b""
    while True:
        length += bytes([(n & 0x7F) | (0x80 if n > 0x7F else 0)])
        n >>= 7
        if not n:
            break
    return req.SerializeToString() + b"\xc2\x3e" + length + pad  # tag: (1000 << 3) | 2


def record(c, first_id, n_requests, pad):
    """GraphBegin, n_requests SetGradMode(True) each padded by pad bytes, GraphEnd(graph=77):
    GraphEnd's answer."""
    c.send(pb.Request(id=first_id, graph_begin=pb.GraphBegin()))
    for k in range(n_requests):
        msg = padded(pb.Request(id=first_id + 1 + k, set_grad_mode=pb.SetGradMode(enabled=True)),
                     pad)
        c.c.sendall(struct.pack("<IIQ", 0x01444454, len(msg), 0) + msg)
    c.send(pb.Request(id=first_id + 1 + n_requests, graph_end=pb.GraphEnd(graph=77)))
    return c.recv()[0]


def session_bytes(c, req_id, sid):
    c.send(pb.Request(id=req_id, stats=pb.Stats()))
    (me,) = [x for x in c.recv()[0].stats.session_list if x.session_id == sid]
    return me.bytes_in_use


def test_a_recorded_graph_is_charged_to_the_session_quota(start_daemon):
    """A graph keeps its requests, packed: that memory is the session's. With a 1 MiB quota,
    a graph of 2 requests of 300 KB is held (and charged: the session's bytes grow by as
    much, and fall back when it is released); one of 4 does not fit, and its GraphEnd is
    RESOURCE_EXHAUSTED, however many times it is tried."""
    d = start_daemon("--session-memory", str(QUOTA))
    c = Raw(d.port)
    sid = c.hello().hello.session_id
    base = session_bytes(c, 2, sid)
    ans = record(c, 10, 2, 300_000)
    assert ans.WhichOneof("body") == "ok", ans
    held = session_bytes(c, 20, sid)
    assert held - base >= 600_000, (base, held)
    c.send(pb.Request(id=21, release=pb.Release(handles=[77])))
    c.send(pb.Request(id=22, sync=pb.Sync()))
    assert c.recv()[0].WhichOneof("body") == "ok"
    after = session_bytes(c, 23, sid)  # (the session remembers the graph's id: 64 bytes)
    assert after <= held - 600_000, (base, held, after)
    for attempt in range(3):
        first = 100 * (attempt + 1)
        ans = record(c, first, 4, 300_000)
        assert ans.WhichOneof("body") == "error", ans
        assert ans.error.code == pb.RESOURCE_EXHAUSTED, ans
        assert "session memory" in ans.error.message, ans
        assert session_bytes(c, first + 50, sid) == after
    c.send(pb.Request(id=999, goodbye=pb.Goodbye()))
    assert c.recv()[0].id == 999
    c.close()
