"""Every op body on the GPU against the op's own FP64 reference (one launch runs them all).

Runs under both synchronisation strategies of the hand-built schedule (grid barriers, dataflow
counters), with outputs split into several tiles, so tile arithmetic is exercised too.
"""

from __future__ import annotations

import pytest
import torch

import h100_catalogue as C
import h100_handmade as H
from latch_core.plugins import registries
from latch_codegen_h100 import build
from latch_codegen_h100.runtime import DTYPES, Program

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

POSITIVE = {"latch::log", "latch::sqrt", "latch::rsqrt", "latch::log1p", "latch::reciprocal", "latch::pow",
            "latch::div", "latch::nll_loss_backward", "latch::cross_entropy_backward"}
EXACT = {"i64", "i32", "i16", "i8", "u8", "bool"}


def _index_bound(node, pos, g):
    op, a = node.op, node.attr_dict
    shape = lambda i: g.value(node.inputs[i]).shape  # noqa: E731
    if op == "latch::embedding" and pos == 1:
        return shape(0)[0]
    if op == "latch::embedding_backward" and pos == 1:
        return a["num_weights"]
    if op in ("latch::gather", "latch::scatter", "latch::scatter_add", "latch::index_select",
              "latch::index_add") and pos == 1:
        return shape(0)[a["dim"]]
    if op == "latch::gather_sum" and pos == 1:
        return shape(0)[0]
    if op in ("latch::nll_loss",) and pos == 1:
        return shape(0)[-1]
    if op == "latch::nll_loss_backward" and pos == 2:
        return shape(1)[-1]
    if op == "latch::cross_entropy" and pos == 1:
        return shape(0)[-1]
    if op == "latch::cross_entropy_backward" and pos == 2:
        return shape(1)[-1]
    return None


def make_inputs(g, seed=0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    out = {}
    produced = {o for n in g.nodes for o in n.outputs}  # a multi-node graph's intermediates are no inputs
    for n in g.nodes:
        for pos, name in enumerate(n.inputs):
            if name is None or name in out or name in produced:
                continue
            v = g.value(name)
            dt = DTYPES[v.dtype]
            bound = _index_bound(n, pos, g)
            if n.op.startswith("latch::ragged_mm") and pos == 2:  # offsets: a partition of rows 1..R-1
                rows = g.value(n.inputs[0]).shape[0]
                t = torch.sort(torch.randint(1, rows, (v.shape[0],), generator=gen)).values
            elif n.op == "latch::token_topk_backward" and pos == 1:  # distinct experts per row
                t = torch.stack([torch.randperm(n.attr("num_experts"), generator=gen)[:v.shape[1]]
                                 for _ in range(v.shape[0])])
            elif n.op in ("latch::route_order", "latch::route_count", "latch::route_place", "latch::route_rows") \
                    and pos == 0:
                t = torch.randint(0, n.attr("num_experts"), v.shape, generator=gen)
            elif n.op in ("latch::route_place", "latch::route_rows") and pos == 1:  # the counts of its indices
                from latch_ops.moe.reference import route_count_math

                t = route_count_math(out[n.inputs[0]], n.attr("num_experts"), n.attr("chunk"))
            elif n.op == "latch::route_offsets":
                t = torch.randint(0, 40, v.shape, generator=gen)
            elif bound is not None:
                if n.op == "latch::scatter":  # distinct targets per row: torch's scatter is order-dependent
                    rows = [torch.randperm(g.value(n.inputs[0]).shape[n.attr("dim")], generator=gen)[:v.shape[-1]]
                            for _ in range(v.shape[0])]
                    t = torch.stack(rows)
                else:
                    t = torch.randint(0, bound, v.shape, generator=gen)
            elif v.dtype == "bool":
                t = torch.randint(0, 2, v.shape, generator=gen).bool()
            elif v.dtype in EXACT:
                t = torch.randint(1, 6, v.shape, generator=gen) * (torch.randint(0, 2, v.shape, generator=gen) * 2 - 1)
            elif n.op in POSITIVE:
                t = torch.rand(v.shape, generator=gen, dtype=torch.float64) * 1.5 + 0.5
            else:
                t = torch.randn(v.shape, generator=gen, dtype=torch.float64)
            out[name] = t.to(dt)
    return out


def reference(g, inputs) -> dict[str, torch.Tensor]:
    ops = registries().ops
    env = {k: (t.double() if t.is_floating_point() else t) for k, t in inputs.items()}
    for n in g.nodes:
        args = [None if i is None else env[i] for i in n.inputs]
        res = ops.get(n.op).extra["reference"](args, n.attr_dict)
        for o, r in zip(n.outputs, res):
            env[o] = r
    return env


def rel_l2(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Relative L2 error; infinities must match exactly (same place, same sign) and are left out."""
    a, b = out.double().cpu(), ref.double().cpu()
    inf = torch.isinf(b)
    if inf.any():
        if not torch.equal(a[inf], b[inf]):
            return float("inf")
        a, b = a[~inf], b[~inf]
    den = b.norm().item()
    return (a - b).norm().item() / (den if den > 0 else 1.0)


def tolerance(g, node) -> float:
    types = [g.value(x).dtype for x in (*[i for i in node.inputs if i], *node.outputs)]
    if "bf16" in types or node.attr("operand_dtype") == "bf16":
        return 1e-2
    if "f16" in types:
        return 2e-3
    return 1e-5


@pytest.mark.parametrize("strategy,split", [("barrier", "rows"), ("dataflow", "cols")])
def test_every_op_matches_its_fp64_reference(strategy, split, tmp_path):
    """Row tiles take the fused bodies' constant-index fast path, column tiles the general one."""
    regs = registries()
    g = C.example_graph(regs.ops)
    doc = build(H.planned([g], strategy=strategy, num_sms=8, tiles=3, split=split), tmp_path / strategy)
    prog = Program.load(tmp_path / strategy)
    inputs = make_inputs(g)
    outs = prog.run_program("update", batch={k: v.cuda() for k, v in inputs.items()})
    assert prog.launches == 1
    ref = reference(g, inputs)
    bad = []
    for n in g.nodes:
        for o in n.outputs:
            got, want = outs[o], ref[o]
            if g.value(o).dtype in EXACT:
                if not torch.equal(got.cpu(), want.to(got.dtype)):
                    bad.append(f"{n.name} {n.op}: {o} differs (exact)")
            else:
                err = rel_l2(got, want)
                if not err <= tolerance(g, n):  # NaN fails too
                    bad.append(f"{n.name} {n.op} {dict(n.attrs)}: {o} rel-L2 {err:.3g} > {tolerance(g, n):g}")
    assert not bad, "\n".join(bad)
    assert doc.build is not None
