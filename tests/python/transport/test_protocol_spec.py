"""docs/protocol.md's claims, held against the daemon with raw frames (no client library):
framing errors answered with id 0 then end of stream, the request kinds, which id an
error names, the first-error rule, failed requests binding their new ids, payload byte
layouts (little-endian, f16, bf16 as the upper half of an f32; numpy is the oracle),
Hello's version check, and the id-0 goodbye of a daemon that shuts down."""

import socket
import struct

import numpy as np

from helpers import MAGIC, frame, hello, raw, read_frame
from tensordd import tensordd_pb2 as pb

F32, F16, BF16 = pb.DTYPE_F32, pb.DTYPE_F16, pb.DTYPE_BF16


def connect(daemon):
    s = raw(daemon.endpoint)
    s.sendall(hello(rid=1))
    r = read_frame(s)
    assert r.id == 1 and r.WhichOneof("body") == "hello", r
    return s


def send(s, rid, payload=b"", want_reply=False, **body):
    s.sendall(frame(pb.Request(id=rid, want_reply=want_reply, **body), payload))


def upload(s, rid, handle, arr, dtype, want_reply=False):
    send(s, rid, arr.tobytes(), want_reply=want_reply,
         upload=pb.Upload(handle=handle, dtype=dtype, shape=list(arr.shape)))


def read_with_payload(s):
    """(Response, payload bytes)."""
    hdr = s.recv(16, socket.MSG_WAITALL)
    magic, mlen, plen = struct.unpack("<IIQ", hdr)
    assert magic == MAGIC
    r = pb.Response()
    r.ParseFromString(s.recv(mlen, socket.MSG_WAITALL))
    data = b""
    while len(data) < plen:
        chunk = s.recv(plen - len(data))
        assert chunk
        data += chunk
    return r, data


def at_eof(s):
    s.settimeout(10)
    return read_frame(s) is None


# ---------------------------------------------------------------- section 2: framing


def test_bad_magic_is_answered_with_id_0_then_the_connection_closes(daemon):
    s = connect(daemon)
    m = pb.Request(id=2, sync=pb.Sync()).SerializeToString()
    s.sendall(struct.pack("<IIQ", 0x02444454, len(m), 0) + m)
    r = read_frame(s)
    assert r.id == 0 and r.error.code == pb.PROTOCOL_ERROR and r.error.request_id == 0
    assert at_eof(s)


def test_an_empty_message_is_a_protocol_error(daemon):
    s = connect(daemon)
    s.sendall(struct.pack("<IIQ", MAGIC, 0, 0))
    r = read_frame(s)
    assert r.id == 0 and r.error.code == pb.PROTOCOL_ERROR
    assert at_eof(s)


def test_before_hello_frames_are_limited_to_16k_and_no_payload(daemon):
    s = raw(daemon.endpoint)
    s.sendall(struct.pack("<IIQ", MAGIC, 16 * 1024 + 1, 0))
    r = read_frame(s)
    assert r.id == 0 and r.error.code == pb.FRAME_TOO_LARGE
    assert at_eof(s)
    s = raw(daemon.endpoint)
    s.sendall(struct.pack("<IIQ", MAGIC, 4, 1))
    r = read_frame(s)
    assert r.id == 0 and r.error.code == pb.FRAME_TOO_LARGE
    assert at_eof(s)


def test_the_first_request_must_be_hello(daemon):
    s = raw(daemon.endpoint)
    send(s, 7, sync=pb.Sync())
    r = read_frame(s)
    assert r.id == 7 and r.error.code == pb.PROTOCOL_ERROR
    assert at_eof(s)


def test_a_payload_on_a_request_other_than_upload_closes(daemon):
    s = connect(daemon)
    send(s, 2, b"\0" * 8, sync=pb.Sync())
    r = read_frame(s)
    assert r.id == 2 and r.error.code == pb.PROTOCOL_ERROR
    assert at_eof(s)


def test_a_request_without_a_known_body_is_answered_and_the_session_goes_on(daemon):
    s = connect(daemon)
    send(s, 2)  # no body at all
    r = read_frame(s)
    assert r.id == 2 and r.error.code == pb.PROTOCOL_ERROR
    send(s, 3, sync=pb.Sync())
    r = read_frame(s)
    assert r.id == 3 and r.WhichOneof("body") == "ok"


