"""tensordd.nn.sparse -- Embedding and EmbeddingBag."""

from __future__ import annotations

from . import functional as F
from .module import Module, Parameter, _normal


class Embedding(Module):
    """A lookup table (num_embeddings, embedding_dim) drawn from N(0, 1); ``padding_idx``'s
    row starts at zero and gets no gradient; ``max_norm`` as :func:`F.embedding`."""

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx=None,
                 max_norm=None, norm_type=2.0, scale_grad_by_freq=False, sparse=False,
                 device=None):
        super().__init__()
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        if padding_idx is not None and padding_idx < 0:
            padding_idx += num_embeddings
        if padding_idx is not None and not 0 <= padding_idx < num_embeddings:
            raise ValueError(f"Embedding: padding_idx {padding_idx} is not a row")
        if scale_grad_by_freq or sparse:
            raise NotImplementedError("Embedding: scale_grad_by_freq and sparse are not "
                                      "supported")
        self.padding_idx, self.max_norm, self.norm_type = padding_idx, max_norm, norm_type
        w = _normal((num_embeddings, embedding_dim))
        if padding_idx is not None:
            w[padding_idx] = 0
        self.weight = Parameter(w, device=device)

    def forward(self, idx):
        """The layer applied to its input (what calling the module does)."""
        return F.embedding(idx, self.weight, padding_idx=self.padding_idx,
                           max_norm=self.max_norm, norm_type=self.norm_type)

    def extra_repr(self):
        """The layer's settings as repr shows them (torch's hook)."""
        return f"{self.num_embeddings}, {self.embedding_dim}"


class EmbeddingBag(Module):
    """Bags of embedding rows reduced by sum, mean or max (``torch.nn.EmbeddingBag``);
    the table drawn from N(0, 1), ``padding_idx``'s row zero."""

    def __init__(self, num_embeddings: int, embedding_dim: int, mode: str = "mean",
                 include_last_offset: bool = False, padding_idx=None, device=None):
        super().__init__()
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.mode, self.include_last_offset = mode, include_last_offset
        if padding_idx is not None and padding_idx < 0:
            padding_idx += num_embeddings
        self.padding_idx = padding_idx
        w = _normal((num_embeddings, embedding_dim))
        if padding_idx is not None:
            w[padding_idx] = 0
        self.weight = Parameter(w, device=device)

    def forward(self, input, offsets=None, per_sample_weights=None):  # noqa: A002
        """The layer applied to its input (what calling the module does)."""
        return F.embedding_bag(input, self.weight, offsets, mode=self.mode,
                               per_sample_weights=per_sample_weights,
                               include_last_offset=self.include_last_offset,
                               padding_idx=self.padding_idx)

    def extra_repr(self):
        """The layer's settings as repr shows them (torch's hook)."""
        return f"{self.num_embeddings}, {self.embedding_dim}, mode={self.mode!r}"
