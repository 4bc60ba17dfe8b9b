#!/usr/bin/env python
"""Fusion report of planned documents: tasks, groups, phases, barriers, the cost model's estimate,
the groups by body (op chain) with their tasks, the view/concat-only groups left, and where RoPE's
nodes went (issue 11: "every byte once"; results/vf.md).

    python tools/fusion_report.py DOC.latch.json [DOC2.latch.json]   # two documents: before, after
    python tools/fusion_report.py --top 25 DOC.latch.json

A document comes from ``latch-pipeline compile EXAMPLE --set device=meta --no-build -o DOC`` (see
results/vf.md for the exact commands). With two documents the totals are printed side by side.
RoPE: the groups holding a node whose source line is in ``examples/transformer.py``'s
``apply_rope`` (forward, and the backward nodes autograd attributes to it), with their op chains.
"""

from __future__ import annotations

import argparse
import collections
import sys

from latch_core import document
from latch_core.plugins import registries
from latch_core.registry import STRUCTURAL, VIEW


def rope_groups(doc) -> list[tuple[str, int]]:
    """(group body, tasks) for each group holding a node of ``apply_rope``."""
    ps = doc.schedule.programs[0]
    g = doc.graph.program(ps.program)
    nodes = {n.name: n for n in g.nodes}
    tasks = collections.Counter(t.group for t in ps.tasks)
    out = []
    for grp in ps.groups:
        if any("apply_rope" in str(getattr(nodes[x], "source", "") or "") for x in grp.nodes):
            out.append((grp.body.split("/")[0], tasks[grp.id]))
    return out


def summary(doc, ops) -> dict:
    ps = doc.schedule.programs[0]
    g = doc.graph.program(ps.program)
    nodes = {n.name: n for n in g.nodes}
    st = dict(dict(doc.schedule.stats).get(f"program.{ps.program}", ()))
    tasks = collections.Counter(t.group for t in ps.tasks)
    bodies: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
    view_only: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
    for grp in ps.groups:
        key = grp.body.split("/")[0]
        bodies[key][0] += 1
        bodies[key][1] += tasks[grp.id]
        if all(nodes[x].op in ops and ops.get(nodes[x].op).tags & {VIEW, STRUCTURAL} for x in grp.nodes):
            view_only[key][0] += 1
            view_only[key][1] += tasks[grp.id]
    return {"tasks": st.get("tasks"), "groups": st.get("groups"), "phases": st.get("phases"),
            "barriers": st.get("barriers"), "est_ms": round(1e3 * st.get("est_seconds", 0.0), 3),
            "bodies": bodies, "view_only": view_only, "rope": rope_groups(doc)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("docs", nargs="+")
    ap.add_argument("--top", type=int, default=15, help="op chains shown, by tasks")
    a = ap.parse_args(argv)
    ops = registries().ops
    sums = [summary(document.load(p), ops) for p in a.docs]
    keys = ("tasks", "groups", "phases", "barriers", "est_ms")
    print("%-10s" % "" + "".join("%16s" % p.split("/")[-1][:15] for p in a.docs))
    for k in keys:
        print("%-10s" % k + "".join("%16s" % s[k] for s in sums))
    for p, s in zip(a.docs, sums):
        print(f"\n== {p}")
        print("top op chains (groups, tasks):")
        for key, (ng, nt) in sorted(s["bodies"].items(), key=lambda kv: -kv[1][1])[:a.top]:
            print(f"  {nt:7d} tasks {ng:5d} groups  {key}")
        vg = sum(v[0] for v in s["view_only"].values())
        vt = sum(v[1] for v in s["view_only"].values())
        print(f"view/concat-only groups: {vg} groups, {vt} tasks")
        for key, (ng, nt) in sorted(s["view_only"].items(), key=lambda kv: -kv[1][1]):
            print(f"  {nt:7d} tasks {ng:5d} groups  {key}")
        rope = collections.Counter(b for b, _ in s["rope"])
        print(f"groups holding apply_rope nodes: {len(s['rope'])}")
        for key, c in rope.most_common():
            print(f"  {c:5d} x  {key}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
