"""The pass ``schedule.fuse_views``: views never materialise inside elementwise chains.

A fusable view (reshape, permute, slice, select, expand: each has an exact index map,
:mod:`latch_schedule.tiling_ops`) folds into the group that reads it, so the fused body reads the
view's operand through the index map and the view costs nothing (:mod:`latch_schedule.fusion`). A
node can join only one group, though, and fusion lets a node join only when *every* reader of it
is in that one group: a view read by several groups (the q/k/v permute of the attention's input
product, read by RoPE's q chain, its k chain and the v operand; the halves of RoPE's input, read
by two pointwise groups that only horizontal fusion merges later) stayed a copy task of its own,
writing the bytes every reader then read back (results/gpu.md run 14: such view bodies ran ~7x
slower than the cost model).

This pass gives each reading node that *absorbs* a view its own copy of the view node
(``<node>.v<k>``, output ``<value>.v<k>``, placed right after the original), so each copy folds
into its reader's group as an index map; readers that do not absorb views (a matmul, the attention,
a reduction, ...) keep sharing the original, which stays what it was before (a copy task, or an
alias prefix: :mod:`latch_schedule.aliases`). A reader absorbs a view when fusion would take the
view into the reader's group given that the reader is the view's only reader:
- a pointwise node (``elementwise``/``copy`` tag: fusion's view -> elementwise edge);
- a ``latch::concat`` (fusion's operand -> concat edge);
- a fusable view that itself absorbs into all its readers (views are visited readers first, so a
  chain of views is cloned along its whole length).

Why this is free and legal:
- An index map costs nothing to recompute, and the copy computes the same op on the same operand:
  the program's semantics and the FP64 reference are unchanged, and no producer is recomputed (a
  view computes nothing; fusion never folds a pointwise producer into an ``expand``, so an
  expand's copies re-read, they do not recompute).
- Convexity and order are fusion's: the clones are ordinary nodes placed after the original, each
  with one reader, and fusion's rules (reverse graph order, every reader in one group) decide
  where they go. A clone that does not end up in its reader's group (fusion refused the edge for a
  reason this pass does not see) is a copy task like the original: the pass never makes more
  copies than absorbing readers, and only when the view had a reader of its own besides.
- The bytes: where the view was materialised, its readers read the copy; now each reads the view's
  operand through the map (the same count for an injective view; for an expand, the smaller
  operand), and the copy's write and read disappear.

First, each ``select`` of a ``permute`` is moved before it (:func:`select_before_permute`): the
same elements, but the q/k/v unbind's v, read by the attention (which does not absorb views),
then copies only its own third of the product's output instead of the whole permuted value.

Never cloned: a view whose output is a program output (it must be written), a view with a single
reader (nothing to gain). Graph metadata ``schedule.fuse_views``: per program, the views cloned and
the clones made. Pure; a changed graph drops any schedule, memory plan and build.
"""

from __future__ import annotations

import attrs

from latch_core.document import Document
from latch_core.ir import Graph, Node, fresh_name
from latch_core.registry import Registry

from .fusion import CONCAT, FUSABLE_VIEWS, is_pointwise


def select_before_permute(graph: Graph) -> tuple[Graph, int]:
    """Each ``select(permute(x, perm), d, i)`` rewritten as ``permute(select(x, perm[d], i), perm')``
    (``perm'``: ``perm`` without position d, renumbered): the same elements in the same order, and
    a permute left for one reader that does not absorb views (the attention reading v) copies only
    the selected part, not the whole permuted value (the q/k/v unbind: a third of the bytes). A
    permute no node reads any more, and not a program output, is dropped. Returns the graph and the
    number of selects rewritten."""
    outputs = set(graph.output_names())
    values = {v.name: v for v in graph.values}
    names = {n.name for n in graph.nodes} | set(values)
    producer = {o: n for n in graph.nodes for o in n.outputs}
    nodes: list[Node] = []
    done = 0
    for n in graph.nodes:
        p = producer.get(n.inputs[0]) if n.op == "latch::select" and n.inputs and n.inputs[0] else None
        if p is None or p.op != "latch::permute" or p.outputs[0] in outputs or len(n.outputs) != 1:
            nodes.append(n)
            continue
        perm = [int(a) for a in dict(p.attrs)["perm"]]
        a = dict(n.attrs)
        d, idx = int(a["dim"]) % len(perm), int(a["index"])
        x = p.inputs[0]
        src = perm[d]
        xs = values[x].shape
        inner = fresh_name(names, f"{n.outputs[0]}.sel")
        values[inner] = attrs.evolve(values[n.outputs[0]], name=inner, shape=tuple(xs[:src]) + tuple(xs[src + 1:]))
        sel = attrs.evolve(n, name=fresh_name(names, f"{n.name}.sel"), inputs=(x,), outputs=(inner,),
                           attrs={"dim": src, "index": idx})
        rest = [q - (q > src) for j, q in enumerate(perm) if j != d]
        per = attrs.evolve(p, name=fresh_name(names, f"{n.name}.perm"), inputs=(inner,), outputs=n.outputs,
                           attrs={"perm": tuple(rest)})
        nodes += [sel, per]
        done += 1
    if not done:
        return graph, 0
    read = {v for n in nodes for v in n.inputs if v is not None}
    dead = {n.outputs[0] for n in nodes if n.op == "latch::permute" and n.outputs[0] not in read
            and n.outputs[0] not in outputs}
    nodes = [n for n in nodes if not (n.outputs and n.outputs[0] in dead)]
    vals = tuple(v for v in values.values() if v.name not in dead)
    return attrs.evolve(graph, values=vals, nodes=tuple(nodes)), done


