#!/usr/bin/env python3
"""train_torchstyle.py -- the digits MLP written as PyTorch code: an
nn.Module, DataLoader-like batching, zero_grad/backward/step and a learning
rate scheduler, and a checkpoint resumed. Only the imports say tensordd: swap them for
``import torch; from torch import nn, optim`` and it runs on torch unchanged.
Everything heavy (forward, backward, the AdamW update) runs in the daemon.

    PYTHONPATH=client/python:build/python /usr/bin/python3 examples/train_torchstyle.py [ENDPOINT]

ENDPOINT defaults to $TENSORDD_ENDPOINT or tcp://127.0.0.1:7070.
"""
import sys
import time

import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import tensordd as torch
from tensordd import nn, optim

EPOCHS = 12
BATCH = 64


class MLP(nn.Module):
    def __init__(self, n_in, n_hidden, n_out):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(n_in, n_hidden), nn.ReLU(), nn.Dropout(0.1),
                                  nn.Linear(n_hidden, n_hidden), nn.ReLU())
        self.head = nn.Linear(n_hidden, n_out)

    def forward(self, x):
        return self.head(self.body(x))


def batches(x, y, batch, rng):
    """A DataLoader(shuffle=True) in four lines: index batches of a permutation."""
    order = rng.permutation(len(x))
    for i in range(0, len(x), batch):
        idx = order[i:i + batch]
        yield torch.tensor(x[idx]), torch.tensor(y[idx])


def main():
    if hasattr(torch, "connect"):  # tensordd: which daemon (torch has nothing to connect to)
        torch.connect(sys.argv[1] if len(sys.argv) > 1 else None, timeout=120)
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.25, random_state=0)

    model = MLP(64, 128, 10)
    opt = optim.AdamW(model.parameters(), lr=3e-3, weight_decay=1e-2)
    sched = optim.lr_scheduler.CosineAnnealingLR(opt, T_max=EPOCHS, eta_min=1e-4)
    loss_fn = nn.CrossEntropyLoss()
    rng = np.random.default_rng(0)
    start = time.monotonic()
    for epoch in range(EPOCHS):
        model.train()
        total, n = 0.0, 0
        for xb, yb in batches(x_train, y_train, BATCH, rng):
            opt.zero_grad()
            loss = loss_fn(model(xb), yb)
            loss.backward()
            opt.step()
            total += loss.item() * len(yb)
            n += len(yb)
        sched.step()
        model.eval()
        with torch.no_grad():
            pred = model(torch.tensor(x_test)).argmax(dim=1).numpy()
        acc = float((pred == y_test).mean())
        print(f"epoch {epoch + 1:2d}  loss {total / n:.4f}  test acc {acc:.3f}  "
              f"lr {sched.get_last_lr()[0]:.5f}")
    print(f"trained in {time.monotonic() - start:.1f}s; first layer: "
          f"{model.body[0].weight.shape}, grad of the head bias: {model.head.bias.grad}")
    if acc < 0.9:
        print("accuracy below 0.9: something is wrong", file=sys.stderr)
        return 1

    # Resuming from a checkpoint, as in torch: a fresh model and optimizer take the
    # state dicts (the optimizer's moments and step counts too), so one more step
    # on each (eval mode: no dropout draws) leaves the same parameters.
    model2 = MLP(64, 128, 10)
    opt2 = optim.AdamW(model2.parameters(), lr=3e-3, weight_decay=1e-2)
    model2.load_state_dict(model.state_dict())
    opt2.load_state_dict(opt.state_dict())
    xb, yb = next(batches(x_train, y_train, BATCH, rng))
    for m, o in ((model, opt), (model2, opt2)):
        m.eval()
        o.zero_grad()
        loss_fn(m(xb), yb).backward()
        o.step()
    diff = max((p - q).abs().max().item() for p, q in zip(model.parameters(),
                                                         model2.parameters()))
    print(f"resumed from a checkpoint: one more step, parameters differ by {diff}")
    if diff != 0:
        print("the resumed run differs", file=sys.stderr)
        return 1
    if hasattr(torch, "default_session"):
        torch.default_session().close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
