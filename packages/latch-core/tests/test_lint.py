"""lint(): every kind of ill-formed graph is reported, naming program, node, source and value."""

import attrs
import pytest

import core_golden
from core_ops import OPS, CoreTestOps
from latch_core import plugins
from latch_core.ir import Graph, GraphSection, Group, Node, Value
from latch_core.lint import LintError, check, lint, lint_section
from latch_core.registry import OpSpec

SRC = "examples/linreg.py:19 in objective"


@pytest.fixture(scope="module")
def ops():
    return plugins.load_with(("core-test-ops", CoreTestOps()), entry_points=False).ops


def base() -> Graph:
    return core_golden.small_graph().graph.programs[0]


def with_values(g, values):
    return attrs.evolve(g, values=values)


def replace_node(g, i, **changes):
    nodes = list(g.nodes)
    nodes[i] = attrs.evolve(nodes[i], **changes)
    return attrs.evolve(g, nodes=nodes)


def retype(g, name, **changes):
    return with_values(g, [attrs.evolve(v, **changes) if v.name == name else v for v in g.values])


def test_golden_graph_is_clean(ops):
    assert lint(base(), ops, require_known_ops=True) == []
    check(core_golden.small_graph().graph, ops)  # no raise


CASES = [
    ("value declared twice",
     lambda g: with_values(g, g.values + (Value("mm", (8, 3), "f32"),)),
     "program 'update': value 'mm' is declared twice"),
    ("input group names an undeclared value",
     lambda g: attrs.evolve(g, inputs=g.inputs + (Group("state", ["ghost"]),)),
     "input group 'state' names undeclared value 'ghost'"),
    ("an input listed twice",
     lambda g: attrs.evolve(g, inputs=g.inputs + (Group("state", ["w"]),)),
     "value 'w' is a program input twice"),
    ("intermediate as an input",
     lambda g: attrs.evolve(retype(g, "lr", role="intermediate")),
     "input 'lr' has role 'intermediate'"),
    ("const without data",
     lambda g: retype(g, "two_over_n", data=None),
     "constant 'two_over_n' has no data"),
    ("node name used twice",
     lambda g: replace_node(g, 3, name="n2"),
     "node 'n2' (latch::mul) (from examples/linreg.py:19 in objective): node name used twice"),
    ("reads an undeclared value",
     lambda g: replace_node(g, 2, inputs=["pred", "why"]),
     f"node 'n2' (latch::sub) (from {SRC}): reads undeclared value 'why'"),
    ("not in topological order",
     lambda g: attrs.evolve(g, nodes=(g.nodes[1], g.nodes[0]) + g.nodes[2:]),
     "node 'n1' (latch::add) (from examples/linreg.py:14 in forward): reads 'mm' before it is defined "
     "(nodes must be in topological order)"),
    ("writes an undeclared value",
     lambda g: replace_node(g, 3, outputs=["sq2"]),
     "node 'n3' (latch::mul) (from examples/linreg.py:19 in objective): writes undeclared value 'sq2'"),
    ("value defined twice",
     lambda g: replace_node(g, 3, outputs=["diff"]),
     "node 'n3' (latch::mul) (from examples/linreg.py:19 in objective): value 'diff' is defined more than once"),
    ("node writes an input",
     lambda g: replace_node(g, 3, outputs=["lr"]),
     "node 'n3' (latch::mul) (from examples/linreg.py:19 in objective): output 'lr' has role 'hyper'"),
    ("operands do not fit the op",
     lambda g: replace_node(g, 0, inputs=["w", "x"]),
     "node 'n0' (latch::matmul) (from examples/linreg.py:14 in forward): operands do not fit the op: "
     "inner dimensions differ"),
    ("wrong operand count",
     lambda g: replace_node(g, 1, inputs=["mm"]),
     "node 'n1' (latch::add) (from examples/linreg.py:14 in forward): operands do not fit the op: "
     "latch::add takes 2..2 operands, got 1"),
    ("declared output type disagrees with the rule",
     lambda g: retype(g, "loss", shape=(1,)),
     "node 'n4' (latch::mean) (from examples/linreg.py:19 in objective): output 'loss' declared f32[1], "
     "the op's rule gives f32[]"),
    ("dtype disagrees with the rule",
     lambda g: retype(g, "pred", dtype="bf16"),
     "output 'pred' declared bf16[8,3], the op's rule gives f32[8,3]"),
    ("output count disagrees with the rule",
     lambda g: replace_node(with_values(g, g.values + (Value("extra", (3,), "f32"),)), 11, outputs=["ub", "extra"]),
     "node 'n11' (latch::mul) (from examples/linreg.py:25 in sgd): op produces 1 outputs, node declares 2"),
    ("declared, never defined",
     lambda g: with_values(g, g.values + (Value("orphan", (1,), "f32"),)),
     "program 'update': value 'orphan' is declared but never defined"),
    ("output group names an undefined value",
     lambda g: attrs.evolve(g, outputs=g.outputs + (Group("metrics", ["nothing"]),)),
     "output group 'metrics' names undefined value 'nothing'"),
    ("in-place pair names an undeclared value",
     lambda g: attrs.evolve(g, inplace=g.inplace + (("zz", "w"),)),
     "in-place pair ('zz' -> 'w') names an undeclared value"),
    ("in-place target is not an input",
     lambda g: attrs.evolve(g, inplace=(("new_w", "uw"), ("new_b", "b"))),
     "in-place pair ('new_w' -> 'uw'): 'uw' is not a program input"),
    ("in-place source is not an output",
     lambda g: attrs.evolve(g, inplace=(("uw", "w"), ("new_b", "b"))),
     "in-place pair ('uw' -> 'w'): 'uw' is not a program output"),
    ("in-place types differ",
     lambda g: attrs.evolve(g, inplace=(("new_w", "b"),)),
     "in-place pair ('new_w' -> 'b'): f32[4,3] != f32[3]"),
    ("an input overwritten twice",
     lambda g: attrs.evolve(g, inplace=(("new_w", "w"), ("new_w", "w"))),
     "an input is overwritten by two in-place outputs"),
]


