"""/metrics (Prometheus text format, checked by a strict parser here) and /healthz on
--metrics-listen: counters move with a session's requests, ops, bytes and errors;
gauges show the open session, the largest session's handles and quota use (bounded: no
label per session); build_info and the standard process_* series; /healthz says whether
a new session would be served."""

import math
import re
import shutil
import subprocess
import urllib.error
import urllib.request

import numpy as np
import pytest
import tensordd

from conftest import TDD_BIN
from daemonproc import Proc, run

NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
LABEL = r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)"'
SAMPLE = re.compile(rf"^({NAME})(?:\{{((?:{LABEL})(?:,{LABEL})*)?\}})? (\S+)$")
FLOAT = re.compile(r"^(?:[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?|[+-]Inf|NaN)$")
TYPES = {"counter", "gauge", "histogram", "summary", "untyped"}


def parse(text):
    """Strict Prometheus text exposition (0.0.4) -> {(name, labels): value}.
    Every sample belongs to a family declared by # TYPE before it (histograms: _bucket,
    _sum, _count), families are contiguous and declared once, series are unique,
    counters are finite and >= 0, histogram buckets are cumulative with +Inf == count."""
    assert text.endswith("\n"), "the page must end with a newline"
    types, helps, samples, order = {}, {}, {}, []
    current = None
    for n, line in enumerate(text.split("\n")[:-1], 1):
        assert line and line == line.strip(), f"line {n}: blank or padded: {line!r}"
        if line.startswith("#"):
            m = re.match(rf"^# (HELP|TYPE) ({NAME}) (.+)$", line)
            assert m, f"line {n}: bad comment: {line!r}"
            kind, name, rest = m.groups()
            if kind == "TYPE":
                assert rest in TYPES, f"line {n}: bad type {rest}"
                assert name not in types, f"line {n}: {name} declared twice"
                types[name] = rest
                order.append(name)
                current = name
            else:
                assert name not in helps, f"line {n}: second HELP for {name}"
                helps[name] = rest
            continue
        m = SAMPLE.match(line)
        assert m, f"line {n}: not a sample: {line!r}"
        name, labelstr, value = m.group(1), m.group(2) or "", m.group(m.lastindex)
        labels = tuple(re.findall(LABEL, labelstr))
        assert len({k for k, _ in labels}) == len(labels), f"line {n}: repeated label"
        family = name
        if current and types[current] == "histogram" and name in (
                current + "_bucket", current + "_sum", current + "_count"):
            family = current
        assert family == current, f"line {n}: {name} outside its family (# TYPE {current})"
        assert FLOAT.match(value), f"line {n}: bad value {value!r}"
        v = float(value)
        key = (name, labels)
        assert key not in samples, f"line {n}: duplicate series {key}"
        samples[key] = v
        if types[family] == "counter" or name.endswith(("_bucket", "_count")):
            assert v >= 0 and not math.isnan(v), f"line {n}: counter {v}"
    for fam, t in types.items():
        if t != "histogram":
            continue
        series = {}
        for (name, labels), v in samples.items():
            if name == fam + "_bucket":
                rest = tuple(kv for kv in labels if kv[0] != "le")
                le = dict(labels)["le"]
                series.setdefault(rest, []).append((float(le), v))
        for rest, buckets in series.items():
            les = [le for le, _ in buckets]
            assert les == sorted(les) and les[-1] == math.inf, (fam, rest, les)
            assert len(set(les)) == len(les), (fam, rest, les)
            counts = [c for _, c in buckets]
            assert counts == sorted(counts), f"{fam}{rest}: buckets not cumulative {counts}"
            assert samples[(fam + "_count", rest)] == counts[-1], (fam, rest)
            assert (fam + "_sum", rest) in samples
    return samples


def get(url):
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.headers.get("Content-Type"), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type"), e.read().decode()


def scrape(d):
    status, ctype, body = get(d.metrics + "/metrics")
    assert status == 200 and ctype.startswith("text/plain; version=0.0.4"), (status, ctype)
    return parse(body)


def val(m, name, **labels):
    for (n, ls), v in m.items():
        if n == name and all(dict(ls).get(k) == str(x) for k, x in labels.items()):
            return v
    return 0.0


def total(m, name):
    return sum(v for (n, _), v in m.items() if n == name)


@pytest.fixture
def mdaemon():
    with Proc(["--listen", "tcp://127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
               "--session-memory", "64M"], expect=("listening on", "metrics on")) as d:
        yield d
    assert d.proc.returncode == 0, d.log()


