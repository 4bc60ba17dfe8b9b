"""Pass ``memory.fuse_cross_entropy``: the LM head's cross-entropy without logit-sized FP32 tensors.

What capture records for ``F.cross_entropy(x @ W^T, t)`` (and its autograd backward), after the
numerical policy:

    logits  = matmul(x.bf16, W^T.bf16) {out_dtype f32}          [N, V] f32
    logp    = log_softmax(logits)                               [N, V] f32
    loss, total = nll_loss(logp, t, None) {mean | sum}
    dlogp   = nll_loss_backward(g, logp, t, None, total)        [N, V] f32 (a scaled one-hot)
    dlogits = log_softmax_backward(dlogp, logp)                 [N, V] f32
    dlogits.bf16 = cast(dlogits)                                (the two gradient products' operand)

four tensors of the logits' size in FP32 (403 MB each for 2048 x 49152). This pass rewrites it to

    logits  = matmul(x.bf16, W^T.bf16) {out_dtype bf16}         [N, V] bf16, written once
    nll, lse, valid = cross_entropy(logits, t)                  [N] each: one read of the logits
    loss    = div(sum(nll), sum(valid))   (mean; sum: loss = sum(nll)), total = sum(valid)
    dlogits.bf16 = cross_entropy_backward(g, logits, t, lse, total) {out_dtype bf16}

(latch_ops.cross_entropy). The logits are stored in the matmul's operand dtype when the policy
gave it a low one (BF16): the gradient products read dlogits in that dtype anyway, and the costed
alternatives move more (results/i11h.md): statistics in the product's epilogue with the backward
recomputing the logits costs a second 155 GFLOP product (~0.26 ms on the H200) to save one 201 MB
write and read (~0.09 ms). The dlogits take the dtype of the casts that read them (the casts go
away), else the log_softmax_backward's. Without a low-precision policy the logits stay FP32 (the
op pair still removes logp, dlogp and the f32 dlogits).

Recognised exactly that chain, on 2-D logits from a ``latch::matmul`` read by nothing else, with
no class weights and reduction mean or sum; anything else is left as it is (the pass reports how
many heads it fused per program in the section's metadata, ``memory.fuse_cross_entropy``).
"""

from __future__ import annotations

import attrs

from latch_core.document import Document
from latch_core.ir import Graph, GraphSection, Node, Value, fresh_name

MATMUL, LOG_SOFTMAX, NLL, NLL_BWD = "latch::matmul", "latch::log_softmax", "latch::nll_loss", "latch::nll_loss_backward"
LOG_SOFTMAX_BWD, CAST = "latch::log_softmax_backward", "latch::cast"
CE, CE_BWD, SUM, DIV = "latch::cross_entropy", "latch::cross_entropy_backward", "latch::sum", "latch::div"
LOW = ("bf16", "f16")


@attrs.frozen
class _Match:
    mm: Node
    lsm: Node
    nll: Node
    nll_bwd: Node
    lsm_bwd: Node
    casts: tuple[Node, ...]  # casts of dlogits to one low dtype (folded), else empty


def _matches(g: Graph) -> list[_Match]:
    producers, consumers = g.producers(), g.consumers()
    outs = set(g.output_names())
    found = []
    for lsm in g.nodes:
        if lsm.op != LOG_SOFTMAX or len(lsm.inputs) != 1:
            continue
        logits, logp = lsm.inputs[0], lsm.outputs[0]
        mm = producers.get(logits)
        if mm is None or mm.op != MATMUL or len(g.value(logits).shape) != 2 or logits in outs or logp in outs:
            continue
        if [c.name for c in consumers.get(logits, [])] != [lsm.name]:
            continue
        readers = consumers.get(logp, [])
        nll = [c for c in readers if c.op == NLL]
        bwd = [c for c in readers if c.op == NLL_BWD]
        lbwd = [c for c in readers if c.op == LOG_SOFTMAX_BWD]
        if len(nll) != 1 or len(bwd) != 1 or len(lbwd) != 1 or len(readers) != 3:
            continue
        nll, bwd, lbwd = nll[0], bwd[0], lbwd[0]
        red = nll.attr("reduction")
        if red not in ("mean", "sum") or nll.inputs[0] != logp or nll.inputs[2] is not None:
            continue
        if (bwd.inputs[1] != logp or bwd.inputs[2] != nll.inputs[1] or bwd.inputs[3] is not None
                or bwd.inputs[4] != nll.outputs[1] or bwd.attr("reduction") != red
                or bwd.attr("ignore_index") != nll.attr("ignore_index")):
            continue
        dlogp = bwd.outputs[0]
        if dlogp in outs or [c.name for c in consumers.get(dlogp, [])] != [lbwd.name]:
            continue
        if tuple(lbwd.inputs) != (dlogp, logp):
            continue
        if nll.outputs[1] in outs or any(c.name != bwd.name for c in consumers.get(nll.outputs[1], [])):
            continue  # the total weight is rebuilt; something else reading it keeps the chain as it is
        dl = lbwd.outputs[0]
        cs = consumers.get(dl, [])
        casts: tuple[Node, ...] = ()
        if (dl not in outs and cs and all(c.op == CAST for c in cs)
                and len({c.attr("dtype") for c in cs}) == 1 and cs[0].attr("dtype") in LOW):
            casts = tuple(cs)
        found.append(_Match(mm, lsm, nll, bwd, lbwd, casts))
    return found


