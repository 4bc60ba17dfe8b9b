"""ATen -> Latch: views and layout, concatenation, reductions and matrix products.

Views become explicit ``latch::reshape/permute/expand/slice/select`` nodes with normalised
attributes (non-negative dims, clamped slice bounds); a view that changes nothing is an alias and
emits no node. Splits and unbinds give one slice/select per piece (unused pieces are removed with
the rest of the dead code when programs are assembled).
"""

from __future__ import annotations

from typing import Any, Sequence

from .lower import Lowerer
from .lower_elementwise import apply_binary

INT64_MAX = (1 << 63) - 1


def _dim(d: int, nd: int) -> int:
    nd = max(nd, 1)
    return d % nd if -nd <= d < nd else d


def reshape_to_out(lw: Lowerer, a: dict) -> str:
    """view / _unsafe_view / reshape / squeeze / unsqueeze / flatten: re-index to torch's shape."""
    return lw.reshape(a["self"], lw.out_type().shape)


def expand(lw: Lowerer, a: dict) -> str:
    return lw.expand(a["self"], lw.out_type().shape)


def repeat(lw: Lowerer, a: dict) -> str:
    """x.repeat(r0, r1, ...): x (with leading 1s for extra repeats) as [1, s0, 1, s1, ...], expanded
    to [r0, s0, r1, s1, ...] and merged pairwise (GPT-J's position table)."""
    reps = [int(r) for r in a["repeats"]]
    shape = (1,) * (len(reps) - len(lw.type(a["self"]).shape)) + tuple(lw.type(a["self"]).shape)
    inter = [d for s in shape for d in (1, s)]
    wide = [d for r, s in zip(reps, shape) for d in (r, s)]
    x = lw.expand(lw.reshape(a["self"], inter), wide)
    return lw.reshape(x, lw.out_type().shape)


def permute(lw: Lowerer, a: dict) -> str:
    nd = len(lw.type(a["self"]).shape)
    return lw.permute(a["self"], [_dim(d, nd) for d in a["dims"]])


def transpose2d(lw: Lowerer, a: dict) -> str:
    nd = len(lw.type(a["self"]).shape)
    return lw.permute(a["self"], [1, 0]) if nd == 2 else a["self"]


def transpose(lw: Lowerer, a: dict) -> str:
    nd = len(lw.type(a["self"]).shape)
    perm = list(range(nd))
    d0, d1 = _dim(a["dim0"], nd), _dim(a["dim1"], nd)
    perm[d0], perm[d1] = perm[d1], perm[d0]
    return lw.permute(a["self"], perm)


def slice_bounds(size: int, start: Any, end: Any, step: Any) -> tuple[int, int, int]:
    start = 0 if start is None else int(start)
    end = size if end is None or end >= INT64_MAX else int(end)
    step = 1 if step is None else int(step)
    if start < 0:
        start += size
    if end < 0:
        end += size
    start = min(max(start, 0), size)
    end = min(max(end, start), size)
    return start, end, step


def emit_slice(lw: Lowerer, x: str, dim: int, start: int, end: int, step: int) -> str:
    size = lw.type(x).shape[dim]
    if start == 0 and end == size and step == 1:
        return x
    return lw.emit1("latch::slice", [x], {"dim": dim, "start": start, "end": end, "step": step})


def slice_(lw: Lowerer, a: dict) -> str:
    x = a["self"]
    shape = lw.type(x).shape
    dim = _dim(a["dim"], len(shape))
    if a.get("step") is not None and a["step"] < 1:
        raise lw.fail("a slice with step < 1", "use a positive step (reverse with torch.flip is not supported)")
    return emit_slice(lw, x, dim, *slice_bounds(shape[dim], a.get("start"), a.get("end"), a.get("step")))


