"""RMSprop and Adagrad in the daemon, and parameter groups with
per-group options for every optimizer, held to torch 1.13's torch.optim.

The same two-layer model (float32) is trained here and in torch for a few steps,
each side taking its gradient from its own backward pass, and the parameters must
agree within rtol 1e-5, atol 1e-6 (float32 rounding differs between the daemon's
loops and torch's kernels by an ulp or two a step) for each optimizer x

* one group with non-default options;
* two groups with different options (lr, weight_decay, momentum, betas, ...);
* options changed mid-run through ``param_groups[i][...]`` (lr by a scheduler, and
  the other per-group options by hand): the daemon's optimizer is not recreated
  (its handle stays) and its state carries on;
* a state_dict round trip: 3 steps, ``state_dict()`` pickled, a fresh session
  loads model and optimizer and steps 3 more, against 6 uninterrupted torch steps;
  and our state_dict values against torch's own.

Plus the typed refusals of bad options (at creation and at a step, which then
changes nothing) and the foreach (ops) path, which cuda takes, against the loop.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import tensordd
from tensordd import tensordd_pb2 as pb

torch = pytest.importorskip("torch")

RTOL, ATOL = 1e-5, 1e-6
RNG = np.random.default_rng(14)
X = RNG.standard_normal((16, 5)).astype(np.float32)
Y = RNG.standard_normal((16, 3)).astype(np.float32)
W1 = (RNG.standard_normal((5, 4)) * 0.5).astype(np.float32)
B1 = (RNG.standard_normal(4) * 0.1).astype(np.float32)
W2 = (RNG.standard_normal((4, 3)) * 0.5).astype(np.float32)

# (class name, options used for one group, options of a second group)
CASES = {
    "SGD": (dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01),
            dict(lr=0.1, momentum=0.5, dampening=0.2, nesterov=False, weight_decay=0.0)),
    "Adam": (dict(lr=0.01, betas=(0.8, 0.99), weight_decay=0.01, amsgrad=True),
             dict(lr=0.03, betas=(0.5, 0.9), eps=1e-6)),
    "AdamW": (dict(lr=0.01, weight_decay=0.1),
              dict(lr=0.02, betas=(0.7, 0.95), weight_decay=0.0, amsgrad=True)),
    "RMSprop": (dict(lr=0.01, alpha=0.9, momentum=0.5, centered=True, weight_decay=0.01),
                dict(lr=0.005, alpha=0.95, eps=1e-6)),
    "Adagrad": (dict(lr=0.1, lr_decay=0.01, weight_decay=0.01, initial_accumulator_value=0.1),
                dict(lr=0.05, eps=1e-6)),
}
# per optimizer: options changed mid-run (besides lr), as a user edits param_groups
CHANGES = {
    "SGD": dict(momentum=0.7, weight_decay=0.02),
    "Adam": dict(betas=(0.85, 0.98), weight_decay=0.0),
    "AdamW": dict(weight_decay=0.05, eps=1e-6),
    "RMSprop": dict(alpha=0.8, weight_decay=0.0),
    "Adagrad": dict(lr_decay=0.1, eps=1e-8),
}


def _ours(session, device="cpu:0"):
    return [session.tensor(a, requires_grad=True, device=device) for a in (W1, B1, W2)]


def _theirs():
    return [torch.tensor(a, requires_grad=True) for a in (W1, B1, W2)]


def _loss_ours(session, ps, i, device="cpu:0"):
    w1, b1, w2 = ps
    lo = (i * 4) % 16
    x = session.tensor(X[lo:lo + 8], device=device)
    y = session.tensor(Y[lo:lo + 8], device=device)
    return ((((x @ w1) + b1).tanh() @ w2 - y) ** 2).mean()


def _loss_theirs(ps, i):
    w1, b1, w2 = ps
    lo = (i * 4) % 16
    return ((torch.tanh(torch.tensor(X[lo:lo + 8]) @ w1 + b1) @ w2
             - torch.tensor(Y[lo:lo + 8])) ** 2).mean()


def _groups(ps, kind, two):
    """One group of all parameters, or two: [w1, b1] with the second options, [w2]."""
    if not two:
        return [{"params": ps}]
    return [{"params": ps[:2], **CASES[kind][1]}, {"params": ps[2:]}]


def _step_both(session, ours, theirs, opt, topt, i, device="cpu:0"):
    opt.zero_grad()
    _loss_ours(session, ours, i, device).backward()
    opt.step()
    topt.zero_grad()
    _loss_theirs(theirs, i).backward()
    topt.step()


def _close(ours, theirs, what=""):
    for k, (a, b) in enumerate(zip(ours, theirs)):
        np.testing.assert_allclose(a.numpy(), b.detach().numpy(), rtol=RTOL, atol=ATOL,
                                   err_msg=f"{what} parameter {k}")


@pytest.mark.parametrize("kind", sorted(CASES))
@pytest.mark.parametrize("two", [False, True], ids=["one_group", "two_groups"])
def test_matches_torch(session, kind, two):
    ours, theirs = _ours(session), _theirs()
    opts = CASES[kind][0]
    opt = getattr(tensordd.optim, kind)(_groups(ours, kind, two), **opts)
    topt = getattr(torch.optim, kind)(_groups(theirs, kind, two), **opts)
    # defaults filled in, as torch's groups
    for g, tg in zip(opt.param_groups, topt.param_groups):
        for key in tg:
            if key in g and key != "params":
                assert g[key] == tg[key], key
    for i in range(6):
        _step_both(session, ours, theirs, opt, topt, i)
    _close(ours, theirs, kind)


@pytest.mark.parametrize("kind", sorted(CASES))
def test_options_changed_mid_run(session, kind):
    """lr by a scheduler on every step, then every per-group option of CHANGES by
    hand on group 0: the same daemon optimizers step on with their state."""
    ours, theirs = _ours(session), _theirs()
    opts = CASES[kind][0]
    opt = getattr(tensordd.optim, kind)(_groups(ours, kind, True), **opts)
    topt = getattr(torch.optim, kind)(_groups(theirs, kind, True), **opts)
    handles = list(opt._handles)
    sched = tensordd.optim.lr_scheduler.ExponentialLR(opt, gamma=0.7)
    tsched = torch.optim.lr_scheduler.ExponentialLR(topt, gamma=0.7)
    for i in range(8):
        if i == 4:
            for g in (opt.param_groups[0], topt.param_groups[0]):
                g.update(CHANGES[kind])
        _step_both(session, ours, theirs, opt, topt, i)
        sched.step()
        tsched.step()
    assert opt._handles == handles  # no optimizer was recreated
    assert [g["lr"] for g in opt.param_groups] == [g["lr"] for g in topt.param_groups]
    _close(ours, theirs, kind)


@pytest.mark.parametrize("kind", sorted(CASES))
def test_lr_change_is_sent_with_the_step(session, kind):
    """param_groups[i]["lr"] = ... reaches the daemon as OptimizerStep's attrs,
    once, and nothing else is sent for options that did not change."""
    ours = _ours(session)
    opt = getattr(tensordd.optim, kind)(ours, **CASES[kind][0])
    sent = []
    real = opt._step_handle

    def spy(handle, grads, attrs=None):
        sent.append(dict(attrs or {}))
        return real(handle, grads, attrs)

    opt._step_handle = spy
    for i, lr in enumerate((None, 0.002, 0.002)):
        if lr is not None:
            opt.param_groups[0]["lr"] = lr
        opt.zero_grad()
        _loss_ours(session, ours, i).backward()
        opt.step()
    assert sent == [{}, {"lr": 0.002}, {}]


@pytest.mark.parametrize("kind", sorted(CASES))
def test_state_dict_round_trip_into_a_fresh_session(daemon, kind):
    opts = CASES[kind][0]
    theirs = _theirs()
    topt = getattr(torch.optim, kind)(_groups(theirs, kind, True), **opts)
    with tensordd.connect(daemon.endpoint) as s:
        ours = _ours(s)
        opt = getattr(tensordd.optim, kind)(_groups(ours, kind, True), **opts)
        for i in range(3):
            _step_both(s, ours, theirs, opt, topt, i)
        blob = pickle.dumps(({f"p{k}": p.numpy() for k, p in enumerate(ours)},
                             opt.state_dict()))
        # the state itself against torch's own
        ours_sd, theirs_sd = opt.state_dict(), topt.state_dict()
        assert set(ours_sd["state"]) == set(theirs_sd["state"])
        for k, st in theirs_sd["state"].items():
            assert set(ours_sd["state"][k]) == set(st), (k, set(st))
            for name, v in st.items():
                if name == "step":
                    assert ours_sd["state"][k]["step"] == int(v)
                elif v is not None:
                    np.testing.assert_allclose(ours_sd["state"][k][name], v.numpy(),
                                               rtol=RTOL, atol=ATOL, err_msg=name)
    params, sd = pickle.loads(blob)
    with tensordd.connect(daemon.endpoint) as s:
        ours = [s.tensor(params[f"p{k}"], requires_grad=True) for k in range(3)]
        opt = getattr(tensordd.optim, kind)(_groups(ours, kind, True), **opts)
        opt.load_state_dict(sd)
        for i in range(3, 6):
            _step_both(s, ours, theirs, opt, topt, i)
        _close(ours, theirs, kind)


@pytest.mark.parametrize("kind", ["RMSprop", "Adagrad"])
def test_torch_state_dict_loads(session, kind):
    """torch's own state_dict (tensors, step tensors) loads and steps on as torch."""
    opts = CASES[kind][0]
    theirs = _theirs()
    topt = getattr(torch.optim, kind)(theirs, **opts)
    for i in range(3):
        topt.zero_grad()
        _loss_theirs(theirs, i).backward()
        topt.step()
    ours = [session.tensor(p.detach().numpy(), requires_grad=True) for p in theirs]
    opt = getattr(tensordd.optim, kind)(ours, **opts)
    opt.load_state_dict(topt.state_dict())
    for i in range(3, 6):
        _step_both(session, ours, theirs, opt, topt, i)
    _close(ours, theirs, kind)


