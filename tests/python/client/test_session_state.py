"""SessionState, a session's bookkeeping that the accelerator's op and numpy share with the
Python Session: the accelerator's own type (tensordd._speedups.SessionState) against its
pure-Python twin (tensordd._state.SessionState), and a Session delegating to whichever
tensordd._codec hands out."""
import itertools
import random

import numpy as np
import pytest

from tensordd import _codec, _state

try:
    from tensordd import _speedups
except ImportError:  # not built: the twin's own checks still run
    _speedups = None

needs_c = pytest.mark.skipif(_speedups is None, reason="tensordd._speedups is not built")


def _kinds():
    out = [_state.SessionState]
    if _speedups is not None:
        out.append(_speedups.SessionState)
    return out


def _snapshot(st):
    """Every field's value; a counter as its repr (count(next value))."""
    out = {}
    for name in type(st).FIELDS:
        v = getattr(st, name)
        if isinstance(v, itertools.count):
            v = repr(v)
        elif isinstance(v, (list, dict)):
            v = (type(v).__name__, repr(v))
        out[name] = v
    return out


@needs_c
def test_the_twin_has_the_accelerators_fields_and_defaults():
    c, py = _speedups.SessionState(), _state.SessionState()
    assert type(c).FIELDS == type(py).FIELDS
    assert _snapshot(c) == _snapshot(py)
    # fresh containers per object, never shared
    assert _speedups.SessionState().calls is not c.calls
    assert _state.SessionState().pending_release is not py.pending_release


@pytest.mark.parametrize("kind", _kinds(), ids=lambda k: k.__module__)
def test_no_field_outside_fields(kind):
    st = kind()
    with pytest.raises(AttributeError):
        st.pending_releases = []  # a misspelt field fails, it is not made
    with pytest.raises(AttributeError):
        st.not_a_field  # noqa: B018
    with pytest.raises(TypeError):
        kind(1)
    del st.calls
    with pytest.raises(AttributeError):
        st.calls  # noqa: B018
    st.calls = {}
    assert st.calls == {}


@needs_c
def test_the_same_updates_leave_the_same_state():
    """Random writes and reads of every field, on both: the same state after each."""
    r = random.Random(5)
    c, py = _speedups.SessionState(), _state.SessionState()
    values = [True, False, None, 0, 7, [], [1, 2], {}, {3: ("add", [1], 4)}, "x"]
    for _ in range(2000):
        name = r.choice(_state.SessionState.FIELDS)
        op = r.randrange(4)
        if op == 0:
            v = r.choice(values)
            copy = (lambda x: x.copy()) if isinstance(v, (list, dict)) else (lambda x: x)
            setattr(c, name, copy(v))
            setattr(py, name, copy(v))
        elif op == 1 and name in ("ids", "handles"):
            start = r.randrange(1, 1 << 40)
            setattr(c, name, itertools.count(start))
            setattr(py, name, itertools.count(start))
            assert next(getattr(c, name)) == next(getattr(py, name)) == start
        elif op == 2 and isinstance(getattr(py, name), list):
            h = r.randrange(1 << 20)
            getattr(c, name).append(h)
            getattr(py, name).append(h)
        assert _snapshot(c) == _snapshot(py), name


def test_codec_hands_out_the_accelerators_when_built():
    want = _speedups.SessionState if _codec.ACCELERATED else _state.SessionState
    assert _codec.SessionState is want


@needs_c
def test_op_and_numpy_take_a_state_first():
    with pytest.raises(TypeError):
        _speedups.op(object(), None, "relu", [1])
    with pytest.raises(TypeError):
        _speedups.numpy(object(), None, None)


def test_session_delegates_to_its_state(session):
    st = session._state
    assert isinstance(st, _codec.SessionState)
    for name in type(st).FIELDS:
        assert getattr(session, "_" + name) is getattr(st, name), name
    a = session.tensor(np.arange(6, dtype=np.float32))
    b = a.relu()  # the op's request id and handle come from the state's counters
    rid, handle = next(st.ids), next(st.handles)
    session._ids = itertools.count(rid)  # written through the Session, read in the state
    assert st.ids is session._ids
    assert handle > b._handle
    np.testing.assert_array_equal(b.numpy(), np.arange(6, dtype=np.float32))
    assert st.open is True and st.busy is False
    del a, b
