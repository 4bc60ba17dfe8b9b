#!/usr/bin/env python
"""Where an update's time goes inside the megakernel, measured on the GPU.

    python tools/profile_report.py EXAMPLE.py [--set k=v ...] [--scheduler S] [--policy] [--updates N]

Runs the one pipeline (latch_check.pipeline.compile_example, i.e. latch_core.pipeline: capture -> policy -> split -> schedule -> plan
-> validate), builds it as a profiling build (build(..., profile=True): -DLATCH_PROFILE=1, its own
cache key and, by default, its own directory), runs a warm-up update and then N updates of the
example's data on the GPU, and prints latch_codegen_h100.profile's report per program: kernel time
(globaltimer, with the CUDA-event time of the same launches), busy / barrier wait / counter wait /
idle time per SM, the waiting fraction of the update, and the top ops, bodies and fusion groups.
With --trace-dir DIR it also writes the per-SM timeline (latch_codegen_h100.timeline): DIR/trace.json
(Chrome/Perfetto trace: one track per SM, each task named by op and source line, waits as events;
open it in ui.perfetto.dev), DIR/timeline.png, and DIR/summary.json with the busy and waiting time
per SM and per op class (also printed, TIMELINE lines).
The profiling build's own overhead (two timer reads and one 16-byte store per instruction) is in
the numbers; compare the CUDA-event time with a normal build's to see it.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="profile_report.py", description=__doc__.splitlines()[0])
    ap.add_argument("example")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--scheduler", default=None, help="scheduling strategy (default: LATCH_SCHEDULER or barrier)")
    ap.add_argument("--policy", action="store_true", help="apply memory.policy (BF16 matmul/attention operands)")
    ap.add_argument("--store-products", action="store_true",
                    help="products feeding only BF16 consumers stored in BF16 (compile's and bench's --store-products)")
    ap.add_argument("--updates", type=int, default=3, help="profiled updates after one warm-up update")
    ap.add_argument("--dir", default=None, help="build directory (default: build/<example>-<strategy>-profile)")
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--per-sm", action="store_true", help="also print every SM's row")
    ap.add_argument("--trace-dir", default=None, help="write trace.json, timeline.png and summary.json here")
    ap.add_argument("--trace-updates", type=int, default=1, help="updates drawn in the trace and PNG (the last ones)")
    ap.add_argument("--phases", default=None, metavar="FILE",
                    help="with --trace-dir: write tools/trace_phases.py's analysis of the trace against the planned "
                         "document (saved beside the trace as planned.latch.json) to FILE: where the waiting comes from")
    args = ap.parse_args(argv)
    if args.updates < 1:
        ap.error("--updates must be at least 1")
    if args.phases and not args.trace_dir:
        ap.error("--phases analyses the trace: give --trace-dir too")

    import torch

    from latch_capture.examples import parse_overrides
    from latch_check.gpu import GpuRun
    from latch_check.pipeline import compile_example
    from latch_codegen_h100 import build
    from latch_codegen_h100.profile import format_reports, report

    if not torch.cuda.is_available():
        print("profile_report: no CUDA device (torch.cuda.is_available() is False); profiling runs on the GPU",
              file=sys.stderr)
        return 2
    name = Path(args.example).stem
    say = lambda m: print(f"  {m}", flush=True)  # noqa: E731
    c = compile_example(args.example, overrides=parse_overrides(args.overrides), scheduler=args.scheduler,
                        policy=args.policy, build=False, say=say, store_products=args.store_products)
    out = Path(args.dir or f"build/{name}-{c.doc.schedule.strategy}-profile")
    t0 = time.perf_counter()
    doc = build(c.doc, out, profile=True)
    st = dict(doc.build.stats)
    say(f"profiling build {time.perf_counter() - t0:7.2f} s  {out} ({st.get('bodies')} bodies, cached: {st.get('cached')})")

    run = GpuRun(c.example, out)
    prog = run.prog
    run.update(run.batches(0))  # warm-up: first-touch costs stay out of the profile
    prog.profile()
    for step in range(1, args.updates + 1):
        run.update(run.batches(step))
    prog.check()
    records = prog.profile()
    reps = report(doc, records)
    per_update_ms = sum(r.kernel_ns for r in reps) / 1e6 / args.updates
    ev = [r.event_ms for r in reps]
    ev_txt = f", CUDA events {sum(ev) / args.updates:.4f} ms" if all(e is not None for e in ev) else ""
    waiting = sum(r.totals["barrier"] + r.totals["counter"] for r in reps) / max(1, sum(r.sm_time_ns for r in reps))
    print(f"PROFILE {name} {doc.schedule.strategy}{' policy' if args.policy else ''}: {args.updates} update(s), "
          f"{len(records)} launch(es); kernel time {per_update_ms:.4f} ms per update (globaltimer{ev_txt}); "
          f"waiting at synchronisation {100 * waiting:.2f}% of the update's SM-time")
    print(format_reports(reps, top=args.top, per_sm=args.per_sm))
    if args.trace_dir:
        write_timeline(doc, records, reps, Path(args.trace_dir), updates=args.trace_updates,
                       launches_per_update=max(1, len(records) // args.updates))
        if args.phases:
            from latch_core.document import to_json_obj

            write_phases(to_json_obj(doc), Path(args.trace_dir), Path(args.phases))
    return 0


def write_phases(doc: dict, trace_dir: Path, out: Path) -> None:
    """tools/trace_phases.py on the trace just written (one launch: --trace-updates 1 of a one-program
    update) and the planned document (``doc``, its JSON object), saved beside it; its printed tables go
    to ``out``, all of them (every interval) to ``out`` with the suffix .json."""
    import contextlib
    import importlib.util
    import json

    plan = trace_dir / "planned.latch.json"
    plan.write_text(json.dumps(doc))
    spec = importlib.util.spec_from_file_location("trace_phases", Path(__file__).with_name("trace_phases.py"))
    tp = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("trace_phases", tp)  # its dataclasses look their module up while it loads
    spec.loader.exec_module(tp)
    out.parent.mkdir(parents=True, exist_ok=True)
    tables = out.with_suffix(".json")  # every interval, not only the printed top ones
    with open(out, "w") as f, contextlib.redirect_stdout(f):
        tp.main([str(trace_dir / "trace.json"), str(plan), "--json", str(tables)])
    print(f"PHASES written to {out} and {tables}")


def write_timeline(doc, records, reps, out: Path, *, updates: int = 1, launches_per_update: int = 1) -> None:
    """trace.json, timeline.png and summary.json of the profiled launches (the last ``updates``
    updates in the pictures; every launch in the summary)."""
    import json

    from latch_codegen_h100.profile import layout_from_document
    from latch_codegen_h100.timeline import class_summary, classes_from_registry, legend, timeline_png, trace

    out.mkdir(parents=True, exist_ok=True)
    layouts = {r.program: layout_from_document(doc, r.program) for r in records}
    classes: dict[str, str] = {}
    for lay in layouts.values():
        classes.update(classes_from_registry(lay))
    drawn = list(records[-updates * launches_per_update:])
    (out / "trace.json").write_text(json.dumps(trace(layouts, drawn, classes)))
    (out / "timeline.png").write_bytes(timeline_png(layouts, drawn, classes))
    summary = []
    for rep in reps:
        text, data = class_summary(rep, layouts[rep.program], classes)
        print(text)
        summary.append(data)
    (out / "summary.json").write_text(json.dumps({"programs": summary, "legend": legend()}, indent=1))
    print(legend())
    print(f"TIMELINE written: {out}/trace.json (open in ui.perfetto.dev), {out}/timeline.png, {out}/summary.json")


if __name__ == "__main__":
    sys.exit(main())
