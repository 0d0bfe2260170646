"""tensordd.nn.functional -- torch.nn.functional's names over the daemon's ops."""

from __future__ import annotations

import numpy as np

from ..tensor import Tensor

__all__ = ["linear", "relu", "gelu", "silu", "sigmoid", "tanh", "leaky_relu", "softmax",
           "log_softmax", "cross_entropy", "nll_loss", "mse_loss",
           "binary_cross_entropy_with_logits", "layer_norm", "embedding", "dropout", "conv2d",
           "max_pool2d", "avg_pool2d", "one_hot", "batch_norm", "adaptive_avg_pool2d", "conv1d",
           "conv_transpose2d", "max_pool1d", "avg_pool1d"]


def _op(name, *inputs, **attrs):
    return inputs[0].session._op(name, *[t for t in inputs if t is not None], **attrs)


def linear(input: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:  # noqa: A002
    """x @ weight.T + bias (``torch.nn.functional.linear``)."""
    # every layer of every step: straight to the session's hand-encoded op when the three
    # are tensors of one session (what Session.op would find); anything else through op
    try:
        s = input._session
        if bias is None:
            if weight._session is s:
                return s._op_fast("linear", [input._handle, weight._handle])
        elif weight._session is s and bias._session is s:
            return s._op_fast("linear", [input._handle, weight._handle, bias._handle])
    except AttributeError:
        pass
    return _op("linear", input, weight, bias)


def relu(input, inplace=False):  # noqa: A002
    """ReLU activation (``torch.nn.functional.relu``)."""
    """The activation applied to a tensor."""
    return input.relu()


def gelu(input):  # noqa: A002
    """GELU activation (``torch.nn.functional.gelu``)."""
    """The activation applied to a tensor."""
    return input.gelu()


def silu(input, inplace=False):  # noqa: A002
    """SiLU activation (``torch.nn.functional.silu``)."""
    """The activation applied to a tensor."""
    return input.silu()


def sigmoid(input):  # noqa: A002
    """Sigmoid activation (``torch.nn.functional.sigmoid``)."""
    """The activation applied to a tensor."""
    return input.sigmoid()


def tanh(input):  # noqa: A002
    """Tanh activation (``torch.nn.functional.tanh``)."""
    """The activation applied to a tensor."""
    return input.tanh()


def leaky_relu(input, negative_slope=0.01, inplace=False):  # noqa: A002
    """Leaky ReLU (``torch.nn.functional.leaky_relu``)."""
    return input.leaky_relu(negative_slope)


def softmax(input, dim):  # noqa: A002
    """Softmax along dim (``torch.nn.functional.softmax``)."""
    return input.softmax(dim)


def log_softmax(input, dim):  # noqa: A002
    """Log-softmax along dim (``torch.nn.functional.log_softmax``)."""
    return input.log_softmax(dim)


def cross_entropy(input, target, reduction="mean", ignore_index=-100,  # noqa: A002
                  label_smoothing=0.0):
    """Cross entropy of logits and class indices (``torch.nn.functional.cross_entropy``)."""
    return _reduced(_op("cross_entropy", input, target, reduction=reduction,
                        ignore_index=int(ignore_index), label_smoothing=float(label_smoothing)),
                    reduction)


def nll_loss(input, target, reduction="mean", ignore_index=-100):  # noqa: A002
    """Negative log likelihood of log-probabilities and class indices
    (``torch.nn.functional.nll_loss``)."""
    return _reduced(_op("nll_loss", input, target, reduction=reduction,
                        ignore_index=int(ignore_index)), reduction)


def mse_loss(input, target, reduction="mean"):  # noqa: A002
    """Mean squared error (``torch.nn.functional.mse_loss``)."""
    return _reduced(_op("mse_loss", input, target, reduction=reduction), reduction)


def binary_cross_entropy_with_logits(input, target, reduction="mean"):  # noqa: A002
    """Binary cross entropy of logits (mean by default)
    (``torch.nn.functional.binary_cross_entropy_with_logits``)."""
    return _reduced(_op("binary_cross_entropy_with_logits", input, target, reduction=reduction),
                    reduction)


def _reduced(loss, reduction):
    """A loss reduced to one value is 0-d: said to the client (backward() checks it
    without a round trip)."""
    if reduction != "none":
        loss._shape = ()
    return loss


def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):  # noqa: A002
    """Layer normalisation over normalized_shape (``torch.nn.functional.layer_norm``)."""
    shape = [normalized_shape] if isinstance(normalized_shape, int) else list(normalized_shape)
    if weight is None and bias is not None:
        raise ValueError("layer_norm: a bias without a weight is not supported")
    return _op("layer_norm", input, weight, bias, normalized_shape=shape, eps=float(eps))


