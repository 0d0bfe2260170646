"""fairness.py -- a small op's round trip while another session loops big matmuls.

Starts its own daemons (BUILD/tensordd) with --device-lanes 1 (every session on one
queue per device, the old behaviour) and with the default lanes, and times
relu(4) + download from one session: alone, then while a second process loops
2048x2048 matmuls on the same device. Prints p50/p99 and the ratio to "alone".

    /usr/bin/python3 bench/fairness.py [BUILD] [--reps N] [--size N]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "client", "python"))
import tensordd  # noqa: E402

HOG = """
import sys, tensordd
s = tensordd.connect(sys.argv[1], timeout=600)
x = s.randn(int(sys.argv[2]), int(sys.argv[2]))
print("ready", flush=True)
while True:
    y = x @ x
    s.sync()
"""


def start_daemon(build: str, *args: str):
    p = subprocess.Popen([os.path.join(build, "tensordd"), "--listen", "tcp://127.0.0.1:0",
                          "--log-level", "warn", *args], stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        line = p.stdout.readline()
        m = re.search(r"listening on (\S+)", line)
        if m:
            return p, m.group(1)
    p.kill()
    raise SystemExit("daemon did not start")


def round_trips(ep: str, reps: int) -> np.ndarray:
    s = tensordd.connect(ep, timeout=600)
    x = s.tensor([-1.0, 2.0, -3.0, 4.0])
    for _ in range(20):
        x.relu().numpy()
    t = np.empty(reps)
    for i in range(reps):
        t0 = time.perf_counter_ns()
        x.relu().numpy()
        t[i] = time.perf_counter_ns() - t0
    s.close()
    return t / 1000.0  # us


def measure(build: str, lanes: int, reps: int, size: int):
    d, ep = start_daemon(build, "--device-lanes", str(lanes))
    try:
        alone = round_trips(ep, reps)
        hog = subprocess.Popen([sys.executable, "-c", HOG, ep, str(size)], stdout=subprocess.PIPE,
                               text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(
                                   [sys.path[0], os.environ.get("PYTHONPATH", "")])})
        try:
            hog.stdout.readline()
            time.sleep(0.3)  # its first matmuls are running
            loaded = round_trips(ep, reps)
        finally:
            hog.kill()
            hog.wait()
    finally:
        d.terminate()
        d.wait(timeout=30)
    return alone, loaded


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("build", nargs="?", default="build")
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--size", type=int, default=2048)
    a = ap.parse_args()
    print(f"fairness: relu(4) + download round trip (us), another session looping "
          f"{a.size}x{a.size} matmuls on cpu:0; {a.reps} round trips each")
    print(f"{'lanes':>6} {'alone p50':>10} {'alone p99':>10} {'loaded p50':>11} "
          f"{'loaded p99':>11} {'p99 ratio':>10}")
    for lanes in (1, 4):
        alone, loaded = measure(a.build, lanes, a.reps, a.size)
        p = lambda v, q: float(np.percentile(v, q))  # noqa: E731
        print(f"{lanes:>6} {p(alone, 50):>10.1f} {p(alone, 99):>10.1f} {p(loaded, 50):>11.1f} "
              f"{p(loaded, 99):>11.1f} {p(loaded, 99) / p(alone, 99):>9.1f}x")
        if lanes == 4:  # the default: bench/summary.py's rows (ms)
            print(f"RESULT fairness.alone_p99_ms {p(alone, 99) / 1e3:.4f} -\n"
                  f"RESULT fairness.p50_ms {p(loaded, 50) / 1e3:.4f} -\n"
                  f"RESULT fairness.p99_ms {p(loaded, 99) / 1e3:.4f} <=2")


if __name__ == "__main__":
    main()
