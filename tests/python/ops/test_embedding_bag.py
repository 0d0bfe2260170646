"""Embedding_bag (forward, and the gradients of weight and per_sample_weights)
against torch 1.13,
and multinomial's draws: their law (chi-square), no repeats without replacement,
the same samples for the same seed, and the typed refusals.

embedding_bag: every mode x (1-D input with offsets, 2-D input, include_last_offset,
padding_idx, per_sample_weights, empty bags) on cpu:0 and ref:0 (in the GPU suites the
cases with offsets on cuda:0), forward and the
gradients of a weighted sum of the output, within rtol 1e-5, atol 1e-6
(float32; the daemon sums in double and rounds once, torch in float).

multinomial: the session's random stream is the daemon's (seeded per session), so a
fresh daemon answers the same session the same draws; the statistics are checked
on such a fixed stream, so the outcome is deterministic. Chi-square bound: the
0.999 quantile of the chi-square law with (categories - 1) degrees of freedom
(16.27 for 3, 20.52 for 5), which a correct sampler exceeds with probability 1e-3.
"""

from __future__ import annotations

import numpy as np
import pytest

import tensordd
from gpusuite import CUDA, host_and_cuda
from tensordd.nn import functional as F

torch = pytest.importorskip("torch")

RTOL, ATOL = 1e-5, 1e-6
RNG = np.random.default_rng(1414)
W = RNG.standard_normal((10, 5)).astype(np.float32)
IX = np.array([1, 2, 4, 5, 4, 3, 2, 9, 0, 7, 2], np.int64)
OFF = np.array([0, 4, 4, 9], np.int64)  # an empty bag, bags of 4, 5 and 2
CHI2_999 = {3: 16.27, 5: 20.52}


def _ours(s, device, input, offsets, psw):  # noqa: A002
    return (s.tensor(input, device=device), s.tensor(offsets, device=device)
            if offsets is not None else None,
            s.tensor(psw, device=device) if psw is not None else None)


CASES = [
    # (mode, input, offsets, include_last_offset, padding_idx, per_sample_weights)
    ("sum", IX, OFF, False, None, None),
    ("mean", IX, OFF, False, None, None),
    ("max", IX, OFF, False, None, None),
    ("mean", IX, OFF, False, 2, None),
    ("max", IX, OFF, False, -8, None),
    ("sum", IX, OFF, False, 4, RNG.standard_normal(11).astype(np.float32)),
    ("sum", IX, np.array([0, 3, 7, 11], np.int64), True, None,
     RNG.standard_normal(11).astype(np.float32)),
    ("sum", IX[:10].reshape(2, 5), None, False, 9, RNG.standard_normal((2, 5)).astype(np.float32)),
    ("mean", IX, np.array([0, 4, 4, 9, 11], np.int64), True, None, None),
    ("sum", IX[:10].reshape(2, 5), None, False, None, None),
    ("max", IX[:10].reshape(5, 2), None, False, 2, None),
    ("mean", np.array([2, 2, 3], np.int64), np.array([0, 2], np.int64), False, 2, None),
]


@pytest.mark.parametrize("case,device", host_and_cuda(
    [pytest.param(case, dev, id=f"{case}-{dev}") for dev in ("cpu:0", "ref:0")
     for case in range(len(CASES))],
    [pytest.param(case, CUDA, id=f"{case}-{CUDA}") for case in (0, 2, 3, 5, 6)]))
def test_embedding_bag_matches_torch(device_session, device, case):
    session = device_session
    mode, ix, off, last, pad, psw = CASES[case]
    w = session.tensor(W, device=device, requires_grad=True)
    i, o, p = _ours(session, device, ix, off, psw)
    if p is not None:
        p.requires_grad_()
    out = F.embedding_bag(i, w, o, mode=mode, per_sample_weights=p, include_last_offset=last,
                          padding_idx=pad)
    tw = torch.tensor(W, requires_grad=True)
    tp = torch.tensor(psw, requires_grad=True) if psw is not None else None
    tout = torch.nn.functional.embedding_bag(
        torch.tensor(ix), tw, torch.tensor(off) if off is not None else None, mode=mode,
        per_sample_weights=tp, include_last_offset=last, padding_idx=pad)
    np.testing.assert_allclose(out.numpy(), tout.detach().numpy(), rtol=RTOL, atol=ATOL)
    scale = RNG.standard_normal(tuple(tout.shape)).astype(np.float32)
    grads = (out * session.tensor(scale, device=device)).sum().backward()
    (tout * torch.tensor(scale)).sum().backward()
    np.testing.assert_allclose(grads.get(w).numpy(), tw.grad.numpy(), rtol=RTOL, atol=ATOL)
    if p is not None:  # per_sample_weights' gradient too
        np.testing.assert_allclose(grads.get(p).numpy(), tp.grad.numpy(), rtol=RTOL, atol=ATOL)


