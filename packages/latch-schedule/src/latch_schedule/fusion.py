"""Fusion: which graph nodes one op body computes together.

Rule (conservative on purpose; switch off with ``fuse=False``): a node joins the group of its
consumers when every node consuming its only output is in that one group, and each such edge is
one of
- elementwise -> elementwise with the same output shape (no recomputation of broadcast operands);
- view -> elementwise or view (the consumer reads through the view's index map: the view never
  materialises);
- elementwise -> injective view (reshape, permute, slice, select; not expand, which would
  recompute the producer for every copy).
- elementwise -> a reduction (sum, mean, amax, amin, prod; ``PROLOGUE_REDUCTIONS``) of that value
  alone, when the reduction is its group's sink: the prologue is computed as the reduction reads
  it (``sum(g * g)`` of the global-norm clip, RMSNorm's ``mean(x ** 2)``), so the squares never
  reach memory; each input element feeds exactly one output element, so nothing is recomputed.
  Producers of the prologue join it by the rules above (a view too: the body then decodes the
  flat index into coordinates). The prologue's values are never group outputs.
A value that is also a program output (an optimizer's new moment, used again to update the
weight) may still join: it stays a group output, written at the tile's index, so it must have the
shape of the group's primary output. Groups thus have one sink (the last node, whose first output
is the primary); other values never reach memory unless they are program outputs; every group is
convex (nothing leaves it except through the sink or as a program output), so a group can run at
its last node's position. The code generator's fused body generator computes such a
group element by element over the tile (latch-codegen-h100 ``fuse.py``).

Sibling fusion: a pointwise node that would be a group of its own (a ``latch::cast`` storing the
BF16 copy of a value the policy feeds to matmuls, typically) and whose only input is produced by
the sink of an elementwise group G (every node pointwise or a fusable view, at least one
pointwise), at G's primary shape, joins G as an extra group output even though that input has
other consumers: the body that computes the f32 value also writes its BF16 copy, instead of a
second pass reading it back. The joined node reads only G's sink, which runs before it, and
nothing of G depends on it, so G stays convex and runs where its sink ran; it becomes the group's
last node (its output the primary, of the same shape), and every output still has the primary's
shape, as the fused generator requires.

Horizontal fusion: two pointwise groups (every node pointwise, every value of one shape) that read
a common input of that shape merge into one, so the input is read once (SwiGLU's backward computes
both input gradients from ``do`` and ``a``): the earlier group joins the later, and the merged
group runs where the later one's sink ran. That is legal when no group outside the two reads an
output of the earlier one before that position (groups run in the order of their sinks): then
nothing between the two positions needs the moved values, no path leaves the merged group and
comes back (such a path would pass through a group in between), and every input of the earlier
group exists earlier still. Its outputs stay outputs (the later sink is the primary; the moved
sink's output is written at the tile's index like a sibling's, having the primary's shape), except
a value all of whose readers are now in the group, which becomes internal. A merged group is
bounded to ``HORIZONTAL_MAX_NODES`` nodes.

Producer fusion into the first reader: a pointwise group P (every node pointwise, every value
of one shape) whose outputs are read by several groups joins the earliest of them, L, when L is a
pointwise group of the same shape and every other reader runs after L (TinyMoE's expert
activation: ``silu(gate)`` is read by the SwiGLU product ``silu * up`` and again by the backward;
it was a phase of its own, its output written and read back by the next phase). P's values read
outside L stay group outputs, written at the tile's index (they have L's primary shape); P then
runs where L's sink runs, which no reader precedes, and its inputs exist earlier still. A merged
group is bounded to ``HORIZONTAL_MAX_NODES`` nodes.

Alias prefixes (option ``alias_views``; issue 11): a view whose output is a contiguous byte range
of its operand (``latch_core.aliasing``: a reshape, a leading-dims select or slice, a permute or
expand of size-1 dims only; the offset a multiple of 256 bytes) and that is not a program output
joins the group of its readers when none of them is pointwise, a fusable view or a fused concat (a
matmul, the attention, a norm, a reduction, ...), or every reader is such a view itself: it is an
address, not a computation. The group's body reads the view's output at the operand's placement
plus the byte offset (latch-codegen-h100 strips the prefix with the same rule,
``latch_core.aliasing.alias_prefixes``), the footprint maps the tile's reads through the view's
index map onto the operand, so dependencies, liveness and the hazard proof see the real bytes read,
and the view is no copy task of its own. Nothing else may join a prefix (the operand's producer
stays outside). A view read by several groups is cloned per reader first (the pass
``schedule.alias_views``, :mod:`latch_schedule.aliases`).

Concatenation (option ``concat``, on by default; issue 11): ``latch::concat`` (along one dim,
each operand a distinct value) takes part in the rule above like an elementwise node whose
operands cover disjoint regions of its output:
- pointwise, fusable view or concat -> concat: an operand joins the concat's group when every
  reader of it is in that group. Element j of the operand feeds exactly one output element (the
  one at j plus the operand's offset along the dim), so nothing is recomputed; the body computes,
  per output element, only the branch whose region holds it (the code generator's puller branches
  on the coordinate: latch-codegen-h100 ``fuse.py``), so no operand is evaluated outside its region.
- concat -> pointwise of the concat's shape, or -> injective view (RoPE's rotated q cast to BF16;
  d(qkv) stacked from dq, dk, dv and permuted back to the product's layout): the consumer pulls
  each element of the concat once, as from any elementwise node. Never into a reduction's prologue
  (the reduction body reads flat elements; it does not branch).
An operand that is a program output does not join (it would be written at the tile's index, which
is not its own), and a concat that is one stays a sink. Convexity is the rule's: a node joins only
when every reader is already in the one group, decided in reverse graph order. A group holding a
concat is not ``pointwise``, so sibling and horizontal fusion leave it alone, and row groups refuse
it (``rowgroups.row_group_ok``). Its footprint is the tiling's: the concat's tiling maps the tile
to each operand's region (an empty box where the tile misses it), and that box propagates to the
operand's producers, so the hazard proof sees exactly the bytes the branches read.

Row groups (option ``row_groups``; issue 11): after the rules above, a row reduction over the
innermost dim, the pointwise chain on its ``(T, 1)`` statistic and the broadcast consumer at the
rows' shape merge into one group whose tasks cover whole rows (RMSNorm forward and backward,
LayerNorm); a statistic read outside stays an output of shape ``(T, 1)``. The rule, its legality
argument and the value classes the row body needs are in :mod:`latch_schedule.rowgroups`. Sibling
and horizontal fusion leave row groups alone (they hold a reduction).

Every group gets a body signature key: a hash of its nodes' ops, attributes, operand/result types
and internal wiring (group inputs numbered by first use). Groups with equal keys share one body.
"""

