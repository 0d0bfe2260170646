"""Client behaviour checked byte by byte against a fake server (no daemon needed):
framing, Hello, asynchrony and batching, payloads, error mapping, attributes."""

from __future__ import annotations

import gc
import socket
import struct

import numpy as np
import pytest

import tensordd
from fakeserver import frame, ok
from tensordd import _wire
from tensordd import tensordd_pb2 as pb


# ---------------------------------------------------------------- framing

def test_header_layout_matches_frame_h():
    hdr = _wire.encode_header(0x01020304, 0x0A0B0C0D0E0F1011)
    assert len(hdr) == 16
    assert hdr == b"TDD\x01" + struct.pack("<I", 0x01020304) + struct.pack("<Q", 0x0A0B0C0D0E0F1011)


def test_header_roundtrip_and_checks():
    assert _wire.decode_header(_wire.encode_header(12, 1 << 40)) == (12, 1 << 40)
    with pytest.raises(_wire.FrameError, match="magic"):
        _wire.decode_header(b"TDD\x02" + bytes(12))
    with pytest.raises(_wire.FrameError, match="exceeds"):
        _wire.decode_header(_wire.encode_header(_wire.MAX_MESSAGE + 1, 0))


@pytest.mark.parametrize("endpoint,expected", [
    ("tcp://127.0.0.1:7070", (socket.AF_INET, ("127.0.0.1", 7070))),
    ("tcp://localhost:1", (socket.AF_INET, ("localhost", 1))),
    ("tcp://[::1]:7070", (socket.AF_INET, ("::1", 7070))),
    ("unix:///run/tensordd.sock", (socket.AF_UNIX, "/run/tensordd.sock")),
])
def test_parse_endpoint(endpoint, expected):
    assert _wire.parse_endpoint(endpoint) == expected


@pytest.mark.parametrize("bad", ["127.0.0.1:7070", "tcp://host", "tcp://host:x", "tcp://:80",
                                 "tcp://h:70000", "unix://", "http://x:1"])
def test_parse_endpoint_rejects(bad):
    with pytest.raises(ValueError):
        _wire.parse_endpoint(bad)


# ---------------------------------------------------------------- device, dtypes

def test_device_parse_format_equality():
    d = tensordd.Device.parse("cpu:1")
    assert (d.backend, d.ordinal, str(d)) == ("cpu", 1, "cpu:1")
    assert d == tensordd.Device("cpu", 1) == "cpu:1"
    assert d != "cpu:0" and d != tensordd.Device("ref", 1)
    assert tensordd.Device.parse("ref") == "ref:0"
    assert len({d, tensordd.Device("cpu", 1), tensordd.Device("cpu", 0)}) == 2
    with pytest.raises(ValueError):
        tensordd.Device.parse("cpu:x")
    with pytest.raises(AttributeError):
        d.ordinal = 3


# ---------------------------------------------------------------- errors

def test_every_error_code_has_its_own_class():
    seen = set()
    for name, number in pb.ErrorCode.items():
        if number == pb.OK:
            continue
        cls = tensordd.error_class(number)
        assert cls is not tensordd.Error and issubclass(cls, tensordd.Error), name
        assert cls.code == name and tensordd.error_class(name) is cls
        assert getattr(tensordd, cls.__name__) is cls and cls.__name__ in tensordd.__all__
        seen.add(cls)
    assert len(seen) == len(pb.ErrorCode.items()) - 1
    for name in ["BackendMismatchError", "DeviceMismatchError", "DTypeMismatchError",
                 "ShapeMismatchError", "NotTrackedError", "UnknownHandleError",
                 "WrongHandleKindError", "UnsupportedOpError", "UnsupportedDTypeError",
                 "DeviceUnavailableError", "PoisonedError", "ResourceExhaustedError",
                 "ProtocolError", "FrameTooLargeError", "VersionMismatchError",
                 "UnauthenticatedError", "InvalidArgumentError", "InternalError",
                 "HandleInUseError"]:
        assert issubclass(getattr(tensordd, name), tensordd.Error)


