"""Pass ``moe.store_operands``: the ragged products read BF16 (or F16) operands from memory.

``memory.policy`` gives every ``matmul``-tagged op ``operand_dtype`` bf16, but stores operands (casts
in the graph) only for ``latch::matmul``; a ragged product with FP32 operands would round them
inside its body, on CUDA cores. This pass does for the three ragged products what
``memory.policy`` does for latch::matmul, so their wgmma bodies can stream the operands with TMA:
each float operand of a ragged node whose ``operand_dtype`` is bf16/f16 is cast once per
(value, dtype), the cast shared by every ragged node reading it and placed just before its first
reader; the node keeps its result's dtype (``out_dtype``). Nothing else changes; a graph without
such nodes passes through untouched. Nodes inside repeated regions are left as they are (their
bodies round the operands themselves).

No torch: the pass runs on the document only.
"""

from __future__ import annotations

import attrs

from latch_core.document import Document
from latch_core.ir import Graph, Node, Value

from . import specs

RAGGED = (specs.RAGGED_MM, specs.RAGGED_MM_GRAD_X, specs.RAGGED_MM_GRAD_W)
LOW = ("bf16", "f16")
CAST = "latch::cast"
FLOAT_SLOTS = (0, 1)  # x/grad and w/grad: the float operands; slot 2 is offsets


def _fresh(names: set[str], base: str) -> str:
    name = base
    while name in names:
        name += "_"
    names.add(name)
    return name


def store_ragged_operands(g: Graph) -> tuple[Graph, int, int]:
    """(new graph, ragged nodes rewritten, casts inserted) for one program."""
    low = {}
    for n in g.nodes:
        dt = n.attr("operand_dtype")
        if n.op in RAGGED and dt in LOW and all(g.value(n.inputs[s]).dtype == "f32" for s in FLOAT_SLOTS):
            low[n.name] = dt
    if not low:
        return g, 0, 0
    index = {n.name: i for i, n in enumerate(g.nodes)}
    names = {v.name for v in g.values} | {n.name for n in g.nodes}
    casts: dict[tuple[str, str], str] = {}
    first: dict[str, int] = {}
    src: dict[str, str | None] = {}
    for n in g.nodes:
        dt = low.get(n.name)
        if dt is None:
            continue
        for s in FLOAT_SLOTS:
            key = (n.inputs[s], dt)
            if key not in casts:
                casts[key] = _fresh(names, f"{n.inputs[s]}.{dt}")
                src[casts[key]] = n.source
            first[casts[key]] = min(first.get(casts[key], len(g.nodes)), index[n.name])
    at: dict[int, list[tuple[str, str, str]]] = {}
    for (base, dt), c in casts.items():
        at.setdefault(first[c], []).append((base, dt, c))
    values = list(g.values) + [Value(c, g.value(base).shape, dt) for (base, dt), c in casts.items()]
    nodes: list[Node] = []
    for i, n in enumerate(g.nodes):
        for base, dt, c in at.get(i, ()):
            nodes.append(Node(_fresh(names, f"cast.{c}"), CAST, (base,), (c,), {"dtype": dt}, source=src[c]))
        dt = low.get(n.name)
        if dt is not None:
            ins = list(n.inputs)
            for s in FLOAT_SLOTS:
                ins[s] = casts[(n.inputs[s], dt)]
            n = attrs.evolve(n, inputs=ins, attrs=dict(n.attr_dict, out_dtype=g.value(n.outputs[0]).dtype))
        nodes.append(n)
    return attrs.evolve(g, values=values, nodes=nodes), len(low), len(casts)


def store_operands_pass(doc: Document, **_options) -> tuple[Document, str]:
    programs, nodes, casts = [], 0, 0
    for p in doc.graph.programs:
        p2, a, b = store_ragged_operands(p)
        programs.append(p2)
        nodes += a
        casts += b
    section = attrs.evolve(doc.graph, programs=programs)
    return attrs.evolve(doc, graph=section), f"{nodes} ragged products read stored operands ({casts} casts)"
