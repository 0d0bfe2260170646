"""Fair devices: chunked kernels and per-session queues on a lane.

A cpu/ref kernel whose output has more than --chunk-elems elements (matmul, bmm,
linear, conv2d, elementwise) runs in pieces, and the lane runs other sessions'
work between pieces. Every case here runs on a daemon with chunking off and on
daemons with piece sizes that divide nothing evenly. An elementwise op computes each
element alone, and the reference backend sums each element of a GEMM or conv in one
loop whatever the rows around it: their pieces must give the very same bytes as the
whole kernel. A BLAS may sum an element in an order that depends on the call's shape
(OpenBLAS's Haswell kernels do), so on cpu:0 a GEMM or conv in pieces is held to numpy
and torch within float32 tolerance, as every case is (so that "equal" is not "equally
wrong"); that its pieces never depend on the load is test_determinism.py's. A daemon
that skipped the pieces after the first fails every case but the bias gradients
(reductions, never split).

Ordering, not time: with --device-lanes 1 (every session on one worker) and
--inline-work 0 (every op through the worker), session B's small op is answered
while session A's earlier work is still pending, which a single FIFO queue per
lane could never do.
"""

from __future__ import annotations

import numpy as np
import pytest

import tensordd
from tensordd.session import _Call

torch = pytest.importorskip("torch")

CHUNKS = ("7", "100", "333")  # piece sizes (output elements); 0 = whole kernels
DEVICES = ("cpu:0", "ref:0")
RTOL, ATOL = 1e-4, 1e-4  # float32 against numpy/torch


