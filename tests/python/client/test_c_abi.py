"""The C interface can grow without breaking programs: a program built against the
0.9.0 headers (tests/abi/include-0.9.0, saved before td_options and td_stats_sessions
existed) runs against today's libtensordd.so, td_error_set included (still exported,
no longer declared); a program built against today's header uses connect options by
name (a token file: an option td_connect_opts never had), every session through
td_stats_sessions (with an older, smaller record too) and string and float-list
attributes."""

import os
import shutil
import subprocess

import pytest

from conftest import TDD_BIN
from daemonproc import Proc

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
BUILD = os.path.dirname(os.path.abspath(TDD_BIN))
CC = os.environ.get("CC", "cc")


def build(tmp_path, src, include):
    if not shutil.which(CC):
        pytest.skip(f"no C compiler {CC}")
    exe = tmp_path / os.path.basename(src).replace(".c", "")
    lib = tmp_path / "lib"  # the build's libtensordd.so under its soname, as installed
    if not lib.exists():
        lib.mkdir()
        (lib / "libtensordd.so.0").symlink_to(os.path.join(BUILD, "libtensordd.so"))
        (lib / "libtensordd.so").symlink_to("libtensordd.so.0")
    r = subprocess.run([CC, "-std=c11", "-Wall", "-Werror", f"-I{include}",
                        os.path.join(ROOT, "tests", "abi", src), f"-L{lib}", "-ltensordd",
                        f"-Wl,-rpath,{lib}", "-o", str(exe)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return exe


@pytest.fixture
def tokened(tmp_path):
    tok = tmp_path / "token"
    tok.write_text("abi-token\n")
    tok.chmod(0o600)
    with Proc(["--listen", "tcp://127.0.0.1:0", "--token-file", str(tok),
               "--session-memory", "1G"]) as d:
        yield d, tok
    assert d.proc.returncode == 0, d.log()


def test_a_program_built_against_the_old_header_runs(tmp_path, tokened):
    d, _ = tokened
    exe = build(tmp_path, "old_client.c", os.path.join(ROOT, "tests", "abi", "include-0.9.0"))
    r = subprocess.run([str(exe), d.endpoint, "abi-token"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "old client: sum 10" in r.stdout


def test_new_connect_options_sessions_and_attributes(tmp_path, tokened):
    d, tok = tokened
    exe = build(tmp_path, "new_client.c", os.path.join(ROOT, "include"))
    r = subprocess.run([str(exe), d.endpoint, str(tok)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


def test_td_error_set_is_not_declared_for_new_programs(tmp_path):
    src = tmp_path / "uses_set.c"
    src.write_text('#include "tensordd.h"\nint main(void) { td_error e; '
                   'return td_error_set(&e, -1, "x"); }\n')
    r = subprocess.run([CC, "-std=c11", "-Werror=implicit-function-declaration",
                        f"-I{os.path.join(ROOT, 'include')}", "-c", str(src), "-o",
                        str(tmp_path / "u.o")], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "td_error_set" in r.stderr
