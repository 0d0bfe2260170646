"""The daemon's ops on PyTorch's own OpInfo sample inputs (conformance).

torch 1.13's op database (torch.testing._internal.common_methods_invocations.op_db)
holds, per op, the sample inputs PyTorch tests itself with: edge shapes (0-d, empty,
broadcasting), argument forms and keyword arguments. Every OpInfo whose name maps to a
tensordd op (OPS below: the OpInfo name and how tensordd spells the call: a Tensor method,
a tensordd.nn.functional function, a tensordd function or the daemon's op by name) runs
its samples on cpu:0 through the Python client and through torch, and the results are
compared:

- forward: float32 and float64, and the integer and bool dtypes where both the OpInfo
  (its cpu dtypes) and the op take them; at most CAP samples per op and dtype (the first
  ones, in the OpInfo's order) so the file stays within seconds;
- gradient: float64, the samples of OpInfos that support autograd: loss =
  sum(out * w) (w random, per float output) through tensordd's backward and through
  torch.autograd.grad, every float input's gradient compared.

Tolerances (numpy assert_allclose: |got - want| <= atol + rtol * |want|, NaN equal to
NaN): float32 rtol 1e-5, atol 1e-5 (norms: atol 1e-4, see OP_TOLS); float64 rtol 1e-9,
atol 1e-9 (ops summing many terms in another order stay well inside both); integer and
bool results exact. The dtype and shape of every output must be torch's. Where PyTorch
leaves the order of equal elements open (sort, argsort, topk without stable=True), the
indices are compared through the values they select along dim.

Each sample is tried, or left out before it is tried for a stated reason (a keyword or
argument the tensordd call's signature does not take, a form in FORMS or SAMPLE_FORMS). A
tried sample must match torch, or be refused with a typed tensordd error listed in
REFUSALS for that op, code and message (each entry says why); a wrong value, another
error or a crash is a failure, except for the samples of KNOWN_WRONG (reported bugs,
counted apart; an entry that starts to match fails the test, so it goes with the fix).
One test per OpInfo; test_opinfo_counts (last) prints the counts of the whole file and
holds them to tests/python/ops/opinfo_counts.txt, the line docs/ops.md quotes (make docs).
"""

from __future__ import annotations

import inspect
import os
import sys
import types
import unittest
import zlib

import numpy as np
import pytest

import tensordd
import tensordd.nn.functional as TF
from conftest import Daemon

torch = pytest.importorskip("torch")

# The OpInfo module imports `expecttest` (PyTorch's test helper package), which Debian does
# not package. Only its TestCase base class and ACCEPT flag are touched at import time and
# none of the expect-test machinery is used here, so a minimal stand-in is registered when
# the real module is missing.
try:
    import expecttest  # noqa: F401
except ImportError:
    _stub = types.ModuleType("expecttest")
    _stub.TestCase = unittest.TestCase
    _stub.ACCEPT = False
    sys.modules["expecttest"] = _stub

try:
    from torch.testing._internal.common_methods_invocations import op_db
except Exception as e:  # pragma: no cover (a torch without the test modules)
    pytest.skip(f"torch's OpInfo database does not import: {e}", allow_module_level=True)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
COUNTS_FILE = os.path.join(ROOT, "tests", "python", "ops", "opinfo_counts.txt")

CAP = 12  # samples per op and dtype (the first ones)
TOLS = {"float32": (1e-5, 1e-5), "float64": (1e-9, 1e-9)}
# Normalising a (near-)constant row multiplies one rounding of its mean by
# 1/sqrt(var + eps), up to 316 for eps 1e-5: float32 atol 1e-4 there.
OP_TOLS = {n: {"float32": (1e-5, 1e-4)} for n in (
    "nn.functional.layer_norm", "nn.functional.group_norm", "nn.functional.batch_norm")}
INT_DTYPES = ("int64", "int32", "int16", "int8", "uint8", "bool")
TORCH_DT = {n: getattr(torch, n) for n in ("float32", "float64") + INT_DTYPES}


