"""The torch training idiom over the daemon's Gradients.

The port test: one training script (an MLP, and a small CNN) is written once
as source text importing torch; the tensordd run executes the same text with
only its imports changed (``import tensordd as torch; from tensordd import
nn, optim``). Both start from torch's initial weights (load_state_dict of
torch's state_dict) and train a few steps with zero_grad/backward/step and a
scheduler. Tolerances (float32 throughout): losses rtol 1e-4 / atol 1e-5,
parameters rtol 1e-4 / atol 2e-5 after every run.
"""

from __future__ import annotations

import numpy as np
import pytest

import tensordd

torch = pytest.importorskip("torch")

TORCH_IMPORTS = "import torch\nfrom torch import nn, optim\n"
TDD_IMPORTS = "import tensordd as torch\nfrom tensordd import nn, optim\n"

MODELS = '''
class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.Tanh(),
                                 nn.Linear(16, 3))

    def forward(self, x):
        return self.net(x)


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(4 * 4 * 4, 3))

    def forward(self, x):
        return self.head(self.pool(self.conv(x).relu()))
'''

TRAIN = '''
def run(kind, init, X, Y, opt_name, sched_name, epochs, batch):
    model = MLP() if kind == "mlp" else CNN()
    model.load_state_dict(init)
    model.train()
    first = list(model.net[0].parameters()) if kind == "mlp" else list(model.conv.parameters())
    rest = [p for p in model.parameters() if all(p is not q for q in first)]
    if opt_name == "sgd":
        opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3)
    elif opt_name == "adam":
        opt = optim.Adam(model.parameters(), lr=0.01)
    else:  # param groups, a per-group lr
        opt = optim.AdamW([{"params": first, "lr": 0.02}, {"params": rest}], lr=0.005,
                          weight_decay=0.05)
    if sched_name == "step":
        sched = optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    elif sched_name == "cosine":
        sched = optim.lr_scheduler.CosineAnnealingLR(opt, T_max=4, eta_min=0.001)
    else:
        sched = optim.lr_scheduler.LambdaLR(opt, lambda e: 1.0 / (1 + e))
    loss_fn = nn.CrossEntropyLoss()
    x, y = torch.tensor(X), torch.tensor(Y)
    losses, lrs = [], []
    for epoch in range(epochs):
        for i in range(0, len(X), batch):
            opt.zero_grad()
            loss = loss_fn(model(x[i:i + batch]), y[i:i + batch])
            loss.backward()
            opt.step()
            losses.append(loss.item())
        sched.step()
        lrs.append([g["lr"] for g in opt.param_groups])
    model.eval()
    return losses, lrs, model.state_dict(), model, opt
'''


def _load(imports):
    ns = {}
    exec(compile(imports + MODELS + TRAIN, "<port>", "exec"), ns)
    return ns


def _data(kind, n=24):
    rng = np.random.default_rng(7)
    if kind == "mlp":
        X = rng.standard_normal((n, 8)).astype(np.float32)
    else:
        X = rng.standard_normal((n, 1, 8, 8)).astype(np.float32)
    Y = rng.integers(0, 3, n).astype(np.int64)
    return X, Y


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
@pytest.mark.parametrize("opt_name,sched_name", [("sgd", "step"), ("adam", "cosine"),
                                                 ("groups", "lambda")])
def test_port_matches_torch(session, kind, opt_name, sched_name):
    X, Y = _data(kind)
    torch.manual_seed(0)
    tns = _load(TORCH_IMPORTS)
    init = (tns["MLP"] if kind == "mlp" else tns["CNN"])().state_dict()
    init = {k: v.clone() for k, v in init.items()}
    t_losses, t_lrs, t_state, _, _ = tns["run"](kind, init, X, Y, opt_name, sched_name, 4, 8)

    dns = _load(TDD_IMPORTS)
    assert tensordd.default_session() is session
    d_losses, d_lrs, d_state, model, opt = dns["run"](kind, init, X, Y, opt_name, sched_name,
                                                      4, 8)
    assert d_lrs == t_lrs  # the schedulers' arithmetic is torch's
    np.testing.assert_allclose(d_losses, t_losses, rtol=1e-4, atol=1e-5)
    assert list(d_state) == list(t_state)
    for name in t_state:
        np.testing.assert_allclose(d_state[name].numpy(), t_state[name].detach().numpy(),
                                   rtol=1e-4, atol=2e-5, err_msg=name)
    assert model.training is False and all(not m.training for m in model.modules())
    # the loss went down in both
    assert np.mean(d_losses[-3:]) < np.mean(d_losses[:3])