def batch_norm(input, running_mean, running_var, weight=None, bias=None,  # noqa: A002
               training=False, momentum=0.1, eps=1e-5):
    """Batch normalisation over every dim but dim 1 (``torch.nn.functional.batch_norm``):
    training uses the batch's statistics and, when given, updates running_mean and
    running_var in place in the daemon (momentum; the running variance unbiased, as torch's);
    eval mode uses the running ones."""
    if (running_mean is None) != (running_var is None):
        raise ValueError("batch_norm: running_mean and running_var are given together")
    if not training and running_mean is None:
        raise ValueError("batch_norm: running_mean and running_var are required in eval mode")
    attrs = dict(training=bool(training), momentum=float(0.0 if momentum is None else momentum),
                 eps=float(eps))
    if running_mean is not None and (weight is not None or bias is None):
        return _op("batch_norm", input, running_mean, running_var, weight, bias, **attrs)
    # The op's optional inputs come in order; other forms apply the affine map outside.
    stats = () if running_mean is None else (running_mean, running_var)
    y = _op("batch_norm", input, *stats, **attrs)
    shape = [1, -1] + [1] * (len(input.shape) - 2)
    if weight is not None:
        y = y * weight.reshape(*shape)
    if bias is not None:
        y = y + bias.reshape(*shape)
    return y


def adaptive_avg_pool2d(input, output_size):  # noqa: A002
    """Adaptive 2-D average pooling (``torch.nn.functional.adaptive_avg_pool2d``)."""
    return _op("adaptive_avg_pool2d", input, output_size=_pair(output_size))


def pixel_shuffle(input, upscale_factor):  # noqa: A002
    """[*, C r^2, H, W] -> [*, C, H r, W r] (``torch.nn.functional.pixel_shuffle``)."""
    return _op("pixel_shuffle", input, upscale_factor=int(upscale_factor))


def pixel_unshuffle(input, downscale_factor):  # noqa: A002
    """[*, C, H r, W r] -> [*, C r^2, H, W] (``torch.nn.functional.pixel_unshuffle``)."""
    return _op("pixel_unshuffle", input, downscale_factor=int(downscale_factor))


__all__ += ["pixel_shuffle", "pixel_unshuffle"]


def embedding(input, weight, padding_idx=None, max_norm=None, norm_type=2.0,  # noqa: A002
              scale_grad_by_freq=False, sparse=False):
    """Rows of weight at the integer indices (``torch.nn.functional.embedding``; any
    integer index dtype). ``padding_idx``: its positions give their row as is and send it
    no gradient. ``max_norm``: rows whose ``norm_type``-norm exceeds it come out scaled to
    it, the gradient reaching weight as torch's does; unlike torch the table itself is not
    renormalized in place (this client's tensors are immutable handles), so a row keeps
    being scaled at each lookup instead of once. The torch device (``tensordd.torch``)
    renormalizes the table in place, as torch does."""
    if scale_grad_by_freq or sparse:
        raise NotImplementedError("embedding: scale_grad_by_freq and sparse are not supported")
    out = _op("embedding", _as_index(input), weight)
    if max_norm is not None:
        p = float(norm_type)
        norms = out.abs().pow(p).sum(-1, keepdim=True).pow(1.0 / p)
        scale = (float(max_norm) / (norms + 1e-7)).clamp(max=1.0)
        out = out + (out * scale - out).detach()  # the scaled rows, the identity's gradient
    if padding_idx is not None:
        if padding_idx < 0:
            padding_idx += weight.shape[0]
        if not 0 <= padding_idx < weight.shape[0]:
            raise ValueError(f"embedding: padding_idx {padding_idx} is not a row of weight")
        keep = (_as_index(input) != padding_idx).unsqueeze(-1)
        out = out.where(keep, out.detach())  # same values; no gradient at padding positions
    return out


