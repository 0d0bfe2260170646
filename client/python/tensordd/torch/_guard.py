"""Loads the PrivateUse1 device guard (_guard.c, built as tensordd/_torch_guard.so).

Torch 1.13 registers no DeviceGuardImpl for PrivateUse1, and its autograd engine and
Python indexing need one. The shared object copies Meta's no-op guard; this module
checks, before letting it, that the guards' vtables have torch 1.13's layout: CPU's
and Meta's share exactly the base class's slots 6, 7 and 16 (getDefaultStream,
getStreamFromGlobalPool, recordDataPtrOnStream) of 19.
"""

from __future__ import annotations

import ctypes
import os

import torch

_CPU, _META, _PRIVATEUSE1 = 0, 14, 19  # c10::DeviceType in torch 1.13
_SLOTS = 19
_SHARED = (6, 7, 16)
_loaded = False


def _find_library() -> str:
    import glob

    import tensordd
    for d in tensordd.__path__:
        for path in [os.path.join(d, "_torch_guard.so"),  # (make's; pip's has a suffix)
                     *sorted(glob.glob(os.path.join(d, "_torch_guard.*.so")))]:
            if os.path.isfile(path):
                return path
    raise ImportError("tensordd.torch: _torch_guard.so is missing (make builds it into the "
                      "build directory's python/tensordd/, pip install ./client/python "
                      "into the package)")


def _c10():
    with open("/proc/self/maps", encoding="utf-8") as f:
        for line in f:
            path = line.split()[-1]
            if os.path.basename(path).startswith("libc10.so"):
                return ctypes.CDLL(path)
    return ctypes.CDLL("libc10.so")


def install() -> None:
    """Registers the guard once (a no-op when torch already has one)."""
    global _loaded
    if _loaded:
        return
    if not torch.__version__.startswith("1.13"):
        raise ImportError(f"tensordd.torch needs torch 1.13 (this is {torch.__version__}): "
                          f"its PrivateUse1 device guard is built for 1.13's layout")
    c10 = _c10()
    registry = ctypes.c_void_p.in_dll(c10, "_ZN3c104impl26device_guard_impl_registryE")
    base = ctypes.addressof(registry)

    def vptr_of(device_type):
        obj = ctypes.c_void_p.from_address(base + 8 * device_type).value
        if not obj:
            return None
        return ctypes.c_void_p.from_address(obj).value

    if ctypes.c_void_p.from_address(base + 8 * _PRIVATEUSE1).value:
        _loaded = True
        return
    cpu, meta = vptr_of(_CPU), vptr_of(_META)
    if not cpu or not meta:
        raise ImportError("tensordd.torch: torch's CPU or Meta device guard is missing")

    def slot(vptr, i):
        return ctypes.c_void_p.from_address(vptr + 8 * i).value

    same = tuple(i for i in range(_SLOTS) if slot(cpu, i) == slot(meta, i))
    if same != _SHARED:
        raise ImportError(f"tensordd.torch: torch's device guard layout is not 1.13's "
                          f"(shared slots {same}, expected {_SHARED})")
    lib = ctypes.CDLL(_find_library())
    lib.tdd_guard_register.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
    rc = lib.tdd_guard_register(base, _META, _PRIVATEUSE1)
    if rc < 0:
        raise ImportError("tensordd.torch: could not register the PrivateUse1 device guard")
    _loaded = True
