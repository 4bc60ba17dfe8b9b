#!/usr/bin/env python
"""Memory report for TinyMoE-200M at 2 x 1024 tokens (examples/tinymoe.py, model on the meta device).

For each recomputation budget (none, then fractions of the node-order peak) and each strategy it
runs ``memory.policy``, ``memory.remat``, ``schedule`` (132 SMs), ``memory.plan`` and
``schedule.validate``, and prints one table: the node-order peak before/after recomputation, the
arena size against the peak of live bytes over the schedule (the lower bound), and the seconds
of each pass. Needs latch-capture, latch-schedule and torch (this script is not part of the
torch-free latch_memory package).

    python packages/latch-memory/benchmarks/tinymoe_memory.py [--budgets 1.0,0.8,0.6] [--doc saved.latch.json]
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import platform
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def _capture(doc_path: str | None):
    from latch_core.document import load, save

    if doc_path and Path(doc_path).exists():
        return load(doc_path), 0.0
    from latch_capture import load_example

    ex = load_example(ROOT / "examples" / "tinymoe.py", device="meta", batch=2, seq=1024)
    t0 = time.perf_counter()
    doc = ex.capture()
    seconds = time.perf_counter() - t0
    if doc_path:
        save(doc, doc_path)
    return doc, seconds


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--budgets", default="1.0,0.8,0.6", help="fractions of the node-order peak (1.0: no recomputation)")
    ap.add_argument("--strategies", default="barrier,dataflow")
    ap.add_argument("--doc", default=None, help="captured document to reuse (written after a capture if missing)")
    ap.add_argument("--json", default=None, help="also write the rows as JSON")
    args = ap.parse_args(argv)

    from latch_core.passes import run_pass
    from latch_core.plugins import registries
    from latch_memory.remat import estimate

    passes = registries().passes
    doc, t_capture = _capture(args.doc)
    t0 = time.perf_counter()
    doc = run_pass(passes.get("memory.policy"), doc)
    t_policy = time.perf_counter() - t0
    node_peak = estimate(doc.graph.program("update")).peak
    rows = []
    for frac in (float(x) for x in args.budgets.split(",")):
        t0 = time.perf_counter()
        d = run_pass(passes.get("memory.remat"), doc, budget_bytes=int(frac * node_peak)) if frac < 1 else doc
        t_remat = time.perf_counter() - t0 if frac < 1 else 0.0
        rep = dict(dict(dict(d.graph.metadata).get("memory.remat", ())).get("update", ()))
        for strategy in args.strategies.split(","):
            t0 = time.perf_counter()
            s = run_pass(passes.get("schedule"), run_pass(passes.get("schedule.split_reductions"), d),
                         scheduler=strategy)
            t_sched = time.perf_counter() - t0
            t0 = time.perf_counter()
            s = run_pass(passes.get("memory.plan"), s)
            t_plan = time.perf_counter() - t0
            t0 = time.perf_counter()
            run_pass(passes.get("schedule.validate"), s)
            t_val = time.perf_counter() - t0
            pm = s.memory.program("update")
            st = dict(dict(dict(s.memory.stats)["programs"])["update"])
            rows.append({
                "budget": frac, "strategy": strategy, "tasks": len(s.schedule.program("update").tasks),
                "node_peak_before": node_peak, "node_peak_after": rep.get("peak_after", node_peak),
                "recomputed": rep.get("recomputed", 0), "arena_bytes": pm.arena_bytes,
                "peak_live_bytes": pm.peak_live_bytes, "arena_values": st["arena_values"],
                "inplace": len(st["inplace"]), "copy_back": len(st["copy_back"]),
                "s_remat": t_remat, "s_schedule": t_sched, "s_plan": t_plan, "s_validate": t_val,
            })
            print(f"  budget {frac} {strategy}: done", file=sys.stderr, flush=True)

    mib = 1 << 20
    print(f"TinyMoE-200M 2x1024, {_dt.date.today()}, {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} CPUs; capture {t_capture:.1f} s, policy {t_policy * 1000:.0f} ms")
    print("| budget | strategy | tasks | node-order peak (MiB) before -> after, recomputed | arena (MiB) | "
          "peak live (MiB) | arena / peak | remat s | schedule s | plan s | validate s | sched+plan+validate s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        total = r["s_schedule"] + r["s_plan"] + r["s_validate"]
        print(f"| {r['budget']:.2f} | {r['strategy']} | {r['tasks']:,} | {r['node_peak_before'] / mib:,.0f} -> "
              f"{r['node_peak_after'] / mib:,.0f}, {r['recomputed']} | {r['arena_bytes'] / mib:,.0f} | "
              f"{r['peak_live_bytes'] / mib:,.0f} | {r['arena_bytes'] / r['peak_live_bytes']:.3f} | {r['s_remat']:.2f} | "
              f"{r['s_schedule']:.2f} | {r['s_plan']:.2f} | {r['s_validate']:.2f} | {total:.2f} |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
