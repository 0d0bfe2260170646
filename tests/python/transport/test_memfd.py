"""Same-host zero copy: tensors handed over as sealed memfds on a Unix socket.

Checked against numpy (bit for bit, as bytes) and, for the refusals, against what the
daemon must never do: take a file descriptor that is not a sealed memfd of the right
size, or keep any fd it was sent and did not take (/proc/<daemon pid>/fd counted before
and after). A raw client (`Raw`) sends the frames and fds by hand where the Python
client would never send them wrong.
"""
import array
import fcntl
import mmap
import os
import socket
import tempfile

import numpy as np
import pytest

import tensordd
import tensordd.session as session_mod
from tensordd import tensordd_pb2 as pb
from tensordd._wire import HEADER, HEADER_SIZE, MAGIC

from conftest import Daemon

SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE


@pytest.fixture(scope="module")
def unix_daemon():
    with tempfile.TemporaryDirectory(prefix="tdd") as d:
        path = os.path.join(d, "s")
        dmn = Daemon("--listen", f"unix://{path}", "--sim-devices", "1",
                     "--memfd-storage-min", "4M")
        dmn.unix = f"unix://{path}"
        dmn.path = path
        yield dmn
        assert dmn.stop() == 0, dmn.log()


def nfds(dmn) -> int:
    return len(os.listdir(f"/proc/{dmn.proc.pid}/fd"))


def memfd_with(data: bytes, seals=SEALS, size=None) -> int:
    fd = os.memfd_create("test", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.write(fd, data)
    if size is not None:
        os.ftruncate(fd, size)
    if seals:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
    return fd


def same_bytes(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and \
        np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes()


def mapped(arr: np.ndarray) -> bool:
    """Whether arr's memory is an mmap (a download that came as a memfd)."""
    b = arr
    while b is not None and not isinstance(b, mmap.mmap):
        b = b.obj if isinstance(b, memoryview) else getattr(b, "base", None)
    return isinstance(b, mmap.mmap)


class Raw:
    """A hand-driven connection: frames and SCM_RIGHTS as a test needs them."""

    def __init__(self, path_or_port):
        if isinstance(path_or_port, int):
            self.s = socket.create_connection(("127.0.0.1", path_or_port), timeout=10)
        else:
            self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.s.settimeout(10)
            self.s.connect(path_or_port)
        self.ids = 0
        self.buf = b""
        self.fds = []
        req = pb.Request()
        req.hello.min_version = req.hello.max_version = session_mod.PROTOCOL_VERSION
        assert self.call(req).WhichOneof("body") == "hello"

    def send(self, req, fds=(), payload=b""):
        self.ids += 1
        req.id = self.ids
        msg = req.SerializeToString()
        frame = HEADER.pack(MAGIC, len(msg), len(payload)) + msg + payload
        anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())] \
            if fds else []
        self.s.sendmsg([frame], anc)
        return req.id

    def _fill(self, n):
        while len(self.buf) < n:
            data, anc, _, _ = self.s.recvmsg(1 << 16, socket.CMSG_SPACE(4 * 8))
            for lvl, kind, raw in anc:
                if lvl == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    self.fds.extend(array.array("i", raw[: len(raw) - len(raw) % 4]))
            if not data:
                raise ConnectionResetError("closed")
            self.buf += data

    def read(self):
        self._fill(HEADER_SIZE)
        _, mlen, plen = HEADER.unpack(self.buf[:HEADER_SIZE])
        self._fill(HEADER_SIZE + mlen + plen)
        resp = pb.Response.FromString(self.buf[HEADER_SIZE:HEADER_SIZE + mlen])
        payload = self.buf[HEADER_SIZE + mlen:HEADER_SIZE + mlen + plen]
        self.buf = self.buf[HEADER_SIZE + mlen + plen:]
        return resp, payload

    def call(self, req, fds=(), payload=b""):
        self.send(req, fds, payload)
        return self.read()[0]

    def upload(self, handle, arr, fd, offset=0, fds=None, want_reply=True):
        req = pb.Request(want_reply=want_reply)
        up = req.upload
        up.handle = handle
        up.dtype = session_mod.to_wire(arr.dtype)
        up.shape.extend(arr.shape)
        up.payload_fd = True
        up.fd_offset = offset
        return self.call(req, [fd] if fds is None else fds)

    def download(self, handle, as_fd=True):
        req = pb.Request()
        req.download.handle = handle
        req.download.as_fd = as_fd
        return self.read_after(req)

    def neg(self, src, dst):
        """Sends neg(src) into the new handle dst, unanswered: the daemon computes it."""
        req = pb.Request()
        req.op.op = "neg"
        req.op.inputs.append(src)
        req.op.outputs.append(dst)
        self.send(req)

    def read_after(self, req):
        self.send(req)
        return self.read()

    def close(self):
        for fd in self.fds:
            os.close(fd)
        self.s.close()


