"""scale.py -- how the daemon's cost grows with sessions and handles (make bench-scale).

Starts its own daemon (BUILD/tensordd, --cpu-devices 1) and measures, from outside:

  sessions   for each N of --sessions, N sessions spread over --procs client processes,
             each looping x.relu().numpy() (a round trip) over its sessions in turn for
             --seconds: round trips per second, latency p50/p99/max, trips slower than
             10 ms ("stalls"), and the daemon's CPU time per round trip (/proc/PID/stat);
             with --why-stalls, every stall is set against the time the client's thread
             and the daemon's loop thread spent runnable but not running during it
             (run_delay, /proc/.../schedstat, read around every trip: a few us more per
             trip): "sched" counts the stalls that waiting for a CPU explains (at least
             half the stall), the others are the daemon's or the client's own;
  idle       --idle idle sessions: the daemon's RSS per session while open, and what of it
             is still held once they closed;
  handles    one session holding H live handles (each of --handles): RSS per handle, the
             daemon's CPU per op at that count, and the RSS still held after releasing them.

Prints a markdown table per part with the targets (performance issue, item 3), writes it to
OUT.md and, where matplotlib is installed (python3-matplotlib), a plot to OUT.png.
A benchmark, not a test: on a shared machine its figures move with the load; compare runs
taken on a quiet machine.

    /usr/bin/python3 bench/scale.py [BUILD] [--sessions 1,16,64,256] [--seconds 3]
        [--procs 8] [--idle 256] [--handles 1000,10000,100000] [--out bench/scale]
        [--why-stalls]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from procstat import rss, start_daemon  # noqa: E402

CLK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid):
    """pid's user + system CPU seconds so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK


