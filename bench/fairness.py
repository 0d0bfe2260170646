"""fairness.py -- a small op's round trip while another session loops big matmuls.

Starts its own daemons (BUILD/tensordd) and times relu(4) + download from one
session: alone, then while a second process loops 2048x2048 matmuls on the same
device. Configurations (daemon options):

  lanes 4                     the default: sessions spread over 4 lanes, kernels in pieces
  lanes 1, whole kernels      one worker; --chunk-elems 0
  lanes 1, whole, no inline   the same with --inline-work 0: every op goes through the
                              worker, so relu waits for its turn on the lane
  lanes 1, pieces, no inline  --chunk-elems default: relu runs between two pieces of
                              the matmul
  lanes 1, pieces             the default with one lane (a small relu runs on the loop
                              thread when its session has nothing queued)

Prints p50/p99 of the round trip (us) alone and loaded, and the hog's time per
matmul alone and while the prober runs, with the ratio to whole kernels. --rounds R
runs every configuration R times in turn (A B C.. A B C..) and prints the medians.
Then the cost of chunking to the big op: one session's matmul loop on daemons with
whole kernels, default pieces (--chunk-elems 524288) and pieces 8 times smaller
(--chunk-elems 65536, the old default), in turn.

    /usr/bin/python3 bench/fairness.py [BUILD] [--reps N] [--size N] [--rounds R]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import threading
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "client", "python"))
import tensordd  # noqa: E402

HOG = """
import sys, time, tensordd
s = tensordd.connect(sys.argv[1], timeout=600)
x = s.randn(int(sys.argv[2]), int(sys.argv[2]))
s.sync()
print("ready", flush=True)
while True:
    t0 = time.perf_counter()
    y = x @ x
    s.sync()
    print(f"t {(time.perf_counter() - t0) * 1e3:.3f}", flush=True)
"""

CONFIGS = [  # (label, daemon options)
    ("lanes 4", ()),
    ("lanes 1, whole kernels", ("--device-lanes", "1", "--chunk-elems", "0")),
    ("lanes 1, whole, no inline", ("--device-lanes", "1", "--chunk-elems", "0",
                                   "--inline-work", "0")),
    ("lanes 1, pieces, no inline", ("--device-lanes", "1", "--inline-work", "0")),
    ("lanes 1, pieces", ("--device-lanes", "1")),
]


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


class Hog:
    """A process looping size x size matmuls (each followed by a sync) on ep; times[]
    collects each iteration's milliseconds."""

    def __init__(self, ep: str, size: int):
        self.p = subprocess.Popen([sys.executable, "-c", HOG, ep, str(size)],
                                  stdout=subprocess.PIPE, text=True,
                                  env={**os.environ, "PYTHONPATH": os.pathsep.join(
                                      [sys.path[0], os.environ.get("PYTHONPATH", "")])})
        self.p.stdout.readline()  # "ready"
        self.times: list[float] = []
        self.t = threading.Thread(target=self._read, daemon=True)
        self.t.start()

    def _read(self):
        for line in self.p.stdout:
            if line.startswith("t "):
                self.times.append(float(line[2:]))

    def wait_for(self, n: int, timeout: float = 600):
        deadline = time.monotonic() + timeout
        while len(self.times) < n and time.monotonic() < deadline:
            time.sleep(0.01)

    def stop(self):
        self.p.kill()
        self.p.wait()


def measure(build: str, opts, reps: int, size: int, hog_alone: int):
    d, ep = start_daemon(build, *opts)
    try:
        alone = round_trips(ep, reps)
        hog = Hog(ep, size)
        try:
            hog.wait_for(hog_alone + 1)  # the first one warms up
            solo = np.median(hog.times[1:hog_alone + 1])
            n0 = len(hog.times)
            loaded = round_trips(ep, reps)
            shared = hog.times[n0:]
        finally:
            hog.stop()
    finally:
        d.terminate()
        d.wait(timeout=30)
    return alone, loaded, solo, float(np.median(shared)) if shared else float("nan")


