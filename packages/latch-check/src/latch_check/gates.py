"""Numerical gates: relative L2 error per tensor group, printed as a table (CONTRACTS.md section 5).

    rel_l2(out, ref) = ||out - ref|| / ||ref||     (in float64; 0 when both are exactly zero,
                                                   inf when only ref is zero; NaN or inf anywhere
                                                   in out or ref makes it NaN, and NaN fails)

Groups of a training update: ``loss``, ``grad <param>`` (one gate per gradient), ``new_params``,
``param_update`` (new - old params: far more sensitive than the params themselves, whose
relative error is diluted by their size), ``new_state``, ``metric <name>``. A gate passes when
rel_l2 <= its threshold; a failed gate stays in the table, marked FAIL.
"""

from __future__ import annotations

import math
from typing import Iterable, Mapping, Sequence

import attrs
import torch

from latch_core.ir import Graph

FP64_THRESHOLD = 1e-10  # FP64 against FP64: rounding differences only


def rel_l2(out: torch.Tensor | Sequence[torch.Tensor], ref: torch.Tensor | Sequence[torch.Tensor]) -> float:
    outs = [out] if isinstance(out, torch.Tensor) else list(out)
    refs = [ref] if isinstance(ref, torch.Tensor) else list(ref)
    if len(outs) != len(refs):
        raise ValueError(f"rel_l2: {len(outs)} outputs against {len(refs)} references")
    num = den = 0.0
    for o, r in zip(outs, refs):
        if tuple(o.shape) != tuple(r.shape):
            raise ValueError(f"rel_l2: shapes differ: {list(o.shape)} vs {list(r.shape)}")
        o = o.detach().to(torch.float64).reshape(-1)
        r = r.detach().to(torch.float64).reshape(-1)
        if not (torch.isfinite(o).all() and torch.isfinite(r).all()):
            return math.nan
        num += float(((o - r) ** 2).sum())
        den += float((r ** 2).sum())
    if den == 0.0:
        return 0.0 if num == 0.0 else math.inf
    return math.sqrt(num) / math.sqrt(den)


@attrs.frozen
class Gate:
    group: str
    rel_l2: float
    threshold: float
    numel: int
    step: int | None = None

    @property
    def passed(self) -> bool:
        return not math.isnan(self.rel_l2) and self.rel_l2 <= self.threshold


@attrs.frozen
class GateTable:
    title: str
    gates: tuple[Gate, ...] = attrs.field(converter=tuple)

    @property
    def passed(self) -> bool:
        return all(g.passed for g in self.gates)

    def failures(self) -> list[Gate]:
        return [g for g in self.gates if not g.passed]

    def format(self) -> str:
        has_step = any(g.step is not None for g in self.gates)
        head = (["step"] if has_step else []) + ["group", "elements", "rel L2", "gate", "result"]
        rows = []
        for g in self.gates:
            row = ([str(g.step)] if has_step else []) + [
                g.group, f"{g.numel:,}", _num(g.rel_l2), f"{g.threshold:.0e}", "ok" if g.passed else "FAIL"]
            rows.append(row)
        widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(head)]
        right = {"elements", "rel L2", "gate", "step"}

        def line(cells):
            return "  ".join(c.rjust(w) if h in right else c.ljust(w) for c, w, h in zip(cells, widths, head)).rstrip()

        out = [self.title, line(head), line(["-" * w for w in widths])]
        out += [line(r) for r in rows]
        n_fail = len(self.failures())
        out.append(f"{len(self.gates)} gates, " + ("all passed" if not n_fail else f"{n_fail} FAILED"))
        return "\n".join(out)

    def __str__(self) -> str:
        return self.format()


def _num(x: float) -> str:
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf"
    return f"{x:.2e}"


def _threshold(thresholds: float | Mapping[str, float], group: str, default: float) -> float:
    if isinstance(thresholds, (int, float)):
        return float(thresholds)
    kind = group.split(" ")[0]
    return float(thresholds.get(group, thresholds.get(kind, default)))


def program_gates(graph: Graph, outputs: Mapping[str, torch.Tensor], reference: Mapping[str, torch.Tensor], *,
                  thresholds: float | Mapping[str, float] = FP64_THRESHOLD, step: int | None = None,
                  previous: Mapping[str, torch.Tensor] | None = None) -> list[Gate]:
    """Gates for one run of ``graph``: each output group against ``reference`` (same value names).

    ``thresholds`` is one number or ``{group or kind: number}`` (kinds: loss, grad, new_params,
    param_update, new_state, metric). ``previous`` (the program's inputs) adds the ``param_update``
    gate on new - old params.
    """
    default = thresholds if isinstance(thresholds, (int, float)) else FP64_THRESHOLD
    gates: list[Gate] = []

    def add(group: str, names: Iterable[str], diff_from: Mapping[str, str] | None = None) -> None:
        names = list(names)
        if not names:
            return
        missing = [n for n in names if n not in reference or n not in outputs]
        if missing:
            raise KeyError(f"gate {group!r}: no output or reference for {missing[:4]}")
        if diff_from is None:
            outs = [outputs[n] for n in names]
            refs = [reference[n] for n in names]
        else:
            outs = [outputs[n].double() - previous[diff_from[n]].double() for n in names]
            refs = [reference[n].double() - previous[diff_from[n]].double() for n in names]
        gates.append(Gate(group, rel_l2(outs, refs), _threshold(thresholds, group, default),
                          sum(o.numel() for o in outs), step))

    groups = {g.name: list(g.values) for g in graph.outputs}
    add("loss", groups.get("loss", []))
    for n in groups.get("grads", []):
        add(f"grad {n.removeprefix('grad.')}", [n])
    add("new_params", groups.get("new_params", []))
    if previous is not None:
        pairs = dict(graph.inplace)
        names = [n for n in groups.get("new_params", []) if n in pairs and pairs[n] in previous]
        add("param_update", names, {n: pairs[n] for n in names})
    add("new_state", groups.get("new_state", []))
    for n in groups.get("metrics", []):
        add(f"metric {n.removeprefix('metric.')}", [n])
    return gates
