"""Neural-network ops with a fused form: softmax / log_softmax and their backward, the two halves of
cross-entropy (nll_loss and its backward), and layer_norm with its backward.

    softmax(x) -> y                        over the LAST dim (the lowering permutes other dims there)
    log_softmax(x) -> y                    over the last dim
    softmax_backward(grad, y) -> dx        dx = y * (grad - sum(grad * y, last))
    log_softmax_backward(grad, y) -> dx    dx = grad - exp(y) * sum(grad, last)
    nll_loss(logp[N,C] | logp[C], target[N] | target[], weight[C] | None) {reduction, ignore_index}
        -> (loss, total_weight[])          loss = -sum_i w[t_i] logp[i, t_i] over t_i != ignore_index,
                                           divided by total_weight = sum_i w[t_i] for 'mean';
                                           'none' gives the per-row terms [N] (total_weight 0)
    nll_loss_backward(grad, logp, target, weight | None, total_weight) {reduction, ignore_index} -> dlogp
    layer_norm(x, w | None, b | None) {normalized_ndim, eps} -> (y, mean, rstd)
        over the last normalized_ndim dims; mean/rstd have shape x.shape[:-k] + [1]*k
    layer_norm_backward(grad, x, mean, rstd, w | None, b | None) {normalized_ndim, output_mask}
        -> the outputs of (dx, dw, db) whose output_mask entry is true, in that order

Row-wise ops (softmax family, layer_norm) are tagged ``norm``: they can be split along the leading
dims, never inside the normalised trailing dims. nll_loss and layer_norm_backward (whose dw/db reduce
over rows) are single whole-tensor tasks (tags ``indexing`` / ``structural``).
"""

from __future__ import annotations

from latch_core.ir import FLOAT_DTYPES, INT_DTYPES, TensorType
from latch_core.registry import INDEXING, NORM, STRUCTURAL, OpSpec, ShapeError

from .common import attr, nbytes, need, per_element, spec

REDUCTIONS = {"none": 0, "mean": 1, "sum": 2}  # torch's enum values (ATen takes the int)


def _t():
    import torch

    return torch


def _float(op, t, what):
    if t.dtype not in FLOAT_DTYPES:
        raise ShapeError(f"{op}: {what} must be a float tensor, got {t}")
    if not t.shape:
        raise ShapeError(f"{op}: {what} must have rank >= 1, got {t}")
    return t


def _softmax_infer(name):
    op = f"latch::{name}"

    def infer(inputs, attrs):
        return [_float(op, need(op, inputs, 0, "x"), "x")]

    return infer


def _softmax_backward_infer(name):
    op = f"latch::{name}"

    def infer(inputs, attrs):
        g, y = _float(op, need(op, inputs, 0, "grad"), "grad"), _float(op, need(op, inputs, 1, "y"), "y")
        if g != y:
            raise ShapeError(f"{op}: grad {g} and y {y} must have one shape and dtype")
        return [g]

    return infer


def _aten(name):
    return getattr(_t().ops.aten, name).default


# ------------------------------------------------------------------------------------------
# nll_loss

def _nll_common(op, logp, target, weight, attrs):
    _float(op, logp, "logp")
    red = attr(op, attrs, "reduction", str)
    if red not in REDUCTIONS:
        raise ShapeError(f"{op}: reduction must be one of {sorted(REDUCTIONS)}, got {red!r}")
    attr(op, attrs, "ignore_index", int)
    if len(logp.shape) not in (1, 2):
        raise ShapeError(f"{op}: logp must be [N, C] or [C], got {logp}")
    if target.dtype not in INT_DTYPES or tuple(target.shape) != tuple(logp.shape[:-1]):
        raise ShapeError(f"{op}: target must be an integer tensor of shape {list(logp.shape[:-1])}, got {target}")
    if weight is not None and (tuple(weight.shape) != (logp.shape[-1],) or weight.dtype != logp.dtype):
        raise ShapeError(f"{op}: weight must be {logp.dtype}[{logp.shape[-1]}], got {weight}")
    return red


