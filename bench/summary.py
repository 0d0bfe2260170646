#!/usr/bin/env python3
"""summary.py -- the table of issue 11's targets at the end of `make bench`, built from the
RESULT lines the benchmarks just printed.

    bash bench/run.sh | /usr/bin/python3 bench/summary.py        (or: summary.py FILE...)

Each benchmark prints, next to its human-readable rows, one machine-readable line per
figure:

    RESULT <name> <value> <target>

name is [a-z0-9_.]+, value a number (nan when the bench could not compute it), target
`<=X`, `>=X` or `-` (a figure with no target: a baseline or a peer ratio). A row printed
more than once (bench/run.sh --runs N) is summarised by its median. A line

    SKIP <name or prefix.*> <reason...>

says why rows were not measured (torch missing). EXPECTED below is the list of rows issue
11 asks for, then the torch device's; the table shows each with its value, target and
verdict (met, missed), and MISSING for one no benchmark printed. Exit status: 0 when every
expected row was printed or skipped, 1 when one is missing, 2 when a line is malformed or a
row's target changes between lines.
"""
from __future__ import annotations

import math
import re
import statistics
import sys
from dataclasses import dataclass, field

# name, label: issue 11's table, its PyTorch RPC comparisons and its targets, in its order.
EXPECTED = [
    ("train.mlp_adam.local", "MLP 64-128-10 Adam step: tensordd / local PyTorch"),
    ("train.mlp_adam.rpc", "MLP 64-128-10 Adam step: PyTorch RPC / tensordd"),
    ("train.mlp_adam.replay", "MLP 64-128-10 Adam step, graph replay / local PyTorch"),
    ("train.mlp_sgd.local", "MLP 64-128-10 SGD step: tensordd / local PyTorch"),
    ("train.mlp_sgd.rpc", "MLP 64-128-10 SGD step: PyTorch RPC / tensordd"),
    ("train.big_mlp.local", "MLP 784-1024-1024-10 SGD step: tensordd / local PyTorch"),
    ("train.big_mlp.rpc", "MLP 784-1024-1024-10 SGD step: PyTorch RPC / tensordd"),
    ("train.conv.local", "conv net 8x1x28x28 SGD step: tensordd / local PyTorch"),
    ("train.conv.rpc", "conv net 8x1x28x28 SGD step: PyTorch RPC / tensordd"),
    ("py.relu_numpy", "relu(4) + .numpy() p50 / raw Python ping-pong p50"),
    ("py.pipelined", "pipelined relu(4) from Python, ops/s"),
    ("c.pipelined_200k", "pipelined relu(4) from C, 200k live handles, ops/s"),
    ("sgemm.1024", "sgemm 1024^2 through the daemon / local OpenBLAS (time)"),
    ("fairness.alone_p99_ms", "relu(4) round trip p99 alone, ms"),
    ("fairness.p50_ms", "relu(4) round trip p50 while 2048^2 matmuls loop, ms"),
    ("fairness.p99_ms", "relu(4) round trip p99 while 2048^2 matmuls loop, ms"),
    ("rpc.tiny", "relu(4) round trip p50: PyTorch RPC / tensordd"),
    ("rpc.pipelined", "pipelined relu(4) ops/s: tensordd / PyTorch RPC"),
    ("rpc.upload64", "64 MiB upload: PyTorch RPC time / tensordd time"),
    ("rpc.download64", "64 MiB download: PyTorch RPC time / tensordd time"),
    ("alloc.faults.mlp_adam", "daemon page faults per MLP Adam step after warm-up"),
    ("alloc.faults.mlp_sgd", "daemon page faults per MLP SGD step after warm-up"),
    ("alloc.faults.big_mlp", "daemon page faults per big MLP step after warm-up"),
    ("alloc.faults.conv", "daemon page faults per conv net step after warm-up"),
    ("alloc.faults.replay", "daemon page faults per replayed MLP Adam step after warm-up"),
    ("alloc.upload4", "1 MiB uploads on 4 connections: tensordd / raw TCP (throughput)"),
    ("memfd.upload", "1 GiB upload: memfd (data in a sealed memfd) / TCP, speed"),
    ("memfd.download", "1 GiB download: memfd (mapped, every page read) / TCP, speed"),
    # the torch device (bench/torch_device.py, bench/torch_models.py)
    ("torch.client_us_per_op", "torch device: client CPU per aten op, MLP step, us"),
    ("torch.resnet18.ops_per_step", "torch device: aten ops per ResNet-18 step"),
    ("torch.resnet18.client_us_per_op", "torch device: client CPU per aten op, ResNet-18 step, us"),
    ("torch.resnet18.eager", "ResNet-18 SGD step, torch device eager / local PyTorch"),
    ("torch.resnet18.captured", "ResNet-18 SGD step, torch device captured / local PyTorch"),
    ("torch.transformer.ops_per_step", "torch device: aten ops per transformer step"),
    ("torch.transformer.client_us_per_op",
     "torch device: client CPU per aten op, transformer step, us"),
    ("torch.transformer.eager", "Transformer AdamW step, torch device eager / local PyTorch"),
    ("torch.transformer.captured", "Transformer AdamW step, torch device captured / local"),
]

