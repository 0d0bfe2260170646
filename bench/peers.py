#!/usr/bin/env python3
"""peers.py -- tensordd against PyTorch RPC (TensorPipe, loopback) and local PyTorch,
measured in the same run on the same machine.

    PYTHONPATH=client/python /usr/bin/python3 bench/peers.py ENDPOINT [--quick] [--pid PID]
        [--threads N]

PyTorch RPC runs as two processes on 127.0.0.1 (this one, "trainer", and a "ps"
child it starts; they meet through a file store, and TensorPipe listens on lo only):
the server holds the tensors and the model, as tensordd's daemon does. Local
PyTorch, PyTorch RPC's server and (when started with --threads N) the daemon run
the same number of intra-op threads, --threads (default 1). PyTorch RPC's rows come
last, after tensordd's and local PyTorch's: its agents busy-poll while they live (about
a sixth of a core each, idle, with its default shm transport), which would slow the
other rows on a small machine. Rows:
  - tiny op: relu of 4 floats and its result back (p50/p99 round trip);
  - pipelined tiny ops: relu of 4 floats, many in flight, ops/s;
  - 64 MiB upload and download;
  - training steps with the model on the server: MLP 64-128-10 (Adam and SGD),
    MLP 784-1024-1024-10 (SGD), a conv net on 8x1x28x28 (SGD). PyTorch RPC uses
    distributed autograd and DistributedOptimizer; tensordd the same code on
    tensordd.nn/optim; local PyTorch is the baseline of every ratio. With --pid
    (the daemon's), the daemon's page faults per step after warm-up too.
Every figure is also printed as a RESULT line for bench/summary.py.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
import torch.distributed.autograd as dist_autograd
import torch.distributed.rpc as rpc
from torch.distributed.optim import DistributedOptimizer

from localblas import set_threads
from pingpong import echo_ping
from procstat import faults

MiB = 1 << 20


# ---------------------------------------------------------------- on the "ps" side

_stored = {}


def ps_store(t):
    _stored["t"] = t


def ps_fetch():
    return _stored["t"]


def ps_make_model(kind):
    return build_model(torch.nn, kind)


def ps_param_rrefs(model_rref):
    return [rpc.RRef(p) for p in model_rref.local_value().parameters()]


def ps_loss(model_rref, x, y):
    return torch.nn.functional.cross_entropy(model_rref.local_value()(x), y)


# ---------------------------------------------------------------- models, written once


def build_model(nn, kind):
    """The same architecture on torch.nn or tensordd.nn."""
    if kind == "mlp":
        return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    if kind == "big":
        return nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                             nn.Linear(1024, 10))
    if kind == "conv":
        return nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Flatten(), nn.Linear(16 * 7 * 7, 10))
    raise ValueError(kind)


CASES = [  # name, model, batch shape, optimizer, lr
    ("MLP 64-128-10, batch 64, Adam", "mlp", (64, 64), "Adam", 1e-3),
    ("MLP 64-128-10, batch 64, SGD", "mlp", (64, 64), "SGD", 1e-2),
    ("MLP 784-1024-1024-10, batch 256, SGD", "big", (256, 784), "SGD", 1e-2),
    ("conv net, 8x1x28x28, SGD", "conv", (8, 1, 28, 28), "SGD", 1e-2),
]


def per_step(step, steps, blocks=3, warmup=3, pid=None):
    """(median seconds per step over blocks of steps after warmup steps, pid's page
    faults per step over the blocks after the first, or None without pid)."""
    for _ in range(warmup):
        step()
    out, f0 = [], None
    for b in range(blocks):
        if b == 1:
            f0 = faults(pid)
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        out.append((time.perf_counter() - t0) / steps)
    f1 = faults(pid)
    per = (f1 - f0) / ((blocks - 1) * steps) if None not in (f0, f1) and blocks > 1 else None
    return statistics.median(out), per


def batch(shape, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(shape).astype(np.float32), rng.integers(0, 10, shape[0])


# ---------------------------------------------------------------- the three systems


def local_step(kind, shape, opt_name, lr):
    torch.manual_seed(0)
    m = build_model(torch.nn, kind)
    opt = getattr(torch.optim, opt_name)(m.parameters(), lr=lr)
    x, y = batch(shape)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)

    def step():
        loss = torch.nn.functional.cross_entropy(m(xt), yt)
        opt.zero_grad()
        loss.backward()
        opt.step()

    return step


def rpc_step(kind, shape, opt_name, lr):
    model = rpc.remote("ps", ps_make_model, args=(kind,))
    params = rpc.rpc_sync("ps", ps_param_rrefs, args=(model,))
    opt = DistributedOptimizer(getattr(torch.optim, opt_name), params, lr=lr)
    x, y = batch(shape)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)

    def step():
        with dist_autograd.context() as ctx:
            loss = rpc.rpc_sync("ps", ps_loss, args=(model, xt, yt))
            dist_autograd.backward(ctx, [loss])
            opt.step(ctx)

    return step


def tdd_step(td, kind, shape, opt_name, lr):
    m = build_model(td.nn, kind)
    opt = getattr(td.optim, opt_name)(m.parameters(), lr=lr)
    x, y = batch(shape)
    loss_fn = td.nn.CrossEntropyLoss()

    def step():
        loss = loss_fn(m(td.tensor(x)), td.tensor(y))
        opt.zero_grad()
        loss.backward()
        opt.step()
        loss.item()  # the step's completion (and its loss) comes back, as RPC's does

    return step


def pct(v, q):
    return float(np.percentile(v, q))


def timed(fn, reps):
    """Microseconds of each of reps calls of fn, after 50 unmeasured ones."""
    for _ in range(50):
        fn()
    v = np.empty(reps)
    for i in range(reps):
        t0 = time.perf_counter_ns()
        fn()
        v[i] = (time.perf_counter_ns() - t0) / 1000.0
    return v


def raw_pingpong(reps, n=64):
    """Microseconds of each raw Python socket ping-pong of n bytes (bench/pingpong.py)."""
    with echo_ping(n) as ping:
        return timed(ping, reps)


def rpc_options(store):
    """TensorPipe options: the two processes meet through a file store (no TCP store
    listening on every interface); TP_SOCKET_IFNAME keeps TensorPipe's own listener on lo."""
    os.environ["TP_SOCKET_IFNAME"] = "lo"
    return rpc.TensorPipeRpcBackendOptions(init_method="file://" + store, rpc_timeout=600)


