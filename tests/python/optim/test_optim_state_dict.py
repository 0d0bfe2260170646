"""``opt.state_dict()``/``load_state_dict()`` carry the
optimizer's real state (momentum buffers, Adam moments, step counts), which
lives in the daemon (OptimizerState / OptimizerLoadState requests).

* checkpoint and resume: a torch-style training run checkpointed mid-way
  (model and optimizer state_dicts, pickled) and resumed in a fresh session
  with the torch idiom (model and optimizer made first, then both loaded) ends
  with the same parameters as an uninterrupted run, bit for bit (cpu);
* the values agree with torch 1.13's own state_dict after a few steps
  (SGD with momentum, Adam, AdamW with amsgrad: rtol 1e-5, atol 1e-7), and a
  torch state_dict loaded into ours steps on as torch does;
* bad state is a typed error that changes nothing, and exporting leaks no handle.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import tensordd
from tensordd import tensordd_pb2 as pb

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(12)
X = RNG.standard_normal((32, 6)).astype(np.float32)
Y = RNG.standard_normal((32, 2)).astype(np.float32)


def _model(seed):
    nn = tensordd.nn
    nn.init_seed(seed)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 2))


def _opt(kind, model):
    if kind == "sgd":
        return tensordd.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True)
    if kind == "adam":
        return tensordd.optim.Adam(model.parameters(), lr=0.01)
    return tensordd.optim.AdamW(model.parameters(), lr=0.01, amsgrad=True)


def _train(session, model, opt, sched, steps, start=0):
    x, y = session.tensor(X), session.tensor(Y)
    for i in range(start, start + steps):
        lo = (i * 8) % 32
        opt.zero_grad()
        out = model(x[lo:lo + 8])
        loss = ((out - y[lo:lo + 8]) ** 2).mean()
        loss.backward()
        opt.step()
        sched.step()


def _params(model):
    return [p.numpy() for p in model.parameters()]


@pytest.mark.parametrize("kind", ["sgd", "adam", "adamw"])
def test_checkpoint_resume_is_bit_exact(daemon, kind):
    steps, cut = 8, 3
    with tensordd.connect(daemon.endpoint) as s:
        m = _model(1)
        opt = _opt(kind, m)
        sched = tensordd.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
        _train(s, m, opt, sched, steps)
        want = _params(m)
    with tensordd.connect(daemon.endpoint) as s:
        m = _model(1)
        opt = _opt(kind, m)
        sched = tensordd.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
        _train(s, m, opt, sched, cut)
        ckpt = pickle.dumps({"model": {k: v.numpy() for k, v in m.state_dict().items()},
                             "opt": opt.state_dict(), "sched": sched.state_dict()})
        assert opt.state_dict()["state"], "the optimizer's state is in the checkpoint"
    with tensordd.connect(daemon.endpoint) as s:
        ckpt = pickle.loads(ckpt)
        m = _model(2)  # other initial values: all must come from the checkpoint
        opt = _opt(kind, m)
        sched = tensordd.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
        m.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["opt"])
        sched.load_state_dict(ckpt["sched"])
        _train(s, m, opt, sched, steps - cut, start=cut)
        got = _params(m)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def test_resume_without_the_state_differs(daemon):
    """The check above has teeth: the same resume with the state dropped (moments
    and step counts reset, what the old state_dict carried) is not bit-exact."""
    with tensordd.connect(daemon.endpoint) as s:
        m = _model(1)
        opt = _opt("adam", m)
        sched = tensordd.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
        _train(s, m, opt, sched, 5)
        want = _params(m)
        m = _model(1)
        opt = _opt("adam", m)
        sched = tensordd.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
        _train(s, m, opt, sched, 2)
        sd = opt.state_dict()
        sd["state"] = {}
        opt.load_state_dict(sd)
        assert opt.state_dict()["state"] == {}
        _train(s, m, opt, sched, 3, start=2)
        assert all(not np.array_equal(g, w) for g, w in zip(_params(m), want))


TORCH_OPTS = {
    "sgd": (lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, dampening=0.1),
            lambda ps: tensordd.optim.SGD(ps, lr=0.1, momentum=0.9, dampening=0.1)),
    "adam": (lambda ps: torch.optim.Adam(ps, lr=0.01, weight_decay=0.01),
             lambda ps: tensordd.optim.Adam(ps, lr=0.01, weight_decay=0.01)),
    "adamw": (lambda ps: torch.optim.AdamW(ps, lr=0.01, amsgrad=True),
              lambda ps: tensordd.optim.AdamW(ps, lr=0.01, amsgrad=True)),
}


def _pair(session):
    w0 = RNG.standard_normal((3, 4)).astype(np.float32)
    b0 = RNG.standard_normal(4).astype(np.float32)
    tw = [torch.tensor(w0, requires_grad=True), torch.tensor(b0, requires_grad=True)]
    dw = [session.tensor(w0, requires_grad=True), session.tensor(b0, requires_grad=True)]
    return tw, dw


def _step_both(session, tw, dw, topt, dopt, k):
    c = np.linspace(-1, 2, 12, dtype=np.float32).reshape(3, 4) * (k + 1)
    topt.zero_grad()
    dopt.zero_grad()
    ((tw[0] * tw[0] * torch.tensor(c)).sum() + (tw[1] ** 3).sum()).backward()
    ((dw[0] * dw[0] * session.tensor(c)).sum() + (dw[1] ** 3).sum()).backward()
    topt.step()
    dopt.step()


@pytest.mark.parametrize("kind", sorted(TORCH_OPTS))
def test_state_matches_torch(session, kind):
    tw, dw = _pair(session)
    topt, dopt = TORCH_OPTS[kind][0](tw), TORCH_OPTS[kind][1](dw)
    assert dopt.state_dict()["state"] == {}  # nothing before the first step, as torch
    for k in range(3):
        _step_both(session, tw, dw, topt, dopt, k)
    ts, ds = topt.state_dict()["state"], dopt.state_dict()["state"]
    assert sorted(ts) == sorted(ds) == [0, 1]
    for i in ts:
        assert set(ds[i]) == set(ts[i]), (ds[i].keys(), ts[i].keys())
        for key, tv in ts[i].items():
            if key == "step":
                assert ds[i][key] == int(tv.item()) == 3
                continue
            np.testing.assert_allclose(ds[i][key], tv.numpy(), rtol=1e-5, atol=1e-7,
                                       err_msg=f"{kind} state[{i}][{key}]")


@pytest.mark.parametrize("kind", sorted(TORCH_OPTS))
def test_torch_state_loads_and_steps_on(session, kind):
    """torch's state_dict (torch tensors) loaded into a fresh optimizer of ours over
    torch's parameter values: the next steps agree with torch's."""
    tw, _ = _pair(session)
    topt = TORCH_OPTS[kind][0](tw)
    dw = None
    for k in range(2):
        topt.zero_grad()
        c = torch.tensor(np.linspace(-1, 2, 12, dtype=np.float32).reshape(3, 4) * (k + 1))
        ((tw[0] * tw[0] * c).sum() + (tw[1] ** 3).sum()).backward()
        topt.step()
    dw = [session.tensor(t.detach(), requires_grad=True) for t in tw]
    dopt = TORCH_OPTS[kind][1](dw)
    dopt.load_state_dict(topt.state_dict())
    for k in range(2, 4):
        _step_both(session, tw, dw, topt, dopt, k)
    for d, t in zip(dw, tw):
        np.testing.assert_allclose(d.numpy(), t.detach().numpy(), rtol=1e-5, atol=1e-6)


def test_bad_state_is_refused_and_changes_nothing(session):
    tw, dw = _pair(session)
    opt = tensordd.optim.Adam(dw, lr=0.01)
    topt = torch.optim.Adam(tw, lr=0.01)
    for k in range(2):
        _step_both(session, tw, dw, topt, opt, k)
    before = opt.state_dict()
    bad = pickle.loads(pickle.dumps(before))
    bad["state"][0]["exp_avg"] = np.zeros((4, 3), np.float32)  # another shape
    with pytest.raises(ValueError, match="shape"):
        opt.load_state_dict(bad)
    bad = pickle.loads(pickle.dumps(before))
    del bad["state"][1]["exp_avg_sq"]
    with pytest.raises(ValueError, match="exp_avg_sq missing"):
        opt.load_state_dict(bad)
    bad = pickle.loads(pickle.dumps(before))
    bad["state"][1]["momentum_buffer"] = np.zeros(4, np.float32)
    with pytest.raises(ValueError, match="not adam's state"):
        opt.load_state_dict(bad)
    after = opt.state_dict()
    for i in before["state"]:
        for key in before["state"][i]:
            np.testing.assert_array_equal(after["state"][i][key], before["state"][i][key])
    # the daemon's own checks, through raw requests: typed errors, nothing changed
    h = opt.handle

    def load(steps, buffers):
        req = pb.Request()
        req.optimizer_load_state.optimizer = h
        req.optimizer_load_state.steps.extend(steps)
        req.optimizer_load_state.buffers.extend(buffers)
        session._roundtrip(req, tensordd.session._Call("optimizer_load_state"))

    m64 = session.tensor(np.zeros((3, 4), np.float64))
    m32 = session.tensor(np.zeros((3, 4), np.float32))
    b32 = session.tensor(np.zeros(4, np.float32))
    cpu1 = session.tensor(np.zeros((3, 4), np.float32), device="cpu:1")
    with pytest.raises(tensordd.InvalidArgumentError, match="steps"):
        load([1], [0] * 3)
    with pytest.raises(tensordd.InvalidArgumentError, match="buffers"):
        load([1, 1], [0] * 5)
    with pytest.raises(tensordd.InvalidArgumentError, match="exp_avg_sq missing"):
        load([1, 0], [m32.handle, 0, 0, 0, 0, 0])
    with pytest.raises(tensordd.InvalidArgumentError, match="step 0"):
        load([1, 0], [m32.handle, m32.handle, 0, b32.handle, 0, 0])
    with pytest.raises(tensordd.InvalidArgumentError, match="keeps no buffer 2"):
        load([1, 0], [m32.handle, m32.handle, m32.handle, 0, 0, 0])
    with pytest.raises(tensordd.InvalidArgumentError, match="out of range"):
        load([-1, 0], [0] * 6)
    with pytest.raises(tensordd.Error) as info:
        load([1, 0], [m64.handle, m32.handle, 0, 0, 0, 0])
    assert info.value.code == "DTYPE_MISMATCH"
    with pytest.raises(tensordd.ShapeMismatchError):
        load([1, 0], [b32.handle, m32.handle, 0, 0, 0, 0])
    with pytest.raises(tensordd.DeviceMismatchError):
        load([1, 0], [cpu1.handle, m32.handle, 0, 0, 0, 0])
    with pytest.raises(tensordd.UnknownHandleError):
        load([1, 0], [10 ** 9, m32.handle, 0, 0, 0, 0])
    after = opt.state_dict()
    for i in before["state"]:
        for key in before["state"][i]:
            np.testing.assert_array_equal(after["state"][i][key], before["state"][i][key])
    # and it still steps as torch
    _step_both(session, tw, dw, topt, opt, 5)
    for d, t in zip(dw, tw):
        np.testing.assert_allclose(d.numpy(), t.detach().numpy(), rtol=1e-5, atol=1e-6)


def test_export_leaks_no_handle_and_copies(session):
    tw, dw = _pair(session)
    opt = tensordd.optim.SGD(dw, lr=0.1, momentum=0.5)
    topt = torch.optim.SGD(tw, lr=0.1, momentum=0.5)
    _step_both(session, tw, dw, topt, opt, 0)
    session.sync()
    handles = session.stats()["session_list"]
    before = {x["session_id"]: x["handles"] for x in handles}[session.session_id]
    sd = opt.state_dict()
    buf = sd["state"][0]["momentum_buffer"].copy()
    _step_both(session, tw, dw, topt, opt, 1)
    np.testing.assert_array_equal(sd["state"][0]["momentum_buffer"], buf)  # a copy
    session.sync()
    after = {x["session_id"]: x["handles"] for x in session.stats()["session_list"]}
    assert after[session.session_id] == before
    # a raw OptimizerState whose second id is taken binds nothing (the first is let go)
    first = session._reserve_handles(3)
    taken = session.tensor(np.zeros(1, np.float32))
    assert taken.handle == first + 3  # parameter 1's momentum buffer
    req = pb.Request()
    req.optimizer_state.optimizer = opt.handle
    req.optimizer_state.first_output = first
    with pytest.raises(tensordd.Error) as info:
        session._roundtrip(req, tensordd.session._Call("optimizer_state"))
    assert info.value.code == "HANDLE_IN_USE"
    session.sync()
    after = {x["session_id"]: x["handles"] for x in session.stats()["session_list"]}
    assert after[session.session_id] == before + 1  # `taken`


def test_state_on_the_op_path(session):
    """foreach (the path devices whose memory the loop cannot touch take, as cuda):
    its state exports equal to the host loop's, and imports into either path."""

    class AdamOps(tensordd.optim.Optimizer):
        kind = "adam"

    x0 = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    states, ws = [], []
    for foreach in (False, True):
        w = session.tensor(x0, requires_grad=True)
        opt = AdamOps([w], lr=0.01, amsgrad=True, **({"foreach": True} if foreach else {}))
        for k in range(3):
            opt.zero_grad()
            (w * w * float(k + 1)).sum().backward()
            opt.step()
        states.append(opt.state_dict())
        ws.append((w, opt))
    loop, ops = states[0]["state"][0], states[1]["state"][0]
    assert set(loop) == set(ops) == {"step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"}
    for key in ("exp_avg", "exp_avg_sq", "max_exp_avg_sq"):
        np.testing.assert_allclose(ops[key], loop[key], rtol=1e-6, atol=1e-9)
    for (w, opt), foreach in zip(ws, (True, False)):  # each path's state into the other
        w2 = session.tensor(w.numpy(), requires_grad=True)
        opt2 = AdamOps([w2], lr=0.01, amsgrad=True, **({"foreach": True} if foreach else {}))
        opt2.load_state_dict(opt.state_dict())
        for ww, oo in ((w, opt), (w2, opt2)):
            oo.zero_grad()
            (ww * ww).sum().backward()
            oo.step()
        np.testing.assert_allclose(w2.numpy(), w.numpy(), rtol=1e-6, atol=1e-7)


def test_model_moved_after_the_optimizer_keeps_its_state(session):
    """torch's Module.to() moves parameters in place: an optimizer made before keeps
    optimizing them, moments included (here cpu:0 -> cpu:1, against a run that
    never moved)."""
    nn = tensordd.nn
    runs = []
    for move in (False, True):
        nn.init_seed(7)
        m = nn.Sequential(nn.Linear(6, 4), nn.Tanh(), nn.Linear(4, 2))
        opt = tensordd.optim.Adam(m.parameters(), lr=0.01)
        params = list(m.parameters())
        x, y = session.tensor(X[:8]), session.tensor(Y[:8])
        for k in range(4):
            if move and k == 2:
                m.to("cpu:1")
                assert all(p is q for p, q in zip(m.parameters(), params))
                assert all(str(p.device) == "cpu:1" for p in m.parameters())
                x, y = x.to("cpu:1"), y.to("cpu:1")
            opt.zero_grad()
            ((m(x) - y) ** 2).mean().backward()
            opt.step()
        runs.append(_params(m))
        assert opt.state_dict()["state"][0]["step"] == 4
    for a, b in zip(*runs):
        np.testing.assert_array_equal(a, b)
