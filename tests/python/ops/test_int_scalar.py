"""An integer tensor with a Python int keeps its dtype, as in torch (``int64 + 1`` is
int64, ``int32 * 3`` int32); a Python float makes the result float32; comparisons with an
int compare exactly (no detour through float32, which rounds integers above 2**24)."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.mark.parametrize("dtype", [np.int64, np.int32])
def test_int_tensor_with_int_keeps_its_dtype(session, dtype):
    a = np.array([5, -7, 9], dtype=dtype)
    t = session.tensor(a)
    for got, want in ((t + 2, a + 2), (2 + t, 2 + a), (t - 3, a - 3), (t * 4, a * 4),
                      (3 - t, 3 - a), (t % 4, a % 4)):
        arr = got.numpy()
        assert got.dtype == np.dtype(dtype).name
        assert arr.dtype == dtype
        np.testing.assert_array_equal(arr, want)
    t += 1
    assert t.dtype == np.dtype(dtype).name
    np.testing.assert_array_equal(t.numpy(), a + 1)


def test_int_tensor_with_float_is_float32(session):
    t = session.tensor(np.array([1, 2, 3]))
    got = t + 0.5
    assert got.numpy().dtype == np.float32
    np.testing.assert_array_equal(got.numpy(), np.array([1.5, 2.5, 3.5], np.float32))
    assert (t / 2).numpy().dtype == np.float32


def test_large_int64_comparisons_are_exact(session):
    big = 2 ** 40 + 1
    t = session.tensor(np.array([big, big + 1], dtype=np.int64))
    np.testing.assert_array_equal((t == big).numpy(), [True, False])
    np.testing.assert_array_equal((t + 1).numpy(), [big + 1, big + 2])
