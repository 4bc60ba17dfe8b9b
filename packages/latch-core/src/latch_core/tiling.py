"""The record an op's tiling rule returns (``OpSpec.extra["tiling"]``, CONTRACTS.md section 3).

It lives in latch-core because both sides use it: op packages (latch-ops, third-party plugins)
build it, the schedulers (latch-schedule) read it; neither imports the other. How tiles are sized
and costed is the scheduler's business (``latch_schedule.tiling``).

A :class:`Tiling` says which dims of the op's first (primary) output a tile may split, and gives
``footprint(out_box) -> (input_boxes, output_boxes)``: for a box of the primary output (one
``(start, stop)`` pair per dim), the box of every operand the body reads (``None`` for an absent
operand) and the box of every output it writes. Footprints must be supersets of what the body
touches: the validator and the arena simulator trust them.
"""

from __future__ import annotations

from typing import Any, Callable

import attrs

Box = tuple  # tuple[tuple[int, int], ...]: one half-open (start, stop) range per dim
Footprint = Callable[[Box], tuple[list, list]]


@attrs.frozen
class Tiling:
    """``split_dims``: dims of the primary output tiles may split (empty: one task).
    ``granule``: per split dim, the fixed tile extent (0: chosen from the cost model).
    ``footprint(out_box) -> (input_boxes, output_boxes)``; see the module docstring."""

    split_dims: tuple[int, ...] = attrs.field(converter=tuple)
    footprint: Footprint = attrs.field(eq=False)
    granule: tuple[int, ...] = attrs.field(default=(), converter=tuple)
    kind: str = "custom"
    # matmul tiles' dispatch order over the last two dims (the SMs take consecutive tiles at once):
    # ("m", G): N-major, G row blocks fastest; ("n", G): row-major within groups of G column blocks;
    # () for plain row-major. latch_schedule.tiling.raster chooses it.
    raster: tuple = attrs.field(default=(), converter=tuple)
    # the relative work of a tile (its box of the primary output -> a positive number), where tiles
    # of one op differ (causal attention: a block of query rows visits the keys up to its last row);
    # None: proportional to the tile's volume. The scheduler shares the op's cost out by it.
    weight: Callable[[Any], float] | None = attrs.field(default=None, eq=False)
    # bytes every task reads whatever its box (a scatter's tile walks every index: latch-codegen-h100's
    # bodies), added to each task's share of the op's cost, so the assignment sees what a tile of
    # such an op really costs (run 53: 40 scatter tasks modelled at 2 us ran ~90 us each)
    task_bytes: float = 0.0

    def granule_of(self, dim: int) -> int:
        if not self.granule:
            return 0
        return self.granule[self.split_dims.index(dim)]
