"""Tilings of core-vocabulary ops that tags cannot describe (views, structural and indexing ops).

Consulted after an op's own ``OpSpec.extra["tiling"]`` and before the tag rules, by op name. Each
entry maps a tile of the op's primary output to the boxes its operands are read in; every map is
exact or a superset (reshape reads the box hull of the flat range a tile covers; data-dependent
reads, like an embedding's table rows, read the whole extent along the indexed dim).

The attribute conventions are latch-ops' (``latch_ops.views``, ``latch_ops.indexing``,
``latch_ops.nn``): normalised dims, ``perm``, ``shape``, ``dim``/``start``/``end``/``step``,
``index``. An op whose attributes do not fit falls back to one whole task.
"""

from __future__ import annotations

from typing import Callable

import attrs as _attrs  # (the tilings take a parameter named attrs)

from latch_core.ir import TensorType

from .boxes import Box, broadcast_box, full_box
from .tiling import Tiling


def _ravel(shape, idx) -> int:
    flat = 0
    for d, i in zip(shape, idx):
        flat = flat * d + i
    return flat


def _unravel(shape, flat) -> list[int]:
    out = []
    for d in reversed(shape):
        out.append(flat % d)
        flat //= d
    return list(reversed(out))


def linear_hull(shape, a: int, b: int) -> Box:
    """The smallest box of ``shape`` containing the row-major flat range [a, b)."""
    if b <= a:
        return tuple((0, 0) for _ in shape)
    lo, hi = _unravel(shape, a), _unravel(shape, b - 1)
    box = []
    for d in range(len(shape)):
        if lo[d] == hi[d]:
            box.append((lo[d], lo[d] + 1))
            continue
        box.append((lo[d], hi[d] + 1))
        box.extend((0, n) for n in shape[d + 1:])
        break
    return tuple(box)


def _rows(R: int) -> tuple[int, ...]:
    """Split dims for data-movement ops: the leading dims (the innermost stays whole, coalesced)."""
    return tuple(range(R - 1)) if R >= 2 else tuple(range(R))


def reshape(ins, outs, attrs) -> Tiling:
    x, P = ins[0].shape, outs[0].shape
    if any(d == 0 for d in P):
        return None

    def fp(box):
        a = _ravel(P, [lo for lo, _ in box])
        b = _ravel(P, [hi - 1 for _, hi in box]) + 1
        return [linear_hull(x, a, b) if x else ()], [box]

    return Tiling(_rows(len(P)), fp, kind="reshape")


def permute(ins, outs, attrs) -> Tiling:
    perm = attrs.get("perm")
    R = len(outs[0].shape)
    if not isinstance(perm, tuple) or sorted(perm) != list(range(R)):
        return None

    def fp(box):
        xb = [None] * R
        for k, p in enumerate(perm):
            xb[p] = box[k]
        return [tuple(xb)], [box]

    return Tiling(_rows(R), fp, kind="permute")


def expand(ins, outs, attrs) -> Tiling:
    x, P = ins[0].shape, outs[0].shape
    return Tiling(_rows(len(P)), lambda box: ([broadcast_box(box, P, x)], [box]), kind="expand")


def slice_(ins, outs, attrs) -> Tiling:
    dim, start, step = attrs.get("dim"), attrs.get("start"), attrs.get("step")
    if not all(isinstance(v, int) for v in (dim, start, step)) or step < 1:
        return None
    R = len(outs[0].shape)

    def fp(box):
        lo, hi = box[dim]
        xb = list(box)
        xb[dim] = (start + lo * step, start + (hi - 1) * step + 1) if hi > lo else (start, start)
        return [tuple(xb)], [box]

    return Tiling(_rows(R) if R > 1 else (0,), fp, kind="slice")


def select(ins, outs, attrs) -> Tiling:
    dim, index = attrs.get("dim"), attrs.get("index")
    if not isinstance(dim, int) or not isinstance(index, int):
        return None
    R = len(outs[0].shape)

    def fp(box):
        xb = list(box)
        xb.insert(dim, (index, index + 1))
        return [tuple(xb)], [box]

    return Tiling(_rows(R), fp, kind="select")


def concat(ins, outs, attrs) -> Tiling:
    dim = attrs.get("dim")
    if not isinstance(dim, int) or any(t is None for t in ins):
        return None
    offsets = []
    o = 0
    for t in ins:
        offsets.append(o)
        o += t.shape[dim]

    def fp(box):
        lo, hi = box[dim]
        reads = []
        for t, off in zip(ins, offsets):
            a, b = max(lo - off, 0), min(hi - off, t.shape[dim])
            xb = list(box)
            xb[dim] = (a, b) if a < b else (0, 0)
            reads.append(tuple(xb))
        return reads, [box]

    return Tiling(_rows(len(outs[0].shape)), fp, kind="concat")


