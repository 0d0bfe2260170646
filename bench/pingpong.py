"""pingpong.py -- the baseline of the Python round-trip rows: a raw socket ping-pong of n
bytes between this process and an echo process on loopback (bench/peers.py,
bench/py_client.py)."""
from __future__ import annotations

import contextlib
import socket
import subprocess
import sys

ECHO = r"""
import socket, sys
n = int(sys.argv[1])
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(1)
print(s.getsockname()[1], flush=True)
c, _ = s.accept(); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
while True:
    got = b""
    while len(got) < n:
        d = c.recv(n - len(got))
        if not d:
            sys.exit(0)
        got += d
    c.sendall(got)
"""


@contextlib.contextmanager
def echo_ping(n: int = 64):
    """Yields ping(): send n bytes to the echo process and read them back."""
    echo = subprocess.Popen([sys.executable, "-c", ECHO, str(n)], stdout=subprocess.PIPE,
                            text=True)
    try:
        so = socket.create_connection(("127.0.0.1", int(echo.stdout.readline())))
        so.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        msg = b"x" * n

        def ping():
            so.sendall(msg)
            got = 0
            while got < n:
                got += len(so.recv(n - got))

        try:
            yield ping
        finally:
            so.close()
    finally:
        echo.kill()
        echo.wait()