def error_of(resp):
    assert resp.WhichOneof("body") == "error", resp
    return resp.error


# ---------------------------------------------------------------- the Python client

DTYPES = [np.float32, np.float64, np.float16, np.int64, np.int32, np.int16, np.int8,
          np.uint8, np.bool_]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(0,), (1,), (3, 0, 2), (513, 7), (64, 64, 33)])
def test_roundtrip_bit_exact(unix_daemon, dtype, shape):
    rng = np.random.default_rng(7)
    if dtype == np.bool_:
        a = rng.integers(0, 2, size=shape).astype(np.bool_)
    elif np.issubdtype(dtype, np.floating):
        a = rng.standard_normal(size=shape).astype(dtype)
        if a.size:
            a.reshape(-1)[0] = np.nan  # NaN bits survive too
    else:
        a = rng.integers(-100, 100, size=shape).astype(dtype)
    with tensordd.connect(unix_daemon.unix, timeout=30, memfd_threshold=0) as s:
        t = s.tensor(a)
        b = t.numpy()
        assert s._memfd, "the daemon refused the memfd"
        assert same_bytes(a, b)
        if a.size:
            assert mapped(b), "the download did not come as a memfd"
        c = (t + t).numpy() if dtype not in (np.bool_,) else t.numpy()
        expect = (a + a) if dtype != np.bool_ else a
        assert same_bytes(expect, c)


def test_non_contiguous_and_bf16(unix_daemon):
    a = np.arange(40 * 30, dtype=np.float32).reshape(40, 30)
    with tensordd.connect(unix_daemon.unix, timeout=30, memfd_threshold=0) as s:
        t = s.tensor(a.T)  # a strided numpy view: uploaded in C order
        assert same_bytes(np.ascontiguousarray(a.T), t.numpy())
        u = s.tensor(a).T  # a strided daemon view: answered with a payload
        assert same_bytes(np.ascontiguousarray(a.T), u.numpy())
        h = s.tensor(a, dtype="bfloat16")
        want = session_mod.bf16_bits_to_f32(session_mod.f32_to_bf16_bits(a))
        assert same_bytes(want, h.numpy())


def test_threshold_and_off(unix_daemon, monkeypatch):
    made = []
    orig = session_mod._memfd_of
    monkeypatch.setattr(session_mod, "_memfd_of", lambda arr: made.append(1) or orig(arr))
    a = np.arange(1000, dtype=np.float64)
    with tensordd.connect(unix_daemon.unix, timeout=30, memfd_threshold=8001) as s:
        assert same_bytes(a, s.tensor(a).numpy())
        assert not made  # 8000 bytes: under the threshold
        u = s.tensor(a) * 2  # (a size the client does not know: through the socket)
        b = u.numpy()
        assert same_bytes(a * 2, b) and not mapped(b)
        w = s.tensor(np.arange(1001, dtype=np.float64)) * 2
        b = w.numpy()
        assert same_bytes(np.arange(1001, dtype=np.float64) * 2, b) and not mapped(b)
        b = w.numpy()  # (known now: a sealed copy)
        assert same_bytes(np.arange(1001, dtype=np.float64) * 2, b) and mapped(b)
    made.clear()
    with tensordd.connect(unix_daemon.unix, timeout=30, memfd=False, memfd_threshold=0) as s:
        assert same_bytes(a, s.tensor(a).numpy())
        assert not made
    with tensordd.connect(unix_daemon.unix, timeout=30, memfd_threshold=8000) as s:
        assert same_bytes(a, s.tensor(a).numpy())
        assert made
    with tensordd.connect(unix_daemon.endpoint, timeout=30, memfd_threshold=0) as s:
        assert not s._memfd  # TCP: never


