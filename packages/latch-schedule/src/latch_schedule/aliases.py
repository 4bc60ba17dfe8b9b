"""The pass ``schedule.alias_views``: one copy of each contiguous view per reader.

A view whose output is a contiguous byte range of its operand (``latch_core.aliasing``) costs
nothing when it folds into the group that reads it: into an elementwise group as an index map
(fusion's view rule, as before), into any other group as its *alias prefix* (the body reads the
view's output at the operand's placement plus the byte offset; :mod:`latch_schedule.fusion`). A
node can join only one group, so a view read by several nodes (the reshape of a product's output
read by SwiGLU's forward and by its backward; the q/k/v selects read by the attention and its
backward) stayed a copy task of its own, writing a second copy of the bytes every reader then
read. This pass gives every reading node its own copy of the view node (``<node>.a<k>``, output
``<value>.a<k>``, placed right after the original), so each folds into its reader; views of views
are handled readers first, so a chain is cloned along its whole length. The clones compute the
same op on the same operand: the program's semantics and the FP64 reference are unchanged.

Only views :func:`latch_core.aliasing.alias_byte_offset` accepts are cloned (contiguous, offset a
multiple of 256 bytes), never one whose output is a program output. Graph metadata
``schedule.alias_views``: per program, the views cloned and the clones made. Pure; a changed graph
drops any schedule, memory plan and build.
"""

from __future__ import annotations

import attrs

from latch_core.aliasing import alias_byte_offset
from latch_core.document import Document
from latch_core.ir import Graph, Node, fresh_name


class _Values:
    """``.value(name)`` over a dict (what :func:`alias_byte_offset` asks of a graph)."""

    def __init__(self, values: dict):
        self.values = values

    def value(self, name: str):
        return self.values[name]


def clone_views(graph: Graph) -> tuple[Graph, dict]:
    """``graph`` with each multi-reader contiguous view cloned per reading node, and a report."""
    outputs = set(graph.output_names())
    values = {v.name: v for v in graph.values}
    lookup = _Values(values)
    by_name = {n.name: n for n in graph.nodes}
    names = set(by_name) | set(values)
    readers: dict[str, list[str]] = {}
    for n in graph.nodes:
        for x in dict.fromkeys(v for v in n.inputs if v is not None):
            readers.setdefault(x, []).append(n.name)
    after: dict[str, list[Node]] = {}
    cloned, made = [], 0
    for n in reversed(graph.nodes):  # readers first: a view of a view is cloned whole
        if len(n.outputs) != 1 or n.outputs[0] in outputs or alias_byte_offset(n, lookup) is None:
            continue
        o = n.outputs[0]
        rs = readers.get(o, [])
        if len(rs) < 2:
            continue
        x = next(v for v in n.inputs if v is not None)
        clones = []
        for k, rname in enumerate(rs[1:], start=1):
            v = fresh_name(names, f"{o}.a{k}")
            values[v] = attrs.evolve(values[o], name=v)
            c = attrs.evolve(n, name=fresh_name(names, f"{n.name}.a{k}"), outputs=(v,))
            r = by_name[rname]
            by_name[rname] = attrs.evolve(r, inputs=tuple(v if y == o else y for y in r.inputs))
            readers[v] = [rname]
            clones.append(c)
            by_name[c.name] = c
        readers[o] = rs[:1]
        readers[x] = readers.get(x, []) + [c.name for c in clones]
        after[n.name] = clones
        cloned.append(n.name)
        made += len(clones)
    if not cloned:
        return graph, {}
    nodes = []
    for n in graph.nodes:
        nodes.append(by_name[n.name])
        nodes.extend(by_name[c.name] for c in after.get(n.name, ()))
    return attrs.evolve(graph, values=tuple(values.values()), nodes=tuple(nodes)), \
        {"views": len(cloned), "clones": made}


def alias_views_pass(doc: Document, **options):
    """Pass ``schedule.alias_views`` (no options); the provenance detail counts the clones."""
    if options:
        raise TypeError(f"schedule.alias_views takes no options, got {sorted(options)}")
    programs, report = [], {}
    for g in doc.graph.programs:
        g2, r = clone_views(g)
        programs.append(g2)
        if r:
            report[g.name] = r
    if not report:
        return doc, "no view read by several nodes"
    meta = dict(doc.graph.metadata)
    meta["schedule.alias_views"] = report
    graph = attrs.evolve(doc.graph, programs=programs, metadata=meta)
    n = sum(r["clones"] for r in report.values())
    v = sum(r["views"] for r in report.values())
    return attrs.evolve(doc, graph=graph, schedule=None, memory=None, build=None), \
        f"{v} contiguous view(s) cloned per reader ({n} clones)"
