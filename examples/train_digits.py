#!/usr/bin/env python3
"""train_digits.py -- a 2-layer MLP trained on scikit-learn's digits entirely
over the wire: the forward pass, the backward pass and the Adam step all run
in the daemon; only each batch goes up and only the loss comes back.

The training step is recorded once (Session.capture) and replayed for every
later batch: one Replay message per step, with the batch's two uploads in the
same write. --one-by-one sends each step's requests one by one instead.

    PYTHONPATH=client/python /usr/bin/python3 examples/train_digits.py [ENDPOINT]
        [--device DEV] [--epochs N] [--one-by-one]

ENDPOINT defaults to $TENSORDD_ENDPOINT or tcp://127.0.0.1:7070; DEV (where the
model and batches live) to cpu:0, e.g. cuda:0.
"""
import argparse
import os
import sys
import time

import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import tensordd

HIDDEN = 128
EPOCHS = 20
BATCH = 64
LR = 3e-3


def init_layer(rng, fan_in, fan_out):
    # PyTorch's nn.Linear initialisation: U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
    bound = 1.0 / np.sqrt(fan_in)
    w = rng.uniform(-bound, bound, size=(fan_in, fan_out)).astype(np.float32)
    b = rng.uniform(-bound, bound, size=(fan_out,)).astype(np.float32)
    return w, b


def main():
    ap = argparse.ArgumentParser(description="train a digits MLP in the daemon")
    ap.add_argument("endpoint", nargs="?", default=os.environ.get(
        "TENSORDD_ENDPOINT", "tcp://127.0.0.1:7070"))
    ap.add_argument("--device", default="cpu:0")
    ap.add_argument("--epochs", type=int, default=EPOCHS)
    ap.add_argument("--one-by-one", action="store_true",
                    help="send every step's requests instead of replaying the recorded step")
    args = ap.parse_args()
    endpoint, dev, epochs = args.endpoint, args.device, args.epochs
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=0.2, random_state=0, stratify=y)
    rng = np.random.default_rng(0)
    w1, b1 = init_layer(rng, 64, HIDDEN)
    w2, b2 = init_layer(rng, HIDDEN, 10)

    start = time.monotonic()
    with tensordd.connect(endpoint) as s:
        params = [s.tensor(a, device=dev, requires_grad=True) for a in (w1, b1, w2, b2)]
        W1, B1, W2, B2 = params
        opt = tensordd.optim.Adam(params, lr=LR)

        def forward(xb):
            return (xb @ W1 + B1).relu() @ W2 + B2

        def train_step(xb, yb):
            loss = s.op("cross_entropy", forward(xb), yb)
            opt.step(loss.backward())
            return loss

        n = len(x_train)
        print(f"training a 64-{HIDDEN}-10 MLP on {n} digits over {endpoint} on {dev}, "
              f"{epochs} epochs of batch {BATCH} (the last partial batch dropped), Adam "
              f"lr={LR}, {'requests one by one' if args.one_by_one else 'the step replayed'}")
        step = None
        for epoch in range(1, epochs + 1):
            order = rng.permutation(n)
            losses = []
            for i in range(0, n - BATCH + 1, BATCH):
                idx = order[i:i + BATCH]
                if step is not None:
                    step.replay(x_train[idx], y_train[idx])
                    continue
                xb = s.tensor(x_train[idx], device=dev)
                yb = s.tensor(y_train[idx], device=dev)
                if args.one_by_one:
                    losses.append(train_step(xb, yb))
                    continue
                with s.capture(xb, yb) as step:  # runs the first step as it records it
                    loss = train_step(xb, yb)
            # Only losses come back, once per epoch: a replayed step's loss tensor holds
            # the latest replay's, so the epoch's last batch is reported then.
            mean_loss = float(np.mean([l.item() for l in losses] if losses else loss.item()))
            width = 30
            done = int(width * epoch / epochs)
            print(f"  epoch {epoch:2d}/{epochs} [{'#' * done}{'.' * (width - done)}] "
                  f"loss {mean_loss:.4f}", flush=True)

        with s.no_grad():
            logits = forward(s.tensor(x_test, device=dev)).numpy()
        accuracy = float((logits.argmax(axis=1) == y_test).mean())
    elapsed = time.monotonic() - start
    print(f"test accuracy {accuracy * 100:.2f}% on {len(y_test)} held-out digits "
          f"({elapsed:.1f} s)")
    if accuracy < 0.95:
        print("train_digits: accuracy below 95%", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
