"""Arena offset assignment: greedy by size, best fit into the gaps left by conflicting values.

Input: items (name, size, start, end) and a conflict relation (two items conflict when they may be
live at the same time; see :meth:`latch_memory.liveness.Liveness.compatible`). Output: an offset per
item, each a multiple of ``alignment``, such that conflicting items never share a byte.

The rule (unchanged from the quadratic first version, so arenas are exactly as tight):
- order: largest items first (ties: earliest start, then input order), the classic greedy-by-size
  order: big values claim space while it is free, small ones fill the gaps;
- placement: among the gaps between the byte ranges of placed items whose intervals overlap this
  one's, take the *smallest* gap the item fits in (best fit); if none fits, place it above them;
- items with disjoint intervals may still conflict (under the dataflow strategy two values can be
  disjoint in one execution order yet unordered): ``ordered(a, b)`` (the expensive happens-before
  test) is asked only about placed items sharing bytes with the chosen position; a refusal makes
  that item part of the gaps and the search repeats.

How it avoids comparing each item with every placed one (which took 21-46 s on a 64-layer
transformer, 8,000 arena values):

1. Which bytes are busy during ``[start, end]``: a segment tree over execution positions. A placed
   item is stored as its byte range in the *cover* union of the O(log T) canonical nodes of its
   interval and in the *sub* union of those nodes and their ancestors. The byte ranges of all items
   overlapping ``[start, end]`` are the sub unions of the query's canonical nodes plus the cover
   unions of their ancestors: O(log T) unions. Each union is kept merged (a sorted list of disjoint
   ranges), so its length is the number of holes in that part of the arena, not a count of items.
   A range is stored rounded up to the alignment (no item can start in the padding, so nothing
   changes but that unions merge through it and a gap's waste counts only usable bytes). Building
   costs O(n log T) union insertions; memory is O(n log T). A query costs the length of the
   O(log T) unions it merges (in C: sorting sorted runs, then map/accumulate), not O(n): on the
   64-layer transformer (8,103 arena values) ~200 ranges per query.
2. Which placed items with disjoint intervals share bytes with the chosen position ``[off, off +
   size)``: every placed item is at least as large as this one (largest first), so any item
   overlapping the position contains its first or its last byte. Items containing one byte are
   pairwise disjoint in time and (an invariant the search maintains) pairwise ordered, so by
   transitivity of happens-before only the latest one ending before ``start`` and the earliest one
   starting after ``end`` need asking: at most four ``ordered`` questions per candidate position.
   (Transitivity: if every user of A happens before every writer of B, and of B before C, then of A
   before C, because a writer of B is one of B's users.) Finding them: items are indexed by size
   class (``size.bit_length()``), each class sorted by offset; an item of class c containing byte p
   starts in ``(p - 2**(c+1), p]``.

The result satisfies the full relation: each pair of items sharing bytes has disjoint intervals and
was asked (directly or through the transitive chain).
"""

from __future__ import annotations

import bisect
from itertools import accumulate, chain, compress, repeat
from operator import and_, ge, rshift, sub
from typing import Callable, Hashable, Sequence


