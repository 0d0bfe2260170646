"""A request that names a new handle and fails still binds it.

The daemon binds every new id of a failed request (Op and Upload outputs,
ToDevice, Backward's Gradients, Grad/GradRemove outputs, OptimizerCreate) to a
poisoned placeholder of the right kind: the client's later Release of it
succeeds, and using it says POISONED naming the request that failed. Before,
Backward, Grad, GradRemove and OptimizerCreate left their id unbound, so the
Release that the client's garbage collection sends later was answered
UNKNOWN_HANDLE and the next, unrelated call raised it.
"""

from __future__ import annotations

import gc

import numpy as np
import pytest

import tensordd
from tensordd.optim import SGD, Optimizer


def session_state(s):
    """(handles, bytes_in_use) of this session, after pending releases are done."""
    s.sync()
    (mine,) = [x for x in s.stats()["session_list"] if x["session_id"] == s.session_id]
    return mine["handles"], mine["bytes_in_use"]


def tensors(s):
    x = s.tensor(np.ones((1, 1, 4, 4), np.float32), requires_grad=True)
    w = s.tensor(np.ones((1, 1, 3, 3), np.float32))
    return x, w


def then_unrelated_call_works(s, x):
    gc.collect()
    np.testing.assert_array_equal((x * 2).numpy(), np.full((1, 1, 4, 4), 2, np.float32))
    s.sync()


def test_bad_conv_attribute_then_backward_and_step_are_typed(session):
    s = session
    x, w = tensors(s)
    try:
        s.op("conv2d", x, w, padding="sideways").sum().backward()  # not a padding
        s.sync()  # (a pipelined backward reports it here)
    except tensordd.Error:
        pass
    gc.collect()
    (x * 2).numpy()  # was: UnknownHandleError: handle 5 is not known to this session


# Each way a Backward can fail, with the error it must raise.
def _nonscalar(s, x, w):
    (x * 3).backward()


def _untracked(s, x, w):
    w.sum().backward()


def _graph_freed(s, x, w):
    loss = (x * 3).sum()
    loss.backward()
    loss.backward()  # the graph was freed by the first pass


def _raw_backward(s, loss_handle):
    """A Backward naming any loss id, its Gradients owned (and released) by the client."""
    req = s._new_request()
    req.backward.loss = loss_handle
    grads = tensordd.autograd.Gradients(s, s._new_handle())
    req.backward.grads = grads.handle
    s._roundtrip(req, tensordd.session._Call("backward", ()))
    return grads


def _released(s, x, w):
    loss = (x * 3).sum()
    h = loss._handle
    del loss  # released with the next request
    gc.collect()
    _raw_backward(s, h)


def _poisoned(s, x, w):
    bad = s.op("reshape", x, shape=[7])  # fails when queued
    with pytest.raises(tensordd.Error):
        s.sync()  # the pending error is told; bad stays poisoned
    bad.sum().backward()


def _pending_error(s, x, w):
    s.op("reshape", x, shape=[7])  # fails when queued: the backward reports it
    (x * 3).sum().backward()


def _bad_grad_output(s, x, w):
    (x * 3).backward(s.tensor(np.ones(3, np.float32)))


BACKWARD_FAILURES = {
    "nonscalar": (_nonscalar, tensordd.errors.InvalidArgumentError),
    "untracked": (_untracked, tensordd.errors.NotTrackedError),
    "graph_freed": (_graph_freed, tensordd.Error),
    "released": (_released, tensordd.errors.UnknownHandleError),
    "poisoned": (_poisoned, tensordd.errors.PoisonedError),
    "pending_error": (_pending_error, tensordd.Error),
    "bad_grad_output": (_bad_grad_output, tensordd.errors.ShapeMismatchError),
}


@pytest.mark.parametrize("how", sorted(BACKWARD_FAILURES))
def test_failed_backward_releases_cleanly(session, how):
    s = session
    fn, exc = BACKWARD_FAILURES[how]
    x, w = tensors(s)
    base = session_state(s)
    with pytest.raises(exc):
        fn(s, x, w)
        s.sync()  # a pipelined backward's error surfaces here
    then_unrelated_call_works(s, x)
    assert session_state(s) == base  # the placeholder was charged and given back


def test_failed_backward_gradients_say_poisoned(session):
    s = session
    x, w = tensors(s)
    y = x * 3
    with pytest.raises(tensordd.errors.InvalidArgumentError) as origin:
        grads = tensordd.autograd.backward(y)
        s.sync()  # a pipelined backward's error surfaces here
    # The Gradients object outlives the failure when the caller kept it.
    req = s._new_request()
    req.backward.loss = y._handle
    grads = tensordd.autograd.Gradients(s, s._new_handle())
    req.backward.grads = grads.handle
    with pytest.raises(tensordd.errors.InvalidArgumentError):
        s._roundtrip(req, tensordd.session._Call("backward", ()))
    with pytest.raises(tensordd.errors.PoisonedError) as e:
        grads.get(x)
    assert e.value.origin_request == req.id
    assert e.value.origin_code == "INVALID_ARGUMENT"
    assert origin.value.code == "INVALID_ARGUMENT"
    grads.release()
    then_unrelated_call_works(s, x)


def _fresh_grads(s, x):
    return (x * 3).sum().backward()


def _get_untracked(s, x, w, g):
    g.get(w)


def _get_no_gradient(s, x, w, g):
    y = s.tensor(np.ones(2, np.float32), requires_grad=True)
    g.get(y)


def _remove_untracked(s, x, w, g):
    g.remove(w)


def _remove_twice(s, x, w, g):
    g.remove(x)
    g.remove(x)


