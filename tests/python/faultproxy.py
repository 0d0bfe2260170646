"""faultproxy -- a loopback TCP proxy between a client and the daemon that injects faults.

    with FaultProxy(daemon_port, "drop", at=5000) as p:
        tensordd.connect(p.endpoint)   # the connection dies after 5000 bytes upstream

Modes (each direction is pumped by its own thread; every socket has a timeout, so
nothing outlives stop()):
  pass      forward as is;
  bytes     forward one byte per send, both ways (every read boundary a client or the
            daemon could meet);
  delay     sleep `delay` seconds before forwarding each chunk;
  drop      after `at` bytes from the client (or from the daemon with direction="down"),
            close both sides: a connection lost mid-frame;
  stall     after `at` bytes from the client, forward nothing more either way, keep the
            sockets open (a peer that went silent);
  truncate  forward `at` bytes from the client, then shut the daemon side for writing
            (half a frame, then end of stream), and stop reading the client.
Counts per direction are in .up and .down. Loopback only: it binds 127.0.0.1.
"""
from __future__ import annotations

import socket
import threading
import time

CHUNK = 65536


class FaultProxy:
    def __init__(self, target_port: int, mode: str = "pass", at: int = 0, delay: float = 0.0,
                 direction: str = "up", timeout: float = 30.0):
        assert mode in ("pass", "bytes", "delay", "drop", "stall", "truncate"), mode
        self.target = ("127.0.0.1", target_port)
        self.mode, self.at, self.delay, self.direction = mode, at, delay, direction
        self.timeout = timeout
        self.up = self.down = 0
        self.fired = threading.Event()  # the fault happened
        self._lsock = socket.socket()
        self._lsock.bind(("127.0.0.1", 0))
        self._lsock.listen(8)
        self._lsock.settimeout(0.2)
        self.port = self._lsock.getsockname()[1]
        self.endpoint = f"tcp://127.0.0.1:{self.port}"
        self._stop = threading.Event()
        self._socks: list[socket.socket] = []
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def __enter__(self) -> "FaultProxy":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        for s in self._socks + [self._lsock]:
            try:
                s.close()
            except OSError:
                pass
        for t in self._threads:
            t.join(timeout=5)

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                c, _ = self._lsock.accept()
            except (socket.timeout, OSError):
                continue
            d = socket.create_connection(self.target, timeout=self.timeout)
            for s in (c, d):
                s.settimeout(0.2)
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._socks += [c, d]
            for src, dst, up in ((c, d, True), (d, c, False)):
                t = threading.Thread(target=self._pump, args=(src, dst, up), daemon=True)
                self._threads.append(t)
                t.start()

    def _count(self, up: bool, n: int) -> int:
        """Adds n bytes to the direction's count; returns the count before."""
        if up:
            before, self.up = self.up, self.up + n
        else:
            before, self.down = self.down, self.down + n
        return before

    def _close_both(self, a, b) -> None:
        for s in (a, b):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def _pump(self, src: socket.socket, dst: socket.socket, up: bool) -> None:
        faulty = up == (self.direction == "up")
        try:
            while not self._stop.is_set():
                if self.mode == "stall" and self.fired.is_set():
                    time.sleep(0.05)
                    continue
                try:
                    data = src.recv(CHUNK)
                except socket.timeout:
                    continue
                if not data:
                    dst.shutdown(socket.SHUT_WR)
                    return
                if faulty and self.mode in ("drop", "stall", "truncate"):
                    before = self._count(up, len(data))
                    if before + len(data) >= self.at:
                        keep = max(0, self.at - before)
                        if keep:
                            dst.sendall(data[:keep])
                        self.fired.set()
                        if self.mode == "drop":
                            self._close_both(src, dst)
                            return
                        if self.mode == "truncate":
                            dst.shutdown(socket.SHUT_WR)
                            return
                        continue  # stall: nothing more either way
                    dst.sendall(data)
                    continue
                self._count(up, len(data))
                if self.mode == "bytes":
                    for i in range(len(data)):
                        dst.sendall(data[i:i + 1])
                elif self.mode == "delay":
                    time.sleep(self.delay)
                    dst.sendall(data)
                else:
                    dst.sendall(data)
        except OSError:
            self._close_both(src, dst)