def align_up(x: int, alignment: int) -> int:
    return -(-x // alignment) * alignment


class _Union:
    """A merged union of byte ranges: ``keys`` are ``lo << S | hi`` for sorted disjoint ranges (one
    int per range sorts in C far faster than tuples); ``lo``/``hi`` the same, for bisection."""

    __slots__ = ("lo", "hi", "keys")

    def __init__(self):
        self.lo: list[int] = []
        self.hi: list[int] = []
        self.keys: list[int] = []

    def add(self, a: int, b: int, shift: int) -> None:
        lo, hi = self.lo, self.hi
        i = bisect.bisect_left(hi, a)  # first range reaching a (touching ranges merge)
        j = bisect.bisect_right(lo, b)  # past the last range starting at or before b
        if i < j:
            a = min(a, lo[i])
            b = max(b, hi[j - 1])
        lo[i:j] = [a]
        hi[i:j] = [b]
        self.keys[i:j] = [(a << shift) | b]


class _BusyTree:
    """Byte ranges of placed items, queried by execution interval (see the module docstring, 1)."""

    def __init__(self, positions: int, shift: int):
        n = 1
        while n < positions:
            n *= 2
        self.n = n
        self.shift = shift
        self.cover: dict[int, _Union] = {}
        self.sub: dict[int, _Union] = {}

    def _canonical(self, s: int, e: int) -> list[int]:
        lo, hi, out = s + self.n, e + self.n + 1, []
        while lo < hi:
            if lo & 1:
                out.append(lo)
                lo += 1
            if hi & 1:
                hi -= 1
                out.append(hi)
            lo >>= 1
            hi >>= 1
        return out

    @staticmethod
    def _ancestors(nodes: list[int]) -> set[int]:
        seen: set[int] = set()
        for x in nodes:
            x >>= 1
            while x and x not in seen:
                seen.add(x)
                x >>= 1
        return seen

    def busy(self, s: int, e: int) -> list[int]:
        """Sorted keys (``lo << shift | hi``) of byte ranges busy at some position of ``[s, e]``
        (ranges may overlap; the caller sweeps them)."""
        nodes = self._canonical(s, e)
        lists = [u.keys for u in (self.sub.get(d) for d in nodes) if u is not None]
        lists += [u.keys for u in (self.cover.get(a) for a in self._ancestors(nodes)) if u is not None]
        if len(lists) == 1:
            return lists[0]
        return sorted(chain.from_iterable(lists))  # sorted runs: timsort merges them

    def add(self, s: int, e: int, a: int, b: int) -> None:
        nodes = self._canonical(s, e)
        for d in nodes:
            u = self.cover.get(d)
            if u is None:
                u = self.cover[d] = _Union()
            u.add(a, b, self.shift)
        for x in self._ancestors(nodes).union(nodes):
            u = self.sub.get(x)
            if u is None:
                u = self.sub[x] = _Union()
            u.add(a, b, self.shift)


def _best_gap(keys: list[int], extra: list[tuple[int, int]], size: int, alignment: int, shift: int) -> int:
    """Lowest-waste aligned offset for ``size`` bytes outside the busy ranges (``keys`` encoded,
    ``extra`` plain pairs): the smallest gap between ranges that holds it, else above them all.
    The sweep over the ranges runs in C (map/accumulate/compress); Python sees only the gaps."""
    if extra:
        keys = sorted(chain(keys, ((lo << shift) | hi for lo, hi in extra)))
    if not keys:
        return 0
    los = list(map(rshift, keys, repeat(shift)))
    reach = list(accumulate(map(and_, keys, repeat((1 << shift) - 1)), max))  # running max of range ends
    best_off, best_waste = None, None
    # gaps at least ``size`` wide before alignment (a necessary condition), selected in C
    wide = compress(range(1, len(los)), map(ge, map(sub, los[1:], reach), repeat(size)))
    gaps = chain(((0, los[0]),) if los[0] >= size else (), ((reach[t - 1], los[t]) for t in wide))
    for cursor, lo in gaps:
        start = align_up(cursor, alignment)
        if start + size <= lo:
            waste = lo - cursor - size
            if best_waste is None or waste < best_waste:
                best_off, best_waste = start, waste
    return best_off if best_off is not None else align_up(reach[-1], alignment)


class _Stabbing:
    """Placed items by size class, each class sorted by offset (see the module docstring, 2)."""

    def __init__(self):
        self.offs: dict[int, list[int]] = {}
        self.ids: dict[int, list[int]] = {}

    def add(self, off: int, size: int, i: int) -> None:
        c = size.bit_length()
        offs = self.offs.setdefault(c, [])
        k = bisect.bisect_right(offs, off)
        offs.insert(k, off)
        self.ids.setdefault(c, []).insert(k, i)

    def containing(self, p: int, offsets: list[int], sizes: list[int]):
        for c, offs in self.offs.items():
            ids = self.ids[c]
            k = bisect.bisect_right(offs, p - (1 << c))  # sizes of class c are < 2**c
            while k < len(offs) and offs[k] <= p:
                i = ids[k]
                if offsets[i] + sizes[i] > p:
                    yield i
                k += 1


def assign_offsets(
    items: Sequence[tuple[Hashable, int, int, int]],
    ordered: Callable[[Hashable, Hashable], bool] | None = None,
    *,
    alignment: int = 256,
    base: int = 0,
) -> tuple[dict[Hashable, int], int]:
    """Offsets (all >= ``base``) for ``items`` and the end of the highest one (the arena size).

    ``items``: ``(name, size, start, end)``; items whose closed intervals ``[start, end]`` overlap
    conflict for sure. ``ordered(a, b)``: items with disjoint intervals may share bytes (None:
    always; otherwise asked lazily, see the module docstring). The relation must be the
    happens-before one (transitive in the sense above); Liveness.compatible is.
    """
    if alignment <= 0 or alignment & (alignment - 1):
        raise ValueError(f"alignment must be a positive power of two, got {alignment}")
    n = len(items)
    offsets: dict[Hashable, int] = {}
    if n == 0:
        return offsets, base
    names = [it[0] for it in items]
    sizes = [int(it[1]) for it in items]
    lo_pos = min(it[2] for it in items)
    starts = [it[2] - lo_pos for it in items]
    ends = [it[3] - lo_pos for it in items]
    bound = sum(align_up(s, alignment) for s in sizes) + alignment  # no offset reaches it
    shift = max(1, bound.bit_length())
    tree = _BusyTree(max(ends) + 1, shift)
    stab = _Stabbing()
    off_of = [0] * n
    top = 0
    for i in sorted(range(n), key=lambda k: (-sizes[k], starts[k], k)):
        size, s, e = sizes[i], starts[i], ends[i]
        if size == 0:
            offsets[names[i]] = base
            continue
        keys = tree.busy(s, e)
        extra: list[tuple[int, int]] = []
        asked: dict[int, bool] = {}
        while True:
            off = _best_gap(keys, extra, size, alignment, shift)
            clash = None if ordered is None else _refusal(
                off, size, s, e, i, stab, off_of, sizes, starts, ends, names, ordered, asked)
            if clash is None:
                break
            extra.append((off_of[clash], align_up(off_of[clash] + sizes[clash], alignment)))
        off_of[i] = off
        offsets[names[i]] = base + off
        top = max(top, off + size)
        tree.add(s, e, off, align_up(off + size, alignment))
        stab.add(off, size, i)
    return offsets, base + top


def _refusal(off, size, s, e, i, stab, off_of, sizes, starts, ends, names, ordered, asked) -> int | None:
    """A placed item sharing bytes with ``[off, off + size)`` that ``ordered`` refuses, else None.
    Only the time neighbours of the position's first and last byte are asked (module docstring, 2);
    items overlapping ``[s, e]`` in time are never there (the gap search excludes their bytes)."""
    for p in (off, off + size - 1):
        pred = succ = None
        for j in stab.containing(p, off_of, sizes):
            if ends[j] < s:
                if pred is None or ends[j] > ends[pred]:
                    pred = j
            elif starts[j] > e:
                if succ is None or starts[j] < starts[succ]:
                    succ = j
        for j in (pred, succ):
            if j is None:
                continue
            ok = asked.get(j)
            if ok is None:
                ok = asked[j] = bool(ordered(names[i], names[j]))
            if not ok:
                return j
    return None


# --------------------------------------------------------------------------------------------
# Lower bounds over the same items


def profile(items: Sequence[tuple[Hashable, int, int, int]]) -> list[tuple[int, int]]:
    """(position, summed size of the items live from there on), at every change."""
    events: dict[int, int] = {}
    for _, size, start, end in items:
        events[start] = events.get(start, 0) + size
        events[end + 1] = events.get(end + 1, 0) - size
    out, cur = [], 0
    for p in sorted(events):
        cur += events[p]
        out.append((p, cur))
    return out


def peak(items: Sequence[tuple[Hashable, int, int, int]]) -> int:
    """The largest summed size of items live at one position (a lower bound on any placement)."""
    return max((cur for _, cur in profile(items)), default=0)


def clique_bound(items: Sequence[tuple[Hashable, int, int, int]], ordered: Callable[[Hashable, Hashable], bool],
                 *, positions: int = 8, candidates: int = 200) -> int:
    """A lower bound on any placement: the summed size of a set of items that pairwise conflict.

    Items live at one position conflict pairwise; to the live set of each of the ``positions``
    fullest positions are added, largest first, those of the ``candidates`` largest items that
    conflict with every member although their intervals are disjoint (``ordered`` says no: e.g.
    values of phases with no barrier between them). At least :func:`peak`. ``ordered`` is asked
    about disjoint pairs only, as in :func:`assign_offsets`.
    """
    tops = sorted(profile(items), key=lambda pc: -pc[1])[:positions]
    big = sorted(items, key=lambda it: -it[1])[:candidates]
    best = 0
    for p, _ in tops:
        members = [it for it in items if it[2] <= p <= it[3]]
        weight = sum(it[1] for it in members)
        inside = {it[0] for it in members}
        # Members overlapping a candidate in time conflict with it for sure; only the others need
        # ``ordered``. Every member contains p, so for a candidate after p those are the members
        # ending before it starts (a prefix by end), for one before p those starting after it ends.
        by_end = sorted(members, key=lambda m: m[3])
        ends = [m[3] for m in by_end]
        by_start = sorted(members, key=lambda m: m[2])
        starts = [m[2] for m in by_start]
        added: list = []
        for c in big:
            if c[0] in inside:
                continue
            if c[2] > p:
                disjoint = by_end[:bisect.bisect_left(ends, c[2])]
            else:
                disjoint = by_start[bisect.bisect_right(starts, c[3]):]
            if all(not ordered(c[0], m[0]) for m in disjoint) and all(
                    (c[2] <= m[3] and m[2] <= c[3]) or not ordered(c[0], m[0]) for m in added):
                added.append(c)
                inside.add(c[0])
                weight += c[1]
        best = max(best, weight)
    return best
