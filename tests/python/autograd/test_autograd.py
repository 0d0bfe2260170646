"""Autodiff through the Python client against a real daemon (`--cpu-devices 2`):
backward, Gradients.get/remove/replace, the grad_replace mismatch matrix,
optimizers. Compared with PyTorch autograd at rtol=1e-5, atol=1e-6 (float32).
Skipped, with the reason shown, while the daemon answers Backward with
UNSUPPORTED_OP."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import tensordd
from helpers import require_autodiff, require_ops

torch = pytest.importorskip("torch")

rng = np.random.default_rng(7)


def randf(*shape):
    return rng.standard_normal(shape).astype(np.float32)


@pytest.fixture
def ad(session):
    require_autodiff(session)
    return session


def mlp_loss(s, x, w1, w2):
    return ((s.tensor(x) @ w1).relu() @ w2).sum()


def test_backward_matches_torch(ad):
    x, w1, w2 = randf(4, 3), randf(3, 5), randf(5, 2)
    W1 = ad.tensor(w1, requires_grad=True)
    W2 = ad.tensor(w2, requires_grad=True)
    assert W1.requires_grad and W2.requires_grad
    loss = mlp_loss(ad, x, W1, W2)
    assert loss.requires_grad
    grads = loss.backward()
    assert isinstance(grads, tensordd.Gradients)

    t1 = torch.tensor(w1, requires_grad=True)
    t2 = torch.tensor(w2, requires_grad=True)
    ((torch.tensor(x) @ t1).relu() @ t2).sum().backward()
    g1 = grads.get(W1)
    assert g1.shape == (3, 5) and g1.dtype == "float32" and g1.device == "cpu:0"
    np.testing.assert_allclose(g1.numpy(), t1.grad.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(grads.get(W2).numpy(), t2.grad.numpy(), rtol=1e-5, atol=1e-6)


def test_backward_with_grad_output_and_retain_graph(ad):
    w = randf(3, 3)
    W = ad.tensor(w, requires_grad=True)
    y = W * W
    go = randf(3, 3)
    g = y.backward(grad=ad.tensor(go), retain_graph=True).get(W)
    np.testing.assert_allclose(g.numpy(), 2 * w * go, rtol=1e-5, atol=1e-6)
    g2 = y.backward(grad=ad.tensor(go)).get(W)  # the graph was kept
    np.testing.assert_allclose(g2.numpy(), 2 * w * go, rtol=1e-5, atol=1e-6)


def test_gradient_accumulates_over_uses(ad):
    w = randf(4)
    W = ad.tensor(w, requires_grad=True)
    grads = (W * W + W).sum().backward()
    np.testing.assert_allclose(grads.get(W).numpy(), 2 * w + 1, rtol=1e-5, atol=1e-6)


def test_no_grad_and_detach_record_nothing(ad):
    W = ad.tensor(randf(3), requires_grad=True)
    with ad.no_grad():
        y = W * W
    assert not y.requires_grad
    require_ops(ad, "detach")
    assert not W.detach().requires_grad


def test_detach_shares_data_and_cuts_the_graph(ad):
    w = randf(5)
    W = ad.tensor(w, requires_grad=True)
    D = W.detach()
    assert D.shape == W.shape and D.dtype == W.dtype and not D.requires_grad
    grads = (W * D).sum().backward()
    t = torch.tensor(w, requires_grad=True)
    (t * t.detach()).sum().backward()
    np.testing.assert_allclose(grads.get(W).numpy(), t.grad.numpy(), rtol=1e-5, atol=1e-6)
    # As in PyTorch, the detached tensor shares W's bytes: an optimizer step on W shows in D.
    tensordd.optim.SGD([W], lr=0.5).step(grads)
    with torch.no_grad():
        t -= 0.5 * t.grad
    np.testing.assert_allclose(D.numpy(), t.detach().numpy(), rtol=1e-5, atol=1e-6)


def test_remove_and_replace(ad):
    w = randf(2, 2)
    W = ad.tensor(w, requires_grad=True)
    grads = (W * W).sum().backward()
    new = randf(2, 2)
    grads.replace(W, ad.tensor(new))
    np.testing.assert_array_equal(grads.get(W).numpy(), new)
    removed = grads.remove(W)
    np.testing.assert_array_equal(removed.numpy(), new)


@pytest.mark.parametrize("grad_device,shape,dtype,error,detail", [
    ("ref:0", (3,), np.float32, tensordd.BackendMismatchError, ("cpu:0", "ref:0")),
    ("cpu:1", (3,), np.float32, tensordd.DeviceMismatchError, ("cpu:0", "cpu:1")),
    ("cpu:0", (3,), np.float64, tensordd.DTypeMismatchError, ("float32", "float64")),
    ("cpu:0", (4,), np.float32, tensordd.ShapeMismatchError, ((3,), (4,))),
])
def test_replace_mismatch_matrix(ad, grad_device, shape, dtype, error, detail):
    w = randf(3)
    W = ad.tensor(w, requires_grad=True)
    grads = (W * W).sum().backward()
    before = grads.get(W).numpy()

    def in_use():
        ad.sync()  # also sends the pending releases
        return {dev: m["bytes_in_use"] for dev, m in ad.stats()["memory"].items()}

    mem = in_use()
    bad = ad.tensor(np.ones(shape, dtype), device=grad_device)
    with pytest.raises(error) as info:
        grads.replace(W, bad)
    e = info.value
    got = (e.target, e.grad) if error is not tensordd.ShapeMismatchError else (e.expected, e.got)
    assert got == detail
    assert "grad_replace" in str(e)
    np.testing.assert_array_equal(grads.get(W).numpy(), before)  # nothing installed
    del bad, e, info  # the traceback holds the offered gradient too
    gc.collect()
    assert in_use() == mem  # nothing leaked
    # the fix: move the gradient where the target lives
    if error is tensordd.BackendMismatchError or error is tensordd.DeviceMismatchError:
        grads.replace(W, ad.tensor(np.ones(3, np.float32), device=grad_device).to("cpu:0"))
        np.testing.assert_array_equal(grads.get(W).numpy(), np.ones(3))


def test_replace_with_a_poisoned_gradient_is_refused(ad):
    """A gradient of the target's shape, device and dtype made by a failed request (a
    gather with an index out of range) is POISONED, naming the gather; nothing is
    installed and the session goes on."""
    W = ad.tensor(randf(2, 3), requires_grad=True)
    grads = (W * W).sum().backward()
    before = grads.get(W).numpy()
    idx = ad.tensor(np.array([[0, 7, 1], [2, 0, 1]], np.int64))
    bad = ad.op("gather", ad.tensor(np.ones((2, 3), np.float32)), idx, dim=1)
    with pytest.raises(tensordd.InvalidArgumentError):
        ad.sync()  # the gather's own failure, told once
    with pytest.raises(tensordd.PoisonedError) as info:
        grads.replace(W, bad)
    assert info.value.handle == bad.handle and info.value.origin_code == "INVALID_ARGUMENT"
    assert "grad_replace" in str(info.value)
    np.testing.assert_array_equal(grads.get(W).numpy(), before)  # nothing installed
    good = randf(2, 3)
    grads.replace(W, ad.tensor(good))  # the session lives on
    np.testing.assert_array_equal(grads.get(W).numpy(), good)


def test_replace_checks_run_in_the_documented_order(ad):
    """The first failing check is the answer: the handle's kind, then the dtype before
    the shape, and a poisoned gradient's mismatch before its poison."""
    W = ad.tensor(randf(2, 3), requires_grad=True)
    grads = (W * W).sum().backward()
    before = grads.get(W).numpy()
    not_grads = tensordd.Gradients(ad, W.handle)  # a tensor's handle where a Gradients' goes
    not_grads._released = True  # (not ours to release)
    with pytest.raises(tensordd.WrongHandleKindError):
        not_grads.replace(W, ad.tensor(randf(2, 3)))
    with pytest.raises(tensordd.DTypeMismatchError):
        grads.replace(W, ad.tensor(np.ones(4, np.float64)))
    idx = ad.tensor(np.array([[0, 9], [1, 2]], np.int64))
    bad = ad.op("gather", ad.tensor(np.ones((2, 3), np.float32)), idx, dim=1)  # (2, 2)
    with pytest.raises(tensordd.InvalidArgumentError):
        ad.sync()
    with pytest.raises(tensordd.ShapeMismatchError):
        grads.replace(W, bad)
    np.testing.assert_array_equal(grads.get(W).numpy(), before)


