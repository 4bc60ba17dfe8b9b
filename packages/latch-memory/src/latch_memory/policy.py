"""The pass ``memory.policy``: the numerical policy as node attributes.

Default policy (TARGETS.md): FP32 master weights, gradients and optimizer state; BF16 operands for
matrix products and attention; FP32 accumulation. Values keep their captured dtypes (the policy
checks that float params, state and gradients are ``master``); what changes is how an op body
computes: ``operand_dtype`` (the precision operands are rounded to before the product) and
``accum_dtype`` (the precision sums are carried in). The FP64 reference ignores both; code
generation honours them (docs/CONTRACTS.md section 1).

The attributes are chosen per op class (tag) from a table, then overridden per op name, then per
node name, each level a mapping ``{"operand_dtype": dtype | None, "accum_dtype": dtype | None}``
(``None`` removes the attribute). When an op has several tagged classes, the first in table order
wins (so a ``matmul`` + ``routing`` op is a matmul).
"""

from __future__ import annotations

from typing import Any, Mapping

import attrs

from latch_core.document import Document
from latch_core.ir import DTYPES, FLOAT_DTYPES, Graph, GraphSection, Node
from latch_core.registry import Registry
from latch_core.errors import UserError

KEYS = ("operand_dtype", "accum_dtype")

DEFAULT_TABLE: dict[str, dict[str, str]] = {
    "matmul": {"operand_dtype": "bf16", "accum_dtype": "f32"},
    "attention": {"operand_dtype": "bf16", "accum_dtype": "f32"},
    "reduction": {"accum_dtype": "f32"},
    "norm": {"accum_dtype": "f32"},
    "indexing": {"accum_dtype": "f32"},  # index_add / scatter-add sum many rows into one
}
DEFAULT_MASTER = "f32"


class PolicyError(UserError, ValueError):
    pass


def _check_entry(where: str, entry: Any) -> dict[str, str | None]:
    if entry is None:
        return {k: None for k in KEYS}
    if not isinstance(entry, Mapping):
        raise PolicyError(f"memory.policy: {where} must be a mapping like {{'operand_dtype': 'bf16'}}, got {entry!r}")
    out = {}
    for k, v in entry.items():
        if k not in KEYS:
            raise PolicyError(f"memory.policy: {where} has key {k!r}; the policy sets only {list(KEYS)}")
        if v is not None and v not in DTYPES:
            raise PolicyError(f"memory.policy: {where}.{k} = {v!r} is not a dtype; known: {sorted(DTYPES)}")
        out[k] = v
    return out


def resolve_table(table: Mapping | None, known_tags: set[str]) -> dict[str, dict]:
    """The default table with the user's per-tag entries laid over it (``None`` drops a class)."""
    merged = {k: dict(v) for k, v in DEFAULT_TABLE.items()}
    for tag, entry in (table or {}).items():
        if tag not in known_tags:
            raise PolicyError(f"memory.policy: table names op class {tag!r}; known classes: {sorted(known_tags)}")
        if entry is None:
            merged.pop(tag, None)
        else:
            merged[tag] = {**merged.get(tag, {}), **_check_entry(f"table[{tag!r}]", entry)}
    return merged


def _known_tags() -> set[str]:
    from latch_core import registry as r

    return {r.ELEMENTWISE, r.REDUCTION, r.MATMUL, r.VIEW, r.COPY, r.INDEXING, r.ATTENTION, r.ROUTING,
            r.NORM, r.RANDOM, r.STRUCTURAL}


def _all_nodes(g: Graph):
    yield from g.nodes
    for r in g.regions:
        yield from _all_nodes(r)


REPEAT_OP = "latch::repeat"  # IR structure (a repeated region), not an op: its region's nodes get the policy


