"""Pass ``memory.weight_copies``: each weight's BF16 copy is optimizer state, written by the update.

After the numerical policy (``memory.policy``, ``moe.store_operands``, ``memory.fuse_cross_entropy``)
every update starts by casting each FP32 weight its matrix products read to BF16:

    p.bf16 = cast(p) {dtype bf16}         # 4 B read + 2 B written per parameter, every update

(TinyMoE-200M: 49 such casts, 207.7M parameters, 1.25 GB per update, 4,796 tasks). The weights
change only in the optimizer, which already reads and writes ``p``; so this pass makes the copy
STATE, the way the moments are:

- a layout value ``p.bf16`` (role ``state``, the low dtype, ``p``'s shape) is an input of every
  program (in its ``state`` group, like the moments and the microbatch accumulators);
- every ``cast(p) {dtype}`` of a parameter is removed and its readers read the state input;
- a program that updates ``p`` (an in-place pair ``new.p -> p``) computes
  ``new.p.bf16 = cast(new.p)`` right after ``new.p``, outputs it (group ``weight_copies``) and
  writes it in place over ``p.bf16``: ``schedule``'s sibling fusion joins that cast to the group
  that computes ``new.p`` (AdamW's flat pass), which then writes 2 B more per parameter instead of
  a separate pass reading 4 B and writing 2 B in the next update.

FP32 master weights and both moments stay. The invariant the runtime keeps is ``p.bf16 ==
cast(p)`` at every update boundary: the copy is created as ``cast(p)`` before the first update
(``latch_capture.bind_inputs``, ``latch_codegen_h100.runtime``) and every program that changes
``p`` rewrites it. With microbatches, the ``accumulate`` programs read the copy and the
``accumulate_and_update`` program writes it once. Under the FP64 interpreter a cast never rounds
(``latch::cast``'s reference), so there the copy is ``p`` itself, exactly what the program read
before the pass: the reference computes the same update with and without it.

Only top-level nodes are rewritten (a region of a ``latch::repeat`` reads its own inputs, not the
layout). A cast whose output is a program output is left alone. The section's metadata
``memory.weight_copies`` records ``copies`` (copy -> parameter), ``dtypes`` (copy -> dtype) and
per program the casts removed and the copies written; ``Request(weight_copies=False)``
(``compile --no-weight-copies``) leaves the pass out.
"""

from __future__ import annotations

from typing import Mapping

import attrs

from latch_core.document import Document
from latch_core.errors import UserError
from latch_core.ir import PARAM, STATE, Graph, GraphSection, Group, Node, Value, fresh_name

CAST = "latch::cast"
LOW = ("bf16", "f16")
META = "memory.weight_copies"
OUTPUT_GROUP = "weight_copies"
STATE_GROUP = "state"


class WeightCopyError(UserError, ValueError):
    pass


def copies_of(section: GraphSection) -> dict[str, str]:
    """copy -> parameter, as the pass recorded it (empty when the pass did not run)."""
    meta = section.meta(META)
    if not meta:
        return {}
    return dict(dict(meta).get("copies", ()))


def _param_casts(g: Graph, params: set[str]) -> list[Node]:
    outs = set(g.output_names())
    return [n for n in g.nodes if n.op == CAST and len(n.inputs) == 1 and n.inputs[0] in params
            and n.attr("dtype") in LOW and g.value(n.inputs[0]).dtype not in LOW and n.outputs[0] not in outs]


