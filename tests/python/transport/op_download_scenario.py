"""op_download_scenario -- op-then-download round trips and their failures, as a transcript.

Run by test_op_download_path.py twice, with the accelerator and with TENSORDD_PURE=1: each run
checks the values against numpy itself and prints one JSON transcript (values,
metadata, the class and message of every error, the session's state after it); the
test wants the two transcripts equal.

    python op_download_scenario.py ENDPOINT
"""
import hashlib
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # tests/python: the shared helpers

import tensordd  # noqa: E402
from tensordd import tensordd_pb2 as pb  # noqa: E402
from fakeserver import FakeServer, frame  # noqa: E402

out = []


def note(what, **kw):
    out.append({"what": what, **kw})


def arr_note(what, a, t=None):
    meta = None if t is None else [list(t._shape), str(t._dtype), str(t._device),
                                   t._requires_grad]
    note(what, dtype=str(a.dtype), shape=list(a.shape), writable=bool(a.flags.writeable),
         contiguous=bool(a.flags.c_contiguous), sha=hashlib.sha1(a.tobytes()).hexdigest(),
         meta=meta)


def err_note(what, fn):
    try:
        fn()
    except Exception as e:  # the class and message are the transcript
        note(what, error=type(e).__name__, code=getattr(e, "code", None), msg=str(e))
        return e
    note(what, error=None)
    return None


def values(s):
    rng = np.random.default_rng(11)
    for dtype in ["float32", "float64", "float16", "bfloat16", "int64", "int32", "int16",
                  "int8", "uint8", "bool"]:
        for shape in [(), (0,), (5,), (3, 0, 2), (2, 3, 4)]:
            a = np.asarray(rng.standard_normal(shape) * 40)
            a = a > 0 if dtype == "bool" else a.astype("float32" if dtype == "bfloat16" else dtype)
            t = s.tensor(a, dtype=dtype) if dtype == "bfloat16" else s.tensor(a)
            want = a
            if dtype == "bfloat16":  # the values bfloat16 holds (truncation is exact here)
                want = t.numpy()
                assert want.dtype == np.float32 and want.shape == a.shape
                np.testing.assert_allclose(want, a, rtol=1e-2, atol=1e-2)
            back = t.numpy()
            assert back.dtype == want.dtype and back.shape == want.shape, (dtype, shape)
            np.testing.assert_array_equal(back, want)
            arr_note(f"upload {dtype}{shape}", back, t)
            if dtype in ("float32", "float64", "float16", "bfloat16", "int64", "int32"):
                r = t.relu() if dtype != "int32" else t.neg()
                got = r.numpy()
                ref = np.where(want > 0, want, np.zeros_like(want)) if dtype != "int32" else -want
                assert got.dtype == ref.dtype and got.shape == ref.shape, (dtype, shape, got, ref)
                np.testing.assert_array_equal(got, ref)
                assert got.flags.writeable  # (a new array the caller owns)
                got[...] = 0  # and it is not shared with anything
                np.testing.assert_array_equal(r.numpy(), ref)
                arr_note(f"op {dtype}{shape}", ref, r)
    # a non-contiguous source (a strided view is sent contiguous)
    a = np.arange(24, dtype=np.float32).reshape(4, 6)[:, ::2].T
    t = s.tensor(a)
    np.testing.assert_array_equal(t.relu().numpy(), np.maximum(a, 0))
    arr_note("strided source", t.numpy(), t)
    # a payload many reads long (past any read buffer)
    big = np.linspace(-1, 1, 300_001, dtype=np.float32)
    r = s.tensor(big).relu()
    got = r.numpy()
    np.testing.assert_array_equal(got, np.maximum(big, 0))
    arr_note("big", got, r)
    # many round trips with releases riding along
    x = s.tensor(np.array([-1.0, 2.0, -3.0, 4.0], np.float32))
    for _ in range(300):
        got = x.relu().numpy()
    np.testing.assert_array_equal(got, [0, 2, 0, 4])


def errors(s):
    x = s.tensor(np.ones(3, np.float32))
    y = s.tensor(np.ones(4, np.float32))
    ghost = tensordd.Tensor(s, 999_999)  # a handle never bound
    err_note("unknown handle", ghost.numpy)
    ghost._session = None  # (not released: never bound)
    err_note("after unknown handle", lambda: arr_note("ok", x.relu().numpy()))
    bad = x + y  # the daemon refuses it (shapes), reported at the next download
    err_note("op error at download", bad.relu().numpy)
    err_note("after op error", lambda: arr_note("ok", x.relu().numpy()))
    # pipelining: the first failure is the one reported, once
    b1 = s.op("matmul", x, y)
    b2 = x + y
    err_note("first error first", lambda: x.numpy())
    err_note("then", lambda: x.relu().numpy())
    del b1, b2, bad
    note("open", open=not s.closed)


def fake_answers(handler, what, timeout=10):
    srv = FakeServer(handler)
    try:
        s = tensordd.connect(srv.endpoint, timeout=timeout)
        x = s.tensor(np.ones(4, np.float32))
        err_note(what, lambda: x.relu().numpy())
        note(what + ": after", closed=s.closed)
        err_note(what + ": next call", lambda: x.numpy())
        s.close(raise_errors=False)
    finally:
        srv.close()


def info(req, shape=(4,), rid=None):
    r = pb.Response(id=req.id if rid is None else rid)
    r.tensor.handle = req.download.handle
    r.tensor.dtype = pb.DTYPE_F32
    r.tensor.shape.extend(shape)
    r.tensor.device.backend = "cpu"
    return r


def faults():
    def closes(srv, req, payload):
        return "close" if req.WhichOneof("body") == "download" else None

    def mid_payload(srv, req, payload):
        if req.WhichOneof("body") != "download":
            return None
        srv._conn.sendall(frame(info(req), b"\0" * 16)[:-6])  # the payload cut short
        return "close"

    def wrong_size(srv, req, payload):
        if req.WhichOneof("body") != "download":
            return None
        return [(info(req, shape=(5,)), b"\0" * 16)]

    def wrong_id(srv, req, payload):
        if req.WhichOneof("body") != "download":
            return None
        return [(info(req, rid=req.id + 7), b"\0" * 16)]

    def daemon_error(srv, req, payload):
        if req.WhichOneof("body") != "download":
            return None
        r = pb.Response(id=req.id)
        r.error.code = pb.UNKNOWN_HANDLE
        r.error.message = "no such tensor (fake)"
        r.error.request_id = req.id
        return [(r, b"")]

    def plain(srv, req, payload):
        if req.WhichOneof("body") != "download":
            return None
        return [(info(req), np.arange(4, dtype=np.float32).tobytes())]

    import time

    def silent(srv, req, payload):  # no answer to the download within the client's 0.3 s
        if req.WhichOneof("body") == "download":
            time.sleep(0.6)
            return "close"
        return None

    fake_answers(silent, "timed out", timeout=0.3)
    fake_answers(closes, "closed mid-call")
    fake_answers(mid_payload, "closed mid-payload")
    fake_answers(wrong_size, "payload size")
    fake_answers(wrong_id, "wrong id")
    fake_answers(daemon_error, "daemon error")
    fake_answers(plain, "unix plain")


def main():
    s = tensordd.connect(sys.argv[1], timeout=60)
    values(s)
    errors(s)
    s.close()
    faults()
    accel = sys.modules["tensordd._codec"].ACCELERATED
    print(json.dumps({"accelerated": accel, "transcript": out}))


if __name__ == "__main__":
    main()
