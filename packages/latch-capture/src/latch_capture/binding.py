"""Binding user tensors to a captured document's value names, and carrying state between runs.

The names are the ones capture gives (module docstring of ``tree``): parameters by their module
name, state entries by their key path, ``input``/``input.<i>``/``input.<key>`` and ``target...``
for the batch, hyper-parameters by name; microbatch accumulators are ``grad_acc.<param>`` and
``loss_acc``; BF16 weight copies (``memory.weight_copies``) are ``<param>.bf16``, created from their
parameter when the state does not hold them. A runtime or checker builds the inputs of a program with :func:`bind_inputs`, runs
it, and calls :func:`advance` to get the next step's inputs (new values replace old ones).
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

from latch_core.ir import Graph, GraphSection
from latch_ops.common import torch_dtype

from . import tree
from .errors import CaptureError


def _section(doc_or_section) -> GraphSection:
    if isinstance(doc_or_section, GraphSection):
        return doc_or_section
    if doc_or_section.graph is None:
        raise CaptureError("the document has no graph section", hint="capture it first (latch-pipeline capture)")
    return doc_or_section.graph


def batch_inputs(inputs: Any, targets: Any) -> dict[str, torch.Tensor]:
    bi, _ = tree.flatten(inputs, "input", "inputs")
    bt, _ = tree.flatten(targets, "target", "targets")
    return {n: t.detach() for n, t in bi + bt}


def bind_inputs(doc_or_section, *, params: Mapping[str, torch.Tensor], state: Any, inputs: Any, targets: Any,
                hyper: Mapping[str, float] | None = None) -> dict[str, torch.Tensor]:
    """Every input of every program of the document, by value name.

    ``state`` is the optimizer state as the user's code holds it; accumulators missing from it
    start at zero. ``hyper`` overrides the defaults recorded at capture.
    """
    section = _section(doc_or_section)
    flat: dict[str, torch.Tensor] = {}
    # detached: a runtime or interpreter receives the data, never autograd leaves (nn.Parameter)
    flat.update({n: p.detach() for n, p in params.items()})
    st, _ = tree.flatten(dict(state or {}), "", "state")
    flat.update({n: t.detach() for n, t in st})
    copies = weight_copies(section)
    for v in section.layout:
        if v.name not in flat:
            if v.name in copies:
                continue  # below: from the parameter
            if v.name.startswith("grad_acc.") or v.name == "loss_acc":
                flat[v.name] = torch.zeros(v.shape, dtype=torch_dtype(v.dtype))
            else:
                raise CaptureError(f"no tensor given for {v.role} {v.name!r} of the document",
                                   hint="pass the same parameters and state structure the document was captured with")
    for c, p in copies.items():
        if c not in flat:
            # the copy is cast(p): given here as p's own values, each runtime stores it in the
            # layout's dtype (the GPU rounds it to BF16 as the program's cast does; the FP64
            # interpreter's cast never rounds, so there it stays p)
            flat[c] = flat[p].clone()
    flat.update(batch_inputs(inputs, targets))
    defaults = dict(section.meta("hyper", ()) or ())
    given = dict(hyper or {})
    unknown = set(given) - set(defaults)
    if unknown:
        raise CaptureError(f"hyper-parameters {sorted(unknown)} are not inputs of the document",
                           hint=f"its hyper-parameters are {sorted(defaults)}")
    for name, default in defaults.items():
        v = given.get(name, default)
        # float64 keeps the Python number exact; a runtime casts it to the program's dtype (f32)
        flat[name] = v if isinstance(v, torch.Tensor) else torch.tensor(float(v), dtype=torch.float64)
    return flat


def weight_copies(doc_or_section) -> dict[str, str]:
    """copy -> parameter of every BF16 weight copy the document keeps as state (the pass
    ``memory.weight_copies`` records them in the graph section's metadata; empty without it)."""
    meta = _section(doc_or_section).meta("memory.weight_copies")
    return dict(dict(meta).get("copies", ())) if meta else {}


def program_inputs(graph: Graph, flat: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The subset of ``flat`` that ``graph`` takes as inputs."""
    missing = [n for n in graph.input_names() if n not in flat]
    if missing:
        raise CaptureError(f"program {graph.name!r} needs inputs {missing[:6]} that were not given",
                           hint="bind them with latch_capture.bind_inputs")
    return {n: flat[n] for n in graph.input_names()}


def advance(graph: Graph, flat: Mapping[str, torch.Tensor], outputs: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``flat`` with every in-place pair (new -> old) of ``graph`` applied: the next step's inputs."""
    nxt = dict(flat)
    for new, old in graph.inplace:
        nxt[old] = outputs[new]
    return nxt