def result(name, value, target="-"):
    print(f"RESULT {name} {value:.6g} {target}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("endpoint")
    ap.add_argument("--quick", action="store_true", help="fewer repetitions")
    ap.add_argument("--pid", type=int, help="the daemon's pid: its page faults per step")
    ap.add_argument("--threads", type=int, default=1,
                    help="intra-op threads of local PyTorch and PyTorch RPC's server, their "
                    "OpenBLAS's included (start the daemon with --threads N to match)")
    ap.add_argument("--ps", help=argparse.SUPPRESS)  # the RPC server child: the store's path
    a = ap.parse_args()
    set_threads(a.threads)  # its OpenBLAS's GEMMs too (localblas.py)
    if a.ps:
        rpc.init_rpc("ps", rank=1, world_size=2, rpc_backend_options=rpc_options(a.ps))
        rpc.shutdown()
        return 0

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                    "client", "python"))
    import tensordd as td

    td.connect(a.endpoint, timeout=600)
    print("peers: tensordd vs PyTorch RPC (TensorPipe, 2 processes on loopback) vs local "
          f"PyTorch, {a.threads} intra-op thread{'s' * (a.threads != 1)}")
    mine = measure_tdd(td, a.quick, a.pid)
    # PyTorch RPC only now: its agents busy-poll (its shm transport) for as long as they
    # live, which would take CPU from the local and tensordd rows on a small machine
    tmp = tempfile.mkdtemp(prefix="tdd-peers-")
    store = os.path.join(tmp, "store")
    ps = subprocess.Popen([sys.executable, os.path.abspath(__file__), a.endpoint, "--ps", store,
                           "--threads", str(a.threads)])
    try:
        rpc.init_rpc("trainer", rank=0, world_size=2, rpc_backend_options=rpc_options(store))
        theirs = measure_rpc(a.quick)
        rpc.shutdown()
    finally:
        try:
            ps.wait(timeout=30)
        except subprocess.TimeoutExpired:
            ps.kill()
            ps.wait()
        for f in os.listdir(tmp):
            os.unlink(os.path.join(tmp, f))
        os.rmdir(tmp)
    report(mine, theirs)
    return 0


