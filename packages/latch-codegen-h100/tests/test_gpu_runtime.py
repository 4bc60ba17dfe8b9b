"""The runtime on the GPU: one launch per update, in-place updates, both strategies, spin-timeout
and bad-index reports, argument checks on a loaded program, microbatch programs."""

from __future__ import annotations

import shutil
import struct

import pytest
import torch

import h100_handmade as H
from latch_core.ir import Value
from latch_codegen_h100 import build
from latch_codegen_h100 import tables as T
from latch_codegen_h100.runtime import LaunchError, Program, ProgramError

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

F = "f32"
N, DIN, DOUT = 32, 16, 8


def sgd_graph():
    """Linear regression with a hand-written backward and an SGD step, updated in place."""
    v = [Value("w", (DIN, DOUT), F, "param"), Value("b", (DOUT,), F, "param"), Value("x", (N, DIN), F, "batch"),
         Value("t", (N, DOUT), F, "batch"), Value("lr", (), F, "hyper")]
    inter = [("h", (N, DOUT)), ("hb", (N, DOUT)), ("d", (N, DOUT)), ("sq", (N, DOUT)), ("loss", ()),
             ("g", (N, DOUT)), ("xt", (DIN, N)), ("gw", (DIN, DOUT)), ("gb", (DOUT,)), ("uw", (DIN, DOUT)),
             ("w2", (DIN, DOUT)), ("ub", (DOUT,)), ("b2", (DOUT,))]
    v += [Value(n, s, F) for n, s in inter]
    nodes = [
        ("mm", "latch::matmul", ("x", "w"), ("h",)), ("addb", "latch::add", ("h", "b"), ("hb",)),
        ("diff", "latch::sub", ("hb", "t"), ("d",)), ("square", "latch::mul", ("d", "d"), ("sq",)),
        ("mse", "latch::mean", ("sq",), ("loss",), {"dims": (0, 1), "keepdim": False}),
        ("grad", "latch::mul", ("d",), ("g",), {"scalar": 2.0 / (N * DOUT)}),
        ("xT", "latch::permute", ("x",), ("xt",), {"perm": (1, 0)}),
        ("gwmm", "latch::matmul", ("xt", "g"), ("gw",)),
        ("gbsum", "latch::sum", ("g",), ("gb",), {"dims": (0,), "keepdim": False}),
        ("scalew", "latch::mul", ("gw", "lr"), ("uw",)), ("stepw", "latch::sub", ("w", "uw"), ("w2",)),
        ("scaleb", "latch::mul", ("gb", "lr"), ("ub",)), ("stepb", "latch::sub", ("b", "ub"), ("b2",)),
    ]
    return H.graph("update", v, nodes, [("params", ["w", "b"]), ("batch", ["x", "t"]), ("hyper", ["lr"])],
                   [("new_params", ["w2", "b2"]), ("loss", ["loss"])], inplace=[("w2", "w"), ("b2", "b")])


def sgd_reference(w, b, x, t, lr, steps):
    w, b, x, t = (a.double().cpu() for a in (w, b, x, t))
    losses = []
    for _ in range(steps):
        d = x @ w + b - t
        losses.append((d * d).mean())
        g = d * (2.0 / d.numel())
        w, b = w - lr * (x.t() @ g), b - lr * g.sum(0)
    return w, b, losses


def _data(seed=0):
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(DIN, DOUT, generator=gen) * 0.3
    b = torch.randn(DOUT, generator=gen) * 0.1
    x = torch.randn(N, DIN, generator=gen)
    t = torch.randn(N, DOUT, generator=gen)
    return w, b, x, t


def _rel(a, b):
    return ((a.double().cpu() - b.double().cpu()).norm() / b.double().cpu().norm()).item()


