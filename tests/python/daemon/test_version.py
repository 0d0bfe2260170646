"""One version, from one place (include/tensordd.h's TD_VERSION_*): the daemon's
--version and HelloReply, tdctl --version, `python3 -m tensordd --version`,
td_version_string() of the built library and tensordd.pc all say it."""

import ctypes
import os
import re
import subprocess
import sys

import tensordd

from conftest import TDD_BIN

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
BUILD = os.path.dirname(os.path.abspath(TDD_BIN))
TDCTL = os.environ.get("TDCTL_BIN", os.path.join(BUILD, "tdctl"))


def header_version():
    text = open(os.path.join(ROOT, "include", "tensordd.h")).read()
    parts = [re.search(rf"#define TD_VERSION_{k} (\d+)", text).group(1)
             for k in ("MAJOR", "MINOR", "PATCH")]
    return ".".join(parts)


def second_word(cmd, env=None):
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0, (cmd, r.returncode, r.stdout, r.stderr)
    return r.stdout.split()[1]


def test_every_program_says_the_header_version(daemon):
    v = header_version()
    assert second_word([TDD_BIN, "--version"]) == v
    assert second_word([TDCTL, "--version"]) == v
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    assert second_word([sys.executable, "-m", "tensordd", "--version"], env=env) == v
    assert tensordd.__version__ == v
    lib = ctypes.CDLL(os.path.join(BUILD, "libtensordd.so"))
    lib.td_version_string.restype = ctypes.c_char_p
    assert lib.td_version_string().decode() == v
    with tensordd.connect(daemon.endpoint, timeout=10) as s:
        assert s.server == f"tensordd {v}", s.server
    pc = open(os.path.join(BUILD, "tensordd.pc")).read()
    assert re.search(rf"^Version: {re.escape(v)}$", pc, re.M), pc


def test_the_header_documents_no_other_version():
    """td_version_string's comment once named a version of its own."""
    text = open(os.path.join(ROOT, "include", "tensordd.h")).read()
    v = header_version()
    for m in re.finditer(r'"(\d+\.\d+\.\d+)"', text):
        assert m.group(1) == v, m.group(0)
