"""SM assignment: longest-processing-time first (LPT).

Each task, largest cost first, goes to the SM with the least work so far. For independent tasks
this is within 4/3 of the best possible makespan (Graham 1969), and it is O(n log S).
"""

from __future__ import annotations

import heapq
from typing import Sequence


def lpt(tasks: Sequence[int], cost: Sequence[float], num_sms: int,
        loads: list[float] | None = None) -> tuple[dict[int, int], list[float]]:
    """Assign ``tasks`` (ids into ``cost``) to SMs; returns (task -> SM, per-SM load).

    ``loads`` are the SMs' starting loads (default zero); ties go to the lower SM index, and
    equal costs keep task order, so the result is deterministic."""
    loads = list(loads) if loads is not None else [0.0] * num_sms
    heap = [(load, s) for s, load in enumerate(loads)]
    heapq.heapify(heap)
    where: dict[int, int] = {}
    for t in sorted(tasks, key=lambda t: (-cost[t], t)):
        load, s = heapq.heappop(heap)
        where[t] = s
        load += cost[t]
        loads[s] = load
        heapq.heappush(heap, (load, s))
    return where, loads