def _sgd_program(tmp_path, steps: int, strategy: str = "barrier"):
    """The SGD program built on 6 SMs, its data on the GPU and the FP64 reference of ``steps``
    updates at lr 0.1: (program, (w, b, x, t) on the GPU, (w, b, losses) of the reference)."""
    g = sgd_graph()
    build(H.planned([g], [g.value("w"), g.value("b")], strategy=strategy, num_sms=6, tiles=3), tmp_path)
    w, b, x, t = _data()
    return Program.load(tmp_path), tuple(a.cuda() for a in (w, b, x, t)), sgd_reference(w, b, x, t, 0.1, steps)


@pytest.mark.parametrize("strategy", ["barrier", "dataflow"])
def test_sgd_updates_in_place_with_one_launch_per_update(strategy, tmp_path):
    prog, (wd, bd, xd, td), (ref_w, ref_b, ref_losses) = _sgd_program(tmp_path, 10, strategy)
    ptrs = (wd.data_ptr(), bd.data_ptr())
    losses = []
    for _ in range(10):
        losses.append(prog({"w": wd, "b": bd}, {}, {"x": xd, "t": td}, {"lr": 0.1}))
    assert prog.launches == 10
    assert (wd.data_ptr(), bd.data_ptr()) == ptrs
    assert _rel(wd, ref_w) < 1e-5 and _rel(bd, ref_b) < 1e-5
    for got, want in zip(losses, ref_losses):
        assert abs(got.item() - want.item()) <= 1e-5 * abs(want.item())


def test_a_schedule_double_buffered_batches_and_swapped_storage_follow_the_caller(tmp_path):
    """The launch path's caches on the GPU: a learning rate that changes every step (rewritten in
    place), two batches used in turn (two cached bindings), and a parameter whose storage is
    replaced (``.data = ...``: a new pointer table) all reach the kernel: the result is the FP64
    reference of the same sequence."""
    g = sgd_graph()
    build(H.planned([g], [g.value("w"), g.value("b")], num_sms=6, tiles=3), tmp_path)
    prog = Program.load(tmp_path)
    w, b, x, t = _data()
    _, _, x2, t2 = _data(seed=1)
    lrs = [0.1 * 0.8 ** i for i in range(8)]
    wr, br = w.double(), b.double()
    for i, lr in enumerate(lrs):
        xs, ts = (x, t) if i % 2 == 0 else (x2, t2)
        wr, br, _ = sgd_reference(wr, br, xs, ts, lr, 1)
    wd, bd = w.cuda(), b.cuda()
    batches = [{"x": x.cuda(), "t": t.cuda()}, {"x": x2.cuda(), "t": t2.cuda()}]
    for i, lr in enumerate(lrs):
        if i == 4:  # same object, new storage (its current value)
            wd.data = wd.data.clone()
        prog({"w": wd, "b": bd}, {}, batches[i % 2], {"lr": lr}, check=False)
    prog.check()
    assert _rel(wd, wr) < 1e-5 and _rel(bd, br) < 1e-5
    assert len(prog._bindings["update"]) == 4  # two batches with w, then with the new storage of w


def test_a_prepared_launcher_runs_the_same_updates(tmp_path):
    prog, (wd, bd, xd, td), (ref_w, ref_b, _) = _sgd_program(tmp_path, 5)
    go = prog.launcher("update", {"w": wd, "b": bd}, {}, {"x": xd, "t": td}, {"lr": 0.1})
    for _ in range(5):
        go()
    prog.check()
    assert prog.launches == 5 and _rel(wd, ref_w) < 1e-5 and _rel(bd, ref_b) < 1e-5
    with pytest.raises(ProgramError, match=r"no program 'nope'"):
        prog.launcher("nope")


