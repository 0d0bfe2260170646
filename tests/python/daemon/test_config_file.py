"""The config file (INI, one key per option of the option table), the TENSORDD_*
environment variables and the flags: --check-config prints the effective settings or
names the file, line and key of each mistake; flags beat the environment, which beats
the file."""

import os
import re
import subprocess

import pytest

from conftest import TDD_BIN
from daemonproc import Proc, run


def effective(text):
    """--check-config's output as {key: [values]} (comments and blanks skipped)."""
    out = {}
    for line in text.splitlines():
        line = line.split(" ;", 1)[0].strip()
        if not line or line.startswith((";", "#")):
            continue
        k, v = (x.strip() for x in line.split("=", 1))
        out.setdefault(k, []).append(v)
    return out


def write(tmp_path, text, name="tensordd.conf"):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def help_options():
    """The long options --help lists with a value: the keys a file may use."""
    r = run("--help")
    assert r.returncode == 0
    return set(re.findall(r"^  --([a-z0-9-]+) [A-Z:]+", r.stdout, re.M)) - {"config"}


def test_good_file_is_accepted_and_printed(tmp_path):
    path = write(tmp_path, "; a comment\n# another\n\nmax-frame = 8M\n  idle-timeout = 30 ; inline\n"
                           "listen = tcp://127.0.0.1:7171\nlisten = unix:///tmp/x.sock\n"
                           "log-level = debug\nlog-format = json\nmax-sessions=7\n")
    r = run("--config", path, "--check-config")
    assert r.returncode == 0, r.stderr
    eff = effective(r.stdout)
    assert eff["max-frame"] == ["8M"]
    assert eff["idle-timeout"] == ["30"]
    assert eff["listen"] == ["tcp://127.0.0.1:7171", "unix:///tmp/x.sock"]
    assert eff["log-level"] == ["debug"] and eff["log-format"] == ["json"]
    assert eff["max-sessions"] == ["7"]
    assert eff["max-payload"] == ["64G"]  # untouched: the default
    assert path in r.stdout.splitlines()[0]
    # every option of the table with a value is in the output, as a key or a comment
    for key in help_options():
        assert re.search(rf"^;? ?{re.escape(key)}\b", r.stdout, re.M), (key, r.stdout)


def test_effective_config_is_itself_a_valid_file(tmp_path):
    path = write(tmp_path, "max-handles = 99\nsession-memory = 1G\npoll-us = 0\n")
    first = run("--config", path, "--check-config")
    assert first.returncode == 0, first.stderr
    again = run("--config", write(tmp_path, first.stdout, "effective.conf"), "--check-config")
    assert again.returncode == 0, again.stderr
    assert first.stdout.splitlines()[1:] == again.stdout.splitlines()[1:]


def test_bad_file_names_file_line_and_key(tmp_path):
    path = write(tmp_path, "max-frame = 8M\nmax-frames = 3\n\nmax-sessions = 0\n"
                           "[section]\nthis is not a setting\nlog-format = xml\n"
                           "help = 1\n")
    r = run("--config", path, "--check-config")
    assert r.returncode == 1
    assert r.stdout == ""
    err = r.stderr
    assert f"{path}:2: unknown key 'max-frames'" in err, err
    assert f"{path}:4: key 'max-sessions': bad value '0'" in err, err
    assert f"{path}:5: sections are not used" in err, err
    assert f"{path}:6: expected `key = value`" in err, err
    assert f"{path}:7: key 'log-format': bad value 'xml'" in err, err
    assert f"{path}:8: unknown key 'help'" in err, err
    assert len(err.strip().splitlines()) == 6, err


def test_a_bad_file_stops_the_daemon_too(tmp_path):
    path = write(tmp_path, "max-frame = lots\n")
    r = run("--config", path, "--listen", "tcp://127.0.0.1:0")
    assert r.returncode == 1
    assert f"{path}:1: key 'max-frame': bad value 'lots'" in r.stderr


def test_missing_explicit_file_is_an_error(tmp_path):
    r = run("--config", str(tmp_path / "nope.conf"), "--check-config")
    assert r.returncode == 1
    assert "nope.conf" in r.stderr and "No such file" in r.stderr


def test_check_config_without_a_file_prints_the_defaults():
    if os.path.exists("/etc/tensordd/tensordd.conf"):
        pytest.skip("this machine has /etc/tensordd/tensordd.conf")
    r = run("--check-config")
    assert r.returncode == 0, r.stderr
    eff = effective(r.stdout)
    assert eff["listen"] == ["tcp://127.0.0.1:7070"]
    assert eff["max-frame"] == ["4M"] and eff["hello-timeout"] == ["10"]


