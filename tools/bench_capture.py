#!/usr/bin/env python
"""Capture benchmark for TinyMoE-200M (examples/tinymoe.py) on the CPU, model on the meta device.

For each workload (2 x 1024 tokens in one step; 16 microbatches of 8 x 1024) it reports the build
time, the capture time, the node count of every program, the number of distinct ops, the peak
resident memory, and the op histogram, as tables. Target (issue 3): capture <= 20 s at 2 x 1024.

    python tools/bench_capture.py                 # both workloads
    python tools/bench_capture.py --only 2x1024   # one of them
    python tools/bench_capture.py --json out.json # also write the numbers

Capture runs in this process, one workload after the other; the peak memory column is the
process's peak so far (so the second workload's includes the first's), and the first build time
includes importing torch and the example. Exit status 1 when the 2 x 1024 target is missed.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import resource
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "tinymoe.py"
TARGET_S = 20.0  # capture at 2 x 1024

WORKLOADS = {
    "2x1024": dict(batch=2, seq=1024, microbatches=1),
    "16x8x1024": dict(batch=8, seq=1024, microbatches=16),
}


def peak_rss_mib() -> float:
    # ru_maxrss is KiB on Linux
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def bench(name: str, overrides: dict, quiet: bool) -> dict:
    from latch_capture import load_example

    t0 = time.perf_counter()
    ex = load_example(EXAMPLE, device="meta", **overrides)
    built = time.perf_counter() - t0
    params = sum(p.numel() for p in ex.model.parameters())
    say = (lambda m: None) if quiet else (lambda m: print(f"  [{name}] {m}", file=sys.stderr, flush=True))
    t0 = time.perf_counter()
    doc = ex.capture(progress=say)
    seconds = time.perf_counter() - t0
    programs = {}
    for prog in doc.graph.programs:
        hist = Counter(n.op for n in prog.nodes)
        programs[prog.name] = {"nodes": len(prog.nodes), "values": len(prog.values), "distinct_ops": len(hist),
                               "histogram": dict(hist.most_common())}
    return {"workload": name, "overrides": overrides, "parameters": params, "build_s": round(built, 2),
            "capture_s": round(seconds, 2), "peak_rss_mib": round(peak_rss_mib()), "programs": programs}


def table(rows: list[list], header: list[str]) -> str:
    cells = [header] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    right = [i > 0 for i in range(len(header))]
    fmt = lambda r: "  ".join(c.rjust(w) if a else c.ljust(w) for c, w, a in zip(r, widths, right))  # noqa: E731
    return "\n".join([fmt(cells[0]), "  ".join("-" * w for w in widths)] + [fmt(r) for r in cells[1:]])


def report(results: list[dict], top: int | None) -> str:
    out = []
    rows = []
    for r in results:
        for pname, p in r["programs"].items():
            rows.append([r["workload"], pname, f"{r['parameters']:,}", r["build_s"], r["capture_s"], p["nodes"],
                         p["values"], p["distinct_ops"], r["peak_rss_mib"]])
    out.append(table(rows, ["workload", "program", "params", "build s", "capture s", "nodes", "values",
                            "distinct ops", "peak MiB"]))
    # op histogram: one column per (workload, program)
    cols = [(r["workload"], pname, p["histogram"]) for r in results for pname, p in r["programs"].items()]
    total = Counter()
    for _, _, h in cols:
        total.update(h)
    ops = [op for op, _ in total.most_common()]
    shown = ops if top is None else ops[:top]
    hrows = [[op] + [h.get(op, 0) for _, _, h in cols] for op in shown]
    if len(shown) < len(ops):
        hrows.append([f"({len(ops) - len(shown)} more ops)"] + [
            sum(h.get(op, 0) for op in ops[len(shown):]) for _, _, h in cols])
    out.append("")
    out.append("op histogram (nodes per op)")
    out.append(table(hrows, ["op"] + [f"{w}:{p}" for w, p, _ in cols]))
    for r in results:
        if r["workload"] == "2x1024":
            ok = r["capture_s"] <= TARGET_S
            out.append("")
            out.append(f"target: capture at 2 x 1024 <= {TARGET_S:.0f} s: {r['capture_s']:.1f} s "
                       f"{'PASS' if ok else 'FAIL'}")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=sorted(WORKLOADS), action="append", help="run only this workload (repeatable)")
    ap.add_argument("--top", type=int, default=None, help="show only the N most frequent ops in the histogram")
    ap.add_argument("--json", type=Path, help="also write the results to this file")
    ap.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    args = ap.parse_args(argv)
    names = args.only or list(WORKLOADS)
    results = [bench(n, WORKLOADS[n], args.quiet) for n in names]
    import torch

    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    print(f"TinyMoE-200M capture benchmark, {stamp}, {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} CPUs, torch {torch.__version__}, python {platform.python_version()}")
    print(report(results, args.top))
    if args.json:
        args.json.write_text(json.dumps({"date": stamp, "torch": torch.__version__, "results": results}, indent=1))
    two = [r for r in results if r["workload"] == "2x1024"]
    return 0 if all(r["capture_s"] <= TARGET_S for r in two) else 1


if __name__ == "__main__":
    sys.exit(main())
