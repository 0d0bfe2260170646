"""Device-memory paths without a GPU: the daemon's simulated discrete device
(`--sim-devices`) keeps tensors in memory the socket may not touch, so uploads,
downloads, strided views and cross-device copies take the staged paths a CUDA
device takes. Its kernels are the reference backend's, so results are checked
bit for bit against numpy."""

import numpy as np
import pytest

import tensordd
from conftest import Daemon


@pytest.fixture(scope="module")
def sim():
    d = Daemon("--cpu-devices", "1", "--sim-devices", "2")
    with tensordd.connect(d.endpoint) as s:
        yield s
    assert d.stop() == 0


def test_sim_devices_listed(sim):
    assert {"sim:0", "sim:1"} <= {str(d) for d in sim.devices()}


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64, np.uint8])
def test_roundtrip_bit_exact(sim, dtype):
    rng = np.random.default_rng(7)
    if dtype == np.uint8:
        a = rng.integers(0, 2, size=(33, 17)).astype(bool)
    else:
        a = (rng.standard_normal((33, 17)) * 100).astype(dtype)
    t = sim.tensor(a, device="sim:0")
    assert str(t.device) == "sim:0"
    got = t.numpy()
    assert got.dtype == a.dtype and np.array_equal(got, a)


def test_large_upload_download(sim):
    a = np.random.default_rng(1).standard_normal(3 << 20).astype(np.float32)  # 12 MiB
    assert np.array_equal(sim.tensor(a, device="sim:1").numpy(), a)


def test_ops_and_strided_view_download(sim):
    rng = np.random.default_rng(2)
    a = rng.standard_normal((4, 5)).astype(np.float32)
    b = rng.standard_normal((5, 3)).astype(np.float32)
    ta, tb = sim.tensor(a, device="sim:0"), sim.tensor(b, device="sim:0")
    np.testing.assert_allclose((ta @ tb).relu().numpy(), np.maximum(a @ b, 0), rtol=1e-6,
                               atol=1e-6)
    # a transposed view lives strided in device memory: laid out densely on the
    # device first, then copied out
    assert np.array_equal(ta.transpose(0, 1).numpy(), a.T)


def test_copies_between_host_and_device(sim):
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    on_cpu = sim.tensor(a)
    on_sim = on_cpu.to("sim:0")
    back = (on_sim * 2).to("sim:1").to("cpu:0")
    assert np.array_equal(back.numpy(), a * 2)
    # a strided host view copied to the device arrives dense
    assert np.array_equal(on_cpu.permute(2, 0, 1).to("sim:0").numpy(), a.transpose(2, 0, 1))


def test_mismatch_with_device_memory_is_typed(sim):
    x = sim.tensor(np.ones(3, np.float32), device="sim:0")
    y = sim.tensor(np.ones(3, np.float32), device="cpu:0")
    _z = x + y
    with pytest.raises(tensordd.BackendMismatchError) as info:
        sim.sync()
    assert (str(info.value.target), str(info.value.grad)) == ("sim:0", "cpu:0")
    assert np.array_equal((x + x).numpy(), np.full(3, 2, np.float32))


def test_training_step_on_device_memory(sim):
    w = sim.tensor(np.ones((3, 1), np.float32), device="sim:0", requires_grad=True)
    x = sim.tensor(np.eye(3, dtype=np.float32), device="sim:0")
    loss = (x @ w).sum()
    grads = loss.backward()
    assert np.array_equal(grads.get(w).numpy(), np.ones((3, 1), np.float32))
    tensordd.optim.SGD([w], lr=0.5).step(grads)
    assert np.array_equal(w.numpy(), np.full((3, 1), 0.5, np.float32))


@pytest.mark.parametrize("kind", ["adam", "adamw"])
def test_adam_amsgrad_on_device_memory(sim, kind):
    """Adam(W) with amsgrad as queued ops on device memory (sim:0) and as the
    host loop (cpu:0, float64: the scalar loop) both track torch.optim for 20
    steps; beta2 0.9 lets exp_avg_sq fall, so the running maximum matters."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(11)
    x, y, w0 = rng.uniform(-1.5, 1.5, (16, 3)), rng.uniform(-1.5, 1.5, (16, 2)), \
        rng.uniform(-1.5, 1.5, (3, 2))
    hyper = dict(lr=0.05, betas=(0.8, 0.9), weight_decay=0.1, amsgrad=True)
    cls, tcls = {"adam": (tensordd.optim.Adam, torch.optim.Adam),
                 "adamw": (tensordd.optim.AdamW, torch.optim.AdamW)}[kind]
    tw = torch.tensor(w0, requires_grad=True)
    topt = tcls([tw], **hyper)
    for _ in range(20):
        topt.zero_grad()
        torch.nn.functional.mse_loss(torch.tensor(x) @ tw, torch.tensor(y)).backward()
        topt.step()
    for dev in ("sim:0", "cpu:0"):
        w = sim.tensor(w0, device=dev, requires_grad=True)
        X, Y = sim.tensor(x, device=dev), sim.tensor(y, device=dev)
        opt = cls([w], **hyper)
        for _ in range(20):
            opt.step(sim.op("mse_loss", X @ w, Y).backward())
        np.testing.assert_allclose(w.numpy(), tw.detach().numpy(), rtol=1e-12, atol=1e-14,
                                   err_msg=dev)
