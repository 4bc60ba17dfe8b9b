"""The FP64 reference interpreter: runs any program of a document on the CPU with the ops' torch
references (``OpSpec.extra["reference"]``, CONTRACTS.md sections 1 and 5).

    outputs = run(doc, "update", {"w1": w1, "w2": w2, "input": x, "target": t, "lr": lr})

- Inputs are checked by name, shape and dtype kind (float / integer / bool) against the program's
  input values; an error names the tensor. Float inputs are cast to float64; integer and bool
  inputs are cast to their declared dtype. Constants come from the document.
- Each node runs its op's reference on float64 values (the references never round to a narrower
  float), and its results are checked against the node's declared shapes and dtypes (floats at the
  interpreter's width, integers and bools exactly as declared), so a
  wrong shape rule or reference is caught at the node that produced it (named, with its source).
- Values are released after their last reader, so large graphs run in bounded memory.
- ``float_dtype`` selects another float width (e.g. ``torch.float32`` to emulate a GPU run).
- ``force={value: tensor}`` replaces values nodes compute by given tensors: the node still runs (so
  its errors surface and its other outputs exist), then each forced output takes the given tensor
  (checked against the value's shape and dtype kind, cast like an input). Checks of a reduced-
  precision program use it to replay the program's own discrete decisions (its routing) in FP64.
  Forcing one output of a multi-output node needs a rule that makes the other outputs agree with
  it (``FORCE_RULES``: ``latch::token_topk`` given its expert ``indices`` re-gathers its gate
  ``values`` from the probabilities); without one it is an error naming the node, never a node
  whose outputs contradict each other.
- ``keep=(value, ...)`` also returns those intermediate values (e.g. router probabilities).
"""

from __future__ import annotations

from typing import Callable, Iterable, Mapping

import torch

from latch_core.ir import FLOAT_DTYPES, Graph
from latch_core.registry import Registry
from latch_ops.common import from_torch_dtype, reference_float_dtype, torch_dtype


class ReferenceError(ValueError):
    """A program the interpreter cannot run with the inputs given; names the value or node."""


def _graph(doc_or_graph, program: str | None) -> Graph:
    if isinstance(doc_or_graph, Graph):
        if program is not None and program != doc_or_graph.name:
            raise ReferenceError(f"asked for program {program!r} but was given the graph {doc_or_graph.name!r}")
        return doc_or_graph
    section = getattr(doc_or_graph, "graph", None)
    if section is None:
        section = doc_or_graph if hasattr(doc_or_graph, "programs") else None
    if section is None:
        raise ReferenceError("the document has no graph section; capture it first")
    if program is None:
        if len(section.programs) != 1:
            raise ReferenceError(f"the document has programs {[p.name for p in section.programs]}; name one")
        return section.programs[0]
    try:
        return section.program(program)
    except Exception as e:
        raise ReferenceError(str(e)) from None


def _kind(dtype: str) -> str:
    return "float" if dtype in FLOAT_DTYPES else ("bool" if dtype == "bool" else "int")


def _tkind(t: torch.Tensor) -> str:
    if t.dtype == torch.bool:
        return "bool"
    return "float" if t.is_floating_point() else "int"


def _where(node) -> str:
    src = f" (from {node.source})" if node.source else ""
    return f"node {node.name!r} ({node.op}){src}"


def _const(v, fdt) -> torch.Tensor:
    dt = fdt if v.dtype in FLOAT_DTYPES else torch_dtype(v.dtype)
    return torch.tensor(list(v.data), dtype=dt).reshape(v.shape)