from __future__ import annotations

import hashlib
from typing import Sequence

import attrs

from latch_core.aliasing import alias_byte_offset
from latch_core.ir import Graph, Node
from latch_core.registry import COPY, ELEMENTWISE, VIEW, OpSpec, Registry

POINTWISE_TAGS = frozenset({ELEMENTWISE, COPY})
# Views fusion may fold into their consumer (each has an exact index map, latch_schedule.tiling_ops).
FUSABLE_VIEWS = frozenset({"latch::reshape", "latch::permute", "latch::expand", "latch::slice", "latch::select"})
INJECTIVE_VIEWS = FUSABLE_VIEWS - {"latch::expand"}
# Reductions that take a fused elementwise prologue (the code generator's ``load(i)`` computes it:
# latch-codegen-h100 ``flat.reduce_body``; its PROLOGUE_REDUCTIONS must list the same ops).
PROLOGUE_REDUCTIONS = frozenset({"latch::sum", "latch::mean", "latch::amax", "latch::amin", "latch::prod"})
# Concatenation fused with its producers and consumers (module docstring, "Concatenation"); the
# code generator's puller evaluates it by branching on the output coordinate (latch-codegen-h100
# fuse.py).
CONCAT = "latch::concat"


@attrs.frozen
class GroupPlan:
    nodes: tuple[Node, ...] = attrs.field(converter=tuple)  # graph order
    inputs: tuple[str, ...] = attrs.field(converter=tuple)  # crossing in, by first use
    outputs: tuple[str, ...] = attrs.field(converter=tuple)  # written to memory
    internal: frozenset[str] = attrs.field(converter=frozenset)  # never reach memory
    primary: str
    body: str
    pointwise: bool  # every node elementwise/copy: output element i needs operand elements at i only
    pointwise_nodes: frozenset[str] = attrs.field(default=frozenset(), converter=frozenset)  # by name
    # a row group's row length (latch_schedule.rowgroups): its tasks cover whole rows; 0 otherwise
    row: int = 0
    # nodes whose op starts each output element from the same element of one input and adds to it
    # (OpSpec.extra["accumulates_into"]: embedding_backward onto its base), with that input's index
    onto: tuple[tuple[str, int], ...] = attrs.field(default=(), converter=lambda x: tuple(sorted(dict(x).items())))

    def inplace_safe(self, graph: Graph, old: str, new: str) -> bool:
        """May one task of this group read ``old`` and write ``new`` over the same bytes?

        Yes when ``new`` has ``old``'s type and everything in the group computed from ``old`` is
        pointwise at ``new``'s shape: element i of ``new`` then needs element i of ``old`` only,
        which the body reads before it writes element i. Views elsewhere in the group (on other
        operands) do not matter; a view, broadcast or reduction on the path from ``old`` does."""
        if not graph.has_value(old) or not graph.has_value(new) or graph.value(old).type != graph.value(new).type:
            return False
        shape = graph.value(new).shape
        tainted = {old}
        reached_new = False
        onto = dict(self.onto)
        for n in self.nodes:  # graph order: producers before consumers
            if not any(v in tainted for v in n.inputs if v is not None):
                continue
            j = onto.get(n.name)
            accumulates = j is not None and j < len(n.inputs) and n.inputs[j] in tainted and \
                not any(v in tainted for k, v in enumerate(n.inputs) if k != j and v is not None)
            if (n.name not in self.pointwise_nodes and not accumulates) or \
                    any(graph.value(o).shape != shape for o in n.outputs):
                return False
            tainted.update(n.outputs)
            reached_new = reached_new or new in n.outputs
        return reached_new


