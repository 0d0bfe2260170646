"""cuda_stream_trip.py -- a small op's round trip on cuda:0 while another session keeps cuda:0 busy.

Starts the emulated daemon (BUILD-emu/tensordd --emu-gpus 1; no GPU here) and times
relu(4) + download on cuda:0 from one session, alone and while a second process loops
elementwise kernels on a 256x256 tensor on cuda:0. Each session issues on a CUDA stream of
its own; what differs between the configurations is the host side:

  lanes 4   the default: the two sessions' work goes through different lanes, so the
            prober's relu is issued (and, in the emulator, run) beside the hog's kernels
  lanes 1   --device-lanes 1: one worker issues both sessions' work in turn, so the relu
            waits behind whatever the hog has queued

The emulator runs kernels on the issuing host thread, so this measures how far the daemon
keeps one session's issue from waiting on another's; on a GPU the streams would also let
the kernels overlap on the device. Not a GPU timing. --rounds R alternates the
configurations (A B A B ..) and prints medians.

    /usr/bin/python3 bench/cuda_stream_trip.py [EMU_BUILD] [--reps N] [--rounds R]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "client", "python"))
import tensordd  # noqa: E402

HOG = """
import sys, time, numpy as np
sys.path.insert(0, sys.argv[2])
import tensordd
s = tensordd.connect(sys.argv[1], timeout=600)
x = s.tensor(np.ones((256, 256), np.float32), device="cuda:0")
print("ready", flush=True)
while True:
    for _ in range(8):
        x = (x * 1.0001).relu()
    x.sum().item()
"""


def start(build: str, *args: str) -> tuple[subprocess.Popen, str]:
    p = subprocess.Popen([os.path.join(build, "tensordd"), "--listen", "tcp://127.0.0.1:0",
                          "--emu-gpus", "1", *args], stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, text=True)
    for line in p.stdout:
        m = re.match(r"listening on (tcp://\S+)", line)
        if m:
            return p, m.group(1)
    raise SystemExit("the daemon did not start")


def probe(endpoint: str, reps: int) -> list[float]:
    s = tensordd.connect(endpoint, timeout=600)
    x = s.tensor(np.array([-1, 2, -3, 4], np.float32), device="cuda:0")
    x.relu().numpy()
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        x.relu().numpy()
        out.append((time.perf_counter() - t) * 1e6)
    s.close()
    return out


def one(build: str, lanes: int, reps: int) -> tuple[float, float]:
    d, ep = start(build, "--device-lanes", str(lanes))
    hog = subprocess.Popen([sys.executable, "-c", HOG, ep, os.path.join(ROOT, "client",
                                                                        "python")],
                           stdout=subprocess.PIPE, text=True)
    try:
        assert hog.stdout.readline().strip() == "ready"
        time.sleep(0.2)
        rt = sorted(probe(ep, reps))
        return rt[len(rt) // 2], rt[min(len(rt) - 1, int(len(rt) * 0.99))]
    finally:
        hog.kill()
        hog.wait()
        d.terminate()
        d.wait(30)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("build", nargs="?", default="build/emu")
    ap.add_argument("--reps", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    res: dict[int, list[tuple[float, float]]] = {4: [], 1: []}
    for _ in range(a.rounds):
        for lanes in (4, 1):
            res[lanes].append(one(a.build, lanes, a.reps))
    print(f"relu(4) round trip on cuda:0 (emulated) under another session's kernels, "
          f"{a.reps} reps, medians of {a.rounds} rounds; load {os.getloadavg()[0]:.1f}")
    for lanes, rows in res.items():
        p50 = statistics.median(r[0] for r in rows)
        p99 = statistics.median(r[1] for r in rows)
        runs = " ".join(f"{r[0]:.0f}" for r in rows)
        print(f"  lanes {lanes}: p50 {p50:.0f} us, p99 {p99:.0f} us  (p50 per round: {runs})")


if __name__ == "__main__":
    main()
