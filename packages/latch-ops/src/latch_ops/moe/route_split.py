"""Pass ``moe.route_split``: ``route_order`` over many SMs.

``route_order`` is one stable sort of the N*k (token, slot) pairs by expert, and as one op it is one
task: at TinyMoE-200M's 32 x 1024 tokens (65,536 pairs) that task took 154-176 us a layer while the
other 131 SMs waited at the next barrier (results/runs/run53-phases-32x1024.txt, ~1.25 ms an update).
The pass rewrites it as four ops over chunks of ``chunk`` flat pairs (C = ceil(P / chunk) of them):

    counts          = route_count(indices)            {num_experts, chunk}  one task per chunk
    position        = route_place(indices, counts)    {num_experts, chunk}  one task per chunk
    (token, pairs)  = route_rows(indices, counts)     {num_experts, chunk}  one task per chunk of rows
    offsets         = route_offsets(counts)           {num_experts}          one task

``counts[c, e]`` (int32) is how many pairs of chunk c go to expert e. From it every task of the second
phase knows where each chunk's pairs of each expert start among the sorted rows, so the three run
side by side after one barrier. ``pairs[r]`` is the pair at sorted row r: position's inverse, which
``moe.fixed_order_scatters`` gathers the combine's gradient by (it used to compute that inverse with
a scatter whose every task walked all P indices: run 53's 40 scatter tasks of ~90 us a layer).

The result is the same sort, bit for bit (latch-ops tests/test_route_emulated.py runs the bodies of
cuda/latch_route.cuh against ``reference.route_order_math``). The pass applies where it pays and the
bodies fit: at least two chunks, at most ``MAX_EXPERTS`` experts, and ``C * E <= MAX_COUNTS`` (route_rows
keeps the column sums of the counts in shared memory). Elsewhere route_order stays one task. No torch:
the pass runs on the document only.
"""

from __future__ import annotations

from typing import Any, Sequence

import attrs

from latch_core.document import Document
from latch_core.ir import INT_DTYPES, Graph, Node, TensorType, Value, fresh_name
from latch_core.registry import ROUTING, OpSpec, ShapeError

from . import specs

ROUTE_COUNT = "latch::route_count"
ROUTE_PLACE = "latch::route_place"
ROUTE_ROWS = "latch::route_rows"
ROUTE_OFFSETS = "latch::route_offsets"

CHUNK = 512  # pairs per chunk: 16 rounds of 32 for the 8 consumer warps, a few microseconds a task
MAX_CHUNKS = 128  # one wave of tasks on the H200's 132 SMs
MAX_EXPERTS = 64  # = latch::ROUTE_SPLIT_EXPERTS: route_rows walks a chunk once per expert it meets
MAX_COUNTS = 4096  # C * E ints: route_rows' shared memory ((C + 1) * E + E + 1 ints, ~16 KB)


