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

import math
from typing import Any, Mapping

import attrs

from latch_core.document import Document
from latch_core.ir import DTYPES, FLOAT_DTYPES, Graph, GraphSection, Node, Value, fresh_name
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


# ---------------------------------------------------------------------------------------------
# Stored operands: matmuls whose policy is BF16 (or F16) read tensors stored in that dtype.

MATMUL_OP, CAST_OP, PERMUTE_OP, RESHAPE_OP = "latch::matmul", "latch::cast", "latch::permute", "latch::reshape"
LOW = ("bf16", "f16")


def _is_transpose(node: Node | None) -> bool:
    # the same test as latch_schedule.layouts.is_transpose (latch-memory does not import latch-schedule)
    if node is None or node.op != PERMUTE_OP or len(node.inputs) != 1:
        return False
    perm = node.attr("perm")
    return isinstance(perm, tuple) and len(perm) >= 2 and perm == tuple(range(len(perm) - 2)) + (len(perm) - 1, len(perm) - 2)


def _is_leading_reshape(g: Graph, node: Node | None) -> bool:
    # latch_schedule.layouts.is_leading_reshape: keeps the last two dims, regroups the ones before
    if node is None or node.op != RESHAPE_OP or len(node.inputs) != 1 or node.inputs[0] is None:
        return False
    x, y = g.value(node.inputs[0]).shape, g.value(node.outputs[0]).shape
    return len(x) >= 2 and len(y) >= 2 and x[-2:] == y[-2:] and math.prod(x[:-2]) == math.prod(y[:-2])


def store_operands(g: Graph, counts: dict) -> Graph:
    """Insert the casts that store BF16/F16 matmul operands (module docstring of this section).

    For each ``latch::matmul`` with ``operand_dtype`` bf16/f16 and f32 operands, each operand is
    cast once per (value, dtype), the cast shared by every matmul reading it; the matmul keeps its
    f32 result (``out_dtype``). A transposing permute (optionally under a leading-dims reshape)
    between the value and the matmul is seen through: the permute's INPUT is cast and the permute
    re-pointed at the cast, so ``schedule.matmul_layouts`` still folds it and a weight read both
    transposed (forward) and as stored (input gradient) is cast once. That needs every reader of
    the views to be such a matmul (else the operand itself is cast). A cast sits just before its
    first reader and carries the first matmul's source line. Then a matmul whose output is read
    only by casts to one float dtype writes that dtype itself (``out_dtype``; the casts go away)."""
    producers = g.producers()
    consumers = g.consumers()
    outs = set(g.output_names())
    index = {n.name: i for i, n in enumerate(g.nodes)}
    low_mm = {n.name: n.attr("operand_dtype") for n in g.nodes if n.op == MATMUL_OP
              and n.attr("operand_dtype") in LOW and len(n.inputs) == 2
              and all(v is not None and g.value(v).dtype == "f32" for v in n.inputs)}
    if not low_mm:
        return g

    def only_low_matmuls(v: str, dt: str) -> bool:
        cs = consumers.get(v, [])
        return v not in outs and bool(cs) and all(low_mm.get(c.name) == dt for c in cs)

    def only_reader(v: str, node: Node) -> bool:
        cs = consumers.get(v, [])
        return v not in outs and len(cs) == 1 and cs[0].name == node.name

    casts: dict[tuple[str, str], str] = {}  # (value, dtype) -> cast output
    cast_at: dict[str, int] = {}  # cast output -> position of its first reader
    cast_src: dict[str, str | None] = {}
    repoint: dict[tuple[str, int], str] = {}  # (node, input slot) -> cast output
    retype: dict[str, str] = {}  # view outputs now carrying the low dtype
    names = {v.name for v in g.values} | {n.name for n in g.nodes}
    seen_through = 0
    for n in g.nodes:
        dt = low_mm.get(n.name)
        if dt is None:
            continue
        for slot, v in enumerate(n.inputs):
            if v in retype:
                continue  # already stored low through a view chain handled for another reader
            p = producers.get(v)
            head = None  # the chain's first view: it reads the base value
            if _is_transpose(p) and only_low_matmuls(v, dt):
                head = p
            elif (_is_leading_reshape(g, p) and _is_transpose(producers.get(p.inputs[0]))
                  and only_low_matmuls(v, dt) and only_reader(p.inputs[0], p)):
                head = producers[p.inputs[0]]
                retype[p.inputs[0]] = dt
            base = head.inputs[0] if head is not None else v
            key = (base, dt)
            if key not in casts:
                casts[key] = fresh_name(names, f"{base}.{dt}")
                cast_src[casts[key]] = n.source
            c = casts[key]
            reader = head if head is not None else n
            cast_at[c] = min(cast_at.get(c, len(g.nodes)), index[reader.name])
            if head is not None:
                repoint[(head.name, 0)] = c
                retype[v] = dt
                seen_through += 1
            else:
                repoint[(n.name, slot)] = c
    by_pos: dict[int, list[tuple[str, str, str]]] = {}
    for (base, dt), c in casts.items():
        by_pos.setdefault(cast_at[c], []).append((base, dt, c))
    values = [attrs.evolve(v, dtype=retype[v.name]) if v.name in retype else v for v in g.values]
    for (base, dt), c in casts.items():
        values.append(Value(c, g.value(base).shape, dt))
    nodes: list[Node] = []
    for i, n in enumerate(g.nodes):
        for base, dt, c in by_pos.get(i, ()):
            nodes.append(Node(fresh_name(names, f"cast.{c}"), CAST_OP, (base,), (c,), {"dtype": dt}, source=cast_src[c]))
        if any((n.name, k) in repoint for k in range(len(n.inputs))):
            n = attrs.evolve(n, inputs=[repoint.get((n.name, k), v) for k, v in enumerate(n.inputs)])
        if n.name in low_mm:
            n = attrs.evolve(n, attrs=dict(n.attr_dict, out_dtype=g.value(n.outputs[0]).dtype))
        nodes.append(n)
    g2 = attrs.evolve(g, values=values, nodes=nodes)
    g2, folded = _fold_output_casts(g2)
    counts["matmuls_with_stored_operands"] = counts.get("matmuls_with_stored_operands", 0) + len(low_mm)
    counts["operand_casts"] = counts.get("operand_casts", 0) + len(casts)
    counts["transposes_seen_through"] = counts.get("transposes_seen_through", 0) + seen_through
    counts["output_casts_folded"] = counts.get("output_casts_folded", 0) + folded
    return g2


