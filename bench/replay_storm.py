"""replay_storm.py -- another session's round trip while one session replays a big graph.

Starts its own daemon (BUILD/tensordd, default build), records a graph of N small requests
(SetGradMode, about 6 bytes each packed) on one raw connection, then sends R Replays of it
pipelined in one write (12-byte frames each), followed by a Sync. While that storm runs, a
second client opens fresh connections in a loop and times Hello + Sync on each. Prints the
storm's duration, how many probes ran during it and their worst and median round trips.

    /usr/bin/python3 bench/replay_storm.py [BUILD] [--requests N] [--replays R] [--no-probe]
                                       [-- daemon args]
"""

from __future__ import annotations

import argparse
import os
import socket
import struct
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from procstat import start_daemon  # noqa: E402

MAGIC = 0x01444454


def load_pb(build):
    sys.path.insert(0, os.path.join(ROOT, "client", "python"))
    sys.path.insert(0, os.path.join(build, "python"))
    from tensordd import tensordd_pb2 as pb  # noqa: PLC0415

    return pb


class Raw:
    def __init__(self, port, pb):
        self.pb = pb
        self.c = socket.create_connection(("127.0.0.1", port), timeout=600)
        self.c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def frame(self, req):
        msg = req.SerializeToString()
        return struct.pack("<IIQ", MAGIC, len(msg), 0) + msg

    def send(self, req):
        self.c.sendall(self.frame(req))

    def exact(self, n):
        b = bytearray()
        while len(b) < n:
            chunk = self.c.recv(n - len(b))
            if not chunk:
                raise EOFError
            b += chunk
        return bytes(b)

    def recv(self):
        _, n, plen = struct.unpack("<IIQ", self.exact(16))
        r = self.pb.Response.FromString(self.exact(n))
        self.exact(plen)
        return r

    def hello(self):
        req = self.pb.Request(id=1)
        req.hello.min_version = req.hello.max_version = 1
        self.send(req)
        return self.recv()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build", nargs="?", default=os.path.join(ROOT, "build"))
    ap.add_argument("--requests", type=int, default=450_000)
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--no-probe", action="store_true", help="time the storm alone")
    ap.add_argument("daemon_args", nargs="*")
    a = ap.parse_args()
    pb = load_pb(a.build)
    d, port = start_daemon(a.build, "--cpu-devices", "1", *a.daemon_args)
    try:
        c = Raw(port, pb)
        c.hello()
        c.send(pb.Request(id=2, graph_begin=pb.GraphBegin()))
        one = c.frame(pb.Request(id=3, set_grad_mode=pb.SetGradMode(enabled=True)))
        c.c.sendall(one * a.requests)
        c.send(pb.Request(id=4, graph_end=pb.GraphEnd(graph=1)))
        r = c.recv()
        assert r.WhichOneof("body") == "ok", r
        storm = b"".join(c.frame(pb.Request(id=10 + k, replay=pb.Replay(graph=1)))
                         for k in range(a.replays))
        storm += c.frame(pb.Request(id=9999, sync=pb.Sync()))
        rtts, done = [], threading.Event()

        def probe():
            while not done.is_set():  # each probe that began during the storm counts
                t0 = time.perf_counter()
                p = Raw(port, pb)
                p.hello()
                p.send(pb.Request(id=2, sync=pb.Sync()))
                p.recv()
                rtts.append(time.perf_counter() - t0)
                p.c.close()
                time.sleep(0.01)

        t0 = time.perf_counter()
        c.c.sendall(storm)
        th = threading.Thread(target=probe)
        if not a.no_probe:
            th.start()
        r = c.recv()
        took = time.perf_counter() - t0
        done.set()
        if not a.no_probe:
            th.join()
        assert r.id == 9999, r
        rtts.sort()
        print(f"graph of {a.requests} requests, {a.replays} pipelined replays: storm {took:.2f} s")
        if rtts:
            print(f"other session's Hello+Sync during it: {len(rtts)} probes, worst "
                  f"{rtts[-1] * 1e3:.1f} ms, median {rtts[len(rtts) // 2] * 1e3:.1f} ms")
    finally:
        d.terminate()
        d.wait(30)


if __name__ == "__main__":
    main()
