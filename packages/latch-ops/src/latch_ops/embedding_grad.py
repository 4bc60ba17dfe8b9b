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

from .fold import fold_adds

EMB_BWD = "latch::embedding_backward"


def rewrite(g: Graph) -> tuple[Graph, int]:
    """(new graph, adds folded) for one program."""
    return fold_adds(g, EMB_BWD, 2)


def embedding_grad_sum_pass(doc: Document, **_options) -> tuple[Document, str]:
    programs, count = [], 0
    for p in doc.graph.programs:
        p2, c = rewrite(p)
        programs.append(p2)
        count += c
    return (attrs.evolve(doc, graph=attrs.evolve(doc.graph, programs=programs)),
            f"{count} tied-embedding gradient sum(s) folded into the embedding backward")
