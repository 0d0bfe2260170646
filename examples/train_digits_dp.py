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
On Kubernetes (deploy/k8s), the ranks are the DaemonSet's pods, found through the headless
Service: --ranks-from-dns tensordd-ranks.tensordd.svc.cluster.local:7070 --world 3 waits
until the name resolves to 3 pod addresses and trains on them, in address order
(examples/k8s/train-digits-dp-job.yaml runs it as a Job; the token comes from
$TENSORDD_TOKEN_FILE).

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


def ranks_from_dns(name_port, world, wait):
    """tcp://ADDR:PORT for every address name resolves to, sorted (every client that asks
    sees the same rank order); with world, polls until there are that many."""
    import socket
    name, _, port = name_port.rpartition(":")
    deadline = time.monotonic() + wait
    while True:
        try:
            addrs = sorted({ai[4][0] for ai in socket.getaddrinfo(name, int(port),
                                                                 type=socket.SOCK_STREAM)})
        except socket.gaierror:
            addrs = []
        if addrs and (not world or len(addrs) >= world):
            addrs = addrs[:world] if world else addrs
            return [f"tcp://[{a}]:{port}" if ":" in a else f"tcp://{a}:{port}" for a in addrs]
        if time.monotonic() > deadline:
            raise SystemExit(f"train_digits_dp: {name} resolved to {len(addrs)} addresses, "
                             f"not {world or 'any'}, within {wait:.0f} s")
        time.sleep(2)


def main():
    ap = argparse.ArgumentParser(description="data-parallel digits MLP across daemons")
    ap.add_argument("endpoints", nargs="*")
    ap.add_argument("--epochs", type=int, default=EPOCHS)
    ap.add_argument("--ranks-from-dns", metavar="NAME:PORT",
                    help="the ranks: every address NAME resolves to (a headless Service)")
    ap.add_argument("--world", type=int, default=0,
                    help="with --ranks-from-dns: wait (up to --wait s) for this many addresses")
    ap.add_argument("--wait", type=float, default=300.0)
    args = ap.parse_args()
    if args.ranks_from_dns:
        args.endpoints += ranks_from_dns(args.ranks_from_dns, args.world, args.wait)
    if not args.endpoints:
        ap.error("no endpoints (give them, or --ranks-from-dns)")
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
