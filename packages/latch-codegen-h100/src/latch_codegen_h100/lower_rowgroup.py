"""The row group body: a row reduction, the chain on its statistic and the broadcast consumer in one pass.

A row group (latch-schedule ``rowgroups``: RMSNorm forward ``x * rsqrt(mean(x * x) + eps) * w``,
its backward ``r * (dy * w) - x * r^3 * mean(dy * w * x) / d``, LayerNorm's two statistics) holds
values of four classes, by shape (R the row length, the primary output's innermost extent):
FULL (one element per (row, column): flat offset ``row * R + col``), ROWVEC (one per column: the
weight), STAT (one per row: flat offset ``row``) and SCALAR. A task covers whole rows (the
scheduler's tiling never splits the innermost dim of a row group).

The body: a warp per row, RU rows per warp at once; lane l holds columns ``4 l + 128 k`` .. +3 for
k < PER = ceil(R / 128) of every FULL input of its RU rows in registers (all loads issued before
any arithmetic: RU * PER * inputs 16-byte loads in flight per lane, RU chosen for ~ROW_ACCESSES),
ROWVEC inputs once per task, STAT inputs once per row. Then, in the group's node order, each
reduction accumulates its (fused) input from the registers: four accumulators per lane in column
order, combined ``(a0 + a1) + (a2 + a3)``, then the warp's xor butterfly (every lane ends with the
same bits: IEEE addition is commutative), divided by R for a mean and rounded to the statistic's
type: a fixed order, the same bits on every run, no atomics. The statistic chain is computed once
per row (every lane, the same value); FULL outputs are computed from the registers and stored
four columns at a time; STAT outputs by lane 0 once per row. x is read once, the statistic never
reaches memory unless it is a group output (RMSNorm's ``r``, saved for the backward).

16-byte accesses need every FULL and ROWVEC operand aligned to four elements (R % 4 == 0 makes
every row start aligned when the base is): checked at run time, else the same loop with one
element per access.
"""

from __future__ import annotations

import math

from latch_core.rowclass import FULL, ROWVEC, SCALAR, STAT, value_class

from .bodies import IN, OUT, BodySpec, _ptr_decl
from .lowering import Lowering, LoweringError, compute_type, storage_type

ROW_REDUCTIONS = frozenset({"latch::sum", "latch::mean"})  # latch-schedule rowgroups.ROW_REDUCTIONS
ROW_ACCESSES = 12  # 16-byte loads per lane of one batch (RU rows x PER groups x FULL inputs)
ROW_MAX_RU = 4
# registers of one batch's row elements up to which the next batch is loaded while this one is
# computed (two buffers, a software pipeline): 0, off. In the bench document alone a pipelined
# RMSNorm forward (one 768-row per batch, 24 floats) compiled without spills, but inside the full
# dense transformer's kernel ptxas spilled it (600 bytes; the same body's text) and the pipelined
# row reductions (lower_reduce) likewise (160-288 bytes): the registers a callee may use depend on
# the kernel around it. One batch of 12 loads (two 768-rows of x, or one of x and dy) is what the
# row reductions ran before without spilling there.
PIPELINE_REGS = 0


def is_row_group(spec: BodySpec) -> bool:
    """Does ``spec`` hold a row reduction before its last node (a row group, not a prologue)?"""
    return any(n.op in ROW_REDUCTIONS for n in spec.nodes[:-1])


