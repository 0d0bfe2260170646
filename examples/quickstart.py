#!/usr/bin/env python3
"""quickstart -- connect to tensordd, upload, run a few ops, download, print.

    python3 examples/quickstart.py [ENDPOINT]

ENDPOINT is argv[1], else $TENSORDD_ENDPOINT, else tcp://127.0.0.1:7070.
Run it with PYTHONPATH=client/python after `make` (which generates the
protobuf module), or with the package installed.
"""

import os
import sys

import numpy as np

import tensordd


def main() -> int:
    endpoint = (sys.argv[1] if len(sys.argv) > 1
                else os.environ.get("TENSORDD_ENDPOINT", "tcp://127.0.0.1:7070"))
    with tensordd.connect(endpoint, timeout=60) as s:
        print(f"connected to {s.server} at {endpoint} (session {s.session_id})")
        if s.note:
            print(f"  daemon says: {s.note}")
        print("devices:", ", ".join(str(d) for d in s.devices()))

        rng = np.random.default_rng(0)
        x = rng.standard_normal((4, 3)).astype(np.float32)
        w = rng.standard_normal((3, 2)).astype(np.float32)

        # Ops are asynchronous: each returns a Tensor at once; nothing waits
        # for the daemon until a value is downloaded.
        X, W = s.tensor(x), s.tensor(w)
        h = (X @ W).relu()
        total = h.sum()

        out = h.numpy()
        expected = np.maximum(x @ w, 0)
        print("relu(x @ w) =\n", out)
        print(f"sum = {total.item():.6f} (numpy: {expected.sum():.6f})")
        if not np.allclose(out, expected, rtol=1e-5, atol=1e-5):
            print("MISMATCH against numpy", file=sys.stderr)
            return 1

        # Errors are typed and name the call that failed.
        bad = X + s.tensor(np.ones((5, 7), np.float32))
        try:
            s.sync()
        except tensordd.ShapeMismatchError as e:
            print(f"as expected, {type(e).__name__}: shapes {e.expected} vs {e.got}")
            print(f"  {e}")
        del bad

        # The same computation on the second CPU device, brought back.
        if "cpu:1" in [str(d) for d in s.devices()]:
            h1 = (X.to("cpu:1") @ W.to("cpu:1")).relu()
            same = np.array_equal(h1.numpy(), out)
            print(f"on {h1.device}: {'identical' if same else 'DIFFERENT'}")
            if not same:
                return 1
        print("stats:", {k: v for k, v in s.stats().items() if isinstance(v, int)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
