#!/usr/bin/env python3
"""torch_models.py -- ResNet-18 and a TransformerEncoder language model, one training step on
the tensordd torch device (eager and captured) divided by the same step in local PyTorch.

    PYTHONPATH=client/python:build/python /usr/bin/python3 bench/torch_models.py ENDPOINT \
        [--threads N] [--turns N] [--models resnet18,transformer] [--device cpu:0] [--quick]

The models and steps are examples/torch's: torchvision's resnet18(num_classes=10) on 8
random 3x64x64 images with SGD (momentum 0.9), and the embedding + 2-layer
nn.TransformerEncoder (dim 32, 4 heads, dropout 0) + linear head on 4 sequences of 12 tokens
with AdamW (weight decay 0.01; ``capturable=True`` for the captured row: the step count on the
device). Every step reads nothing back (no .item()); each block of
steps ends with one synchronisation (tensordd.torch.synchronize). Rows per model:

- ``local``: plain PyTorch on this process's CPU, torch's intra-op threads and its OpenBLAS's
  both set to --threads (bench/localblas.py), the daemon's --threads (bench/run.sh starts it);
- ``eager``: the step on the device op by op (``x.to(dev)``, forward, backward, ``opt.step()``);
- ``captured``: the step captured once (``tensordd.torch.graph``), then per step
  ``static_x.copy_(x); static_y.copy_(y); g.replay()``.

The three rows alternate within each of --turns turns (default 3); each turn's device rows
are divided by that turn's local row, and min / median / max of those ratios are printed.
Also printed: the aten ops one eager step dispatches to the device and the client's CPU time
per aten op in an eager step (time.process_time of this process / ops: torch's autograd and
the optimizer's Python included, the daemon's work not). RESULT lines for bench/summary.py:

    RESULT torch.<model>.ops_per_step <n> -
    RESULT torch.<model>.client_us_per_op <us> <=15
    RESULT torch.<model>.eager <median ratio> <=1.2
    RESULT torch.<model>.captured <median ratio> <=1.0

A capture the device refuses prints its reason and ``nan`` for the captured row.
"""
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from localblas import blas_threads, set_threads  # noqa: E402

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import tensordd.torch as tt  # noqa: E402
from tensordd.torch import _ops  # noqa: E402

VOCAB, DIM, HEADS, LAYERS, SEQ, BATCH = 50, 32, 4, 2, 12, 4


