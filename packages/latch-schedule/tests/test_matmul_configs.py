"""schedule.matmul_configs: the cost model's choice of body configuration and split-K factor, the
split-K rewrite, and matmul tiling: granules from the recorded configuration, footprints exact for
every layout and split (element by element against an independent index map)."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from latch_core.configs import BodyConfig
from latch_core.hookspecs import hookimpl
from latch_core.ir import Graph, Group, Node, TensorType, Value
from latch_core.plugins import load_with
from latch_schedule import tiling
from latch_schedule.boxes import full_box
from latch_schedule.matmul_configs import choose, choose_configs, price
from latch_schedule.tiling import CostModel, split

WG = [BodyConfig(f"wgmma_128x{bn}x64", (128, bn), 64, (128 + bn) * 128, "wgmma") for bn in (16, 32, 64, 96, 128, 192, 256)]


def _wgmma_only(in_types, out_types, attrs):
    tb = bool(attrs.get("trans_b", False))
    return [c for c in WG if tb or c.tile[1] % 64 == 0]


class ConfigPlugin:
    @hookimpl
    def latch_register_configs(self, register):
        register("latch::matmul", _wgmma_only)


@pytest.fixture(scope="module")
def configs():
    return load_with(("cfg", ConfigPlugin()), entry_points=False).configs


def test_the_cost_formula_counts_waves_fill_and_epilogue():
    cost = CostModel()
    cfg = WG[4]  # 128 x 128
    seconds, tiles, waves = price(cfg, 1, 2048, 768, 768, 1, 2, cost, 132)
    assert tiles == 16 * 6 and waves == 1
    assert seconds == pytest.approx(2 * 128 * 128 * 768 / (5e12 * 0.78) + 0.7e-6 + 128 * 128 * 2 / 25e9)
    # split-K: partials in f32 and their write + read over all SMs' bandwidth
    s2, tiles2, waves2 = price(cfg, 1, 128, 4096, 256, 4, 2, cost, 132)
    assert tiles2 == 8 and waves2 == 1
    assert s2 == pytest.approx(2 * 128 * 128 * 1024 / (5e12 * 0.78) + 0.7e-6 + 128 * 128 * 4 / 25e9
                               + 2 * 4 * 128 * 256 * 4 / (25e9 * 132) + cost.split_k_overhead)
    # the measured rates by tile width (run 10), largest threshold <= BN
    assert cost.mma_efficiency(16) == 0.12 and cost.mma_efficiency(96) == 0.55 and cost.mma_efficiency(192) == 0.9
    assert cost.mma_efficiency(256) == 1.0 and cost.mma_efficiency(48) == 0.23 and cost.mma_efficiency(8) == 0.12


def test_wave_quantisation_picks_the_tile_that_fills_the_sms():
    # DESIGN.md's example: 2048 x 768 is 96 tiles of 128 x 128 but 128 tiles of 128 x 96. With equal
    # efficiencies the thinner tile wins; with the measured ones (128 x 96 runs at 0.55 / 0.78 of
    # 128 x 128's rate) the wider tile's single wave is cheaper, as run 10 measured (80% vs 100%).
    flat = CostModel(mma_eff=((16, 1.0),))
    cfg, s, _, tiles, waves = choose(WG, 1, 2048, 768, 768, 2, flat, 132)
    assert (cfg.tile, s, tiles, waves) == ((128, 96), 1, 128, 1)
    cfg, s, _, tiles, waves = choose(WG, 1, 2048, 768, 768, 2, CostModel(), 132)
    assert (cfg.tile, s, tiles, waves) == ((128, 128), 1, 96, 1)


def test_split_k_by_default_where_run_13_measured_it_winning():
    """Run 13 timed every product both ways in one launch: the split wins where few tiles meet a
    long K and loses on the short ones, where the partials' sum phase costs more than idle SMs."""
    nn = [c for c in WG if c.tile[1] % 64 == 0]
    cost = CostModel()
    # lm_head dgrad at 2048 tokens (2048 x 768, K 49152): 65% -> 86% of cuBLAS split in two
    assert choose(nn, 1, 2048, 49152, 768, 2, cost, 132)[1] == 2
    # attn_out wgrad at 32768 tokens (768 x 768, K 32768): 45% -> 101% split in four
    assert choose(nn, 1, 768, 32768, 768, 4, cost, 132)[1] == 4
    # attn_out wgrad at 2048 tokens (K 2048): 7.7 us unsplit, 16.8 us split: stays whole
    assert choose(nn, 1, 768, 2048, 768, 4, cost, 132)[1] == 1
    # the router's forward (2048 x 16, K 768): 0.3 us whole, 1.4 us split
    assert choose(WG, 1, 2048, 768, 16, 4, cost, 132)[1] == 1
    # and products that fill the SMs never split
    assert choose(nn, 1, 32768, 768, 2304, 2, cost, 132)[1] == 1