def slice_scatter(ins, outs, attrs) -> Tiling:
    dim, start, end, step = (attrs.get(k) for k in ("dim", "start", "end", "step"))
    if not all(isinstance(v, int) for v in (dim, start, end, step)) or step < 1:
        return None
    n_src = ins[1].shape[dim]

    def fp(box):
        lo, hi = box[dim]
        a = max(0, -(-(max(lo, start) - start) // step))
        b = min(n_src, -(-(min(hi, end) - start) // step))
        sb = list(box)
        sb[dim] = (a, b) if a < b else (0, 0)
        return [box, tuple(sb)], [box]

    return Tiling(_rows(len(outs[0].shape)), fp, kind="slice_scatter")


def select_scatter(ins, outs, attrs) -> Tiling:
    dim, index = attrs.get("dim"), attrs.get("index")
    if not isinstance(dim, int) or not isinstance(index, int):
        return None

    def fp(box):
        lo, hi = box[dim]
        sb = list(box[:dim]) + list(box[dim + 1:])
        if not lo <= index < hi:
            sb = [(0, 0)] * len(sb)
        return [box, tuple(sb)], [box]

    return Tiling(_rows(len(outs[0].shape)), fp, kind="select_scatter")


def embedding(ins, outs, attrs) -> Tiling:
    w = ins[0]
    R = len(outs[0].shape)
    if w is None or len(w.shape) != 2 or R < 1:
        return None

    def fp(box):  # rows of the table are data-dependent: read them all, for the tile's columns
        return [((0, w.shape[0]), box[-1]), tuple(box[:-1])], [box]

    return Tiling(tuple(range(R - 1)), fp, kind="embedding")


def index_select(ins, outs, attrs) -> Tiling:
    dim = attrs.get("dim")
    if not isinstance(dim, int):
        return None
    x = ins[0].shape
    R = len(outs[0].shape)

    def fp(box):
        xb = list(box)
        xb[dim] = (0, x[dim])
        return [tuple(xb), (box[dim],)], [box]

    return Tiling(_rows(R), fp, kind="index_select")


def gather(ins, outs, attrs) -> Tiling:
    dim = attrs.get("dim")
    if not isinstance(dim, int):
        return None
    x = ins[0].shape
    R = len(outs[0].shape)

    def fp(box):
        xb = list(box)
        xb[dim] = (0, x[dim])
        return [tuple(xb), box], [box]

    return Tiling(_rows(R), fp, kind="gather")


def scatter_like(ins, outs, attrs) -> Tiling:
    """Scatters (embedding_backward, index_add, scatter, scatter_add): where a source element
    lands is data, so a tile of the output reads every source and index element and applies those
    that fall inside it (latch-codegen-h100's bodies do exactly that); the base operand, where
    there is one, is read at the tile. Tiles never write each other's bytes."""
    P = outs[0].shape
    if len(P) < 1:
        return None
    base = len(ins) == 3  # (x, idx, src): out starts as x

    def fp(box):
        reads = [None if t is None else full_box(t.shape) for t in ins]
        if base and ins[0] is not None and tuple(ins[0].shape) == tuple(P):
            reads[0] = box
        return reads, [box]

    return Tiling(_rows(len(P)), fp, kind="scatter")


def scatter_walk(ins, outs, attrs) -> Tiling:
    """index_add, scatter, scatter_add: scatter_like's tiles, each of which walks every index
    (ins[1]) to find the sources that land in it, so a task costs that walk whatever its size."""
    t = scatter_like(ins, outs, attrs)
    if t is None or len(ins) < 2 or ins[1] is None:
        return t
    return _attrs.evolve(t, task_bytes=float(ins[1].nbytes))


def nll_loss_backward(ins, outs, attrs) -> Tiling:
    """grad_input[N, C] row by row: each row needs its target, the scalar grad and total weight."""
    P = outs[0].shape
    if len(P) != 2:
        return None

    def fp(box):
        reads = []
        for k, t in enumerate(ins):
            if t is None:
                reads.append(None)
            elif k == 1:  # logp: the tile itself
                reads.append(box)
            elif k == 2 and len(t.shape) == 1:  # target rows
                reads.append((box[0],))
            else:
                reads.append(full_box(t.shape))
        return reads, [box]

    return Tiling((0,), fp, kind="nll_loss_backward")


BY_NAME: dict[str, Callable] = {
    "latch::reshape": reshape,
    "latch::permute": permute,
    "latch::expand": expand,
    "latch::slice": slice_,
    "latch::select": select,
    "latch::concat": concat,
    "latch::slice_scatter": slice_scatter,
    "latch::select_scatter": select_scatter,
    "latch::embedding": embedding,
    "latch::index_select": index_select,
    "latch::gather": gather,
    "latch::nll_loss_backward": nll_loss_backward,
    "latch::embedding_backward": scatter_like,
    "latch::index_add": scatter_walk,
    "latch::scatter": scatter_walk,
    "latch::scatter_add": scatter_walk,
}

# Views that read each input element at most once per output element and never broadcast: an
# elementwise producer may be fused into them without recomputation.
INJECTIVE_VIEWS = frozenset({"latch::reshape", "latch::permute", "latch::slice", "latch::select"})


def by_name(op: str, ins: list[TensorType | None], outs: list[TensorType], attrs: dict) -> Tiling | None:
    fn = BY_NAME.get(op)
    if fn is None or not outs:
        return None
    try:
        return fn(ins, outs, attrs)
    except (TypeError, IndexError, KeyError):
        return None
