"""Helpers shared by the daemon tests."""

from __future__ import annotations

import pytest

import tensordd

_known: dict = {}


def require_ops(session, *names: str) -> None:
    """Skips the test if the daemon does not know one of the ops yet.

    The op set grows over time (first add sub mul div matmul sum relu); a
    test of a later op skips, with the op named, until the daemon serves it.
    Probing sends the op with no inputs: only an unknown name answers
    UNSUPPORTED_OP (an arity or attribute complaint means the op exists).
    """
    missing = []
    for name in names:
        if name not in _known:
            session.op(name)
            try:
                session.sync()
                _known[name] = True
            except tensordd.UnsupportedOpError:
                _known[name] = False
            except tensordd.Error:
                _known[name] = True
        if not _known[name]:
            missing.append(name)
    if missing:
        pytest.skip(f"daemon does not serve op(s) yet: {', '.join(missing)}")


def autodiff_served(session) -> bool:
    """Whether the daemon answers Backward (False while autodiff is a stub)."""
    if "<backward>" not in _known:
        x = session.tensor([1.0], requires_grad=True)
        try:
            x.sum().backward()
            _known["<backward>"] = True
        except tensordd.UnsupportedOpError:
            _known["<backward>"] = False
        except tensordd.Error:
            _known["<backward>"] = True
    return _known["<backward>"]


def require_autodiff(session) -> None:
    if not autodiff_served(session):
        pytest.skip("daemon answers UNSUPPORTED_OP to Backward: autodiff not served yet")