SPLITS = CostModel(split_k_choices=(1, 2, 4, 8, 16))


def test_split_k_only_when_sms_idle_and_k_is_long():
    cost = SPLITS
    cfg, s, _, tiles, _ = choose(WG[4:5], 1, 128, 4096, 256, 4, cost, 132)  # 2 tiles on 132 SMs
    assert s == 16 and tiles == 32
    # K / S must keep 4 k-steps of 64: K = 1024 allows S <= 4
    _, s, _, _, _ = choose(WG[4:5], 1, 128, 1024, 256, 4, cost, 132)
    assert s == 4
    # enough tiles already: never split
    _, s, _, _, _ = choose(WG[4:5], 1, 2048, 4096, 2048, 4, cost, 132)
    assert s == 1
    # a hand-set split is kept
    _, s, _, _, _ = choose(WG[4:5], 1, 2048, 4096, 2048, 4, cost, 132, fixed_split=2)
    assert s == 2
    assert choose([], 1, 8, 8, 8, 4, cost, 132) is None


def _mm_graph(m, k, n, dtype="bf16", out="f32", **attr):
    a = Value("a", (m, k), dtype, "batch")
    b = Value("b", (k, n), dtype, "param")
    y = Value("y", (m, n), out)
    node = Node("mm", "latch::matmul", ("a", "b"), ("y",), dict(attr, out_dtype=out), source="t.py:1")
    return Graph("update", [a, b, y], [node], [Group("batch", ["a"]), Group("params", ["b"])], [Group("loss", ["y"])])


def test_split_k_rewrite_keeps_the_output_and_sums_in_a_fixed_order(configs):
    g2, report = choose_configs(_mm_graph(128, 4096, 256), cost=SPLITS, num_sms=132, registry=configs)
    part = g2.nodes[0]
    s = part.attr("split_k")
    assert s > 1 and part.attr("out_dtype") == "f32" and part.attr("config") == report[0]["config"]
    assert part.name == "mm.partial" and part.op == "latch::matmul"
    assert g2.value(part.outputs[0]).shape == (s, 128, 256) and g2.value(part.outputs[0]).dtype == "f32"
    # select views of partial 0..S-1, then ((p0 + p1) + p2) + ...: a fixed order, elementwise
    views = g2.nodes[1:1 + s]
    assert [(n.op, n.inputs, n.attr_dict) for n in views] == [
        ("latch::select", part.outputs, {"dim": 0, "index": i}) for i in range(s)]
    adds = g2.nodes[1 + s:]
    assert [n.op for n in adds] == ["latch::add"] * (s - 1)
    acc = views[0].outputs[0]
    for i, n in enumerate(adds):
        assert n.inputs == (acc, views[i + 1].outputs[0])
        acc = n.outputs[0]
    assert adds[-1].name == "mm" and adds[-1].outputs == ("y",) and g2.value("y").dtype == "f32"
    assert report[0]["split_k"] == s and report[0]["layout"] == "NN" and report[0]["shape"] == "128x4096x256"


def test_split_k_of_a_bf16_output_ends_in_a_cast(configs):
    g2, _ = choose_configs(_mm_graph(128, 4096, 256, out="bf16"), cost=SPLITS, num_sms=132, registry=configs)
    s = g2.nodes[0].attr("split_k")
    assert [n.op for n in g2.nodes] == ["latch::matmul"] + ["latch::select"] * s + ["latch::add"] * (s - 1) + ["latch::cast"]
    assert g2.nodes[-1].name == "mm" and g2.nodes[-1].outputs == ("y",) and g2.value("y").dtype == "bf16"
    assert all(g2.value(n.outputs[0]).dtype == "f32" for n in g2.nodes[:-1])


def test_split_k_sum_is_one_fused_group(configs):
    """The partials' sum and the cast are one group (one phase, one pass over the partials), not a
    reduction body then a cast (two phases): run 18 measured the split products 13-18 us slower so."""
    pytest.importorskip("latch_ops")  # the real op specs: select is a view, add and cast pointwise
    from latch_core.plugins import registries
    from latch_schedule.fusion import fuse

    ops = registries().ops
    g2, _ = choose_configs(_mm_graph(128, 4096, 256, out="bf16"), cost=SPLITS, num_sms=132, registry=configs)
    names = [[n.name for n in p.nodes] for p in fuse(g2, ops)]
    assert len(names) == 2 and names[0] == ["mm.partial"] and names[1][-1] == "mm"
    assert len(names[1]) == 2 * g2.nodes[0].attr("split_k")  # S views, S - 1 adds, the cast


