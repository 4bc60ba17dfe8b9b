"""Pass ``moe.store_operands``: the ragged products read BF16 (or F16) operands from memory.

``memory.policy`` gives every ``matmul``-tagged op ``operand_dtype`` bf16, but stores operands (casts
in the graph) only for ``latch::matmul``; a ragged product with FP32 operands would round them
inside its body, on CUDA cores. This pass does for the three ragged products what
``memory.policy`` does for latch::matmul, so their wgmma bodies can stream the operands with TMA:
each float operand of a ragged node whose ``operand_dtype`` is bf16/f16 is cast once per
(value, dtype), the cast shared by every ragged node reading it and placed just before its first
reader; the node keeps its result's dtype (``out_dtype``). A row gather (``index_select`` along
dim 0) read only by such nodes is cast at its source instead (the routed rows are gathered in BF16).
Nothing else changes; a graph without such nodes passes through untouched. Nodes inside repeated regions are left as they are (their
bodies round the operands themselves).

No torch: the pass runs on the document only.
"""

from __future__ import annotations

import attrs

from latch_core.document import Document
from latch_core.ir import Graph, Node, Value, fresh_name

from . import specs

RAGGED = (specs.RAGGED_MM, specs.RAGGED_MM_GRAD_X, specs.RAGGED_MM_GRAD_W)
LOW = ("bf16", "f16")
CAST = "latch::cast"
GATHER = "latch::index_select"
FLOAT_SLOTS = (0, 1)  # x/grad and w/grad: the float operands; slot 2 is offsets


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
                casts[key] = fresh_name(names, f"{n.inputs[s]}.{dt}")
                src[casts[key]] = n.source
            first[casts[key]] = min(first.get(casts[key], len(g.nodes)), index[n.name])
    # A row gather read only by these products is cast before it instead (cast(index_select(x)) ==
    # index_select(cast(x)) exactly): the cast covers the N source rows instead of the N*k gathered
    # ones, the gather moves half the bytes, and the FP32 gathered rows never exist.
    producers = {o: n for n in g.nodes for o in n.outputs}
    consumers = g.consumers()
    outs = set(g.output_names())
    early: dict[str, tuple[str, str, str]] = {}  # gather node -> (its input cast, the cast's dtype, new output)
    dtypes_of: dict[str, int] = {}
    for base, _dt in casts:
        dtypes_of[base] = dtypes_of.get(base, 0) + 1
    for (base, dt), c in casts.items():
        s = producers.get(base)
        if (s is not None and s.op == GATHER and dtypes_of[base] == 1 and s.attr("dim") == 0 and base not in outs
                and g.value(s.inputs[0]).dtype == "f32" and all(r.name in low for r in consumers.get(base, ()))):
            early[s.name] = (s.inputs[0], dt, c)
    # casts already in the graph (memory.policy's, e.g. of the layer input for the router's matmul)
    pos = {n.name: i for i, n in enumerate(g.nodes)}
    done_casts = {(n.inputs[0], n.attr("dtype")): (n.outputs[0], pos[n.name]) for n in g.nodes if n.op == CAST}
    src_casts: dict[tuple[str, str], str] = {}
    for name, (x, dt, _c) in early.items():
        if (x, dt) in done_casts and done_casts[(x, dt)][1] < pos[name]:
            src_casts[(x, dt)] = done_casts[(x, dt)][0]
    at: dict[int, list[tuple[str, str, str]]] = {}
    for (base, dt), c in casts.items():
        s = producers.get(base)
        if s is None or s.name not in early:
            at.setdefault(first[c], []).append((base, dt, c))
    gone = {producers[b].outputs[0] for b, _ in casts if producers.get(b) is not None and producers[b].name in early}
    values = [v for v in g.values if v.name not in gone]
    values += [Value(c, g.value(base).shape, dt) for (base, dt), c in casts.items()]
    nodes: list[Node] = []
    for i, n in enumerate(g.nodes):
        for base, dt, c in at.get(i, ()):
            nodes.append(Node(fresh_name(names, f"cast.{c}"), CAST, (base,), (c,), {"dtype": dt}, source=src[c]))
        if n.name in early:
            x, dt, c = early[n.name]
            xc = src_casts.get((x, dt))
            if xc is None:
                xc = src_casts[(x, dt)] = fresh_name(names, f"{x}.{dt}")
                values.append(Value(xc, g.value(x).shape, dt))
                nodes.append(Node(fresh_name(names, f"cast.{xc}"), CAST, (x,), (xc,), {"dtype": dt}, source=n.source))
            nodes.append(attrs.evolve(n, inputs=(xc,) + tuple(n.inputs[1:]), outputs=(c,)))
            continue
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
