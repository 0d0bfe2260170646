"""The per-step fast paths of a training step, held to exact oracles.

* SGD on dense float32 parameters runs a four-wide loop in the daemon
  (daemon/optim.c's sgd_dense_f32): every option (weight decay, momentum,
  dampening, nesterov, maximize) must give the bits of the same update written
  in numpy float32, op for op in torch.optim's order (each float32 operation is
  correctly rounded on both sides, so equality is exact), on sizes with and
  without a tail of fewer than four elements, and with a gradient assigned by
  hand as a transposed view.
* linear's bias is copied into the output row by row (backends/cpu/cpu_blas.c's
  fill_bias): every way a bias may broadcast to the output (a row, a column, a
  strided view, a batch of rows) against numpy, with small integers so that the
  products and sums are exact.
"""

from __future__ import annotations

import numpy as np
import pytest

import tensordd

SGD_CASES = [
    dict(lr=0.1),
    dict(lr=0.05, weight_decay=0.01),
    dict(lr=0.05, momentum=0.9),
    dict(lr=0.05, momentum=0.9, dampening=0.3, weight_decay=0.02),
    dict(lr=0.05, momentum=0.8, nesterov=True),
    dict(lr=0.05, momentum=0.5, nesterov=True, weight_decay=0.1, maximize=True),
    dict(lr=0.1, maximize=True),
]


def _sgd_numpy(p, grads, lr, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False,
               maximize=False):
    """torch.optim.SGD's update in float32, one correctly rounded operation at a time."""
    f = np.float32
    p = p.copy()
    buf = None
    for g in grads:
        g = -g if maximize else g.copy()
        if weight_decay:
            g = g + f(weight_decay) * p
        if momentum:
            buf = g.copy() if buf is None else buf * f(momentum) + f(1.0 - dampening) * g
            g = g + f(momentum) * buf if nesterov else buf
        p = p + (-f(lr)) * g
    return p


@pytest.mark.parametrize("opts", SGD_CASES, ids=lambda o: ",".join(sorted(o)))
@pytest.mark.parametrize("shape", [(7,), (64, 128), (3, 5)])
def test_sgd_float32_is_torch_order_exactly(session, opts, shape):
    rng = np.random.default_rng(11)
    w0 = rng.standard_normal(shape).astype(np.float32)
    coefs = [rng.standard_normal(shape).astype(np.float32) for _ in range(3)]
    w = session.tensor(w0, requires_grad=True)
    opt = tensordd.optim.SGD([w], **opts)
    for c in coefs:
        opt.zero_grad()
        (w * session.tensor(c)).sum().backward()  # the gradient is c exactly
        opt.step()
    np.testing.assert_array_equal(w.numpy(), _sgd_numpy(w0, coefs, **opts))


@pytest.mark.parametrize("opts", [SGD_CASES[3], SGD_CASES[5]], ids=["momentum", "nesterov"])
def test_sgd_strided_gradient_takes_the_same_bits(session, opts):
    """A gradient set by hand as a transposed view: the same bits as a dense one and
    as numpy."""
    rng = np.random.default_rng(12)
    w0 = rng.standard_normal((6, 10)).astype(np.float32)
    coefs = [rng.standard_normal((10, 6)).astype(np.float32) for _ in range(3)]
    w1, w2 = (session.tensor(w0, requires_grad=True) for _ in range(2))
    o1, o2 = tensordd.optim.SGD([w1], **opts), tensordd.optim.SGD([w2], **opts)
    for c in coefs:
        w1.grad = session.tensor(c).transpose(0, 1)
        o1.step()
        w2.grad = session.tensor(np.ascontiguousarray(c.T))
        o2.step()
    want = _sgd_numpy(w0, [np.ascontiguousarray(c.T) for c in coefs], **opts)
    np.testing.assert_array_equal(w1.numpy(), want)
    np.testing.assert_array_equal(w2.numpy(), want)


