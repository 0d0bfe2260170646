"""cuda devices through the daemon: the grad_replace mismatch matrix with
real GPU devices, device memory accounting, and the emulator's fault injection.

Runs only when TDD_GPU_ARGS is set (gpusuite.py). The fault injections need the
emulated build (`--emu-gpus` in TDD_GPU_ARGS): its TDD_EMU_FAIL_ALLOC and
TDD_EMU_STICKY_LAUNCH (backends/cuda/emu/emu.h) make the Nth device allocation fail and
the Nth kernel launch fault, which a real GPU cannot be asked to do.
"""

from __future__ import annotations

import gc
import os

import numpy as np
import pytest

import tensordd

from gpusuite import GPU_ARGS, gpu_daemon_fixture, only_with_gpu, start_gpu_daemon

pytestmark = only_with_gpu
EMU = GPU_ARGS is not None and "--emu-gpus" in GPU_ARGS


def start(monkeypatch=None, **env):
    if monkeypatch:
        for k, v in env.items():
            monkeypatch.setenv(k, str(v))
    return start_gpu_daemon(cpu_devices=2)


gpu_daemon = gpu_daemon_fixture(cpu_devices=2)


@pytest.fixture
def gs(gpu_daemon):
    s = tensordd.connect(gpu_daemon.endpoint, timeout=120)
    devs = [str(d) for d in s.devices()]
    if "cuda:1" not in devs:
        pytest.skip(f"two CUDA devices needed, the daemon serves {devs}")
    yield s
    s.close(raise_errors=False)


def in_use(s):
    s.sync()  # also sends the pending releases
    return {dev: m["bytes_in_use"] for dev, m in s.stats()["memory"].items()}


@pytest.mark.parametrize("target,grad_device,error", [
    ("cpu:0", "cuda:0", tensordd.BackendMismatchError),
    ("cuda:0", "cpu:0", tensordd.BackendMismatchError),
    ("cuda:0", "cuda:1", tensordd.DeviceMismatchError),
    ("cuda:1", "cuda:0", tensordd.DeviceMismatchError),
])
def test_replace_mismatch_matrix_on_gpus(gs, target, grad_device, error):
    w = np.array([1.0, -2.0, 3.0], np.float32)
    W = gs.tensor(w, device=target, requires_grad=True)
    grads = (W * W).sum().backward()  # the backward pass runs on target
    before = grads.get(W).numpy()
    np.testing.assert_allclose(before, 2 * w, rtol=1e-6)
    mem = in_use(gs)
    bad = gs.tensor(np.ones(3, np.float32), device=grad_device)
    with pytest.raises(error) as info:
        grads.replace(W, bad)
    e = info.value
    assert (str(e.target), str(e.grad)) == (target, grad_device)  # names both
    assert "grad_replace" in str(e)
    np.testing.assert_array_equal(grads.get(W).numpy(), before)  # nothing installed
    del bad, e, info
    gc.collect()
    assert in_use(gs) == mem  # nothing leaked, on either device
    # the fix: move the gradient where the target lives
    grads.replace(W, gs.tensor(np.ones(3, np.float32), device=grad_device).to(target))
    np.testing.assert_array_equal(grads.get(W).numpy(), np.ones(3))


def test_dtype_and_shape_mismatch_on_gpu(gs):
    W = gs.tensor(np.ones(3, np.float32), device="cuda:0", requires_grad=True)
    grads = (W * W).sum().backward()
    with pytest.raises(tensordd.DTypeMismatchError):
        grads.replace(W, gs.tensor(np.ones(3, np.float64), device="cuda:0"))
    with pytest.raises(tensordd.ShapeMismatchError):
        grads.replace(W, gs.tensor(np.ones(4, np.float32), device="cuda:0"))


def test_devices_listed_with_memory(gs):
    info = {str(i["device"]): i for i in gs.device_info()}
    for dev in ("cuda:0", "cuda:1", "cpu:0"):
        assert dev in info
    assert info["cuda:0"]["memory_total"] > 0
    if EMU:
        assert "emulator" in info["cuda:0"]["name"]


def test_copies_between_gpus_and_host(gs):
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    back = (gs.tensor(a).to("cuda:0") * 2).to("cuda:1").to("cpu:0")
    np.testing.assert_array_equal(back.numpy(), a * 2)
    # a strided host view copied to the device arrives dense
    t = gs.tensor(a).permute(2, 0, 1).to("cuda:1")
    np.testing.assert_array_equal(t.numpy(), a.transpose(2, 0, 1))


# ---------------------------------------------------------------- fault injection

emu_only = pytest.mark.skipif(not EMU, reason="fault injection needs the emulated build")


@emu_only
def test_failed_allocation_is_resource_exhausted_and_the_session_continues(monkeypatch):
    # Device allocations in this session: a (1), b (2), a * b (3: fails), a + b (4).
    d = start(monkeypatch, TDD_EMU_FAIL_ALLOC=3)
    try:
        with tensordd.connect(d.endpoint, timeout=60) as s:
            base = in_use(s)
            x = np.arange(6, dtype=np.float32).reshape(2, 3)
            a = s.tensor(x, device="cuda:0")
            b = s.tensor(x + 1, device="cuda:0")
            c = a * b
            with pytest.raises(tensordd.ResourceExhaustedError):
                s.sync()
            with pytest.raises(tensordd.PoisonedError):
                c.numpy()
            np.testing.assert_array_equal((a + b).numpy(), 2 * x + 1)  # the session goes on
            del a, b, c
            gc.collect()
            assert in_use(s) == base  # device bytes back to the baseline
        assert "allocation 3" in d.log()
    finally:
        assert d.stop() == 0, d.log()