def _get_released_grads(s, x, w, g):
    g.release()
    g.get(x)


def _get_unknown_tensor(s, x, w, g):
    t = s.tensor(np.ones(2, np.float32), requires_grad=True)
    h = t._handle
    del t
    gc.collect()
    req = s._new_request()
    req.grad.grads = g.handle
    req.grad.tensor = h
    req.grad.output = s._new_handle()
    out = tensordd.Tensor(s, req.grad.output)  # released by the client when it dies
    s._roundtrip(req, tensordd.session._Call("grad", ()))
    del out


GRAD_FAILURES = {
    "get_untracked": (_get_untracked, tensordd.errors.NotTrackedError),
    "get_no_gradient": (_get_no_gradient, tensordd.errors.InvalidArgumentError),
    "remove_untracked": (_remove_untracked, tensordd.errors.NotTrackedError),
    "remove_twice": (_remove_twice, tensordd.errors.InvalidArgumentError),
    "get_released_grads": (_get_released_grads, tensordd.errors.UnknownHandleError),
    "get_unknown_tensor": (_get_unknown_tensor, tensordd.errors.UnknownHandleError),
}


@pytest.mark.parametrize("how", sorted(GRAD_FAILURES))
def test_failed_grad_releases_cleanly(session, how):
    s = session
    fn, exc = GRAD_FAILURES[how]
    x, w = tensors(s)
    g = _fresh_grads(s, x)
    base = session_state(s)
    with pytest.raises(exc):
        fn(s, x, w, g)
    then_unrelated_call_works(s, x)
    del g
    gc.collect()
    handles, _ = session_state(s)
    assert handles == base[0] - 1  # only the Gradients are gone


def test_grad_output_of_failed_grad_says_poisoned(session):
    s = session
    x, w = tensors(s)
    g = _fresh_grads(s, x)
    req = s._new_request()
    req.grad.grads = g.handle
    req.grad.tensor = w._handle
    req.grad.output = s._new_handle()
    out = tensordd.Tensor(s, req.grad.output)
    with pytest.raises(tensordd.errors.NotTrackedError):
        s._roundtrip(req, tensordd.session._Call("grad", ()))
    with pytest.raises(tensordd.errors.PoisonedError) as e:
        (out + 1).numpy()
    assert e.value.origin_request == req.id
    assert e.value.origin_code == "NOT_TRACKED"
    del out
    then_unrelated_call_works(s, x)


class _AnyOptimizer(Optimizer):
    kind = "sgd"

    def __init__(self, params, kind="sgd", **hyper):
        self.kind = kind
        super().__init__(params, **hyper)


OPTIMIZER_FAILURES = {
    "unknown_attribute": lambda x, w: _AnyOptimizer([x], lr=0.1, bogus=1.0),
    "bad_value": lambda x, w: _AnyOptimizer([x], lr=-1.0),
    "unknown_kind": lambda x, w: _AnyOptimizer([x], kind="nope", lr=0.1),
    "duplicate_params": lambda x, w: SGD([x, x], lr=0.1),
    "untracked_param": lambda x, w: SGD([w], lr=0.1),
}


@pytest.mark.parametrize("how", sorted(OPTIMIZER_FAILURES))
def test_failed_optimizer_create_releases_cleanly(session, how):
    s = session
    x, w = tensors(s)
    base = session_state(s)
    with pytest.raises(tensordd.Error):
        OPTIMIZER_FAILURES[how](x, w)
    then_unrelated_call_works(s, x)
    assert session_state(s) == base


def test_failed_optimizer_handle_says_poisoned(session):
    s = session
    x, w = tensors(s)
    req = s._new_request()
    req.want_reply = True
    req.optimizer_create.handle = s._new_handle()
    req.optimizer_create.kind = "sgd"
    req.optimizer_create.params.extend([x._handle, x._handle])
    with pytest.raises(tensordd.errors.InvalidArgumentError):
        s._roundtrip(req, tensordd.session._Call("optimizer_create", ()))
    g = _fresh_grads(s, x)
    step = s._new_request()
    step.optimizer_step.optimizer = req.optimizer_create.handle
    step.optimizer_step.grads = g.handle
    with pytest.raises(tensordd.errors.PoisonedError) as e:
        s._roundtrip(step, tensordd.session._Call("optimizer_step", ()))
    assert e.value.origin_request == req.id
    s._release_later(req.optimizer_create.handle)
    then_unrelated_call_works(s, x)


def test_failed_ops_upload_to_device_release_cleanly(session):
    s = session
    x, w = tensors(s)
    base = session_state(s)
    with pytest.raises(tensordd.Error):
        s.op("reshape", x, shape=[7]).numpy()
    with pytest.raises(tensordd.Error):
        s.op("no_such_op", x).numpy()
    with pytest.raises(tensordd.Error):
        x.to("nosuch:0").numpy()
    with pytest.raises(tensordd.Error):
        s.tensor(np.ones(4, np.float32), device="nosuch:0").numpy()
    then_unrelated_call_works(s, x)
    assert session_state(s) == base


def test_invalid_new_id_stays_handle_in_use(session):
    s = session
    x, w = tensors(s)
    req = s._new_request()
    req.backward.loss = (x * 3).sum()._handle
    req.backward.grads = w._handle  # in use: not a new id, and must not be replaced
    with pytest.raises(tensordd.errors.HandleInUseError):
        s._roundtrip(req, tensordd.session._Call("backward", ()))
    np.testing.assert_array_equal(w.numpy(), np.ones((1, 1, 3, 3), np.float32))
    then_unrelated_call_works(s, x)
