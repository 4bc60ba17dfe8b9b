"""Numerical gates: relative L2 error per tensor group, printed as a table (CONTRACTS.md section 5).

    rel_l2(out, ref) = ||out - ref|| / ||ref||     (in float64; 0 when both are exactly zero,
                                                   inf when only ref is zero; NaN or inf anywhere
                                                   in out or ref makes it NaN, and NaN fails)

Groups of a training update: ``loss``, ``grad <param>`` (one gate per gradient), ``new_params``,
``param_update`` (new - old params: far more sensitive than the params themselves, whose
relative error is diluted by their size), ``new_state``, ``weight_copies`` (the BF16 weight copies the
update writes, ``memory.weight_copies``: against the reference's new weights, which its casts never
round), ``metric <name>``. A gate passes when
rel_l2 <= its threshold; a failed gate stays in the table, marked FAIL.

The ``torch`` column (``program_gates(..., torch_outputs=...)``): PyTorch's own update on the same inputs
(``latch_check.qualify``: BF16 autocast under a BF16 policy), measured against the SAME FP64
reference, group by group; where it exceeds the threshold the table says so (``torch result``
FAIL). At a *fresh* state (``state="fresh"``: the first updates from initialisation) AdamW's update
is about ``-lr * sign(g)`` element by element, so ``param_update`` and ``new_params`` measure how
many near-zero gradient entries change sign under rounding. A gate passes ONLY on its absolute
threshold, at every state (no gate is loosened to pass); where one of those two fails at a fresh
state and the program's error is at most ``FRESH_FACTOR`` x PyTorch's own on the same inputs, the
result says ``FAIL (torch-level)`` and the ratio, so the table shows a gate that PyTorch's own BF16
sits at, not a kernel error; at a *trained* state (``state="trained"``) that is where the update is
gated sharply. docs/GATES.md gives the measurements behind both.

Routing gates (``routing <node>``, :func:`routing_gate`) judge a discrete decision instead: the
experts a program chose per token against the FP64 reference's top-k of the same router
probabilities. A differing choice (a *flip*) passes only as a near-tie; the table prints them
after the relative-L2 rows, with the number of flips, the worst probability gap and its margin.
"""

from __future__ import annotations

import math
from typing import Iterable, Mapping, Sequence

import attrs
import torch

from latch_core.ir import Graph

FP64_THRESHOLD = 1e-10  # FP64 against FP64: rounding differences only
FRESH_FACTOR = 1.5
"""At a fresh state a FAILED ``param_update`` or ``new_params`` gate whose rel_l2 is <= FRESH_FACTOR x
PyTorch's own error on the same inputs is marked ``FAIL (torch-level)``: still a failure (it counts
in the table's FAILED and in the verdict), labelled as what it is (docs/GATES.md: the first AdamW
step is sign-like; measured program/PyTorch ratios 0.3-1.0 on the CPU)."""
SIGN_LIKE = ("param_update", "new_params")  # groups the fresh-state rule applies to
ZERO_GRAD = 1e-12
"""A gradient whose reference norm is at most ZERO_GRAD x the norm of all the reference gradients
is zero by construction (OPT's ``k_proj.bias``: q.(k + b) adds one constant per query row, which
softmax removes): what both sides hold is rounding noise, and noise against noise is no measure.
Its gate measures the error against the norm of all the gradients instead (same threshold): a
program that computes a real value where the exact one is zero still fails it."""


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
    torch_rel: float | None = None  # PyTorch's own update's rel L2 on the same group (None: not measured)
    factor: float | None = None    # fresh-state label: a failure within factor x torch is "torch-level"
    vs_all: bool = False           # zero by construction: rel_l2 is against all the gradients' norm (ZERO_GRAD)

    @property
    def passed(self) -> bool:
        """The absolute threshold, and nothing else, decides."""
        return not math.isnan(self.rel_l2) and self.rel_l2 <= self.threshold

    @property
    def torch_level(self) -> bool:
        """A failed fresh-state sign-like gate within ``factor`` x PyTorch's own error (a label only)."""
        return (not self.passed and self.factor is not None and self.torch_rel is not None
                and not math.isnan(self.torch_rel) and self.torch_rel > 0
                and self.rel_l2 <= self.factor * self.torch_rel)

    @property
    def result_text(self) -> str:
        tail = " (zero by construction: vs all grads)" if self.vs_all else ""
        if self.passed:
            return "ok" + tail
        if self.torch_level:
            return f"FAIL (torch-level: {self.rel_l2 / self.torch_rel:.2f}x torch)"
        return "FAIL" + tail

    @property
    def torch_passed(self) -> bool | None:
        """Whether PyTorch's own update meets the absolute threshold (None: not measured)."""
        if self.torch_rel is None:
            return None
        return not math.isnan(self.torch_rel) and self.torch_rel <= self.threshold

    @property
    def gate_text(self) -> str:
        return f"{self.threshold:.0e}"


