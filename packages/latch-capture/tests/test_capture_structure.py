"""The shape of captured documents: programs, groups, layout, in-place pairs, microbatch programs,
constants, custom-op lowering, sources, and capture of large models on the meta device."""

import os

import torch
from torch import nn

from latch_capture import capture_module, tensor_update
from latch_core.lint import lint_section
from latch_core.registry import OpSpec


def sgd(params, grads, state, hyper):
    return {n: p - hyper["lr"] * grads[n] for n, p in params.items()}, state


def mse(out, target):
    return ((out - target) ** 2).mean()


def momentum():
    def init(params):
        return {"step": torch.zeros(()), "buf": {n: torch.zeros_like(p) for n, p in params.items()}}

    def update(params, grads, state, hyper):
        buf = {n: 0.9 * state["buf"][n] + grads[n] for n in params}
        return {n: p - 0.1 * buf[n] for n, p in params.items()}, {"step": state["step"] + 1, "buf": buf}

    return tensor_update(update, init_state=init)


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3))


def test_single_step_program(ops):
    doc = capture_module(_mlp(), mse, torch.randn(4, 6), torch.randn(4, 3), optimizer=momentum(), grads=True)
    assert [p.name for p in doc.graph.programs] == ["update"]
    assert lint_section(doc.graph, ops, require_known_ops=True) == []
    g = doc.graph.program("update")
    names = ["0.weight", "0.bias", "2.weight", "2.bias"]
    assert [v.name for v in doc.graph.layout] == names + ["step"] + [f"buf.{n}" for n in names]
    assert g.group("params").values == tuple(names)
    assert g.group("batch").values == ("input", "target")
    assert g.group("new_params", outputs=True).values == tuple(f"new.{n}" for n in names)
    assert g.group("grads", outputs=True).values == tuple(f"grad.{n}" for n in names)
    assert dict(g.inplace)["new.buf.0.weight"] == "buf.0.weight"
    assert dict(g.inplace)["new.step"] == "step"
    assert not any(n.op in ("aten::detach", "latch::copy") for n in g.nodes)


def test_microbatch_programs_share_one_layout(ops):
    doc = capture_module(_mlp(), mse, torch.randn(4, 6), torch.randn(4, 3), optimizer=momentum(), microbatches=3)
    sec = doc.graph
    assert [p.name for p in sec.programs] == ["accumulate", "accumulate_and_update"]
    assert sec.meta("microbatches") == 3
    assert lint_section(sec, ops, require_known_ops=True) == []
    layout = {v.name: v for v in sec.layout}
    assert layout["grad_acc.0.weight"].role == "state" and layout["grad_acc.0.weight"].shape == (5, 6)
    assert layout["loss_acc"].shape == ()
    acc, last = sec.program("accumulate"), sec.program("accumulate_and_update")
    # accumulate writes only the accumulators
    assert {old for _, old in acc.inplace} == {n for n in layout if n.startswith("grad_acc.")} | {"loss_acc"}
    assert [g.name for g in acc.outputs] == ["new_state", "loss"]
    # the last microbatch: optimizer over (acc + g) / 3, accumulators reset by latch::full
    assert {old for _, old in last.inplace} == set(layout)
    producers = last.producers()
    assert producers["new.grad_acc.0.weight"].op == "latch::full"
    divs = [n for n in last.nodes if n.op == "latch::div" and n.attr("scalar") == 3.0]
    assert len(divs) == 5  # four gradients and the loss
    for p in sec.programs:
        assert p.input_names() == [v.name for v in sec.layout] + ["input", "target"]


def test_unchanged_state_is_not_written():
    def update(params, grads, state, hyper):
        return {n: p - 0.1 * grads[n] for n, p in params.items()}, state

    opt = tensor_update(update, init_state=lambda p: {"unused": torch.zeros(3)})
    doc = capture_module(_mlp(), mse, torch.randn(4, 6), torch.randn(4, 3), optimizer=opt)
    g = doc.graph.program("update")
    assert [grp.name for grp in g.outputs] == ["new_params", "loss"]
    assert "unused" not in {old for _, old in g.inplace}
    assert any(v.name == "unused" for v in doc.graph.layout)


