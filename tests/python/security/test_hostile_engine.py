"""What a hostile or careless client could do to the
engine (sessions, optimizers, autodiff) against a real daemon, with torch (CPU) as
the oracle for the numbers and for what is refused.

- item 4: per-handle bookkeeping is charged to --session-memory, so many zero-size
  tensors hit RESOURCE_EXHAUSTED and the account returns to its baseline;
- item 5: OptimizerCreate's duplicate check is linear: 200k parameters no longer
  freeze the loop (and every other session) for seconds;
- item 6: the in-place version counter is the storage's, so a view of a parameter
  saved for backward is refused after an optimizer step, as torch refuses it;
- item 13: optimizer steps update the parameter's storage in place on every backend
  and path (host loop, foreach ops, sim), so views taken before step() see it.
"""

from __future__ import annotations

import gc
import threading
import time

import numpy as np
import pytest

import tensordd
from helpers import require_autodiff

torch = pytest.importorskip("torch")


def my_bytes(s) -> int:
    """This session's bytes_in_use as the daemon reports it (one session per daemon)."""
    (me,) = s.stats()["session_list"]
    return me["bytes_in_use"]


def my_handles(s) -> int:
    (me,) = s.stats()["session_list"]
    return me["handles"]


def vm_rss(pid: int) -> int:
    """The daemon's resident set in bytes (/proc/PID/status VmRSS)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.fixture(scope="module")
def engine_daemon(sim_daemon):
    return sim_daemon


@pytest.fixture
def engine(engine_daemon):
    """A session of its own per test, so what one test leaves cannot reach the next."""
    s = tensordd.connect(engine_daemon.endpoint, timeout=60)
    require_autodiff(s)
    yield s
    s.close(raise_errors=False)


# ---------------------------------------------------------------- item 4

QUOTA = 4 << 20  # --session-memory 4M


def test_many_zero_size_handles_hit_the_session_quota(start_daemon):
    d = start_daemon("--session-memory", str(QUOTA))
    with tensordd.connect(d.endpoint, timeout=60) as s:
        empty = np.empty(0, np.float32)
        first = s.tensor(empty)  # (the session's list of id runs is charged once, here)
        s.sync()
        base, rss0 = my_bytes(s), vm_rss(d.proc.pid)
        keep = []
        # Before the fix 200k of these were charged nothing (about 96 MB of daemon RSS
        # at the default --max-handles whatever the quota): now each handle's value,
        # storage header, smallest allocation and table slots are.
        with pytest.raises(tensordd.ResourceExhaustedError) as info:
            for i in range(200_000):
                keep.append(s.tensor(empty))
                if i % 1000 == 999:
                    s.sync()
            s.sync()
        assert info.value.resource == "session memory"
        bound, used, rss1 = my_handles(s) - 1, my_bytes(s), vm_rss(d.proc.pid)
        assert 0 < bound < len(keep) and bound < 20_000
        assert used <= QUOTA
        # a realistic cost per handle (the value struct alone is over 200 bytes)
        assert (used - base) / bound >= 256
        # the daemon grew by about the quota, not by 200k handles' worth
        assert rss1 - rss0 < 4 * QUOTA, (rss0, rss1)
        # Once the quota was full every later upload was refused and left unbound:
        # the first `bound` are live, the rest must not be released.
        keep[bound - 1].numpy()
        with pytest.raises(tensordd.UnknownHandleError):
            keep[bound].numpy()
        for t in keep[bound:]:
            t._session = None
        del keep, t
        gc.collect()
        s.sync()
        assert my_handles(s) == 1  # first
        assert my_bytes(s) == base  # every per-handle charge given back
        # and the session works on
        np.testing.assert_array_equal(s.tensor(np.arange(3, dtype=np.float32)).numpy(),
                                      [0, 1, 2])
    assert d.stop() == 0, d.log()  # (the sanitizer build reports leaks here)


def test_handle_charges_are_given_back_on_failed_requests(start_daemon):
    d = start_daemon("--session-memory", str(QUOTA))
    with tensordd.connect(d.endpoint, timeout=60) as s:
        require_autodiff(s)
        w = s.tensor(np.ones(3, np.float32), requires_grad=True)
        x = s.tensor(np.ones(3, np.float32))
        s.sync()
        base = my_bytes(s)
        # Requests that check their output id and then fail bind nothing and keep no charge.
        with pytest.raises(tensordd.InvalidArgumentError):
            tensordd.optim.SGD([w, w], lr=0.1)
        with pytest.raises(tensordd.NotTrackedError):
            tensordd.optim.SGD([x], lr=0.1)
        gc.collect()
        s.sync()
        assert my_bytes(s) == base
    assert d.stop() == 0, d.log()


# ---------------------------------------------------------------- item 5

N_PARAMS = 200_000
# The old O(N^2) duplicate check took 13.8 s for 200k parameters (measured for the
# issue); the linear one takes tens of milliseconds. A bound of 4 s fails the former
# on any machine and leaves the latter a margin of well over 20x: it is a bound on the
# loop's stall, not a performance figure.
STALL_BOUND_S = 4.0


def test_optimizer_over_200k_parameters_does_not_freeze_other_sessions(start_daemon):
    d = start_daemon()
    with tensordd.connect(d.endpoint, timeout=120) as s, \
            tensordd.connect(d.endpoint, timeout=120) as other:
        params = [s.zeros(1, requires_grad=True) for _ in range(N_PARAMS)]
        s.sync()
        other.sync()
        worst = [0.0]
        pings = [0]
        stop = threading.Event()

        def pinger():
            while not stop.is_set():
                t0 = time.monotonic()
                other.sync()
                worst[0] = max(worst[0], time.monotonic() - t0)
                pings[0] += 1
                time.sleep(0.002)

        th = threading.Thread(target=pinger, daemon=True)
        th.start()
        time.sleep(0.05)
        t0 = time.monotonic()
        opt = tensordd.optim.SGD(params, lr=0.5)  # one OptimizerCreate, answered
        took = time.monotonic() - t0
        time.sleep(0.05)
        stop.set()
        th.join(150)
        assert not th.is_alive()
        assert pings[0] > 1
        assert took < STALL_BOUND_S, f"OptimizerCreate of {N_PARAMS} parameters took {took:.2f}s"
        assert worst[0] < STALL_BOUND_S, f"another session's Sync waited {worst[0]:.2f}s"
        # The optimizer works, and a duplicate among them is still refused.
        g = (params[-1] * 3).sum().backward()
        opt.step(g)
        np.testing.assert_allclose(params[-1].numpy(), [-1.5])
        np.testing.assert_allclose(params[0].numpy(), [0.0])
        with pytest.raises(tensordd.InvalidArgumentError, match="appears twice"):
            tensordd.optim.SGD(params[:10] + params[5:6], lr=0.1)
    assert d.stop() == 0, d.log()


# ---------------------------------------------------------------- item 6


def _views(kind):
    """(daemon view, torch view) of a 2x3 parameter."""
    return {
        "unsqueeze": (lambda w: w.unsqueeze(0), lambda w: w.unsqueeze(0)),
        "transpose": (lambda w: w.transpose(0, 1), lambda w: w.transpose(0, 1)),
        "detach": (lambda w: w.detach(), lambda w: w.detach()),
    }[kind]


W0 = np.array([[1.0, -2.0, 3.0], [0.5, 4.0, -1.5]], np.float32)


@pytest.mark.parametrize("device", ["cpu:0", "sim:0"])
@pytest.mark.parametrize("kind", ["unsqueeze", "transpose", "detach"])
def test_view_saved_for_backward_is_refused_after_a_step(engine, device, kind):
    s = engine
    view, tview = _views(kind)
    # torch: the view shares w's version counter; the in-place step makes the saved
    # view stale and backward raises.
    tw = torch.tensor(W0, requires_grad=True)
    tx = torch.ones(tview(torch.zeros(2, 3)).shape, requires_grad=True)
    tloss = (tview(tw) * tx).sum()
    topt = torch.optim.SGD([tw], lr=0.1)
    (tw * tw).sum().backward()
    topt.step()
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        tloss.backward()

    w = s.tensor(W0, device=device, requires_grad=True)
    x = s.tensor(np.ones(tx.shape, np.float32), device=device, requires_grad=True)
    loss = (view(w) * x).sum()  # mul saves both inputs: the view of w among them
    opt = tensordd.optim.SGD([w], lr=0.1)
    opt.step((w * w).sum().backward())
    np.testing.assert_allclose(w.numpy(), tw.detach().numpy(), rtol=1e-6)
    with pytest.raises(tensordd.InvalidArgumentError, match="modified by an inplace operation"):
        loss.backward()
        s.sync()  # a pipelined backward's error surfaces here


@pytest.mark.parametrize("device", ["cpu:0", "sim:0"])
def test_view_saved_after_the_step_gives_torch_gradients(engine, device):
    s = engine
    w = s.tensor(W0, device=device, requires_grad=True)
    opt = tensordd.optim.SGD([w], lr=0.1)
    opt.step((w * w).sum().backward())
    loss = (w.unsqueeze(0) * w.transpose(0, 1).transpose(0, 1)).sum()
    g = loss.backward().get(w).numpy()

    tw = torch.tensor(W0, requires_grad=True)
    topt = torch.optim.SGD([tw], lr=0.1)
    (tw * tw).sum().backward()
    topt.step()
    topt.zero_grad()
    (tw.unsqueeze(0) * tw.transpose(0, 1).transpose(0, 1)).sum().backward()
    np.testing.assert_allclose(g, tw.grad.numpy(), rtol=1e-6)


# ---------------------------------------------------------------- item 13

def _optimizer(cls, params, **attrs):
    """An optimizer of that class with exactly these attrs (foreach among them: the
    Python classes do not take it, the daemon does)."""
    opt = tensordd.optim.Optimizer.__new__(cls)
    tensordd.optim.Optimizer.__init__(opt, params, **attrs)
    return opt


OPTIMS = {
    "sgd_momentum": (lambda p, **kw: _optimizer(tensordd.optim.SGD, p, lr=0.1, momentum=0.9, **kw),
                     lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9)),
    "adam": (lambda p, **kw: _optimizer(tensordd.optim.Adam, p, lr=0.05, **kw),
             lambda p: torch.optim.Adam(p, lr=0.05)),
    "adamw": (lambda p, **kw: _optimizer(tensordd.optim.AdamW, p, lr=0.05, weight_decay=0.1,
                                         **kw),
              lambda p: torch.optim.AdamW(p, lr=0.05, weight_decay=0.1)),
}


@pytest.mark.parametrize("foreach", [False, True])
@pytest.mark.parametrize("device", ["cpu:0", "ref:0", "sim:0"])
@pytest.mark.parametrize("name", sorted(OPTIMS))
def test_step_updates_in_place_so_earlier_views_see_it(engine, name, device, foreach):
    s = engine
    make, tmake = OPTIMS[name]
    c = np.array([[0.5, -1.0, 2.0], [1.5, 0.25, -3.0]], np.float32)

    tw = torch.tensor(W0, requires_grad=True)
    topt = tmake([tw])
    w = s.tensor(W0, device=device, requires_grad=True)
    C = s.tensor(c, device=device)
    d = w.detach()  # views taken before any step
    u = w.unsqueeze(0)
    tr = w.transpose(0, 1)
    opt = make([w], **({"foreach": True} if foreach else {}))
    for _ in range(3):
        topt.zero_grad()
        (tw * tw * torch.from_numpy(c)).sum().backward()
        topt.step()
        opt.step((w * w * C).sum().backward())
        want = tw.detach().numpy()
        np.testing.assert_allclose(w.numpy(), want, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(d.numpy(), want, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(u.numpy()[0], want, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(tr.numpy().T, want, rtol=1e-5, atol=1e-6)