def plan_chunks(n_pairs: int, num_experts: int) -> int | None:
    """Pairs per chunk for route_order over ``n_pairs`` pairs and ``num_experts`` experts, or None
    where route_order stays one task (fewer than two chunks, too many experts)."""
    if num_experts > MAX_EXPERTS or n_pairs < 2 * CHUNK:
        return None
    chunks = min(-(-n_pairs // CHUNK), MAX_CHUNKS, MAX_COUNTS // num_experts)
    chunk = -(-n_pairs // chunks)
    chunk = -(-chunk // 32) * 32  # whole warp rounds
    return chunk if -(-n_pairs // chunk) >= 2 else None


# --------------------------------------------------------------------------------------------
# Shape rules, costs, tilings, references

def _pairs(op: str, idx: TensorType | None) -> int:
    idx = specs._need(op, "indices", idx, 2, INT_DTYPES, "[N, k] expert indices")
    return idx.shape[0] * idx.shape[1]


def _geometry(op: str, idx: TensorType | None, attrs_: dict[str, Any]) -> tuple[int, int, int, int]:
    """(P, E, chunk, C) of a split node."""
    P = _pairs(op, idx)
    E = specs._int_attr(op, attrs_, "num_experts", 1)
    chunk = specs._int_attr(op, attrs_, "chunk", 1)
    return P, E, chunk, -(-P // chunk)


def _need_counts(op: str, counts: TensorType | None, C: int, E: int) -> None:
    if counts is None or counts.shape != (C, E) or counts.dtype != "i32":
        raise ShapeError(f"{op}: counts must be [C={C}, E={E}] i32 (route_count's result for the same chunk), "
                         f"got {counts}")


def infer_route_count(inputs: Sequence[TensorType | None], attrs_: dict[str, Any]) -> list[TensorType]:
    _P, E, _chunk, C = _geometry(ROUTE_COUNT, inputs[0], attrs_)
    return [TensorType((C, E), "i32")]


def infer_route_place(inputs: Sequence[TensorType | None], attrs_: dict[str, Any]) -> list[TensorType]:
    P, E, _chunk, C = _geometry(ROUTE_PLACE, inputs[0], attrs_)
    _need_counts(ROUTE_PLACE, inputs[1], C, E)
    return [TensorType((P,), "i64")]


def infer_route_rows(inputs: Sequence[TensorType | None], attrs_: dict[str, Any]) -> list[TensorType]:
    P, E, _chunk, C = _geometry(ROUTE_ROWS, inputs[0], attrs_)
    _need_counts(ROUTE_ROWS, inputs[1], C, E)
    return [TensorType((P,), "i64"), TensorType((P,), "i64")]


def infer_route_offsets(inputs: Sequence[TensorType | None], attrs_: dict[str, Any]) -> list[TensorType]:
    (counts,) = inputs
    E = specs._int_attr(ROUTE_OFFSETS, attrs_, "num_experts", 1)
    if counts is None or len(counts.shape) != 2 or counts.shape[1] != E or counts.dtype != "i32":
        raise ShapeError(f"{ROUTE_OFFSETS}: counts must be [C, E={E}] i32, got {counts}")
    return [TensorType((E + 1,), "i64")]


def _nbytes(types) -> int:
    return sum(t.nbytes for t in types if t is not None)


# Costs (flops, bytes). Every task of the second phase reads the whole counts matrix; route_rows
# walks one chunk per (expert, chunk) its rows meet: about E + 2 chunks a task, E + 2 walks of
# every index over the op.
def cost_route_count(inputs, outputs, attrs_):
    return inputs[0].numel, _nbytes(list(inputs) + list(outputs))


def cost_route_place(inputs, outputs, attrs_):
    idx, counts = inputs
    C = counts.shape[0]
    return idx.numel, idx.nbytes + C * counts.nbytes + _nbytes(outputs)


def cost_route_rows(inputs, outputs, attrs_):
    idx, counts = inputs
    C, E = counts.shape
    return idx.numel * (E + 2), idx.nbytes * (E + 2) + C * counts.nbytes + _nbytes(outputs)


def cost_route_offsets(inputs, outputs, attrs_):
    return inputs[0].numel, _nbytes(list(inputs) + list(outputs))


def _full(t: TensorType):
    return tuple((0, d) for d in t.shape)


def _pair_rows(idx: TensorType, a: int, b: int):
    """The rows of indices[N, k] that hold the flat pairs [a, b) (whole rows: a superset)."""
    k = idx.shape[1]
    return ((a // k, -(-b // k)), (0, k))


def tiling_route_count(in_types, out_types, attrs_):
    from latch_core.tiling import Tiling

    idx = in_types[0]
    P, chunk = idx.numel, int(attrs_["chunk"])

    def footprint(box):
        (c0, c1), _ = box
        return [_pair_rows(idx, c0 * chunk, min(P, c1 * chunk))], [box]

    return Tiling((0,), footprint, granule=(1,), kind="route_count")


def tiling_route_place(in_types, out_types, attrs_):
    from latch_core.tiling import Tiling

    idx, counts = in_types

    def footprint(box):
        ((p0, p1),) = box
        return [_pair_rows(idx, p0, p1), _full(counts)], [box]

    return Tiling((0,), footprint, granule=(int(attrs_["chunk"]),), kind="route_place")


def tiling_route_rows(in_types, out_types, attrs_):
    from latch_core.tiling import Tiling

    idx, counts = in_types

    def footprint(box):  # which pairs land in a tile's rows is data: every index
        return [_full(idx), _full(counts)], [box, box]

    return Tiling((0,), footprint, granule=(int(attrs_["chunk"]),), kind="route_rows")


def _ref_count(inputs, attrs_):
    from .reference import route_count_math

    return [route_count_math(inputs[0], int(attrs_["num_experts"]), int(attrs_["chunk"]))]


def _ref_place(inputs, attrs_):
    from .reference import route_place_math

    return [route_place_math(inputs[0], inputs[1], int(attrs_["num_experts"]), int(attrs_["chunk"]))]


def _ref_rows(inputs, attrs_):
    from .reference import route_rows_math

    return list(route_rows_math(inputs[0], inputs[1], int(attrs_["num_experts"]), int(attrs_["chunk"])))


def _ref_offsets(inputs, attrs_):
    from .reference import route_offsets_math

    return [route_offsets_math(inputs[0])]


SPECS = [
    OpSpec(
        name=ROUTE_COUNT,
        signature="route_count(indices[N,k]) {num_experts: int, chunk: int} -> counts[C,E] i32",
        infer=infer_route_count, tags={ROUTING}, num_inputs=(1, 1), cost=cost_route_count,
        doc="per chunk of `chunk` flat (token, slot) pairs, how many go to each expert (route_order's first phase)",
        extra={"reference": _ref_count, "tiling": tiling_route_count},
    ),
    OpSpec(
        name=ROUTE_PLACE,
        signature="route_place(indices[N,k], counts[C,E]) {num_experts: int, chunk: int} -> position[N*k] i64",
        infer=infer_route_place, tags={ROUTING}, num_inputs=(2, 2), cost=cost_route_place,
        doc="route_order's position (the sorted row of each pair) from each chunk's pairs and the counts",
        extra={"reference": _ref_place, "tiling": tiling_route_place},
    ),
    OpSpec(
        name=ROUTE_ROWS,
        signature="route_rows(indices[N,k], counts[C,E]) {num_experts: int, chunk: int} "
                  "-> (token[N*k] i64, pairs[N*k] i64)",
        infer=infer_route_rows, tags={ROUTING}, num_inputs=(2, 2), cost=cost_route_rows,
        doc="route_order's token per sorted row and the pair at each sorted row (position's inverse), by rows",
        extra={"reference": _ref_rows, "tiling": tiling_route_rows},
    ),
    OpSpec(
        name=ROUTE_OFFSETS,
        signature="route_offsets(counts[C,E]) {num_experts: int} -> offsets[E+1] i64",
        infer=infer_route_offsets, tags={ROUTING}, num_inputs=(1, 1), cost=cost_route_offsets,
        doc="route_order's per-expert row offsets from the chunk counts",
        extra={"reference": _ref_offsets},
    ),
]


# --------------------------------------------------------------------------------------------
# The rewrite

def split_routes(g: Graph) -> tuple[Graph, int]:
    """(new graph, route_order nodes split) for one program."""
    todo = {}
    for n in g.nodes:
        if n.op != specs.ROUTE_ORDER or len(n.outputs) != 3 or len(n.inputs) != 1:
            continue
        N, k = g.value(n.inputs[0]).shape
        chunk = plan_chunks(N * k, int(n.attr("num_experts")))
        if chunk is not None:
            todo[n.name] = chunk
    if not todo:
        return g, 0
    names = {v.name for v in g.values} | {n.name for n in g.nodes}
    values = list(g.values)
    nodes: list[Node] = []
    for n in g.nodes:
        if n.name not in todo:
            nodes.append(n)
            continue
        chunk, E = todo[n.name], int(n.attr("num_experts"))
        (idx,) = n.inputs
        token, position, offsets = n.outputs
        P = g.value(token).shape[0]
        counts = fresh_name(names, f"{n.name}.counts")
        pairs = fresh_name(names, f"{n.name}.pairs")
        values += [Value(counts, (-(-P // chunk), E), "i32"), Value(pairs, (P,), "i64")]
        a = {"num_experts": E, "chunk": chunk}
        nodes += [Node(fresh_name(names, f"{n.name}.count"), ROUTE_COUNT, (idx,), (counts,), dict(a), source=n.source),
                  Node(fresh_name(names, f"{n.name}.place"), ROUTE_PLACE, (idx, counts), (position,), dict(a),
                       source=n.source),
                  Node(n.name, ROUTE_ROWS, (idx, counts), (token, pairs), dict(a), source=n.source),
                  Node(fresh_name(names, f"{n.name}.offsets"), ROUTE_OFFSETS, (counts,), (offsets,),
                       {"num_experts": E}, source=n.source)]
    return attrs.evolve(g, values=values, nodes=nodes), len(todo)


def route_split_pass(doc: Document, **_options) -> tuple[Document, str]:
    programs, count = [], 0
    for p in doc.graph.programs:
        p2, c = split_routes(p)
        programs.append(p2)
        count += c
    return (attrs.evolve(doc, graph=attrs.evolve(doc.graph, programs=programs)),
            f"{count} route_order(s) split into count, place, rows and offsets over chunks of pairs")