def test_error_details_from_proto():
    e = pb.Error(code=pb.BACKEND_MISMATCH, message="backends differ", request_id=7)
    e.backend_mismatch.target.backend, e.backend_mismatch.target.ordinal = "cpu", 0
    e.backend_mismatch.grad.backend, e.backend_mismatch.grad.ordinal = "ref", 0
    exc = tensordd.errors.error_from_proto(e, "grad_replace(#1, #2, #3)")
    assert isinstance(exc, tensordd.BackendMismatchError)
    assert (exc.target, exc.grad) == ("cpu:0", "ref:0")
    assert exc.code == "BACKEND_MISMATCH" and exc.request_id == 7 and exc.message == "backends differ"
    assert "grad_replace(#1, #2, #3)" in str(exc) and "BACKEND_MISMATCH" in str(exc)

    e = pb.Error(code=pb.DTYPE_MISMATCH)
    e.dtype_mismatch.target, e.dtype_mismatch.grad = pb.DTYPE_F32, pb.DTYPE_F64
    exc = tensordd.errors.error_from_proto(e)
    assert (exc.target, exc.grad) == ("float32", "float64")

    e = pb.Error(code=pb.POISONED)
    e.poisoned.handle, e.poisoned.origin_request, e.poisoned.origin_code = 9, 4, pb.SHAPE_MISMATCH
    exc = tensordd.errors.error_from_proto(e)
    assert isinstance(exc, tensordd.PoisonedError)
    assert (exc.handle, exc.origin_request, exc.origin_code) == (9, 4, "SHAPE_MISMATCH")

    e = pb.Error(code=pb.RESOURCE_EXHAUSTED)
    e.resource_exhausted.resource, e.resource_exhausted.requested = "memory", 10
    e.resource_exhausted.available = 5
    exc = tensordd.errors.error_from_proto(e)
    assert (exc.resource, exc.requested, exc.available) == ("memory", 10, 5)

    e = pb.Error(code=pb.INVALID_ARGUMENT)
    e.invalid_argument.argument = "dim"
    assert tensordd.errors.error_from_proto(e).argument == "dim"

    exc = tensordd.errors.error_from_proto(pb.Error(code=999, message="from the future"))
    assert type(exc) is tensordd.Error and exc.code == "UNKNOWN(999)"


# ---------------------------------------------------------------- sessions on a fake server

def test_hello_is_first_and_carries_version_token_name(fake):
    srv = fake()
    s = tensordd.connect(srv.endpoint, token="sekrit", timeout=10)
    assert s.session_id == 42 and s.server == "fake 0" and s.version == 1
    s.close()
    req, _ = srv.requests[0]
    assert req.WhichOneof("body") == "hello" and req.id == 1
    assert (req.hello.min_version, req.hello.max_version) == (1, 1)
    assert req.hello.token == "sekrit" and req.hello.client_name == "tensordd-python"
    assert srv.bodies()[-1] == "goodbye"
    assert s.closed


def test_ops_are_async_ids_ascend_and_outputs_are_client_allocated(fake):
    srv = fake()
    with tensordd.connect(srv.endpoint, timeout=10) as s:
        a = s.tensor(np.ones((2, 3), np.float32))
        b = s.tensor(np.ones((2, 3), np.float32))
        c = a + b
        d = c.relu().sum()
        assert len(srv.requests) == 1  # only Hello: nothing flushed before a sync
        s.sync()
    bodies = srv.bodies()
    # the temporary c.relu() died at once: its release rides with the sync
    assert bodies == ["hello", "upload", "upload", "op", "op", "op", "release", "sync", "goodbye"]
    relu_out = srv.requests[4][0].op.outputs[0]
    assert list(srv.requests[6][0].release.handles) == [relu_out]
    ids = [r.id for r, _ in srv.requests]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    for r, _ in srv.requests[1:6]:
        assert not r.want_reply
    ops = [r.op for r, b in srv.requests if b == "op" or r.WhichOneof("body") == "op"]
    assert [o.op for o in ops] == ["add", "relu", "sum"]
    assert list(ops[0].inputs) == [a.handle, b.handle] and list(ops[0].outputs) == [c.handle]
    assert list(ops[2].outputs) == [d.handle]
    handles = [a.handle, b.handle, c.handle, d.handle]
    assert handles[0] >= 1 and len(set(handles)) == 4


@pytest.mark.parametrize("shape,dtype", [((2, 3), np.float32), ((300, 300), np.float32),
                                         ((), np.float64), ((0, 4), np.float32),
                                         ((5,), np.int64), ((3, 2), np.bool_),
                                         ((70000,), np.int32)])
