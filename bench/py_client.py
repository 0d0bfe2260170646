#!/usr/bin/env python3
"""py_client.py -- the Python client's per-request cost against a raw Python socket
ping-pong, measured in the same run.

    PYTHONPATH=client/python:build/python /usr/bin/python3 bench/py_client.py ENDPOINT [ROUNDS]

Rows (issue 11 item 5): relu(4) and its values back (``x.relu().numpy()``, p50 of
2000) against a raw Python socket ping-pong of 64 bytes with an echo process (p50 of
2000), and pipelined relu(4) ops (20000, dropped at once, one sync at the end) in
ops/s. Each round measures the three in turn; the medians of the rounds are printed,
with every round's figure. Which client runs is PYTHONPATH's (the accelerator
tensordd._speedups when built; TENSORDD_PURE=1 forces pure Python).
"""
import statistics
import sys
import time

from pingpong import echo_ping

import tensordd


def p50(fn, reps):
    out = []
    clock = time.perf_counter
    for _ in range(reps):
        t0 = clock()
        fn()
        out.append(clock() - t0)
    return statistics.median(out) * 1e6


def main() -> int:
    endpoint = sys.argv[1]
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    with echo_ping(64) as ping:
        s = tensordd.connect(endpoint, timeout=600)  # (as bench/peers.py connects)
        x4 = s.tensor([-1.0, 2.0, -3.0, 4.0])
        raw, rt, pipe = [], [], []
        for _ in range(rounds):
            raw.append(p50(ping, 2000))
            rt.append(p50(lambda: x4.relu().numpy(), 2000))
            n = 20000
            t0 = time.perf_counter()
            for _ in range(n):
                x4.relu()  # dropped at once: its Release is pipelined too
            s.sync()
            pipe.append(n / (time.perf_counter() - t0))
        s.close()
    accel = getattr(sys.modules.get("tensordd._codec"), "ACCELERATED", None)
    print(f"python client ({'accelerated' if accel else 'pure Python'}), "
          f"median of {rounds} rounds")
    print(f"  raw Python ping-pong 64 B  p50 {statistics.median(raw):7.1f} us   "
          f"{[round(v, 1) for v in raw]}")
    print(f"  relu(4) + .numpy()         p50 {statistics.median(rt):7.1f} us   "
          f"{[round(v, 1) for v in rt]}   "
          f"{statistics.median(rt) / statistics.median(raw):.2f}x the ping-pong")
    print(f"  pipelined relu(4)          {statistics.median(pipe):11.0f} ops/s   "
          f"{[round(v) for v in pipe]}")
    print(f"RESULT py.relu_numpy {statistics.median(rt) / statistics.median(raw):.4f} <=1.3\n"
          f"RESULT py.pipelined {statistics.median(pipe):.0f} >=300000")  # bench/summary.py
    return 0


if __name__ == "__main__":
    sys.exit(main())