def _nll_infer(inputs, attrs):
    op = "latch::nll_loss"
    logp, target = need(op, inputs, 0, "logp"), need(op, inputs, 1, "target")
    weight = inputs[2] if len(inputs) > 2 else None
    red = _nll_common(op, logp, target, weight, attrs)
    loss_shape = tuple(logp.shape[:-1]) if red == "none" else ()
    return [TensorType(loss_shape, logp.dtype), TensorType((), logp.dtype)]


def _nll_ref(inputs, attrs):
    logp, target, weight = inputs
    out, total = _aten("nll_loss_forward")(logp, target, weight, REDUCTIONS[attrs["reduction"]], attrs["ignore_index"])
    return [out, total]


def _nll_backward_infer(inputs, attrs):
    op = "latch::nll_loss_backward"
    g, logp, target = need(op, inputs, 0, "grad"), need(op, inputs, 1, "logp"), need(op, inputs, 2, "target")
    weight, total = inputs[3], need(op, inputs, 4, "total_weight")
    red = _nll_common(op, logp, target, weight, attrs)
    want = tuple(logp.shape[:-1]) if red == "none" else ()
    if tuple(g.shape) != want or g.dtype != logp.dtype:
        raise ShapeError(f"{op}: grad must be {logp.dtype}{list(want)} for reduction {red!r}, got {g}")
    if tuple(total.shape) != () or total.dtype != logp.dtype:
        raise ShapeError(f"{op}: total_weight must be a {logp.dtype} scalar, got {total}")
    return [logp]


def _nll_backward_ref(inputs, attrs):
    g, logp, target, weight, total = inputs
    return [_aten("nll_loss_backward")(g, logp, target, weight, REDUCTIONS[attrs["reduction"]],
                                       attrs["ignore_index"], total)]


# ------------------------------------------------------------------------------------------
# layer_norm

def _ln_shapes(op, x, attrs):
    k = attr(op, attrs, "normalized_ndim", int)
    if not 1 <= k <= len(x.shape):
        raise ShapeError(f"{op}: normalized_ndim {k} must be in [1, {len(x.shape)}] for {x}")
    norm = tuple(x.shape[-k:])
    stat = tuple(x.shape[:-k]) + (1,) * k
    return k, norm, stat


def _ln_affine(op, x, norm, w, b):
    for name, t in (("w", w), ("b", b)):
        if t is not None and (tuple(t.shape) != norm or t.dtype != x.dtype):
            raise ShapeError(f"{op}: {name} must be {x.dtype}{list(norm)}, got {t}")


def _ln_infer(inputs, attrs):
    op = "latch::layer_norm"
    x = _float(op, need(op, inputs, 0, "x"), "x")
    _k, norm, stat = _ln_shapes(op, x, attrs)
    _ln_affine(op, x, norm, inputs[1], inputs[2])
    eps = attrs.get("eps")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)):
        raise ShapeError(f"{op}: attribute 'eps' must be a number, got {eps!r}")
    return [x, TensorType(stat, x.dtype), TensorType(stat, x.dtype)]


def _ln_ref(inputs, attrs):
    x, w, b = inputs
    k = attrs["normalized_ndim"]
    return list(_aten("native_layer_norm")(x, list(x.shape[-k:]), w, b, float(attrs["eps"])))


def _ln_backward_infer(inputs, attrs):
    op = "latch::layer_norm_backward"
    g = _float(op, need(op, inputs, 0, "grad"), "grad")
    x = _float(op, need(op, inputs, 1, "x"), "x")
    mean, rstd = need(op, inputs, 2, "mean"), need(op, inputs, 3, "rstd")
    w, b = inputs[4], inputs[5]
    _k, norm, stat = _ln_shapes(op, x, attrs)
    if g != x:
        raise ShapeError(f"{op}: grad {g} must match x {x}")
    for name, t in (("mean", mean), ("rstd", rstd)):
        if t != TensorType(stat, x.dtype):
            raise ShapeError(f"{op}: {name} must be {x.dtype}{list(stat)}, got {t}")
    _ln_affine(op, x, norm, w, b)
    mask = attr(op, attrs, "output_mask", (tuple, list))
    if len(mask) != 3 or not all(isinstance(m, bool) for m in mask) or not any(mask):
        raise ShapeError(f"{op}: output_mask must be three bools, at least one true, got {mask!r}")
    if mask[1] and w is None:
        raise ShapeError(f"{op}: output_mask asks for dw but w is absent")
    if mask[2] and b is None:
        raise ShapeError(f"{op}: output_mask asks for db but b is absent")
    out = []
    for m, t in zip(mask, (x, TensorType(norm, x.dtype), TensorType(norm, x.dtype))):
        if m:
            out.append(t)
    return out