def select(lw: Lowerer, a: dict) -> str:
    x = a["self"]
    shape = lw.type(x).shape
    dim = _dim(a["dim"], len(shape))
    index = a["index"] % shape[dim] if a["index"] < 0 else a["index"]
    return lw.emit1("latch::select", [x], {"dim": dim, "index": index})


def slice_scatter(lw: Lowerer, a: dict) -> str:
    """slice_scatter(self, src, ...) and slice_backward(grad, input_sizes, ...) (into zeros)."""
    out = lw.out_type()
    if "self" in a:
        x, src = a["self"], a["src"]
    else:
        x, src = lw.full(out.shape, 0.0, out.dtype), a["grad_output"]
    shape = lw.type(x).shape
    dim = _dim(a["dim"], len(shape))
    start, end, step = slice_bounds(shape[dim], a.get("start"), a.get("end"), a.get("step"))
    if start == 0 and end == shape[dim] and step == 1:
        return lw.cast(src, out.dtype)
    return lw.emit1("latch::slice_scatter", [x, lw.cast(src, out.dtype)],
                    {"dim": dim, "start": start, "end": end, "step": step})


def select_scatter(lw: Lowerer, a: dict) -> str:
    """select_scatter(self, src, dim, index) and select_backward(grad, input_sizes, dim, index)."""
    out = lw.out_type()
    if "self" in a:
        x, src = a["self"], a["src"]
    else:
        x, src = lw.full(out.shape, 0.0, out.dtype), a["grad_output"]
    shape = lw.type(x).shape
    dim = _dim(a["dim"], len(shape))
    index = a["index"] % shape[dim] if a["index"] < 0 else a["index"]
    return lw.emit1("latch::select_scatter", [x, lw.cast(src, out.dtype)], {"dim": dim, "index": index})


def _split(lw: Lowerer, x: str, dim: int, sizes: Sequence[int]) -> tuple[str, ...]:
    out, pos = [], 0
    for s in sizes:
        out.append(emit_slice(lw, x, dim, pos, pos + s, 1))
        pos += s
    return tuple(out)


def split(lw: Lowerer, a: dict) -> tuple[str, ...]:
    x = a["self"]
    shape = lw.type(x).shape
    dim = _dim(a["dim"], len(shape))
    size, step = shape[dim], int(a["split_size"])
    sizes = [min(step, size - p) for p in range(0, size, step)] if step > 0 else [size]
    return _split(lw, x, dim, sizes)


def split_with_sizes(lw: Lowerer, a: dict) -> tuple[str, ...]:
    x = a["self"]
    return _split(lw, x, _dim(a["dim"], len(lw.type(x).shape)), [int(s) for s in a["split_sizes"]])


def unbind(lw: Lowerer, a: dict) -> tuple[str, ...]:
    x = a["self"]
    shape = lw.type(x).shape
    dim = _dim(a["dim"], len(shape))
    return tuple(lw.emit1("latch::select", [x], {"dim": dim, "index": i}) for i in range(shape[dim]))


def cat(lw: Lowerer, a: dict) -> str:
    out = lw.out_type()
    xs = [lw.cast(x, out.dtype) for x in a["tensors"] if lw.type(x).numel > 0 or len(lw.type(x).shape) > 1]
    if len(xs) == 1:
        return xs[0]
    return lw.emit1("latch::concat", xs, {"dim": _dim(a["dim"], len(out.shape))})


