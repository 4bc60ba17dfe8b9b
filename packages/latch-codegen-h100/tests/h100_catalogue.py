"""One example application of each op of the core vocabulary, for compile and GPU tests.

Each entry: op -> list of (input types [(shape, dtype) | None], attrs). Output types come from the
op's own shape rule (latch_ops), so the catalogue stays honest when the vocabulary changes.
"""

from __future__ import annotations

from latch_core.ir import Graph, Group, Node, TensorType, Value

F = "f32"
EXAMPLES: dict[str, list[tuple[list, dict]]] = {}


def ex(op, inputs, **attrs):
    EXAMPLES.setdefault(f"latch::{op}", []).append((inputs, attrs))


for u in ("neg", "abs", "sign", "relu", "exp", "log", "log1p", "expm1", "sqrt", "rsqrt", "reciprocal", "sin", "cos",
          "tanh", "erf", "sigmoid", "silu"):
    ex(u, [((4, 33), F)])
ex("gelu", [((4, 33), F)], approximate="tanh")
ex("gelu", [((4, 33), F)], approximate="none")
ex("logical_not", [((5,), "bool")])
for b in ("add", "sub", "mul", "div", "pow", "maximum", "minimum"):
    ex(b, [((4, 33), F), ((33,), F)])
ex("add", [((4, 33), "bf16")], scalar=1.5)
ex("sub", [((4, 33), F)], scalar=2.0, scalar_first=True)
ex("div", [((6,), "i64"), ((6,), "i64")], rounding_mode="floor")
ex("pow", [((4, 33), F)], scalar=2)
for c in ("eq", "ne", "lt", "le", "gt", "ge"):
    ex(c, [((4, 33), F), ((4, 1), F)])
for c in ("logical_and", "logical_or", "logical_xor"):
    ex(c, [((7,), "bool"), ((7,), "bool")])
ex("where", [((4, 33), "bool"), ((4, 33), F), ((33,), F)])
ex("where", [((4, 33), "bool"), None, ((4, 33), F)], scalar_a=float("-inf"))
ex("clamp", [((4, 33), F)], min=-1.0, max=1.0)
ex("cast", [((4, 33), F)], dtype="bf16")
ex("cast", [((4, 33), "i64")], dtype="f32")
ex("tril", [((2, 5, 5), F)], diagonal=0)
ex("triu", [((5, 5), F)], diagonal=1)
ex("full", [], shape=(3, 4), value=0.5, dtype="f32")
ex("arange", [], start=0, step=1, size=10, dtype="i64")
for bw, attrs in (("gelu_backward", {"approximate": "tanh"}), ("silu_backward", {}), ("sigmoid_backward", {}),
                  ("tanh_backward", {}), ("threshold_backward", {"threshold": 0.0})):
    ex(bw, [((4, 33), F), ((4, 33), F)], **attrs)
for r in ("sum", "mean", "amax", "amin", "prod"):
    ex(r, [((4, 5, 6), F)], dims=(0, 2), keepdim=False)
ex("sum", [((3, 5000), F)], dims=(1,), keepdim=True)
ex("sum", [((4, 5), "i64")], dims=(0, 1), keepdim=False)
ex("argmax", [((4, 37), F)], dims=(1,), keepdim=False)
ex("argmin", [((4, 37), F)], dims=(0,), keepdim=True)
ex("matmul", [((70, 40), F), ((40, 65), F)])
ex("matmul", [((3, 20, 40), F), ((3, 40, 24), F)], operand_dtype="bf16", accum_dtype="f32")
ex("matmul", [((2, 3, 8, 16), F), ((2, 3, 16, 8), F)])
ex("reshape", [((4, 6), F)], shape=(2, 12))
ex("reshape", [((4, 6), F)], shape=(4, 1, 6))
ex("permute", [((2, 3, 4), F)], perm=(2, 0, 1))
ex("expand", [((1, 4), F)], shape=(3, 4))
ex("slice", [((8, 6), F)], dim=0, start=1, end=7, step=2)
ex("select", [((8, 6), F)], dim=1, index=3)
ex("concat", [((2, 3), F), ((4, 3), F)], dim=0)
ex("slice_scatter", [((8, 6), F), ((3, 6), F)], dim=0, start=1, end=7, step=2)
ex("select_scatter", [((8, 6), F), ((8,), F)], dim=1, index=2)
ex("copy", [((5, 5), F)])
ex("embedding", [((11, 8), F), ((2, 5), "i64")])
ex("embedding_backward", [((2, 5, 8), F), ((2, 5), "i64")], num_weights=11, padding_idx=-1)
ex("gather", [((4, 7), F), ((4, 3), "i64")], dim=1)
ex("scatter", [((4, 7), F), ((4, 3), "i64"), ((4, 3), F)], dim=1)
ex("scatter_add", [((4, 7), F), ((4, 3), "i64"), ((4, 3), F)], dim=1)
ex("index_select", [((6, 7), F), ((3,), "i64")], dim=0)
ex("index_add", [((6, 7), F), ((3,), "i64"), ((3, 7), F)], dim=0)
ex("softmax", [((3, 4, 37), F)])
ex("log_softmax", [((5, 37), F)])
ex("softmax_backward", [((5, 37), F), ((5, 37), F)])
ex("log_softmax_backward", [((5, 37), F), ((5, 37), F)])
ex("nll_loss", [((5, 37), F), ((5,), "i64"), None], reduction="mean", ignore_index=-100)
ex("nll_loss", [((5, 37), F), ((5,), "i64"), ((37,), F)], reduction="sum", ignore_index=-100)
ex("nll_loss_backward", [((), F), ((5, 37), F), ((5,), "i64"), None, ((), F)], reduction="mean", ignore_index=-100)
ex("cross_entropy", [((6, 40), "bf16"), ((6,), "i64")], ignore_index=-100)  # BF16: the 16-byte vector path
ex("cross_entropy", [((5, 37), F), ((5,), "i64")], ignore_index=-100)
ex("cross_entropy_backward", [((), F), ((6, 40), "bf16"), ((6,), "i64"), ((6,), F), ((), F)], ignore_index=-100,
   reduction="mean", out_dtype="bf16")