def clone_fusable_views(graph: Graph, ops: Registry | None) -> tuple[Graph, dict]:
    """``graph`` with each multi-reader fusable view cloned per absorbing reader, and a report."""
    outputs = set(graph.output_names())
    values = {v.name: v for v in graph.values}
    by_name = {n.name: n for n in graph.nodes}
    names = set(by_name) | set(values)
    readers: dict[str, list[str]] = {}
    for n in graph.nodes:
        for x in dict.fromkeys(v for v in n.inputs if v is not None):
            readers.setdefault(x, []).append(n.name)

    def spec(op: str):
        return ops.get(op) if ops is not None and op in ops else None

    def is_view(n: Node) -> bool:
        s = spec(n.op)
        return n.op in FUSABLE_VIEWS and s is not None and not is_pointwise(s) and len(n.outputs) == 1 \
            and len([v for v in n.inputs if v is not None]) == 1

    absorbs_all: dict[str, bool] = {}  # view node -> every reader absorbs it (decided readers first)

    def absorbs(rname: str) -> bool:
        r = by_name[rname]
        if is_pointwise(spec(r.op)) or r.op == CONCAT:
            return True
        return is_view(r) and absorbs_all.get(r.name, False)

    after: dict[str, list[Node]] = {}
    cloned, made = [], 0
    for n in reversed(graph.nodes):  # readers first
        if not is_view(n):
            continue
        o = n.outputs[0]
        rs = readers.get(o, [])
        if o in outputs or not rs:
            absorbs_all[n.name] = False
            continue
        take = [r for r in rs if absorbs(r)]
        absorbs_all[n.name] = len(take) == len(rs)
        if len(rs) < 2 or not take:
            continue
        keep = [r for r in rs if r not in take]
        # the original goes to the non-absorbing readers if any, else to the first absorbing one
        give = take if keep else take[1:]
        x = next(v for v in n.inputs if v is not None)
        clones = []
        for k, rname in enumerate(give, start=1):
            v = fresh_name(names, f"{o}.v{k}")
            values[v] = attrs.evolve(values[o], name=v)
            cname = fresh_name(names, f"{n.name}.v{k}")
            c = attrs.evolve(n, name=cname, outputs=(v,))
            r = by_name[rname]
            by_name[rname] = attrs.evolve(r, inputs=tuple(v if y == o else y for y in r.inputs))
            readers[v] = [rname]
            absorbs_all[cname] = True
            clones.append(c)
            by_name[cname] = c
        readers[o] = keep if keep else take[:1]
        readers[x] = readers.get(x, []) + [c.name for c in clones]
        after[n.name] = clones
        cloned.append(n.name)
        made += len(clones)
    if not cloned:
        return graph, {}
    nodes = []
    for n in graph.nodes:
        nodes.append(by_name[n.name])
        nodes.extend(by_name[c.name] for c in after.get(n.name, ()))
    return attrs.evolve(graph, values=tuple(values.values()), nodes=tuple(nodes)), \
        {"views": len(cloned), "clones": made}


def fuse_views_pass(doc: Document, ops: Registry | None = None, **options):
    """Pass ``schedule.fuse_views`` (option ``ops``: the op registry, default the plugins'); the
    provenance detail counts the clones."""
    if options:
        raise TypeError(f"schedule.fuse_views takes only the option ops, got {sorted(options)}")
    if ops is None:
        from latch_core.plugins import registries

        ops = registries().ops
    programs, report = [], {}
    for g in doc.graph.programs:
        g1, swapped = select_before_permute(g)
        g2, r = clone_fusable_views(g1, ops)
        programs.append(g2)
        if swapped:
            r = {**(r or {"views": 0, "clones": 0}), "selects_before_permutes": swapped}
        if r:
            report[g.name] = r
    if not report:
        return doc, "no fusable view read by several absorbing nodes"
    meta = dict(doc.graph.metadata)
    meta["schedule.fuse_views"] = report
    graph = attrs.evolve(doc.graph, programs=programs, metadata=meta)
    n = sum(r["clones"] for r in report.values())
    v = sum(r["views"] for r in report.values())
    k = sum(r.get("selects_before_permutes", 0) for r in report.values())
    return attrs.evolve(doc, graph=graph, schedule=None, memory=None, build=None), \
        f"{k} select(s) moved before their permute; {v} fusable view(s) cloned per absorbing reader ({n} clones)"
