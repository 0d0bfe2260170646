"""group_stall.py -- another session's round trip while process-group requests wait for
peers that never come.

Starts two daemons of its own on loopback (BUILD/tensordd, default flags but
--group-timeout and --group-store-dir). On daemon v, one attacker session per
worker lane (session id mod --device-lanes) waits for a rank that never comes:

  connect    GroupCreate with exchange, then a GroupConnect naming the addresses of a
             rank made on daemon h that never connects (the default rendezvous)
  store      GroupCreate through the store, rank 0 of 2, rank 1 never joins

While they wait (--group-timeout, default 10 s), one victim session per lane loops
a 512x512 float32 matmul and its download, and the script prints each victim's
worst round trip and the worst of all:

    RESULT group_stall.worst_rtt_s <seconds> <=0.5

    /usr/bin/python3 bench/group_stall.py [BUILD] [--wait connect|store]
        [--timeout SECS] [--size N] [--lanes N]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "client", "python"))
import tensordd  # noqa: E402
from tensordd import parallel  # noqa: E402


def start(binary, *args):
    p = subprocess.Popen([binary, "--listen", "tcp://127.0.0.1:0", *args],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        line = p.stdout.readline()
        if not line:
            break
        if line.startswith("listening on tcp://"):
            return p, line.split()[2]
    p.kill()
    raise SystemExit(f"{binary} did not start")


def on_every_lane(endpoint, lanes):
    """Sessions until their ids cover every lane (a session runs on lane id % lanes)."""
    picked, spare = {}, []
    for _ in range(4 * lanes):
        s = tensordd.connect(endpoint, timeout=600)
        if s.session_id % lanes in picked:
            spare.append(s)
        else:
            picked[s.session_id % lanes] = s
        if len(picked) == lanes:
            break
    for s in spare:
        s.close()
    return list(picked.values())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build", nargs="?", default="build")
    ap.add_argument("--wait", choices=["connect", "store"], default="connect")
    ap.add_argument("--timeout", type=int, default=10)
    ap.add_argument("--size", type=int, default=512)
    ap.add_argument("--lanes", type=int, default=4)
    a = ap.parse_args()
    binary = os.path.join(a.build, "tensordd")
    store = tempfile.mkdtemp(prefix="tdd-group-stall-")
    args = ["--group-timeout", str(a.timeout), "--device-lanes", str(a.lanes),
            "--group-store-dir", store]
    (pv, ev), (ph, eh) = start(binary, *args), start(binary, *args)
    try:
        attackers = on_every_lane(ev, a.lanes)
        hs = tensordd.connect(eh, timeout=600)
        waits, kept = [], []
        for i, s in enumerate(attackers):
            name = f"stall-{i}"
            if a.wait == "store":
                waits.append(lambda s=s, name=name: parallel.create_group(s, name, 0, 2))
                continue
            g, addr = parallel.prepare_group(s, name, 0, 2)
            hg, haddr = parallel.prepare_group(hs, name, 1, 2)
            kept.append(hg)
            waits.append(lambda g=g, addr=addr, haddr=haddr: g.connect([addr, haddr]))
        ended, errors = [None] * len(waits), [None] * len(waits)

        def one(i):
            try:
                waits[i]()
            except tensordd.Error as e:
                errors[i] = type(e).__name__
            ended[i] = time.monotonic()

        victims = on_every_lane(ev, a.lanes)
        rng = np.random.default_rng(0)
        x = rng.standard_normal((a.size, a.size)).astype(np.float32)
        tx = [s.tensor(x) for s in victims]
        worst = [0.0] * len(victims)
        rounds = [0] * len(victims)

        def victim(k, until):
            worst[k], rounds[k] = 0.0, 0
            while until() and rounds[k] < 100000:
                t0 = time.monotonic()
                (tx[k] @ tx[k]).numpy()
                worst[k] = max(worst[k], time.monotonic() - t0)
                rounds[k] += 1

        def run_victims(until):
            vt = [threading.Thread(target=victim, args=(k, until), daemon=True)
                  for k in range(len(victims))]
            for t in vt:
                t.start()
            for t in vt:
                t.join(30 * a.timeout)

        def report(what):
            for k, s in enumerate(victims):
                print(f"  {what}: victim session {s.session_id} (lane "
                      f"{s.session_id % a.lanes}): {rounds[k]} matmul round trips, worst "
                      f"{worst[k]:.3f} s")

        t_quiet = time.monotonic()  # the same victims with nobody waiting, as long
        run_victims(lambda: time.monotonic() - t_quiet < a.timeout)
        report("quiet")
        quiet_worst = max(worst)
        t_attack = time.monotonic()
        threads = [threading.Thread(target=one, args=(i,), daemon=True)
                   for i in range(len(waits))]
        for t in threads:
            t.start()
        time.sleep(0.5)  # their requests are in
        run_victims(lambda: any(e is None for e in ended))
        for t in threads:
            t.join(30 * a.timeout)
        print(f"group_stall: {len(attackers)} sessions wait ({a.wait}, --group-timeout "
              f"{a.timeout}) on {a.lanes} lanes; their waits ended after "
              f"{max(e or 0 for e in ended) - t_attack:.1f} s ({', '.join(map(str, errors))})")
        report("attack")
        print(f"quiet worst round trip {quiet_worst:.3f} s")
        print(f"RESULT group_stall.worst_rtt_s {max(worst):.4f} <=0.5")
    finally:
        for p in (pv, ph):
            p.kill()
            p.wait()
        shutil.rmtree(store, ignore_errors=True)


if __name__ == "__main__":
    main()
