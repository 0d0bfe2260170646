"""The daemon's ops through the Python client against PyTorch.

Table-driven: every op of the daemon's op table (backends/ops.h) that PyTorch
has, on cpu:0 and ref:0 (cuda:0 in the GPU suites: a case the cuda backend declines,
typed, is skipped there), in float32 and float64 (plus int64 and bool where
PyTorch allows them), on random inputs from a numpy RNG seeded per case.
Each case runs the same computation through tensordd and through torch (on
tensors of the same dtype) and compares the output's dtype, shape and values.
Each op x dtype x device is its own test id.

Tolerances (assert_allclose: |got - want| <= atol + rtol * |want|):
  - exact ("exact"): integer and bool results, views, indexing, joins,
    comparisons, creation ops: bit-for-bit equal (assert_array_equal);
  - float32 elementwise: rtol 1e-5, atol 1e-6;
  - float64 elementwise: rtol 1e-10, atol 1e-12;
  - reductions, matmul, conv2d, norms and losses: the elementwise tolerance
    scaled by sqrt(K), K the number of terms summed per output element
    (matmul/linear: the inner size; conv2d: C_in/groups * kh * kw; a
    reduction: the reduced element count), to allow for a different
    summation order.
The reference is torch in the same dtype (torch CPU float32 is itself
rounded, so the float32 bounds hold both sides' rounding).

Random ops (rand, randn, randint, dropout in train mode) have no PyTorch
equivalent value and are left to the conformance suite; dropout in eval mode
(identity) is covered.
"""

from __future__ import annotations

import math
import zlib

import numpy as np
import pytest

from gpusuite import declines_skip, devices

torch = pytest.importorskip("torch")
FN = torch.nn.functional

DEVICES = devices("cpu:0", "ref:0")
F = ("float32", "float64")
FI = F + ("int64",)
FIB = FI + ("bool",)

# (rtol, atol) per dtype for one elementwise result; scaled by sqrt(K).
TOLS = {"float32": (1e-5, 1e-6), "float64": (1e-10, 1e-12),
        "float16": (1e-3, 1e-3), "bfloat16": (1e-2, 1e-2)}


# ---------------------------------------------------------------- input specs
# A spec is a callable (rng, dtype) -> np.ndarray. dtype is the test's dtype.

def R(*shape, lo=-2.0, hi=2.0):
    """Random values of the test dtype (ints in [-5, 5], bools half true)."""
    def make(rng, dt):
        if dt == "bool":
            return rng.random(shape) < 0.5
        if dt == "int64":
            return rng.integers(-5, 6, shape).astype(np.int64)
        return rng.uniform(lo, hi, shape).astype(dt)
    return make


def P(*shape):
    """Positive values of the test dtype (floats in [0.5, 2], ints in [1, 5])."""
    def make(rng, dt):
        if dt == "int64":
            return rng.integers(1, 6, shape).astype(np.int64)
        return rng.uniform(0.5, 2.0, shape).astype(dt)
    return make


def NZ(*shape):
    """Values away from zero (either sign): divisors."""
    def make(rng, dt):
        if dt == "int64":
            return (rng.integers(1, 6, shape) * rng.choice([-1, 1], shape)).astype(np.int64)
        return (rng.uniform(0.5, 2.0, shape) * rng.choice([-1.0, 1.0], shape)).astype(dt)
    return make


def EXPO(*shape):
    """Exponents: floats in [-2, 2], ints in [0, 3]."""
    def make(rng, dt):
        if dt == "int64":
            return rng.integers(0, 4, shape).astype(np.int64)
        return rng.uniform(-2.0, 2.0, shape).astype(dt)
    return make


def IDX(*shape, hi, lo=0):
    """int64 indices in [lo, hi), whatever the test dtype."""
    return lambda rng, dt: rng.integers(lo, hi, shape).astype(np.int64)


def MASK(*shape):
    """A bool mask, whatever the test dtype."""
    return lambda rng, dt: rng.random(shape) < 0.5


def FIXED(dtype, *shape):
    """Random values of a fixed dtype (for type-promotion cases)."""
    inner = R(*shape)
    return lambda rng, dt: inner(rng, dtype)


def CONST(values, dtype=None):
    """Given values (in the test dtype unless dtype says otherwise)."""
    return lambda rng, dt: np.array(values, dtype=dtype or dt)


# ---------------------------------------------------------------- the cases

class Case:
    """fn(session, *tensors) and tfn(*torch_tensors) compute the same thing;
    each returns a tensor or a tuple/list of tensors."""

    def __init__(self, name, inputs, fn, tfn, dtypes=F, k=1, exact=False, marks=()):
        self.name, self.inputs, self.fn, self.tfn = name, inputs, fn, tfn
        self.dtypes, self.k, self.exact, self.marks = dtypes, k, exact, marks


CASES: list[Case] = []


def case(*args, **kw):
    CASES.append(Case(*args, **kw))


# -- elementwise binary: tensor form with broadcasting, and the scalar form
BINARY = {
    # name: (torch fn, dtypes, input specs)
    "add": (torch.add, FIB, None),
    "sub": (torch.sub, FI, None),
    "mul": (torch.mul, FIB, None),
    "div": (torch.div, FI, (R(3, 1, 4), NZ(2, 4))),
    "pow": (torch.pow, FI, (P(3, 1, 4), EXPO(2, 4))),
    "maximum": (torch.maximum, FIB, None),
    "minimum": (torch.minimum, FIB, None),
    "remainder": (torch.remainder, FI, (R(3, 1, 4, lo=-6, hi=6), NZ(2, 4))),
    "eq": (torch.eq, FIB, None),
    "ne": (torch.ne, FIB, None),
    "lt": (torch.lt, FIB, None),
    "le": (torch.le, FIB, None),
    "gt": (torch.gt, FIB, None),
    "ge": (torch.ge, FIB, None),
    "logical_and": (torch.logical_and, FIB, None),
    "logical_or": (torch.logical_or, FIB, None),
    "logical_xor": (torch.logical_xor, FIB, None),
}
for _name, (_tf, _dts, _ins) in BINARY.items():
    case(f"{_name}-bcast", list(_ins or (R(3, 1, 4), R(2, 4))),
         lambda s, a, b, _n=_name: s.op(_n, a, b), lambda a, b, _t=_tf: _t(a, b), dtypes=_dts)
# equal shapes, non-broadcast (the fast contiguous path), and a 0-d operand
case("add-same", [R(5, 7), R(5, 7)], lambda s, a, b: a + b, lambda a, b: a + b, dtypes=FIB)
case("mul-0d", [R(4, 3), R()], lambda s, a, b: a * b, lambda a, b: a * b, dtypes=FI)
case("add-alpha", [R(3, 1, 4), R(2, 4)], lambda s, a, b: s.op("add", a, b, alpha=2.5),
     lambda a, b: torch.add(a, b, alpha=2.5))
case("sub-alpha", [R(3, 4), R(4)], lambda s, a, b: s.op("sub", a, b, alpha=-0.5),
     lambda a, b: torch.sub(a, b, alpha=-0.5))
case("add-alpha-int", [R(3, 4), R(4)], lambda s, a, b: s.op("add", a, b, alpha=3),
     lambda a, b: torch.add(a, b, alpha=3), dtypes=("int64",))