def test_flag_beats_environment_beats_file(tmp_path):
    path = write(tmp_path, "listen = tcp://127.0.0.1:1001\nmetrics-listen = 127.0.0.1:2001\n"
                           "log-format = json\nmax-frame = 8M\n")
    env = {"TENSORDD_LISTEN": "tcp://127.0.0.1:1002, unix:///tmp/e.sock",
           "TENSORDD_METRICS_LISTEN": "127.0.0.1:2002"}
    # file only
    eff = effective(run("--config", path, "--check-config").stdout)
    assert eff["listen"] == ["tcp://127.0.0.1:1001"] and eff["metrics-listen"] == ["127.0.0.1:2001"]
    # the environment replaces the file's listen list and metrics address
    eff = effective(run("--config", path, "--check-config", env=env).stdout)
    assert eff["listen"] == ["tcp://127.0.0.1:1002", "unix:///tmp/e.sock"]
    assert eff["metrics-listen"] == ["127.0.0.1:2002"]
    assert eff["log-format"] == ["json"] and eff["max-frame"] == ["8M"]  # the file's still
    # flags replace both
    r = run("--config", path, "--check-config", "--listen", "tcp://127.0.0.1:1003",
            "--metrics-listen", "127.0.0.1:2003", "--max-frame", "16M", env=env)
    eff = effective(r.stdout)
    assert eff["listen"] == ["tcp://127.0.0.1:1003"]
    assert eff["metrics-listen"] == ["127.0.0.1:2003"] and eff["max-frame"] == ["16M"]


def test_environment_value_errors_name_the_variable():
    r = run("--check-config", env={"TENSORDD_LOG_FORMAT": "yaml"})
    assert r.returncode == 1
    assert "TENSORDD_LOG_FORMAT: bad value 'yaml'" in r.stderr


def test_token_file_from_environment_and_credentials(tmp_path):
    tok = tmp_path / "tok"
    tok.write_text("s3cret\n")
    tok.chmod(0o600)
    r = run("--check-config", env={"TENSORDD_TOKEN_FILE": str(tok)})
    assert effective(r.stdout)["token-file"] == [str(tok)]
    assert "s3cret" not in r.stdout  # the path is printed, never the token
    creds = tmp_path / "creds"
    creds.mkdir()
    (creds / "token").write_text("fromcred\n")
    (creds / "token").chmod(0o400)
    r = run("--check-config", env={"CREDENTIALS_DIRECTORY": str(creds)})
    assert effective(r.stdout)["token-file"] == [str(creds / "token")]


def test_the_file_configures_a_running_daemon(tmp_path):
    """Keys reach the daemon: a token required by the file is required on the wire."""
    import tensordd
    tok = tmp_path / "tok"
    tok.write_text("filetoken\n")
    tok.chmod(0o600)
    path = write(tmp_path, f"listen = tcp://127.0.0.1:0\ntoken-file = {tok}\n")
    with Proc(["--config", path]) as d:
        with pytest.raises(tensordd.UnauthenticatedError):
            with tensordd.connect(d.endpoint, token="wrong", timeout=10) as s:
                s.sync()
        with tensordd.connect(d.endpoint, token="filetoken", timeout=10) as s:
            s.sync()
    assert d.proc.returncode == 0


def test_example_config_is_valid(tmp_path):
    """Valid where it is installed: there the group `tensordd` exists (--check-config
    refuses a --unix-group that does not); here it is this process's group."""
    import grp
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    with open(os.path.join(root, "deploy", "tensordd.conf.example")) as f:
        text = f.read()
    assert "\nunix-group = tensordd\n" in text
    try:
        grp.getgrnam("tensordd")
    except KeyError:
        text = text.replace("\nunix-group = tensordd\n",
                            f"\nunix-group = {grp.getgrgid(os.getgid()).gr_name}\n")
    r = run("--config", write(tmp_path, text), "--check-config")
    assert r.returncode == 0, r.stderr
    assert effective(r.stdout)["metrics-listen"] == ["127.0.0.1:9470"]
    r = run("--config", os.path.join(root, "deploy", "tensordd.conf.example"), "--check-config",
            "--unix-group", "no-such-group-tdd")
    assert r.returncode == 1 and "no-such-group-tdd: no such group" in r.stderr, r


def test_help_lists_the_environment_variables():
    r = subprocess.run([TDD_BIN, "--help"], capture_output=True, text=True, timeout=30)
    for var in ("TENSORDD_LISTEN", "TENSORDD_TOKEN_FILE"):
        assert var in r.stdout


def test_a_line_too_long_is_an_error_not_a_cut_value(tmp_path):
    """inih reads lines into a fixed buffer: a longer one would lose its tail silently."""
    path = write(tmp_path, "max-frame = 8M\nlisten = unix:///tmp/" + "d" * 300 + ".sock\n")
    r = run("--config", path, "--check-config")
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, lines  # not also a complaint about the cut value
    assert re.fullmatch(rf"tensordd: {re.escape(path)}:2: line longer than \d+ characters",
                        lines[0]), lines


