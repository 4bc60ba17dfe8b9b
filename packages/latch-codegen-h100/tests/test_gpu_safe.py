"""On the GPU: a launch that fails part-way leaves the caller's parameters and optimizer state as
they were, in safe mode (guard.py); the shared input checks (latch_core.inputs) on the runtime.

The failure is forced the way a corrupted table would: one wait before a task of the in-place
update group asks for more signals than any launch sends, so the other SMs' update tasks have
already written their tiles of the parameters and the state when the spin times out.
"""

from __future__ import annotations

import shutil
import struct

import pytest
import torch

import h100_handmade as H
from latch_core.document import load
from latch_core.ir import Value
from latch_codegen_h100 import build
from latch_codegen_h100 import tables as T
from latch_codegen_h100.runtime import LaunchError, Program, ProgramError

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

F = "f32"
N, DIN, DOUT = 32, 48, 8


def momentum_graph():
    """y = x @ w; a fake gradient gw = x^T y; m' = 0.9 m + gw (in place of m), w' = w - lr m' (in place)."""
    v = [Value("w", (DIN, DOUT), F, "param"), Value("m", (DIN, DOUT), F, "state"), Value("x", (N, DIN), F, "batch"),
         Value("lr", (), F, "hyper")]
    v += [Value(n, s, F) for n, s in (("y", (N, DOUT)), ("loss", ()), ("xt", (DIN, N)), ("gw", (DIN, DOUT)),
                                       ("m9", (DIN, DOUT)), ("m2", (DIN, DOUT)), ("u", (DIN, DOUT)), ("w2", (DIN, DOUT)))]
    nodes = [
        ("mm", "latch::matmul", ("x", "w"), ("y",)),
        ("mean", "latch::mean", ("y",), ("loss",), {"dims": (0, 1), "keepdim": False}),
        ("xT", "latch::permute", ("x",), ("xt",), {"perm": (1, 0)}),
        ("gwmm", "latch::matmul", ("xt", "y"), ("gw",)),
        ("decay", "latch::mul", ("m",), ("m9",), {"scalar": 0.9}),
        ("acc", "latch::add", ("m9", "gw"), ("m2",)),
        ("scale", "latch::mul", ("m2", "lr"), ("u",)),
        ("step", "latch::sub", ("w", "u"), ("w2",)),
    ]
    return H.graph("update", v, nodes, [("params", ["w"]), ("state", ["m"]), ("batch", ["x"]), ("hyper", ["lr"])],
                   [("new_params", ["w2"]), ("new_state", ["m2"]), ("loss", ["loss"])],
                   inplace=[("w2", "w"), ("m2", "m")])


def _corrupt_last_update_wait(src, dst):
    """Copy the build and make the wait before the last in-place update task unsatisfiable."""
    shutil.copytree(src, dst)
    doc = load(src / "program.latch.json")
    ps = doc.schedule.programs[0]
    writers = {t.id for t in ps.tasks if any(a.value in ("w2", "m2") for a in t.writes)}
    path = dst / "tables" / "update.instrs.bin"
    data = bytearray(path.read_bytes())
    instrs = T.unpack_instrs(bytes(data))
    k = max(i for i in range(1, len(instrs)) if instrs[i][0] == T.I_TASK and instrs[i][1] in writers
            and instrs[i - 1][0] == T.I_WAIT)
    struct.pack_into("<4i", data, 16 * (k - 1), T.I_WAIT, instrs[k - 1][1], 1000, 0)
    path.write_bytes(bytes(data))
    return len(writers)


def _inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(DIN, DOUT, generator=g) * 0.3).cuda()
    m = (torch.randn(DIN, DOUT, generator=g) * 0.1).cuda()
    x = torch.randn(N, DIN, generator=g).cuda()
    return w, m, x