# scalar forms (attr "other"): a float scalar, and an int one that keeps ints integral
for _name, _tf, _other, _dts, _spec in [
        ("add", torch.add, 2.5, FIB, R), ("sub", torch.sub, 0.75, F, R),
        ("mul", torch.mul, -1.5, FIB, R), ("div", torch.div, 4.0, FIB, R),
        ("pow", torch.pow, 2.0, F, R), ("pow", torch.pow, 0.5, F, P),
        ("pow", torch.pow, -1.5, F, P), ("remainder", torch.remainder, 1.5, F, R),
        ("eq", torch.eq, 1.0, FI, R), ("ne", torch.ne, 1.0, FI, R),
        ("lt", torch.lt, 0.5, FIB, R), ("le", torch.le, 0.5, FI, R),
        ("gt", torch.gt, -0.25, FIB, R), ("ge", torch.ge, 0.0, FI, R),
        ("add", torch.add, 3, ("int64",), R), ("mul", torch.mul, 3, ("int64",), R),
        ("sub", torch.sub, 2, ("int64",), R), ("pow", torch.pow, 2, ("int64",), R),
        ("remainder", torch.remainder, 3, ("int64",), R),
        ("remainder", torch.remainder, -3, ("int64",), R),
        ("div", torch.div, 2, ("int64",), R)]:
    case(f"{_name}-scalar-{_other}", [_spec(3, 4)],
         lambda s, a, _n=_name, _o=_other: s.op(_n, a, other=_o),
         lambda a, _t=_tf, _o=_other: _t(a, _o), dtypes=_dts)
case("maximum-scalar", [R(3, 4)], lambda s, a: s.op("maximum", a, other=0.25),
     lambda a: torch.maximum(a, torch.tensor(0.25, dtype=a.dtype)))
case("minimum-scalar", [R(3, 4)], lambda s, a: s.op("minimum", a, other=-0.25),
     lambda a: torch.minimum(a, torch.tensor(-0.25, dtype=a.dtype)))
case("sub-scalar-alpha", [R(3, 4)], lambda s, a: s.op("sub", a, other=1.5, alpha=2.0),
     lambda a: torch.sub(a, 1.5, alpha=2.0))
# PyTorch's type promotion (dtype label "mixed": the specs fix the dtypes)
MIXED = ("mixed",)
for _n, _a, _b in [("f32+f64", FIXED("float32", 3, 4), FIXED("float64", 3, 4)),
                   ("i64+f32", FIXED("int64", 3, 4), FIXED("float32", 4)),
                   ("bool+i64", FIXED("bool", 3, 4), FIXED("int64", 3, 4)),
                   ("f32+0d-f64", FIXED("float32", 3, 4), FIXED("float64")),
                   ("i64+0d-f64", FIXED("int64", 3, 4), FIXED("float64")),
                   ("bool+0d-i64", FIXED("bool", 3, 4), FIXED("int64"))]:
    case(f"promote-{_n}", [_a, _b], lambda s, a, b: s.op("add", a, b),
         lambda a, b: torch.add(a, b), dtypes=MIXED)
case("promote-mul-f32-f64", [FIXED("float32", 2, 3), FIXED("float64", 3)],
     lambda s, a, b: a * b, lambda a, b: a * b, dtypes=MIXED)
case("promote-div-i64-i64", [FIXED("int64", 2, 3), CONST([1, 2, -4], "int64")],
     lambda s, a, b: a / b, lambda a, b: a / b, dtypes=MIXED)
case("promote-lt-i64-f64", [FIXED("int64", 2, 3), FIXED("float64", 3)],
     lambda s, a, b: a < b, lambda a, b: a < b, dtypes=MIXED)
case("promote-scalar-float-on-int", [FIXED("int64", 2, 3)],
     lambda s, a: s.op("mul", a, other=0.5), lambda a: a * 0.5, dtypes=MIXED)
case("where-bcast", [MASK(3, 1, 4), R(2, 4), R(3, 2, 1)],
     lambda s, c, a, b: s.op("where", c, a, b), torch.where, dtypes=FIB)
case("where-promote", [MASK(2, 3), FIXED("float32", 2, 3), FIXED("float64", 3)],
     lambda s, c, a, b: s.op("where", c, a, b), torch.where, dtypes=MIXED)
case("masked_fill", [R(3, 4), MASK(4)],
     lambda s, x, m: x.masked_fill(m, -7.5 if x.dtype.startswith("float") else 7),
     lambda x, m: x.masked_fill(m, -7.5 if x.dtype.is_floating_point else 7), dtypes=FI)
case("masked_fill-bool", [R(3, 4), MASK(3, 1)], lambda s, x, m: x.masked_fill(m, True),
     lambda x, m: x.masked_fill(m, True), dtypes=("bool",))

# -- unary
SQ = (3, 5)
UNARY = [
    # (id, name, attrs, torch fn, spec, dtypes)
    ("neg", "neg", {}, torch.neg, R, FI),
    ("abs", "abs", {}, torch.abs, R, FI),
    ("sign", "sign", {}, torch.sign, R, FI),
    ("exp", "exp", {}, torch.exp, R, FI),
    ("log", "log", {}, torch.log, P, FI),
    ("log1p", "log1p", {}, torch.log1p, P, FI),
    ("expm1", "expm1", {}, torch.expm1, R, FI),
    ("sqrt", "sqrt", {}, torch.sqrt, P, FI),
    ("rsqrt", "rsqrt", {}, torch.rsqrt, P, FI),
    ("sin", "sin", {}, torch.sin, R, FI),
    ("cos", "cos", {}, torch.cos, R, FI),
    ("tanh", "tanh", {}, torch.tanh, R, FI),
    ("sigmoid", "sigmoid", {}, torch.sigmoid, R, FI),
    ("relu", "relu", {}, torch.relu, R, FI),
    ("leaky_relu", "leaky_relu", {"negative_slope": 0.1},
     lambda x: FN.leaky_relu(x, 0.1), R, F),
    ("leaky_relu-default", "leaky_relu", {}, FN.leaky_relu, R, F),
    ("gelu", "gelu", {}, FN.gelu, R, F),
    ("gelu-tanh", "gelu", {"approximate": "tanh"}, lambda x: FN.gelu(x, approximate="tanh"),
     R, F),
    ("silu", "silu", {}, FN.silu, R, F),
    ("softplus", "softplus", {}, FN.softplus, R, F),
    ("softplus-beta-threshold", "softplus", {"beta": 2.0, "threshold": 1.5},
     lambda x: FN.softplus(x, beta=2.0, threshold=1.5), R, F),
    ("clamp", "clamp", {"min": -0.5, "max": 0.75}, lambda x: x.clamp(-0.5, 0.75), R, F),
    ("clamp-min", "clamp", {"min": 0.25}, lambda x: x.clamp(min=0.25), R, F),
    ("clamp-max", "clamp", {"max": -0.25}, lambda x: x.clamp(max=-0.25), R, F),
    ("clamp-int", "clamp", {"min": -2, "max": 3}, lambda x: x.clamp(-2, 3), R, ("int64",)),
    ("floor", "floor", {}, torch.floor, R, F),
    ("ceil", "ceil", {}, torch.ceil, R, F),
    ("round", "round", {}, torch.round, R, F),
    ("reciprocal", "reciprocal", {}, torch.reciprocal, NZ, FI),
    ("square", "square", {}, torch.square, R, FI),
    ("logical_not", "logical_not", {}, torch.logical_not, R, FIB),
]
for _id, _name, _attrs, _tf, _spec, _dts in UNARY:
    case(_id, [_spec(*SQ)], lambda s, x, _n=_name, _a=_attrs: s.op(_n, x, **_a),
         lambda x, _t=_tf: _t(x), dtypes=_dts)
