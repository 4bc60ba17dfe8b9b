"""Cross-entropy over logits as the LM head writes them: the pair the ``memory.fuse_cross_entropy``
pass puts in place of log_softmax -> nll_loss -> nll_loss_backward -> log_softmax_backward.

    cross_entropy(logits[N, V], target[N]) {ignore_index}
        -> (nll[N], lse[N], valid[N])      lse_i = log sum_j exp(logits[i, j]) (online max/sum-exp);
                                           nll_i = lse_i - logits[i, t_i], valid_i = 1 for t_i != ignore_index,
                                           both 0 on an ignored row; f32 outputs (f64 for f64 logits)
    cross_entropy_backward(grad[], logits[N, V], target[N], lse[N], total[]) {ignore_index, reduction, out_dtype?}
        -> dlogits[N, V]                   (exp(logits - lse) - onehot(t)) * grad / total ('mean') or * grad
                                           ('sum'); 0 on ignored rows; stored as out_dtype (default logits')

Why this form: the logits matrix is the largest tensor of an LM update (2048 x 49152 FP32 is
403 MB) and log_softmax, its gradient and nll_loss_backward's one-hot each were another tensor of
that size. Here the product writes the logits ONCE in the policy's operand dtype (BF16), the
forward reads them once for the row statistics (lse: 8 bytes a row), and the backward reads them
once and writes dlogits once, in the dtype the two gradient products read (BF16), so no tensor of
the logits' size is FP32. The scalar loss is ``sum(nll) / sum(valid)`` in ordinary reductions (fixed
order). The FP64 reference below computes exactly these formulas at the reference width.

Tiling (``extra["tiling"]``): cross_entropy splits rows (each row is reduced whole); the backward
splits rows and columns (every element is independent given lse).
"""

from __future__ import annotations

from latch_core.ir import FLOAT_DTYPES, INT_DTYPES, TensorType
from latch_core.registry import INDEXING, OpSpec, ShapeError

from .common import attr, nbytes, need, ref_dtype, spec

REDUCTIONS = ("mean", "sum")


def _t():
    import torch

    return torch


def _stat_dtype(logits: TensorType) -> str:
    return "f64" if logits.dtype == "f64" else "f32"


def _common(op, logits, target, attrs):
    if logits.dtype not in FLOAT_DTYPES or len(logits.shape) != 2:
        raise ShapeError(f"{op}: logits must be a float [N, V] tensor, got {logits}")
    if target.dtype not in INT_DTYPES or tuple(target.shape) != (logits.shape[0],):
        raise ShapeError(f"{op}: target must be an integer tensor of shape [{logits.shape[0]}], got {target}")
    attr(op, attrs, "ignore_index", int)


def _fwd_infer(inputs, attrs):
    op = "latch::cross_entropy"
    logits, target = need(op, inputs, 0, "logits"), need(op, inputs, 1, "target")
    _common(op, logits, target, attrs)
    row = TensorType((logits.shape[0],), _stat_dtype(logits))
    return [row, row, row]


def _valid(target, ignore_index):
    """(rows whose target counts, targets with the ignored ones replaced by class 0)."""
    torch = _t()
    valid = target != ignore_index
    return valid, torch.where(valid, target, torch.zeros_like(target))


def _check_range(op, target, valid, V):
    bad = valid & ((target < 0) | (target >= V))
    if bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        raise IndexError(f"{op}: target {int(target[i])} at row {i} is outside [0, {V})")


def _fwd_ref(inputs, attrs):
    torch = _t()
    logits, target = inputs
    x = logits.to(ref_dtype("f32"))
    valid, safe = _valid(target, attrs["ignore_index"])
    _check_range("latch::cross_entropy", target, valid, x.shape[1])
    lse = torch.logsumexp(x, dim=1)
    picked = x.gather(1, safe.unsqueeze(1)).squeeze(1)
    zero = torch.zeros_like(lse)
    nll = torch.where(valid, lse - picked, zero)
    return [nll, lse, valid.to(lse.dtype)]


