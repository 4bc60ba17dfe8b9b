"""Lowering of ``latch::matmul`` (latch_ops/matmul.py): a[*B, M, K] @ b[*B, K, N] -> out[*B, M, N].

The tile is a box of the output over (*B, M, N); the batch dims are flattened (they are
contiguous). ``operand_dtype`` ("bf16"/"f16") rounds the operands before the multiply;
``accum_dtype`` "f32" (the default) accumulates in float, f64 operands in double.
"""

from __future__ import annotations

from .lowering import BodyContext, Lowering

HEADER = "latch_matmul.cuh"


def _acc(ctx: BodyContext) -> str:
    if ctx.attr("accum_dtype") == "f64" or ctx.inputs[0].dtype == "f64":
        return "double"
    return "float"


def _round(ctx: BodyContext) -> int:
    return {None: 0, "f32": 0, "f64": 0, "bf16": 1, "f16": 2}[ctx.attr("operand_dtype")]


def _body(ctx: BodyContext) -> str:
    a, b = ctx.inputs
    out = ctx.outputs[0]
    r = out.rank
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    nb = r - 2
    bstrides = []
    acc = 1
    for d in reversed(range(nb)):
        bstrides.append(acc)
        acc *= out.shape[d]
    bstrides.reverse()
    lines = []
    if nb == 0:
        lines.append("const long long b_lo = 0, b_hi = 1;")
    elif nb == 1:
        lines.append("const long long b_lo = c.t->lo[0], b_hi = c.t->hi[0];")
    call = (f"latch::matmul_tile<{a.ctype}, {b.ctype}, {out.ctype}, {_acc(ctx)}, {_round(ctx)}>"
            f"({a.ptr}, {b.ptr}, {out.ptr}, {m}LL, {n}LL, {k}LL, {{blo}}, {{bhi}}, "
            f"c.t->lo[{r - 2}], c.t->hi[{r - 2}], c.t->lo[{r - 1}], c.t->hi[{r - 1}], {ctx.smem});")
    if nb <= 1:
        lines.append(call.format(blo="b_lo", bhi="b_hi"))
        return "\n".join(lines)
    # A box over several batch dims is not one flat range: walk it one flat batch index at a time.
    ext = " * ".join(f"((long long)c.t->hi[{d}] - c.t->lo[{d}])" for d in range(nb))
    lines.append(f"const long long nbatch = {ext};")
    lines.append("for (long long i = 0; i < nbatch; ++i) {")
    lines.append("  long long q = i, flat = 0;")
    for d in reversed(range(nb)):
        e = f"((long long)c.t->hi[{d}] - c.t->lo[{d}])"
        lines.append(f"  flat += (c.t->lo[{d}] + q % {e}) * {bstrides[d]}LL; q /= {e};")
    lines.append("  " + call.format(blo="flat", bhi="flat + 1"))
    lines.append("}")
    return "\n".join(lines)


def _smem(ctx: BodyContext) -> int:
    size = 8 if _acc(ctx) == "double" else 4
    return size * 32 * ((64 + 1) + (64 + 1))


def lowerings() -> list[Lowering]:
    return [Lowering("latch::matmul", body=_body, headers=(HEADER,), smem=_smem,
                     doc="tiled SIMT matrix product, FP32 (or FP64) accumulation, operand_dtype rounding")]

