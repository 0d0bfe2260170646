"""A PEP 517 shim over setuptools.build_meta that builds offline.

pip builds in an isolated environment that sees no system site-packages, so
``requires = ["setuptools", "wheel"]`` would make it download them. This shim
declares no requirements and, when setuptools is not importable in the
isolated environment, takes Debian's (python3-setuptools, python3-wheel) from
the system's dist-packages. Everything else is setuptools' own backend.
"""

from __future__ import annotations

import os
import sys


def _import_setuptools():
    try:
        from setuptools import build_meta  # noqa: F401
        import wheel  # noqa: F401
        return build_meta
    except ImportError:
        pass
    version = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    candidates = [
        "/usr/lib/python3/dist-packages",
        os.path.join(sys.base_prefix, "lib", "python3", "dist-packages"),
        os.path.join(sys.base_prefix, "lib", version, "dist-packages"),
        os.path.join(sys.base_prefix, "lib", version, "site-packages"),
    ]
    for d in candidates:
        if os.path.isdir(os.path.join(d, "setuptools")) and d not in sys.path:
            sys.path.append(d)
    try:
        from setuptools import build_meta
        import wheel  # noqa: F401
    except ImportError as e:
        raise ImportError(
            "building tensordd needs setuptools>=61 and wheel (Debian: apt-get install "
            "python3-setuptools python3-wheel; elsewhere: pip install setuptools wheel, then "
            "pip install --no-build-isolation ./client/python)") from e
    return build_meta


_sb = _import_setuptools()


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


prepare_metadata_for_build_wheel = _sb.prepare_metadata_for_build_wheel
build_wheel = _sb.build_wheel
build_sdist = _sb.build_sdist
if hasattr(_sb, "build_editable"):
    prepare_metadata_for_build_editable = _sb.prepare_metadata_for_build_editable
    build_editable = _sb.build_editable
