"""Pipelined training steps (Backward.pipelined, OptimizerStep.pipelined):
``loss.backward(); opt.step(); loss.item()`` is one write and one read, gives results
bit-identical to the synchronous path (each request waiting for its answer), and a
failure poisons exactly what the synchronous path would have, reported at the next
synchronising call with the first-error rule. Oracle for the values: torch 1.13 on
the CPU (float32, rtol 1e-4 / atol 1e-5 after a few steps); the two tensordd paths
must agree bit for bit.
"""

import numpy as np
import pytest
import torch

import tensordd

STEPS = 6


def data(seed=0):
    rng = np.random.default_rng(seed)
    xs = [rng.standard_normal((16, 8)).astype(np.float32) for _ in range(STEPS)]
    ys = [rng.integers(0, 4, 16).astype(np.int64) for _ in range(STEPS)]
    init = [(rng.standard_normal((8, 12)) * 0.3).astype(np.float32),
            np.zeros(12, np.float32),
            (rng.standard_normal((12, 4)) * 0.3).astype(np.float32),
            np.zeros(4, np.float32)]
    return xs, ys, init


def make_opt(kind, params):
    if kind == "adam":
        return tensordd.optim.Adam(params, lr=1e-2)
    return tensordd.optim.SGD(params, lr=0.1, momentum=0.9)


def train(s, kind, pipelined, torch_idiom):
    """Losses and final parameters of STEPS steps, each ending with one loss.item()."""
    s.pipeline_steps = pipelined
    xs, ys, init = data()
    params = [s.tensor(a, requires_grad=True) for a in init]
    opt = make_opt(kind, params)
    w1, b1, w2, b2 = params
    losses = []
    for x, y in zip(xs, ys):
        loss = s.op("cross_entropy", (s.tensor(x) @ w1 + b1).relu() @ w2 + b2, s.tensor(y))
        if torch_idiom:
            opt.zero_grad()
            loss.backward()
            opt.step()
        else:
            opt.step(loss.backward())
        losses.append(loss.item())
    return np.array(losses, np.float32), [p.numpy() for p in params]


def torch_train(kind):
    xs, ys, init = data()
    ps = [torch.tensor(a, requires_grad=True) for a in init]
    opt = (torch.optim.Adam(ps, lr=1e-2) if kind == "adam"
           else torch.optim.SGD(ps, lr=0.1, momentum=0.9))
    losses = []
    for x, y in zip(xs, ys):
        h = (torch.from_numpy(x) @ ps[0] + ps[1]).relu() @ ps[2] + ps[3]
        loss = torch.nn.functional.cross_entropy(h, torch.from_numpy(y))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return np.array(losses, np.float32), [p.detach().numpy() for p in ps]


@pytest.mark.parametrize("kind", ["adam", "sgd"])
@pytest.mark.parametrize("torch_idiom", [False, True])
def test_pipelined_step_is_bit_identical_to_synchronous(daemon, kind, torch_idiom):
    runs = []
    for pipelined in (False, True):
        with tensordd.connect(daemon.endpoint, timeout=60) as s:
            runs.append(train(s, kind, pipelined, torch_idiom))
    (l_sync, p_sync), (l_pipe, p_pipe) = runs
    assert l_sync.tobytes() == l_pipe.tobytes()
    for a, b in zip(p_sync, p_pipe):
        assert a.tobytes() == b.tobytes()
    l_ref, p_ref = torch_train(kind)
    np.testing.assert_allclose(l_pipe, l_ref, rtol=1e-4, atol=1e-5)
    for a, b in zip(p_pipe, p_ref):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


class _CountingReads:
    """Counts the replies the session reads (a frame head per reply)."""

    def __init__(self, conn):
        self.conn, self.reads = conn, 0
        self._orig = conn.read_frame_head

    def __enter__(self):
        def read():
            self.reads += 1
            return self._orig()
        self.conn.read_frame_head = read
        return self

    def __exit__(self, *exc):
        del self.conn.read_frame_head


