"""backward() raises at the call what the client can know, as torch does (typed as the
daemon's errors), instead of at a later unrelated line: a loss of more than one element without grad=, a loss that does
not require grad, a second backward of a loss whose graph the first one freed.
set_grad_enabled works both ways torch's does: a call, and a ``with`` block."""

from __future__ import annotations

import numpy as np
import pytest

import tensordd


def _x(session):
    return session.tensor(np.arange(4, dtype=np.float32), requires_grad=True)


def test_non_scalar_loss_raises_at_the_call(session):
    x = _x(session)
    y = x * 2  # (its shape is not known to the client: described at backward)
    with pytest.raises(tensordd.InvalidArgumentError, match="only for scalar outputs"):
        y.backward()
    g = (x * 2).sum().backward()  # the session carries on
    np.testing.assert_array_equal(g.get(x).numpy(), [2, 2, 2, 2])


def test_untracked_loss_raises_at_the_call(session):
    x = session.tensor(np.arange(4, dtype=np.float32))
    y = (x * 3).sum(0)  # (shape unknown to the client: described, untracked)
    with pytest.raises(tensordd.NotTrackedError, match="does not require grad"):
        y.backward()


def test_second_backward_without_retain_graph_raises_at_the_call(session):
    x = _x(session)
    loss = (x * x).sum()
    loss.backward()
    with pytest.raises(tensordd.InvalidArgumentError, match="second time"):
        loss.backward()
    loss2 = (x * x).sum()
    loss2.backward(retain_graph=True)
    g = loss2.backward()  # retained: a second backward is fine
    np.testing.assert_array_equal(g.get(x).numpy(), 2 * np.arange(4, dtype=np.float32))


def test_reduced_losses_stay_pipelined(session):
    """A full reduction or a reduced loss is 0-d: the check needs no round trip."""
    x = _x(session)
    assert (x * 2).sum()._shape == ()
    assert (x * 2).mean()._shape == ()
    t = session.tensor(np.array([1, 0]))
    logits = session.tensor(np.ones((2, 3), np.float32), requires_grad=True)
    assert tensordd.nn.functional.cross_entropy(logits, t)._shape == ()
    assert tensordd.nn.functional.cross_entropy(logits, t, reduction="none")._shape is None


def test_set_grad_enabled_as_a_context_manager(session):
    tensordd.set_default_session(session)
    assert tensordd.is_grad_enabled()
    with tensordd.set_grad_enabled(False):
        assert not tensordd.is_grad_enabled()
        y = _x(session) * 2
    assert tensordd.is_grad_enabled()
    tensordd.set_grad_enabled(False)  # as a call: stays off
    assert not tensordd.is_grad_enabled()
    with session.set_grad_enabled(True):
        assert session.grad_enabled
    assert not session.grad_enabled
    tensordd.set_grad_enabled(True)
    session.sync()
    assert y.numpy().tolist() == [0, 2, 4, 6]
