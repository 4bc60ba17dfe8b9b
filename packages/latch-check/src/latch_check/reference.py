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
"""

from __future__ import annotations

from typing import Mapping

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


def run(doc_or_graph, program: str | None, inputs: Mapping[str, torch.Tensor], *, ops: Registry | None = None,
        float_dtype: torch.dtype = torch.float64) -> dict[str, torch.Tensor]:
    """Run ``program`` of a document (or a Graph) on ``inputs``; returns every output by name."""
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

    outputs = set(graph.output_names())
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
    missing = [n for n in graph.output_names() if n not in env]
    if missing:
        raise ReferenceError(f"program {graph.name!r}: outputs {missing[:6]} were never computed")
    return {n: env[n] for n in graph.output_names()}