_NARROW_INTS = ("uint8", "int8", "int16", "int32")


def _as_index(t):
    """An integer index tensor as int64, the daemon's index dtype (torch takes narrower
    integers in places; a cast costs one small op)."""
    return t.to(dtype="int64") if isinstance(t, Tensor) and t.dtype in _NARROW_INTS else t


def dropout(input, p=0.5, training=True, inplace=False):  # noqa: A002
    """Zeroes elements with probability p and scales the rest by 1 / (1 - p) when training
    (``torch.nn.functional.dropout``)."""
    if not training or p == 0:
        return input
    return _op("dropout", input, p=float(p), train=bool(training))


def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):  # noqa: A002
    """2-D convolution (``torch.nn.functional.conv2d``)."""
    pad = padding if isinstance(padding, str) else _pair(padding)  # "same", "valid" or ints
    return _op("conv2d", input, weight, bias, stride=_pair(stride), padding=pad,
               dilation=_pair(dilation), groups=int(groups))


def embedding_bag(input, weight, offsets=None, max_norm=None, norm_type=2.0,  # noqa: A002
                  scale_grad_by_freq=False, mode="mean", sparse=False, per_sample_weights=None,
                  include_last_offset=False, padding_idx=None):
    """Sums, means or maxima of bags of embedding rows (``torch.nn.functional.embedding_bag``):
    input 2-D (each row a bag) or 1-D with ``offsets`` (each bag's start; with
    ``include_last_offset`` one more, the end). ``per_sample_weights`` (mode "sum") scale
    the rows; ``padding_idx``'s entries are left out (of the mean's count too); an empty
    bag is zeros. Differentiable in ``weight`` and ``per_sample_weights``."""
    if max_norm is not None or scale_grad_by_freq or sparse:
        raise NotImplementedError("embedding_bag: max_norm, scale_grad_by_freq and sparse "
                                  "are not supported")
    if input.ndim == 2:
        if offsets is not None:
            raise ValueError("if input is 2D, then offsets has to be None, as input is treated "
                             "is a mini-batch of fixed length sequences")
        bags, per = input.shape
        offsets = input.session.arange(0, bags * per, per, device=input.device) if per else \
            input.session.tensor(np.zeros(bags, np.int64), device=input.device)
        input = input.reshape(-1)
        if per_sample_weights is not None:
            per_sample_weights = per_sample_weights.reshape(-1)
        include_last_offset = False
    elif input.ndim != 1:
        raise ValueError(f"input has to be 1D or 2D Tensor, but got Tensor of dimension "
                         f"{input.ndim}")
    elif offsets is None:
        raise ValueError("offsets has to be a 1D Tensor but got None")
    attrs = {"mode": str(mode), "include_last_offset": bool(include_last_offset)}
    if padding_idx is not None:
        attrs["padding_idx"] = int(padding_idx)
    return _op("embedding_bag", input, weight, offsets, per_sample_weights, **attrs)


__all__ += ["embedding_bag"]


def conv1d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):  # noqa: A002
    """1-D convolution (``torch.nn.functional.conv1d``); padding may be "same" or "valid"."""
    pad = padding if isinstance(padding, str) else _single(padding)
    return _op("conv1d", input, weight, bias, stride=_single(stride), padding=pad,
               dilation=_single(dilation), groups=int(groups))