def test_inplace_update_stays_in_the_daemon(unix_daemon, monkeypatch):
    """An optimizer step writes the parameter in place: the daemon's private copy of the
    page changes, the client's memfd does not; the next download shows the new values
    (a copy: the storage no longer matches the file)."""
    kept = []
    orig = session_mod._memfd_of

    def spy(arr):
        fd = orig(arr)
        kept.append(os.dup(fd))
        return fd

    monkeypatch.setattr(session_mod, "_memfd_of", spy)
    p0 = np.linspace(-1, 1, 4096 * 3, dtype=np.float32)
    try:
        with tensordd.connect(unix_daemon.unix, timeout=30, memfd_threshold=0) as s:
            p = s.tensor(p0, requires_grad=True)
            opt = tensordd.optim.SGD([p], lr=0.25)
            (p * p).sum().backward()
            opt.step()
            got = p.detach().numpy()
            assert np.array_equal(got, p0 - np.float32(0.25) * (2 * p0))
            assert len(kept) == 1
            assert os.pread(kept[0], p0.nbytes, 0) == p0.tobytes()  # the file is untouched
            assert fcntl.fcntl(kept[0], fcntl.F_GET_SEALS) & fcntl.F_SEAL_WRITE
    finally:
        for fd in kept:
            os.close(fd)


def test_downloaded_array_is_private(unix_daemon):
    a = np.arange(5000, dtype=np.int32)
    with tensordd.connect(unix_daemon.unix, timeout=30, memfd_threshold=0) as s:
        t = s.tensor(a)
        b = t.numpy()
        b[:] = -1  # copy-on-write in this process
        assert same_bytes(a, t.numpy())


def test_refused_fds_fall_back(start_daemon, tmp_path):
    path = str(tmp_path / "s")
    d = start_daemon("--listen", f"unix://{path}", "--max-conn-fds", "0")
    a = np.arange(3000, dtype=np.float32)
    with tensordd.connect(f"unix://{path}", timeout=30, memfd_threshold=0) as s:
        t = s.tensor(a)
        assert not s._memfd  # refused once, then through the socket
        assert same_bytes(a, t.numpy())
        assert same_bytes(a * 2, (s.tensor(a) * 2).numpy())
    with tensordd.connect(f"unix://{path}", timeout=30, memfd_threshold=0) as s:
        u = s.zeros(3000)
        u._shape, u._dtype = (3000,), "float32"  # (a size the client knows: it asks as_fd)
        assert same_bytes(np.zeros(3000, np.float32), u.numpy())
        assert not s._memfd
    d.stop()


def test_quota_holds(start_daemon, tmp_path):
    path = str(tmp_path / "s")
    d = start_daemon("--listen", f"unix://{path}", "--session-memory", "1M")
    base = None
    r = Raw(path)
    try:
        base = nfds(d)
        big = np.zeros(300_000, np.float32)  # 1.2 MB
        fd = memfd_with(big.tobytes())
        e = error_of(r.upload(1, big, fd))
        os.close(fd)
        assert pb.ErrorCode.Name(e.code) == "RESOURCE_EXHAUSTED", e
        assert nfds(d) == base
        small = np.ones(1000, np.float32)
        fd = memfd_with(small.tobytes())
        assert r.upload(2, small, fd).WhichOneof("body") == "ok"
        os.close(fd)
        resp, _ = r.download(2)
        assert resp.tensor.payload_fd
    finally:
        r.close()
    d.stop()


