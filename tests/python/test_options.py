"""The daemon's options come from one table: --help lists each with its default,
and a bad value is one line naming the flag and what it takes, exit code 2."""

import subprocess

import pytest

from conftest import TDD_BIN


def run(*args):
    return subprocess.run([TDD_BIN, *args], capture_output=True, text=True, timeout=30)


def test_help_lists_every_option_with_its_default():
    r = run("--help")
    assert r.returncode == 0
    for flag, default in [("--max-frame", "4M"), ("--max-payload", "64G"),
                          ("--max-sessions", "1024"), ("--hello-timeout", "10"),
                          ("--write-timeout", "20"), ("--max-write-queue", "64M"),
                          ("--idle-timeout", "never"), ("--session-memory", "none")]:
        line = next((ln for ln in r.stdout.splitlines() if ln.strip().startswith(flag + " ")),
                    None)
        assert line is not None, f"{flag} missing from --help:\n{r.stdout}"
        text = r.stdout[r.stdout.index(line):].split("\n  --", 1)[0]
        assert f"(default {default})" in " ".join(text.split()), text
    assert all(len(ln) <= 80 for ln in r.stdout.splitlines())


@pytest.mark.parametrize("args, flag", [
    (["--max-frame", "4Q"], "--max-frame"),
    (["--max-frame=4Q"], "--max-frame"),
    (["--cpu-devices", "x"], "--cpu-devices"),
    (["--cpu-devices", "0"], "--cpu-devices"),
    (["--max-sessions", "-3"], "--max-sessions"),
    (["--write-timeout", "1.5"], "--write-timeout"),
    (["--max-handles", "99999999999999999999999"], "--max-handles"),
    (["--log-level", "loud"], "--log-level"),
    (["--bogus"], "--bogus"),
    (["--transfer-peers", "10.0.0.0/33"], "--transfer-peers"),
    (["--transfer-peers", "10.0.0.1,example.org"], "--transfer-peers"),
])
def test_bad_value_is_one_line_naming_the_flag(args, flag):
    r = run(*args)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert flag in lines[0] and "tensordd:" in lines[0], lines[0]
    assert f"for {args[-1]}" not in lines[0] or args[-1].startswith("--"), lines[0]


def test_version_is_the_one_hello_reports(daemon):
    import tensordd
    r = run("--version")
    assert r.returncode == 0
    with tensordd.connect(daemon.endpoint, timeout=10) as s:
        server = s.server
    assert r.stdout.split()[:2] == server.split()[:2], (r.stdout, server)


@pytest.mark.parametrize("poll", ["0", "100", "5000"])
def test_loop_serves_with_and_without_polling(start_daemon, poll):
    """--poll-us only changes how the loop waits (polling after a request, or
    sleeping at once): answers, timers and shutdown are the same."""
    import numpy as np
    import tensordd
    # (--poll-min-cpus 1: polling on this machine whatever its CPU count)
    d = start_daemon("--poll-us", poll, "--poll-min-cpus", "1", "--idle-timeout", "1")
    with tensordd.connect(d.endpoint, timeout=10) as s:
        a = np.arange(6, dtype=np.float32)
        for _ in range(50):
            assert float((s.tensor(a) * 2).sum().numpy()) == 30.0
    assert d.stop() == 0, d.log()
