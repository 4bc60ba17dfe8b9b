"""The readable text form of a document (``latch-pipeline show``).

One line per node: ``%out: f32[4,8] = latch::matmul(%a, %b) {attr=...}  # source``; then the
schedule (per SM: tasks and sync) and the memory plan (arena placements), when present.
"""

from __future__ import annotations

from collections import Counter as _Counter

from .document import Document
from .ir import Graph
from .sections import BARRIER, SIGNAL, TASK, WAIT, MemorySection, ScheduleSection


def _fmt_attr(v) -> str:
    if isinstance(v, tuple) and v and all(isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], str) for x in v):
        return "{" + ", ".join(f"{k}={_fmt_attr(x)}" for k, x in v) + "}"
    if isinstance(v, tuple):
        return "[" + ",".join(_fmt_attr(x) for x in v) + "]"
    return repr(v)


def format_graph(g: Graph, indent: str = "") -> list[str]:
    lines = []
    for grp in g.inputs:
        vals = ", ".join(f"%{n}: {g.value(n).type}" for n in grp.values if g.has_value(n))
        lines.append(f"{indent}input {grp.name}({vals})")
    for v in g.values:
        if v.role == "const":
            lines.append(f"{indent}const %{v.name}: {v.type}")
    for n in g.nodes:
        outs = ", ".join(f"%{o}: {g.value(o).type}" if g.has_value(o) else f"%{o}: ?" for o in n.outputs)
        ins = ", ".join("_" if i is None else f"%{i}" for i in n.inputs)
        attr = " {" + ", ".join(f"{k}={_fmt_attr(v)}" for k, v in n.attrs) + "}" if n.attrs else ""
        src = f"  # {n.source}" if n.source else ""
        lines.append(f"{indent}{outs} = {n.op}({ins}){attr}{src}")
    for grp in g.outputs:
        lines.append(f"{indent}output {grp.name}({', '.join('%' + v for v in grp.values)})")
    if g.inplace:
        lines.append(f"{indent}inplace " + ", ".join(f"%{new} -> %{old}" for new, old in g.inplace))
    for r in g.regions:
        lines.append(f"{indent}region {r.name}:")
        lines.extend(format_graph(r, indent + "  "))
    return lines


def _matmul_configs(per_program) -> list[str]:
    """The ``matmul_configs`` record of schedule.matmul_configs (graph metadata), one line per matmul."""
    lines = ["  matmul_configs (node: batch*MxKxN layout -> config, split-K S, tiles, waves, estimate):"]
    for prog, rows in per_program:
        for row in rows:
            r = dict(row)
            lines.append(f"    {prog} {r.get('node')}: {r.get('shape')} {r.get('layout')} -> {r.get('config')} "
                         f"S={r.get('split_k')} {r.get('tiles')} tiles {r.get('waves')} waves ~{r.get('cost_us')} us")
    return lines


def _aliases(per_program: tuple, shown: int = 12) -> list[str]:
    """The schedule's alias prefixes (latch_schedule.fusion): views read in place, per program."""
    lines = []
    for item in per_program:
        if not (isinstance(item, tuple) and len(item) == 2):
            continue
        prog, rows = item
        parts = [f"%{r[0]} = %{r[1]}+{r[2]}B (g{r[3]})" for r in rows[:shown] if isinstance(r, tuple) and len(r) == 4]
        more = f" ... (+{len(rows) - shown})" if len(rows) > shown else ""
        lines.append(f"  aliases {prog}: {len(rows)} views read in place: " + ", ".join(parts) + more)
    return lines