# ---------------------------------------------------------------- computed tensors, no copy

BIG = 1 << 21  # float32 elements: 8 MiB, over --memfd-storage-min (4 MiB)


def backing_file(arr: np.ndarray):
    """(path, inode) of the file mapped where arr's data is (/proc/self/maps); ("", 0) for
    anonymous memory. A download the daemon sealed in place maps its storage's memfd,
    "memfd:tensordd-storage"; a sealed copy maps "memfd:tensordd-download"."""
    addr = arr.__array_interface__["data"][0]
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(None, 5)
            lo, hi = (int(v, 16) for v in parts[0].split("-"))
            if lo <= addr < hi:
                return (parts[5].strip() if len(parts) > 5 else ""), int(parts[4])
    return "", 0


def known(t, shape, dtype="float32"):
    """t with its shape and dtype told to the client, which otherwise takes a computed
    tensor's first download through the socket (Session._download)."""
    t._shape, t._dtype = tuple(shape), dtype
    return t


def test_computed_download_is_the_storage(unix_daemon):
    """With --memfd-storage-min, once the session passed a memfd, a large tensor the daemon
    computes lives in a memfd of its own, and its downloads hand that memfd over sealed (no
    copy), bit for bit."""
    x0 = np.random.default_rng(7).standard_normal(BIG).astype(np.float32)
    with tensordd.connect(unix_daemon.unix, timeout=30, memfd_threshold=1 << 20) as s:
        x = s.tensor(x0)  # a memfd upload: the session passes fds
        y = known(x * 3, x0.shape)
        a = y.numpy()
        assert same_bytes(a, x0 * np.float32(3))
        name, ino = backing_file(a)
        assert "tensordd-storage" in name, name
        b = y.numpy()  # (again: the same file)
        assert same_bytes(b, a) and backing_file(b) == (name, ino)
        z = known((-x).reshape(1024, BIG // 1024), (1024, BIG // 1024))
        c = z.numpy()
        assert same_bytes(c, (-x0).reshape(1024, BIG // 1024))
        assert "tensordd-storage" in backing_file(c)[0]
        small = known(x[:1000] * 2, (1000,)).numpy()  # (under --memfd-storage-min: a copy)
        assert same_bytes(small, x0[:1000] * np.float32(2))


def test_inplace_after_zero_copy_download(unix_daemon):
    """Sealed means sealed: an optimizer step writes the parameter in place after its
    storage was handed out; the array the client holds keeps the old bytes, the next
    download shows the new ones (a copy: the storage's pages are no longer the file's)."""
    w0 = (np.arange(BIG) % 7 - 3).astype(np.float32)
    with tensordd.connect(unix_daemon.unix, timeout=30, memfd_threshold=1 << 20) as s:
        w = s.tensor(w0)
        p = s.zeros(BIG, requires_grad=True)
        held = known(p.detach(), (BIG,)).numpy()
        assert "tensordd-storage" in backing_file(held)[0]
        opt = tensordd.optim.SGD([p], lr=0.25)
        (p * w).sum().backward()
        opt.step()
        got = known(p.detach(), (BIG,)).numpy()
        p1 = np.float32(0) - np.float32(0.25) * w0  # exact: small integers times 1/4
        assert same_bytes(got, p1)
        assert "tensordd-download" in backing_file(got)[0]
        assert same_bytes(held, np.zeros(BIG, np.float32))
        opt.step()
        assert same_bytes(known(p.detach(), (BIG,)).numpy(), p1 - np.float32(0.25) * w0)
        assert same_bytes(held, np.zeros(BIG, np.float32)) and same_bytes(got, p1)


def test_sealed_storage_refuses_writes(start_daemon, tmp_path):
    """The memfd of a computed tensor comes with every seal: no write, no writable shared
    mapping, no resize; the daemon closes it when the tensor goes (fds counted, in a daemon
    of its own: no memfd cached from other tests)."""
    path = str(tmp_path / "s")
    d = start_daemon("--listen", f"unix://{path}", "--memfd-storage-min", "4M")
    a = np.random.default_rng(5).standard_normal(BIG).astype(np.float32)
    r = Raw(path)
    try:
        base = nfds(d)
        fd = memfd_with(a.tobytes())
        assert r.upload(1, a, fd).WhichOneof("body") == "ok"
        os.close(fd)
        r.neg(1, 2)
        resp, payload = r.download(2)
        assert resp.tensor.payload_fd and not payload
        got = r.fds.pop(0)
        assert "tensordd-storage" in os.readlink(f"/proc/self/fd/{got}")
        seals = fcntl.fcntl(got, fcntl.F_GET_SEALS)
        want = SEALS | fcntl.F_SEAL_SEAL
        assert seals & want == want, seals
        assert os.pread(got, a.nbytes, resp.tensor.fd_offset) == (-a).tobytes()
        with pytest.raises(PermissionError):
            os.pwrite(got, b"x", resp.tensor.fd_offset)
        with pytest.raises(PermissionError):
            mmap.mmap(got, 4096, flags=mmap.MAP_SHARED, prot=mmap.PROT_WRITE)
        with pytest.raises(PermissionError):
            os.ftruncate(got, 0)
        assert os.fstat(got).st_size >= resp.tensor.fd_offset + a.nbytes
        req = pb.Request(want_reply=True)
        req.release.handles.extend([1, 2])
        assert r.call(req).WhichOneof("body") == "ok"
        req = pb.Request()
        req.sync.SetInParent()
        r.call(req)
        assert nfds(d) == base  # the storage's memfd is closed with the tensor
        assert os.pread(got, a.nbytes, resp.tensor.fd_offset) == (-a).tobytes()  # still ours
        os.close(got)
    finally:
        r.close()
    d.stop()


@pytest.mark.parametrize("opts", [(), ("--memfd-storage-min", "0"),
                                  ("--memfd-storage-min", "4M", "--max-memfd-storage", "0")])
def test_memfd_storage_off(start_daemon, tmp_path, opts):
    """Off by default and by either option: computed tensors are made in anonymous memory, their downloads
    are sealed copies."""
    path = str(tmp_path / "s")
    d = start_daemon("--listen", f"unix://{path}", *opts)
    x0 = np.arange(BIG, dtype=np.float32)
    with tensordd.connect(f"unix://{path}", timeout=30, memfd_threshold=1 << 20) as s:
        a = known(s.tensor(x0) * 2, x0.shape).numpy()
        assert same_bytes(a, x0 * 2)
        assert "tensordd-download" in backing_file(a)[0]
    d.stop()


def test_memfd_storage_quota(start_daemon, tmp_path):
    """--session-memory counts storage made in memfds as any other."""
    path = str(tmp_path / "s")
    d = start_daemon("--listen", f"unix://{path}", "--session-memory", "12M",
                     "--memfd-storage-min", "4M")
    x0 = np.ones(BIG, np.float32)
    with tensordd.connect(f"unix://{path}", timeout=30, memfd_threshold=1 << 20) as s:
        x = s.tensor(x0)  # 8 MiB
        with pytest.raises(tensordd.ResourceExhaustedError):
            known(x * 2, x0.shape).numpy()  # 8 more
        assert same_bytes(x.numpy(), x0)
    d.stop()


# ---------------------------------------------------------------- refusals, raw

def test_zero_copy_both_ways(unix_daemon):
    """The download of an untouched memfd upload is the client's own file."""
    r = Raw(unix_daemon.path)
    try:
        a = np.arange(1 << 16, dtype=np.float32)
        fd = memfd_with(b"\0" * 4096 + a.tobytes())
        assert r.upload(1, a, fd, offset=4096).WhichOneof("body") == "ok"
        resp, payload = r.download(1)
        assert resp.tensor.payload_fd and not payload
        got = r.fds.pop(0)
        assert os.fstat(got).st_ino == os.fstat(fd).st_ino
        assert resp.tensor.fd_offset == 4096
        b = r.download(1, as_fd=False)[1]
        assert b == a.tobytes()
        req = pb.Request()
        req.download.handle = 1
        req.download.as_fd = True
        req.download.fd_min_bytes = a.nbytes + 1  # under it: a payload, no fd
        resp, b = r.read_after(req)
        assert not resp.tensor.payload_fd and b == a.tobytes() and not r.fds
        os.close(got)
        os.close(fd)
        # a computed tensor: a new sealed memfd (one copy)
        r.neg(1, 2)
        resp, _ = r.download(2)
        got = r.fds.pop(0)
        assert fcntl.fcntl(got, fcntl.F_GET_SEALS) & fcntl.F_SEAL_WRITE
        assert os.pread(got, a.nbytes, resp.tensor.fd_offset) == (-a).tobytes()
        os.close(got)
    finally:
        r.close()


def bad_fds():
    a = np.arange(1024, dtype=np.float32)
    good = a.tobytes()

    def regular():
        f = tempfile.TemporaryFile()
        f.write(good)
        f.flush()
        fd = os.dup(f.fileno())
        f.close()
        return fd

    def pipe():
        rd, wr = os.pipe()
        os.close(wr)
        return rd

    return a, {
        "regular file": (regular, "payload_fd", "regular file"),
        "pipe": (pipe, "payload_fd", "pipe"),
        "unsealed memfd": (lambda: memfd_with(good, seals=0), "payload_fd", "not sealed"),
        "sealed against shrinking only": (
            lambda: memfd_with(good, seals=fcntl.F_SEAL_SHRINK), "payload_fd", "writing"),
        "too small": (lambda: memfd_with(good[:-4]), "payload_fd", "holds 4092 bytes"),
    }


@pytest.mark.parametrize("kind", list(bad_fds()[1]))
def test_bad_fd_refused_and_closed(unix_daemon, kind):
    a, table = bad_fds()
    make, argument, words = table[kind]
    r = Raw(unix_daemon.path)
    try:
        base = nfds(unix_daemon)
        fd = make()
        e = error_of(r.upload(1, a, fd))
        os.close(fd)
        assert pb.ErrorCode.Name(e.code) == "INVALID_ARGUMENT", e
        assert e.invalid_argument.argument == argument and words in e.message, e
        assert nfds(unix_daemon) == base  # the daemon kept nothing
        # the session goes on; the refused handle is a poisoned placeholder
        assert error_of(r.download(1)[0]).code == pb.ErrorCode.Value("POISONED")
        fd = memfd_with(a.tobytes())
        assert r.upload(2, a, fd).WhichOneof("body") == "ok"
        os.close(fd)
        assert r.download(2, as_fd=False)[1] == a.tobytes()
    finally:
        r.close()


def test_bad_offset_and_missing_fd(unix_daemon):
    a = np.arange(256, dtype=np.float32)
    r = Raw(unix_daemon.path)
    try:
        base = nfds(unix_daemon)
        fd = memfd_with(b"\0" * 8 + a.tobytes())
        e = error_of(r.upload(1, a, fd, offset=8))
        assert e.invalid_argument.argument == "fd_offset", e
        e = error_of(r.upload(2, a, None, fds=[]))
        assert "no file descriptor" in e.message, e
        e = error_of(r.upload(3, a, None, fds=[fd, fd]))
        assert "2 file descriptors" in e.message, e
        os.close(fd)
        assert nfds(unix_daemon) == base
    finally:
        r.close()


def test_fd_on_other_request_closes_connection(unix_daemon):
    r = Raw(unix_daemon.path)
    try:
        base = nfds(unix_daemon)
        fd = memfd_with(b"x" * 64)
        req = pb.Request()
        req.sync.SetInParent()
        r.send(req, [fd])
        os.close(fd)
        resp, _ = r.read()  # the refusal, not an Ok before it
        e = error_of(resp)
        assert pb.ErrorCode.Name(e.code) == "PROTOCOL_ERROR" and "takes none" in e.message, e
        with pytest.raises((ConnectionResetError, OSError)):
            r.read()
    finally:
        r.close()
    for _ in range(100):  # the daemon closes the connection and everything it held
        if nfds(unix_daemon) < base:
            break
        import time
        time.sleep(0.02)
    assert nfds(unix_daemon) == base - 1


def test_too_many_fds_in_flight(start_daemon, tmp_path):
    path = str(tmp_path / "s")
    d = start_daemon("--listen", f"unix://{path}", "--max-conn-fds", "2")
    r = Raw(path)
    try:
        fds = [memfd_with(b"x" * 64) for _ in range(3)]
        req = pb.Request()
        req.sync.SetInParent()
        r.send(req, fds)
        for fd in fds:
            os.close(fd)
        e = error_of(r.read()[0])
        assert pb.ErrorCode.Name(e.code) == "PROTOCOL_ERROR" and "--max-conn-fds" in e.message
    finally:
        r.close()
    d.stop()


def test_tcp_refuses(unix_daemon):
    a = np.arange(16, dtype=np.float32)
    r = Raw(int(unix_daemon.endpoint.rsplit(":", 1)[1]))
    try:
        e = error_of(r.upload(1, a, None, fds=[]))
        assert e.invalid_argument.argument == "payload_fd" and "TCP" in e.message, e
        req = pb.Request(want_reply=True)
        req.upload.handle = 2
        req.upload.dtype = pb.DTYPE_F32
        req.upload.shape.append(16)
        assert r.call(req, payload=a.tobytes()).WhichOneof("body") == "ok"
        e = error_of(r.download(2)[0])
        assert e.invalid_argument.argument == "as_fd" and "TCP" in e.message, e
    finally:
        r.close()


def test_device_memory_one_copy(unix_daemon):
    """sim:0 holds device memory: the upload is copied from the mapping on the worker;
    the download answers with a payload."""
    a = np.random.default_rng(1).standard_normal(10000).astype(np.float32)
    with tensordd.connect(unix_daemon.unix, timeout=30, memfd_threshold=0) as s:
        t = s.tensor(a, device="sim:0")
        b = t.numpy()
        assert s._memfd and same_bytes(a, b) and not mapped(b)
        assert same_bytes(a * 3, (t * 3).numpy())


GPU_ARGS = os.environ.get("TDD_GPU_ARGS")


@pytest.mark.skipif(GPU_ARGS is None, reason="GPU suite: make test-emu, or tests/gpu/run.sh")
def test_cuda_memfd(tmp_path):
    """cuda:0 holds device memory: a memfd upload is one copy from the mapping to the
    device (on the worker), the download answers with a payload; bit-exact, no fd kept."""
    path = str(tmp_path / "s")
    d = Daemon("--listen", f"unix://{path}", *GPU_ARGS.split())
    try:
        a = np.random.default_rng(5).standard_normal((64, 33)).astype(np.float32)
        with tensordd.connect(f"unix://{path}", timeout=120, memfd_threshold=0) as s:
            t = s.tensor(a, device="cuda:0")
            b = t.numpy()
            assert s._memfd and s._memfd_checked and str(t.device) == "cuda:0"
            assert same_bytes(a, b) and not mapped(b)
            assert same_bytes(a * 2, (t * 2).numpy())
            base = nfds(d)
            fd = memfd_with(a.tobytes(), seals=0)
            r = Raw(path)
            req = pb.Request(want_reply=True)
            req.upload.handle = 1
            req.upload.dtype = pb.DTYPE_F32
            req.upload.shape.extend(a.shape)
            req.upload.device.backend = "cuda"
            req.upload.payload_fd = True
            e = error_of(r.call(req, [fd]))
            os.close(fd)
            assert "not sealed" in e.message, e
            assert nfds(d) == base + 1  # (the raw connection's own socket)
            r.close()
    finally:
        assert d.stop() == 0, d.log()
