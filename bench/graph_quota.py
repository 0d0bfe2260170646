"""graph_quota.py -- what recorded graphs cost a daemon with a session quota.

Starts its own daemon (BUILD/tensordd) with --session-memory QUOTA, then one session
records G graphs of one request each, padded to about 3.9 MB (an unknown field the daemon
keeps and packs again). Prints how many GraphEnds were answered Ok, the session's charge
(Stats bytes_in_use) and the daemon's RSS growth.

    /usr/bin/python3 bench/graph_quota.py [BUILD] [--graphs G] [--quota BYTES]
"""

from __future__ import annotations

import argparse
import os
import struct
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from procstat import rss, start_daemon  # noqa: E402
from replay_storm import Raw, load_pb  # noqa: E402


def varint(n):
    out = b""
    while True:
        out += bytes([(n & 0x7F) | (0x80 if n > 0x7F else 0)])
        n >>= 7
        if not n:
            return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build", nargs="?", default=os.path.join(ROOT, "build"))
    ap.add_argument("--graphs", type=int, default=25)
    ap.add_argument("--quota", type=int, default=1 << 20)
    ap.add_argument("--pad", type=int, default=3_900_000)
    a = ap.parse_args()
    pb = load_pb(a.build)
    d, port = start_daemon(a.build, "--cpu-devices", "1", "--session-memory", str(a.quota))
    try:
        c = Raw(port, pb)
        sid = c.hello().hello.session_id
        time.sleep(0.2)
        rss0 = rss(d.pid)
        ok = 0
        rid = 10
        for g in range(a.graphs):
            c.send(pb.Request(id=rid, graph_begin=pb.GraphBegin()))
            msg = pb.Request(id=rid + 1, set_grad_mode=pb.SetGradMode(enabled=True))
            msg = msg.SerializeToString() + b"\xc2\x3e" + varint(a.pad) + b"\x00" * a.pad
            c.c.sendall(struct.pack("<IIQ", 0x01444454, len(msg), 0) + msg)
            c.send(pb.Request(id=rid + 2, graph_end=pb.GraphEnd(graph=1000 + g)))
            r = c.recv()
            ok += r.WhichOneof("body") == "ok"
            rid += 3
        c.send(pb.Request(id=rid, stats=pb.Stats()))
        st = c.recv().stats
        (me,) = [x for x in st.session_list if x.session_id == sid]
        print(f"--session-memory {a.quota}: {ok} of {a.graphs} GraphEnds Ok (graphs of one "
              f"{a.pad}-byte request), session charged {me.bytes_in_use} B, daemon RSS "
              f"+{(rss(d.pid) - rss0) / 1e6:.1f} MB")
    finally:
        d.terminate()
        d.wait(30)


if __name__ == "__main__":
    main()
