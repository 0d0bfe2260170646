"""tdctl's output file and exit codes under failure: a full
filesystem is a clear message and exit 1, never a signal, and leaves neither a
partial output nor a temporary file; an existing output survives a failed run; a
malformed endpoint is a usage error (2), not a failed connect (3)."""

import os
import subprocess
import uuid

import numpy as np
import pytest

from conftest import TDCTL_BIN


@pytest.fixture(scope="module")
def tdctl():
    if not os.access(TDCTL_BIN, os.X_OK):
        pytest.skip(f"tdctl not built at {TDCTL_BIN}")
    return TDCTL_BIN


@pytest.fixture
def small_fs(tmp_path):
    """A 256 KiB tmpfs (needs root and mount rights: skipped where the machine refuses)."""
    mnt = tmp_path / f"fs-{uuid.uuid4().hex[:8]}"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def apply(tdctl, daemon, src, out):
    return subprocess.run([tdctl, "--endpoint", daemon.endpoint, "apply", "neg", str(src), "-o",
                           str(out)], capture_output=True, text=True, timeout=120)


def test_full_filesystem_is_exit_1_with_a_message_and_no_file(tdctl, daemon, tmp_path,
                                                              small_fs):
    big = np.arange(1 << 18, dtype=np.float32)  # 1 MiB: four times the filesystem
    np.save(tmp_path / "big.npy", big)
    r = apply(tdctl, daemon, tmp_path / "big.npy", small_fs / "out.npy")
    # before: exit 3 "IO: Bad address" (recv(2) into the mapping past the disk end; the
    # issue saw a SIGBUS, 135, where a store touched it first)
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert "no space" in r.stderr.lower(), r.stderr
    assert os.listdir(small_fs) == [], os.listdir(small_fs)  # no partial, no temporary


def test_output_fits_then_replaces_atomically(tdctl, daemon, tmp_path, small_fs):
    small = np.arange(1000, dtype=np.float32)
    np.save(tmp_path / "small.npy", small)
    out = small_fs / "out.npy"
    assert apply(tdctl, daemon, tmp_path / "small.npy", out).returncode == 0
    np.testing.assert_array_equal(np.load(out), -small)
    # A failing run (too big) leaves the earlier output as it was.
    np.save(tmp_path / "big.npy", np.zeros(1 << 18, np.float32))
    assert apply(tdctl, daemon, tmp_path / "big.npy", out).returncode == 1
    np.testing.assert_array_equal(np.load(out), -small)
    assert sorted(os.listdir(small_fs)) == ["out.npy"]


def test_failed_op_leaves_no_output(tdctl, daemon, tmp_path):
    np.save(tmp_path / "a.npy", np.ones(3, np.float32))
    r = subprocess.run([tdctl, "--endpoint", daemon.endpoint, "apply", "sum",
                        str(tmp_path / "a.npy"), "-o", str(tmp_path / "o.npy"), "--attr",
                        "dim=5"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    assert sorted(os.listdir(tmp_path)) == ["a.npy"]


@pytest.mark.parametrize("endpoint", ["foo", "http://127.0.0.1:1", "127.0.0.1:7070"])
def test_malformed_endpoint_is_a_usage_error(tdctl, endpoint):
    r = subprocess.run([tdctl, "--endpoint", endpoint, "devices"], capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "endpoint" in r.stderr
