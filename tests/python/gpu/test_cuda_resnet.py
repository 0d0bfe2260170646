"""test_resnet.py's ResNet on cuda:0 (issue 14's must-show on the GPU path).

Runs only when TDD_GPU_ARGS is set (make test-emu, tests/gpu/run.sh): the same model text,
torch's initial weights, 4 SGD or Adam steps and an eval forward, moved to cuda:0 with
model.to; losses, parameters, running stats and eval logits held to torch's (CPU) with
test_resnet.py's tolerances.
"""

from __future__ import annotations


import pytest

import tensordd
from test_resnet import check_resnet_matches_torch

pytest.importorskip("torch")

from gpusuite import gpu_daemon_fixture, gpu_session_fixture, only_with_gpu

pytestmark = only_with_gpu


gpu_daemon = gpu_daemon_fixture(cpu_devices=1)


gs = gpu_session_fixture("gs")


@pytest.mark.parametrize("opt_name", ["sgd", "adam"])
def test_resnet_matches_torch_on_cuda(gs, opt_name):
    assert tensordd.default_session() is gs
    check_resnet_matches_torch(opt_name, "cuda:0")
