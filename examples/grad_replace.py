#!/usr/bin/env python3
"""grad_replace.py -- the contract that started tensordd.

burn's dispatch backend panics ("The provided tensors are not on the same
backend") when a gradient from one backend is installed over a tensor of
another, and installs a gradient of the wrong device, dtype or shape
silently. tensordd checks grads, tracking, backend, device, dtype and shape
before installing anything, answers a typed error naming both sides, and the
session lives on. This script shows each answer and the fix.

    PYTHONPATH=client/python /usr/bin/python3 examples/grad_replace.py [ENDPOINT]

The daemon needs two cpu devices for the device case: tensordd --cpu-devices 2.
"""
import os
import sys

import numpy as np

import tensordd


def main():
    endpoint = sys.argv[1] if len(sys.argv) > 1 else os.environ.get(
        "TENSORDD_ENDPOINT", "tcp://127.0.0.1:7070")
    with tensordd.connect(endpoint) as s:
        w = s.tensor(np.ones((2, 3), np.float32), device="cpu:0", requires_grad=True)
        x = s.tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
        grads = (w * x).sum().backward()
        print("d(sum(w*x))/dw =\n", grads.get(w).numpy())

        # A clipped gradient computed on the reference backend: wrong backend.
        g_ref = s.tensor(np.full((2, 3), 0.5, np.float32), device="ref:0")
        try:
            grads.replace(w, g_ref)
        except tensordd.BackendMismatchError as e:
            print(f"\n{e.code}: target on {e.target}, gradient on {e.grad}")
            print("  nothing was installed; the gradient still reads",
                  grads.get(w).numpy().ravel())

        # The fix: move the gradient to the target's device first.
        grads.replace(w, g_ref.to(w.device))
        print(f"\nafter g.to({w.device}): installed ->", grads.get(w).numpy().ravel())

        # The other checks burn does not make, each typed and harmless:
        served = {str(d) for d in s.devices()}
        cases = [
            ("wrong dtype", lambda: s.tensor(np.ones((2, 3), np.float64))),
            ("wrong shape", lambda: s.tensor(np.ones((3, 2), np.float32))),
        ]
        if "cpu:1" in served:
            cases.insert(0, ("other device", lambda: s.tensor(np.ones((2, 3), np.float32),
                                                              device="cpu:1")))
        for what, make in cases:
            try:
                grads.replace(w, make())
            except tensordd.Error as e:
                sides = ""
                if hasattr(e, "target") and hasattr(e, "grad"):
                    sides = f": target {e.target}, gradient {e.grad}"
                elif hasattr(e, "expected"):
                    sides = f": expected {e.expected}, got {e.got}"
                print(f"{what:12s} -> {e.code}{sides}")
        try:
            grads.replace(x, s.tensor(np.ones((2, 3), np.float32)))
        except tensordd.NotTrackedError as e:
            print(f"{'untracked':12s} -> {e.code}")

        # The session is alive and the installed gradient is what the optimizer uses.
        tensordd.optim.SGD([w], lr=1.0).step(grads)
        print("\nafter one SGD step with lr=1:", w.numpy().ravel())
    return 0


if __name__ == "__main__":
    sys.exit(main())