def reps_of(quick):
    """(round trips, pipelined ops, transfers, steps per block of each training case)."""
    steps = {k: v // (4 if quick else 1) or 1 for k, v in {"mlp": 40, "big": 4, "conv": 20}.items()}
    return (300, 2000, 2, steps) if quick else (2000, 20000, 5, steps)


def median_time(fn, k):
    out = []
    for _ in range(k):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def measure_tdd(td, quick, pid):
    """The raw ping-pong, tensordd's rows and local PyTorch's training steps."""
    reps, n, k, steps = reps_of(quick)
    m = {"raw": raw_pingpong(reps)}
    x4 = td.tensor([-1.0, 2.0, -3.0, 4.0])
    m["tiny"] = timed(lambda: x4.relu().numpy(), reps)
    t0 = time.perf_counter()
    for _ in range(n):
        x4.relu()  # dropped at once: its Release is pipelined too
    td.default_session().sync()
    m["pipelined"] = n / (time.perf_counter() - t0)
    big = np.random.default_rng(0).standard_normal(64 * MiB // 4).astype(np.float32)
    holder = {}

    def up_tdd():
        holder["t"] = td.tensor(big)
        holder["t"].shape  # noqa: B018 -- waits for the upload to land

    up_tdd()
    m["up"] = median_time(up_tdd, k)
    m["down"] = median_time(lambda: holder["t"].numpy(), k)
    del holder["t"]
    for name, kind, shape, opt_name, lr in CASES:
        m[name, "local"], m[name, "tdd"] = alternated(
            local_step(kind, shape, opt_name, lr), tdd_step(td, kind, shape, opt_name, lr),
            steps[kind], pid)
    return m


def alternated(local, remote, steps, pid, blocks=3):
    """(local's median seconds per step, (tensordd's, its daemon's page faults per step)):
    blocks of each in alternating order (local first, then tensordd first, ...), so that a
    load that comes or goes during the row weighs on both sides alike."""
    for _ in range(max(3, steps)):  # warm-up: the daemon's pool has what a step needs
        local()
        remote()
    lt, rt, f0 = [], [], faults(pid)
    for b in range(blocks):
        for side in ((local, lt), (remote, rt))[::1 if b % 2 == 0 else -1]:
            t0 = time.perf_counter()
            for _ in range(steps):
                side[0]()
            side[1].append((time.perf_counter() - t0) / steps)
    f1 = faults(pid)  # local steps map nothing in the daemon
    per = (f1 - f0) / (blocks * steps) if None not in (f0, f1) else None
    return statistics.median(lt), (statistics.median(rt), per)


def measure_rpc(quick):
    """PyTorch RPC's rows, the same work."""
    reps, n, k, steps = reps_of(quick)
    t4 = torch.tensor([-1.0, 2.0, -3.0, 4.0])
    m = {"tiny": timed(lambda: rpc.rpc_sync("ps", torch.relu, args=(t4,)), reps)}
    t0 = time.perf_counter()
    futs = [rpc.rpc_async("ps", torch.relu, args=(t4,)) for _ in range(n)]
    torch.futures.wait_all(futs)
    m["pipelined"] = n / (time.perf_counter() - t0)
    bt = torch.from_numpy(np.random.default_rng(0).standard_normal(64 * MiB // 4)
                          .astype(np.float32))
    m["up"] = median_time(lambda: rpc.rpc_sync("ps", ps_store, args=(bt,)), k)
    m["down"] = median_time(lambda: rpc.rpc_sync("ps", ps_fetch), k)
    for name, kind, shape, opt_name, lr in CASES:
        m[name] = per_step(rpc_step(kind, shape, opt_name, lr), steps[kind])[0]
    return m


def report(mine, theirs):
    r_raw, r_tdd, r_rpc = mine["raw"], mine["tiny"], theirs["tiny"]
    print("\ntiny op: relu(4) and its values back, round trip in us (p50 / p99)")
    print(f"  raw Python socket ping-pong (64 B) {pct(r_raw, 50):9.1f} / {pct(r_raw, 99):9.1f}")
    print(f"  PyTorch RPC   {pct(r_rpc, 50):9.1f} / {pct(r_rpc, 99):9.1f}")
    print(f"  tensordd      {pct(r_tdd, 50):9.1f} / {pct(r_tdd, 99):9.1f}   "
          f"{pct(r_tdd, 50) / pct(r_raw, 50):.2f}x the raw ping-pong; PyTorch RPC is "
          f"{pct(r_rpc, 50) / pct(r_tdd, 50):.1f}x slower (p50)")
    result("rpc.tiny", pct(r_rpc, 50) / pct(r_tdd, 50))

    print("\npipelined tiny ops (relu of 4 floats, many in flight), ops/s")
    print(f"  PyTorch RPC   {theirs['pipelined']:10.0f}")
    print(f"  tensordd      {mine['pipelined']:10.0f}   "
          f"{mine['pipelined'] / theirs['pipelined']:.1f}x PyTorch RPC")
    result("rpc.pipelined", mine["pipelined"] / theirs["pipelined"])

    print("\n64 MiB transfers, MB/s (medians)")
    for way in ("up", "down"):
        print(f"  {way + 'load':9} PyTorch RPC {64 * MiB / theirs[way] / 1e6:8.0f}   tensordd "
              f"{64 * MiB / mine[way] / 1e6:8.0f}   {theirs[way] / mine[way]:.1f}x")
        result(f"rpc.{way}load64", theirs[way] / mine[way])

    print("\ntraining step, model on the server, ms per step (median of 3 blocks); ratios "
          "to local PyTorch")
    print(f"  {'case':38} {'local':>8} {'tensordd':>9} {'ratio':>6} {'PT RPC':>8} {'ratio':>6} "
          f"{'RPC/tdd':>8} {'faults/step':>11}")
    for (name, *_), key in zip(CASES, ("mlp_adam", "mlp_sgd", "big_mlp", "conv")):
        loc, (rem, flt), rp = mine[name, "local"], mine[name, "tdd"], theirs[name]
        print(f"  {name:38} {loc * 1e3:8.3f} {rem * 1e3:9.3f} {rem / loc:5.2f}x {rp * 1e3:8.3f} "
              f"{rp / loc:5.2f}x {rp / rem:7.1f}x {'-' if flt is None else f'{flt:.2f}':>11}")
        result(f"train.{key}.local", rem / loc, "<=1.1")
        result(f"train.{key}.rpc", rp / rem, ">=5")
        if flt is not None:
            result(f"alloc.faults.{key}", flt, "<=0")


if __name__ == "__main__":
    sys.exit(main())