# ---------------------------------------------------------------------------------------------
# Routing: near-tie flips of a top-k choice

BF16_SPACING = 2.0 ** -7  # bfloat16 keeps 8 significant bits: its spacing at 1 (relative resolution)
ROUTING_FACTOR = 4.0
"""The routing margin is ``ROUTING_FACTOR * BF16_SPACING * p`` with ``p`` the larger of the two
probabilities in a flip: the FP64 gap ``p_ref - p_chosen`` a BF16 program may get wrong.

Why: near a tie the gap between two softmax probabilities moves by ``p * (dz_a - dz_b)``, ``dz`` the
error of the logits; relative to ``p`` it is the logit error itself. Under the BF16 policy the
router's logits carry the rounding of its own operands (up to 2^-8 relative each, half of BF16's
spacing) and the error its input brings from every upstream BF16 product; it is relative to the
size of the logits' terms, so it grows with width and depth. Measured on the CPU (the FP64
reference with BF16-rounded operands, ``gpu.policy_faithful_ops``, against plain FP64 with the same
routing; the largest change of any probability pair of any token, relative to the larger one):
0.35 x 2^-7 on TinyMoE SMALL (64 tokens) over 10 updates, 1.3 x 2^-7 at d_model 256 / 4 layers /
16 experts, 2.0 x 2^-7 at d_model 768 / 8 layers / 8 experts (TinyMoE-200M's width and depth) at
initialisation. A factor 4 leaves at least 2x room over all of them; a flip beyond it (3% of the
larger probability) is not rounding and fails. A router whose logits grow far beyond these scales
in training moves its probabilities more: its flips would then fail this gate loudly (a false alarm
to investigate), never pass silently."""


@attrs.frozen
class Flip:
    """One token whose chosen expert set differs from the reference's: the program chose
    ``chosen`` where the reference chose ``instead``; ``gap`` = the largest FP64 probability among
    ``instead`` minus the smallest among ``chosen`` (the amount by which the program's set is worse
    than the best; inf for an invalid choice), ``margin`` the near-tie allowance at that token."""

    token: int
    chosen: tuple[int, ...]
    instead: tuple[int, ...]
    gap: float
    margin: float

    @property
    def near_tie(self) -> bool:
        return self.gap <= self.margin  # NaN compares false: a NaN probability fails


@attrs.frozen
class RoutingGate:
    """The routing decisions of one ``token_topk`` node (``group`` = ``routing <node>``): ``numel``
    (token, slot) choices, ``flipped`` of which differ from the reference's; passes when every flip
    is a near-tie."""

    group: str
    numel: int
    flipped: int
    flips: tuple[Flip, ...] = attrs.field(converter=tuple)
    step: int | None = None
    note: str = ""  # why the gate fails beyond its flips (e.g. non-finite probabilities)

    @property
    def passed(self) -> bool:
        return not self.note and all(f.near_tie for f in self.flips)

    @property
    def worst(self) -> Flip | None:
        """The flip closest to (or furthest beyond) its margin: the one the table prints."""
        def ratio(f: Flip) -> float:
            return f.gap / f.margin if f.margin > 0 and not math.isnan(f.gap) else math.inf
        return max(self.flips, key=ratio, default=None)