def conv_transpose2d(input, weight, bias=None, stride=1, padding=0,  # noqa: A002
                     output_padding=0, groups=1, dilation=1):
    """2-D transposed convolution (``torch.nn.functional.conv_transpose2d``)."""
    return _op("conv_transpose2d", input, weight, bias, stride=_pair(stride),
               padding=_pair(padding), output_padding=_pair(output_padding),
               groups=int(groups), dilation=_pair(dilation))


def max_pool2d(input, kernel_size, stride=None, padding=0, dilation=1,  # noqa: A002
               ceil_mode=False):
    """2-D max pooling (``torch.nn.functional.max_pool2d``)."""
    return _op("max_pool2d", input, kernel_size=_pair(kernel_size),
               stride=None if stride is None else _pair(stride), padding=_pair(padding),
               dilation=_pair(dilation), ceil_mode=bool(ceil_mode))


def avg_pool2d(input, kernel_size, stride=None, padding=0):  # noqa: A002
    """2-D average pooling (``torch.nn.functional.avg_pool2d``)."""
    return _op("avg_pool2d", input, kernel_size=_pair(kernel_size),
               stride=None if stride is None else _pair(stride), padding=_pair(padding))


def max_pool1d(input, kernel_size, stride=None, padding=0, dilation=1,  # noqa: A002
               ceil_mode=False, return_indices=False):
    """1-D max pooling (``torch.nn.functional.max_pool1d``); with return_indices, the values
    and the int64 positions in L of the maxima."""
    return _op("max_pool1d", input, kernel_size=_single(kernel_size),
               stride=None if stride is None else _single(stride), padding=_single(padding),
               dilation=_single(dilation), ceil_mode=bool(ceil_mode),
               return_indices=bool(return_indices), num_outputs=2 if return_indices else 1)


def avg_pool1d(input, kernel_size, stride=None, padding=0, ceil_mode=False,  # noqa: A002
               count_include_pad=True):
    """1-D average pooling (``torch.nn.functional.avg_pool1d``)."""
    return _op("avg_pool1d", input, kernel_size=_single(kernel_size),
               stride=None if stride is None else _single(stride), padding=_single(padding),
               ceil_mode=bool(ceil_mode), count_include_pad=bool(count_include_pad))


def one_hot(tensor, num_classes=-1):
    """One-hot int64 encoding of class indices (``torch.nn.functional.one_hot``)."""
    return _op("one_hot", tensor, num_classes=int(num_classes))


def _pair(v):
    return [int(v), int(v)] if isinstance(v, int) else [int(x) for x in v]


def _single(v):
    return int(v) if isinstance(v, int) else int(tuple(v)[0])


__all__ += ["scaled_dot_product_attention"]


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                 is_causal=False, scale=None):
    """softmax(query @ key^T * scale + mask) @ value, with dropout on the weights
    (``torch.nn.functional.scaled_dot_product_attention``, torch 2.x): a bool attn_mask
    marks the positions that take part, a float one is added; is_causal masks the positions
    after each query's. Fused into one op in the daemon; its dropout draws from the
    session's random stream."""
    attrs = {"dropout_p": float(dropout_p), "is_causal": bool(is_causal)}
    if scale is not None:
        attrs["scale"] = float(scale)
    return _op("scaled_dot_product_attention", query, key, value, attn_mask, **attrs)


__all__ += ["interpolate"]


def interpolate(input, size=None, scale_factor=None, mode="nearest",  # noqa: A002
                align_corners=None):
    """Resizes [N, C, W] or [N, C, H, W] by size or scale_factor, mode "nearest", "linear"
    (3-D) or "bilinear" (4-D) (``torch.nn.functional.interpolate``; the scale factor sets the
    sampling as torch's does when recompute_scale_factor is not given)."""
    attrs = {"mode": mode}
    if size is not None:
        attrs["size"] = [int(size)] if isinstance(size, int) else [int(v) for v in size]
    if scale_factor is not None:
        attrs["scale_factor"] = [float(scale_factor)] if isinstance(scale_factor, (int, float)) \
            else [float(v) for v in scale_factor]
    if align_corners is not None:
        attrs["align_corners"] = bool(align_corners)
    return _op("interpolate", input, **attrs)
