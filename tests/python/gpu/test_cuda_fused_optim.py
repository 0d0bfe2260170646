"""The fused optimizer step on cuda:0: SGD (momentum, dampening, Nesterov, weight decay),
Adam (L2, amsgrad) and AdamW update all parameters of a group in one kernel launch, as
torch's fused/foreach optimizers do, with the cpu backend's bits (the same formula,
operation for operation, each rounded once), and torch.optim's values within the dtype's
tolerance.

Runs only when TDD_GPU_ARGS is set (see gpusuite.py). The launches are counted from the
emulator's profile (TDD_EMU_PROFILE), on the emulated build only."""

from __future__ import annotations

import numpy as np
import pytest

import tensordd
from gpusuite import (GPU_ARGS, only_with_gpu, profile_kernels, profile_size,
                      profiled_fixtures)

pytestmark = only_with_gpu
EMU = GPU_ARGS is not None and "--emu-gpus" in GPU_ARGS
torch = pytest.importorskip("torch")

SHAPES = [(7, 5), (300,), (3, 4, 2), (9000,)]  # the last spans two chunks of the launch
CASES = {
    "SGD": dict(lr=0.1, momentum=0.9, dampening=0.1, weight_decay=0.01),
    "SGD-nesterov": dict(lr=0.05, momentum=0.8, nesterov=True),
    "SGD-plain": dict(lr=0.1, maximize=True),
    "Adam": dict(lr=0.01, betas=(0.8, 0.95), weight_decay=0.1),
    "Adam-amsgrad": dict(lr=0.01, amsgrad=True),
    "AdamW": dict(lr=0.01, weight_decay=0.05),
}


daemon, s = profiled_fixtures("fused")


def make(kind):
    name = kind.split("-")[0]
    return getattr(tensordd.optim, name), getattr(torch.optim, name), CASES[kind]


def run(s, kind, device, dtype, inits, coefs, groups=1, foreach=None, daemon=None):
    """Steps of kind on device from inits with loss sum((W * C).sum()) (its gradients are
    C exactly on every backend); the parameters after each step, and the launches of the
    last step (emulated build)."""
    opt_cls, _, opts = make(kind)
    ws = [s.tensor(w.astype(dtype), device=device, requires_grad=True) for w in inits]
    half = (len(ws) + 1) // 2
    params = ws if groups == 1 else [{"params": ws[:half]}, {"params": ws[half:]}]
    if foreach is not None:  # torch's per-group option: the update as queued ops
        params = [{"params": ws, "foreach": foreach}]
    opt = opt_cls(params, **opts)
    launched = None
    for cs in coefs:
        opt.zero_grad()
        loss = None
        for w, c in zip(ws, cs):
            term = (w * s.tensor(c.astype(dtype), device=device)).sum()
            loss = term if loss is None else loss + term
        loss.backward()
        loss.item()  # the backward's kernels have run
        at = profile_size(daemon) if daemon else 0
        opt.step()
        out = [w.numpy() for w in ws]
        if daemon:
            launched = profile_kernels(daemon, at)
    return out, launched


def torch_run(kind, inits, coefs):
    _, opt_cls, opts = make(kind)
    ws = [torch.tensor(w.astype(np.float64), requires_grad=True) for w in inits]
    opt = opt_cls(ws, **opts)
    for cs in coefs:
        opt.zero_grad()
        sum((w * torch.tensor(c.astype(np.float64))).sum() for w, c in zip(ws, cs)).backward()
        opt.step()
    return [w.detach().numpy() for w in ws]


def data(steps=3, seed=0):
    rng = np.random.default_rng(seed)
    inits = [rng.standard_normal(sh) for sh in SHAPES]
    coefs = [[rng.standard_normal(sh) for sh in SHAPES] for _ in range(steps)]
    return inits, coefs


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("kind", sorted(CASES))
def test_fused_step_has_the_cpu_backends_bits_in_one_launch(daemon, s, kind, dtype):
    inits, coefs = data()
    gpu, launched = run(s, kind, "cuda:0", dtype, inits, coefs, daemon=daemon if EMU else None)
    cpu, _ = run(s, kind, "cpu:0", dtype, inits, coefs)
    for k, (g, c) in enumerate(zip(gpu, cpu)):
        assert g.dtype == dtype
        assert g.tobytes() == c.tobytes(), f"parameter {k}: cuda:0 and cpu:0 differ"
    want = torch_run(kind, inits, coefs)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    for g, w in zip(gpu, want):
        np.testing.assert_allclose(g, w, rtol=tol, atol=tol)
    if EMU:  # the whole group's update: one launch, nothing else
        assert len(launched) == 1 and "fused_step" in launched[0], launched


def test_one_launch_per_parameter_group_and_many_on_the_ops_path(daemon, s):
    if not EMU:
        pytest.skip("launches are counted on the emulated build")
    inits, coefs = data(steps=2, seed=1)
    two, launched = run(s, "Adam", "cuda:0", np.float32, inits, coefs, groups=2, daemon=daemon)
    assert len(launched) == 2 and all("fused_step" in k for k in launched), launched
    ops, launched = run(s, "Adam", "cuda:0", np.float32, inits, coefs, foreach=True,
                        daemon=daemon)
    assert len(launched) > 4 * len(SHAPES) and not any("fused_step" in k for k in launched)
    for a, b in zip(two, ops):  # the ops path agrees within f32's rounding
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_a_poisoned_gradient_fails_the_step_and_the_session_goes_on(s):
    w = s.tensor(np.ones(4, np.float32), device="cuda:0", requires_grad=True)
    opt = tensordd.optim.Adam([w], lr=0.1)
    bad = s.op("gather", s.tensor(np.ones((2, 2), np.float32), device="cuda:0"),
               s.tensor(np.array([[0, 5], [1, 0]], np.int64), device="cuda:0"), dim=1)
    with pytest.raises(tensordd.InvalidArgumentError):
        s.sync()
    (w * 2).sum().backward()
    opt.step()
    np.testing.assert_allclose(w.numpy(), np.full(4, 0.9, np.float32), rtol=1e-6)
    del bad
