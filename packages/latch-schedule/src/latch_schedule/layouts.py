"""The pass ``schedule.matmul_layouts``: transposes feeding matrix products become operand layouts.

Captured code spells ``x @ w.T`` as ``matmul(x, permute(w, (1, 0)))``; scheduled as written, the
permute is a copy of the whole weight every step. ``latch::matmul`` can read either operand stored
transposed (``trans_a``: ``a`` stored ``[*B, K, M]``; ``trans_b``: ``b`` stored ``[*B, N, K]``), so
this pass rewrites, for operand ``a`` or ``b`` of every matmul:

- ``permute(x)`` that swaps the last two dims (perm ``(0, ..., n-3, n-1, n-2)``) -> ``x`` with the
  operand's trans flag flipped;
- ``reshape(permute(x))`` where the reshape only merges or splits LEADING dims (its input and
  output end in the same two dims and hold the same elements) -> ``reshape'(x)`` (the same
  leading dims, ``x``'s last two) with the flag flipped; this is exact because row-major
  reshapes of leading dims move whole trailing ``[p, q]`` blocks, and swapping the last two dims
  acts inside each block. A new reshape is added only when the leading dims really change.

Repeated until nothing folds (a double transpose folds away). Nothing else is folded: a permute
that moves any other dim, or a reshape touching the last two dims, stays as it is. A permute or
reshape the folds leave without readers (and that is no program output) is removed. The forms the
captured examples produce: forward ``matmul(view, permute(W))`` -> ``matmul(view, W){trans_b}``;
weight gradient ``matmul(permute(dY), X)`` -> ``matmul(dY, X){trans_a}``; the input gradient
``matmul(dY, W)`` is already in its layout.

Pure: returns a new document (graph metadata ``schedule.matmul_layouts``: per program, the folds
made and the nodes removed); the ``schedule`` pass runs it first unless ``matmul_layouts=False``.
"""

from __future__ import annotations

import math

import attrs

from latch_core.document import Document
from latch_core.ir import Graph, Node, Value, fresh_name

MATMUL = "latch::matmul"
PERMUTE = "latch::permute"
RESHAPE = "latch::reshape"
FLAGS = ("trans_a", "trans_b")


def is_transpose(node: Node | None) -> bool:
    """A ``latch::permute`` swapping exactly the last two dims."""
    if node is None or node.op != PERMUTE or len(node.inputs) != 1:
        return False
    perm = node.attr("perm")
    if not isinstance(perm, tuple) or len(perm) < 2:
        return False
    n = len(perm)
    return perm == tuple(range(n - 2)) + (n - 1, n - 2)


def is_leading_reshape(graph: Graph | dict, node: Node | None) -> bool:
    """A ``latch::reshape`` that keeps the last two dims and only merges/splits the ones before.
    ``graph``: the program, or a mapping value name -> Value."""
    if node is None or node.op != RESHAPE or len(node.inputs) != 1 or node.inputs[0] is None:
        return False
    shape = (lambda v: graph[v].shape) if isinstance(graph, dict) else (lambda v: graph.value(v).shape)
    x, y = shape(node.inputs[0]), shape(node.outputs[0])
    return len(x) >= 2 and len(y) >= 2 and x[-2:] == y[-2:] and math.prod(x[:-2]) == math.prod(y[:-2])


