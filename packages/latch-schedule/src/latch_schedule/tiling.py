"""Tiling: how an op's output splits into tiles, and what each tile reads and writes.

A :class:`Tiling` says which dims of the op's first (primary) output a tile may split, and gives
``footprint(out_box) -> (input_boxes, output_boxes)``: for a box of the primary output, the box of
every operand the body reads (``None`` for an absent operand) and the box of every output it
writes. Footprints must be supersets of what the body touches: the validator and the arena
simulator trust them.

Where a tiling comes from, first match wins:
1. ``OpSpec.extra["tiling"](in_types, out_types, attrs) -> Tiling`` (ops the tags cannot describe);
2. by op name, the core vocabulary's views, structural and indexing ops
   (:mod:`latch_schedule.tiling_ops`: reshape, permute, expand, slice, select, concat, ...);
3. the op's tags (``latch_core.registry``):
   - ``elementwise`` / ``copy``: any dim splits; operands follow broadcasting;
   - ``norm`` (row-wise: normalised over attr ``dims``/``dim``, default the last dim): the other
     dims split; every operand is read whole along the normalised dims;
   - ``reduction`` (attrs ``dims``, ``keepdim``): the kept dims split; reduced dims read whole;
   - ``matmul`` (``a[*B,M,K] @ b[*B,K,N]``, either operand possibly stored transposed, a leading
     split-K dim on the output): split and batch dims in tiles of 1, M and N in the tile of the
     node's recorded body configuration (``config``), else fixed tiles (128 x 128 up to 256 x 256,
     the largest that still balances over the SMs), reading rows of ``a`` and columns of ``b`` over
     the tile's K range;
4. anything else (indexing, routing, attention, structural, unknown ops, full reductions):
   ONE task covering every output, reading every operand whole.

How many tiles: a tiling with free dims (``granule`` 0) is split so each tile costs about
``CostModel.min_task`` seconds, and over every SM when each tile keeps ``min_spread_task`` (never more than ``max_tiles_per_sm * num_sms`` tiles, never more
tiles than elements); fixed dims (matmul M/N) use their granule. Tiny ops get one task.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import attrs

from latch_core.ir import DTYPES, TensorType
from latch_core.registry import ATTENTION, COPY, ELEMENTWISE, MATMUL, NORM, REDUCTION, VIEW, OpSpec

from .boxes import Box, broadcast_box, full_box

# The record itself is latch-core's (op packages build it without importing latch-schedule).
from latch_core.tiling import Footprint, Tiling  # noqa: E402,F401


@attrs.frozen
class CostModel:
    """Per-SM throughput of an H200 (132 SMs) used to size and balance tiles, in seconds."""

    sm_flops: float = 0.5e12  # FP32 CUDA-core FLOP/s per SM (elementwise, reductions)
    sm_mma_flops: float = 5.0e12  # tensor-core FLOP/s per SM (matmul, attention), ~70% of peak
    sm_bytes: float = 25e9  # HBM bytes/s per SM while every SM streams (~3.3 TB/s in total)
    task_overhead: float = 0.5e-6  # fixed cost of one task (dispatch, operand setup, epilogue)
    # Split free dims only into tiles of at least this much work: TinyMoE's 2 x 1024 update should
    # take ~3.4 ms on 132 SMs, ~450 SM-ms in all: tens of thousands of tasks of 10-20 us each.
    min_task: float = 20e-6
    # ...but an op with at least num_sms x min_spread_task of work spreads over every SM: run 14
    # (the dense transformer at full size) had row and elementwise ops on 12-40 SMs at ~150 us a
    # task while the others waited at the barrier (62% of SM-time).
    min_spread_task: float = 2e-6
    max_tiles_per_sm: int = 1  # an op gets at most num_sms * this many free-dim tiles (one wave)
    # (M, N) extents of matmul tiles, smallest first: a matmul takes the largest that still
    # gives it at least ``matmul_waves * num_sms`` tiles (balance), else the smallest.
    matmul_tiles: tuple[tuple[int, int], ...] = ((128, 128), (128, 256), (256, 256))
    matmul_waves: int = 2
    l2_bytes: float = 50e6  # the H200's L2 (tiles' raster order keeps operand blocks within half of it)
    num_sms: int = 132
    # Body-configuration choice (latch_schedule.matmul_configs): a tile's pipeline fill and drain,
    # the tensor cores' efficiency by tile width BN (the largest threshold <= BN applies, relative
    # to sm_mma_flops), the split-K factors tried, and the K steps each split must keep.
    # The efficiencies are measured: the wgmma body's steady-state rate per tile width on the H200
    # (results/gpu.md run 10: BN 256 655 TFLOP/s, 128 514, 64 304 at K >= 2048; 96 327 at K = 768)
    # over 132 x sm_mma_flops. Thin tiles lose more than their wave count wins: the shared-memory
    # traffic per flop grows as BN shrinks (4 BN / (256 + 3 BN) of the tensor cores' rate at best).
    mma_fill: float = 0.7e-6
    mma_eff: tuple[tuple[int, float], ...] = ((16, 0.12), (32, 0.23), (64, 0.46), (96, 0.55), (128, 0.78),
                                              (192, 0.9), (256, 1.0))
    # Split-K: run 13 timed each product both ways in one launch (results/gpu.md): the split wins
    # where few tiles meet a long K (lm_head dgrad at 2048 tokens 65% -> 86% of cuBLAS, the K = 32768
    # weight gradients 45-72% -> 85-101%) and loses on short ones (attn_out wgrad at 2048: 7.7 ->
    # 16.8 us), where the partials' sum, a phase of its own behind a barrier, costs more than the
    # idle SMs: ``split_k_overhead`` is that phase's fixed cost.
    split_k_choices: tuple[int, ...] = (1, 2, 4, 8, 16)
    split_k_min_steps: int = 4  # S > 1 only when K / S >= this many k_tile steps
    split_k_overhead: float = 5e-6
    # The ping-pong body (configurations named ``wgmma_pp_*``, latch_schedule.matmul_configs): its
    # tensor-core rate relative to sm_mma_flops; 0 leaves the ping-pong configurations out of the
    # choice. Measured (results/gpu.md run pp, H200, 32,768 tokens, each against the cooperative
    # 128 x 256 choice in the same run): tasks of 2 sub-tiles LOSE (qkv.fwd 219 vs 191 us,
    # attn_out.fwd 77.5 vs 71.2, attn_out.dgrad 80.9 vs 72.2), tasks of 8 win (lm_head.fwd 4641 vs
    # 4939 us). Through this formula those ratios need 0.76-0.84 (a 128 x 128 sub-tile loads A
    # again: a third more L2 -> shared traffic per flop than 128 x 256); 0.82 reproduces all four.
    pingpong_efficiency: float = 0.82
    # Bodies whose tensor-core rate is below ``sm_mma_flops``, by op: their modelled time is their
    # FLOPs (the op's own count) / (sm_mma_flops x this). Measured (results/gpu.md run 25, H200,
    # bench-attention at TinyMoE-200M's shape (2, 12, 1024, 64), causal, the wgmma bodies): the
    # forward 89 us where the model said 12.3 us (0.14), the backward 86 us against 20.5 (0.24): the
    # attention of 8 layers 1.4 ms against a modelled 0.26. Recalibrated from results/gpu.md run 48
    # (TinyMoE-200M's profile at 32 x 1024, the branch-free score loops of session 12 and the aligned
    # lse boxes of session 13): sdpa_backward 22.82 us a task against the old 0.24's 18.16 (-> 0.19),
    # sdpa 12.25 us against the old 0.14's 24.96 (-> 0.29). Update these from the next measurement.
    mma_op_eff: tuple[tuple[str, float], ...] = (("latch::sdpa", 0.29), ("latch::sdpa_backward", 0.19))
    # Row bodies (a warp per row: the norm-tagged ops, token_topk) walk their rows one after another,
    # each row a chain of dependent loads and shuffles: a short row costs its latency, not its bytes.
    # Measured (results/gpu.md run 26, H200, TinyMoE-200M's router at 2 x 1024 tokens, 16 experts):
    # softmax in 5 tasks of 410 rows took 72 us a task (the model said 2.6), token_topk in 3 tasks of
    # 683 rows ~110 us: ~1.4 us per row per warp, 8 warps per SM; the other 131 SMs waited.
    row_latency: float = 1.4e-6
    rows_in_flight: int = 8  # warps of one 256-thread worker, each on its own row

    def mma_efficiency(self, bn: int) -> float:
        eff = self.mma_eff[0][1]
        for width, e in self.mma_eff:
            if bn >= width:
                eff = e
        return eff

    def op_efficiency(self, op: str) -> float:
        """The tensor-core rate of ``op``'s body relative to ``sm_mma_flops`` (``mma_op_eff``; 1 else)."""
        return next((e for name, e in self.mma_op_eff if name == op), 1.0)

    def seconds(self, flops: float, mma_flops: float, nbytes: float) -> float:
        return max(flops / self.sm_flops + mma_flops / self.sm_mma_flops, nbytes / self.sm_bytes)