def test_upload_sends_exact_bytes(fake, shape, dtype):
    srv = fake()
    rng = np.random.default_rng(0)
    arr = (rng.standard_normal(shape) * 10).astype(dtype)
    with tensordd.connect(srv.endpoint, timeout=10) as s:
        t = s.tensor(arr, device="cpu:1", requires_grad=True)
        assert t.shape == shape and t.dtype == np.dtype(dtype).name and t.device == "cpu:1"
        s.sync()
    req, payload = srv.requests[1]
    up = req.upload
    assert tuple(up.shape) == shape and (up.device.backend, up.device.ordinal) == ("cpu", 1)
    assert up.requires_grad and up.handle == t.handle
    assert payload == arr.tobytes()


def test_upload_of_non_contiguous_array_and_python_lists(fake):
    srv = fake()
    base = np.arange(12, dtype=np.float32).reshape(3, 4)
    with tensordd.connect(srv.endpoint, timeout=10) as s:
        kept = [s.tensor(base.T), s.tensor([[1.5, 2.5]])]
        assert kept[1].dtype == "float32"  # Python floats default to float32, as in torch
        kept.append(s.tensor(np.arange(3, dtype=">f4")))  # big-endian input is converted
        s.sync()
    assert srv.requests[1][1] == np.ascontiguousarray(base.T).tobytes()
    assert srv.requests[2][1] == np.array([[1.5, 2.5]], np.float32).tobytes()
    assert srv.requests[3][1] == np.arange(3, dtype=np.float32).tobytes()


def _tensor_reply(req, arr, wire_dtype=None):
    r = pb.Response(id=req.id)
    r.tensor.handle = req.download.handle
    r.tensor.dtype = wire_dtype or tensordd.dtypes.to_wire(arr.dtype)
    r.tensor.shape.extend(arr.shape)
    r.tensor.device.backend = "cpu"
    return [(r, arr.tobytes())]


@pytest.mark.parametrize("shape", [(2, 3), (512, 1024), (), (0,)])
def test_download_fills_array(fake, shape):
    data = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    srv = fake(lambda srv, req, p: _tensor_reply(req, data) if req.HasField("download") else None)
    with tensordd.connect(srv.endpoint, timeout=10) as s:
        t = s.tensor(np.zeros(shape, np.float32))
        out = t.numpy()
        assert out.dtype == np.float32 and out.shape == shape
        np.testing.assert_array_equal(out, data)
        out2 = t.numpy()  # the stream stays in step after a large payload
        np.testing.assert_array_equal(out2, data)


def test_download_bfloat16_widens_to_float32(fake):
    values = np.array([1.0, -2.5, 0.15625], np.float32)
    bits = (values.view(np.uint32) >> 16).astype(np.uint16)
    srv = fake(lambda srv, req, p: _tensor_reply(req, bits, pb.DTYPE_BF16)
               if req.HasField("download") else None)
    with tensordd.connect(srv.endpoint, timeout=10) as s:
        out = s.tensor(np.zeros(3, np.float32)).numpy()
    np.testing.assert_array_equal(out, values)


def test_op_output_shape_is_described_lazily_and_cached(fake):
    def handler(srv, req, payload):
        if req.HasField("describe"):
            r = pb.Response(id=req.id)
            r.tensor.handle = req.describe.handle
            r.tensor.dtype = pb.DTYPE_F32
            r.tensor.shape.extend([4, 5])
            r.tensor.device.backend, r.tensor.device.ordinal = "cpu", 1
            return [(r, b"")]
        return None

    srv = fake(handler)
    with tensordd.connect(srv.endpoint, timeout=10) as s:
        a = s.tensor(np.ones((4, 3), np.float32))
        b = s.tensor(np.ones((3, 5), np.float32))
        c = a @ b
        assert c._brief() == f"tensordd.Tensor(#{c.handle})"  # nothing asked yet
        assert c.shape == (4, 5) and c.dtype == "float32" and c.device == "cpu:1"
        assert not c.requires_grad and c.ndim == 2 and c.numel() == 20 and len(c) == 4
    assert srv.bodies().count("describe") == 1


def test_release_is_batched_with_the_next_request(fake):
    srv = fake()
    with tensordd.connect(srv.endpoint, timeout=10) as s:
        ts = [s.tensor(np.ones(2, np.float32)) for _ in range(5)]
        handles = [t.handle for t in ts]
        del ts
        gc.collect()
        assert len(srv.requests) == 1  # nothing sent yet: releases wait for a request
        s.sync()
    assert srv.bodies() == ["hello"] + ["upload"] * 5 + ["release", "sync", "goodbye"]
    rel = srv.requests[6][0]
    assert sorted(rel.release.handles) == sorted(handles) and not rel.want_reply


