"""autograd -- backward() and Gradients: autodiff that runs in the daemon.

``loss.backward()`` sends one Backward request; the daemon runs the whole
backward pass next to the data and keeps the result as a Gradients handle.
Gradients are read (``get``), taken out (``remove``) or replaced
(``replace``) by handle, and optimizers consume the handle directly: no
gradient has to cross the wire to train.
"""

from __future__ import annotations

from ._codec import frame_backward
from .errors import local_error
from .session import _Call
from .tensor import Tensor

__all__ = ["Gradients", "backward", "grad"]


def _check_tensor(session, t, what: str) -> None:
    if not isinstance(t, Tensor):
        raise TypeError(f"{what}: expected a Tensor, got {type(t).__name__}")
    if t._session is not session:
        raise ValueError(f"{what}: tensor #{t._handle} belongs to another session")


def backward(loss: Tensor, grad: Tensor | None = None, retain_graph: bool | None = None,
             create_graph: bool = False, inputs=None, _register: bool = True) -> "Gradients":
    """Runs the backward pass of loss in the daemon and returns its Gradients.

    grad: the gradient of loss (None: loss must have one element; its
    gradient is 1). retain_graph: keep the graph for another backward
    (default: create_graph, as torch). create_graph: record the backward pass
    itself, so the gradients can be differentiated again (gradient penalties,
    Hessian-vector products). inputs: only these tensors' gradients (leaves
    or not), through the part of the graph that leads to them.
    Pipelined without inputs (``session.pipeline_steps``, the default): sent
    without waiting; its errors, and earlier ones, surface at the next
    synchronising call. Otherwise synchronising: errors of earlier asynchronous
    requests surface here.
    """
    session = loss._session
    _check_tensor(session, loss, "backward")
    _check_loss(session, loss, grad)
    if (grad is None and not retain_graph and not create_graph and inputs is None
            and _register and session.pipeline_steps and not session._capturing):
        # the training step's form, encoded by hand (test_step_fast_paths.py holds it to protobuf's)
        rid, gh = next(session._ids), session._new_handle()
        grads = Gradients(session, gh)
        session._send_frame(rid, frame_backward(rid, loss._handle, gh),
                            _Call("backward", (loss._handle,), f"-> grads #{gh}"))
        if session.retain_grads:
            session._grad_sets.append(grads)
            session._grad_epoch += 1
        else:
            session._unkept_backward = True
        _graph_freed(session, loss)
        return grads
    req = session._new_request()
    b = req.backward
    b.loss = loss._handle
    if grad is not None:
        _check_tensor(session, grad, "backward grad")
        b.grad_output = grad._handle
    b.retain_graph = bool(create_graph if retain_graph is None else retain_graph)
    b.create_graph = bool(create_graph)
    if inputs is not None:
        for i, t in enumerate(inputs):
            _check_tensor(session, t, f"backward inputs[{i}]")
            b.inputs.append(t._handle)
    b.grads = session._new_handle()
    # The Gradients object exists before the round trip so that its handle
    # is released even if the daemon answers with an error.
    grads = Gradients(session, b.grads)
    call = _Call("backward", (loss._handle,), f"-> grads #{b.grads}")
    # The training step's form is pipelined; a grad-of (inputs: autograd.grad reads the
    # gradients at once) and a recording wait for their answer.
    if session.pipeline_steps and not session._capturing and inputs is None and _register:
        b.pipelined = True  # not answered: a failure is reported at the next sync
        session._send(req, call)
    else:
        session._roundtrip(req, call)
    # The torch idiom: param.grad reads these (summed with earlier ones until
    # zero_grad), opt.step() without an argument steps with them.
    if _register and session.retain_grads:
        session._grad_sets.append(grads)
        session._grad_epoch += 1
    elif _register:
        session._unkept_backward = True
    if not b.retain_graph:
        _graph_freed(session, loss)
    return grads


# How many freed losses a session remembers (a second backward of one raises at the call).
_FREED_MEMORY = 4096