def _ln_backward_ref(inputs, attrs):
    g, x, mean, rstd, w, b = inputs
    k = attrs["normalized_ndim"]
    mask = [bool(m) for m in attrs["output_mask"]]
    res = _aten("native_layer_norm_backward")(g, x, list(x.shape[-k:]), mean, rstd, w, b, mask)
    return [r for r, m in zip(res, mask) if m]


def _cost_rows(flops):
    def cost(inputs, outputs, attrs):
        return flops * inputs[0].numel, nbytes(list(inputs) + list(outputs))

    return cost


SPECS: list[OpSpec] = [
    spec("softmax", "softmax(x) -> y (last dim)", _softmax_infer("softmax"),
         lambda i, a: [_t().softmax(i[0], -1)], tags={NORM}, num_inputs=(1, 1), cost=per_element(5),
         doc="exp(x - max) / sum(exp(x - max)) over the last dim", torch_ops=("aten._softmax",)),
    spec("log_softmax", "log_softmax(x) -> y (last dim)", _softmax_infer("log_softmax"),
         lambda i, a: [_t().log_softmax(i[0], -1)], tags={NORM}, num_inputs=(1, 1), cost=per_element(5),
         doc="x - max - log(sum(exp(x - max))) over the last dim", torch_ops=("aten._log_softmax",)),
    spec("softmax_backward", "softmax_backward(grad, y) -> dx (last dim)", _softmax_backward_infer("softmax_backward"),
         lambda i, a: [_aten("_softmax_backward_data")(i[0], i[1], -1, i[1].dtype)], tags={NORM}, num_inputs=(2, 2),
         cost=per_element(4), doc="y * (grad - sum(grad * y))", torch_ops=("aten._softmax_backward_data",)),
    spec("log_softmax_backward", "log_softmax_backward(grad, y) -> dx (last dim)",
         _softmax_backward_infer("log_softmax_backward"),
         lambda i, a: [_aten("_log_softmax_backward_data")(i[0], i[1], -1, i[1].dtype)], tags={NORM},
         num_inputs=(2, 2), cost=per_element(4), doc="grad - exp(y) * sum(grad)",
         torch_ops=("aten._log_softmax_backward_data",)),
    spec("nll_loss", "nll_loss(logp, target, weight | None) {reduction, ignore_index} -> (loss, total_weight)",
         _nll_infer, _nll_ref, tags={INDEXING}, num_inputs=(3, 3), cost=_cost_rows(1),
         doc="negative log-likelihood of the target classes", torch_ops=("aten.nll_loss_forward",)),
    spec("nll_loss_backward",
         "nll_loss_backward(grad, logp, target, weight | None, total_weight) {reduction, ignore_index} -> dlogp",
         _nll_backward_infer, _nll_backward_ref, tags={INDEXING}, num_inputs=(5, 5), cost=_cost_rows(1),
         doc="-w[t] * grad (/ total_weight for 'mean') at the target positions, 0 elsewhere",
         torch_ops=("aten.nll_loss_backward",)),
    spec("layer_norm", "layer_norm(x, w | None, b | None) {normalized_ndim, eps} -> (y, mean, rstd)",
         _ln_infer, _ln_ref, tags={NORM}, num_inputs=(3, 3), cost=_cost_rows(8),
         doc="(x - mean) * rstd * w + b over the trailing normalized_ndim dims",
         torch_ops=("aten.native_layer_norm",)),
    spec("layer_norm_backward",
         "layer_norm_backward(grad, x, mean, rstd, w | None, b | None) {normalized_ndim, output_mask} -> (dx?, dw?, db?)",
         _ln_backward_infer, _ln_backward_ref, tags={STRUCTURAL}, num_inputs=(6, 6), cost=_cost_rows(12),
         doc="gradients of layer_norm; only the outputs output_mask selects",
         torch_ops=("aten.native_layer_norm_backward",)),
]