def test_error_names_the_failing_call_and_session_survives(fake):
    state = {}

    def handler(srv, req, payload):
        if req.HasField("sync") and "reported" not in state:
            state["add_id"] = next(r.id for r, _ in srv.requests if r.op.op == "add")
            state["reported"] = True
            r = pb.Response(id=req.id)
            r.error.code = pb.SHAPE_MISMATCH
            r.error.message = "add: operand shapes differ"
            r.error.request_id = state["add_id"]
            r.error.shape_mismatch.expected.extend([2, 3])
            r.error.shape_mismatch.got.extend([4, 5])
            return [(r, b"")]
        return None

    srv = fake(handler)
    with tensordd.connect(srv.endpoint, timeout=10) as s:
        a = s.tensor(np.ones((2, 3), np.float32))
        b = s.tensor(np.ones((4, 5), np.float32))
        c = a + b
        with pytest.raises(tensordd.ShapeMismatchError) as info:
            s.sync()
        e = info.value
        assert (e.expected, e.got) == ((2, 3), (4, 5))
        assert e.request_id == state["add_id"]
        assert f"op add(#{a.handle}, #{b.handle}) -> #{c.handle}" in str(e)
        s.sync()  # the session goes on
    assert srv.bodies()[-1] == "goodbye"


def test_attribute_encoding(fake):
    srv = fake()
    with tensordd.connect(srv.endpoint, timeout=10) as s:
        x = s.tensor(np.ones((2, 3), np.float32))
        s.op("custom", x, i=3, f=0.5, b=True, ints=(1, -2), floats=[0.5, 2], s="mean",
             skipped=None, npint=np.int64(4), dtype="float64", device="cpu:1", num_outputs=2)
        x.sum(dim=1, keepdim=True)
        x + 2
        3 - x
        s.sync()
    ops = [r.op for r, _ in srv.requests if r.WhichOneof("body") == "op"]
    attrs = {a.name: a for a in ops[0].attrs}
    assert set(attrs) == {"i", "f", "b", "ints", "floats", "s", "npint"}
    assert attrs["i"].i == 3 and attrs["f"].f == 0.5 and attrs["b"].WhichOneof("value") == "b"
    assert list(attrs["ints"].ints.v) == [1, -2] and list(attrs["floats"].floats.v) == [0.5, 2.0]
    assert attrs["s"].s == "mean" and attrs["npint"].i == 4
    assert ops[0].dtype == pb.DTYPE_F64 and ops[0].device.ordinal == 1 and len(ops[0].outputs) == 2
    sum_attrs = {a.name: a for a in ops[1].attrs}
    assert list(sum_attrs["dim"].ints.v) == [1] and sum_attrs["keepdim"].b is True
    add = ops[2]  # a Python int goes as an int (the tensor's dtype decides, as in torch)
    assert add.op == "add" and len(add.inputs) == 1 and add.attrs[0].name == "other" \
        and add.attrs[0].WhichOneof("value") == "i" and add.attrs[0].i == 2
    assert [o.op for o in ops[3:]] == ["neg", "add"] and ops[4].attrs[0].i == 3
    with pytest.raises(TypeError):
        s.op("x", x, bad=object())


def test_creation_ops_name_device_dtype_shape(fake):
    srv = fake()
    with tensordd.connect(srv.endpoint, timeout=10) as s:
        z = s.zeros(2, 3, device="cpu:1", dtype="float32", requires_grad=True)
        s.ones((4,))
        s.full((2, 2), 7)
        s.randn(3)
        s.arange(5)
        assert z.device == "cpu:1"
        s.sync()
    ops = [r.op for r, _ in srv.requests if r.WhichOneof("body") == "op"]
    assert [o.op for o in ops] == ["zeros", "ones", "full", "randn", "arange"]
    assert list(ops[0].attrs[0].ints.v) == [2, 3] and ops[0].requires_grad
    assert ops[0].device.ordinal == 1 and ops[0].dtype == pb.DTYPE_F32
    assert ops[1].device.backend == "cpu" and ops[1].dtype == pb.DTYPE_INVALID
    assert {a.name: a.i for a in ops[4].attrs} == {"start": 0, "end": 5, "step": 1}
    assert ops[2].attrs[1].name == "value" and ops[2].attrs[1].i == 7


