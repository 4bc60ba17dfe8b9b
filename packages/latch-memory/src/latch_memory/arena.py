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
