"""One graph rewrite two passes share: an ``add`` of an op's result folded into the op as its base.

``add(op(a, b), G)`` -> ``op(a, b, G)`` where the op node has ``arity`` inputs (no base yet), nothing
else reads its result, no program output names it, and ``G`` has the result's type (no broadcast).
The op node moves to the add's place (after G's producer) and takes the add's output. Used by
``ops.embedding_grad_sum`` (a tied embedding's two gradients) and ``moe.fixed_order_scatters``
(the residual stream's gradient into ``gather_sum``). No torch.
"""

from __future__ import annotations

import attrs

from latch_core.ir import Graph

ADD = "latch::add"


def fold_adds(g: Graph, op: str, arity: int) -> tuple[Graph, int]:
    """(new graph, adds folded) for one program."""
    producers = {o: n for n in g.nodes for o in n.outputs}
    readers: dict[str, int] = {}
    for n in g.nodes:
        for i in n.inputs:
            if i is not None:
                readers[i] = readers.get(i, 0) + 1
    outputs = set(g.output_names())

    def folds(n):
        """(G, the op node) when ``n`` is an add this rewrite folds."""
        if n.op != ADD or len(n.inputs) != 2 or len(n.outputs) != 1 or n.attrs:
            return None
        out = g.value(n.outputs[0])
        for mine, other in ((0, 1), (1, 0)):
            e = producers.get(n.inputs[mine])
            G = n.inputs[other]
            if (e is None or e.op != op or len(e.inputs) != arity or readers.get(e.outputs[0]) != 1
                    or e.outputs[0] in outputs or G == e.outputs[0]):
                continue
            if g.value(e.outputs[0]).type == out.type == g.value(G).type:
                return G, e
        return None

    found = {n.name: f for n in g.nodes if (f := folds(n)) is not None}
    if not found:
        return g, 0
    moved = {e.name for _, e in found.values()}
    dead = {e.outputs[0] for _, e in found.values()}
    nodes = []
    for n in g.nodes:
        if n.name in moved:
            continue  # re-emitted where its add was: after G's producer too
        if n.name in found:
            G, e = found[n.name]
            nodes.append(attrs.evolve(e, inputs=tuple(e.inputs) + (G,), outputs=n.outputs))
        else:
            nodes.append(n)
    values = [v for v in g.values if v.name not in dead]
    return attrs.evolve(g, values=values, nodes=nodes), len(found)
