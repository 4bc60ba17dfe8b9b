"""Assembling programs from the two lowered traces (CONTRACTS.md section 2).

- K = 1: ``update`` = forward+backward, then the optimizer.
- K > 1: ``accumulate`` = forward+backward, gradients added into the state accumulators
  ``grad_acc.<param>`` and the loss into ``loss_acc``; ``accumulate_and_update`` = the same for the
  last microbatch, then grads = (grad_acc + grad) / K and loss = (loss_acc + loss) / K, the
  optimizer, and the accumulators reset to zero. The runtime runs ``accumulate`` K-1 times, then
  ``accumulate_and_update``; so the step's gradient is the mean of the microbatch gradients, which
  is the full-batch gradient when the objective is a mean over equal microbatches.

Output value names are fixed: ``new.<name>`` for new params and state, ``loss``, ``grad.<param>``,
``routing.<token_topk node>`` (``routing=True``: the expert indices each ``latch::token_topk`` node
chooses, output by every program so a checker can replay them), ``metric.<name>``. An update that
returns an input unchanged does not write it (no output, no in-place pair). Dead nodes (unused
pieces of splits, unused metrics) are removed.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch

from latch_core.ir import BATCH, CONST, HYPER, INTERMEDIATE, PARAM, STATE, Graph, GraphSection, Group, Node, Value

from latch_ops.moe.specs import TOKEN_TOPK

from .errors import CaptureError
from .lower import Fragment
from .trace import CaptureInputs, Traced

GRAD_ACC = "grad_acc."
LOSS_ACC = "loss_acc"
ROUTING = "routing."
# Routing decisions: op -> index of the output that holds the decision (token_topk's expert indices;
# its gate values follow from them and the probabilities, so they are not a decision of their own).
DECISIONS = {TOKEN_TOPK: 1}


class Builder:
    """One program under construction: inputs, instantiated fragments, extra nodes, outputs."""

    def __init__(self, name: str, ops, reserved: set[str]):
        self.name = name
        self.ops = ops
        self.values: dict[str, Value] = {}
        self.nodes: list[Node] = []
        self.taken: set[str] = set(reserved)
        self.inputs: list[tuple[str, list[str]]] = []
        self.produced: dict[str, int] = {}  # value -> index of its node
        self.renames: dict[str, str] = {}
        self._n = 0

    def fresh(self, base: str) -> str:
        name = base
        while name in self.taken:
            self._n += 1
            name = f"{base}_{self._n}"
        self.taken.add(name)
        return name

    def add_inputs(self, group: str, role: str, items: Sequence[tuple[str, Any]]) -> None:
        names = []
        for n, t in items:
            self.values[n] = Value(n, t.shape, t.dtype, role)
            self.taken.add(n)
            names.append(n)
        if names:
            self.inputs.append((group, names))

    def instantiate(self, frag: Fragment, bind: Mapping[str, str]) -> list[str]:
        local: dict[str, str] = {}
        for n in frag.inputs:
            if n in bind:
                local[n] = bind[n]
        for v in frag.values:
            new = self.fresh(v.name)
            local[v.name] = new
            self.values[new] = Value(new, v.shape, v.dtype, v.role, v.data)
        for node in frag.nodes:
            try:
                ins = tuple(None if i is None else local[i] for i in node.inputs)
            except KeyError as e:
                raise CaptureError(f"internal: fragment input {e} is not bound in program {self.name}") from None
            outs = tuple(local[o] for o in node.outputs)
            self._add_node(Node(outs[0], node.op, ins, outs, node.attrs, node.source))
        return [local.get(o, bind.get(o, o)) for o in frag.outputs]

    def _add_node(self, node: Node) -> None:
        for o in node.outputs:
            self.produced[o] = len(self.nodes)
        self.nodes.append(node)

    def emit(self, op: str, inputs: Sequence[str], attrs: Mapping[str, Any] | None = None, base: str = "acc") -> str:
        spec = self.ops.get(op)
        types = spec.check([self.values[i].type for i in inputs], dict(attrs or {}))
        name = self.fresh(base)
        self.values[name] = Value(name, types[0].shape, types[0].dtype, INTERMEDIATE)
        self._add_node(Node(name, op, tuple(inputs), (name,), dict(attrs or {}), None))
        return name

    def output(self, value: str, name: str) -> str:
        """Give ``value`` the output name ``name``: a rename when it is a node result not yet named,
        else a latch::copy (an input, a constant, or a value already an output under another name)."""
        if name in self.values or name in self.renames.values():
            raise CaptureError(f"the output name {name!r} collides with another value",
                               hint="rename the parameter, state entry or metric")
        if value in self.produced and value not in self.renames:
            self.renames[value] = name
            return name
        self.taken.discard(name)
        copy = self.emit("latch::copy", [value], base=name)
        self.renames[copy] = copy
        return copy

    def finish(self, outputs: Sequence[tuple[str, list[str]]], inplace: Sequence[tuple[str, str]]) -> Graph:
        ren = {k: v for k, v in self.renames.items() if k != v}
        nodes = [Node(ren.get(n.outputs[0], n.outputs[0]), n.op, tuple(None if i is None else ren.get(i, i) for i in n.inputs),
                      tuple(ren.get(o, o) for o in n.outputs), n.attrs, n.source) for n in self.nodes]
        values = {}
        for k, v in self.values.items():
            nk = ren.get(k, k)
            values[nk] = Value(nk, v.shape, v.dtype, v.role, v.data)
        out_groups = [(g, names) for g, names in outputs if names or g == "loss"]
        # dead-code elimination: keep nodes whose results reach an output
        needed = {n for _, names in out_groups for n in names}
        keep = []
        for node in reversed(nodes):
            if any(o in needed for o in node.outputs):
                keep.append(node)
                needed.update(i for i in node.inputs if i is not None)
        keep.reverse()
        input_names = [n for _, names in self.inputs for n in names]
        used = set(input_names) | {o for n in keep for o in n.outputs} | {i for n in keep for i in n.inputs if i}
        order = input_names + [k for k, v in values.items() if v.role == CONST and k in used]
        order += [o for n in keep for o in n.outputs]
        return Graph(
            name=self.name,
            values=tuple(values[k] for k in order),
            nodes=tuple(keep),
            inputs=tuple(Group(g, tuple(names)) for g, names in self.inputs),
            outputs=tuple(Group(g, tuple(names)) for g, names in out_groups),
            inplace=tuple(inplace),
        )


def routing_outputs(b: Builder, first: int) -> list[str]:
    """Output every routing decision made by the nodes ``b.nodes[first:]`` (one forward+backward) as
    ``routing.<node name>``; the decision values keep feeding their consumers under the new name."""
    return [b.output(n.outputs[DECISIONS[n.op]], ROUTING + n.name) for n in b.nodes[first:] if n.op in DECISIONS]


def _types(spec: CaptureInputs, names: Sequence[str]):
    return [(n, spec.types[n]) for n in names]


def assemble(spec: CaptureInputs, fb: Traced, opt: Traced, *, microbatches: int, grads: bool, example: str,
             ops, routing: bool | str = False) -> GraphSection:
    pnames, snames = spec.names("params"), spec.names("state")
    bnames = spec.names("batch_in") + spec.names("batch_tg")
    hnames = [n for n, _ in spec.hyper]
    K = microbatches
    acc_names = [GRAD_ACC + p for p in pnames] + [LOSS_ACC] if K > 1 else []
    clash = set(acc_names) & (set(pnames) | set(snames) | set(bnames) | set(hnames))
    if clash:
        raise CaptureError(f"the names {sorted(clash)[:4]} are reserved for microbatch accumulators",
                           hint="rename those state entries")
    types = dict(spec.types)
    loss_type = _output_type(fb, 0)
    for p in pnames:
        types[GRAD_ACC + p] = spec.types[p]
    if K > 1:
        types[LOSS_ACC] = loss_type
    layout = tuple(Value(n, types[n].shape, types[n].dtype, PARAM) for n in pnames) + tuple(
        Value(n, types[n].shape, types[n].dtype, STATE) for n in snames + acc_names)
    fb_metrics = [k for k in fb.output_keys if k.startswith("metric.")]
    opt_metrics = [k for k in opt.output_keys if k.startswith("metric.")]
    dup = set(fb_metrics) & set(opt_metrics)
    if dup:
        raise CaptureError(f"metric {sorted(dup)[0][7:]!r} is returned by both the objective and the update",
                           hint="give the metrics distinct names")
    canonical = {"loss"} | {f"new.{n}" for n in pnames + snames + acc_names} | set(fb_metrics) | set(opt_metrics)
    canonical |= {f"grad.{p}" for p in pnames}
    clash = canonical & set(types)
    if clash:
        raise CaptureError(f"the names {sorted(clash)[:4]} are reserved for program outputs",
                           hint="rename those parameters, state entries or inputs")

    def start(name: str) -> Builder:
        b = Builder(name, ops, canonical)
        b.add_inputs("params", PARAM, _types(spec, pnames))
        b.add_inputs("state", STATE, [(n, types[n]) for n in snames + acc_names])
        b.add_inputs("batch", BATCH, _types(spec, bnames))
        b.add_inputs("hyper", HYPER, _types(spec, hnames))
        return b

    decides = any(n.op in DECISIONS for n in fb.fragment.nodes)
    if routing == "auto":
        routing = decides
    if routing and not decides:
        raise CaptureError("routing=True, but the update makes no routing decision (no latch::token_topk node)",
                           hint="capture without routing, or route tokens with latch_ops.moe.torch_ops.token_topk")

    def run_fb(b: Builder) -> tuple[str, dict[str, str], list[str], list[str]]:
        """(loss, metrics, gradients, routing outputs: empty unless ``routing``)."""
        bind = {n: n for n in pnames + snames + bnames + hnames}
        first = len(b.nodes)
        outs = dict(zip(fb.output_keys, b.instantiate(fb.fragment, bind)))
        decisions = routing_outputs(b, first) if routing else []
        return outs["loss"], {k: outs[k] for k in fb_metrics}, [outs[f"grad.{p}"] for p in pnames], decisions

    def run_opt(b: Builder, grads_in: list[str]) -> tuple[list, list, dict]:
        bind = {n: n for n in pnames + snames + hnames}
        bind.update({f"grad.{p}": g for p, g in zip(pnames, grads_in)})
        outs = dict(zip(opt.output_keys, b.instantiate(opt.fragment, bind)))
        new_p = [(p, outs[f"new.{p}"]) for p in pnames]
        new_s = [(s, outs[f"new.{s}"]) for s in snames]
        return new_p, new_s, {k: outs[k] for k in opt_metrics}

    def written(b: Builder, pairs) -> tuple[list[str], list[tuple[str, str]]]:
        names, inplace = [], []
        for old, v in pairs:
            if v == old:  # returned unchanged: nothing to write
                continue
            new = b.output(v, f"new.{old}")
            names.append(new)
            inplace.append((new, old))
        return names, inplace

    def metrics_out(b: Builder, metrics: dict[str, str]) -> list[str]:
        return [b.output(v, k) for k, v in metrics.items()]

    programs = []
    if K == 1:
        b = start("update")
        loss, m1, g, r = run_fb(b)
        new_p, new_s, m2 = run_opt(b, g)
        np_names, ip1 = written(b, new_p)
        ns_names, ip2 = written(b, new_s)
        outs = [("new_params", np_names), ("new_state", ns_names), ("loss", [b.output(loss, "loss")])]
        if grads:
            outs.append(("grads", [b.output(x, f"grad.{p}") for p, x in zip(pnames, g)]))
        outs.append(("routing", r))
        outs.append(("metrics", metrics_out(b, {**m1, **m2})))
        programs.append(b.finish(outs, ip1 + ip2))
    else:
        # accumulate: grads and loss added into the accumulators
        b = start("accumulate")
        loss, m1, g, r = run_fb(b)
        acc = [(GRAD_ACC + p, b.emit("latch::add", [GRAD_ACC + p, x])) for p, x in zip(pnames, g)]
        acc.append((LOSS_ACC, b.emit("latch::add", [LOSS_ACC, loss])))
        ns_names, ip = written(b, acc)
        outs = [("new_state", ns_names), ("loss", [b.output(loss, "loss")]), ("routing", r),
                ("metrics", metrics_out(b, m1))]
        programs.append(b.finish(outs, ip))
        # accumulate_and_update: the last microbatch, the mean, the optimizer, accumulators reset
        b = start("accumulate_and_update")
        loss, m1, g, r = run_fb(b)
        mean_g = [b.emit("latch::div", [b.emit("latch::add", [GRAD_ACC + p, x])], {"scalar": float(K)}, base="grad_mean")
                  for p, x in zip(pnames, g)]
        mean_loss = b.emit("latch::div", [b.emit("latch::add", [LOSS_ACC, loss])], {"scalar": float(K)}, base="loss_mean")
        new_p, new_s, m2 = run_opt(b, mean_g)
        zeros = [(n, b.emit("latch::full", [], {"shape": types[n].shape, "value": 0.0, "dtype": types[n].dtype},
                            base="zero")) for n in acc_names]
        np_names, ip1 = written(b, new_p)
        ns_names, ip2 = written(b, new_s + zeros)
        outs = [("new_params", np_names), ("new_state", ns_names), ("loss", [b.output(mean_loss, "loss")])]
        if grads:
            outs.append(("grads", [b.output(x, f"grad.{p}") for p, x in zip(pnames, mean_g)]))
        outs.append(("routing", r))
        outs.append(("metrics", metrics_out(b, {**m1, **m2})))
        programs.append(b.finish(outs, ip1 + ip2))
    metadata = {
        "example": example,
        "microbatches": K,
        "hyper": {n: v for n, v in spec.hyper},
        "inputs_style": spec.call_style,
        "torch_version": torch.__version__,
    }
    return GraphSection(programs=tuple(programs), layout=layout, metadata=metadata)


def _output_type(t: Traced, index: int):
    frag = t.fragment
    name = frag.outputs[index]
    for v in frag.values:
        if v.name == name:
            return v.type
    return frag.input_types[name]