def test_embedding_bag_module(session):
    tensordd.nn.init_seed(3)
    m = tensordd.nn.EmbeddingBag(10, 5, mode="sum", padding_idx=1)
    t = torch.nn.EmbeddingBag(10, 5, mode="sum", padding_idx=1)
    with torch.no_grad():
        t.weight.copy_(torch.tensor(m.weight.numpy()))
    assert np.all(m.weight.numpy()[1] == 0)
    x = IX[:8].reshape(2, 4)
    np.testing.assert_allclose(m(session.tensor(x)).numpy(),
                               t(torch.tensor(x)).detach().numpy(), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("args,attrs,err,match", [
    ((IX, np.array([1, 4], np.int64)), {}, tensordd.InvalidArgumentError, "invalid argument"),
    ((IX, np.array([0, 6, 4], np.int64)), {}, tensordd.InvalidArgumentError, "invalid argument"),
    ((IX, np.array([0, 12], np.int64)), {}, tensordd.InvalidArgumentError, "invalid argument"),
    ((np.array([0, 10], np.int64), np.array([0], np.int64)), {}, tensordd.InvalidArgumentError,
     "invalid argument"),
    ((IX, OFF), {"mode": "min"}, tensordd.InvalidArgumentError, "mode"),
    ((IX, OFF), {"padding_idx": 10}, tensordd.InvalidArgumentError, "padding_idx"),
])
def test_embedding_bag_refusals(session, args, attrs, err, match):
    w = session.tensor(W)
    with pytest.raises(err, match=match):
        session.op("embedding_bag", session.tensor(args[0]), w, session.tensor(args[1]),
                   **attrs).numpy()
    with pytest.raises(tensordd.InvalidArgumentError, match="per_sample_weights"):
        F.embedding_bag(session.tensor(IX), w, session.tensor(OFF), mode="mean",
                        per_sample_weights=session.tensor(np.ones(11, np.float32))).numpy()
    assert session.tensor(np.ones(2, np.float32)).numpy().tolist() == [1.0, 1.0]


def _fresh_draws(start_daemon, fn):
    """fn(session) on the first session of a fresh daemon: the same stream every run."""
    d = start_daemon("--cpu-devices", "1")
    with tensordd.connect(d.endpoint) as s:
        return fn(s)


def _chi2(counts, p):
    expected = np.asarray(p) / np.sum(p) * np.sum(counts)
    return float(np.sum((counts - expected) ** 2 / expected))


@pytest.mark.parametrize("device", ["cpu:0", "ref:0"])
def test_multinomial_with_replacement_law_and_seed(start_daemon, device):
    p = np.array([0.1, 0.2, 0.3, 0.4], np.float32)

    def draw(s):
        x = s.tensor(np.tile(p * 7.0, (50, 1)), device=device)  # unnormalised weights
        return x.multinomial(80, replacement=True).numpy()

    a, b = _fresh_draws(start_daemon, draw), _fresh_draws(start_daemon, draw)
    np.testing.assert_array_equal(a, b)  # same seed, same samples, across runs
    assert a.shape == (50, 80) and a.dtype == np.int64
    counts = np.bincount(a.ravel(), minlength=4)
    assert _chi2(counts, p) < CHI2_999[3], counts


@pytest.mark.parametrize("device", ["cpu:0", "ref:0"])
def test_multinomial_without_replacement(start_daemon, device):
    p = np.array([0.05, 0.1, 0.15, 0.2, 0.0, 0.25, 0.25], np.float32)

    def draw(s):
        x = s.tensor(np.tile(p, (3000, 1)), device=device)
        one = s.tensor(p, device=device).multinomial(6).numpy()
        return x.multinomial(4).numpy(), one

    (a, one), (b, _) = _fresh_draws(start_daemon, draw), _fresh_draws(start_daemon, draw)
    np.testing.assert_array_equal(a, b)
    assert a.shape == (3000, 4) and one.shape == (6,)
    for row in list(a) + [one]:
        assert len(set(row.tolist())) == len(row)  # no repeats
    assert not np.any(a == 4) and 4 not in one  # a zero weight is never drawn
    assert sorted(one.tolist()) == [0, 1, 2, 3, 5, 6]  # every non-zero category, once
    # the first draw of each row follows p (the next ones, p without what was drawn)
    nz = p[p > 0]
    counts = np.bincount(a[:, 0], minlength=7)[p > 0]
    assert _chi2(counts, nz) < CHI2_999[5], counts


def test_multinomial_draws_differ_between_calls(session):
    x = session.tensor(np.ones(50, np.float32))
    assert not np.array_equal(x.multinomial(20).numpy(), x.multinomial(20).numpy())
    assert tensordd.multinomial(x, 3).numpy().shape == (3,)


@pytest.mark.parametrize("probs,k,repl,match", [
    ([0.5, -0.1, 0.6], 1, True, "invalid argument"),
    ([[0.5, 0.5], [0.0, 0.0]], 1, True, "invalid argument"),
    ([0.5, float("nan")], 1, False, "invalid argument"),
    ([0.5, float("inf")], 1, True, "invalid argument"),
    ([0.2, 0.3, 0.5], 4, False, "4 samples from 3 categories"),
    ([0.2, 0.0, 0.5], 3, False, "invalid argument"),  # fewer non-zero weights than samples
    ([0.2, 0.3], 0, True, "num_samples"),
    ([[[0.2]]], 1, True, "1-D or 2-D"),
])
def test_multinomial_refusals(session, probs, k, repl, match):
    x = session.tensor(np.array(probs, np.float32))
    with pytest.raises(tensordd.InvalidArgumentError, match=match):
        x.multinomial(k, replacement=repl).numpy()
    assert session.tensor(np.ones(2, np.float32)).numpy().tolist() == [1.0, 1.0]
