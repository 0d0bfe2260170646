"""A replay puts its inputs wherever a recorded request reads a handle, as the request
table's read column says (daemon/dispatch.c): an op's inputs, and a Backward's loss,
grad_output and inputs too. The oracle is numpy's gradient of the same expression at
each replay's input; a Backward left reading the recorded input would differentiate
the wrong tensor (or none).
"""

from __future__ import annotations

import numpy as np

import tensordd


def test_a_replayed_backward_reads_the_replay_inputs(session):
    rng = np.random.default_rng(11)
    wv = rng.standard_normal((3, 4)).astype(np.float32)
    xs = [rng.standard_normal((3, 4)).astype(np.float32) for _ in range(4)]
    w = session.tensor(wv)
    x0 = session.tensor(xs[0], requires_grad=True)
    with session.capture(x0) as g:
        loss = (x0 * x0 * w).sum()
        # Backward restricted to the graph's input: Backward.inputs names it
        gx = tensordd.autograd.backward(loss, inputs=[x0]).get(x0)
    np.testing.assert_allclose(gx.numpy(), 2 * xs[0] * wv, rtol=1e-6, atol=1e-6)
    for x in xs[1:]:
        xt = session.tensor(x, requires_grad=True)
        g.replay(xt)
        np.testing.assert_allclose(gx.numpy(), 2 * x * wv, rtol=1e-6, atol=1e-6)


def test_a_replayed_backward_reads_the_replay_grad_output(session):
    rng = np.random.default_rng(12)
    xv = rng.standard_normal(5).astype(np.float32)
    gos = [rng.standard_normal(5).astype(np.float32) for _ in range(3)]
    x = session.tensor(xv, requires_grad=True)
    go0 = session.tensor(gos[0])
    with session.capture(go0) as g:
        y = x * x
        gx = tensordd.autograd.backward(y, go0).get(x)
    np.testing.assert_allclose(gx.numpy(), 2 * xv * gos[0], rtol=1e-6, atol=1e-6)
    for go in gos[1:]:
        g.replay(go)
        np.testing.assert_allclose(gx.numpy(), 2 * xv * go, rtol=1e-6, atol=1e-6)