@pytest.mark.parametrize("xshape,bias_of", [
    ((5, 4), lambda s: s.tensor(np.arange(3, dtype=np.float32) - 1)),  # a row [N]
    ((5, 4), lambda s: s.tensor((np.arange(5, dtype=np.float32) - 2).reshape(5, 1))),  # a column
    ((5, 4), lambda s: s.tensor(np.arange(6, dtype=np.float32) - 3)[::2]),  # strided [N]
    ((2, 5, 4), lambda s: s.tensor(np.arange(3, dtype=np.float32) * 2)),  # batch of rows
    ((2, 5, 4), lambda s: s.tensor((np.arange(10, dtype=np.float32) - 4).reshape(2, 5, 1))),
    ((5, 4), lambda s: s.tensor(np.arange(15, dtype=np.float32).reshape(5, 3))),  # full
    ((5, 4), lambda s: s.tensor(np.arange(15, dtype=np.float32).reshape(3, 5)).t()),  # full, T
], ids=["row", "column", "strided", "3d-row", "3d-column", "full", "full-transposed"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_linear_bias_layouts(session, xshape, bias_of, dtype):
    rng = np.random.default_rng(13)
    x = rng.integers(-3, 4, xshape).astype(dtype)
    w = rng.integers(-3, 4, (3, xshape[-1])).astype(dtype)
    b = bias_of(session)
    if dtype == np.float64:
        b = b.double()
    want = x @ w.T + b.numpy().astype(dtype)
    got = tensordd.nn.functional.linear(session.tensor(x), session.tensor(w), b).numpy()
    np.testing.assert_array_equal(got, want)


# ---------------------------------------------------------------- the client's hand-encoded requests

import os  # noqa: E402
import random  # noqa: E402
import time  # noqa: E402

from tensordd import _codec  # noqa: E402
from tensordd import tensordd_pb2 as pb  # noqa: E402
from tensordd._wire import HEADER, MAGIC  # noqa: E402
from tensordd.session import _attr_bytes, _set_attr, _upload_device  # noqa: E402

try:
    from tensordd import _speedups
except ImportError:  # not built: the pure-Python encoders are still checked
    _speedups = None

EDGES = [1, 127, 128, 16383, 16384, 2**21, 2**35, 2**63 - 1, 2**64 - 1]


def _u64(r):
    return r.choice(EDGES + [r.randrange(1, 2**40)])


def _unframe(frame, payload_len=0):
    magic, msg_len, plen = HEADER.unpack(frame[:16])
    assert magic == MAGIC and plen == payload_len and msg_len == len(frame) - 16
    return frame[16:]


def test_upload_backward_and_step_frames_are_protobufs_encoding():
    r = random.Random(111)
    devices = ["cpu:0", "cpu", "cpu:1", "ref:0", "cuda:3", tensordd.Device("cpu", 200)]
    for _ in range(2000):
        rid, handle, a, b = _u64(r), _u64(r), _u64(r), _u64(r)
        wire = r.choice([pb.DTYPE_F32, pb.DTYPE_F64, pb.DTYPE_I64, pb.DTYPE_BOOL, pb.DTYPE_I16])
        shape = tuple(r.choice([0, 1, 3, 127, 128, 70000]) for _ in range(r.randrange(0, 5)))
        rg = r.random() < 0.5
        dev, dev_bytes = _upload_device(r.choice(devices))
        nbytes = r.randrange(0, 1 << 16)
        req = pb.Request(id=rid)
        up = req.upload
        up.handle, up.dtype, up.requires_grad = handle, wire, rg
        up.shape.extend(shape)
        dev._to_proto(up.device)
        assert _unframe(_codec.py_frame_upload(rid, handle, wire, shape, dev_bytes, rg, nbytes),
                        nbytes) == req.SerializeToString()

        req = pb.Request(id=rid)
        req.backward.loss, req.backward.grads, req.backward.pipelined = a, b, True
        assert _unframe(_codec.frame_backward(rid, a, b)) == req.SerializeToString()
        req = pb.Request(id=rid)
        st = req.optimizer_step
        st.optimizer, st.grads, st.pipelined = a, b, True
        assert _unframe(_codec.frame_optimizer_step(rid, a, b)) == req.SerializeToString()


ATTR_VALUES = [1, True, 1.0, 0, False, 0.0, -0.0, -1, 2**62, 1.5, "mean", "", "é",
               (1, 2), (), (3,), 1e300, float("inf")]


def _attrs_ref(attrs):
    op = pb.Op()
    for k, v in attrs.items():
        if v is not None:
            _set_attr(op.attrs.add(), k, v)
    return op.SerializeToString()


def test_cached_attributes_are_protobufs_encoding():
    """Values that compare equal but encode differently (1, True, 1.0; 0.0, -0.0) must not
    share a cache entry: each is checked right after the others filled the cache."""
    r = random.Random(112)
    for _ in range(3):
        for v in ATTR_VALUES:
            assert _attr_bytes({"a": v}) == _attrs_ref({"a": v}), v
    for _ in range(500):
        attrs = {k: r.choice(ATTR_VALUES + [None]) for k in r.sample("abcdefg", r.randrange(1, 5))}
        assert _attr_bytes(attrs) == _attrs_ref(attrs)
    # left to protobuf: lists, numpy scalars, NaN, tuples holding non-ints
    for v in ([1, 2], np.float32(1), np.int64(2), float("nan"), (1.0, 2.0), (True,)):
        assert _attr_bytes({"a": v}) is None


def _op_encoders():
    out = [("python", _codec.py_encode_op, _codec.py_frame_op, _codec.py_append_op)]
    if _speedups is not None:
        out.append(("c", _speedups.encode_op, _speedups.frame_op, _speedups.append_op))
    return out


@pytest.mark.parametrize("impl", _op_encoders(), ids=lambda i: i[0])
def test_op_with_cached_attributes_is_protobufs_encoding(impl):
    _, encode_op, frame_op, append_op = impl
    r = random.Random(113)
    for _ in range(1000):
        rid, out = _u64(r), _u64(r)
        inputs = [_u64(r) for _ in range(r.choice([1, 2, 3]))]
        name = r.choice(["cross_entropy", "leaky_relu", "x" * 130])
        attrs = {k: r.choice(ATTR_VALUES) for k in r.sample("abcd", r.randrange(1, 4))}
        req = pb.Request(id=rid)
        req.op.op = name
        req.op.inputs.extend(inputs)
        req.op.outputs.append(out)
        for k, v in attrs.items():
            _set_attr(req.op.attrs.add(), k, v)
        want = req.SerializeToString()
        extra = _attr_bytes(attrs)
        assert encode_op(rid, name, inputs, out, extra) == want
        assert _unframe(frame_op(rid, name, tuple(inputs), out, extra)) == want
        buf = bytearray(b"q")
        assert append_op(buf, rid, name, inputs, out, extra) == len(buf)
        assert _unframe(bytes(buf[1:])) == want


@pytest.mark.skipif(_speedups is None, reason="tensordd._speedups is not built")
def test_accelerator_refuses_extra_that_is_not_bytes():
    for bad in ("attrs", bytearray(b"\x22\x00"), 3):
        with pytest.raises(TypeError):
            _speedups.frame_op(1, "relu", [1], 2, bad)
        with pytest.raises(TypeError):
            _speedups.append_op(bytearray(), 1, "relu", [1], 2, bad)


UPLOAD_DTYPES = [np.float32, np.float64, np.float16, np.int64, np.int32, np.int16, np.int8,
                 np.uint8, np.bool_]


@pytest.mark.parametrize("dtype", UPLOAD_DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape", [(), (0,), (5,), (2, 3, 4)], ids=str)
def test_small_uploads_round_trip(session, dtype, shape):
    a = (np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape) % 3).astype(dtype)
    for device in ("cpu", "cpu:0", tensordd.Device("cpu", 0)):
        t = session.tensor(a, device=device)
        assert t.shape == shape and t.dtype == np.dtype(dtype).name and t.device == "cpu:0"
        got = t.numpy()
        assert got.dtype == a.dtype
        np.testing.assert_array_equal(got, a)


def test_small_uploads_keep_requires_grad_and_non_native_arrays(session):
    w0 = np.arange(6, dtype=np.float32).reshape(2, 3)
    w = session.tensor(w0, requires_grad=True)
    assert w.requires_grad
    (g,) = tensordd.autograd.grad((w * w).sum(), w)
    np.testing.assert_array_equal(g.numpy(), 2 * w0)
    big_endian = np.arange(4, dtype=">f4")  # the general path: swapped to native first
    np.testing.assert_array_equal(session.tensor(big_endian).numpy(), np.arange(4.0))
    strided = np.arange(12, dtype=np.float32)[::3]
    np.testing.assert_array_equal(session.tensor(strided).numpy(), [0.0, 3.0, 6.0, 9.0])


def test_a_failed_small_upload_names_itself(session):
    with pytest.raises(tensordd.Error) as e:
        session.tensor(np.ones((2, 3), np.int32), device="cpu:9").numpy()
    assert "upload #" in str(e.value) and "int32(2, 3) on cpu:9" in str(e.value)


def test_ops_with_cached_attributes_run_like_the_protobuf_path(session):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(114)
    x = rng.standard_normal((6, 5)).astype(np.float32)
    y = rng.integers(0, 5, 6)
    xt, yt = session.tensor(x), session.tensor(y)
    for _ in range(2):  # the second time from the cache
        for ls in (0.0, 0.25):
            got = session.op("cross_entropy", xt, yt, reduction="sum", ignore_index=2,
                             label_smoothing=ls).numpy()
            want = torch.nn.functional.cross_entropy(torch.from_numpy(x), torch.from_numpy(y),
                                                     reduction="sum", ignore_index=2,
                                                     label_smoothing=ls).numpy()
            np.testing.assert_allclose(got, want, rtol=1e-5)
        np.testing.assert_array_equal(session.op("sum", xt, dim=(0, 1)).numpy().shape, ())
        np.testing.assert_allclose(session.op("leaky_relu", xt, negative_slope=-0.0).numpy(),
                                   np.maximum(x, 0) + np.minimum(x, 0) * -0.0)
    with pytest.raises(tensordd.Error) as e:
        session.op("cross_entropy", xt, yt, reduction="nope").numpy()
    assert "op cross_entropy" in str(e.value)


# ---------------------------------------------------------------- --poll-us

def _cpu_s(pid: int):
    """(the main thread's, every other thread's) CPU seconds so far (/proc schedstat)."""
    main = rest = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
            ns = int(f.read().split()[0])
        if int(tid) == pid:
            main = ns
        else:
            rest += ns
    return main / 1e9, rest / 1e9


def test_the_loop_does_not_poll_while_device_work_runs(start_daemon):
    """With a poll window far longer than the work (--poll-us 1000000), the loop thread
    (the main thread) sleeps while queued work runs on the device's worker, instead of
    polling for a second after the last request: the worker and the client need the
    cores. Measured as CPU time, not wall-clock time: the loop thread's against the
    worker's over the same half second (both would get the same share of a loaded
    machine); before this change the loop used about as much as the worker."""
    d = start_daemon("--poll-us", "1000000", "--poll-min-cpus", "1", "--threads", "1")
    pid = d.proc.pid
    with tensordd.connect(d.endpoint, timeout=60) as s:
        a = s.tensor(np.ones((512, 512), np.float32))
        t0 = time.perf_counter()
        keep = a @ a
        s.sync()
        one = max(time.perf_counter() - t0, 1e-3)
        window = 0.5
        loop0, workers0 = _cpu_s(pid)
        # enough work queued for the worker to outlast the window twice over
        keep = [a @ a for _ in range(min(int(2 * window / one) + 2, 2000))]
        s.flush()
        time.sleep(window)
        loop1, workers1 = _cpu_s(pid)
        del keep
        s.sync()
    loop, workers = loop1 - loop0, workers1 - workers0
    assert workers > 0.02, f"the worker ran {workers:.3f} s: the test measured nothing"
    assert loop < 0.2 * workers, f"the loop thread used {loop:.3f} s, the worker {workers:.3f} s"


@pytest.mark.parametrize("min_cpus", ["1", "4096"])
def test_no_polling_on_machines_with_fewer_cpus_than_poll_min_cpus(start_daemon, min_cpus):
    """--poll-min-cpus above the machine's CPU count turns polling off (said in the log);
    then the loop thread sleeps after a request instead of polling for the window (CPU
    time of the loop thread over half a second after a request, against the same daemon
    polling: with a preempted loop thread backing off on a busy machine, that control may
    poll little, and the comparison is only made when it polled)."""
    d = start_daemon("--poll-us", "1000000", "--poll-min-cpus", min_cpus)
    pid = d.proc.pid
    with tensordd.connect(d.endpoint, timeout=60) as s:
        s.sync()
        loop0, _ = _cpu_s(pid)
        time.sleep(0.5)
        loop = _cpu_s(pid)[0] - loop0
        s.sync()
    d.stop()
    said = "no polling after requests" in d.log()
    assert said == (min_cpus == "4096"), d.log()
    if min_cpus == "4096":
        assert loop < 0.02, f"the loop thread used {loop:.3f} s of CPU while idle"


def test_linear_takes_the_short_path_only_within_one_session(session, daemon):
    """F.linear goes straight to the hand-encoded op for tensors of one session; without
    a bias too; a weight of another session or a non-tensor still gets Session.op's
    errors."""
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    w = np.array([[1, 0, -1], [2, 1, 0]], np.float32)
    F = tensordd.nn.functional
    xt, wt = session.tensor(x), session.tensor(w)
    np.testing.assert_array_equal(F.linear(xt, wt).numpy(), x @ w.T)
    np.testing.assert_array_equal(F.linear(xt, wt, session.tensor(np.ones(2, np.float32)))
                                  .numpy(), x @ w.T + 1)
    with tensordd.connect(daemon.endpoint, timeout=60) as other:
        with pytest.raises(ValueError, match="another session"):
            F.linear(xt, other.tensor(w))
        with pytest.raises(ValueError, match="another session"):
            F.linear(xt, wt, other.tensor(np.ones(2, np.float32)))
    with pytest.raises(TypeError):
        F.linear(xt, w)  # a numpy weight
    with pytest.raises(tensordd.Error) as e:
        F.linear(xt, session.tensor(np.ones((2, 4), np.float32))).numpy()
    assert "op linear" in str(e.value)
