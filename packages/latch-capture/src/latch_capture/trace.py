"""Tracing: the user's update as two pure, flat functions run under make_fx in fake mode.

1. forward+backward: ``(params, buffers, state, batch, hyper) -> (loss, metrics..., grads...)``;
   the backward is ``torch.autograd.grad`` called INSIDE the traced function on re-leafed params
   (``p.detach().requires_grad_()`` under ``enable_grad``), so torch's own derivative formulas
   (and custom ops' registered autograd) produce the backward nodes.
2. optimizer: ``(params, grads, state, hyper) -> (new params..., new state..., metrics...)``.

Traced separately, they are composed in the Latch IR (``programs.py``): the microbatch programs
reuse one forward+backward trace instead of tracing it per program.

Every input is a fresh fake tensor made from its shape and dtype (``make_fx`` would merge inputs
that are the same tensor object, and fake tensors never allocate: a 200M-parameter model on the
meta device traces in a few hundred MB). Functionalization removes in-place ops; an in-place
change of an INPUT (``state["m"].mul_(b)``) would be silently dropped, so it is an error.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, Callable, Mapping

import attrs
import torch
import torch.fx.traceback as fx_traceback
import torch.utils._pytree as pytree
from torch._subclasses.fake_tensor import (
    DataDependentOutputException, DynamicOutputShapeException, FakeTensorMode, UnsupportedOperatorException,
)
from torch._subclasses.functional_tensor import FunctionalTensor, FunctionalTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

from latch_core.ir import TensorType
from latch_ops.common import from_torch_dtype

from . import lower, tree
from .errors import CaptureError
from .source import SourceTracker, clear_stack_trace, install_backward_sources

HYPER_DTYPE = torch.float32


def _ttype(t: torch.Tensor, what: str) -> TensorType:
    try:
        return TensorType(tuple(int(d) for d in t.shape), from_torch_dtype(t.dtype))
    except ValueError as e:
        raise CaptureError(f"{what} has an unsupported dtype", hint=str(e)) from None


@attrs.frozen
class CaptureInputs:
    """The flat, named inputs of a capture and how to rebuild the user's structures from them."""

    params: tuple[tuple[str, Any], ...]
    buffers: tuple[tuple[str, Any], ...]
    state: tuple[tuple[str, Any], ...]
    rebuild_state: Callable
    batch_in: tuple[tuple[str, Any], ...]
    rebuild_in: Callable
    call_style: str  # "tensor" | "args" | "kwargs"
    batch_tg: tuple[tuple[str, Any], ...]
    rebuild_tg: Callable
    hyper: tuple[tuple[str, float], ...]
    types: Mapping[str, TensorType]

    @staticmethod
    def make(model, inputs, targets, state, hyper: dict) -> "CaptureInputs":
        params = list(model.named_parameters())
        buffers = list(model.named_buffers())
        if not isinstance(state, Mapping):
            raise CaptureError(f"state is a {type(state).__name__}", hint="the optimizer state must be a dict of tensors")
        st, rb_state = tree.flatten(dict(state), "", "state")
        if isinstance(inputs, torch.Tensor):
            style = "tensor"
        elif isinstance(inputs, Mapping):
            style = "kwargs"
        elif isinstance(inputs, (tuple, list)):
            style = "args"
        else:
            raise CaptureError(f"inputs is a {type(inputs).__name__}", hint="pass a tensor, a tuple/list or a dict of tensors")
        bi, rb_in = tree.flatten(inputs, "input", "inputs")
        bt, rb_tg = tree.flatten(targets, "target", "targets")
        for k, v in hyper.items():
            if not isinstance(k, str) or isinstance(v, bool) or not isinstance(v, (int, float)):
                raise CaptureError(f"hyper-parameter {k!r} = {v!r}", hint="hyper maps names to numbers (their defaults)")
        tree.check_unique({
            "a parameter": [n for n, _ in params], "a buffer": [n for n, _ in buffers], "the state": [n for n, _ in st],
            "the inputs": [n for n, _ in bi], "the targets": [n for n, _ in bt], "a hyper-parameter": list(hyper),
        })
        types = {}
        for group, items in (("parameter", params), ("buffer", buffers), ("state entry", st),
                             ("input", bi), ("target", bt)):
            for n, t in items:
                types[n] = _ttype(t, f"{group} {n!r}")
        for n in hyper:
            types[n] = TensorType((), from_torch_dtype(HYPER_DTYPE))
        return CaptureInputs(tuple(params), tuple(buffers), tuple(st), rb_state, tuple(bi), rb_in, style,
                             tuple(bt), rb_tg, tuple((k, float(v)) for k, v in hyper.items()), types)

    def param_count(self) -> int:
        return sum(self.types[n].numel for n, _ in self.params)

    def names(self, group: str) -> list[str]:
        return [n for n, _ in getattr(self, group)]


