"""Which code path each group of a planned document takes (flat vector, ILP, row/column reductions,
...): `python classify_paths.py DOC.latch.json`. A reading aid for results/mb.md, not a test."""
import collections
import sys

from latch_core.document import load
from latch_codegen_h100.bodies import group_spec, node_index, render_body
from latch_codegen_h100.codegen import _lowerings


def main(path):
    doc = load(path)
    low = _lowerings()
    stats = collections.Counter(); tasks = collections.Counter(); ex = {}
    for ps in doc.schedule.programs:
        g = doc.graph.program(ps.program)
        idx = node_index(g)
        ntask = collections.Counter(t.group for t in ps.tasks)
        for grp in ps.groups:
            spec = group_spec(g, grp, False, idx)
            try:
                src = render_body(spec, low).source
            except Exception as e:
                kind = "error"
            else:
                ops = "+".join(o.split("::")[1] for o in spec.ops)
                if len(spec.nodes) == 1 and low[spec.nodes[0].op].body is not None and spec.nodes[0].op != "latch::concat":
                    kind = "own body: " + spec.nodes[0].op.split("::")[1]
                elif "one flat range" in src or ("gld4" in src and "row tiles" not in src and "reduce" not in src and "concat" not in ops):
                    kind = "flat vector"
                elif "row tiles: U groups" in src:
                    kind = "ilp W=4" if "latch::gld4" in src.split("operands not aligned")[0] else "ilp W=1/gen"
                    if kind == "ilp W=1/gen": ex.setdefault(ops, spec.describe())
                elif "load4v(b_ + r_" in src: kind = "reduce rows (registers)"
                elif "cs_[warp_ * 32 + lane_]" in src: kind = "reduce columns"
                elif "auto load = " in src: kind = "reduce other"
                elif "concat" in ops: kind = "concat vec" if "gld4" in src else "concat elementwise"
                else:
                    kind = "general (no fast path)"; ex.setdefault("gen:"+ops, spec.describe())
            stats[kind] += 1; tasks[kind] += ntask[grp.id]
    for k in sorted(stats, key=lambda k: -tasks[k]): print(f"{k:32s} groups {stats[k]:5d} tasks {tasks[k]:6d}")
    for k, v in list(ex.items())[:15]: print("  ", k, v[:200])


if __name__ == "__main__":
    main(sys.argv[1])
