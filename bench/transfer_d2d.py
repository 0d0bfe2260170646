#!/usr/bin/env python3
"""transfer_d2d.py BUILD [MIB] [REPS] -- a tensor moved daemon to daemon (t.to("b/cpu:0"):
TransferAccept, TransferSend, the source's own connection) against raw TCP between the same
two network namespaces, in the same run.

Two daemons run in network namespaces of their own joined by a bridge (as the tests make
them: tests/python/parallel/test_parallel.Hosts; root needed, else distinct loopback ports, said in
the output). Raw TCP: one Python process in namespace 0 sends MIB MiB with sendall to one
in namespace 1 that recv_into's them into a preallocated buffer; timed by the receiver from
its first byte to its last. Transfer: an int32 tensor of MIB MiB made on daemon a, moved to
daemon b, timed by the client around .to() (the two requests and their replies included).
The first transfer lands in fresh memory (page faults on b); later ones reuse b's pool.

    sudo PYTHONPATH=client/python:build/python python3 bench/transfer_d2d.py build 256 5
"""
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))

RECV = r"""
import socket, sys, time
n = int(sys.argv[1]); s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[2], 0)); s.listen(1); print(s.getsockname()[1], flush=True)
c, _ = s.accept(); buf = bytearray(n); mv = memoryview(buf); got = 0; t0 = None
while got < n:
    k = c.recv_into(mv[got:], min(n - got, 1 << 22))
    if t0 is None: t0 = time.perf_counter()
    if not k: break
    got += k
print(got, time.perf_counter() - t0, flush=True)
"""
SEND = r"""
import socket, sys
n = int(sys.argv[1]); c = socket.create_connection((sys.argv[2], int(sys.argv[3])))
c.sendall(bytearray(n)); c.close()
"""


def in_ns(hosts, k, argv):
    return (["ip", "netns", "exec", hosts.ns[k]] if hosts.ns else []) + argv


def raw_tcp(hosts, nbytes):
    py = sys.executable
    r = subprocess.Popen(in_ns(hosts, 1, [py, "-c", RECV, str(nbytes), hosts.addrs[1]]),
                         stdout=subprocess.PIPE, text=True)
    port = r.stdout.readline().strip()
    subprocess.run(in_ns(hosts, 0, [py, "-c", SEND, str(nbytes), hosts.addrs[1], port]),
                   check=True, timeout=120)
    got, secs = r.stdout.readline().split()
    r.wait(30)
    assert int(got) == nbytes
    return float(secs)


def main():
    build = sys.argv[1] if len(sys.argv) > 1 else "build"
    mib = int(sys.argv[2]) if len(sys.argv) > 2 else 256
    reps = int(sys.argv[3]) if len(sys.argv) > 3 else 5
    os.environ.setdefault("TDD_BIN", os.path.join(build, "tensordd"))
    import numpy as np

    import tensordd
    from test_parallel import Hosts, RankDaemon

    nbytes = mib << 20
    hosts = Hosts(2)
    print(f"daemons in {hosts.how}; load {os.getloadavg()[0]:.1f}")
    ds = []
    try:
        token = os.path.join(ROOT, "build", ".bench-d2d-token")
        with open(token, "w") as f:
            f.write("bench-d2d-token\n")
        os.chmod(token, 0o600)
        peers = ",".join(sorted(set(hosts.addrs)))  # pushes reach only these (--transfer-peers)
        ds = [RankDaemon(hosts, k, ["--token-file", token, "--transfer-peers", peers])
              for k in range(2)]
        m = tensordd.connect_many([d.endpoint for d in ds], aliases=["a", "b"],
                                  token="bench-d2d-token", timeout=300)
        x = m.arange(nbytes // 4, dtype="int32", device="a/cpu:0")
        m["a"].sync()
        d2d, tcp = [], []
        for i in range(reps):
            tcp.append(raw_tcp(hosts, nbytes))
            t0 = time.perf_counter()
            y = x.to("b/cpu:0")
            d2d.append(time.perf_counter() - t0)
            if i == 0:
                assert np.array_equal(y.numpy(), np.arange(nbytes // 4, dtype=np.int32))
            del y
            m["b"].sync()
        m.close()
    finally:
        for d in ds:
            d.stop()
        hosts.close()

    def gbs(secs):
        return nbytes / secs / 1e9

    print(f"{mib} MiB, {reps} runs each, interleaved")
    print(f"  raw TCP (python sendall -> recv_into): median {gbs(statistics.median(tcp)):.2f} "
          f"GB/s, best {gbs(min(tcp)):.2f} GB/s")
    print(f"  daemon to daemon (t.to): first {gbs(d2d[0]):.2f} GB/s (fresh memory), median of "
          f"the rest {gbs(statistics.median(d2d[1:] or d2d)):.2f} GB/s, best {gbs(min(d2d)):.2f} "
          f"GB/s")


if __name__ == "__main__":
    main()