@pytest.mark.parametrize("kind", ["RMSprop", "Adagrad", "Adam", "SGD"])
def test_foreach_path_matches_the_loop(session, kind):
    """The ops path (what cuda runs) against the host loop and torch."""
    opts = dict(CASES[kind][0])
    ours, theirs = _ours(session), _theirs()
    cls = getattr(tensordd.optim, kind)
    opt = cls(_groups(ours, kind, True), **opts)
    for g in opt.param_groups:
        g["foreach"] = True  # sent with the first step
    topt = getattr(torch.optim, kind)(_groups(theirs, kind, True), **opts)
    for i in range(5):
        if i == 3:
            for g in (opt.param_groups[1], topt.param_groups[1]):
                g["lr"] = g["lr"] * 0.5
        _step_both(session, ours, theirs, opt, topt, i)
    _close(ours, theirs, kind)


def test_add_param_group(session):
    ours, theirs = _ours(session), _theirs()
    opt = tensordd.optim.RMSprop(ours[:2], lr=0.01, momentum=0.3)
    topt = torch.optim.RMSprop(theirs[:2], lr=0.01, momentum=0.3)
    _step_both(session, ours, theirs, opt, topt, 0)
    opt.add_param_group({"params": [ours[2]], "lr": 0.02, "centered": True})
    topt.add_param_group({"params": [theirs[2]], "lr": 0.02, "centered": True})
    for key, v in topt.param_groups[1].items():  # torch's defaults filled in as ours
        if key in opt.param_groups[1] and key != "params":
            assert opt.param_groups[1][key] == v, key
    assert opt.param_groups[1]["momentum"] == 0.3  # a default filled in
    for i in range(1, 4):
        _step_both(session, ours, theirs, opt, topt, i)
    _close(ours, theirs)
    with pytest.raises(ValueError, match="more than one"):
        opt.add_param_group({"params": [ours[0]]})


