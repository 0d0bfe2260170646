"""localblas.py -- local PyTorch on N threads, its BLAS included.

torch.set_num_threads(N) sets PyTorch's own intra-op threads only: a PyTorch linked to a
pthreads OpenBLAS (Debian's torch is, through libblas.so.3) still runs every GEMM on
OpenBLAS's own pool, one thread per core by default. A "1 thread" local baseline then ran
its GEMMs on 2 cores against a daemon started with --threads 1 (the MLP 784-1024-1024-10
step: 1.7-1.8x local by the wall clock at an equal CPU time per step). set_threads(N) sets
both; blas_threads() says what the loaded OpenBLAS uses (None: no OpenBLAS in the process).
"""
import ctypes

import torch


def _openblas():
    """The OpenBLAS libraries mapped into this process (after torch's import)."""
    libs = []
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "blas" in line}
    except OSError:
        return libs
    for p in sorted(paths):
        if not p.startswith("/"):
            continue
        try:
            lib = ctypes.CDLL(p)
            lib.openblas_get_num_threads  # noqa: B018  (only OpenBLAS has it)
        except (OSError, AttributeError):
            continue
        libs.append(lib)
    return libs


def set_threads(n):
    """PyTorch's intra-op threads and its OpenBLAS's (if any) to n."""
    torch.set_num_threads(n)
    for lib in _openblas():
        lib.openblas_set_num_threads(ctypes.c_int(n))


def blas_threads():
    """The thread count of the OpenBLAS PyTorch uses, or None."""
    libs = _openblas()
    return libs[0].openblas_get_num_threads() if libs else None
