"""The pass ``schedule.matmul_configs``: a body configuration and split-K factor for every matmul.

For every ``latch::matmul`` node, the configurations the installed backend registers for it
(``latch_core.configs``, hook ``latch_register_configs``) are priced with the cost model
(:class:`latch_schedule.tiling.CostModel`), for each split-K factor ``S`` in
``CostModel.split_k_choices`` ({1, 2, 4, 8, 16}); ``S > 1`` only when ``K / S >= split_k_min_steps
* k_tile`` (each partial keeps a pipeline's worth of K steps) and the unsplit product has fewer
tiles than SMs (splitting only pays where SMs would idle)::

    tiles = batch * ceil(M / BM) * ceil(N / BN) * S          waves = ceil(tiles / num_sms)
    cost  = waves * (2 * BM * BN * ceil(K / S) / rate + mma_fill + BM * BN * out_bytes / sm_bytes)
            + (S > 1: 2 * S * batch * M * N * 4 / (sm_bytes * num_sms)   # partials written, then read
                      + split_k_overhead)                                # the sum's phase and barrier

``rate`` is ``sm_mma_flops * mma_efficiency(BN)`` for tensor-core configurations (``kind`` "wgmma")
and ``sm_flops`` for CUDA-core ones ("simt"); ``out_bytes`` is 4 for split partials (FP32). The
cheapest wins; ties go to the first configuration listed, then the smaller ``S``.

**Ping-pong** configurations (names ``wgmma_pp_<BM>x<W>x<BK>``, latch_gemm_pingpong.cuh) compute a
task of ``BM x W`` as ``T = W / 128`` sub-tiles of ``BM x 128``, the two consumer warpgroups taking
them in turn: every sub-tile's epilogue but the last runs under the other warpgroup's products, so
a task pays one fill and one sub-tile's epilogue, and its stores overlap its math::

    main  = 2 * BM * 128 * K / (sm_mma_flops * pingpong_efficiency)      epi = BM * 128 * out_bytes / sm_bytes
    cost  = waves * (max(T * main, T * epi) + mma_fill + epi)            (never split along K)

Where K is short (12 K blocks at K = 768) the cooperative body's per-tile fill and epilogue are a
fifth of its time and ping-pong wins; where K is long they vanish and the cooperative 128 x 256
body's higher rate wins; where tiles are few, the wider task loses on waves.

The choice is recorded on the node (attribute ``config``), so tiling takes the configuration's
tile and code generation instantiates that body. ``S > 1`` rewrites the node (deterministic:
the reduction reads the ``S`` partials in a fixed order, no atomics)::

    %y.partial = matmul(a, b){..., split_k=S, out_dtype=f32, config}     # [S, *B, M, N]
    %y         = sum(%y.partial){dims=(0,)}                                # (node keeps its name)

written as the chain ``((%p0 + %p1) + %p2) + ...`` of ``select`` views of the partials (then a
``cast`` where y is not f32), not as ``latch::sum`` over dim 0 (then a cast): the chain is
elementwise, so fusion makes it ONE group (views read in place, the adds and the cast in
registers) and the fused body's contiguous-tile paths read it with 16-byte loads; the reduction
body then a separate cast took two phases (two barriers) and ran the sum one column lane per output
(results/gpu.md run 18: the three split products ~13-18 us slower than in run 13)::

    %y.partial = matmul(a, b){..., split_k=S, out_dtype=f32, config}     # [S, *B, M, N]
    %y.p<i>    = select(%y.partial){dim=0, index=i}                       # i < S, views
    %y         = add(...add(%y.p0, %y.p1)..., %y.p<S-1>)                   # fixed order
    # or, when y is not f32:  %y.acc = add(...); %y = cast(%y.acc){dtype}

A node that already records a ``config`` (a document scheduled before) is left as it is; a node
with ``split_k`` set keeps its factor. Without registered configurations nothing is recorded and
tiling keeps its own rule. Pure; the report lists each choice (node, shape, layout, config, S,
tiles, waves, estimated cost) and goes to the schedule's stats (``matmul_configs``).
"""

from __future__ import annotations

import math
from typing import Any

import attrs

from latch_core.document import Document
from latch_core.ir import DTYPES, Graph, Node, Value, fresh_name

from .tiling import CostModel, matmul_dims

MATMUL = "latch::matmul"


def _layout(ta: bool, tb: bool) -> str:
    return ("T" if ta else "N") + ("T" if tb else "N")