# ---------------------------------------------------------------- the map
# name -> (call, dtypes or None): call(s, input, *args, **kwargs) with tensors already
# tensordd's. A call whose signature does not bind a sample's arguments leaves it out.

def M(name):
    """A Tensor method."""
    def call(x, *a, **k):
        return getattr(x, name)(*a, **k)
    call.sig = lambda x: inspect.signature(getattr(x, name))
    call.bound = True
    return call


def Fn(name):
    """A tensordd.nn.functional function."""
    f = getattr(TF, name)

    def call(x, *a, **k):
        return f(x, *a, **k)
    call.sig = lambda x: inspect.signature(f)
    return call


def Fixed(fn):
    """A call written here: its own signature says what it takes."""
    fn.sig = lambda x: inspect.signature(fn)
    return fn


@Fixed
def _atan2(input, other):  # noqa: A002
    return input.session.op("atan2", input, other)


def _logical(name):
    @Fixed
    def call(input, other):  # noqa: A002
        return input.session.op(name, input, other)
    return call


@Fixed
def _scatter_add(input, dim, index, src):  # noqa: A002
    return input.session.op("scatter_add", input, index, src, dim=int(dim))


@Fixed
def _sort(input, dim=-1, descending=False, stable=False):  # noqa: A002
    return input.session.op("sort", input, dim=int(dim), descending=bool(descending),
                            stable=bool(stable), num_outputs=2)


@Fixed
def _argsort(input, dim=-1, descending=False):  # noqa: A002
    return input.session.op("argsort", input, dim=int(dim), descending=bool(descending))


@Fixed
def _topk(input, k, dim=-1, largest=True, sorted=True):  # noqa: A002
    return input.session.op("topk", input, k=int(k), dim=int(dim), largest=bool(largest),
                            sorted=bool(sorted), num_outputs=2)


@Fixed
def _pad(input, pad, mode="constant", value=None):  # noqa: A002
    return input.session.op("pad", input, pad=[int(p) for p in pad], mode=mode,
                            value=None if value is None else float(value))


@Fixed
def _addmm(input, mat1, mat2, beta=1, alpha=1):  # noqa: A002
    return input.session.op("addmm", input, mat1, mat2, beta=beta, alpha=alpha)


@Fixed
def _baddbmm(input, batch1, batch2, beta=1, alpha=1):  # noqa: A002
    return input.session.op("baddbmm", input, batch1, batch2, beta=beta, alpha=alpha)


@Fixed
def _group_norm(input, num_groups, weight=None, bias=None, eps=1e-5):  # noqa: A002
    return input.session.op("group_norm", *[t for t in (input, weight, bias) if t is not None],
                            num_groups=int(num_groups), eps=float(eps))


@Fixed
def _cat(tensors, dim=0):
    return tensordd.cat(tensors, dim)


@Fixed
def _stack(tensors, dim=0):
    return tensordd.stack(tensors, dim)


@Fixed
def _clamp(input, min=None, max=None):  # noqa: A002
    if isinstance(min, tensordd.Tensor) or isinstance(max, tensordd.Tensor):
        return input.session.op("clamp", *[t for t in (input, min, max) if t is not None])
    return input.clamp(min, max)


@Fixed
def _where(input, condition, other):  # noqa: A002
    return input.where(condition, other)


@Fixed
def _einsum(tensors, equation):  # the OpInfo's order: operands first
    return tensordd.einsum(equation, *tensors)


@Fixed
def _flip(input, dims):  # noqa: A002 (torch.flip(input, dims))
    return input.flip(*dims)


def _alpha(name):
    @Fixed
    def call(input, other, alpha=1):  # noqa: A002
        if alpha == 1:
            return getattr(input, name)(other)
        if isinstance(other, tensordd.Tensor):  # the op's alpha attribute
            return input.session.op(name, input, other, alpha=alpha)
        return getattr(input, name)(other * alpha)
    return call