# ------------------------------------------------------------------------------------------

@attrs.frozen
class Traced:
    """A lowered trace: the fragment plus the meaning of its flat outputs."""

    fragment: "lower.Fragment"
    output_keys: tuple[str, ...]  # e.g. ("loss", "metric.acc", "grad.l1.weight") / ("new.w", ...)
    seconds: float


def _fakes(mode: FakeTensorMode, names: list[str], types: Mapping[str, TensorType]) -> list[torch.Tensor]:
    from latch_ops.common import torch_dtype

    with mode:
        return [torch.empty(types[n].shape, dtype=torch_dtype(types[n].dtype)) for n in names]


def _functionalized(fn: Callable, input_names: list[str], what: str) -> Callable:
    """Run ``fn`` on functional wrappers of its inputs; fail if it mutated an input in place."""

    def inner(*args):
        guard = torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(torch._C.DispatchKey.Functionalize))
        with guard, FunctionalTensorMode():
            fargs = [FunctionalTensor.to_functional(a) for a in args]
            out = fn(*fargs)
            for name, a in zip(input_names, fargs):
                torch._sync(a)
                if torch._functionalize_has_data_mutation(a.elem) or torch._functionalize_has_metadata_mutation(a.elem):
                    raise CaptureError(
                        f"{what} modifies its input {name!r} in place",
                        hint="Latch captures a pure update: return new tensors (x = x * b) instead of in-place "
                             "ops (x.mul_(b), x += ..., x.copy_(...)) on parameters, state, inputs or hyper-parameters",
                    )

            def unwrap(t):
                torch._sync(t)
                return torch._from_functional_tensor(t.elem)

            return pytree.tree_map_only(FunctionalTensor, unwrap, out)

    return inner


_HINT_DATA = ("Latch captures static graphs: .item(), .tolist(), Python if/while on tensor values and shapes "
              "computed from tensor data cannot be captured; keep shapes static (fixed capacities, masks with "
              "torch.where) or use a Latch op with static shapes (e.g. latch_ops.moe's route_order for per-expert counts)")
_HINT_SHAPE = ("its output shape depends on tensor values (nonzero, boolean-mask indexing, masked_select, unique); "
               "Latch needs static shapes: use torch.where with a mask, or a fixed-size formulation")


@contextlib.contextmanager
def traced_like_export():
    """What library code sees while capture traces: ``torch.compiler.is_compiling()`` is True, as in
    torch.export's non-strict tracing (which sets the same flag around its make_fx trace).

    Libraries written to be exportable check it to skip data-dependent shortcuts: transformers'
    ``is_tracing()`` (mask creation, packed-sequence detection), MoE dispatch without ``.tolist()``.
    Capture's functional tensors are not the FakeTensors those checks also look for, so without the
    flag such code runs ``if tensor.all():`` and fails as a data-dependent read. ``is_exporting()``
    stays False: it changes how torch functionalizes mutating custom ops."""
    import torch.compiler as tc

    old = getattr(tc, "_is_compiling_flag", None)
    if old is None:  # a torch without the flag: nothing to set
        yield
        return
    tc._is_compiling_flag = True
    try:
        yield
    finally:
        tc._is_compiling_flag = old


