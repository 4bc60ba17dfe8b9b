"""Op bodies: a fusion group's canonical signature, and the device function generated for it.

A :class:`BodySpec` is a fusion group with the names taken out: operands are numbered (group
inputs, then group outputs, then values internal to the group), each with its shape and dtype, and
every node refers to operands by number. Two groups with equal specs get one device function
(``latch_body_<key>``): code size grows with distinct signatures, not with tasks. The code is a
function of the spec alone, so the spec's hash is a sound cache key for it.

Operand order at run time (the group's operand records in the task table): group inputs in
``FusionGroup.inputs`` order, then group outputs in ``FusionGroup.outputs`` order.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

import attrs

from latch_core.ir import Graph, IRError
from latch_core.sections import FusionGroup

from .lowering import BodyContext, Lowering, LoweringError, Operand, storage_type

IN, OUT, TMP = "in", "out", "tmp"


class CodegenError(ValueError):
    """The document cannot be lowered; the message names the program, group, node and op."""


@attrs.frozen
class SpecValue:
    kind: str  # IN, OUT or TMP
    index: int  # position among values of its kind
    shape: tuple[int, ...] = attrs.field(converter=tuple)
    dtype: str = "f32"


@attrs.frozen
class SpecNode:
    op: str
    attrs: tuple[tuple[str, Any], ...]
    inputs: tuple[int | None, ...]  # indices into BodySpec.values
    outputs: tuple[int, ...]


@attrs.frozen
class BodySpec:
    values: tuple[SpecValue, ...]
    nodes: tuple[SpecNode, ...]
    primary: int  # index into values (an OUT value)
    aliased: bool = False  # a single view node whose output shares its input's bytes

    @property
    def key(self) -> str:
        return hashlib.sha256(repr(self).encode()).hexdigest()[:16]



    def of_kind(self, kind: str) -> list[int]:
        return [i for i, v in enumerate(self.values) if v.kind == kind]

    @property
    def ops(self) -> tuple[str, ...]:
        return tuple(n.op for n in self.nodes)

    def describe(self) -> str:
        shapes = ", ".join(f"{v.dtype}[{','.join(map(str, v.shape))}]" for v in self.values if v.kind != TMP)
        return f"{'+'.join(self.ops)}({shapes})"


@attrs.frozen
class GroupSite:
    """Where a body came from, for error messages: program, group id, node names, sources."""

    program: str
    group: int
    nodes: tuple[str, ...]
    sources: tuple[str | None, ...]

    def describe(self) -> str:
        src = next((s for s in self.sources if s), None)
        where = f" (from {src})" if src else ""
        return f"program {self.program!r} group {self.group} (nodes {', '.join(self.nodes)}){where}"


def node_index(graph: Graph) -> tuple[dict, dict]:
    """(node name -> node, node name -> position) of ``graph``, for :func:`group_spec`."""
    return {n.name: n for n in graph.nodes}, {n.name: i for i, n in enumerate(graph.nodes)}


def group_spec(graph: Graph, group: FusionGroup, aliased: bool = False,
               nodes_index: tuple[dict, dict] | None = None) -> BodySpec:
    """The canonical signature of ``group`` in ``graph``. ``nodes_index``: :func:`node_index` of ``graph``
    (computed once by a caller visiting every group of a big graph)."""
    nodes_by_name, order = nodes_index if nodes_index is not None else node_index(graph)
    try:
        nodes = sorted((nodes_by_name[n] for n in group.nodes), key=lambda n: order[n.name])
    except KeyError as e:
        raise CodegenError(f"program {graph.name!r} group {group.id}: names node {e.args[0]!r}, which the graph lacks")
    index: dict[str, int] = {}
    values: list[SpecValue] = []

    def add(name: str, kind: str, k: int) -> None:
        try:
            v = graph.value(name)
        except IRError as e:
            raise CodegenError(f"program {graph.name!r} group {group.id}: {e}") from None
        index[name] = len(values)
        values.append(SpecValue(kind, k, v.shape, v.dtype))

    for k, name in enumerate(group.inputs):
        add(name, IN, k)
    for k, name in enumerate(group.outputs):
        if name in index:
            raise CodegenError(f"program {graph.name!r} group {group.id}: value {name!r} is both an input and an output")
        add(name, OUT, k)
    tmp = 0
    spec_nodes = []
    for n in nodes:
        ins = []
        for i in n.inputs:
            if i is None:
                ins.append(None)
            elif i in index:
                ins.append(index[i])
            else:
                raise CodegenError(
                    f"program {graph.name!r} group {group.id}: node {n.name!r} ({n.op}) reads {i!r}, which is "
                    f"neither a group input nor computed earlier in the group; the schedule's group is malformed"
                )
        outs = []
        for o in n.outputs:
            if o not in index:
                add(o, TMP, tmp)
                tmp += 1
            outs.append(index[o])
        spec_nodes.append(SpecNode(n.op, n.attrs, tuple(ins), tuple(outs)))
    if group.primary not in index or values[index[group.primary]].kind != OUT:
        raise CodegenError(f"program {graph.name!r} group {group.id}: primary {group.primary!r} is not a group output")
    return BodySpec(tuple(values), tuple(spec_nodes), index[group.primary], aliased)


# --------------------------------------------------------------------------------------------
# Code generation for one body


def _ptr_decl(spec: BodySpec) -> tuple[list[str], dict[int, str]]:
    lines, names = [], {}
    k = 0
    for i, v in enumerate(spec.values):
        if v.kind == IN:
            names[i] = f"in{v.index}"
            lines.append(f"  const {storage_type(v.dtype)}* in{v.index} = "
                         f"(const {storage_type(v.dtype)}*)c.ops[{k}];")
            k += 1
    for i, v in enumerate(spec.values):
        if v.kind == OUT:
            names[i] = f"out{v.index}"
            lines.append(f"  {storage_type(v.dtype)}* out{v.index} = ({storage_type(v.dtype)}*)c.ops[{k}];")
            k += 1
    return lines, names


def body_context(spec: BodySpec) -> BodyContext:
    n = spec.nodes[0]
    _, names = _ptr_decl(spec)
    ins = tuple(None if i is None else Operand(names[i], spec.values[i].shape, spec.values[i].dtype) for i in n.inputs)
    # An output no one outside the group reads has no placement: the body must not write it.
    outs = tuple(Operand(names.get(o, "nullptr"), spec.values[o].shape, spec.values[o].dtype, present=o in names)
                 for o in n.outputs)
    primary = list(n.outputs).index(spec.primary)
    return BodyContext(op=n.op, attrs=dict(n.attrs), inputs=ins, outputs=outs, primary=primary, aliased=spec.aliased)


def single_node_ok(spec: BodySpec) -> bool:
    """A group of one node that reads and writes only that node's operands."""
    if len(spec.nodes) != 1:
        return False
    n = spec.nodes[0]
    ins = {i for i in n.inputs if i is not None}
    return ins == set(spec.of_kind(IN)) and set(spec.of_kind(OUT)) <= set(n.outputs)