# round half to even, floor/ceil of exact integers and halves
HALVES = [-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 3.5, -3.0, 0.0, 4.0, 0.49999997, -1.25]
for _n in ("round", "floor", "ceil"):
    case(f"{_n}-halves", [CONST(HALVES)], lambda s, x, _n=_n: s.op(_n, x),
         lambda x, _n=_n: getattr(torch, _n)(x))
case("activations-large", [CONST([-50.0, -20.0, -5.0, 0.0, 5.0, 20.0, 50.0])],
     lambda s, x: s.stack([x.sigmoid(), x.tanh(), x.softplus(), x.silu(), x.gelu(),
                           s.op("gelu", x, approximate="tanh"), x.exp().log1p()]),
     lambda x: torch.stack([x.sigmoid(), x.tanh(), FN.softplus(x), FN.silu(x), FN.gelu(x),
                            FN.gelu(x, approximate="tanh"), x.exp().log1p()]))

# -- reductions
X3 = (3, 4, 5)
for _name, _dts in [("sum", FIB), ("mean", F), ("amax", FIB), ("amin", FIB), ("prod", FI),
                    ("logsumexp", F)]:
    _tf = getattr(torch, _name)
    for _dim, _keep, _k in [(None, False, 60), ([1], False, 4), ([0, 2], True, 15),
                            ([-1], True, 5), ([2, 0, 1], False, 60)]:
        if _name == "logsumexp" and _dim is None:
            continue  # torch.logsumexp needs dims
        if _name == "prod" and _dim is not None and len(_dim) > 1:
            continue  # torch.prod takes one dim
        _id = f"{_name}-{'all' if _dim is None else 'dim' + '_'.join(map(str, _dim))}" + \
            ("-keep" if _keep else "")
        if _dim is None:
            _t = (lambda x, _t=_tf: _t(x))
        elif _name == "prod":
            _t = (lambda x, _t=_tf, _d=_dim, _kp=_keep: _t(x, _d[0], keepdim=_kp))
        else:
            _t = (lambda x, _t=_tf, _d=_dim, _kp=_keep: _t(x, dim=_d, keepdim=_kp))
        _spec = (lambda *sh: (lambda rng, dt: (rng.uniform(0.7, 1.3, sh).astype(dt)
                                               if dt != "int64" else
                                               rng.integers(-2, 3, sh).astype(np.int64)))) \
            if _name == "prod" else R
        case(_id, [_spec(*X3)],
             lambda s, x, _n=_name, _d=_dim, _kp=_keep:
             s.op(_n, x, dim=_d, keepdim=_kp if _d is not None else None),
             _t, dtypes=_dts, k=_k)
for _name in ("var", "std"):
    _tf = getattr(torch, _name)
    for _dim, _corr, _keep, _k in [(None, 1, False, 60), ([1], 0, False, 4),
                                   ([0, 2], 2, True, 15), ([-1], 1, True, 5)]:
        _id = f"{_name}-{'all' if _dim is None else 'dim' + '_'.join(map(str, _dim))}" \
              f"-corr{_corr}" + ("-keep" if _keep else "")
        case(_id, [R(*X3)],
             lambda s, x, _n=_name, _d=_dim, _c=_corr, _kp=_keep:
             s.op(_n, x, dim=_d, correction=_c, keepdim=_kp if _d is not None else None),
             lambda x, _t=_tf, _d=_dim, _c=_corr, _kp=_keep:
             _t(x, dim=_d, correction=_c, keepdim=_kp), k=_k)
    # the client's unbiased= spelling
    case(f"{_name}-unbiased-false", [R(4, 6)],
         lambda s, x, _n=_name: getattr(x, _n)(dim=1, unbiased=False),
         lambda x, _n=_name: getattr(x, _n)(dim=1, unbiased=False), k=6)
for _name in ("argmax", "argmin"):
    _tf = getattr(torch, _name)
    case(f"{_name}-flat", [R(*X3)], lambda s, x, _n=_name: s.op(_n, x),
         lambda x, _t=_tf: _t(x), dtypes=F)
    case(f"{_name}-dim1", [R(*X3)], lambda s, x, _n=_name: s.op(_n, x, dim=1),
         lambda x, _t=_tf: _t(x, dim=1), dtypes=F)
    case(f"{_name}-dim-1-keep", [R(*X3)], lambda s, x, _n=_name: s.op(_n, x, dim=-1, keepdim=True),
         lambda x, _t=_tf: _t(x, dim=-1, keepdim=True), dtypes=F)
# ties: PyTorch returns the first index of the extreme
case("argmax-ties", [CONST([[1, 3, 3, 0], [2, 2, 2, 2]], "int64")],
     lambda s, x: s.op("argmax", x, dim=1), lambda x: x.argmax(dim=1), dtypes=MIXED)
case("argmin-ties", [CONST([[1, 0, 3, 0], [2, 2, 2, 2]], "int64")],
     lambda s, x: s.op("argmin", x, dim=1), lambda x: x.argmin(dim=1), dtypes=MIXED)
for _d in (0, 1, -1):
    case(f"cumsum-dim{_d}", [R(*X3)], lambda s, x, _d=_d: x.cumsum(_d),
         lambda x, _d=_d: x.cumsum(_d), dtypes=FIB, k=5)
for _name, _tf in [("softmax", torch.softmax), ("log_softmax", torch.log_softmax)]:
    for _d in (0, 1, -1):
        case(f"{_name}-dim{_d}", [R(*X3, lo=-5, hi=5)], lambda s, x, _n=_name, _d=_d:
             s.op(_n, x, dim=_d), lambda x, _t=_tf, _d=_d: _t(x, _d), k=5)
case("softmax-large", [CONST([[1000.0, 999.0, -1000.0], [-1e4, -1e4 + 1, -1e4 + 2]])],
     lambda s, x: s.stack([x.softmax(1), x.log_softmax(1)]),
     lambda x: torch.stack([x.softmax(1), x.log_softmax(1)]), k=3)
case("logsumexp-large", [CONST([[1000.0, 999.0, -1000.0], [-1e4, -1e4 + 1, -1e4 + 2]])],
     lambda s, x: x.logsumexp(1), lambda x: x.logsumexp(1), k=3)

# -- linear algebra (k = inner size)
for _id, _a, _b, _k in [("1d-1d", (7,), (7,), 7), ("2d-1d", (3, 7), (7,), 7),
                        ("1d-2d", (7,), (7, 4), 7), ("2d-2d", (5, 16), (16, 6), 16),
                        ("batched-3d-2d", (2, 3, 8), (8, 4), 8),
                        ("batched-2d-3d", (3, 8), (2, 8, 4), 8),
                        ("batched-bcast", (2, 1, 3, 6), (5, 6, 4), 6),
                        ("batched-1d", (2, 3, 6), (6,), 6), ("1d-batched", (6,), (2, 6, 3), 6),
                        ("large", (33, 130), (130, 40), 130)]:
    case(f"matmul-{_id}", [R(*_a), R(*_b)], lambda s, a, b: a @ b, lambda a, b: a @ b,
         dtypes=FI, k=_k)
case("bmm", [R(4, 3, 9), R(4, 9, 5)], lambda s, a, b: a.bmm(b), torch.bmm, dtypes=FI, k=9)
case("linear-bias", [R(6, 10), R(4, 10), R(4)], lambda s, x, w, b: s.op("linear", x, w, b),
     FN.linear, k=10)
case("linear-nobias", [R(6, 10), R(4, 10)], lambda s, x, w: s.op("linear", x, w),
     FN.linear, k=10)
