#!/usr/bin/env python
"""The planned document of the full-size dense transformer, on the CPU: which tensors of the
logits' size it holds, and its phase / task / barrier counts (issue 11).

    python tools/lmhead_plan_report.py                    # with memory.fuse_cross_entropy
    python tools/lmhead_plan_report.py --no-fuse          # the pipeline without it, to compare
    python tools/lmhead_plan_report.py --json out.json --scheduler dataflow

Runs the pipeline from capture to memory.plan (the model on the meta device; no build, no
simulation). Prints one line per value of at least the logits' element count (N x V) that the
memory plan places, with its dtype and bytes, then a ``PLAN`` line. Exit status 1 when
``--expect-no-f32-logits`` is given and such a value is FP32.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FULL = dict(d_model=768, layers=8, heads=12, mlp_hidden=2048, vocab=49152, batch=2, seq=1024, device="meta")
DTYPE_BYTES = {"f64": 8, "f32": 4, "bf16": 2, "f16": 2, "i64": 8, "i32": 4, "bool": 1}


def plan(overrides: dict, fuse: bool, scheduler: str | None = None):
    from latch_core.pipeline import Request, compile

    req = Request(example=str(ROOT / "examples" / "transformer.py"), overrides=overrides, build=False,
                  fuse_cross_entropy=fuse, scheduler=scheduler)
    return compile(req)


def report(doc, n_logits: int) -> dict:
    s = doc.schedule
    stats = dict(s.stats)
    big = []
    planned = {(pm.program, pl.value) for pm in doc.memory.programs for pl in pm.placements}
    for g in doc.graph.programs:
        for v in g.values:
            if math.prod(v.shape) >= n_logits:
                big.append({"program": g.name, "value": v.name, "dtype": v.dtype, "shape": list(v.shape),
                            "bytes": math.prod(v.shape) * DTYPE_BYTES.get(v.dtype, 4),
                            "planned": (g.name, v.name) in planned})
    progs = []
    for p in s.programs:
        phases = {t.phase for t in p.tasks}
        progs.append({"program": p.program, "tasks": len(p.tasks), "phases": len(phases - {-1}),
                      "barriers": p.num_barriers, "groups": len(p.groups), "counters": len(p.counters)})
    return {"large_values": big, "programs": progs, "stats": {k: v for k, v in stats.items()
                                                            if isinstance(v, (int, float, str))},
            "arena_bytes": doc.memory.arena_bytes}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--no-fuse", action="store_true", help="leave memory.fuse_cross_entropy out")
    ap.add_argument("--scheduler", default=None, help="barrier (default) or dataflow")
    ap.add_argument("--json", help="write the report here")
    ap.add_argument("--expect-no-f32-logits", action="store_true")
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    doc = plan(FULL, not a.no_fuse, a.scheduler)
    n_logits = FULL["batch"] * FULL["seq"] * FULL["vocab"]
    r = report(doc, n_logits)
    r["seconds"] = round(time.perf_counter() - t0, 1)
    for v in r["large_values"]:
        print(f"{v['program']:>8}  {v['value']:<40} {v['dtype']:>4} {v['shape']}  {v['bytes'] / 1e6:8.1f} MB"
              f"{'' if v['planned'] else '  (not in the arena)'}")
    f32 = [v for v in r["large_values"] if v["dtype"] in ("f32", "f64")]
    for p in r["programs"]:
        print(f"PLAN {p['program']}: {p['tasks']} tasks, {p['groups']} groups, {p['phases']} phases, "
              f"{p['barriers']} barriers, {p['counters']} counters; "
              f"arena {r['arena_bytes'] / 1e9:.2f} GB; {len(f32)} FP32 tensors of >= the logits' size "
              f"({'fused' if not a.no_fuse else 'unfused'}, {r['seconds']} s)")
    if a.json:
        Path(a.json).write_text(json.dumps(r, indent=1))
    return 1 if a.expect_no_f32_logits and f32 else 0


if __name__ == "__main__":
    sys.exit(main())