def test_no_grad_sends_set_grad_mode(fake):
    srv = fake()
    with tensordd.connect(srv.endpoint, timeout=10) as s:
        with s.no_grad():
            assert not s.grad_enabled
            with s.no_grad():
                pass
        assert s.grad_enabled
        s.sync()
    modes = [r.set_grad_mode.enabled for r, _ in srv.requests
             if r.WhichOneof("body") == "set_grad_mode"]
    assert modes == [False, True]


def test_autodiff_and_optimizer_requests(fake):
    def handler(srv, req, payload):
        if req.HasField("grad"):
            r = pb.Response(id=req.id)
            r.tensor.handle = req.grad.output
            r.tensor.dtype = pb.DTYPE_F32
            r.tensor.shape.extend([3])
            r.tensor.device.backend = "cpu"
            return [(r, b"")]
        return None

    srv = fake(handler)
    with tensordd.connect(srv.endpoint, timeout=10) as s:
        w = s.tensor(np.ones(3, np.float32), requires_grad=True)
        loss = (w * w).sum()
        grads = loss.backward(retain_graph=True)
        g = grads.get(w)
        assert g.shape == (3,)
        grads.replace(w, g)
        grads.remove(w)
        opt = tensordd.optim.SGD([w], lr=0.1, momentum=0.9, nesterov=True)
        opt.step(grads)
        tensordd.optim.AdamW([w], lr=0.01)
    reqs = {r.WhichOneof("body"): r for r, _ in srv.requests}
    assert reqs["backward"].backward.loss == loss.handle and reqs["backward"].backward.retain_graph
    assert reqs["backward"].backward.grads == grads.handle
    assert (reqs["grad"].grad.grads, reqs["grad"].grad.tensor) == (grads.handle, w.handle)
    assert reqs["grad_replace"].grad_replace.grad == g.handle
    assert reqs["grad_remove"].grad_remove.tensor == w.handle
    creates = [r.optimizer_create for r, _ in srv.requests
               if r.WhichOneof("body") == "optimizer_create"]
    assert [c.kind for c in creates] == ["sgd", "adamw"]
    sgd = {a.name: a for a in creates[0].attrs}
    assert sgd["lr"].f == pytest.approx(0.1) and sgd["nesterov"].b and sgd["momentum"].f == 0.9
    adamw = {a.name: a.f for a in creates[1].attrs}
    assert adamw == pytest.approx({"lr": 0.01, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8,
                                   "weight_decay": 0.01})
    assert reqs["optimizer_step"].optimizer_step.optimizer == opt.handle


def test_connection_lost_while_waiting(fake):
    srv = fake(lambda srv, req, p: "close" if req.HasField("sync") else None)
    s = tensordd.connect(srv.endpoint, timeout=10)
    with pytest.raises(tensordd.ConnectionClosedError):
        s.sync()
    assert s.closed
    with pytest.raises(tensordd.ConnectionClosedError):
        s.zeros(2)
    s.close()  # harmless


def test_timeout_raises_timed_out(fake):
    import threading
    gate = threading.Event()

    def handler(srv, req, payload):
        if req.HasField("sync"):
            gate.wait(5)
            return "close"
        return None

    srv = fake(handler)
    s = tensordd.connect(srv.endpoint, timeout=0.3)
    try:
        with pytest.raises(tensordd.TimedOutError):
            s.sync()
        assert s.closed
    finally:
        gate.set()


def test_final_error_before_hello_reply_is_raised(fake):
    def handler(srv, req, payload):
        r = pb.Response(id=0)
        r.error.code = pb.VERSION_MISMATCH
        r.error.version_mismatch.server_min = 2
        r.error.version_mismatch.server_max = 3
        return [(r, b"")]

    srv = fake(handler)
    with pytest.raises(tensordd.VersionMismatchError) as info:
        tensordd.connect(srv.endpoint, timeout=10)
    assert (info.value.server_min, info.value.server_max) == (2, 3)


def test_tensor_del_after_close_is_silent(fake):
    srv = fake()
    s = tensordd.connect(srv.endpoint, timeout=10)
    t = s.tensor(np.ones(2, np.float32))
    s.close()
    del t
    gc.collect()
    assert srv.bodies() == ["hello", "upload", "goodbye"]


def test_frame_helper_matches_client_encoding():
    req = pb.Request(id=3)
    req.sync.SetInParent()
    data = frame(req)
    assert data[:4] == b"TDD\x01" and data[16:] == req.SerializeToString()
    assert ok(5).id == 5