ex("cross_entropy_backward", [((), F), ((5, 37), F), ((5,), "i64"), ((5,), F), ((), F)], ignore_index=-100,
   reduction="sum")
# the 16-byte paths of FP32 and FP16 logits and of mixed logits / dlogits dtypes (latch_xent.cuh)
ex("cross_entropy", [((7, 48), F), ((7,), "i64")], ignore_index=-100)
ex("cross_entropy", [((7, 48), "f16"), ((7,), "i64")], ignore_index=-100)
ex("cross_entropy_backward", [((), F), ((7, 48), F), ((7,), "i64"), ((7,), F), ((), F)], ignore_index=-100,
   reduction="mean", out_dtype="bf16")
ex("cross_entropy_backward", [((), F), ((7, 48), "bf16"), ((7,), "i64"), ((7,), F), ((), F)], ignore_index=-100,
   reduction="sum", out_dtype="f32")
# the backward's ring body (16-bit logits, V a multiple of 8 and >= 8192: lower_xent.ring_taken)
ex("cross_entropy_backward", [((), F), ((3, 8200), "f16"), ((3,), "i64"), ((3,), F), ((), F)], ignore_index=-100,
   reduction="mean", out_dtype="f16")
ex("layer_norm", [((3, 4, 16), F), ((16,), F), ((16,), F)], normalized_ndim=1, eps=1e-5)
ex("layer_norm_backward", [((3, 16), F), ((3, 16), F), ((3, 1), F), ((3, 1), F), ((16,), F), ((16,), F)],
   normalized_ndim=1, output_mask=(True, True, True))


def example_graph(ops_registry, entries=None, name="update") -> Graph:
    """One graph applying every example: each example's operands are its own batch inputs, each
    output is a program output (so every node is its own group and every value reaches memory)."""
    values, nodes, batch, outs = [], [], [], []
    k = 0
    for op, cases in sorted((entries or EXAMPLES).items()):
        spec = ops_registry.get(op)
        for ins, attrs in cases:
            names, types = [], []
            for j, t in enumerate(ins):
                if t is None:
                    names.append(None)
                    types.append(None)
                    continue
                nm = f"in{k}_{j}"
                values.append(Value(nm, t[0], t[1], "batch"))
                batch.append(nm)
                names.append(nm)
                types.append(TensorType(t[0], t[1]))
            out_types = spec.check(types, dict(attrs))
            onames = []
            for j, ot in enumerate(out_types):
                nm = f"out{k}_{j}"
                values.append(Value(nm, ot.shape, ot.dtype))
                onames.append(nm)
                outs.append(nm)
            nodes.append(Node(f"n{k}", op, names, onames, attrs))
            k += 1
    return Graph(name, values, nodes, [Group("batch", batch)], [Group("metrics", outs)])


# attention (latch_ops/attention.py): Tq != Tk exercises the top-left causal alignment
_Q, _K, _V = ((2, 2, 5, 16), F), ((2, 2, 7, 16), F), ((2, 2, 7, 8), F)
ex("sdpa", [_Q, _K, _V], causal=True, scale=0.25)
ex("sdpa", [_Q, _K, _V], causal=False, scale=0.3)
ex("sdpa_backward", [((2, 2, 5, 8), F), None, _Q, _K, _V, ((2, 2, 5, 8), F), ((2, 2, 5), F)], causal=True, scale=0.25)
ex("sdpa_backward", [((2, 2, 5, 8), F), ((2, 2, 5), F), _Q, _K, _V, ((2, 2, 5, 8), F), ((2, 2, 5), F)],
   causal=False, scale=0.3)

# MoE (latch_ops/moe): offsets is routing data (a partition of the rows, possibly with empty experts)
ex("token_topk", [((6, 8), F)], k=2)
ex("token_topk_backward", [((6, 2), F), ((6, 2), "i64")], num_experts=8)
ex("route_order", [((6, 2), "i64")], num_experts=8)
# route_order split over chunks of 128 pairs (moe.route_split): 384 pairs, three chunks (test_gpu_ops'
# three row tiles of route_place then are whole chunks, as the scheduler's granule makes them)
ex("route_count", [((192, 2), "i64")], num_experts=8, chunk=128)
ex("route_place", [((192, 2), "i64"), ((3, 8), "i32")], num_experts=8, chunk=128)
ex("route_rows", [((192, 2), "i64"), ((3, 8), "i32")], num_experts=8, chunk=128)
ex("route_offsets", [((3, 8), "i32")], num_experts=8)
ex("gather_sum", [((12, 8), F), ((10,), "i64")], k=2)
ex("gather_sum", [((12, 6), F), ((10,), "i64"), ((5, 6), F)], k=2)
ex("ragged_mm", [((12, 16), F), ((4, 16, 8), F), ((5,), "i64")])
ex("ragged_mm", [((12, 16), F), ((4, 16, 8), F), ((5,), "i64")], operand_dtype="bf16", accum_dtype="f32")
ex("ragged_mm_grad_x", [((12, 8), F), ((4, 16, 8), F), ((5,), "i64")])
ex("ragged_mm_grad_w", [((12, 16), F), ((12, 8), F), ((5,), "i64")])
