"""torch.nn.functional.embedding's padding_idx and max_norm, nn.Embedding's, and index
tensors of every integer dtype (uint8, int8, int16, int32, int64) for gather,
index_select and embedding; `import tensordd` makes tensordd.parallel and tensordd.nn
available. Compared with torch: outputs and weight gradients in float64 (rtol 1e-12:
the same sums in the same order, one rounding apart at most)."""

import os
import subprocess
import sys

import numpy as np
import pytest

import tensordd
import tensordd.nn.functional as F

torch = pytest.importorskip("torch")

RTOL, ATOL = 1e-12, 1e-12


def weight_grad(session, w_np, idx_np, **kw):
    w = session.tensor(w_np, requires_grad=True)
    idx = session.tensor(idx_np)
    out = F.embedding(idx, w, **kw)
    g = np.random.default_rng(3).standard_normal(out.shape)
    loss = (out * session.tensor(g)).sum()
    grads = loss.backward()
    return out.numpy(), grads.get(w).numpy(), g


def torch_ref(w_np, idx_np, g, **kw):
    w = torch.tensor(w_np, requires_grad=True)
    out = torch.nn.functional.embedding(torch.tensor(idx_np), w, **kw)
    (out * torch.tensor(g)).sum().backward()
    return out.detach().numpy(), w.grad.numpy()


@pytest.mark.parametrize("padding_idx", [0, 2, -1])
def test_padding_idx_matches_torch(session, padding_idx):
    rng = np.random.default_rng(1)
    w = rng.standard_normal((5, 3))
    idx = np.array([[0, 2, 4], [2, 2, 1]])
    out, gw, g = weight_grad(session, w, idx, padding_idx=padding_idx)
    t_out, t_gw = torch_ref(w, idx, g, padding_idx=padding_idx)
    np.testing.assert_allclose(out, t_out, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(gw, t_gw, rtol=RTOL, atol=ATOL)
    assert not gw[padding_idx % 5].any()


@pytest.mark.parametrize("norm_type", [2.0, 1.0])
def test_max_norm_output_and_gradient_match_torch(session, norm_type):
    rng = np.random.default_rng(2)
    w = rng.standard_normal((6, 4)) * np.array([[0.1], [3], [0.2], [5], [1], [2]])
    idx = np.array([1, 3, 0, 5, 3])
    out, gw, g = weight_grad(session, w, idx, max_norm=1.5, norm_type=norm_type)
    t_out, t_gw = torch_ref(w.copy(), idx, g, max_norm=1.5, norm_type=norm_type)
    # torch renormalizes with 1e-7 in the denominator too
    np.testing.assert_allclose(out, t_out, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(gw, t_gw, rtol=RTOL, atol=ATOL)


def test_module_padding_row_starts_at_zero(session):
    emb = tensordd.nn.Embedding(4, 3, padding_idx=1)
    assert not emb.weight.numpy()[1].any()
    out = emb(session.tensor(np.array([1, 0, 1])))
    assert not out.numpy()[0].any() and out.numpy()[1].any()


@pytest.mark.parametrize("dt", [np.uint8, np.int8, np.int16, np.int32, np.int64])
def test_narrow_integer_indices(session, dt):
    x_np = np.arange(12, dtype=np.float32).reshape(3, 4)
    x = session.tensor(x_np)
    gi = np.array([[0, 3], [2, 1], [1, 1]])
    np.testing.assert_array_equal(x.gather(1, session.tensor(gi.astype(dt))).numpy(),
                                  np.take_along_axis(x_np, gi, 1))
    si = np.array([2, 0])
    np.testing.assert_array_equal(x.index_select(0, session.tensor(si.astype(dt))).numpy(),
                                  x_np[si])
    np.testing.assert_array_equal(F.embedding(session.tensor(si.astype(dt)), x).numpy(),
                                  x_np[si])


def test_import_tensordd_makes_parallel_available():
    code = "import tensordd; print(tensordd.parallel.__name__, tensordd.nn.__name__)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=60, env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["tensordd.parallel", "tensordd.nn"]