@Fixed
def _masked_fill(input, mask, value):  # noqa: A002
    if isinstance(value, tensordd.Tensor):  # a 0-d tensor value: the op's third input
        return input.session.op("masked_fill", input, mask, value)
    return input.masked_fill(mask, value)


@Fixed
def _embedding(weight, idx):  # the OpInfo's order: weight first
    return TF.embedding(idx, weight)


@Fixed
def _embedding_bag(weight, idx, offsets=None, max_norm=None, norm_type=2.0,
                   scale_grad_by_freq=False, mode="mean", sparse=False, per_sample_weights=None,
                   include_last_offset=False, padding_idx=None):
    return TF.embedding_bag(idx, weight, offsets, max_norm, norm_type, scale_grad_by_freq, mode,
                            sparse, per_sample_weights, include_last_offset, padding_idx)


FLOAT = ("float32", "float64")

OPS = {
    # unary
    **{n: (M(n), None) for n in (
        "abs", "neg", "sign", "exp", "log", "log1p", "expm1", "sqrt", "rsqrt", "sin", "cos",
        "tanh", "sigmoid", "floor", "ceil", "round", "reciprocal", "square", "logical_not")},
    "nn.functional.relu": (Fn("relu"), None),
    "nn.functional.gelu": (Fn("gelu"), FLOAT),
    "nn.functional.silu": (Fn("silu"), FLOAT),
    "nn.functional.leaky_relu": (Fn("leaky_relu"), FLOAT),
    "nn.functional.softplus": (M("softplus"), FLOAT),
    # binary
    "add": (_alpha("add"), None), "sub": (_alpha("sub"), None),
    **{n: (M(n), None) for n in (
        "mul", "div", "pow", "maximum", "minimum", "remainder", "eq", "ne",
        "lt", "le", "gt", "ge")},
    "atan2": (_atan2, None),
    **{n: (_logical(n), None) for n in ("logical_and", "logical_or", "logical_xor")},
    "clamp": (_clamp, None),
    "masked_fill": (_masked_fill, None),
    "where": (_where, None),
    # reductions
    **{n: (M(n), None) for n in (
        "sum", "mean", "amax", "amin", "argmax", "argmin", "max", "min", "var", "std",
        "logsumexp", "prod", "cumsum", "softmax", "log_softmax")},
    # linear algebra
    "matmul": (M("matmul"), None), "mm": (M("mm"), None), "bmm": (M("bmm"), None),
    "nn.functional.linear": (Fn("linear"), None),
    "addmm": (_addmm, None), "baddbmm": (_baddbmm, None),
    "einsum": (_einsum, None),
    # views and copies
    **{n: (M(n), None) for n in (
        "transpose", "permute", "reshape", "view", "flatten", "squeeze", "unsqueeze",
        "expand", "contiguous", "clone", "split", "chunk", "t", "tril", "triu",
        "float", "double", "long", "int", "bool")},
    "flip": (_flip, None), "cat": (_cat, None), "stack": (_stack, None),
    # indexing
    "gather": (M("gather"), None), "index_select": (M("index_select"), None),
    "scatter_add": (_scatter_add, None),
    "nn.functional.one_hot": (Fn("one_hot"), None),
    "nn.functional.embedding": (_embedding, None),
    "nn.functional.embedding_bag": (_embedding_bag, None),
    "sort": (_sort, None), "argsort": (_argsort, None), "topk": (_topk, None),
    "nn.functional.pad": (_pad, None),
    # nn
    "nn.functional.cross_entropy": (Fn("cross_entropy"), FLOAT),
    "nn.functional.nll_loss": (Fn("nll_loss"), FLOAT),
    "nn.functional.mse_loss": (Fn("mse_loss"), FLOAT),
    "nn.functional.binary_cross_entropy_with_logits":
        (Fn("binary_cross_entropy_with_logits"), FLOAT),
    "nn.functional.layer_norm": (Fn("layer_norm"), FLOAT),
    "nn.functional.group_norm": (_group_norm, FLOAT),
    "nn.functional.batch_norm": (Fn("batch_norm"), FLOAT),
    "nn.functional.interpolate": (Fn("interpolate"), FLOAT),
    "nn.functional.conv1d": (Fn("conv1d"), FLOAT),
    "nn.functional.conv2d": (Fn("conv2d"), FLOAT),
    "nn.functional.conv_transpose2d": (Fn("conv_transpose2d"), FLOAT),
    "nn.functional.max_pool2d": (Fn("max_pool2d"), FLOAT),
    "nn.functional.avg_pool2d": (Fn("avg_pool2d"), FLOAT),
    "nn.functional.adaptive_avg_pool2d": (Fn("adaptive_avg_pool2d"), FLOAT),
}