def _graph_freed(session, loss: Tensor) -> None:
    freed = session.__dict__.setdefault("_freed_graphs", {})
    if len(freed) >= _FREED_MEMORY:
        freed.clear()
    freed[loss._handle] = True


def _check_loss(session, loss: Tensor, grad) -> None:
    """What the client can know before sending a Backward, raised at the call (as torch
    does; typed as the daemon would: InvalidArgumentError, NotTrackedError): a second backward of a loss whose graph the first one freed; without grad, a
    loss of more than one element, or one that does not require grad. A loss whose
    shape the client does not know (an op's output other than a full reduction or a
    reduced loss) is described first: one round trip. (A full reduction or a reduced
    loss stays pipelined: whether it requires grad is known only when described, so an
    untracked one still fails at the next synchronising call.)"""
    if loss._handle in session.__dict__.get("_freed_graphs", ()):
        raise local_error(
            "INVALID_ARGUMENT",
            f"backward: trying to backward through the graph of #{loss._handle} a second "
            f"time: its first backward() freed it. Pass retain_graph=True to the first "
            f"backward() to backward through it again", f"backward(#{loss._handle})")
    if grad is not None:
        return
    if loss._shape is None:
        session._describe_tensor(loss)
    shape = loss._shape
    n = 1
    for d in shape or ():
        n *= d
    if shape is not None and n != 1:
        raise local_error("INVALID_ARGUMENT",
                          f"backward: grad can be implicitly created only for scalar outputs; "
                          f"#{loss._handle} has shape {tuple(shape)} (pass grad=, the "
                          f"Backward's grad_output, or reduce it first: .sum(), .mean())",
                          f"backward(#{loss._handle})")
    if loss._requires_grad is False:
        raise local_error("NOT_TRACKED",
                          f"backward: #{loss._handle} does not require grad and has no grad_fn "
                          f"(no input of its ops requires grad, or it was computed under "
                          f"no_grad)", f"backward(#{loss._handle})")


def _as_tuple(x, what: str) -> tuple:
    if isinstance(x, Tensor):
        return (x,)
    if isinstance(x, (list, tuple)):
        return tuple(x)
    raise TypeError(f"grad: {what} must be a Tensor or a sequence of Tensors, "
                    f"got {type(x).__name__}")


def grad(outputs, inputs, grad_outputs=None, retain_graph: bool | None = None,
         create_graph: bool = False, allow_unused: bool = False) -> tuple:
    """The gradients of outputs with respect to inputs, as a tuple of Tensors
    (torch.autograd.grad): nothing is accumulated into ``.grad``.

    grad_outputs: the gradient of each output (None, or a None entry: the
    output must have one element; its gradient is 1). retain_graph defaults
    to create_graph. create_graph: the result is differentiable again.
    allow_unused: an input the outputs do not depend on gets None instead of
    raising. Several outputs are one pass over the sum of their products with
    their grad_outputs. One round trip for the pass, one per input.
    """
    outs = _as_tuple(outputs, "outputs")
    ins = _as_tuple(inputs, "inputs")
    if not outs or not ins:
        raise ValueError("grad: outputs and inputs must not be empty")
    gos = (None,) * len(outs) if grad_outputs is None else _as_tuple(grad_outputs,
                                                                      "grad_outputs")
    if len(gos) != len(outs):
        raise ValueError(f"grad: {len(gos)} grad_outputs for {len(outs)} outputs")
    session = outs[0]._session
    for i, t in enumerate(ins):
        _check_tensor(session, t, f"grad inputs[{i}]")
        if not t.requires_grad:
            raise RuntimeError(f"grad: inputs[{i}] does not require grad")
    for i, o in enumerate(outs):
        _check_tensor(session, o, f"grad outputs[{i}]")
        if not o.requires_grad:
            raise RuntimeError(f"grad: outputs[{i}] does not require grad and has no grad_fn")
    if len(outs) == 1:
        loss, go = outs[0], gos[0]
    else:
        # d/dx sum_i <o_i, g_i> is sum_i J_i^T g_i: one pass instead of one per output
        loss, go = None, None
        for o, g in zip(outs, gos):
            term = (o * g).sum() if g is not None else o.sum()
            loss = term if loss is None else loss + term
    grads = backward(loss, grad=go, retain_graph=retain_graph, create_graph=create_graph,
                     inputs=ins, _register=False)
    try:
        result = []
        for i, t in enumerate(ins):
            g = grads._get_or_none(t)
            if g is None and not allow_unused:
                raise RuntimeError(f"grad: inputs[{i}] (#{t._handle}) was not used in the "
                                   f"graph of the outputs (allow_unused=True gives None)")
            result.append(g)
        return tuple(result)
    finally:
        grads.release()