def test_grad_is_lazy_accumulates_and_zero_grad_clears(session):
    w0 = np.array([[0.5, -1.0], [2.0, 0.25]], np.float32)
    x0 = np.array([[1.0, 2.0], [-1.0, 0.5]], np.float32)
    w = tensordd.nn.Parameter(w0)
    x = session.tensor(x0)
    tw = torch.tensor(w0, requires_grad=True)
    tx = torch.tensor(x0)
    assert w.grad is None
    (x @ w).square().sum().backward()
    (tx @ tw).square().sum().backward()
    g = w.grad
    assert isinstance(g, tensordd.Tensor)  # a handle: nothing downloaded yet
    np.testing.assert_allclose(g.numpy(), tw.grad.numpy(), rtol=1e-6)
    (x @ w).sum().backward()  # accumulates, as torch
    (tx @ tw).sum().backward()
    np.testing.assert_allclose(w.grad.numpy(), tw.grad.numpy(), rtol=1e-6)
    opt = tensordd.optim.SGD([w], lr=0.1)
    topt = torch.optim.SGD([tw], lr=0.1)
    opt.step()  # with the accumulated gradient
    topt.step()
    np.testing.assert_allclose(w.numpy(), tw.detach().numpy(), rtol=1e-5, atol=1e-6)
    opt.zero_grad()
    assert w.grad is None
    opt.step()  # no gradients: nothing changes, as torch
    np.testing.assert_allclose(w.numpy(), tw.detach().numpy(), rtol=1e-5, atol=1e-6)
    # a hand-set gradient is used by step()
    w.grad = session.tensor(np.ones((2, 2), np.float32))
    tw.grad = torch.ones(2, 2)
    opt.step()
    topt.step()
    np.testing.assert_allclose(w.numpy(), tw.detach().numpy(), rtol=1e-5, atol=1e-6)


def test_optimizer_state_dict_and_lr_changes(session):
    w = tensordd.nn.Parameter(np.ones(3, np.float32))
    opt = tensordd.optim.SGD([w], lr=0.5, momentum=0.9)
    sd = opt.state_dict()
    assert sd["state"] == {} and sd["param_groups"][0]["lr"] == 0.5
    assert sd["param_groups"][0]["params"] == [0]
    sd["param_groups"][0]["lr"] = 0.125
    opt.load_state_dict(sd)
    assert opt.param_groups[0]["lr"] == 0.125
    other = opt.state_dict()  # a group's options are taken, as torch takes them
    other["param_groups"][0]["momentum"] = 0.5
    opt.load_state_dict(other)
    assert opt.param_groups[0]["momentum"] == 0.5
    opt.param_groups[0]["momentum"] = 0.9  # sent with the next step
    with pytest.raises(ValueError, match="state"):
        opt.load_state_dict({"state": {0: {"momentum_buffer": 1}},
                             "param_groups": opt.state_dict()["param_groups"]})
    # the step runs at the new lr (momentum state kept): compare with torch
    tw = torch.ones(3, requires_grad=True)
    topt = torch.optim.SGD([tw], lr=0.5, momentum=0.9)
    for lr in (0.5, 0.125, 0.3, 0.0):
        opt.param_groups[0]["lr"] = lr
        topt.param_groups[0]["lr"] = lr
        opt.zero_grad()
        topt.zero_grad()
        (w * w * session.tensor(np.array([1.0, 2.0, 3.0], np.float32))).sum().backward()
        (tw * tw * torch.tensor([1.0, 2.0, 3.0])).sum().backward()
        opt.step()
        topt.step()
        np.testing.assert_allclose(w.numpy(), tw.detach().numpy(), rtol=1e-6, atol=1e-7)


def test_module_api(session):
    nn = tensordd.nn
    m = nn.Sequential(nn.Linear(4, 5), nn.ReLU(), nn.Dropout(0.5), nn.LayerNorm(5),
                      nn.Linear(5, 2, bias=False))
    names = [n for n, _ in m.named_parameters()]
    assert names == ["0.weight", "0.bias", "3.weight", "3.bias", "4.weight"]
    assert all(isinstance(p, nn.Parameter) and p.requires_grad and p.is_leaf
               for p in m.parameters())
    sd = m.state_dict()
    assert list(sd) == names and sd["0.weight"].shape == (5, 4)
    x = session.tensor(np.ones((3, 4), np.float32))
    m.eval()
    a = m(x).numpy()
    np.testing.assert_array_equal(a, m(x).numpy())  # dropout off in eval
    assert m.train() is m and m[2].training
    emb = nn.Embedding(10, 3)
    assert emb(session.tensor(np.array([1, 2, 1]))).shape == (3, 3)
    m2 = nn.Sequential(nn.Linear(4, 5), nn.ReLU(), nn.Dropout(0.5), nn.LayerNorm(5),
                       nn.Linear(5, 2, bias=False))
    m2.load_state_dict(m.state_dict())
    m.eval()
    m2.eval()
    np.testing.assert_allclose(m2(x).numpy(), m(x).numpy())
    with pytest.raises(KeyError):
        m2.load_state_dict({"0.weight": np.zeros((5, 4), np.float32)})


def test_gradients_api_is_unchanged(session):
    """The daemon's API keeps its release semantics: a session that never used
    the torch idiom does not keep backward()'s Gradients."""
    w = session.tensor(np.ones(2, np.float32), requires_grad=True)
    assert session.retain_grads is False
    g = (w * 3).sum().backward()
    assert isinstance(g, tensordd.Gradients) and session._grad_sets == []
    np.testing.assert_array_equal(g.get(w).numpy(), [3.0, 3.0])