def routing_gate(group: str, probs: torch.Tensor, chosen: torch.Tensor, reference: torch.Tensor, *,
                 step: int | None = None, factor: float = ROUTING_FACTOR) -> RoutingGate:
    """Gate a program's top-k choice ``chosen`` [N, k] against the FP64 reference's ``reference``
    [N, k] of the same probabilities ``probs`` [N, E] (FP64, computed from the same upstream
    decisions). Choices are compared as sets per token (slot order does not change the result).
    An index outside [0, E) or repeated within a token is a flip with an infinite gap."""
    if probs.dim() != 2 or chosen.shape != reference.shape or chosen.dim() != 2 or chosen.shape[0] != probs.shape[0]:
        raise ValueError(f"routing gate {group!r}: probabilities {list(probs.shape)}, choices {list(chosen.shape)} "
                         f"and reference {list(reference.shape)} do not fit [N, E], [N, k], [N, k]")
    p = probs.detach().to(torch.float64).cpu()
    if bool((p < 0).any()):
        raise ValueError(f"routing gate {group!r}: the ranked scores have negative entries; the near-tie margin "
                         "is defined for probabilities (route on softmax outputs)")
    N, E = p.shape
    note = "" if bool(torch.isfinite(p).all()) else "non-finite FP64 probabilities"
    got = chosen.detach().cpu().long().tolist()
    want = reference.detach().cpu().long().tolist()
    flips, flipped = [], 0
    for t in range(N):
        g, r = got[t], want[t]
        if set(g) == set(r) and len(set(g)) == len(g):
            continue
        valid = len(set(g)) == len(g) and all(0 <= e < E for e in g)
        mine = sorted(set(g) - set(r)) if valid else sorted(set(g))
        theirs = sorted(set(r) - set(g))
        flipped += max(len(theirs), 1)
        if not valid:
            flips.append(Flip(t, tuple(g), tuple(theirs), math.inf, 0.0))
            continue
        top = max(float(p[t, e]) for e in theirs)
        gap = top - min(float(p[t, e]) for e in mine)
        flips.append(Flip(t, tuple(mine), tuple(theirs), gap, factor * BF16_SPACING * top))
    return RoutingGate(group, N * chosen.shape[1], flipped, flips, step, note)


