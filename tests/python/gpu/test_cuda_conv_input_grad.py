"""test_conv_input_grad.py's shapes on cuda:0 (float32, the same torch oracle and
tolerances): conv2d's input gradient through cuda's conv_transpose2d, and the second
order through its formulas. Runs only when TDD_GPU_ARGS is set, e.g. against the emulated
build: TDD_GPU_ARGS="--emu-gpus 2 --emu-gpu-memory 256M" TDD_BIN=build/X-emu/tensordd ...
A case whose op cuda declines (a typed error) is skipped."""

from __future__ import annotations

import pytest

import tensordd
import test_conv_input_grad as C

pytest.importorskip("torch")

from gpusuite import declined, gpu_daemon_fixture, gpu_session_fixture, only_with_gpu  # noqa: E402

pytestmark = only_with_gpu

gpu_daemon = gpu_daemon_fixture(cpu_devices=1)


ad = gpu_session_fixture("ad")


@pytest.mark.parametrize("name,xs,ws,kw", [pytest.param(*s, id=s[0]) for s in C.SHAPES])
def test_conv2d_gradients_on_cuda_match_torch(ad, name, xs, ws, kw):
    try:
        C.test_conv2d_gradients_match_torch(ad, name, xs, ws, kw, "cuda:0", "float32")
    except tensordd.Error as e:
        if declined(e):
            pytest.skip(f"cuda declines an op of a pass: {e}")
        raise