case("linear-3d", [R(2, 3, 10), R(4, 10), R(4)], lambda s, x, w, b: s.op("linear", x, w, b),
     FN.linear, k=10)
case("linear-1d", [R(10), R(4, 10), R(4)], lambda s, x, w, b: s.op("linear", x, w, b),
     FN.linear, k=10)
case("linear-1d-weight", [R(3, 10), R(10)], lambda s, x, w: s.op("linear", x, w),
     FN.linear, k=10)

# -- views (exact) and ops on non-contiguous views
V = (2, 3, 4)
VIEWS = [
    ("transpose", lambda s, x: x.transpose(0, 2), lambda x: x.transpose(0, 2)),
    ("transpose-neg", lambda s, x: x.transpose(-1, -2), lambda x: x.transpose(-1, -2)),
    ("permute", lambda s, x: x.permute(2, 0, 1), lambda x: x.permute(2, 0, 1)),
    ("reshape", lambda s, x: x.reshape(4, -1), lambda x: x.reshape(4, -1)),
    ("reshape-of-transposed", lambda s, x: x.transpose(0, 1).reshape(6, 4),
     lambda x: x.transpose(0, 1).reshape(6, 4)),
    ("view", lambda s, x: x.view(6, 4), lambda x: x.view(6, 4)),
    ("flatten", lambda s, x: x.flatten(), lambda x: x.flatten()),
    ("flatten-1-2", lambda s, x: x.flatten(1, 2), lambda x: x.flatten(1, 2)),
    ("unsqueeze", lambda s, x: x.unsqueeze(1), lambda x: x.unsqueeze(1)),
    ("unsqueeze-neg", lambda s, x: x.unsqueeze(-1), lambda x: x.unsqueeze(-1)),
    ("squeeze-all", lambda s, x: x.reshape(2, 1, 3, 1, 4).squeeze(),
     lambda x: x.reshape(2, 1, 3, 1, 4).squeeze()),
    ("squeeze-dim", lambda s, x: x.reshape(2, 1, 3, 1, 4).squeeze(3),
     lambda x: x.reshape(2, 1, 3, 1, 4).squeeze(3)),
    ("squeeze-nonone", lambda s, x: x.squeeze(0), lambda x: x.squeeze(0)),
    ("expand", lambda s, x: x[:, 1:2].expand(2, 5, 4), lambda x: x[:, 1:2].expand(2, 5, 4)),
    ("expand-new-dims", lambda s, x: x.expand(3, -1, -1, -1), lambda x: x.expand(3, -1, -1, -1)),
    ("slice", lambda s, x: x[:, 1:3, ::2], lambda x: x[:, 1:3, ::2]),
    ("slice-op", lambda s, x: s.op("slice", x, dim=2, start=1, stop=4, step=2),
     lambda x: x[:, :, 1:4:2]),
    ("slice-neg", lambda s, x: s.op("slice", x, dim=-1, start=-3, stop=-1),
     lambda x: x[..., -3:-1]),
    ("slice-past-end", lambda s, x: s.op("slice", x, dim=1, start=1, stop=100),
     lambda x: x[:, 1:100]),
    ("index-int", lambda s, x: x[1, :, 2], lambda x: x[1, :, 2]),
    ("index-none-ellipsis", lambda s, x: x[None, ..., 1], lambda x: x[None, ..., 1]),
    ("contiguous-of-permuted", lambda s, x: x.permute(1, 2, 0).contiguous(),
     lambda x: x.permute(1, 2, 0).contiguous()),
    ("clone-of-sliced", lambda s, x: x[:, ::2].clone(), lambda x: x[:, ::2].clone()),
    ("split", lambda s, x: x.split(2, dim=2), lambda x: x.split(2, dim=2)),
    ("split-uneven", lambda s, x: x.split(2, dim=1), lambda x: x.split(2, dim=1)),
    ("split-sizes", lambda s, x: x.split([1, 3], dim=-1), lambda x: x.split([1, 3], dim=-1)),
    ("chunk", lambda s, x: x.chunk(3, dim=1), lambda x: x.chunk(3, dim=1)),
    ("chunk-uneven", lambda s, x: x.chunk(3, dim=2), lambda x: x.chunk(3, dim=2)),
    ("split-of-transposed", lambda s, x: x.transpose(0, 2).split(3, dim=0),
     lambda x: x.transpose(0, 2).split(3, dim=0)),
]
for _id, _fn, _tf in VIEWS:
    case(_id, [R(*V)], _fn, _tf, dtypes=FIB, exact=True)
# ops on non-contiguous views: transposed, sliced with steps, expanded, permuted
NC = [
    ("exp-of-transposed", lambda s, x: x.transpose(0, 2).exp(), lambda x: x.transpose(0, 2).exp(),
     1),
    ("add-transposed-sliced",
     lambda s, x: x.transpose(1, 2)[:, ::2] + x[:1].transpose(1, 2)[:, 1:3],
     lambda x: x.transpose(1, 2)[:, ::2] + x[:1].transpose(1, 2)[:, 1:3], 1),
    ("mul-expanded", lambda s, x: x[:, :1].expand(2, 3, 4) * x.permute(0, 1, 2),
     lambda x: x[:, :1].expand(2, 3, 4) * x, 1),
    ("sum-of-permuted", lambda s, x: x.permute(2, 0, 1).sum(dim=(1, 2)),
     lambda x: x.permute(2, 0, 1).sum(dim=(1, 2)), 6),
    ("amax-of-sliced", lambda s, x: x[:, ::2, 1:].amax(dim=-1),
     lambda x: x[:, ::2, 1:].amax(dim=-1), 3),
    ("softmax-of-transposed", lambda s, x: x.transpose(0, 2).softmax(1),
     lambda x: x.transpose(0, 2).softmax(1), 3),
    ("cumsum-of-transposed", lambda s, x: x.transpose(1, 2).cumsum(2),
     lambda x: x.transpose(1, 2).cumsum(2), 3),
    ("matmul-transposed", lambda s, x: x.transpose(1, 2) @ x,
     lambda x: x.transpose(1, 2) @ x, 3),
    ("matmul-sliced", lambda s, x: x[:, ::2, :] @ x[0].t()[:, ::2],
     lambda x: x[:, ::2, :] @ x[0].t()[:, ::2], 4),
    ("bmm-transposed", lambda s, x: x.bmm(x.transpose(1, 2)),
     lambda x: x.bmm(x.transpose(1, 2)), 4),
    ("linear-strided",
     lambda s, x: s.op("linear", x.transpose(1, 2)[0], x[:, :, 0], x[0, 0, 1:3]),
     lambda x: FN.linear(x.transpose(1, 2)[0], x[:, :, 0], x[0, 0, 1:3]), 3),
    ("cat-of-views", lambda s, x: s.cat([x.transpose(1, 2), x[:, :, ::2].transpose(1, 2)], 1),
     lambda x: torch.cat([x.transpose(1, 2), x[:, :, ::2].transpose(1, 2)], 1), 1),
    ("where-of-views", lambda s, x: s.op("where", x.permute(2, 1, 0) > 0, x.permute(2, 1, 0),
                                          x[:1].permute(2, 1, 0)),
     lambda x: torch.where(x.permute(2, 1, 0) > 0, x.permute(2, 1, 0), x[:1].permute(2, 1, 0)),
     1),
    ("cast-of-transposed", lambda s, x: x.transpose(0, 1).to("float64"),
     lambda x: x.transpose(0, 1).to(torch.float64), 1),
    ("gather-of-transposed", lambda s, x: x.transpose(1, 2).gather(
        1, s.tensor(np.array([[[0, 2, 1], [3, 3, 0]]] * 2), device=x.device)),
     lambda x: x.transpose(1, 2).gather(1, torch.tensor([[[0, 2, 1], [3, 3, 0]]] * 2)), 1),
    ("layer_norm-of-transposed", lambda s, x: s.op("layer_norm", x.transpose(1, 2),
                                                    normalized_shape=[3]),
     lambda x: FN.layer_norm(x.transpose(1, 2), [3]), 3),
]
for _id, _fn, _tf, _k in NC:
    case(_id, [R(*V)], _fn, _tf, k=_k)