def test_parser_rejects_what_prometheus_would():
    good = "# TYPE a counter\na 1\n"
    parse(good)
    for bad in ["a 1\n", "# TYPE a counter\na{x=\"1\"} one\n", "# TYPE a counter\na 1",
                "# TYPE a counter\na 1\na 2\n", "# TYPE a gauge\n# TYPE a gauge\na 1\n",
                "# TYPE a counter\na -1\n", "# TYPE a counter\na{x=1} 1\n",
                "# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\n"
                "h_sum 0\nh_count 1\n"]:
        with pytest.raises(AssertionError):
            parse(bad)


def test_counters_move_with_a_session(mdaemon):
    before = scrape(mdaemon)
    assert val(before, "tensordd_up") == 1
    assert val(before, "tensordd_sessions") == 0
    with tensordd.connect(mdaemon.endpoint, timeout=10) as s:
        a = s.tensor(np.ones((64, 64), np.float32))
        b = s.tensor(np.ones((64, 64), np.float32))
        c = (a @ b) + a
        assert float(c.sum().numpy()) == 64 * 64 * 65
        bad = s.tensor(np.ones(3, np.float32))
        with pytest.raises(tensordd.Error):
            (a + bad).numpy()
        during = scrape(mdaemon)
        assert val(during, "tensordd_sessions") == 1
        # per-session detail is tdctl's (Stats), not labels: the largest session, the quota
        assert val(during, "tensordd_session_memory_max_bytes") >= 3 * 64 * 64 * 4
        assert val(during, "tensordd_session_memory_limit_bytes") == 64 << 20
        assert val(during, "tensordd_session_handles_max") >= 4
        assert not any(k in ("session", "client", "peer") for (_, ls) in during
                       for k, _ in ls), "a label per session or client"
        assert val(during, "tensordd_handles") >= 4
        assert val(during, "tensordd_device_memory_bytes", device="cpu:0") >= 3 * 64 * 64 * 4
        assert ("tensordd_device_queue_depth", (("device", "cpu:0"),)) in during
    after = scrape(mdaemon)

    def delta(name, **labels):
        return val(after, name, **labels) - val(before, name, **labels)

    assert val(after, "tensordd_sessions") == 0
    assert delta("tensordd_sessions_opened_total") == 1
    assert delta("tensordd_requests_total", request="hello") == 1
    assert delta("tensordd_requests_total", request="upload") == 3
    assert delta("tensordd_requests_total", request="op") >= 4  # matmul, add, sum, add
    assert delta("tensordd_ops_total", op="matmul", result="ok") == 1
    assert delta("tensordd_ops_total", op="sum", result="ok") == 1
    assert delta("tensordd_op_duration_seconds_count", op="matmul") == 1
    assert delta("tensordd_op_duration_seconds_sum", op="matmul") > 0
    assert delta("tensordd_bytes_received_total") >= 2 * 64 * 64 * 4 + 3 * 4
    assert delta("tensordd_bytes_sent_total") > 0
    assert total(after, "tensordd_errors_total") - total(before, "tensordd_errors_total") == 1
    ops_done = sum(v for (n, ls), v in after.items() if n == "tensordd_ops_total")
    hist = sum(v for (n, ls), v in after.items() if n == "tensordd_op_duration_seconds_count")
    assert ops_done == hist
    assert val(after, "tensordd_handles") == 0


