"""The pass ``memory.remat``: recompute cheap forward values in the backward under a budget.

The estimate (before any schedule exists) is liveness over the node order: an intermediate value
lives from the node that defines it to its last consumer (to the end when it is a program output);
the *peak* is the largest sum of live bytes at one node. Inputs, constants and in-place outputs
(new params and state) are not counted: they live in external buffers and the constant area
whatever the pass does.

A step: at a peak position ``p``, pick a node whose outputs are live across ``p`` but unused there
(defined before ``p``, consumed again after it) and whose op is cheap (tags ``elementwise``,
``view``, ``norm`` by default; never ``random``). Insert a clone of it just before its first
consumer after ``p`` and let those later consumers read the clone; the original's outputs now die
at their last use before ``p``. Operands of the clone that are themselves dead at ``p`` and made by
cheap nodes are recomputed with it (a short chain, ``depth`` levels): recomputing a norm's output
from a pre-activation that is kept anyway needs the activation in between recomputed too. The clone's operands must then live until the clone, which can cost
more than it saves, so each candidate is scored by the peak it would leave (range-max over the
current profile plus the step's piecewise-constant change) and the best one is kept only if it
lowers ``(peak, number of positions at the peak)``. Steps repeat until the peak meets
``budget_bytes`` or no candidate helps. A clone computes the same op on the same operands, so
the graph's results are unchanged (checked against the FP64 interpreter in the tests).

Results go to the graph metadata under ``memory.remat``: per program the budget, the peak before
and after, whether the budget was met, the steps taken and how many nodes were recomputed (cloned;
an original whose readers all moved to its clone is dropped, so the node count grows by less).
"""

from __future__ import annotations

from typing import Iterable

import attrs

from latch_core.document import Document
from latch_core.ir import CONST, Graph, GraphSection, Node, Value
from latch_core.registry import ELEMENTWISE, NORM, RANDOM, VIEW, Registry

from .policy import REPEAT_OP  # a repeated region: never recomputed, its body left as it is
from latch_core.errors import UserError

DEFAULT_TAGS = (ELEMENTWISE, VIEW, NORM)


class RematError(UserError, ValueError):
    pass


# --------------------------------------------------------------------------------------------
# The node-order liveness estimate

@attrs.define
class Estimate:
    nodes: list[Node]
    defs: dict[str, int]  # value -> index of its defining node
    last: dict[str, int]  # value -> index of its last consumer (len(nodes) when an output)
    uses: dict[str, list[int]]  # value -> sorted consumer indices
    sizes: dict[str, int]
    profile: list[int]  # live bytes at each node index

    @property
    def peak(self) -> int:
        return max(self.profile, default=0)


def estimate(g: Graph, nodes: list[Node] | None = None) -> Estimate:
    nodes = list(g.nodes if nodes is None else nodes)
    n = len(nodes)
    outputs = set(g.output_names())
    defs, uses = {}, {}
    for i, nd in enumerate(nodes):
        for o in nd.outputs:
            defs[o] = i
        for x in nd.inputs:
            if x is not None and x in defs:
                lst = uses.setdefault(x, [])
                if not lst or lst[-1] != i:
                    lst.append(i)
    inplace_new = {new for new, _ in g.inplace}  # written into their old value's buffer, not the arena
    sizes = {v: 0 if v in inplace_new else _nbytes(g, v) for v in defs}
    last = {}
    diff = [0] * (n + 2)
    for v, d in defs.items():
        end = n if v in outputs else (uses[v][-1] if v in uses else d)
        last[v] = end
        diff[d] += sizes[v]
        diff[min(end, n - 1) + 1] -= sizes[v]
    profile, cur = [], 0
    for i in range(n):
        cur += diff[i]
        profile.append(cur)
    return Estimate(nodes, defs, last, uses, sizes, profile)


def _nbytes(g: Graph, v: str) -> int:
    return g.value(v).nbytes


class _RangeMax:
    """Sparse table: max of a list over [lo, hi] in O(1)."""

    def __init__(self, xs: list[int]):
        self.t = [list(xs)]
        k = 1
        while 2 * k <= len(xs):
            prev = self.t[-1]
            self.t.append([max(prev[i], prev[i + k]) for i in range(len(xs) - 2 * k + 1)])
            k *= 2

    def query(self, lo: int, hi: int) -> int:
        if lo > hi:
            return -(1 << 62)
        j = (hi - lo + 1).bit_length() - 1
        row = self.t[j]
        return max(row[lo], row[hi - (1 << j) + 1])


