#!/usr/bin/env python3
"""conv_step.py -- bench/peers.py's conv net (8x1x28x28, conv-relu-pool twice, linear,
cross_entropy, SGD) one training step at a time, over the wire and in local PyTorch,
wall clock and CPU time side by side.

    PYTHONPATH=client/python:build/python /usr/bin/python3 bench/conv_step.py ENDPOINT PID \
        [--steps N] [--blocks N]

PID is the daemon's: its CPU time per step comes from /proc/PID/task/*/schedstat (every
thread), the client's from time.process_time(), local PyTorch's (one intra-op thread) from
time.process_time() too. On a machine shared with other work the wall clock moves with
the load; CPU time per step mostly does not, so the CPU ratio is the one to compare
across runs: (client + daemon CPU) / local PyTorch's CPU.
"""
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peers  # noqa: E402  (the model and the steps, written once)
from localblas import set_threads  # noqa: E402
from train_step import cpu_ns  # noqa: E402

CASE = ("conv", (8, 1, 28, 28), "SGD", 1e-2)


def measure(step, steps, nblocks, pid=None):
    """Medians over nblocks blocks of (wall, own CPU, daemon CPU) seconds per step."""
    for _ in range(10):
        step()
    wall, cpu, dcpu = [], [], []
    for _ in range(nblocks):
        time.sleep(0.05)
        d0 = cpu_ns(pid) if pid else None
        c0, t0 = time.process_time(), time.perf_counter()
        for _ in range(steps):
            step()
        wall.append((time.perf_counter() - t0) / steps)
        cpu.append((time.process_time() - c0) / steps)
        d1 = cpu_ns(pid) if pid else None
        if d0 is not None and d1 is not None:
            dcpu.append((d1 - d0) / 1e9 / steps)
    return (statistics.median(wall), statistics.median(cpu),
            statistics.median(dcpu) if dcpu else None)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("endpoint")
    ap.add_argument("pid", type=int)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--blocks", type=int, default=5)
    a = ap.parse_args()
    set_threads(1)  # its OpenBLAS too (localblas.py), as the daemon's --threads 1
    import tensordd as td

    td.connect(a.endpoint, timeout=600)
    lw, lc, _ = measure(peers.local_step(*CASE), a.steps, a.blocks)
    rw, rc, rd = measure(peers.tdd_step(td, *CASE), a.steps, a.blocks, a.pid)
    print(f"conv net 8x1x28x28 SGD, ms per step (median of {a.blocks} blocks of {a.steps})")
    print(f"  local PyTorch  wall {lw * 1e3:7.3f}  CPU {lc * 1e3:7.3f}")
    line = f"  tensordd       wall {rw * 1e3:7.3f}  client CPU {rc * 1e3:7.3f}"
    if rd is not None:
        line += f"  daemon CPU {rd * 1e3:7.3f}"
    print(line)
    print(f"  wall ratio {rw / lw:.2f}x", end="")
    if rd is not None:
        print(f"   (client + daemon CPU) / local CPU {(rc + rd) / lc:.2f}x")
    else:
        print()


if __name__ == "__main__":
    main()
