#!/usr/bin/env python3
"""train_digits_dp.py -- the digits MLP of train_digits.py trained data-parallel across
several daemons: each daemon holds a replica, runs forward and backward on its shard of
every batch, the daemons average the gradients among themselves (an all-reduce on Gloo,
no gradient crosses this client), and each replica takes the same Adam step.

    PYTHONPATH=client/python /usr/bin/python3 examples/train_digits_dp.py ENDPOINT ENDPOINT...
        [--epochs N]

The daemons' addresses for each other travel through this script (GroupCreate with
exchange, then GroupConnect); each daemon listens for its peers on --group-address
(default 127.0.0.1, so on one host nothing else is needed):

    build/tensordd --listen tcp://127.0.0.1:7071 &
    build/tensordd --listen tcp://127.0.0.1:7072 &
    examples/train_digits_dp.py tcp://127.0.0.1:7071 tcp://127.0.0.1:7072

Across hosts, start each with --group-address set to an address the others reach.

The global batch (96) is split into equal shards, one per daemon.
"""
import argparse
import sys
import time

import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import tensordd
from tensordd import parallel

HIDDEN = 128
EPOCHS = 20
BATCH = 96
LR = 3e-3


def init_params(fan_in=64, hidden=HIDDEN, out=10, seed=0):
    """PyTorch's nn.Linear initialisation, as numpy arrays [w1, b1, w2, b2]."""
    rng = np.random.default_rng(seed)
    params = []
    for a, b in ((fan_in, hidden), (hidden, out)):
        bound = 1.0 / np.sqrt(a)
        params.append(rng.uniform(-bound, bound, size=(a, b)).astype(np.float32))
        params.append(rng.uniform(-bound, bound, size=(b,)).astype(np.float32))
    return params


def forward(params, x):
    w1, b1, w2, b2 = params
    return (x @ w1 + b1).relu() @ w2 + b2


def loss_fn(session, params, xb, yb):
    return session.op("cross_entropy", forward(params, xb), yb)


def main():
    ap = argparse.ArgumentParser(description="data-parallel digits MLP across daemons")
    ap.add_argument("endpoints", nargs="+")
    ap.add_argument("--epochs", type=int, default=EPOCHS)
    args = ap.parse_args()
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=0.2, random_state=0, stratify=y)
    n_ranks = len(args.endpoints)
    if BATCH % n_ranks:
        print(f"train_digits_dp: a batch of {BATCH} does not split into {n_ranks} shards",
              file=sys.stderr)
        return 2
    init = init_params()
    start = time.monotonic()
    sessions = parallel.connect_many(args.endpoints, timeout=120)
    try:
        pg = parallel.init_process_group(sessions)
        dp = parallel.DataParallel(
            pg, build=lambda s, dev: [s.tensor(a, device=dev, requires_grad=True) for a in init],
            loss_fn=loss_fn, make_optimizer=lambda ps: tensordd.optim.Adam(ps, lr=LR))
        print(f"training a 64-{HIDDEN}-10 MLP data-parallel on {n_ranks} daemons "
              f"({', '.join(args.endpoints)}), group {pg.name}: batch {BATCH} as {n_ranks} "
              f"shards of {BATCH // n_ranks}, Adam lr={LR}, {args.epochs} epochs")
        rng = np.random.default_rng(0)
        n = len(x_train)
        for epoch in range(1, args.epochs + 1):
            order = rng.permutation(n)
            losses = [dp.step(x_train[order[i:i + BATCH]], y_train[order[i:i + BATCH]])
                      for i in range(0, n - BATCH + 1, BATCH)]
            print(f"  epoch {epoch:2d}/{args.epochs} loss {np.mean(losses):.4f}", flush=True)
        # The replicas stayed equal: every one took the same averaged step.
        p0 = dp.parameters(0)
        spread = max(float(np.abs(a - b).max()) for r in range(1, n_ranks)
                     for a, b in zip(p0, dp.parameters(r)))
        s0 = sessions[0]
        with s0.no_grad():
            logits = forward(dp.params[0], s0.tensor(x_test)).numpy()
        accuracy = float((logits.argmax(axis=1) == y_test).mean())
    finally:
        for s in sessions:
            s.close(raise_errors=False)
    print(f"test accuracy {accuracy * 100:.2f}% on {len(y_test)} held-out digits; largest "
          f"difference between replicas {spread:.3g} ({time.monotonic() - start:.1f} s)")
    if accuracy < 0.95 or spread > 0:
        print("train_digits_dp: accuracy below 95%, or the replicas drifted apart",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
