"""ATen -> Latch: softmax family, cross-entropy pieces, layer norm, and indexing ops.

Latch's softmax ops act on the last dim; a softmax over another dim is lowered as permute ->
softmax -> permute back, so row-wise tiling (split the leading dims) is always legal for them.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from latch_ops.nn import REDUCTIONS

from .lower import Lowerer
from .lower_elementwise import apply_binary, is_t

_REDUCTION_NAMES = {v: k for k, v in REDUCTIONS.items()}


def _last_dim(lw: Lowerer, xs: Sequence[str], dim: int, fn: Callable[[list[str]], str]) -> str:
    nd = len(lw.type(xs[0]).shape)
    d = dim % nd if nd else 0
    if nd == 0 or d == nd - 1:
        return fn(list(xs))
    perm = [i for i in range(nd) if i != d] + [d]
    inv = [perm.index(i) for i in range(nd)]
    return lw.permute(fn([lw.permute(x, perm) for x in xs]), inv)


def softmax(op: str):
    def low(lw: Lowerer, a: dict) -> str:
        if a.get("half_to_float"):
            raise lw.fail("softmax with half_to_float", "cast the input to float32 before the softmax")
        x = a["self"]
        if not lw.type(x).shape:  # softmax of a scalar: 1 (log: 0)
            return lw.full((), 0.0 if op == "log_softmax" else 1.0, lw.type(x).dtype)
        return _last_dim(lw, [x], a["dim"], lambda xs: lw.emit1(f"latch::{op}", xs))

    return low


def safe_softmax(lw: Lowerer, a: dict) -> str:
    """``_safe_softmax`` (attention's math path): a softmax whose fully masked rows (every entry
    -inf) give 0 instead of NaN; its backward is the plain softmax backward."""
    out = lw.out_type()
    x = lw.cast(a["self"], out.dtype)
    if not lw.type(x).shape:
        return lw.full((), 1.0, out.dtype)

    def rows(xs):
        (v,) = xs
        y = lw.emit1("latch::softmax", [v])
        m = lw.emit1("latch::amax", [v], {"dims": (len(lw.type(v).shape) - 1,), "keepdim": True})
        dead = lw.expand(lw.emit1("latch::eq", [m], {"scalar": float("-inf")}), lw.type(v).shape)
        return lw.emit1("latch::where", [dead, None, y], {"scalar_a": 0.0})

    return _last_dim(lw, [x], a["dim"], rows)


def softmax_backward(op: str):
    def low(lw: Lowerer, a: dict) -> str:
        g, y = a["grad_output"], a["output"]
        out = lw.out_type()
        if lw.type(g).dtype != out.dtype:
            raise lw.fail("a softmax backward across dtypes", "cast the softmax input to float32 first")
        if not out.shape:
            return lw.full((), 0.0, out.dtype)
        return _last_dim(lw, [g, y], a["dim"], lambda xs: lw.emit1(f"latch::{op}", xs))

    return low


def nll_loss(lw: Lowerer, a: dict) -> tuple[str, str]:
    red = _REDUCTION_NAMES[int(a["reduction"])]
    loss, total = lw.emit("latch::nll_loss", [a["self"], a["target"], a.get("weight")],
                          {"reduction": red, "ignore_index": int(a["ignore_index"])})
    return loss, total


def nll_loss_backward(lw: Lowerer, a: dict) -> str:
    red = _REDUCTION_NAMES[int(a["reduction"])]
    return lw.emit1("latch::nll_loss_backward",
                    [a["grad_output"], a["self"], a["target"], a.get("weight"), a["total_weight"]],
                    {"reduction": red, "ignore_index": int(a["ignore_index"])})


def layer_norm(lw: Lowerer, a: dict) -> tuple[str, str, str]:
    k = len(a["normalized_shape"])
    y, mean, rstd = lw.emit("latch::layer_norm", [a["input"], a.get("weight"), a.get("bias")],
                            {"normalized_ndim": k, "eps": float(a["eps"])})
    return y, mean, rstd


def layer_norm_backward(lw: Lowerer, a: dict) -> tuple:
    mask = tuple(bool(m) for m in a["output_mask"])
    w, b = a.get("weight"), a.get("bias")
    # a gradient torch was asked for but whose operand is absent is undefined in torch too
    mask = (mask[0], mask[1] and w is not None, mask[2] and b is not None)
    if not any(mask):
        return (None, None, None)
    outs = iter(lw.emit("latch::layer_norm_backward", [a["grad_out"], a["input"], a["mean"], a["rstd"], w, b],
                        {"normalized_ndim": len(a["normalized_shape"]), "output_mask": mask}))
    return tuple(next(outs) if m else None for m in mask)


# ------------------------------------------------------------------------------------------
# Indexing

def embedding(lw: Lowerer, a: dict) -> str:
    return lw.emit1("latch::embedding", [a["weight"], a["indices"]])


def embedding_backward(lw: Lowerer, a: dict) -> str:
    if a.get("scale_grad_by_freq"):
        raise lw.fail("embedding with scale_grad_by_freq=True", "use scale_grad_by_freq=False")
    return lw.emit1("latch::embedding_backward", [a["grad_output"], a["indices"]],
                    {"num_weights": int(a["num_weights"]), "padding_idx": int(a["padding_idx"])})


def _dim(lw: Lowerer, x: str, d: int) -> int:
    nd = max(len(lw.type(x).shape), 1)
    return d % nd


def gather(lw: Lowerer, a: dict) -> str:
    return lw.emit1("latch::gather", [a["self"], a["index"]], {"dim": _dim(lw, a["self"], a["dim"])})


def scatter(lw: Lowerer, a: dict) -> str:
    if a.get("reduce") is not None:
        raise lw.fail(f"scatter with reduce={a['reduce']!r}", "use scatter_add, or scatter without reduce")
    x, idx = a["self"], a["index"]
    src = a.get("src")
    if src is None or not is_t(src):
        value = a.get("value") if a.get("value") is not None else src
        t = lw.type(x)
        src = lw.full(lw.type(idx).shape, value, t.dtype)
    return lw.emit1("latch::scatter", [x, idx, src], {"dim": _dim(lw, x, a["dim"])})


def scatter_add(lw: Lowerer, a: dict) -> str:
    return lw.emit1("latch::scatter_add", [a["self"], a["index"], a["src"]], {"dim": _dim(lw, a["self"], a["dim"])})


def index_select(lw: Lowerer, a: dict) -> str:
    x, idx = a["self"], a["index"]
    if not lw.type(idx).shape:
        idx = lw.reshape(idx, (1,))
    return lw.emit1("latch::index_select", [x, idx], {"dim": _dim(lw, x, a["dim"])})


def index_add(lw: Lowerer, a: dict) -> str:
    x, idx, src = a["self"], a["index"], a["source"]
    dtype = lw.type(x).dtype
    if a.get("alpha", 1) != 1:
        src = apply_binary(lw, "mul", src, a["alpha"], dtype)
    return lw.emit1("latch::index_add", [x, idx, lw.cast(src, dtype)], {"dim": _dim(lw, x, a["dim"])})


def _one_index(lw: Lowerer, x: str, indices) -> tuple[int, str]:
    """(dim, index tensor) of x[..., idx] with exactly one index tensor after leading Nones."""
    present = [(d, i) for d, i in enumerate(indices) if i is not None]
    if len(present) != 1 or any(i is not None for i in indices[: present[0][0]]):
        raise lw.fail("advanced indexing with several index tensors",
                      "index one dim at a time (x[idx], x[:, idx]) or use torch.gather / index_select")
    d, idx = present[0]
    size = lw.type(x).shape[d]
    if lw.type(idx).dtype == "bool":
        raise lw.fail("boolean-mask indexing", "use torch.where with the mask (static shapes)")
    return d, _wrap_known(lw, idx, size)


def _wrap_known(lw: Lowerer, idx: str, size: int) -> str:
    """x[..., idx] counts a negative index from the end (Falcon's ``qkv[..., [-2], :]``); index_select
    does not. An index known at capture time is wrapped here. One computed from the batch is taken
    as is: latch::index_select's contract is indices in [0, size) (what argsort/topk/route_order and
    token ids give); a negative one there is not wrapped (a known gap, results/hf.md)."""
    v = lw.known_value(idx)
    if v is None or not bool((v < 0).any()):
        return idx
    if bool((v < -size).any() | (v >= size).any()):
        raise lw.fail(f"index {v.reshape(-1).tolist()} out of range for a dim of size {size}", "fix the index")
    return lw.fold(f"{idx}_wrapped", torch.where(v < 0, v + size, v))


def index(lw: Lowerer, a: dict) -> str:
    """x[..., idx, ...] with one integer index tensor: index_select on the flattened index."""
    x = a["self"]
    d, idx = _one_index(lw, x, a["indices"])
    it = lw.type(idx)
    flat = lw.reshape(idx, (it.numel,))
    sel = lw.emit1("latch::index_select", [x, flat], {"dim": d})
    return lw.reshape(sel, lw.out_type().shape)


def index_put(lw: Lowerer, a: dict) -> str:
    """x[..., idx, ...] = values (or += with accumulate) with one integer index tensor."""
    x, values = a["self"], a["values"]
    xt = lw.type(x)
    d, idx = _one_index(lw, x, a["indices"])
    it = lw.type(idx)
    n = it.numel
    flat = lw.reshape(idx, (n,))
    full_shape = tuple(xt.shape[:d]) + tuple(it.shape) + tuple(xt.shape[d + 1:])
    rows_shape = tuple(xt.shape[:d]) + (n,) + tuple(xt.shape[d + 1:])
    src = lw.reshape(lw.expand(lw.cast(values, xt.dtype), full_shape), rows_shape)
    if a.get("accumulate"):
        return lw.emit1("latch::index_add", [x, flat, src], {"dim": d})
    # x[idx] = v: scatter along d with the index broadcast over the other dims
    shape_b = [1] * len(rows_shape)
    shape_b[d] = n
    idx_b = lw.expand(lw.reshape(flat, shape_b), rows_shape)
    return lw.emit1("latch::scatter", [x, idx_b, src], {"dim": d})


def topk(lw: Lowerer, a: dict) -> tuple[str, str]:
    """torch.topk(x, k, dim, largest, sorted) -> latch::token_topk on x viewed as [rows, size(dim)]:
    the k largest per row in descending order, ties to the lower index (a valid order for torch's
    sorted and unsorted forms alike). ``largest=False`` takes the top-k of -x. Its derivative is
    torch's (zeros scattered at the indices), lowered like any scatter."""
    x, k = a["self"], int(a["k"])
    t = lw.type(x)
    if t.dtype not in ("f64", "f32", "bf16", "f16"):
        raise lw.fail(f"top-k of a {t.dtype} tensor", "Latch's top-k ranks float values; cast the tensor to float first")
    nd = max(len(t.shape), 1)
    d = int(a.get("dim", -1)) % nd
    if not t.shape:
        x, t = lw.reshape(x, (1,)), lw.type(lw.reshape(x, (1,)))
    shape = t.shape
    perm = [i for i in range(len(shape)) if i != d] + [d]
    inv = [perm.index(i) for i in range(len(shape))]
    xp = lw.permute(x, perm)
    lead = tuple(shape[i] for i in perm[:-1])
    rows = 1
    for s_ in lead:
        rows *= s_
    x2 = lw.reshape(xp, (rows, shape[d]))
    largest = a.get("largest", True)
    if not largest:
        x2 = lw.emit1("latch::neg", [x2])
    values, indices = lw.emit("latch::token_topk", [x2], {"k": k})
    if not largest:
        values = lw.emit1("latch::neg", [values])
    out_v, out_i = lw.out_type(0), lw.out_type(1)
    values = lw.permute(lw.reshape(values, lead + (k,)), inv)
    indices = lw.permute(lw.reshape(indices, lead + (k,)), inv)
    return lw.reshape(values, out_v.shape), lw.reshape(lw.cast(indices, out_i.dtype), out_i.shape)


def TABLE() -> dict:
    return {
        "aten._softmax": softmax("softmax"),
        "aten._safe_softmax": safe_softmax,
        "aten._log_softmax": softmax("log_softmax"),
        "aten._softmax_backward_data": softmax_backward("softmax_backward"),
        "aten._log_softmax_backward_data": softmax_backward("log_softmax_backward"),
        "aten.nll_loss_forward": nll_loss,
        "aten.nll_loss_backward": nll_loss_backward,
        "aten.native_layer_norm": layer_norm,
        "aten.native_layer_norm_backward": layer_norm_backward,
        "aten.embedding": embedding,
        "aten.embedding_dense_backward": embedding_backward,
        "aten.gather": gather,
        "aten.scatter.src": scatter,
        "aten.scatter.value": scatter,
        "aten.scatter_add": scatter_add,
        "aten.index_select": index_select,
        "aten.index_add": index_add,
        "aten.index.Tensor": index,
        "aten.index_put": index_put,
        "aten.topk": topk,
    }
