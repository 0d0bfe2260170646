"""The Python client encodes the common op request (tensor inputs, one output, no
attributes) by hand for speed; the bytes must be those protobuf itself gives."""
import random

import tensordd
from tensordd import tensordd_pb2 as pb
from tensordd.session import _encode_op


def reference(rid, name, inputs, out):
    req = pb.Request()
    req.id = rid
    req.op.op = name
    req.op.inputs.extend(inputs)
    req.op.outputs.append(out)
    return req.SerializeToString()


def test_hand_encoded_op_is_protobufs_encoding():
    r = random.Random(1)
    names = ["relu", "add", "matmul", "cross_entropy", "x" * 200, "é"]
    edges = [1, 127, 128, 16383, 16384, 2**21, 2**35, 2**63 - 1]
    for _ in range(2000):
        rid = r.choice(edges + [r.randrange(1, 2**40)])
        inputs = [r.choice(edges + [r.randrange(1, 2**20)]) for _ in range(r.randrange(1, 4))]
        out = r.choice(edges + [r.randrange(1, 2**30)])
        name = r.choice(names)
        assert _encode_op(rid, name, inputs, out) == reference(rid, name, inputs, out)


def test_fast_path_ops_run_like_the_slow_ones(session):
    import numpy as np

    a = session.tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    b = session.tensor(np.full((2, 3), 2.0, np.float32))
    an, bn = a.numpy(), b.numpy()
    fast = (a * b).relu() - a  # tensor inputs: the hand-encoded path
    np.testing.assert_array_equal(fast.numpy(), np.maximum(an * bn, 0) - an)
    # an attribute (None: left out) takes the protobuf path: the same request
    slow = session.op("sub", session.op("relu", session.op("mul", a, b, x=None)), a, x=None)
    np.testing.assert_array_equal(fast.numpy(), slow.numpy())
    with __import__("pytest").raises(tensordd.Error) as e:
        session.op("add", a, session.tensor(np.ones(4, np.float32))).numpy()
    assert e.value.code == "SHAPE_MISMATCH"
    assert "op add" in str(e.value)  # the error still names the call