@pytest.mark.parametrize("kind,attrs,name", [
    ("rmsprop", {"alpha": -0.1}, "alpha"),
    ("rmsprop", {"momentum": -1.0}, "momentum"),
    ("rmsprop", {"eps": float("nan")}, "eps"),
    ("rmsprop", {"betas": [0.9, 0.99]}, "betas"),
    ("adagrad", {"lr_decay": -1.0}, "lr_decay"),
    ("adagrad", {"initial_accumulator_value": -0.5}, "initial_accumulator_value"),
    ("adagrad", {"momentum": 0.9}, "momentum"),
    ("adagrad", {"lr": -1.0}, "lr"),
    ("adam", {"alpha": 0.9}, "alpha"),
    ("sgd", {"lr": 0.1, "centered": True}, "centered"),
])
def test_bad_options_are_typed_errors(session, kind, attrs, name):
    """The daemon's refusals, at creation (raw requests, past the classes' own checks)."""
    w = session.tensor(W1, requires_grad=True)
    req = session._new_request()
    req.want_reply = True
    c = req.optimizer_create
    c.handle = session._new_handle()
    c.kind = kind
    c.params.append(w._handle)
    for k, v in attrs.items():
        tensordd.session._set_attr(c.attrs.add(), k, v)
    with pytest.raises(tensordd.InvalidArgumentError, match=name) as e:
        session._roundtrip(req, tensordd.session._Call("optimizer_create", ()))
    assert e.value.code == pb.ErrorCode.Name(pb.INVALID_ARGUMENT)
    session._release_later(c.handle)


