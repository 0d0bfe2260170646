#!/usr/bin/env python3
"""summary.py -- the table of issue 11's targets at the end of `make bench`, built from the
RESULT lines the benchmarks just printed.

    bash bench/run.sh | /usr/bin/python3 bench/summary.py        (or: summary.py FILE...)

Each benchmark prints, next to its human-readable rows, one machine-readable line per
figure:

    RESULT <name> <value> <target>

name is [a-z0-9_.]+, value a number (nan when the bench could not compute it), target
`<=X`, `>=X` or `-` (a figure with no target: a baseline or a peer ratio). A row printed
more than once (bench/run.sh --runs N: one line per turn) is summarised by its median, with
its min, max and number of turns; a row whose spread (max - min) is wider than its median's
margin to the target is flagged "unsure": one more run could turn its verdict. A line

    SKIP <name or prefix.*> <reason...>

says why rows were not measured (torch missing). EXPECTED below is the list of rows the
suite must print, then the torch device's; the table shows each with its value, target and verdict (met, missed), and
MISSING for one no benchmark printed. Exit status: 0 when every expected row was printed
or skipped, 1 when one is missing, 2 when a line is malformed or a row's target changes
between lines.

    summary.py --markdown bench/RESULTS.md LOG   also writes the table as markdown, headed by
                                                the run's machine, CPU model, commit, command
                                                and load averages (the lines bench/run.sh
                                                prints: machine:, cpu:, commit:, command:, ==)
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

    def unsure(self) -> str:
        """'' or why the verdict could turn: the spread over the turns is wider than the
        median's distance to the bound."""
        if self.target == "-" or len(self.values) < 2 or any(map(math.isnan, self.values)):
            return ""
        bound = float(TARGET.match(self.target).group(2))
        spread, margin = max(self.values) - min(self.values), abs(self.value - bound)
        return f"unsure: spread {fmt(spread)} > margin {fmt(margin)}" if spread > margin else ""

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


HEAD = f"  {'row':64} {'median':>9} {'target':>9} {'min':>9} {'max':>9} {'turns':>5}  verdict"


def table(lines):
    """(rows of (name, label, Row or None, verdict), missing names, counts, errors)."""
    rows, skips, errors = parse(lines)
    out, missing, counts = [], [], {"met": 0, "missed": 0, "unsure": 0}
    known = {name for name, _ in EXPECTED}
    for name, label in EXPECTED + [(n, n) for n in sorted(rows) if n not in known]:
        row = rows.get(name)
        if row is None:
            why = skipped(name, skips)
            verdict = f"skipped: {why}" if why else "MISSING"
            if not why:
                missing.append(name)
            out.append((name, label, None, verdict))
            continue
        verdict = row.verdict()
        counts[verdict.split()[0]] = counts.get(verdict.split()[0], 0) + 1
        unsure = row.unsure()
        if unsure:
            counts["unsure"] += 1
            verdict += f", {unsure}"
        out.append((name, label, row, verdict))
    return out, missing, counts, errors


def summarise(lines, out=sys.stdout) -> int:
    rows, missing, counts, errors = table(lines)
    runs = max((len(r.values) for _, _, r, _ in rows if r), default=0)
    print(f"summary: issue 11's rows (median, min and max of {runs} turn{'s' * (runs != 1)} "
          "where a row repeats)", file=out)
    print(HEAD, file=out)
    for _, label, row, verdict in rows:
        if row is None:
            print(f"  {label:64} {'-':>9} {'':>9} {'':>9} {'':>9} {'':>5}  {verdict}", file=out)
            continue
        v = row.values
        print(f"  {label:64} {fmt(row.value):>9} {row.target:>9} {fmt(min(v)):>9} "
              f"{fmt(max(v)):>9} {len(v):>5}  {verdict}", file=out)
    print(f"targets met {counts['met']}, missed {counts['missed']}; unsure {counts['unsure']}; "
          f"rows missing {len(missing)}" + (": " + ", ".join(missing) if missing else ""),
          file=out)
    for e in errors:
        print(f"summary: {e}", file=out)
    return 2 if errors else 1 if missing else 0


def context(lines):
    """The run's machine, cpu, commit and command lines and its load averages, from the log."""
    info, loads = {}, []
    for line in lines:
        for key in ("machine", "cpu", "commit", "command"):
            if line.startswith(key + ":") and key not in info:
                info[key] = line.split(":", 1)[1].strip()
        m = re.match(r"== (.*), (\d\d:\d\d:\d\d) UTC, load average ([0-9. ]+)", line)
        if m:
            loads.append((m.group(1).strip(), m.group(2), m.group(3).strip()))
    return info, loads


def markdown(lines, path, date=None):
    """The table as bench/RESULTS.md: generated, replaced by every full make bench."""
    import datetime

    rows, missing, counts, _ = table(lines)
    info, loads = context(lines)
    date = date or datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    md = ["# Benchmark results (generated)", "",
          "Written by `make bench` (bench/run.sh, then bench/summary.py --markdown); do not edit.",
          "Each row: the ratio or figure of every turn (a turn runs every benchmark once, "
          "tensordd and its baseline in the same turn), min / median / max over the turns. "
          "\"unsure\": the spread over the turns is wider than the median's margin to the "
          "target. Older figures and notes: bench/archive/.", "",
          f"- date: {date}"]
    for key in ("machine", "cpu", "commit", "command"):
        md.append(f"- {key}: {info.get(key, '-')}")
    if loads:
        md.append("- load average (1, 5, 15 min) at each turn's start: "
                  + "; ".join(f"{when} {t}: {la}" for when, t, la in loads))
    md += ["", "| row | min | median | max | turns | target | verdict |",
           "|---|---:|---:|---:|---:|---|---|"]
    for name, label, row, verdict in rows:
        if row is None:
            md.append(f"| {label} (`{name}`) | | | | | | {verdict} |")
            continue
        v = row.values
        md.append(f"| {label} (`{name}`) | {fmt(min(v))} | {fmt(row.value)} | {fmt(max(v))} | "
                  f"{len(v)} | {row.target.replace('<', '&lt;')} | {verdict} |")
    md += ["", f"Targets met {counts['met']}, missed {counts['missed']}, unsure "
           f"{counts['unsure']}; rows missing {len(missing)}"
           + (": " + ", ".join(missing) if missing else "") + ".", ""]
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(md))


def main(argv) -> int:
    md = None
    if len(argv) > 2 and argv[1] == "--markdown":
        md, argv = argv[2], argv[:1] + argv[3:]
    if len(argv) > 1:
        lines = []
        for path in argv[1:]:
            with open(path, encoding="utf-8", errors="replace") as f:
                lines += f.readlines()
    else:
        lines = sys.stdin.readlines()
    rc = summarise(lines)
    if md:
        markdown(lines, md)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv))