def _bwd_infer(inputs, attrs):
    op = "latch::cross_entropy_backward"
    g = need(op, inputs, 0, "grad")
    logits, target = need(op, inputs, 1, "logits"), need(op, inputs, 2, "target")
    lse, total = need(op, inputs, 3, "lse"), need(op, inputs, 4, "total")
    _common(op, logits, target, attrs)
    red = attr(op, attrs, "reduction", str)
    if red not in REDUCTIONS:
        raise ShapeError(f"{op}: reduction must be one of {list(REDUCTIONS)}, got {red!r}")
    for name, t, shape in (("grad", g, ()), ("lse", lse, (logits.shape[0],)), ("total", total, ())):
        if tuple(t.shape) != shape or t.dtype not in FLOAT_DTYPES:
            raise ShapeError(f"{op}: {name} must be a float tensor of shape {list(shape)}, got {t}")
    out = attrs.get("out_dtype") or logits.dtype
    if out not in FLOAT_DTYPES:
        raise ShapeError(f"{op}: out_dtype must be a float dtype, got {out!r}")
    return [TensorType(logits.shape, out)]


def _bwd_ref(inputs, attrs):
    torch = _t()
    g, logits, target, lse, total = inputs
    x = logits.to(ref_dtype("f32"))
    valid, safe = _valid(target, attrs["ignore_index"])
    _check_range("latch::cross_entropy_backward", target, valid, x.shape[1])
    p = torch.exp(x - lse.to(x.dtype).unsqueeze(1))
    onehot = torch.zeros_like(p).scatter(1, safe.unsqueeze(1), 1.0)
    scale = g.to(x.dtype) / total.to(x.dtype) if attrs["reduction"] == "mean" else g.to(x.dtype)
    d = (p - onehot) * scale
    d = torch.where(valid.unsqueeze(1), d, torch.zeros_like(d))
    return [d.to(ref_dtype(attrs.get("out_dtype") or "f32"))]


ROWS_PER_TASK = 8  # cross_entropy: one row per consumer warp (8 warps of the worker's 256 consumer threads)


def _tiling(split_dims, footprint, kind, granule=()):
    from latch_core.tiling import Tiling

    return Tiling(split_dims, footprint, granule=granule, kind=kind)


def tiling_fwd(in_types, out_types, attrs):
    """Rows split in blocks of ``ROWS_PER_TASK`` (fixed: the scheduler's rule for a free innermost
    dim would round a 1-D output's blocks up to 128 rows, 16 tasks for 2048 rows); a tile reads its
    rows of logits whole and its targets."""
    V = in_types[0].shape[1]

    def footprint(box):
        (r0, r1), = box
        return [((r0, r1), (0, V)), ((r0, r1),)], [((r0, r1),)] * 3

    return _tiling((0,), footprint, "cross_entropy", granule=(ROWS_PER_TASK,))


def tiling_bwd(in_types, out_types, attrs):
    """Rows and columns split; a tile reads its box of logits and its rows' targets and lse."""

    def footprint(box):
        rows, cols = box
        return [(), (rows, cols), (rows,), (rows,), ()], [(rows, cols)]

    return _tiling((0, 1), footprint, "cross_entropy_backward")


def _cost_fwd(inputs, outputs, attrs):
    return 4 * inputs[0].numel, nbytes(list(inputs) + list(outputs))


def _cost_bwd(inputs, outputs, attrs):
    return 4 * inputs[1].numel, nbytes(list(inputs) + list(outputs))


def _spec(name, signature, infer, ref, *, num_inputs, cost, doc, tiling) -> OpSpec:
    s = spec(name, signature, infer, ref, tags={INDEXING}, num_inputs=num_inputs, cost=cost, doc=doc)
    s.extra["tiling"] = tiling
    return s


SPECS: list[OpSpec] = [
    _spec("cross_entropy", "cross_entropy(logits[N,V], target[N]) {ignore_index} -> (nll[N], lse[N], valid[N])",
          _fwd_infer, _fwd_ref, num_inputs=(2, 2), cost=_cost_fwd, tiling=tiling_fwd,
          doc="per-row logsumexp of the logits and the target's negative log-likelihood (online, one read)"),
    _spec("cross_entropy_backward",
          "cross_entropy_backward(grad[], logits[N,V], target[N], lse[N], total[]) {ignore_index, reduction, "
          "out_dtype?} -> dlogits[N,V]",
          _bwd_infer, _bwd_ref, num_inputs=(5, 5), cost=_cost_bwd, tiling=tiling_bwd,
          doc="(softmax(logits) - onehot(target)) * grad (/ total for 'mean'), 0 on ignored rows"),
]
