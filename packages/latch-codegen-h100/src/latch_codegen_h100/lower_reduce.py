"""Lowerings of the reductions (latch_ops/reduction.py): sum, mean, amax, amin, prod, argmax, argmin.

A task computes a box of the output; each output element reduces over the full reduced dims of the
input. Float sums, means and products accumulate in double (cheap for these memory-bound ops, and
closer to the FP64 reference than float); integer ones in long long; max/min in compute type.
"""

from __future__ import annotations

from . import cgen
from .lowering import BodyContext, Lowering, compute_type

HEADER = "latch_reduce.cuh"
BLOCK_THRESHOLD = 2048  # reduced length from which the whole block reduces one output element
THREAD_THRESHOLD = 16  # reduced length up to which one thread reduces one output element


def _acc_type(op: str, dtype: str) -> str:
    ct = compute_type(dtype)
    if ct == "bool":
        ct = "long long"
    if op in ("sum", "mean", "prod") and ct == "float":
        return "double"
    return ct


# Reductions whose input may be computed in the body (an elementwise prologue fused into the
# reduction by latch-schedule's fusion: ``sum(g * g)`` reads g once): ``reduce_statements`` with
# ``load`` given. Each output element still reduces in the same fixed order, so the result is the
# same bits on every run.
PROLOGUE_REDUCTIONS = frozenset(f"latch::{n}" for n in ("sum", "mean", "amax", "amin", "prod"))


def _reduce_body(name: str):
    def body(ctx: BodyContext) -> str:
        return reduce_statements(name, ctx)
    return body


def row_reduction(dims, rank: int) -> bool:
    """Do ``dims`` reduce contiguous rows (the trailing dims: each output element one run of memory)?"""
    return bool(dims) and sorted(d % rank for d in dims) == list(range(rank - len(dims), rank))


