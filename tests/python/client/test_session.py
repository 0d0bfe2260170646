"""The public API against a real daemon: connecting, devices, transfers, ops
compared with numpy, lazy metadata, device moves, stats, grad mode, closing.

Tolerances: float32 elementwise ops are compared with rtol=1e-6 (they are
exact or correctly rounded in both); reductions and matmul, whose summation
order differs from numpy's, with rtol=1e-5, atol=1e-5 * sqrt(K)."""

from __future__ import annotations

import os
import socket
import tempfile

import numpy as np
import pytest

import tensordd
from helpers import require_ops

rng = np.random.default_rng(1234)


def randf(*shape):
    return rng.standard_normal(shape).astype(np.float32)


# ---------------------------------------------------------------- connect

def test_connect_says_hello(daemon):
    with tensordd.connect(daemon.endpoint, timeout=30) as s:
        assert s.server.startswith("tensordd")
        assert s.version == tensordd.PROTOCOL_VERSION and s.session_id > 0
        assert not s.closed
        assert isinstance(s.note, str)
    assert s.closed


def test_connect_over_unix_socket(start_daemon):
    path = os.path.join(tempfile.mkdtemp(prefix="tdd-py-"), "tensordd.sock")
    start_daemon("--listen", f"unix://{path}")
    with tensordd.connect(f"unix://{path}", timeout=30) as s:
        a = s.tensor(np.arange(4, dtype=np.float32))
        np.testing.assert_array_equal((a + a).numpy(), np.arange(4, dtype=np.float32) * 2)


def test_connect_refused_is_typed():
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(tensordd.IOFailureError, match="cannot connect"):
        tensordd.connect(f"tcp://127.0.0.1:{port}", timeout=5)


def test_sessions_are_isolated(daemon):
    with tensordd.connect(daemon.endpoint) as s1, tensordd.connect(daemon.endpoint) as s2:
        assert s1.session_id != s2.session_id
        a = s1.tensor(np.ones(3, np.float32))
        # the same handle id means nothing in another session
        ghost = tensordd.Tensor(s2, a.handle)
        with pytest.raises(tensordd.UnknownHandleError):
            ghost.numpy()
        np.testing.assert_array_equal(a.numpy(), np.ones(3, np.float32))


def test_daemon_exits_zero_on_sigterm_with_a_session_open(start_daemon):
    d = start_daemon("--cpu-devices", "2")
    s = tensordd.connect(d.endpoint, timeout=30)
    s.tensor(np.ones(1000, np.float32)).numpy()
    assert d.stop() == 0, d.log()
    s.close(raise_errors=False)


# ---------------------------------------------------------------- devices

def test_devices(session):
    devs = session.devices()
    assert all(isinstance(d, tensordd.Device) for d in devs)
    names = [str(d) for d in devs]
    assert {"cpu:0", "cpu:1", "ref:0"} <= set(names)
    assert len(set(names)) == len(names)
    info = {str(i["device"]): i for i in session.device_info()}
    assert set(info) == set(names)
    assert info["cpu:0"]["memory_total"] > 0 and info["cpu:0"]["name"]


# ---------------------------------------------------------------- transfers

@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int64", "bool", "float16"])
def test_upload_download_roundtrip_dtypes(session, dtype):
    data = (randf(3, 5) * 100).astype(dtype)
    t = session.tensor(data)
    assert t.dtype == dtype and t.shape == (3, 5) and t.device == "cpu:0"
    out = t.numpy()
    assert out.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(out, data)


@pytest.mark.parametrize("shape", [(), (0,), (1,), (7, 0, 3), (2, 3, 4, 5), (4 << 20,)])
def test_upload_download_roundtrip_shapes(session, shape):
    data = randf(*shape)
    t = session.tensor(data)
    out = t.numpy()
    assert out.shape == shape
    np.testing.assert_array_equal(out, data)


@pytest.mark.parametrize("device", ["cpu:0", "cpu:1", "ref:0"])
def test_upload_to_each_device(session, device):
    data = randf(4, 4)
    t = session.tensor(data, device=device)
    assert t.device == device
    np.testing.assert_array_equal(t.numpy(), data)
    session.sync()