FUNC, PFUNC = "@FUNC@", "@PFUNC@"  # placeholders for the function names in Rendered.source


@attrs.frozen
class Rendered:
    """A body's generated code and what the kernel needs to know about it.

    ``source`` names its functions ``@FUNC@`` (consumer half) and ``@PFUNC@`` (producer half): bodies
    whose source is the same text share one function (``func``), told apart at run time only by
    their ``args`` (``c.args``, a row of the kernel's constant table), so code size and compile time
    grow with distinct texts, not with distinct shapes."""

    source: str
    smem: int  # scratch shared memory (bytes)
    tensor_maps: tuple = ()  # TensorMap records, in the order the body uses them
    stage_bytes: int = 0  # bytes of one ring stage (bodies with a producer half)
    args: tuple[int, ...] = ()

    @property
    def produces(self) -> bool:
        return bool(self.tensor_maps)

    @property
    def share(self) -> str:
        return hashlib.sha256(self.source.encode()).hexdigest()[:16]

    @property
    def func(self) -> str:
        return f"latch_body_{self.share}"

    @property
    def producer_func(self) -> str:
        return f"latch_produce_{self.share}"

    def named(self) -> str:
        return self.source.replace(FUNC, self.func).replace(PFUNC, self.producer_func)


def render_body(spec: BodySpec, lowerings: dict[str, Lowering]) -> Rendered:
    """The C++ source of the body's device function(s) and what the kernel needs to know."""
    for n in spec.nodes:
        if n.op not in lowerings:
            raise LoweringError(f"no lowering for op {n.op}")
    smem, maps, stage_bytes, producer, inline, args = 0, (), 0, None, False, ()
    if len(spec.nodes) == 1 and lowerings[spec.nodes[0].op].body is not None:
        if not single_node_ok(spec):
            raise LoweringError(
                f"{spec.nodes[0].op}: the group's operands are not the node's operands in order "
                "(a group of one node must read and write exactly that node's operands)"
            )
        low = lowerings[spec.nodes[0].op]
        ctx = body_context(spec)
        decl, _ = _ptr_decl(spec)
        stmts = low.body(ctx)
        smem = int(low.smem(ctx)) if low.smem is not None else 0
        args = tuple(int(x) for x in low.args(ctx)) if low.args is not None else ()
        lines = decl + ["  {"] + ["    " + s if s else s for s in stmts.splitlines()] + ["  }"]
        inline = low.inline
        prod_src = low.producer(ctx) if low.producer is not None else None  # None: no producer half here
        if prod_src is not None:
            inline = True
            maps = tuple(low.tensor_maps(ctx))
            stage_bytes = int(low.stage_bytes(ctx))
            if not maps:
                raise LoweringError(f"{low.op}: a producer half with no tensor maps")
            nops = len(ctx.inputs) + len(ctx.outputs)
            for m in maps:
                if not 0 <= m.operand < nops:
                    raise LoweringError(f"{low.op}: tensor map of operand {m.operand}; the body has {nops} operands")
            producer = decl + ["  {"] + ["    " + s if s else s for s in prod_src.splitlines()] + ["  }"]
    else:
        from .lower_reduce import PROLOGUE_REDUCTIONS

        # a concat fuses with its producers and consumers: the fused body branches on its dim (fuse.py)
        missing = [n.op for n in spec.nodes if not lowerings[n.op].fusable and n.op != "latch::concat"]
        from .lower_rowgroup import ROW_REDUCTIONS, is_row_group

        if missing and is_row_group(spec) and set(missing) <= ROW_REDUCTIONS:
            # a row group (latch_schedule.rowgroups): statistic, chain and consumer in one pass
            from .lower_rowgroup import row_body

            out = [f"__device__ __noinline__ void {FUNC}(const latch::Ctx& c) {{"] + row_body(spec, lowerings) + ["}", ""]
            return Rendered("\n".join(out), 0, (), 0, ())
        if missing == [spec.nodes[-1].op] and missing[0] in PROLOGUE_REDUCTIONS:
            # a reduction with its elementwise prologue (latch_schedule.fusion): flat.reduce_body
            from .flat import reduce_body

            lines = reduce_body(spec, lowerings)
            low = lowerings[spec.nodes[-1].op]
            smem = int(low.smem(None)) if low.smem is not None else 0
            qual = "__device__ __noinline__"
            out = [f"{qual} void {FUNC}(const latch::Ctx& c) {{"] + lines + ["}", ""]
            return Rendered("\n".join(out), smem, (), 0, ())
        if missing:
            raise LoweringError(
                f"{missing[0]} has neither an elementwise nor a view form and is fused with "
                f"{len(spec.nodes) - 1} other node(s); this code generator fuses elementwise ops and views "
                "only: schedule it as a group of its own"
            )
        from .fuse import fused_body  # fuse imports this module

        lines = fused_body(spec, lowerings)
    qual = "__device__ __forceinline__" if inline else "__device__ __noinline__"
    out = [f"{qual} void {FUNC}(const latch::Ctx& c) {{"] + lines + ["}", ""]
    if producer is not None:
        out += [f"__device__ __forceinline__ bool {PFUNC}(const latch::Ctx& c, latch::Pipe& p) {{"]
        out += producer + ["  return true;", "}", ""]
    return Rendered("\n".join(out), smem, maps, stage_bytes, args)


def numel(shape) -> int:
    return math.prod(shape)
