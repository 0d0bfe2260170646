"""A session's results are a function of its own requests and the daemon's configuration.

The same small model is trained twice on one daemon: alone, then while several other
sessions keep the same device busy with matmul loops. The parameters must be equal bit
for bit. The daemon runs with one lane per device and no inline work, so every request
of every session goes through the same worker and the trainer's kernels are cut into
pieces with the neighbours' work between them; the pieces are small (--chunk-elems), so
every GEMM of the model is split. The model's GEMMs are on and off a 64 grid (OpenBLAS
sums an element in an order that depends on the call's shape differently on and off its
tile grid, and differently per kernel family), forward and backward, stepped by SGD with
momentum and by Adam.

OpenBLAS picks its kernels from the CPU, or from OPENBLAS_CORETYPE when the environment
sets it, and different kernels sum in different orders. Equal bits must hold whichever
kernels the daemon got, so the test runs daemons with the environment as this machine
sets it and, for the daemon process only, with the core type left to OpenBLAS and forced
to Haswell, Zen and SkylakeX where this CPU can run them (a core type whose instructions the
CPU lacks is skipped: OpenBLAS would die of SIGILL). The test's own environment is
never changed.

So that "equal" is not "equally wrong", the parameters are also held to the same
training in torch (float32 after 6 steps: rtol 1e-4, atol 1e-5 under SGD; under Adam an
element whose gradient is about 0 may step the other way under float32 rounding, up to
2 lr per step, so atol 1e-4 there, a 60th of the most any element can move).
"""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest

import tensordd

torch = pytest.importorskip("torch")

DEV = "cpu:0"
STEPS = 6
NEIGHBOURS = 4
# pieces of at most this many output elements: every GEMM below is cut (a BLAS GEMM in
# whole 64-row blocks)
DAEMON_ARGS = ("--device-lanes", "1", "--inline-work", "0", "--chunk-elems", "16384",
               "--cpu-devices", "1")

RNG = np.random.default_rng(22)
X = RNG.standard_normal((640, 256)).astype(np.float32)
Y = RNG.standard_normal((640, 10)).astype(np.float32)
# 256 -> 512: M, K, N on the 64 grid; 512 -> 300 -> 10: off it
INIT = [(RNG.standard_normal(s) / np.sqrt(s[0])).astype(np.float32)
        for s in ((256, 512), (512, 300), (300, 10))]
BIAS = (RNG.standard_normal(300) * 0.1).astype(np.float32)
RTOL, ATOL, ATOL_ADAM = 1e-4, 1e-5, 1e-4


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


