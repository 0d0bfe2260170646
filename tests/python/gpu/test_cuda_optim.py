"""Issue 14 on cuda:0 (runs only when TDD_GPU_ARGS is set, as test_cuda_ops.py): RMSprop,
Adagrad and Adam with two param groups and options changed mid-run (the ops path, which
cuda takes) against torch.optim; embedding_bag forward and gradient against torch; and
multinomial's draws on cuda:0 equal to ref:0's for the same seed (the first session of a
fresh daemon, so the same stream). Tolerances as test_optimizers.py and test_embedding_bag.py."""

from __future__ import annotations


import numpy as np
import pytest

import tensordd
from conftest import Daemon
from tensordd.nn import functional as F

torch = pytest.importorskip("torch")
from gpusuite import GPU_ARGS, gpu_daemon_fixture, only_with_gpu

pytestmark = only_with_gpu

import test_optimizers as o14  # noqa: E402  (the models, cases and helpers of the cpu tests)

DEV = "cuda:0"


gpu_daemon = gpu_daemon_fixture(cpu_devices=1)


@pytest.fixture
def gs(gpu_daemon):
    s = tensordd.connect(gpu_daemon.endpoint, timeout=120)
    if DEV not in [str(d) for d in s.devices()]:
        pytest.skip(f"no {DEV}")
    yield s
    s.close(raise_errors=False)


@pytest.mark.parametrize("kind", ["RMSprop", "Adagrad", "Adam"])
def test_optimizers_on_cuda(gs, kind):
    ours, theirs = o14._ours(gs, DEV), o14._theirs()
    opts = o14.CASES[kind][0]
    opt = getattr(tensordd.optim, kind)(o14._groups(ours, kind, True), **opts)
    topt = getattr(torch.optim, kind)(o14._groups(theirs, kind, True), **opts)
    for i in range(5):
        if i == 3:
            for g in (opt.param_groups[0], topt.param_groups[0]):
                g.update(o14.CHANGES[kind])
                g["lr"] *= 0.5
        o14._step_both(gs, ours, theirs, opt, topt, i, DEV)
    o14._close(ours, theirs, kind)
    sd = opt.state_dict()  # the state comes back from the device in torch's layout
    tsd = topt.state_dict()
    for k, st in tsd["state"].items():
        for name, v in st.items():
            if name != "step" and v is not None:
                np.testing.assert_allclose(sd["state"][k][name], v.numpy(), rtol=o14.RTOL,
                                           atol=o14.ATOL)


@pytest.mark.parametrize("case", [0, 2, 3, 5, 6])
def test_embedding_bag_on_cuda(gs, case):
    import test_embedding_bag as b14
    mode, ix, off, last, pad, psw = b14.CASES[case]
    w = gs.tensor(b14.W, device=DEV, requires_grad=True)
    i, o, p = b14._ours(gs, DEV, ix, off, psw)
    if p is not None:
        p.requires_grad_()
    out = F.embedding_bag(i, w, o, mode=mode, per_sample_weights=p, include_last_offset=last,
                          padding_idx=pad)
    tw = torch.tensor(b14.W, requires_grad=True)
    tp = torch.tensor(psw, requires_grad=True) if psw is not None else None
    tout = torch.nn.functional.embedding_bag(
        torch.tensor(ix), tw, torch.tensor(off), mode=mode, per_sample_weights=tp,
        include_last_offset=last, padding_idx=pad)
    np.testing.assert_allclose(out.numpy(), tout.detach().numpy(), rtol=b14.RTOL, atol=b14.ATOL)
    grads = (out * out).sum().backward()
    (tout * tout).sum().backward()
    np.testing.assert_allclose(grads.get(w).numpy(), tw.grad.numpy(), rtol=b14.RTOL,
                               atol=b14.ATOL)
    if p is not None:
        np.testing.assert_allclose(grads.get(p).numpy(), tp.grad.numpy(), rtol=b14.RTOL,
                                   atol=b14.ATOL)


def test_multinomial_on_cuda_draws_as_ref():
    p = np.abs(np.random.default_rng(5).standard_normal((6, 9))).astype(np.float32)
    draws = []
    for dev in (DEV, "ref:0"):
        d = Daemon("--cpu-devices", "1", *(GPU_ARGS or "").split())
        try:
            with tensordd.connect(d.endpoint, timeout=120) as s:
                x = s.tensor(p, device=dev)
                draws.append((x.multinomial(5).numpy(), x.multinomial(20, True).numpy()))
        finally:
            assert d.stop() == 0
    for a, b in zip(*draws):
        np.testing.assert_array_equal(a, b)
    for row in draws[0][0]:
        assert len(set(row.tolist())) == 5
