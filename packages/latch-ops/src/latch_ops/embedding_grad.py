"""Pass ``ops.embedding_grad_sum``: a tied embedding's two gradients summed by the embedding backward.

A weight both looked up (``embedding``) and multiplied (the LM head of a tied model) gets two
gradients that autograd adds: ``add(G, embedding_backward(g, idx))``, G the head's weight-gradient
product. As two ops that is a whole-table pass to write the backward's mostly-zero dW and another
that reads G and dW and writes the sum: TinyMoE-200M's 49,152 x 768 table, run 32, ~110 us and
~140 us, each its own phase. ``embedding_backward(g, idx, G)`` starts every tile from G's rows
instead of zeros and adds the rows idx names in index order (deterministic, no atomics), so the sum
costs one read of G and one write: the add and its phase are gone.

Rewritten: an ``add`` of two same-typed operands (no broadcast) where one is the output of a
two-input ``embedding_backward`` that nothing else reads and no program output names. Anything
else is left alone. The sum's association changes from G + (g1 + g2 + ...) to ((G + g1) + g2) + ...,
within the gates' FP64 comparison; the bits are the same on every run. No torch.
"""

from __future__ import annotations

import attrs

from latch_core.document import Document
from latch_core.ir import Graph

EMB_BWD, ADD = "latch::embedding_backward", "latch::add"


def rewrite(g: Graph) -> tuple[Graph, int]:
    """(new graph, adds folded) for one program."""
    producers = {o: n for n in g.nodes for o in n.outputs}
    readers: dict[str, int] = {}
    for n in g.nodes:
        for i in n.inputs:
            if i is not None:
                readers[i] = readers.get(i, 0) + 1
    outputs = set(g.output_names())

    def folds(n) -> tuple[str, object] | None:
        """(G, the embedding_backward node) when ``n`` is an add this pass folds."""
        if n.op != ADD or len(n.inputs) != 2 or len(n.outputs) != 1 or n.attrs:
            return None
        out = g.value(n.outputs[0])
        for mine, other in ((0, 1), (1, 0)):
            e = producers.get(n.inputs[mine])
            G = n.inputs[other]
            if (e is None or e.op != EMB_BWD or len(e.inputs) != 2 or readers.get(e.outputs[0]) != 1
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
            nodes.append(attrs.evolve(e, inputs=(e.inputs[0], e.inputs[1], G), outputs=n.outputs))
        else:
            nodes.append(n)
    values = [v for v in g.values if v.name not in dead]
    return attrs.evolve(g, values=values, nodes=nodes), len(found)


def embedding_grad_sum_pass(doc: Document, **_options) -> tuple[Document, str]:
    programs, count = [], 0
    for p in doc.graph.programs:
        p2, c = rewrite(p)
        programs.append(p2)
        count += c
    return (attrs.evolve(doc, graph=attrs.evolve(doc.graph, programs=programs)),
            f"{count} tied-embedding gradient sum(s) folded into the embedding backward")
