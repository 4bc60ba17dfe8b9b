"""On the GPU (marked gpu): the LM head's cross-entropy bodies (latch_xent.cuh) against the ops' FP64
references, over the paths the rewrite of 2026-12-02 (results/ce.md) touches: BF16, FP16 and FP32
logits with BF16 or FP32 dlogits (16-byte paths), an odd vocabulary (scalar paths), ragged row tiles,
column tiles in and out of chunks of 8, ignored rows and targets at a row's first and last column;
the backward reads the forward's lse, as in a model. Every output twice: the same bits.

    .venv/bin/python -m pytest -q -m gpu packages/latch-codegen-h100/tests/test_xent_gpu.py
"""

from __future__ import annotations

import pytest
import torch

import h100_handmade as H
from latch_codegen_h100 import build
from latch_codegen_h100.runtime import DTYPES, Program
from test_gpu_ops import reference, rel_l2, tolerance

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

IGNORE = -100
# (name, logits dtype, dlogits dtype, rows, V): 257 chunks of 8 a row (2056) leave a row's last chunk
# to one thread; 1003 is odd (the scalar paths); 37 rows split in 5 or 3 are ragged;
# 96 (12 chunks a row) makes the backward take 21 rows at once (a row per 12 threads, 4 threads idle).
# The backward's ring body (lower_xent.ring_taken: 16-bit logits, V a multiple of 8 and >= 8192;
# results/xb.md): "ring" at TinyMoE-200M's vocabulary (W = 256, 6 or 2 stages a row), "ringh" FP16
# logits into FP32 dlogits at V = 8200 (W = 8: a row's last stage one chunk, its box mostly past the
# row's end), "ringcut" V = 8704 (W = 256: column tiles of 2176 start at 2176 and 6528, not
# multiples of W, so those tiles take the register body at run time beside ring tiles), "ringodd"
# V = 8193 (odd: the register body's scalar path, chosen at lowering).
RING_CASES = [("ring", "bf16", "bf16", 37, 49152), ("ringh", "f16", "f32", 19, 8200),
              ("ringcut", "bf16", "bf16", 19, 8704), ("ringodd", "bf16", "bf16", 19, 8193)]
CASES = [("bb", "bf16", "bf16", 37, 2056), ("hh", "f16", "f16", 37, 2056), ("fb", "f32", "bf16", 37, 2056),
         ("ff", "f32", "f32", 37, 2056), ("bf", "bf16", "f32", 37, 2056), ("odd", "bf16", "bf16", 37, 1003),
         ("wide", "bf16", "bf16", 19, 6144), ("narrow", "bf16", "bf16", 37, 96)] + RING_CASES


def _graph():
    f = "f32"
    values, nodes, batch, metrics = [("g", (), f, "batch"), ("tot", (), f, "batch")], [], ["g", "tot"], []
    for c, dt, out, n, v in CASES:
        values += [(f"x_{c}", (n, v), dt, "batch"), (f"t_{c}", (n,), "i64", "batch"), (f"nll_{c}", (n,), f),
                   (f"lse_{c}", (n,), f), (f"valid_{c}", (n,), f), (f"dx_{c}", (n, v), out)]
        nodes += [(f"fwd_{c}", "latch::cross_entropy", (f"x_{c}", f"t_{c}"), (f"nll_{c}", f"lse_{c}", f"valid_{c}"),
                   {"ignore_index": IGNORE}),
                  (f"bwd_{c}", "latch::cross_entropy_backward", ("g", f"x_{c}", f"t_{c}", f"lse_{c}", "tot"),
                   (f"dx_{c}",), {"ignore_index": IGNORE, "reduction": "mean", "out_dtype": out})]
        batch += [f"x_{c}", f"t_{c}"]
        metrics += [f"nll_{c}", f"lse_{c}", f"valid_{c}", f"dx_{c}"]
    return H.graph("update", values, nodes, [("batch", batch)], [("metrics", metrics)])


def _inputs(g, seed=0):
    gen = torch.Generator().manual_seed(seed)
    out = {"g": torch.tensor(1.5), "tot": torch.tensor(29.0)}
    for c, dt, _, n, v in CASES:
        x = torch.randn((n, v), generator=gen, dtype=torch.float64) * 3.0
        t = torch.randint(0, v, (n,), generator=gen)
        t[0], t[1], t[2] = 0, v - 1, v - 8  # a row's first and last column, a chunk's first
        t[torch.arange(n) % 4 == 3] = IGNORE  # ignored rows, ragged among the tiles
        out[f"x_{c}"], out[f"t_{c}"] = x.to(DTYPES[dt]), t
    return out


@pytest.mark.parametrize("split,tiles", [("rows", 5), ("cols", 3), ("cols", 4)])
def test_xent_bodies_match_fp64_and_repeat_bits(tmp_path, split, tiles):
    """Row tiles: 37 rows in 5 (8, 8, 8, 8, 5) and 19 in 4; column tiles of 2056 in 3 (686: the
    scalar path) or 4 (514: also not chunks of 8), of 6144 in 3 or 4 (2048, 1536: the vector path at
    a column offset)."""
    g = _graph()
    build(H.planned([g], strategy="barrier", num_sms=8, tiles=tiles, split=split), tmp_path / "b")
    prog = Program.load(tmp_path / "b")
    inputs = _inputs(g)
    batch = {k: v.cuda() for k, v in inputs.items()}
    first = {k: v.clone() for k, v in prog.run_program("update", batch=batch).items()}
    again = prog.run_program("update", batch=batch)
    ref = reference(g, inputs)
    bad = []
    for n in g.nodes:
        for o in n.outputs:
            if not torch.equal(first[o], again[o]):
                bad.append(f"{o}: different bits on the second run")
            err = rel_l2(first[o], ref[o])
            if not err <= tolerance(g, n):
                bad.append(f"{n.name}: {o} rel-L2 {err:.3g} > {tolerance(g, n):g}")
        if n.op == "latch::cross_entropy_backward":
            # an ignored row's gradient is exactly 0
            c = n.name[4:]
            rows = inputs[f"t_{c}"] == IGNORE
            if first[n.outputs[0]].cpu()[rows].abs().max().item() != 0.0:
                bad.append(f"{n.name}: an ignored row has a nonzero gradient")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("split,tiles", [("rows", 5), ("cols", 4)])
def test_xent_ring_body_gives_the_register_body_bits(tmp_path, monkeypatch, split, tiles):
    """The ring body and the register body compute every element by the same code (xent_grad8 on the
    same unpacked words): the program built with the ring switched off (lower_xent.RING) gives the
    same dlogits to the bit, ignored rows, ragged row tiles and column tiles included."""
    from latch_codegen_h100 import lower_xent

    g = _graph()
    inputs = _inputs(g, seed=1)
    batch = {k: v.cuda() for k, v in inputs.items()}
    outs = {}
    for ring in (True, False):
        monkeypatch.setattr(lower_xent, "RING", ring)
        d = tmp_path / f"b{int(ring)}"
        doc = build(H.planned([g], strategy="barrier", num_sms=8, tiles=tiles, split=split), d)
        # the ring build has the ring (its bodies stream the 16-bit rows), the other none
        assert (dict(dict(doc.build.stats)["ring"])["stages"] > 0) is ring
        outs[ring] = {k: v.clone() for k, v in Program.load(d).run_program("update", batch=batch).items()}
    bad = [f"dx_{c}" for c, *_ in RING_CASES if not torch.equal(outs[True][f"dx_{c}"], outs[False][f"dx_{c}"])]
    assert not bad, f"the ring body's bits differ from the register body's: {bad}"
