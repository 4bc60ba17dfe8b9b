"""The ping-pong matmul body on the GPU (H200): every ping-pong width on the forward layout and the
middle one on the input and weight gradients' layouts, at ragged shapes (M, N not multiples of the task, K not a multiple of 64), FP32 and
BF16 outputs (both through TMA stores), against the FP64 product of the same BF16 operands; the
same launch twice gives the same bits (no atomics, a fixed order)."""

from __future__ import annotations

import pytest

from latch_check.bench_matmul import MAX_GATE, REL_GATE, Case, _program, bf16_gate, forced_name, plan_document

pytestmark = pytest.mark.gpu

WIDTHS = ("wgmma_pp_128x256x64", "wgmma_pp_128x512x64", "wgmma_pp_128x1024x64")
CASES = [Case("pp_fwd", 1000, 1320, 200, tb=True), Case("pp_dgrad", 520, 776, 264),
         Case("pp_wgrad", 264, 392, 1000, ta=True), Case("pp_one", 128, 128, 768, tb=True)]
# (case, configuration): each pair is two bodies (FP32 and BF16 outputs) in one kernel; ptxas time
# grows faster than linearly with the bodies, so the gradients' layouts take one width each
PAIRS = [(c, w) for c in CASES if c.tb for w in WIDTHS] + [(c, WIDTHS[1]) for c in CASES if not c.tb]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from latch_codegen_h100 import Program, build

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    from latch_core.document import Document
    from latch_core.ir import GraphSection

    progs = []
    for c, w in PAIRS:
        f = forced_name(c.name, w)
        progs += [_program(c, f"{f}.check", 1, "f32", w), _program(c, f"{f}.x1", 1, "bf16", w)]
    doc = plan_document(Document(graph=GraphSection(progs, (), {})), sms, split_k=False)
    d = tmp_path_factory.mktemp("pp_gpu")
    build(doc, d)
    return Program.load(d)


@pytest.mark.parametrize("case,cfg", PAIRS, ids=lambda x: getattr(x, "name", x))
def test_pingpong_matches_fp64_and_repeats_bit_for_bit(built, case, cfg):
    import torch

    prog = built
    g = torch.Generator(device=prog.device).manual_seed(7)
    a = torch.randn(case.a_shape, device=prog.device, generator=g).to(torch.bfloat16)
    b = torch.randn(case.b_shape, device=prog.device, generator=g).to(torch.bfloat16)
    batch = {f"{case.name}.a": a, f"{case.name}.b": b}
    A = a.t() if case.ta else a
    B = b.t() if case.tb else b
    ref = torch.mm(A.double(), B.double())
    norm = ref.norm().item()
    f = forced_name(case.name, cfg)
    outs = {}
    for prog_name in (f"{f}.check", f"{f}.x1"):
        runs = []
        for _ in range(2):
            prog.launch(prog_name, batch=batch)
            prog.check()
            runs.append(prog.outputs(prog_name, batch=batch)[f"{prog_name}.out0"].clone())
        assert torch.equal(runs[0], runs[1]), f"{prog_name}: two launches differ"
        outs[prog_name] = runs[0].double()
    got = outs[f"{f}.check"]
    rel = (got - ref).norm().item() / norm
    worst = (got - ref).abs().max().item() / ref.abs().max().item()
    assert rel <= REL_GATE and worst <= MAX_GATE, (rel, worst)
    torch_rel = (torch.mm(A, B).double() - ref).norm().item() / norm
    bf = (outs[f"{f}.x1"] - ref).norm().item() / norm
    assert bf <= bf16_gate(torch_rel), (bf, torch_rel)
