#!/usr/bin/env python3
"""make_corpus.py -- writes the seed corpus for the daemon fuzz target.

Run from the repository root after `make` (it needs the generated tensordd_pb2):
    PYTHONPATH=client/python/tensordd /usr/bin/python3 tests/fuzz/make_corpus.py
Each file is the byte stream one client sends: valid sessions, and sessions
broken in the ways a hostile or buggy client breaks them. It also writes the session
target's seed programs (seed_*) into corpus_session, beside what libFuzzer kept."""
import os
import random
import struct

import tensordd_pb2 as pb

MAGIC = 0x01444454
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")
SESSION_OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus_session")


def frame(req, payload=b"", magic=MAGIC, mlen=None, plen=None):
    m = req.SerializeToString()
    return struct.pack("<IIQ", magic, len(m) if mlen is None else mlen,
                       len(payload) if plen is None else plen) + m + payload


def hello(i=1, lo=1, hi=1):
    return frame(pb.Request(id=i, hello=pb.Hello(min_version=lo, max_version=hi, client_name="fuzz")))


def upload(i, h, shape, dtype=pb.DTYPE_F32, device=None, payload=None, grad=False):
    n = 1
    for d in shape:
        n *= max(d, 0)
    size = {pb.DTYPE_F32: 4, pb.DTYPE_F64: 8, pb.DTYPE_I64: 8, pb.DTYPE_I32: 4,
            pb.DTYPE_BOOL: 1, pb.DTYPE_F16: 2, pb.DTYPE_BF16: 2}.get(dtype, 4)
    if payload is None:
        payload = struct.pack("<%df" % n, *[(k % 7) - 3.0 for k in range(n)]) if size == 4 else bytes(n * size)
    up = pb.Upload(handle=h, dtype=dtype, shape=shape, requires_grad=grad)
    if device:
        up.device.backend, up.device.ordinal = device
    return frame(pb.Request(id=i, upload=up), payload)


def op(i, name, ins, outs, want=False, **attrs):
    o = pb.Op(op=name, inputs=ins, outputs=outs)
    for k, v in attrs.items():
        a = o.attrs.add(name=k)
        if isinstance(v, bool):
            a.b = v
        elif isinstance(v, int):
            a.i = v
        elif isinstance(v, float):
            a.f = v
        elif isinstance(v, str):
            a.s = v
        else:
            a.ints.v.extend(v)
    return frame(pb.Request(id=i, want_reply=want, op=o))


def req(i, **kw):
    return frame(pb.Request(id=i, **kw))


# ---------------------------------------------------------------- the session target
# fuzz_session.c reads a program: a step byte (modulo 13) and the bytes that step takes.
# These seeds reach the paths its markers open from the start: a Sync step followed by
# 0xA6 (a transfer), 0xA7 (a process group), 0xA8 (a request in flight as the connection
# drops, then resumed), 0xA9 (MODE_EXPIRE: the end, a request in flight); an input that
# opens with 0xF5 sets a mode with its second byte (bits 0-1: --session-memory of 2, 16 or
# 128 KiB; bit 2: MODE_EXPIRE, a resume window of 1 s left to run out).
UPLOAD, OP, GRAPH, SYNC, RELEASE, DOWNLOAD = 0, 2, 11, 12, 9, 10
TRANSFER, GROUP, HELD, END = 0xA6, 0xA7, 0xA8, 0xA9

def upload_f32(n, cpu=False):
    """Upload f32 [n] (n < 5) on ref:0 (cpu:0), its values 1..n, not answered."""
    return bytes([UPLOAD, 0x40 if cpu else 0, n]) + bytes(range(1, 4 * n + 1)) + b"\x00"

def relu(pick=0):
    return bytes([OP, 0, pick, 0, 0])

def sync():
    return bytes([SYNC])

def mode(m):
    return bytes([0xF5, m])

def accept(b=0, n=4):
    """After a Sync: TransferAccept, f32 [n] on ref:0 with b=0."""
    return sync() + bytes([TRANSFER, 1, b, n])

def send(b=0, tensor=0, cap=0):
    """After a Sync: TransferSend; b%8 the endpoint (0, 1: the daemon itself, 2: a port
    that never answers, 3: a closed port, 4: [::1], refused by --transfer-peers, 5: TLS to
    a plain listener, 6, 7: bad)."""
    return sync() + bytes([TRANSFER, 0, b, tensor]) + (bytes([cap]) if b >> 6 < 3 else b"")

def group(name=0, world=1, rank=0, exchange=0, cpu=0):
    w = {0: 0, 1: 1, 2: 6, 3: 7}[world]
    return name | (w << 2) | (rank << 5) | (exchange << 6) | (cpu << 7)

def create(**kw):
    return sync() + bytes([GROUP, 0, group(**kw)])

