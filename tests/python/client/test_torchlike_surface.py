"""The Tensor surface PyTorch users expect, checked against
torch 1.13 (and numpy) as the oracle.

repr()/str()/print() show the values as torch (downloaded on demand,
summarised for big tensors) with device, dtype and requires_grad
(test_python_repr.py holds the format to torch's and checks errors).
"""

from __future__ import annotations

import numpy as np
import pytest

import tensordd

torch = pytest.importorskip("torch")


def pair(session, x):
    return session.tensor(x), torch.tensor(x)


def same(t, ref, **kw):
    got = t.torch() if isinstance(t, tensordd.Tensor) else t
    assert got.dtype == ref.dtype, (got.dtype, ref.dtype)
    assert tuple(got.shape) == tuple(ref.shape)
    if ref.dtype.is_floating_point:
        torch.testing.assert_close(got, ref, **kw)
    else:
        assert torch.equal(got, ref)


X = np.array([[3.5, -1.0, 2.0], [0.5, 7.0, -4.25], [1.0, 1.0, 9.0]], np.float32)


def test_str_shows_values_like_torch(session):
    t = session.tensor(X, requires_grad=True)
    text = str(t)
    assert text.startswith("tensor([[ 3.5000") or text.startswith("tensor([[ 3.5")
    for v in ["-4.25", "9."]:
        assert v in text
    assert "device='cpu:0'" in text and "dtype=tensordd.float32" in text
    assert "requires_grad=True" in text
    assert str(session.tensor(np.array(5, np.int64))).startswith("tensor(5")
    big = session.zeros(100, 100)
    text = str(big)
    assert "..." in text and len(text) < 2000  # summarised as torch does
    assert f"{session.tensor(np.float32(1.25)):.1f}" == "1.2"
    y = t * 2
    assert repr(y) == str(y) and repr(y).startswith("tensor([[ 7.0000,")


def test_max_min(session):
    t, r = pair(session, X)
    same(t.max(), r.max())
    same(t.min(), r.min())
    for dim in (0, 1, -1):
        for keepdim in (False, True):
            v, i = t.max(dim, keepdim)
            rv, ri = r.max(dim, keepdim)
            same(v, rv)
            same(i, ri)
            res = t.min(dim=dim, keepdim=keepdim)
            rres = r.min(dim=dim, keepdim=keepdim)
            same(res.values, rres.values)
            same(res.indices, rres.indices)
    o, ro = pair(session, X[::-1].copy())
    same(t.max(o), r.max(ro))


def test_conversions(session):
    t, r = pair(session, X)
    same(t.half(), r.half())
    same(t.long(), r.long())
    same(t.int(), r.int())
    same(t.double(), r.double())
    same(t.bool(), r.bool())
    same(t.bfloat16(), r.bfloat16())
    c = session.tensor(X, device="cpu:1").cpu()
    assert c.device == "cpu:0"
    assert t.cpu() is t


