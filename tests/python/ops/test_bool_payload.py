"""A bool tensor holds 0 or 1: an Upload whose bool payload has another byte is refused
(INVALID_ARGUMENT 'payload', the tensor poisoned), on host memory (cpu:0) and on a
device with staging (sim:0), and the session goes on. Before, byte 2 was stored as is:
downloads gave it back, and kernels read it as true or as 2 depending on the path."""
import numpy as np
import pytest

from helpers import frame, hello, raw, read_frame
from tensordd import tensordd_pb2 as pb


def upload(rid, handle, device, payload, want_reply):
    dev = pb.Device(backend=device.split(":")[0], ordinal=int(device.split(":")[1]))
    return frame(pb.Request(id=rid, want_reply=want_reply,
                            upload=pb.Upload(handle=handle, dtype=pb.DTYPE_BOOL,
                                             shape=[len(payload)], device=dev)), payload)


@pytest.mark.parametrize("device", ["cpu:0", "sim:0"])
def test_bool_payload_other_than_0_or_1_is_refused(sim_daemon, device):
    with raw(sim_daemon.endpoint) as so:
        so.sendall(hello())
        assert read_frame(so).WhichOneof("body") == "hello"
        so.sendall(upload(2, 1, device, bytes([0, 1, 2, 1]), want_reply=True))
        r = read_frame(so)
        assert r.id == 2 and r.error.code == pb.INVALID_ARGUMENT, r
        assert "payload" in r.error.message
        # fire-and-forget: the next synchronising request reports it
        so.sendall(upload(3, 2, device, bytes([1, 255]), want_reply=False))
        so.sendall(frame(pb.Request(id=4, sync=pb.Sync())))
        r = read_frame(so)
        assert r.id == 4 and r.error.code == pb.INVALID_ARGUMENT and r.error.request_id == 3
        # the refused tensors are poisoned; a good bool upload round-trips
        so.sendall(frame(pb.Request(id=5, download=pb.Download(handle=1))))
        assert read_frame(so).error.code == pb.POISONED
        so.sendall(upload(6, 3, device, bytes([1, 0, 1]), want_reply=True))
        assert read_frame(so).WhichOneof("body") == "ok"
        so.sendall(frame(pb.Request(id=7, download=pb.Download(handle=3))))
        r = read_frame(so)
        assert r.WhichOneof("body") == "tensor", r


def test_client_bool_arrays_still_upload(session):
    t = session.tensor(np.array([True, False, True]))
    np.testing.assert_array_equal(t.numpy(), [True, False, True])
    assert int(t.sum().item()) == 2