# ---------------------------------------------------------------------------------------------
# Costs

def node_cost(spec: OpSpec | None, in_types: Sequence[TensorType | None], out_types: Sequence[TensorType],
              attr: dict[str, Any]) -> tuple[float, float, float]:
    """(flops, mma_flops, bytes) of one node: OpSpec.cost where given, else one flop per output
    element and every operand and result moved once (CONTRACTS.md section 1)."""
    flops = None
    nbytes = None
    if spec is not None and spec.cost is not None:
        flops, nbytes = spec.cost(list(in_types), list(out_types), attr)
    if flops is None:
        flops = sum(t.numel for t in out_types)
    if nbytes is None:
        nbytes = sum(t.nbytes for t in in_types if t is not None) + sum(t.nbytes for t in out_types)
    if spec is not None and VIEW in spec.tags and not nbytes:
        # latch-ops counts views as free (folded into their consumer); a view scheduled on its
        # own copies its bytes, and inside a fused group its bytes cancel as internal.
        nbytes = sum(t.nbytes for t in in_types if t is not None) + sum(t.nbytes for t in out_types)
    if spec is not None and spec.tags & {MATMUL, ATTENTION}:
        return 0.0, float(flops), float(nbytes)
    return float(flops), 0.0, float(nbytes)


# ---------------------------------------------------------------------------------------------
# Tag-based tilings