PINGPONG_PREFIX = "wgmma_pp_"  # latch_codegen_h100.matmul_configs: the ping-pong body's configurations
PINGPONG_BN = 128  # the sub-tile one warpgroup of the ping-pong body owns: BM x 128


def is_pingpong(cfg) -> bool:
    return cfg.kind == "wgmma" and cfg.name.startswith(PINGPONG_PREFIX)


def price(cfg, batch: int, m: int, k: int, n: int, s: int, out_bytes: int, cost: CostModel,
          num_sms: int) -> tuple[float, int, int]:
    """(seconds, tiles, waves) of one configuration at split factor ``s`` (module docstring)."""
    bm, bn = cfg.tile[-2:]
    tiles = batch * math.ceil(m / bm) * math.ceil(n / bn) * s
    waves = math.ceil(tiles / num_sms)
    if is_pingpong(cfg):
        subs = math.ceil(bn / PINGPONG_BN)
        main = 2 * bm * PINGPONG_BN * math.ceil(k / s) / (cost.sm_mma_flops * cost.pingpong_efficiency)
        epi = bm * PINGPONG_BN * (4 if s > 1 else out_bytes) / cost.sm_bytes
        return waves * (max(subs * main, subs * epi) + cost.mma_fill + epi), tiles, waves
    rate = cost.sm_mma_flops * cost.mma_efficiency(bn) if cfg.kind == "wgmma" else cost.sm_flops
    ob = 4 if s > 1 else out_bytes
    per_tile = 2 * bm * bn * math.ceil(k / s) / rate + cost.mma_fill + bm * bn * ob / cost.sm_bytes
    seconds = waves * per_tile
    if s > 1:
        seconds += 2 * s * batch * m * n * 4 / (cost.sm_bytes * num_sms) + cost.split_k_overhead
    return seconds, tiles, waves


def choose(cands, batch: int, m: int, k: int, n: int, out_bytes: int, cost: CostModel, num_sms: int,
           fixed_split: int = 0) -> tuple[Any, int, float, int, int] | None:
    """(config, S, seconds, tiles, waves) of the cheapest candidate, or None without candidates."""
    best = None
    for cfg in cands:
        if is_pingpong(cfg) and cost.pingpong_efficiency <= 0:
            continue
        bm, bn = cfg.tile[-2:]
        tiles1 = batch * math.ceil(m / bm) * math.ceil(n / bn)
        fixed = fixed_split > 1
        for s in (fixed_split,) if fixed else cost.split_k_choices:
            if s > 1 and not fixed and (k / s < cost.split_k_min_steps * cfg.k_tile or tiles1 >= num_sms or s > k):
                continue
            # A body streaming K in k_tile blocks (TMA) cannot stop inside a block: every partial's
            # K range (ceil(K / S) long, latch_ops.matmul) must be whole blocks.
            if s > 1 and not fixed and cfg.kind == "wgmma" and math.ceil(k / s) % cfg.k_tile:
                continue
            if s > 1 and not fixed and is_pingpong(cfg):  # (ping-pong wins on many tiles; split-K is for few)
                continue
            seconds, tiles, waves = price(cfg, batch, m, k, n, s, out_bytes, cost, num_sms)
            if best is None or seconds < best[2]:
                best = (cfg, s, seconds, tiles, waves)
    return best