@pytest.mark.parametrize("kind", ["RMSprop", "Adagrad"])
def test_bad_option_at_a_step_changes_nothing(session, kind):
    ours = _ours(session)
    opt = getattr(tensordd.optim, kind)(ours, **CASES[kind][0])
    opt.zero_grad()
    _loss_ours(session, ours, 0).backward()
    opt.step()
    before = [p.numpy() for p in ours]
    state = opt.state_dict()["state"]
    opt.param_groups[0]["lr"] = -0.5
    opt.param_groups[0]["weight_decay"] = 0.5
    opt.zero_grad()
    _loss_ours(session, ours, 1).backward()
    with pytest.raises(tensordd.InvalidArgumentError, match="lr"):
        opt.step()
    for a, b in zip(ours, before):
        np.testing.assert_array_equal(a.numpy(), b)
    after = opt.state_dict()["state"]
    for k in state:
        for name, v in state[k].items():
            np.testing.assert_array_equal(after[k][name], v)
    # with the lr put right, the step runs with the options as torch would have them
    opt.param_groups[0]["lr"] = 0.01
    opt.step()
    assert not np.array_equal(ours[0].numpy(), before[0])


def test_classes_refuse_as_torch():
    for kind, bad in (("RMSprop", dict(alpha=-1.0)), ("RMSprop", dict(lr=-1.0)),
                      ("Adagrad", dict(lr_decay=-1.0)),
                      ("Adagrad", dict(initial_accumulator_value=-1.0))):
        with pytest.raises(ValueError):
            getattr(torch.optim, kind)([torch.zeros(1, requires_grad=True)], **bad)
        with pytest.raises(ValueError):
            getattr(tensordd.optim, kind)([object()], **bad)


@pytest.mark.parametrize("foreach", [False, True], ids=["loop", "ops"])
@pytest.mark.parametrize("kind,opts", [
    ("RMSprop", dict(lr=0.01, alpha=0.9, momentum=0.5, centered=True, weight_decay=0.1,
                     maximize=True)),
    ("Adagrad", dict(lr=0.1, lr_decay=0.05, initial_accumulator_value=0.3, weight_decay=0.1,
                     maximize=True)),
])
def test_float64_and_maximize(session, kind, opts, foreach):
    """float64 parameters follow torch's arithmetic to the last bits (rtol 1e-12): the
    update is torch's, op for op, on either path."""
    w0 = np.random.default_rng(64).standard_normal((7, 3))
    w = session.tensor(w0, requires_grad=True)
    opt = getattr(tensordd.optim, kind)([w], **opts)
    opt.param_groups[0]["foreach"] = foreach
    tw = torch.tensor(w0, requires_grad=True)
    topt = getattr(torch.optim, kind)([tw], **opts)
    for _ in range(10):
        opt.zero_grad()
        (w * w * w).sum().backward()
        opt.step()
        topt.zero_grad()
        (tw * tw * tw).sum().backward()
        topt.step()
    np.testing.assert_allclose(w.numpy(), tw.detach().numpy(), rtol=1e-12, atol=1e-15)
