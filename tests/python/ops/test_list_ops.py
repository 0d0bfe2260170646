"""ListOps: the daemon describes its op table (name, kind, inputs, attributes with type,
default and bounds) so clients need not hard-code it; it agrees with docs/ops.md (made
from the same table) and with what Op accepts."""

import os
import re

import numpy as np
import pytest

import tensordd
import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def test_every_op_of_ops_md_is_listed_with_its_kind(session):
    ops = session.list_ops()
    text = open(os.path.join(ROOT, "docs", "ops.md")).read()
    table = text.split("| op | kind |", 1)[1].split("\n\n", 1)[0]
    kinds = dict(re.findall(r"^\| (\w+) \| (\w+) \|", table, flags=re.M))
    assert kinds and set(kinds) == set(ops), set(kinds) ^ set(ops)
    for name, kind in kinds.items():
        assert ops[name]["kind"] == kind, (name, ops[name]["kind"], kind)


def test_attributes_types_and_defaults(session):
    ops = session.list_ops()
    topk = ops["topk"]["attrs"]
    assert topk["k"]["required"] and topk["k"]["type"] == "an int"
    assert not topk["dim"]["required"] and topk["dim"]["default"] == "-1"
    assert ops["add"]["attrs"]["alpha"]["default"] == "1"
    assert ops["mse_loss"]["attrs"]["reduction"]["type"] == "a string"
    assert "mean" in ops["mse_loss"]["attrs"]["reduction"]["bounds"]
    assert ops["relu"]["min_inputs"] == ops["relu"]["max_inputs"] == 1
    assert ops["zeros"]["inputs"] == "" and ops["zeros"]["min_inputs"] == 0


def test_what_is_listed_is_what_op_accepts(session):
    """An attribute the table lists is taken; one it does not list is refused naming it."""
    ops = session.list_ops()
    x = session.tensor(np.array([3.0, 1.0, 2.0], np.float32))
    assert set(ops["topk"]["attrs"]) >= {"k", "dim", "largest"}
    v, i = session.op("topk", x, num_outputs=2, k=2, dim=0, largest=True)
    np.testing.assert_array_equal(v.numpy(), [3.0, 2.0])
    assert "bogus" not in ops["topk"]["attrs"]
    with pytest.raises(tensordd.InvalidArgumentError, match="bogus"):
        session.op("topk", x, num_outputs=2, k=2, bogus=1)[0].numpy()


def test_output_counts_come_from_the_table(session):
    """session.op learns how many outputs an op makes from ListOps: topk, sort and max with
    dim answer (values, indices) as torch does; max_pool2d one more with return_indices;
    split and chunk, whose count only their inputs tell, ask for num_outputs."""
    ops = session.list_ops()
    assert ops["topk"]["num_outputs"] == ops["sort"]["num_outputs"] == 2
    assert ops["relu"]["num_outputs"] == 1
    assert ops["max_pool2d"]["outputs_with"] == "return_indices"
    assert ops["split"]["num_outputs"] == ops["chunk"]["num_outputs"] == 0
    a = np.array([[3.0, 1.0, 2.0], [0.5, 4.0, -1.0]], np.float32)
    t = torch.from_numpy(a)
    x = session.tensor(a)
    v, i = session.op("topk", x, k=2)
    tv, ti = torch.topk(t, 2)
    np.testing.assert_array_equal(v.numpy(), tv.numpy())
    np.testing.assert_array_equal(i.numpy(), ti.numpy())
    v, i = session.op("max", x, dim=1)
    tv, ti = torch.max(t, dim=1)
    np.testing.assert_array_equal(v.numpy(), tv.numpy())
    np.testing.assert_array_equal(i.numpy(), ti.numpy())
    v, i = session.op("sort", x, dim=0)
    np.testing.assert_array_equal(i.numpy(), torch.sort(t, dim=0).indices.numpy())
    img = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
    y = session.op("max_pool2d", session.tensor(img), kernel_size=2)
    ty, tix = F.max_pool2d(torch.from_numpy(img), 2, return_indices=True)
    np.testing.assert_array_equal(y.numpy(), ty.numpy())
    y, ix = session.op("max_pool2d", session.tensor(img), kernel_size=2, return_indices=True)
    np.testing.assert_array_equal(ix.numpy(), tix.numpy())
    assert session.op("relu", x).numpy().shape == (2, 3)
    with pytest.raises(ValueError, match="num_outputs"):
        session.op("split", x, split_size=1, dim=0)
    p, q = session.op("split", x, num_outputs=2, split_size=1, dim=0)
    np.testing.assert_array_equal(q.numpy(), a[1:])
