"""Code generation without a compiler: signatures, tables, error messages, parallel lowering."""

from __future__ import annotations

import struct

import attrs
import pytest

import h100_handmade as H
from latch_core.hookspecs import hookimpl
from latch_core.ir import Value
from latch_core.plugins import load_with
from latch_core.sections import Counter
from latch_codegen_h100 import CodegenError, Lowering, generate
from latch_codegen_h100 import tables as T

F = "f32"


def _mlpish():
    """x @ w + b, relu, sum: a matmul, a fused elementwise pair, a reduction."""
    values = [Value("w", (8, 16), F, "param"), Value("b", (16,), F, "param"), Value("x", (4, 8), F, "batch"),
              Value("h", (4, 16), F), Value("hb", (4, 16), F), Value("r", (4, 16), F), Value("loss", (), F)]
    nodes = [("mm", "latch::matmul", ("x", "w"), ("h",)), ("add", "latch::add", ("h", "b"), ("hb",)),
             ("relu", "latch::relu", ("hb",), ("r",)),
             ("sum", "latch::sum", ("r",), ("loss",), {"dims": (0, 1), "keepdim": False})]
    return H.graph("update", values, nodes, [("params", ["w", "b"]), ("batch", ["x"])], [("loss", ["loss"])])


def test_generates_kernel_units_tables_and_manifest():
    g = _mlpish()
    doc = H.planned([g], [g.value("w"), g.value("b")])
    gen = generate(doc, jobs=1)
    assert gen.units[0].name == "kernel.cu"
    kernel = gen.units[0].source
    assert "latch_dispatch" in kernel and '#include "latch_kernel_main.cuh"' in kernel
    assert len(gen.manifest["bodies"]) == 4  # matmul, add, relu, sum
    m = gen.manifest["programs"]["update"]
    assert m["num_tasks"] == len(doc.schedule.programs[0].tasks)
    assert len(gen.tables["update"].tasks) == T.TASK.size * m["num_tasks"]
    assert [b["name"] for b in gen.manifest["buffers"]] == ["w", "b", "x"]
    assert m["outputs"][0]["value"] == "loss" and m["outputs"][0]["buffer"] == 0


def test_fused_group_is_one_body_with_intermediates_in_registers():
    g = _mlpish()
    doc = H.planned([g], groups={"update": [["mm"], ["add", "relu"], ["sum"]]})
    gen = generate(doc, jobs=1)
    assert len(gen.manifest["bodies"]) == 3
    fused = next(b for b in gen.manifest["bodies"] if b["ops"] == ["latch::add", "latch::relu"])
    src = next(u.source for u in gen.units[1:] if any(k == fused["key"] for k in u.bodies))
    body = src[src.index(fused["function"]):]
    body = body[:body.index("\n}\n")]
    stores = [ln for ln in body.splitlines() if "latch::st<" in ln]
    assert len(stores) == 2 and all("(out0," in ln for ln in stores)  # one per loop path, group output only
    # the contiguous-tile fast path: row tiles, or one row of dim 0 cut along dim 1
    assert "if ((c.t->lo[1] == 0 && c.t->hi[1] == 16) || (((long long)c.t->hi[0] - c.t->lo[0]) == 1))" in body
    assert "latch::ew::relu_" in body


def test_equal_signatures_share_one_body_and_tables_are_not_in_sources():
    values = [Value("x", (64, 32), F, "batch"), Value("y", (64, 32), F), Value("z", (64, 32), F)]
    nodes = [("e1", "latch::exp", ("x",), ("y",)), ("e2", "latch::exp", ("y",), ("z",))]
    g = H.graph("update", values, nodes, [("batch", ["x"])], [("metrics", ["z"])])
    a = generate(H.planned([g], tiles=2, num_sms=4), jobs=1)
    b = generate(H.planned([g], tiles=5, num_sms=3), jobs=1)
    assert len(a.manifest["bodies"]) == 1
    assert [u.source for u in a.units] == [u.source for u in b.units]  # schedule lives in the tables
    assert a.tables["update"].tasks != b.tables["update"].tasks


def test_parallel_lowering_gives_the_same_sources():
    g = _mlpish()
    doc = H.planned([g])
    serial = generate(doc, jobs=1, bodies_per_unit=1)
    parallel = generate(doc, jobs=2, bodies_per_unit=1, parallel_min_bodies=0)
    assert len(serial.units) == 5
    assert [u.source for u in serial.units] == [u.source for u in parallel.units]


