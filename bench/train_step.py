#!/usr/bin/env python3
"""train_step.py -- one MLP training step over the wire against the same step in
local PyTorch (CPU), measured in the same run.

    PYTHONPATH=client/python /usr/bin/python3 bench/train_step.py ENDPOINT

The step: upload a 64x64 batch and its labels, forward (64-128-10 MLP, relu,
cross_entropy), backward and an Adam step, all in the daemon, then the loss's
value read back (loss.item()). Local PyTorch does the same with torch.optim.Adam.
Then the same MLP with SGD (the torch idiom: zero_grad, backward, step), pipelined.
Three ways over the wire: synchronous (backward and step each wait for their
answer: session.pipeline_steps = False), pipelined (the default: one write and
one read per step) and a recorded graph replayed.
Blocks of steps separated by idle gaps, medians reported (OpenBLAS threads
spin after a call and would take the other core from the other process).
"""
import os
import statistics
import sys
import time

import numpy as np
import torch

import tensordd
from localblas import set_threads
from procstat import faults

STEPS, BLOCKS = 50, 7


def blocks(step, steps=STEPS, nblocks=BLOCKS, warmup=10):
    """Median seconds per step over nblocks blocks of steps steps, after warmup steps."""
    for _ in range(warmup):
        step()
    per_step = []
    for _ in range(nblocks):
        time.sleep(0.1)
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        per_step.append((time.perf_counter() - t0) / steps)
    return statistics.median(per_step)


def cpu_ns(pid):
    """CPU time the daemon has used so far, in ns (every thread's /proc schedstat), or None."""
    total = 0
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
    except (OSError, ValueError, TypeError):
        return None
    return total


def cpu_per_step(step, pid, steps=STEPS * 6, warmup=10):
    """(client, daemon) CPU microseconds per step over steps steps: less disturbed by
    other work on the machine than the wall clock (the daemon's: None without pid)."""
    for _ in range(warmup):
        step()
    d0, c0 = cpu_ns(pid), time.process_time()
    for _ in range(steps):
        step()
    d1, c1 = cpu_ns(pid), time.process_time()
    daemon = (d1 - d0) / steps / 1e3 if d0 is not None and d1 is not None else None
    return (c1 - c0) / steps * 1e6, daemon


def torch_mlp_step(tp, topt, x, y):
    """One local PyTorch step of the 64-128-10 MLP with parameters tp and optimizer topt."""

    def step():
        xb, yb = torch.from_numpy(x), torch.from_numpy(y)
        loss = torch.nn.functional.cross_entropy((xb @ tp[0] + tp[1]).relu() @ tp[2] + tp[3], yb)
        topt.zero_grad()
        loss.backward()
        topt.step()
        loss.item()

    return step


def main():
    endpoint = sys.argv[1]
    pid = sys.argv[2] if len(sys.argv) > 2 else None  # the daemon's, for its page faults
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 64)).astype(np.float32)
    y = rng.integers(0, 10, 64).astype(np.int64)
    w1 = (rng.standard_normal((64, 128)) * 0.1).astype(np.float32)
    b1 = np.zeros(128, np.float32)
    w2 = (rng.standard_normal((128, 10)) * 0.1).astype(np.float32)
    b2 = np.zeros(10, np.float32)

    set_threads(1)  # its OpenBLAS's GEMMs too (localblas.py), as the daemon's --threads 1
    tp = [torch.tensor(a, requires_grad=True) for a in (w1, b1, w2, b2)]
    topt = torch.optim.Adam(tp, lr=1e-3)

    torch_step = torch_mlp_step(tp, topt, x, y)

    local = blocks(torch_step)
    cpu_local, _ = cpu_per_step(torch_step, None)

    with tensordd.connect(endpoint) as s:
        params = [s.tensor(a, requires_grad=True) for a in (w1, b1, w2, b2)]
        W1, B1, W2, B2 = params
        opt = tensordd.optim.Adam(params, lr=1e-3)

        def remote_step():
            xb, yb = s.tensor(x), s.tensor(y)
            loss = s.op("cross_entropy", (xb @ W1 + B1).relu() @ W2 + B2, yb)
            opt.step(loss.backward())
            loss.item()

        s.pipeline_steps = False
        synchronous = blocks(remote_step)
        cpu_sync = cpu_per_step(remote_step, pid)
        s.pipeline_steps = True
        remote = blocks(remote_step)
        cpu_pipe = cpu_per_step(remote_step, pid)

        # the same step recorded once and replayed: one Replay message (and the
        # batch's two uploads) per step, then the loss read back
        x0, y0 = s.tensor(x), s.tensor(y)
        with s.capture(x0, y0) as graph:
            loss = s.op("cross_entropy", (x0 @ W1 + B1).relu() @ W2 + B2, y0)
            opt.step(loss.backward())

        def replay_step():
            graph.replay(x, y)
            loss.item()

        replayed = blocks(replay_step)
        cpu_replay = cpu_per_step(replay_step, pid)
        f0 = faults(pid)  # after warm-up: a steady step should map nothing new
        for _ in range(STEPS * 4):
            replay_step()
        f1 = faults(pid)

    print("MLP 64-128-10 training step, batch 64, Adam (median of %d blocks of %d)" %
          (BLOCKS, STEPS))
    print("  local PyTorch (1 thread)  %7.3f ms" % (local * 1e3))
    print("  tensordd, synchronous     %7.3f ms   %.2fx local" %
          (synchronous * 1e3, synchronous / local))
    print("  tensordd, pipelined       %7.3f ms   %.2fx local" % (remote * 1e3, remote / local))
    print("  tensordd, graph replay    %7.3f ms   %.2fx local" %
          (replayed * 1e3, replayed / local))
    print("  CPU per step, client / daemon (us): synchronous %s, pipelined %s, replay %s" %
          tuple("%.0f / %s" % (c, "-" if d is None else "%.0f" % d)
                for c, d in (cpu_sync, cpu_pipe, cpu_replay)))
    if None not in (cpu_sync[1], cpu_pipe[1], cpu_replay[1]):
        # CPU time moves less than the wall clock when other work shares the cores
        print("  CPU per step, client + daemon / local PyTorch's %.0f us: synchronous %.2fx, "
              "pipelined %.2fx, replay %.2fx" %
              ((cpu_local,) + tuple(sum(c) / cpu_local for c in (cpu_sync, cpu_pipe, cpu_replay))))
    if f0 is not None and f1 is not None:
        print("  daemon page faults per replayed step after warm-up: %.2f (%d over %d steps)" %
              ((f1 - f0) / (STEPS * 4), f1 - f0, STEPS * 4))
        print("RESULT alloc.faults.replay %.4f <=0" % ((f1 - f0) / (STEPS * 4)))
    print("RESULT train.mlp_adam.replay %.4f <=0.8" % (replayed / local))  # bench/summary.py
    small_sgd(endpoint, pid, x, y, (w1, b1, w2, b2))
    big_mlp(endpoint, pid)
    return 0


