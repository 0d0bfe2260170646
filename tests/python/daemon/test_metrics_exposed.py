"""--metrics-listen beyond loopback, as Prometheus in a cluster scrapes it: the daemon in a
network namespace of its own (a veth pair, an address the test assigns), scraped from this
namespace over that address. Beyond loopback the endpoint needs a token (or --insecure),
as the tensor listeners do: /metrics asks for it as a bearer token, /healthz stays open
for probes. The page is strict Prometheus text with build_info and process_* series, and
its series count does not grow as sessions come and go (no label per session). Without
the privileges to make a namespace, the daemon binds 0.0.0.0 and is scraped through
127.0.0.1 (the same address rule; the output says which ran)."""

import os
import subprocess
import urllib.error
import urllib.request

import numpy as np
import pytest
import tensordd

from daemonproc import Proc, run
from test_metrics import parse

TOKEN = "metrics-exposed-token"


def _ip(*args, ns=None):
    cmd = (["ip", "netns", "exec", ns, "ip"] if ns else ["ip"]) + list(args)
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if r.returncode:
        raise OSError(f"{' '.join(cmd)}: {r.stderr.strip()}")


class Netns:
    """A namespace with a veth to this one: this side .1, the namespace's side .2 of a /30
    in 10.(200..249).x.0; or, without privileges, nothing (addr 0.0.0.0, reach 127.0.0.1)."""

    def __init__(self):
        tag = str(os.getpid())[-6:]
        self.ns, self.link = f"tdm{tag}", f"tdmh{tag}"
        a, b = 200 + os.getpid() % 50, os.getpid() // 50 % 250
        self.made = False
        try:
            if os.geteuid() != 0:
                raise OSError("not root")
            taken = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True,
                                   timeout=30).stdout
            if f" 10.{a}.{b}." in taken:
                raise OSError(f"10.{a}.{b}.0/30 is in use here")
            _ip("netns", "add", self.ns)
            self.made = True
            _ip("link", "add", self.link, "type", "veth", "peer", "name", "eth0", "netns",
                self.ns)
            _ip("addr", "add", f"10.{a}.{b}.1/30", "dev", self.link)
            _ip("link", "set", self.link, "up")
            _ip("addr", "add", f"10.{a}.{b}.2/30", "dev", "eth0", ns=self.ns)
            _ip("link", "set", "eth0", "up", ns=self.ns)
            _ip("link", "set", "lo", "up", ns=self.ns)
            self.addr = self.reach = f"10.{a}.{b}.2"
            self.prefix = ["ip", "netns", "exec", self.ns]
            self.how = f"namespace {self.ns} at {self.addr}, scraped over veth {self.link}"
        except (OSError, subprocess.TimeoutExpired) as e:
            self.close()
            self.addr, self.reach, self.prefix = "0.0.0.0", "127.0.0.1", []
            self.how = f"no network namespace ({e}): bound to 0.0.0.0, scraped via 127.0.0.1"

    def close(self):
        if self.made:
            subprocess.run(["ip", "link", "del", self.link], capture_output=True, timeout=30)
            subprocess.run(["ip", "netns", "del", self.ns], capture_output=True, timeout=30)
            self.made = False


@pytest.fixture
def netns():
    n = Netns()
    print(n.how)
    yield n
    n.close()


def get(url, token=None):
    req = urllib.request.Request(url)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def series(page):
    return set(parse(page))


def test_scrape_beyond_loopback_with_a_token(tmp_path, netns):
    tok = tmp_path / "token"
    tok.write_text(TOKEN + "\n")
    tok.chmod(0o600)
    args = ["--listen", f"tcp://{netns.addr}:0", "--metrics-listen", f"{netns.addr}:0",
            "--token-file", str(tok)]
    with Proc(args, expect=("listening on", "metrics on"), prefix=netns.prefix) as d:
        port = d.metrics.rsplit(":", 1)[1]
        base = f"http://{netns.reach}:{port}"
        tport = d.endpoint.rsplit(":", 1)[1]
        endpoint = f"tcp://{netns.reach}:{tport}"

        status, body = get(base + "/metrics")
        assert status == 401 and "Bearer" in body, (status, body)
        status, body = get(base + "/metrics", token="wrong")
        assert status == 401, status
        status, body = get(base + "/healthz")  # probes carry no secret
        assert status == 200 and body == "ok\n", (status, body)
        status, body = get(base + "/livez")  # the liveness probe's: the loop answers
        assert status == 200 and body == "alive\n", (status, body)

        status, page = get(base + "/metrics", token=TOKEN)
        assert status == 200, (status, page)
        m = parse(page)
        build = [ls for (n, ls) in m if n == "tensordd_build_info"]
        assert len(build) == 1 and dict(build[0])["version"] == tensordd.__version__, build
        for name in ("process_cpu_seconds_total", "process_resident_memory_bytes",
                     "process_open_fds", "process_start_time_seconds", "process_max_fds"):
            assert (name, ()) in m, name
        assert m[("process_resident_memory_bytes", ())] > 1 << 20
        assert m[("process_open_fds", ())] >= 3

        # sessions come and go: the set of series stays the same once every op and
        # request type seen has its series (bounded by ops, devices, codes, not sessions)
        def one_session(i):
            with tensordd.connect(endpoint, token=TOKEN, timeout=10) as s:
                a = s.tensor(np.full(16, float(i), np.float32))
                assert float((a * 2).sum().numpy()) == 32.0 * i

        one_session(0)
        first = series(get(base + "/metrics", token=TOKEN)[1])
        counts = []
        for i in range(1, 6):
            one_session(i)
            with tensordd.connect(endpoint, token=TOKEN, timeout=10) as held:
                held.tensor(np.ones(4, np.float32)).numpy()
                during = series(get(base + "/metrics", token=TOKEN)[1])
                counts.append(len(during))
                assert during == first, sorted(during ^ first)[:10]
        assert len(set(counts)) == 1, counts
        for name, labels in first:
            assert not {k for k, _ in labels} & {"session", "client", "peer"}, (name, labels)
    assert d.proc.returncode == 0, d.log()


def test_beyond_loopback_without_token_is_refused():
    r = run("--listen", "tcp://127.0.0.1:0", "--metrics-listen", "0.0.0.0:0")
    assert r.returncode != 0
    assert "beyond loopback needs a token" in r.stderr and "--insecure" in r.stderr, r.stderr


def test_insecure_allows_it_with_a_warning():
    with Proc(["--listen", "tcp://127.0.0.1:0", "--metrics-listen", "0.0.0.0:0", "--insecure"],
              expect=("listening on", "metrics on")) as d:
        port = d.metrics.rsplit(":", 1)[1]
        status, page = get(f"http://127.0.0.1:{port}/metrics")
        assert status == 200 and parse(page)
    assert any("INSECURE: metrics on 0.0.0.0" in ln for ln in d.stderr_lines()), d.log()