# -- joins and indexing
case("cat", [R(2, 3), R(4, 3), R(1, 3)], lambda s, a, b, c: s.cat([a, b, c]),
     lambda a, b, c: torch.cat([a, b, c]), dtypes=FIB, exact=True)
case("cat-dim-1", [R(2, 3), R(2, 1), R(2, 2)], lambda s, a, b, c: s.cat([a, b, c], -1),
     lambda a, b, c: torch.cat([a, b, c], -1), dtypes=FIB, exact=True)
case("cat-one", [R(2, 3)], lambda s, a: s.cat([a], 1), lambda a: torch.cat([a], 1),
     dtypes=F, exact=True)
case("stack", [R(2, 3), R(2, 3), R(2, 3)], lambda s, a, b, c: s.stack([a, b, c]),
     lambda a, b, c: torch.stack([a, b, c]), dtypes=FIB, exact=True)
case("stack-dim2", [R(2, 3), R(2, 3)], lambda s, a, b: s.stack([a, b], 2),
     lambda a, b: torch.stack([a, b], 2), dtypes=FIB, exact=True)
case("stack-dim-1", [R(4), R(4)], lambda s, a, b: s.stack([a, b], -1),
     lambda a, b: torch.stack([a, b], -1), dtypes=F, exact=True)
case("gather-dim0", [R(4, 5), IDX(3, 5, hi=4)], lambda s, x, i: x.gather(0, i),
     lambda x, i: x.gather(0, i), dtypes=FIB, exact=True)
case("gather-dim1-small", [R(4, 5), IDX(4, 2, hi=5)], lambda s, x, i: x.gather(1, i),
     lambda x, i: x.gather(1, i), dtypes=FIB, exact=True)
case("gather-3d", [R(2, 3, 4), IDX(2, 2, 4, hi=3)], lambda s, x, i: x.gather(-2, i),
     lambda x, i: x.gather(-2, i), dtypes=F, exact=True)
case("scatter_add-dim0", [R(4, 5), IDX(6, 5, hi=4), R(6, 5)],
     lambda s, x, i, src: s.op("scatter_add", x, i, src, dim=0),
     lambda x, i, src: x.scatter_add(0, i, src), dtypes=FI, k=6)
case("scatter_add-dim1-smaller", [R(3, 5), IDX(2, 7, hi=5), R(3, 8)],
     lambda s, x, i, src: s.op("scatter_add", x, i, src, dim=1),
     lambda x, i, src: x.scatter_add(1, i, src), dtypes=FI, k=7)
case("index_select-dim0", [R(5, 3), IDX(7, hi=5)], lambda s, x, i: x.index_select(0, i),
     lambda x, i: x.index_select(0, i), dtypes=FIB, exact=True)
case("index_select-dim1", [R(2, 5, 3), IDX(4, hi=5)], lambda s, x, i: x.index_select(1, i),
     lambda x, i: x.index_select(1, i), dtypes=FIB, exact=True)
case("index-with-tensor", [R(5, 3), IDX(4, hi=5)], lambda s, x, i: x[i], lambda x, i: x[i],
     dtypes=F, exact=True)
case("one_hot", [IDX(2, 5, hi=6)], lambda s, i: s.op("one_hot", i, num_classes=6),
     lambda i: FN.one_hot(i, 6), dtypes=MIXED, exact=True)
for _n in ("tril", "triu"):
    for _dg in (0, 1, -2):
        case(f"{_n}-diag{_dg}", [R(2, 4, 5)],
             lambda s, x, _n=_n, _dg=_dg: s.op(_n, x, diagonal=_dg),
             lambda x, _n=_n, _dg=_dg: getattr(torch, _n)(x, _dg), dtypes=FIB, exact=True)
for _pad, _val in [([1, 2], 0.0), ([0, 1, 2, 0], -1.5), ([1, 1, 0, 0, 2, 1], 0.0),
                   ([-1, 2], 0.0)]:
    case(f"pad-{'_'.join(map(str, _pad))}-v{_val}", [R(2, 3, 4)],
         lambda s, x, _p=_pad, _v=_val: s.op("pad", x, pad=_p, value=_v),
         lambda x, _p=_pad, _v=_val: FN.pad(x, _p, value=_v), exact=True)
case("pad-int", [R(2, 3)], lambda s, x: s.op("pad", x, pad=[1, 1, 1, 0], value=7),
     lambda x: FN.pad(x, [1, 1, 1, 0], value=7), dtypes=("int64",), exact=True)
case("embedding", [IDX(3, 4, hi=6), R(6, 5)], lambda s, i, w: s.op("embedding", i, w),
     lambda i, w: FN.embedding(i, w), exact=True)
case("embedding-1d", [IDX(7, hi=6), R(6, 5)], lambda s, i, w: s.op("embedding", i, w),
     lambda i, w: FN.embedding(i, w), exact=True)
for _to in ("float32", "float64", "int64", "bool"):
    case(f"cast-to-{_to}", [R(3, 4, lo=-4, hi=4)],
         lambda s, x, _to=_to: x.to(dtype=_to), lambda x, _to=_to: x.to(getattr(torch, _to)),
         dtypes=FIB, exact=True)
case("dropout-eval", [R(3, 4)], lambda s, x: s.op("dropout", x, p=0.5, train=False),
     lambda x: FN.dropout(x, 0.5, training=False), exact=True)
case("dropout-p0", [R(3, 4)], lambda s, x: s.op("dropout", x, p=0.0),
     lambda x: FN.dropout(x, 0.0, training=True), exact=True)

# -- nn
LOGITS = (6, 5)
for _red in ("mean", "sum", "none"):
    case(f"cross_entropy-{_red}", [R(*LOGITS, lo=-3, hi=3), IDX(6, hi=5)],
         lambda s, x, t, _r=_red: s.op("cross_entropy", x, t, reduction=_r),
         lambda x, t, _r=_red: FN.cross_entropy(x, t, reduction=_r), k=30)
    case(f"cross_entropy-{_red}-ignore-smooth",
         [R(*LOGITS, lo=-3, hi=3), CONST([1, -100, 4, 0, -100, 2], "int64")],
         lambda s, x, t, _r=_red: s.op("cross_entropy", x, t, reduction=_r,
                                       label_smoothing=0.1),
         lambda x, t, _r=_red: FN.cross_entropy(x, t, reduction=_r, label_smoothing=0.1), k=30)
    case(f"nll_loss-{_red}", [R(*LOGITS, lo=-3, hi=0), IDX(6, hi=5)],
         lambda s, x, t, _r=_red: s.op("nll_loss", x, t, reduction=_r),
         lambda x, t, _r=_red: FN.nll_loss(x, t, reduction=_r), k=6)
    case(f"mse_loss-{_red}", [R(3, 4), R(3, 4)],
         lambda s, x, y, _r=_red: s.op("mse_loss", x, y, reduction=_r),
         lambda x, y, _r=_red: FN.mse_loss(x, y, reduction=_r), k=12)
    case(f"bce_with_logits-{_red}", [R(3, 4, lo=-4, hi=4), R(3, 4, lo=0, hi=1)],
         lambda s, x, y, _r=_red: s.op("binary_cross_entropy_with_logits", x, y, reduction=_r),
         lambda x, y, _r=_red: FN.binary_cross_entropy_with_logits(x, y, reduction=_r), k=12)