def test_check_config_answers_bad_flags_with_1_too():
    """--check-config exits 0 or 1 whatever is wrong; a normal start keeps exit 2 for flags."""
    for args in (["--bogus"], ["--max-frame", "4Q"], ["stray"]):
        r = run("--check-config", *args)
        assert r.returncode == 1, (args, r.stderr)
        assert r.stdout == "" and r.stderr.startswith("tensordd: "), r.stderr
    assert run("--max-frame", "4Q").returncode == 2


def _token_refused(path, *want):
    """--check-config and a start both refuse the token file, naming it and the fix."""
    for args in (["--check-config"], ["--listen", "tcp://127.0.0.1:0"]):
        r = run("--token-file", str(path), *args)
        assert r.returncode in (1, 2) and "listening on" not in r.stdout, (args, r)
        assert str(path) in r.stderr and all(w in r.stderr for w in want), r.stderr


def test_a_token_file_is_used_whole_or_refused(tmp_path):
    """Every byte of the token file is the token (less one final line break), or the
    file is refused: a NUL or a line break inside would have cut the token short."""
    tok = tmp_path / "tok"
    tok.write_bytes(b"ab\0cdefgh\n")
    tok.chmod(0o600)
    _token_refused(tok, "NUL", "byte 2")
    tok.write_bytes(b"first\nsecond\n")
    _token_refused(tok, "line break", "byte 5")
    tok.write_bytes(bytes(range(1, 33)))  # random-looking bytes, no NUL: control bytes
    _token_refused(tok, "control byte")
    tok.write_bytes(b"\n")
    _token_refused(tok, "1..255 bytes")
    tok.write_bytes(b"x" * 256)
    _token_refused(tok, "1..255 bytes")
    # a good one, with and without its line break: the whole line is the token
    for text in (b"correct horse battery\r\n", b"correct horse battery"):
        tok.write_bytes(text)
        with Proc(["--listen", "tcp://127.0.0.1:0", "--token-file", str(tok)]) as d:
            import tensordd
            with pytest.raises(tensordd.UnauthenticatedError):
                tensordd.connect(d.endpoint, token="correct", timeout=10)
            with tensordd.connect(d.endpoint, token="correct horse battery", timeout=10) as s:
                s.sync()


def test_a_token_file_others_can_read_or_a_link_is_refused(tmp_path):
    tok = tmp_path / "tok"
    tok.write_text("s3cret\n")
    tok.chmod(0o644)
    _token_refused(tok, "others may read", "chmod 600")
    tok.chmod(0o602)
    _token_refused(tok, "others may read", "chmod 600")
    tok.chmod(0o600)
    link = tmp_path / "link"
    link.symlink_to(tok)
    _token_refused(link, "symbolic link", "subPath")
    _token_refused(tmp_path, "not a regular file")
    tok.chmod(0o640)  # group-readable: warned, served
    r = run("--token-file", str(tok), "--check-config")
    assert r.returncode == 0 and "readable by its group" in r.stderr, r


@pytest.mark.parametrize("args,want", [
    (["--listen", "tcp://0.0.0.0:0"], "needs TLS"),
    (["--listen", "tls://127.0.0.1:0", "--tls-cert", "/etc/hostname"], "--tls-key"),
    (["--listen", "tls://127.0.0.1:0", "--tls-cert", "/nonexistent/cert.pem", "--tls-key",
      "/nonexistent/key.pem"], "/nonexistent/cert.pem"),
    (["--listen", "unix:///tmp/tdd-never.sock", "--unix-group", "no-such-group-tdd"],
     "no-such-group-tdd"),
    (["--listen", "ftp://127.0.0.1:0"], "expected tcp://"),
])
def test_check_config_refuses_what_a_start_refuses(args, want):
    """--check-config and a start apply one validation: the same refusal, exit 1."""
    check = run(*args, "--check-config")
    start = run(*args)
    assert check.returncode == 1 and start.returncode == 1, (check, start)
    assert want in check.stderr and want in start.stderr, (check.stderr, start.stderr)
    said = check.stderr.strip().removeprefix("tensordd: ")
    assert said and said in start.stderr, (said, start.stderr)
    assert "listening on" not in start.stdout


def test_a_key_set_twice_is_refused_naming_both_lines(tmp_path):
    """A second setting of a key would silently win: refused, with both lines; listen
    alone repeats."""
    path = write(tmp_path, "max-sessions = 4\nlisten = tcp://127.0.0.1:0\n"
                           "listen = unix:///tmp/tdd-twice.sock\n\nmax-sessions = 8\n")
    for extra in (["--check-config"], ["--listen", "tcp://127.0.0.1:0"]):
        r = run("--config", path, *extra)
        assert r.returncode == 1 and "listening on" not in r.stdout, r
        assert f"{path}:5: key 'max-sessions' set again (first at line 1)" in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    r = run("--config", write(tmp_path, "listen = tcp://127.0.0.1:0\nlisten = tcp://[::1]:0\n"),
            "--check-config")
    assert r.returncode == 0 and len(effective(r.stdout)["listen"]) == 2, r
