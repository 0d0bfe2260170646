"""Graphs: a training step recorded once (GraphBegin .. GraphEnd) and replayed.

The oracle is the same requests sent one by one: a replay must give bit-identical
parameters, and a failed replay must poison what the requests would have and raise
the same first error.
"""

from __future__ import annotations

import socket
import time

import numpy as np
import pytest

import tensordd

STEPS = 6


def data(seed=0):
    rng = np.random.default_rng(seed)
    xs = [rng.standard_normal((16, 8)).astype(np.float32) for _ in range(STEPS)]
    ys = [rng.integers(0, 4, 16).astype(np.int64) for _ in range(STEPS)]
    init = [(rng.standard_normal((8, 12)) * 0.3).astype(np.float32), np.zeros(12, np.float32),
            (rng.standard_normal((12, 4)) * 0.3).astype(np.float32), np.zeros(4, np.float32)]
    return xs, ys, init


def model(s, init, opt_name):
    params = [s.tensor(a, requires_grad=True) for a in init]
    opt = getattr(tensordd.optim, opt_name)(params, lr=0.05)
    return params, opt


def step(s, params, opt, x, y):
    w1, b1, w2, b2 = params
    loss = s.op("cross_entropy", (x @ w1 + b1).relu() @ w2 + b2, y)
    opt.step(loss.backward())
    return loss


@pytest.mark.parametrize("opt_name", ["SGD", "Adam"])
def test_replay_is_bit_identical_to_requests_one_by_one(session, opt_name):
    xs, ys, init = data()
    params, opt = model(session, init, opt_name)
    for x, y in zip(xs, ys):
        loss_a = step(session, params, opt, session.tensor(x), session.tensor(y))
    want = [p.numpy() for p in params]
    want_loss = loss_a.item()

    params, opt = model(session, init, opt_name)
    x0, y0 = session.tensor(xs[0]), session.tensor(ys[0])
    with session.capture(x0, y0) as g:
        loss_b = step(session, params, opt, x0, y0)  # runs as it records: step 0
    for x, y in zip(xs[1:], ys[1:]):
        g.replay(x, y)
    got = [p.numpy() for p in params]
    for w, v in zip(want, got):
        np.testing.assert_array_equal(w, v)
    assert loss_b.item() == want_loss  # the latest replay's loss


def test_replay_with_tensors_and_bounded_handles(session):
    xs, ys, init = data(1)
    params, opt = model(session, init, "SGD")
    x0, y0 = session.tensor(xs[0]), session.tensor(ys[0])
    with session.capture(x0, y0) as g:
        loss = step(session, params, opt, x0, y0)
    session.sync()
    base = session.stats()["handles"]
    for i in range(20):
        g.replay(session.tensor(xs[i % STEPS]), session.tensor(ys[i % STEPS]))
    loss.item()
    session.flush()
    session.sync()
    assert session.stats()["handles"] <= base + 4  # replays rebind, they do not pile up


def run_bad_labels(s, replay):
    """A step whose labels are out of range: cross_entropy fails on the device."""
    xs, ys, init = data(2)
    params, opt = model(s, init, "SGD")
    before = [p.numpy() for p in params]
    bad = np.full(16, 9, np.int64)  # 4 classes
    if replay:
        x0, y0 = s.tensor(xs[0]), s.tensor(ys[0])
        with s.capture(x0, y0) as g:
            loss = step(s, params, opt, x0, y0)
        s.sync()
        before = [p.numpy() for p in params]
        g.replay(xs[1], bad)
        with pytest.raises(tensordd.Error) as first:
            s.sync()
    else:  # backward's round trip raises the error the step's forward left pending
        w1, b1, w2, b2 = params
        loss = s.op("cross_entropy", (s.tensor(xs[1]) @ w1 + b1).relu() @ w2 + b2,
                    s.tensor(bad))
        with pytest.raises(tensordd.Error) as first:
            opt.step(loss.backward())
            s.sync()
    with pytest.raises(tensordd.Error) as poisoned:
        loss.item()
    after = [p.numpy() for p in params]
    return first.value, poisoned.value, before, after


def test_failed_replay_poisons_what_the_requests_would(daemon):
    outcomes = []
    for replay in (False, True):
        with tensordd.connect(daemon.endpoint, timeout=60) as s:
            outcomes.append(run_bad_labels(s, replay))
    (e1, p1, b1, a1), (e2, p2, b2, a2) = outcomes
    assert e1.code == e2.code, (e1, e2)
    assert p1.code == p2.code == "POISONED", (p1, p2)
    for b, a in zip(b1 + b2, a1 + a2):
        np.testing.assert_array_equal(b, a)  # the failed step updated nothing, both ways