def whole(in_types: Sequence[TensorType | None], out_types: Sequence[TensorType]) -> Tiling:
    ins = [None if t is None else full_box(t.shape) for t in in_types]
    outs = [full_box(t.shape) for t in out_types]
    return Tiling((), lambda box: (ins, outs), kind="whole")


def elementwise(in_types, out_types) -> Tiling:
    P = out_types[0].shape

    def fp(box):
        return ([None if t is None else broadcast_box(box, P, t.shape) for t in in_types],
                [broadcast_box(box, P, t.shape) for t in out_types])

    return Tiling(tuple(range(len(P))), fp, kind="elementwise")


def _dims_attr(attr: dict, rank: int, key_list=("dims", "dim")) -> tuple[int, ...] | None:
    for key in key_list:
        if key in attr and attr[key] is not None:
            v = attr[key]
            vs = v if isinstance(v, tuple) else (v,)
            if not all(isinstance(d, int) and not isinstance(d, bool) for d in vs):
                return None
            return tuple(sorted({d % rank if rank else 0 for d in vs}))
    return None


def norm(in_types, out_types, attr) -> Tiling:
    """Row-wise ops: normalised over ``dims`` (default: the last), independent across the rest."""
    P = out_types[0].shape
    R = len(P)
    if R == 0:
        return whole(in_types, out_types)
    normed = _dims_attr(attr, R)
    if normed is None and isinstance(attr.get("normalized_ndim"), int) and 0 < attr["normalized_ndim"] <= R:
        normed = tuple(range(R - attr["normalized_ndim"], R))
    normed = normed or (R - 1,)

    def one(box, t: TensorType):
        s = t.shape
        r = len(s)
        if r == R:
            return tuple((0, s[k]) if k in normed or s[k] != P[k] else box[k] for k in range(R))
        if r < R and tuple(s) == tuple(P[:r]):  # per-row statistics, aligned to the leading dims
            return tuple((0, s[k]) if k in normed else box[k] for k in range(r))
        b = broadcast_box(box, P, s)
        return tuple((0, s[j]) if (R - r + j) in normed else b[j] for j in range(r))

    def fp(box):
        return ([None if t is None else one(box, t) for t in in_types], [one(box, t) for t in out_types])

    return Tiling(tuple(k for k in range(R) if k not in normed), fp, kind="norm")


