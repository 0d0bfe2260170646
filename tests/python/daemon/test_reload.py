"""SIGHUP reloads what may change while sessions run (log level and format, the token,
the TLS certificate and key, the quotas of new sessions), logs what changed and what
would need a restart, and keeps every session open; a configuration that does not
parse changes nothing."""

import os
import re
import signal
import time

import numpy as np
import pytest
import tensordd

from daemonproc import Proc


def wait_log(d, pattern, n=1, timeout=20.0):
    """Waits (bounded) until pattern has matched n lines of the daemon's log."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [ln for ln in d.stderr_lines() if re.search(pattern, ln)]
        if len(found) >= n:
            return found
        assert d.proc.poll() is None, f"daemon exited {d.proc.returncode}:\n{d.log()}"
        time.sleep(0.05)
    raise AssertionError(f"no {n} line(s) matching {pattern!r}:\n{d.log()}")


def write_private(path, text):
    path.write_text(text)
    path.chmod(0o600)


def hup(d, n):
    d.proc.send_signal(signal.SIGHUP)
    return wait_log(d, r"SIGHUP: configuration (reloaded|not reloaded)", n)[-1]


def test_sighup_keeps_sessions_and_applies_the_new_token_and_quota(tmp_path):
    tok = tmp_path / "token"
    write_private(tok, "first\n")
    conf = tmp_path / "tensordd.conf"
    conf.write_text(f"token-file = {tok}\nsession-memory = 64M\nlog-level = info\n")
    with Proc(["--config", str(conf), "--listen", "tcp://127.0.0.1:0"]) as d:
        old = tensordd.connect(d.endpoint, token="first", timeout=10)
        a = old.tensor(np.arange(6, dtype=np.float32))
        write_private(tok, "second\n")
        conf.write_text(f"token-file = {tok}\nsession-memory = 1M\nlog-level = debug\n"
                        "max-frame = 8M\n")
        line = hup(d, 1)
        assert "reloaded" in line and "token-file" in line and "session-memory" in line, line
        assert "log-level" in line and "1 session(s) kept open" in line, line
        restart = wait_log(d, r"need a restart: max-frame")
        assert " warn " in restart[0], restart
        assert d.proc.poll() is None

        # the session opened before the reload: its tensors, its quota (64M: 4 MiB fits)
        np.testing.assert_array_equal((a * 2).numpy(), np.arange(6, dtype=np.float32) * 2)
        big = old.tensor(np.ones(1 << 20, np.float32))
        assert float(big.sum().numpy()) == float(1 << 20)

        # new Hellos: the old token is refused, the new one admitted with the new quota
        with pytest.raises(tensordd.UnauthenticatedError):
            tensordd.connect(d.endpoint, token="first", timeout=10).close()
        with tensordd.connect(d.endpoint, token="second", timeout=10) as s:
            assert float(s.tensor(np.ones(4, np.float32)).sum().numpy()) == 4.0
            with pytest.raises(tensordd.ResourceExhaustedError):
                s.tensor(np.ones(1 << 20, np.float32)).numpy()  # 4 MiB over the new 1M
        # the new level: debug lines now
        wait_log(d, r" debug ")
        old.close()
    assert d.proc.returncode == 0, d.log()


def test_a_bad_reload_changes_nothing(tmp_path):
    tok = tmp_path / "token"
    write_private(tok, "kept\n")
    conf = tmp_path / "tensordd.conf"
    conf.write_text(f"token-file = {tok}\n")
    with Proc(["--config", str(conf), "--listen", "tcp://127.0.0.1:0"]) as d:
        with tensordd.connect(d.endpoint, token="kept", timeout=10) as s:
            a = s.tensor(np.arange(3, dtype=np.float32))
            conf.write_text(f"token-file = {tok}\nmax-handles = lots\n")
            line = hup(d, 1)
            assert "not reloaded" in line and " error " in line, line
            assert float(a.sum().numpy()) == 3.0
        with tensordd.connect(d.endpoint, token="kept", timeout=10) as s:
            assert float(s.tensor(np.ones(2, np.float32)).sum().numpy()) == 2.0
    assert d.proc.returncode == 0, d.log()


def test_reload_cannot_drop_the_token_of_an_exposed_listener(tmp_path):
    """A tcp:// listener beyond loopback runs because a token guards it: a reload that
    removes the token is refused as a whole."""
    tok = tmp_path / "token"
    write_private(tok, "guard\n")
    conf = tmp_path / "tensordd.conf"
    conf.write_text(f"token-file = {tok}\n")
    # 0.0.0.0 on port 0: beyond loopback, though the test connects through 127.0.0.1
    with Proc(["--config", str(conf), "--listen", "tcp://0.0.0.0:0"]) as d:
        port = d.endpoint.rsplit(":", 1)[1]
        conf.write_text("log-level = debug\n")
        line = hup(d, 1)
        assert "not reloaded" in line and "no token" in line, line
        with pytest.raises(tensordd.UnauthenticatedError):
            tensordd.connect(f"tcp://127.0.0.1:{port}", timeout=10).close()
    assert d.proc.returncode == 0, d.log()


def test_reload_reads_the_tls_certificate_again(tmp_path):
    ssl = pytest.importorskip("ssl")
    import subprocess
    if subprocess.run(["which", "openssl"], capture_output=True).returncode:
        pytest.skip("no openssl command")

    def make_cert(name, cn):
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                        "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1", "-subj",
                        f"/CN={cn}", "-addext", "subjectAltName=IP:127.0.0.1",
                        "-keyout", str(tmp_path / f"{name}.key"),
                        "-out", str(tmp_path / f"{name}.crt")],
                       check=True, capture_output=True, timeout=60)

    def served_cn(port):
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        import socket
        with socket.create_connection(("127.0.0.1", int(port)), timeout=10) as raw:
            with ctx.wrap_socket(raw) as t:
                der = t.getpeercert(binary_form=True)
        pem = ssl.DER_cert_to_PEM_cert(der)
        out = subprocess.run(["openssl", "x509", "-noout", "-subject"], input=pem,
                             capture_output=True, text=True, timeout=30)
        return out.stdout.strip()

    make_cert("old", "old-cert")
    make_cert("new", "new-cert")
    crt, key = tmp_path / "srv.crt", tmp_path / "srv.key"
    crt.write_bytes((tmp_path / "old.crt").read_bytes())
    key.write_bytes((tmp_path / "old.key").read_bytes())
    key.chmod(0o600)
    with Proc(["--listen", "tls://127.0.0.1:0", "--tls-cert", str(crt), "--tls-key",
               str(key)], expect=("listening on tls://",)) as d:
        port = [ln for ln in d.stdout if ln.startswith("listening on tls://")][0].rsplit(":", 1)[1]
        assert "old-cert" in served_cn(port.strip())
        crt.write_bytes((tmp_path / "new.crt").read_bytes())
        key.write_bytes((tmp_path / "new.key").read_bytes())
        line = hup(d, 1)
        assert "reloaded" in line, line
        wait_log(d, r"TLS certificate and key read again")
        assert "new-cert" in served_cn(port.strip())
    assert d.proc.returncode == 0, d.log()