def test_a_pipelined_step_reads_one_reply(session):
    xs, ys, init = data()
    params = [session.tensor(a, requires_grad=True) for a in init]
    opt = tensordd.optim.Adam(params, lr=1e-2)
    w1, b1, w2, b2 = params
    session.list_ops()  # the op table op() consults, asked once per session: not a step's
    session.sync()
    with _CountingReads(session._conn) as c:
        for x, y in zip(xs, ys):
            loss = session.op("cross_entropy", (session.tensor(x) @ w1 + b1).relu() @ w2 + b2,
                              session.tensor(y))
            opt.zero_grad()
            loss.backward()
            opt.step()
            loss.item()
    assert c.reads == STEPS  # the loss only; backward and step are not answered


def run_failing_backward(s, pipelined):
    """A backward that fails in its checks (a loss of 16 elements and no grad_output):
    the error, then the parameters before and after the step that followed it."""
    s.pipeline_steps = pipelined
    xs, ys, init = data(1)
    params = [s.tensor(a, requires_grad=True) for a in init]
    opt = make_opt("adam", params)
    w1, b1, w2, b2 = params
    before = [p.numpy() for p in params]
    per_row = ((s.tensor(xs[0]) @ w1 + b1).relu() @ w2 + b2).sum(1)  # 16 elements
    with pytest.raises(tensordd.Error) as e:
        grads = per_row.backward()
        opt.step(grads)
        s.sync()
    after = [p.numpy() for p in params]
    return e.value, before, after


def test_a_failed_backward_poisons_the_step_as_the_synchronous_path(daemon):
    outcomes = []
    for pipelined in (False, True):
        with tensordd.connect(daemon.endpoint, timeout=60) as s:
            outcomes.append(run_failing_backward(s, pipelined))
            s.sync()  # the error was reported once: the session is clean again
    (e1, b1, a1), (e2, b2, a2) = outcomes
    assert e1.code == e2.code == "INVALID_ARGUMENT"
    assert "grad_output" in str(e2)
    for b, a in zip(b2, a2):
        assert b.tobytes() == a.tobytes()  # the step did not run
    for x, y in zip(a1, a2):
        assert x.tobytes() == y.tobytes()


def test_first_error_wins_over_the_steps_own(session):
    """A forward that fails on the device (labels out of range): backward and step
    never run, the parameters are unchanged, and the next synchronising call reports
    the forward's own error (not a POISONED of the step); the loss stays poisoned."""
    xs, ys, init = data(2)
    params = [session.tensor(a, requires_grad=True) for a in init]
    opt = make_opt("sgd", params)
    w1, b1, w2, b2 = params
    before = [p.numpy() for p in params]
    bad = np.full(16, 9, np.int64)  # 4 classes
    loss = session.op("cross_entropy", (session.tensor(xs[0]) @ w1 + b1).relu() @ w2 + b2,
                      session.tensor(bad))
    opt.zero_grad()
    loss.backward()
    opt.step()
    with pytest.raises(tensordd.Error) as first:
        loss.item()
    assert first.value.code != "POISONED"
    assert "cross_entropy" in str(first.value)
    with pytest.raises(tensordd.Error) as again:
        loss.item()
    assert again.value.code == "POISONED"
    for b, p in zip(before, params):
        assert b.tobytes() == p.numpy().tobytes()
    # the session trains on after the error was reported
    opt.zero_grad()
    loss = session.op("cross_entropy", (session.tensor(xs[1]) @ w1 + b1).relu() @ w2 + b2,
                      session.tensor(ys[1]))
    loss.backward()
    opt.step()
    assert np.isfinite(loss.item())
    assert any(b.tobytes() != p.numpy().tobytes() for b, p in zip(before, params))


def test_steps_are_pipelined_only_with_a_daemon_that_names_it(session, fake):
    """A daemon from before pipelined steps would answer them, and the client would read
    those answers as the next requests': HelloReply.features gates the form."""
    assert {"pipelined_steps", "memfd", "transfer", "create_graph"} <= session.features
    assert session.pipeline_steps
    srv = fake()  # answers Hello as a version-1 daemon: no features
    s = tensordd.connect(srv.endpoint, timeout=10)
    try:
        assert s.features == frozenset() and not s.pipeline_steps
        w = s.tensor(np.ones(3, np.float32), requires_grad=True)
        loss = w.sum()
        try:
            loss.backward()
        except tensordd.Error:
            pass  # the fake's answers are not a real Gradients; the form sent is the point
        sent = [r for r, _ in srv.requests if r.WhichOneof("body") == "backward"]
        assert sent and not any(r.backward.pipelined for r in sent)
    finally:
        s.close(raise_errors=False)