def _spec(ops: Registry | None, op: str) -> OpSpec | None:
    if ops is not None and op in ops:
        return ops.get(op)
    return None


def is_pointwise(spec: OpSpec | None) -> bool:
    return spec is not None and bool(spec.tags & POINTWISE_TAGS)


def accumulates_into(spec: OpSpec | None) -> int | None:
    """The input an op starts each output element from (and only adds to), or None."""
    return None if spec is None else spec.extra.get("accumulates_into")


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


def _siblings(graph: Graph, nodes, pointwise, view, find, parent, consumers, internal: set[str]) -> int:
    """Sibling fusion (module docstring): a pointwise node alone in its group whose only input is
    the output of an elementwise group's sink, at the group's primary shape, joins that group as
    an extra output. A sink output whose readers all joined becomes internal (unless it is a
    program output). Returns how many joined."""
    producer = {o: i for i, n in enumerate(nodes) for o in n.outputs}
    outputs = set(graph.output_names())
    size: dict[int, int] = {}
    for i in range(len(nodes)):
        r = find(i)
        size[r] = size.get(r, 0) + 1
    elementwise: dict[int, bool] = {}  # group root -> every member pointwise or a fusable view, one pointwise
    for i in range(len(nodes)):
        r = find(i)
        ok = pointwise[i] or view[i]
        elementwise[r] = elementwise.get(r, True) and ok
    has_pointwise = {find(i) for i in range(len(nodes)) if pointwise[i]}
    joined = 0
    for i, n in enumerate(nodes):
        if not pointwise[i] or len(n.outputs) != 1 or find(i) != i or size.get(i, 1) != 1:
            continue
        ins = {v for v in n.inputs if v is not None}
        if len(ins) != 1:
            continue
        p = producer.get(next(iter(ins)))
        if p is None:
            continue
        root = find(p)
        if root == i or not elementwise.get(root) or root not in has_pointwise:
            continue
        if graph.value(n.outputs[0]).shape != graph.value(nodes[root].outputs[0]).shape:
            continue
        if graph.value(nodes[p].outputs[0]).shape != graph.value(nodes[root].outputs[0]).shape:
            continue
        parent[i] = root
        size[root] += 1
        joined += 1
        x = nodes[p].outputs[0]
        if x not in outputs and all(find(c) == root for c in consumers.get(x, [])):
            internal.add(x)
    return joined


HORIZONTAL_MAX_NODES = 64  # a merged body's size bound (code size, registers)


