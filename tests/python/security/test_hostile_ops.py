"""Op attributes at their extremes, as a hostile or careless client sends them,
on every CPU-side backend: cpu:0, ref:0 and sim:0.

Oracles: the definition of the op evaluated with Python's unbounded ints (tril/triu with
a diagonal near the int64 limits, where torch 1.13 itself overflows), and torch 1.13
(clamp, and whether a value or a bound is refused at all).

- tril/triu keep column j of row i when j - i <= diagonal (tril) or >= diagonal (triu),
  whatever the diagonal: INT64_MAX/INT64_MIN must neither overflow nor differ by backend.
- clamp is min(max(x, min), max): min > max gives max everywhere; a NaN bound gives NaN
  (torch's two-bound clamp and clamp_min/clamp_max; torch 1.13's single-bound clamp()
  alone leaves values unchanged, a bug later torch versions fixed), a NaN input stays NaN;
  a bound the output dtype cannot hold is refused (INVALID_ARGUMENT naming it), as torch.
- creation ops refuse requires_grad on non-float dtypes (as Upload does); randint refuses
  bounds the dtype cannot hold; full, masked_fill and pad refuse a value the dtype cannot
  hold (NaN, +-Inf or out of range into integers, past the largest finite into floats);
  each a typed INVALID_ARGUMENT naming the attribute, told before anything runs.
"""

from __future__ import annotations

import numpy as np
import pytest

import tensordd

torch = pytest.importorskip("torch")

DEVICES = ("cpu:0", "ref:0", "sim:0")
I64_MAX, I64_MIN = 2**63 - 1, -(2**63)
NAN, INF = float("nan"), float("inf")


@pytest.fixture(scope="module")
def hd(sim_daemon):
    return sim_daemon


@pytest.fixture
def s(hd):
    sess = tensordd.connect(hd.endpoint, timeout=60)
    yield sess
    sess.close(raise_errors=False)


def expect_invalid(sess, argument):
    """The last request(s) failed with INVALID_ARGUMENT naming argument; the session lives."""
    with pytest.raises(tensordd.InvalidArgumentError) as info:
        sess.sync()
    assert info.value.argument == argument, str(info.value)
    assert sess.tensor(np.ones(2, np.float32)).numpy().tolist() == [1.0, 1.0]


def torch_raises(fn):
    try:
        fn()
    except RuntimeError:
        return True
    return False


# ---------------------------------------------------------------- item 9: tril/triu

DIAGONALS = (I64_MAX, I64_MIN, I64_MAX - 1, I64_MIN + 1, 2**62, -(2**62), 4, -4, 0)


def tri_oracle(shape, diagonal, upper):
    rows, cols = shape[-2], shape[-1]
    keep = np.array([[(j - i >= diagonal) if upper else (j - i <= diagonal)
                      for j in range(cols)] for i in range(rows)])
    return np.broadcast_to(keep, shape)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", ("tril", "triu"))
@pytest.mark.parametrize("diagonal", DIAGONALS, ids=str)
def test_tri_extreme_diagonal_matches_definition(s, device, op, diagonal):
    a = np.arange(1, 2 * 3 * 4 + 1, dtype=np.float32).reshape(2, 3, 4)
    x = s.tensor(a, device=device)
    got = s.op(op, x, diagonal=diagonal).numpy()
    want = np.where(tri_oracle(a.shape, diagonal, op == "triu"), a, 0)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("device", DEVICES)
def test_triu_int64_max_is_all_zero(s, device):
    # the reproduction: cpu gave [[0,0,0],[1,1,1],[1,1,1]]
    x = s.tensor(np.ones((3, 3), np.float32), device=device)
    assert s.op("triu", x, diagonal=I64_MAX).numpy().tolist() == [[0.0] * 3] * 3
    assert s.op("tril", x, diagonal=I64_MAX).numpy().tolist() == [[1.0] * 3] * 3


# ---------------------------------------------------------------- item 10: clamp

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ("float32", "float64", "int32", "int64", "float16", "bfloat16"))
@pytest.mark.parametrize("bounds", ((3.0, 1.0), (3, 1), (2, 2), (-1.5, -7)), ids=str)
def test_clamp_min_above_max_gives_max(s, device, dtype, bounds):
    lo, hi = bounds
    t = torch.arange(-5, 6).to(getattr(torch, dtype))
    if dtype in ("float16", "bfloat16"):  # numpy has no bfloat16: upload float32, cast there
        x = s.op("cast", s.tensor(t.float().numpy(), device=device), dtype=dtype)
    else:
        x = s.tensor(t.numpy(), device=device)
    if dtype == "float16":  # torch 1.13 has no float16 clamp on CPU: float32, rounded back
        want = torch.clamp(t.float(), min=lo, max=hi).half()
    else:
        want = torch.clamp(t, min=lo, max=hi)
    got = s.op("clamp", x, min=lo, max=hi)
    if dtype in ("float16", "bfloat16"):
        got = s.op("cast", got, dtype="float32")
        want = want.float()
    got = got.numpy()
    assert str(got.dtype) == str(want.numpy().dtype)
    np.testing.assert_array_equal(got, want.numpy())


