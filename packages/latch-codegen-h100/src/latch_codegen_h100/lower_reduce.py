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


def column_reduction(dims, rank: int) -> bool:
    """Is the input's innermost dim kept (consecutive outputs adjacent in memory: a column sum)?"""
    return bool(dims) and rank > 1 and (rank - 1) not in {d % rank for d in dims}


def reduce_statements(name: str, ctx: BodyContext, load: list[str] | None = None,
                      load4: list[str] | None = None, vec_cond: str = "false") -> str:
    """The body's statements. ``load``: statements defining the lambda ``load(long long i)`` (element
    ``i`` of the input in its row-major order, as the accumulator type ``acc_type``), replacing the
    load from ``ctx.inputs[0].ptr``. ``load4``: statements defining ``load4(long long i, acc (&v)[4])``
    (elements i..i+3): a row reduction whose row length is a multiple of 4 then runs the vector
    path (``latch::reduce_rows_vec4_*``) when ``vec_cond`` holds at run time (the operands aligned)."""
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
    if R > THREAD_THRESHOLD and column_reduction(dims, x.rank):
        generic = f"latch::reduce_columns<{acc}, {op}>(n_out, {R}LL, base, off, load, store, ({acc}*){ctx.smem});"
        vector = None
    elif R >= BLOCK_THRESHOLD:
        generic = (f"latch::reduce_block_per_output<{acc}, {op}>(n_out, {R}LL, base, off, load, store, "
                   f"({acc}*){ctx.smem});")
        vector = f"latch::reduce_rows_vec4_block<{acc}, {op}>(n_out, {R}LL, base, load4, store, ({acc}*){ctx.smem});"
    elif R <= THREAD_THRESHOLD:
        # short reductions (a split-K sum over S <= 16 partials): one thread per output, in index order
        generic = f"latch::reduce_thread_per_output<{acc}, {op}>(n_out, {R}LL, base, off, load, store);"
        vector = None
    else:
        generic = f"latch::reduce_warp_per_output<{acc}, {op}>(n_out, {R}LL, base, off, load, store);"
        vector = f"latch::reduce_rows_vec4_warp<{acc}, {op}>(n_out, {R}LL, base, load4, store);"
    if vector is not None and load4 is not None and R % 4 == 0 and row_reduction(dims, x.rank):
        lines += load4
        lines += [f"if ({vec_cond}) {{", "  " + vector, "} else {", "  " + generic, "}"]
    else:
        lines.append(generic)
    return "\n".join(lines)


def acc_type(op: str, dtype: str) -> str:
    """The accumulator's C++ type of reduction ``op`` (``latch::sum``) over ``dtype``."""
    return _acc_type(op.split("::")[-1], dtype)


def _smem(ctx: BodyContext) -> int:
    from .codegen import THREADS

    return max(33, THREADS) * 8  # block_reduce's 33 words, or reduce_columns' one per thread


def lowerings() -> list[Lowering]:
    return [Lowering(f"latch::{n}", body=_reduce_body(n), headers=(HEADER,), smem=_smem,
                     doc=f"reduction {n} over attribute dims")
            for n in ("sum", "mean", "amax", "amin", "prod", "argmax", "argmin")]
