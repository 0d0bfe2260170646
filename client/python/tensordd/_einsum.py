"""tensordd.einsum -- torch.einsum planned as the daemon's ops (sum, permute, expand,
reshape, bmm), so autodiff records the plan's ops and the gradient needs no formula of
its own. No per-element loop: each contraction of two operands is one bmm.

The plan, for an equation in torch's grammar (letters a-z A-Z, one '...' per operand, an
implicit output of the letters used once, sorted as torch sorts them: '...' first, then
A-Z, then a-z):
  1. a letter repeated within one operand (a diagonal) becomes one dim: the operand times
     an eye() over the two dims, summed over the second (an elementwise pass, O(n^2)
     temporary per repeat);
  2. dims no longer needed (in no other operand and not in the output) are summed away;
  3. operands are contracted left to right: the shared letters still needed later are the
     bmm's batch, the shared letters not needed are its inner dim, the rest its rows and
     columns; size-1 dims broadcast (expand) as torch's einsum broadcasts them;
  4. the result is permuted into the output's order.
"""

from __future__ import annotations

from .errors import InvalidArgumentError
from .tensor import Tensor

_ELL = "..."


def _bad(msg: str) -> InvalidArgumentError:
    return InvalidArgumentError(f"einsum(): {msg}", call="einsum")


def _order(label) -> tuple:
    """torch's implicit-output order: ellipsis dims first (in place), then A-Z, then a-z."""
    if isinstance(label, int):
        return (0, label)
    return (1, label) if label.isupper() else (2, label)


def _parse(equation: str, operands) -> tuple[list[list], list]:
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(operands):
        raise _bad(f"{len(terms)} operand subscripts for {len(operands)} operands")
    ell_nd = 0
    parsed = []
    for term, op in zip(terms, operands):
        if term.count(_ELL) > 1:
            raise _bad(f"more than one '...' in '{term}'")
        letters = term.replace(_ELL, "")
        if any(not (c.isascii() and c.isalpha()) for c in letters):
            raise _bad(f"subscripts are letters a-z, A-Z and '...', got '{term}'")
        nd = len(op.shape)
        if (_ELL in term and nd < len(letters)) or (_ELL not in term and nd != len(letters)):
            raise _bad(f"'{term}' does not fit an operand of {nd} dims")
        parsed.append((term, nd - len(letters)))
        if _ELL in term:
            ell_nd = max(ell_nd, nd - len(letters))
    labels = []
    for term, en in parsed:  # ellipsis dims as ints, right-aligned across the operands
        before, _, after = term.partition(_ELL) if _ELL in term else (term, "", "")
        labels.append(list(before) + list(range(ell_nd - en, ell_nd)) * (_ELL in term)
                      + list(after))
    used = [lb for ls in labels for lb in ls]
    if arrow:
        if rhs.count(_ELL) > 1:
            raise _bad(f"more than one '...' in the output '{rhs}'")
        before, _, after = rhs.partition(_ELL) if _ELL in rhs else (rhs, "", "")
        if any(not (c.isascii() and c.isalpha()) for c in before + after):
            raise _bad(f"output subscripts are letters and '...', got '{rhs}'")
        out = list(before) + (list(range(ell_nd)) if _ELL in rhs else []) + list(after)
        for c in before + after:
            if c not in used:
                raise _bad(f"output subscript '{c}' is in no operand")
            if (before + after).count(c) > 1:
                raise _bad(f"output subscript '{c}' appears more than once")
    else:
        out = sorted((lb for lb in dict.fromkeys(used) if used.count(lb) == 1
                      or isinstance(lb, int)), key=_order)
    return labels, out


def _diagonal(t: Tensor, labels: list) -> tuple[Tensor, list]:
    """Repeated labels of one operand folded into one dim each (step 1)."""
    while True:
        seen = {}
        for d, lb in enumerate(labels):
            if lb in seen:
                break
            seen[lb] = d
        else:
            return t, labels
        d0, d1 = seen[lb], d
        n0, n1 = t.shape[d0], t.shape[d1]
        if n0 != n1 and 1 not in (n0, n1):
            raise _bad(f"subscript '{lb}' has sizes {n0} and {n1} in one operand")
        n = max(n0, n1)
        shape = [1] * len(labels)
        shape[d0] = shape[d1] = n
        eye = t.session._op("eye", n=n, dtype=t.dtype, device=t.device).reshape(*shape)
        t = (t * eye).sum(dim=d1)
        labels = labels[:d1] + labels[d1 + 1:]