def test_the_unit_split_does_not_follow_the_cores():
    """The same document gives the same sources (hence the same cache key) on 2 cores and on 16:
    a library built on one machine serves another's build (tools/gpu_check.sh's seeded cache)."""
    values, nodes = [], []
    for k in range(1, 14):  # 13 bodies: a split that followed the cores gave 2 units on 1 core, 3 on 16
        values += [Value(f"x{k}", (64, 4 * k), F, "batch"), Value(f"y{k}", (64, 4 * k), F)]
        nodes.append((f"e{k}", "latch::exp", (f"x{k}",), (f"y{k}",)))
    g = H.graph("update", values, nodes, [("batch", [f"x{k}" for k in range(1, 14)])],
                [("metrics", [f"y{k}" for k in range(1, 14)])])
    doc = H.planned([g])
    one, many = generate(doc, jobs=1), generate(doc, jobs=16)
    assert len(one.manifest["bodies"]) == 13 and len(one.units) == 1 + 3  # kernel.cu and three units
    assert [(u.name, u.source) for u in one.units] == [(u.name, u.source) for u in many.units]


def test_missing_lowering_names_node_op_and_source():
    values = [Value("x", (4,), F, "batch"), Value("y", (4,), F)]
    g = H.graph("update", values, [H.Node("mystery", "acme::frob", ("x",), ("y",), source="model.py:12 in forward")],
                [("batch", ["x"])], [("metrics", ["y"])])
    with pytest.raises(CodegenError) as e:
        generate(H.planned([g]), jobs=1)
    msg = str(e.value)
    assert "'mystery'" in msg and "acme::frob" in msg and "model.py:12" in msg and "lowering" in msg


def test_a_crashing_lowering_is_named():
    class P:
        @hookimpl
        def latch_register_lowerings(register):
            def bad(ctx):
                raise KeyError("oops")
            register("acme::bad", Lowering("acme::bad", body=bad))

    regs = load_with(("acme", P), entry_points=False)
    values = [Value("x", (4,), F, "batch"), Value("y", (4,), F)]
    g = H.graph("update", values, [("n0", "acme::bad", ("x",), ("y",))], [("batch", ["x"])], [("metrics", ["y"])])
    with pytest.raises(CodegenError, match=r"n0.*acme::bad.*lowering crashed: KeyError"):
        generate(H.planned([g]), jobs=1, regs=regs)


def test_whole_output_body_refuses_a_split_schedule():
    values = [Value("lp", (6, 5), F, "batch"), Value("t", (6,), "i64", "batch"), Value("loss", (), F),
              Value("tw", (), F)]
    g = H.graph("update", values, [("nll", "latch::nll_loss", ("lp", "t", None), ("loss", "tw"),
                                    {"reduction": "mean", "ignore_index": -100})],
                [("batch", ["lp", "t"])], [("loss", ["loss"])])
    doc = H.planned([g])
    ps = doc.schedule.programs[0]
    t0 = ps.tasks[0]
    # pretend a scheduler split the loss: give task 0 a (wrong) partial tile of a [6]-shaped primary
    g2 = attrs.evolve(g, values=[v if v.name != "loss" else Value("loss", (6,), F) for v in g.values])
    doc2 = attrs.evolve(doc, graph=attrs.evolve(doc.graph, programs=[g2]),
                        schedule=attrs.evolve(doc.schedule, programs=[attrs.evolve(
                            ps, tasks=[attrs.evolve(t0, tile=((0, 3),))])]))
    with pytest.raises(CodegenError, match=r"nll.*whole output in one task"):
        generate(doc2, jobs=1)


def test_sync_contract_is_checked():
    values = [Value("x", (8,), F, "batch"), Value("y", (8,), F), Value("z", (8,), F)]
    g = H.graph("update", values, [("a", "latch::exp", ("x",), ("y",)), ("b", "latch::exp", ("y",), ("z",))],
                [("batch", ["x"])], [("metrics", ["z"])])
    doc = H.planned([g], strategy="dataflow", tiles=2)
    ps = doc.schedule.programs[0]
    bad = attrs.evolve(ps, counters=[Counter(c.id, c.expected + 1) for c in ps.counters])
    with pytest.raises(CodegenError, match=r"counter 0: expects 3 signals per launch, the SM lists send 2"):
        generate(attrs.evolve(doc, schedule=attrs.evolve(doc.schedule, programs=[bad])), jobs=1)
    doc = H.planned([g], strategy="barrier", num_sms=2)
    ps = doc.schedule.programs[0]
    sms = [list(ps.sms[0]), [i for i in ps.sms[1] if i[0] != "barrier"]]
    with pytest.raises(CodegenError, match=r"SM 1: runs 0 of 1 barriers"):
        generate(attrs.evolve(doc, schedule=attrs.evolve(doc.schedule, programs=[attrs.evolve(ps, sms=sms)])), jobs=1)


