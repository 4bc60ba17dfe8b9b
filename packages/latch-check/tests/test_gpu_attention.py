"""latch::sdpa and latch::sdpa_backward on the GPU against the FP64 reference, at sequence lengths
that are not a multiple of the tiles (77, 1000), head dims 64 and 128, causal and not, grouped-query
attention, with and without a gradient of lse; the backward must give the same bits on a second
run. BF16 storage (and FP32 storage under operand_dtype bf16) runs the tensor-core bodies (gate:
bench_attention.REL_GATE, the BF16 rounding of operands, outputs and P); the same shapes with ``attention_body="simt"`` and in f64 run the SIMT bodies (f64: exact
to rounding). Variant "wgmma" runs the forward on wgmma + TMA through the worker's ring
(``attention_body="wgmma"`` on the forward node); variants "wgmma_bwd" (with a gradient of lse) and
"wgmma_bwd_nog" (without) run both the forward and the backward on wgmma + TMA (``attention_body=
"wgmma"`` on both nodes; the backward opt-in, latch_attention_wgmma_bwd.cuh). All selected cases share
ONE build (one document, many programs): with every variant (both head dims' wgmma bodies in one
kernel) ptxas serialises the wgmma instructions (C7511; results/fa.md), which is slower, not wrong."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from latch_check import bench_attention as BA  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

CASES = [
    BA.Case("c77d64", 2, 4, 2, 77, 64, True),
    BA.Case("n77d128", 1, 2, 2, 77, 128, False),
    BA.Case("c1000d128", 1, 4, 1, 1000, 128, True),
    BA.Case("n1000d64", 1, 2, 2, 1000, 64, False),
    BA.Case("c200d64g4", 1, 8, 2, 200, 64, True),
]
F64_GATE = 1e-10


# (tag, storage, grad_lse, forced body, operand_dtype, forward body): "mma_f32" is FP32 values under
# the BF16 policy (captured models), which the tensor-core bodies serve by rounding as they stage;
# "wgmma" is the forward on wgmma + TMA through the worker's ring (attention_body="wgmma" on the
# forward node, BF16 storage's default; its backward, on mma.sync, reads the wgmma forward's out
# and lse); "mma" / "mma_glse" force the mma.sync forward and backward; "wgmma_bwd*" the wgmma
# backward, BF16 storage's default (last field: the backward node's body)
VARIANTS = (("mma", "bf16", False, None, None, "mma", "mma"), ("mma_glse", "bf16", True, None, None, "mma", "mma"),
            ("mma_f32", "f32", True, None, "bf16", None, None), ("simt", "bf16", False, "simt", None, None, None),
            ("f64", "f64", True, None, None, None, None), ("wgmma", "bf16", True, None, None, "wgmma", "mma"),
            ("wgmma_bwd", "bf16", True, None, None, "wgmma", "wgmma"),
            ("wgmma_bwd_nog", "bf16", False, None, None, "wgmma", "wgmma"),
            ("wgmma2_bwd", "bf16", True, None, None, "wgmma", "wgmma2"))  # the overlapped backward (engineer ab)


@pytest.fixture(scope="module")
def programs(request, tmp_path_factory):
    """The selected variants' programs, ONE build per head dim (``-k wgmma`` builds only that variant's
    programs): {tag: ({head dim: program}, cases, dtype, glse)}. One head dim a kernel, as a model's
    kernel and bench-attention's builds have it. (Case 0 and 1 are where the wgmma backward's lse
    boxes started unaligned and the H200 raised an illegal instruction until session 13:
    results/lead13.md.)"""
    from latch_core.document import Document
    from latch_core.ir import GraphSection
    from latch_codegen_h100 import Program, build

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    progs, variants = {}, {}
    wanted = {it.callspec.params.get("tag") for it in request.session.items if hasattr(it, "callspec")}
    for tag, dtype, glse, body, operand, fwd_body, bwd_body in VARIANTS:
        if tag not in wanted:
            continue
        cases = [BA.Case(f"{tag}.{c.name}", c.batch, c.heads, c.kv_heads, c.seq, c.head_dim, c.causal) for c in CASES]
        for c in cases:
            progs.setdefault(c.head_dim, []).extend(
                BA._programs(c, dtype, glse, body, operand, fwd_body=fwd_body, bwd_body=bwd_body))
        variants[tag] = (cases, dtype, glse)
    built = {}
    for d, ps in sorted(progs.items()):
        out = tmp_path_factory.mktemp(f"attention-d{d}")
        doc = Document(graph=GraphSection(ps, (), {"example": "test_gpu_attention"}))
        build(BA.plan_document(doc, sms), out)
        built[d] = Program.load(out)
    return {tag: (built,) + v for tag, v in variants.items()}


@pytest.mark.parametrize("tag", [v[0] for v in VARIANTS])
@pytest.mark.parametrize("i", range(len(CASES)))
def test_attention_matches_fp64_and_repeats_bitwise(programs, tag, i):
    built, cases, dtype, glse = programs[tag]
    c = cases[i]
    prog = built[c.head_dim]
    tdt = {"f64": torch.float64, "f32": torch.float32, "bf16": torch.bfloat16}[dtype]
    ins = BA.make_inputs(c, prog.device, seed=i, dtype=tdt)
    ref = BA.reference(c, ins, glse=glse)
    errs, identical = BA.check_case(prog, c, ins, ref, glse=glse)
    gate = F64_GATE if dtype == "f64" else BA.REL_GATE
    assert identical, f"{c.name}: the backward's bits differ between two runs"
    assert all(e <= gate for e in errs.values()), (c.name, errs)
