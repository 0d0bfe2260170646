"""Logging: text or JSON lines; syslog priority prefixes when stderr is the journal
($JOURNAL_STREAM names stderr's device and inode); sessions opening and closing and
failed authentication at info with peer and client name; `listening on` in the log
with a timestamp (stdout keeps its plain line for scripts)."""

import datetime
import json
import os
import re
import tempfile

import numpy as np
import pytest
import tensordd

from daemonproc import Proc

TS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


def one_session(endpoint, **kw):
    with tensordd.connect(endpoint, timeout=10, **kw) as s:
        a = s.tensor(np.arange(4, dtype=np.float32))
        assert float((a * 2).sum().numpy()) == 12.0
        return s.session_id if hasattr(s, "session_id") else None


def test_json_lines_parse_and_carry_session_ids():
    with Proc(["--listen", "tcp://127.0.0.1:0", "--log-format", "json"]) as d:
        one_session(d.endpoint)
        one_session(d.endpoint)
    assert d.proc.returncode == 0, d.log()
    recs = [json.loads(line) for line in d.stderr_lines()]  # every line is one object
    for r in recs:
        assert set(r) <= {"ts", "level", "msg", "conn", "session"}, r
        assert r["level"] in ("error", "warn", "info", "debug"), r
        assert TS.match(r["ts"]), r
        datetime.datetime.strptime(r["ts"], "%Y-%m-%dT%H:%M:%S.%fZ")
    opened = [r for r in recs if re.match(r"session \d+ opened", r["msg"])]
    closed = [r for r in recs if re.match(r"session \d+ closed", r["msg"])]
    assert len(opened) == 2 and len(closed) == 2, recs
    for r in opened + closed:
        sid = int(r["msg"].split()[1])
        assert r["session"] == sid and r["conn"] == sid, r
        assert r["level"] == "info"
        assert "peer 127.0.0.1:" in r["msg"] and "client 'tensordd-python'" in r["msg"], r
    assert opened[0]["session"] != opened[1]["session"]
    listening = [r for r in recs if r["msg"].startswith("listening on tcp://127.0.0.1:")]
    assert listening and listening[0]["level"] == "info"
    assert listening[0]["msg"].split()[2] == d.endpoint


def test_json_escapes_what_it_quotes(tmp_path):
    """A client name with quotes, backslashes and control characters stays one valid line."""
    from helpers import hello, raw, read_frame  # the raw-frame helpers of the suite
    with Proc(["--listen", "tcp://127.0.0.1:0", "--log-format", "json"]) as d:
        sock = raw(d.endpoint)
        sock.sendall(hello(name='evil"\\\n\x01name'))
        read_frame(sock)
        sock.close()
    recs = [json.loads(line) for line in d.stderr_lines()]
    names = [r["msg"] for r in recs if "opened" in r["msg"]]
    assert names and 'client \'evil"\\\n\x01name\'' in names[0], names


def test_text_lines_cannot_be_forged_by_a_client_name():
    """Text mode escapes control characters: a newline in a name is not a new line."""
    from helpers import hello, raw, read_frame
    with Proc(["--listen", "tcp://127.0.0.1:0"]) as d:
        sock = raw(d.endpoint)
        sock.sendall(hello(name="x\n2026-01-01T00:00:00.000Z error forged"))
        read_frame(sock)
        sock.close()
    lines = d.stderr_lines()
    assert not any(ln.startswith("2026-01-01T00:00:00.000Z") for ln in lines), lines
    assert any("x\\x0a2026-01-01" in ln for ln in lines), lines


def test_text_lines_have_time_and_level():
    with Proc(["--listen", "tcp://127.0.0.1:0"]) as d:
        one_session(d.endpoint)
    lines = d.stderr_lines()
    assert lines
    for line in lines:
        ts, level, _ = line.split(None, 2)
        assert TS.match(ts) and level in ("error", "warn", "info", "debug"), line
    assert any(re.search(r"info  listening on tcp://", ln) for ln in lines), lines
    assert any(re.search(r"info  session \d+ opened: peer 127\.0\.0\.1:\d+, client "
                         r"'tensordd-python'", ln) for ln in lines), lines
    assert any(re.search(r"info  session \d+ closed: peer", ln) for ln in lines), lines
    # stdout keeps the bare line scripts parse
    assert d.stdout[0] == f"listening on {d.endpoint}\n"


def test_auth_failure_is_logged_with_peer_and_client(tmp_path):
    tok = tmp_path / "tok"
    tok.write_text("right\n")
    tok.chmod(0o600)
    with Proc(["--listen", "tcp://127.0.0.1:0", "--token-file", str(tok)]) as d:
        with pytest.raises(tensordd.UnauthenticatedError):
            one_session(d.endpoint, token="wrong")
    lines = [ln for ln in d.stderr_lines() if "authentication failed" in ln]
    assert len(lines) == 1, d.log()
    assert " info " in lines[0] and "peer 127.0.0.1:" in lines[0]
    assert "client 'tensordd-python'" in lines[0]