def _topk_given_indices(node, args: list, results: list, forced: dict[int, torch.Tensor]) -> list | None:
    """token_topk(probs) -> (values, indices) with ``indices`` forced: values = probs at those
    indices (slot order kept), after checking each row names distinct experts in [0, E). Forced
    values alone determine no indices: None."""
    if 1 not in forced:
        return None
    probs, idx = args[0], forced[1]
    name = node.outputs[1]
    E = probs.shape[1]
    bad = (idx < 0) | (idx >= E)
    if bool(bad.any()):
        pos = [int(i) for i in bad.nonzero()[0]]
        raise ReferenceError(f"forced value {name!r} of {_where(node)}: [{pos[0]}, {pos[1]}] = "
                             f"{int(idx[tuple(pos)])} is not an expert index in [0, {E})")
    srt = torch.sort(idx, dim=1).values
    dup = (srt[:, 1:] == srt[:, :-1]).any(dim=1)
    if bool(dup.any()):
        row = int(dup.nonzero()[0, 0])
        raise ReferenceError(f"forced value {name!r} of {_where(node)}: row {row} chooses an expert twice "
                             f"({idx[row].tolist()}); each token's k choices must be distinct")
    return [probs.gather(1, idx.long()), idx]


# op -> rule(node, operands, computed results, {output index: forced tensor}) -> results (None: this
# subset determines no consistent results), for ops whose outputs must agree with each other when
# only some of them are forced.
FORCE_RULES: dict[str, Callable] = {"latch::token_topk": _topk_given_indices}


def _check_force(graph: Graph, force: Mapping[str, torch.Tensor], fdt: torch.dtype) -> dict[str, torch.Tensor]:
    produced = {o for n in graph.nodes for o in n.outputs}
    out = {}
    for name, t in force.items():
        if not graph.has_value(name):
            raise ReferenceError(f"force names {name!r}, which is no value of program {graph.name!r}")
        v = graph.value(name)
        if name not in produced:
            raise ReferenceError(f"force names {name!r}, a {v.role} value of program {graph.name!r} that no node "
                                 "computes; give program inputs through inputs, force only node results")
        if not isinstance(t, torch.Tensor):
            raise ReferenceError(f"forced value {name!r} is a {type(t).__name__}, not a tensor")
        if tuple(t.shape) != tuple(v.shape):
            raise ReferenceError(f"forced value {name!r} has shape {list(t.shape)}, the program declares {v.type}")
        if _tkind(t) != _kind(v.dtype):
            raise ReferenceError(f"forced value {name!r} is {t.dtype}, the program declares {v.dtype} "
                                 f"({_kind(v.dtype)})")
        out[name] = t.detach().to(device="cpu", dtype=fdt if v.dtype in FLOAT_DTYPES else torch_dtype(v.dtype))
    return out


def _forced_results(node, args: list, results: list, force: Mapping[str, torch.Tensor]) -> list:
    forced = {i: force[o] for i, o in enumerate(node.outputs) if o in force}
    if len(forced) == len(node.outputs):
        return [forced[i] for i in range(len(results))]
    rule = FORCE_RULES.get(node.op)
    out = None if rule is None else rule(node, args, results, forced)
    if out is None:
        given = [node.outputs[i] for i in forced]
        rest = [o for o in node.outputs if o not in force]
        raise ReferenceError(f"{_where(node)}: forcing {given} would leave its other outputs {rest} computed from "
                             f"its own results; force every output of the node (no rule derives {node.op}'s other "
                             "outputs from these)")
    return list(out)


