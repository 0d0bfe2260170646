#!/usr/bin/env python3
"""allreduce.py -- all-reduce of float32 tensors of 1, 16 and 256 MiB across 2 and 3
tensordd daemons of this host (their process group on Gloo), against Gloo called directly
by 2 and 3 processes through the daemon's own shim (gloo_direct), in the same run.

    make bench-allreduce        (= bench/allreduce.py BUILD [--iters N] [--mib 1,16,256])

The daemon figure is the time from releasing every rank's AllReduce request (one thread
per session, started together) until the last reply: what a data-parallel step waits
for, round trips included. The direct figure is Gloo's allreduce call on one rank.
Medians of --iters (after one warm-up); "bus GB/s" is 2(n-1)/n * bytes / time, the
bytes each rank sends and receives in a ring all-reduce, as nccl-tests reports it.
"""
import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))


def start_daemons(build, n, store):
    procs, eps = [], []
    for _ in range(n):
        p = subprocess.Popen([os.path.join(build, "tensordd"), "--listen", "tcp://127.0.0.1:0",
                              "--log-level", "warn", "--group-store-dir", store],
                             stdout=subprocess.PIPE, text=True)
        line = p.stdout.readline()
        if not line.startswith("listening on "):
            raise SystemExit(f"daemon did not start: {line!r}")
        procs.append(p)
        eps.append(line.split()[2])
    return procs, eps


def daemon_times(build, n, sizes, iters):
    import tensordd
    from tensordd import parallel

    out = {}
    with tempfile.TemporaryDirectory(prefix="tdd-bench-groups-") as store:
        procs, eps = start_daemons(build, n, store)
        try:
            ss = parallel.connect_many(eps, timeout=600)
            pg = parallel.init_process_group(ss)
            for mib in sizes:
                numel = mib * (1 << 20) // 4
                ts = [s.tensor(np.full(numel, r + 1.0, np.float32)) for r, s in enumerate(ss)]
                for s in ss:
                    s.sync()
                times = []
                for it in range(iters + 1):
                    go = threading.Barrier(n + 1)
                    def rank(r):
                        go.wait()
                        pg.groups[r].all_reduce(ts[r])
                    th = [threading.Thread(target=rank, args=(r,)) for r in range(n)]
                    for t in th:
                        t.start()
                    go.wait()
                    t0 = time.perf_counter()
                    for t in th:
                        t.join()
                    if it:
                        times.append(time.perf_counter() - t0)
                # every element is now sum(r + 1) * n^iters... checked on a few elements
                want = float(n * (n + 1) // 2) * float(n) ** iters
                got = ts[0][:4].numpy()
                assert np.allclose(got, want, rtol=1e-5), (got, want)
                out[mib] = float(np.median(times))
                del ts
            for s in ss:
                s.close()
        finally:
            for p in procs:
                p.terminate()
                p.wait(30)
    return out


def direct_times(build, n, sizes, iters):
    r = subprocess.run([os.path.join(build, "gloo", "gloo_direct"), str(n), str(iters),
                        *map(str, sizes)], capture_output=True, text=True, timeout=600)
    if r.returncode:
        raise SystemExit(f"gloo_direct failed:\n{r.stderr}")
    out = {}
    for line in r.stdout.splitlines():  # gloo-direct world W MiB M: median S s ...
        w = line.split()
        out[int(w[4].rstrip(":"))] = float(w[6])
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--mib", default="1,16,256")
    args = ap.parse_args()
    sizes = [int(x) for x in args.mib.split(",")]
    print(f"machine: {os.cpu_count()} cores, "
          f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB; "
          f"all ranks on this host, loopback TCP; medians of {args.iters}")
    print("| ranks | MiB | tensordd daemons (s) | bus GB/s | Gloo direct (s) | bus GB/s | daemons / direct |")
    print("|---|---|---|---|---|---|---|")
    for n in (2, 3):
        d = daemon_times(args.build, n, sizes, args.iters)
        g = direct_times(args.build, n, sizes, args.iters)
        for mib in sizes:
            bus = lambda t: 2 * (n - 1) / n * mib * 2**20 / t / 1e9  # noqa: E731
            print(f"| {n} | {mib} | {d[mib]:.4f} | {bus(d[mib]):.2f} | {g[mib]:.4f} | "
                  f"{bus(g[mib]):.2f} | {d[mib] / g[mib]:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