THROUGHPUT = [  # (label, daemon options): one session alone, its matmul loop
    ("whole kernels", ("--chunk-elems", "0")),
    ("pieces (default)", ()),
    ("pieces of 65536", ("--chunk-elems", "65536")),
]


def throughput(build: str, size: int, rounds: int, n: int = 6):
    """Time per size x size matmul (+ sync) of one session, per daemon; the daemons run
    side by side and are used in turn (A B C A B C ..), n matmuls per turn."""
    started = [start_daemon(build, "--device-lanes", "1", *opts) for _, opts in THROUGHPUT]
    try:
        sess = [tensordd.connect(ep, timeout=600) for _, ep in started]
        xs = [s.randn(size, size) for s in sess]
        for s, x in zip(sess, xs):
            (x @ x).numpy()  # warm: pools, team threads
        times = [[] for _ in THROUGHPUT]
        for _ in range(rounds):
            for k, (s, x) in enumerate(zip(sess, xs)):
                for _ in range(n):
                    t0 = time.perf_counter()
                    y = x @ x
                    s.sync()
                    times[k].append((time.perf_counter() - t0) * 1e3)
                del y
        for s in sess:
            s.close()
    finally:
        for d, _ in started:
            d.terminate()
            d.wait(timeout=30)
    whole = float(np.median(times[0]))
    print(f"matmul loop alone ({size}x{size}, one session, --device-lanes 1; median of "
          f"{rounds * n} each, turns alternating)")
    for (label, _), t in zip(THROUGHPUT, times):
        m = float(np.median(t))
        print(f"  {label:<18} {m:>9.1f} ms  {m / whole:>5.2f}x whole")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("build", nargs="?", default="build")
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--size", type=int, default=2048)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--hog-alone", type=int, default=5, help="matmuls timed without the prober")
    a = ap.parse_args()
    print(f"fairness: relu(4) + download round trip (us), another session looping "
          f"{a.size}x{a.size} matmuls on cpu:0; {a.reps} round trips each, median of "
          f"{a.rounds} round(s); load {os.getloadavg()[0]:.1f}")
    rows = {label: [] for label, _ in CONFIGS}
    for _ in range(a.rounds):  # every configuration once per round, in turn
        for label, opts in CONFIGS:
            alone, loaded, solo, shared = measure(a.build, opts, a.reps, a.size, a.hog_alone)
            p = lambda v, q: float(np.percentile(v, q))  # noqa: E731
            rows[label].append((p(alone, 50), p(alone, 99), p(loaded, 50), p(loaded, 99), solo,
                                shared))
    print(f"{'configuration':<28} {'alone p50':>9} {'alone p99':>9} {'loaded p50':>10} "
          f"{'loaded p99':>10} {'p99 ratio':>9} {'matmul ms':>9} {'w/ prober':>9} "
          f"{'vs whole':>8}")
    whole = np.median([r[4] for r in rows["lanes 1, whole kernels"]])
    for label, _ in CONFIGS:
        m = np.median(np.array(rows[label]), axis=0)
        print(f"{label:<28} {m[0]:>9.1f} {m[1]:>9.1f} {m[2]:>10.1f} {m[3]:>10.1f} "
              f"{m[3] / m[1]:>8.1f}x {m[4]:>9.1f} {m[5]:>9.1f} {m[4] / whole:>7.2f}x")
    m = np.median(np.array(rows["lanes 4"]), axis=0)  # the default: bench/summary.py's rows, ms
    print(f"RESULT fairness.alone_p99_ms {m[1] / 1e3:.4f} -\nRESULT fairness.p50_ms "
          f"{m[2] / 1e3:.4f} -\nRESULT fairness.p99_ms {m[3] / 1e3:.4f} <=2")
    throughput(a.build, a.size, max(a.rounds, 3))
    print(f"load after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
