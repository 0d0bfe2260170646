"""tensordd.nn -- a small torch.nn: Module, Parameter and the common layers.

A model written against ``torch.nn`` ports by changing its imports::

    import tensordd as torch            # or: from tensordd import nn, optim
    from tensordd import nn

    model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 3))

Parameters are created on the default session (the one :func:`tensordd.connect`
opened last) on ``cpu:0``; ``model.to(device)`` moves them. Initialisation
follows torch's distributions (kaiming-uniform weights, uniform biases) drawn
with numpy, so it is not bit-identical to torch's: load torch's weights with
``load_state_dict`` (torch tensors and numpy arrays are accepted) to compare.

The classes live in modules named as torch's: module (Module, Parameter, the
containers), linear, sparse, conv, activation, normalization, pooling, loss,
dropout, flatten, upsampling; import them from ``tensordd.nn``.
"""

from __future__ import annotations

from . import functional  # noqa: F401
from .activation import GELU, LeakyReLU, LogSoftmax, ReLU, Sigmoid, SiLU, Softmax, Tanh
from .conv import Conv1d, Conv2d, ConvTranspose2d
from .dropout import Dropout
from .flatten import Flatten
from .linear import Identity, Linear
from .loss import BCEWithLogitsLoss, CrossEntropyLoss, MSELoss
from .module import Module, ModuleList, Parameter, Sequential, init_seed
from .normalization import BatchNorm1d, BatchNorm2d, LayerNorm
from .pooling import AdaptiveAvgPool2d, AvgPool1d, AvgPool2d, MaxPool1d, MaxPool2d
from .sparse import Embedding, EmbeddingBag
from .upsampling import Upsample

__all__ = ["Module", "Parameter", "Sequential", "ModuleList", "Linear", "Embedding",
           "LayerNorm", "Conv2d", "ReLU", "GELU", "SiLU", "Tanh", "Sigmoid", "LeakyReLU",
           "Identity", "Flatten", "Dropout", "Softmax", "LogSoftmax", "MaxPool2d", "AvgPool2d",
           "MSELoss", "CrossEntropyLoss", "BCEWithLogitsLoss", "functional", "init_seed",
           "BatchNorm1d", "BatchNorm2d", "AdaptiveAvgPool2d", "Conv1d", "ConvTranspose2d",
           "EmbeddingBag", "Upsample", "MaxPool1d", "AvgPool1d"]