FLAGS = _cpu_flags()
# what OpenBLAS's kernels of each core type execute (OpenBLAS: driver/others/dynamic.c)
NEEDS = {"Haswell": {"avx2", "fma"},
         "Zen": {"avx2", "fma"},
         "SkylakeX": {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd"}}


def _variants() -> list:
    """(id, environment for the daemon) per OpenBLAS core type tried."""
    machine = dict(os.environ)
    auto = {k: v for k, v in machine.items() if not k.startswith("OPENBLAS_")}
    out = [pytest.param(machine, id="machine-env")]
    if any(k.startswith("OPENBLAS_") for k in machine):
        out.append(pytest.param(auto, id="coretype-autodetect"))
    for core, needs in NEEDS.items():
        env = dict(auto, OPENBLAS_CORETYPE=core)
        if machine.get("OPENBLAS_CORETYPE") == core:
            continue  # the machine's own
        marks = () if needs <= FLAGS else pytest.mark.skip(
            reason=f"this CPU lacks {sorted(needs - FLAGS)} for OpenBLAS's {core} kernels")
        out.append(pytest.param(env, id=f"coretype-{core}", marks=marks))
    return out


def _forward(s, ps, x):
    w1, w2, b2, w3 = ps
    h = (x @ w1).relu()
    h = s.op("linear", h, w2.transpose(0, 1), b2).tanh()
    return h @ w3


def train(endpoint: str) -> list[np.ndarray]:
    """SGD with momentum on one copy of the model, Adam on another: the parameters."""
    s = tensordd.connect(endpoint, timeout=300)
    try:
        x, y = s.tensor(X, device=DEV), s.tensor(Y, device=DEV)
        out = []
        for kind, opts in (("SGD", dict(lr=0.05, momentum=0.9, weight_decay=1e-3)),
                           ("Adam", dict(lr=1e-3, weight_decay=1e-3))):
            ps = [s.tensor(a, device=DEV, requires_grad=True)
                  for a in (INIT[0], INIT[1], BIAS, INIT[2])]
            opt = getattr(tensordd.optim, kind)(ps, **opts)
            for _ in range(STEPS):
                opt.zero_grad()
                ((_forward(s, ps, x) - y) ** 2).mean().backward()
                opt.step()
            out += [p.numpy() for p in ps]
        return out
    finally:
        s.close(raise_errors=False)


def train_torch() -> list[np.ndarray]:
    x, y = torch.tensor(X), torch.tensor(Y)
    out = []
    for kind, opts in (("SGD", dict(lr=0.05, momentum=0.9, weight_decay=1e-3)),
                       ("Adam", dict(lr=1e-3, weight_decay=1e-3))):
        w1, w2, b2, w3 = (torch.tensor(a, requires_grad=True)
                          for a in (INIT[0], INIT[1], BIAS, INIT[2]))
        opt = getattr(torch.optim, kind)([w1, w2, b2, w3], **opts)
        for _ in range(STEPS):
            opt.zero_grad()
            h = torch.tanh(torch.relu(x @ w1) @ w2 + b2)
            ((h @ w3 - y) ** 2).mean().backward()
            opt.step()
        out += [p.detach().numpy() for p in (w1, w2, b2, w3)]
    return out


class Neighbours:
    """Sessions looping matmuls (sizes on and off the grid) on the trainer's device."""

    def __init__(self, endpoint: str, n: int):
        self.stop = threading.Event()
        self.done = [0] * n
        self.errors: list[BaseException] = []
        self.ready = threading.Barrier(n + 1, timeout=120)
        self.threads = [threading.Thread(target=self._loop, args=(endpoint, i), daemon=True)
                        for i in range(n)]
        for t in self.threads:
            t.start()
        self.ready.wait()

    def _loop(self, endpoint: str, i: int) -> None:
        s = None
        try:
            s = tensordd.connect(endpoint, timeout=300)
            n = 320 + 64 * i if i % 2 else 300 + 37 * i
            a = s.tensor(np.random.default_rng(i).standard_normal((n, n)).astype(np.float32),
                         device=DEV)
            s.sync()
            self.ready.wait()
            for _ in range(100000):  # bounded; stopped long before
                if self.stop.is_set():
                    break
                (a @ a).relu().sum().item()
                self.done[i] += 1
        except BaseException as e:  # noqa: BLE001 -- reported by close()
            self.errors.append(e)
            try:
                self.ready.abort()
            except threading.BrokenBarrierError:
                pass
        finally:
            if s is not None:
                s.close(raise_errors=False)

    def close(self) -> list[int]:
        self.stop.set()
        for t in self.threads:
            t.join(120)
        assert not any(t.is_alive() for t in self.threads), "a neighbour did not stop"
        assert not self.errors, f"a neighbour failed: {self.errors[0]!r}"
        return self.done


@pytest.mark.parametrize("env", _variants())
def test_training_is_bit_identical_alone_and_beside_busy_neighbours(start_daemon, env):
    d = start_daemon(*DAEMON_ARGS, env=env)
    alone = train(d.endpoint)
    again = train(d.endpoint)
    nb = Neighbours(d.endpoint, NEIGHBOURS)
    try:
        before = list(nb.done)
        loaded = train(d.endpoint)
        during = [b - a for a, b in zip(before, nb.done)]
    finally:
        nb.close()
    assert sum(during) > 0, "the neighbours ran no matmul while the model trained"
    for k, (a, b, c) in enumerate(zip(alone, again, loaded)):
        assert a.tobytes() == b.tobytes(), f"parameter {k}: two runs alone differ"
        assert a.tobytes() == c.tobytes(), (
            f"parameter {k}: differs in {int(np.sum(a != c))} of {a.size} elements when "
            f"{NEIGHBOURS} other sessions keep {DEV} busy ({during} matmuls during training)")
    for k, (a, t) in enumerate(zip(alone, train_torch())):
        np.testing.assert_allclose(a, t, rtol=RTOL, atol=ATOL if k < 4 else ATOL_ADAM,
                                   err_msg=f"parameter {k} vs torch")


def test_lanes_and_inline_work_do_not_change_bits(start_daemon):
    """The same training on daemons that differ only in how work reaches the device
    (lanes, inline work on the loop thread): settings that never change bits."""
    runs = []
    for extra in (("--device-lanes", "1", "--inline-work", "0"),
                  ("--device-lanes", "3", "--inline-work", "1000000")):
        d = start_daemon("--chunk-elems", "16384", "--cpu-devices", "1", *extra)
        runs.append(train(d.endpoint))
    for k, (a, b) in enumerate(zip(*runs)):
        assert a.tobytes() == b.tobytes(), f"parameter {k} differs between lane settings"
