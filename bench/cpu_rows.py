#!/usr/bin/env python3
"""cpu_rows.py -- CPU time per training step of the GEMM-bound models, as ROW lines for
bench/compare.py (and readable alone).

    PYTHONPATH=client/python:build/python /usr/bin/python3 bench/cpu_rows.py ENDPOINT PID \
        [--models big,conv,mlp] [--scale K]

The models are bench/peers.py's (tensordd.nn/optim against torch.nn/optim, SGD): the MLP
784-1024-1024-10 on a batch of 256, the conv net on 8x1x28x28 and the MLP 64-128-10 on
64x64. Local PyTorch and its OpenBLAS run on one thread (bench/localblas.py); start the
daemon with --threads 1. For each model: the daemon's CPU per step (every thread's
/proc/PID/task/*/schedstat), the client's (time.process_time), local PyTorch's, and the
ratios. CPU time is what a loaded machine moves least (the wall clock moves with every
other process on the cores). One line per figure: `ROW name value`.
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peers  # noqa: E402
from localblas import set_threads  # noqa: E402
from train_step import cpu_ns  # noqa: E402

STEPS = {"big": 10, "conv": 100, "mlp": 200}  # steps per measurement at --scale 1
CASE = {c[1]: c[1:] for c in peers.CASES if c[3] == "SGD"}


def cpu_ms(step, steps, pid=None):
    """(own, pid's) CPU milliseconds per step over steps steps, after a few warm-up ones."""
    for _ in range(3):
        step()
    d0, c0 = cpu_ns(pid) if pid else None, time.process_time()
    for _ in range(steps):
        step()
    d1, c1 = cpu_ns(pid) if pid else None, time.process_time()
    daemon = (d1 - d0) / 1e6 / steps if d0 is not None and d1 is not None else None
    return (c1 - c0) * 1e3 / steps, daemon


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("endpoint")
    ap.add_argument("pid", type=int)
    ap.add_argument("--models", default="big,conv,mlp")
    ap.add_argument("--scale", type=float, default=1.0, help="steps per measurement, scaled")
    a = ap.parse_args()
    set_threads(1)
    import tensordd as td

    td.connect(a.endpoint, timeout=600)
    for kind in a.models.split(","):
        steps = max(1, int(STEPS[kind] * a.scale))
        local, _ = cpu_ms(peers.local_step(*CASE[kind]), steps)
        client, daemon = cpu_ms(peers.tdd_step(td, *CASE[kind]), steps, a.pid)
        print(f"ROW {kind}.local_cpu_ms {local:.4f}")
        print(f"ROW {kind}.client_cpu_ms {client:.4f}")
        if daemon is not None:
            print(f"ROW {kind}.daemon_cpu_ms {daemon:.4f}")
            print(f"ROW {kind}.daemon_over_local {daemon / local:.4f}")
            print(f"ROW {kind}.total_over_local {(daemon + client) / local:.4f}")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
