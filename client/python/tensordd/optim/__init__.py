"""optim -- optimizers that run in the daemon (SGD, Adam, AdamW, RMSprop, Adagrad).

An optimizer is created once with its parameters (OptimizerCreate, a round
trip, so a bad hyperparameter or a full quota raises in the constructor as in
PyTorch; the C client's td_optimizer_create is asynchronous and reports it at
the next synchronising call); its state (momentum buffers,
Adam moments, amsgrad's maxima, RMSprop's averages, Adagrad's sums) lives in
the daemon, keyed by parameter, and
``state_dict()``/``load_state_dict()`` download and upload it in torch's layout
(OptimizerState, OptimizerLoadState). ``step(grads)`` reads a Gradients handle
and updates the parameters in place in one synchronising request.

The classes live in modules named as torch's: optimizer (the Optimizer base class),
sgd, adam (Adam, AdamW), rmsprop, adagrad; import them from ``tensordd.optim``.
"""

from __future__ import annotations

from .adagrad import Adagrad
from .adam import Adam, AdamW
from .optimizer import Optimizer
from .rmsprop import RMSprop
from .sgd import SGD

__all__ = ["Optimizer", "SGD", "Adam", "AdamW", "RMSprop", "Adagrad"]


from . import lr_scheduler  # noqa: E402,F401 (tensordd.optim.lr_scheduler, as in torch)
