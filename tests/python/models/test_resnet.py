"""A ResNet-style CNN trains as torch's does.

One model source text (conv2d, batch_norm, relu, residual adds, a strided projection
shortcut, adaptive_avg_pool2d, linear, cross_entropy) runs under torch and, with only its
imports changed, under tensordd. Both start from torch's initial weights (load_state_dict),
train 4 steps on 4x3x8x8 batches with SGD (momentum, weight decay) or Adam, then run an
eval-mode forward. Losses, every parameter, the BatchNorm running stats and
num_batches_tracked must match torch's. Tolerances (float32 throughout): losses rtol 1e-4 /
atol 1e-5; parameters and running stats after the steps rtol 1e-4 / atol 1e-5; the eval
logits rtol 1e-4 / atol 1e-4 (measured on cpu:0: at most 3.3e-7 apart). On cpu:0, and on
cuda:0 in the GPU suites (the same model moved there with model.to).
"""

from __future__ import annotations

import numpy as np
import pytest

import tensordd
from gpusuite import devices

torch = pytest.importorskip("torch")

TORCH_IMPORTS = "import torch\nfrom torch import nn, optim\nimport torch.nn.functional as F\n"
TDD_IMPORTS = ("import tensordd as torch\nfrom tensordd import nn, optim\n"
               "import tensordd.nn.functional as F\n")

MODEL = '''
class Block(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False),
                                          nn.BatchNorm2d(cout))
        else:
            self.shortcut = nn.Identity()

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet(nn.Module):
    def __init__(self, classes=5):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(8)
        self.layer1 = Block(8, 8, 1)
        self.layer2 = Block(8, 16, 2)
        self.pool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(16, classes)

    def forward(self, x):
        x = F.relu(self.bn(self.stem(x)))
        x = self.layer2(self.layer1(x))
        return self.fc(self.pool(x).flatten(1))


def run(init, X, Y, opt_name, dev, steps, batch):
    model = ResNet()
    model.load_state_dict(init)
    model.to(dev)
    model.train()
    if opt_name == "sgd":
        opt = optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    else:
        opt = optim.Adam(model.parameters(), lr=0.01)
    losses = []
    for step in range(steps):
        i = (step * batch) % len(X)
        x, y = torch.tensor(X[i:i + batch]).to(dev), torch.tensor(Y[i:i + batch]).to(dev)
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    model.eval()
    logits = model(torch.tensor(X[:batch]).to(dev))
    return losses, model.state_dict(), logits.detach().cpu().numpy()
'''


def _load(imports):
    ns = {}
    exec(compile(imports + MODEL, "<resnet14>", "exec"), ns)
    return ns


def _data(n=16):
    rng = np.random.default_rng(14)
    X = rng.standard_normal((n, 3, 8, 8)).astype(np.float32)
    Y = rng.integers(0, 5, n).astype(np.int64)
    return X, Y


def check_resnet_matches_torch(opt_name, dev):
    X, Y = _data()
    tns = _load(TORCH_IMPORTS)
    torch.manual_seed(0)
    init = {k: v.clone() for k, v in tns["ResNet"]().state_dict().items()}
    t_losses, t_state, t_logits = tns["run"](init, X, Y, opt_name, "cpu", 4, 4)

    dns = _load(TDD_IMPORTS)
    d_losses, d_state, d_logits = dns["run"](init, X, Y, opt_name, dev, 4, 4)
    np.testing.assert_allclose(d_losses, t_losses, rtol=1e-4, atol=1e-5)
    assert list(d_state) == list(t_state)
    assert sum(k.endswith("running_mean") for k in t_state) == 6
    for name, want in t_state.items():
        got = d_state[name].numpy()
        if name.endswith("num_batches_tracked"):
            assert int(got) == int(want) == 4, name
            continue
        np.testing.assert_allclose(got, want.detach().numpy(), rtol=1e-4, atol=1e-5,
                                   err_msg=name)
    np.testing.assert_allclose(d_logits, t_logits, rtol=1e-4, atol=1e-4, err_msg="eval logits")
    # the steps moved the weights and the running stats off their start
    assert not np.allclose(t_state["fc.weight"].numpy(), init["fc.weight"].numpy())
    assert not np.allclose(t_state["bn.running_var"].numpy(), 1.0)


@pytest.mark.parametrize("device", devices("cpu:0"))
@pytest.mark.parametrize("opt_name", ["sgd", "adam"])
def test_resnet_matches_torch(device_session, opt_name, device):
    assert tensordd.default_session() is device_session
    check_resnet_matches_torch(opt_name, device)