def session_seeds():
    s = {}
    # GraphEnd refused: a session of 2 KiB records relu after relu until the graph's
    # requests no longer fit; then the same under 16 KiB (uploads and ops refused too)
    body = upload_f32(2) + sync() + bytes([GRAPH, 0]) + relu() * 24 + bytes([GRAPH, 1]) + \
        sync() + bytes([GRAPH, 2, 1]) + sync()
    s["graph_quota_2k"] = mode(1) + body
    s["graph_quota_16k"] = mode(2) + upload_f32(4) * 6 + body + relu() * 8 + body
    s["graph_quota_128k"] = mode(3) + upload_f32(4) + body * 3
    # transfers: to the daemon itself (the push lands in this session), again with the
    # spent capability, to a closed port, to an address --transfer-peers refuses, over
    # TLS to a plain listener, bad endpoints, a made-up capability, a bad token, a size
    # the capability does not say, a bad accept (cuda, unknown dtype, a bound handle)
    s["transfer_paths"] = upload_f32(4) + accept() + send() + send() + accept() + \
        send(2) + send(3) + send(4) + send(5) + send(6) + send(7) + send(0xC0) + send(56) + \
        accept(0, 2) + send(0, 0, 2) + accept(0xF0) + accept(0x0C) + accept(0x0F) + \
        sync() + bytes([DOWNLOAD, 0x0F]) + sync()
    # groups: one rank of one (store, exchange + connect, all-reduce sum and average,
    # broadcast, a root out of range, all-gather), a rank whose peers
    # never come (0 of 2, 1 of 2, 2 of 3 is 1 of 3 here), bad names and world sizes
    s["group_paths"] = upload_f32(3) + create(world=2) + sync() + bytes([GROUP, 19, 0, 1]) + \
        bytes([RELEASE, 0, 1]) + create() + sync() + bytes([GROUP, 19, 0, 1]) + \
        sync() + bytes([GROUP, 23, 0, 1]) + sync() + bytes([GROUP, 83, 0, 1]) + \
        sync() + bytes([GROUP, 87, 0, 1]) + sync() + bytes([GROUP, 99, 0, 1]) + \
        create(name=1, exchange=1) + sync() + bytes([GROUP, 2 | (1 << 2), 2]) + \
        sync() + bytes([GROUP, 19, 0, 2]) + \
        sync() + bytes([GROUP, 2 | (1 << 2) | (1 << 4) | (3 << 5), 2]) + \
        create(name=2) + create(world=0) + create(name=3) + create(name=1) + \
        create(name=1, exchange=1, cpu=1) + sync() + bytes([GROUP, 2 | (3 << 2), 0]) + sync()
    # held sessions: a TransferSend to itself, one to a port that never answers, one to a
    # closed port, and a GroupCreate whose rank 0 never comes, each in flight as the
    # connection drops; resumed
    s["held_in_flight"] = upload_f32(4) + accept() + sync() + bytes([HELD, 1, 0, 0, 0]) + \
        accept() + sync() + bytes([HELD, 1, 2, 0, 0]) + \
        sync() + bytes([HELD, 1, 3, 0, 0]) + sync() + bytes([HELD, 0, group(world=2, rank=1)]) + \
        sync() + bytes([HELD, 0, group(world=1)]) + sync()
    # held sessions left to expire (a resume window of 1 s, no Goodbye), a request in flight
    s["expire_transfer"] = mode(4) + upload_f32(4) + accept() + sync() + bytes([END, 1, 0, 0, 0])
    s["expire_silent_push"] = mode(4) + upload_f32(4) + accept() + sync() + bytes([END, 1, 2, 0, 0])
    s["expire_group"] = mode(4) + upload_f32(2) + sync() + bytes([END, 0, group(world=2)])
    s["expire_held_quota"] = mode(5) + upload_f32(4) + accept() + sync() + bytes([HELD, 1, 0, 0, 0]) + \
        bytes([GRAPH, 0]) + relu() * 30 + bytes([GRAPH, 1]) + sync() + bytes([END, 0, group(world=2, rank=1)])
    return s


