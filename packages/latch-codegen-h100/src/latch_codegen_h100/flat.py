"""Flat fused bodies: an elementwise group over one contiguous range, four elements per access.

A fused elementwise group (``fuse.py``) whose every value has either the primary output's shape or
a single element, and which holds no view but contiguous reshapes (squeeze, unsqueeze, flatten: element
``i`` of a reshape is element ``i`` of its input) and no op that reads its own coordinates (tril, arange),
computes element ``i`` of every output from element ``i`` of every full-shape input and the
single-element inputs: the shapes do not matter, only the flat index does. Such a group is the
optimizer's (AdamW with weight decay, the clip scale and the BF16 copy: ``p, g, m, v`` in, ``p, m, v``
out, the scalars once), a residual add, a cast, SwiGLU's gate. Its body:

- loads each single-element input once per task, before the loop;
- software-pipelines the loop: the next U groups' loads are issued before the current ones are
  computed and stored (loads in flight while the body computes: AdamW's divisions and square root);
- peels a head of up to three elements so that the first operand's address is aligned to four
  elements (16 bytes for FP32, 8 for BF16); when every full-shape operand is then aligned (equal
  offsets from aligned bases: odd row lengths included), runs the vector loop: each thread takes U groups of four
  consecutive elements per iteration (``ld4``/``st4``: one 16-byte access per FP32 operand), all
  loads before any store, U chosen so that ~192 bytes of loads per thread are in flight (3 for
  AdamW's four FP32 inputs, 6 for a residual add, 12 for a cast: :func:`unroll_for`),
  addressed by 32-bit offsets from per-operand base pointers at the vector range's start;
  intermediates stay in registers;
- prefetches into L2, at the top of each iteration, each full-shape input's groups
  :data:`PREFETCH_AHEAD` iterations ahead (one thread per 128-byte line, never past the vector
  range): the register loads of the next batch then wait on L2, not HBM, and more reads are in
  flight per SM than the registers hold;
- finishes the head and the tail (and a tile whose operands are misaligned differently) one
  element per thread.

Every input byte is read once and every output byte written once per task. The tile must span
every dim but the first (row tiles, what the elementwise tiling gives): the caller checks that at
run time and otherwise runs the general body.

The same flattening serves reductions with a fused elementwise prologue (:func:`reduce_body`):
the reduction's ``load(i)`` computes the prologue at flat index ``i`` of the reduced input.
"""

from __future__ import annotations

import math

import attrs

from .bodies import IN, OUT, TMP, BodyContext, BodySpec, Operand, _ptr_decl
from .cgen import strides
from .lowering import Lowering, LoweringError, compute_type, storage_type

VEC = 4  # elements per access
# Accesses per operand per thread and iteration: enough that each thread has ~IN_FLIGHT bytes of
# loads outstanding (256 threads x 192 B = 48 KiB per SM: one SM's share of 4.27 TB/s is ~32 KB
# per us, and loaded HBM latency is above 1 us), between 2 and 12 (registers).
IN_FLIGHT, MIN_UNROLL, MAX_UNROLL = 192, 2, 12
_SIZE = {"f64": 8, "f32": 4, "bf16": 2, "f16": 2, "i64": 8, "i32": 4, "i16": 2, "i8": 1, "u8": 1, "bool": 1}


DATA_REGS = 96  # registers of loaded and computed elements per thread the unroll may use (of 224)

# L2 prefetch distance of the vector loop, in iterations (0: no prefetch). The software pipeline
# issues the register loads of iteration k + 1 during iteration k, and ptxas sinks them into the
# arithmetic (register pressure), so on their own they are in flight for part of an iteration
# only (results/aw.md). A prefetch of iteration k + PREFETCH_AHEAD's groups holds no register: at
# 2 each SM has up to two more batches (2 x 48 KiB for AdamW) requested from HBM, and the register
# loads of those groups find them in L2. Footprint: 2 x 48 KiB x 132 SMs ~ 13 MB of the 60 MB L2.
PREFETCH_AHEAD = 2
LINE = 128  # bytes of an L2 line; one prefetch per line assumes it fills the line (unmeasured: results/aw.md)


