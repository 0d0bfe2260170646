#!/usr/bin/env python3
"""step_costs.py -- the per-step and per-request costs of the small training steps, for A/B runs.

    PYTHONPATH=client/python:build/python /usr/bin/python3 bench/step_costs.py ENDPOINT DAEMON_PID

One line: for bench/peers.py's 64-128-10 MLP with SGD and with Adam, and its conv net
(the same model code, tensordd.nn/optim against torch.nn/optim with one thread), the
wall time per step (median of 7 blocks) against local PyTorch's in the same run, and
the CPU per step of the client (time.process_time) and of the daemon (every thread's
/proc/PID/task/*/schedstat); then relu(4) + .numpy()'s p50 against a raw Python
socket ping-pong's (bench/pingpong.py). CPU time moves less than the wall clock when
other work shares the cores, so both are printed. Which client and daemon run is the
caller's choice (PYTHONPATH, ENDPOINT): run before and after alternately, TAG=... in
the environment labels the line.
"""
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from localblas import set_threads  # noqa: E402
from peers import local_step, tdd_step  # noqa: E402
from pingpong import echo_ping  # noqa: E402

import tensordd as td  # noqa: E402


def daemon_cpu_ns(pid):
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except OSError:  # a thread that ended meanwhile
            pass
    return total


def per_step(step, pid, steps, nblocks=7):
    """(wall us, client CPU us, daemon CPU us) per step, medians over nblocks blocks."""
    for _ in range(10):
        step()
    wall, client, daemon = [], [], []
    for _ in range(nblocks):
        d0 = daemon_cpu_ns(pid) if pid else 0
        c0, t0 = time.process_time(), time.perf_counter()
        for _ in range(steps):
            step()
        wall.append((time.perf_counter() - t0) / steps * 1e6)
        client.append((time.process_time() - c0) / steps * 1e6)
        daemon.append((daemon_cpu_ns(pid) - d0) / steps / 1e3 if pid else 0.0)
    return statistics.median(wall), statistics.median(client), statistics.median(daemon)


def p50(fn, reps=2000):
    for _ in range(100):
        fn()
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return statistics.median(out) * 1e6


def main():
    endpoint, pid = sys.argv[1], int(sys.argv[2])
    set_threads(1)  # its OpenBLAS too (localblas.py)
    td.connect(endpoint, timeout=600)
    cases = [("sgd", "mlp", (64, 64), "SGD", 1e-2, 100), ("adam", "mlp", (64, 64), "Adam", 1e-3, 100),
             ("conv", "conv", (8, 1, 28, 28), "SGD", 1e-2, 20)]
    parts = []
    for name, kind, shape, opt, lr, steps in cases:
        local = per_step(local_step(kind, shape, opt, lr), None, steps)
        wall, client, daemon = per_step(tdd_step(td, kind, shape, opt, lr), pid, steps)
        parts.append(f"{name} {wall:.0f}/{local[0]:.0f} us = {wall / local[0]:.2f}x "
                     f"(CPU {client:.0f}+{daemon:.0f} = {(client + daemon) / local[1]:.2f}x "
                     f"local {local[1]:.0f})")
    x4 = td.tensor([-1.0, 2.0, -3.0, 4.0])
    with echo_ping(64) as ping:
        pp = p50(ping)
        rt = p50(lambda: x4.relu().numpy())
    parts.append(f"relu {rt:.1f}/{pp:.1f} us = {rt / pp:.2f}x")
    print(f"{os.environ.get('TAG', 'step_costs')}: " + "; ".join(parts), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
