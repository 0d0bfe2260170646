"""The client is a pip-installable package.

From a clean clone of the repository's HEAD: a fresh
``python3 -m venv --system-site-packages``, ``pip install ./client/python``
with the package index switched off (PIP_NO_INDEX: nothing may come from the
network; the build backend is Debian's setuptools), then a session run from
outside the source tree, with the installed package (tensordd_pb2 generated at
build time: the clone has none and still has none afterwards), and
``python3 -m tensordd --version``. About 10 s, so it runs in ``make test``.

In the tree, ``make`` writes tensordd_pb2 into the build directory
(``$(BUILD)/python/tensordd/``), never into client/python, and the package
finds it there from ``PYTHONPATH=client/python:$(BUILD)/python``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _run(args, **kw):
    if args[0] == "make" and "env" not in kw:
        # not the outer make's variables (make BUILD=... or SAN=... test: make puts them in
        # MAKEFLAGS and in the environment too): the clone's own
        kw["env"] = {k: v for k, v in os.environ.items()
                     if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES", "BUILD",
                                  "SAN", "WERROR", "OPT", "NVCC", "TDD_EMU")}
    p = subprocess.run(args, capture_output=True, text=True, timeout=120, **kw)
    assert p.returncode == 0, f"{args} -> {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return p.stdout


PY = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable


@pytest.fixture(scope="module")
def clone(tmp_path_factory):
    """A clean clone of HEAD: (the directory that holds it, the clone)."""
    if shutil.which("git") is None:
        pytest.skip("git not installed")
    base = tmp_path_factory.mktemp("pkg")
    _run(["git", "clone", "-q", "--no-hardlinks", ROOT, str(base / "clone")])
    return base, base / "clone"


def test_make_generates_into_the_build_directory(clone):
    base, tree = clone
    if shutil.which("make") is None or shutil.which("protoc") is None:
        pytest.skip("make or protoc not installed")
    _run(["make", "-s", "BUILD=b", "b/python/tensordd/tensordd_pb2.py"], cwd=str(tree))
    assert (tree / "b" / "python" / "tensordd" / "tensordd_pb2.py").is_file()
    assert not (tree / "client" / "python" / "tensordd" / "tensordd_pb2.py").exists()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = f"{tree}/client/python:{tree}/b/python"
    code = ("import tensordd, tensordd.tensordd_pb2 as pb, sys\n"
            "assert pb.__file__.startswith(sys.argv[1]), pb.__file__\n"
            "assert tensordd.__file__.startswith(sys.argv[2]), tensordd.__file__\n")
    _run([PY, "-c", code, f"{tree}/b/python", f"{tree}/client/python"], env=env, cwd=str(base))
    # without it, the import says what to do
    env["PYTHONPATH"] = f"{tree}/client/python"
    p = subprocess.run([PY, "-c", "import tensordd"], env=env, cwd=str(base), capture_output=True,
                       text=True, timeout=60)
    assert p.returncode != 0 and "PYTHONPATH=client/python:build/python" in p.stderr
    _run(["make", "-s", "build/python/tensordd/tensordd_pb2.py"], cwd=str(tree))
    # the default build directory's is found without PYTHONPATH naming it
    _run([PY, "-c", code, f"{tree}/build/python", f"{tree}/client/python"], env=env,
         cwd=str(base))
    _run(["make", "-s", "clean"], cwd=str(tree))
    assert not (tree / "build").exists()
    assert subprocess.run(["git", "status", "--porcelain", "--ignored", "client"], cwd=str(tree),
                          capture_output=True, text=True).stdout == ""


@pytest.fixture(scope="module")
def venv(clone):
    py = PY
    probe = subprocess.run([py, "-c", "import venv, ensurepip"], capture_output=True)
    if probe.returncode:
        pytest.skip("python3-venv not installed")
    base, clone = clone
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


def test_plain_venv(clone, daemon):
    """A plain venv (no system site-packages) where numpy and protobuf are installed
    (here: Debian's, put on the venv's path by a .pth file, as an installed package
    is): pip builds the client offline (the backend finds Debian's setuptools by
    itself inside pip's isolated build) and its dependencies are satisfied."""
    base, tree = clone
    probe = subprocess.run([PY, "-c", "import venv, ensurepip"], capture_output=True)
    if probe.returncode or not os.path.isdir("/usr/lib/python3/dist-packages/numpy"):
        pytest.skip("python3-venv or Debian's numpy not installed")
    env_dir = base / "plain"
    _run([PY, "-m", "venv", str(env_dir)])
    py = str(env_dir / "bin" / "python")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PIP_FIND_LINKS")}
    env.update(PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1")
    site = _run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                env=env).strip()
    assert _run([py, "-c", "import sys; print(sys.prefix != sys.base_prefix)"], env=env).strip() \
        == "True"
    with open(os.path.join(site, "deps-from-debian.pth"), "w") as f:
        f.write("/usr/lib/python3/dist-packages\n")
    _run([py, "-m", "pip", "install", str(tree / "client" / "python")], env=env, cwd=str(base))
    assert not (tree / "client" / "python" / "tensordd" / "tensordd_pb2.py").exists()
    shown = _run([py, "-m", "pip", "show", "tensordd"], env=env, cwd=str(base))
    assert "Requires: numpy, protobuf" in shown, shown
    code = ("import sys, numpy as np, tensordd\n"
            "assert tensordd.__file__.startswith(sys.prefix), tensordd.__file__\n"
            "with tensordd.connect() as s:\n"
            "    print(repr(s.tensor(np.arange(3, dtype=np.float32)) * 2))\n")
    out = _run([py, "-c", code], env=dict(env, TENSORDD_ENDPOINT=daemon.endpoint), cwd=str(base))
    assert out.strip() == "tensor([0., 2., 4.], device='cpu:0', dtype=tensordd.float32)"