# --------------------------------------------------------------------------------------------
# One step


@attrs.frozen
class Step:
    chain: tuple[int, ...]  # indices of the nodes to clone, in order; the last is the head
    at: int  # index of the head's first consumer after the peak: the clones go just before it


def _chain(est: Estimate, head: int, p: int, eligible, depth: int) -> list[int]:
    """The head plus the cheap producers of operands that are dead at ``p`` (cloning them too
    saves extending those operands across the peak), up to ``depth`` levels."""
    chain, frontier = {head}, [(head, 0)]
    while frontier:
        i, d = frontier.pop()
        if d >= depth:
            continue
        for x in est.nodes[i].inputs:
            if x is None or x not in est.defs or est.last[x] >= p:
                continue
            j = est.defs[x]
            if j not in chain and eligible(est.nodes[j]):
                chain.add(j)
                frontier.append((j, d + 1))
    return sorted(chain)


def _candidate_changes(est: Estimate, chain: list[int], p: int, n_out: set[str]):
    """(at, intervals of change) for cloning ``chain`` (head last) across peak position p, or None."""
    head = est.nodes[chain[-1]]
    late, keep_end = [], {}
    for o in head.outputs:
        if o in n_out:
            return None
        us = est.uses.get(o, [])
        if p in us:
            return None
        early = [u for u in us if u < p]
        late += [u for u in us if u > p]
        keep_end[o] = early[-1] if early else chain[-1]
    if not late:
        return None
    q = min(late)
    changes = []  # (lo, hi, delta) over the current indices
    for o in head.outputs:
        # o stays live only up to keep_end; the clone's copy lives from q to the old end
        lo, hi = keep_end[o] + 1, q - 1
        if lo <= hi:
            changes.append((lo, hi, -est.sizes[o]))
    made = {o for j in chain for o in est.nodes[j].outputs}
    operands = dict.fromkeys(x for j in chain for x in est.nodes[j].inputs if x is not None and x not in made)
    for x in operands:
        if x in est.defs and est.last[x] < q:
            lo, hi = est.last[x] + 1, q - 1
            if lo <= hi:
                changes.append((lo, hi, est.sizes[x]))
    return q, changes


def _peak_after(est: Estimate, rmq: _RangeMax, changes) -> int:
    """Max of profile + changes, by range-max over the pieces the changes cut."""
    n = len(est.profile)
    cuts = {0, n}
    for lo, hi, _ in changes:
        cuts.add(lo)
        cuts.add(hi + 1)
    pts = sorted(c for c in cuts if 0 <= c <= n)
    best = -(1 << 62)
    for a, b in zip(pts, pts[1:]):
        delta = sum(d for lo, hi, d in changes if lo <= a and b - 1 <= hi)
        best = max(best, rmq.query(a, b - 1) + delta)
    return best


def _apply(g: Graph, est: Estimate, step: Step, names: set[str], k: int) -> tuple[list[Node], list[Value]]:
    nodes = list(est.nodes)
    suffix = f".remat{k}"
    rename: dict[str, str] = {}
    clones, new_values = [], []
    for j in step.chain:
        orig = nodes[j]
        for o in orig.outputs:
            rename[o] = _fresh(o + suffix, names)
            new_values.append(attrs.evolve(g.value(o), name=rename[o]))
        clones.append(attrs.evolve(
            orig, name=_fresh(orig.name + suffix, names), outputs=tuple(rename[o] for o in orig.outputs),
            inputs=tuple(rename.get(x, x) if x is not None else None for x in orig.inputs)))
    head_out = set(nodes[step.chain[-1]].outputs)
    for j in range(step.at, len(nodes)):
        nd = nodes[j]
        if any(x in head_out for x in nd.inputs):
            nodes[j] = attrs.evolve(nd, inputs=tuple(rename[x] if x in head_out else x for x in nd.inputs))
    nodes[step.at:step.at] = clones
    for j in reversed(step.chain):  # an original nobody reads any more was only moved: drop it
        orig = est.nodes[j]
        if not any(x in orig.outputs for nd in nodes for x in nd.inputs):
            nodes.remove(orig)
    return nodes, new_values


def _fresh(name: str, names: set[str]) -> str:
    base, i = name, 1
    while name in names:
        name = f"{base}_{i}"
        i += 1
    names.add(name)
    return name