def _fold_output_casts(g: Graph) -> tuple[Graph, int]:
    """A matmul whose output only feeds casts to one float dtype writes that dtype (out_dtype)."""
    consumers = g.consumers()
    outs = set(g.output_names())
    rename: dict[str, str] = {}  # cast output -> the value the matmul now writes
    drop: set[str] = set()  # cast node names
    new_out: dict[str, tuple[str, str]] = {}  # matmul name -> (new output, dtype)
    for n in g.nodes:
        if n.op != MATMUL_OP or n.outputs[0] in outs:
            continue
        cs = consumers.get(n.outputs[0], [])
        dts = {c.attr("dtype") for c in cs}
        if not cs or any(c.op != CAST_OP for c in cs) or len(dts) != 1 or not dts <= set(LOW):
            continue
        if any(c.outputs[0] in outs for c in cs[1:]):
            continue
        first = cs[0].outputs[0]
        new_out[n.name] = (first, dts.pop())
        drop.update(c.name for c in cs)
        for c in cs[1:]:
            rename[c.outputs[0]] = first
    if not new_out:
        return g, 0
    gone = {n.outputs[0] for n in g.nodes if n.name in new_out} | set(rename)
    nodes = []
    for n in g.nodes:
        if n.name in drop:
            continue
        if n.name in new_out:
            out, dt = new_out[n.name]
            n = attrs.evolve(n, outputs=(out,), attrs=dict(n.attr_dict, out_dtype=dt))
        if any(v in rename for v in n.inputs if v is not None):
            n = attrs.evolve(n, inputs=[rename.get(v, v) if v is not None else None for v in n.inputs])
        nodes.append(n)
    values = [v for v in g.values if v.name not in gone]
    return attrs.evolve(g, values=values, nodes=nodes), len(new_out)