def _rewrite(g: Graph, copy_of: Mapping[tuple[str, str], str], copy_type: Mapping[str, Value]) -> tuple[Graph, int, int]:
    """One program: casts of parameters replaced by the state inputs, the copies of updated
    parameters written. Returns (graph, casts removed, copies written)."""
    params = {v for grp in g.inputs if grp.name == "params" for v in grp.values}
    removed = {n.name: copy_of[(n.inputs[0], n.attr("dtype"))] for n in _param_casts(g, params)}
    rename = {n.outputs[0]: removed[n.name] for n in g.nodes if n.name in removed}
    new_of = {old: new for new, old in g.inplace}  # parameter -> its new value
    names = {v.name for v in g.values} | {n.name for n in g.nodes} | set(copy_type)
    writes: dict[str, tuple[str, str, str]] = {}  # new.p -> (copy state, new copy value, dtype)
    for (p, dt), c in copy_of.items():
        if p in new_of and g.has_value(new_of[p]):
            writes[new_of[p]] = (c, fresh_name(names, f"new.{c}"), dt)
    values = [v for v in g.values if v.name not in rename]
    values += [copy_type[c] for c in sorted(set(copy_of.values()), key=list(copy_type).index)]
    producers = g.producers()
    nodes: list[Node] = []
    for n in g.nodes:
        if n.name in removed:
            continue
        if any(v in rename for v in n.inputs if v is not None):
            n = attrs.evolve(n, inputs=[rename.get(v, v) if v is not None else None for v in n.inputs])
        nodes.append(n)
        for o in n.outputs:
            if o in writes:
                c, new_c, dt = writes[o]
                nodes.append(Node(fresh_name(names, f"cast.{new_c}"), CAST, (o,), (new_c,), {"dtype": dt},
                                  source=producers[o].source))
                values.append(Value(new_c, g.value(o).shape, dt))
    for new_p, (c, new_c, dt) in writes.items():
        if new_p not in producers:  # an in-place output that is a program input passed through
            raise WeightCopyError(f"memory.weight_copies: program {g.name!r} writes {new_p!r} in place, but no node "
                                  "computes it; such a program cannot keep its weight copies")
    copies = sorted(set(copy_of.values()), key=list(copy_type).index)
    inputs = list(g.inputs)
    if any(grp.name == STATE_GROUP for grp in inputs):
        inputs = [Group(grp.name, tuple(grp.values) + tuple(copies)) if grp.name == STATE_GROUP else grp
                  for grp in inputs]
    else:
        inputs.append(Group(STATE_GROUP, tuple(copies)))
    outputs = [grp for grp in g.outputs if grp.name != OUTPUT_GROUP]
    written = [w[1] for w in writes.values()]
    if written:
        outputs.append(Group(OUTPUT_GROUP, tuple(written)))
    inplace = tuple(g.inplace) + tuple((w[1], w[0]) for w in writes.values())
    out = attrs.evolve(g, values=values, nodes=nodes, inputs=inputs, outputs=outputs, inplace=inplace)
    return out, len(removed), len(written)


def make_copies(section: GraphSection) -> tuple[GraphSection, dict]:
    """The pass on a graph section; returns the new section and its report (module docstring)."""
    if section.meta(META):
        raise WeightCopyError("memory.weight_copies: the document's weight copies are state already (the pass ran); "
                              "run it on a document from before it")
    layout_params = {v.name: v for v in section.layout if v.role == PARAM}
    wanted: dict[tuple[str, str], None] = {}
    for g in section.programs:
        params = {v for grp in g.inputs if grp.name == "params" for v in grp.values}
        for n in _param_casts(g, params):
            wanted[(n.inputs[0], n.attr("dtype"))] = None
    if not wanted:
        meta = dict(section.metadata)
        meta[META] = {"copies": {}, "dtypes": {}, "programs": {g.name: {"casts_removed": 0, "copies_written": 0}
                                                               for g in section.programs}}
        return attrs.evolve(section, metadata=meta), meta[META]
    names = {v.name for v in section.layout}
    for g in section.programs:
        names |= {v.name for v in g.values} | {n.name for n in g.nodes}
    # the copy keeps the name the cast's output had where it can: ``p.bf16``, what show printed before
    cast_outs = {n.outputs[0] for g in section.programs
                 for n in _param_casts(g, {v for grp in g.inputs if grp.name == "params" for v in grp.values})}
    names -= cast_outs
    copy_of: dict[tuple[str, str], str] = {}
    copy_type: dict[str, Value] = {}
    for p, dt in wanted:
        if p not in layout_params:
            raise WeightCopyError(f"memory.weight_copies: parameter {p!r} is cast to {dt} but is not in the layout")
        c = fresh_name(names, f"{p}.{dt}")
        copy_of[(p, dt)] = c
        copy_type[c] = Value(c, layout_params[p].shape, dt, STATE)
    report_programs = {}
    programs = []
    for g in section.programs:
        g2, removed, written = _rewrite(g, copy_of, copy_type)
        programs.append(g2)
        report_programs[g.name] = {"casts_removed": removed, "copies_written": written}
    updated = {old for g in section.programs for _, old in g.inplace}
    stale = [p for (p, _), c in copy_of.items() if p not in updated]
    layout = tuple(section.layout) + tuple(copy_type.values())
    meta = dict(section.metadata)
    meta[META] = {"copies": {c: p for (p, _), c in copy_of.items()},
                  "dtypes": {c: dt for (_, dt), c in copy_of.items()},
                  "programs": report_programs, "never_updated": sorted(stale)}
    return attrs.evolve(section, programs=programs, layout=layout, metadata=meta), meta[META]


def weight_copies_pass(doc: Document) -> tuple[Document, str]:
    """Pass ``memory.weight_copies`` (module docstring); no options."""
    section, report = make_copies(doc.graph)
    n = len(report["copies"])
    numel = sum(v.numel for v in section.layout if v.name in report["copies"])
    per = "; ".join(f"{p}: {r['casts_removed']} casts removed, {r['copies_written']} copies written"
                    for p, r in report["programs"].items())
    detail = f"{n} weight copies as state ({numel:,} elements)" + (f"; {per}" if n else "")
    return attrs.evolve(doc, graph=section, schedule=None, memory=None, build=None), detail