def test_upload_of_views_and_lists(session):
    base = randf(6, 8)
    np.testing.assert_array_equal(session.tensor(base[::2, 1::3]).numpy(), base[::2, 1::3])
    np.testing.assert_array_equal(session.tensor(base.T).numpy(), base.T)
    t = session.tensor([[1, 2], [3, 4]])
    assert t.dtype == "int64"
    np.testing.assert_array_equal(t.numpy(), [[1, 2], [3, 4]])
    t = session.tensor(2.5)
    assert t.shape == () and t.item() == 2.5 and float(t) == 2.5


def test_array_may_change_after_upload(session):
    big = np.ones(1 << 20, np.float32)  # above the zero-copy threshold
    small = np.ones(16, np.float32)
    tb, ts = session.tensor(big), session.tensor(small)
    big[:] = 7
    small[:] = 7
    assert tb.numpy().max() == 1 and ts.numpy().max() == 1


# ---------------------------------------------------------------- first op set vs numpy

def test_elementwise_ops_match_numpy(session):
    x, y = randf(5, 7), randf(5, 7)
    y[np.abs(y) < 0.1] = 0.5
    a, b = session.tensor(x), session.tensor(y)
    cases = {
        "add": (a + b, x + y), "sub": (a - b, x - y), "mul": (a * b, x * y),
        "div": (a / b, x / y), "relu": (a.relu(), np.maximum(x, 0)),
        "add()": (a.add(b), x + y), "sub()": (a.sub(b), x - y), "mul()": (a.mul(b), x * y),
        "div()": (a.div(b), x / y), "op": (session.op("add", a, b), x + y),
    }
    for name, (t, expected) in cases.items():
        got = t.numpy()
        assert got.dtype == np.float32 and got.shape == expected.shape, name
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=0, err_msg=name)


@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (3, 4, 5), (64, 128, 32), (200, 300, 100)])
def test_matmul_matches_numpy(session, m, k, n):
    x, y = randf(m, k), randf(k, n)
    got = (session.tensor(x) @ session.tensor(y)).numpy()
    expected = x.astype(np.float64) @ y.astype(np.float64)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5 * np.sqrt(k))
    got2 = session.tensor(x).matmul(session.tensor(y)).numpy()
    np.testing.assert_allclose(got2, got, rtol=1e-6, atol=1e-6)


def test_sum_matches_numpy(session):
    x = randf(100, 37)
    t = session.tensor(x).sum()
    assert t.shape == ()
    np.testing.assert_allclose(t.numpy(), x.astype(np.float64).sum(), rtol=1e-5, atol=1e-3)
    assert abs(t.item() - float(x.astype(np.float64).sum())) < 1e-3


