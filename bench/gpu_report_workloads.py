#!/usr/bin/env python3
"""gpu_report_workloads.py -- one training step of each workload `make gpu-report` profiles,
on a daemon's cuda:0 (the native client: ``import tensordd as torch``).

    gpu_report_workloads.py ENDPOINT WORKLOAD     WORKLOAD: mlp | resnet18 | gpt

mlp: the digits MLP of examples/train_digits.py (64 -> 128 -> 10, ReLU, batch 64, Adam).
resnet18: ResNet-18's layout (a 3x3 stem, four stages of two basic blocks, strides 1 2 2 2,
batch norm, global average pool, a linear head) at a quarter of its widths (16..128
channels) on 2 images of 3x32x32, SGD with momentum: the emulator runs every thread of every
kernel on the host, so the shapes are small; the kernels and their access patterns are the
full model's.
gpt: test_transformer.py's pre-norm GPT blocks (2 layers, d 64, 4 heads, T 32, batch 2),
causal F.scaled_dot_product_attention, Adam.
Each runs one warm-up step (weights and optimizer state made) and then the profiled step:
the daemon's TDD_EMU_PROFILE file is cut at the warm-up's end (its size is printed on
stdout as "step-start BYTES" before the step, read by tools/gpu_report.py).
"""
import os
import sys

import numpy as np

import tensordd
import tensordd as torch
from tensordd import nn, optim
import tensordd.nn.functional as F

DEV = "cuda:0"


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(64, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


class Basic(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False),
                                      nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + (self.down(x) if self.down is not None else x))


class ResNet18(nn.Module):
    def __init__(self, width=16, classes=10):
        super().__init__()
        self.stem = nn.Conv2d(3, width, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(width)
        blocks, cin = [], width
        for i, stride in enumerate((1, 2, 2, 2)):
            cout = width << i
            blocks += [Basic(cin, cout, stride), Basic(cout, cout, 1)]
            cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.pool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        x = F.relu(self.bn(self.stem(x)))
        return self.fc(self.pool(self.blocks(x)).flatten(1))


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
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
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.out(self.act(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, vocab=64, T=32, d=64, heads=4, layers=2):
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


def step(model, opt, x, y, flat=False):
    opt.zero_grad()
    out = model(x)
    if flat:
        out = out.reshape(-1, out.shape[-1])
        y = y.reshape(-1)
    loss = F.cross_entropy(out, y)
    loss.backward()
    opt.step()
    return loss.item()


def main():
    endpoint, workload = sys.argv[1], sys.argv[2]
    sess = tensordd.connect(endpoint, timeout=600)
    tensordd.set_default_session(sess)
    rng = np.random.default_rng(0)
    if workload == "mlp":
        model = MLP().to(DEV)
        opt = optim.Adam(model.parameters(), lr=3e-3)
        x = rng.standard_normal((64, 64)).astype(np.float32)
        y = rng.integers(0, 10, 64).astype(np.int64)
        flat = False
    elif workload == "resnet18":
        model = ResNet18().to(DEV)
        model.train()
        opt = optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        x = rng.standard_normal((2, 3, 32, 32)).astype(np.float32)
        y = rng.integers(0, 10, 2).astype(np.int64)
        flat = False
    elif workload == "gpt":
        model = GPT().to(DEV)
        opt = optim.Adam(model.parameters(), lr=1e-3)
        x = rng.integers(0, 64, (2, 32)).astype(np.int64)
        y = rng.integers(0, 64, (2, 32)).astype(np.int64)
        flat = True
    else:
        sys.exit(f"unknown workload {workload}")
    xd, yd = torch.tensor(x).to(DEV), torch.tensor(y).to(DEV)
    step(model, opt, xd, yd, flat)  # warm-up: optimizer state made
    prof = os.environ.get("TDD_EMU_PROFILE_FILE")
    print("step-start", os.path.getsize(prof) if prof and os.path.exists(prof) else 0,
          flush=True)
    loss = step(model, opt, xd, yd, flat)
    print("loss", loss, flush=True)
    if workload == "gpt":
        # the step's attention (forward): per layer, batch and head, query i attends keys
        # 0..i; each pair costs a score (E multiply-adds) and a weighted row of v (Ev)
        T, d, heads, layers, batch = 32, 64, 4, 2, 2
        E = Ev = d // heads
        pairs = layers * batch * heads * T * (T + 1) // 2
        print("attention-flops", 2 * pairs * (E + Ev), flush=True)
    tensordd.set_default_session(None)
    sess.close(raise_errors=False)


if __name__ == "__main__":
    main()