class Gradients:
    """The gradients of one backward pass: a map from tracked tensor to gradient.

    Lives in the daemon; released when this object dies (or by
    :meth:`release`).
    """

    __slots__ = ("_session", "_handle", "_released", "__weakref__")

    def __init__(self, session, handle: int):
        self._session = session
        self._handle = handle
        self._released = False

    def __del__(self):
        session = getattr(self, "_session", None)
        if session is not None and not self._released:
            session._release_later(self._handle)

    @property
    def handle(self) -> int:
        """The daemon handle of this Gradients (as named in error messages)."""
        return self._handle

    def __repr__(self) -> str:
        return f"tensordd.Gradients(#{self._handle}{', released' if self._released else ''})"

    def release(self) -> None:
        """Frees the gradients in the daemon now (batched with the next request).

        The handle id is never reused: later calls on this object name a
        released handle and raise UnknownHandleError.
        """
        if not self._released:
            self._released = True
            self._session._release_later(self._handle)
            sets = self._session._grad_sets
            if self in sets:
                sets.remove(self)
                self._session._grad_epoch += 1

    def _grad_call(self, field: str, t: Tensor) -> Tensor:
        session = self._session
        _check_tensor(session, t, field)
        req = session._new_request()
        g = getattr(req, field)
        g.grads = self._handle
        g.tensor = t._handle
        g.output = session._new_handle()
        out = Tensor(session, g.output)
        resp, _ = session._roundtrip(req, _Call(field, (self._handle, t._handle),
                                                f"-> #{g.output}"))
        if resp.WhichOneof("body") == "tensor":
            out._set_info(resp.tensor)
        return out

    def _get_or_none(self, t: Tensor):
        """t's gradient, or None if this backward pass gave it none (or released)."""
        from .errors import Error

        if self._released:
            return None
        try:
            return self._grad_call("grad", t)
        except Error as e:
            if e.code in ("INVALID_ARGUMENT", "NOT_TRACKED", "UNKNOWN_HANDLE"):
                return None
            raise

    def get(self, t: Tensor) -> Tensor:
        """t's gradient, as a new Tensor (NotTrackedError if t is not tracked)."""
        return self._grad_call("grad", t)

    def remove(self, t: Tensor) -> Tensor:
        """Takes t's gradient out of the map and returns it."""
        return self._grad_call("grad_remove", t)

    def replace(self, t: Tensor, g: Tensor) -> None:
        """Installs g as t's gradient.

        The daemon checks, in this order, that this is a live Gradients handle
        (UnknownHandleError, WrongHandleKindError), that t is tracked
        (NotTrackedError), then backend, device, dtype and shape against t
        (BackendMismatchError, DeviceMismatchError, DTypeMismatchError,
        ShapeMismatchError, each naming both sides), then that g was not made
        by a failed request (PoisonedError). A failed check installs nothing.
        """
        session = self._session
        _check_tensor(session, t, "replace")
        _check_tensor(session, g, "replace grad")
        req = session._new_request()
        r = req.grad_replace
        r.grads = self._handle
        r.tensor = t._handle
        r.grad = g._handle
        session._roundtrip(req, _Call("grad_replace", (self._handle, t._handle, g._handle)))