class _RowPuller:
    """Expressions of group values at lane element (u_, k_, j_) (FULL) or row u_ (STAT)."""

    def __init__(self, spec: BodySpec, lowerings: dict[str, Lowering], cls: dict[int, str], indent: str):
        self.spec, self.low, self.cls, self.ind = spec, lowerings, cls, indent
        self.producer = {o: n for n in spec.nodes for o in n.outputs}
        self.lines: list[str] = []
        self.memo: dict[int, str] = {}
        self.count = 0

    def stat(self, vi: int) -> str:
        """A STAT or SCALAR value's expression (its register, computed before)."""
        c = self.cls[vi]
        v = self.spec.values[vi]
        if c == SCALAR:
            return f"c{vi}_"
        if v.kind == IN:
            return f"s{vi}_[u_]"
        n = self.producer[vi]
        if n.op == "latch::reshape":  # a statistic's reshape: the same elements
            return self.stat(next(i for i in n.inputs if i is not None))
        return f"s{vi}_[u_]"

    def full(self, vi: int) -> str:
        """A value's element at the lane's column (u_, k_, j_) of the row."""
        c = self.cls[vi]
        if c in (STAT, SCALAR):
            return self.stat(vi)
        v = self.spec.values[vi]
        if v.kind == IN:
            return f"f{vi}_[u_][k_][j_]" if c == FULL else f"w{vi}_[k_][j_]"
        if vi in self.memo:
            return self.memo[vi]
        n = self.producer[vi]
        src = [i for i in n.inputs if i is not None]
        if n.op in ("latch::reshape", "latch::expand"):
            name = self.full(src[0])
        else:
            low = self.low[n.op]
            if low.expr is None:
                raise LoweringError(f"row group: {n.op} has no elementwise form")
            from .fuse import node_info

            args = ["" if i is None else self.full(i) for i in n.inputs]
            ct = compute_type(v.dtype)
            self.count += 1
            name = f"e{self.count}_"
            self.lines.append(f"{self.ind}const {ct} {name} = ({ct})({low.expr(args, node_info(self.spec, n, ()))});")
        self.memo[vi] = name
        return name


