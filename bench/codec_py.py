"""codec_py.py -- CPU time per call of the Python client's wire codec (tensordd._codec):
the accelerator's functions (when built) and the pure-Python ones, in process, no socket.
Each row is the median over --rounds rounds of --n calls, in process CPU time.

    PYTHONPATH=client/python:build/python python3 bench/codec_py.py [--n N] [--rounds R]
        [--speedups PATH]   (time the accelerator built at PATH instead of the package's)
        [--codec PATH]      (time the pure-Python _codec.py at PATH instead)
"""
from __future__ import annotations

import argparse
import importlib.util
import statistics
import time

from tensordd import tensordd_pb2 as pb


def load(name: str, path: str | None):
    if path is None:
        return importlib.import_module("tensordd." + name)
    spec = importlib.util.spec_from_file_location("tensordd." + name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def row(name: str, fn, n: int, rounds: int) -> None:
    times = []
    for _ in range(rounds):
        t0 = time.process_time()
        for _ in range(n):
            fn()
        times.append((time.process_time() - t0) / n * 1e9)
    times.sort()
    print(f"{name:40s} {statistics.median(times):8.1f} ns  (min {times[0]:.1f}, max {times[-1]:.1f})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=200000)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--speedups")
    ap.add_argument("--codec")
    a = ap.parse_args()
    sp = load("_speedups", a.speedups)
    _codec = load("_codec", a.codec)
    reply = pb.Response(id=5, tensor=pb.TensorInfo(handle=3, dtype=1, shape=[64, 128],
                                                   device=pb.Device(backend="cpu", ordinal=1)))
    msg = reply.SerializeToString()
    ins = [1000001, 1000002]
    handles = list(range(1000, 1016))
    print(f"codec_py: {a.n} calls x {a.rounds} rounds, median ns per call (process CPU time)")
    row("accel encode_op", lambda: sp.encode_op(123456, "add", ins, 1000003), a.n, a.rounds)
    row("accel frame_download", lambda: sp.frame_download(123456, 1000003), a.n, a.rounds)
    row("accel frame_release (16)", lambda: sp.frame_release(123456, handles), a.n, a.rounds)
    row("accel parse_tensor_reply", lambda: sp.parse_tensor_reply(msg), a.n, a.rounds)
    row("pure encode_op", lambda: _codec.py_encode_op(123456, "add", ins, 1000003), a.n, a.rounds)
    row("pure frame_backward", lambda: _codec.frame_backward(123456, 1000003, 1000004), a.n,
        a.rounds)
    row("protobuf parse reply", lambda: pb.Response.FromString(msg), a.n, a.rounds)


if __name__ == "__main__":
    main()