@pytest.mark.parametrize("device", DEVICES)
def test_clamp_with_min_above_max_gives_max_as_torch(s, device):
    x = s.op("arange", end=4, device=device)
    assert s.op("clamp", x, min=3.0, max=1.0).numpy().tolist() == [1.0, 1.0, 1.0, 1.0]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ("float32", "float64", "int64"))
@pytest.mark.parametrize("bounds", (dict(min=NAN), dict(max=NAN), dict(min=0.0, max=NAN),
                                    dict(min=NAN, max=5.0), dict(min=NAN, max=NAN)), ids=str)
def test_clamp_nan_bound_gives_nan(s, device, dtype, bounds):
    t = torch.arange(-3, 4).to(getattr(torch, dtype))
    got = s.op("clamp", s.tensor(t.numpy(), device=device), **bounds).numpy()
    assert np.isnan(got).all(), got
    # the independent oracle: torch propagates a NaN bound (its two-bound clamp and
    # clamp_min/clamp_max; 1.13's one-bound clamp() is the exception)
    tt = t.float() if dtype == "int64" else t
    if "min" in bounds and "max" in bounds:
        assert torch.isnan(torch.clamp(tt, **bounds)).all()
    elif "min" in bounds:
        assert torch.isnan(torch.clamp_min(tt, bounds["min"])).all()
    else:
        assert torch.isnan(torch.clamp_max(tt, bounds["max"])).all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bounds", (dict(min=0.0, max=1.0), dict(min=3.0, max=1.0),
                                    dict(min=-INF), dict(max=INF), dict(min=INF),
                                    dict(min=-INF, max=-INF)), ids=str)
def test_clamp_nan_input_and_infinite_bounds_match_torch(s, device, bounds):
    a = np.array([NAN, -INF, -2.0, 0.5, 2.0, INF], np.float32)
    got = s.op("clamp", s.tensor(a, device=device), **bounds).numpy()
    want = torch.clamp(torch.from_numpy(a), **bounds).numpy()
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype,bound,argument", (
    ("int32", dict(min=2**40), "min"), ("int32", dict(max=-(2**40)), "max"),
    ("int32", dict(min=0, max=2**31), "max"), ("float32", dict(min=1e300), "min"),
    ("int64", dict(max=-1e300), "max")), ids=str)
def test_clamp_bound_the_dtype_cannot_hold_is_refused(s, device, dtype, bound, argument):
    t = torch.arange(4).to(getattr(torch, dtype))
    assert torch_raises(lambda: torch.clamp(t, **bound))
    s.op("clamp", s.tensor(t.numpy(), device=device), **bound)
    expect_invalid(s, argument)


@pytest.mark.parametrize("device", DEVICES)
def test_clamp_int64_limits_are_exact(s, device):
    t = torch.tensor([I64_MIN, -1, 0, 1, I64_MAX])
    x = s.tensor(t.numpy(), device=device)
    for b in (dict(min=I64_MAX), dict(max=I64_MIN), dict(min=I64_MAX, max=I64_MIN),
              dict(min=I64_MIN, max=I64_MAX), dict(min=-1, max=1)):
        np.testing.assert_array_equal(s.op("clamp", x, **b).numpy(),
                                      torch.clamp(t, **b).numpy(), err_msg=str(b))


# ---------------------------------------------------------------- item 11: dtype checks

GRAD_CASES = (  # (op, attributes, dtype, the same in torch)
    ("zeros", dict(shape=[2]), "int64", lambda: torch.zeros(2, dtype=torch.int64,
                                                            requires_grad=True)),
    ("ones", dict(shape=[2]), "int32", lambda: torch.ones(2, dtype=torch.int32,
                                                          requires_grad=True)),
    ("full", dict(shape=[2], value=1), None, lambda: torch.full((2,), 1, requires_grad=True)),
    ("full", dict(shape=[2], value=True), None, lambda: torch.full((2,), True,
                                                                   requires_grad=True)),
    ("arange", dict(end=3), None, lambda: torch.arange(3, requires_grad=True)),
    ("eye", dict(n=2), "bool", lambda: torch.eye(2, dtype=torch.bool, requires_grad=True)),
    ("randint", dict(high=5, shape=[3]), None, lambda: torch.randint(5, (3,),
                                                                     requires_grad=True)),
)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name,attrs,dtype,in_torch", GRAD_CASES, ids=lambda v: str(v))
def test_creation_requires_grad_on_non_float_is_refused(s, device, name, attrs, dtype, in_torch):
    assert torch_raises(in_torch)
    out = s.op(name, dtype=dtype, device=device, requires_grad=True, **attrs)
    expect_invalid(s, "requires_grad")
    with pytest.raises(tensordd.Error):  # the output is bound poisoned, nothing else
        out.numpy()


