"""Fusion: which graph nodes one op body computes together.

Rule (conservative on purpose; switch off with ``fuse=False``): an elementwise/copy node whose only
output has exactly one consumer node, that consumer also elementwise/copy with an output of the
same shape, and the value not a program output, joins its consumer's group. Groups are therefore
in-trees of elementwise nodes whose internal values never reach memory; every group is convex
(an internal value has no consumer outside), so a group can run at its last node's position.

Every group gets a body signature key: a hash of its nodes' ops, attributes, operand/result types
and internal wiring (group inputs numbered by first use). Groups with equal keys share one body.
"""

from __future__ import annotations

import hashlib
from typing import Sequence

import attrs

from latch_core.ir import Graph, Node
from latch_core.registry import COPY, ELEMENTWISE, OpSpec, Registry

POINTWISE_TAGS = frozenset({ELEMENTWISE, COPY})


@attrs.frozen
class GroupPlan:
    nodes: tuple[Node, ...] = attrs.field(converter=tuple)  # graph order
    inputs: tuple[str, ...] = attrs.field(converter=tuple)  # crossing in, by first use
    outputs: tuple[str, ...] = attrs.field(converter=tuple)  # written to memory
    internal: frozenset[str] = attrs.field(converter=frozenset)  # never reach memory
    primary: str
    body: str
    pointwise: bool  # every node elementwise/copy: output element i needs operand elements at i only


def _spec(ops: Registry | None, op: str) -> OpSpec | None:
    if ops is not None and op in ops:
        return ops.get(op)
    return None


def is_pointwise(spec: OpSpec | None) -> bool:
    return spec is not None and bool(spec.tags & POINTWISE_TAGS)


def body_key(graph: Graph, nodes: Sequence[Node], inputs: Sequence[str]) -> str:
    """Signature of the computation, independent of value names."""
    ref: dict[str, str] = {v: f"in{i}:{graph.value(v).type}" for i, v in enumerate(inputs)}
    parts = []
    for j, n in enumerate(nodes):
        args = ",".join("_" if i is None else ref.get(i, f"?{i}") for i in n.inputs)
        outs = ",".join(str(graph.value(o).type) for o in n.outputs)
        parts.append(f"{n.op}({args}){n.attrs!r}->{outs}")
        for k, o in enumerate(n.outputs):
            ref[o] = f"n{j}.{k}"
    text = ";".join(parts)
    digest = hashlib.sha1(text.encode()).hexdigest()[:16]
    names = "+".join(n.op.split("::")[-1] for n in nodes)
    if len(names) > 48:
        names = names[:45] + "..."
    return f"{names}/{digest}"


def fuse(graph: Graph, ops: Registry | None, enabled: bool = True) -> list[GroupPlan]:
    """Groups of ``graph``'s nodes, in an order that is topological for the groups."""
    nodes = graph.nodes
    index = {n.name: i for i, n in enumerate(nodes)}
    consumers: dict[str, list[int]] = {}
    for i, n in enumerate(nodes):
        for v in n.inputs:
            if v is not None:
                lst = consumers.setdefault(v, [])
                if not lst or lst[-1] != i:
                    lst.append(i)
    program_outputs = set(graph.output_names())
    pointwise = [is_pointwise(_spec(ops, n.op)) for n in nodes]

    parent = list(range(len(nodes)))  # union-find: merge a node into its consumer

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    internal: set[str] = set()
    if enabled:
        for i, n in enumerate(nodes):
            if not pointwise[i] or len(n.outputs) != 1:
                continue
            o = n.outputs[0]
            cs = consumers.get(o, [])
            if len(cs) != 1 or o in program_outputs:
                continue
            c = cs[0]
            cn = nodes[c]
            if not pointwise[c] or len(cn.outputs) != 1:
                continue
            if graph.value(cn.outputs[0]).shape != graph.value(o).shape:
                continue
            parent[find(i)] = find(c)
            internal.add(o)

    members: dict[int, list[int]] = {}
    for i in range(len(nodes)):
        members.setdefault(find(i), []).append(i)
    # A group runs at its last node; ordering groups by that node keeps them topological.
    order = sorted(members.values(), key=lambda m: m[-1])
    plans = []
    for m in order:
        gnodes = [nodes[i] for i in m]
        produced = {o for n in gnodes for o in n.outputs}
        ins: list[str] = []
        seen = set()
        for n in gnodes:
            for v in n.inputs:
                if v is None or v in produced or v in seen:
                    continue
                seen.add(v)
                ins.append(v)
        outs = [o for n in gnodes for o in n.outputs if o not in internal]
        tail = gnodes[-1]
        plans.append(GroupPlan(
            nodes=gnodes, inputs=ins, outputs=outs, internal=produced & internal,
            primary=tail.outputs[0] if tail.outputs else "",
            body=body_key(graph, gnodes, ins),
            pointwise=all(pointwise[i] for i in m),
        ))
    return plans