case("cross_entropy-ignore_index-custom", [R(*LOGITS), CONST([1, 3, 3, 0, 2, 3], "int64")],
     lambda s, x, t: s.op("cross_entropy", x, t, ignore_index=3),
     lambda x, t: FN.cross_entropy(x, t, ignore_index=3), k=30)
case("cross_entropy-smooth-sum", [R(*LOGITS), IDX(6, hi=5)],
     lambda s, x, t: s.op("cross_entropy", x, t, reduction="sum", label_smoothing=0.3),
     lambda x, t: FN.cross_entropy(x, t, reduction="sum", label_smoothing=0.3), k=30)
case("cross_entropy-1d", [R(5), CONST(3, "int64")],
     lambda s, x, t: s.op("cross_entropy", x, t), lambda x, t: FN.cross_entropy(x, t), k=5)
case("cross_entropy-large-logits", [CONST([[1000.0, 0.0, -1000.0], [-500.0, 500.0, 499.0]]),
                                    CONST([2, 1], "int64")],
     lambda s, x, t: s.op("cross_entropy", x, t, reduction="none"),
     lambda x, t: FN.cross_entropy(x, t, reduction="none"), k=3)
case("nll_loss-ignore", [R(*LOGITS, lo=-3, hi=0), CONST([1, -100, 4, 0, -100, 2], "int64")],
     lambda s, x, t: s.op("nll_loss", x, t), lambda x, t: FN.nll_loss(x, t), k=6)
case("bce_with_logits-extreme", [CONST([-100.0, -30.0, 0.0, 30.0, 100.0]),
                                 CONST([0.0, 1.0, 0.5, 0.0, 1.0])],
     lambda s, x, y: s.op("binary_cross_entropy_with_logits", x, y, reduction="none"),
     lambda x, y: FN.binary_cross_entropy_with_logits(x, y, reduction="none"))
case("layer_norm-affine", [R(4, 6), R(6), R(6)],
     lambda s, x, w, b: s.op("layer_norm", x, w, b, normalized_shape=[6]),
     lambda x, w, b: FN.layer_norm(x, [6], w, b), k=6)
case("layer_norm-plain", [R(4, 6)], lambda s, x: s.op("layer_norm", x, normalized_shape=[6]),
     lambda x: FN.layer_norm(x, [6]), k=6)
case("layer_norm-weight-only", [R(4, 6), R(6)],
     lambda s, x, w: s.op("layer_norm", x, w, normalized_shape=[6]),
     lambda x, w: FN.layer_norm(x, [6], w), k=6)
case("layer_norm-2dims-eps", [R(2, 3, 4, 5), R(4, 5), R(4, 5)],
     lambda s, x, w, b: s.op("layer_norm", x, w, b, normalized_shape=[4, 5], eps=1e-3),
     lambda x, w, b: FN.layer_norm(x, [4, 5], w, b, eps=1e-3), k=20)
CONV = [
    # (id, x shape, w shape, bias, attrs)
    ("basic", (2, 3, 7, 6), (4, 3, 3, 3), True, {}),
    ("nobias", (2, 3, 7, 6), (4, 3, 3, 2), False, {}),
    ("stride2-pad1", (2, 3, 8, 7), (5, 3, 3, 3), True, {"stride": 2, "padding": 1}),
    ("stride-pad-pairs", (1, 2, 9, 8), (3, 2, 3, 2), True,
     {"stride": [2, 1], "padding": [1, 2]}),
    ("dilation", (2, 2, 9, 9), (3, 2, 3, 3), True, {"dilation": 2, "padding": 2}),
    ("groups2", (2, 4, 6, 6), (6, 2, 3, 3), True, {"groups": 2, "padding": 1}),
    ("depthwise", (2, 3, 6, 5), (3, 1, 3, 3), True, {"groups": 3}),
    ("1x1", (2, 5, 4, 4), (3, 5, 1, 1), False, {}),
    ("3d-input", (3, 6, 5), (2, 3, 3, 3), True, {"padding": 1}),
    ("all", (2, 4, 10, 9), (4, 2, 3, 2), True,
     {"stride": [2, 3], "padding": [2, 1], "dilation": [2, 1], "groups": 2}),
]
for _id, _xs, _ws, _bias, _at in CONV:
    _k = _ws[1] * _ws[2] * _ws[3]
    _ins = [R(*_xs), R(*_ws)] + ([R(_ws[0])] if _bias else [])
    case(f"conv2d-{_id}", _ins, lambda s, *t, _a=_at: s.op("conv2d", *t, **_a),
         lambda *t, _a=_at: FN.conv2d(*t, **_a), k=_k)
POOL = [
    ("k2", {"kernel_size": 2}),
    ("k3-s2-p1", {"kernel_size": 3, "stride": 2, "padding": 1}),
    ("k-pairs", {"kernel_size": [3, 2], "stride": [2, 1], "padding": [1, 0]}),
    ("ceil", {"kernel_size": 3, "stride": 2, "ceil_mode": True}),
    ("ceil-pad", {"kernel_size": 2, "stride": 2, "padding": 1, "ceil_mode": True}),
]
for _id, _at in POOL:
    case(f"max_pool2d-{_id}", [R(2, 3, 7, 6)], lambda s, x, _a=_at: s.op("max_pool2d", x, **_a),
         lambda x, _a=_at: FN.max_pool2d(x, **_a), exact=True)
    case(f"avg_pool2d-{_id}", [R(2, 3, 7, 6)], lambda s, x, _a=_at: s.op("avg_pool2d", x, **_a),
         lambda x, _a=_at: FN.avg_pool2d(x, **_a), k=9)
    if "padding" in _at:
        case(f"avg_pool2d-{_id}-exclude-pad", [R(2, 3, 7, 6)],
             lambda s, x, _a=_at: s.op("avg_pool2d", x, count_include_pad=False, **_a),
             lambda x, _a=_at: FN.avg_pool2d(x, count_include_pad=False, **_a), k=9)
case("max_pool2d-dilation", [R(2, 2, 9, 8)],
     lambda s, x: s.op("max_pool2d", x, kernel_size=2, dilation=2, padding=1),
     lambda x: FN.max_pool2d(x, 2, dilation=2, padding=1), exact=True)
case("max_pool2d-indices", [R(2, 3, 7, 6)],
     lambda s, x: s.op("max_pool2d", x, kernel_size=3, stride=2, padding=1, return_indices=True,
                       num_outputs=2),
     lambda x: FN.max_pool2d(x, 3, 2, 1, return_indices=True), exact=True)
case("max_pool2d-3d-input", [R(3, 5, 6)], lambda s, x: s.op("max_pool2d", x, kernel_size=2),
     lambda x: FN.max_pool2d(x, 2), exact=True)
case("avg_pool2d-3d-input", [R(3, 5, 6)], lambda s, x: s.op("avg_pool2d", x, kernel_size=2),
     lambda x: FN.avg_pool2d(x, 2), k=4)


# -- large tensors (the cpu backend's threaded/vectorised paths) and empty ones
BIG = (257, 1031)
case("large-add-bcast", [R(*BIG), R(BIG[1])], lambda s, a, b: a + b, lambda a, b: a + b,
     dtypes=FI)
