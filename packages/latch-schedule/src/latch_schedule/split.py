"""Two-level reductions: a graph rewrite so that no big full reduction is one single-SM task.

A reduction that keeps no dims (``sum(g * g)`` of a 150 MB gradient for the global-norm clip) has
nothing to tile: on one SM it would take milliseconds. When its cost exceeds
``split_factor * CostModel.min_task`` it is rewritten as

    partial = red(x, dims = every dim but the leading ones, keepdim)   # tiled over the leading dims
    out     = red(partial, dims = the leading ones, keepdim)           # one small task

keeping just enough leading dims to give ``num_sms`` partial rows. ``sum``, ``mean`` (equal-sized
partials, so the mean of means is the mean), ``amax`` and ``amin`` on float operands are rewritten;
the result differs from the one-level reduction only by rounding (summation order), which every
parallel reduction changes anyway; the FP64 reference runs the rewritten graph. The original node
keeps its name and output (the second level); the first level is ``<node>.partial``.
"""

from __future__ import annotations

import math

import attrs

from latch_core.document import Document
from latch_core.ir import FLOAT_DTYPES, Graph, Node, Value
from latch_core.registry import Registry

from .fusion import _spec
from .tiling import CostModel, node_cost

SPLITTABLE = frozenset({"latch::sum", "latch::mean", "latch::amax", "latch::amin"})


def _plan(graph: Graph, node: Node, ops: Registry | None, cost: CostModel, num_sms: int, factor: float):
    """(kept leading dims, keepdim) when ``node`` should be split, else None."""
    if node.op not in SPLITTABLE or len(node.inputs) != 1 or node.inputs[0] is None or len(node.outputs) != 1:
        return None
    x = graph.value(node.inputs[0])
    if x.dtype not in FLOAT_DTYPES or len(x.shape) < 2:
        return None
    dims = node.attr("dims")
    if not isinstance(dims, tuple) or sorted(d % len(x.shape) for d in dims) != list(range(len(x.shape))):
        return None  # only full reductions: a partial one is tiled over its kept dims already
    spec = _spec(ops, node.op)
    f, m, b = node_cost(spec, [x.type], [graph.value(node.outputs[0]).type], node.attr_dict)
    if cost.seconds(f, m, b) <= factor * cost.min_task:
        return None
    lead = 1
    while lead < len(x.shape) - 1 and math.prod(x.shape[:lead]) < num_sms:
        lead += 1
    return lead, bool(node.attr("keepdim", False))


def split_reductions(graph: Graph, ops: Registry | None, *, cost: CostModel | None = None, num_sms: int = 132,
                     factor: float = 4.0) -> tuple[Graph, list[str]]:
    """The rewritten program and the names of the nodes split."""
    cost = cost or CostModel()
    nodes: list[Node] = []
    values = list(graph.values)
    names = {v.name for v in values}
    split = []
    for n in graph.nodes:
        p = _plan(graph, n, ops, cost, num_sms, factor)
        if p is None:
            nodes.append(n)
            continue
        lead, keep = p
        x = graph.value(n.inputs[0])
        rank = len(x.shape)
        partial = f"{n.outputs[0]}.partial"
        while partial in names:
            partial += "_"
        names.add(partial)
        pshape = tuple(x.shape[:lead]) + ((1,) * (rank - lead) if keep else ())
        values.append(Value(partial, pshape, x.dtype))
        a1 = dict(n.attr_dict, dims=tuple(range(lead, rank)), keepdim=keep)
        a2 = dict(n.attr_dict, dims=tuple(range(len(pshape))) if keep else tuple(range(lead)), keepdim=keep)
        nodes.append(Node(f"{n.name}.partial", n.op, n.inputs, [partial], a1, source=n.source))
        nodes.append(attrs.evolve(n, inputs=(partial,), attrs=a2))
        split.append(n.name)
    if not split:
        return graph, []
    return attrs.evolve(graph, values=values, nodes=nodes), split


def split_document(doc: Document, ops: Registry | None, *, cost: CostModel | None = None, num_sms: int = 132,
                   factor: float = 4.0) -> tuple[Document, dict[str, list[str]]]:
    programs, done = [], {}
    for g in doc.graph.programs:
        g2, names = split_reductions(g, ops, cost=cost, num_sms=num_sms, factor=factor)
        programs.append(g2)
        if names:
            done[g.name] = names
    if not done:
        return doc, {}
    return attrs.evolve(doc, graph=attrs.evolve(doc.graph, programs=programs)), done