def _run(fn: Callable, names: list[str], fakes: list, tracker: SourceTracker, what: str):
    try:
        with fx_traceback.preserve_node_meta(), traced_like_export():
            return make_fx(_functionalized(fn, names, what), tracing_mode="fake")(*fakes)
    except CaptureError:
        raise
    except DataDependentOutputException as e:
        raise CaptureError("data-dependent value read by", op=_opname(e), source=tracker.last_source,
                           hint=_HINT_DATA) from None
    except DynamicOutputShapeException as e:
        raise CaptureError("data-dependent shape from", op=_opname(e), source=tracker.last_source,
                           hint=_HINT_SHAPE) from None
    except UnsupportedOperatorException as e:
        raise CaptureError("op without a fake (meta) implementation:", op=_opname(e), source=tracker.last_source,
                           hint="register a fake/meta kernel for it (torch.library.register_fake) or avoid it") from None
    except Exception as e:
        raise CaptureError(f"tracing the {what} failed ({type(e).__name__}: {_first_line(e)})",
                           source=tracker.last_source,
                           hint="the model/objective/update must run on CPU tensors of the given shapes; "
                                "see the chained exception for torch's full message") from e
    finally:
        clear_stack_trace()


def _opname(e: Exception) -> str:
    func = getattr(e, "func", None)
    if func is not None:
        return str(func).removesuffix(".default")
    return _first_line(e)


def _first_line(e: Exception) -> str:
    s = str(e).strip().splitlines()
    return s[0] if s else type(e).__name__


# ------------------------------------------------------------------------------------------

def _split_objective(res) -> tuple[torch.Tensor, dict]:
    if isinstance(res, torch.Tensor):
        return res, {}
    if isinstance(res, (tuple, list)) and len(res) == 2 and isinstance(res[0], torch.Tensor) and isinstance(res[1], Mapping):
        return res[0], dict(res[1])
    raise CaptureError(f"the objective returned a {type(res).__name__}",
                       hint="return the scalar loss tensor, or (loss, {name: tensor}) to also output metrics")


def _check_metrics(metrics: dict, who: str) -> None:
    for k, v in metrics.items():
        if not isinstance(k, str) or not isinstance(v, torch.Tensor):
            raise CaptureError(f"{who} returned metric {k!r} = {type(v).__name__}", hint="metrics map names to tensors")


def trace_forward_backward(spec: CaptureInputs, model, objective: Callable, forward_state: Callable | None,
                           ops, say: Callable[[str], None]) -> Traced:
    pnames, bnames = spec.names("params"), spec.names("buffers")
    snames, inames, tnames = spec.names("state"), spec.names("batch_in"), spec.names("batch_tg")
    hnames = [n for n, _ in spec.hyper]
    order = pnames + bnames + snames + inames + tnames + hnames
    tracker = SourceTracker("forward+backward", say)
    keys: list[str] = []

    def fb(*flat):
        it = iter(flat)
        params = {n: next(it) for n in pnames}
        buffers = {n: next(it) for n in bnames}
        state = spec.rebuild_state([next(it) for _ in snames])
        inputs = spec.rebuild_in([next(it) for _ in inames])
        targets = spec.rebuild_tg([next(it) for _ in tnames])
        hyper = {n: next(it) for n in hnames}
        fs: dict = {}
        if forward_state is not None:
            with tracker:
                fs = forward_state(dict(params), state, dict(hyper))
            fs = _check_forward_state(fs, spec)
        with torch.enable_grad():
            leaves = {n: fs.get(n, p).detach().requires_grad_() for n, p in params.items()}
            bufs = {n: fs.get(n, b) for n, b in buffers.items()}
            args, kwargs = (inputs,), {}
            if spec.call_style == "args":
                args = tuple(inputs)
            elif spec.call_style == "kwargs":
                args, kwargs = (), dict(inputs)
            with tracker:
                out = torch.func.functional_call(model, {**leaves, **bufs}, args, kwargs)
                res = objective(out, targets)
            loss, metrics = _split_objective(res)
            _check_metrics(metrics, "the objective")
            if tuple(loss.shape) != () or not loss.is_floating_point():
                raise CaptureError(f"the objective returned a loss of shape {list(loss.shape)} and dtype {loss.dtype}",
                                   hint="return a float scalar: reduce it with .mean() or .sum()")
            if not loss.requires_grad:
                raise CaptureError("the loss does not depend on any parameter",
                                   hint="check that the objective uses the model's outputs")
            install_backward_sources(loss, tracker)
            grads = torch.autograd.grad(loss, list(leaves.values()), allow_unused=True)
            clear_stack_trace()
        grads = [g if g is not None else torch.zeros_like(p) for g, p in zip(grads, params.values())]
        keys[:] = ["loss"] + [f"metric.{k}" for k in metrics] + [f"grad.{n}" for n in pnames]
        return [loss.detach(), *(m.detach() for m in metrics.values()), *grads]

    t0 = time.perf_counter()
    say(f"capture: tracing forward + backward ({len(order)} inputs)")
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    try:
        gm = _run(fb, order, _fakes(mode, order, spec.types), tracker, "forward + backward")
        t1 = time.perf_counter()
        say(f"capture: traced forward + backward in {t1 - t0:.1f} s ({len(gm.graph.nodes)} torch nodes); lowering")
        consts = {n: b for n, b in spec.buffers}
        frag = lower.lower(gm, order, keys, ops, consts=consts, progress=say)
    except CaptureError as e:
        hint = library_hint(model, e)
        if hint is None:
            raise
        raise CaptureError(e.what, op=e.op, source=e.source, hint=hint) from e.__cause__
    return Traced(frag, tuple(keys), time.perf_counter() - t0)


