"""Boxes (per-dimension half-open ranges) and an overlap index over them.

A box of a rank-r value is a tuple of r ``(lo, hi)`` pairs; the scalar's box is ``()``. Tiles of
one op form a grid (a product of per-dimension interval lists), so the index below answers "which
boxes overlap this one" by bisecting the distinct intervals of one dimension, then filtering the
others: O(log n + hits) for grids, never all-pairs. Everything here is exact integer arithmetic.
"""

from __future__ import annotations

import bisect
import itertools
import math
from typing import Any, Generic, Iterable, Sequence, TypeVar

Box = tuple[tuple[int, int], ...]
T = TypeVar("T")


def full_box(shape: Sequence[int]) -> Box:
    return tuple((0, int(d)) for d in shape)


def volume(box: Box) -> int:
    return math.prod(hi - lo for lo, hi in box)


def is_empty(box: Box) -> bool:
    for lo, hi in box:
        if hi <= lo:
            return True
    return False


def overlaps(a: Box, b: Box) -> bool:
    """Non-empty intersection (scalars always overlap each other)."""
    for (alo, ahi), (blo, bhi) in zip(a, b):
        if alo >= bhi or blo >= ahi:
            return False
    return not (is_empty(a) or is_empty(b))


def intersect(a: Box, b: Box) -> Box:
    return tuple((max(alo, blo), min(ahi, bhi)) for (alo, ahi), (blo, bhi) in zip(a, b))


def contains(outer: Box, inner: Box) -> bool:
    if is_empty(inner):
        return True
    return all(olo <= ilo and ihi <= ohi for (olo, ohi), (ilo, ihi) in zip(outer, inner))


def hull(a: Box | None, b: Box) -> Box:
    if a is None:
        return b
    return tuple((min(alo, blo), max(ahi, bhi)) for (alo, ahi), (blo, bhi) in zip(a, b))


def within(box: Box, shape: Sequence[int]) -> bool:
    if len(box) != len(shape):
        return False
    for (lo, hi), d in zip(box, shape):
        if not 0 <= lo <= hi <= d:
            return False
    return True


def covered(box: Box, parts: Sequence[Box], disjoint: bool) -> bool:
    """Is ``box`` covered by the union of ``parts``? Exact: by volume when the parts are known to be
    pairwise disjoint, else by coordinate compression of the (few) overlapping parts."""
    if is_empty(box):
        return True
    clipped = [intersect(box, p) for p in parts]
    clipped = [c for c in clipped if not is_empty(c)]
    if disjoint:
        return sum(volume(c) for c in clipped) == volume(box)
    if any(contains(c, box) for c in clipped):
        return True
    cuts = [sorted({box[k][0], box[k][1]} | {c[k][0] for c in clipped} | {c[k][1] for c in clipped})
            for k in range(len(box))]
    # every elementary cell of the compressed grid must lie in some part
    cells = [list(zip(cs, cs[1:])) for cs in cuts]
    if math.prod(len(c) for c in cells) > 200_000:
        raise ValueError(f"coverage check of {box} by {len(clipped)} overlapping boxes is too large")

    def rec(k: int, prefix: list[tuple[int, int]]) -> bool:
        if k == len(cells):
            cell = tuple(prefix)
            return any(contains(c, cell) for c in clipped)
        for iv in cells[k]:
            prefix.append(iv)
            ok = rec(k + 1, prefix)
            prefix.pop()
            if not ok:
                return False
        return True

    return rec(0, [])


def broadcast_box(out_box: Box, out_shape: Sequence[int], in_shape: Sequence[int]) -> Box:
    """The box of a broadcast operand that an output box reads (NumPy rules: right-aligned, size-1
    dims read index 0). A dim that does not broadcast reads its whole extent (conservative)."""
    if in_shape == out_shape:
        return out_box
    r, R = len(in_shape), len(out_shape)
    if r > R:
        return full_box(in_shape)
    box = []
    for j, d in enumerate(in_shape):
        k = R - r + j
        if d == out_shape[k]:
            box.append(out_box[k])
        else:
            box.append((0, d))
    return tuple(box)