def reduce_statements(name: str, ctx: BodyContext, load: list[str] | None = None,
                      load4: list[str] | None = None, vec_cond: str = "false",
                      pf4: list[str] | None = None, pfl: list[tuple[str, int]] | None = None) -> str:
    """The body's statements. ``load``: statements defining the lambda ``load(long long i)`` (element
    ``i`` of the input in its row-major order, as the accumulator type ``acc_type``), replacing the
    load from ``ctx.inputs[0].ptr``. ``load4``: statements defining ``load4(long long i, acc (&v)[4])``
    (elements i..i+3): a row reduction whose row length is a multiple of 4 then runs the vector
    path (``latch::reduce_rows_vec4_*``) when ``vec_cond`` holds at run time (the operands aligned).
    ``pf4``: statements defining ``pf4v(long long i)``, the L2 prefetch of the lines that ``load4v(i)``
    reads from memory (the short path's prefetch ahead; a plain input defines its own). ``pfl``:
    the (pointer, element bytes) of every operand the prologue reads at flat index ``i`` of the
    reduced input (a flat prologue's full-size inputs), for the contiguous row path's L2 prefetch
    (:func:`rows_contig_statements`; a plain input's is its own)."""
    x, out = ctx.inputs[0], ctx.outputs[0]
    dims = tuple(ctx.attr("dims"))
    keepdim = bool(ctx.attr("keepdim"))
    kept = [d for d in range(x.rank) if d not in dims]
    R = 1
    for d in dims:
        R *= x.shape[d]
    xst = cgen.strides(x.shape)
    # output dim of each kept input dim
    out_dim = {d: (d if keepdim else k) for k, d in enumerate(kept)}
    lines = [f"const long long n_out = {cgen.tile_count(out.rank)};"]
    lines.append("auto base = [&](long long o) -> long long {")
    lines += cgen.tile_decode("o", out.rank, "y", "  ")
    lines.append("  return " + cgen.dot([f"y{out_dim[d]}" for d in kept], [xst[d] for d in kept]) + ";")
    lines.append("};")
    lines += cgen.lambda_offset("r", cgen.merge_dims(dims, x.shape), "off")
    ost = cgen.strides(out.shape)
    if name in ("argmax", "argmin"):
        lines.append(f"auto load = [&](long long i) -> double {{ return (double)latch::ld<{x.ctype}>({x.ptr}, i); }};")
        lines.append("auto store = [&](long long o, long long v) {")
        lines += cgen.tile_decode("o", out.rank, "z", "  ")
        lines.append(f"  latch::st<{out.ctype}>({out.ptr}, "
                     f"{cgen.dot([f'z{k}' for k in range(out.rank)], ost)}, v);")
        lines.append("};")
        lines.append(f"latch::argreduce_warp_per_output<{'true' if name == 'argmax' else 'false'}>"
                     f"(n_out, {R}LL, base, off, load, store);")
        return "\n".join(lines)
    acc = _acc_type(name, x.dtype)
    op = {"sum": "latch::SumOp", "mean": "latch::SumOp", "prod": "latch::ProdOp",
          "amax": "latch::MaxOp", "amin": "latch::MinOp"}[name]
    if load is None:
        lines.append(f"auto load = [&](long long i) -> {acc} {{ return ({acc})latch::ld<{x.ctype}>({x.ptr}, i); }};")
    else:
        if name not in {p.split("::")[1] for p in PROLOGUE_REDUCTIONS}:
            raise ctx.fail(f"{name} takes no fused prologue")
        lines += load
    lines.append(f"auto store = [&](long long o, {acc} v) {{")
    lines += cgen.tile_decode("o", out.rank, "z", "  ")
    val = f"v / ({acc}){R}" if name == "mean" else "v"
    lines.append(f"  latch::st<{out.ctype}>({out.ptr}, {cgen.dot([f'z{k}' for k in range(out.rank)], ost)}, "
                 f"({compute_type(out.dtype)})({val}));")
    lines.append("};")
    if column_reduction(dims, x.rank) and R > THREAD_THRESHOLD:
        scalar = column_statements(acc, op, f"({acc}*){ctx.smem}", R)
        ct = compute_type(x.dtype)
        kept_last = len(kept) == 1 and kept[0] == x.rank - 1 and x.shape[-1] % 4 == 0
        if load is None and load4 is None and kept_last and ct in ("float", "double"):
            # a plain column reduction: its input read four columns at a time
            load4 = [f"auto load4 = [&](long long i, {acc} (&o4_)[4]) {{",
                     f"  {ct} r_[4];", f"  latch::gld4({x.ptr}, i, r_);",
                     "  #pragma unroll", f"  for (int j_ = 0; j_ < 4; ++j_) o4_[j_] = ({acc})r_[j_];", "};"]
            vec_cond = f"latch::aligned4({x.ptr}, 0)"
        if load4 is not None and kept_last and ct in ("float", "double"):
            # four consecutive outputs per thread (the kept dim is the last: consecutive outputs are
            # consecutive in memory), one 16-byte access per row; at run time the tile's first
            # output must sit on a multiple of four and its length be one
            lines += load4
            vec = column_vec_statements(acc, op, f"({acc}*){ctx.smem}", R)
            lines += [f"if (({vec_cond}) && n_out % 4 == 0 && base(0) % 4 == 0) {{"] + ["  " + x_ for x_ in vec]
            lines += ["} else {"] + ["  " + x_ for x_ in scalar] + ["}"]
        else:
            lines += scalar
        return "\n".join(lines)
    if R >= BLOCK_THRESHOLD:
        generic = (f"latch::reduce_block_per_output<{acc}, {op}>(n_out, {R}LL, base, off, load, store, "
                   f"({acc}*){ctx.smem});")
        vector = f"latch::reduce_rows_vec4_block<{acc}, {op}>(n_out, {R}LL, base, load4, store, ({acc}*){ctx.smem});"
    elif R <= THREAD_THRESHOLD:
        # short reductions (a split-K sum over S <= 16 partials): one thread per output, in index order
        generic = f"latch::reduce_thread_per_output<{acc}, {op}>(n_out, {R}LL, base, off, load, store);"
        vector = None
        short = None if load is not None and load4 is None else \
            short_vec_statements(name, ctx, acc, op, dims, load4, vec_cond, pf4)
        if short is not None:
            pre, cond, stmts = short
            lines += pre
            lines += [f"if ({cond}) {{"] + ["  " + x_ for x_ in stmts] + ["} else {", "  " + generic, "}"]
            return "\n".join(lines)
    else:
        generic = f"latch::reduce_warp_per_output<{acc}, {op}>(n_out, {R}LL, base, off, load, store);"
        vector = f"latch::reduce_rows_vec4_warp<{acc}, {op}>(n_out, {R}LL, base, load4, store);"
    rows_ok = R % 4 == 0 and row_reduction(dims, x.rank)
    if load is None and load4 is None and rows_ok and vector is not None and compute_type(x.dtype) in ("float", "double"):
        # a plain reduction: its input read four at a time (the prologue path defines these itself)
        ct = compute_type(x.dtype)
        load4 = [f"auto load4 = [&](long long i, {acc} (&o4_)[4]) {{",
                 f"  {ct} r_[4];", f"  latch::gld4({x.ptr}, i, r_);",
                 "  #pragma unroll", f"  for (int j_ = 0; j_ < 4; ++j_) o4_[j_] = ({acc})r_[j_];", "};",
                 f"auto load4v = [&](long long i, {ct} (&o4_)[4]) {{ latch::gld4({x.ptr}, i, o4_); }};"]
        vec_cond = f"latch::aligned4({x.ptr}, 0)"
    if vector is not None and R < BLOCK_THRESHOLD and load4 is not None and rows_ok and \
            compute_type(x.dtype) in ("float", "double"):
        ct = compute_type(x.dtype)
        vector = "\n  ".join(rows_statements(acc, ct, op, R))
        # a tile that is one contiguous range of the output reads one contiguous range of the
        # input (the reduced dims are the trailing ones): the straight-line, prefetched row path
        if pfl is None and load is None:
            big = cgen_numel(x.shape) * {"double": 8, "float": 4}.get(ct, 4) >= PREFETCH_MIN_BYTES
            pfl = [(x.ptr, 8 if ct == "double" else 4)] if big else []
        full, first, count = cgen.contiguous_tile(out.shape, "long long")
        contig = "\n    ".join(rows_contig_statements(name, acc, ct, op, R, out, first, count,
                                                     wide=cgen_numel(x.shape) >= 2**31, pfl=pfl or []))
        vector = f"if ({full}) {{\n    {contig}\n  }} else {{\n  {vector}\n  }}"
    if vector is not None and load4 is not None and rows_ok:
        lines += load4
        lines += [f"if ({vec_cond}) {{", "  " + vector, "} else {", "  " + generic, "}"]
    else:
        lines.append(generic)
    return "\n".join(lines)


