"""Optimizers and random draws on cuda:0 (runs only when TDD_GPU_ARGS is set: gpusuite.py):
RMSprop, Adagrad and Adam with two param groups and options changed mid-run (the ops path,
which cuda takes) against torch.optim, tolerances as test_optimizers.py's; and multinomial's
draws on cuda:0 equal to ref:0's for the same seed (the first session of a fresh daemon, so
the same stream). embedding_bag on cuda:0 is ops/test_embedding_bag.py's cuda parameter."""

from __future__ import annotations


import numpy as np
import pytest

import tensordd
from conftest import Daemon

torch = pytest.importorskip("torch")
from gpusuite import GPU_ARGS, gpu_daemon_fixture, only_with_gpu

pytestmark = only_with_gpu

import test_optimizers as opt_cases  # noqa: E402  (the cpu tests: models, cases, helpers)

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
    ours, theirs = opt_cases._ours(gs, DEV), opt_cases._theirs()
    opts = opt_cases.CASES[kind][0]
    opt = getattr(tensordd.optim, kind)(opt_cases._groups(ours, kind, True), **opts)
    topt = getattr(torch.optim, kind)(opt_cases._groups(theirs, kind, True), **opts)
    for i in range(5):
        if i == 3:
            for g in (opt.param_groups[0], topt.param_groups[0]):
                g.update(opt_cases.CHANGES[kind])
                g["lr"] *= 0.5
        opt_cases._step_both(gs, ours, theirs, opt, topt, i, DEV)
    opt_cases._close(ours, theirs, kind)
    sd = opt.state_dict()  # the state comes back from the device in torch's layout
    tsd = topt.state_dict()
    for k, st in tsd["state"].items():
        for name, v in st.items():
            if name != "step" and v is not None:
                np.testing.assert_allclose(sd["state"][k][name], v.numpy(), rtol=opt_cases.RTOL,
                                           atol=opt_cases.ATOL)


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