def library_hint(model, err: CaptureError) -> str | None:
    """A better hint for a capture failure caused by a known library setting (the config switch to
    use instead), else None. transformers: ``config._experts_implementation`` / ``_attn_implementation``."""
    cfg = getattr(model, "config", None)
    if cfg is None:
        return None
    experts = getattr(cfg, "_experts_implementation", None)
    attn = getattr(cfg, "_attn_implementation", None)
    where = err.source or ""
    if "data-dependent" in err.what and getattr(cfg, "layerdrop", None) is not None and getattr(model, "training", False):
        return (f"transformers' LayerDrop (config.layerdrop={cfg.layerdrop}) draws torch.rand in training mode and "
                "skips a layer through a Python if on it, which a static graph cannot hold (even at layerdrop=0): "
                "with layerdrop=0 and dropout 0 in the config, put the model in eval() mode before capture "
                "(model.eval(); the update and its gradients are the same), which skips the draw")
    if experts == "eager" and "data-dependent" in err.what and _switchable_experts(model):
        return ('transformers\' experts_implementation="eager" loops over the experts a batch hits (nonzero, shapes '
                'from data), which a static graph cannot hold: use the default experts_implementation="grouped_mm" '
                'or "batched_mm" (from_pretrained(..., experts_implementation="grouped_mm"), or '
                'model.set_experts_implementation("grouped_mm"))')
    if "masking_utils.py" in where or ("attention with a mask computed from the batch" in err.what and attn):
        return ("transformers builds its attention mask from the batch's attention_mask here; Latch's attention "
                "takes causal or full attention only (no padding masks yet): for unpadded batches drop "
                "attention_mask from the model's inputs (the causal mask is built without it)")
    window = getattr(cfg, "sliding_window", None)
    if "neither causal nor full" in err.what and window and getattr(cfg, "use_sliding_window", True) is not False:
        return (f"the model's config sets sliding_window={window}, shorter than the sequence, so its attention mask "
                "is a band, and Latch's attention takes causal or full attention only (no sliding windows yet): "
                f"train on sequences of at most {window} tokens (the window mask is then the causal one), or set "
                "sliding_window=None in the config where the model allows it (full causal attention)")
    if attn not in (None, "sdpa", "eager") and ("attention" in where or "attention" in (err.op or "")):
        return (f'transformers\' attn_implementation="{attn}" calls kernels Latch cannot capture: use '
                'attn_implementation="sdpa" (the default) or "eager" (from_pretrained(..., attn_implementation="sdpa"), '
                'or model.set_attn_implementation("sdpa"))')
    return None


def _switchable_experts(model) -> bool:
    """Whether the model's experts go through transformers' switchable experts implementations (a
    model with its own dispatch, e.g. JetMoE's ``.tolist()`` of per-expert counts, has no switch)."""
    can = getattr(type(model), "_can_set_experts_implementation", None)
    try:
        return bool(can()) if callable(can) else False
    except Exception:  # transformers' source heuristic failed: no switch to name
        return False