# 16-byte loads per thread a short reduction's vector path keeps in flight in registers (U groups x
# R rows; software pipelined: the next U groups' rows load while the current ones are reduced, so
# twice as many registers hold data). TinyMoE-200M's combine (R = 2, one 16-byte row load and one
# 4-byte weight per row) ran at 38% of its bytes floor with 8 and no pipelining or prefetch (run 53:
# 186 us a task against a 71 us floor): every iteration waited a whole loaded HBM latency.
SHORT_LOADS = 12
# L2 prefetch distance of the short vector path, in iterations (flat.PREFETCH_AHEAD's rule: two
# batches requested ahead of the register loads, no register cost); 0 switches it off.
SHORT_PREFETCH_AHEAD = 2
# An input smaller than this is not prefetched: a table every task reads stays in the 60 MB L2
PREFETCH_MIN_BYTES = 1 << 20


def exact_in_float(name: str, R: int, acc: str, ct: str, out_ct: str) -> bool:
    """Does a sum of ``R`` <= 2 values of compute type float, accumulated in ``acc`` = double from
    the identity and rounded to float, give the bits of the same sum in float? Yes: 0 + a is exact
    in both (+0 for a = -0 in both), and for two floats RN24(RN53(a + b)) = RN24(a + b) (double
    rounding is innocuous when 53 >= 2 x 24 + 2, Figueroa 1995; subnormal sums of two floats are
    exact in both, a float overflow rounds to the same infinity). The short path then skips the
    double conversions (two F2F per element at a quarter of the FP32 rate)."""
    return name == "sum" and R <= 2 and acc == "double" and ct == "float" and out_ct == "float"


