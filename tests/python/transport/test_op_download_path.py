"""The accelerator's whole op-then-download path (tensordd._speedups op and numpy: the
request frames, one send, the answer read and parsed in C, its payload read straight
into the array) against the pure-Python path and numpy.

op_download_scenario.py runs once with the accelerator and once with TENSORDD_PURE=1 on the
same daemon; each run checks its values against numpy (dtypes, 0-d, empty, strided
sources, bool, float16, bfloat16, a payload of 1.2 MB) and writes a transcript of
values, metadata and every error's class and message (an unknown handle, a daemon-side
error in the op, the first of two pipelined failures, a connection closed before the
answer and inside the payload, a payload of the wrong size, an answer to another
request, an error answer, no answer within the timeout); the two transcripts must be
equal."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import tensordd
from tensordd import _codec

HERE = os.path.dirname(os.path.abspath(__file__))


def _run(endpoint, pure):
    env = dict(os.environ)
    env.pop("TENSORDD_PURE", None)
    if pure:
        env["TENSORDD_PURE"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    out = subprocess.run([sys.executable, os.path.join(HERE, "op_download_scenario.py"), endpoint],
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_both_paths_give_the_same_values_and_errors(daemon):
    pure = _run(daemon.endpoint, True)
    assert pure["accelerated"] is False
    try:
        from tensordd import _speedups  # noqa: F401
    except ImportError:
        pytest.skip("tensordd._speedups is not built: the pure-Python run alone passed")
    accel = _run(daemon.endpoint, False)
    assert accel["accelerated"] is True
    assert len(accel["transcript"]) == len(pure["transcript"])
    for a, p in zip(accel["transcript"], pure["transcript"]):
        assert a == p
    seen = {e["what"]: e for e in accel["transcript"]}
    assert seen["unknown handle"]["code"] == "UNKNOWN_HANDLE"
    assert seen["op error at download"]["code"] == "SHAPE_MISMATCH"
    assert "matmul" in seen["first error first"]["msg"]  # the first failure, not the add
    assert seen["then"]["error"] is None and seen["open"]["open"]
    assert seen["closed mid-call"]["code"] == "CLOSED"
    assert "during a payload" in seen["closed mid-payload"]["msg"]
    assert seen["payload size"]["code"] == "PROTOCOL_ERROR"
    assert seen["wrong id"]["code"] == "PROTOCOL_ERROR"
    assert seen["daemon error"]["code"] == "UNKNOWN_HANDLE"
    assert seen["daemon error: after"]["closed"] is False
    assert seen["timed out"]["code"] == "TIMEOUT" and seen["timed out: after"]["closed"]


needs_c = pytest.mark.skipif(_codec.numpy is None,
                             reason="the accelerator is not built or TENSORDD_PURE=1")


@needs_c
def test_the_accelerated_path_is_the_one_taken(session):
    """op and numpy of the accelerator run (no Python round trip) on a plain socket, and
    step aside where the Python path must run (a resumable session's journal)."""
    x = session.tensor(np.array([-1.0, 2.0], np.float32))
    r = _codec.op(session._state, session, "relu", [x.handle])
    assert type(r) is tensordd.Tensor and r._shape is None
    plain = tensordd.Tensor(session, r.handle)  # (made by __init__, which C does not run)
    for name in type(r).__slots__[:-1]:
        a, b = getattr(r, name), getattr(plain, name)
        assert a is b or (name == "_handle" and a == b), name
    plain._session = None  # (never released: r holds the handle)
    calls = []
    conn = session._conn
    real = type(conn).read_frame_head

    def counting(self):
        calls.append(1)
        return real(self)

    type(conn).read_frame_head = counting
    try:
        np.testing.assert_array_equal(r.numpy(), [0.0, 2.0])
    finally:
        type(conn).read_frame_head = real
    assert calls == []  # the answer was read in C
    assert r._shape == (2,) and r._dtype == "float32" and str(r._device) == "cpu:0"
    conn._journal = []  # (as enable_resume leaves it): not the accelerator's
    try:
        assert _codec.op(session._state, session, "relu", [x.handle]) is None
        assert _codec.numpy(session._state, session, r) is None
    finally:
        conn._journal = None


def test_an_interrupted_download_closes_the_session(fake):
    """A signal handler's exception while the download waits for its answer (either
    path: the C one checks signals when recv is interrupted): the session is closed (the
    answer would answer the next call) and the exception goes on."""
    import signal
    import threading

    release = threading.Event()

    def stall(srv, req, payload):
        if req.WhichOneof("body") == "download":
            release.wait(10)
            return "close"
        return None

    srv = fake(stall)
    s = tensordd.connect(srv.endpoint, timeout=20)
    x = s.tensor(np.ones(4, np.float32))

    def boom(signum, frame):
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGALRM, boom)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        with pytest.raises(KeyboardInterrupt):
            x.relu().numpy()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        release.set()
    assert s.closed
    with pytest.raises(tensordd.ConnectionClosedError) as e:
        x.numpy()
    assert "interrupted during download(#" in str(e.value)
