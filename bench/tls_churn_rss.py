#!/usr/bin/env python3
"""tls_churn_rss.py TENSORDD [N] [MODE] -- the daemon's RSS over N short connections to a
tls:// listener that never complete a handshake, and 2 s after the last.

MODE: garbage (300 random bytes), plain (a first byte that is not a TLS record: the
"speaks TLS" refusal), badrecord (0x16 then random bytes: a failed handshake), hello (a
real ClientHello, then the client leaves once answered; the others leave at once, without
reading the daemon's answer). Certificates are made with the openssl command
in a temporary directory. Prints RSS at the start, after each fifth of the connections
(with the connections gauge of /metrics) and 2 s after the last.

    python3 bench/tls_churn_rss.py build/tensordd 5000 garbage
"""
import os
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import procstat  # noqa: E402


def make_pki(d):
    def ossl(*a):
        subprocess.run(["openssl", *a], cwd=d, check=True, capture_output=True, timeout=60)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    ossl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "1", "-subj", "/CN=ca")
    with open(os.path.join(d, "s.ext"), "w") as f:
        f.write("subjectAltName=IP:127.0.0.1\n")
    ossl("req", "-new", *ec, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=server")
    ossl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
         "-CAcreateserial", "-out", "server.pem", "-days", "1", "-extfile", "s.ext")


def main():
    binp = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 5000
    mode = sys.argv[3] if len(sys.argv) > 3 else "garbage"
    with tempfile.TemporaryDirectory(prefix="tdd-churn-") as d:
        make_pki(d)
        p = subprocess.Popen([binp, "--listen", "tls://127.0.0.1:0", "--tls-cert",
                              os.path.join(d, "server.pem"), "--tls-key",
                              os.path.join(d, "server.key"), "--metrics-listen", "127.0.0.1:0"],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        try:
            murl = ep = None
            for line in p.stdout:
                if line.startswith("metrics on"):
                    murl = line.split()[2]
                if line.startswith("listening on tls://"):
                    ep = line.split()[2]
                    break
            host, port = ep[len("tls://"):].rsplit(":", 1)
            ctx = ssl.create_default_context(cafile=os.path.join(d, "ca.pem"))

            def rss():
                return procstat.rss(p.pid) >> 20

            def conns():
                page = urllib.request.urlopen(murl, timeout=10).read().decode()
                return next(x.split()[1] for x in page.splitlines()
                            if x.startswith("tensordd_connections "))

            def one():
                s = socket.create_connection((host, int(port)), timeout=10)
                try:
                    if mode == "garbage":
                        s.sendall(os.urandom(300))
                    elif mode == "plain":
                        s.sendall(b"\x01" + os.urandom(299))
                    elif mode == "badrecord":
                        s.sendall(b"\x16" + os.urandom(299))
                    else:
                        inc, out = ssl.MemoryBIO(), ssl.MemoryBIO()
                        so = ctx.wrap_bio(inc, out, server_hostname="127.0.0.1")
                        try:
                            so.do_handshake()
                        except ssl.SSLWantReadError:
                            pass
                        s.sendall(out.read())
                        s.recv(4096)
                except OSError:
                    pass
                s.close()

            start, marks = rss(), []
            for i in range(n):
                one()
                if (i + 1) % max(1, n // 5) == 0:
                    marks.append(f"{rss()} MB ({conns()} conns)")
            time.sleep(2)
            print(f"{mode} x{n}: RSS {start} MB at start; {', '.join(marks)}; "
                  f"{rss()} MB 2 s after the last")
        finally:
            p.terminate()
            p.wait(30)


if __name__ == "__main__":
    main()
