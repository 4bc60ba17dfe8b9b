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


def _reduce_body(name: str):
    def body(ctx: BodyContext) -> str:
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
        lines.append(f"auto load = [&](long long i) -> {acc} {{ return ({acc})latch::ld<{x.ctype}>({x.ptr}, i); }};")
        lines.append(f"auto store = [&](long long o, {acc} v) {{")
        lines += cgen.tile_decode("o", out.rank, "z", "  ")
        val = f"v / ({acc}){R}" if name == "mean" else "v"
        lines.append(f"  latch::st<{out.ctype}>({out.ptr}, {cgen.dot([f'z{k}' for k in range(out.rank)], ost)}, "
                     f"({compute_type(out.dtype)})({val}));")
        lines.append("};")
        if R >= BLOCK_THRESHOLD:
            lines.append(f"latch::reduce_block_per_output<{acc}, {op}>(n_out, {R}LL, base, off, load, store, "
                         f"({acc}*){ctx.smem});")
        elif R <= THREAD_THRESHOLD:
            lines.append(f"latch::reduce_thread_per_output<{acc}, {op}>(n_out, {R}LL, base, off, load, store);")
        else:
            lines.append(f"latch::reduce_warp_per_output<{acc}, {op}>(n_out, {R}LL, base, off, load, store);")
        return "\n".join(lines)
    return body


def _smem(ctx: BodyContext) -> int:
    return 33 * 8


def lowerings() -> list[Lowering]:
    return [Lowering(f"latch::{n}", body=_reduce_body(n), headers=(HEADER,), smem=_smem,
                     doc=f"reduction {n} over attribute dims")
            for n in ("sum", "mean", "amax", "amin", "prod", "argmax", "argmin")]
