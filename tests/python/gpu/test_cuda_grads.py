"""The gradient checks of test_grad_torch.py on cuda:0 (issue 10).

Runs only when TDD_GPU_ARGS is set (see test_cuda_ops.py). Every case of
test_grad_torch.py that the daemon differentiates (its xfail cases are left out) runs
forward and backward on cuda:0 in float32 against torch autograd, with the same
tolerances; a case whose forward or backward needs an op or dtype the cuda backend
declines (UNSUPPORTED_OP, UNSUPPORTED_DTYPE, typed) is skipped, so the passed count is
what runs on cuda.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest

import tensordd
import test_grad_torch as G

torch = pytest.importorskip("torch")

from gpusuite import declined, gpu_daemon_fixture, gpu_session_fixture, only_with_gpu

pytestmark = only_with_gpu
DEV = "cuda:0"


gpu_daemon = gpu_daemon_fixture(cpu_devices=1)


gs = gpu_session_fixture("gs")


@pytest.mark.parametrize("c", [pytest.param(c, id=c.name) for c in G.CASES if not c.xfail])
def test_grad_on_cuda_matches_torch(gs, c):
    dtype = "float32"
    rng = np.random.default_rng(zlib.crc32(f"{c.name}/{dtype}".encode()))
    arrays = [(make(rng, dtype), grad) for make, grad in c.inputs]
    tts = [torch.tensor(a, requires_grad=g) for a, g in arrays]
    tout = c.tfn(*tts)
    w = rng.uniform(0.5, 1.5, tuple(tout.shape)).astype(str(tout.dtype).replace("torch.", ""))
    tloss = (tout * torch.from_numpy(w)).sum()
    tloss.backward()
    try:
        ts = [gs.tensor(a, device=DEV, requires_grad=g) for a, g in arrays]
        out = c.fn(gs, *ts)
        loss = (out * gs.tensor(w, device=DEV)).sum()
        grads = loss.backward()
        got = [(grads.get(t).numpy(), tt) for t, tt in zip(ts, tts) if tt.requires_grad]
        got_loss = loss.numpy()
    except tensordd.Error as e:
        if declined(e):
            pytest.skip(f"cuda declines an op of the forward or backward: {e}")
        raise
    rtol, atol = G._tol("float32", c.k)
    np.testing.assert_allclose(got_loss, tloss.detach().numpy(), rtol=rtol, atol=atol,
                               err_msg=f"{c.name} on {DEV}: loss")
    for n, (g, tt) in enumerate(got):
        np.testing.assert_allclose(g, tt.grad.numpy(), rtol=rtol, atol=atol,
                                   err_msg=f"{c.name} on {DEV}: gradient of input {n}")