@pytest.mark.parametrize("strategy", ["barrier", "dataflow"])
def test_launches_captured_into_a_cuda_graph_replay_as_updates(strategy, tmp_path):
    """The epoch lives on the device, so a captured launch replays as a new launch: ten updates,
    one launched, one captured (capture does not run it), nine replays, equal the FP64 reference of
    ten; a capture of a binding's first launch is refused by name."""
    prog, (wd, bd, xd, td), (ref_w, ref_b, _) = _sgd_program(tmp_path, 10, strategy)
    args = ({"w": wd, "b": bd}, {}, {"x": xd, "t": td}, {"lr": 0.1})
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        prog.launch("update", *args)  # the warm-up: binds and uploads the tables
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        prog.launch("update", *args)
    from latch_codegen_h100.runtime import BINDINGS_KEPT

    for _ in range(BINDINGS_KEPT + 1):  # the captured binding leaves the cache; the graph still needs its table
        prog._binding("update", {"w": wd, "b": bd}, {}, {"x": xd.clone(), "t": td}, {"lr": 0.1})
    junk = [torch.full((16,), -1, dtype=torch.int64, device="cuda") for _ in range(256)]  # reuse freed blocks
    for _ in range(9):
        graph.replay()
    del junk
    prog.check()
    assert _rel(wd, ref_w) < 1e-5 and _rel(bd, ref_b) < 1e-5
    xd2 = xd.clone()
    with pytest.raises(ProgramError, match=r"first launch with these tensors is being captured"):
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            prog.launch("update", {"w": wd, "b": bd}, {}, {"x": xd2, "t": td}, {"lr": 0.1})


def test_loaded_program_checks_its_arguments(tmp_path):
    g = sgd_graph()
    build(H.planned([g], [g.value("w"), g.value("b")]), tmp_path)
    prog = Program.load(tmp_path)
    w, b, x, t = (a.cuda() for a in _data())
    with pytest.raises(ProgramError, match=r"batch 'x': shape \[16, 32\]"):
        prog({"w": w, "b": b}, {}, {"x": x.t().contiguous(), "t": t}, {"lr": 0.1})
    with pytest.raises(ProgramError, match=r"param 'b' \(f32\[8\]\) is missing"):
        prog({"w": w}, {}, {"x": x, "t": t}, {"lr": 0.1})
    with pytest.raises(ProgramError, match=r"batch 't': on cpu"):
        prog({"w": w, "b": b}, {}, {"x": x, "t": t.cpu()}, {"lr": 0.1})
    with pytest.raises(ProgramError, match=r"hyper-parameter 'lr' not given"):
        prog({"w": w, "b": b}, {}, {"x": x, "t": t})


def test_spin_timeout_names_sm_task_node_and_counter(tmp_path):
    g = sgd_graph()
    build(H.planned([g], [g.value("w"), g.value("b")], strategy="dataflow", num_sms=4), tmp_path / "ok")
    shutil.copytree(tmp_path / "ok", tmp_path / "bad")
    path = tmp_path / "bad" / "tables" / "update.instrs.bin"
    data = bytearray(path.read_bytes())
    instrs = T.unpack_instrs(bytes(data))
    k = next(i for i, ins in enumerate(instrs) if ins[0] == T.I_WAIT)
    struct.pack_into("<4i", data, 16 * k, T.I_WAIT, instrs[k][1], 1000, 0)  # a wait no launch satisfies
    path.write_bytes(bytes(data))
    bad = Program.load(tmp_path / "bad", timeout_s=0.5)
    w, b, x, t = (a.cuda() for a in _data())
    # Whichever SM times out first is reported; the cause (the corrupted wait) is always named.
    with pytest.raises(LaunchError, match=r"spin timeout in program 'update': SM \d+, task \d+ \(node \w+, op "
                                          r"latch::\w+.*\) waited on counter \d+: value \d+ of target \d+ .*cause: SM "
                                          rf"\d+, task \d+ \(node \w+, op latch::\w+.*\) waits on counter {instrs[k][1]} "
                                          r"for 1000 signals; the program sends \d+"):
        bad({"w": w, "b": b}, {}, {"x": x, "t": t}, {"lr": 0.1})
    ok = Program.load(tmp_path / "ok")  # the device is still usable
    loss = ok({"w": w, "b": b}, {}, {"x": x, "t": t}, {"lr": 0.1})
    assert torch.isfinite(loss)