# ---------------------------------------------------------------------------------------------
# Stored attention operands: attention whose policy is BF16 (or F16) reads and writes that dtype.

SDPA_OP, SDPA_BWD_OP = "latch::sdpa", "latch::sdpa_backward"
# single-input views whose output dtype is their input's: a chain of them is retyped with its base
VIEW_OPS = frozenset({"latch::reshape", "latch::permute", "latch::expand", "latch::slice", "latch::select"})
_LOW_IN = {SDPA_OP: (0, 1, 2), SDPA_BWD_OP: (0, 2, 3, 4, 5)}  # q, k, v | grad_out, q, k, v, out
_LOW_OUT = {SDPA_OP: (0,), SDPA_BWD_OP: (0, 1, 2)}  # out (lse stays f32) | dq, dk, dv


def _region_values(g: Graph) -> set[str]:
    """Every value a node of ``g``'s repeated regions (and theirs, nested) reads or writes."""
    vals: set[str] = set()

    def touch(rg: Graph) -> None:
        for n in rg.nodes:
            vals.update(v for v in (*n.inputs, *n.outputs) if v is not None)
        for rr in rg.regions:
            touch(rr)
    for rg in g.regions:
        touch(rg)
    return vals


def store_attention(g: Graph, counts: dict) -> Graph:
    """Store the operands and results of BF16/F16-policy attention in that dtype.

    The attention bodies that run on the worker's ring (TMA copies the bytes as stored) need BF16
    storage; with FP32 storage and ``operand_dtype`` bf16 the bodies round as they stage, on the
    older mma.sync path (run 26: the model's attention backward at 92 us per task against ~30 us for
    the same shape stored in BF16). For each ``latch::sdpa`` / ``latch::sdpa_backward`` whose
    ``operand_dtype`` is bf16/f16 and whose float operands are f32:

    - q, k, v and grad_out are cast once per (value, dtype), the cast shared by the forward and the
      backward (and placed before the first of them);
    - the results (the forward's out, the backward's dq, dk, dv; lse stays f32) are written in the
      low dtype under a new name ``<value>.<dtype>``, and the backward reads the forward's out as
      written. Each other reader is served where it is: a chain of single-input views is retyped
      with its base; a cast to the low dtype at the end of one (the matmul operand cast that
      :func:`store_operands` put there) goes, its readers reading the chain; any other reader (an
      FP32 elementwise op, a program output) reads a cast back to f32 that keeps the original name.

    The FP64 reference is unchanged (a cast between float dtypes keeps the reference's width); on
    the GPU the results gain the roundings torch's autocast attention has (out, dq, dk, dv in BF16)."""
    outs = set(g.output_names())
    region_vals = _region_values(g)

    def eligible(n: Node) -> str | None:
        dt = n.attr("operand_dtype")
        if n.op not in _LOW_IN or dt not in LOW:
            return None
        vals = [n.inputs[i] for i in _LOW_IN[n.op]] + [n.outputs[i] for i in _LOW_OUT[n.op]]
        if any(v is None or g.value(v).dtype != "f32" or v in region_vals for v in vals):
            return None
        return dt

    nodes = list(g.nodes)
    low = {n.name: dt for n in nodes if (dt := eligible(n)) is not None}
    if not low:
        return g
    names = {v.name for v in g.values} | {n.name for n in nodes}
    values = {v.name: v for v in g.values}
    readers: dict[str, list[tuple[int, int]]] = {}  # value -> (node position, input slot), graph order
    for i, n in enumerate(nodes):
        for j, v in enumerate(n.inputs):
            if v is not None:
                readers.setdefault(v, []).append((i, j))
    repoint: dict[tuple[str, int], str] = {}  # (node, input slot) -> the value it reads instead
    new_out: dict[tuple[str, int], str] = {}  # (node, output slot) -> the low value it writes
    before: dict[int, list[Node]] = {}  # nodes inserted before / after position i
    after: dict[int, list[Node]] = {}
    dropped: set[str] = set()  # casts to the low dtype that go: their readers read the chain
    rename: dict[str, str] = {}  # a dropped cast's output -> what its readers read
    stats = dict.fromkeys(("attention_nodes_stored", "attention_operand_casts", "attention_results_low",
                           "attention_casts_dropped", "attention_widening_casts"), 0)
    stats["attention_nodes_stored"] = len(low)

    def serve(old: str, low_name: str, pos: int, dt: str, source, f32_name: str | None) -> None:
        """The readers of ``old`` (an f32 value now written in ``dt`` as ``low_name`` by node ``pos``)
        served: low attention operands and casts to ``dt`` read ``low_name``, single-input views
        are retyped (recursively), the rest read a cast back to f32 named ``f32_name`` (None: a
        fresh name, readers re-pointed; else ``old`` itself, kept as the f32 name)."""
        wide: list[tuple[int, int]] = []
        for i, j in readers.get(old, []):
            c = nodes[i]
            if low.get(c.name) == dt and j in _LOW_IN[c.op]:
                repoint[(c.name, j)] = low_name
            elif (c.op in VIEW_OPS and len(c.inputs) == 1 and c.outputs[0] not in outs
                  and c.outputs[0] not in region_vals):
                repoint[(c.name, 0)] = low_name
                w = c.outputs[0]
                values[w] = attrs.evolve(values[w], dtype=dt)
                serve(w, w, i, dt, c.source, None)
            elif c.op == CAST_OP and c.attr("dtype") == dt and c.outputs[0] not in outs:
                dropped.add(c.name)
                rename[c.outputs[0]] = low_name
                values.pop(c.outputs[0], None)
                stats["attention_casts_dropped"] += 1
            else:
                wide.append((i, j))
        keep = f32_name is not None and old in outs
        if not wide and not keep:
            if f32_name is not None:
                values.pop(old, None)  # nobody reads the f32 value any more
            return
        if f32_name is None:
            f32_name = fresh_name(names, f"{old}.f32")
            values[f32_name] = Value(f32_name, values[old].shape, "f32")
            for i, j in wide:
                repoint[(nodes[i].name, j)] = f32_name
        after.setdefault(pos, []).append(Node(fresh_name(names, f"cast.{f32_name}"), CAST_OP, (low_name,),
                                              (f32_name,), {"dtype": "f32"}, source=source))
        stats["attention_widening_casts"] += 1

    # results first (the backward then reads the forward's out as written), then the operand casts
    stored = [(i, n, low[n.name]) for i, n in enumerate(nodes) if n.name in low]
    for i, n, dt in stored:
        for k in _LOW_OUT[n.op]:
            old = n.outputs[k]
            low_name = fresh_name(names, f"{old}.{dt}")
            values[low_name] = attrs.evolve(values[old], name=low_name, dtype=dt)
            new_out[(n.name, k)] = low_name
            stats["attention_results_low"] += 1
            serve(old, low_name, i, dt, n.source, old)
    casts: dict[tuple[str, str], str] = {}
    for i, n, dt in stored:
        for j in _LOW_IN[n.op]:
            v = n.inputs[j]
            if (n.name, j) in repoint or values[v].dtype == dt:
                continue
            if (v, dt) not in casts:
                c = casts[(v, dt)] = fresh_name(names, f"{v}.{dt}")
                values[c] = Value(c, values[v].shape, dt)
                before.setdefault(i, []).append(Node(fresh_name(names, f"cast.{c}"), CAST_OP, (v,), (c,),
                                                     {"dtype": dt}, source=n.source))
                stats["attention_operand_casts"] += 1
            repoint[(n.name, j)] = casts[(v, dt)]
    out_nodes: list[Node] = []
    for i, n in enumerate(nodes):
        out_nodes += before.get(i, [])
        if n.name not in dropped:
            ins = [repoint.get((n.name, j), rename.get(v, v) if v is not None else None) for j, v in enumerate(n.inputs)]
            outs_ = [new_out.get((n.name, k), o) for k, o in enumerate(n.outputs)]
            if ins != list(n.inputs) or outs_ != list(n.outputs):
                n = attrs.evolve(n, inputs=ins, outputs=outs_)
            out_nodes.append(n)
        out_nodes += after.get(i, [])
    for k, v in stats.items():
        counts[k] = counts.get(k, 0) + v
    return attrs.evolve(g, values=list(values.values()), nodes=out_nodes)