def row_body(spec: BodySpec, lowerings: dict[str, Lowering]) -> list[str]:
    """The statements of a row group's device function (module docstring)."""
    P = tuple(spec.values[spec.primary].shape)
    if not P:
        raise LoweringError("row group: a scalar primary output has no rows")
    R = P[-1]
    rows = math.prod(P) // R
    if R % 4 or R <= 0:
        raise LoweringError(f"row group: rows of {R} elements; the row body needs a multiple of four")
    cls = {i: value_class(v.shape, rows, R) for i, v in enumerate(spec.values)}
    for i, c in cls.items():
        if c is None:
            raise LoweringError(f"row group: value {i} of shape {spec.values[i].shape} is neither a row, a column "
                                f"vector, a statistic nor a scalar of the {rows} x {R} rows")
    for n in spec.nodes:
        if n.op in ROW_REDUCTIONS:
            a = dict(n.attrs)
            x = spec.values[n.inputs[0]]
            dims = a.get("dims")
            dims = tuple(int(d) % len(x.shape) for d in (dims if isinstance(dims, (tuple, list)) else (dims,)))
            if cls[n.inputs[0]] != FULL or dims != (len(x.shape) - 1,) or not a.get("keepdim"):
                raise LoweringError(f"row group: {n.op} is not a reduction of the rows over the innermost dim")
    if cls[spec.primary] != FULL:
        raise LoweringError("row group: the primary output is not a row-shaped value")
    decl, names = _ptr_decl(spec)
    full_in = [i for i, v in enumerate(spec.values) if v.kind == IN and cls[i] == FULL]
    vec_in = [i for i, v in enumerate(spec.values) if v.kind == IN and cls[i] == ROWVEC]
    stat_in = [i for i, v in enumerate(spec.values) if v.kind == IN and cls[i] == STAT]
    scal_in = [i for i, v in enumerate(spec.values) if v.kind == IN and cls[i] == SCALAR]
    full_out = [i for i, v in enumerate(spec.values) if v.kind == OUT and cls[i] == FULL]
    stat_out = [i for i, v in enumerate(spec.values) if v.kind == OUT and cls[i] == STAT]
    other_out = [i for i, v in enumerate(spec.values) if v.kind == OUT and cls[i] not in (FULL, STAT)]
    if other_out:
        raise LoweringError(f"row group: output {other_out[0]} is neither row-shaped nor a statistic")
    PER = -(-R // 128)
    RU = max(1, min(ROW_MAX_RU, ROW_ACCESSES // (PER * max(1, len(full_in)))))
    wide = math.prod(P) >= 2**31
    it = "long long" if wide else "int"
    L = list(decl)
    L.append(f"  // row group: rows of {R} elements, {RU} row(s) per warp at once, {PER} group(s) of four per lane")
    # the tile's rows: every dim of the primary but the innermost (the tiling keeps that one whole)
    lead = len(P) - 1
    ext = [f"((long long)c.t->hi[{d}] - c.t->lo[{d}])" for d in range(lead)]
    L.append(f"  const long long n_rows_ = {' * '.join(ext) if ext else '1LL'};")
    L.append("  auto row_of_ = [&](long long i) -> long long {")
    if lead:
        st = [math.prod(P[d + 1:lead]) for d in range(lead)]
        L.append("    long long q = i, f = 0;")
        for d in reversed(range(lead)):
            if d:
                L.append(f"    f += ((long long)c.t->lo[{d}] + q % {ext[d]}) * {st[d]}LL; q /= {ext[d]};")
            else:
                L.append(f"    f += ((long long)c.t->lo[0] + q) * {st[0]}LL;")
        L.append("    return f;")
    else:
        L.append("    return 0LL;")
    L.append("  };")
    L.append("  const int lane_ = threadIdx.x & 31, warp_ = threadIdx.x >> 5;")
    L.append("  constexpr int NW_ = LATCH_THREADS / 32;")
    for i in scal_in:
        v = spec.values[i]
        L.append(f"  const {compute_type(v.dtype)} c{i}_ = latch::ld<{storage_type(v.dtype)}>({names[i]}, 0);")
    aligned = [names[i] for i in full_in + vec_in + full_out]
    cond = " && ".join(f"latch::aligned4({p}, 0)" for p in aligned) or "true"
    L.append(f"  if ({cond}) {{  // 16-byte accesses")
    L += _loop(spec, lowerings, cls, names, full_in, vec_in, stat_in, full_out, stat_out, R, PER, RU, it, True)
    L.append("  } else {  // an operand not aligned to four elements: one element per access")
    L += _loop(spec, lowerings, cls, names, full_in, vec_in, stat_in, full_out, stat_out, R, PER, RU, it, False)
    L.append("  }")
    return L


def _ld4(vec: bool, dtype: str, ptr: str, off: str, reg: str) -> str:
    if vec:
        return f"latch::gld4({ptr}, {off}, {reg});"
    return f"for (int j_ = 0; j_ < 4; ++j_) {reg}[j_] = latch::ld<{storage_type(dtype)}>({ptr}, {off} + j_);"


def _st4(vec: bool, dtype: str, ptr: str, off: str, reg: str) -> str:
    if vec:
        return f"latch::gst4({ptr}, {off}, {reg});"
    return f"for (int j_ = 0; j_ < 4; ++j_) latch::st<{storage_type(dtype)}>({ptr}, {off} + j_, {reg}[j_]);"


def _loop(spec, lowerings, cls, names, full_in, vec_in, stat_in, full_out, stat_out, R, PER, RU, it, vec) -> list[str]:
    from . import lower_reduce

    I = "    "
    L = []
    col = "(4 * lane_ + 128 * k_)"
    for i in vec_in:  # the weight: the lane's columns, once per task
        v = spec.values[i]
        L += [f"{I}{compute_type(v.dtype)} w{i}_[{PER}][4];",
              f"{I}#pragma unroll", f"{I}for (int k_ = 0; k_ < {PER}; ++k_) {{",
              f"{I}  if ({col} < {R}) {{ {_ld4(vec, v.dtype, names[i], col, f'w{i}_[k_]')} }}",
              f"{I}  else {{ w{i}_[k_][0] = w{i}_[k_][1] = w{i}_[k_][2] = w{i}_[k_][3] = 0; }}", f"{I}}}"]
    pipe = RU * PER * 4 * len(full_in) <= PIPELINE_REGS and bool(full_in)
    J = I + "  "

    def fill(i0: str, pre: str, ind: str) -> list[str]:
        """The load phase of the rows i0.. (arrays named with prefix ``pre``)."""
        F = [f"{ind}#pragma unroll",
             f"{ind}for (int u_ = 0; u_ < {RU}; ++u_) {pre}row_[u_] = {i0} + u_ < n_rows_ ? ({it})row_of_({i0} + u_) : 0;",
             f"{ind}#pragma unroll", f"{ind}for (int u_ = 0; u_ < {RU}; ++u_) {{"]
        for i in stat_in:
            v = spec.values[i]
            F.append(f"{ind}  {pre}s{i}_[u_] = {i0} + u_ < n_rows_ ? latch::ld<{storage_type(v.dtype)}>({names[i]}, "
                     f"{pre}row_[u_]) : 0;")
        if full_in:
            F += [f"{ind}  #pragma unroll", f"{ind}  for (int k_ = 0; k_ < {PER}; ++k_) {{",
                  f"{ind}    if ({i0} + u_ < n_rows_ && {col} < {R}) {{"]
            for i in full_in:
                F.append(f"{ind}      {_ld4(vec, spec.values[i].dtype, names[i], f'{pre}row_[u_] * {R} + {col}', f'{pre}f{i}_[u_][k_]')}")
            F.append(f"{ind}    }} else {{")
            for i in full_in:
                a = f"{pre}f{i}_[u_][k_]"
                F.append(f"{ind}      {a}[0] = {a}[1] = {a}[2] = {a}[3] = 0;")
            F += [f"{ind}    }}", f"{ind}  }}"]
        F.append(f"{ind}}}")
        return F

    pres = ["", "n"] if pipe else [""]
    for pre in pres:  # the rows being computed, and (pipelined) the next batch's
        L.append(f"{I}{it} {pre}row_[{RU}];")
        for i in full_in:
            L.append(f"{I}{compute_type(spec.values[i].dtype)} {pre}f{i}_[{RU}][{PER}][4];")
        for i in stat_in:
            L.append(f"{I}{compute_type(spec.values[i].dtype)} {pre}s{i}_[{RU}];")
    L.append(f"{I}long long i0_ = (long long)warp_ * {RU};")
    if pipe:
        L.append(f"{I}if (i0_ < n_rows_) {{")
        L += fill("i0_", "", I + "  ")
        L.append(f"{I}}}")
    L.append(f"{I}for (; i0_ < n_rows_; i0_ += (long long)NW_ * {RU}) {{")
    if pipe:
        L += [f"{J}const long long i1_ = i0_ + (long long)NW_ * {RU};",
              f"{J}if (i1_ < n_rows_) {{  // the next batch's loads, in flight while this one is computed"]
        L += fill("i1_", "n", J + "  ")
        L.append(f"{J}}}")
    else:
        L += fill("i0_", "", J)
    # the group's nodes in order: reductions and the statistic chain, once per row
    computed_stats = set()
    for n in spec.nodes:
        o = n.outputs[0]
        if n.op in ROW_REDUCTIONS:
            xi = n.inputs[0]
            xv = spec.values[xi]
            acc = lower_reduce.acc_type(n.op, xv.dtype)
            ct = compute_type(spec.values[o].dtype)
            p = _RowPuller(spec, lowerings, cls, J + "        ")
            e = p.full(xi)
            div = f" / ({acc}){R}" if n.op == "latch::mean" else ""
            L += [f"{J}{ct} s{o}_[{RU}];  // {n.op} over the row",
                  f"{J}#pragma unroll", f"{J}for (int u_ = 0; u_ < {RU}; ++u_) {{",
                  f"{J}  {acc} a_[4] = {{0, 0, 0, 0}};",
                  f"{J}  #pragma unroll", f"{J}  for (int k_ = 0; k_ < {PER}; ++k_) {{",
                  f"{J}    if ({col} < {R}) {{",
                  f"{J}      #pragma unroll", f"{J}      for (int j_ = 0; j_ < 4; ++j_) {{"]
            L += p.lines
            L += [f"{J}        a_[j_] += ({acc})({e});", f"{J}      }}", f"{J}    }}", f"{J}  }}",
                  f"{J}  {acc} t_ = (a_[0] + a_[1]) + (a_[2] + a_[3]);",
                  f"{J}  t_ = latch::warp_reduce<latch::SumOp>(t_);",
                  f"{J}  s{o}_[u_] = ({ct})(t_{div});", f"{J}}}"]
            computed_stats.add(o)
        elif cls[o] == STAT and n.op != "latch::reshape":
            low = lowerings[n.op]
            if low.expr is None:
                raise LoweringError(f"row group: {n.op} has no elementwise form")
            from .fuse import node_info

            p = _RowPuller(spec, lowerings, cls, J + "  ")
            args = ["" if i is None else p.stat(i) for i in n.inputs]
            ct = compute_type(spec.values[o].dtype)
            L += [f"{J}{ct} s{o}_[{RU}];", f"{J}#pragma unroll", f"{J}for (int u_ = 0; u_ < {RU}; ++u_) "
                  f"s{o}_[u_] = ({ct})({low.expr(args, node_info(spec, n, ()))});"]
            computed_stats.add(o)
    # the outputs: row-shaped ones four columns at a time, statistics once per row
    if full_out:
        p = _RowPuller(spec, lowerings, cls, J + "        ")
        exprs = {i: p.full(i) for i in full_out}
        L += [f"{J}#pragma unroll", f"{J}for (int u_ = 0; u_ < {RU}; ++u_) {{",
              f"{J}  #pragma unroll", f"{J}  for (int k_ = 0; k_ < {PER}; ++k_) {{",
              f"{J}    if (i0_ + u_ < n_rows_ && {col} < {R}) {{"]
        for i in full_out:
            L.append(f"{J}      {compute_type(spec.values[i].dtype)} o{i}_[4];")
        L += [f"{J}      #pragma unroll", f"{J}      for (int j_ = 0; j_ < 4; ++j_) {{"]
        L += p.lines
        for i in full_out:
            L.append(f"{J}        o{i}_[j_] = {exprs[i]};")
        L.append(f"{J}      }}")
        for i in full_out:
            L.append(f"{J}      {_st4(vec, spec.values[i].dtype, names[i], f'row_[u_] * {R} + {col}', f'o{i}_')}")
        L += [f"{J}    }}", f"{J}  }}", f"{J}}}"]
    if stat_out:
        L += [f"{J}if (lane_ == 0) {{", f"{J}  #pragma unroll", f"{J}  for (int u_ = 0; u_ < {RU}; ++u_) {{",
              f"{J}    if (i0_ + u_ < n_rows_) {{"]
        p = _RowPuller(spec, lowerings, cls, J)
        for i in stat_out:
            v = spec.values[i]
            L.append(f"{J}      latch::st<{storage_type(v.dtype)}>({names[i]}, row_[u_], {p.stat(i)});")
        L += [f"{J}    }}", f"{J}  }}", f"{J}}}"]
    if pipe:  # the next batch becomes the current one
        L += [f"{J}#pragma unroll", f"{J}for (int u_ = 0; u_ < {RU}; ++u_) {{", f"{J}  row_[u_] = nrow_[u_];"]
        L += [f"{J}  s{i}_[u_] = ns{i}_[u_];" for i in stat_in]
        for i in full_in:
            L += [f"{J}  #pragma unroll", f"{J}  for (int k_ = 0; k_ < {PER}; ++k_) {{",
                  f"{J}    #pragma unroll", f"{J}    for (int j_ = 0; j_ < 4; ++j_) f{i}_[u_][k_][j_] = nf{i}_[u_][k_][j_];",
                  f"{J}  }}"]
        L.append(f"{J}}}")
    L.append(f"{I}}}")
    return L
