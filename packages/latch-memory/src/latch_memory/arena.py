"""Arena offset assignment: best-fit into the gaps left by conflicting values.

Input: items (name, size, start, end) and a conflict relation (two items conflict when they may be
live at the same time; see :meth:`latch_memory.liveness.Liveness.compatible`). Output: an offset per item, each
a multiple of ``alignment``, such that conflicting items never share a byte.

Order: largest items first (ties: earliest start), the classic greedy-by-size order: big values
claim space while it is free, small ones fill the gaps. Placement: among the gaps between the
byte ranges of already placed items that conflict with this one, take the *smallest* gap the item
fits in (best fit); if none fits, place it above the highest conflicting item.

Conflicts are asked lazily: overlapping intervals (positions in one execution order) conflict for
sure and pick the gaps; ``ordered(a, b)`` (the expensive happens-before test) is only asked for
items with disjoint intervals that would share bytes with the chosen position, and a failure
makes that item a conflict and the search repeat. The result satisfies the full relation.
"""

from __future__ import annotations

from typing import Callable, Hashable, Sequence


def align_up(x: int, alignment: int) -> int:
    return -(-x // alignment) * alignment


def _best_gap(busy: list[tuple[int, int]], size: int, alignment: int) -> int:
    """Lowest-waste aligned offset for ``size`` bytes outside the sorted, possibly overlapping
    ``busy`` ranges."""
    best_off, best_waste = None, None
    cursor = 0
    for lo, hi in busy:
        start = align_up(cursor, alignment)
        if start + size <= lo:
            waste = lo - cursor - size
            if best_waste is None or waste < best_waste:
                best_off, best_waste = start, waste
        cursor = max(cursor, hi)
    if best_off is not None:
        return best_off
    return align_up(cursor, alignment)


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
    always; otherwise asked lazily, see the module docstring).
    """
    if alignment <= 0 or alignment & (alignment - 1):
        raise ValueError(f"alignment must be a positive power of two, got {alignment}")
    queue = sorted(items, key=lambda it: (-it[1], it[2]))
    placed: list[tuple[Hashable, int, int, int, int]] = []  # (name, offset, end offset, start, end)
    offsets: dict[Hashable, int] = {}
    top = base
    for name, size, start, end in queue:
        if size == 0:
            offsets[name] = base
            continue
        busy = []
        maybe = []
        for other, lo, hi, s2, e2 in placed:
            if start <= e2 and s2 <= end:
                busy.append((lo - base, hi - base))
            elif ordered is not None:
                maybe.append((other, lo - base, hi - base))
        busy.sort()
        checked: set = set()
        while True:
            off = _best_gap(busy, size, alignment)
            clash = None
            for other, lo, hi in maybe:
                if lo < off + size and off < hi and other not in checked:
                    checked.add(other)
                    if not ordered(name, other):
                        clash = (lo, hi)
                        break
            if clash is None:
                break
            busy.append(clash)
            busy.sort()
        offsets[name] = base + off
        placed.append((name, base + off, base + off + size, start, end))
        top = max(top, base + off + size)
    return offsets, top


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
        for c in big:
            if c[0] in inside:
                continue
            if all((c[2] <= m[3] and m[2] <= c[3]) or not ordered(c[0], m[0]) for m in members):
                members.append(c)
                inside.add(c[0])
                weight += c[1]
        best = max(best, weight)
    return best