# ---------------------------------------------------------------------------------------------
# Stored products (opt-in): a BF16-policy product whose result only feeds BF16 consumers writes BF16.

PRODUCT_OPS = frozenset({MATMUL_OP, "latch::ragged_mm", "latch::ragged_mm_grad_x"})
PASS_THROUGH = frozenset({"latch::concat"})  # structural ops that only move values (RoPE's halves joined)


def store_products(g: Graph, ops: Registry, counts: dict) -> Graph:
    """A product (``latch::matmul``, ``latch::ragged_mm``, ``latch::ragged_mm_grad_x``) with
    ``operand_dtype`` bf16/f16 and an f32 result writes its result in that dtype when everything
    the result reaches, through elementwise ops, views and concats, ends in that dtype's consumers: a cast to
    it, or a product / attention with that ``operand_dtype`` (which will store its operands so).
    A program output, a value a repeated region touches, a reduction or any other reader on the way
    keeps the result f32. The node writes ``<value>.<dtype>`` (``out_dtype``); views on the way are
    retyped with it and every other reader reads its own cast back to f32, which fuses into that
    reader's group, so the group reads the low dtype (the rounding torch's autocast has: its products return BF16). Off by default."""
    from latch_core import registry as r

    outs = set(g.output_names())
    region_vals = _region_values(g)
    consumers = g.consumers()
    memo: dict[tuple[str, str], bool] = {}

    def tags(n: Node) -> frozenset:
        return frozenset(ops.get(n.op).tags) if n.op in ops else frozenset()

    def reaches_low(v: str, dt: str) -> bool:
        key = (v, dt)
        if key not in memo:
            memo[key] = False  # a cycle cannot happen in a DAG; this only guards the recursion
            cs = consumers.get(v, [])
            memo[key] = (v not in outs and v not in region_vals and bool(cs)
                         and all(_low_reader(c, dt) for c in cs))
        return memo[key]

    def _low_reader(c: Node, dt: str) -> bool:
        t = tags(c)
        if c.op == CAST_OP:
            return c.attr("dtype") == dt
        if (r.MATMUL in t or r.ATTENTION in t) and c.attr("operand_dtype") == dt:
            return True
        if ((r.ELEMENTWISE in t or r.VIEW in t or c.op in PASS_THROUGH)
                and not t & {r.REDUCTION, r.MATMUL, r.ATTENTION, r.RANDOM}):
            return all(o is not None and reaches_low(o, dt) for o in c.outputs)
        return False

    chosen: dict[str, str] = {}
    for n in g.nodes:
        dt = n.attr("operand_dtype")
        if (n.op in PRODUCT_OPS and dt in LOW and len(n.outputs) == 1 and g.value(n.outputs[0]).dtype == "f32"
                and n.attr("out_dtype") in (None, "f32") and reaches_low(n.outputs[0], dt)):
            chosen[n.name] = dt
    if not chosen:
        return g
    names = {v.name for v in g.values} | {n.name for n in g.nodes}
    values = {v.name: v for v in g.values}
    out_to: dict[str, str] = {}  # product -> the low value it now writes
    # (reader, slot) -> (the low value, the dtype it is widened from; None: read as it is)
    widen: dict[tuple[str, int], tuple[str, str | None]] = {}
    saved = 0

    def serve(v: str, low: str, dt: str) -> None:
        # a view reader is retyped with its input (its output keeps its name); any other reader
        # gets its own cast back to f32 just before it: a cast with one reader fuses into that
        # reader's group, where one cast shared by readers in several groups would be stored
        for c in consumers.get(v, []):
            if r.VIEW in tags(c) and len(c.inputs) == 1:
                w = c.outputs[0]
                values[w] = attrs.evolve(values[w], dtype=dt)
                widen[(c.name, 0)] = (low, None)  # reads the low value itself
                serve(w, w, dt)
            else:
                for j, x in enumerate(c.inputs):
                    if x == v:
                        widen[(c.name, j)] = (low, dt)

    for n in g.nodes:
        if n.name in chosen:
            old, dt = values[n.outputs[0]], chosen[n.name]
            low = out_to[n.name] = fresh_name(names, f"{old.name}.{dt}")
            values[low] = Value(low, old.shape, dt)
            saved += math.prod(old.shape) * 2 * (1 + len(consumers.get(old.name, [])))
            serve(old.name, low, dt)
            del values[old.name]
    nodes: list[Node] = []
    for n in g.nodes:
        if n.name in out_to:
            nodes.append(attrs.evolve(n, outputs=(out_to[n.name],), attrs=dict(n.attr_dict, out_dtype=chosen[n.name])))
            continue
        ins = list(n.inputs)
        for j, v in enumerate(n.inputs):
            if (n.name, j) in widen:
                low, dt = widen[(n.name, j)]
                if dt is None or (n.op == CAST_OP and n.attr("dtype") == dt):
                    ins[j] = low  # a cast to the low dtype reads the low value (an exact copy)
                    continue
                w = fresh_name(names, f"{v}.f32")
                values[w] = Value(w, values[low].shape, "f32")
                nodes.append(Node(fresh_name(names, f"cast.{w}"), CAST_OP, (low,), (w,), {"dtype": "f32"},
                                  source=n.source))
                ins[j] = w
        nodes.append(n if ins == list(n.inputs) else attrs.evolve(n, inputs=ins))
    values = list(values.values())
    counts["products_stored_low"] = counts.get("products_stored_low", 0) + len(chosen)
    counts["product_bytes_saved"] = counts.get("product_bytes_saved", 0) + saved
    return attrs.evolve(g, values=values, nodes=nodes)