# Forms of PyTorch's that tensordd does not take, left out before they are tried.
# (name, variant) -> reason. Random ops have no value to compare with.
FORMS = {
    ("div", "trunc_rounding"): "rounding_mode (tensordd's div is true division)",
    ("div", "floor_rounding"): "rounding_mode (tensordd's div is true division)",
    ("softmax", "with_dtype"): "softmax's dtype= (cast first in tensordd)",
    ("addmm", "decomposed"): "a torch-side decomposition of addmm, not another form",
}

# Typed refusals a tried sample may answer: (OpInfo name, error code, words of the
# message) -> why.
REFUSALS = {
    ("addmm", "INVALID_ARGUMENT", "must be an int for integral inputs"):
        "a float alpha/beta with integer inputs (torch 1.13 truncates it silently)",
    ("baddbmm", "INVALID_ARGUMENT", "must be an int for integral inputs"):
        "a float alpha/beta with integer inputs (torch 1.13 truncates it silently)",
    ("add", "INVALID_ARGUMENT", "attribute alpha must be a number, got bool"):
        "alpha=True with bool tensors (the op's alpha is a number; docs/ops.md says a number "
        "may be a bool: reported)",
    ("gather", "DTYPE_MISMATCH", "indices must be int64"):
        "an empty uint8 index (torch skips its int64 check when the index is empty)",
    ("t", "INVALID_ARGUMENT", "out of range for a"):
        "t() of a 0-D or 1-D tensor (torch returns it as it is; the client asks transpose(0, 1))",
    ("square", "UNSUPPORTED_DTYPE", "dtype bool"): "square of bool (torch: x * x, a bool)",
    ("sign", "UNSUPPORTED_DTYPE", "dtype bool"): "sign of bool",
    ("max.reduction_with_dim", "UNSUPPORTED_DTYPE", "argmax: dtype bool"):
        "max(dim) of bool: the client's indices come from argmax, which takes no bool",
    ("min.reduction_with_dim", "UNSUPPORTED_DTYPE", "argmin: dtype bool"):
        "min(dim) of bool: the client's indices come from argmin, which takes no bool",
    ("nn.functional.one_hot", "INVALID_ARGUMENT", "num_classes must be positive"):
        "num_classes=-1 (inferred from the data; the daemon sizes outputs before it runs)",
    ("nn.functional.batch_norm", "INVALID_ARGUMENT", "input must be [N, C, *]"):
        "a 1-D input (torch takes it; the op takes [N, C, *])",
    **{(f"nn.functional.interpolate.{m}", "INVALID_ARGUMENT", w): why
       for m in ("nearest", "linear", "bilinear", "bicubic", "trilinear", "area")
       for w, why in (("input must be [N, C, W] or [N, C, H, W]", "5-D (volumetric) inputs"),
                      ("interpolate: mode", "modes bicubic, trilinear and area"))},
}

# Wrong answers known today, each reported: (OpInfo name, predicate(sample)) -> the bug.
# Such a sample is still tried; it counts as known-wrong while it fails, and the test fails
# once it passes (so the entry is removed with the fix).
KNOWN_WRONG: dict = {}