def _into_first_reader(graph: Graph, nodes, pointwise, find, parent, consumers, internal: set[str]) -> int:
    """Producer fusion into the first reader (module docstring). Returns how many groups joined."""
    def groups():
        members: dict[int, list[int]] = {}
        for i in range(len(nodes)):
            members.setdefault(find(i), []).append(i)
        return members

    def flat(m) -> tuple | None:  # the one shape of a pointwise group's values, else None
        if not all(pointwise[i] and len(nodes[i].outputs) == 1 for i in m):
            return None
        shape = graph.value(nodes[m[-1]].outputs[0]).shape
        if not shape or any(graph.value(nodes[i].outputs[0]).shape != shape for i in m):
            return None
        return shape

    members = groups()
    outputs = set(graph.output_names())
    joined = 0
    for r in sorted(members):
        m = members.get(r)
        if m is None or find(r) != r:
            continue
        shape = flat(m)
        if shape is None:
            continue
        readers = sorted({find(c) for i in m for c in consumers.get(nodes[i].outputs[0], []) if find(c) != r})
        if len(readers) < 2:
            continue  # one reader: the main rule's case (it did not fuse, for its own reasons)
        late = readers[0]
        ml = members[late]
        if flat(ml) != shape or len(m) + len(ml) > HORIZONTAL_MAX_NODES:
            continue
        parent[r] = late
        members[late] = ml + m
        del members[r]
        for i in members[late]:
            o = nodes[i].outputs[0]
            if o not in outputs and all(find(c) == late for c in consumers.get(o, [])):
                internal.add(o)
        joined += 1
    return joined



def _horizontal(graph: Graph, nodes, pointwise, find, parent, consumers, internal: set[str]) -> int:
    """Horizontal fusion (module docstring): pointwise groups of one shape that read a common input
    of that shape merge, the earlier into the later, when nothing outside both reads the earlier
    one's outputs before the later one runs. Returns how many groups merged."""
    members: dict[int, list[int]] = {}
    for i in range(len(nodes)):
        members.setdefault(find(i), []).append(i)
    info: dict[int, tuple] = {}  # root -> (shape, full-shape inputs)
    for r, m in members.items():
        if not all(pointwise[i] and len(nodes[i].outputs) == 1 for i in m):
            continue
        shape = graph.value(nodes[r].outputs[0]).shape
        if not shape or any(graph.value(nodes[i].outputs[0]).shape != shape for i in m):
            continue
        made = {nodes[i].outputs[0] for i in m}
        ins = {v for i in m for v in nodes[i].inputs if v is not None and v not in made
               and graph.value(v).shape == shape}
        if ins:
            info[r] = (shape, ins)
    readers: dict[str, list[int]] = {}
    for r in sorted(info):
        for v in info[r][1]:
            readers.setdefault(v, []).append(r)
    merged = 0
    for v in sorted(readers):
        roots = readers[v]
        for a, b in zip(roots, roots[1:]):
            ra, rb = find(a), find(b)
            if ra == rb or ra not in info or rb not in info or info[ra][0] != info[rb][0]:
                continue
            early, late = min(ra, rb), max(ra, rb)
            ma, mb = members[early], members[late]
            if len(ma) + len(mb) > HORIZONTAL_MAX_NODES:
                continue
            # the merged group runs at the later sink: every reader of the earlier group's values
            # outside both groups must come after it (groups run in the order of their sinks)
            ok = True
            for i in ma:
                for c in consumers.get(nodes[i].outputs[0], []):
                    rc = find(c)
                    if rc != early and rc != late and rc < late:
                        ok = False
                        break
                if not ok:
                    break
            if not ok:
                continue
            parent[early] = late
            members[late] = mb + ma
            del members[early]
            # a value every reader of which is now in the group never reaches memory
            outputs = set(graph.output_names())
            for i in members[late]:
                o = nodes[i].outputs[0]
                if o not in outputs and all(find(c) == late for c in consumers.get(o, [])):
                    internal.add(o)
            info[late] = (info[late][0], info[late][1] | info.pop(early)[1])
            merged += 1
    return merged