def fold_layouts(graph: Graph) -> tuple[Graph, list[dict], list[str]]:
    """The rewritten program, one record per fold (matmul, operand, the views folded through, the
    resulting flag) and the names of the views removed."""
    producers = graph.producers()
    index = {n.name: i for i, n in enumerate(graph.nodes)}
    nodes: list[Node | None] = list(graph.nodes)
    values = list(graph.values)
    vnames = {v.name for v in values} | {n.name for n in graph.nodes}
    added: dict[int, list[Node]] = {}  # position -> new reshape nodes placed right after it
    folds: list[dict] = []
    touched: set[str] = set()  # views folded through: removal candidates
    type_of = {v.name: v for v in values}

    for i, n in enumerate(graph.nodes):
        if n.op != MATMUL or len(n.inputs) != 2 or any(v is None for v in n.inputs):
            continue
        ins = list(n.inputs)
        attr = n.attr_dict
        changed = False
        for slot in (0, 1):
            through = []
            while True:
                v = ins[slot]
                p = producers.get(v)
                if is_transpose(p):
                    ins[slot] = p.inputs[0]
                    through.append(p.name)
                    touched.add(p.name)
                elif is_leading_reshape(type_of, p) and is_transpose(producers.get(p.inputs[0])):
                    perm_node = producers[p.inputs[0]]
                    x = type_of[perm_node.inputs[0]]
                    lead = tuple(type_of[v].shape[:-2])
                    if lead == tuple(x.shape[:-2]):
                        ins[slot] = x.name
                    else:
                        out = fresh_name(vnames, f"{v}.untransposed")
                        values.append(Value(out, lead + tuple(x.shape[-2:]), x.dtype))
                        type_of[out] = values[-1]
                        r = Node(fresh_name(vnames, f"{p.name}.untransposed"), RESHAPE, (x.name,), (out,),
                                 {"shape": lead + tuple(x.shape[-2:])}, source=p.source)
                        added.setdefault(index[p.name], []).append(r)
                        producers[out] = r
                        ins[slot] = out
                    through += [p.name, perm_node.name]
                    touched.update((p.name, perm_node.name))
                else:
                    break
                attr[FLAGS[slot]] = not bool(attr.get(FLAGS[slot], False))
                changed = True
            if through:
                folds.append({"node": n.name, "operand": "ab"[slot], "through": tuple(through),
                              FLAGS[slot]: bool(attr.get(FLAGS[slot], False))})
        if changed:
            for k in FLAGS:
                if k in attr and not attr[k]:
                    del attr[k]  # an absent flag is false: keep the attributes canonical
            nodes[i] = attrs.evolve(n, inputs=tuple(ins), attrs=attr)
    if not folds:
        return graph, [], []

    out_nodes: list[Node] = []
    for i, n in enumerate(nodes):
        out_nodes.append(n)
        out_nodes.extend(added.get(i, ()))
    # Drop the folded views nobody reads any more (a removal can orphan the view before it).
    keep_values = set(graph.output_names())
    removed: list[str] = []
    while True:
        read = keep_values | {v for n in out_nodes for v in n.inputs if v is not None}
        dead = [n for n in out_nodes if n.name in touched and not any(o in read for o in n.outputs)]
        if not dead:
            break
        gone = {n.name for n in dead}
        removed += [n.name for n in dead]
        out_nodes = [n for n in out_nodes if n.name not in gone]
    live = {o for n in out_nodes for o in n.outputs} | set(graph.input_names())
    live |= {v.name for v in values if v.role == "const"}
    values = [v for v in values if v.name in live]
    return attrs.evolve(graph, values=values, nodes=out_nodes), folds, removed


def layouts_document(doc: Document) -> tuple[Document, dict[str, dict]]:
    """Every program folded; the report per program (``folds``, ``removed``)."""
    programs, report = [], {}
    for g in doc.graph.programs:
        g2, folds, removed = fold_layouts(g)
        programs.append(g2)
        if folds:
            report[g.name] = {"folds": tuple(folds), "removed": tuple(removed)}
    if not report:
        return doc, {}
    meta = dict(doc.graph.metadata)
    meta["schedule.matmul_layouts"] = {p: {"folds": len(r["folds"]), "removed": r["removed"]}
                                       for p, r in report.items()}
    graph = attrs.evolve(doc.graph, programs=programs, metadata=meta)
    return attrs.evolve(doc, graph=graph), report


def layouts_pass(doc: Document, **options):
    """Pass ``schedule.matmul_layouts`` (no options); the provenance detail counts the folds."""
    if options:
        raise TypeError(f"schedule.matmul_layouts takes no options, got {sorted(options)}")
    out, report = layouts_document(doc)
    if not report:
        return out, "nothing to fold"
    folds = sum(len(r["folds"]) for r in report.values())
    removed = sum(len(r["removed"]) for r in report.values())
    return attrs.evolve(out, schedule=None, memory=None, build=None), f"{folds} transpose(s) folded, {removed} removed"