def _delay(fd):
    """run_delay (ns spent runnable, not running) from an open schedstat file, or 0."""
    try:
        return int(os.pread(fd, 128, 0).split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def _client(build, endpoint, n, seconds, start, out, dpid=0):
    """One client process: n sessions, each with a 4-element tensor; round trips over them
    in turn from `start` (a shared wall-clock instant) for `seconds`; latencies to out,
    and with dpid (the daemon's: its loop thread is its main thread) each stall's
    (latency, the client's run_delay during it, the daemon loop's)."""
    sys.path[:0] = [os.path.join(ROOT, "client", "python"), os.path.join(build, "python")]
    import numpy as np
    import tensordd
    sessions = [tensordd.connect(endpoint, timeout=120) for _ in range(n)]
    xs = [s.tensor(np.array([-1.0, 2.0, -3.0, 4.0], np.float32)) for s in sessions]
    for x in xs:
        x.relu().numpy()
    while time.time() < start:
        time.sleep(0.001)
    lat, why = [], []
    end = start + seconds
    i = 0
    if dpid:
        own = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
        loop = os.open(f"/proc/{dpid}/task/{dpid}/schedstat", os.O_RDONLY)
        o0, l0 = _delay(own), _delay(loop)
    while time.time() < end:
        t0 = time.perf_counter_ns()
        xs[i].relu().numpy()
        dt = time.perf_counter_ns() - t0
        lat.append(dt)
        if dpid:
            o1, l1 = _delay(own), _delay(loop)
            if dt > 10_000_000:
                why.append((dt, o1 - o0, l1 - l0))
            o0, l0 = o1, l1
        i = (i + 1) % n
    for s in sessions:
        s.close()
    out.put((lat, why))


def sessions_part(build, endpoint, pid, ns, procs, seconds, why_stalls=False):
    rows = []
    ctx = mp.get_context("spawn")
    for n in ns:
        p = min(procs, n)
        share = [n // p + (k < n % p) for k in range(p)]
        q = ctx.Queue()
        start = time.time() + 5.0 + n * 0.03  # time to connect every session first (loaded: longer)
        workers = [ctx.Process(target=_client,
                               args=(build, endpoint, k, seconds, start, q,
                                     pid if why_stalls else 0))
                   for k in share]
        for w in workers:
            w.start()
        while time.time() < start:
            time.sleep(0.001)
        c0 = cpu_s(pid)
        time.sleep(seconds)
        c1 = cpu_s(pid)
        lat, why = [], []
        for _ in workers:
            la, wh = q.get(timeout=seconds + 120)
            lat += la
            why += wh
        for w in workers:
            w.join(60)
        lat.sort()
        trips = len(lat)
        rows.append({
            "sessions": n, "procs": p, "trips_s": trips / seconds,
            "p50_us": lat[trips // 2] / 1e3 if trips else float("nan"),
            "p99_us": lat[min(trips - 1, trips * 99 // 100)] / 1e3 if trips else float("nan"),
            "max_ms": lat[-1] / 1e6 if trips else float("nan"),
            "stalls": sum(1 for x in lat if x > 10_000_000),
            # stalls that waiting for a CPU (the client's or the daemon loop's) explains
            "sched": sum(1 for dt, o, lp in why if max(o, lp) >= dt / 2) if why_stalls else "-",
            "cpu_us": (c1 - c0) * 1e6 / trips if trips else float("nan")})
    return rows


def idle_part(build, endpoint, pid, n):
    sys.path[:0] = [os.path.join(ROOT, "client", "python"), os.path.join(build, "python")]
    import tensordd
    time.sleep(0.5)
    r0 = rss(pid)
    ss = [tensordd.connect(endpoint, timeout=60) for _ in range(n)]
    for s in ss:
        s.sync()
    time.sleep(0.5)
    r1 = rss(pid)
    for s in ss:
        s.close()
    time.sleep(1.5)
    r2 = rss(pid)
    return {"idle": n, "kib_per_session": (r1 - r0) / n / 1024,
            "held_after_close_kib": (r2 - r0) / 1024}


def handles_part(build, endpoint, pid, counts):
    sys.path[:0] = [os.path.join(ROOT, "client", "python"), os.path.join(build, "python")]
    import numpy as np
    import tensordd
    rows = []
    for h in counts:
        s = tensordd.connect(endpoint, timeout=600)
        x = s.tensor(np.ones(4, np.float32))
        s.sync()
        time.sleep(0.3)
        r0 = rss(pid)
        keep = [x.relu() for _ in range(h)]
        s.sync()
        r1 = rss(pid)
        ops = 20000
        c0 = cpu_s(pid)
        for _ in range(ops):
            x.relu()  # made and released at once: the op's cost at h live handles
        s.sync()
        c1 = cpu_s(pid)
        del keep
        s.sync()
        time.sleep(0.5)
        r2 = rss(pid)
        s.close()
        rows.append({"handles": h, "bytes_per_handle": (r1 - r0) / h,
                     "cpu_us_per_op": (c1 - c0) * 1e6 / ops,
                     "held_after_release_mb": (r2 - r0) / 1e6})
    return rows


def table(rows, cols):
    head = "| " + " | ".join(c for c, _ in cols) + " |"
    sep = "|" + "---|" * len(cols)
    body = ["| " + " | ".join(f.format(r[c]) if isinstance(f, str) else f(r[c])
                              for c, f in cols) + " |" for r in rows]
    return "\n".join([head, sep] + body)


def verdicts(srows):
    """The targets of item 3 that the sessions part can judge, met or missed."""
    out = []
    peak = max(r["trips_s"] for r in srows)
    for r in srows:
        if r["sessions"] >= 256:
            out.append(f"throughput at {r['sessions']} sessions {r['trips_s'] / peak:.2f}x the "
                       f"peak (target >= 0.9): {'met' if r['trips_s'] >= 0.9 * peak else 'missed'}")
    base = [r for r in srows if r["sessions"] >= 16]
    if len(base) >= 2:
        lo = min(r["cpu_us"] for r in base)
        hi = max(r["cpu_us"] for r in base)
        out.append(f"daemon CPU per round trip from 16 sessions on: {lo:.1f}-{hi:.1f} us "
                   f"(target flat within 20%): {'met' if hi <= 1.2 * lo else 'missed'}")
    for r in srows:
        ratio = r["p99_us"] / r["p50_us"]
        ok = ratio <= 3 and r["max_ms"] <= 10
        out.append(f"{r['sessions']} sessions: p99/p50 {ratio:.1f}, worst {r['max_ms']:.1f} ms "
                   f"(targets <= 3 and <= 10 ms): {'met' if ok else 'missed'}")
    return out


def plot(path, srows):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(1, 2, figsize=(10, 4))
    n = [r["sessions"] for r in srows]
    ax[0].plot(n, [r["trips_s"] for r in srows], "o-")
    ax[0].set_xscale("log", base=2)
    ax[0].set_xlabel("sessions")
    ax[0].set_ylabel("round trips / s")
    ax[1].plot(n, [r["cpu_us"] for r in srows], "o-", label="daemon CPU / trip")
    ax[1].plot(n, [r["p50_us"] for r in srows], "s-", label="p50 latency")
    ax[1].plot(n, [r["p99_us"] for r in srows], "^-", label="p99 latency")
    ax[1].set_xscale("log", base=2)
    ax[1].set_yscale("log")
    ax[1].set_xlabel("sessions")
    ax[1].set_ylabel("us")
    ax[1].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return True


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("build", nargs="?", default=os.path.join(ROOT, "build"))
    ap.add_argument("--sessions", default="1,16,64,256")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--procs", type=int, default=8)
    ap.add_argument("--idle", type=int, default=256)
    ap.add_argument("--handles", default="1000,10000,100000")
    ap.add_argument("--out", default=os.path.join(HERE, "scale"))
    ap.add_argument("--why-stalls", action="store_true",
                    help="set each stall against the run-queue waits of both ends")
    a = ap.parse_args()
    ns = [int(x) for x in a.sessions.split(",") if x]
    if not ns or min(ns) < 1:
        ap.error("--sessions: a comma-separated list of counts >= 1")
    counts = [int(x) for x in a.handles.split(",") if x]
    d, port = start_daemon(a.build, "--cpu-devices", "1", "--max-sessions",
                           str(max(ns + [a.idle]) + 16), "--max-inflight", "65536")
    endpoint = f"tcp://127.0.0.1:{port}"
    try:
        srows = sessions_part(a.build, endpoint, d.pid, ns, a.procs, a.seconds, a.why_stalls)
        idle = idle_part(a.build, endpoint, d.pid, a.idle) if a.idle else None
        hrows = handles_part(a.build, endpoint, d.pid, counts) if counts else []
    finally:
        d.terminate()
        d.wait(30)
    load = os.getloadavg()
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo")
                if ln.startswith("model name")), "?")
    parts = [f"# make bench-scale ({time.strftime('%Y-%m-%d %H:%M')}, {cpu}, "
             f"{os.cpu_count()} CPUs, load {load[0]:.1f} {load[1]:.1f} {load[2]:.1f})", "",
             f"## Sessions ({a.procs} client processes at most, {a.seconds:g} s each)", "",
             table(srows, [("sessions", "{}"), ("procs", "{}"), ("trips_s", "{:.0f}"),
                           ("p50_us", "{:.0f}"), ("p99_us", "{:.0f}"), ("max_ms", "{:.1f}"),
                           ("stalls", "{}"), ("sched", "{}"), ("cpu_us", "{:.1f}")]), ""]
    parts += [f"- {v}" for v in verdicts(srows)] + [""]
    if idle:
        parts += ["## Idle sessions", "",
                  table([idle], [("idle", "{}"), ("kib_per_session", "{:.1f}"),
                                 ("held_after_close_kib", "{:.0f}")]), ""]
    if hrows:
        parts += ["## Live handles in one session", "",
                  table(hrows, [("handles", "{}"), ("bytes_per_handle", "{:.0f}"),
                                ("cpu_us_per_op", "{:.2f}"), ("held_after_release_mb", "{:.1f}")]),
                  ""]
    text = "\n".join(parts)
    print(text)
    with open(a.out + ".md", "w") as f:
        f.write(text)
    if plot(a.out + ".png", srows):
        print(f"plot: {a.out}.png")
    else:
        print("plot: not drawn (python3-matplotlib is not installed; "
              "apt-get install python3-matplotlib)")


if __name__ == "__main__":
    main()
