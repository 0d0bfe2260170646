"""Double backward on cuda:0 (issue 14, item 3): a few of test_double_backward.py's
Hessian-vector products and its gradient penalty, float32 on cuda:0, against torch 1.13
on CPU, with test_double_backward.py's float32 tolerances (rtol 1e-4, atol 1e-4, scaled
by sqrt(k)).

Runs only when TDD_GPU_ARGS is set (make test-emu; tests/gpu/run.sh on a GPU). A case whose
passes need an op or dtype the cuda backend declines (UNSUPPORTED_OP, UNSUPPORTED_DTYPE,
typed) is skipped, so the passed count is what runs on cuda. Kept small: the emulator runs
each kernel on the host.
"""

from __future__ import annotations


import numpy as np
import pytest

import tensordd
import test_double_backward as D
import test_grad_torch as G

torch = pytest.importorskip("torch")

from gpusuite import declined, gpu_daemon_fixture, gpu_session_fixture, only_with_gpu

pytestmark = only_with_gpu
DEV = "cuda:0"
NAMES = ("tanh", "sigmoid", "gelu", "mul-bcast", "div-bcast", "matmul-2d-2d", "softmax-dim1",
         "log_softmax-dim-1", "logsumexp-dim1", "cross_entropy-mean", "mse_loss-mean",
         "layer_norm-affine", "mlp")


gpu_daemon = gpu_daemon_fixture(cpu_devices=1)


ad = gpu_session_fixture("ad")


def _run(fn, *args):
    try:
        fn(*args)
    except tensordd.Error as e:
        if declined(e):
            pytest.skip(f"cuda declines an op of a pass: {e}")
        raise


def test_cases_exist():
    assert set(NAMES) <= {c.name for c in G.CASES if not c.xfail}


@pytest.mark.parametrize("c", [pytest.param(c, id=c.name) for c in G.CASES
                               if c.name in NAMES])
def test_hvp_on_cuda_matches_torch(ad, c):
    _run(D.test_hvp_matches_torch, ad, c, DEV, "float32")


def test_gradient_penalty_on_cuda_matches_torch(ad):
    x0, ps0 = D._gp_arrays("float32")
    tx = torch.tensor(x0, requires_grad=True)
    tps = [torch.tensor(p, requires_grad=True) for p in ps0]
    (tgx,) = torch.autograd.grad(D._disc(D._tlib(), tx, tps, "tanh").sum(), tx,
                                 create_graph=True)
    tgp = ((tgx.square().sum(1).sqrt() - 1.0).square()).mean()
    tgrads = torch.autograd.grad(tgp, tps[:3])

    def run():
        x = ad.tensor(x0, device=DEV, requires_grad=True)
        ps = [ad.tensor(p, device=DEV, requires_grad=True) for p in ps0]
        (gx,) = D.agrad(D._disc(D._slib(ad), x, ps, "tanh").sum(), x, create_graph=True)
        gp = ((gx.square().sum(1).sqrt() - 1.0).square()).mean()
        grads = D.agrad(gp, ps[:3])
        rtol, atol = D._tol("float32", 6)
        np.testing.assert_allclose(gp.numpy(), D._np(tgp), rtol=rtol, atol=atol)
        for n, (a, b) in enumerate(zip(grads, tgrads)):
            assert a.device == DEV
            np.testing.assert_allclose(a.numpy(), D._np(b), rtol=rtol, atol=atol,
                                       err_msg=f"gradient penalty on {DEV}: parameter {n}")

    _run(run)
