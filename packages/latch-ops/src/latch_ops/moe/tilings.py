"""How the ragged matmuls split into tasks (``OpSpec.extra["tiling"]``, CONTRACTS.md section 3).

Which rows belong to which expert is data, so a footprint cannot name the experts a tile meets:
footprints read every expert's weights (ragged_mm, grad_x) or every row (grad_w). They are
supersets of what a body touches, as the validator and the arena simulator require. A row tile
may straddle experts; the body walks ``offsets`` to find the segments inside its rows.

The record is ``latch_core.tiling.Tiling``: latch-ops does not depend on latch-schedule.
"""

from __future__ import annotations

TILE = 128  # rows per tile (the wgmma body's block tile: two warpgroups of 64 rows); columns: ``cols``
WIDE = 256  # columns per tile of a wide BF16/F16 product (wgmma N = 256)


def cols(out_cols: int, dtype: str) -> int:
    """Columns per tile of ragged_mm / ragged_mm_grad_x with ``out_cols`` output columns and
    operands of ``dtype``: 256 for BF16/F16 outputs of at least 256 columns (the grouped wgmma
    body then runs one 128 x 256 sub-tile per expert the rows meet), else 128. Run 29
    (results/rg.md): the 128 x 128 tiles ran at ~1.6 TFLOP/s per SM; the dense wgmma body's
    steady-state rate at BN 256 is 1.27x that at BN 128 (results/gpu.md run 10: 655 vs 514
    TFLOP/s), each tile loads A once for twice the columns, and TinyMoE-200M's phases become one
    wave (128 and 96 tasks instead of 256 and 192) whose slowest task is one straddling tile
    rather than two. The lowering (latch_codegen_h100.lower_moe.ragged_wgmma) takes BN from here."""
    return WIDE if dtype in ("bf16", "f16") and out_cols >= WIDE else TILE


def _tiling(split_dims, footprint, granule, kind):
    from latch_core.tiling import Tiling

    return Tiling(split_dims, footprint, granule=granule, kind=kind)


def _full(t):
    return tuple((0, d) for d in t.shape)


def _ragged_rows(in_types, out_types, w_col_dim: int, kind: str):
    """Output tiles of rows x columns; a tile reads its rows of the row operand (every column),
    its columns of every expert's weight (w's dim ``w_col_dim``) and all offsets."""
    rows, w, offsets = in_types

    def footprint(box):
        (r0, r1), cols = box
        wbox = [(0, d) for d in w.shape]
        wbox[w_col_dim] = cols
        return [((r0, r1), (0, rows.shape[1])), tuple(wbox), _full(offsets)], [box]

    return _tiling((0, 1), footprint, (TILE, cols(out_types[0].shape[1], rows.dtype)), kind)


def ragged_mm(in_types, out_types, attrs):
    """ragged_mm(x, w, offsets) -> out[R, Dout]: output column j is w's column j (w's last dim)."""
    return _ragged_rows(in_types, out_types, 2, "ragged_mm")


def ragged_grad_x(in_types, out_types, attrs):
    """ragged_mm_grad_x(grad, w, offsets) -> dx[R, Din]: dx column i is w's row i (w's middle dim),
    since the body multiplies by w[e] transposed."""
    return _ragged_rows(in_types, out_types, 1, "ragged_grad_x")


def ragged_grad_w(in_types, out_types, attrs):
    """ragged_mm_grad_w(x, grad, offsets) -> dw[E, Din, Dout]: tiles of (one expert, Din block,
    Dout block); a tile reads its Din columns of every row of x and its Dout columns of every
    row of grad (the expert's rows are data)."""
    x, grad, offsets = in_types

    def footprint(box):
        _e, din, dout = box
        return [((0, x.shape[0]), din), ((0, grad.shape[0]), dout), _full(offsets)], [box]

    return _tiling((0, 1, 2), footprint, (1, TILE, TILE), "ragged_grad_w")


def token_topk(in_types, out_types, attrs):
    """token_topk(probs) -> (values[N, k], indices[N, k]): tiles of rows (a warp per row); a tile
    reads its rows of probs (every expert) and writes its rows of both outputs. How many rows a tile
    holds is the cost model's choice (granule 0)."""
    (probs,) = in_types

    def footprint(box):
        rows = box[0]
        return [(rows, (0, probs.shape[1]))], [box, box]

    return _tiling((0,), footprint, (0,), "token_topk")


def token_topk_backward(in_types, out_types, attrs):
    """token_topk_backward(grad_values[N, k], indices[N, k]) -> grad_probs[N, E]: tiles of rows; a tile
    reads its rows of both inputs (every slot) and writes its rows of grad_probs (every expert). Run
    29: as one task it took 133 us a layer (an element per thread, two dependent loads each) while
    the other SMs waited; the scheduler spreads it by rows (latch_schedule.tasks.ROW_BODIES)."""
    g, idx = in_types

    def footprint(box):
        rows = box[0]
        return [(rows, (0, g.shape[1])), (rows, (0, idx.shape[1]))], [(rows, (0, out_types[0].shape[1]))]

    return _tiling((0,), footprint, (0,), "token_topk_backward")