def test_no_configs_no_choice_and_a_recorded_choice_is_kept(configs):
    g = _mm_graph(64, 64, 64)
    assert choose_configs(g, registry=load_with(entry_points=False).configs) == (g, [])
    g2, rep = choose_configs(g, registry=configs)
    assert g2.nodes[0].attr("config") == rep[0]["config"] and g2.nodes[0].attr("split_k") is None
    assert choose_configs(g2, registry=configs) == (g2, [])


# ---------------------------------------------------------------------------------------------
# Tiling: footprints against an independent index map, for every layout and split


def _elements(box):
    return itertools.product(*(range(lo, hi) for lo, hi in box))


def _inside(idx, box):
    return all(lo <= i < hi for i, (lo, hi) in zip(idx, box))


@pytest.mark.parametrize("ta,tb", list(itertools.product([False, True], repeat=2)))
@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("batch", [(), (2,)])
def test_footprints_are_exact_for_every_layout_and_split(ta, tb, splits, batch):
    m, k, n = 40, 13, 30
    a = TensorType(batch + ((k, m) if ta else (m, k)), "f32")
    b = TensorType(batch + ((n, k) if tb else (k, n)), "f32")
    lead = (splits,) if splits > 1 else ()
    out = TensorType(lead + batch + (m, n), "f32")
    attr = {"trans_a": ta, "trans_b": tb, **({"split_k": splits} if splits > 1 else {})}
    t = tiling.matmul([a, b], [out], CostModel(matmul_tiles=((16, 16),)), attr)
    assert t.granule == (1,) * (len(out.shape) - 2) + (16, 16)
    c = math.ceil(k / splits)
    rng = random.Random(0)
    for box in split(out.shape, t, 7):
        (ab, bb), outs = t.footprint(box)
        assert outs == [box]
        need_a, need_b = set(), set()
        for e in _elements(box):
            s = e[0] if lead else 0
            bi = tuple(e[len(lead):-2])
            i, j = e[-2], e[-1]
            for kk in range(s * c, min(k, (s + 1) * c)) if splits > 1 else range(k):
                need_a.add(bi + ((kk, i) if ta else (i, kk)))
                need_b.add(bi + ((j, kk) if tb else (kk, j)))
        for idx in rng.sample(sorted(need_a), min(60, len(need_a))):
            assert _inside(idx, ab), (box, idx, ab)
        for idx in rng.sample(sorted(need_b), min(60, len(need_b))):
            assert _inside(idx, bb), (box, idx, bb)
        # exact: the boxes are the hulls of what the tile needs, no larger
        for need, got in ((need_a, ab), (need_b, bb)):
            if need:
                hull = tuple((min(x[d] for x in need), max(x[d] for x in need) + 1) for d in range(len(got)))
                assert hull == tuple(got), (box, hull, got)


def test_granules_come_from_the_recorded_configuration(configs, monkeypatch):
    import latch_core.plugins as plugins

    regs = load_with(("cfg", ConfigPlugin()), entry_points=False)
    monkeypatch.setattr(plugins, "registries", lambda: regs)
    a, b, y = TensorType((2048, 768), "bf16"), TensorType((768, 768), "bf16"), TensorType((2048, 768), "f32")
    t = tiling.matmul([a, b], [y], CostModel(), {"config": "wgmma_128x192x64"})
    assert t.granule == (128, 192)
    assert len(split(y.shape, t, 1)) == 16 * 4
    assert tiling.matmul([a, b], [y], CostModel(), {}).granule == (128, 128)  # today's rule
    from latch_core.configs import ConfigError

    with pytest.raises(ConfigError, match="records body configuration 'wgmma_128x96x64'.*offer: wgmma_128x64x64"):
        tiling.matmul([a, b], [y], CostModel(), {"config": "wgmma_128x96x64"})  # BN=96 needs trans_b
    assert full_box(y.shape) == ((0, 2048), (0, 768))


# The ping-pong configurations latch_codegen_h100 registers beside the cooperative ones
PP = [BodyConfig(f"wgmma_pp_128x{w}x64", (128, w), 64, 256 * 128, "wgmma") for w in (256, 512, 1024)]