def _sum_unneeded(t: Tensor, labels: list, needed: set) -> tuple[Tensor, list]:
    dims = [d for d, lb in enumerate(labels) if lb not in needed]
    if not dims:
        return t, labels
    return t.sum(dim=tuple(dims)), [lb for lb in labels if lb in needed]


def _sizes(ts, ls) -> dict:
    size = {}
    for t, labels in zip(ts, ls):
        for n, lb in zip(t.shape, labels):
            cur = size.get(lb, 1)
            if n != cur and 1 not in (n, cur):
                raise _bad(f"operands do not broadcast: subscript {lb!r} has sizes {cur} and {n}")
            size[lb] = n if cur == 1 else cur  # 0 stays 0
    return size


def _arrange(t: Tensor, labels: list, groups: list, size: dict) -> Tensor:
    """t's dims in the order of groups' labels (a label t lacks: a new dim of 1), expanded to
    size, reshaped to one dim per group."""
    order = [lb for g in groups for lb in g]
    missing = [lb for lb in order if lb not in labels]
    if missing:
        t = t.reshape(*t.shape, *([1] * len(missing)))
        labels = labels + missing
    perm = [labels.index(lb) for lb in order]
    if perm != list(range(len(perm))):
        t = t.permute(*perm)
    full = [size[lb] for lb in order]
    if list(t.shape) != full:
        t = t.expand(*full)
    dims = []
    for g in groups:
        n = 1
        for lb in g:
            n *= size[lb]
        dims.append(n)
    return t.reshape(*dims)


def _contract(a, la, b, lb, later: set, size: dict) -> tuple[Tensor, list]:
    batch = [x for x in la if x in lb and x in later]
    inner = [x for x in la if x in lb and x not in later]
    rows = [x for x in la if x not in lb]
    cols = [x for x in lb if x not in la]
    if a.dtype != b.dtype:  # a sum of integers is int64 (torch's sum): the pair widens to it
        wide = "int64" if "int64" in (a.dtype, b.dtype) else None
        if wide is not None:
            a, b = a.to(dtype=wide), b.to(dtype=wide)
    am = _arrange(a, la, [batch, rows, inner], size)
    bm = _arrange(b, lb, [batch, inner, cols], size)
    y = am.bmm(bm)
    labels = batch + rows + cols
    return y.reshape(*[size[x] for x in labels]), labels


def einsum(equation: str, *operands) -> Tensor:
    """``torch.einsum(equation, *operands)``: operands as arguments or one list."""
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    if not operands or not all(isinstance(t, Tensor) for t in operands):
        raise TypeError("einsum(): the operands must be tensordd Tensors")
    labels, out = _parse(equation, operands)
    ts = list(operands)
    for k, t in enumerate(ts):
        ts[k], labels[k] = _diagonal(t, labels[k])
    size = _sizes(ts, labels)
    for k in range(len(ts)):
        others = {lb for j, ls in enumerate(labels) if j != k for lb in ls}
        ts[k], labels[k] = _sum_unneeded(ts[k], labels[k], others | set(out))
    t, lt = ts[0], labels[0]
    for k in range(1, len(ts)):
        later = set(out) | {lb for ls in labels[k + 1:] for lb in ls}
        t, lt = _contract(t, lt, ts[k], labels[k], later, size)
        t, lt = _sum_unneeded(t, lt, later)
    t, lt = _sum_unneeded(t, lt, set(out))
    if not out:
        return t.reshape() if len(t.shape) else t
    perm = [lt.index(lb) for lb in out]
    if perm != list(range(len(perm))):
        t = t.permute(*perm)
    full = [size[lb] for lb in out]
    if list(t.shape) != full:  # a single operand's size-1 dim that another broadcast
        t = t.expand(*full)
    return t
