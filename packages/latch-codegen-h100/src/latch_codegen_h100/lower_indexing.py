"""Lowerings of the indexing ops (latch_ops/indexing.py).

Gathers (embedding, gather, index_select) compute each output element of the tile from one input
element chosen by an index. index_select and embedding copy whole rows where the run after the
indexed dim is long enough (the row path below: one index per row, 16-byte copies); gather (an
index per element), short runs and tiles that split the run keep one element per thread. Scatters (scatter, scatter_add, index_add) fill
the task's tile of the output (zeros or a copy of x), then walk every source element and apply the
ones whose target falls inside the tile (atomically for the accumulating forms), so tiles of one
scatter never write each other's bytes. An index outside its dimension is reported through the
kernel's error record (``latch_report``), naming the task, instead of reading wild memory.
embedding_backward is deterministic (no float atomics; see its body).
"""

from __future__ import annotations

import math

from . import cgen
from .lowering import BodyContext, Lowering, compute_type

HEADER = "latch_common.cuh"


def _tile_loop(rank: int, prefix: str = "y") -> list[str]:
    lines = [f"const long long n_tile = {cgen.tile_count(rank)};",
             "for (long long i = threadIdx.x; i < n_tile; i += LATCH_THREADS) {"]
    lines += cgen.tile_decode("i", rank, prefix, "  ")
    return lines


def _check(var: str, bound: int, indent: str = "  ", on_fail: str = "continue;") -> str:
    return (f"{indent}if ({var} < 0 || {var} >= {bound}LL) {{ latch_report(latch::ERR_INDEX_RANGE, {var}, "
            f"{bound}LL); {on_fail} }}")


def _in_tile(coords: list[str]) -> str:
    return " && ".join(f"{c} >= c.t->lo[{d}] && {c} < c.t->hi[{d}]" for d, c in enumerate(coords)) or "true"


def _embedding(ctx: BodyContext) -> str:
    w, idx = ctx.inputs
    out = ctx.outputs[0]
    r = out.rank
    V, D = w.shape
    ost = cgen.strides(out.shape)
    if out.shape[-1] >= ROW_MIN:
        # rows: out's dims 0..r-2 (one index each); the run: its last dim (the table row, D wide)
        return "\n".join(_row_gather(
            x=w, out=out, idx=idx, k=r - 2, bound=V,
            index_off=lambda ys: cgen.dot(ys, cgen.strides(idx.shape)),
            x_base=lambda ys: "0", x_stride=D,
            o_row=lambda ys: cgen.dot(ys, ost[:r - 1])))
    return "\n".join(_embedding_scalar(ctx))


def _embedding_scalar(ctx: BodyContext) -> list[str]:
    w, idx = ctx.inputs
    out = ctx.outputs[0]
    r = out.rank
    V, D = w.shape
    ys = [f"y{d}" for d in range(r)]
    lines = _tile_loop(r)
    lines.append(f"  long long t = (long long)latch::ld<{idx.ctype}>({idx.ptr}, "
                 f"{cgen.dot(ys[:-1], cgen.strides(idx.shape))});")
    lines.append(_check("t", V, on_fail="t = 0;"))
    lines.append(f"  latch::st<{out.ctype}>({out.ptr}, {cgen.dot(ys, cgen.strides(out.shape))}, "
                 f"latch::ld<{w.ctype}>({w.ptr}, t * {D}LL + y{r - 1}));")
    lines.append("}")
    return lines


# ---- the row path of the gathers (index_select, embedding) -------------------------------------
# An output row (the coordinates up to and including the indexed dim) takes ONE index; the dims
# after it are copied as one contiguous run of x, in 16-byte vectors where both row starts are
# aligned (a raw copy when x and out have one dtype, as LDG/STG.E.128 through __ldcg/__stcg: the
# operands are generic pointers, so plain accesses compile to generic LD/ST.128, and .cg reads L2,
# where other SMs' writes are seen; 4-element ld4/st4 with the conversion when the dtypes differ),
# the scalar loop for the run's tail and for misaligned rows.
#
# A warp copies R rows a step, U vectors per lane per row: every lane issues its R x U loads before
# it stores any of them. What kept the old body at ~40% of the floor (results/gr.md) was the chain in
# front of each step's loads: per row the task record, its lo and then the index were loaded one
# after another (a store might alias them), row after row. Now the task's box is read once, and the
# indices of a CHUNK of KC = 32 // R steps arrive in one coalesced load, one lane per row, issued a
# chunk ahead and range-checked before their chunk starts; each step takes its rows' offsets from
# those lanes by shuffle. Registers bound the loads in flight (ptxas shares one allocation over the
# noinline bodies of a kernel: at 9-12 loads per lane some bodies of test_gather_rows.py's
# document spill, at 8 none), so the rows PREFETCH_AHEAD steps ahead are requested to L2 (latch::gpf, a hint
# that holds no register) while this step's loads are in flight: HBM sees ~3 steps of rows per warp.
# Rows of 16 KB and more take the whole block per row (_block_rows: the index loaded once per row).
ROW_MIN = 32  # elements of a full run below which the row path is not taken (a warp would idle lanes)
ROW_LOADS = 8  # vector loads per lane issued before the stores (9-12 spill in test_gather_rows' document)
ROWS_MAX = 4  # rows per warp step (more rows: more 64-bit row pointers live, the same spills)
BLOCK_ROW_VECTORS = 1024  # a run of this many vectors (16 KB) or more is copied by the whole block
LOADS_IN_FLIGHT = ROW_LOADS  # the old name (tests)