def remat_program(g: Graph, ops: Registry, budget_bytes: int, *, tags: Iterable[str] = DEFAULT_TAGS,
                  max_steps: int = 10000, depth: int = 3) -> tuple[Graph, dict]:
    cheap = frozenset(tags)
    outputs = set(g.output_names())
    est = estimate(g)
    before = est.peak
    values = list(g.values)
    names = {v.name for v in values} | {nd.name for nd in g.nodes}
    for nd in g.nodes:
        if nd.op not in ops and nd.op != REPEAT_OP:
            src = f" (from {nd.source})" if nd.source else ""
            raise RematError(f"memory.remat: program {g.name!r} node {nd.name!r}{src} uses op {nd.op!r}, which no "
                             "installed plugin registers; install the plugin that provides it")
    eligible_op = {op: op != REPEAT_OP and bool(ops.get(op).tags & cheap) and RANDOM not in ops.get(op).tags
                   for op in {nd.op for nd in g.nodes}}

    def eligible(nd: Node) -> bool:
        return eligible_op[nd.op]

    steps = cloned = 0
    work = g
    while steps < max_steps and est.peak > budget_bytes:
        peak = est.peak
        at_peak = [i for i, x in enumerate(est.profile) if x == peak]
        p = at_peak[0]
        rmq = _RangeMax(est.profile)
        options = []
        for i in range(p):
            nd = est.nodes[i]
            if not eligible(nd) or not any(est.last[o] > p for o in nd.outputs):
                continue
            chain = _chain(est, i, p, eligible, depth)
            ch = _candidate_changes(est, chain, p, outputs)
            if ch is None:
                continue
            q, changes = ch
            gain = -sum(d for lo, hi, d in changes if lo <= p <= hi)
            options.append((_peak_after(est, rmq, changes), -gain, len(chain), tuple(chain), q))
        options.sort()
        accepted = False
        for new_peak, _, _, chain, q in options[:8]:
            if new_peak > peak:
                break
            nodes, new_vals = _apply(work, est, Step(chain, q), names, steps)
            trial_graph = attrs.evolve(work, values=values + new_vals, nodes=nodes)
            trial = estimate(trial_graph)
            if (trial.peak, trial.profile.count(trial.peak)) < (peak, len(at_peak)):
                values = values + new_vals
                work, est = trial_graph, trial
                steps += 1
                cloned += len(chain)
                accepted = True
                break
        if not accepted:
            break
    # drop values that no node defines any more (originals moved by a clone)
    defined = set(work.input_names()) | {v.name for v in work.values if v.role == CONST}
    defined |= {o for nd in work.nodes for o in nd.outputs}
    work = attrs.evolve(work, values=[v for v in values if v.name in defined])
    stats = {"budget_bytes": int(budget_bytes), "peak_before": before, "peak_after": est.peak,
             "met": est.peak <= budget_bytes, "steps": steps, "recomputed": cloned, "nodes_before": len(g.nodes),
             "nodes_after": len(work.nodes)}
    return work, stats


def remat_section(section: GraphSection, ops: Registry, budget_bytes: int, **kw) -> tuple[GraphSection, dict]:
    programs, report = [], {}
    for p in section.programs:
        np_, st = remat_program(p, ops, budget_bytes, **kw)
        programs.append(np_)
        report[p.name] = st
    meta = dict(section.metadata)
    meta["memory.remat"] = report
    return attrs.evolve(section, programs=programs, metadata=meta), report


def remat_pass(doc: Document, *, budget_bytes: int | None = None, tags=DEFAULT_TAGS, max_steps: int = 10000,
               strict: bool = False, registry: Registry | None = None) -> Document:
    """Pass ``memory.remat``. ``strict``: fail when the budget cannot be met (default: report it)."""
    if budget_bytes is None or int(budget_bytes) < 0:
        raise RematError(f"memory.remat: option budget_bytes must be a byte count >= 0, got {budget_bytes!r} "
                         f"(compile --remat-budget N, or passes -O memory.remat.budget_bytes=N)")
    if registry is None:
        from latch_core.plugins import registries

        registry = registries().ops
    section, report = remat_section(doc.graph, registry, int(budget_bytes), tags=tuple(tags), max_steps=int(max_steps))
    if strict:
        missed = {k: v for k, v in report.items() if not v["met"]}
        if missed:
            raise RematError("memory.remat: budget not met: " + "; ".join(
                f"program {k!r} peak {v['peak_after']} bytes > budget {v['budget_bytes']} "
                f"(was {v['peak_before']}; {v['recomputed']} nodes recomputed)" for k, v in missed.items())
                + "; raise budget_bytes or allow more op classes in tags")
    return attrs.evolve(doc, graph=section)