class WithConstants(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.register_buffer("scale", torch.arange(4.0) + 1)
        self.plain = torch.tensor([0.5, 1.0, 1.5, 2.0])  # a tensor attribute, not a buffer

    def forward(self, x):
        return self.lin(x) * self.scale + self.plain + torch.tensor(3.0)


def test_buffers_and_literals_become_constants(ops):
    doc = capture_module(WithConstants(), mse, torch.randn(2, 4), torch.randn(2, 4), optimizer=tensor_update(sgd),
                         hyper={"lr": 0.1})
    g = doc.graph.program("update")
    consts = {v.name: v for v in g.values if v.role == "const"}
    assert consts["scale"].data == (1.0, 2.0, 3.0, 4.0)
    assert any(v.data == (0.5, 1.0, 1.5, 2.0) for v in consts.values())
    assert any(v.data == (3.0,) and v.shape == () for v in consts.values())
    assert "scale" not in g.input_names()
    assert g.group("hyper").values == ("lr",)
    assert lint_section(doc.graph, ops, require_known_ops=True) == []


def test_backward_nodes_carry_the_forward_line():
    doc = capture_module(_mlp(), mse, torch.randn(4, 6), torch.randn(4, 3), optimizer=momentum())
    g = doc.graph.program("update")
    here = os.path.basename(__file__)
    mm = [n for n in g.nodes if n.op == "latch::matmul"]
    assert len(mm) == 5  # 2 forward; backward: 2 weight gradients, 1 input gradient (layer 2)
    # a model of torch.nn layers only: its line is the layer's forward; backward nodes carry it too
    assert all(n.source and "linear.py" in n.source and "in forward" in n.source for n in mm)
    assert not any("latch_capture" in n.source or "autograd" in n.source for n in mm)
    tanh_bw = [n for n in g.nodes if n.op == "latch::tanh_backward"]
    assert tanh_bw and tanh_bw[0].source is not None
    update_lines = [n.source for n in g.nodes if n.source and here in n.source and "in update" in n.source]
    assert update_lines, "optimizer nodes point at the update function"


def test_unused_parameter_gets_a_zero_gradient():
    class Partial(nn.Module):
        def __init__(self):
            super().__init__()
            self.used = nn.Linear(3, 3)
            self.unused = nn.Linear(3, 3)

        def forward(self, x):
            return self.used(x)

    doc = capture_module(Partial(), mse, torch.randn(2, 3), torch.randn(2, 3), optimizer=tensor_update(sgd),
                         hyper={"lr": 0.1}, grads=True)
    g = doc.graph.program("update")
    assert g.producers()["grad.unused.weight"].op == "latch::full"


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def test_meta_device_model_never_allocates_its_weights():
    """A 268M-parameter model (1 GiB of f32 weights, 3 GiB with AdamW state) captures without memory."""
    import pathlib
    import sys

    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "examples"))
    try:
        from _optim import adamw
    finally:
        sys.path.pop(0)
    model = nn.Sequential(nn.Linear(16384, 8192, device="meta"), nn.ReLU(), nn.Linear(8192, 16384, device="meta"))
    before = _rss_mb()
    doc = capture_module(model, mse, torch.empty(2, 16384, device="meta"), torch.empty(2, 16384, device="meta"),
                         optimizer=adamw(max_norm=1.0), hyper={"lr": 1e-3})
    grown = _rss_mb() - before
    params = sum(v.numel for v in doc.graph.layout if v.role == "param")
    assert params == 2 * 16384 * 8192 + 8192 + 16384
    assert grown < 400, f"capture grew the process by {grown:.0f} MB"