def test_released_gradients_are_unknown(ad):
    W = ad.tensor(randf(3), requires_grad=True)
    grads = (W * W).sum().backward()
    grads.release()
    with pytest.raises(tensordd.UnknownHandleError) as info:
        grads.get(W)
    assert info.value.handle == grads.handle


def test_to_device_keeps_the_graph(ad):
    w = randf(3)
    W = ad.tensor(w, requires_grad=True)
    grads = (W.to("cpu:1") * 2).sum().backward()
    g = grads.get(W)
    assert g.device == "cpu:0"
    np.testing.assert_allclose(g.numpy(), np.full(3, 2), rtol=0)


def _optimizer(kind, params, **attrs):
    """An optimizer of that kind with exactly these attrs (any the daemon takes)."""
    cls = {"adam": tensordd.optim.Adam, "adamw": tensordd.optim.AdamW}[kind]
    opt = tensordd.optim.Optimizer.__new__(cls)
    tensordd.optim.Optimizer.__init__(opt, params, **attrs)
    return opt


@pytest.mark.parametrize("make,torch_make", [
    (lambda p: tensordd.optim.SGD(p, lr=0.1), lambda p: torch.optim.SGD(p, lr=0.1)),
    (lambda p: tensordd.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=0.01, nesterov=True),
     lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=0.01, nesterov=True)),
    (lambda p: tensordd.optim.Adam(p, lr=0.01), lambda p: torch.optim.Adam(p, lr=0.01)),
    (lambda p: tensordd.optim.AdamW(p, lr=0.01), lambda p: torch.optim.AdamW(p, lr=0.01)),
    # amsgrad: a small beta2 and a large lr let exp_avg_sq fall between steps,
    # so the running maximum differs from it (without amsgrad these fail)
    (lambda p: tensordd.optim.Adam(p, lr=0.2, betas=(0.9, 0.0), amsgrad=True),
     lambda p: torch.optim.Adam(p, lr=0.2, betas=(0.9, 0.0), amsgrad=True)),
    (lambda p: tensordd.optim.Adam(p, lr=0.3, betas=(0.8, 0.3), weight_decay=0.1, amsgrad=True),
     lambda p: torch.optim.Adam(p, lr=0.3, betas=(0.8, 0.3), weight_decay=0.1, amsgrad=True)),
    # (a decay of lr * weight_decay = 0.5 halves the weights, and so the
    # gradients, each step: exp_avg_sq falls whatever the data)
    (lambda p: tensordd.optim.AdamW(p, lr=0.5, betas=(0.8, 0.0), weight_decay=1.0, amsgrad=True),
     lambda p: torch.optim.AdamW(p, lr=0.5, betas=(0.8, 0.0), weight_decay=1.0, amsgrad=True)),
    # maximize: the daemon takes it, the classes don't (so the base class sends it)
    (lambda p: _optimizer("adam", p, lr=0.3, beta1=0.8, beta2=0.3, weight_decay=0.1,
                          maximize=True, amsgrad=True),
     lambda p: torch.optim.Adam(p, lr=0.3, betas=(0.8, 0.3), weight_decay=0.1, maximize=True,
                                amsgrad=True)),
    (lambda p: _optimizer("adamw", p, lr=0.3, beta1=0.8, beta2=0.0, weight_decay=0.5,
                          maximize=True, amsgrad=True),
     lambda p: torch.optim.AdamW(p, lr=0.3, betas=(0.8, 0.0), weight_decay=0.5, maximize=True,
                                 amsgrad=True)),
], ids=["sgd", "sgd-nesterov", "adam", "adamw", "adam-amsgrad", "adam-amsgrad-wd",
        "adamw-amsgrad", "adam-amsgrad-maximize", "adamw-amsgrad-maximize"])
def test_optimizers_match_torch(ad, make, torch_make):
    x, w1, w2 = randf(8, 3), randf(3, 5), randf(5, 2)
    W1 = ad.tensor(w1, requires_grad=True)
    W2 = ad.tensor(w2, requires_grad=True)
    opt = make([W1, W2])
    t1 = torch.tensor(w1, requires_grad=True)
    t2 = torch.tensor(w2, requires_grad=True)
    topt = torch_make([t1, t2])
    for _ in range(3):
        opt.step(mlp_loss(ad, x, W1, W2).backward())
        topt.zero_grad()
        ((torch.tensor(x) @ t1).relu() @ t2).sum().backward()
        topt.step()
    np.testing.assert_allclose(W1.numpy(), t1.detach().numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(W2.numpy(), t2.detach().numpy(), rtol=1e-4, atol=1e-5)
