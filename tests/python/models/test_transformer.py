"""A small transformer trained through the daemon matches PyTorch.

One model source (token embedding, a positional parameter added, pre-norm blocks of
layer_norm, causal multi-head attention, linear, gelu and residual adds, a final
layer_norm and a linear head, cross_entropy) runs twice: under torch 1.13 and under
tensordd with only the imports changed (``import tensordd as torch; from tensordd import
nn, optim``). The attention is the one difference: tensordd calls
F.scaled_dot_product_attention(is_causal=True), one fused op in the daemon; torch 1.13 has
no such function, so its side is torch 2.x's formula written out (softmax of the masked,
scaled scores, times v). Both start from torch's initial weights (load_state_dict) and take
a few Adam steps on the same batches. Tolerances (float32): losses rtol 1e-4 / atol 1e-5,
every parameter after training rtol 1e-4 / atol 5e-5. On cpu:0, or on cuda:0 when
TDD_GPU_ARGS is set (tests/gpu/suites.sh runs this file on the emulated and real GPUs).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import tensordd
from conftest import Daemon

torch = pytest.importorskip("torch")

GPU_ARGS = os.environ.get("TDD_GPU_ARGS")
DEVICE = "cuda:0" if GPU_ARGS is not None else "cpu:0"

TORCH_IMPORTS = '''import math
import torch
from torch import nn, optim


def attend(q, k, v):
    T = q.shape[-2]
    att = q @ k.transpose(-2, -1) * (1.0 / math.sqrt(q.shape[-1]))
    att = att.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    return torch.softmax(att, dim=-1) @ v
'''
TDD_IMPORTS = '''import tensordd as torch
from tensordd import nn, optim


def attend(q, k, v):
    return nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
'''

MODEL = '''
class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        # no bias: the key's bias has a zero gradient in exact arithmetic (softmax ignores
        # a constant added to a row of scores), so Adam would scale rounding noise to lr
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.act = nn.GELU()
        self.out = nn.Linear(4 * d, d)

    def forward(self, x):
        B, T, C = x.shape
        H = self.heads
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.reshape(B, T, H, C // H).transpose(1, 2) for t in (q, k, v))
        y = attend(q, k, v).transpose(1, 2).reshape(B, T, C)
        x = x + self.proj(y)
        return x + self.out(self.act(self.fc(self.ln2(x))))


class TinyGPT(nn.Module):
    def __init__(self, vocab=13, T=6, d=16, heads=2, layers=2):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.zeros(T, d))
        self.blocks = nn.ModuleList([Block(d, heads) for _ in range(layers)])
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)

    def forward(self, idx):
        B, T = idx.shape
        x = self.tok(idx) + self.pos[:T]
        for b in self.blocks:
            x = b(x)
        return self.head(self.ln(x))


def run(init, X, Y, steps, dev):
    model = TinyGPT()
    model.load_state_dict(init)
    model.to(dev)
    opt = optim.Adam(model.parameters(), lr=0.01)
    losses = []
    for s in range(steps):
        x = torch.tensor(X[s % len(X)]).to(dev)
        y = torch.tensor(Y[s % len(Y)]).to(dev)
        opt.zero_grad()
        logits = model(x)
        loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, model.state_dict()
'''


def _load(imports):
    ns = {}
    exec(compile(imports + MODEL, "<transformer>", "exec"), ns)
    return ns


@pytest.fixture(scope="module")
def sess():
    d = Daemon("--cpu-devices", "1", *(GPU_ARGS or "").split())
    s = tensordd.connect(d.endpoint, timeout=120)
    tensordd.set_default_session(s)
    yield s
    tensordd.set_default_session(None)
    s.close(raise_errors=False)
    rc = d.stop()
    assert rc == 0, f"daemon exited with {rc} on SIGTERM:\n{d.log()}"


def test_tiny_transformer_trains_as_torch(sess):
    rng = np.random.default_rng(14)
    # next-token batches of a noisy counting sequence: learnable in a few steps
    starts = rng.integers(0, 13, (4, 3, 1))
    seq = (starts + np.arange(7)) % 13
    X, Y = seq[:, :, :6].astype(np.int64), seq[:, :, 1:].astype(np.int64)
    torch.manual_seed(0)
    tns = _load(TORCH_IMPORTS)
    init = {k: v.clone() for k, v in tns["TinyGPT"]().state_dict().items()}
    t_losses, t_state = tns["run"](init, X, Y, 6, "cpu")

    dns = _load(TDD_IMPORTS)
    d_losses, d_state = dns["run"](init, X, Y, 6, DEVICE)
    np.testing.assert_allclose(d_losses, t_losses, rtol=1e-4, atol=1e-5)
    assert list(d_state) == list(t_state)
    for name in t_state:
        np.testing.assert_allclose(d_state[name].numpy(), t_state[name].detach().numpy(),
                                   rtol=1e-4, atol=5e-5, err_msg=name)
    assert t_losses[-1] < t_losses[0]  # it learns something: the comparison is not of noise