def test_a_failed_launch_leaves_params_and_state_as_they_were_in_safe_mode(tmp_path):
    g = momentum_graph()
    build(H.planned([g], [g.value("w"), g.value("m")], strategy="dataflow", num_sms=6, tiles=3), tmp_path / "ok")
    assert _corrupt_last_update_wait(tmp_path / "ok", tmp_path / "bad") >= 2
    w, m, x = _inputs()
    w0, m0 = w.clone(), m.clone()

    unsafe = Program.load(tmp_path / "bad", timeout_s=0.5)
    with pytest.raises(LaunchError, match="spin timeout"):
        unsafe({"w": w}, {"m": m}, {"x": x}, {"lr": 0.1})
    # without safe mode the failure leaves a half update (this is what safe mode exists for)
    assert not (torch.equal(w, w0) and torch.equal(m, m0))

    w, m = w0.clone(), m0.clone()
    safe = Program.load(tmp_path / "bad", timeout_s=0.5)
    safe.safe = True
    with pytest.raises(LaunchError, match=r"(?s)spin timeout.*safe update: the 2 parameter/state tensor\(s\)"):
        safe({"w": w}, {"m": m}, {"x": x}, {"lr": 0.1})
    assert torch.equal(w, w0) and torch.equal(m, m0)

    ok = Program.load(tmp_path / "ok")  # the device is still usable; safe mode changes no result
    ok.safe = True
    w1, m1 = w0.clone(), m0.clone()
    ok({"w": w1}, {"m": m1}, {"x": x}, {"lr": 0.1})
    w2, m2 = w0.clone(), m0.clone()
    Program.load(tmp_path / "ok")({"w": w2}, {"m": m2}, {"x": x}, {"lr": 0.1})
    assert torch.equal(w1, w2) and torch.equal(m1, m2) and not torch.equal(w1, w0)


def test_the_runtime_applies_the_shared_input_checks(tmp_path):
    g = momentum_graph()
    build(H.planned([g], [g.value("w"), g.value("m")]), tmp_path)
    prog = Program.load(tmp_path)
    w, m, x = _inputs()
    with pytest.raises(ProgramError, match=r"program 'update' takes no input named 'nosuch'"):
        prog({"w": w}, {"m": m}, {"x": x, "nosuch": x}, {"lr": 0.1})
    with pytest.raises(ProgramError, match=r"batch 'x': dtype torch.int64, the program was built for f32"):
        prog({"w": w}, {"m": m}, {"x": x.long()}, {"lr": 0.1})
    with pytest.raises(ProgramError, match=r"takes no input named 'beta'"):
        prog({"w": w}, {"m": m}, {"x": x}, {"lr": 0.1, "beta": 0.5})
    bad = x.clone()
    bad[3, 5] = float("nan")
    prog({"w": w.clone()}, {"m": m.clone()}, {"x": bad}, {"lr": 0.1})  # off by default: no word
    prog.check_finite = True
    with pytest.raises(ProgramError, match=r"batch 'x' holds 1 non-finite element\(s\) \(the first at index \[3, 5\]"):
        prog({"w": w}, {"m": m}, {"x": bad}, {"lr": 0.1})


def test_a_body_error_after_an_in_place_update_is_undone_in_safe_mode(tmp_path):
    """The update of w runs in the first phase; the embedding's body then reports an index out of
    range (a body error, not a timeout): safe mode puts w back."""
    v = [Value("w", (8,), F, "param"), Value("emb", (11, 4), F, "param"), Value("x", (8,), F, "batch"),
         Value("idx", (5,), "i64", "batch"), Value("u", (8,), F), Value("w2", (8,), F), Value("y", (5, 4), F)]
    nodes = [("scale", "latch::mul", ("x",), ("u",), {"scalar": 0.5}), ("step", "latch::sub", ("w", "u"), ("w2",)),
             ("lookup", "latch::embedding", ("emb", "idx"), ("y",))]
    g = H.graph("update", v, nodes, [("params", ["w", "emb"]), ("batch", ["x", "idx"])],
                [("new_params", ["w2"]), ("metrics", ["y"])], inplace=[("w2", "w")])
    build(H.planned([g], [g.value("w"), g.value("emb")]), tmp_path)  # barrier: one phase per group, in order
    prog = Program.load(tmp_path)
    w, emb, x = torch.randn(8, device="cuda"), torch.randn(11, 4, device="cuda"), torch.randn(8, device="cuda")
    bad = torch.tensor([0, 99, 1, 2, 3], device="cuda")
    w0 = w.clone()
    with pytest.raises(LaunchError, match=r"read index 99, outside \[0, 11\)"):
        prog.run({"w": w, "emb": emb}, {}, {"x": x, "idx": bad})
    assert not torch.equal(w, w0)  # unsafe: the update of w happened before the body error
    w = w0.clone()
    prog.safe = True
    with pytest.raises(LaunchError, match=r"(?s)read index 99, outside \[0, 11\).*safe update: the 1 parameter/state"):
        prog.run({"w": w, "emb": emb}, {}, {"x": x, "idx": bad})
    assert torch.equal(w, w0)