def node_policy(node: Node, ops: Registry, table: dict, op_over: dict, node_over: dict, prog: str) -> dict:
    if node.op == REPEAT_OP:
        return dict(node_over.get(node.name, {}))
    if node.op not in ops:
        src = f" (from {node.source})" if node.source else ""
        raise PolicyError(
            f"memory.policy: program {prog!r} node {node.name!r}{src} uses op {node.op!r}, which no installed "
            "plugin registers; install the plugin that provides it (the policy needs its op class)")
    tags = ops.get(node.op).tags
    chosen: dict = {}
    for tag, entry in table.items():
        if tag in tags:
            chosen = dict(entry)
            break
    chosen.update(op_over.get(node.op, {}))
    chosen.update(node_over.get(node.name, {}))
    return chosen


def _apply(g: Graph, ops, table, op_over, node_over, counts: dict) -> Graph:
    nodes = []
    for n in g.nodes:
        want = node_policy(n, ops, table, op_over, node_over, g.name)
        attr = n.attr_dict
        for k in KEYS:
            if k in want:
                if want[k] is None:
                    attr.pop(k, None)
                else:
                    attr[k] = want[k]
        for k in KEYS:
            if k in attr:
                counts[f"{k}={attr[k]}"] = counts.get(f"{k}={attr[k]}", 0) + 1
        nodes.append(n if attr == n.attr_dict else attrs.evolve(n, attrs=attr))
    regions = [_apply(r, ops, table, op_over, node_over, counts) for r in g.regions]
    return attrs.evolve(g, nodes=nodes, regions=regions)


def check_master(section: GraphSection, master: str) -> None:
    """Float params, state and gradient outputs must be held in the ``master`` dtype."""
    for prog in section.programs:
        grads = set()
        for grp in prog.outputs:
            if grp.name == "grads":
                grads.update(grp.values)
        for v in prog.values:
            if v.dtype in FLOAT_DTYPES and (v.role in ("param", "state") or v.name in grads) and v.dtype != master:
                what = "gradient" if v.name in grads else v.role
                raise PolicyError(
                    f"memory.policy: program {prog.name!r} {what} {v.name!r} is {v.dtype}, but the policy keeps "
                    f"master weights, gradients and optimizer state in {master}; capture the model in {master} "
                    "or pass master=None to keep the captured dtypes")


def apply_policy(section: GraphSection, ops: Registry, *, table: Mapping | None = None, ops_table: Mapping | None = None,
                 nodes: Mapping | None = None, master: str | None = DEFAULT_MASTER) -> tuple[GraphSection, dict]:
    """The policy applied to every program; returns the new section and a summary."""
    if master is not None:
        if master not in FLOAT_DTYPES:
            raise PolicyError(f"memory.policy: master={master!r} is not a float dtype; known: {sorted(FLOAT_DTYPES)}")
        check_master(section, master)
    merged = resolve_table(table, _known_tags())
    op_over = {}
    for op, entry in (ops_table or {}).items():
        if op not in ops:
            raise PolicyError(f"memory.policy: ops override names {op!r}, which no installed plugin registers")
        op_over[op] = _check_entry(f"ops[{op!r}]", entry)
    node_over = {k: _check_entry(f"nodes[{k!r}]", e) for k, e in (nodes or {}).items()}
    all_names = {n.name for p in section.programs for n in _all_nodes(p)}
    for k in node_over:
        if k not in all_names:
            raise PolicyError(f"memory.policy: nodes override names {k!r}, which is no node of any program")
    counts: dict[str, int] = {}
    programs = [_apply(p, ops, merged, op_over, node_over, counts) for p in section.programs]
    summary = {"master": master, "table": merged, "ops": op_over, "nodes": node_over, "counts": counts}
    meta = dict(section.metadata)
    meta["memory.policy"] = summary
    return attrs.evolve(section, programs=programs, metadata=meta), summary


def policy_pass(doc: Document, *, table=None, ops=None, nodes=None, master=DEFAULT_MASTER, registry=None) -> Document:
    """Pass ``memory.policy``. ``registry``: an op registry (default: the installed plugins')."""
    if registry is None:
        from latch_core.plugins import registries

        registry = registries().ops
    section, _ = apply_policy(doc.graph, registry, table=table, ops_table=ops, nodes=nodes, master=master)
    return attrs.evolve(doc, graph=section)