def test_chained_ops_and_op_output_metadata(session):
    x, w = randf(8, 16), randf(16, 4)
    h = (session.tensor(x) @ session.tensor(w)).relu()
    assert h._brief().startswith(f"tensordd.Tensor(#{h.handle}")  # nothing asked yet
    assert h.shape == (8, 4) and h.dtype == "float32" and h.device == "cpu:0"
    assert h.requires_grad is False and h.ndim == 2 and h.size(1) == 4 and h.numel() == 32
    np.testing.assert_allclose(h.numpy(), np.maximum(x @ w, 0), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", ["cpu:1", "ref:0"])
def test_ops_run_on_the_inputs_device(session, device):
    x, y = randf(6, 5), randf(5, 3)
    out = (session.tensor(x, device=device) @ session.tensor(y, device=device)).relu()
    assert out.device == device
    np.testing.assert_allclose(out.numpy(), np.maximum(x @ y, 0), rtol=1e-5, atol=1e-5)


def test_many_pipelined_ops(session):
    x = randf(16)
    t = session.tensor(x)
    one = session.tensor(np.ones(16, np.float32))
    for _ in range(2000):
        t = t + one
    np.testing.assert_allclose(t.numpy(), x + 2000, rtol=1e-5)


# ---------------------------------------------------------------- device moves

def test_to_device(session):
    x = randf(3, 4)
    a = session.tensor(x)
    assert a.to("cpu:0") is a
    b = a.to("cpu:1")
    c = b.to(tensordd.Device("ref", 0))
    assert (b.device, c.device) == ("cpu:1", "ref:0")
    np.testing.assert_array_equal(c.numpy(), x)
    assert c.shape == (3, 4) and c.dtype == "float32"


# ---------------------------------------------------------------- session calls

def test_stats(session):
    before = session.stats()
    for key in ["sessions", "handles", "bytes_received", "bytes_sent", "requests",
                "tensors_alive", "uptime_ms"]:
        assert isinstance(before[key], int), key
    assert before["sessions"] >= 1
    keep = session.tensor(np.ones(1024, np.float32))
    after = session.stats()
    assert after["requests"] > before["requests"]
    assert after["bytes_received"] >= before["bytes_received"] + 4096
    assert after["handles"] == before["handles"] + 1
    assert after["memory"]["cpu:0"]["bytes_in_use"] >= 4096
    mine = [x for x in after["session_list"] if x["session_id"] == session.session_id]
    assert len(mine) == 1 and mine[0]["client_name"] == "tensordd-python"
    assert mine[0]["handles"] >= 1
    del keep


def test_stats_count_errors_by_code(session):
    before = session.stats()["errors"].get("UNSUPPORTED_OP", 0)
    session.op("definitely_not_an_op", session.tensor(np.ones(1, np.float32)))
    with pytest.raises(tensordd.UnsupportedOpError):
        session.sync()
    assert session.stats()["errors"]["UNSUPPORTED_OP"] == before + 1


def test_sync_reports_first_error_once_and_session_survives(session):
    a = session.tensor(np.ones((2, 3), np.float32))
    b = session.tensor(np.ones((4, 5), np.float32))
    _bad1 = a + b
    _bad2 = session.op("no_such_op_either", a)
    with pytest.raises(tensordd.ShapeMismatchError):  # the first one, not the second
        session.sync()
    session.sync()  # reported once
    np.testing.assert_array_equal((a + a).numpy(), np.full((2, 3), 2, np.float32))


def test_no_grad_and_set_grad_enabled(session):
    assert session.grad_enabled
    with session.no_grad():
        assert not session.grad_enabled
        x = session.tensor(np.ones(2, np.float32), requires_grad=True)
        y = x + x
        session.sync()
    assert session.grad_enabled
    session.set_grad_enabled(False)
    session.set_grad_enabled(True)
    session.sync()
    np.testing.assert_array_equal(y.numpy(), [2, 2])
    assert x.requires_grad


def test_flush_sends_without_waiting(session):
    before = session.stats()["requests"]
    _keep = [session.tensor(np.ones(1, np.float32)) for _ in range(3)]
    session.flush()
    assert session.stats()["requests"] >= before + 4


def test_close_then_use_raises_closed(daemon):
    s = tensordd.connect(daemon.endpoint)
    t = s.tensor(np.ones(2, np.float32))
    s.close()
    s.close()
    assert s.closed
    with pytest.raises(tensordd.ConnectionClosedError):
        t.numpy()
    with pytest.raises(tensordd.ConnectionClosedError):
        s.sync()


def test_closing_frees_the_session(daemon):
    with tensordd.connect(daemon.endpoint) as watcher:
        s = tensordd.connect(daemon.endpoint)
        _keep = [s.tensor(np.ones(256, np.float32)) for _ in range(10)]
        s.sync()
        sid = s.session_id
        assert any(x["session_id"] == sid and x["handles"] == 10
                   for x in watcher.stats()["session_list"])
        s.close()
        watcher.sync()
        assert all(x["session_id"] != sid for x in watcher.stats()["session_list"])


def test_close_with_a_pending_error(daemon):
    s = tensordd.connect(daemon.endpoint)
    s.op("no_such_op", s.tensor(np.ones(1, np.float32)))
    # Goodbye is synchronising: the pending error is told before the session ends.
    with pytest.raises(tensordd.UnsupportedOpError) as info:
        s.close()
    assert "no_such_op" in str(info.value)
    assert s.closed


# ---------------------------------------------------------------- the growing op set

def test_scalar_operands(session):
    require_ops(session, "add", "sub", "mul", "div", "neg", "reciprocal")
    x = randf(4, 3)
    x[np.abs(x) < 0.1] = 0.5
    t = session.tensor(x)
    cases = [(t + 2, x + 2), (2 + t, 2 + x), (t - 1.5, x - 1.5), (1.5 - t, 1.5 - x),
             (t * 3, x * 3), (3 * t, 3 * x), (t / 4, x / 4), (4 / t, 4 / x), (-t, -x)]
    for got, expected in cases:
        np.testing.assert_allclose(got.numpy(), expected, rtol=1e-6, atol=1e-6)


def test_comparisons(session):
    require_ops(session, "eq", "ne", "lt", "le", "gt", "ge")
    x = np.array([1, 2, 3, 4], np.float32)
    y = np.array([4, 2, 1, 4], np.float32)
    a, b = session.tensor(x), session.tensor(y)
    for got, expected in [(a == b, x == y), (a != b, x != y), (a < b, x < y), (a <= b, x <= y),
                          (a > b, x > y), (a >= b, x >= y), (a > 2, x > 2), (a <= 2.5, x <= 2.5),
                          (a.eq(b), x == y), (a.ge(b), x >= y)]:
        out = got.numpy()
        assert out.dtype == np.bool_
        np.testing.assert_array_equal(out, expected)


def test_unary_methods(session):
    names = ["neg", "abs", "exp", "log", "sqrt", "sigmoid", "tanh", "sin", "cos", "reciprocal",
             "square", "rsqrt", "sign", "gelu"]
    require_ops(session, *names)
    x = np.abs(randf(3, 4)) + 0.1
    t = session.tensor(x)
    import torch
    tx = torch.from_numpy(x)
    for name in names:
        fn = getattr(torch, name, None) or getattr(torch.nn.functional, name)
        expected = fn(tx).numpy()
        np.testing.assert_allclose(getattr(t, name)().numpy(), expected, rtol=1e-5, atol=1e-6,
                                   err_msg=name)
    np.testing.assert_allclose(abs(session.tensor(-x)).numpy(), x, rtol=0)
    np.testing.assert_allclose((t ** 2).numpy(), x ** 2, rtol=1e-5)
    np.testing.assert_allclose(t.clamp(0.3, 0.8).numpy(), np.clip(x, 0.3, 0.8), rtol=0)


def test_reductions_with_dims(session):
    require_ops(session, "sum", "mean", "amax", "amin", "argmax", "argmin")
    x = randf(3, 4, 5)
    t = session.tensor(x)
    for dim, keep in [(0, False), (1, True), ((0, 2), False), (-1, True)]:
        np.testing.assert_allclose(t.sum(dim=dim, keepdim=keep).numpy(),
                                   x.sum(axis=dim, keepdims=keep), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(t.mean(dim, keep).numpy(), x.mean(axis=dim, keepdims=keep),
                                   rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(t.mean().numpy(), x.mean(), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(t.amax(1).numpy(), x.max(axis=1))
    np.testing.assert_array_equal(t.amin(2).numpy(), x.min(axis=2))
    np.testing.assert_array_equal(t.argmax(dim=1).numpy(), x.argmax(axis=1))
    np.testing.assert_array_equal(t.argmin(dim=2).numpy(), x.argmin(axis=2))


def test_softmax_family(session):
    require_ops(session, "softmax", "log_softmax")
    x = randf(4, 10) * 5
    t = session.tensor(x)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    sm = e / e.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(t.softmax(1).numpy(), sm, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(t.log_softmax(-1).numpy(), np.log(sm), rtol=1e-5, atol=1e-5)


def test_shape_methods(session):
    require_ops(session, "reshape", "view", "transpose", "permute", "flatten", "unsqueeze",
                "squeeze", "contiguous", "expand", "clone")
    x = randf(2, 3, 4)
    t = session.tensor(x)
    assert t.reshape(6, 4).shape == (6, 4)
    np.testing.assert_array_equal(t.reshape(4, -1).numpy(), x.reshape(4, -1))
    np.testing.assert_array_equal(t.view((24,)).numpy(), x.reshape(24))
    np.testing.assert_array_equal(t.transpose(0, 2).numpy(), x.transpose(2, 1, 0))
    np.testing.assert_array_equal(t.permute(1, 2, 0).numpy(), x.transpose(1, 2, 0))
    np.testing.assert_array_equal(t.flatten(1).numpy(), x.reshape(2, 12))
    assert t.unsqueeze(0).shape == (1, 2, 3, 4)
    assert t.unsqueeze(0).squeeze(0).shape == (2, 3, 4)
    np.testing.assert_array_equal(t.transpose(0, 1).contiguous().numpy(), x.transpose(1, 0, 2))
    np.testing.assert_array_equal(session.tensor(x[:1]).expand(5, 3, 4).numpy(),
                                  np.broadcast_to(x[:1], (5, 3, 4)))
    np.testing.assert_array_equal(t.clone().numpy(), x)


def test_t_and_T(session):
    require_ops(session, "transpose")
    x = randf(3, 5)
    t = session.tensor(x)
    np.testing.assert_array_equal(t.t().numpy(), x.T)
    np.testing.assert_array_equal(t.T.numpy(), x.T)


def test_cast(session):
    require_ops(session, "cast")
    x = randf(5) * 10
    t = session.tensor(x)
    assert t.to("float32") is t
    d = t.to(dtype="float64")
    assert d.dtype == "float64"
    np.testing.assert_array_equal(d.numpy(), x.astype(np.float64))
    np.testing.assert_array_equal(t.to("int32").numpy(), x.astype(np.int32))
    assert t.double().dtype == "float64" and d.float().dtype == "float32"


def test_creation_ops(session):
    require_ops(session, "zeros", "ones", "full", "arange", "rand", "randn")
    z = session.zeros(2, 3)
    assert z.shape == (2, 3) and z.dtype == "float32" and z.device == "cpu:0"
    np.testing.assert_array_equal(z.numpy(), np.zeros((2, 3), np.float32))
    np.testing.assert_array_equal(session.ones((4,), device="cpu:1").numpy(), np.ones(4))
    assert session.ones(2, device="ref:0").device == "ref:0"
    np.testing.assert_array_equal(session.full((2, 2), 7.5).numpy(), np.full((2, 2), 7.5))
    np.testing.assert_array_equal(session.arange(5).numpy(), np.arange(5))
    np.testing.assert_allclose(session.arange(1, 2, 0.25).numpy(), np.arange(1, 2, 0.25))
    np.testing.assert_array_equal(session.zeros(3, dtype="int64").numpy(), np.zeros(3, np.int64))
    r = session.rand(1000).numpy()
    assert r.shape == (1000,) and r.min() >= 0 and r.max() < 1 and 0.4 < r.mean() < 0.6
    n = session.randn(10000).numpy()
    assert abs(n.mean()) < 0.05 and 0.95 < n.std() < 1.05
    g = session.zeros(3, requires_grad=True)
    assert g.requires_grad


def test_binary_methods_and_where(session):
    require_ops(session, "maximum", "minimum", "where", "gt", "masked_fill")
    x, y = randf(3, 4), randf(3, 4)
    a, b = session.tensor(x), session.tensor(y)
    np.testing.assert_array_equal(a.maximum(b).numpy(), np.maximum(x, y))
    np.testing.assert_array_equal(a.minimum(b).numpy(), np.minimum(x, y))
    np.testing.assert_array_equal(a.where(a > b, b).numpy(), np.where(x > y, x, y))
    np.testing.assert_array_equal(a.masked_fill(a > 0, 0.0).numpy(), np.where(x > 0, 0, x))
    np.testing.assert_array_equal(a.mm(b.t()).numpy().shape, (3, 3))


def test_more_elementwise_and_reductions(session):
    names = ["log1p", "expm1", "floor", "ceil", "round", "silu", "leaky_relu", "softplus",
             "prod", "var", "std", "logsumexp", "cumsum"]
    require_ops(session, *names)
    import torch
    x = randf(4, 5)
    t, tx = session.tensor(x), torch.from_numpy(x)
    F = torch.nn.functional
    cases = {
        "log1p": (t.abs().log1p(), tx.abs().log1p()), "expm1": (t.expm1(), tx.expm1()),
        "floor": (t.floor(), tx.floor()), "ceil": (t.ceil(), tx.ceil()),
        "round": (t.round(), tx.round()), "silu": (t.silu(), F.silu(tx)),
        "leaky_relu": (t.leaky_relu(0.2), F.leaky_relu(tx, 0.2)),
        "softplus": (t.softplus(), F.softplus(tx)),
        "prod": (t.prod(dim=1), tx.prod(dim=1)), "var": (t.var(dim=0), tx.var(dim=0)),
        "std": (t.std(), tx.std()), "logsumexp": (t.logsumexp(1), tx.logsumexp(1)),
        "cumsum": (t.cumsum(1), tx.cumsum(1)),
    }
    for name, (got, expected) in cases.items():
        np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=1e-5, atol=1e-5,
                                   err_msg=name)


def test_cat_stack_index(session):
    require_ops(session, "cat", "stack", "index_select", "gather", "tril", "triu")
    x, y = randf(2, 3), randf(2, 3)
    a, b = session.tensor(x), session.tensor(y)
    np.testing.assert_array_equal(session.cat([a, b], dim=1).numpy(), np.concatenate([x, y], 1))
    np.testing.assert_array_equal(session.stack([a, b]).numpy(), np.stack([x, y]))
    idx = session.tensor(np.array([2, 0], np.int64))
    np.testing.assert_array_equal(a.index_select(1, idx).numpy(), x[:, [2, 0]])
    gidx = np.array([[0, 2], [1, 1]], np.int64)
    np.testing.assert_array_equal(a.gather(1, session.tensor(gidx)).numpy(),
                                  np.take_along_axis(x, gidx, 1))
    sq = randf(3, 3)
    np.testing.assert_array_equal(session.tensor(sq).tril().numpy(), np.tril(sq))
    np.testing.assert_array_equal(session.tensor(sq).triu(1).numpy(), np.triu(sq, 1))


def test_value_conversions(session):
    x = randf(2, 3)
    t = session.tensor(x)
    assert t.tolist() == x.tolist()
    np.testing.assert_array_equal(np.asarray(t), x)
    one = session.tensor(np.array([3], np.int64))
    assert int(one) == 3 and bool(one) and one.item() == 3
    with pytest.raises(ValueError):
        t.item()
    with pytest.raises(TypeError):  # numpy defers to Tensor and Tensor refuses arrays
        x + t


def test_split_and_chunk_have_several_outputs(session):
    require_ops(session, "split", "chunk")
    x = randf(5, 3)
    t = session.tensor(x)
    for got, expected in [(t.chunk(2), np.split(x, [3])), (t.chunk(4), np.split(x, [2, 4])),
                          (t.split(2), np.split(x, [2, 4])), (t.split([1, 4]), np.split(x, [1])),
                          (t.chunk(3, dim=1), np.split(x, 3, axis=1))]:
        assert len(got) == len(expected)
        for g, e in zip(got, expected):
            np.testing.assert_array_equal(g.numpy(), e)
    a, b = session.op("chunk", t, chunks=2, dim=0, num_outputs=2)
    assert (a.shape, b.shape) == ((3, 3), (2, 3))


def test_indexing(session):
    require_ops(session, "slice", "squeeze", "unsqueeze", "index_select")
    x = randf(4, 5, 6)
    t = session.tensor(x)
    keys = [0, -1, 3, (1, 2), (slice(1, 3),), (slice(None), 2), (slice(None, None, 2), -2, 1),
            (Ellipsis, 0), (0, Ellipsis, slice(1, 4)), (None, 1), (slice(-3, None), None, 0),
            (slice(10, 20),)]
    for key in keys:
        got = t[key]
        np.testing.assert_array_equal(got.numpy(), x[key], err_msg=repr(key))
        assert got.shape == x[key].shape
    idx = session.tensor(np.array([3, 0, 3], np.int64))
    np.testing.assert_array_equal(t[idx].numpy(), x[[3, 0, 3]])
    with pytest.raises(IndexError):
        t[4]
    # negative steps as numpy has them (torch refuses them; ours has them)
    for key in [(slice(None, None, -1),), (slice(None), slice(4, 0, -2)), (Ellipsis, slice(None, None, -3)),
                (slice(-1, -5, -1), 2)]:
        np.testing.assert_array_equal(t[key].numpy(), x[key], err_msg=repr(key))
        assert t[key].shape == x[key].shape
    with pytest.raises(ValueError):
        t[::0]