# Per-sample forms tensordd does not take: OpInfo name -> (predicate(sample), reason).
SAMPLE_FORMS = {
    "nn.functional.adaptive_avg_pool2d": (
        lambda sm: sm.args and isinstance(sm.args[0], (list, tuple)) and None in sm.args[0],
        "adaptive_avg_pool2d output_size with None (keep that dim)"),
    "nn.functional.embedding_bag": (
        lambda sm: sm.kwargs.get("max_norm") is not None or sm.kwargs.get("sparse") or
        sm.kwargs.get("scale_grad_by_freq"),
        "embedding_bag max_norm, sparse or scale_grad_by_freq"),
    "clamp": (lambda sm: sm.args and sm.args[0] is None and len(sm.args) > 1 and
              isinstance(sm.args[1], torch.Tensor),
              "clamp with only a max tensor (the op's tensor bounds come min first)"),
}

COUNTS = {"fwd_tried": 0, "fwd_matched": 0, "fwd_refused": 0, "fwd_left_out": 0,
          "fwd_known_wrong": 0, "grad_tried": 0, "grad_matched": 0, "grad_refused": 0,
          "grad_left_out": 0, "grad_known_wrong": 0}
LEFT_OUT: dict = {}
FAILURES: list = []


# ---------------------------------------------------------------- running one sample

def _flat_tensors(obj, out):
    if isinstance(obj, torch.Tensor):
        out.append(obj)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            _flat_tensors(v, out)
    elif isinstance(obj, dict):
        for v in obj.values():
            _flat_tensors(v, out)
    return out


def _to_td(s, obj, leaves):
    """torch tensors (nested in lists, tuples and dicts) as tensordd uploads; those in
    leaves (by id) are uploaded with requires_grad and recorded there."""
    if isinstance(obj, torch.Tensor):
        arr = obj.detach().contiguous().numpy()
        want = id(obj) in leaves
        t = s.tensor(arr, device="cpu:0", requires_grad=want or None)
        if want:
            leaves[id(obj)] = t
        return t
    if isinstance(obj, list):
        return [_to_td(s, v, leaves) for v in obj]
    if isinstance(obj, tuple) and not isinstance(obj, torch.Size):
        return tuple(_to_td(s, v, leaves) for v in obj)
    if isinstance(obj, torch.Size):
        return tuple(obj)
    if isinstance(obj, dict):
        return {k: _to_td(s, v, leaves) for k, v in obj.items()}
    if isinstance(obj, torch.dtype):
        return str(obj).replace("torch.", "")
    return obj


def _outputs(out):
    if isinstance(out, (list, tuple)):
        return list(out)
    return [out]


def _np(t):
    return t.detach().numpy() if isinstance(t, torch.Tensor) else np.asarray(t)


# Ops whose index output PyTorch leaves open among equal values (unless stable=True): their
# indices are compared through the values they select along dim.
TIES = {"sort", "argsort", "topk"}


def _tie_dim(info, call, x, args, kwargs):
    """dim of a TIES op's call (None: compare indices as they are)."""
    if info.name not in TIES or x.ndim == 0:
        return None
    b = call.sig(x).bind(x, *args, **kwargs)
    b.apply_defaults()
    return None if b.arguments.get("stable") else int(b.arguments["dim"])


