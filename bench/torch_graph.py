#!/usr/bin/env python3
"""torch_graph.py -- a training step on the tensordd torch device, eager vs captured
(tensordd.torch.graph) vs local PyTorch.

    PYTHONPATH=client/python:build/python /usr/bin/python3 bench/torch_graph.py ENDPOINT \
        [ROUNDS] [STEPS] [WIDTH]

The step: an MLP (256 -> WIDTH -> WIDTH -> 10, WIDTH 512 by default, ReLU, batch 64,
float32) forward,
cross-entropy, backward and an SGD-momentum step, on new data every step. Rows:

- ``local``: plain PyTorch on this process's CPU;
- ``eager``: the step on the device (``cpu:0`` unless $TENSORDD_DEVICE), op by op
  (``x.to(dev)``, forward, backward, ``opt.step()``);
- ``captured``: the step captured once (``with tensordd.torch.graph(g)``), then per
  step ``static_x.copy_(x); static_y.copy_(y); g.replay()``.

Per row: wall time of STEPS steps (default 20) followed by one synchronisation (the
device rows) divided by STEPS; the rows alternate within each of ROUNDS rounds
(default 7) and min / median / max over the rounds are printed, with the requests the
client sent per step (the session's request ids used). A measurement, not a test.
"""
import os
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import tensordd.torch as tt


WIDTH = int(sys.argv[4]) if len(sys.argv) > 4 else 512


def model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(256, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH), nn.ReLU(),
                         nn.Linear(WIDTH, 10))


def step(m, opt, x, y):
    loss = F.cross_entropy(m(x), y)
    loss.backward()
    opt.step()
    return loss


def main() -> int:
    endpoint = sys.argv[1]
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 7
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 20
    dev = tt.device(endpoint, os.environ.get("TENSORDD_DEVICE") or "cpu:0")
    s = tt.session_of(dev)
    g = torch.Generator().manual_seed(1)
    data = [(torch.randn(64, 256, generator=g), torch.randint(0, 10, (64,), generator=g))
            for _ in range(steps)]

    local = model()
    lopt = torch.optim.SGD(local.parameters(), lr=0.01, momentum=0.9)
    eager = model().to(dev)
    eopt = torch.optim.SGD(eager.parameters(), lr=0.01, momentum=0.9)
    cap = model().to(dev)
    copt = torch.optim.SGD(cap.parameters(), lr=0.01, momentum=0.9)
    for m, o, d in ((local, lopt, "cpu"), (eager, eopt, dev), (cap, copt, dev)):
        for x, y in data[:2]:  # warm-up: optimizer state, torch's caches
            o.zero_grad(set_to_none=True)
            step(m, o, x.to(d), y.to(d)).item()
    static_x = torch.empty(64, 256, device=dev)
    static_y = torch.empty(64, dtype=torch.int64, device=dev)
    static_x.copy_(data[0][0])
    static_y.copy_(data[0][1])
    copt.zero_grad(set_to_none=True)
    graph = tt.Graph()
    with tt.graph(graph, device=dev):
        loss = step(cap, copt, static_x, static_y)
    loss.item()

    def run_local():
        for x, y in data:
            lopt.zero_grad(set_to_none=True)
            step(local, lopt, x, y)

    def run_eager():
        for x, y in data:
            eopt.zero_grad(set_to_none=True)
            step(eager, eopt, x.to(dev), y.to(dev))
        tt.synchronize(dev)

    def run_captured():
        for x, y in data:
            static_x.copy_(x)
            static_y.copy_(y)
            graph.replay()
        tt.synchronize(dev)

    rows = (("local PyTorch (CPU)", run_local), ("eager on the device", run_eager),
            ("captured, replayed", run_captured))
    times = {name: [] for name, _ in rows}
    reqs = {}
    for _ in range(rounds):
        for name, fn in rows:
            r0 = s._next_request_id()
            t0 = time.perf_counter()
            fn()
            times[name].append((time.perf_counter() - t0) / steps * 1e3)
            reqs[name] = (s._next_request_id() - r0) / steps
    print(f"MLP 256-{WIDTH}-{WIDTH}-10, batch 64, SGD momentum; {steps} steps per round, {rounds} "
          f"rounds (ms per step)")
    print("| row | min | median | max | requests per step |")
    print("|---|---|---|---|---|")
    for name, _ in rows:
        t = times[name]
        r = "-" if name.startswith("local") else f"{reqs[name]:.1f}"
        print(f"| {name} | {min(t):.2f} | {statistics.median(t):.2f} | {max(t):.2f} | {r} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