case("large-mul-transposed", [R(*BIG), R(BIG[1], BIG[0])], lambda s, a, b: a * b.t(),
     lambda a, b: a * b.t())
case("large-exp-tanh-sigmoid", [R(*BIG)], lambda s, x: x.exp() + x.tanh() * x.sigmoid(),
     lambda x: x.exp() + x.tanh() * x.sigmoid())
case("large-gelu", [R(*BIG)], lambda s, x: x.gelu(), FN.gelu)
case("large-sum-all", [R(*BIG)], lambda s, x: x.sum(), lambda x: x.sum(), dtypes=FI,
     k=BIG[0] * BIG[1])
case("large-sum-dim0", [R(*BIG)], lambda s, x: x.sum(0), lambda x: x.sum(0), k=BIG[0])
case("large-mean-dim1", [R(*BIG)], lambda s, x: x.mean(1), lambda x: x.mean(1), k=BIG[1])
case("large-var-all", [R(*BIG)], lambda s, x: x.var(), lambda x: x.var(), k=BIG[0] * BIG[1])
case("large-amax-of-transposed", [R(*BIG)], lambda s, x: x.t().amax(1),
     lambda x: x.t().amax(1))
case("large-argmax-dim1", [R(*BIG)], lambda s, x: x.argmax(1), lambda x: x.argmax(1))
case("large-softmax", [R(*BIG, lo=-8, hi=8)], lambda s, x: x.softmax(1), lambda x: x.softmax(1),
     k=BIG[1])
case("large-log_softmax-dim0", [R(*BIG, lo=-8, hi=8)], lambda s, x: x.log_softmax(0),
     lambda x: x.log_softmax(0), k=BIG[0])
case("large-cumsum", [R(*BIG)], lambda s, x: x.cumsum(1), lambda x: x.cumsum(1), k=BIG[1])
case("large-where", [MASK(*BIG), R(*BIG), R(BIG[1])], lambda s, c, a, b: s.op("where", c, a, b),
     torch.where)
case("large-cast", [R(*BIG)], lambda s, x: x.to("float64" if x.dtype == "float32" else "float32"),
     lambda x: x.to(torch.float64 if x.dtype == torch.float32 else torch.float32))
case("large-matmul-batched", [R(3, 64, 200), R(200, 72)], lambda s, a, b: a @ b,
     lambda a, b: a @ b, k=200)
case("large-conv2d", [R(2, 8, 20, 18), R(16, 8, 3, 3), R(16)],
     lambda s, x, w, b: s.op("conv2d", x, w, b, padding=1), lambda x, w, b: FN.conv2d(x, w, b,
                                                                                      padding=1),
     k=72)
case("empty-add", [R(0, 4), R(4)], lambda s, a, b: a + b, lambda a, b: a + b, dtypes=FI)
case("empty-sum", [R(0, 3)], lambda s, x: x.sum(0), lambda x: x.sum(0), dtypes=FI)
case("empty-sum-all", [R(2, 0)], lambda s, x: x.sum(), lambda x: x.sum(), dtypes=FI)
case("empty-prod", [R(0, 3)], lambda s, x: x.prod(0), lambda x: x.prod(0), dtypes=FI)
case("empty-matmul-k0", [R(3, 0), R(0, 2)], lambda s, a, b: a @ b, lambda a, b: a @ b)
case("empty-cat", [R(0, 3), R(2, 3)], lambda s, a, b: s.cat([a, b]),
     lambda a, b: torch.cat([a, b]), dtypes=FIB, exact=True)
case("one-element", [R(1, 1), R(1)], lambda s, a, b: (a * b).sum(1).exp(),
     lambda a, b: (a * b).sum(1).exp())

# -- special values: negative bases, 0**0, NaN and infinity propagation as PyTorch
NANS = [1.0, float("nan"), -2.0, float("inf"), float("-inf"), 0.0]
case("pow-negative-base", [CONST([-2.0, -1.5, 0.0, 3.0, -0.0]), CONST([2.0, 3.0, 2.0, 0.5, 1.0])],
     lambda s, a, b: s.stack([a ** b, a ** 3.0, a ** 0.0]),
     lambda a, b: torch.stack([a ** b, a ** 3.0, a ** 0.0]))
case("nan-inf-elementwise", [CONST(NANS), CONST(NANS[::-1])],
     lambda s, a, b: s.stack([a.maximum(b), a.minimum(b), a.relu(), a.clamp(-1, 1), a.exp(),
                              a.sigmoid(), a.tanh(), a.abs(), a + b]),
     lambda a, b: torch.stack([torch.maximum(a, b), torch.minimum(a, b), a.relu(),
                               a.clamp(-1, 1), a.exp(), a.sigmoid(), a.tanh(), a.abs(),
                               a + b]))
# (sign(nan) is left out: torch 1.13 answers 0, numpy and the daemon NaN)
case("nan-reductions", [CONST([[1.0, float("nan"), 2.0], [3.0, -1.0, 0.5]])],
     lambda s, x: s.cat([x.amax(1), x.amin(1), x.sum(1), x.argmax(1).to("float64").to(
         x.dtype), x.argmin(1).to("float64").to(x.dtype)]),
     lambda x: torch.cat([x.amax(1), x.amin(1), x.sum(1), x.argmax(1).to(x.dtype),
                          x.argmin(1).to(x.dtype)]), k=3)
case("inf-softmax-logsumexp", [CONST([[float("-inf"), 0.0], [float("-inf"), float("-inf")],
                                      [float("inf"), 1.0]])],
     lambda s, x: s.cat([x.softmax(1)[:2].flatten(), x.logsumexp(1)]),
     lambda x: torch.cat([x.softmax(1)[:2].flatten(), x.logsumexp(1)]), k=2)
case("max_pool2d-nan", [CONST([[[[1.0, float("nan")], [2.0, 0.0]]]])],
     lambda s, x: s.op("max_pool2d", x, kernel_size=2), lambda x: FN.max_pool2d(x, 2),
     exact=True)
case("cross_entropy-all-ignored", [R(3, 4), CONST([-100, -100, -100], "int64")],
     lambda s, x, t: s.op("cross_entropy", x, t), lambda x, t: FN.cross_entropy(x, t))
case("var-correction-ge-n", [R(3, 4)], lambda s, x: s.op("var", x, dim=[1], correction=4),
     lambda x: torch.var(x, dim=1, correction=4), k=4)

def _params():
    out = []
    for c in CASES:
        for dt in c.dtypes:
            out.append(pytest.param(c, dt, id=f"{c.name}-{dt}", marks=c.marks))
    return out


def _tol(dtype: str, k: int):
    rtol, atol = TOLS[dtype]
    scale = max(1.0, math.sqrt(k))
    return rtol * scale, atol * scale


def _as_list(x):
    return list(x) if isinstance(x, (tuple, list)) else [x]


def compare(got_tensors, want_tensors, exact=False, k=1, what=""):
    got_tensors, want_tensors = _as_list(got_tensors), _as_list(want_tensors)
    assert len(got_tensors) == len(want_tensors), f"{what}: number of outputs"
    for n, (g, w) in enumerate(zip(got_tensors, want_tensors)):
        want = w.detach().numpy()
        got = g.numpy()
        tag = f"{what} output {n}"
        assert g.dtype == str(w.dtype).replace("torch.", ""), \
            f"{tag}: dtype {g.dtype}, torch gives {w.dtype}"
        assert tuple(g.shape) == tuple(w.shape), f"{tag}: shape {g.shape}, torch {tuple(w.shape)}"
        assert got.shape == want.shape, f"{tag}: downloaded shape {got.shape}"
        if exact or want.dtype.kind in "biu":
            np.testing.assert_array_equal(got, want, err_msg=tag)
        else:
            rtol, atol = _tol(want.dtype.name, k)
            np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=tag)