@pytest.mark.parametrize("device", DEVICES)
def test_creation_requires_grad_on_float_still_works(s, device):
    w = s.op("zeros", shape=[3], dtype="float32", device=device, requires_grad=True)
    loss = s.op("sum", s.op("mul", w, other=2.0))
    g = loss.backward().get(w).numpy()
    assert g.dtype == np.float32 and g.tolist() == [2.0, 2.0, 2.0]
    a = s.arange(3.0, device=device, requires_grad=True)
    assert a.numpy().dtype == np.float32


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("low,high,argument", ((-(2**40), 5, "low"), (0, 2**40, "high"),
                                               (-(2**31) - 1, 0, "low"), (0, 2**31 + 1, "high"),
                                               (I64_MIN + 1, 0, "low")), ids=str)
def test_randint_bounds_beyond_int32_are_refused(s, device, low, high, argument):
    assert torch_raises(lambda: torch.randint(low, high, (3,), dtype=torch.int32))
    s.op("randint", low=low, high=high, shape=[64], dtype="int32", device=device)
    expect_invalid(s, argument)


@pytest.mark.parametrize("device", DEVICES)
def test_randint_int32_at_its_limits_stays_in_range(s, device):
    v = s.op("randint", low=-(2**31), high=2**31, shape=[4096], dtype="int32",
             device=device).numpy()
    assert v.dtype == np.int32
    assert v.min() < -(2**29) and v.max() > 2**29  # draws spread over the whole range
    # and in float16 only what float16 holds
    s.op("randint", low=0, high=70000, shape=[4], dtype="float16", device=device)
    expect_invalid(s, "high")


FULL_BAD = (
    ("int64", NAN), ("int64", INF), ("int64", -INF), ("int64", 1e30), ("int64", 2.0**63),
    ("int32", NAN), ("int32", 2**40), ("int32", 2.0**31), ("int32", -(2**31) - 1),
    ("float32", 1e300), ("float16", 65520.0), ("float16", 1e10),
)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype,value", FULL_BAD, ids=str)
def test_full_value_the_dtype_cannot_hold_is_refused(s, device, dtype, value):
    if not (dtype == "int64" and value == 2.0**63):  # torch 1.13 wraps that one
        assert torch_raises(lambda: torch.full((2,), value, dtype=getattr(torch, dtype)))
    s.op("full", shape=[2], value=value, dtype=dtype, device=device)
    expect_invalid(s, "value")


FULL_OK = (
    ("int64", 1.5), ("int64", -1.5), ("int64", I64_MAX), ("int64", I64_MIN), ("int64", -(2.0**63)),
    ("int32", 2**31 - 1), ("int32", -(2**31)), ("bool", NAN), ("bool", 0.5), ("bool", 7),
    ("float16", INF), ("float32", NAN), ("float32", -INF), ("float32", float(I64_MAX)),
)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype,value", FULL_OK, ids=str)
def test_full_value_the_dtype_holds_matches_torch(s, device, dtype, value):
    got = s.op("full", shape=[3], value=value, dtype=dtype, device=device)
    if dtype == "float16":
        got = s.op("cast", got, dtype="float32")
    want = torch.full((3,), value, dtype=getattr(torch, dtype))
    if dtype == "float16":
        want = want.float()
    np.testing.assert_array_equal(got.numpy(), want.numpy())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype,value", (("int64", NAN), ("int32", 2**40), ("int32", -INF)), ids=str)
def test_masked_fill_and_pad_refuse_what_the_dtype_cannot_hold(s, device, dtype, value):
    t = torch.ones(4, dtype=getattr(torch, dtype))
    m = torch.tensor([True, False, True, False])
    assert torch_raises(lambda: t.masked_fill(m, value))
    assert torch_raises(lambda: torch.nn.functional.pad(t, (1, 1), value=value))
    x = s.tensor(t.numpy(), device=device)
    s.op("masked_fill", x, s.tensor(m.numpy(), device=device), value=value)
    expect_invalid(s, "value")
    s.op("pad", x, pad=[1, 1], value=value)
    expect_invalid(s, "value")