def prefetch_lanes(dtype: str) -> int:
    """Consecutive threads whose groups of VEC elements of ``dtype`` share one 128-byte line
    (8 for FP32's 16-byte groups, 16 for BF16's 8-byte ones): one of them prefetches it."""
    return max(1, min(32, LINE // (VEC * _SIZE.get(dtype, 4))))


def unroll_for(flat: BodySpec) -> int:
    """Accesses per operand and iteration of the vector loop (module docstring): enough for
    IN_FLIGHT bytes of loads, at most what DATA_REGS registers hold of every full-shape operand's
    and output's elements (a one-input body with several outputs stays small)."""
    full, _, outs = _regs(flat)
    per_step = sum(VEC * _SIZE.get(flat.values[i].dtype, 4) for i in full) or VEC * 4
    regs = max(MIN_UNROLL, DATA_REGS // (VEC * max(1, len(full) + len(outs))))
    return max(MIN_UNROLL, min(MAX_UNROLL, regs, -(-IN_FLIGHT // per_step)))


def _numel(shape) -> int:
    return math.prod(shape)


def flat_spec(spec: BodySpec, lowerings: dict[str, Lowering], shape: tuple[int, ...] | None = None,
              skip_last: bool = False) -> BodySpec | None:
    """``spec`` with every value of ``shape`` (default: the primary's) flattened to ``(numel,)`` and
    every single-element value to ``()``, or None when the group is not flat (a view, a value of
    another shape, an op that reads its coordinates). ``skip_last``: the last node (a reduction
    sink) is left out of the checks."""
    target = tuple(spec.values[spec.primary].shape if shape is None else shape)
    n = _numel(target)
    if n <= 1:
        return None
    nodes = spec.nodes[:-1] if skip_last else spec.nodes
    for node in nodes:
        low = lowerings.get(node.op)
        if low is None or len(node.outputs) != 1:
            return None
        if node.op == FLAT_VIEW:  # a contiguous reshape keeps the flat index: element i is element i
            continue
        if low.expr is None or low.view_map is not None:
            return None
    used = {i for node in nodes for i in node.inputs if i is not None} | {o for node in nodes for o in node.outputs}
    if skip_last:
        used |= {i for i in spec.nodes[-1].inputs if i is not None}
    values = []
    for i, v in enumerate(spec.values):
        if i not in used and not (skip_last and i == spec.primary):
            values.append(v)
            continue
        if skip_last and i == spec.primary:
            values.append(v)  # the reduction's output keeps its shape
        elif _numel(v.shape) == n:
            # the primary's shape, or another of its element count: only a reshape makes one, and
            # an elementwise op whose operand and result have equal counts broadcasts nothing
            # (the shapes differ by size-1 dims at most), so the flat order is the same
            values.append(attrs.evolve(v, shape=(n,)))
        elif _numel(v.shape) == 1:
            values.append(attrs.evolve(v, shape=()))
        else:
            return None
    flat = attrs.evolve(spec, values=tuple(values))
    # ops that read their coordinates (tril/triu, arange) cannot be flattened: their expression
    # indexes NodeInfo.coords, which the flat form leaves empty
    from .fuse import node_info

    for node in nodes:
        if node.op == FLAT_VIEW:
            continue
        try:
            lowerings[node.op].expr(["x"] * len(node.inputs), node_info(flat, node, ()))
        except (IndexError, KeyError):
            return None
    return flat


FLAT_VIEW = "latch::reshape"  # squeeze, unsqueeze, flatten and view are captured as reshape


class _VecPuller:
    """The fused puller with group inputs taken from registers loaded four at a time."""

    def __new__(cls, spec, lowerings, names, indent, regs: dict[int, str]):
        from .fuse import _Puller

        class P(_Puller):
            def load(self, vi, coords):
                return regs[vi]

        return P(spec, lowerings, names, indent)


def _regs(flat: BodySpec) -> tuple[list[int], list[int], list[int]]:
    full = [i for i, v in enumerate(flat.values) if v.kind == IN and v.shape != ()]
    scalar = [i for i, v in enumerate(flat.values) if v.kind == IN and v.shape == ()]
    outs = [i for i, v in enumerate(flat.values) if v.kind == OUT]
    return full, scalar, outs


def vector_lines(flat: BodySpec, lowerings: dict[str, Lowering], names: dict[int, str], inner: int,
                 ind: str = "  ", shape: tuple[int, ...] | None = None) -> list[str]:
    """Statements of the flat body over elements [lo[0] * inner, hi[0] * inner) of every operand,
    or, given the primary's ``shape``, over the task's contiguous tile of it (the caller checks
    :func:`latch_codegen_h100.cgen.contiguous_tile`'s condition)."""
    from .fuse import _Puller

    full, scalar, outs = _regs(flat)
    vals = flat.values
    UNROLL = unroll_for(flat)
    if shape is not None:
        from .cgen import contiguous_tile

        _, first, count = contiguous_tile(shape)
        L = [f"{ind}const long long lo_ = {first}, hi_ = lo_ + {count};"]
    else:
        L = [f"{ind}const long long lo_ = (long long)c.t->lo[0] * {inner}LL, hi_ = (long long)c.t->hi[0] * {inner}LL;"]
    regs: dict[int, str] = {}
    for i in scalar:
        regs[i] = f"s{i}_"
        L.append(f"{ind}const {compute_type(vals[i].dtype)} s{i}_ = latch::ld<{storage_type(vals[i].dtype)}>({names[i]}, 0);")
    # the vector range starts where the first operand reaches a 4-element boundary (a head of up
    # to three elements before it): every operand aligned there (the usual case: equal offsets
    # from aligned bases), else the whole tile runs element by element
    ref = names[(full + outs)[0]]
    L.append(f"{ind}const long long vlo_ = lo_ + latch::peel4({ref} + lo_) < hi_ ? lo_ + latch::peel4({ref} + lo_) : hi_;")
    aligned = " && ".join(f"latch::aligned4({names[i]}, vlo_)" for i in full + outs)
    L.append(f"{ind}const bool vec_ = {aligned};")
    L.append(f"{ind}const long long vbeg_ = vec_ ? vlo_ : lo_;")
    L.append(f"{ind}const long long vend_ = vec_ ? vlo_ + ((hi_ - vlo_) / {VEC}LL) * {VEC}LL : lo_;")
    # the vector range in groups of four, addressed by 32-bit offsets from base pointers at its
    # start (64-bit when an operand has 2^31 elements or more): no 64-bit compare or add per access
    wide = any(_numel(vals[i].shape) >= 2**31 for i in full + outs)
    it = "long long" if wide else "int"
    L.append(f"{ind}const {it} nq_ = ({it})((vend_ - vbeg_) / {VEC}LL);")
    base = {}
    for i in full + outs:
        base[i] = f"b{i}_"
        const = "const " if vals[i].kind == IN else ""
        L.append(f"{ind}{const}{storage_type(vals[i].dtype)}* const b{i}_ = {names[i]} + vbeg_;")
    step = UNROLL
    # software pipelined: the loads of the thread's next U groups are issued before the arithmetic
    # and stores of the current ones, so loads stay in flight while the body computes (every
    # element is read and written by one thread only: in-place updates are safe)
    L.append(f"{ind}const {it} g0_ = ({it})threadIdx.x;")
    for i in full:
        L.append(f"{ind}{compute_type(vals[i].dtype)} r{i}_[{UNROLL}][{VEC}] = {{}};")
    L.append(f"{ind}#pragma unroll")
    L.append(f"{ind}for (int u_ = 0; u_ < {UNROLL}; ++u_) {{")
    L.append(f"{ind}  if (g0_ + u_ * LATCH_THREADS < nq_) {{")
    for i in full:
        L.append(f"{ind}    latch::gld4({base[i]}, {VEC} * (g0_ + u_ * LATCH_THREADS), r{i}_[u_]);")
    L.append(f"{ind}  }}")
    L.append(f"{ind}}}")
    L.append(f"{ind}for ({it} g_ = g0_; g_ < nq_; g_ += {step} * LATCH_THREADS) {{")
    i2 = ind + "  "
    L.append(f"{i2}const {it} gn_ = g_ + {step} * LATCH_THREADS;")
    L += _prefetch_lines(flat, full, base, it, step, i2)
    for i in full:
        L.append(f"{i2}{compute_type(vals[i].dtype)} c{i}_[{UNROLL}][{VEC}];")
    for i in outs:
        L.append(f"{i2}{compute_type(vals[i].dtype)} o{i}_[{UNROLL}][{VEC}];")
    L.append(f"{i2}#pragma unroll")
    L.append(f"{i2}for (int u_ = 0; u_ < {UNROLL}; ++u_) {{")
    L.append(f"{i2}  #pragma unroll")
    L.append(f"{i2}  for (int j_ = 0; j_ < {VEC}; ++j_) {{")
    for i in full:
        L.append(f"{i2}    c{i}_[u_][j_] = r{i}_[u_][j_];")
    L.append(f"{i2}  }}")
    L.append(f"{i2}  if (gn_ + u_ * LATCH_THREADS < nq_) {{")
    for i in full:
        L.append(f"{i2}    latch::gld4({base[i]}, {VEC} * (gn_ + u_ * LATCH_THREADS), r{i}_[u_]);")
    L.append(f"{i2}  }}")
    L.append(f"{i2}}}")
    L.append(f"{i2}#pragma unroll")
    L.append(f"{i2}for (int u_ = 0; u_ < {UNROLL}; ++u_) {{")
    L.append(f"{i2}  #pragma unroll")
    L.append(f"{i2}  for (int j_ = 0; j_ < {VEC}; ++j_) {{")
    lane = dict(regs)
    for i in full:
        lane[i] = f"c{i}_[u_][j_]"
    p = _VecPuller(flat, lowerings, names, i2 + "    ", lane)
    stores = []
    for i in outs:
        v = p.pull(i, ["j_"])
        stores.append(f"{i2}    o{i}_[u_][j_] = {v};")
    L += p.lines + stores
    L.append(f"{i2}  }}")
    L.append(f"{i2}}}")
    L.append(f"{i2}#pragma unroll")
    L.append(f"{i2}for (int u_ = 0; u_ < {UNROLL}; ++u_) {{")
    L.append(f"{i2}  if (g_ + u_ * LATCH_THREADS < nq_) {{")
    for i in outs:
        L.append(f"{i2}    latch::gst4({base[i]}, {VEC} * (g_ + u_ * LATCH_THREADS), o{i}_[u_]);")
    L.append(f"{i2}  }}")
    L.append(f"{i2}}}")
    L.append(f"{ind}}}")
    # the head [lo_, vbeg_), the tail [vend_, hi_) (the whole tile when the operands are not
    # aligned alike: vbeg_ = vend_ = lo_): one element per thread
    L.append(f"{ind}for (long long k_ = threadIdx.x; k_ < (vbeg_ - lo_) + (hi_ - vend_); k_ += LATCH_THREADS) {{")
    L.append(f"{i2}const long long i = k_ < vbeg_ - lo_ ? lo_ + k_ : vend_ + (k_ - (vbeg_ - lo_));")
    # full-shape inputs load at i (the plain puller's load), scalars come from their registers
    tail = _Puller(flat, lowerings, names, i2)
    for i in scalar:
        tail.memo[(i, ())] = regs[i]
    stores = []
    for i in outs:
        v = tail.pull(i, ["i"])
        stores.append(f"{i2}latch::st<{storage_type(vals[i].dtype)}>({names[i]}, i, {v});")
    L += tail.lines + stores
    L.append(f"{ind}}}")
    return L


def _prefetch_lines(flat: BodySpec, full: list[int], base: dict[int, str], it: str, step: int,
                    ind: str) -> list[str]:
    """The top of the vector loop's iteration at ``g_``: each full-shape input's groups of the
    iteration PREFETCH_AHEAD ahead requested into L2 (``latch::gpf``), by one thread of each run
    of :func:`prefetch_lanes` consecutive ones. Thread t's group u is g_ + u * LATCH_THREADS, so
    for each u the block's groups are one contiguous run of the operand (and u + 1's run follows
    u's). A line is exactly ``lanes`` consecutive groups (the vector range's base is 16-byte
    aligned, not 128: a line may straddle two runs of lanes), so it holds exactly one group whose
    index is a multiple of ``lanes``, and that group's thread (t % lanes == 0: LATCH_THREADS is a
    multiple of ``lanes``) prefetches it: every line once. Every prefetched group is below nq_:
    nothing past the vector range is touched."""
    ahead = PREFETCH_AHEAD
    if ahead <= 0 or not full:
        return []
    by_lanes: dict[int, list[int]] = {}
    for i in full:
        by_lanes.setdefault(prefetch_lanes(flat.values[i].dtype), []).append(i)
    L = [f"{ind}// L2 prefetch of iteration +{ahead}'s groups: one thread per 128-byte line, inside the range",
         f"{ind}const {it} gp_ = g_ + {ahead * step} * LATCH_THREADS;",
         f"{ind}#pragma unroll",
         f"{ind}for (int u_ = 0; u_ < {step}; ++u_) {{"]
    for lanes, ops in sorted(by_lanes.items()):
        lane = f"(threadIdx.x & {lanes - 1}) == 0 && " if lanes > 1 else ""
        L.append(f"{ind}  if ({lane}gp_ + u_ * LATCH_THREADS < nq_) {{")
        for i in ops:
            L.append(f"{ind}    latch::gpf({base[i]}, {VEC} * (gp_ + u_ * LATCH_THREADS));")
        L.append(f"{ind}  }}")
    L.append(f"{ind}}}")
    return L


def reduce_body(spec: BodySpec, lowerings: dict[str, Lowering]) -> list[str]:
    """A reduction (the group's last node) whose input is computed by the group's elementwise
    prologue: the reduction's statements with ``load(i)`` pulling the prologue at flat index ``i``
    of the reduced input (every prologue value of that shape or single-element: no index
    arithmetic), or at the coordinates decoded from ``i`` (broadcasts and views)."""
    from . import lower_reduce
    from .fuse import _Puller, broadcast_coords

    red = spec.nodes[-1]
    if red.op not in lower_reduce.PROLOGUE_REDUCTIONS:
        raise LoweringError(f"{red.op}: a fused prologue feeds only {sorted(lower_reduce.PROLOGUE_REDUCTIONS)}")
    if len(red.outputs) != 1 or red.outputs[0] != spec.primary or len([i for i in red.inputs if i is not None]) != 1:
        raise LoweringError(f"{red.op}: a reduction with a fused prologue must be the group's sink, one input, "
                            "one output")
    xi = next(i for i in red.inputs if i is not None)
    x = spec.values[xi]
    if x.kind != TMP:
        raise LoweringError(f"{red.op}: its input is not computed in the group; nothing to fuse")
    for v in spec.values:
        if v.kind == OUT and v.index != spec.values[spec.primary].index:
            raise LoweringError(f"{red.op}: a fused prologue's values other than the reduction's result "
                                "must stay in the body")
    decl, names = _ptr_decl(spec)
    out = spec.values[spec.primary]
    ctx = BodyContext(op=red.op, attrs=dict(red.attrs), inputs=(Operand("nullptr", x.shape, x.dtype),),
                      outputs=(Operand(names[spec.primary], out.shape, out.dtype),), primary=0)
    acc = lower_reduce.acc_type(red.op, x.dtype)
    flat = flat_spec(spec, lowerings, shape=tuple(x.shape), skip_last=True)
    load = [f"auto load = [&](long long i) -> {acc} {{"]
    load4, vec_cond, pre, pf4, pfl = None, "false", [], None, None
    if flat is not None:
        p = _Puller(flat, lowerings, names, "  ")
        v = p.pull(xi, ["i"])
        load4, vec_cond, pre = _load4(flat, lowerings, names, xi, acc)
        load4 = load4 + _load4(flat, lowerings, names, xi, compute_type(x.dtype), "load4v")[0]
        pf4 = _pf4(flat, names, [(i, "i") for i in _regs(flat)[0]])
        pfl = _pfl(flat, names)
    else:
        p = _Puller(spec, lowerings, names, "  ")
        coords = []
        st = strides(x.shape)
        for d in range(len(x.shape)):
            p.lines.append(f"  const long long x{d} = (i / {st[d]}LL) % {x.shape[d]}LL;")
            coords.append(f"x{d}")
        v = p.pull(xi, broadcast_coords(x.shape, x.shape, coords))
        if len(x.shape) >= 1 and x.shape[-1] % 4 == 0 and math.prod(x.shape) < 2**31:
            load4, vec_cond, pf4 = _load4_pulled(spec, lowerings, names, xi, acc)
    load += p.lines + [f"  return ({acc})({v});", "};"]
    stmts = lower_reduce.reduce_statements(red.op.split("::")[-1], ctx, load, load4, vec_cond, pf4,
                                           pfl=[] if pfl is None else pfl)
    return decl + pre + ["  {"] + ["    " + s if s else s for s in stmts.splitlines()] + ["  }"]


def _load4_pulled(spec: BodySpec, lowerings: dict[str, Lowering], names: dict[int, str], xi: int, acc: str):
    """(statements defining ``load4v`` and ``load4``, their run-time condition) for a prologue with
    broadcasts or views (RMSNorm's ``dy * w * x`` with a (d,) weight): elements i..i+3 of the
    reduced input (i a multiple of 4, its last dim a multiple of 4), decoded in 32-bit with
    constant extents, each operand read as fuse.py's ILP path classes it (one 16-byte load, one
    load for the four, or four loads), all before the arithmetic."""
    from .fuse import GEN_, VEC_, _IlpPuller

    x = spec.values[xi]
    ct = compute_type(x.dtype)
    r = len(x.shape)
    p = _IlpPuller(spec, lowerings, names, "    ", 4)
    lane = [f"x{d}" for d in range(r - 1)] + [f"(x{r - 1} + j_)"]
    v = p.pull_st(xi, lane, VEC_)
    L = [f"auto load4v = [&](long long i, {ct} (&o4_)[4]) {{", "  constexpr int u_ = 0;",
         "  const int l_ = (int)i;"]
    acc_, dec = 1, []
    for d in reversed(range(1, r)):
        dec.append(f"  const int x{d} = ({'l_' if acc_ == 1 else f'l_ / {acc_}'}) % {x.shape[d]};")
        acc_ *= x.shape[d]
    dec.append(f"  const int x0 = {'l_' if acc_ == 1 else f'l_ / {acc_}'};")
    L += dec
    vec = []
    for k, reg, vi, off in p.loads.values():
        st = storage_type(spec.values[vi].dtype)
        vct = compute_type(spec.values[vi].dtype)
        if k == VEC_:
            L += [f"  {vct} {reg}[1][4];", f"  latch::gld4({names[vi]}, {off}, {reg}[0]);"]
            vec.append(names[vi])
        elif k == GEN_:
            L += [f"  {vct} {reg}[1][4];", "  #pragma unroll",
                  f"  for (int j_ = 0; j_ < 4; ++j_) {reg}[0][j_] = latch::ld<{st}>({names[vi]}, {off});"]
        else:
            L.append(f"  {vct} {reg}[1] = {{latch::ld<{st}>({names[vi]}, {off})}};")
    L += ["  #pragma unroll", "  for (int j_ = 0; j_ < 4; ++j_) {"]
    L += ["  " + ln for ln in p.lines] + [f"    o4_[j_] = ({ct})({v});", "  }", "};",
                                          f"auto load4 = [&](long long i, {acc} (&o4_)[4]) {{",
                                          f"  {ct} t_[4];", "  load4v(i, t_);", "  #pragma unroll",
                                          f"  for (int j_ = 0; j_ < 4; ++j_) o4_[j_] = ({acc})t_[j_];", "};"]
    # the prefetch of the lines load4v(i) reads with 16-byte accesses (its VEC operands)
    pf = _pf4(spec, names, [(vi, off) for k, _, vi, off in p.loads.values() if k == VEC_],
              ["  const int l_ = (int)i;"] + dec)
    if all(math.prod(v.shape) < 2**31 for v in spec.values):  # 32-bit index math (fuse.ilp_lines alike)
        from .fuse import _LONG

        L = [_LONG.sub(r"\1", x) for x in L]
        pf = None if pf is None else [_LONG.sub(r"\1", x) for x in pf]
    cond = " && ".join(f"latch::aligned4({n}, 0)" for n in dict.fromkeys(vec)) or "true"
    return L, cond, pf


def _pfl(flat: BodySpec, names: dict[int, str]) -> list[tuple[str, int]]:
    """(pointer, element bytes) of each full-size input of a flat prologue (read at the reduced
    input's flat index) with at least lower_reduce.PREFETCH_MIN_BYTES: what the contiguous row
    path prefetches line by line (lower_reduce.rows_contig_statements)."""
    from .lower_reduce import PREFETCH_MIN_BYTES

    out = []
    for i in _regs(flat)[0]:
        size = _SIZE.get(flat.values[i].dtype, 4)
        if _numel(flat.values[i].shape) * size >= PREFETCH_MIN_BYTES:
            out.append((names[i], size))
    return out


def _pf4(spec: BodySpec, names: dict[int, str], accesses, head: list[str] = ()) -> list[str] | None:
    """Statements defining ``pf4v(long long i)``: the L2 prefetch (``latch::gpf4``: one thread per
    128-byte line) of each (input, offset) of ``accesses`` whose input has at least
    lower_reduce.PREFETCH_MIN_BYTES (smaller tables stay in L2), the offsets in terms of the
    coordinates ``head`` decodes from ``i``; None when none is that large."""
    from .lower_reduce import PREFETCH_MIN_BYTES

    big = [(vi, off) for vi, off in dict.fromkeys(accesses)
           if _numel(spec.values[vi].shape) * _SIZE.get(spec.values[vi].dtype, 4) >= PREFETCH_MIN_BYTES]
    if not big:
        return None
    return (["auto pf4v = [&](long long i) {"] + list(head)
            + [f"  latch::gpf4({names[vi]}, {off});" for vi, off in big] + ["};"])


def _load4(flat: BodySpec, lowerings: dict[str, Lowering], names: dict[int, str], xi: int, acc: str,
           name: str = "load4"):
    """(statements defining ``load4``, its run-time condition, statements before it): the prologue at
    four consecutive flat indices, the full-shape inputs loaded with ``ld4``, the single-element ones
    once per task."""
    full, scalar, _ = _regs(flat)
    vals = flat.values
    pre = [f"  const {compute_type(vals[i].dtype)} s{i}_ = latch::ld<{storage_type(vals[i].dtype)}>({names[i]}, 0);"
           for i in scalar]
    regs = {i: f"s{i}_" for i in scalar}
    for i in full:
        regs[i] = f"r{i}_[j_]"
    lines = [f"auto {name} = [&](long long i, {acc} (&o4_)[4]) {{"]
    for i in full:
        lines += [f"  {compute_type(vals[i].dtype)} r{i}_[4];", f"  latch::gld4({names[i]}, i, r{i}_);"]
    lines += ["  #pragma unroll", "  for (int j_ = 0; j_ < 4; ++j_) {"]
    p = _VecPuller(flat, lowerings, names, "    ", regs)
    v = p.pull(xi, ["j_"])
    lines += p.lines + [f"    o4_[j_] = ({acc})({v});", "  }", "};"]
    cond = " && ".join(f"latch::aligned4({names[i]}, 0)" for i in full) or "true"
    return lines, cond, pre