def reduction(in_types, out_types, attr) -> Tiling:
    x = in_types[0] if in_types else None
    if x is None:
        return whole(in_types, out_types)
    n = len(x.shape)
    dims = _dims_attr(attr, n, ("dims",))
    if dims is None:
        dims = tuple(range(n))
    keepdim = bool(attr.get("keepdim", False))
    kept = [d for d in range(n) if d not in dims]
    if not kept:
        return whole(in_types, out_types)
    P = out_types[0].shape
    out_of_in = {d: (d if keepdim else kept.index(d)) for d in kept}
    if keepdim and len(P) != n or not keepdim and len(P) != len(kept):
        return whole(in_types, out_types)

    def fp(box):
        xb = tuple(box[out_of_in[d]] if d in out_of_in else (0, x.shape[d]) for d in range(n))
        ins = [xb] + [None if t is None else full_box(t.shape) for t in in_types[1:]]
        outs = [box if tuple(t.shape) == tuple(P) else full_box(t.shape) for t in out_types]
        return ins, outs

    return Tiling(tuple(sorted(out_of_in.values())), fp, kind="reduction")


def matmul_dims(a: TensorType, b: TensorType, attr: dict[str, Any]) -> tuple[int, int, int, bool, bool, int]:
    """(M, K, N, trans_a, trans_b, split_k) of a ``latch::matmul``-shaped node (latch_ops.matmul):
    ``a`` is stored ``[*B, M, K]`` (``[*B, K, M]`` with ``trans_a``), ``b`` ``[*B, K, N]``
    (``[*B, N, K]`` with ``trans_b``); ``split_k`` is 1 when absent."""
    ta, tb = bool(attr.get("trans_a", False)), bool(attr.get("trans_b", False))
    m, k = (a.shape[-1], a.shape[-2]) if ta else (a.shape[-2], a.shape[-1])
    n = b.shape[-2] if tb else b.shape[-1]
    s = attr.get("split_k")
    return m, k, n, ta, tb, s if isinstance(s, int) and not isinstance(s, bool) and s > 1 else 1


def k_slice(s_lo: int, s_hi: int, k: int, splits: int) -> tuple[int, int]:
    """The contraction range split-K partials ``[s_lo, s_hi)`` sum: partial s covers
    ``[s*c, min(K, (s+1)*c))`` with ``c = ceil(K / splits)`` (the op's definition, latch_ops.matmul)."""
    if splits <= 1:
        return 0, k
    if s_hi <= s_lo:
        return 0, 0
    c = math.ceil(k / splits)
    return min(k, s_lo * c), min(k, s_hi * c)


def matmul_rule_tile(batch: int, m: int, n: int, cost: CostModel) -> tuple[int, int]:
    """Today's (M, N) tile rule, used when no body configuration is recorded: the largest of
    ``cost.matmul_tiles`` that still gives ``matmul_waves * num_sms`` tiles, else the smallest."""
    tm, tn = cost.matmul_tiles[0]
    for bm, bn in cost.matmul_tiles[1:]:
        if batch * math.ceil(m / bm) * math.ceil(n / bn) >= cost.matmul_waves * cost.num_sms:
            tm, tn = bm, bn
    return tm, tn


