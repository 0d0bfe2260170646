"""The dtype of a binary op with a scalar `other` (docs/protocol.md, "A scalar
`other`"): an int keeps an integer input's dtype (bool becomes int64), a float makes
integer and bool inputs float32, floating inputs keep theirs; the comparisons are bool.
And docs/ops.md marks the integer dtypes these ops run on as running (it once showed
`sub` as unsupported on every integer dtype)."""

import os
import re

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

CASES = [  # input dtype, other, result dtype
    ("int32", 2, "int32"), ("int32", 2.0, "float32"), ("int64", 3, "int64"),
    ("uint8", 2, "uint8"), ("uint8", 2.0, "float32"), ("bool", 2, "int64"),
    ("bool", 2.0, "float32"), ("float16", 2, "float16"), ("float16", 2.0, "float16"),
    ("float64", 2, "float64"),
]


@pytest.mark.parametrize("dtype, other, want", CASES)
@pytest.mark.parametrize("op", ["add", "sub", "mul"])
def test_result_dtype_follows_the_scalars_kind(session, op, dtype, other, want):
    if op == "sub" and dtype == "bool":
        pytest.skip("sub of bool is refused, as in torch")
    a = session.tensor(np.array([1, 0, 1], dtype=dtype))
    r = session.op(op, a, other=other)
    assert r.dtype == want, (op, dtype, other, r.dtype)
    py = {"add": lambda x: x + other, "sub": lambda x: x - other,
          "mul": lambda x: x * other}[op]
    np.testing.assert_array_equal(r.numpy(), py(np.array([1, 0, 1], dtype=dtype)).astype(want))


def test_comparison_with_a_scalar_is_bool(session):
    a = session.tensor(np.array([1, 2, 3], dtype=np.int32))
    assert session.op("eq", a, other=2.0).dtype == "bool"


def test_the_spec_states_the_rule():
    spec = open(os.path.join(ROOT, "docs", "protocol.md")).read()
    assert "**A scalar `other`**" in spec
    assert "`int32 + 2.0` is\n`float32`" in spec or "`int32 + 2.0` is `float32`" in spec


@pytest.mark.parametrize("op", ["add", "sub", "mul", "maximum", "minimum"])
def test_ops_md_marks_integer_dtypes_that_run(session, op):
    rows = {}
    text = open(os.path.join(ROOT, "docs", "ops.md")).read()
    header = next(ln for ln in text.splitlines() if ln.startswith("| op | kind |"))
    cols = [c.strip() for c in header.strip("|").split("|")]
    for ln in text.splitlines():
        m = re.match(r"^\| (\w+) \|", ln)
        if m and m.group(1) not in rows:
            rows[m.group(1)] = [c.strip() for c in ln.strip("|").split("|")]
    row = dict(zip(cols, rows[op]))
    for dt in ("int32", "int64", "uint8", "int8", "int16"):
        a = session.tensor(np.array([5, 7], dtype=dt))
        b = session.tensor(np.array([2, 3], dtype=dt))
        session.op(op, a, b).numpy()  # runs
        assert row[dt].startswith("✓"), (op, dt, row[dt])