def run(doc_or_graph, program: str | None, inputs: Mapping[str, torch.Tensor], *, ops: Registry | None = None,
        float_dtype: torch.dtype = torch.float64, force: Mapping[str, torch.Tensor] | None = None,
        keep: Iterable[str] = ()) -> dict[str, torch.Tensor]:
    """Run ``program`` of a document (or a Graph) on ``inputs``; returns every output by name, and
    the values named in ``keep``. ``force`` replaces computed values (module docstring)."""
    graph = _graph(doc_or_graph, program)
    if ops is None:
        from latch_core.plugins import registries

        ops = registries().ops
    fdt_name = from_torch_dtype(float_dtype)
    if fdt_name not in FLOAT_DTYPES:
        raise ReferenceError(f"float_dtype must be a float dtype, got {float_dtype}")
    for r in graph.regions:
        raise ReferenceError(f"program {graph.name!r} has region {r.name!r}: latch::repeat is not supported by the "
                             "reference interpreter yet")

    env: dict[str, torch.Tensor] = {}
    expected = graph.input_names()
    unknown = sorted(set(inputs) - set(expected))
    if unknown:
        raise ReferenceError(f"program {graph.name!r} has no inputs named {unknown[:6]}; its inputs are {expected[:12]}")
    for name in expected:
        v = graph.value(name)
        if name not in inputs:
            raise ReferenceError(f"program {graph.name!r}: input {name!r} ({v.role} {v.type}) was not given")
        t = inputs[name]
        if not isinstance(t, torch.Tensor):
            raise ReferenceError(f"input {name!r} is a {type(t).__name__}, not a tensor")
        if tuple(t.shape) != tuple(v.shape):
            raise ReferenceError(f"input {name!r} has shape {list(t.shape)}, the program needs {list(v.shape)}")
        if _tkind(t) != _kind(v.dtype):
            raise ReferenceError(f"input {name!r} is {t.dtype}, the program needs {v.dtype} ({_kind(v.dtype)})")
        env[name] = t.detach().to(device="cpu", dtype=float_dtype if v.dtype in FLOAT_DTYPES else torch_dtype(v.dtype))
    for v in graph.values:
        if v.role == "const":
            env[v.name] = _const(v, float_dtype)

    force = _check_force(graph, force or {}, float_dtype)
    keep = list(keep)
    for name in keep:
        if not graph.has_value(name):
            raise ReferenceError(f"keep names {name!r}, which is no value of program {graph.name!r}")
    outputs = set(graph.output_names()) | set(keep)
    last_use: dict[str, int] = {}
    for i, node in enumerate(graph.nodes):
        for name in node.inputs:
            if name is not None:
                last_use[name] = i

    with reference_float_dtype(fdt_name), torch.no_grad():
        for i, node in enumerate(graph.nodes):
            if node.op not in ops:
                raise ReferenceError(f"{_where(node)}: op {node.op!r} is not registered; install the plugin that provides it")
            ref = ops.get(node.op).extra.get("reference")
            if ref is None:
                raise ReferenceError(f"{_where(node)}: op {node.op!r} has no reference function (OpSpec.extra['reference'])")
            args = []
            for name in node.inputs:
                if name is None:
                    args.append(None)
                elif name not in env:
                    raise ReferenceError(f"{_where(node)}: operand {name!r} is not defined (or was released)")
                else:
                    args.append(env[name])
            try:
                results = ref(args, node.attr_dict)
            except Exception as e:
                raise ReferenceError(f"{_where(node)}: the reference raised {type(e).__name__}: {e}") from e
            if len(results) != len(node.outputs):
                raise ReferenceError(f"{_where(node)}: the reference gave {len(results)} results for {len(node.outputs)} outputs")
            if force and any(o in force for o in node.outputs):
                results = _forced_results(node, args, list(results), force)
            for name, r in zip(node.outputs, results):
                v = graph.value(name)
                want = float_dtype if v.dtype in FLOAT_DTYPES else torch_dtype(v.dtype)
                if not isinstance(r, torch.Tensor) or tuple(r.shape) != tuple(v.shape) or r.dtype != want:
                    got = f"{r.dtype}{list(r.shape)}" if isinstance(r, torch.Tensor) else type(r).__name__
                    raise ReferenceError(f"{_where(node)}: the reference gave {got} for output {name!r} declared {v.type}")
                env[name] = r
            for name in node.inputs:
                if name is not None and last_use.get(name) == i and name not in outputs:
                    env.pop(name, None)
    missing = [n for n in graph.output_names() + keep if n not in env]
    if missing:
        raise ReferenceError(f"program {graph.name!r}: outputs {missing[:6]} were never computed")
    return {n: env[n] for n in graph.output_names() + keep}