def matmul(in_types, out_types, cost: CostModel, attr: dict[str, Any] | None = None,
           op: str = "latch::matmul") -> Tiling:
    """Tiles over (split, batch, M, N) of a matmul's output; a tile reads the rows of ``a`` and the
    columns of ``b`` it needs (as stored: transposed operands are read transposed) over the K range
    of its split partials. Granules: the recorded body configuration's tile (attribute ``config``,
    looked up in the installed ``latch_register_configs`` plugins), else today's rule; split and
    batch dims in tiles of 1."""
    attr = attr or {}
    a, b = (in_types + [None, None])[:2]
    P = out_types[0].shape
    if a is None or b is None or len(a.shape) < 2 or len(a.shape) != len(b.shape):
        return whole(in_types, out_types)
    m, K, n, ta, tb, S = matmul_dims(a, b, attr)
    lead = 1 if S > 1 else 0
    if len(P) != len(a.shape) + lead:
        return whole(in_types, out_types)
    R = len(P)
    extra = in_types[2:]

    def fp(box):
        bb = tuple(box[lead:-2])
        kr = k_slice(box[0][0], box[0][1], K, S) if lead else (0, K)
        ab = bb + ((kr, box[-2]) if ta else (box[-2], kr))
        bx = bb + ((box[-1], kr) if tb else (kr, box[-1]))
        ins = [ab, bx] + [None if t is None else broadcast_box(box, P, t.shape) for t in extra]
        return ins, [box] + [full_box(t.shape) for t in out_types[1:]]

    batch = math.prod(P[lead:-2])
    name = attr.get("config")
    if isinstance(name, str):
        from latch_core.configs import find_config

        tm, tn = find_config(op, in_types, out_types, attr, name).tile[-2:]
    else:
        tm, tn = matmul_rule_tile(batch, m, n, cost)
    esize = lambda t: DTYPES.get(t.dtype, 4)  # noqa: E731
    kk = math.ceil(K / S) if S > 1 else K
    # (shortness judged on blocks of at most 256 rows: a ping-pong task 1024 wide is wide, not long in K)
    short = max(min(tm, 256) * kk * esize(a), min(tn, 256) * kk * esize(b)) <= cost.l2_bytes / 2 / 32
    order = raster(math.ceil(m / tm), math.ceil(n / tn), tm * kk * esize(a), tn * kk * esize(b), cost, short)
    return Tiling(tuple(range(R)), fp, granule=(1,) * (R - 2) + (tm, tn), kind="matmul", raster=order)


