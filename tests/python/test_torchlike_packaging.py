"""Issue 12, Build 1: the client is a pip-installable package.

From a clean clone of the repository's HEAD: a fresh
``python3 -m venv --system-site-packages``, ``pip install ./client/python``
with the package index switched off (PIP_NO_INDEX: nothing may come from the
network; the build backend is Debian's setuptools), then a session run from
outside the source tree, with the installed package (tensordd_pb2 generated at
build time: the clone has none and still has none afterwards), and
``python3 -m tensordd --version``. About 10 s, so it runs in ``make test``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(args, **kw):
    p = subprocess.run(args, capture_output=True, text=True, timeout=120, **kw)
    assert p.returncode == 0, f"{args} -> {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return p.stdout


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    if shutil.which("git") is None:
        pytest.skip("git not installed")
    py = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
    probe = subprocess.run([py, "-c", "import venv, ensurepip"], capture_output=True)
    if probe.returncode:
        pytest.skip("python3-venv not installed")
    base = tmp_path_factory.mktemp("pkg")
    clone = base / "clone"
    _run(["git", "clone", "-q", "--no-hardlinks", ROOT, str(clone)])
    pkg = clone / "client" / "python"
    assert not (pkg / "tensordd" / "tensordd_pb2.py").exists()
    env_dir = base / "venv"
    _run([py, "-m", "venv", "--system-site-packages", str(env_dir)])
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PIP_FIND_LINKS")}
    env.update(PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1")
    _run([str(env_dir / "bin" / "pip"), "install", str(pkg)], env=env, cwd=str(base))
    # the build wrote no generated module into the source tree
    assert not (pkg / "tensordd" / "tensordd_pb2.py").exists()
    return env_dir, env, base


def test_version(venv):
    env_dir, env, base = venv
    out = _run([str(env_dir / "bin" / "python"), "-m", "tensordd", "--version"], env=env,
               cwd=str(base))
    assert out.startswith("tensordd-python ") and "(protocol 1)" in out


def test_session_from_outside_the_source_tree(venv, daemon):
    env_dir, env, base = venv
    code = (
        "import sys, numpy as np, tensordd\n"
        "assert tensordd.__file__.startswith(sys.prefix), tensordd.__file__\n"
        "import tensordd.tensordd_pb2, tensordd.nn, tensordd.optim.lr_scheduler\n"
        "with tensordd.connect() as s:\n"
        "    x = tensordd.tensor(np.arange(6, dtype=np.float32).reshape(2, 3))\n"
        "    m = tensordd.nn.Linear(3, 2)\n"
        "    print(float((x * 2).sum()), m(x).shape)\n"
    )
    env = dict(env, TENSORDD_ENDPOINT=daemon.endpoint)
    out = _run([str(env_dir / "bin" / "python"), "-c", code], env=env, cwd=str(base))
    assert out.split() == ["30.0", "(2,", "2)"]