def constant_pad_nd(lw: Lowerer, a: dict) -> str:
    """F.pad(x, pad, value=v) (mode "constant"): ``pad`` pairs (before, after) from the last dim
    backwards; a negative amount crops (constant_pad_nd's own backward pads by the negation)."""
    x = a["self"]
    pad = [int(p) for p in a["pad"]]
    t = lw.type(x)
    nd = len(t.shape)
    if len(pad) % 2 or len(pad) // 2 > nd:
        raise lw.fail(f"padding {pad} of a {nd}-dim tensor", "give (before, after) pairs for at most every dim")
    value = a.get("value")
    value = 0 if value is None else value
    for i in range(len(pad) // 2):
        d = nd - 1 - i
        lo, hi = pad[2 * i], pad[2 * i + 1]
        size = lw.type(x).shape[d]
        if lo < 0 or hi < 0:
            x = emit_slice(lw, x, d, max(-lo, 0), size - max(-hi, 0), 1)
        parts = []
        for amount in (lo, hi):
            if amount > 0:
                shape = list(lw.type(x).shape)
                shape[d] = amount
                parts.append(lw.full(shape, value, t.dtype))
            else:
                parts.append(None)
        pieces = [p for p in (parts[0], x, parts[1]) if p is not None]
        if len(pieces) > 1:
            x = lw.emit1("latch::concat", pieces, {"dim": d})
    return x


def stack(lw: Lowerer, a: dict) -> str:
    out = lw.out_type()
    dim = _dim(a["dim"], len(out.shape))
    xs = []
    for x in a["tensors"]:
        shape = list(lw.type(x).shape)
        shape.insert(dim, 1)
        xs.append(lw.reshape(lw.cast(x, out.dtype), shape))
    if len(xs) == 1:
        return xs[0]
    return lw.emit1("latch::concat", xs, {"dim": dim})


# ------------------------------------------------------------------------------------------
# Matrix products

def mm(lw: Lowerer, a: dict) -> str:
    return lw.emit1("latch::matmul", [a["self"], a["mat2"]])


def addmm(lw: Lowerer, a: dict) -> str:
    """beta * bias + alpha * (mat1 @ mat2) as matmul, scalings and a broadcast add; baddbmm (batch1,
    batch2: Bloom's ALiBi scores) the same over a batch."""
    out = lw.out_type()
    x, y = (a["mat1"], a["mat2"]) if "mat1" in a else (a["batch1"], a["batch2"])
    prod = lw.emit1("latch::matmul", [x, y])
    if a.get("alpha", 1) != 1:
        prod = apply_binary(lw, "mul", prod, a["alpha"], out.dtype)
    beta, bias = a.get("beta", 1), a["self"]
    if beta == 0:
        return prod
    if beta != 1:
        bias = apply_binary(lw, "mul", bias, beta, out.dtype)
    return apply_binary(lw, "add", prod, bias, out.dtype)


def mv(lw: Lowerer, a: dict) -> str:
    v = lw.reshape(a["vec"], (lw.type(a["vec"]).shape[0], 1))
    return lw.reshape(lw.emit1("latch::matmul", [a["self"], v]), lw.out_type().shape)


def dot(lw: Lowerer, a: dict) -> str:
    n = lw.type(a["self"]).shape[0]
    x = lw.reshape(a["self"], (1, n))
    y = lw.reshape(a["tensor"], (n, 1))
    return lw.reshape(lw.emit1("latch::matmul", [x, y]), ())


# ------------------------------------------------------------------------------------------
# Reductions

def _dims(dim: Any, nd: int) -> tuple[int, ...]:
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return tuple(range(nd))
    if isinstance(dim, int):
        dim = [dim]
    return tuple(sorted({_dim(d, nd) for d in dim}))


def reduce_(lw: Lowerer, op: str, x: str, dim: Any, keepdim: bool, dtype: Any = None) -> str:
    out = lw.out_type()
    if dtype is not None:
        from latch_ops.common import from_torch_dtype

        x = lw.cast(x, from_torch_dtype(dtype))
    nd = len(lw.type(x).shape)
    if nd == 0:
        return lw.cast(x, out.dtype)  # reducing a scalar is the identity (up to sum's widening)
    return lw.emit1(f"latch::{op}", [x], {"dims": _dims(dim, nd), "keepdim": bool(keepdim)})


def reduction(op: str):
    def low(lw: Lowerer, a: dict) -> str:
        return reduce_(lw, op, a["self"], a.get("dim"), a.get("keepdim") or False, a.get("dtype"))

    return low


def max_dim(op: str, arg_op: str):
    """max.dim / min.dim -> (values, indices)."""

    def low(lw: Lowerer, a: dict) -> tuple[str, str]:
        x, keep = a["self"], bool(a.get("keepdim"))
        nd = len(lw.type(x).shape)
        dims = _dims(a["dim"], nd)
        vals = lw.emit1(f"latch::{op}", [x], {"dims": dims, "keepdim": keep})
        idx = lw.emit1(f"latch::{arg_op}", [x], {"dims": dims, "keepdim": keep})
        return vals, idx

    return low


def argreduce(op: str):
    def low(lw: Lowerer, a: dict) -> str:
        x, dim, keep = a["self"], a.get("dim"), bool(a.get("keepdim"))
        if dim is None:  # over the flattened tensor
            x = lw.reshape(x, (lw.type(x).numel,))
            res = lw.emit1(f"latch::{op}", [x], {"dims": (0,), "keepdim": False})
            return lw.reshape(res, lw.out_type().shape)
        nd = len(lw.type(x).shape)
        return lw.emit1(f"latch::{op}", [x], {"dims": _dims(dim, nd), "keepdim": keep})

    return low


def vector_norm(lw: Lowerer, a: dict) -> str:
    """linalg_vector_norm with ord 2: sqrt(sum(x * x))."""
    if a.get("ord", 2) != 2:
        raise lw.fail(f"vector norm of order {a.get('ord')!r}", "only the 2-norm is supported; write other norms with abs/pow/sum")
    out = lw.out_type()
    x = lw.cast(a["self"], out.dtype)
    sq = apply_binary(lw, "mul", x, x, out.dtype)
    nd = len(lw.type(sq).shape)
    s = lw.emit1("latch::sum", [sq], {"dims": _dims(a.get("dim"), nd), "keepdim": bool(a.get("keepdim"))}) if nd else sq
    return lw.emit1("latch::sqrt", [s])


def TABLE() -> dict:
    t: dict = {}
    for n in ("view.default", "_unsafe_view", "reshape", "squeeze", "unsqueeze", "flatten", "view_as", "_reshape_alias"):
        t[f"aten.{n}"] = reshape_to_out
    t["aten.expand"] = expand
    t["aten.permute"] = permute
    t["aten.t"] = transpose2d
    t["aten.transpose"] = transpose
    t["aten.slice.Tensor"] = slice_
    t["aten.select.int"] = select
    t["aten.slice_scatter"] = slice_scatter
    t["aten.slice_backward"] = slice_scatter
    t["aten.select_scatter"] = select_scatter
    t["aten.select_backward"] = select_scatter
    t["aten.split.Tensor"] = split
    t["aten.split_with_sizes"] = split_with_sizes
    t["aten.unbind.int"] = unbind
    t["aten.cat"] = cat
    t["aten.stack"] = stack
    t["aten.constant_pad_nd"] = constant_pad_nd
    t["aten.mm"] = mm
    t["aten.bmm"] = mm
    t["aten.addmm"] = addmm
    t["aten.baddbmm"] = addmm
    t["aten.repeat"] = repeat
    t["aten.mv"] = mv
    t["aten.dot"] = dot
    for n in ("sum", "mean", "amax", "amin"):
        t[f"aten.{n}"] = reduction(n)
    t["aten.prod"] = reduction("prod")
    t["aten.max.default"] = lambda lw, a: reduce_(lw, "amax", a["self"], None, False)
    t["aten.min.default"] = lambda lw, a: reduce_(lw, "amin", a["self"], None, False)
    t["aten.max.dim"] = max_dim("amax", "argmax")
    t["aten.min.dim"] = max_dim("amin", "argmin")
    t["aten.argmax"] = argreduce("argmax")
    t["aten.argmin"] = argreduce("argmin")
    t["aten.linalg_vector_norm"] = vector_norm
    return t