def short_vec_statements(name: str, ctx: BodyContext, acc: str, op: str, dims, load4: list[str] | None,
                         vec_cond: str, pf4: list[str] | None = None):
    """A short reduction (R <= THREAD_THRESHOLD) whose kept innermost dim is the input's innermost
    (the reduced dims are not last) and a multiple of 4, over a tile that is one contiguous range
    of the output (row tiles): (statements before, run-time condition, statements), or None where
    it does not apply. Thread t takes groups of four consecutive outputs (t, t + LATCH_THREADS, ...,
    U at a time): their coordinates decoded with constant extents (no run-time division), each of
    the R rows read with one 16-byte access (``load4v``: the input, or the fused prologue, at four
    consecutive elements), each output reduced in index order from the operator's identity in
    ``acc``, as ``reduce_thread_per_output`` does (the same operations in the same order: the same
    bits; :func:`exact_in_float` where float gives them too), and written with one 16-byte store.
    Software pipelined as flat.py's loop: the rows of the thread's next U groups are loaded before
    the current ones are reduced and stored, and at the top of each iteration the lines of the groups
    SHORT_PREFETCH_AHEAD iterations ahead are prefetched into L2 (``pf4v``: the plain input's, or
    the prologue's full-size vector operands'; never past the tile). ``load4``: a fused prologue's
    statements (defining ``load4v``), or None for a plain input; ``pf4``: its ``pf4v``."""
    x, out = ctx.inputs[0], ctx.outputs[0]
    rank = x.rank
    red = {d % rank for d in dims}
    kept = [d for d in range(rank) if d not in red]
    if name not in ("sum", "mean", "amax", "amin", "prod") or not kept or kept[-1] != rank - 1:
        return None
    if x.shape[-1] % 4 or not out.shape or out.shape[-1] != x.shape[-1]:
        return None
    if compute_type(x.dtype) not in ("float", "double") or compute_type(out.dtype) not in ("float", "double"):
        return None
    R = 1
    for d in red:
        R *= x.shape[d]
    wide = max(cgen_numel(x.shape), cgen_numel(out.shape)) >= 2**31
    it = "long long" if wide else "int"
    full, first, count = cgen.contiguous_tile(out.shape, it)
    keepdim = bool(ctx.attr("keepdim"))
    out_dim = {d: (d if keepdim else k) for k, d in enumerate(kept)}
    xst, ost = cgen.strides(x.shape), cgen.strides(out.shape)
    ct = compute_type(x.dtype)
    out_ct = compute_type(out.dtype)
    pre = list(load4 or [])  # a fused prologue's load4 / load4v (flat.reduce_body)
    if load4 is None:
        pre.append(f"auto load4v = [&](long long i, {ct} (&o4_)[4]) {{ latch::gld4({x.ptr}, i, o4_); }};")
        vec_cond = f"latch::aligned4({x.ptr}, 0)"
        big = cgen_numel(x.shape) * {"double": 8, "float": 4}.get(ct, 4) >= PREFETCH_MIN_BYTES
        pf4 = [f"auto pf4v = [&](long long i) {{ latch::gpf4({x.ptr}, i); }};"] if big else None
    ahead = SHORT_PREFETCH_AHEAD if pf4 else 0
    pre += list(pf4 or []) if ahead else []
    U = max(1, SHORT_LOADS // R)
    av = ct if exact_in_float(name, R, acc, ct, out_ct) else acc  # the accumulator's type here
    init = f"{op}::template init<{av}>()"
    val = f"a_[j_] / ({av}){R}" if name == "mean" else "a_[j_]"
    # input offset of each row of the reduced dims (their merged index r: row-major over them)
    rsizes = [x.shape[d] for d in sorted(red)]
    rstr = [xst[d] for d in sorted(red)]
    roff = []
    for r in range(R):
        q, terms = r, []
        for sz, st in zip(reversed(rsizes), reversed(rstr)):
            terms.append((q % sz) * st)
            q //= sz
        roff.append(sum(terms))
    # the output's coordinates of flat output element l_ (constant extents)
    dec, acc_ = [], 1
    for d in reversed(range(1, out.rank)):
        dec.append(f"const {it} y{d} = ({'l_' if acc_ == 1 else f'l_ / {acc_}'}) % {out.shape[d]};")
        acc_ *= out.shape[d]
    dec.append(f"const {it} y0 = {'l_' if acc_ == 1 else f'l_ / {acc_}'};")
    bexpr = " + ".join(f"y{out_dim[d]} * {xst[d]}" if xst[d] != 1 else f"y{out_dim[d]}" for d in kept)

    def at(g: str, what: list[str], ind: str, clamp: bool = False) -> list[str]:
        """``what`` for the group at index ``g``, given its input row base b_: skipped past the tile,
        or (``clamp``: the register loads) done at the tile's last group instead, a valid address
        whose values are not used. Clamped, the loads of every group sit in one straight line, so
        ptxas issues them all before the first use of any (a fused prologue computes right after
        its loads: guarded by a branch per group, each group's loads waited for the previous
        group's arithmetic, two 16-byte loads in flight per thread instead of 2 U)."""
        if clamp:
            head = [f"{ind}{{", f"{ind}  const {it} gc_ = {g} < n4_ ? {g} : n4_ - 1;",
                    f"{ind}  const {it} l_ = first_ + 4 * gc_;"]
        else:
            head = [f"{ind}if ({g} < n4_) {{", f"{ind}  const {it} l_ = first_ + 4 * ({g});"]
        return (head + [f"{ind}  {d}" for d in dec] + [f"{ind}  const long long b_ = {bexpr};"]
                + [f"{ind}  {w}" for w in what] + [f"{ind}}}"])

    loads = lambda dst: [f"load4v(b_ + {roff[r]}LL, {dst}[u_][{r}]);" for r in range(R)]  # noqa: E731
    stmts = [
        "{",
        f"  const {it} n4_ = {count} / 4, first_ = {first};",
        f"  {ct} v_[{U}][{R}][4];  // the next groups' rows: loads in flight",
        "  if (n4_ > 0) {",
        "    #pragma unroll",
        f"    for (int u_ = 0; u_ < {U}; ++u_) {{",
    ] + at(f"({it})threadIdx.x + u_ * LATCH_THREADS", loads("v_"), "      ", clamp=True) + [
        "    }",
        "  }",
        f"  for ({it} g0_ = threadIdx.x; g0_ < n4_; g0_ += {U} * LATCH_THREADS) {{",
    ]
    if ahead:
        stmts += [f"    // L2 prefetch of iteration +{ahead}'s rows (pf4v: one thread per 128-byte line)",
                  "    #pragma unroll",
                  f"    for (int u_ = 0; u_ < {U}; ++u_) {{"]
        stmts += at(f"g0_ + ({ahead * U} + u_) * LATCH_THREADS",
                    [f"pf4v(b_ + {roff[r]}LL);" for r in range(R)], "      ")
        stmts += ["    }"]
    stmts += [
        f"    {ct} c_[{U}][{R}][4];",
        "    #pragma unroll",
        f"    for (int u_ = 0; u_ < {U}; ++u_) {{",
        "      #pragma unroll",
        f"      for (int r_ = 0; r_ < {R}; ++r_) {{",
        "        #pragma unroll",
        "        for (int j_ = 0; j_ < 4; ++j_) c_[u_][r_][j_] = v_[u_][r_][j_];",
        "      }",
    ] + at(f"g0_ + ({U} + u_) * LATCH_THREADS", loads("v_"), "      ", clamp=True) + [
        "    }",
        "    #pragma unroll",
        f"    for (int u_ = 0; u_ < {U}; ++u_) {{",
        "      if (g0_ + u_ * LATCH_THREADS < n4_) {",
        f"        {av} a_[4] = {{{init}, {init}, {init}, {init}}};",
        "        #pragma unroll",
        f"        for (int r_ = 0; r_ < {R}; ++r_) {{",
        "          #pragma unroll",
        f"          for (int j_ = 0; j_ < 4; ++j_) a_[j_] = {op}::apply(a_[j_], ({av})c_[u_][r_][j_]);",
        "        }",
        f"        {out_ct} o_[4];",
        "        #pragma unroll",
        f"        for (int j_ = 0; j_ < 4; ++j_) o_[j_] = ({out_ct})({val});",
        "        latch::gst4(" + f"{out.ptr}, first_ + 4 * (g0_ + u_ * LATCH_THREADS), o_);",
        "      }",
        "    }",
        "  }",
        "}",
    ]
    cond = f"({full}) && ({first}) % 4 == 0 && ({count}) % 4 == 0 && ({vec_cond}) && latch::aligned4({out.ptr}, 0)"
    return pre, cond, stmts


def cgen_numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


# 16-byte loads in flight per lane in a row reduction (over one or several rows): 16 x 16 B x 256
# threads = 64 KiB per SM (the clip's sum of squares over 768-rows ran at ~31% of the bytes floor
# with 6, ~24 KiB, and nothing in flight while a warp reduced)
ROW_ACCESSES = 16
ROW_MAX_RU = 16  # rows one warp holds at once (short rows)


def _warp_row_sums(acc: str, op: str, ru: int, per: int) -> list[str]:
    """The row paths' reduction of the loaded ``v_[ru][per][4]``: per row, four accumulators in k
    order from the identity, ``(a0 + a1) + (a2 + a3)``, the xor-shuffle warp reduction into ``t_``
    (the caller's lines store it and close the row loop)."""
    init = f"{op}::template init<{acc}>()"
    return [
        "  #pragma unroll",
        f"  for (int u_ = 0; u_ < {ru}; ++u_) {{",
        f"    {acc} a_[4] = {{{init}, {init}, {init}, {init}}};",
        "    #pragma unroll",
        f"    for (int k_ = 0; k_ < {per}; ++k_) {{",
        "      #pragma unroll",
        f"      for (int j_ = 0; j_ < 4; ++j_) a_[j_] = {op}::apply(a_[j_], ({acc})v_[u_][k_][j_]);",
        "    }",
        f"    {acc} t_ = {op}::apply({op}::apply(a_[0], a_[1]), {op}::apply(a_[2], a_[3]));",
        f"    t_ = latch::warp_reduce<{op}>(t_);",
    ]


def rows_statements(acc: str, ct: str, op: str, R: int) -> list[str]:
    """A row reduction of rows of ``R`` contiguous elements (R % 4 == 0, R < BLOCK_THRESHOLD):
    a warp per row, each lane holding its PER = ceil(R / 128) groups of four of the row in
    registers, RU rows per warp at once (RU * PER ~ ROW_ACCESSES loads in flight per lane, all
    issued before any arithmetic), then per row four accumulators in index order, combined in a
    fixed order and across the warp by xor shuffles: the same bits on every run. ``load4v(i, v)``
    fills v with elements i..i+3 in compute type ``ct``."""
    per = -(-R // 128)
    ru = max(1, min(ROW_MAX_RU, ROW_ACCESSES // per))
    init_c = f"{op}::template init<{ct}>()"
    init = f"{op}::template init<{acc}>()"
    return [
        "{",
        "const int lane_ = threadIdx.x & 31, warp_ = threadIdx.x >> 5;",
        "constexpr int NW_ = LATCH_THREADS / 32;",
        f"for (long long o0_ = (long long)warp_ * {ru}; o0_ < n_out; o0_ += (long long)NW_ * {ru}) {{",
        f"  {ct} v_[{ru}][{per}][4];",
        "  #pragma unroll",
        f"  for (int u_ = 0; u_ < {ru}; ++u_) {{",
        "    const long long b_ = o0_ + u_ < n_out ? base(o0_ + u_) : 0LL;",
        "    #pragma unroll",
        f"    for (int k_ = 0; k_ < {per}; ++k_) {{",
        "      const long long r_ = 4LL * lane_ + 128LL * k_;",
        f"      if (o0_ + u_ < n_out && r_ < {R}LL) load4v(b_ + r_, v_[u_][k_]);",
        f"      else {{ v_[u_][k_][0] = v_[u_][k_][1] = v_[u_][k_][2] = v_[u_][k_][3] = {init_c}; }}",
        "    }",
        "  }",
    ] + _warp_row_sums(acc, op, ru, per) + [
        "    if (lane_ == 0 && o0_ + u_ < n_out) store(o0_ + u_, t_);",
        "  }",
        "}",
        "}",
    ]


# The contiguous row path (rows_contig_statements): 16-byte loads per lane of one batch (RU rows x
# PER groups, RU = ceil(ROW_CONTIG_ACCESSES / PER): 16 for rows of 512, 18 for rows of 768), all
# issued in one straight line before the first arithmetic, and the L2 prefetch distance in
# batches of the warp (the task's first ROW_PREFETCH_AHEAD batches are requested at its start).
# rows_statements' loads sat behind the per-row base() (a run-time 64-bit division by the tile's
# extents, branches): ptxas issued one row's PER loads, waited, squared, then the next row's, so
# a lane had PER loads in flight (4 or 6: 16-24 KiB per SM) and each row cost one HBM round trip:
# the clip's sum of squares ran at 30% (rows of 512) and 61% (rows of 768) of its bytes floor
# (run 39: 20.6 us for 197 KB, 60.1 us for 1.18 MB a task).
ROW_CONTIG_ACCESSES = 16
ROW_PREFETCH_AHEAD = 2


def rows_contig_statements(name: str, acc: str, ct: str, op: str, R: int, out, first: str, count: str,
                           wide: bool, pfl: list[tuple[str, int]]) -> list[str]:
    """The row reduction over a tile that is ONE contiguous range of the output (``first``,
    ``count``: :func:`latch_codegen_h100.cgen.contiguous_tile`), so its rows are one contiguous
    range of the input: output ``first + o`` reduces elements ``(first + o) * R`` .. ``+ R - 1``
    (no per-row coordinate decode). Per row the same operations in the same order as
    :func:`rows_statements` (a warp per row, lane l's groups at 4 l + 128 k, four accumulators in
    k order from the identity, ``(a0 + a1) + (a2 + a3)``, the xor-shuffle warp reduction): the
    same bits. Warp w's batch b is the RU consecutive rows from (b NW + w) RU:

    - its RU x PER ``load4v`` in one straight line: the rows clamped to the tile's last row and
      a lane's group past the row's end to its last group (valid addresses, values replaced by
      the identity; only a row length that is not a multiple of 128 has such lanes), so ptxas
      issues every load before the first square, F2F or DADD;
    - at the top of each batch, the L2 prefetch (``latch::gpf``: one address per 128-byte line,
      lanes striding the lines; never past the tile) of the warp's batch ROW_PREFETCH_AHEAD ahead,
      of every operand of ``pfl`` ((pointer, element bytes), read at the flat index); before the
      first batch the ones in between, so a short task requests all its bytes at its start;
    - each row's result stored by lane 0 at ``first + o``."""
    per = -(-R // 128)
    ru = max(1, min(ROW_MAX_RU, -(-ROW_CONTIG_ACCESSES // per)))
    it = "long long" if wide else "int"
    init_c = f"{op}::template init<{ct}>()"
    init = f"{op}::template init<{acc}>()"
    ahead = ROW_PREFETCH_AHEAD if pfl else 0
    val = f"t_ / ({acc}){R}" if name == "mean" else "t_"
    L = [
        "{",
        "const int lane_ = threadIdx.x & 31, warp_ = threadIdx.x >> 5;",
        "constexpr int NW_ = LATCH_THREADS / 32;",
        f"const {it} n_ = ({it})({count}), first_ = ({it})({first});",
    ]

    def prefetch(batch: str, ind: str) -> list[str]:
        """The L2 prefetch of the warp's rows from ``batch`` (a row index), RU of them."""
        lines = [f"{ind}{{",
                 f"{ind}  const {it} p0_ = {batch};",
                 f"{ind}  const {it} pe_ = (n_ - p0_ < {ru} ? n_ - p0_ : {ru}) * {R};  // elements left in the batch",
                 f"{ind}  const long long pb_ = (long long)(first_ + p0_) * {R}LL;"]
        for ptr, size in pfl:
            step = max(1, 128 // size)  # elements of one line
            nl = -(-ru * R // step)
            lines += [f"{ind}  #pragma unroll",
                      f"{ind}  for (int m_ = 0; m_ < {-(-nl // 32)}; ++m_) {{",
                      f"{ind}    const {it} e_ = (lane_ + 32 * m_) * {step};",
                      f"{ind}    if (e_ < pe_) latch::gpf({ptr}, pb_ + e_);",
                      f"{ind}  }}"]
        return lines + [f"{ind}}}"]

    if ahead:
        L += ["// the task's first batches requested at its start (the loop prefetches the rest)",
              f"for (int a_ = 1; a_ < {ahead}; ++a_) {{",
              f"  if (({it})(warp_ + a_ * NW_) * {ru} < n_) {{"]
        L += prefetch(f"({it})(warp_ + a_ * NW_) * {ru}", "    ")
        L += ["  }", "}"]
    L += [
        f"if (n_ > 0) for ({it} o0_ = ({it})warp_ * {ru}; o0_ < n_; o0_ += ({it})NW_ * {ru}) {{",
    ]
    if ahead:
        L += [f"  // L2 prefetch of batch +{ahead}'s rows: lanes striding its 128-byte lines",
              f"  if (o0_ + ({it})NW_ * {ru * ahead} < n_) {{"]
        L += prefetch(f"o0_ + ({it})NW_ * {ru * ahead}", "    ")
        L += ["  }"]
    L += [
        f"  {ct} v_[{ru}][{per}][4];",
        "  #pragma unroll",
        f"  for (int u_ = 0; u_ < {ru}; ++u_) {{",
        f"    const {it} oc_ = o0_ + u_ < n_ ? o0_ + u_ : n_ - 1;  // clamped: a valid row",
        "    const long long b_ = (long long)(first_ + oc_) * " + f"{R}LL;",
        "    #pragma unroll",
        f"    for (int k_ = 0; k_ < {per}; ++k_) {{",
        "      const int r_ = 4 * lane_ + 128 * k_;",
    ]
    if R % 128:
        L += [f"      load4v(b_ + (r_ < {R} ? r_ : {R - 4}), v_[u_][k_]);",
              f"      if (r_ >= {R}) {{ v_[u_][k_][0] = v_[u_][k_][1] = v_[u_][k_][2] = v_[u_][k_][3] = {init_c}; }}"]
    else:
        L += ["      load4v(b_ + r_, v_[u_][k_]);"]
    L += [
        "    }",
        "  }",
    ] + _warp_row_sums(acc, op, ru, per) + [
        f"    if (lane_ == 0 && o0_ + u_ < n_) latch::st<{out.ctype}>({out.ptr}, (long long)(first_ + o0_ + u_), "
        f"({compute_type(out.dtype)})({val}));",
        "  }",
        "}",
        "}",
    ]
    return L


COLUMN_UNROLL = 8  # independent loads (and accumulators) per thread and iteration of a column reduction


def column_reduction(dims, rank: int) -> bool:
    """Do ``dims`` reduce the leading dims (each output element a column: consecutive outputs are
    consecutive in memory, the reduced index strides over whole rows)?"""
    return bool(dims) and len(dims) < rank and sorted(d % rank for d in dims) == list(range(len(dims)))


def column_statements(acc: str, op: str, scratch: str, R: int) -> list[str]:
    """A column reduction (``n_out`` outputs, ``R`` rows; ``base``, ``off``, ``load``, ``store`` as
    the other paths define them): the 32 lanes of a warp take 32 consecutive outputs (one 128-byte
    access per row), the warps split the rows (warp w takes rows w, w + W, ...), each thread keeps
    COLUMN_UNROLL accumulators fed by independent loads, combined in index order, and the warps'
    partials are combined in warp order through shared memory: a fixed order, the same bits on every
    run, no atomics."""
    U = COLUMN_UNROLL
    init = f"{op}::template init<{acc}>()"
    return [
        "{",
        f"  {acc}* cs_ = {scratch};",
        "  const int lane_ = threadIdx.x & 31, warp_ = threadIdx.x >> 5;",
        "  constexpr int NW_ = LATCH_THREADS / 32;",
        "  static_assert(LATCH_THREADS <= 256, \"the column partials fill 256 x 8 bytes of scratch\");",
        "  for (long long o0_ = 0; o0_ < n_out; o0_ += 32) {",
        "    const long long o = o0_ + lane_;",
        f"    {acc} a_[{U}];",
        "    #pragma unroll",
        f"    for (int k_ = 0; k_ < {U}; ++k_) a_[k_] = {init};",
        "    if (o < n_out) {",
        "      const long long b_ = base(o);",
        "      long long r_ = warp_;",
        f"      for (; r_ + {U - 1}LL * NW_ < {R}LL; r_ += {U}LL * NW_) {{",
        f"        {acc} v_[{U}];",
        "        #pragma unroll",
        f"        for (int k_ = 0; k_ < {U}; ++k_) v_[k_] = load(b_ + off(r_ + k_ * NW_));",
        "        #pragma unroll",
        f"        for (int k_ = 0; k_ < {U}; ++k_) a_[k_] = {op}::apply(a_[k_], v_[k_]);",
        "      }",
        f"      for (; r_ < {R}LL; r_ += NW_) a_[0] = {op}::apply(a_[0], load(b_ + off(r_)));",
        "    }",
        f"    {acc} t_ = a_[0];",
        "    #pragma unroll",
        f"    for (int k_ = 1; k_ < {U}; ++k_) t_ = {op}::apply(t_, a_[k_]);",
        "    latch::block_sync();  // the previous round's partials are read",
        "    cs_[warp_ * 32 + lane_] = t_;",
        "    latch::block_sync();",
        "    if (warp_ == 0 && o < n_out) {",
        f"      {acc} s_ = cs_[lane_];",
        "      for (int w_ = 1; w_ < NW_; ++w_) s_ = " + f"{op}::apply(s_, cs_[w_ * 32 + lane_]);",
        "      store(o, s_);",
        "    }",
        "  }",
        "  latch::block_sync();  // the scratch is free for the next body",
        "}",
    ]


COLUMN_GROUPS = 8  # groups of four consecutive outputs per pass of the vector column path (32 outputs)
COLUMN_VEC_UNROLL = 8  # rows whose 16-byte accesses a thread of the vector column path has in flight


def column_vec_statements(acc: str, op: str, scratch: str, R: int) -> list[str]:
    """A column reduction whose outputs are consecutive in memory (the kept dim is the innermost),
    four outputs per thread: thread t takes the group of four outputs ``t % 8`` of a pass of 32
    and the row slice ``t / 8`` (rows s, s + 32, ...), COLUMN_VEC_UNROLL rows' 16-byte accesses
    per operand (``load4``: the fused prologue at four consecutive columns) issued before they are
    accumulated, in row order, into the thread's four accumulators; then the 32 row slices'
    partials in slice order through shared memory (32 x 32 accumulators). A fixed order: the same
    bits on every run, no atomics. The caller checks that the tile's outputs start at a multiple of
    four, come in whole fours, and that the operands are aligned."""
    U, GP = COLUMN_VEC_UNROLL, COLUMN_GROUPS
    init = f"{op}::template init<{acc}>()"
    return [
        "{",
        f"  {acc}* cs_ = {scratch};",
        f"  constexpr int GP_ = {GP}, RW_ = LATCH_THREADS / GP_;",
        f"  static_assert(RW_ * GP_ * 4 * sizeof({acc}) <= {COLUMN_SCRATCH}, \"the column partials fill the scratch\");",
        "  const int gi_ = threadIdx.x % GP_, rs_ = threadIdx.x / GP_;",
        "  for (long long o0_ = 0; o0_ < n_out; o0_ += 4 * GP_) {",
        "    const long long o_ = o0_ + 4 * gi_;",
        f"    {acc} a_[4] = {{{init}, {init}, {init}, {init}}};",
        "    if (o_ < n_out) {",
        "      const long long b_ = base(o_);",
        "      long long r_ = rs_;",
        f"      for (; r_ + {U - 1}LL * RW_ < {R}LL; r_ += {U}LL * RW_) {{",
        f"        {acc} v_[{U}][4];",
        "        #pragma unroll",
        f"        for (int k_ = 0; k_ < {U}; ++k_) load4(b_ + off(r_ + k_ * RW_), v_[k_]);",
        "        #pragma unroll",
        f"        for (int k_ = 0; k_ < {U}; ++k_) {{",
        "          #pragma unroll",
        f"          for (int j_ = 0; j_ < 4; ++j_) a_[j_] = {op}::apply(a_[j_], v_[k_][j_]);",
        "        }",
        "      }",
        f"      for (; r_ < {R}LL; r_ += RW_) {{",
        f"        {acc} v_[4];",
        "        load4(b_ + off(r_), v_);",
        "        #pragma unroll",
        f"        for (int j_ = 0; j_ < 4; ++j_) a_[j_] = {op}::apply(a_[j_], v_[j_]);",
        "      }",
        "    }",
        "    latch::block_sync();  // the previous pass's partials are read",
        "    #pragma unroll",
        "    for (int j_ = 0; j_ < 4; ++j_) cs_[rs_ * (4 * GP_) + 4 * gi_ + j_] = a_[j_];",
        "    latch::block_sync();",
        "    if (threadIdx.x < 4 * GP_ && o0_ + threadIdx.x < n_out) {",
        f"      {acc} s_ = cs_[threadIdx.x];",
        f"      for (int w_ = 1; w_ < RW_; ++w_) s_ = {op}::apply(s_, cs_[w_ * (4 * GP_) + threadIdx.x]);",
        "      store(o0_ + threadIdx.x, s_);",
        "    }",
        "  }",
        "  latch::block_sync();  // the scratch is free for the next body",
        "}",
    ]


def acc_type(op: str, dtype: str) -> str:
    """The accumulator's C++ type of reduction ``op`` (``latch::sum``) over ``dtype``."""
    return _acc_type(op.split("::")[-1], dtype)


COLUMN_SCRATCH = 256 * 4 * 8  # the vector column path's partials: 256 threads x 4 doubles


def _smem(ctx: BodyContext) -> int:
    # block_reduce's 33 doubles, a column reduction's partials (one per consumer thread), or the
    # vector column path's (four per consumer thread)
    return max(33 * 8, 256 * 8, COLUMN_SCRATCH)


def lowerings() -> list[Lowering]:
    return [Lowering(f"latch::{n}", body=_reduce_body(n), headers=(HEADER,), smem=_smem,
                     doc=f"reduction {n} over attribute dims")
            for n in ("sum", "mean", "amax", "amin", "prod", "argmax", "argmin")]