def apply_policy(section: GraphSection, ops: Registry, *, table: Mapping | None = None, ops_table: Mapping | None = None,
                 nodes: Mapping | None = None, master: str | None = DEFAULT_MASTER,
                 store: bool = True, attention: bool = True, products: bool = False) -> tuple[GraphSection, dict]:
    """The policy applied to every program; returns the new section and a summary. ``store``: insert
    the casts that store low-precision matmul operands (:func:`store_operands`); with ``attention``
    too, attention's operands and results (:func:`store_attention`); with ``products`` too, products
    whose results only feed low-precision consumers write that precision (:func:`store_products`)."""
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
    stored: dict[str, int] = {}
    if store:
        programs = [store_operands(p, stored) for p in programs]
        if attention:
            programs = [store_attention(p, stored) for p in programs]
        if products:
            programs = [store_products(p, ops, stored) for p in programs]
    summary = {"master": master, "table": merged, "ops": op_over, "nodes": node_over, "counts": counts,
               "stored": stored}
    meta = dict(section.metadata)
    meta["memory.policy"] = summary
    return attrs.evolve(section, programs=programs, metadata=meta), summary


def policy_pass(doc: Document, *, table=None, ops=None, nodes=None, master=DEFAULT_MASTER, store=True,
                attention=True, products=False, registry=None) -> Document:
    """Pass ``memory.policy``. ``registry``: an op registry (default: the installed plugins');
    ``store=False`` keeps the attributes only (no casts: operands rounded inside the bodies);
    ``attention=False`` stores matmul operands only (attention keeps FP32 storage and rounds in its
    bodies: the mma.sync path, not the ring's wgmma bodies); ``products=True`` (off by default): a
    product whose result only feeds BF16 consumers through elementwise ops writes BF16."""
    if registry is None:
        from latch_core.plugins import registries

        registry = registries().ops
    section, _ = apply_policy(doc.graph, registry, table=table, ops_table=ops, nodes=nodes, master=master,
                              store=bool(store), attention=bool(attention), products=bool(products))
    return attrs.evolve(doc, graph=section)