def test_a_second_hello_is_a_protocol_error_and_closes(daemon):
    s = connect(daemon)
    s.sendall(hello(rid=2))
    r = read_frame(s)
    assert r.id == 2 and r.error.code == pb.PROTOCOL_ERROR
    assert at_eof(s)


def test_an_upload_of_the_wrong_size_is_read_and_dropped(daemon):
    s = connect(daemon)
    send(s, 2, b"\xff" * 12, upload=pb.Upload(handle=1, dtype=F32, shape=[2, 2]))  # 16 needed
    send(s, 3, sync=pb.Sync())  # the 12 bytes were not taken for this frame's header
    r = read_frame(s)
    assert r.id == 3 and r.error.code == pb.INVALID_ARGUMENT and r.error.request_id == 2
    assert r.error.invalid_argument.argument == "payload"
    send(s, 4, download=pb.Download(handle=1))  # bound to a poisoned placeholder
    r = read_frame(s)
    assert r.id == 4 and r.error.code == pb.POISONED
    assert r.error.poisoned.origin_code == pb.INVALID_ARGUMENT
    s.close()


# ---------------------------------------------------------------- sections 3-5


def test_first_error_rule_and_which_id_is_which(daemon):
    s = connect(daemon)
    upload(s, 2, 1, np.ones((2, 3), np.float32), F32)
    upload(s, 3, 2, np.ones((4, 5), np.float32), F32)
    send(s, 4, op=pb.Op(op="add", inputs=[1, 2], outputs=[3]))  # cannot broadcast
    send(s, 5, op=pb.Op(op="no_such_op", inputs=[1], outputs=[4]))  # a second error
    send(s, 6, download=pb.Download(handle=1))
    r = read_frame(s)
    # the synchronising request carries the first error, names the request that failed,
    # and does not run (no payload came with it)
    assert r.id == 6 and r.error.code == pb.SHAPE_MISMATCH and r.error.request_id == 4
    assert list(r.error.shape_mismatch.expected) and list(r.error.shape_mismatch.got)
    # the second error was not kept: the next synchronising request succeeds
    send(s, 7, sync=pb.Sync())
    r = read_frame(s)
    assert r.id == 7 and r.WhichOneof("body") == "ok"
    # the failed op's output is a poisoned placeholder naming its origin
    send(s, 8, download=pb.Download(handle=3))
    r = read_frame(s)
    assert r.id == 8 and r.error.code == pb.POISONED
    assert r.error.poisoned.origin_request == 4
    assert r.error.poisoned.origin_code == pb.SHAPE_MISMATCH
    # so is the output of the second failure, and a consumer of either keeps the origin
    send(s, 9, op=pb.Op(op="relu", inputs=[3], outputs=[5]))
    send(s, 10, download=pb.Download(handle=5))
    r = read_frame(s)
    assert r.id == 10 and r.error.code == pb.POISONED and r.error.request_id == 9
    send(s, 11, download=pb.Download(handle=5))
    r = read_frame(s)
    assert r.error.code == pb.POISONED and r.error.poisoned.origin_request == 4
    s.close()


def test_a_synchronising_request_with_a_pending_error_binds_its_new_ids(daemon):
    s = connect(daemon)
    send(s, 2, op=pb.Op(op="no_such_op", outputs=[1]))
    upload(s, 3, 2, np.ones(1, np.float32), F32, want_reply=False)
    send(s, 4, backward=pb.Backward(loss=2, grads=3))  # would be NOT_TRACKED; never runs
    r = read_frame(s)
    assert r.id == 4 and r.error.code == pb.UNSUPPORTED_OP and r.error.request_id == 2
    # grads=3 was bound to a poisoned placeholder: releasing it succeeds, a new id fails
    send(s, 5, want_reply=True, release=pb.Release(handles=[3]))
    r = read_frame(s)
    assert r.id == 5 and r.WhichOneof("body") == "ok", r
    send(s, 6, want_reply=True, release=pb.Release(handles=[99]))
    r = read_frame(s)
    assert r.id == 6 and r.error.code == pb.UNKNOWN_HANDLE
    # an id once bound is never bound again
    upload(s, 7, 3, np.ones(1, np.float32), F32, want_reply=True)
    r = read_frame(s)
    assert r.id == 7 and r.error.code == pb.HANDLE_IN_USE
    s.close()


