"""Pass ``moe.fixed_order_scatters``: the MoE's scatters back to tokens become gathers summed in a
fixed order (deterministic, no float atomics, spread over the SMs by rows).

Autograd turns the layer's two gathers (``index_select`` by route_order's ``token``, the dispatch,
and by its ``position``, the combine) into ``index_add`` onto zeros, whose body lets every task walk
every source element and add with float atomics: one token's k contributions land in an order that
varies from run to run. Both have a gather form, because route_order's outputs are two views of one
permutation of the N*k (token, slot) pairs:

    index_add(zeros[N, ...], 0, token, g)     ->  gather_sum(g, position) {k}
        token n's k rows of g, in slot order, summed from zero (each token's contributions in their
        own slots, summed in a fixed order: the bits of sum(reshape(index_select(g, 0, position),
        [N, k, ...]), dims=[1]), without writing the N*k gathered rows);
    index_add(zeros[P, ...], 0, position, g)  ->  index_select(g, 0, scatter(zeros_i64[P], 0, position, arange(P)))
        position is a permutation, so the sum has one term per row: a gather by its inverse; where
        ``moe.route_split`` ran first, route_rows' ``pairs`` is that inverse and the gather reads it.

An ``index_add`` onto anything but a ``latch::full`` of zeros, along another dim, or by an index
that is not a route_order output, is left alone. No torch: the pass runs on the document only.
"""

from __future__ import annotations

import attrs

from latch_core.document import Document
from latch_core.ir import Graph, Node, Value, fresh_name

from ..fold import fold_adds
from . import gather_sum, route_split, specs

INDEX_ADD, INDEX_SELECT, FULL = "latch::index_add", "latch::index_select", "latch::full"


def rewrite_scatters(g: Graph) -> tuple[Graph, int, int]:
    """(new graph, index_add nodes replaced, adds folded into a gather_sum) for one program."""
    producers = {o: n for n in g.nodes for o in n.outputs}
    # value -> (kind, indices, position, pairs): route_order's outputs, or route_split's (whose
    # route_rows also gives position's inverse, ``pairs``, so the combine needs no scatter)
    routes: dict[str, tuple[str, str, str, str | None]] = {}
    for n in g.nodes:
        if n.op == specs.ROUTE_ORDER and len(n.outputs) == 3:
            routes[n.outputs[0]] = ("token", n.inputs[0], n.outputs[1], None)
            routes[n.outputs[1]] = ("position", n.inputs[0], n.outputs[1], None)
    rows = {m.inputs: m for m in g.nodes if m.op == route_split.ROUTE_ROWS}
    for n in g.nodes:
        m = rows.get(n.inputs) if n.op == route_split.ROUTE_PLACE else None
        if m is not None:  # the same indices and counts
            routes[m.outputs[0]] = ("token", n.inputs[0], n.outputs[0], m.outputs[1])
            routes[n.outputs[0]] = ("position", n.inputs[0], n.outputs[0], m.outputs[1])

    def zeros(v: str | None) -> bool:
        p = producers.get(v)
        return p is not None and p.op == FULL and p.attr("value") in (0, 0.0) and not isinstance(p.attr("value"), bool)

    def eligible(n: Node) -> bool:
        return (n.op == INDEX_ADD and len(n.inputs) == 3 and n.attr("dim") == 0 and n.inputs[1] in routes
                and zeros(n.inputs[0]) and n.attr("alpha") in (None, 1, 1.0))

    todo = [n for n in g.nodes if eligible(n)]
    if not todo:
        return g, 0, 0
    names = {v.name for v in g.values} | {n.name for n in g.nodes}
    values = list(g.values)
    nodes: list[Node] = []
    for n in g.nodes:
        if not eligible(n):
            nodes.append(n)
            continue
        kind, indices, position, pairs = routes[n.inputs[1]]
        src, out = n.inputs[2], n.outputs[0]
        sv = g.value(src)
        if kind == "token":  # each token's k rows of g, in slot order, summed: one gather_sum
            N, k = g.value(indices).shape
            nodes.append(Node(n.name, gather_sum.GATHER_SUM, (src, position), (out,), {"k": k}, source=n.source))
        elif pairs is not None:  # the inverse is route_rows' own output
            nodes.append(Node(n.name, INDEX_SELECT, (src, pairs), (out,), {"dim": 0}, source=n.source))
        else:
            P = g.value(n.inputs[1]).shape[0]
            base, ar, inv = (fresh_name(names, f"{out}.{s}") for s in ("inv_base", "rows", "inverse"))
            values += [Value(base, (P,), "i64"), Value(ar, (P,), "i64"), Value(inv, (P,), "i64")]
            nodes += [Node(fresh_name(names, f"full.{base}"), FULL, (), (base,), {"shape": [P], "value": 0, "dtype": "i64"},
                           source=n.source),
                      Node(fresh_name(names, f"arange.{ar}"), "latch::arange", (), (ar,),
                           {"start": 0, "step": 1, "size": P, "dtype": "i64"}, source=n.source),
                      Node(fresh_name(names, f"inverse.{inv}"), "latch::scatter", (base, n.inputs[1], ar), (inv,), {"dim": 0},
                           source=n.source),
                      Node(n.name, INDEX_SELECT, (src, inv), (out,), {"dim": 0}, source=n.source)]
    # the zeros the index_adds started from, now read by no one
    read = {v for n in nodes for v in n.inputs if v is not None} | set(g.output_names())
    dead = {n.name for n in nodes if n.op == FULL and all(o not in read for o in n.outputs)}
    gone = {o for n in nodes if n.name in dead for o in n.outputs}
    nodes = [n for n in nodes if n.name not in dead]
    values = [v for v in values if v.name not in gone]
    folded, adds = fold_adds(attrs.evolve(g, values=values, nodes=nodes), gather_sum.GATHER_SUM, 2)
    return folded, len(todo), adds


def fixed_order_scatters_pass(doc: Document, **_options) -> tuple[Document, str]:
    programs, count, adds = [], 0, 0
    for p in doc.graph.programs:
        p2, c, a = rewrite_scatters(p)
        programs.append(p2)
        count += c
        adds += a
    return (attrs.evolve(doc, graph=attrs.evolve(doc.graph, programs=programs)),
            f"{count} MoE scatters back to tokens became fixed-order gathers ({adds} add(s) folded into a gather_sum)")
