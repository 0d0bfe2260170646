"""A client that goes away while its connection waits on a synchronising request that
waits on something outside the daemon (a process group's rank that never comes, a push
to a daemon that never answers): the daemon reads nothing from the connection then, yet
it notices the end of stream and ends the session while the wait is still going on,
not only when it would write the answer (a --group-timeout or --transfer-timeout
later)."""

from __future__ import annotations

import socket
import tempfile
import threading
import time

import pytest

import tensordd
from helpers import frame, hello, raw, read_frame
from tensordd import tensordd_pb2 as pb


def _session_ids(observer):
    return {x["session_id"] for x in observer.stats()["session_list"]}


def _gone_within(observer, sid, seconds):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if sid not in _session_ids(observer):
            return True
        time.sleep(0.1)
    return False


class _Mute:
    """A listener that accepts connections and never answers (a peer that hangs)."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.settimeout(0.2)
        self.endpoint = f"tcp://127.0.0.1:{self.sock.getsockname()[1]}"
        self.conns, self._stop = [], False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self._stop:
            try:
                self.conns.append(self.sock.accept()[0])
            except OSError:
                continue

    def close(self):
        self._stop = True
        self.thread.join(10)
        for c in self.conns:
            c.close()
        self.sock.close()


@pytest.mark.parametrize("wait", ["group_create", "transfer_send"])
def test_a_client_gone_while_its_request_waits_ends_its_session(start_daemon, wait):
    with tempfile.TemporaryDirectory(prefix="tdd-gone-") as store:
        # (the waits outlast the check below; a shutdown then waits for them to end)
        d = start_daemon("--group-store-dir", store, "--group-timeout", "12",
                         "--transfer-peers", "127.0.0.1", "--transfer-timeout", "12")
        mute = _Mute()
        observer = tensordd.connect(d.endpoint, timeout=60)
        sock = raw(d.endpoint)
        try:
            sock.sendall(hello(1, "goes-away"))
            sid = read_frame(sock).hello.session_id
            if wait == "group_create":  # rank 1 of 2 never joins
                req = pb.Request(id=2, group_create=pb.GroupCreate(
                    group=1, name="gone-client", rank=0, world_size=2))
            else:  # the target accepts the connection and never says a word
                sock.sendall(frame(pb.Request(id=2, upload=pb.Upload(
                    handle=1, dtype=pb.DTYPE_F32, shape=[2])), b"\0" * 8))
                req = pb.Request(id=3, transfer_send=pb.TransferSend(
                    tensor=1, endpoint=mute.endpoint, token="t", capability=bytes(16)))
            sock.sendall(frame(req))
            time.sleep(0.5)  # the request is in, and waits
            assert sid in _session_ids(observer)
            sock.close()
            assert _gone_within(observer, sid, 6), \
                "the session of a client that went away lives on until its request ends"
            observer.sync()  # the daemon goes on
        finally:
            sock.close()
            observer.close(raise_errors=False)
            mute.close()
        assert d.stop() == 0, d.log()