def _compare(what, got, want, dtype, x_np=None, dim=None, tols=None):
    gl, wl = _outputs(got), _outputs(want)
    assert len(gl) == len(wl), f"{what}: {len(gl)} outputs, torch has {len(wl)}"
    for i, (g, w) in enumerate(zip(gl, wl)):
        wa = _np(w)
        ga = g.numpy() if isinstance(g, tensordd.Tensor) else np.asarray(g)
        assert ga.dtype == wa.dtype, f"{what}: output {i} dtype {ga.dtype}, torch's {wa.dtype}"
        assert ga.shape == wa.shape, f"{what}: output {i} shape {ga.shape}, torch's {wa.shape}"
        if dim is not None and i == len(wl) - 1:  # the indices (sort/topk: output 1)
            assert ga.size == 0 or (ga.min() >= 0 and ga.max() < x_np.shape[dim]), \
                f"{what}: output {i}: indices outside [0, {x_np.shape[dim]}): {ga}"
            np.testing.assert_array_equal(np.take_along_axis(x_np, ga, dim),
                                          np.take_along_axis(x_np, wa, dim),
                                          err_msg=f"{what}: output {i} (values at the indices)")
        elif wa.dtype.kind in "biu":
            np.testing.assert_array_equal(ga, wa, err_msg=f"{what}: output {i}")
        else:
            # the input dtype's tolerance; an int input's float output (mean): the output's
            rtol, atol = tols if tols else TOLS[str(wa.dtype)]
            np.testing.assert_allclose(ga, wa, rtol=rtol, atol=atol, equal_nan=True,
                                       err_msg=f"{what}: output {i}")


def _bind_ok(call, td_input, td_args, td_kwargs):
    """Whether the tensordd call takes the sample's arguments (by its signature)."""
    sig = call.sig(td_input)
    try:
        if getattr(call, "bound", False):
            sig.bind(*td_args, **td_kwargs)  # a method: self is the input
        else:
            sig.bind(td_input, *td_args, **td_kwargs)
        return True
    except (TypeError, AttributeError):
        return False


def _left_out(info, call, sample, x, args, kwargs, direction):
    """Counts and says whether the sample is left out, untried (a form tensordd lacks)."""
    why = None
    form = SAMPLE_FORMS.get(info.name)
    if form and form[0](sample):
        why = form[1]
    elif not _bind_ok(call, x, args, kwargs):
        why = f"{info.name}: an argument or keyword the tensordd call does not take"
    if why:
        COUNTS[f"{direction}_left_out"] += 1
        LEFT_OUT[why] = LEFT_OUT.get(why, 0) + 1
    return why is not None


def _drain(s):
    """Takes the session's other pending errors (an op's failure also poisons what was
    queued on its output), so that none surfaces at a later sample's call."""
    for _ in range(8):
        try:
            s.sync()
            return
        except tensordd.Error:
            pass


def _samples(info, dtype, requires_grad=False):
    """The first CAP samples; those before a generator that raises part-way (torch 1.13's
    cross_entropy generator calls random.sample on a set, which Python 3.11 refuses)."""
    out = []
    it = None
    while len(out) < CAP:
        try:
            if it is None:
                it = iter(info.sample_inputs("cpu", dtype, requires_grad=requires_grad))
            out.append(next(it))
        except StopIteration:
            break
        except TypeError as e:
            why = f"the rest of a sample generator that raises ({e})"[:90]
            LEFT_OUT[why] = LEFT_OUT.get(why, 0) + 1
            break
    return out


def _known_wrong(info, sample):
    for (n, pred), bug in KNOWN_WRONG.items():
        if n == info.name and pred(sample):
            return bug
    return None


def _fail(info, sample, direction, msg):
    """A wrong value, a crash or an unlisted refusal: a failure unless a known bug."""
    if _known_wrong(info, sample):
        COUNTS[f"{direction}_known_wrong"] += 1
    else:
        FAILURES.append(msg)


def _matched(info, sample, direction, what):
    bug = _known_wrong(info, sample)
    if bug:
        FAILURES.append(f"{what} matches now: remove KNOWN_WRONG's entry ({bug})")
    else:
        COUNTS[f"{direction}_matched"] += 1


def _refused(name, e, direction, s, info, sample):
    if e.code == "POISONED":  # an output of a failed request: the failure itself is pending
        try:
            s.sync()
        except tensordd.Error as root:
            e = root
    if not any(n == name and c == e.code and words in str(e) for n, c, words in REFUSALS):
        _fail(info, sample, direction, f"{name} {direction}: refused with "
              f"{type(e).__name__}: {e} (not in REFUSALS)")
        return
    COUNTS[f"{direction}_refused"] += 1