class LM(nn.Module):
    """examples/torch/transformer_lm.py's model."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        layer = nn.TransformerEncoderLayer(DIM, HEADS, dim_feedforward=64, dropout=0.0,
                                           batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, LAYERS)
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, tokens):
        return self.head(self.encoder(self.embed(tokens)))


def resnet18_case(n):
    import torchvision

    def make():
        torch.manual_seed(0)
        return torchvision.models.resnet18(num_classes=10)

    def opt(m, capturable):
        return torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)

    def loss(m, x, y):
        return F.cross_entropy(m(x), y)

    g = torch.Generator().manual_seed(1)
    data = [(torch.randn(8, 3, 64, 64, generator=g), torch.randint(0, 10, (8,), generator=g))
            for _ in range(n)]
    return make, opt, loss, data


def transformer_case(n):
    def make():
        torch.manual_seed(0)
        return LM()

    def opt(m, capturable):
        # capturable (the captured row): the step count on the parameters' device, so that
        # a replay advances it (tensordd.torch runs torch's capturable path on its tensors)
        return torch.optim.AdamW(m.parameters(), lr=1e-3, weight_decay=0.01,
                                 capturable=capturable)

    def loss(m, x, y):
        return F.cross_entropy(m(x).reshape(-1, VOCAB), y.reshape(-1))

    g = torch.Generator().manual_seed(1)
    data = []
    for _ in range(n):
        tokens = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g)
        data.append((tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()))
    return make, opt, loss, data


CASES = {"resnet18": (resnet18_case, "ResNet-18 8x3x64x64 SGD momentum", 3),
         "transformer": (transformer_case, "TransformerEncoder LM 4x12 AdamW", 10)}


def count_ops(fn):
    """(result of fn(), aten ops dispatched to the device, process CPU seconds)."""
    calls = [0]
    real = _ops.dispatch

    def counted(func, args, kwargs):
        calls[0] += 1
        return real(func, args, kwargs)

    _ops.dispatch = counted
    try:
        c0 = time.process_time()
        out = fn()
        cpu = time.process_time() - c0
    finally:
        _ops.dispatch = real
    return out, calls[0], cpu


def bench_model(name, dev, turns, steps, quick):
    case, label, default_steps = CASES[name]
    steps = steps or default_steps
    make, make_opt, loss_of, data = case(steps)

    def one(m, o, x, y):
        o.zero_grad(set_to_none=True)
        loss = loss_of(m, x, y)
        loss.backward()
        o.step()
        return loss

    local, eager, cap = make(), make().to(dev), make().to(dev)
    lopt, eopt, copt = make_opt(local, False), make_opt(eager, False), make_opt(cap, True)
    for m, o, d in ((local, lopt, "cpu"), (eager, eopt, dev), (cap, copt, dev)):
        for x, y in data[:2]:  # warm-up: optimizer state, torch's caches, the views' indices
            one(m, o, x.to(d), y.to(d)).item()

    # ops per step and the client's CPU per op: eager steps, each synchronised after
    nmeas = 1 if quick else 3
    per_op, nops = [], 0
    for x, y in data[:nmeas]:
        xd, yd = x.to(dev), y.to(dev)
        tt.synchronize(dev)
        _, nops, cpu = count_ops(lambda: one(eager, eopt, xd, yd))
        tt.synchronize(dev)
        per_op.append(cpu / max(nops, 1) * 1e6)

    static_x = torch.empty_like(data[0][0], device=dev)
    static_y = torch.empty_like(data[0][1], device=dev)
    static_x.copy_(data[0][0])
    static_y.copy_(data[0][1])
    graph, why = tt.Graph(), None
    copt.zero_grad(set_to_none=True)
    try:
        with tt.graph(graph, device=dev):
            loss = loss_of(cap, static_x, static_y)
            loss.backward()
            copt.step()
        loss.item()
    except RuntimeError as e:
        graph, why = None, str(e)

    def run_local():
        for x, y in data:
            one(local, lopt, x, y)

    def run_eager():
        for x, y in data:
            one(eager, eopt, x.to(dev), y.to(dev))
        tt.synchronize(dev)

    def run_captured():
        for x, y in data:
            static_x.copy_(x)
            static_y.copy_(y)
            graph.replay()
        tt.synchronize(dev)

    rows = [("local", run_local), ("eager", run_eager)]
    if graph is not None:
        rows.append(("captured", run_captured))
    times = {r: [] for r, _ in rows}
    for _ in range(turns):
        for r, fn in rows:
            t0 = time.perf_counter()
            fn()
            times[r].append((time.perf_counter() - t0) / len(data))
    print(f"{label}: {len(data)} steps per block, {turns} alternated turns; ms per step "
          f"min / median / max; ratio to the same turn's local step")
    for r, _ in rows:
        t = [v * 1e3 for v in times[r]]
        line = f"  {r:9s} {min(t):8.2f} {statistics.median(t):8.2f} {max(t):8.2f} ms"
        if r != "local":
            ratio = [a / b for a, b in zip(times[r], times["local"])]
            line += (f"   x local {min(ratio):.2f} / {statistics.median(ratio):.2f} / "
                     f"{max(ratio):.2f}")
        print(line)
    if why is not None:
        print(f"  captured  not measured: {why}")
    print(f"  {nops} aten ops per eager step; client CPU per op "
          f"{min(per_op):.1f} / {statistics.median(per_op):.1f} / {max(per_op):.1f} us")

    def ratio(r):
        if r not in times:
            return float("nan")
        return statistics.median(a / b for a, b in zip(times[r], times["local"]))

    print(f"RESULT torch.{name}.ops_per_step {nops} -")
    print(f"RESULT torch.{name}.client_us_per_op {statistics.median(per_op):.3f} <=15")
    print(f"RESULT torch.{name}.eager {ratio('eager'):.4f} <=1.2")
    print(f"RESULT torch.{name}.captured {ratio('captured'):.4f} <=1.0")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("endpoint")
    ap.add_argument("--threads", type=int, default=1,
                    help="local PyTorch's threads and its OpenBLAS's: the daemon's --threads")
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--steps", type=int, default=0, help="steps per block (0: per model)")
    ap.add_argument("--models", default="resnet18,transformer")
    ap.add_argument("--device", default="cpu:0")
    ap.add_argument("--quick", action="store_true", help="1 turn, 2 steps: rows printed only")
    a = ap.parse_args()
    if a.quick:
        a.turns, a.steps = 1, 2
    set_threads(a.threads)
    print(f"local PyTorch: {torch.get_num_threads()} intra-op threads, its OpenBLAS "
          f"{blas_threads()}; load average {os.getloadavg()[0]:.2f}")
    dev = tt.device(a.endpoint, a.device)
    for name in a.models.split(","):
        bench_model(name, dev, a.turns, a.steps, a.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