def randf(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def elementwise_cases(s, dev, rng):
    a, b = randf(rng, 37, 41), randf(rng, 37, 41)
    row = randf(rng, 41)
    A, B, R = (s.tensor(v, device=dev) for v in (a, b, row))
    cond = s.tensor(a > 0, device=dev)
    return {
        "add_bcast": ((A + R).numpy(), a + row),
        "mul": ((A * B).numpy(), a * b),
        "sub_scalar": ((A - 2.5).numpy(), a - np.float32(2.5)),
        "exp": (A.exp().numpy(), np.exp(a)),
        "tanh": (A.tanh().numpy(), np.tanh(a)),
        "relu": (A.relu().numpy(), np.maximum(a, 0)),
        "where": (s.op("where", cond, A, B).numpy(), np.where(a > 0, a, b)),
        "transposed": ((A.transpose(0, 1) + B.transpose(0, 1)).numpy(), (a + b).T),
    }


ELEMENTWISE = ("add_bcast", "mul", "sub_scalar", "exp", "tanh", "relu", "where", "transposed")


def gemm_cases(s, dev, rng):
    x, w = randf(rng, 37, 29), randf(rng, 29, 41)
    xb, wb = randf(rng, 3, 13, 9), randf(rng, 9, 11)
    x1, w4 = randf(rng, 1, 13, 9), randf(rng, 4, 9, 11)
    p, q = randf(rng, 5, 17, 8), randf(rng, 5, 8, 6)
    m1 = randf(rng, 1, 31, 16)
    lx, lw, lb = randf(rng, 23, 16), randf(rng, 12, 16), randf(rng, 12)
    lx3 = randf(rng, 3, 7, 16)
    d64a, d64b = rng.standard_normal((19, 7)), rng.standard_normal((7, 23))
    # on its 64-tile grid, and large enough for several 64-row pieces on cpu:0
    tx, tw = randf(rng, 1088, 128), randf(rng, 128, 64)
    tp, tq = randf(rng, 20, 64, 64), randf(rng, 20, 64, 128)
    tlx, tlw, tlb = randf(rng, 1088, 64), randf(rng, 128, 64), randf(rng, 128)
    dtx, dtw = rng.standard_normal((1088, 64)), rng.standard_normal((64, 128))
    T = lambda v: s.tensor(v, device=dev)  # noqa: E731
    lin = lambda xx: xx @ lw.T + lb  # noqa: E731
    return {
        "matmul": ((T(x) @ T(w)).numpy(), x @ w),
        "matmul_batch_shared_b": ((T(xb) @ T(wb)).numpy(), xb @ wb),
        "matmul_bcast_a": ((T(x1) @ T(w4)).numpy(), x1 @ w4),
        "matmul_lead_one": ((T(m1) @ T(lw.T.copy())).numpy(), m1 @ lw.T),
        "bmm": (s.op("bmm", T(p), T(q)).numpy(), p @ q),
        "linear": (s.op("linear", T(lx), T(lw), T(lb)).numpy(), lin(lx)),
        "linear_3d": (s.op("linear", T(lx3), T(lw), T(lb)).numpy(), lin(lx3)),
        "matmul_f64": ((T(d64a) @ T(d64b)).numpy(), d64a @ d64b),
        "matmul_tiled": ((T(tx) @ T(tw)).numpy(), tx @ tw),
        "matmul_tiled_t": ((T(tx).transpose(0, 1).transpose(0, 1) @ T(tw.T.copy()).transpose(0, 1))
                           .numpy(), tx @ tw),
        "bmm_tiled": (s.op("bmm", T(tp), T(tq)).numpy(), tp @ tq),
        "linear_tiled": (s.op("linear", T(tlx), T(tlw), T(tlb)).numpy(), tlx @ tlw.T + tlb),
        "matmul_tiled_f64": ((T(dtx) @ T(dtw)).numpy(), dtx @ dtw),
    }


def conv_cases(s, dev, rng):
    out = conv_case(s, dev, rng, "conv2d", (6, 3, 9, 9), (4, 3, 3, 3))
    # channels, kernel and image on OpenBLAS's 64-tile grid
    out.update(conv_case(s, dev, rng, "conv2d_tiled", (18, 64, 8, 8), (64, 64, 3, 3)))
    return out


def conv_case(s, dev, rng, name, xshape, wshape):
    x, w, b = randf(rng, *xshape), randf(rng, *wshape), randf(rng, wshape[0])
    go = randf(rng, xshape[0], wshape[0], xshape[2], xshape[3])
    X = s.tensor(x, device=dev, requires_grad=True)
    W = s.tensor(w, device=dev, requires_grad=True)
    Bb = s.tensor(b, device=dev, requires_grad=True)
    y = s.op("conv2d", X, W, Bb, padding=1)
    g = y.backward(grad=s.tensor(go, device=dev))
    tx, tw, tb = (torch.tensor(v, requires_grad=True) for v in (x, w, b))
    ty = torch.nn.functional.conv2d(tx, tw, tb, padding=1)
    ty.backward(torch.tensor(go))
    return {
        name: (y.numpy(), ty.detach().numpy()),
        name + "_grad_x": (g.get(X).numpy(), tx.grad.numpy()),
        name + "_grad_w": (g.get(W).numpy(), tw.grad.numpy()),
        name + "_grad_b": (g.get(Bb).numpy(), tb.grad.numpy()),
    }


def mlp_grad_cases(s, dev, rng):
    """matmul and linear backward through autograd (their grads are matmuls)."""
    x, w1, w2 = randf(rng, 33, 20), randf(rng, 20, 27), randf(rng, 27, 5)
    W1 = s.tensor(w1, device=dev, requires_grad=True)
    W2 = s.tensor(w2, device=dev, requires_grad=True)
    loss = ((s.tensor(x, device=dev) @ W1).relu() @ W2).sum()
    g = loss.backward()
    t1, t2 = torch.tensor(w1, requires_grad=True), torch.tensor(w2, requires_grad=True)
    ((torch.tensor(x) @ t1).relu() @ t2).sum().backward()
    return {"mlp_grad_w1": (g.get(W1).numpy(), t1.grad.numpy()),
            "mlp_grad_w2": (g.get(W2).numpy(), t2.grad.numpy())}


def run_all(endpoint, dev):
    s = tensordd.connect(endpoint, timeout=120)
    try:
        out = {}
        for make in (elementwise_cases, gemm_cases, conv_cases, mlp_grad_cases):
            out.update(make(s, dev, np.random.default_rng(11)))
        return out
    finally:
        s.close(raise_errors=False)


@pytest.fixture(scope="module")
def results():
    """{chunk: {device: {case: (daemon result, oracle)}}}, one daemon per piece size."""
    from conftest import Daemon

    res = {}
    for chunk in ("0",) + CHUNKS:
        d = Daemon("--chunk-elems", chunk, "--inline-work", "0", "--device-lanes", "1")
        try:
            res[chunk] = {dev: run_all(d.endpoint, dev) for dev in DEVICES}
        finally:
            d.kill()
    return res


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("chunk", CHUNKS)
def test_exact_kernels_in_pieces_are_bit_identical(results, chunk, dev):
    """Elementwise ops everywhere, every kernel on ref:0 (see the module's text)."""
    whole, pieces = results["0"][dev], results[chunk][dev]
    assert whole.keys() == pieces.keys()
    exact = [c for c in pieces if dev == "ref:0" or c in ELEMENTWISE]
    assert len(exact) >= len(ELEMENTWISE)
    for case in exact:
        got, want = pieces[case][0], whole[case][0]
        assert got.dtype == want.dtype and got.shape == want.shape, case
        assert got.tobytes() == want.tobytes(), (
            f"{case} on {dev}: --chunk-elems {chunk} differs from the whole kernel in "
            f"{int(np.sum(got != want))} of {got.size} elements")


@pytest.mark.parametrize("dev", DEVICES)
def test_results_match_numpy_and_torch(results, dev):
    for chunk, by_dev in results.items():
        for case, (got, want) in by_dev[dev].items():
            np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL,
                                       err_msg=f"{case} on {dev}, --chunk-elems {chunk}")