def test_curl_sees_the_same_page(mdaemon):
    if not shutil.which("curl"):
        pytest.skip("curl is not installed")
    r = subprocess.run(["curl", "-sf", "--max-time", "10", mdaemon.metrics + "/metrics"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    m = parse(r.stdout)
    assert val(m, "tensordd_accepting_sessions") == 1


def test_healthz_says_whether_sessions_are_accepted():
    with Proc(["--listen", "tcp://127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
               "--max-sessions", "1"], expect=("listening on", "metrics on")) as d:
        status, _, body = get(d.metrics + "/healthz")
        assert (status, body) == (200, "ok\n")
        with tensordd.connect(d.endpoint, timeout=10) as s:
            s.sync()
            status, _, body = get(d.metrics + "/healthz")
            assert status == 503 and "max-sessions" in body, body
            assert val(scrape(d), "tensordd_accepting_sessions") == 0
        for _ in range(200):  # the close is seen by the loop after the client's
            status, _, body = get(d.metrics + "/healthz")
            if status == 200:
                break
        assert status == 200, body
        assert get(d.metrics + "/nothing")[0] == 404
        req = urllib.request.Request(d.metrics + "/metrics", data=b"x", method="POST")
        try:
            urllib.request.urlopen(req, timeout=10)
            raise AssertionError("POST accepted")
        except urllib.error.HTTPError as e:
            assert e.code == 405


def test_metrics_bind_beyond_loopback_needs_a_token():
    """As for --listen (test_metrics_exposed.py scrapes one that has it)."""
    r = run("--metrics-listen", "0.0.0.0:0", "--listen", "tcp://127.0.0.1:0")
    assert r.returncode == 1
    assert "beyond loopback needs a token" in r.stderr, r.stderr
    r = run("--metrics-listen", "example.org:9470", "--listen", "tcp://127.0.0.1:0")
    assert r.returncode == 2
    assert "--metrics-listen" in r.stderr and "not an IP address" in r.stderr, r.stderr
    r = run("--metrics-listen", "[::1]:0", "--check-config")
    assert r.returncode == 0, r.stderr


def test_metrics_off_by_default():
    with Proc(["--listen", "tcp://127.0.0.1:0"]) as d:
        pass
    assert not any(line.startswith("metrics on") for line in d.stdout)


def test_tdctl_stats_shows_the_same_numbers(mdaemon):
    import json
    import os
    tdctl = os.environ.get("TDCTL_BIN", os.path.join(os.path.dirname(TDD_BIN), "tdctl"))
    if not os.access(tdctl, os.X_OK):
        pytest.skip(f"{tdctl} not built")
    with tensordd.connect(mdaemon.endpoint, timeout=10) as s:
        a = s.tensor(np.ones((8, 8), np.float32))
        assert float((a @ a).sum().numpy()) == 512.0
        r = subprocess.run([tdctl, "--endpoint", mdaemon.endpoint, "stats", "--json", "--metrics",
                            mdaemon.metrics], capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        page = scrape(mdaemon)
    # the page was read after tdctl's: counters can only have grown by tdctl's own session
    assert out["ops"]["matmul"]["ok"] == val(page, "tensordd_ops_total", op="matmul", result="ok")
    assert out["ops"]["sum"]["ok"] == 1
    assert out["requests_by_type"]["upload"] == val(page, "tensordd_requests_total",
                                                    request="upload")
    assert out["queue_depth"].keys() == {"cpu:0", "ref:0"}
    assert out["sessions_opened"] in (val(page, "tensordd_sessions_opened_total"),
                                      val(page, "tensordd_sessions_opened_total") - 1)
    assert out["sessions"] == 2  # ours and tdctl's, as Stats counts them
    mine = [x for x in out["session_memory"] if x["client_name"] == "tensordd-python"]
    assert len(mine) == 1 and mine[0]["bytes_in_use"] >= 8 * 8 * 4
    assert mine[0]["limit"] == 64 << 20
    text = subprocess.run([tdctl, "--endpoint", mdaemon.endpoint, "stats", "--metrics",
                           mdaemon.metrics], capture_output=True, text=True, timeout=30)
    assert text.returncode == 0, text.stderr
    assert re.search(r"^  matmul +1 +0 +[\d.]+ us$", text.stdout, re.M), text.stdout
    import socket
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nothing listens there now
    bad = subprocess.run([tdctl, "--endpoint", mdaemon.endpoint, "stats", "--metrics",
                          f"http://127.0.0.1:{port}"], capture_output=True, text=True, timeout=30)
    assert bad.returncode == 3 and "cannot connect" in bad.stderr


def test_metrics_port_in_use_stops_the_daemon_before_it_listens(tmp_path):
    import socket
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    sock = tmp_path / "d.sock"
    try:
        r = run("--listen", f"unix://{sock}",
                "--metrics-listen", f"127.0.0.1:{busy.getsockname()[1]}")
    finally:
        busy.close()
    assert r.returncode == 1
    assert "cannot serve metrics" in r.stderr
    assert "listening on" not in r.stdout and not sock.exists()


def test_resume_windows_held_gauge():
    """A resumable session whose connection drops is held: the gauge counts it."""
    from helpers import frame, pb, raw, read_frame
    with Proc(["--listen", "tcp://127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
               "--max-resume-window", "60"], expect=("listening on", "metrics on")) as d:
        assert val(scrape(d), "tensordd_resume_windows_held") == 0
        sock = raw(d.endpoint)
        sock.sendall(frame(pb.Request(id=1, hello=pb.Hello(
            min_version=1, max_version=1, client_name="held", resume_window=30))))
        resp = read_frame(sock)
        assert resp is not None
        sock.close()  # no Goodbye: the session is held for its window
        for _ in range(200):  # the loop notices the close after the client does
            m = scrape(d)
            if val(m, "tensordd_resume_windows_held") == 1:
                break
        assert val(m, "tensordd_resume_windows_held") == 1, m
    assert d.proc.returncode == 0, d.log()


def test_healthz_is_503_while_draining():
    """SIGTERM: the daemon stops accepting and drains; a client that does not read its
    downloads keeps it draining (up to --write-timeout), and /healthz says so."""
    import signal
    import socket
    import time
    from helpers import frame, hello, pb, read_frame
    with Proc(["--listen", "tcp://127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
               "--write-timeout", "120"], expect=("listening on", "metrics on")) as d:
        host, port = d.endpoint[len("tcp://"):].rsplit(":", 1)
        c = socket.socket()
        c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        c.settimeout(30)
        c.connect((host, int(port)))
        c.sendall(hello())
        assert read_frame(c).WhichOneof("body") == "hello"
        n = 4 << 20  # 16 MiB of f32
        c.sendall(frame(pb.Request(id=2, upload=pb.Upload(handle=1, dtype=pb.DTYPE_F32,
                                                          shape=[n])), b"\0" * (4 * n)))
        for i in range(4):  # 64 MiB of answers it will not read
            c.sendall(frame(pb.Request(id=3 + i, download=pb.Download(handle=1))))
        # the first answer has begun: the daemon holds the rest for us (a SIGTERM that came
        # before it read the requests would find nothing to drain, and exit)
        assert c.recv(16, socket.MSG_PEEK)
        assert get(d.metrics + "/healthz")[0] == 200
        d.proc.send_signal(signal.SIGTERM)
        for _ in range(400):
            status, _, body = get(d.metrics + "/healthz")
            if status == 503:
                break
            time.sleep(0.05)
        assert status == 503 and "shutting down" in body, (status, body)
        assert val(scrape(d), "tensordd_accepting_sessions") == 0
        assert d.proc.poll() is None  # still draining: the client holds it
        c.close()
        assert d.proc.wait(60) == 0, d.log()


def test_healthz_counts_sessions_held_for_resume():
    """--max-sessions 2 with both slots held for resume (connections dropped, no
    Goodbye): a new Hello is RESOURCE_EXHAUSTED, so /healthz is 503 and
    tensordd_accepting_sessions 0 -- the same rule as the Hello's."""
    from helpers import frame, hello, pb, raw, read_frame
    with Proc(["--listen", "tcp://127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
               "--max-sessions", "2", "--max-resume-window", "60"],
              expect=("listening on", "metrics on")) as d:
        for i in range(2):
            sock = raw(d.endpoint)
            sock.sendall(frame(pb.Request(id=1, hello=pb.Hello(
                min_version=1, max_version=1, client_name=f"held{i}", resume_window=30))))
            assert read_frame(sock).WhichOneof("body") == "hello"
            sock.close()  # no Goodbye: held for its window
        for _ in range(200):  # the loop notices the closes after the client does
            m = scrape(d)
            if val(m, "tensordd_resume_windows_held") == 2:
                break
        assert val(m, "tensordd_resume_windows_held") == 2, m
        assert val(m, "tensordd_sessions") == 0
        sock = raw(d.endpoint)
        sock.sendall(hello())
        r = read_frame(sock)
        sock.close()
        assert r.WhichOneof("body") == "error" and r.error.code == pb.RESOURCE_EXHAUSTED, r
        status, _, body = get(d.metrics + "/healthz")
        assert status == 503 and "max-sessions" in body and "resume" in body, (status, body)
        assert val(scrape(d), "tensordd_accepting_sessions") == 0
    assert d.proc.returncode == 0, d.log()


def test_endpoint_recovers_after_half_open_connections_time_out():
    """--metrics-max-connections clients that send half a request fill every slot;
    once --metrics-timeout closed them, /healthz and /metrics answer again by themselves
    (the listening socket is polled again), while the half-open clients still hold
    their ends."""
    import socket
    import time
    with Proc(["--listen", "tcp://127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
               "--metrics-max-connections", "4", "--metrics-timeout", "1"],
              expect=("listening on", "metrics on")) as d:
        host, port = d.metrics[len("http://"):].rsplit(":", 1)
        half = []
        try:
            for _ in range(4):
                s = socket.create_connection((host, int(port)), timeout=10)
                s.sendall(b"GET /healthz HTTP/1.1\r\n")  # never finished
                half.append(s)
            status = None
            for _ in range(40):  # bounded: 40 tries of at most 2 s
                try:
                    with urllib.request.urlopen(d.metrics + "/healthz", timeout=2) as r:
                        status = r.status
                        break
                except (urllib.error.URLError, OSError):
                    time.sleep(0.1)
            assert status == 200, "the metrics endpoint never answered again"
            scrape(d)
            with tensordd.connect(d.endpoint, timeout=10) as s:  # the daemon itself served throughout
                s.sync()
        finally:
            for s in half:
                s.close()
    assert d.proc.returncode == 0, d.log()