@emu_only
def test_sticky_error_fails_the_device_and_cpu_still_serves(monkeypatch):
    # Kernel launches: a + b (1), (a + b) * 2 (2: raises the sticky error).
    d = start(monkeypatch, TDD_EMU_STICKY_LAUNCH=2)
    try:
        with tensordd.connect(d.endpoint, timeout=60) as s:
            x = np.ones(4, np.float32)
            a = s.tensor(x, device="cuda:0")
            b = a + a
            np.testing.assert_array_equal(b.numpy(), 2 * x)
            c = b * 2
            with pytest.raises(tensordd.DeviceError):  # the fault itself
                c.numpy()
            with pytest.raises(tensordd.DeviceUnavailableError):
                a.numpy()  # the device stays failed: its tensors cannot be read back
            # ListDevices marks cuda:0 failed, saying why; the others still serve
            info = {str(i["device"]): i for i in s.device_info()}
            assert info["cuda:0"]["failed"]
            assert "cudaErrorIllegalAddress" in info["cuda:0"]["status"]
            for dev in ("cuda:1", "cpu:0"):
                assert not info[dev]["failed"] and info[dev]["status"] == ""
            # cpu:0 and the other GPU still serve
            np.testing.assert_array_equal((s.tensor(x) * 3).numpy(), 3 * x)
            np.testing.assert_array_equal((s.tensor(x, device="cuda:1") * 3).numpy(), 3 * x)
        assert "sticky" in d.log()
    finally:
        assert d.stop() == 0, d.log()


@emu_only
def test_allocation_on_a_failed_device_is_device_unavailable(monkeypatch):
    d = start(monkeypatch, TDD_EMU_STICKY_LAUNCH=1)
    try:
        with tensordd.connect(d.endpoint, timeout=60) as s:
            a = s.tensor(np.ones(4, np.float32), device="cuda:0")
            with pytest.raises(tensordd.DeviceError):
                (a + a).numpy()  # the launch faults: the device has failed
            with pytest.raises(tensordd.DeviceUnavailableError):
                (a + a).numpy()  # a new output needs an allocation on the failed device
    finally:
        d.stop()


@emu_only
def test_device_error_code_and_class():
    # DEVICE_ERROR: the last code of the list (include/td_error.h, proto ErrorCode)
    assert tensordd.DeviceError.code == "DEVICE_ERROR"
    assert tensordd.error_class("DEVICE_ERROR") is tensordd.DeviceError
    assert tensordd.error_class(23) is tensordd.DeviceError


@emu_only
def test_tdctl_devices_prints_the_failed_device(monkeypatch):
    import subprocess
    d = start(monkeypatch, TDD_EMU_STICKY_LAUNCH=1)
    try:
        with tensordd.connect(d.endpoint, timeout=60) as s:
            a = s.tensor(np.ones(4, np.float32), device="cuda:0")
            with pytest.raises(tensordd.DeviceError):
                (a + a).numpy()
            tdctl = os.environ.get("TDCTL_BIN", "build/emu/tdctl")
            out = subprocess.run([tdctl, "--endpoint", d.endpoint, "devices"],
                                 capture_output=True, text=True, timeout=60)
            assert out.returncode == 0, out.stderr
            lines = out.stdout.splitlines()
            row = next(i for i, l in enumerate(lines) if l.startswith("cuda:0"))
            assert "FAILED: cudaErrorIllegalAddress" in lines[row + 1]
            assert "FAILED" not in "".join(l for l in lines if l.startswith(("cuda:1", "cpu:0")))
    finally:
        assert d.stop() == 0, d.log()


@emu_only
def test_out_of_device_memory_names_requested_and_free_bytes(monkeypatch):
    d = start(monkeypatch, TDD_EMU_FAIL_ALLOC=2)
    try:
        with tensordd.connect(d.endpoint, timeout=60) as s:
            a = s.tensor(np.ones(1000, np.float32), device="cuda:0")
            b = a * 2
            with pytest.raises(tensordd.ResourceExhaustedError) as info:
                b.numpy()
            e = info.value
            assert e.resource == "cuda:0 memory"
            assert e.requested == 4000
            assert 0 < e.available <= info_total(s, "cuda:0")
            assert "4000 bytes requested" in str(e) and "free" in str(e)
    finally:
        assert d.stop() == 0, d.log()


def info_total(s, dev):
    return {str(i["device"]): i for i in s.device_info()}[dev]["memory_total"]


@emu_only
def test_device_error_names_the_cuda_error(monkeypatch):
    d = start(monkeypatch, TDD_EMU_STICKY_LAUNCH=1)
    try:
        with tensordd.connect(d.endpoint, timeout=60) as s:
            a = s.tensor(np.ones(4, np.float32), device="cuda:0")
            with pytest.raises(tensordd.DeviceError) as info:
                (a + a).numpy()
            assert "cudaErrorIllegalAddress" in str(info.value)
    finally:
        assert d.stop() == 0, d.log()