NAME = re.compile(r"[a-z0-9_.]+\Z")
TARGET = re.compile(r"(<=|>=)(-?[0-9.]+(?:e[+-]?[0-9]+)?)\Z")


@dataclass
class Row:
    target: str
    values: list = field(default_factory=list)

    @property
    def value(self) -> float:
        return statistics.median(self.values)

    def verdict(self) -> str:
        if self.target == "-":
            return "(no target)"
        op, bound = TARGET.match(self.target).groups()
        v = self.value
        if math.isnan(v):
            return "missed (nan)"
        ok = v <= float(bound) if op == "<=" else v >= float(bound)
        return "met" if ok else "missed"


def parse(lines):
    """(rows: name -> Row, skips: [(pattern, reason)], errors: [str]) from output lines."""
    rows, skips, errors = {}, [], []
    for n, line in enumerate(lines, 1):
        words = line.split()
        if not words or words[0] not in ("RESULT", "SKIP"):
            continue
        if words[0] == "SKIP":
            if len(words) < 3:
                errors.append(f"line {n}: SKIP needs a name and a reason: {line.strip()}")
            else:
                skips.append((words[1], " ".join(words[2:])))
            continue
        if len(words) != 4 or not NAME.match(words[1]) or not (
                words[3] == "-" or TARGET.match(words[3])):
            errors.append(f"line {n}: not RESULT <name> <value> <target>: {line.strip()}")
            continue
        try:
            value = float(words[2])
        except ValueError:
            errors.append(f"line {n}: value is not a number: {line.strip()}")
            continue
        row = rows.setdefault(words[1], Row(words[3]))
        if row.target != words[3]:
            errors.append(f"line {n}: {words[1]}'s target {words[3]} differs from {row.target}")
            continue
        row.values.append(value)
    return rows, skips, errors


def skipped(name, skips):
    for pattern, reason in skips:
        if name == pattern or (pattern.endswith("*") and name.startswith(pattern[:-1])):
            return reason
    return None


def fmt(v: float) -> str:
    if math.isnan(v):
        return "nan"
    return f"{v:.0f}" if abs(v) >= 1000 else f"{v:.3g}"


def summarise(lines, out=sys.stdout) -> int:
    rows, skips, errors = parse(lines)
    runs = max((len(r.values) for r in rows.values()), default=0)
    print(f"summary: issue 11's rows (median of {runs} run{'s' * (runs != 1)} where a row repeats)",
          file=out)
    print(f"  {'row':64} {'value':>9} {'target':>9}  verdict", file=out)
    missing, counts = [], {"met": 0, "missed": 0}
    known = {name for name, _ in EXPECTED}
    for name, label in EXPECTED + [(n, n) for n in sorted(rows) if n not in known]:
        row = rows.get(name)
        if row is None:
            why = skipped(name, skips)
            verdict = f"skipped: {why}" if why else "MISSING"
            if not why:
                missing.append(name)
            print(f"  {label:64} {'-':>9} {'':>9}  {verdict}", file=out)
            continue
        verdict = row.verdict()
        counts[verdict.split()[0]] = counts.get(verdict.split()[0], 0) + 1
        k = len(row.values)
        n = f" ({k} run{'s' * (k != 1)})" if k != runs else ""
        print(f"  {label:64} {fmt(row.value):>9} {row.target:>9}  {verdict}{n}", file=out)
    print(f"targets met {counts['met']}, missed {counts['missed']}; rows missing {len(missing)}"
          + (": " + ", ".join(missing) if missing else ""), file=out)
    for e in errors:
        print(f"summary: {e}", file=out)
    return 2 if errors else 1 if missing else 0


def main(argv) -> int:
    if len(argv) > 1:
        lines = []
        for path in argv[1:]:
            with open(path, encoding="utf-8", errors="replace") as f:
                lines += f.readlines()
    else:
        lines = sys.stdin.readlines()
    return summarise(lines)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