def small_sgd(endpoint, pid, x, y, init):
    """The same MLP with SGD, pipelined: local PyTorch's step is cheaper than with Adam,
    so what tensordd's step costs beyond the work itself (the client's Python, the
    wire, the daemon's loop) weighs more in the ratio (bench/peers.py's SGD row)."""
    tp = [torch.tensor(a, requires_grad=True) for a in init]
    topt = torch.optim.SGD(tp, lr=1e-2)

    torch_step = torch_mlp_step(tp, topt, x, y)

    local = blocks(torch_step)
    cpu_local, _ = cpu_per_step(torch_step, None)
    with tensordd.connect(endpoint) as s:
        W1, B1, W2, B2 = params = [s.tensor(a, requires_grad=True) for a in init]
        opt = tensordd.optim.SGD(params, lr=1e-2)

        def remote_step():
            loss = s.op("cross_entropy", (s.tensor(x) @ W1 + B1).relu() @ W2 + B2, s.tensor(y))
            opt.zero_grad()
            loss.backward()
            opt.step()
            loss.item()

        remote = blocks(remote_step)
        client, daemon = cpu_per_step(remote_step, pid)
    print("MLP 64-128-10 training step, batch 64, SGD, pipelined (median of %d blocks of %d)" %
          (BLOCKS, STEPS))
    print("  local PyTorch (1 thread)  %7.3f ms" % (local * 1e3))
    print("  tensordd, pipelined       %7.3f ms   %.2fx local" % (remote * 1e3, remote / local))
    if daemon is not None:
        print("  CPU per step, client %.0f + daemon %.0f us = %.2fx local PyTorch's %.0f us" %
              (client, daemon, (client + daemon) / cpu_local, cpu_local))


def big_mlp(endpoint, pid=None, steps=5, nblocks=5):
    """MLP 784-1024-1024-10, batch 256, SGD: GEMMs and elementwise kernels big enough
    to run on every thread of the device (what idle-thread spinning slows down). Its
    time is GEMMs: the CPU time per step (the daemon's against local PyTorch's, the same
    OpenBLAS on as many threads) is the figure that the machine's load moves least."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((256, 784)).astype(np.float32)
    y = rng.integers(0, 10, 256).astype(np.int64)
    dims = [784, 1024, 1024, 10]
    init = []
    for i, o in zip(dims, dims[1:]):
        init += [(rng.standard_normal((i, o)) / np.sqrt(i)).astype(np.float32),
                 np.zeros(o, np.float32)]

    tp = [torch.tensor(a, requires_grad=True) for a in init]
    topt = torch.optim.SGD(tp, lr=1e-2)

    def torch_step():
        h = torch.from_numpy(x)
        for k in range(0, len(tp), 2):
            h = h @ tp[k] + tp[k + 1]
            if k + 2 < len(tp):
                h = h.relu()
        loss = torch.nn.functional.cross_entropy(h, torch.from_numpy(y))
        topt.zero_grad()
        loss.backward()
        topt.step()

    local = blocks(torch_step, steps, nblocks, warmup=2)
    cpu_local, _ = cpu_per_step(torch_step, None, steps * 4, warmup=2)
    with tensordd.connect(endpoint) as s:
        params = [s.tensor(a, requires_grad=True) for a in init]
        opt = tensordd.optim.SGD(params, lr=1e-2)

        def remote_step():
            h = s.tensor(x)
            for k in range(0, len(params), 2):
                h = h @ params[k] + params[k + 1]
                if k + 2 < len(params):
                    h = h.relu()
            loss = s.op("cross_entropy", h, s.tensor(y))
            opt.step(loss.backward())
            s.sync()

        remote = blocks(remote_step, steps, nblocks, warmup=2)
        client, daemon = cpu_per_step(remote_step, pid, steps * 4, warmup=2)
    print("MLP 784-1024-1024-10 training step, batch 256, SGD (median of %d blocks of %d)" %
          (nblocks, steps))
    print("  local PyTorch (1 thread)  %7.3f ms" % (local * 1e3))
    print("  tensordd over loopback    %7.3f ms   %.2fx local" % (remote * 1e3, remote / local))
    if daemon is not None:
        print("  CPU per step (ms): daemon %.2f, client %.2f; local PyTorch %.2f; "
              "daemon / local %.2fx, (daemon + client) / local %.2fx" %
              (daemon / 1e3, client / 1e3, cpu_local / 1e3, daemon / cpu_local,
               (daemon + client) / cpu_local))


if __name__ == "__main__":
    sys.exit(main())