def test_pingpong_price_pays_one_fill_and_one_subtile_epilogue_per_task():
    cost = CostModel()
    seconds, tiles, waves = price(PP[1], 1, 32768, 768, 49152, 1, 2, cost, 132)
    assert tiles == 256 * 96 and waves == 187
    main = 2 * 128 * 128 * 768 / (5e12 * cost.pingpong_efficiency)
    assert seconds == pytest.approx(187 * (4 * main + 0.7e-6 + 128 * 128 * 2 / 25e9))


def test_the_model_takes_pingpong_for_the_short_k_lm_head_forward_and_not_where_it_loses():
    cost = CostModel()
    tb = [c for c in WG] + PP
    nn = [c for c in WG if c.tile[1] % 64 == 0] + PP
    # lm_head.fwd at 32,768 tokens (M 32768, K 768, N 49152): 49,152 one-tile tasks of 128 x 256
    # pay the tile transition each (run 20: 79-85% of cuBLAS); ping-pong tasks of 8 sub-tiles hide
    # all but one per task (run pp: 4641 us against 4939)
    cfg, s, secs, _, _ = choose(tb, 1, 32768, 768, 49152, 2, cost, 132)
    assert cfg.name == "wgmma_pp_128x1024x64" and s == 1
    old = choose(WG, 1, 32768, 768, 49152, 2, cost, 132)
    assert old[0].name == "wgmma_128x256x64" and secs < old[2]
    # tasks of two sub-tiles lost in run pp (the other K = 768 products at 32,768 tokens: qkv.fwd 219
    # vs 191 us, attn_out.fwd 77.5 vs 71.2, attn_out.dgrad 80.9 vs 72.2): the model keeps 128 x 256
    assert choose(tb, 1, 32768, 768, 2304, 2, cost, 132)[0].name == "wgmma_128x256x64"
    assert choose(tb, 1, 32768, 768, 768, 2, cost, 132)[0].name == "wgmma_128x256x64"
    assert choose(nn, 1, 32768, 768, 768, 2, cost, 132)[0].name == "wgmma_128x256x64"
    # long K (lm_head.dgrad at 32,768 tokens, K 49,152; the weight gradients, K 32,768): the
    # cooperative 128 x 256 body's rate wins, the transition is noise
    assert choose(nn, 1, 32768, 49152, 768, 2, cost, 132)[0].name == "wgmma_128x256x64"
    assert not choose(nn, 1, 49152, 32768, 768, 4, cost, 132)[0].name.startswith("wgmma_pp_")
    # few tiles (attn_out.fwd at 2,048 tokens: 96 tiles of 128 x 128, one wave): a wider task is
    # the same wave, twice as long
    assert choose(tb, 1, 2048, 768, 768, 2, cost, 132)[0].name == "wgmma_128x128x64"
    # few tiles and long K: split-K, never ping-pong (ping-pong is not split)
    cfg, s, *_ = choose(nn, 1, 2048, 49152, 768, 2, cost, 132)
    assert s > 1 and not cfg.name.startswith("wgmma_pp_")
    # pingpong_efficiency = 0 leaves them out: the choice before they existed
    assert choose(tb, 1, 32768, 768, 49152, 2, CostModel(pingpong_efficiency=0), 132)[0] == old[0]


def test_a_wide_pingpong_task_keeps_the_l2_raster_of_the_lm_head(monkeypatch):
    """lm_head.fwd at 32,768 tokens with ping-pong tasks of 128 x 1024 (K 768): the B block of a
    task is 1.5 MB because it is wide, not long in K; it must keep the grouped raster order (15
    column blocks, 23.6 MB of B in L2, all row blocks) rather than fall back to the plain order
    that re-reads the 75 MB weight every ~3 row blocks (run 13: 71% of cuBLAS)."""
    import latch_core.configs as core_configs

    monkeypatch.setattr(core_configs, "find_config", lambda op, i, o, a, name: next(c for c in PP + WG if c.name == name))
    bf = "bf16"
    ins = [TensorType((32768, 768), bf), TensorType((49152, 768), bf)]
    outs = [TensorType((32768, 49152), bf)]
    t = tiling.matmul(ins, outs, CostModel(), {"trans_b": True, "config": "wgmma_pp_128x1024x64"})
    assert t.granule[-2:] == (128, 1024) and t.raster == ("n", 15)
    # the cooperative 128 x 256 tiles keep their groups of 63
    t = tiling.matmul(ins, outs, CostModel(), {"trans_b": True, "config": "wgmma_128x256x64"})
    assert t.raster == ("n", 63)
    # long K stays plain, however the rows are counted
    t = tiling.matmul([TensorType((32768, 32768), bf), TensorType((32768, 768), bf)], [TensorType((32768, 768), bf)],
                      CostModel(), {"config": "wgmma_pp_128x512x64"})
    assert t.raster == ()
