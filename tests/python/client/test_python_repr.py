"""``repr(t)``/``str(t)`` show the values as torch does
(downloaded on demand; past 1000 elements summarised, and then only the
corners are gathered and downloaded) plus device, dtype and requires_grad;
and a repr never raises for the session's sake nor loses its error.

The text is held to torch 1.13's own repr of the same values (everything
before torch's ``dtype=`` suffix, which names torch's dtypes).
"""

from __future__ import annotations

import sys

import numpy as np
import pytest

import tensordd

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(5)
CASES = {
    "small": np.array([[3.5, -1.0, 2.0], [0.5, 7.0, -4.25]], np.float32),
    "integral": np.arange(6, dtype=np.float32).reshape(2, 3),
    "scalar": np.array(2.5, np.float32),
    "int64": np.arange(-4, 8, dtype=np.int64).reshape(3, 4),
    "bool": np.array([True, False, True]),
    "sci": np.array([1e-5, 3.0, 2e5], np.float32),
    "summary 2d": np.arange(2000, dtype=np.float32).reshape(40, 50) / 7,
    "summary 3d": RNG.standard_normal((20, 30, 40)).astype(np.float32),
    "summary 5d": RNG.standard_normal((2, 3, 4, 5, 20)).astype(np.float32),
    "summary int": RNG.integers(-5, 5, (7, 8, 9, 10)),
    "summary bool": np.arange(1500) % 3 == 0,
    "summary row": np.ones((3, 2000), np.float32),
}


def _torch_body(x) -> str:
    text = repr(torch.from_numpy(x))
    for cut in (",\n       dtype=torch", ", dtype=torch"):
        text = text.split(cut)[0]
    return text[:-1] if text.endswith(")") else text


@pytest.mark.parametrize("name", sorted(CASES))
def test_repr_is_torch_s(session, name):
    x = CASES[name]
    t = session.tensor(x)
    text = repr(t)
    assert text == str(t)
    dtype = {"float32": "float32", "int64": "int64", "bool": "bool"}[str(x.dtype)]
    suffix = f", device='cpu:0', dtype=tensordd.{dtype})"
    assert text.endswith(suffix), text
    assert text[:-len(suffix)] == _torch_body(x)


def test_repr_metadata(session):
    w = session.tensor(np.ones(2, np.float32), requires_grad=True)
    assert repr(w) == "tensor([1., 1.], device='cpu:0', dtype=tensordd.float32, requires_grad=True)"
    y = (w * 2).sum()  # an op's output: its shape and dtype are asked of the daemon
    assert repr(y) == "tensor(4., device='cpu:0', dtype=tensordd.float32, requires_grad=True)"
    b = session.tensor(np.array([1.5, -2.0], np.float32), dtype="bfloat16", device="cpu:1")
    assert repr(b) == "tensor([ 1.5000, -2.0000], device='cpu:1', dtype=tensordd.bfloat16)"
    p = tensordd.nn.Parameter(np.zeros(1, np.float32))
    assert repr(p).startswith("Parameter containing:\ntensor([0.], device='cpu:0'")


def test_big_tensors_download_only_their_corners(session):
    huge = session.zeros(2000, 1000)  # 8 MB
    before = session.stats()["bytes_sent"]
    text = repr(huge)
    sent = session.stats()["bytes_sent"] - before
    assert text.startswith("tensor([[0., 0., 0.,  ..., 0., 0., 0.],")
    assert text.count("\n") == 6 and "...," in text
    assert sent < 4096, sent  # 36 values, not 2e6
    w = session.randn(50, 40, requires_grad=True)
    assert repr(w).endswith("requires_grad=True)")
    # the corners are the tensor's own, printed with 4 digits after the point, as torch
    # prints them: fixed (0.7697), or scientific (7.6968e-01) when a corner is tiny or the
    # range wide, so within half a unit of the 4th digit of max(|value|, 1)
    shown = np.array([float(v) for v in repr(w).split("\n")[0][9:].split(",")[:3]])
    want = w.numpy()[0, :3].astype(np.float64)
    assert np.all(np.abs(shown - want) <= 0.5e-4 * np.maximum(np.abs(want), 1) * (1 + 1e-6)), \
        (shown, want)


def test_repr_of_a_failed_tensor_shows_the_failure(session):
    a = session.tensor(np.ones((2, 3), np.float32))
    c = a @ session.tensor(np.ones((4, 5), np.float32))  # fails in the daemon
    text = repr(c)
    assert text.startswith(f"tensordd.Tensor(#{c.handle}") and "POISONED" in text
    with pytest.raises(tensordd.ShapeMismatchError):  # the session's error is still there
        session.sync()
    session.sync()
    assert "POISONED" in repr(c) and "SHAPE_MISMATCH" in repr(c)
    np.testing.assert_array_equal((a * 2).numpy(), 2 * np.ones((2, 3)))


def test_repr_keeps_an_earlier_failure_for_the_next_sync(session):
    """A pending asynchronous error of an earlier request, which the daemon hands to
    the first synchronising request (here repr's download), is raised by the next
    synchronising call as if repr had not run; repr shows the values."""
    a = session.tensor(np.ones((2, 3), np.float32))
    bad = a @ a  # fails: nothing has synchronised since
    t = session.tensor(np.array([1.0, 2.0], np.float32)) + 1  # shape unknown: asked first
    assert repr(t) == "tensor([2., 3.], device='cpu:0', dtype=tensordd.float32)"
    with pytest.raises(tensordd.ShapeMismatchError) as info:
        session.sync()
    assert info.value.request_id and "matmul" in str(info.value)
    session.sync()  # raised once
    # with the values downloaded and summarised (the corner ops come after it)
    bad2 = a @ a
    big = session.ones(40, 50)
    assert repr(big).startswith("tensor([[1., 1., 1.,  ..., 1., 1., 1.],")
    with pytest.raises(tensordd.ShapeMismatchError):
        big.numpy()
    np.testing.assert_array_equal(big.numpy(), np.ones((40, 50)))
    del bad, bad2


def test_repr_inside_a_round_trip_does_not_start_one(session):
    """A debugger stopped inside the client (here: a trace function evaluating repr
    when the session is about to read a reply) sees the handle form; the session's
    replies stay in step."""
    t = session.tensor(np.array([1.0, 2.0], np.float32)) * 3
    for where in ("read_frame_head", "read_into"):  # the reply's head, a download's payload
        seen = []

        def tracer(frame, event, arg):
            if event == "call" and frame.f_code.co_name == where and not seen:
                seen.append(repr(t))
            return None

        sys.settrace(tracer)
        try:
            got = t.numpy()
        finally:
            sys.settrace(None)
        assert seen and seen[0].startswith(f"tensordd.Tensor(#{t.handle}"), seen
        assert "mid-call" in seen[0]
        np.testing.assert_array_equal(got, [3.0, 6.0])
    assert repr(t).startswith("tensor([3., 6.]")


def test_repr_of_a_closed_session(daemon):
    s = tensordd.connect(daemon.endpoint)
    t = s.tensor(np.ones(3, np.float32))
    s.close()
    assert repr(t) == f"tensordd.Tensor(#{t.handle}, shape=(3,), dtype=float32, device=cpu:0, " \
                      f"session closed)"
