#!/usr/bin/env python3
"""trip_rows.py -- a small op's round trip (x.relu().numpy() on 4 floats) from Python, as
ROW lines for bench/compare.py (and readable alone).

    PYTHONPATH=client/python:build/python /usr/bin/python3 bench/trip_rows.py ENDPOINT PID \
        [--trips N] [--sessions S]

S sessions on one connection each (default 1), used in turn, N round trips in all: the
daemon's CPU per round trip (every thread's /proc/PID/task/*/schedstat), the client's,
and the latency's p50 and p99 in us. CPU time is what a loaded machine moves least.
One line per figure: `ROW name value`.
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_step import cpu_ns  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("endpoint")
    ap.add_argument("pid", type=int)
    ap.add_argument("--trips", type=int, default=20000)
    ap.add_argument("--sessions", type=int, default=1)
    a = ap.parse_args()
    import numpy as np
    import tensordd

    ss = [tensordd.connect(a.endpoint, timeout=120) for _ in range(a.sessions)]
    xs = [s.tensor(np.array([-1.0, 2.0, -3.0, 4.0], np.float32)) for s in ss]
    for _ in range(200):
        for x in xs:
            x.relu().numpy()
    lat = []
    d0, c0 = cpu_ns(a.pid), time.process_time()
    for i in range(a.trips):
        x = xs[i % len(xs)]
        t0 = time.perf_counter_ns()
        x.relu().numpy()
        lat.append(time.perf_counter_ns() - t0)
    d1, c1 = cpu_ns(a.pid), time.process_time()
    lat.sort()
    print(f"ROW trip.daemon_cpu_us {(d1 - d0) / 1e3 / a.trips:.3f}")
    print(f"ROW trip.client_cpu_us {(c1 - c0) * 1e6 / a.trips:.3f}")
    print(f"ROW trip.p50_us {lat[len(lat) // 2] / 1e3:.2f}")
    print(f"ROW trip.p99_us {lat[len(lat) * 99 // 100] / 1e3:.2f}")
    for s in ss:
        s.close()


if __name__ == "__main__":
    main()
