"""fakeserver -- a scripted stand-in for the daemon, for offline client tests.

It accepts one connection on a Unix socket, records every request (with its
payload bytes) and answers synchronising requests through a handler the
test supplies. It speaks the real framing (proto/frame.h), so it checks the
client's bytes as the daemon would see them.
"""

from __future__ import annotations

import os
import socket
import struct
import tempfile
import threading

from tensordd import tensordd_pb2 as pb

HEADER = struct.Struct("<IIQ")
MAGIC = 0x01444454

# Request bodies that always get exactly one Response.
SYNCHRONISING = {"hello", "sync", "download", "describe", "list_devices", "stats", "backward",
                 "grad", "grad_remove", "grad_replace", "optimizer_step", "goodbye"}


def recv_exact(sock, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise EOFError
        buf += chunk
    return bytes(buf)


def frame(msg, payload: bytes = b"") -> bytes:
    data = msg.SerializeToString()
    return HEADER.pack(MAGIC, len(data), len(payload)) + data + payload


def ok(req_id: int) -> "pb.Response":
    r = pb.Response(id=req_id)
    r.ok.SetInParent()
    return r


class FakeServer:
    """Records requests; answers with handler(server, request, payload).

    handler returns None for the default answer (Ok, or a HelloReply to
    Hello) or a list of (Response, payload bytes) to send; "close" closes
    the connection instead of answering.
    """

    def __init__(self, handler=None):
        self.handler = handler
        self.requests: list = []  # (pb.Request, payload bytes)
        self.errors: list = []
        self._dir = tempfile.mkdtemp(prefix="tdd-fake-")
        self.path = os.path.join(self._dir, "sock")
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(self.path)
        self._listener.listen(1)
        self._conn = None
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def endpoint(self) -> str:
        return f"unix://{self.path}"

    def bodies(self) -> list:
        return [r.WhichOneof("body") for r, _ in self.requests]

    def _serve(self) -> None:
        try:
            self._conn, _ = self._listener.accept()
            while True:
                try:
                    magic, msg_len, payload_len = HEADER.unpack(recv_exact(self._conn, 16))
                except EOFError:
                    return
                if magic != MAGIC:
                    self.errors.append(f"bad magic {magic:#x}")
                    return
                req = pb.Request.FromString(recv_exact(self._conn, msg_len))
                payload = recv_exact(self._conn, payload_len) if payload_len else b""
                self.requests.append((req, payload))
                body = req.WhichOneof("body")
                if body not in SYNCHRONISING and not req.want_reply:
                    continue
                if body in ("backward", "optimizer_step") and getattr(req, body).pipelined:
                    continue  # not answered (Backward.pipelined)
                answer = self.handler(self, req, payload) if self.handler else None
                if answer == "close":
                    self._conn.close()
                    return
                if answer is None:
                    if body == "hello":
                        r = pb.Response(id=req.id)
                        r.hello.version = 1
                        r.hello.server = "fake 0"
                        r.hello.session_id = 42
                        answer = [(r, b"")]
                    else:
                        answer = [(ok(req.id), b"")]
                for resp, data in answer:
                    self._conn.sendall(frame(resp, data))
                if body == "goodbye":
                    self._conn.close()
                    return
        except OSError as e:  # the client went away mid-frame
            self.errors.append(repr(e))

    def close(self) -> None:
        for s in (self._conn, self._listener):
            if s is not None:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                try:
                    s.close()
                except OSError:
                    pass
        self._thread.join(5)
        try:
            os.unlink(self.path)
            os.rmdir(self._dir)
        except OSError:
            pass