@attrs.frozen
class GateTable:
    title: str
    gates: tuple[Gate | RoutingGate, ...] = attrs.field(converter=tuple)

    @property
    def passed(self) -> bool:
        return all(g.passed for g in self.gates)

    def failures(self) -> list[Gate]:
        return [g for g in self.gates if not g.passed]

    def format(self) -> str:
        has_step = any(g.step is not None for g in self.gates)
        st = ["step"] if has_step else []
        l2 = [g for g in self.gates if isinstance(g, Gate)]
        has_torch = any(g.torch_rel is not None for g in l2)
        tcols = ["torch", "torch result"] if has_torch else []

        def torch_cells(g):
            if not has_torch:
                return []
            if g.torch_rel is None:
                return ["-", "-"]
            return [_num(g.torch_rel), "ok" if g.torch_passed else "FAIL"]

        rows = [([str(g.step)] if has_step else []) + [
            g.group, f"{g.numel:,}", _num(g.rel_l2)] + torch_cells(g) + [g.gate_text, g.result_text]
            for g in l2]
        out = [self.title] + _block(st + ["group", "elements", "rel L2"] + tcols + ["gate", "result"], rows)
        routing = [g for g in self.gates if isinstance(g, RoutingGate)]
        if routing:
            rows, details = [], []
            for g in routing:
                w = g.worst
                rows.append(([str(g.step)] if has_step else []) + [
                    g.group, f"{g.numel:,}", str(g.flipped), "-" if w is None else _num(w.gap),
                    "-" if w is None else f"{w.margin:.1e}", "ok" if g.passed else "FAIL"])
                details += [f"  {g.group}: {g.note}"] if g.note else []
                for f in g.flips[:_SHOWN_FLIPS]:
                    details.append(f"  {g.group}: token {f.token} chose {list(f.chosen)} where FP64 chose "
                                   f"{list(f.instead)}: gap {_num(f.gap)}, margin {f.margin:.1e}, "
                                   + ("near-tie" if f.near_tie else "NOT a near-tie"))
                if len(g.flips) > _SHOWN_FLIPS:
                    details.append(f"  {g.group}: ... {len(g.flips) - _SHOWN_FLIPS} more tokens")
            out.append(f"routing: choices that differ from FP64's top-k (flips); a flip passes when its FP64 "
                       f"probability gap <= margin = {ROUTING_FACTOR:g} x 2^-7 x the larger probability "
                       "(worst gap: the flip nearest its margin)")
            out += _block(st + ["group", "choices", "flips", "worst gap", "margin", "result"], rows) + details
        n_fail = len(self.failures())
        t_fail = [g.group for g in l2 if g.torch_passed is False]
        tail = ""
        if has_torch:
            tail = ("; PyTorch's own update on the same inputs passes every gate it was measured on" if not t_fail
                    else f"; PyTorch's own update on the same inputs FAILS {len(t_fail)}: {', '.join(t_fail[:6])}"
                    + (" ..." if len(t_fail) > 6 else ""))
        n_level = sum(1 for g in l2 if g.torch_level)
        if n_level:
            tail += (f"; {n_level} of the failures torch-level (a fresh-state sign-like gate within "
                     f"{FRESH_FACTOR:g}x PyTorch's own error: docs/GATES.md)")
        out.append(f"{len(self.gates)} gates, " + ("all passed" if not n_fail else f"{n_fail} FAILED") + tail)
        return "\n".join(out)

    def __str__(self) -> str:
        return self.format()


_SHOWN_FLIPS = 8  # flips listed per routing gate (all are counted)
_RIGHT = {"elements", "rel L2", "torch", "gate", "step", "choices", "flips", "worst gap", "margin"}


def _block(head: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(head)]

    def line(cells):
        return "  ".join(c.rjust(w) if h in _RIGHT else c.ljust(w) for c, w, h in zip(cells, widths, head)).rstrip()

    return [line(head), line(["-" * w for w in widths])] + [line(r) for r in rows]


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


def attach_torch(gates: Sequence[Gate], torch_gates: Sequence[Gate], state: str | None = None) -> list[Gate]:
    """``gates`` with the ``torch`` column taken from ``torch_gates`` (PyTorch's update gated by
    :func:`program_gates` over the same graph, possibly against another reference: one replaying
    PyTorch's own routing), matched by group; ``state`` as in :func:`program_gates`."""
    if state not in (None, "fresh", "trained"):
        raise ValueError(f"attach_torch: state must be 'fresh', 'trained' or None, got {state!r}")
    by_group = {g.group: g.rel_l2 for g in torch_gates}
    out = []
    for g in gates:
        pt = by_group.get(g.group)
        factor = FRESH_FACTOR if state == "fresh" and pt is not None and g.group in SIGN_LIKE else None
        out.append(attrs.evolve(g, torch_rel=pt, factor=factor))
    return out


_TORCH_DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16}