def test_an_index_out_of_range_is_reported_with_its_task(tmp_path):
    v = [Value("emb", (11, 4), F, "param"), Value("idx", (5,), "i64", "batch"), Value("y", (5, 4), F)]
    g = H.graph("update", v, [("lookup", "latch::embedding", ("emb", "idx"), ("y",))],
                [("params", ["emb"]), ("batch", ["idx"])], [("metrics", ["y"])])
    build(H.planned([g], [g.value("emb")]), tmp_path)
    prog = Program.load(tmp_path)
    emb = torch.randn(11, 4, device="cuda")
    out = prog.run({"emb": emb}, {}, {"idx": torch.tensor([0, 3, 10, 2, 1], device="cuda")})
    assert torch.equal(out["y"], emb[[0, 3, 10, 2, 1]])
    with pytest.raises(LaunchError, match=r"task \d+ \(node lookup, op latch::embedding\) read index 99, outside \[0, 11\)"):
        prog.run({"emb": emb}, {}, {"idx": torch.tensor([0, 99, 1, 2, 3], device="cuda")})


def microbatch_doc(k):
    """accumulate: acc += w * x; accumulate_and_update: w -= 0.1 * (acc + w * x), acc = 0."""
    def prog(name, last):
        v = [Value("w", (8,), F, "param"), Value("acc", (8,), F, "state"), Value("x", (8,), F, "batch"),
             Value("wx", (8,), F), Value("acc2", (8,), F), Value("loss", (), F)]
        nodes = [("m", "latch::mul", ("w", "x"), ("wx",)), ("a", "latch::add", ("acc", "wx"), ("acc2",)),
                 ("l", "latch::sum", ("wx",), ("loss",), {"dims": (0,), "keepdim": False})]
        outs, inplace = [("loss", ["loss"])], []
        if last:
            v += [Value("u", (8,), F), Value("w2", (8,), F), Value("acc3", (8,), F)]
            nodes += [("s", "latch::mul", ("acc2",), ("u",), {"scalar": 0.1}), ("st", "latch::sub", ("w", "u"), ("w2",)),
                      ("z", "latch::mul", ("acc2",), ("acc3",), {"scalar": 0.0})]
            outs = [("new_params", ["w2"]), ("new_state", ["acc3"])] + outs
            inplace = [("w2", "w"), ("acc3", "acc")]
        else:
            outs = [("new_state", ["acc2"])] + outs
            inplace = [("acc2", "acc")]
        return H.graph(name, v, nodes, [("params", ["w"]), ("state", ["acc"]), ("batch", ["x"])], outs, inplace)

    g1, g2 = prog("accumulate", False), prog("accumulate_and_update", True)
    return H.planned([g1, g2], [g1.value("w"), g1.value("acc")], metadata={"microbatches": k})


def test_microbatches_run_k_launches_then_the_update(tmp_path):
    build(microbatch_doc(3), tmp_path)
    prog = Program.load(tmp_path)
    w = torch.randn(8, device="cuda")
    acc = torch.zeros(8, device="cuda")
    xs = [torch.randn(8, device="cuda") for _ in range(3)]
    w0 = w.clone()
    loss = prog({"w": w}, {"acc": acc}, [{"x": x} for x in xs])
    assert prog.launches == 3
    want = w0 - 0.1 * sum(w0 * x for x in xs)
    assert torch.allclose(w, want, rtol=1e-6, atol=1e-6)
    assert torch.equal(acc, torch.zeros(8, device="cuda"))
    assert abs(loss.item() - (w0 * xs[-1]).sum().item()) < 1e-4  # the last program's loss output
    with pytest.raises(ProgramError, match=r"runs 3 microbatches: pass batch as a list of 3"):
        prog({"w": w}, {"acc": acc}, {"x": xs[0]})