def test_want_reply_answers_an_op_after_it_ran_and_describe_reports_no_pending_error(daemon):
    s = connect(daemon)
    upload(s, 2, 1, np.arange(6, dtype=np.float32).reshape(2, 3), F32)
    send(s, 3, op=pb.Op(op="no_such_op", inputs=[1], outputs=[2]))  # pending error
    send(s, 4, want_reply=True, op=pb.Op(op="relu", inputs=[1], outputs=[3]))
    r = read_frame(s)
    assert r.id == 4 and r.tensor.handle == 3 and list(r.tensor.shape) == [2, 3]
    send(s, 5, describe=pb.Describe(handle=3))
    r = read_frame(s)
    assert r.id == 5 and r.WhichOneof("body") == "tensor"  # not the pending error
    send(s, 6, sync=pb.Sync())
    r = read_frame(s)
    assert r.id == 6 and r.error.code == pb.UNSUPPORTED_OP and r.error.request_id == 3
    s.close()


# ---------------------------------------------------------------- section 6: payloads


def test_payloads_are_little_endian_c_order(daemon):
    s = connect(daemon)
    a = np.arange(12, dtype="<i8").reshape(3, 4)
    upload(s, 2, 1, a, pb.DTYPE_I64)
    send(s, 3, op=pb.Op(op="transpose", inputs=[1], outputs=[2],
                        attrs=[pb.Attr(name="dim0", i=0), pb.Attr(name="dim1", i=1)]))
    send(s, 4, download=pb.Download(handle=2))
    r, data = read_with_payload(s)
    assert list(r.tensor.shape) == [4, 3]
    assert data == np.ascontiguousarray(a.T).astype("<i8").tobytes()
    s.close()


def test_f16_and_bf16_layouts(daemon):
    s = connect(daemon)
    x = np.array([1.5, -2.25, 0.0, 3.140625, 1024.0, -0.0078125], np.float32)  # exact in both
    # f16: IEEE binary16, little-endian (numpy's float16 is the oracle)
    upload(s, 2, 1, x.astype("<f2"), F16)
    send(s, 3, op=pb.Op(op="cast", inputs=[1], outputs=[2], dtype=F32))
    send(s, 4, download=pb.Download(handle=2))
    _, data = read_with_payload(s)
    assert np.frombuffer(data, "<f4").tolist() == x.tolist()
    # bf16: the upper 16 bits of the f32 (the values are exact in bf16)
    upload(s, 5, 3, x.astype("<f4"), F32)
    send(s, 6, op=pb.Op(op="cast", inputs=[3], outputs=[4], dtype=BF16))
    send(s, 7, download=pb.Download(handle=4))
    r, data = read_with_payload(s)
    assert r.tensor.dtype == BF16 and len(data) == 2 * x.size
    assert data == (x.view("<u4") >> 16).astype("<u2").tobytes()
    s.close()


# ---------------------------------------------------------------- sections 7 and 9


def test_hello_without_a_common_version_is_refused_and_closed(daemon):
    s = raw(daemon.endpoint)
    send(s, 1, hello=pb.Hello(min_version=2, max_version=5))
    r = read_frame(s)
    assert r.id == 1 and r.error.code == pb.VERSION_MISMATCH
    assert (r.error.version_mismatch.server_min, r.error.version_mismatch.server_max) == (1, 1)
    assert at_eof(s)


def test_goodbye_is_answered_then_the_daemon_closes(daemon):
    s = connect(daemon)
    send(s, 2, goodbye=pb.Goodbye())
    r = read_frame(s)
    assert r.id == 2 and r.WhichOneof("body") == "ok"
    assert at_eof(s)


def test_a_daemon_that_shuts_down_says_goodbye_with_id_0(start_daemon):
    d = start_daemon()
    s = connect(d)
    upload(s, 2, 1, np.ones(4, np.float32), F32)
    send(s, 3, sync=pb.Sync())
    assert read_frame(s).id == 3
    d.proc.send_signal(15)
    r = read_frame(s)
    assert r.id == 0 and r.WhichOneof("body") == "ok"
    assert at_eof(s)
    assert d.proc.wait(30) == 0  # (a second SIGTERM now would kill it: not sent)