def main():
    os.makedirs(OUT, exist_ok=True)
    rnd = random.Random(20261130)
    c = {}
    base = hello() + upload(2, 1, [2, 3]) + upload(3, 2, [3, 2])
    c["session_matmul"] = base + op(4, "matmul", [1, 2], [3]) + op(5, "relu", [3], [4]) + \
        op(6, "sum", [4], [5]) + req(7, download=pb.Download(handle=5)) + req(8, sync=pb.Sync()) + \
        req(9, goodbye=pb.Goodbye())
    c["session_errors"] = base + op(4, "add", [1, 2], [3]) + op(5, "relu", [3], [4]) + \
        op(6, "nope", [1], [5]) + op(7, "relu", [99], [6]) + op(8, "relu", [1], [1]) + \
        op(9, "relu", [1], [0]) + op(10, "add", [1], [7, 8]) + req(11, sync=pb.Sync()) + \
        req(12, download=pb.Download(handle=4)) + req(13, release=pb.Release(handles=[1, 1, 77])) + \
        req(14, describe=pb.Describe(handle=2)) + req(15, stats=pb.Stats())
    c["session_devices"] = hello() + upload(2, 1, [4], device=("cpu", 1)) + \
        upload(3, 2, [4], device=("ref", 0)) + upload(4, 3, [4], device=("cuda", 0)) + \
        upload(5, 4, [4], device=("tpu", 0)) + op(6, "add", [1, 2], [5]) + \
        frame(pb.Request(id=7, to_device=pb.ToDevice(input=1, output=6, device=pb.Device(backend="ref")))) + \
        op(8, "mul", [6, 2], [7], want=True) + req(9, list_devices=pb.ListDevices()) + req(10, sync=pb.Sync())
    c["upload_bad_payload"] = hello() + upload(2, 1, [2, 3], payload=b"\x00" * 5) + \
        upload(3, 2, [-1, 3], payload=b"") + upload(4, 3, [1 << 40, 1 << 40], payload=b"") + \
        upload(5, 4, [2] * 9, payload=b"") + upload(6, 5, [2], dtype=99, payload=b"\x00" * 8) + \
        upload(7, 6, [2], dtype=pb.DTYPE_I64, grad=True) + req(8, sync=pb.Sync())
    c["no_hello"] = req(1, sync=pb.Sync()) + base
    c["hello_twice"] = hello() + hello(2)
    c["version_mismatch"] = hello(1, 99, 99) + req(2, sync=pb.Sync())
    c["bad_magic"] = frame(pb.Request(id=1, hello=pb.Hello(min_version=1, max_version=1)), magic=0xdeadbeef)
    c["frame_too_large"] = hello() + struct.pack("<IIQ", MAGIC, 0xFFFFFFF0, 0)
    c["payload_too_large"] = hello() + struct.pack("<IIQ", MAGIC, 4, 1 << 62) + b"\x08\x01\x10\x00"
    c["payload_on_sync"] = hello() + frame(pb.Request(id=2, sync=pb.Sync()), b"xxxx")
    c["truncated_header"] = hello() + struct.pack("<IIQ", MAGIC, 10, 0)[:9]
    c["truncated_message"] = hello() + frame(pb.Request(id=2, sync=pb.Sync()))[:-1]
    c["truncated_payload"] = hello() + upload(2, 1, [1024])[:-100]
    c["empty_message"] = hello() + struct.pack("<IIQ", MAGIC, 0, 0)
    c["not_protobuf"] = hello() + struct.pack("<IIQ", MAGIC, 8, 0) + b"\xff" * 8
    c["empty_request"] = hello() + req(2)
    c["attrs"] = base + op(4, "sum", [1], [3], dim=[5, -9], keepdim=True) + \
        op(5, "relu", [1], [4], alpha="x", beta=1.5) + frame(pb.Request(id=6, op=pb.Op(
            op="add", inputs=[1, 1], outputs=[5], attrs=[pb.Attr(name="empty")]))) + req(7, sync=pb.Sync())
    c["autodiff_requests"] = base + upload(4, 9, [2, 3], grad=True) + op(5, "relu", [9], [10]) + \
        op(6, "sum", [10], [11]) + req(7, backward=pb.Backward(loss=11, grads=12)) + \
        req(8, grad=pb.Grad(grads=12, tensor=9, output=13)) + \
        req(9, grad_replace=pb.GradReplace(grads=12, tensor=9, grad=1)) + \
        req(10, grad_replace=pb.GradReplace(grads=1, tensor=9, grad=1)) + \
        req(11, grad_remove=pb.Grad(grads=12, tensor=2, output=14)) + \
        req(12, set_grad_mode=pb.SetGradMode(enabled=False)) + \
        req(13, optimizer_create=pb.OptimizerCreate(handle=20, kind="adam", params=[9])) + \
        req(14, optimizer_step=pb.OptimizerStep(optimizer=20, grads=12)) + req(15, sync=pb.Sync())
    c["random_1mib"] = bytes(rnd.getrandbits(8) for _ in range(1 << 20))
    c["hello_then_random"] = hello() + bytes(rnd.getrandbits(8) for _ in range(4096))
    for k in range(6):
        s = bytearray(c["session_matmul"])
        for _ in range(8):
            s[rnd.randrange(len(s))] = rnd.getrandbits(8)
        c["mutated_%d" % k] = bytes(s)
    for name, data in c.items():
        with open(os.path.join(OUT, name), "wb") as f:
            f.write(data)
    print("wrote %d corpus files to %s" % (len(c), OUT))
    seeds = session_seeds()
    for name, data in seeds.items():
        with open(os.path.join(SESSION_OUT, "seed_" + name), "wb") as f:
            f.write(data)
    print("wrote %d seed programs to %s" % (len(seeds), SESSION_OUT))


if __name__ == "__main__":
    main()