def test_missing_sections_and_placements_are_named():
    g = _mlpish()
    doc = H.planned([g])
    with pytest.raises(CodegenError, match=r"lacks \['memory'\]"):
        generate(attrs.evolve(doc, memory=None), jobs=1)
    pm = doc.memory.programs[0]
    pm2 = attrs.evolve(pm, placements=[p for p in pm.placements if p.value != "hb"])
    with pytest.raises(CodegenError, match=r"value 'hb' crosses the group boundary but the memory plan has no placement"):
        generate(attrs.evolve(doc, memory=attrs.evolve(doc.memory, programs=[pm2])), jobs=1)


def test_task_and_instruction_tables_round_trip():
    rec = T.TaskRecord(body=3, task=7, group=2, op_begin=10, op_count=4, lo=(0, 5), hi=(4, 9))
    fields = T.unpack_tasks(rec.pack())[0]
    assert fields[:8] == (3, 7, 2, 2, 10, 4, -1, -1)  # no tensor map, no local dependency
    assert fields[8:10] == (0, 5) and fields[16:18] == (4, 9)
    instrs, begins = T.pack_instrs([[("task", 0), ("signal", 1)], [("wait", 1, 2), ("barrier", 0)]])
    assert T.unpack_instrs(instrs) == [(1, 0, 0, 0), (4, 1, 0, 0), (3, 1, 2, 0), (2, 0, 0, 0)]
    assert struct.unpack("<3i", begins) == (0, 2, 4)


def test_constant_bytes():
    assert T.const_bytes((1.0, 2.0), "f32", 2, "c") == struct.pack("<2f", 1.0, 2.0)
    assert T.const_bytes((3,), "i64", 4, "c") == struct.pack("<4q", 3, 3, 3, 3)  # splat
    # bf16: round to nearest even (1 + 2^-8 is a tie between 1 and 1 + 2^-7: rounds to 1)
    assert T.const_bytes((1.0 + 2 ** -8,), "bf16", 1, "c") == struct.pack("<H", 0x3F80)
    assert T.const_bytes((1.0 + 3 * 2 ** -9,), "bf16", 1, "c") == struct.pack("<H", 0x3F81)
    with pytest.raises(ValueError, match="constant 'c': 3 data items for 2 elements"):
        T.const_bytes((1, 2, 3), "f32", 2, "c")


def test_reductions_pick_one_thread_one_warp_or_the_block_per_output_by_length():
    """A few reduced elements (split-K partials: R = S) are summed by one thread per output, in
    index order; longer ones by a warp, very long ones by the whole block; column sums across
    the outputs."""
    values = [Value("p", (4, 64, 32), F, "batch"), Value("s", (64, 32), F), Value("t", (4, 64), F),
              Value("u", (4,), F)]
    nodes = [("split_sum", "latch::sum", ("p",), ("s",), {"dims": (0,), "keepdim": False}),
             ("row_sum", "latch::sum", ("p",), ("t",), {"dims": (2,), "keepdim": False}),
             ("all_sum", "latch::sum", ("p",), ("u",), {"dims": (1, 2), "keepdim": False}),
             ("col_sum", "latch::sum", ("p",), ("w",), {"dims": (0, 1), "keepdim": False})]
    values.append(Value("w", (32,), F))
    g = H.graph("update", values, nodes, [("batch", ["p"])], [("out", ["s", "t", "u", "w"])])
    gen = generate(H.planned([g]), jobs=1)
    src = "\n".join(u.source for u in gen.units[1:])

    assert src.count("latch::reduce_thread_per_output<double, latch::SumOp>(n_out, 4LL,") == 1  # R = 4
    assert src.count("latch::reduce_warp_per_output<double, latch::SumOp>(n_out, 32LL,") == 1  # R = 32
    assert src.count("latch::reduce_block_per_output<double, latch::SumOp>(n_out, 2048LL,") == 1  # R = 2048
    # a column sum (the innermost dim kept: a bias or norm-weight gradient): threads across the
    # outputs, down the rows, partials combined in a fixed order
    assert src.count("for (int w_ = 1; w_ < NW_; ++w_) s_ = latch::SumOp::apply(s_, cs_[w_ * 32 + lane_]);") == 1