def fuse_program(g: Graph) -> tuple[Graph, int]:
    """``g`` with every recognised LM-head cross-entropy rewritten (module docstring); the count."""
    found = _matches(g)
    if not found:
        return g, 0
    names = {v.name for v in g.values} | {n.name for n in g.nodes}
    outs = set(g.output_names())
    values = {v.name: v for v in g.values}
    order = [v.name for v in g.values]
    drop: set[str] = set()
    replace: dict[str, list[Node]] = {}  # node name -> the nodes put in its place
    evolve: dict[str, Node] = {}
    rename: dict[str, str] = {}
    gone: set[str] = set()
    for m in found:
        logits = m.mm.outputs[0]
        lt = values[logits]
        N, V = lt.shape
        low = m.mm.attr("operand_dtype")
        store = low if low in LOW else lt.dtype
        if store != lt.dtype:
            values[logits] = attrs.evolve(lt, dtype=store)
            evolve[m.mm.name] = attrs.evolve(m.mm, attrs=dict(m.mm.attr_dict, out_dtype=store))
        stat = "f64" if store == "f64" else "f32"
        acc = {k: v for k, v in m.nll.attr_dict.items() if k == "accum_dtype"}
        ign = m.nll.attr("ignore_index")
        target = m.nll.inputs[1]
        base = m.nll.outputs[0]
        nll_v, lse_v, valid_v, s_v = (fresh_name(names, f"{base}.{k}") for k in ("nll", "lse", "valid", "sum"))
        for v in (nll_v, lse_v, valid_v):
            values[v] = Value(v, (N,), stat)
            order.append(v)
        loss, total = m.nll.outputs
        src = m.nll.source
        fwd = [Node(fresh_name(names, f"xent.{base}"), CE, (logits, target), (nll_v, lse_v, valid_v),
                    {"ignore_index": ign, **acc}, source=src)]
        red = m.nll.attr("reduction")
        loss_dt = values[loss].dtype
        if red == "mean":
            values[s_v] = Value(s_v, (), stat)
            order.append(s_v)
            fwd.append(Node(fresh_name(names, f"sum.{s_v}"), SUM, (nll_v,), (s_v,), {"dims": (0,), "keepdim": False, **acc},
                            source=src))
            fwd.append(Node(fresh_name(names, f"sum.{total}"), SUM, (valid_v,), (total,),
                            {"dims": (0,), "keepdim": False, **acc}, source=src))
            fwd.append(Node(fresh_name(names, f"div.{loss}"), DIV, (s_v, total), (loss,), {}, source=src))
        else:
            fwd.append(Node(fresh_name(names, f"sum.{loss}"), SUM, (nll_v,), (loss,), {"dims": (0,), "keepdim": False, **acc},
                            source=src))
            fwd.append(Node(fresh_name(names, f"sum.{total}"), SUM, (valid_v,), (total,),
                            {"dims": (0,), "keepdim": False, **acc}, source=src))
        for v in (loss, total):
            if values[v].dtype != stat or values[v].shape != ():
                raise ValueError(f"memory.fuse_cross_entropy: {m.nll.name}'s output {v} is {values[v]}, expected "
                                 f"{stat}[] (loss dtype {loss_dt})")
        replace[m.nll.name] = fwd
        dl = m.lsm_bwd.outputs[0]
        if m.casts:
            out = m.casts[0].outputs[0]
            out_dt = m.casts[0].attr("dtype")
            for c in m.casts[1:]:
                rename[c.outputs[0]] = out
                gone.add(c.outputs[0])
            drop.update(c.name for c in m.casts)
            gone.add(dl)
        else:
            out, out_dt = dl, values[dl].dtype
        bwd = Node(fresh_name(names, f"xent_bwd.{base}"), CE_BWD, (m.nll_bwd.inputs[0], logits, target, lse_v, total),
                   (out,), {"ignore_index": ign, "reduction": red, "out_dtype": out_dt, **acc}, source=m.lsm_bwd.source)
        replace[m.lsm_bwd.name] = [bwd]
        drop.update({m.lsm.name, m.nll_bwd.name})
        gone.update({m.lsm.outputs[0], m.nll_bwd.outputs[0]})
    if any(v in outs for v in gone):
        raise AssertionError("memory.fuse_cross_entropy removed a program output")  # _matches excludes it
    nodes: list[Node] = []
    for n in g.nodes:
        if n.name in drop:
            continue
        if n.name in replace:
            nodes.extend(replace[n.name])
            continue
        n = evolve.get(n.name, n)
        if any(v in rename for v in n.inputs if v is not None):
            n = attrs.evolve(n, inputs=[rename.get(v, v) if v is not None else None for v in n.inputs])
        nodes.append(n)
    new_values = [values[v] for v in dict.fromkeys(order) if v not in gone]
    return attrs.evolve(g, values=new_values, nodes=nodes), len(found)


def fuse_section(section: GraphSection) -> tuple[GraphSection, dict[str, int]]:
    counts: dict[str, int] = {}
    programs = []
    for p in section.programs:
        p2, k = fuse_program(p)
        counts[p.name] = k
        programs.append(p2)
    meta = dict(section.metadata)
    meta["memory.fuse_cross_entropy"] = {"fused": counts}
    return attrs.evolve(section, programs=programs, metadata=meta), counts


def fuse_pass(doc: Document) -> tuple[Document, str]:
    """Pass ``memory.fuse_cross_entropy`` (module docstring); no options."""
    section, counts = fuse_section(doc.graph)
    detail = ", ".join(f"{k}: {v} fused" for k, v in counts.items())
    return attrs.evolve(doc, graph=section), detail
