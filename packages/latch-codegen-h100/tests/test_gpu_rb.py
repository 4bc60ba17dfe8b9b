"""On the H200: the groups results/rb.md changed, at TinyMoE-200M's shapes, give the bits they gave before.

- The RoPE backward group (d(qkv) BF16 from BF16 dq, dk, dv through widening casts, cos/sin f32;
  fuse.py's vector path with the concat's regions pulled jointly) against the same body rendered
  with every region pulled on its own (``fuse.JOINT_REGIONS = False``: the arithmetic of before):
  the same bits; against FP64 within the BF16 output's gate; against the element loop (tiles cut
  along the last dim) the same bits.
- The sums over the top-2 expert rows (``reshape+sum``; ``reshape+reshape+mul+sum`` with the routing
  weights; lower_reduce's short vector path on row tiles) against the one-thread-per-output loop
  (tiles cut along the last dim) and against the double-precision sum computed by torch on the
  CPU in the same order: the same bits.
- A second launch gives the same bits.

    .venv/bin/python -m pytest -q -m gpu -s packages/latch-codegen-h100/tests/test_gpu_rb.py
"""

from __future__ import annotations

import pytest

import h100_handmade as H
from test_concat_vector import _backward, _Build

T, C = 1024, 768  # TinyMoE-200M: 2 x 1024 tokens, d_model 768, top-2


def _graph(name: str):
    b = _Build(T)
    _backward(b, "bwd", "bf16")
    rope = b.groups[0]
    rows = 2 * T
    b.values += [("x", (2 * rows, C), "f32", "batch"), ("w", (rows, 2), "f32", "batch"),
                 ("xr", (rows, 2, C), "f32"), ("s", (rows, C), "f32"), ("xr2", (rows, 2, C), "f32"),
                 ("wr", (rows, 2, 1), "f32"), ("m", (rows, 2, C), "f32"), ("sw", (rows, C), "f32")]
    b.nodes += [("r1", "latch::reshape", ("x",), ("xr",), {"shape": (rows, 2, C)}),
                ("s1", "latch::sum", ("xr",), ("s",), {"dims": (1,), "keepdim": False}),
                ("r2", "latch::reshape", ("x",), ("xr2",), {"shape": (rows, 2, C)}),
                ("r3", "latch::reshape", ("w",), ("wr",), {"shape": (rows, 2, 1)}),
                ("m1", "latch::mul", ("xr2", "wr"), ("m",), {}),
                ("s2", "latch::sum", ("m",), ("sw",), {"dims": (1,), "keepdim": False, "accum_dtype": "f32"})]
    outs = b.outs + ["s", "sw"]
    g = H.graph(name, b.values, b.nodes, [("batch", b.ins + ["x", "w"])], [("metrics", outs)])
    return g, [rope, ["r1", "s1"], ["r2", "r3", "m1", "s2"]], outs


def _doc():
    """Programs "rows" (row tiles: the vector paths) and "cols" (tiles cut along the last dim: the
    element loop and the thread-per-output loop) over the same groups."""
    from latch_core.document import Document
    from latch_core.ir import GraphSection
    from latch_core.sections import MemorySection, ScheduleSection

    graphs, scheds = [], []
    for split in ("rows", "cols"):
        g, groups, outs = _graph(split)
        graphs.append(g)
        scheds.append(H.schedule_program(g, num_sms=132, tiles=128, groups=groups, split=split))
    mems = [H.memory_program(g, s) for g, s in zip(graphs, scheds)]
    doc = Document(graph=GraphSection(graphs, (), {}), schedule=ScheduleSection("barrier", 132, scheds),
                   memory=MemorySection(256, max(m.arena_bytes for m in mems), mems))
    return doc, outs


def test_the_cols_program_cuts_every_group_along_its_last_dim():
    """CPU: the comparison below compares two paths: the cols program's tiles are not contiguous."""
    doc, _ = _doc()
    rows, cols = doc.schedule.programs
    assert all(t.tile[-1] == (0, doc.graph.program("rows").value(rows.groups[t.group].primary).shape[-1])
               for t in rows.tasks)
    for t in cols.tasks:
        full = doc.graph.program("cols").value(cols.groups[t.group].primary).shape[-1]
        assert t.tile[-1][1] - t.tile[-1][0] < full


def test_the_gpu_tests_inputs_are_the_programs_inputs():
    """CPU: make_inputs gives a multi-node graph's inputs only, never its intermediates (run 30: the
    GPU test passed 'v1', ... and the program refused them before any kernel ran)."""
    pytest.importorskip("torch")
    from test_gpu_ops import make_inputs

    doc, _ = _doc()
    for name in ("rows", "cols"):
        g = doc.graph.program(name)
        assert sorted(make_inputs(g)) == sorted(g.input_names())


@pytest.mark.gpu
def test_rope_backward_and_topk_sums_keep_their_bits(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from latch_codegen_h100 import build, fuse
    from latch_codegen_h100.runtime import Program
    from test_gpu_ops import make_inputs, reference, rel_l2

    doc, outs = _doc()
    rope, s, sw = outs
    g = doc.graph.program("rows")
    inputs = make_inputs(g)
    batch = {k: v.cuda() for k, v in inputs.items()}
    build(doc, tmp_path / "joint", use_cache=False)
    prog = Program.load(tmp_path / "joint")
    got = {p: prog.run_program(p, batch=batch) for p in ("rows", "cols")}
    again = prog.run_program("rows", batch=batch)
    monkeypatch.setattr(fuse, "JOINT_REGIONS", False)
    build(doc, tmp_path / "separate", use_cache=False)
    separate = Program.load(tmp_path / "separate").run_program("rows", batch=batch)

    def bits(t):
        return t.view(torch.int16 if t.dtype == torch.bfloat16 else torch.int32).cpu()

    bad = []
    for name in outs:
        if not torch.equal(bits(got["rows"][name]), bits(again[name])):
            bad.append(f"{name}: a second launch gave other bits")
        if not torch.equal(bits(got["rows"][name]), bits(got["cols"][name])):
            n = (bits(got["rows"][name]) != bits(got["cols"][name])).sum().item()
            bad.append(f"{name}: the vector path and the element loop differ in {n} elements")
    if not torch.equal(bits(got["rows"][rope]), bits(separate[rope])):
        n = (bits(got["rows"][rope]) != bits(separate[rope])).sum().item()
        bad.append(f"{rope}: joint regions and separate regions differ in {n} elements")
    err = rel_l2(got["rows"][rope], reference(g, inputs)[rope])
    if not err <= 4e-3:  # the BF16 output's rounding
        bad.append(f"{rope}: rel-L2 {err:.3g} against FP64 > 4e-3")
    # the sums, in the order the bodies take: 0 + row 0 + row 1 in double, then rounded to f32
    x, w = inputs["x"].float().view(2 * T, 2, C), inputs["w"].float().view(2 * T, 2, 1)
    want_s = (x[:, 0].double() + x[:, 1].double()).float()
    xw = x * w  # f32 products, rounded as the body rounds them
    want_sw = (xw[:, 0].double() + xw[:, 1].double()).float()
    for name, want in ((s, want_s), (sw, want_sw)):
        if not torch.equal(bits(got["rows"][name]), bits(want)):
            bad.append(f"{name}: not the double-precision sum in index order")
    print(f"RB rope: rel-L2 {err:.3g}; joint == separate == element loop; the sums bit-exact")
    assert not bad, "\n".join(bad)