def _row_plan(x, out, run_full: int) -> tuple[int, int, int, int, bool]:
    """(G threads per row, U vectors per lane per row, R rows per group step, VW elements per
    vector, raw) for a gather whose full run has ``run_full`` elements."""
    raw = x.dtype == out.dtype
    vw = 16 // _itemsize(x.dtype) if raw else 4
    nv = max(1, run_full // vw)
    if nv >= BLOCK_ROW_VECTORS:
        return 256, max(1, min(8, -(-nv // 256))), 1, vw, raw
    # a lane holds n32 vectors of each row; (U, R) keeps the most loads in flight on average over a
    # row's ceil(n32 / U) passes (a last pass short of U vectors holds fewer), then the larger U
    n32 = -(-nv // 32)
    u, r = max(((u, min(ROWS_MAX, ROW_LOADS // u)) for u in range(1, min(8, n32, ROW_LOADS) + 1)),
               key=lambda p: (n32 * p[1] / -(-n32 // p[0]), p[0]))
    return 32, u, r, vw, raw


def _itemsize(dtype: str) -> int:
    return {"f64": 8, "f32": 4, "bf16": 2, "f16": 2, "i64": 8, "i32": 4, "i16": 2, "i8": 1, "u8": 1, "bool": 1}[dtype]


def _copy_ops(x, out, raw: bool, R: int, U: int, step: int):
    """(register declaration, aligned test, vector load, vector store, scalar copy) over ``src_[w_]``
    / ``dst_[w_]``, vector ``v0_ + u_ * step`` (the row's pointer plus the pass's start, then a
    constant: an immediate offset in the LDG/STG, no address register per access), element ``e_``."""
    sx, so = x.ctype, out.ctype
    if raw:
        return (f"uint4 a_[{R}][{U}];",
                "((reinterpret_cast<unsigned long long>(src_[w_]) | reinterpret_cast<unsigned long long>(dst_[w_]))"
                " & 15ULL) == 0",
                f"a_[w_][u_] = __ldcg((reinterpret_cast<const uint4*>(src_[w_]) + v0_) + u_ * {step});",
                f"__stcg((reinterpret_cast<uint4*>(dst_[w_]) + v0_) + u_ * {step}, a_[w_][u_]);",
                "dst_[w_][e_] = src_[w_][e_];")
    return (f"typename latch::Compute<{sx}>::type a_[{R}][{U}][4];",
            "latch::aligned4(src_[w_], 0) && latch::aligned4(dst_[w_], 0)",
            f"latch::ld4<{sx}>(src_[w_] + v0_ * 4, u_ * {4 * step}, a_[w_][u_]);",
            f"latch::st4<{so}>(dst_[w_] + v0_ * 4, u_ * {4 * step}, a_[w_][u_]);",
            f"latch::st<{so}>(dst_[w_], e_, latch::ld<{sx}>(src_[w_], e_));")


def _row_gather(*, x, out, idx, k: int, bound: int, index_off, x_base, x_stride: int, o_row) -> list[str]:
    """Statements copying the task's tile of ``out`` row by row. Rows are out's dims ``0..k`` (the
    tile's box there), the run its dims ``k+1..`` from ``lo[k+1]``: the caller guarantees (at run
    time) that the tile spans every dim after ``k+1`` whole. ``index_off(ys)``: the row's index offset
    in ``idx``; the row's first element in x is ``x_base(ys) + t * x_stride`` (``t`` its index), in out
    ``o_row(ys)``, both before the run's offset."""
    run_full = math.prod(out.shape[k + 1:])
    G, U, R, VW, raw = _row_plan(x, out, run_full)
    if G != 32:
        return _block_rows(x=x, out=out, idx=idx, k=k, bound=bound, index_off=index_off, x_base=x_base,
                           x_stride=x_stride, o_row=o_row, U=U, VW=VW, raw=raw)
    ost = cgen.strides(out.shape)
    KC = 32 // R
    step_bytes = (THREADS // 32) * R * run_full * _itemsize(x.dtype)  # one step of every warp of the block
    PF = max(1, min(PREFETCH_AHEAD, PREFETCH_BYTES // step_bytes))
    PF = PF if KC > PF else 0
    ext = lambda d: f"e{d}_"  # noqa: E731
    ys = [f"y{d}" for d in range(k + 1)]
    reg, vec_ok, ld, st, tail = _copy_ops(x, out, raw, R, U, 32)
    it = "int" if run_full < 2**31 else "long long"  # vector counts of a row
    sx, so = x.ctype, out.ctype
    lines = [
        f"// row path: a warp per row, {R} row(s) x {U} {'16-byte' if raw else '4-element'} vector(s) per lane in flight; "
        f"the indices a chunk of {KC} steps ahead, the next step's rows prefetched to L2",
        "const latch::Task* tk_ = c.t;  // the box read once (a store may alias the task record)",
    ]
    for d in range(k + 2):
        lines.append(f"const long long l{d}_ = tk_->lo[{d}], e{d}_ = (long long)tk_->hi[{d}] - l{d}_;")
    lines += [
        f"const long long nrows_ = {' * '.join(ext(d) for d in range(k + 1))};",
        f"const long long run_ = e{k + 1}_ * {ost[k + 1]}LL, ro_ = l{k + 1}_ * {ost[k + 1]}LL;",
        f"const {it} nv_ = ({it})(run_ / {VW});",
        "const int lane_ = threadIdx.x % 32, grp_ = threadIdx.x / 32;",
        f"constexpr int R_ = {R}, KC_ = {KC};  // rows per step; steps per chunk (lane l: step l / R_, slot l % R_)",
        "const long long stride_ = (LATCH_THREADS / 32) * R_;  // rows between a warp's steps",
        "const long long first_ = (long long)grp_ * R_;",
        "const long long nst_ = nrows_ > first_ ? (nrows_ - first_ + stride_ - 1) / stride_ : 0;  // warp-uniform",
        "// the chunk loaded ahead: this lane's row's index (raw), x offset but the index's part, out offset (-1: no row)",
        "long long nt_ = 0, nxb_ = 0, noo_ = -1;",
        "auto load_ = [&](long long q_) {",
        "  const long long r_ = first_ + (q_ * KC_ + lane_ / R_) * stride_ + lane_ % R_;",
        "  nt_ = 0; nxb_ = 0; noo_ = -1;",
        "  if (lane_ < KC_ * R_ && r_ < nrows_) {",
        "    long long q2_ = r_;",
    ]
    for d in reversed(range(1, k + 1)):
        lines.append(f"    const long long y{d} = l{d}_ + q2_ % e{d}_; q2_ /= e{d}_;")
    lines += [
        "    const long long y0 = l0_ + q2_;",
        f"    nt_ = (long long)latch::ld<{idx.ctype}>({idx.ptr}, {index_off(ys)});",
        f"    nxb_ = {x_base(ys)};",
        f"    noo_ = {o_row(ys)};",
        "  }",
        "};",
        "// the chunk's lane offsets (x and out, elements, run offset included; x -1: no row), the index checked",
        "auto prep_ = [&](long long& cx, long long& co) {",
        "  cx = -1; co = -1;",
        "  if (noo_ >= 0) {",
        "    long long t = nt_;",
        f"    if (t < 0 || t >= {bound}LL) {{ latch_report(latch::ERR_INDEX_RANGE, t, {bound}LL); t = 0; }}",
        f"    cx = nxb_ + t * {x_stride}LL + ro_; co = noo_ + ro_;",
        "  }",
        "};",
        "long long cx_ = -1, co_ = -1, xx_ = -1, xo2_ = -1;  // this chunk's offsets; the next chunk's",
        "if (nst_ > 0) { load_(0); prep_(cx_, co_); load_(1); }",
        "for (long long k_ = 0, s_ = 0; k_ < nst_; ++k_, ++s_) {",
        "  if (s_ == KC_) { s_ = 0; cx_ = xx_; co_ = xo2_; load_(k_ / KC_ + 1); }",
        f"  if (s_ == KC_ - {max(1, PF)}) prep_(xx_, xo2_);  // the next chunk's indices (loaded a chunk ago) checked",
    ]
    if PF:
        nb = f"run_ * {_itemsize(x.dtype)}LL"
        lines += [
            f"  // the rows {PF} step(s) ahead to L2 (a line per lane from the row's start, in the row's bytes)",
            f"  if (k_ + {PF} < nst_) {{",
            "#pragma unroll",
            "    for (int w_ = 0; w_ < R_; ++w_) {",
            f"      const long long px_ = __shfl_sync(0xffffffffu, s_ + {PF} < KC_ ? cx_ : xx_, "
            f"(int)(s_ + {PF} < KC_ ? s_ + {PF} : s_ + {PF} - KC_) * R_ + w_);",
            "      if (px_ >= 0) {",
            f"        const char* pb_ = reinterpret_cast<const char*>({x.ptr} + px_);",
            "        const long long mis_ = (long long)(reinterpret_cast<unsigned long long>(pb_) & 127ULL);",
            "#pragma unroll 1",
            f"        for (long long b_ = lane_ * 128LL - mis_; b_ < {nb}; b_ += 32 * 128LL) latch::gpf(pb_, b_ < 0 ? 0 : b_);",
            "      }",
            "    }",
            "  }",
        ]
    lines += [
        f"  const {sx}* src_[R_];",
        f"  {so}* dst_[R_];",
        "  bool ok_[R_], any_ = false;  // a row copied by vectors: both starts aligned (else element by element)",
        "#pragma unroll",
        "  for (int w_ = 0; w_ < R_; ++w_) {",
        "    const long long xo_ = __shfl_sync(0xffffffffu, cx_, (int)s_ * R_ + w_);",
        "    const long long oo_ = __shfl_sync(0xffffffffu, co_, (int)s_ * R_ + w_);",
        f"    src_[w_] = xo_ >= 0 ? {x.ptr} + xo_ : nullptr;",
        f"    dst_[w_] = xo_ >= 0 ? {out.ptr} + oo_ : nullptr;",
        f"    ok_[w_] = src_[w_] != nullptr && ({vec_ok});",
        "    any_ = any_ || ok_[w_];",
        "  }",
        "  if (any_) {",
        f"    for ({it} v0_ = lane_; v0_ < nv_; v0_ += {32 * U}) {{",
        f"      const {it} rem_ = nv_ - v0_;  // the lane's u-th vector of the pass: v0_ + 32 u, there if 32 u < rem_",
        f"      {reg}",
        "#pragma unroll",
        "      for (int w_ = 0; w_ < R_; ++w_)",
        "#pragma unroll",
        f"        for (int u_ = 0; u_ < {U}; ++u_) if (ok_[w_] && u_ * 32 < rem_) {ld}",
        "#pragma unroll",
        "      for (int w_ = 0; w_ < R_; ++w_)",
        "#pragma unroll",
        f"        for (int u_ = 0; u_ < {U}; ++u_) if (ok_[w_] && u_ * 32 < rem_) {st}",
        "    }",
        "  }",
        "  // the vector rows' tails, the misaligned rows whole: element by element, not unrolled (cold)",
        "#pragma unroll",
        "  for (int w_ = 0; w_ < R_; ++w_) {",
        "    if (src_[w_] == nullptr) continue;",
        "#pragma unroll 1",
        f"    for (long long e_ = (ok_[w_] ? nv_ * {VW} : 0LL) + lane_; e_ < run_; e_ += 32) {tail}",
        "  }",
        "}",
    ]
    return lines


PREFETCH_AHEAD = 2  # the rows this many steps ahead requested to L2 while this step's loads are in flight
PREFETCH_BYTES = 64 * 1024  # ... at most this many bytes of rows ahead per block (at least one step)
THREADS = 256  # LATCH_THREADS


def _block_rows(*, x, out, idx, k, bound, index_off, x_base, x_stride, o_row, U, VW, raw) -> list[str]:
    """Rows of BLOCK_ROW_VECTORS vectors and more: the whole block copies one row at a time (U
    vectors per thread per pass), the index loaded by every thread (one broadcast address)."""
    ost = cgen.strides(out.shape)
    ys = [f"y{d}" for d in range(k + 1)]
    reg, vec_ok, ld, st, tail = _copy_ops(x, out, raw, 1, U, 256)
    sx, so = x.ctype, out.ctype
    lines = [f"// row path: the block per row, {U} {'16-byte' if raw else '4-element'} vector(s) per thread in flight",
             "const latch::Task* tk_ = c.t;  // the box read once (a store may alias the task record)"]
    for d in range(k + 2):
        lines.append(f"const long long l{d}_ = tk_->lo[{d}], e{d}_ = (long long)tk_->hi[{d}] - l{d}_;")
    lines += [
        f"const long long nrows_ = {' * '.join(f'e{d}_' for d in range(k + 1))};",
        f"const long long run_ = e{k + 1}_ * {ost[k + 1]}LL, ro_ = l{k + 1}_ * {ost[k + 1]}LL;",
        f"const long long nv_ = run_ / {VW};",
        "const int lane_ = threadIdx.x;",
        "for (long long r_ = 0; r_ < nrows_; ++r_) {",
        "  long long q_ = r_;",
    ]
    for d in reversed(range(1, k + 1)):
        lines.append(f"  const long long y{d} = l{d}_ + q_ % e{d}_; q_ /= e{d}_;")
    lines += [
        "  const long long y0 = l0_ + q_;",
        f"  long long t = (long long)latch::ld<{idx.ctype}>({idx.ptr}, {index_off(ys)});",
        f"  if (t < 0 || t >= {bound}LL) {{ if (lane_ == 0) latch_report(latch::ERR_INDEX_RANGE, t, {bound}LL); t = 0; }}",
        f"  const {sx}* src_[1] = {{{x.ptr} + ({x_base(ys)}) + t * {x_stride}LL + ro_}};",
        f"  {so}* dst_[1] = {{{out.ptr} + ({o_row(ys)}) + ro_}};",
        "  const int w_ = 0;",
        f"  if ({vec_ok}) {{",
        f"    for (long long v0_ = lane_; v0_ < nv_; v0_ += {256 * U}LL) {{",
        f"      {reg}",
        "#pragma unroll",
        f"      for (int u_ = 0; u_ < {U}; ++u_) if (v0_ + u_ * 256 < nv_) {ld}",
        "#pragma unroll",
        f"      for (int u_ = 0; u_ < {U}; ++u_) if (v0_ + u_ * 256 < nv_) {st}",
        "    }",
        f"    for (long long e_ = nv_ * {VW} + lane_; e_ < run_; e_ += 256) {tail}",
        "  } else {",
        f"    for (long long e_ = lane_; e_ < run_; e_ += 256) latch::st<{so}>(dst_[0], e_, latch::ld<{sx}>(src_[0], e_));",
        "  }",
        "}",
    ]
    return lines


def row_path_taken(op: str, x_shape, out_shape, dim: int | None = None) -> bool:
    """Whether the gather's body has the row path (tests and reports read it): the run after the
    indexed dim is at least ROW_MIN elements."""
    if op == "latch::embedding":
        return out_shape[-1] >= ROW_MIN
    if op == "latch::index_select":
        return dim < len(out_shape) - 1 and math.prod(out_shape[dim + 1:]) >= ROW_MIN
    return False


def _fill_tile(out, value: str, src=None) -> list[str]:
    """Statements writing the tile of ``out``: a constant, or a copy of ``src`` (same shape)."""
    ys = [f"y{d}" for d in range(out.rank)]
    off = cgen.dot(ys, cgen.strides(out.shape))
    lines = _tile_loop(out.rank)
    v = f"latch::ld<{src.ctype}>({src.ptr}, {off})" if src is not None else value
    lines.append(f"  latch::st<{out.ctype}>({out.ptr}, {off}, {v});")
    lines.append("}")
    lines.append("latch::block_sync();  // the tile is filled before any thread accumulates into it")
    return lines


EMB_CHUNK = 1024  # indices examined per step of the embedding backward (4 per thread, one load round)
EMB_BATCH = 8  # hits whose grad values a thread loads before it adds them (in index order)


def emb_backward_smem(ctx) -> int:
    """Scratch of the embedding backward: 32 counts (sub-round x warp), then EMB_CHUNK hits (int2)."""
    return 128 + EMB_CHUNK * 8


def _embedding_backward(ctx: BodyContext) -> str:
    """Deterministic, no atomics: consumer thread ``x`` owns the columns ``lo1 + x, lo1 + x + THREADS,
    ...`` of the tile. The tile is zeroed first (whole rows: one contiguous range, 16-byte stores),
    or, with a third input ``base`` (pass ops.embedding_grad_sum: a tied embedding's other gradient),
    starts as base's rows (a copy, four 16-byte loads in flight per thread; none where dW is base:
    the planner writes dW over base's bytes when nothing else reads base, OpSpec
    extra["accumulates_into"], and then only the hits move);
    then the indices are examined in order in chunks of ``EMB_CHUNK`` (each thread loads 4 of them at
    once): the ones naming a row of the tile (the hits) are compacted into shared memory in index
    order (warp ballots, then a prefix over the 32 warp counts), and every thread walks only the hits,
    adding grad row k into row idx[k] for its columns, the grad values of ``EMB_BATCH`` hits loaded
    before they are added. Every element of dW is written by one thread, its terms summed in index
    order: the same bits every run, whatever the tiling, and the same bits as the previous body.

    Why (run 26, dense 49152 x 768 table, 2048 indices, 373-row tiles: 190 us per task against a 48 us
    model): the previous body made every thread walk all 2048 indices from shared memory (~15 of them
    hit a 373-row tile), staged 256 indices per step (8 dependent global round trips, 16 block syncs),
    and added each hit with a load of g, a load of dW and a store in sequence, one hit at a time.
    (Run 14: one global index load per k and scalar zeroing took ~424 us per task.)"""
    g, idx = ctx.inputs[0], ctx.inputs[1]
    base = ctx.inputs[2] if len(ctx.inputs) > 2 else None  # ops.embedding_grad_sum: start from base's rows
    dw = ctx.outputs[0]
    n, D = dw.shape
    N = idx.numel
    T = ctx.threads
    if T % 32 or EMB_CHUNK % T or (EMB_CHUNK // T) * (T // 32) > 32:
        raise ctx.fail(f"the embedding backward's compaction needs a multiple of 32 threads dividing "
                       f"{EMB_CHUNK}, at most 32 warp counts; got {T} threads")
    S, NW, H = EMB_CHUNK // T, T // 32, EMB_BATCH
    pad = int(ctx.attr("padding_idx", -1) if ctx.attr("padding_idx") is not None else -1)
    acc = compute_type(dw.dtype)
    zero_vec = dw.dtype in ("f32", "bf16", "f16")
    lines = [
        "const long long r0_ = c.t->lo[0], r1_ = c.t->hi[0], c0_ = c.t->lo[1], c1_ = c.t->hi[1];",
        f"int* cnt_ = reinterpret_cast<int*>({ctx.smem});  // hits per (sub-round, warp)",
        f"int2* hit_ = reinterpret_cast<int2*>({ctx.smem} + 128);  // (k - k0, row) of the chunk's hits, in k order",
        "const int lane_ = threadIdx.x & 31, warp_ = threadIdx.x >> 5;",
    ]
    # the tile's start: zeros, or base's rows (a copy; nothing to do where dW is written over base)
    first = "0" if base is None else f"latch::ld<{base.ctype}>({base.ptr}, i)"
    if base is not None:
        lines.append(f"if (static_cast<const void*>({base.ptr}) != static_cast<const void*>({dw.ptr})) {{")
    if zero_vec:
        aligned = f"(reinterpret_cast<unsigned long long>({dw.ptr}) % (4 * sizeof(*{dw.ptr}))) == 0"
        if base is not None:
            aligned += f" && (reinterpret_cast<unsigned long long>({base.ptr}) % (4 * sizeof(*{base.ptr}))) == 0"
        lines += [
            f"if (c0_ == 0 && c1_ == {D}LL && ((r0_ * {D}LL) % 4) == 0 && {aligned}) {{",
            f"  const long long b_ = r0_ * {D}LL, e_ = r1_ * {D}LL, v_ = b_ + ((e_ - b_) / 4) * 4;",
        ]
        if base is None:
            lines += [f"  const {acc} z_[4] = {{({acc})0, ({acc})0, ({acc})0, ({acc})0}};",
                      "  for (long long i = b_ + 4 * threadIdx.x; i < v_; i += 4 * LATCH_THREADS) latch::st4(" + dw.ptr + ", i, z_);"]
        else:  # four 16-byte loads in flight per thread, then their stores
            lines += ["  long long i = b_ + 4 * threadIdx.x;",
                      "  for (; i + 12 * LATCH_THREADS < v_; i += 16 * LATCH_THREADS) {",
                      f"    {acc} q_[4][4];",
                      "#pragma unroll",
                      f"    for (int u = 0; u < 4; ++u) latch::ld4({base.ptr}, i + u * 4 * LATCH_THREADS, q_[u]);",
                      "#pragma unroll",
                      f"    for (int u = 0; u < 4; ++u) latch::st4({dw.ptr}, i + u * 4 * LATCH_THREADS, q_[u]);",
                      "  }",
                      "  for (; i < v_; i += 4 * LATCH_THREADS) {",
                      f"    {acc} q_[4];",
                      f"    latch::ld4({base.ptr}, i, q_);",
                      f"    latch::st4({dw.ptr}, i, q_);",
                      "  }"]
        lines += [
            f"  for (long long i = v_ + threadIdx.x; i < e_; i += LATCH_THREADS) latch::st<{dw.ctype}>({dw.ptr}, i, ({acc}){first});",
            "} else {",
        ]
    lines += [
        "for (long long d = c0_ + threadIdx.x; d < c1_; d += LATCH_THREADS)",
        f"  for (long long r = r0_; r < r1_; ++r) {{ const long long i = r * {D}LL + d; "
        f"latch::st<{dw.ctype}>({dw.ptr}, i, ({acc}){first}); }}",
    ]
    if zero_vec:
        lines.append("}")
    if base is not None:
        lines.append("}")
    lines += [
        f"for (long long k0 = 0; k0 < {N}LL; k0 += {EMB_CHUNK}) {{",
        "  latch::block_sync();  // the previous chunk's hits are walked (and the tile zeroed) before they are replaced",
        f"  long long tk_[{S}];",
        f"  unsigned bal_[{S}];",
        "#pragma unroll",
        f"  for (int s = 0; s < {S}; ++s) {{  // k = k0 + s * THREADS + threadIdx.x: coalesced, {S} loads in flight",
        f"    const long long k = k0 + s * {T} + threadIdx.x;",
        "    long long t = -1;",
        f"    if (k < {N}LL) t = (long long)latch::ld<{idx.ctype}>({idx.ptr}, k);",
        "    tk_[s] = t;",
        "  }",
        "#pragma unroll",
        f"  for (int s = 0; s < {S}; ++s) {{",
        f"    const long long k = k0 + s * {T} + threadIdx.x;",
        "    long long t = tk_[s];",
        f"    if (k < {N}LL) {{",
        f"      if (t < 0 || t >= {n}LL) {{ latch_report(latch::ERR_INDEX_RANGE, t, {n}LL); t = -1; }}",
        f"      else if (t < r0_ || t >= r1_ || t == {pad}LL) t = -1;",
        "    }",
        "    tk_[s] = t;",
        "    bal_[s] = __ballot_sync(0xffffffffu, t >= 0);",
        f"    if (lane_ == 0) cnt_[s * {NW} + warp_] = __popc(bal_[s]);",
        "  }",
        "  latch::block_sync();",
        f"  int base_[{S}];",
        "  int m_ = 0;",
        f"  for (int j = 0; j < {S * NW}; ++j) {{  // prefix over the counts in (sub-round, warp) = k order",
        "#pragma unroll",
        f"    for (int s = 0; s < {S}; ++s) if (j == s * {NW} + warp_) base_[s] = m_;",
        "    m_ += cnt_[j];",
        "  }",
        "#pragma unroll",
        f"  for (int s = 0; s < {S}; ++s)",
        "    if (tk_[s] >= 0)",
        "      hit_[base_[s] + __popc(bal_[s] & ((1u << lane_) - 1u))] = "
        f"make_int2(s * {T} + (int)threadIdx.x, (int)(tk_[s] - r0_));",
        "  latch::block_sync();",
        f"  for (int j0 = 0; j0 < m_; j0 += {H}) {{",
        f"    const int hn_ = (m_ - j0) < {H} ? (m_ - j0) : {H};",
        "    for (long long d = c0_ + threadIdx.x; d < c1_; d += LATCH_THREADS) {",
        f"      {acc} gv_[{H}];",
        "#pragma unroll",
        f"      for (int h = 0; h < {H}; ++h)",
        f"        if (h < hn_) gv_[h] = latch::ld<{g.ctype}>({g.ptr}, (k0 + hit_[j0 + h].x) * {D}LL + d);",
        "#pragma unroll",
        f"      for (int h = 0; h < {H}; ++h)",
        "        if (h < hn_) {  // in k order: a row hit twice gets its terms in order",
        f"          const long long o_ = (r0_ + hit_[j0 + h].y) * {D}LL + d;",
        f"          latch::st<{dw.ctype}>({dw.ptr}, o_, latch::ld<{dw.ctype}>({dw.ptr}, o_) + gv_[h]);",
        "        }",
        "    }",
        "  }",
        "}",
    ]
    return "\n".join(lines)


def _select_along(ctx: BodyContext, index_offset) -> list[str]:
    """out[y] = x[y with y[dim] replaced by idx[index_offset(ys)]]: gather and index_select differ
    only in where the index of an output element lives. One element per thread (the general case)."""
    x, idx = ctx.inputs
    out = ctx.outputs[0]
    dim = ctx.attr("dim")
    ys = [f"y{d}" for d in range(out.rank)]
    xs = list(ys)
    xs[dim] = "t"
    lines = _tile_loop(out.rank)
    lines.append(f"  long long t = (long long)latch::ld<{idx.ctype}>({idx.ptr}, {index_offset(ys, dim, idx)});")
    lines.append(_check("t", x.shape[dim], on_fail="t = 0;"))
    lines.append(f"  latch::st<{out.ctype}>({out.ptr}, {cgen.dot(ys, cgen.strides(out.shape))}, "
                 f"latch::ld<{x.ctype}>({x.ptr}, {cgen.dot(xs, cgen.strides(x.shape))}));")
    lines.append("}")
    return lines


def _gather(ctx: BodyContext) -> str:
    # idx has the output's shape: an index per element, so no row path (each element its own source)
    return "\n".join(_select_along(ctx, lambda ys, dim, idx: cgen.dot(ys, cgen.strides(idx.shape))))


def _index_select(ctx: BodyContext) -> str:
    # idx is 1-D, indexed by the output's coordinate along dim
    x, idx = ctx.inputs
    out = ctx.outputs[0]
    dim = ctx.attr("dim")
    scalar = _select_along(ctx, lambda ys, dim, idx: f"y{dim}")
    if not row_path_taken(ctx.op, x.shape, out.shape, dim):
        return "\n".join(scalar)
    r = out.rank
    xst, ost = cgen.strides(x.shape), cgen.strides(out.shape)
    row = _row_gather(
        x=x, out=out, idx=idx, k=dim, bound=x.shape[dim],
        index_off=lambda ys: ys[dim],
        x_base=lambda ys: cgen.dot(ys[:dim], xst[:dim]), x_stride=xst[dim],
        o_row=lambda ys: cgen.dot(ys, ost[:dim + 1]))
    # the row path needs one contiguous run per row: the tile spans every dim after dim + 1 whole
    full = " && ".join(f"c.t->lo[{d}] == 0 && c.t->hi[{d}] == {out.shape[d]}" for d in range(dim + 2, r)) or "true"
    return "\n".join([f"if ({full}) {{"] + ["  " + ln for ln in row] + ["} else {"]
                      + ["  " + ln for ln in scalar] + ["}"])


def _scatter(accumulate: bool):
    def body(ctx: BodyContext) -> str:
        x, idx, src = ctx.inputs
        out = ctx.outputs[0]
        dim = ctx.attr("dim")
        js = [f"j{d}" for d in range(idx.rank)]
        ts = list(js)
        ts[dim] = "t"
        lines = _fill_tile(out, "", src=x)
        lines.append(f"for (long long k = threadIdx.x; k < {idx.numel}LL; k += LATCH_THREADS) {{")
        lines += cgen.const_decode("k", idx.shape, "j", "  ")
        lines.append(f"  const long long t = (long long)latch::ld<{idx.ctype}>({idx.ptr}, k);")
        lines.append(_check("t", x.shape[dim]))
        lines.append(f"  if (!({_in_tile(ts)})) continue;")
        val = f"latch::ld<{src.ctype}>({src.ptr}, {cgen.dot(js, cgen.strides(src.shape))})"
        dst = f"{out.ptr} + {cgen.dot(ts, cgen.strides(out.shape))}"
        if accumulate:
            lines.append(f"  latch::atomic_add({dst}, {val});")
        else:
            lines.append(f"  latch::st<{out.ctype}>({out.ptr}, {cgen.dot(ts, cgen.strides(out.shape))}, {val});")
        lines.append("}")
        return "\n".join(lines)
    return body


def _index_add(ctx: BodyContext) -> str:
    x, idx, src = ctx.inputs
    out = ctx.outputs[0]
    dim = ctx.attr("dim")
    js = [f"j{d}" for d in range(src.rank)]
    ts = list(js)
    ts[dim] = "t"
    lines = _fill_tile(out, "", src=x)
    lines.append(f"for (long long k = threadIdx.x; k < {src.numel}LL; k += LATCH_THREADS) {{")
    lines += cgen.const_decode("k", src.shape, "j", "  ")
    lines.append(f"  const long long t = (long long)latch::ld<{idx.ctype}>({idx.ptr}, j{dim});")
    lines.append(_check("t", x.shape[dim]))
    lines.append(f"  if (!({_in_tile(ts)})) continue;")
    lines.append(f"  latch::atomic_add({out.ptr} + {cgen.dot(ts, cgen.strides(out.shape))}, "
                 f"latch::ld<{src.ctype}>({src.ptr}, k));")
    lines.append("}")
    return "\n".join(lines)


def lowerings() -> list[Lowering]:
    h = (HEADER,)
    return [
        Lowering("latch::embedding", body=_embedding, headers=h,
                 doc="row gather: a warp per row, the index once, 16-byte vectors (runs of ROW_MIN elements and more)"),
        Lowering("latch::embedding_backward", body=_embedding_backward, headers=h, smem=emb_backward_smem,
                 doc="each thread owns tile columns: zero the tile (16-byte stores; with base, copy base's rows), "
                     "compact the indices hitting "
                     "the tile in order (ballots), add the hits' grad rows in order (no atomics)"),
        Lowering("latch::gather", body=_gather, headers=h),
        Lowering("latch::index_select", body=_index_select, headers=h,
                 doc="row gather along dim (runs of ROW_MIN elements and more), else one element per thread"),
        Lowering("latch::scatter", body=_scatter(False), headers=h),
        Lowering("latch::scatter_add", body=_scatter(True), headers=h),
        Lowering("latch::index_add", body=_index_add, headers=h),
    ]
