"""PyTorch's argument forms the op table used to refuse, against torch.

Each case is one form PyTorch accepts: masked_fill with a 0-d tensor value and with a mask
that broadcasts the input larger, conv2d with padding="same"/"valid", gather on a 0-d
input, clamp with tensor bounds, pad's reflect/replicate/circular modes, cross_entropy's
other forms. Forward values and the gradients of sum(out * w) (w random) are compared with
torch autograd's, on cpu:0 and ref:0, or on cuda:0 when TDD_GPU_ARGS is set (the GPU
suites: make test-emu, tests/gpu/run.sh).
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest

import tensordd
from gpusuite import GPU_ARGS, gpu_daemon_fixture

torch = pytest.importorskip("torch")
F = torch.nn.functional

# cpu:0 and ref:0 in the main suite; cuda:0 in the GPU suites (TDD_GPU_ARGS set)
DEVICES = ["cuda:0"] if GPU_ARGS is not None else ["cpu:0", "ref:0"]


fd = gpu_daemon_fixture(cpu_devices=1)


@pytest.fixture
def s(fd):
    sess = tensordd.connect(fd.endpoint, timeout=120)
    yield sess
    sess.close(raise_errors=False)


def f32(*shape, lo=-2.0, hi=2.0):
    return lambda rng: rng.uniform(lo, hi, shape).astype(np.float32)


def const(a):
    return lambda rng: np.asarray(a)


def mask(*shape):
    return lambda rng: rng.random(shape) < 0.5


def idx(*shape, hi):
    return lambda rng: rng.integers(0, hi, shape).astype(np.int64)


def probs(*shape, axis=1):
    def make(rng):
        p = rng.uniform(0.1, 1.0, shape).astype(np.float32)
        return p / p.sum(axis=axis, keepdims=True)
    return make


class Case:
    def __init__(self, name, inputs, fn, tfn, grads=None, atol=1e-5):
        self.name, self.inputs, self.fn, self.tfn = name, inputs, fn, tfn
        self.grads = grads or []  # indices of the inputs that require grad
        self.atol = atol


CASES = [
    # masked_fill: the value as a 0-d tensor (torch.masked_fill's Tensor overload)
    Case("masked_fill_value_tensor", [f32(3, 4), mask(3, 4), const(np.float32(2.5))],
         lambda s, x, m, v: s.op("masked_fill", x, m, v),
         lambda x, m, v: torch.masked_fill(x, m, v), grads=[0, 2]),
    Case("masked_fill_value_tensor_f64_into_f32", [f32(5), mask(5), const(np.float64(-1.25))],
         lambda s, x, m, v: s.op("masked_fill", x, m, v),
         lambda x, m, v: torch.masked_fill(x, m, v), grads=[0]),
    Case("masked_fill_value_tensor_into_int", [idx(6, hi=9), mask(6), const(np.float32(1.7))],
         lambda s, x, m, v: s.op("masked_fill", x, m, v),
         lambda x, m, v: torch.masked_fill(x, m, v)),
    # a mask that broadcasts the input to a larger shape
    Case("masked_fill_mask_broadcasts_input", [f32(4), mask(3, 4)],
         lambda s, x, m: s.op("masked_fill", x, m, value=-3.0),
         lambda x, m: torch.masked_fill(x, m, -3.0), grads=[0]),
    Case("masked_fill_both_broadcast_value_tensor",
         [f32(3, 1), mask(1, 4), const(np.float32(0.5))],
         lambda s, x, m, v: s.op("masked_fill", x, m, v),
         lambda x, m, v: torch.masked_fill(x, m, v), grads=[0, 2]),
    # gather on a 0-d input
    Case("gather_0d_input_1elem", [const(np.float32(5.5)), const(np.array([0]))],
         lambda s, x, i: s.op("gather", x, i, dim=0),
         lambda x, i: torch.gather(x, 0, i), grads=[0]),
    Case("gather_0d_input_0d_index", [const(np.float32(-1.5)), const(np.array(0))],
         lambda s, x, i: s.op("gather", x, i, dim=-1),
         lambda x, i: torch.gather(x, -1, i), grads=[0]),
    Case("gather_0d_input_repeated", [const(np.float32(3.0)), const(np.array([0, 0, 0]))],
         lambda s, x, i: s.op("gather", x, i, dim=0),
         lambda x, i: torch.gather(x, 0, i), grads=[0]),
    # clamp with tensor bounds (broadcast, promoted; min > max gives max, as torch)
    Case("clamp_tensor_min_max", [f32(3, 4), f32(4, lo=-1.5, hi=0.0), f32(3, 1, lo=0.0, hi=1.5)],
         lambda s, x, lo, hi: s.op("clamp", x, lo, hi),
         lambda x, lo, hi: torch.clamp(x, lo, hi), grads=[0, 1, 2]),
    Case("clamp_tensor_min_only", [f32(2, 5), f32(5)],
         lambda s, x, lo: s.op("clamp", x, lo),
         lambda x, lo: torch.clamp(x, min=lo), grads=[0, 1]),
    Case("clamp_tensor_min_above_max", [f32(6), f32(6, lo=0.5, hi=1.0), f32(6, lo=-1.0, hi=0.0)],
         lambda s, x, lo, hi: s.op("clamp", x, lo, hi),
         lambda x, lo, hi: torch.clamp(x, lo, hi), grads=[0, 1, 2]),
    Case("clamp_int_tensor_float_bounds", [idx(2, 3, hi=9), f32(3, lo=1, hi=3), f32(1, lo=5, hi=7)],
         lambda s, x, lo, hi: s.op("clamp", x, lo, hi),
         lambda x, lo, hi: torch.clamp(x, lo, hi)),
    Case("clamp_int_tensors", [idx(2, 3, hi=9), const(np.array([2, 3, 4])), const(np.array(6))],
         lambda s, x, lo, hi: s.op("clamp", x, lo, hi),
         lambda x, lo, hi: torch.clamp(x, lo, hi)),
    # pad modes that read the input (PyTorch's input ranks; negative pads crop)
    *[Case(f"pad_{mode}_{tag}", [f32(*shape)],
           (lambda mode, pad: lambda s, x: s.op("pad", x, pad=list(pad), mode=mode))(mode, pad),
           (lambda mode, pad: lambda x: F.pad(x, pad, mode=mode))(mode, pad), grads=[0])
      for mode in ("reflect", "replicate", "circular")
      for tag, shape, pad in (("1d", (2, 3, 5), (2, 3)), ("2d", (1, 2, 4, 5), (1, 2, 3, 0)),
                              ("3d", (1, 1, 3, 4, 3), (1, 1, 2, 0, 0, 2)),
                              ("crop", (2, 2, 6), (-1, 2)))],
    Case("pad_reflect_unbatched_2d", [f32(3, 4, 5)],
         lambda s, x: s.op("pad", x, pad=[2, 1, 1, 3], mode="reflect"),
         lambda x: F.pad(x, (2, 1, 1, 3), mode="reflect"), grads=[0]),
    Case("pad_circular_crop_both", [f32(1, 2, 5, 6)],
         lambda s, x: s.op("pad", x, pad=[-2, 3, 1, -1], mode="circular"),
         lambda x: F.pad(x, (-2, 3, 1, -1), mode="circular"), grads=[0]),
    # cross_entropy / nll_loss: [N, C, d...], class weights, soft targets, with ignore_index
    # and label_smoothing, each reduction
    *[Case(f"cross_entropy_{tag}_{red}", ins,
           (lambda kw, red: lambda s, *t: s.op("cross_entropy", *t, reduction=red, **kw))(kw, red),
           (lambda kw, red: lambda x, y, *w: F.cross_entropy(
               x, y, *([w[0]] if w else []), reduction=red, **kw))(kw, red),
           grads=gr, atol=1e-5)
      for red in ("mean", "sum", "none")
      for tag, ins, kw, gr in (
          ("nc_d1_d2", [f32(2, 4, 3, 2), idx(2, 3, 2, hi=4)], {}, [0]),
          ("nc_d_ignore_smooth", [f32(3, 5, 4), const(np.array([[0, 1, 2, 3], [4, -100, 1, 0],
                                                                [2, 2, -100, 4]]))],
           {"ignore_index": -100, "label_smoothing": 0.2}, [0]),
          ("weight", [f32(6, 4), idx(6, hi=4), f32(4, lo=0.2, hi=2.0)], {}, [0]),
          ("weight_nc_d_ignore_smooth", [f32(2, 3, 5), const(np.array([[0, 2, 1, 1, 0],
                                                                       [2, 1, 0, 1, 2]])),
                                         f32(3, lo=0.2, hi=2.0)],
           {"ignore_index": 1, "label_smoothing": 0.1}, [0]),
          ("probs", [f32(4, 5), probs(4, 5)], {}, [0, 1]),
          ("probs_nc_d_weight_smooth", [f32(2, 3, 4), probs(2, 3, 4), f32(3, lo=0.2, hi=2.0)],
           {"label_smoothing": 0.3}, [0, 1]),
          ("probs_unbatched", [f32(5), probs(5, axis=0)], {}, [0, 1]),
      )],
    *[Case(f"nll_loss_{tag}", ins,
           (lambda kw: lambda s, *t: s.op("nll_loss", *t, **kw))(kw),
           (lambda kw: lambda x, y, *w: F.nll_loss(x, y, *([w[0]] if w else []), **kw))(kw),
           grads=[0])
      for tag, ins, kw in (
          ("nc_d", [f32(2, 4, 3), idx(2, 3, hi=4)], {}),
          ("weight_ignore", [f32(5, 3), const(np.array([0, 2, 1, 2, 0])), f32(3, lo=0.2, hi=2.0)],
           {"ignore_index": 0}),
          ("weight_nc_d_none", [f32(2, 3, 2, 2), idx(2, 2, 2, hi=3), f32(3, lo=0.2, hi=2.0)],
           {"reduction": "none"}),
      )],
    # sort, argsort, topk (values with their gradient; indices as int64), distinct values
    Case("sort_values", [f32(3, 5)], lambda s, x: s.op("sort", x, num_outputs=2, dim=1)[0],
         lambda x: torch.sort(x, dim=1)[0], grads=[0]),
    Case("sort_indices_desc_dim0", [f32(4, 3)],
         lambda s, x: s.op("sort", x, num_outputs=2, dim=0, descending=True)[1],
         lambda x: torch.sort(x, dim=0, descending=True)[1]),
    Case("sort_desc_values_3d", [f32(2, 4, 3)],
         lambda s, x: s.op("sort", x, num_outputs=2, dim=1, descending=True)[0],
         lambda x: torch.sort(x, dim=1, descending=True)[0], grads=[0]),
    Case("sort_int", [idx(3, 6, hi=1000)],
         lambda s, x: s.op("sort", x, num_outputs=2)[0], lambda x: torch.sort(x)[0]),
    Case("sort_nan_last", [const(np.array([1.0, np.nan, -2.0, 0.5], np.float32))],
         lambda s, x: s.op("argsort", x), lambda x: torch.argsort(x)),
    Case("argsort_desc", [f32(3, 7)], lambda s, x: s.op("argsort", x, dim=-1, descending=True),
         lambda x: torch.argsort(x, dim=-1, descending=True)),
    Case("topk_values", [f32(4, 6)], lambda s, x: s.op("topk", x, num_outputs=2, k=3)[0],
         lambda x: torch.topk(x, 3)[0], grads=[0]),
    Case("topk_smallest_dim0_indices", [f32(5, 3)],
         lambda s, x: s.op("topk", x, num_outputs=2, k=2, dim=0, largest=False)[1],
         lambda x: torch.topk(x, 2, dim=0, largest=False)[1]),
    Case("topk_smallest_values_3d", [f32(2, 5, 2)],
         lambda s, x: s.op("topk", x, num_outputs=2, k=4, dim=1, largest=False)[0],
         lambda x: torch.topk(x, 4, dim=1, largest=False)[0], grads=[0]),
    # max/min with a dim: values (gradient to the picked index) and indices
    Case("max_dim_values", [f32(3, 5)], lambda s, x: s.op("max", x, num_outputs=2, dim=1)[0],
         lambda x: torch.max(x, dim=1)[0], grads=[0]),
    Case("max_dim_indices_keepdim", [f32(4, 3)],
         lambda s, x: s.op("max", x, num_outputs=2, dim=0, keepdim=True)[1],
         lambda x: torch.max(x, dim=0, keepdim=True)[1]),
    Case("min_dim_values_keepdim", [f32(2, 3, 4)],
         lambda s, x: s.op("min", x, num_outputs=2, dim=-1, keepdim=True)[0],
         lambda x: torch.min(x, dim=-1, keepdim=True)[0], grads=[0]),
    Case("min_dim_int_indices", [idx(3, 6, hi=1000)],
         lambda s, x: s.op("min", x, num_outputs=2, dim=1)[1], lambda x: torch.min(x, dim=1)[1]),
    # addmm, baddbmm (beta 0 leaves the input unread, as torch)
    Case("addmm", [f32(3), f32(2, 4), f32(4, 3)],
         lambda s, x, a, b: s.op("addmm", x, a, b), torch.addmm, grads=[0, 1, 2]),
    Case("addmm_beta_alpha", [f32(2, 3), f32(2, 4), f32(4, 3)],
         lambda s, x, a, b: s.op("addmm", x, a, b, beta=0.5, alpha=-2.0),
         lambda x, a, b: torch.addmm(x, a, b, beta=0.5, alpha=-2.0), grads=[0, 1, 2]),
    Case("addmm_beta0_nan", [const(np.full((2, 3), np.nan, np.float32)), f32(2, 4), f32(4, 3)],
         lambda s, x, a, b: s.op("addmm", x, a, b, beta=0),
         lambda x, a, b: torch.addmm(x, a, b, beta=0), grads=[1, 2]),
    Case("addmm_int", [idx(3, hi=5), idx(2, 4, hi=5), idx(4, 3, hi=5)],
         lambda s, x, a, b: s.op("addmm", x, a, b, beta=2, alpha=3),
         lambda x, a, b: torch.addmm(x, a, b, beta=2, alpha=3)),
    Case("baddbmm", [f32(1, 3), f32(2, 3, 4), f32(2, 4, 3)],
         lambda s, x, a, b: s.op("baddbmm", x, a, b, beta=1.5, alpha=0.5),
         lambda x, a, b: torch.baddbmm(x, a, b, beta=1.5, alpha=0.5), grads=[0, 1, 2]),
    # adaptive_avg_pool2d (windows of uneven sizes, overlapping)
    *[Case(f"adaptive_avg_pool2d_{tag}", [f32(*shape)],
           (lambda os: lambda s, x: s.op("adaptive_avg_pool2d", x, output_size=list(os)))(os),
           (lambda os: lambda x: F.adaptive_avg_pool2d(x, os))(os), grads=[0])
      for tag, shape, os in (("global", (2, 3, 5, 4), (1, 1)), ("uneven", (1, 2, 7, 5), (3, 2)),
                             ("upsample", (2, 3, 3), (5, 4)), ("same", (1, 1, 4, 4), (4, 4)))],
    # group_norm
    Case("group_norm_affine", [f32(2, 6, 3, 2), f32(6), f32(6)],
         lambda s, x, w, b: s.op("group_norm", x, w, b, num_groups=3),
         lambda x, w, b: F.group_norm(x, 3, w, b), grads=[0, 1, 2], atol=1e-4),
    Case("group_norm_plain_1d", [f32(3, 4, 5)],
         lambda s, x: s.op("group_norm", x, num_groups=2, eps=1e-3),
         lambda x: F.group_norm(x, 2, eps=1e-3), grads=[0], atol=1e-4),
    Case("group_norm_weight_only_2d", [f32(4, 6), f32(6)],
         lambda s, x, w: s.op("group_norm", x, w, num_groups=6),
         lambda x, w: F.group_norm(x, 6, w), grads=[0, 1], atol=1e-4),
    # conv2d padding="same" (odd and even kernels, dilation) and "valid"
    Case("conv2d_same_3x3", [f32(2, 3, 5, 6), f32(4, 3, 3, 3), f32(4)],
         lambda s, x, w, b: s.op("conv2d", x, w, b, padding="same"),
         lambda x, w, b: F.conv2d(x, w, b, padding="same"), grads=[0, 1, 2], atol=1e-4),
    Case("conv2d_same_even_kernel", [f32(1, 2, 5, 4), f32(3, 2, 2, 4)],
         lambda s, x, w: s.op("conv2d", x, w, padding="same"),
         lambda x, w: F.conv2d(x, w, padding="same"), grads=[0, 1], atol=1e-4),
    Case("conv2d_same_dilated_groups", [f32(2, 4, 6, 5), f32(4, 2, 2, 3)],
         lambda s, x, w: s.op("conv2d", x, w, padding="same", dilation=[2, 1], groups=2),
         lambda x, w: F.conv2d(x, w, padding="same", dilation=(2, 1), groups=2),
         grads=[0, 1], atol=1e-4),
    Case("conv2d_same_unbatched", [f32(2, 4, 4), f32(3, 2, 3, 2)],
         lambda s, x, w: s.op("conv2d", x, w, padding="same"),
         lambda x, w: F.conv2d(x, w, padding="same"), grads=[0, 1], atol=1e-4),
    Case("conv2d_valid", [f32(2, 3, 5, 6), f32(4, 3, 3, 2)],
         lambda s, x, w: s.op("conv2d", x, w, padding="valid", stride=2),
         lambda x, w: F.conv2d(x, w, padding="valid", stride=2), grads=[0, 1], atol=1e-4),
]


def _params():
    return [pytest.param(c, d, id=f"{c.name}-{d}") for c in CASES for d in DEVICES]


@pytest.mark.filterwarnings("ignore:Using padding='same'")  # torch's note on even kernels
@pytest.mark.parametrize("c,dev", _params())
def test_form_matches_torch(s, c, dev):
    check_case_matches_torch(s, c, dev)


def check_case_matches_torch(s, c, dev):
    """Case c on dev against torch: the forward (dtype, shape, values at rtol 1e-5 and the
    case's atol) and, for its grads inputs, the gradient of a weighted sum of the output."""
    rng = np.random.default_rng(zlib.crc32(c.name.encode()))
    arrays = [np.asarray(make(rng)) for make in c.inputs]
    tts = [torch.tensor(a, requires_grad=(k in c.grads)) for k, a in enumerate(arrays)]
    tout = c.tfn(*tts)
    ts = [s.tensor(a, device=dev, requires_grad=(k in c.grads)) for k, a in enumerate(arrays)]
    out = c.fn(s, *ts)
    got = out.numpy()
    want = tout.detach().numpy()
    assert got.dtype == want.dtype, f"{c.name}: dtype {got.dtype}, torch {want.dtype}"
    assert got.shape == want.shape, f"{c.name}: shape {got.shape}, torch {want.shape}"
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=c.atol, err_msg=f"{c.name}: forward")
    if not c.grads:
        return
    w = rng.uniform(0.5, 1.5, want.shape).astype(want.dtype)
    (tout * torch.from_numpy(w)).sum().backward()
    grads = (out * s.tensor(w, device=dev)).sum().backward()
    for k in c.grads:
        np.testing.assert_allclose(grads.get(ts[k]).numpy(), tts[k].grad.numpy(), rtol=1e-5,
                                   atol=c.atol, err_msg=f"{c.name}: gradient of input {k}")