class BoxIndex(Generic[T]):
    """Items keyed by boxes of one value; ``query(box)`` gives the items whose box overlaps it.

    When every dim's distinct intervals are disjoint (what tilings produce: the boxes are cells of
    a grid, several items may share a cell) a query is a product of per-dim bisections, O(log n +
    hits). Otherwise the dim with the most distinct intervals is bisected and the rest filtered."""

    def __init__(self, items: Iterable[tuple[Box, T]]):
        self.items: list[tuple[Box, T]] = [(b, x) for b, x in items if not is_empty(b)]
        self._dim = -1
        self._grid: dict | None = None
        if not self.items or not self.items[0][0]:
            return
        rank = len(self.items[0][0])
        per_dim = [sorted({b[k] for b, _ in self.items}) for k in range(rank)]
        disjoint = [all(a[1] <= b[0] for a, b in zip(ivs, ivs[1:])) for ivs in per_dim]
        if all(disjoint):
            pos = [{iv: i for i, iv in enumerate(ivs)} for ivs in per_dim]
            cells: dict[tuple[int, ...], list[int]] = {}
            for i, (b, _) in enumerate(self.items):
                cells.setdefault(tuple(pos[k][b[k]] for k in range(rank)), []).append(i)
            self._grid = cells
            self._starts_d = [[lo for lo, _ in ivs] for ivs in per_dim]
            self._ends_d = [[hi for _, hi in ivs] for ivs in per_dim]
            # the hull of all items: a query containing it hits everything (whole-value reads)
            self._hull = tuple((ivs[0][0], ivs[-1][1]) for ivs in per_dim)
            self._all = sorted(i for hit in cells.values() for i in hit)
            return
        best = max(range(rank), key=lambda k: len(per_dim[k]))
        self._dim = best
        groups: dict[tuple[int, int], list[int]] = {}
        for i, (b, _) in enumerate(self.items):
            groups.setdefault(b[best], []).append(i)
        ivs = per_dim[best]
        self._disjoint_intervals = disjoint[best]
        self._starts = [lo for lo, _ in ivs]
        self._ends = [hi for _, hi in ivs]
        self._buckets = [groups[iv] for iv in ivs]

    def __len__(self) -> int:
        return len(self.items)

    def _query_idx(self, box: Box) -> list[int]:
        if not self.items:
            return []
        if self._grid is not None:
            for (lo, hi), (hlo, hhi) in zip(box, self._hull):
                if lo > hlo or hi < hhi:
                    break
            else:
                return list(self._all)
            ranges = []
            size = 1
            ends, starts = self._ends_d, self._starts_d
            for k, (lo, hi) in enumerate(box):
                a = bisect.bisect_right(ends[k], lo)
                b = bisect.bisect_left(starts[k], hi)
                if a >= b or hi <= lo:
                    return []
                ranges.append(range(a, b))
                size *= b - a
            cells = self._grid
            out: list[int] = []
            if size <= 4 * len(cells) + 16:
                get = cells.get
                if len(ranges) == 2:
                    r1 = ranges[1]
                    for i in ranges[0]:
                        for j in r1:
                            hit = get((i, j))
                            if hit:
                                out.extend(hit)
                else:
                    for cell in itertools.product(*ranges):
                        hit = get(cell)
                        if hit:
                            out.extend(hit)
            else:  # a sparse grid queried over a wide range: walk the occupied cells instead
                for cell, hit in cells.items():
                    if all(c in r for c, r in zip(cell, ranges)):
                        out.extend(hit)
                out.sort()
            return out
        if self._dim < 0:  # scalars
            return list(range(len(self.items)))
        if is_empty(box):
            return []
        lo, hi = box[self._dim]
        if self._disjoint_intervals:
            cand = range(bisect.bisect_right(self._ends, lo), bisect.bisect_left(self._starts, hi))
        else:
            last = bisect.bisect_left(self._starts, hi)
            cand = [k for k in range(last) if self._ends[k] > lo]
        items = self.items
        out = []
        for k in cand:
            for i in self._buckets[k]:
                if _overlap_nonempty(items[i][0], box):
                    out.append(i)
        return out

    def query(self, box: Box) -> list[T]:
        items = self.items
        return [items[i][1] for i in self._query_idx(box)]

    def pairs(self) -> list[tuple[T, T]]:
        """Every unordered pair of distinct items with overlapping boxes."""
        items = self.items
        if self._grid is not None:  # distinct cells are disjoint; items sharing a cell overlap
            return [(items[a][1], items[b][1]) for hit in self._grid.values() if len(hit) > 1
                    for i, a in enumerate(hit) for b in hit[i + 1:]]
        out = []
        for i, (b, x) in enumerate(items):
            for j in self._query_idx(b):
                if j > i:
                    out.append((x, items[j][1]))
        return out


def _overlap_nonempty(a: Box, b: Box) -> bool:
    """Overlap of two boxes already known to be non-empty."""
    for (alo, ahi), (blo, bhi) in zip(a, b):
        if alo >= bhi or blo >= ahi:
            return False
    return True


class MultiIndex(Generic[T]):
    """Several :class:`BoxIndex` under one query: items come in families (e.g. the tiles of one
    fusion group), each family a grid, while their union usually is not."""

    def __init__(self, items: Iterable[tuple[Box, T, Any]]):
        fams: dict[Any, list[tuple[Box, T]]] = {}
        for b, x, fam in items:
            fams.setdefault(fam, []).append((b, x))
        self.indexes = [BoxIndex(v) for v in fams.values()]

    def query(self, box: Box) -> list[T]:
        if len(self.indexes) == 1:
            return self.indexes[0].query(box)
        out: list[T] = []
        for idx in self.indexes:
            out.extend(idx.query(box))
        return out