def _check_forward_state(fs, spec: CaptureInputs) -> dict:
    if not isinstance(fs, Mapping):
        raise CaptureError(f"forward_state returned a {type(fs).__name__}",
                           hint="forward_state(params, state, hyper) returns {parameter or buffer name: tensor}")
    known = {n for n, _ in spec.params} | {n for n, _ in spec.buffers}
    for k, v in fs.items():
        if k not in known:
            raise CaptureError(f"forward_state returned {k!r}, which is neither a parameter nor a buffer of the model",
                               hint=f"use one of: {', '.join(sorted(known)[:12])}")
        want = spec.types[k]
        if not isinstance(v, torch.Tensor) or _ttype(v, k) != want:
            got = _ttype(v, k) if isinstance(v, torch.Tensor) else type(v).__name__
            raise CaptureError(f"forward_state[{k!r}] is {got} but the model's {k!r} is {want}",
                               hint="return a tensor of the same shape and dtype")
    return dict(fs)


def trace_update(spec: CaptureInputs, update: Callable, ops, say: Callable[[str], None]) -> Traced:
    pnames, snames = spec.names("params"), spec.names("state")
    hnames = [n for n, _ in spec.hyper]
    gnames = [f"grad.{n}" for n in pnames]
    order = pnames + gnames + snames + hnames
    types = dict(spec.types)
    types.update({f"grad.{n}": spec.types[n] for n in pnames})
    tracker = SourceTracker("optimizer", say)
    keys: list[str] = []

    def opt(*flat):
        it = iter(flat)
        params = {n: next(it) for n in pnames}
        grads = {n: next(it) for n in pnames}
        state = spec.rebuild_state([next(it) for _ in snames])
        hyper = {n: next(it) for n in hnames}
        with tracker:
            res = update(dict(params), dict(grads), state, dict(hyper))
        if not isinstance(res, (tuple, list)) or len(res) not in (2, 3):
            raise CaptureError(f"the optimizer update returned a {type(res).__name__}",
                               hint="update(params, grads, state, hyper) returns (new_params, new_state) "
                                    "or (new_params, new_state, metrics)")
        new_params, new_state = res[0], res[1]
        metrics = dict(res[2]) if len(res) == 3 else {}
        _check_metrics(metrics, "the optimizer update")
        flat_p = _match("new_params", new_params, pnames, params)
        if not isinstance(new_state, Mapping):
            raise CaptureError(f"the optimizer update returned new_state as a {type(new_state).__name__}",
                               hint="return the new state with the structure of the state it received")
        ns, _ = tree.flatten(dict(new_state), "", "new_state")
        flat_s = _match("new_state", dict(ns), snames, dict(zip(snames, flat[len(pnames) * 2:len(pnames) * 2 + len(snames)])))
        keys[:] = [f"new.{n}" for n in pnames] + [f"new.{n}" for n in snames] + [f"metric.{k}" for k in metrics]
        return [*flat_p, *flat_s, *metrics.values()]

    t0 = time.perf_counter()
    say("capture: tracing the optimizer update")
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    gm = _run(opt, order, _fakes(mode, order, types), tracker, "optimizer update")
    frag = lower.lower(gm, order, keys, ops, consts={}, progress=say)
    return Traced(frag, tuple(keys), time.perf_counter() - t0)


def _match(what: str, new: Any, names: list[str], old: Mapping[str, torch.Tensor]) -> list[torch.Tensor]:
    if not isinstance(new, Mapping):
        raise CaptureError(f"the optimizer update returned {what} as a {type(new).__name__}",
                           hint=f"return {what} as a dict with the same keys as the input")
    missing = [n for n in names if n not in new]
    extra = [k for k in new if k not in old]
    if missing or extra:
        raise CaptureError(f"the optimizer update's {what} does not match its input",
                           hint=f"missing keys {missing[:8]}, unexpected keys {extra[:8]}; return every key, no others")
    out = []
    for n in names:
        v = new[n]
        if not isinstance(v, torch.Tensor):
            raise CaptureError(f"{what}[{n!r}] is a {type(v).__name__}", hint="return tensors")
        if tuple(v.shape) != tuple(old[n].shape) or v.dtype != old[n].dtype:
            raise CaptureError(
                f"{what}[{n!r}] is {v.dtype} {list(v.shape)} but the value it replaces is {old[n].dtype} {list(old[n].shape)}",
                hint="a new value overwrites the old one in place: keep its shape and dtype (cast/reshape explicitly)")
        out.append(v)
    return out
