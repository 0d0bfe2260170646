"""The client stays honest after
every error.

- iteration and integer indexing are bounded by the real shape, asked from
  the daemon once when unknown (torch's IndexError);
- after the daemon stops (SIGTERM) the next call is the typed CLOSED error,
  never PROTOCOL_ERROR "got a reply to request #0";
- connect() reads $TENSORDD_ENDPOINT and $TENSORDD_TOKEN_FILE;
- device strings are validated when parsed (``x.to("float8")`` is a
  TypeError at once, saying what a device and a dtype look like);
- a local TypeError/ValueError (or an interruption) never leaves the session
  out of step with the daemon.
"""

from __future__ import annotations

import itertools
import os

import numpy as np
import pytest

import tensordd


def _x(session):
    return session.tensor(np.arange(12, dtype=np.float32).reshape(4, 3))


def test_iteration_ends_at_the_real_shape(session):
    y = _x(session) + 1  # an op output: its shape is not known to the client
    rows = list(itertools.islice(iter(y), 8))
    assert len(rows) == 4
    assert [r.shape for r in rows] == [(3,)] * 4
    np.testing.assert_array_equal(np.stack([r.numpy() for r in rows]),
                                  np.arange(12, dtype=np.float32).reshape(4, 3) + 1)
    assert len(list(y)) == 4


def test_iteration_asks_the_shape_once(session, monkeypatch):
    y = _x(session) * 2
    calls = []
    real = session._describe_tensor
    monkeypatch.setattr(session, "_describe_tensor", lambda t: (calls.append(t), real(t)))
    rows = list(y)
    assert [r.shape for r in rows] == [(3,)] * 4  # derived locally, no more Describes
    assert len(calls) == 1


@pytest.mark.parametrize("key", [10, -5, (0, 3), (slice(None), -4), (0, 0, 0)])
def test_out_of_range_index_is_indexerror(session, key):
    y = _x(session) + 1
    with pytest.raises(IndexError):
        y[key]
    session.sync()  # nothing was sent that fails later


def test_in_range_indices_of_unknown_shapes(session):
    y = _x(session) + 1
    ref = np.arange(12, dtype=np.float32).reshape(4, 3) + 1
    assert y[-1].shape == (3,)
    np.testing.assert_array_equal(y[-1].numpy(), ref[-1])
    np.testing.assert_array_equal(y[1:, -2].numpy(), ref[1:, -2])
    assert float(y[3, 2]) == ref[3, 2]


def test_len_and_0d(session):
    y = _x(session).sum()
    with pytest.raises(TypeError):
        len(y)
    with pytest.raises(TypeError):
        iter(y).__next__()
    assert len(_x(session) + 0) == 4


def test_sigterm_then_typed_closed(start_daemon):
    d = start_daemon("--cpu-devices", "1")
    s = tensordd.connect(d.endpoint, timeout=30)
    t = s.tensor(np.ones(3, np.float32))
    y = t + 1
    np.testing.assert_array_equal(y.numpy(), [2, 2, 2])
    assert d.stop() == 0
    with pytest.raises(tensordd.ConnectionClosedError) as info:
        (y * 2).numpy()
    assert "PROTOCOL" not in str(info.value) and "request #0" not in str(info.value)
    # and every call after it, fire-and-forget ones included
    with pytest.raises(tensordd.ConnectionClosedError):
        s.tensor(np.ones(2, np.float32))
    with pytest.raises(tensordd.ConnectionClosedError):
        s.sync()
    s.close()  # harmless


def test_sigterm_then_fire_and_forget_then_sync(start_daemon):
    d = start_daemon("--cpu-devices", "1")
    s = tensordd.connect(d.endpoint, timeout=30)
    t = s.tensor(np.ones(3, np.float32))
    s.sync()
    assert d.stop() == 0
    with pytest.raises(tensordd.ConnectionClosedError):
        for _ in range(64):  # the writes may succeed until the kernel notices
            t = t + 1
        s.sync()


def test_connect_reads_tensordd_endpoint(daemon, monkeypatch):
    monkeypatch.setenv("TENSORDD_ENDPOINT", daemon.endpoint)
    monkeypatch.delenv("TENSORDD_TOKEN_FILE", raising=False)
    with tensordd.connect(timeout=30) as s:
        assert s.endpoint == daemon.endpoint
        assert (s.tensor([1.0, 2.0]) * 2).tolist() == [2.0, 4.0]


def test_connect_reads_tensordd_token_file(start_daemon, tmp_path, monkeypatch):
    good = tmp_path / "token"
    good.write_text("s3cret-token\n")
    os.chmod(good, 0o600)
    bad = tmp_path / "wrong"
    bad.write_text("not-it\n")
    os.chmod(bad, 0o600)
    d = start_daemon("--cpu-devices", "1", "--token-file", str(good))
    monkeypatch.setenv("TENSORDD_ENDPOINT", d.endpoint)
    monkeypatch.setenv("TENSORDD_TOKEN_FILE", str(good))
    with tensordd.connect(timeout=30) as s:
        s.sync()
    monkeypatch.setenv("TENSORDD_TOKEN_FILE", str(bad))
    with pytest.raises(tensordd.UnauthenticatedError):
        tensordd.connect(timeout=30)
    # an explicit token wins over the environment
    with tensordd.connect(token="s3cret-token", timeout=30) as s:
        s.sync()


def test_float8_is_a_typeerror_at_once(session):
    x = _x(session)
    with pytest.raises(TypeError) as info:
        x.to("float8")
    text = str(info.value)
    assert "device" in text and "dtype" in text and "cpu" in text and "float32" in text
    with pytest.raises(TypeError):
        session.tensor([1.0], device="float8")
    with pytest.raises(TypeError):
        tensordd.Device.parse("float8")
    with pytest.raises(ValueError):  # still a ValueError too, as before
        tensordd.Device.parse("cpu:x")
    session.sync()  # nothing went out
    assert x.to("cpu:1").device == "cpu:1"


def test_local_errors_leave_the_session_in_step(session):
    x = _x(session)
    before = session.stats()["errors"]
    attempts = [
        lambda: session.op("add", x, x, foo=object()),
        lambda: session.tensor(np.array(["a", "b"])),
        lambda: session.tensor([1.0], dtype="float8"),
        lambda: x.sum(dim="a"),
        lambda: x[1.5],
        lambda: x.to("bogus:zz"),
        lambda: tensordd.optim.SGD([x, 3], lr=0.1),
        lambda: session.zeros("a"),
        lambda: x & x,  # float tensors: no bitwise ops in the daemon
        lambda: x[[0, 9]],
    ]
    for attempt in attempts:
        with pytest.raises((TypeError, ValueError, IndexError)):
            attempt()
        session.sync()
    np.testing.assert_array_equal((x + 1).numpy(), np.arange(12).reshape(4, 3) + 1)
    assert session.stats()["errors"] == before


def test_interrupted_round_trip_is_closed_not_out_of_step(session, monkeypatch):
    """A KeyboardInterrupt between request and reply leaves the reply in the
    stream: the next call must not read it as its own."""
    x = _x(session)
    conn = session._conn
    real = conn.read_frame_head
    state = {"armed": True}

    def interrupted():
        if state["armed"]:
            state["armed"] = False
            raise KeyboardInterrupt
        return real()

    monkeypatch.setattr(conn, "read_frame_head", interrupted)
    with pytest.raises(KeyboardInterrupt):
        x.numpy()
    with pytest.raises(tensordd.ConnectionClosedError) as info:
        (x + 1).numpy()
    assert "interrupted" in str(info.value)
