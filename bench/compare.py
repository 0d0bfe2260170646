#!/usr/bin/env python3
"""compare.py -- two builds of tensordd on the same benchmark, in alternating turns.

    /usr/bin/python3 bench/compare.py A B [--turns N] [--threads T] [-- DRIVER ARGS...]
    make bench-compare A=/path/to/tree-a B=/path/to/tree-b [COMPARE_ARGS='--turns 7']

A and B are source trees, each built (TREE/build/tensordd, TREE/build/python); a base
commit's tree is `git worktree add /tmp/base COMMIT && make -C /tmp/base -j2`. Every turn
runs both, in the order A B on even turns and B A on odd ones (so that a load that rises
or falls through the run weighs on both alike): a fresh daemon of that tree on a loopback
port (--threads T, default 1), and the driver (default bench/cpu_rows.py of this tree,
with DRIVER ARGS) against it with that tree's Python client. The driver prints
`ROW name value` lines. At the end, for every row: the median of each build's values and
the ratio B/A of each turn's pair, as min / median / max. Which rows to trust: CPU time
per step (cpu_rows.py's) moves far less with the machine's load than the wall clock.
Every daemon binds 127.0.0.1 and is stopped before its turn ends.
"""
import argparse
import os
import queue
import statistics
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
START_TIMEOUT, RUN_TIMEOUT = 30, 900


def start_daemon(tree, threads):
    """(process, endpoint) of tree's daemon on a free loopback port."""
    binary = os.path.join(tree, "build", "tensordd")
    proc = subprocess.Popen([binary, "--listen", "tcp://127.0.0.1:0", "--log-level", "warn",
                             "--threads", str(threads)], stdout=subprocess.PIPE, text=True)
    lines = queue.Queue()

    def pump():
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            line = None
        if line is None:
            stop(proc)
            raise RuntimeError(f"{binary} did not start")
        if line.startswith("listening on "):
            return proc, line.split()[2]


def stop(proc):
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def run_turn(tree, threads, driver):
    """The driver's ROW values against a fresh daemon of tree: {name: value}."""
    proc, endpoint = start_daemon(tree, threads)
    try:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [os.path.join(tree, "client", "python"), os.path.join(tree, "build", "python")])
        out = subprocess.run([sys.executable, driver[0], endpoint, str(proc.pid), *driver[1:]],
                             env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT)
    finally:
        stop(proc)
    if out.returncode:
        raise RuntimeError(f"{driver[0]} against {tree} failed ({out.returncode}):\n"
                           f"{out.stderr[-2000:]}")
    rows = {}
    for line in out.stdout.splitlines():
        f = line.split()
        if len(f) == 3 and f[0] == "ROW":
            rows[f[1]] = float(f[2])
    return rows


def main():
    argv = sys.argv[1:]
    extra = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("a", help="tree A (the baseline)")
    ap.add_argument("b", help="tree B")
    ap.add_argument("--turns", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1, help="the daemons' --threads")
    ap.add_argument("--driver", default=os.path.join(HERE, "cpu_rows.py"),
                    help="the benchmark (prints ROW name value lines)")
    a = ap.parse_args(argv)
    trees = {"A": os.path.abspath(a.a), "B": os.path.abspath(a.b)}
    for t in trees.values():
        if not os.access(os.path.join(t, "build", "tensordd"), os.X_OK):
            ap.error(f"{t}/build/tensordd is not built")
    vals = {"A": [], "B": []}
    print(f"A: {trees['A']}\nB: {trees['B']}\ndriver: {a.driver} {' '.join(extra)}, "
          f"daemons --threads {a.threads}, {a.turns} turns")
    for turn in range(a.turns):
        order = "AB" if turn % 2 == 0 else "BA"
        for x in order:
            vals[x].append(run_turn(trees[x], a.threads, [a.driver, *extra]))
        la = " ".join(f"{k}={v:.4g}" for k, v in vals["A"][-1].items())
        print(f"turn {turn + 1} ({order}), load {os.getloadavg()[0]:.1f}: A {la}", flush=True)
    names = [n for n in vals["A"][0] if all(n in r for r in vals["A"] + vals["B"])]
    print(f"\n{'row':<28} {'A median':>10} {'B median':>10}   B/A per turn: min / median / max")
    for n in names:
        va = [r[n] for r in vals["A"]]
        vb = [r[n] for r in vals["B"]]
        ratios = [y / x for x, y in zip(va, vb) if x]
        rs = (f"{min(ratios):.3f} / {statistics.median(ratios):.3f} / {max(ratios):.3f}"
              if ratios else "-")
        print(f"{n:<28} {statistics.median(va):>10.4f} {statistics.median(vb):>10.4f}   {rs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
