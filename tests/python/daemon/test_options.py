"""The daemon's options come from one table: --help lists each with its default,
and a bad value is one line naming the flag and what it takes, exit code 2."""

import re
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


def option_blocks(text):
    """--help's option entries: {flag: its text, lines joined}."""
    blocks, cur = {}, None
    for line in text.splitlines():
        m = re.match(r"^  (--[a-z0-9-]+)", line)
        if m:
            cur = m.group(1)
            blocks[cur] = line[len(m.group(0)):]
        elif cur and line.startswith(" " * 27):
            blocks[cur] += " " + line.strip()
        else:
            cur = None
    return {k: " ".join(v.split()) for k, v in blocks.items()}


COMMANDS = {"--help", "--version", "--check-config"}


def test_every_option_help_ends_with_its_default():
    r = run("--help")
    blocks = option_blocks(r.stdout)
    assert len(blocks) > 50, r.stdout
    for flag, text in blocks.items():
        if flag in COMMANDS:
            continue
        assert re.search(r"\(default [^()]+(\([^()]*\))?[^()]*\)$", text), (flag, text)
    # texts once cut at 320 bytes lost their ends
    assert blocks["--poll-us"].endswith("(default 100)"), blocks["--poll-us"]
    assert "where shmem has no huge pages" in blocks["--memfd-storage-min"]
    assert blocks["--memfd-storage-min"].endswith("(default never)")


def test_man_page_has_every_default():
    """tensordd(8) is made from --help: it keeps the defaults the help ends with."""
    import os
    man = os.path.join(os.path.dirname(TDD_BIN), "man", "tensordd.8")
    if not os.path.exists(man):
        pytest.skip("no man page built (make man)")
    page = open(man).read().replace("\\-", "-").replace("\\e", "\\")
    page = " ".join(re.sub(r"^\.\S+.*$", "", page, flags=re.M).split())
    assert "(default 100)" in page and "(default never)" in page
    assert "where shmem has no huge pages" in page