def journal_env(path):
    st = os.stat(path)
    return {"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_journal_prefixes_when_stderr_is_the_journal(fmt):
    fd, path = tempfile.mkstemp(prefix="tdd-journal-")
    os.close(fd)
    try:
        with Proc(["--listen", "tcp://127.0.0.1:0", "--log-format", fmt, "--log-level", "debug"],
                  env=journal_env(path), stderr_path=path) as d:
            one_session(d.endpoint)
        lines = d.stderr_lines()
        assert lines
        prio = {"error": "<3>", "warn": "<4>", "info": "<6>", "debug": "<7>"}
        seen = set()
        for line in lines:
            m = re.match(r"^<(\d)>(.*)$", line)
            assert m, line
            body = m.group(2)
            level = json.loads(body)["level"] if fmt == "json" else body.split()[1]
            assert f"<{m.group(1)}>" == prio[level], line
            seen.add(level)
        assert {"info", "debug"} <= seen, lines
    finally:
        os.unlink(path)


def test_no_prefixes_when_journal_stream_is_another_file():
    fd, path = tempfile.mkstemp(prefix="tdd-journal-")
    os.close(fd)
    other = tempfile.NamedTemporaryFile(prefix="tdd-other-")
    try:
        with Proc(["--listen", "tcp://127.0.0.1:0"], env=journal_env(other.name),
                  stderr_path=path) as d:
            pass
        lines = d.stderr_lines()
        assert lines and not any(ln.startswith("<") for ln in lines), lines
    finally:
        os.unlink(path)
        other.close()


def test_stdout_on_the_journal_gets_no_second_listening_line():
    """Under systemd stdout is the journal too: `listening on` is logged once, with its
    priority, not also as stdout's bare line."""
    import signal
    import subprocess
    import time
    from conftest import TDD_BIN
    fd, path = tempfile.mkstemp(prefix="tdd-journal-")
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith("TENSORDD_")}
        env.update(journal_env(path))
        with open(path, "a") as out:
            proc = subprocess.Popen([TDD_BIN, "--listen", "tcp://127.0.0.1:0", "--metrics-listen",
                                     "127.0.0.1:0"], stdout=out, stderr=out, env=env,
                                    stdin=subprocess.DEVNULL)
        try:
            for _ in range(400):
                text = open(path).read()
                if "listening on" in text or proc.poll() is not None:
                    break
                time.sleep(0.05)
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 0
        lines = open(path).read().splitlines()
        assert all(ln.startswith("<") for ln in lines), lines
        assert len([ln for ln in lines if "listening on tcp://" in ln]) == 1, lines
        assert len([ln for ln in lines if "metrics on http://" in ln]) == 1, lines
    finally:
        os.close(fd)
        os.unlink(path)


def test_debug_lines_carry_conn_and_no_session_opens_before_authentication(tmp_path):
    """Every JSON line about a connection names it ("conn"); a connection whose Hello
    fails authentication is logged as accepted, never as a session opened."""
    tok = tmp_path / "tok"
    tok.write_text("right\n")
    tok.chmod(0o600)
    with Proc(["--listen", "tcp://127.0.0.1:0", "--token-file", str(tok), "--log-format",
               "json", "--log-level", "debug"]) as d:
        with pytest.raises(tensordd.UnauthenticatedError):
            one_session(d.endpoint, token="wrong")
        one_session(d.endpoint, token="right")
    recs = [json.loads(line) for line in d.stderr_lines()]
    about_conns = [r for r in recs if re.search(r"\b(connection|session) \d+\b", r["msg"])]
    assert about_conns, recs
    for r in about_conns:
        n = int(re.search(r"\b(?:connection|session) (\d+)\b", r["msg"]).group(1))
        assert r.get("conn") == n, r
    failed = [r for r in recs if "authentication failed" in r["msg"]]
    assert len(failed) == 1, recs
    bad = failed[0]["conn"]
    assert "session" not in failed[0], failed[0]
    assert not any(re.match(rf"session {bad} opened", r["msg"]) for r in recs), recs
    assert any(r["msg"].startswith(f"connection {bad} accepted from 127.0.0.1:")
               and r["level"] == "debug" for r in recs), recs
    opened = [r for r in recs if re.match(r"session \d+ opened", r["msg"])]
    assert len(opened) == 1 and opened[0]["session"] == opened[0]["conn"] != bad, opened
