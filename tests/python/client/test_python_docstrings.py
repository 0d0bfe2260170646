"""A docstring on every public name of the Python client:
the package's functions and classes, and each public method and property
those classes define (tensordd, tensordd.nn, tensordd.nn.functional,
tensordd.optim, tensordd.optim.lr_scheduler and the modules they come from;
private modules such as _wire, whose names the modules import, are not public).
"""

from __future__ import annotations

import importlib
import inspect

import tensordd

MODULES = ["tensordd", "tensordd.nn", "tensordd.nn.functional", "tensordd.optim",
           "tensordd.optim.lr_scheduler", "tensordd.session", "tensordd.tensor",
           "tensordd.autograd", "tensordd.device", "tensordd.dtypes", "tensordd.errors"]


def _ours(o) -> bool:
    mod = getattr(o, "__module__", "") or ""
    return mod.startswith("tensordd") and not any(p.startswith("_") for p in mod.split("."))


def _public_names():
    seen = {}
    for name in MODULES:
        mod = importlib.import_module(name)
        for n, o in vars(mod).items():
            if n.startswith("_"):
                continue
            if inspect.isclass(o) and _ours(o):
                seen[f"{o.__module__}.{o.__qualname__}"] = o
                for m, f in vars(o).items():
                    if m.startswith("_"):
                        continue
                    if isinstance(f, (staticmethod, classmethod)):
                        f = f.__func__
                    if inspect.isfunction(f) or isinstance(f, property):
                        seen[f"{o.__module__}.{o.__qualname__}.{m}"] = f
            elif inspect.isfunction(o) and _ours(o):
                seen[f"{o.__module__}.{o.__qualname__}"] = o
    return seen


def test_every_public_name_has_a_docstring():
    names = _public_names()
    assert len(names) > 250 and "tensordd.tensor.Tensor.relu" in names
    missing = sorted(k for k, o in names.items() if not (o.__doc__ or "").strip())
    assert not missing, f"{len(missing)} public names without a docstring: {missing}"
    assert tensordd.Tensor.__doc__ and tensordd.connect.__doc__
