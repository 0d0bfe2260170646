#!/usr/bin/env python3
"""torch_device.py -- the tensordd torch device's client cost per aten op.

    PYTHONPATH=client/python:build/python /usr/bin/python3 bench/torch_device.py ENDPOINT \
        [ROUNDS] [--quick]

What a PyTorch program pays in this process for each aten op that reaches the device
(tensordd.torch's dispatch: torch's meta kernel, the mapping, the daemon requests'
encoding), measured as this process's CPU time (time.process_time: the daemon's work,
and waiting for it, are not in it) divided by the ops dispatched. Rows:

- ``add``: ``a + b`` of two [64] float32 tensors (20000 ops, results dropped);
- ``mul_``: ``p.mul_(0.9)`` in place (20000);
- ``linear``: ``F.linear(x, w, b)`` forward, [8, 32] x [16, 32] (its addmm and t: 5000 calls);
- ``mlp step``: a 2-layer MLP's forward, backward and SGD-momentum step (200 steps; every
  aten op of the step counted, torch's autograd engine included in the time).

The daemon syncs once per row, outside the timing of the ops. Each round measures the
rows in turn; the medians of the rounds are printed with every round's figure. The
target is 15 us per op; the ``mlp step`` row is bench/summary.py's
``RESULT torch.client_us_per_op``. --quick: a tenth of the ops (rows printed only).
"""
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import tensordd.torch as tt
from tensordd.torch import _ops


def _counting():
    calls = [0]
    real = _ops.dispatch

    def counted(func, args, kwargs):
        calls[0] += 1
        return real(func, args, kwargs)

    return calls, counted, real


def row(dev, name, fn, n):
    calls, counted, real = _counting()
    tt.synchronize(dev)
    _ops.dispatch = counted
    try:
        t0 = time.process_time()
        fn(n)
        cpu = time.process_time() - t0
    finally:
        _ops.dispatch = real
    tt.synchronize(dev)
    return cpu / max(calls[0], 1) * 1e6, calls[0]


def main() -> int:
    argv = [a for a in sys.argv[1:] if a != "--quick"]
    scale = 10 if "--quick" in sys.argv else 1
    endpoint = argv[0]
    rounds = int(argv[1]) if len(argv) > 1 else 3
    dev = tt.device(endpoint, "cpu:0")
    torch.manual_seed(0)
    a, b = torch.randn(64).to(dev), torch.randn(64).to(dev)
    p = torch.randn(64).to(dev)
    x, w, bias = torch.randn(8, 32).to(dev), torch.randn(16, 32).to(dev), torch.randn(16).to(dev)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    xs, ys = torch.randn(16, 32).to(dev), torch.randint(0, 10, (16,)).to(dev)

    def adds(n):
        for _ in range(n):
            a + b

    def muls(n):
        with torch.no_grad():
            for _ in range(n):
                p.mul_(0.9)

    def linears(n):
        for _ in range(n):
            F.linear(x, w, bias)

    def steps(n):
        for _ in range(n):
            opt.zero_grad()
            F.cross_entropy(model(xs), ys).backward()
            opt.step()

    rows = (("add", adds, 20000 // scale), ("mul_", muls, 20000 // scale),
            ("linear", linears, 5000 // scale), ("mlp step", steps, 200 // scale))
    figures = {name: [] for name, _, _ in rows}
    counts = {}
    for _ in range(rounds):
        for name, fn, n in rows:
            us, ops = row(dev, name, fn, n)
            figures[name].append(us)
            counts[name] = ops
    print(f"torch device client cost per aten op (process CPU time / ops dispatched), "
          f"{rounds} rounds; target 15 us")
    for name, _, n in rows:
        vals = figures[name]
        print(f"  {name:9s} {statistics.median(vals):7.1f} us/op  ({counts[name]} ops per "
              f"round; rounds: {', '.join(f'{v:.1f}' for v in vals)})")
    print(f"RESULT torch.client_us_per_op {statistics.median(figures['mlp step']):.3f} <=15")
    return 0


if __name__ == "__main__":
    sys.exit(main())