def _forward(s, info, call, dtype):
    name = info.name if not info.variant_test_name else f"{info.name}.{info.variant_test_name}"
    torch.manual_seed(zlib.crc32(f"{name}/{dtype}".encode()))
    for n, sample in enumerate(_samples(info, TORCH_DT[dtype])):
        what = f"{name} {dtype} sample {n}"
        leaves = {}
        x = _to_td(s, sample.input, leaves)
        args = _to_td(s, tuple(sample.args), leaves)
        kwargs = _to_td(s, dict(sample.kwargs), leaves)
        if _left_out(info, call, sample, x, args, kwargs, "fwd"):
            continue
        try:
            want = info(sample.input, *sample.args, **sample.kwargs)
        except Exception:  # torch itself refuses (e.g. an int dtype it lists): nothing to hold
            COUNTS["fwd_left_out"] += 1
            LEFT_OUT["torch refuses the sample"] = LEFT_OUT.get("torch refuses the sample", 0) + 1
            continue
        COUNTS["fwd_tried"] += 1
        try:
            got = call(x, *args, **kwargs)
            for g in _outputs(got):
                if isinstance(g, tensordd.Tensor):
                    g.numpy()
        except tensordd.Error as e:
            _refused(name, e, "fwd", s, info, sample)
            _drain(s)
            continue
        except Exception as e:
            _fail(info, sample, "fwd", f"{what}: {type(e).__name__}: {e}")
            continue
        try:
            dim = _tie_dim(info, call, x, args, kwargs)
            tols = OP_TOLS.get(info.name, {}).get(dtype, TOLS[dtype] if dtype in TOLS else None)
            _compare(what, got, want, dtype, None if dim is None else _np(sample.input), dim,
                     tols)
        except AssertionError as e:
            _fail(info, sample, "fwd", str(e))
            continue
        _matched(info, sample, "fwd", what)


def _gradient(s, info, call):
    name = info.name if not info.variant_test_name else f"{info.name}.{info.variant_test_name}"
    torch.manual_seed(zlib.crc32(f"{name}/grad".encode()))
    for n, sample in enumerate(_samples(info, torch.float64, requires_grad=True)):
        what = f"{name} gradient sample {n}"
        tleaves = [t for t in _flat_tensors((sample.input, sample.args, sample.kwargs), [])
                   if t.requires_grad and t.dtype == torch.float64]
        if not tleaves:
            continue
        leaves = {id(t): None for t in tleaves}
        x = _to_td(s, sample.input, leaves)
        args = _to_td(s, tuple(sample.args), leaves)
        kwargs = _to_td(s, dict(sample.kwargs), leaves)
        if _left_out(info, call, sample, x, args, kwargs, "grad"):
            continue
        try:
            tout = [o for o in _outputs(info(sample.input, *sample.args, **sample.kwargs))
                    if isinstance(o, torch.Tensor) and o.requires_grad]
        except Exception:
            COUNTS["grad_left_out"] += 1
            continue
        if not tout:
            continue
        rng = np.random.default_rng(zlib.crc32(what.encode()))
        ws = [rng.uniform(0.5, 1.5, tuple(o.shape)) for o in tout]
        ws = [w.astype(str(o.dtype).replace("torch.", "")) for w, o in zip(ws, tout)]
        tloss = sum((o * torch.from_numpy(w)).sum().double() for o, w in zip(tout, ws))
        tgrads = torch.autograd.grad(tloss, tleaves, allow_unused=True)
        COUNTS["grad_tried"] += 1
        try:
            res = call(x, *args, **kwargs)
            s.sync()  # the op's own error first (asking a failed output's dtype is POISONED)
            out = [o for o in _outputs(res)
                   if isinstance(o, tensordd.Tensor) and o.dtype in FLOAT]
            if len(out) != len(tout):
                _fail(info, sample, "grad", f"{what}: {len(out)} float outputs, torch has "
                      f"{len(tout)}")
                continue
            loss = out[0].session.tensor(np.zeros((), np.float64), device="cpu:0")
            for o, w in zip(out, ws):
                loss = loss + (o * s.tensor(w, device="cpu:0")).sum().double()
            grads = loss.backward()
            got = []
            for t, tg in zip(tleaves, tgrads):
                got.append((grads.get(leaves[id(t)]).numpy(), tg))
        except tensordd.Error as e:
            _refused(name, e, "grad", s, info, sample)
            _drain(s)
            continue
        except Exception as e:
            _fail(info, sample, "grad", f"{what}: {type(e).__name__}: {e}")
            continue
        try:
            for i, (g, tg) in enumerate(got):
                want = np.zeros(g.shape) if tg is None else tg.numpy()
                assert g.shape == want.shape, f"{what}: grad {i} shape {g.shape}, {want.shape}"
                rtol, atol = TOLS["float32" if any(o.dtype == torch.float32 for o in tout)
                                  else "float64"]
                np.testing.assert_allclose(g, want, rtol=rtol, atol=atol, equal_nan=True,
                                           err_msg=f"{what}: gradient of leaf {i}")
        except AssertionError as e:
            _fail(info, sample, "grad", str(e))
            continue
        _matched(info, sample, "grad", what)