def test_upload_inside_capture_is_refused_and_session_lives(session):
    x0 = session.tensor(np.ones((2, 2), np.float32))
    with pytest.raises(tensordd.Error) as e:
        with session.capture(x0):
            (x0 * 2.0 + session.tensor(np.ones(2, np.float32))).relu()
    assert e.value.code == "INVALID_ARGUMENT"
    assert "upload" in str(e.value)
    np.testing.assert_array_equal((x0 + 1.0).numpy(), np.full((2, 2), 2.0, np.float32))


def test_replay_checks_its_inputs(session):
    x0 = session.tensor(np.ones((2, 3), np.float32))
    with session.capture(x0) as g:
        out = x0 * 3.0
    with pytest.raises(ValueError):
        g.replay(np.ones((3, 2), np.float32))
    g.replay(session.tensor(np.ones((2, 3), np.float64)))  # dtype: a typed daemon error
    with pytest.raises(tensordd.Error) as e:
        session.sync()
    assert e.value.code == "DTYPE_MISMATCH"
    assert (e.value.target, e.value.grad) == ("float32", "float64")  # recorded, offered
    g.replay(session.tensor(np.ones((2, 3), np.float32), device="cpu:1"))
    with pytest.raises(tensordd.Error) as e:
        session.sync()
    assert e.value.code == "DEVICE_MISMATCH"
    assert (str(e.value.target), str(e.value.grad)) == ("cpu:0", "cpu:1")
    g.replay(np.full((2, 3), 2.0, np.float32))
    np.testing.assert_array_equal(out.numpy(), np.full((2, 3), 6.0, np.float32))


def test_goodbye_while_recording_ends_the_session(daemon):
    s = tensordd.connect(daemon.endpoint, timeout=60)
    x0 = s.tensor(np.ones(3, np.float32))
    g = s.capture(x0)
    g.__enter__()
    x0 * 2.0
    sid = s.session_id
    s.close()  # Goodbye: answered and the connection ends, recording and all
    assert s.closed
    # (the daemon is shared by the whole run: look for this session, not at the count)
    with tensordd.connect(daemon.endpoint, timeout=60) as o:
        deadline = time.monotonic() + 10
        while sid in live_ids(o) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert sid not in live_ids(o)


def live_ids(o):
    return {x["session_id"] for x in o.stats()["session_list"]}


# ---------------------------------------------------------------- replays share the loop

def raw_record(c, pb, body, graph):
    """On raw connection c: GraphBegin, the frames in body, GraphEnd(graph); its answer."""
    c.send(pb.Request(id=2, graph_begin=pb.GraphBegin()))
    c.c.sendall(body)
    c.send(pb.Request(id=3, graph_end=pb.GraphEnd(graph=graph)))
    return c.recv()[0]


def test_pipelined_replays_leave_the_loop_to_other_clients(start_daemon):
    """A graph of 150,000 small requests replayed by 10 pipelined 12-byte frames: the
    replays run a slice per turn of the loop, so a second client's Hello and Sync are
    answered while the storm is still in progress (its trailing Sync unanswered)."""
    from test_resume import Raw, frame_of
    from tensordd import tensordd_pb2 as pb

    d = start_daemon("--cpu-devices", "1")
    a = Raw(d.port)
    a.hello()
    one = frame_of(pb.Request(id=3, set_grad_mode=pb.SetGradMode(enabled=True)))
    assert raw_record(a, pb, one * 150_000, graph=1).WhichOneof("body") == "ok"
    a.c.sendall(b"".join(frame_of(pb.Request(id=10 + k, replay=pb.Replay(graph=1)))
                         for k in range(10)) + frame_of(pb.Request(id=99, sync=pb.Sync())))
    b = Raw(d.port)
    assert b.hello().WhichOneof("body") == "hello"
    b.send(pb.Request(id=2, sync=pb.Sync()))
    assert b.recv()[0].WhichOneof("body") == "ok"
    # the storm is not over: nothing has come back to a yet
    a.c.setblocking(False)
    try:
        early = a.c.recv(16)
    except BlockingIOError:
        early = None
    a.c.setblocking(True)
    a.c.settimeout(300)
    assert early is None, "the replays ended before another client was served"
    r = a.recv()[0]
    assert r.id == 99 and r.WhichOneof("body") == "ok", r
    b.close()
    a.close()