def _seed(*parts) -> int:
    return zlib.crc32("/".join(parts).encode())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("c,dtype", _params())
def test_op_matches_torch(device_session, c, dtype, device):
    session = device_session
    rng = np.random.default_rng(_seed(c.name, dtype))
    arrays = [spec(rng, dtype) for spec in c.inputs]
    ts = [session.tensor(a, device=device) for a in arrays]
    want = c.tfn(*[torch.from_numpy(np.array(a)) for a in arrays])
    with declines_skip(device, session):
        got = c.fn(session, *ts)
    for g in _as_list(got):
        assert g.device == device
    compare(got, want, exact=c.exact, k=c.k, what=f"{c.name} {dtype} on {device}")


# ---------------------------------------------------------------- creation ops

CREATE = [
    # (id, daemon fn(s, device, dtype), torch fn(dtype), dtypes)
    ("zeros", lambda s, d, dt: s.zeros(2, 3, device=d, dtype=dt),
     lambda dt: torch.zeros(2, 3, dtype=dt), FIB),
    ("ones", lambda s, d, dt: s.ones(4, device=d, dtype=dt),
     lambda dt: torch.ones(4, dtype=dt), FIB),
    ("zeros-0d", lambda s, d, dt: s.zeros(device=d, dtype=dt),
     lambda dt: torch.zeros((), dtype=dt), F),
    ("full", lambda s, d, dt: s.full((3, 2), 2.5 if dt != "int64" else 7, device=d, dtype=dt),
     lambda dt: torch.full((3, 2), 2.5 if dt != torch.int64 else 7, dtype=dt), FI),
    ("full-bool", lambda s, d, dt: s.full((2, 2), True, device=d, dtype=dt),
     lambda dt: torch.full((2, 2), True, dtype=dt), ("bool",)),
    ("eye", lambda s, d, dt: s.op("eye", n=4, device=d, dtype=dt),
     lambda dt: torch.eye(4, dtype=dt), FIB),
    ("eye-rect", lambda s, d, dt: s.op("eye", n=3, m=5, device=d, dtype=dt),
     lambda dt: torch.eye(3, 5, dtype=dt), F),
    ("arange-int", lambda s, d, dt: s.arange(2, 11, 3, device=d, dtype=dt),
     lambda dt: torch.arange(2, 11, 3, dtype=dt), FI),
    ("arange-float", lambda s, d, dt: s.arange(0.5, 2.0, 0.25, device=d, dtype=dt),
     lambda dt: torch.arange(0.5, 2.0, 0.25, dtype=dt), F),
    ("arange-neg-step", lambda s, d, dt: s.arange(5, -4, -2, device=d, dtype=dt),
     lambda dt: torch.arange(5, -4, -2, dtype=dt), FI),
    ("arange-empty", lambda s, d, dt: s.arange(3, 3, device=d, dtype=dt),
     lambda dt: torch.arange(3, 3, dtype=dt), FI),
    ("linspace", lambda s, d, dt: s.op("linspace", start=-1.0, end=2.0, steps=7, device=d,
                                       dtype=dt),
     lambda dt: torch.linspace(-1.0, 2.0, 7, dtype=dt), F),
    ("linspace-1", lambda s, d, dt: s.op("linspace", start=3.0, end=5.0, steps=1, device=d,
                                         dtype=dt),
     lambda dt: torch.linspace(3.0, 5.0, 1, dtype=dt), F),
    ("linspace-many", lambda s, d, dt: s.op("linspace", start=0.0, end=1.0, steps=101,
                                            device=d, dtype=dt),
     lambda dt: torch.linspace(0.0, 1.0, 101, dtype=dt), F),
]


def _create_params():
    out = []
    for c in CREATE:
        marks = ()
        if hasattr(c, "marks"):  # a pytest.param: its values and marks
            c, marks = c.values, c.marks
        name, fn, tfn, dts = c
        out += [pytest.param(fn, tfn, dt, id=f"{name}-{dt}", marks=marks) for dt in dts]
    return out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fn,tfn,dtype", _create_params())
def test_creation_matches_torch(device_session, fn, tfn, dtype, device):
    with declines_skip(device, device_session):
        got = fn(device_session, device, dtype)
    want = tfn(getattr(torch, dtype))
    assert got.device == device
    # linspace: PyTorch computes from both ends; allow an ulp-scale difference
    compare(got, want, exact=False, k=1, what=f"creation {dtype} on {device}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fn,tfn,dtype", [
    pytest.param(lambda s, d: s.full((2, 3), 3, device=d), lambda: torch.full((2, 3), 3),
                 "int64", id="full-int-value-int64"),
    pytest.param(lambda s, d: s.full((2, 3), 1.5, device=d), lambda: torch.full((2, 3), 1.5),
                 "float32", id="full-float-value-float32"),
    pytest.param(lambda s, d: s.arange(5, device=d), lambda: torch.arange(5), "int64",
                 id="arange-ints-int64"),
    pytest.param(lambda s, d: s.arange(0.0, 1.0, 0.125, device=d),
                 lambda: torch.arange(0.0, 1.0, 0.125), "float32", id="arange-floats-float32"),
])
def test_creation_default_dtype_as_torch(device_session, fn, tfn, dtype, device):
    got, want = fn(device_session, device), tfn()
    assert str(want.dtype) == f"torch.{dtype}"
    compare(got, want, what=f"creation default dtype on {device}")


# Reductions whose layouts take each of the cuda backend's reduction kernels: short rows over
# the dense innermost dim (several to a warp, the last warp part-filled), outer dims with
# under 1024 dense kept outputs (a block per 32 outputs), outer dims with >= 1024 outputs (a
# thread each), long rows (a block per output, split across blocks when outputs are few);
# with each map (plain, exp-sub for logsumexp, squared deviation for var) and combine.
REDUCTION_LAYOUTS = [
    ("short_rows", (64, 10), -1),
    ("short_rows_part_warp", (5, 7, 3), -1),
    ("row_of_one", (45, 1), -1),
    ("columns", (300, 70), 0),
    ("few_columns", (300, 10), 0),
    ("columns_3d", (6, 50, 40), (0, 1)),
    ("many_columns", (5, 2000), 0),
    ("long_rows", (3, 5000), 1),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name,shape,dim", REDUCTION_LAYOUTS,
                         ids=[r[0] for r in REDUCTION_LAYOUTS])
@pytest.mark.parametrize("dtype", ["float32", "float64", "int64"])
def test_reduction_layouts_match_torch(device_session, name, shape, dim, dtype, device):
    rng = np.random.default_rng(len(name) * 7 + len(dtype))
    if dtype == "int64":
        a = rng.integers(-50, 50, shape).astype(np.int64)
        ops = ["sum", "amax", "amin"]
    else:
        a = rng.standard_normal(shape).astype(dtype)
        ops = ["sum", "mean", "amax", "amin", "var", "logsumexp"]
    x, tx = device_session.tensor(a, device=device), torch.from_numpy(a)
    for op in ops:
        got = getattr(x, op)(dim)
        want = getattr(tx, op)(dim)
        compare(got, want, exact=dtype == "int64", k=shape[0] if dim == 0 else 8,
                what=f"{op} over {dim} of {shape} {dtype} on {device}")