@pytest.fixture(scope="module")
def od():
    d = Daemon("--cpu-devices", "1")
    yield d
    rc = d.stop()
    assert rc == 0, f"daemon exited with {rc} on SIGTERM:\n{d.log()}"


INFOS = [i for i in op_db if i.name in OPS and (i.name, i.variant_test_name) not in FORMS]
RAN: set = set()


def _id(info):
    return info.name + (f".{info.variant_test_name}" if info.variant_test_name else "")


@pytest.fixture(scope="module")
def os_(od):
    s = tensordd.connect(od.endpoint, timeout=120)
    yield s
    s.close(raise_errors=False)


@pytest.mark.parametrize("info", INFOS, ids=_id)
def test_opinfo(os_, info):
    """One OpInfo's samples: forward in each dtype, then gradients (float64)."""
    FAILURES.clear()
    call, only = OPS[info.name]
    cpu = {str(d).replace("torch.", "") for d in info.supported_dtypes("cpu")}
    dts = [d for d in FLOAT + INT_DTYPES if d in cpu and (only is None or d in only)]
    for dt in dts:
        _forward(os_, info, call, dt)
    if info.supports_autograd and "float64" in dts:
        _gradient(os_, info, call)
    RAN.add(_id(info))
    assert not FAILURES, f"{len(FAILURES)} samples failed:\n" + "\n".join(FAILURES)


def _counts_line():
    return ("forward samples: {fwd_tried} tried, {fwd_matched} matched, {fwd_refused} refused "
            "typed, {fwd_known_wrong} known wrong; gradient samples: {grad_tried} tried, "
            "{grad_matched} matched, {grad_refused} refused typed, {grad_known_wrong} known "
            "wrong").format(**COUNTS)


def test_opinfo_counts():
    """The counts of the whole file (it runs last), as recorded for docs/ops.md."""
    if RAN != {_id(i) for i in INFOS}:
        pytest.skip("the counts are those of the whole file (some OpInfos did not run)")
    line = _counts_line()
    print(f"\nopinfo: {line}\nleft out before trying (forward {COUNTS['fwd_left_out']}, "
          f"gradient {COUNTS['grad_left_out']}): {LEFT_OUT}")
    with open(COUNTS_FILE) as f:
        recorded = f.read().strip()
    assert recorded == line, (f"{COUNTS_FILE} says\n  {recorded}\nthis run counted\n  {line}\n"
                              f"(write the new line there and run make docs)")