def _derive_copies(graph: Graph, copies, values: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``values`` with each missing weight copy made from the new weight its cast reads."""
    made = graph.producers()
    out = dict(values)
    for c in copies:
        if c not in out and c in made and made[c].inputs[0] in out:
            out[c] = out[made[c].inputs[0]].to(_TORCH_DTYPES[graph.value(c).dtype])
    return out


def program_gates(graph: Graph, outputs: Mapping[str, torch.Tensor], reference: Mapping[str, torch.Tensor], *,
                  thresholds: float | Mapping[str, float] = FP64_THRESHOLD, step: int | None = None,
                  previous: Mapping[str, torch.Tensor] | None = None,
                  torch_outputs: Mapping[str, torch.Tensor] | None = None, state: str | None = None) -> list[Gate]:
    """Gates for one run of ``graph``: each output group against ``reference`` (same value names).

    ``thresholds`` is one number or ``{group or kind: number}`` (kinds: loss, grad, new_params,
    param_update, new_state, weight_copies, metric). ``previous`` (the program's inputs) adds the ``param_update``
    gate on new - old params. ``torch_outputs`` (PyTorch's own update on the same inputs, same
    names) fills the ``torch`` column; ``state`` ``"fresh"`` or ``"trained"`` says where the update
    starts (module docstring: the fresh-state rule for ``param_update`` and ``new_params``).
    """
    if state not in (None, "fresh", "trained"):
        raise ValueError(f"program_gates: state must be 'fresh', 'trained' or None, got {state!r}")
    default = thresholds if isinstance(thresholds, (int, float)) else FP64_THRESHOLD
    gates: list[Gate] = []
    groups = {g.name: list(g.values) for g in graph.outputs}
    grads = [n for n in groups.get("grads", []) if n in reference]
    all_grads = math.sqrt(sum(float(reference[n].detach().double().pow(2).sum()) for n in grads)) if grads else 0.0

    def err(outs, refs, vs_all: bool) -> float:
        r = rel_l2(outs, refs)  # shapes checked, NaN or inf anywhere is NaN
        if not vs_all or math.isnan(r):
            return r
        d = math.sqrt(sum(float((o.detach().double() - r.detach().double()).pow(2).sum()) for o, r in zip(outs, refs)))
        return d / all_grads

    def add(group: str, names: Iterable[str], diff_from: Mapping[str, str] | None = None, grad: bool = False) -> None:
        names = list(names)
        if not names:
            return
        missing = [n for n in names if n not in reference or n not in outputs]
        if missing:
            raise KeyError(f"gate {group!r}: no output or reference for {missing[:4]}")
        def values(src):
            if diff_from is None:
                return [src[n] for n in names]
            return [src[n].double() - previous[diff_from[n]].double() for n in names]

        outs, refs = values(outputs), values(reference)
        ref_norm = math.sqrt(sum(float(r.detach().double().pow(2).sum()) for r in refs))
        vs_all = grad and all_grads > 0 and ref_norm <= ZERO_GRAD * all_grads
        pt = None
        if torch_outputs is not None:
            absent = [n for n in names if n not in torch_outputs]
            if absent:
                raise KeyError(f"gate {group!r}: PyTorch's update has no value {absent[:4]}")
            pt = err(values(torch_outputs), refs, vs_all)
        factor = FRESH_FACTOR if state == "fresh" and pt is not None and group in SIGN_LIKE else None
        gates.append(Gate(group, err(outs, refs, vs_all), _threshold(thresholds, group, default),
                          sum(o.numel() for o in outs), step, pt, factor, vs_all))

    add("loss", groups.get("loss", []))
    for n in groups.get("grads", []):
        add(f"grad {n.removeprefix('grad.')}", [n], grad=True)
    add("new_params", groups.get("new_params", []))
    if previous is not None:
        pairs = dict(graph.inplace)
        names = [n for n in groups.get("new_params", []) if n in pairs and pairs[n] in previous]
        add("param_update", names, {n: pairs[n] for n in names})
    add("new_state", groups.get("new_state", []))
    copies = groups.get("weight_copies", [])
    if copies:
        # PyTorch keeps no copy: its BF16 autocast rounds its new FP32 weight when it next reads it.
        # (Outputs holding none of the copies are such an update too, e.g. qualify's PyTorch update
        # gated as the outputs; outputs holding some but not all fail below, naming the missing.)
        if torch_outputs is not None:
            torch_outputs = _derive_copies(graph, copies, torch_outputs)
        if not any(c in outputs for c in copies):
            outputs = _derive_copies(graph, copies, outputs)
    add("weight_copies", copies)
    for n in groups.get("metrics", []):
        add(f"metric {n.removeprefix('metric.')}", [n])
    return gates