def test_products_store_through_tma_where_the_tile_is_whole_128_byte_rows():
    """The wgmma body's epilogue goes through shared memory and TMA stores (a third tensor map, 16
    KiB of scratch) when BN is whole 128-byte box rows of the output; otherwise (BN 96 of a BF16
    output, a split-K partial) it stores from registers."""
    bf = "bf16"
    values = [Value("x", (256, 128), bf, "batch"), Value("w", (128, 128), bf, "batch"), Value("v", (96, 128), bf, "batch"),
              Value("y", (256, 128), bf), Value("z", (256, 96), bf), Value("p", (2, 256, 128), F)]
    nodes = [("wide", "latch::matmul", ("x", "w"), ("y",), {"trans_b": True}),
             ("narrow", "latch::matmul", ("x", "v"), ("z",), {"trans_b": True}),
             ("split", "latch::matmul", ("x", "w"), ("p",), {"trans_b": True, "split_k": 2, "out_dtype": F})]
    g = H.graph("update", values, nodes, [("batch", ["x", "w", "v"])], [("out", ["y", "z", "p"])])
    gen = generate(H.planned([g]), jobs=1)
    bodies = {b["ops"][0] + ":" + str(b["tensor_maps"]): b for b in gen.manifest["bodies"]}
    src = "\n".join(u.source for u in gen.units[1:])
    assert src.count("latch::GemmStoreTma<__nv_bfloat16, 2> epi{") == 1  # wide: BN 128, 2 slots per warp
    assert src.count("latch::GemmStore<__nv_bfloat16> epi{") == 1  # narrow: BN 96
    assert src.count("latch::GemmStore<float> epi{") == 1  # the split partial
    maps = sorted(b["tensor_maps"] for b in gen.manifest["bodies"])
    assert maps == [2, 2, 3], bodies
    assert max(b["smem"] for b in gen.manifest["bodies"]) == 16384
    tm = gen.manifest["programs"]["update"]["tmaps"]
    assert {"value": "y", "dims": [128, 256], "box": [64, 8]} in [{k: t[k] for k in ("value", "dims", "box")} for t in tm]


def test_epilogue_slots_take_shared_memory_from_the_ring():
    """``epilogue_slots`` = 8 stages a whole 128 x 256 BF16 tile's boxes per warp (64 KiB of scratch),
    so the ring of 48 KiB stages drops from 4 stages to 3; the default (2 slots: 16 KiB) keeps 4."""
    bf = "bf16"

    def ring(slots):
        attrs = {"trans_b": True, "operand_dtype": bf, "accum_dtype": "f32", "config": "wgmma_128x256x64"}
        if slots:
            attrs["epilogue_slots"] = slots
        values = [Value("x", (256, 128), bf, "batch"), Value("w", (512, 128), bf, "batch"), Value("y", (256, 512), bf)]
        g = H.graph("update", values, [("mm", "latch::matmul", ("x", "w"), ("y",), attrs)], [("batch", ["x", "w"])],
                    [("out", ["y"])])
        gen = generate(H.planned([g]), jobs=1)
        src = "\n".join(u.source for u in gen.units[1:])
        return gen.manifest["ring"], src

    r2, s2 = ring(None)
    r8, s8 = ring(8)
    assert "latch::GemmStoreTma<__nv_bfloat16, 2> epi{" in s2 and "latch::GemmStoreTma<__nv_bfloat16, 8> epi{" in s8
    assert (r2["stages"], r2["stage_bytes"], r2["scratch"]) == (4, 49152, 16384)
    assert (r8["stages"], r8["stage_bytes"], r8["scratch"]) == (3, 49152, 65536)


def test_the_profile_reads_the_list_end_once():
    """The profile's list end is read once, before the consumers' loop: a global load of it per task,
    between one task's end stamp and the next one's start, was +0.16 us on every gap of run 32's
    profile (0.32 -> 0.48 us median against run 29)."""
    from latch_codegen_h100.codegen import CUDA_DIR

    src = (CUDA_DIR / "latch_kernel_main.cuh").read_text()
    body = src[src.index("__device__ __forceinline__ bool consumers("):]
    body = body[:body.index("}  // namespace latch")]
    loop = body[body.index("for (;; q = q + 1"):]
    assert "a.sm_begin[a.num_lists]" not in loop and "const int lists_end = a.sm_begin[a.num_lists];" in body