@pytest.mark.parametrize("op", ["floordiv", "mod", "rpow", "rfloordiv", "rmod"])
def test_arithmetic_operators(session, op):
    a = np.array([7.0, -7.0, 5.5, -0.5], np.float32)
    b = np.array([2.0, 3.0, -2.0, 0.75], np.float32)
    ta, ra = pair(session, a)
    tb, rb = pair(session, b)
    f = {"floordiv": lambda x, y: (x // y, x // 2),
         "mod": lambda x, y: (x % y, x % 3),
         "rpow": lambda x, y: (2 ** x, 1.5 ** y),
         "rfloordiv": lambda x, y: (10 // y,),
         "rmod": lambda x, y: (10 % y,)}[op]
    for got, ref in zip(f(ta, tb), f(ra, rb)):
        same(got, ref)


def test_integer_floordiv_and_mod(session):
    a = np.array([7, -7, 9, -9, 0], np.int64)
    b = np.array([2, 2, -4, -4, 3], np.int64)
    ta, ra = pair(session, a)
    tb, rb = pair(session, b)
    same(ta // tb, torch.div(ra, rb, rounding_mode="floor"))
    same(ta // 2, torch.div(ra, 2, rounding_mode="floor"))
    same(ta % tb, ra % rb)
    same(2 ** session.tensor(np.array([0, 1, 5], np.int64)), 2 ** torch.tensor([0, 1, 5]))


def test_logical_operators(session):
    m = np.array([True, False, True, False])
    n = np.array([True, True, False, False])
    tm, rm = pair(session, m)
    tn, rn = pair(session, n)
    same(tm & tn, rm & rn)
    same(tm | tn, rm | rn)
    same(tm ^ tn, rm ^ rn)
    same(~tm, ~rm)
    same(tm & True, rm & True)
    with pytest.raises(TypeError, match="bool"):
        session.tensor(np.array([1, 2])) & session.tensor(np.array([3, 1]))
    session.sync()


def test_in_place_forms(session):
    t, r = pair(session, X)
    alias = t
    t += 1
    r += 1
    assert alias is t
    same(t, r)
    t.add_(2, alpha=3)
    r.add_(2, alpha=3)
    t.mul_(0.5)
    r.mul_(0.5)
    t -= session.tensor(X)
    r -= torch.tensor(X)
    t /= 4
    r /= 4
    t.clamp_(min=0.5)
    r.clamp_(min=0.5)
    same(t, r)
    same(t.zero_(), r.zero_())
    same(t.fill_(3.0), r.fill_(3.0))
    w = session.tensor(X, requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf"):
        w += 1
    with pytest.raises(RuntimeError, match="leaf"):
        w.add_(1)
    session.sync()
    np.testing.assert_array_equal(w.numpy(), X)  # unchanged


def test_requires_grad_(session):
    t = session.tensor(X)
    assert not t.requires_grad
    assert t.requires_grad_() is t
    assert t.requires_grad and t.is_leaf
    g = (t * t).sum().backward()
    np.testing.assert_allclose(g.get(t).numpy(), 2 * X)
    with pytest.raises(RuntimeError):
        session.tensor(np.array([1, 2])).requires_grad_()


def test_advanced_indexing(session):
    x = np.arange(24, dtype=np.float32).reshape(4, 3, 2)
    t, r = pair(session, x)
    y = t + 0  # shape unknown to the client
    ry = r + 0
    same(y[[0, 2, 3]], ry[[0, 2, 3]])
    same(y[[-1, 0]], ry[[-1, 0]])
    same(y[:, [2, 0]], ry[:, [2, 0]])
    same(y[np.array([[0, 1], [3, 3]])], ry[torch.tensor([[0, 1], [3, 3]])])
    idx = session.tensor(np.array([1, 1, 0]))
    same(y[idx], ry[torch.tensor([1, 1, 0])])
    same(y[..., [1]], ry[..., [1]])
    mask = x[:, 0, 0] > 5
    same(y[mask], ry[torch.tensor(mask)])
    same(y[t > 10], ry[r > 10])
    same(y[:, x[0, :, 0] > 1], ry[:, torch.tensor(x[0, :, 0] > 1)])
    same(y[(t > 4)[:, :, 0]], ry[(r > 4)[:, :, 0]])
    same(y.flip(0), ry.flip(0))
    same(y.flip(0, 2), ry.flip(0, 2))
    # negative steps: numpy's meaning (torch refuses them), the same as flip
    same(y[::-1], ry.flip(0))
    same(y[:, ::-2], ry.flip(1)[:, ::2])
    with pytest.raises(IndexError):
        y[[0, 4]]
    with pytest.raises(IndexError):
        y[np.array([True, False])]
    session.sync()


def test_scalar_protocols(session):
    t = session.tensor(np.array([[2.5]], np.float32))
    assert float(t) == 2.5 and int(t) == 2 and bool(t) is True
    i = session.tensor(np.array(3, np.int64))
    assert [10, 11, 12, 13][i] == 13 and list(range(i)) == [0, 1, 2]
    assert i.__index__() == 3
    with pytest.raises(TypeError):
        [1, 2][t]
    with pytest.raises(RuntimeError, match="ambiguous"):
        bool(session.tensor(np.ones(2, np.float32)))
    assert len(session.tensor(X)) == 3
    assert not bool(session.tensor(np.array([0.0], np.float32)))