# ---------------------------------------------------------------- ordering on one lane


def pending_tasks(sess) -> int:
    """StatsReply.tasks_pending: tasks queued on a lane or running, all sessions."""
    req = sess._new_request()
    req.stats.SetInParent()
    resp, _ = sess._roundtrip(req, _Call("stats"))
    return resp.stats.tasks_pending


def small_op_during_big_one(start_daemon, chunk, n=1536, attempts=3):
    """A queues one n x n matmul; once it is pending, B runs relu(4). Returns the tasks
    still pending when B has its answer (None: A's matmul was over before B asked),
    A's result, and the same matmul's result run again with B idle."""
    d = start_daemon("--device-lanes", "1", "--inline-work", "0", "--chunk-elems", chunk)
    a = tensordd.connect(d.endpoint, timeout=120)
    b = tensordd.connect(d.endpoint, timeout=120)
    try:
        x = a.tensor(np.random.default_rng(3).standard_normal((n, n)).astype(np.float32))
        small = b.tensor([-1.0, 2.0, -3.0, 4.0])
        a.sync()
        b.sync()
        for _ in range(attempts):
            y = x @ x
            a.stats()  # the matmul has been read and queued
            if pending_tasks(b) == 0:
                continue  # it finished before B could ask: try again
            relu = small.relu().numpy()
            left = pending_tasks(b)
            np.testing.assert_array_equal(relu, [0.0, 2.0, 0.0, 4.0])
            return left, y.numpy(), (x @ x).numpy()
        return None, None, None
    finally:
        a.close(raise_errors=False)
        b.close(raise_errors=False)


def test_small_op_is_answered_between_pieces_of_a_big_kernel(start_daemon):
    """With whole kernels (the control) B's op comes after A's running matmul; in pieces
    it comes while the matmul is still pending, and the matmul's result, its pieces
    interleaved with B's turn, is the same bytes as the same pieces run with B idle (and
    the whole kernel's within float32 rounding)."""
    left0, y0, _ = small_op_during_big_one(start_daemon, "0")
    for _ in range(3):  # B's op may land in the matmul's last piece: then nothing is left
        left, y, y_idle = small_op_during_big_one(start_daemon, "65536")
        if left:
            break
    assert left0 is not None and left is not None, "A's matmul was never seen pending"
    assert left0 == 0, "the control: a whole kernel is not interrupted"
    assert left > 0, "B's op waited for the whole of A's matmul although it runs in pieces"
    assert y.tobytes() == y_idle.tobytes(), "B's turn between two pieces changed A's bits"
    np.testing.assert_allclose(y, y0, rtol=1e-4, atol=1e-3)  # K = 1536 float32 sums


