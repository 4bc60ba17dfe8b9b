"""What a document says about how to check it, read without torch: its numerical policy and
whether its programs output routing decisions."""

from __future__ import annotations

from latch_core.document import Document


def policy_of(doc: Document) -> str:
    """"bf16" when any node computes with half-precision operands, else "f32"."""
    for g in doc.graph.programs:
        for n in g.nodes:
            if n.attr("operand_dtype") in ("bf16", "f16"):
                return "bf16"
    return "f32"


def has_routing(graph) -> bool:
    """Whether ``graph`` outputs its routing decisions (group ``routing``)."""
    return any(g.name == "routing" for g in graph.outputs)