def fuse(graph: Graph, ops: Registry | None, enabled: bool = True,
         prologue_ops: frozenset[str] = PROLOGUE_REDUCTIONS, alias_views: bool = False,
         row_groups: bool = False, concat: bool = True) -> list[GroupPlan]:
    """Groups of ``graph``'s nodes, in an order that is topological for the groups. ``prologue_ops``:
    the reductions that take an elementwise prologue (empty: none do). ``alias_views``: contiguous
    views join the group that reads them as its alias prefix (module docstring). ``row_groups``:
    a row reduction, the chain on its statistic and their broadcast consumer form one row group
    (:mod:`latch_schedule.rowgroups`)."""
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
    specs = [_spec(ops, n.op) for n in nodes]
    pointwise = [is_pointwise(s) for s in specs]
    view = [s is not None and VIEW in s.tags and not pointwise[i] and n.op in FUSABLE_VIEWS
            for i, (s, n) in enumerate(zip(specs, nodes))]
    cat = [concat and s is not None and n.op == CONCAT and isinstance(n.attr_dict.get("dim"), int)
           and len(set(v for v in n.inputs if v is not None)) == len([v for v in n.inputs if v is not None])
           for s, n in zip(specs, nodes)]

    parent = list(range(len(nodes)))  # union-find: merge a node into its consumer

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    internal: set[str] = set()
    prefix: set[int] = set()  # alias-prefix views (latch_core.aliasing.alias_prefixes)
    if enabled:
        # Reverse graph order: when a node is considered, all its consumers already sit in their
        # final groups, and it joins one only if every consumer is in that one group. Each group
        # thus keeps a single sink (its root), and nothing leaves it except through the sink or
        # as a program output, so groups stay convex.
        for i in range(len(nodes) - 1, -1, -1):
            n = nodes[i]
            if not (pointwise[i] or view[i] or cat[i]) or len(n.outputs) != 1:
                continue
            o = n.outputs[0]
            cs = consumers.get(o, [])
            if not cs:
                continue
            root = find(cs[0])
            if any(find(c) != root for c in cs):
                continue
            shape = graph.value(o).shape
            if not cat[i] and alias_views and o not in program_outputs and alias_byte_offset(n, graph) is not None and all(
                    c in prefix or not (pointwise[c] or view[c] or cat[c]) for c in cs):
                parent[i] = root  # an address, not a computation: the reader's body reads o in place
                internal.add(o)
                prefix.add(i)
                continue
            if any(c in prefix for c in cs):
                continue  # only another contiguous view may join an alias prefix
            ok = True
            prologue = False
            for c in cs:
                cn = nodes[c]
                if len(cn.outputs) != 1:
                    ok = False
                elif cat[c]:
                    # a concat's operand: each of its elements feeds one output element (the
                    # operand appears once, cat[] checks), so nothing is recomputed
                    ok = pointwise[i] or view[i] or cat[i]
                elif cat[i]:
                    # a concat into an elementwise consumer of its shape or an injective view:
                    # the consumer pulls each concat element once (never into a reduction's
                    # prologue: the reduction body reads flat elements, it does not branch)
                    ok = ((pointwise[c] and graph.value(cn.outputs[0]).shape == shape)
                          or (view[c] and cn.op in INJECTIVE_VIEWS)) and nodes[root].op not in prologue_ops
                elif pointwise[i] and pointwise[c]:
                    ok = graph.value(cn.outputs[0]).shape == shape
                elif pointwise[i] and cn.op in prologue_ops:
                    # the reduction's prologue: its input computed as it is read (module docstring)
                    ok = find(c) == c and len([v for v in cn.inputs if v is not None]) == 1
                    prologue = True
                elif pointwise[i]:
                    ok = view[c] and cn.op in INJECTIVE_VIEWS
                else:
                    ok = pointwise[c] or view[c]
                if not ok:
                    break
            if not ok:
                continue
            if prologue and o in program_outputs:
                continue  # a reduction's body writes only the reduction's result
            if o in program_outputs:
                # it stays a group output: the body writes it at the tile's index, so it must
                # have the shape of the group's primary output
                if (not pointwise[i] or any(cat[c] for c in cs) or graph.value(nodes[root].outputs[0]).shape != shape
                        or nodes[root].op in prologue_ops):
                    continue
            else:
                internal.add(o)
            parent[i] = root

    row_roots: dict[int, int] = {}
    if enabled and row_groups:
        from .rowgroups import merge_row_groups

        reductions = frozenset(o for o in prologue_ops if o.split("::")[-1] in ("sum", "mean"))
        row_roots = merge_row_groups(graph, nodes, pointwise, find, parent, consumers, internal, prefix, reductions)
    if enabled:
        _siblings(graph, nodes, pointwise, view, find, parent, consumers, internal)
        _horizontal(graph, nodes, pointwise, find, parent, consumers, internal)
        _into_first_reader(graph, nodes, pointwise, find, parent, consumers, internal)
    members: dict[int, list[int]] = {}
    for i in range(len(nodes)):
        members.setdefault(find(i), []).append(i)
    # A group runs at its sink (the union-find root; its last node unless siblings joined it, which
    # read only the sink's outputs and so may run with it): ordering groups by it keeps them
    # topological.
    plans = []
    for r in sorted(members):
        m = members[r]
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
            pointwise_nodes={nodes[i].name for i in m if pointwise[i]},
            row=row_roots.get(r, 0),
            onto={n.name: j for n in gnodes if (j := accumulates_into(_spec(ops, n.op))) is not None},
        ))
    return plans
