"""Clients that misbehave without sending garbage: one that goes quiet in the
middle of a frame, one that never reads its replies, one that hangs up in the
middle of an upload. None of them may block another session, and what they
held must come back (handles and memory, read from the daemon's own stats)."""

import socket
import time

import numpy as np
import pytest

import tensordd
from tensordd import tensordd_pb2 as pb

from helpers import frame, hello, raw


@pytest.fixture
def fresh(start_daemon):
    """A daemon of its own, so the counters read here are this test's alone."""
    d = start_daemon("--cpu-devices", "1")
    return d


def memory_in_use(s):
    return sum(m["bytes_in_use"] for m in s.stats()["memory"].values())


def assert_quick_session(endpoint):
    """A second client gets correct answers while the first misbehaves."""
    t0 = time.monotonic()
    with tensordd.connect(endpoint, timeout=10) as s:
        a = np.arange(12, dtype=np.float32).reshape(3, 4)
        got = (s.tensor(a) * 2).sum().numpy()
        assert float(got) == float((a * 2).sum())
    assert time.monotonic() - t0 < 5.0, "another session was held up"


def test_client_silent_mid_frame_does_not_block_others(fresh):
    quiet = raw(fresh.endpoint)
    quiet.sendall(hello(name="isolation"))
    req = frame(pb.Request(id=2, sync=pb.Sync()))
    quiet.sendall(req[:7])  # half a header, then nothing
    for _ in range(3):
        assert_quick_session(fresh.endpoint)
    quiet.sendall(req[7:])  # the rest arrives late: the session is still served
    quiet.settimeout(10)
    hdr = quiet.recv(16, socket.MSG_WAITALL)
    assert len(hdr) == 16
    quiet.close()


def test_client_that_never_reads_replies_does_not_block_others(fresh):
    with tensordd.connect(fresh.endpoint) as watcher:
        base_mem = memory_in_use(watcher)
        hog = raw(fresh.endpoint)
        hog.sendall(hello(name="isolation"))
        big = np.zeros(1 << 20, np.float32)  # 4 MiB tensor
        hog.sendall(frame(pb.Request(id=2, upload=pb.Upload(
            handle=1, dtype=pb.DTYPE_F32, shape=[big.size])), big.tobytes()))
        # 64 downloads of 4 MiB each that it never reads: 256 MiB of replies
        burst = b"".join(frame(pb.Request(id=3 + i, download=pb.Download(handle=1)))
                         for i in range(64))
        hog.setblocking(False)
        try:
            hog.send(burst)
        except BlockingIOError:
            pass
        for _ in range(3):
            assert_quick_session(fresh.endpoint)
        # replies point at the tensor's memory: the stalled client costs no copies
        assert memory_in_use(watcher) - base_mem <= 2 * big.nbytes
        hog.close()
        deadline = time.monotonic() + 10
        while watcher.stats()["sessions"] > 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert watcher.stats()["sessions"] == 1
        assert memory_in_use(watcher) == base_mem


def test_hang_up_mid_upload_frees_everything(fresh):
    with tensordd.connect(fresh.endpoint) as watcher:
        base = watcher.stats()
        base_mem = memory_in_use(watcher)
        c = raw(fresh.endpoint)
        c.sendall(hello(name="isolation"))
        # The Hello reply first: the session surely exists before the wait below,
        # which could otherwise end before the daemon had even accepted it.
        assert len(c.recv(16, socket.MSG_WAITALL)) == 16
        payload = np.ones(1 << 20, np.float32).tobytes()  # 4 MiB promised
        msg = frame(pb.Request(id=2, upload=pb.Upload(handle=7, dtype=pb.DTYPE_F32,
                                                      shape=[1 << 20])), payload)
        c.sendall(msg[:len(msg) // 2])  # half of it, then gone
        c.close()
        deadline = time.monotonic() + 10
        while watcher.stats()["sessions"] > base["sessions"] and time.monotonic() < deadline:
            time.sleep(0.05)
        after = watcher.stats()
        assert after["sessions"] == base["sessions"]
        assert after["handles"] == base["handles"]
        assert after["tensors_alive"] == base["tensors_alive"]
        assert memory_in_use(watcher) == base_mem
        assert_quick_session(fresh.endpoint)


def test_idle_timeout_closes_only_the_silent_session(start_daemon):
    d = start_daemon("--idle-timeout", "1")
    quiet = raw(d.endpoint)
    quiet.sendall(hello(name="isolation"))
    with tensordd.connect(d.endpoint, timeout=10) as busy:
        deadline = time.monotonic() + 2.5
        while time.monotonic() < deadline:  # busy keeps talking; quiet says nothing
            busy.sync()
            time.sleep(0.2)
        quiet.settimeout(5)
        data = b""
        while True:  # the Hello reply, then EOF
            chunk = quiet.recv(65536)
            if not chunk:
                break
            data += chunk
        assert len(data) > 16, "the Hello reply came before the close"
        busy.sync()  # the active session is still served
        assert busy.stats()["sessions"] == 1