@pytest.mark.parametrize("mutate,expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_each_problem_is_reported_with_its_culprit(ops, mutate, expected):
    problems = lint(mutate(base()), ops)
    assert any(expected in p for p in problems), problems


def test_unknown_ops_are_skipped_unless_required(ops):
    g = replace_node(base(), 3, op="vendor::fancy")
    assert lint(g, ops) == []
    assert lint(g, ops, require_known_ops=True) == [
        "program 'update' node 'n3' (vendor::fancy) (from examples/linreg.py:19 in objective): "
        "unknown op 'vendor::fancy'; install the plugin that provides it"]


def test_a_crashing_shape_rule_is_reported_as_that_rule_bug():
    def broken(inputs, attrs):
        raise KeyError("dims")

    from latch_core.registry import Registry
    reg = Registry("op")
    for spec in OPS:
        reg.add(spec.name, attrs.evolve(spec, infer=broken) if spec.name == "latch::mean" else spec, "t")
    problems = lint(base(), reg)
    assert problems == ["program 'update' node 'n4' (latch::mean) (from examples/linreg.py:19 in objective): "
                        "shape rule of latch::mean raised KeyError: 'dims'"]


def test_regions_are_linted_too(ops):
    doc = core_golden.programs_regions()
    upd = doc.graph.programs[1]
    assert lint(upd, ops) == []
    body = upd.regions[0]
    bad_body = attrs.evolve(body, nodes=tuple(reversed(body.nodes)))
    problems = lint(attrs.evolve(upd, regions=[bad_body]), ops)
    assert any("program 'sgd_step' node 'r1' (latch::sub): reads 'u' before it is defined" in p for p in problems)


def test_section_checks_layout_and_program_names(ops):
    sec = core_golden.programs_regions().graph
    assert lint_section(sec, ops) == []
    twice = attrs.evolve(sec, programs=sec.programs + (sec.programs[0],))
    assert "graph section: program names repeat: ['accumulate', 'accumulate_and_update', 'accumulate']" \
        in lint_section(twice, ops)
    missing = attrs.evolve(sec, layout=sec.layout[:1])
    assert "program 'accumulate': 'grad_acc.w' is a state but not in the layout" in lint_section(missing, ops)
    wrong = attrs.evolve(sec, layout=(attrs.evolve(sec.layout[0], shape=(5,)), sec.layout[1]))
    assert "program 'accumulate': 'w' is f32[4] but the layout says f32[5]" in lint_section(wrong, ops)


def test_check_raises_with_all_problems_and_truncates_long_lists():
    g = base()
    many = with_values(g, g.values + tuple(Value(f"orphan{i}", (1,), "f32") for i in range(25)))
    with pytest.raises(LintError) as e:
        check(many)
    assert len(e.value.problems) == 25
    assert str(e.value).startswith("25 problem(s) in the graph:")
    assert "... and 5 more" in str(e.value)
    with pytest.raises(LintError):
        check(GraphSection(programs=[many]))


def test_an_empty_program_is_valid():
    assert lint(Graph("p", [], [], [], [])) == []


def test_optional_operands_may_be_absent():
    spec = OpSpec("t::opt", "opt(x, bias?)", lambda ins, a: [ins[0]], num_inputs=(2, 2))
    from latch_core.registry import Registry
    reg = Registry("op")
    reg.add(spec.name, spec, "t")
    g = Graph("p", [Value("x", (2,), "f32", "batch"), Value("y", (2,), "f32")],
              [Node("n", "t::opt", ["x", None], ["y"])], [Group("batch", ["x"])], [Group("out", ["y"])])
    assert lint(g, reg) == []