def test_latch_namespace_ops_lower_generically():
    """torch.ops.latch.NAME -> latch::NAME: tensors in schema order (None when absent), other
    arguments as attributes by schema name, every result an output; the backward op too."""
    from latch_core.ir import TensorType
    from latch_core.plugins import load_with
    from latch_core.hookspecs import hookimpl

    lib = "latch::_capture_test_axpy"
    if not hasattr(torch.ops.latch, "_capture_test_axpy"):
        @torch.library.custom_op(lib, mutates_args=())
        def axpy(x: torch.Tensor, y: torch.Tensor | None, alpha: float, twice: bool) -> tuple[torch.Tensor, torch.Tensor]:
            out = alpha * x + (y if y is not None else 0)
            return out, (out * 2 if twice else out.clone())

        @axpy.register_fake
        def _(x, y, alpha, twice):
            return torch.empty_like(x), torch.empty_like(x)

        @torch.library.custom_op("latch::_capture_test_axpy_backward", mutates_args=())
        def axpy_bw(g: torch.Tensor, alpha: float) -> torch.Tensor:
            return g * alpha

        @axpy_bw.register_fake
        def _(g, alpha):
            return torch.empty_like(g)

        def setup(ctx, inputs, output):
            ctx.alpha = inputs[2]

        def backward(ctx, g0, g1):
            return torch.ops.latch._capture_test_axpy_backward(g0, ctx.alpha), None, None, None

        axpy.register_autograd(backward, setup_context=setup)

    def infer(inputs, attrs):
        assert set(attrs) == {"alpha", "twice"}
        return [inputs[0], inputs[0]]

    class Specs:
        @hookimpl
        def latch_register_ops(self, register):
            register(OpSpec(lib, "axpy(x, y?) {alpha, twice}", infer, num_inputs=(2, 2)))
            register(OpSpec("latch::_capture_test_axpy_backward", "axpy_backward(g) {alpha}",
                            lambda i, a: [i[0]], num_inputs=(1, 1)))

    from latch_ops import plugin as core_ops

    regs = load_with(("core-ops", core_ops), ("axpy", Specs()), entry_points=False)

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.ones(3))

        def forward(self, x):
            out, _ = torch.ops.latch._capture_test_axpy(self.w * x, None, 2.5, True)
            return out

    doc = capture_module(M(), mse, torch.randn(3), torch.randn(3), optimizer=tensor_update(sgd), hyper={"lr": 0.1},
                         ops=regs.ops)
    g = doc.graph.program("update")
    (fwd,) = [n for n in g.nodes if n.op == lib]
    assert fwd.inputs[1] is None and len(fwd.outputs) == 2
    assert fwd.attr_dict == {"alpha": 2.5, "twice": True}
    (bwd,) = [n for n in g.nodes if n.op == "latch::_capture_test_axpy_backward"]
    assert bwd.attr_dict == {"alpha": 2.5}
    assert g.value(fwd.outputs[0]).type == TensorType((3,), "f32")


def test_keyword_inputs_and_progress_messages():
    class TwoInputs(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(3, 2)
            self.b = nn.Linear(4, 2)

        def forward(self, left, right, scale=None):
            return self.a(left) + self.b(right) * scale

    messages = []
    doc = capture_module(TwoInputs(), mse, {"left": torch.randn(2, 3), "right": torch.randn(2, 4), "scale": 2.0},
                         torch.randn(2, 2), optimizer=tensor_update(sgd), hyper={"lr": 0.1}, progress=messages.append)
    g = doc.graph.program("update")
    assert g.group("batch").values == ("input.left", "input.right", "target")
    assert doc.graph.meta("inputs_style") == "kwargs"
    mul = [n for n in g.nodes if n.op == "latch::mul" and n.attr("scalar") == 2.0]
    assert mul, "the static keyword argument is a constant of the graph"
    assert any("tracing forward + backward" in m for m in messages)
    assert any(m.startswith("capture: done in") for m in messages)


def test_bind_inputs_gives_data_not_autograd_leaves():
    from latch_capture import advance, bind_inputs, program_inputs

    model = _mlp()
    opt = momentum()
    doc = capture_module(model, mse, torch.randn(4, 6), torch.randn(4, 3), optimizer=opt, microbatches=2)
    flat = bind_inputs(doc, params=dict(model.named_parameters()), state=opt.initial_state(dict(model.named_parameters())),
                       inputs=torch.randn(4, 6), targets=torch.randn(4, 3))
    assert not any(t.requires_grad for t in flat.values())
    assert torch.count_nonzero(flat["grad_acc.0.weight"]) == 0 and flat["loss_acc"].shape == ()
    acc = doc.graph.program("accumulate")
    assert set(program_inputs(acc, flat)) == set(acc.input_names())
    fake_out = {new: torch.ones(acc.value(new).shape) for new, _ in acc.inplace}
    nxt = advance(acc, flat, fake_out)
    assert torch.equal(nxt["grad_acc.0.weight"], torch.ones(5, 6)) and nxt["0.weight"] is flat["0.weight"]