def choose_configs(graph: Graph, *, cost: CostModel | None = None, num_sms: int = 132,
                   registry=None) -> tuple[Graph, list[dict]]:
    """The program with every matmul's configuration recorded (and split-K rewritten) and the report."""
    from latch_core.configs import configs_for

    cost = cost or CostModel()
    nodes: list[Node] = []
    values = list(graph.values)
    names = {v.name for v in values} | {n.name for n in graph.nodes}
    report: list[dict] = []
    changed = False
    for node in graph.nodes:
        if node.op != MATMUL or len(node.inputs) != 2 or any(v is None for v in node.inputs) or node.attr("config"):
            nodes.append(node)
            continue
        a, b = (graph.value(v).type for v in node.inputs)
        y = graph.value(node.outputs[0])
        attr = node.attr_dict
        m, k, n, ta, tb, s0 = matmul_dims(a, b, attr)
        batch = math.prod(a.shape[:-2])
        cands = configs_for(MATMUL, [a, b], [y.type], attr, registry)
        best = choose(cands, batch, m, k, n, DTYPES[y.dtype], cost, num_sms, fixed_split=s0)
        if best is None:
            nodes.append(node)
            continue
        cfg, s, seconds, tiles, waves = best
        lead = "".join(f"{d}*" for d in a.shape[:-2])  # batch dims, then M x K x N
        report.append({"node": node.name, "shape": f"{lead}{m}x{k}x{n}",
                       "layout": _layout(ta, tb), "config": cfg.name, "split_k": s, "tiles": tiles,
                       "waves": waves, "cost_us": round(seconds * 1e6, 2), "source": node.source or ""})
        changed = True
        if s == 1 or s0 > 1:
            nodes.append(attrs.evolve(node, attrs=dict(attr, config=cfg.name)))
            continue
        # split-K: partials, then a fixed-order sum over the split dim, then the output's dtype
        part = fresh_name(names, f"{y.name}.partial")
        values.append(Value(part, (s,) + tuple(y.shape), "f32"))
        pattr = dict(attr, config=cfg.name, split_k=s, out_dtype="f32")
        nodes.append(Node(fresh_name(names, f"{node.name}.partial"), MATMUL, node.inputs, (part,), pattr,
                          source=node.source))
        nodes.extend(split_sum(names, values, node, part, s, y))
    if not changed:
        return graph, []
    return attrs.evolve(graph, values=values, nodes=nodes), report


def split_sum(names: set, values: list, node: Node, part: str, s: int, y: Value) -> list[Node]:
    """The nodes that sum the ``s`` partials ``part`` ([s, *y.shape], f32) into ``y`` (keeping
    ``node``'s name on the last one) in a fixed order: select views, a chain of adds, a cast where
    ``y`` is not f32. Appends the new values to ``values`` and their names to ``names``."""
    out: list[Node] = []
    views = []
    for i in range(s):
        v = fresh_name(names, f"{y.name}.p{i}")
        values.append(Value(v, y.shape, "f32"))
        out.append(Node(fresh_name(names, f"{node.name}.p{i}"), "latch::select", (part,), (v,),
                        {"dim": 0, "index": i}, source=node.source))
        views.append(v)
    acc = views[0]
    for i in range(1, s):
        last = i == s - 1 and y.dtype == "f32"
        v = y.name if last else fresh_name(names, f"{y.name}.acc{i}")
        if not last:
            values.append(Value(v, y.shape, "f32"))
        out.append(Node(node.name if last else fresh_name(names, f"{node.name}.acc{i}"), "latch::add",
                        (acc, views[i]), (v,), {}, source=node.source))
        acc = v
    if y.dtype != "f32":
        out.append(Node(node.name, "latch::cast", (acc,), (y.name,), {"dtype": y.dtype}, source=node.source))
    return out


def configs_document(doc: Document, *, cost: CostModel | None = None, num_sms: int = 132,
                     registry=None) -> tuple[Document, dict[str, list[dict]]]:
    programs, report = [], {}
    for g in doc.graph.programs:
        g2, rep = choose_configs(g, cost=cost, num_sms=num_sms, registry=registry)
        programs.append(g2)
        if rep:
            report[g.name] = rep
    if not report:
        return doc, {}
    return attrs.evolve(doc, graph=attrs.evolve(doc.graph, programs=programs)), report


def configs_pass(doc: Document, *, num_sms: int = 132, **options):
    """Pass ``schedule.matmul_configs`` (options: ``num_sms``, ``cost_<field>`` CostModel overrides).
    The choices are recorded in the graph's metadata (``matmul_configs``: program -> one row per
    matmul) and the provenance detail; ``latch-pipeline show`` and ``schedule`` print them."""
    from .tasks import options_cost

    out, report = configs_document(doc, cost=options_cost(options), num_sms=int(num_sms))
    if not report:
        return out, "no matmul to configure"
    meta = dict(out.graph.metadata)
    meta["matmul_configs"] = {p: [dict(r) for r in rows] for p, rows in report.items()}
    out = attrs.evolve(out, graph=attrs.evolve(out.graph, metadata=meta), schedule=None, memory=None, build=None)
    n = sum(len(r) for r in report.values())
    splits = sum(1 for rows in report.values() for r in rows if r["split_k"] > 1)
    return out, f"{n} matmul(s) configured, {splits} split along K"


def format_choice(c: dict) -> str:
    """One line of ``latch-pipeline show``'s per-matmul summary."""
    return (f"{c['node']}: {c['shape']} {c['layout']} -> {c['config']} S={c['split_k']} "
            f"{c['tiles']} tiles {c['waves']} waves ~{c['cost_us']} us")
