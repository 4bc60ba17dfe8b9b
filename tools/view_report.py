"""View-only fusion groups of a planned document: how many, their bytes, which are contiguous.

    python tools/view_report.py                  # the full-size dense transformer (results/va.md)
    python tools/view_report.py --small          # the example's default sizes (seconds)
    python tools/view_report.py --no-alias-views # the schedule without alias prefixes (as before issue 11's views)
    python tools/view_report.py --doc FILE.latch.json

A view-only group is a fusion group whose every node is a view or structural op (reshape, permute,
expand, slice, select, concat, slice/select_scatter): as its own group it is a copy task reading
its input and writing its output. It is *contiguous* when it is a chain of views each of which is
a contiguous range of its operand (``latch_core.aliasing.contiguous_offset``), ending in a value
that is not a program output: such a group is what the scheduler's alias prefixes remove (the view
folds into the operand addressing of the group that reads it). Printed: per kind (op chain), the
groups, tasks and bytes moved (input + output), the phases that hold only view-only tasks, and the
totals the schedule reports (tasks, phases, barriers).
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time

from latch_core.aliasing import contiguous_offset
from latch_core.registry import STRUCTURAL, VIEW

DENSE = dict(d_model=768, layers=8, heads=12, vocab=49152, seq=1024, batch=2, mlp_hidden=2048)


def view_groups(doc, ops) -> dict:
    """Counts over the first program of ``doc`` (its schedule and graph)."""
    ps = doc.schedule.programs[0]
    g = doc.graph.program(ps.program)
    nodes = {n.name: n for n in g.nodes}
    outputs = set(g.output_names())
    tasks_of = collections.Counter(t.group for t in ps.tasks)
    phase_groups: dict[int, set] = collections.defaultdict(set)
    for t in ps.tasks:
        phase_groups[t.phase].add(t.group)
    kinds: dict[tuple, list] = collections.defaultdict(lambda: [0, 0, 0, 0])  # groups, tasks, bytes, contiguous groups
    view_only, contiguous = set(), set()
    total = {"groups": 0, "tasks": 0, "bytes": 0, "contig_groups": 0, "contig_tasks": 0, "contig_bytes": 0}
    for grp in ps.groups:
        gn = [nodes[x] for x in grp.nodes]
        if not all(n.op in ops and ops.get(n.op).tags & {VIEW, STRUCTURAL} for n in gn):
            continue
        view_only.add(grp.id)
        nbytes = sum(g.value(v).nbytes for v in (*grp.inputs, *grp.outputs))
        contig = len(grp.inputs) == 1 and not (set(grp.outputs) & outputs) and all(
            len([i for i in n.inputs if i is not None]) == 1
            and contiguous_offset(n.op, n.attr_dict, g.value(n.inputs[0]).shape, g.value(n.outputs[0]).shape) is not None
            for n in gn)
        key = tuple(n.op.split("::")[-1] for n in gn)
        k = kinds[key]
        k[0] += 1
        k[1] += tasks_of[grp.id]
        k[2] += nbytes
        total["groups"] += 1
        total["tasks"] += tasks_of[grp.id]
        total["bytes"] += nbytes
        if contig:
            contiguous.add(grp.id)
            k[3] += 1
            total["contig_groups"] += 1
            total["contig_tasks"] += tasks_of[grp.id]
            total["contig_bytes"] += nbytes
    phases = [p for p in phase_groups if p >= 0]
    total["phases_view_only"] = sum(1 for p in phases if phase_groups[p] <= view_only)
    total["phases_contiguous_only"] = sum(1 for p in phases if phase_groups[p] <= contiguous)
    total["schedule_tasks"] = len(ps.tasks)
    total["schedule_groups"] = len(ps.groups)
    total["schedule_phases"] = len(phases)
    total["schedule_barriers"] = ps.num_barriers
    total["kinds"] = {"+".join(k): v for k, v in sorted(kinds.items(), key=lambda kv: -kv[1][2])}
    st = dict(dict(doc.schedule.stats).get(f"program.{ps.program}", ()) or ())
    total["alias_prefix_views"] = st.get("alias_prefix_views", 0)
    return total


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--small", action="store_true", help="the example's default sizes")
    ap.add_argument("--example", default="examples/transformer.py")
    ap.add_argument("--scheduler", default="barrier")
    ap.add_argument("--alias-views", dest="alias_views", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--doc", help="a planned *.latch.json instead of compiling")
    ap.add_argument("--json", help="write the counts here")
    a = ap.parse_args(argv)
    from latch_core.plugins import registries

    ops = registries().ops
    t0 = time.time()
    if a.doc:
        from latch_core.document import load

        doc = load(a.doc)
    else:
        from latch_core import pipeline

        request = pipeline.Request(example=a.example, overrides={} if a.small else DENSE, scheduler=a.scheduler,
                                   build=False, alias_views=a.alias_views)
        doc = pipeline.compile(request)
    r = view_groups(doc, ops)
    print(f"planned in {time.time() - t0:.1f} s; alias views {'on' if a.alias_views else 'off'}")
    print(f"schedule: {r['schedule_tasks']} tasks, {r['schedule_groups']} groups, {r['schedule_phases']} phases, "
          f"{r['schedule_barriers']} barriers")
    print(f"view-only groups: {r['groups']} ({r['tasks']} tasks, {r['bytes'] / 1e9:.3f} GB moved); "
          f"contiguous: {r['contig_groups']} ({r['contig_tasks']} tasks, {r['contig_bytes'] / 1e9:.3f} GB)")
    print(f"phases holding only view-only tasks: {r['phases_view_only']}; only contiguous ones: "
          f"{r['phases_contiguous_only']}; views read in place by their readers (alias prefixes): "
          f"{r['alias_prefix_views']}")
    print(f"{'ops':44s} {'groups':>7s} {'tasks':>7s} {'GB':>8s} {'contig':>7s}")
    for k, (n, t, b, c) in r["kinds"].items():
        print(f"{k[:44]:44s} {n:7d} {t:7d} {b / 1e9:8.3f} {c:7d}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(r, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
