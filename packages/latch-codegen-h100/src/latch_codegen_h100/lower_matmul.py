"""Lowering of ``latch::matmul`` (latch_ops/matmul.py): a[*B, M, K] @ b[*B, K, N] -> out[*B, M, N].

The tile is a box of the output over (*B, M, N); the batch dims are flattened (they are
contiguous). ``trans_a`` / ``trans_b`` (operands stored [*B, K, M] / [*B, N, K]) select the SIMT
body's TRANS_A / TRANS_B; the output is stored in its own dtype (``out_dtype``); with ``split_k``
the output has a leading split dim and partial s sums its K slice (``matmul_tile_k``).
``operand_dtype`` ("bf16"/"f16") rounds the operands before the multiply (a no-op once the policy
stores them in BF16); ``accum_dtype`` "f32" (the default) accumulates in float, f64 operands in
double. This is the SIMT body of every ``simt_*`` configuration (latch_codegen_h100.matmul_configs).
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
    ta, tb = bool(ctx.attr("trans_a", False)), bool(ctx.attr("trans_b", False))
    splits = int(ctx.attr("split_k") or 1)
    lead = 1 if splits > 1 else 0  # split-K: out is [S, *B, M, N], partial s sums one K slice
    r = out.rank
    m, k = (a.shape[-1], a.shape[-2]) if ta else (a.shape[-2], a.shape[-1])
    n = b.shape[-2] if tb else b.shape[-1]
    nb = r - 2 - lead
    bstrides = []
    acc = 1
    for d in reversed(range(nb)):
        bstrides.append(acc)
        acc *= out.shape[lead + d]
    bstrides.reverse()
    lines = []
    c_ptr = out.ptr
    k_lo, k_hi = "0LL", f"{k}LL"
    if lead:
        chunk = -(-k // splits)
        lines.append("for (long long s = c.t->lo[0]; s < c.t->hi[0]; ++s) {")
        lines.append(f"  const long long k_lo = s * {chunk}LL < {k}LL ? s * {chunk}LL : {k}LL;")
        lines.append(f"  const long long k_hi = k_lo + {chunk}LL < {k}LL ? k_lo + {chunk}LL : {k}LL;")
        lines.append(f"  {out.ctype}* c_s = {out.ptr} + s * {acc * m * n}LL;")
        c_ptr, k_lo, k_hi = "c_s", "k_lo", "k_hi"
    ind = "  " * lead
    if nb == 0:
        lines.append(f"{ind}const long long b_lo = 0, b_hi = 1;")
    elif nb == 1:
        lines.append(f"{ind}const long long b_lo = c.t->lo[{lead}], b_hi = c.t->hi[{lead}];")
    call = (f"latch::matmul_tile_k<{a.ctype}, {b.ctype}, {out.ctype}, {_acc(ctx)}, {_round(ctx)}, "
            f"{'true' if ta else 'false'}, {'true' if tb else 'false'}>"
            f"({a.ptr}, {b.ptr}, {c_ptr}, {m}LL, {n}LL, {k}LL, {{blo}}, {{bhi}}, "
            f"c.t->lo[{r - 2}], c.t->hi[{r - 2}], c.t->lo[{r - 1}], c.t->hi[{r - 1}], {k_lo}, {k_hi}, {ctx.smem});")
    if nb <= 1:
        lines.append(ind + call.format(blo="b_lo", bhi="b_hi"))
    else:
        # A box over several batch dims is not one flat range: walk it one flat batch index at a time.
        ext = " * ".join(f"((long long)c.t->hi[{lead + d}] - c.t->lo[{lead + d}])" for d in range(nb))
        lines.append(f"{ind}const long long nbatch = {ext};")
        lines.append(f"{ind}for (long long i = 0; i < nbatch; ++i) {{")
        lines.append(f"{ind}  long long q = i, flat = 0;")
        for d in reversed(range(nb)):
            e = f"((long long)c.t->hi[{lead + d}] - c.t->lo[{lead + d}])"
            lines.append(f"{ind}  flat += (c.t->lo[{lead + d}] + q % {e}) * {bstrides[d]}LL; q /= {e};")
        lines.append(f"{ind}  " + call.format(blo="flat", bhi="flat + 1"))
        lines.append(f"{ind}}}")
    if lead:
        lines.append("}")
    return "\n".join(lines)


def _smem(ctx: BodyContext) -> int:
    size = 8 if _acc(ctx) == "double" else 4
    return size * 32 * ((64 + 1) + (64 + 1))


def lowerings() -> list[Lowering]:
    return [Lowering("latch::matmul", body=_body, headers=(HEADER,), smem=_smem,
                     doc="tiled SIMT matrix product, FP32 (or FP64) accumulation, operand_dtype rounding")]

