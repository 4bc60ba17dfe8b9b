#!/usr/bin/env python
"""Schedule report for TinyMoE-200M (examples/tinymoe.py) at 2 x 1024 tokens, on the CPU.

Captures the update (model on the meta device), then for each scheduling strategy runs the
``schedule`` pass, the memory stage's ``memory.plan`` and the static validator, and reports:
tasks, fusion groups, distinct op bodies, phases and barriers (barrier strategy), counters, waits
and signals (dataflow), the estimated makespan and idle fraction from the cost model, the task
spread over SMs, the arena size, and the time each pass takes. Target (issue 4): schedule + plan +
validate under 10 s per strategy on a 2-core machine.

    python tools/schedule_report.py                        # capture, then both strategies
    python tools/schedule_report.py --doc tinymoe.latch.json   # a document captured before
    python tools/schedule_report.py --strategy dataflow --json out.json --save-dir /tmp/sched

Times are wall-clock seconds of this process (and its CPU seconds, which a loaded machine
inflates less). Exit status 1 when a strategy misses the target or the validator finds a hazard.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "tinymoe.py"
TARGET_S = 10.0  # schedule + plan + validate, per strategy
WORKLOAD = dict(batch=2, seq=1024, microbatches=1)


class _Clock:
    def __init__(self):
        self.wall, self.cpu = time.perf_counter(), time.process_time()

    def stop(self) -> tuple[float, float]:
        return round(time.perf_counter() - self.wall, 3), round(time.process_time() - self.cpu, 3)


def capture(quiet: bool):
    from latch_capture import load_example

    say = (lambda m: None) if quiet else (lambda m: print(f"  [capture] {m}", file=sys.stderr, flush=True))
    c = _Clock()
    ex = load_example(EXAMPLE, device="meta", **WORKLOAD)
    doc = ex.capture(progress=say)
    return doc, c.stop()


def run_strategy(doc, strategy: str, num_sms: int, save_dir: Path | None) -> dict:
    from latch_core import document
    from latch_core.passes import run_pass
    from latch_core.plugins import registries

    from latch_schedule.passes import SCHEDULE, SPLIT_REDUCTIONS
    from latch_schedule.validate import validate

    regs = registries()
    times = {}
    c = _Clock()
    d = run_pass(SPLIT_REDUCTIONS, doc, num_sms=num_sms)
    times["split_reductions"] = c.stop()
    c = _Clock()
    d = run_pass(SCHEDULE, d, scheduler=strategy, num_sms=num_sms)
    times["schedule"] = c.stop()
    plan = regs.passes.get("memory.plan") if "memory.plan" in regs.passes else None
    if plan is None:
        raise SystemExit("error: latch-memory's memory.plan pass is not installed; install packages/latch-memory")
    c = _Clock()
    d = run_pass(plan, d)
    times["plan"] = c.stop()
    c = _Clock()
    problems = validate(d, ops=regs.ops)
    times["validate"] = c.stop()
    if save_dir is not None:
        save_dir.mkdir(parents=True, exist_ok=True)
        document.save(d, save_dir / f"tinymoe_2x1024.{strategy}.latch.json")

    section = d.schedule
    stats = dict(section.stats)
    out = {"strategy": strategy, "times": times, "problems": problems[:20], "n_problems": len(problems),
           "seconds_tasks": stats.get("seconds_tasks"), "seconds_strategy": stats.get("seconds_strategy"),
           "programs": {}}
    for ps in section.programs:
        st = dict(stats.get(f"program.{ps.program}", ()))
        per_sm = [sum(1 for i in sm if i[0] == "task") for sm in ps.sms]
        load = [0.0] * len(ps.sms)
        for s, sm in enumerate(ps.sms):
            for i in sm:
                if i[0] == "task":
                    load[s] += ps.tasks[i[1]].cost
        pm = d.memory.program(ps.program)
        out["programs"][ps.program] = {
            **st,
            "tasks_per_sm": [min(per_sm), max(per_sm)],
            "sm_busy_ms": [round(min(load) * 1e3, 3), round(max(load) * 1e3, 3)],
            "instructions": sum(len(sm) for sm in ps.sms),
            "arena_bytes": pm.arena_bytes, "peak_live_bytes": pm.peak_live_bytes,
        }
    return out


def table(rows: list[list], header: list[str]) -> str:
    cells = [header] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    fmt = lambda r: "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths)))  # noqa: E731
    return "\n".join([fmt(cells[0]), "  ".join("-" * w for w in widths)] + [fmt(r) for r in cells[1:]])


def report(results: list[dict], capture_times, nodes: dict) -> str:
    out = []
    if capture_times is not None:
        out.append(f"capture: {capture_times[0]:.1f} s wall ({capture_times[1]:.1f} s CPU); nodes per program: {nodes}")
    rows = []
    for r in results:
        for prog, p in r["programs"].items():
            rows.append([
                r["strategy"], prog, p["tasks"], p["groups"], p["bodies"],
                p.get("phases", "-"), p.get("barriers", "-"), p.get("counters", "-"), p.get("waits", "-"),
                p.get("signals", "-"), f"{p['est_seconds'] * 1e3:.2f}", f"{p['est_idle_fraction']:.2f}",
                f"{p['tasks_per_sm'][0]}..{p['tasks_per_sm'][1]}", f"{p['arena_bytes'] / 2**20:.0f}",
            ])
    out.append(table(rows, ["strategy", "program", "tasks", "groups", "bodies", "phases", "barriers", "counters",
                            "waits", "signals", "est ms", "est idle", "tasks/SM", "arena MiB"]))
    out.append("")
    rows = []
    for r in results:
        t = r["times"]
        total = sum(v[0] for v in t.values())
        total_cpu = sum(v[1] for v in t.values())
        rows.append([r["strategy"], f"{t['schedule'][0]:.2f} ({r['seconds_tasks']:.2f} tasks + "
                     f"{r['seconds_strategy']:.2f} strategy)", f"{t['plan'][0]:.2f}", f"{t['validate'][0]:.2f}",
                     f"{total:.2f}", f"{total_cpu:.2f}", "PASS" if total <= TARGET_S else "FAIL",
                     "ok" if not r["n_problems"] else f"{r['n_problems']} hazards"])
    out.append(table(rows, ["strategy", "schedule s", "plan s", "validate s", "total s", "total CPU s",
                            f"<= {TARGET_S:.0f} s", "validator"]))
    for r in results:
        for p in r["problems"][:5]:
            out.append(f"  {r['strategy']}: {p}")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--doc", type=Path, help="use this captured document instead of capturing TinyMoE")
    ap.add_argument("--strategy", action="append", help="barrier / dataflow / another registered one (repeatable)")
    ap.add_argument("--num-sms", type=int, default=132)
    ap.add_argument("--json", type=Path, help="also write the results to this file")
    ap.add_argument("--save-dir", type=Path, help="write each scheduled + planned document here")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)
    from latch_core import document

    if args.doc is not None:
        doc, cap = document.load(args.doc), None
    else:
        doc, cap = capture(args.quiet)
    nodes = {p.name: len(p.nodes) for p in doc.graph.programs}
    strategies = args.strategy or ["barrier", "dataflow"]
    results = []
    for s in strategies:
        if not args.quiet:
            print(f"  [{s}] schedule, plan, validate ...", file=sys.stderr, flush=True)
        results.append(run_strategy(doc, s, args.num_sms, args.save_dir))
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = float("nan")
    print(f"TinyMoE-200M schedule report, 2 x 1024 tokens, {args.num_sms} SMs; {stamp}, "
          f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs (load {load:.1f}), "
          f"python {platform.python_version()}")
    print(report(results, cap, nodes))
    if args.json:
        args.json.write_text(json.dumps({"date": stamp, "capture": cap, "nodes": nodes, "results": results}, indent=1))
    ok = all(sum(v[0] for v in r["times"].values()) <= TARGET_S and not r["n_problems"] for r in results)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