def test_one_lane_serves_sessions_in_turn(start_daemon):
    """A queues a chain of matmuls; B's op on the same (only) lane is answered while
    most of A's chain still waits: the lane takes one task per session in turn."""
    d = start_daemon("--device-lanes", "1", "--inline-work", "0", "--chunk-elems", "0")
    a = tensordd.connect(d.endpoint, timeout=120)
    b = tensordd.connect(d.endpoint, timeout=120)
    try:
        rng = np.random.default_rng(7)
        x = a.tensor((rng.standard_normal((256, 256)) / 16).astype(np.float32))
        small = b.tensor([-1.0, 2.0, -3.0, 4.0])
        b.sync()
        y = x
        for _ in range(200):
            y = y @ x
        a.stats()
        relu = small.relu().numpy()
        left = pending_tasks(b)
        np.testing.assert_array_equal(relu, [0.0, 2.0, 0.0, 4.0])
        assert left > 0, "B's op waited behind every one of A's matmuls"
        y.numpy()
    finally:
        a.close(raise_errors=False)
        b.close(raise_errors=False)


def test_cross_device_work_in_both_directions_completes(start_daemon):
    """Two sessions copy between cpu:0 and ref:0 in opposite directions on one lane per
    device; each lane serves them in turn and runs only tasks whose inputs are ready, so
    neither worker blocks on the other (a worker blocked on a producer queued behind the
    other worker's blocked task would hang here)."""
    d = start_daemon("--device-lanes", "1", "--inline-work", "0", "--chunk-elems", "50")
    a = tensordd.connect(d.endpoint, timeout=60)
    b = tensordd.connect(d.endpoint, timeout=60)
    try:
        base = np.arange(200, dtype=np.float32).reshape(10, 20) / 100
        ta = a.tensor(base, device="cpu:0")
        tb = b.tensor(base, device="ref:0")
        for _ in range(25):
            ta = (ta.to("ref:0") * 1.0).to("cpu:0") + 1.0
            tb = (tb.to("cpu:0") * 1.0).to("ref:0") + 1.0
        want = base.copy()
        for _ in range(25):
            want = want + np.float32(1.0)
        np.testing.assert_array_equal(ta.numpy(), want)
        np.testing.assert_array_equal(tb.numpy(), want)
    finally:
        a.close(raise_errors=False)
        b.close(raise_errors=False)


def test_queues_are_reused_past_many_sessions(start_daemon):
    """A lane binds a queue per session and reuses the queues of sessions whose work has
    all run once more than 64 are bound: 70 sessions at once, then 70 one after another,
    each with its own results in its own order."""
    d = start_daemon("--device-lanes", "1", "--inline-work", "0", "--chunk-elems", "50")
    base = np.arange(120, dtype=np.float32).reshape(10, 12)
    sessions = [tensordd.connect(d.endpoint, timeout=60) for _ in range(70)]
    try:
        outs = []
        for i, s in enumerate(sessions):
            t = s.tensor(base)
            outs.append(((t + float(i)) * 2.0 - float(i)).relu())
        for i, t in enumerate(outs):
            np.testing.assert_array_equal(t.numpy(), np.maximum((base + i) * 2 - i, 0))
    finally:
        for s in sessions:
            s.close(raise_errors=False)
    for i in range(70):
        s = tensordd.connect(d.endpoint, timeout=60)
        try:
            np.testing.assert_array_equal((s.tensor(base) * float(i)).numpy(), base * i)
        finally:
            s.close(raise_errors=False)