def format_schedule(s: ScheduleSection, *, max_sms: int = 8, max_instrs: int = 12) -> list[str]:
    lines = [f"schedule: strategy {s.strategy}, {s.num_sms} SMs"]
    for k, v in s.stats:
        if k == "matmul_configs" and isinstance(v, tuple):
            lines.extend(_matmul_configs(v))
            continue
        if k == "aliases" and isinstance(v, tuple):
            lines.extend(_aliases(v))
            continue
        lines.append(f"  {k}: {v}")
    for ps in s.programs:
        kinds = _Counter(i[0] for sm in ps.sms for i in sm)
        lines.append(
            f"  program {ps.program}: {len(ps.groups)} groups, {len(ps.tasks)} tasks, "
            f"{ps.num_barriers} barriers, {len(ps.counters)} counters, "
            f"{kinds[WAIT]} waits, {kinds[SIGNAL]} signals"
        )
        phases = sorted({t.phase for t in ps.tasks if t.phase >= 0})
        if phases:
            per = _Counter(t.phase for t in ps.tasks)
            lines.append("    phases: " + ", ".join(f"{ph}:{per[ph]}" for ph in phases[:40]) + (" ..." if len(phases) > 40 else ""))
        for sm_i, sm in enumerate(ps.sms[:max_sms]):
            parts = []
            for ins in sm[:max_instrs]:
                if ins[0] == TASK:
                    t = ps.tasks[ins[1]]
                    parts.append(f"t{t.id}(g{t.group})")
                elif ins[0] == BARRIER:
                    parts.append(f"|B{ins[1]}|")
                elif ins[0] == WAIT:
                    parts.append(f"wait(c{ins[1]}>={ins[2]})")
                elif ins[0] == SIGNAL:
                    parts.append(f"sig(c{ins[1]})")
            more = f" ... (+{len(sm) - max_instrs})" if len(sm) > max_instrs else ""
            lines.append(f"    SM{sm_i:>3}: " + " ".join(parts) + more)
        if len(ps.sms) > max_sms:
            lines.append(f"    ... {len(ps.sms) - max_sms} more SMs")
    return lines


def format_memory(m: MemorySection, *, max_rows: int = 40) -> list[str]:
    lines = [f"memory: arena {m.arena_bytes} bytes, alignment {m.alignment}"]
    for k, v in m.stats:
        lines.append(f"  {k}: {v}")
    for pm in m.programs:
        lines.append(f"  program {pm.program}: arena {pm.arena_bytes} bytes, peak live {pm.peak_live_bytes} bytes")
        arena = sorted((p for p in pm.placements if p.buffer == "arena"), key=lambda p: (p.offset, p.first))
        for p in arena[:max_rows]:
            lines.append(f"    [{p.offset:>12}, {p.offset + p.nbytes:>12})  live {p.first:>5}..{p.last:<5} %{p.value}")
        if len(arena) > max_rows:
            lines.append(f"    ... {len(arena) - max_rows} more arena placements")
    return lines


def format_document(doc: Document, *, source: str = "") -> str:
    from .document import SCHEMA_VERSION

    lines = [f"# latch document {source} (schema {SCHEMA_VERSION[0]}.{SCHEMA_VERSION[1]}); sections: {', '.join(sorted(doc.sections())) or 'none'}"]
    if doc.provenance:
        lines.append("# passes: " + " -> ".join(p.name for p in doc.provenance))
    for p in doc.provenance:
        detail = f"  {p.detail}" if p.detail else ""
        lines.append(f"# pass {p.name}: started {p.started}, took {p.seconds * 1000:.1f} ms{detail}")
    if doc.graph is not None:
        if doc.graph.layout:
            lines.append("layout " + ", ".join(f"%{v.name}: {v.type} ({v.role})" for v in doc.graph.layout))
        for k, v in doc.graph.metadata:
            if k == "matmul_configs" and isinstance(v, tuple):
                lines.extend(_matmul_configs(v))
                continue
            lines.append(f"meta {k} = {_fmt_attr(v)}")
        for g in doc.graph.programs:
            lines.append(f"program {g.name}:")
            lines.extend(format_graph(g, "  "))
    if doc.schedule is not None:
        lines.extend(format_schedule(doc.schedule))
    if doc.memory is not None:
        lines.extend(format_memory(doc.memory))
    if doc.build is not None:
        b = doc.build
        lines.append(f"build: {b.directory} key {b.key[:16]} units {len(b.units)} toolkit {b.toolkit}")
    return "\n".join(lines)
