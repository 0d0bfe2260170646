"""tdctl end to end: `apply` against numpy through real .npy files, exit codes,
--help for every subcommand, and the progress bar (drawn on a terminal, absent
when stderr is piped)."""

import os
import pty
import select
import subprocess

import numpy as np
import pytest

from conftest import TDCTL_BIN

SUBCOMMANDS = ["devices", "ping", "stats", "sessions", "apply"]


@pytest.fixture(scope="module")
def tdctl():
    if not os.access(TDCTL_BIN, os.X_OK):
        pytest.skip(f"tdctl not built at {TDCTL_BIN}")
    return TDCTL_BIN


def run(tdctl, daemon, *args, timeout=120):
    return subprocess.run([tdctl, "--endpoint", daemon.endpoint, *args], capture_output=True,
                          text=True, timeout=timeout)


def test_apply_add_matches_numpy(tdctl, daemon, tmp_path):
    rng = np.random.default_rng(3)
    a = rng.standard_normal((300, 200)).astype(np.float32)
    b = rng.standard_normal((300, 200)).astype(np.float32)
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "b.npy", b)
    r = run(tdctl, daemon, "apply", "add", str(tmp_path / "a.npy"), str(tmp_path / "b.npy"),
            "-o", str(tmp_path / "c.npy"))
    assert r.returncode == 0, r.stderr
    c = np.load(tmp_path / "c.npy")
    assert c.dtype == np.float32 and c.shape == a.shape
    assert c.tobytes() == (a + b).tobytes()  # same bytes as numpy


def test_apply_with_attributes_and_device(tdctl, daemon, tmp_path):
    a = np.arange(12, dtype=np.float64).reshape(3, 4)
    np.save(tmp_path / "a.npy", a)
    r = run(tdctl, daemon, "apply", "sum", str(tmp_path / "a.npy"), "-o",
            str(tmp_path / "s.npy"), "--device", "ref:0", "--attr", "dim=1", "--attr",
            "keepdim=true")
    assert r.returncode == 0, r.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "s.npy"), a.sum(axis=1, keepdims=True))


def test_daemon_error_exits_1_with_the_code_name(tdctl, daemon, tmp_path):
    np.save(tmp_path / "a.npy", np.ones((3, 4), np.float32))
    np.save(tmp_path / "b.npy", np.ones((4, 5), np.float32))
    r = run(tdctl, daemon, "apply", "add", str(tmp_path / "a.npy"), str(tmp_path / "b.npy"),
            "-o", str(tmp_path / "c.npy"))
    assert r.returncode == 1
    assert "SHAPE_MISMATCH" in r.stderr


def test_usage_errors_exit_2(tdctl, daemon, tmp_path):
    assert run(tdctl, daemon, "no-such-subcommand").returncode == 2
    assert run(tdctl, daemon, "apply", "add").returncode == 2  # no inputs, no -o
    np.save(tmp_path / "f.npy", np.asfortranarray(np.ones((3, 4), np.float32)))
    r = run(tdctl, daemon, "apply", "relu", str(tmp_path / "f.npy"), "-o",
            str(tmp_path / "o.npy"))
    assert r.returncode == 2 and "fortran" in r.stderr.lower()


def test_cannot_connect_exits_3(tdctl):
    r = subprocess.run([tdctl, "--endpoint", "tcp://127.0.0.1:1", "ping"], capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 3


@pytest.mark.parametrize("sub", SUBCOMMANDS)
def test_help_for_every_subcommand(tdctl, sub):
    r = subprocess.run([tdctl, sub, "--help"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and sub in r.stdout and "usage" in r.stdout.lower()


def test_ping_and_devices(tdctl, daemon):
    r = run(tdctl, daemon, "devices")
    assert r.returncode == 0 and "cpu:0" in r.stdout and "ref:0" in r.stdout
    r = run(tdctl, daemon, "ping", "-n", "20")
    assert r.returncode == 0 and "median" in r.stdout


def _big_inputs(tmp_path):
    a = np.random.default_rng(5).standard_normal(4 << 20).astype(np.float32)  # 16 MiB
    np.save(tmp_path / "big.npy", a)
    return a


def test_progress_bar_on_a_terminal(tdctl, daemon, tmp_path):
    a = _big_inputs(tmp_path)
    out = tmp_path / "neg.npy"
    # stderr on a pseudo-terminal, as under tmux or an interactive shell
    master, slave = pty.openpty()
    p = subprocess.Popen([tdctl, "--endpoint", daemon.endpoint, "apply", "neg",
                          str(tmp_path / "big.npy"), "-o", str(out)],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=slave)
    os.close(slave)
    seen = b""
    while True:
        ready, _, _ = select.select([master], [], [], 60)
        if not ready:
            break
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        seen += chunk
    os.close(master)
    assert p.wait(60) == 0
    text = seen.decode(errors="replace")
    assert "MiB/s" in text and "ETA" in text and "100%" in text, text
    np.testing.assert_array_equal(np.load(out), -a)


def test_no_progress_bar_when_piped(tdctl, daemon, tmp_path):
    a = _big_inputs(tmp_path)
    r = run(tdctl, daemon, "apply", "neg", str(tmp_path / "big.npy"), "-o",
            str(tmp_path / "neg.npy"))
    assert r.returncode == 0
    assert "MiB/s" not in r.stderr and "ETA" not in r.stderr and "\r" not in r.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "neg.npy"), -a)


def test_progress_rates_are_physical(tdctl, daemon, tmp_path):
    """The first sample may already count a whole buffer sent before the clock started:
    no drawn rate may be one that no loopback copy reaches (100 GiB/s), nor an ETA
    shown for it."""
    import re
    _big_inputs(tmp_path)
    master, slave = pty.openpty()
    p = subprocess.Popen([tdctl, "--endpoint", daemon.endpoint, "apply", "neg",
                          str(tmp_path / "big.npy"), "-o", str(tmp_path / "neg.npy")],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=slave)
    os.close(slave)
    seen = b""
    while True:
        ready, _, _ = select.select([master], [], [], 60)
        if not ready:
            break
        try:
            chunk = os.read(master, 65536)
        except OSError:
            break
        if not chunk:
            break
        seen += chunk
    os.close(master)
    assert p.wait(60) == 0
    frames = [f for f in seen.decode(errors="replace").split("\r") if "MiB/s" in f]
    assert frames, seen
    for f in frames:
        m = re.search(r"(\S+) MiB/s", f)
        assert m, f
        if m.group(1) != "--":
            assert float(m.group(1)) < 100 * 1024, f


def test_help_text_has_no_broken_lines(tdctl):
    """Every help line is one option or sentence: past the column where a description
    starts, no run of spaces (a missing newline glued two lines together)."""
    import re
    texts = [subprocess.run([tdctl, "--help"], capture_output=True, text=True,
                            timeout=30).stdout]
    for sub in ("devices", "ping", "stats", "sessions", "apply"):
        texts.append(subprocess.run([tdctl, sub, "--help"], capture_output=True, text=True,
                                    timeout=30).stdout)
    for text in texts:
        for line in text.splitlines():
            body = line.strip()
            parts = re.split(r" {2,}", body, maxsplit=1)
            assert len(parts) == 1 or "  " not in parts[1], line
            assert len(line) <= 80, line


def test_version_flag(tdctl):
    r = subprocess.run([tdctl, "--version"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and r.stdout.startswith("tdctl "), (r.returncode, r.stdout)