def raster(n_m: int, n_n: int, a_block: int, b_block: int, cost: CostModel,
           short: bool | None = None) -> tuple[str, int]:
    """The order the SMs take a product's tiles in (they run consecutive tiles at the same time),
    so that what runs together shares operand blocks in L2:

    - the dim with fewer tiles walks fastest, all of it, while its operand's blocks fit in half
      the L2 (the LM head's 2048 x 49152 output at 2 x 1024 tokens: 16 row blocks of A stay hot
      while its 75 MB weight streams once);
    - when they do not, and the blocks are short in K (whole blocks stay resident), in groups of
      as many blocks as fit: the LM head at 32 x 1024 tokens (256 x 192 tiles) in plain order read
      the whole 75 MB weight again for every row block of M (19 GB from HBM: 5.76 ms, 71% of
      cuBLAS, run 13); in groups of 63 column blocks it reads A three times and B once.
    Long-K blocks stream through the ring in step with the tiles that share them, so they keep the
    plain rule. ``short``: whether the blocks are short in K (default: both blocks within
    ``budget / 32``; :func:`matmul` judges blocks of at most 256 rows, so a wide ping-pong task is
    not taken for a long one)."""
    budget = cost.l2_bytes / 2
    if short is None:
        short = max(a_block, b_block) <= budget / 32
    if n_m < n_n:
        g = n_m if n_m * a_block <= budget or not short else max(1, int(budget // a_block))
        return ("m", g)
    if n_n * b_block <= budget or not short:
        return ()
    return ("n", max(1, int(budget // b_block)))


def tiling_for(spec: OpSpec | None, in_types: Sequence[TensorType | None], out_types: Sequence[TensorType],
               attr: dict[str, Any], cost: CostModel) -> Tiling:
    in_types = list(in_types)
    out_types = list(out_types)
    if not out_types:
        return whole(in_types, out_types)
    if spec is not None and "tiling" in spec.extra:
        t = spec.extra["tiling"](in_types, out_types, attr)
        if not isinstance(t, Tiling):
            raise TypeError(f"{spec.name}: extra['tiling'] returned {type(t).__name__}, not latch_schedule.tiling.Tiling")
        return t
    if spec is not None:
        from .tiling_ops import by_name

        t = by_name(spec.name, in_types, out_types, attr)
        if t is not None:
            return t
    tags = spec.tags if spec is not None else frozenset()
    if tags & {ELEMENTWISE, COPY}:
        return elementwise(in_types, out_types)
    if NORM in tags:
        return norm(in_types, out_types, attr)
    if REDUCTION in tags:
        return reduction(in_types, out_types, attr)
    if MATMUL in tags:
        return matmul(in_types, out_types, cost, attr, spec.name)
    return whole(in_types, out_types)


# ---------------------------------------------------------------------------------------------
# Choosing tiles

ALIGN = 128  # a split innermost dim is cut at multiples of this many elements (vector loads)
# ...but a reduction's kept innermost dim at multiples of 32 (the column body's 32 lanes, one
# 128-byte row each): each of its output elements reads a whole column, so 128 left a norm-weight
# gradient's (768,) output, or the clip's per-row partial sums, as 6 tasks of ~85 us (run 14).
REDUCTION_ALIGN = 32


def split(shape: Sequence[int], tiling: Tiling, target: int) -> list[Box]:
    """Boxes of ``shape`` (row-major order, a grid) with about ``target`` tiles over the free dims."""
    if not tiling.split_dims or any(d == 0 for d in shape):
        return [full_box(shape)]
    blocks: dict[int, int] = {}
    remaining = max(1, target)
    fixed_tiles = 1
    for k in tiling.split_dims:
        g = tiling.granule_of(k)
        if g > 0:
            blocks[k] = min(g, shape[k])
            fixed_tiles *= math.ceil(shape[k] / blocks[k])
    remaining = max(1, remaining // fixed_tiles)
    for k in tiling.split_dims:
        if k in blocks:
            continue
        n = shape[k]
        count = max(1, min(n, remaining))
        block = math.ceil(n / count)
        align = REDUCTION_ALIGN if tiling.kind == "reduction" else ALIGN
        if k == len(shape) - 1 and block < n and n > align:
            block = min(n, math.ceil(block / align) * align)
        blocks[k] = block
        remaining = max(1, remaining // math.ceil(n / block))  # floor: never exceed the target
    per_dim = []
    for k, n in enumerate(shape):
        if k in blocks:
            b = blocks[k]
            per_dim.append([(lo, min(n, lo + b)) for lo in range(0, n, b)])
        else:
            per_dim.append([(0, n)])
    if tiling.kind == "matmul" and len(per_dim) >= 2 and tiling.raster:
        # Raster order (:func:`raster`): the tiles that run at the same time (consecutive ones,
        # dealt round-robin to the SMs) share operand blocks.
        boxes = [()]
        for ivs in per_dim[:-2]:
            boxes = [bx + (iv,) for bx in boxes for iv in ivs]
        ms, ns = per_dim[-2], per_dim[-1]
        fast, g = tiling.raster
        if fast == "m":  # N-major, g row blocks at a time fastest
            return [bx + (m, n) for bx in boxes for m0 in range(0, len(ms), g)
                    for n in ns for m in ms[m0:m0 + g]]
        return [bx + (m, n) for bx in boxes for n0 in range(0, len(ns), g)
                for m in ms for n in ns[n0:n0 + g]]
    boxes: list[Box] = [()]
    for ivs in per_dim:
        boxes = [bx + (iv,) for bx in boxes for iv in ivs]
    return boxes


def target_tiles(seconds: float, cost: CostModel, num_sms: int) -> int:
    """Tiles of ``min_task`` seconds each, but never fewer than the SMs while a tile would keep
    ``min_spread_task`` of work: under a barrier a phase lasts as long as its longest task, so an op
    of 0.5 ms on 25 SMs (the 20 us rule alone) holds the other 107 idle for 20 us x 7."""
    by_size = int(seconds // cost.min_task)
    spread = min(num_sms, int(seconds // cost.min_spread_task))
    return max(1, min(cost.max_tiles_per_sm * num_sms, max(by_size, spread)))