def test_a_replay_queues_no_more_than_max_inflight(start_daemon):
    """A graph of 600 sums of a 1M-element tensor, each released at once, replayed: the
    work queued at any time stays within --max-inflight, as a client's pipelined requests
    would (a replay waits for room rather than queueing its whole graph at once)."""
    from test_resume import Raw, frame_of
    from tensordd import tensordd_pb2 as pb

    d = start_daemon("--cpu-devices", "1", "--max-inflight", "8", "--inline-work", "0")
    a = Raw(d.port)
    a.hello()
    x = np.ones(1 << 20, np.float32)
    a.send(pb.Request(id=1, upload=pb.Upload(handle=1, dtype=pb.DTYPE_F32, shape=x.shape)),
           x.tobytes())
    body = b"".join(frame_of(pb.Request(id=4, op=pb.Op(op="sum", inputs=[1], outputs=[100 + k])))
                    + frame_of(pb.Request(id=5, release=pb.Release(handles=[100 + k])))
                    for k in range(600))
    assert raw_record(a, pb, body, graph=2).WhichOneof("body") == "ok"
    b = Raw(d.port)
    b.hello()
    a.send(pb.Request(id=10, replay=pb.Replay(graph=2)))
    a.send(pb.Request(id=11, sync=pb.Sync()))
    pending = []
    a.c.setblocking(False)
    deadline = time.monotonic() + 300
    for k in range(10**7):  # Stats from b until a's Sync is answered (bounded)
        b.send(pb.Request(id=20 + k, stats=pb.Stats()))
        pending.append(b.recv()[0].stats.tasks_pending)
        try:
            if a.c.recv(1, socket.MSG_PEEK):
                break
        except BlockingIOError:
            pass
        assert time.monotonic() < deadline, "the replay did not end"
        time.sleep(0.001)
    a.c.setblocking(True)
    r = a.recv()[0]
    assert r.id == 11 and r.WhichOneof("body") == "ok", r
    assert max(pending) <= 8, pending
    b.close()
    a.close()


def test_inputs_named_at_graph_end_carry_state_between_replays(session):
    # A recurrence: the state is a tensor made before the block and named as an input at
    # GraphEnd; each replay is given the previous replay's output (an id the graph binds
    # again) in its place. The oracle is numpy's same recurrence.
    rng = np.random.default_rng(3)
    a = rng.standard_normal((3, 4)).astype(np.float32)
    xs = [rng.standard_normal((3, 4)).astype(np.float32) for _ in range(5)]
    state = session.tensor(a)
    x0 = session.tensor(xs[0])
    with session.capture(x0) as g:
        out = state * 0.5 + x0
        g.add_inputs(state)
    want = a * np.float32(0.5) + xs[0]
    for x in xs[1:]:
        g.replay(x, out)  # the state's slot takes the latest output
        want = want * np.float32(0.5) + x
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(state.numpy(), a)  # the recorded input is left as it was
    with pytest.raises(TypeError):
        g.replay(xs[0])  # two inputs now: x0's, then the state's


def test_graph_end_inputs_are_checked(session):
    x0 = session.tensor(np.ones((2, 2), np.float32))
    w = session.tensor(np.ones((2, 2), np.float32))
    with pytest.raises(tensordd.Error) as e:  # bound by the graph itself
        with session.capture(x0) as g:
            y = x0 @ w
            g.add_inputs(y)
    assert e.value.code == "INVALID_ARGUMENT" and "bound by the graph" in str(e.value)
    with pytest.raises(tensordd.Error) as e:  # named twice
        with session.capture(x0) as g:
            y = x0 @ w
            g.add_inputs(w, x0)
    assert e.value.code == "INVALID_ARGUMENT" and "input of the graph already" in str(e.value)
    with session.capture(x0) as g:
        y = x0 @ w
        g.add_inputs(w)
    g.replay(x0, session.tensor(np.ones((2, 3), np.float32)))  # the late input's shape
    with pytest.raises(tensordd.Error) as e:
        session.sync()
    assert e.value.code == "SHAPE_MISMATCH"
    g.replay(x0, session.tensor(np.full((2, 2), 2.0, np.float32)))
    np.testing.assert_array_equal(y.numpy(), np.full((2, 2), 4.0, np.float32))


def test_a_replayed_op_may_read_the_id_it_binds_again(session):
    # The state's slot is given the graph's own output, and the one recorded op both reads
    # it (through the slot) and binds it again: it reads the previous replay's value.
    state = session.tensor(np.zeros(4, np.float32))
    x0 = session.tensor(np.ones(4, np.float32))
    with session.capture(x0) as g:
        total = state + x0
        g.add_inputs(state)
    for i in range(2, 6):
        g.replay(np.full(4, float(i), np.float32), total)
    np.testing.assert_array_equal(total.numpy(), np.full(4, 1.0 + 2 + 3 + 4 + 5, np.float32))
    session.sync()
    handles = session.stats()["handles"]
    g.replay(np.ones(4, np.float32), total)
    session.sync()
    assert session.stats()["handles"] <= handles + 1  # the old value went with its binding
