"""The user API: ``tensor_update``, ``capture_module`` and the ``Example`` bundle examples return.

    doc = capture_module(model, objective, inputs, targets,
                         optimizer=tensor_update(update, init_state=init, forward_state=None),
                         state=None, hyper={"lr": 0.1}, microbatches=1, grads=False, routing=False)

Arguments (README.md has the long form):
- ``model``: an ``nn.Module``; its parameters are the ``params`` (on any device, including
  ``meta``: capture only reads shapes and dtypes). Its buffers become constants of the graph (their
  data is copied into the document), unless ``forward_state`` supplies them.
- ``inputs``: what the model is called with: a tensor (``model(x)``), a tuple/list
  (``model(*inputs)``) or a dict (``model(**inputs)``); ``targets``: passed unchanged to the
  objective (tensor, tuple, list or dict). Both give the shapes ONE microbatch is traced at.
- ``objective(outputs, targets)``: returns the scalar loss, or ``(loss, {name: tensor})`` to also
  output metrics.
- ``optimizer``: a :class:`TensorUpdate` from :func:`tensor_update`.
- ``state``: the optimizer state (a dict, possibly nested, of tensors); default
  ``optimizer.init_state(params)``.
- ``hyper``: ``{name: float}`` run-time hyper-parameters: each becomes a ``hyper`` input of shape
  ``()`` (f32), passed to the update as a 0-dim tensor, with the float as its recorded default.
  Constants written as Python numbers inside ``update`` are baked into the graph instead.
- ``microbatches``: K >= 1. K > 1 captures ``accumulate`` and ``accumulate_and_update``
  (CONTRACTS.md section 2): the step's gradient is the mean of the K microbatch gradients and its
  loss the mean of the K losses.
- ``grads``: also output the gradients the optimizer receives (group ``grads``), for checking.
- ``routing``: also output every routing decision (group ``routing``): the ``indices`` output of
  each ``latch::token_topk`` node, named ``routing.<node name>``, in every program. A checker
  needs them to tell a near-tie routing flip under a reduced-precision policy from a kernel error
  (``latch_check.gpu``); an update without a ``token_topk`` node is an error. ``routing="auto"``
  outputs them exactly when the update makes routing decisions.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Mapping

import attrs

from .errors import CaptureError


@attrs.frozen
class TensorUpdate:
    """An optimizer written as a pure tensor function (see :func:`tensor_update`)."""

    update: Callable
    init_state: Callable | None = None
    forward_state: Callable | None = None
    # What this update is in torch.optim terms, for benchmark controls (latch_check.controls): e.g.
    # {"optimizer": "adamw", "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.1, "max_norm": 1.0,
    # "lr": 3e-4 or None (then the example's hyper["lr"])}. Never read by capture.
    control: Mapping | None = None

    def initial_state(self, params: Mapping[str, Any]) -> dict:
        if self.init_state is None:
            return {}
        state = self.init_state(dict(params))
        if not isinstance(state, Mapping):
            raise CaptureError(
                f"init_state returned a {type(state).__name__}",
                hint="init_state(params) must return a dict (possibly nested) of tensors",
            )
        return dict(state)


def tensor_update(update: Callable, *, init_state: Callable | None = None,
                  forward_state: Callable | None = None, control: Mapping | None = None) -> TensorUpdate:
    """Wrap a pure optimizer step for :func:`capture_module`.

    - ``update(params, grads, state, hyper)`` -> ``(new_params, new_state)`` or
      ``(new_params, new_state, metrics)``. ``params`` and ``grads`` are dicts keyed by parameter
      name, ``state`` has the structure ``init_state`` returns, ``hyper`` maps hyper-parameter names
      to 0-dim tensors; ``metrics`` is a dict of extra tensors to output (e.g. the gradient norm).
      It must not modify its arguments in place. ``new_params``/``new_state`` must have the keys of
      ``params``/``state`` with unchanged shapes and dtypes: each new value overwrites its old one
      in place. An entry returned unchanged (the very input tensor) is not written at all.
    - ``init_state(params)`` -> the initial state dict (e.g. zero moments and a step counter);
      called with real tensors for checking and with meta/fake tensors for large models, so build it
      with ``torch.zeros_like``-style calls.
    - ``forward_state(params, state, hyper)`` -> ``{name: tensor}``: values the forward pass of
      this step reads from the optimizer state. A key naming a model parameter replaces that
      parameter's value IN THE FORWARD, and the gradient is taken at that value (evaluation points
      of schedule-free or lookahead optimizers); a key naming a model buffer supplies that buffer
      (e.g. a step counter or RNG offset the model reads). ``update`` still receives the stored
      params. Default: none, the forward uses the params and the module's own buffers.
    """
    if not callable(update):
        raise CaptureError(f"tensor_update got a {type(update).__name__} as update", hint="pass a function")
    for name, fn in (("init_state", init_state), ("forward_state", forward_state)):
        if fn is not None and not callable(fn):
            raise CaptureError(f"tensor_update got a {type(fn).__name__} as {name}", hint="pass a function or None")
    return TensorUpdate(update, init_state, forward_state, control)


@attrs.define
class Example:
    """Everything :func:`capture_module` needs, as an example's ``build(**overrides)`` returns it.

    ``batch(step)`` (optional) returns ``(inputs, targets)`` for the given microbatch index
    (0, 1, 2, ...; step ``s`` of a K-microbatch run uses indices ``s*K .. s*K+K-1``): checks over
    several steps use it; without it they reuse ``inputs``/``targets``.
    """

    model: Any
    objective: Callable
    inputs: Any
    targets: Any
    optimizer: TensorUpdate
    state: Any = None
    hyper: dict = attrs.field(factory=dict)
    microbatches: int = 1
    name: str = ""
    batch: Callable | None = None

    def params(self) -> dict:
        return dict(self.model.named_parameters())

    def initial_state(self) -> dict:
        if self.state is not None:
            return dict(self.state)
        return self.optimizer.initial_state(self.params())

    def microbatch(self, index: int) -> tuple[Any, Any]:
        if self.batch is None:
            return self.inputs, self.targets
        return self.batch(index)

    def capture(self, **kwargs) -> Any:
        opts = dict(state=self.state, hyper=self.hyper, microbatches=self.microbatches, example=self.name)
        opts.update(kwargs)
        return capture_module(self.model, self.objective, self.inputs, self.targets, optimizer=self.optimizer, **opts)


def capture_module(model, objective: Callable, inputs: Any, targets: Any, *, optimizer: TensorUpdate,
                   state: Any = None, hyper: Mapping[str, float] | None = None, microbatches: int = 1,
                   grads: bool = False, routing: bool | str = False, example: str = "",
                   progress: Callable[[str], None] | None = None, ops=None):
    """Capture one training update of ``model`` as a Latch document (graph section only).

    See the module docstring for the arguments. ``progress`` receives one-line messages during long
    captures; ``ops`` is the op registry to lower against (default: the installed plugins').
    """
    from latch_core.document import Document, Provenance

    from . import programs, trace

    import torch

    if not isinstance(model, torch.nn.Module):
        raise CaptureError(f"model is a {type(model).__name__}", hint="pass an nn.Module")
    if not isinstance(optimizer, TensorUpdate):
        raise CaptureError(f"optimizer is a {type(optimizer).__name__}",
                           hint="wrap the update function with latch_capture.tensor_update(update, init_state=...)")
    if not isinstance(microbatches, int) or isinstance(microbatches, bool) or microbatches < 1:
        raise CaptureError(f"microbatches={microbatches!r}", hint="give a positive integer number of microbatches")
    if ops is None:
        from latch_core.plugins import registries

        ops = registries().ops
    say = progress or (lambda msg: None)
    started = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime())
    t0 = time.perf_counter()
    if state is None:
        state = optimizer.initial_state(dict(model.named_parameters()))
    spec = trace.CaptureInputs.make(model, inputs, targets, state, dict(hyper or {}))
    _refuse_empty(spec)
    say(f"capture: {len(spec.params)} parameters ({spec.param_count():,} elements), "
        f"{len(spec.state)} state tensors, microbatches {microbatches}")
    fb = trace.trace_forward_backward(spec, model, objective, optimizer.forward_state, ops, say)
    opt = trace.trace_update(spec, optimizer.update, ops, say)
    section = programs.assemble(spec, fb, opt, microbatches=microbatches, grads=grads, routing=routing,
                                example=example, ops=ops)
    from latch_core.lint import lint_section

    from .lower import LoweringBug

    problems = lint_section(section, ops, require_known_ops=True)
    if problems:  # every node was checked while lowering; a problem here is a bug in assembly
        raise LoweringBug("latch-capture assembled an ill-formed graph (please report):\n  " + "\n  ".join(problems[:10]))
    seconds = time.perf_counter() - t0
    sizes = ", ".join(f"{p.name}: {len(p.nodes)} nodes" for p in section.programs)
    say(f"capture: done in {seconds:.1f} s ({sizes})")
    return Document(graph=section, provenance=(Provenance("capture", started, round(seconds, 6), sizes),))


EMPTY_HINT = ("Latch schedules tensors with at least one element in every dimension (a zero-size dimension "
              "has no tiles to run); give every dimension a size of at least 1 (check --set values such as batch=0)")


def _refuse_empty(spec) -> None:
    """Zero-size dimensions of the update's tensors (parameters, state, inputs, targets) are refused
    before tracing, naming the tensor: they used to surface as an unrelated KeyError deep in
    lowering. (An empty intermediate, e.g. the pass-through half of a partial rotary embedding that
    rotates every dimension, is legal and stays.)"""
    for kind, items in (("parameter", spec.params), ("buffer", spec.buffers), ("state entry", spec.state),
                        ("input", spec.batch_in), ("target", spec.batch_tg)):
        for name, t in items:
            shape = tuple(getattr(t, "shape", ()))
            if any(int(d) == 0 for d in shape):
                raise CaptureError(f"{kind} {name!r} has shape {list(shape)}, with a zero-size dimension",
                                   hint=EMPTY_HINT)
