"""memory.policy: dtype attributes per op class, overrides, master dtype check."""

import attrs
import pytest

from latch_core.document import program_doc
from latch_core.passes import run_pass
from latch_memory.plugin import POLICY
from latch_memory.policy import PolicyError, apply_policy
from latch_memory.testing import mlp_graph, test_registry, two_weight_graph

REG = test_registry()


def _attrs(section, prog="update"):
    return {n.name: n.attr_dict for n in section.program(prog).nodes}


def test_default_policy_per_op_class():
    doc = run_pass(POLICY, program_doc(mlp_graph(layers=2)), registry=REG)
    a = _attrs(doc.graph)
    assert a["n_pre0"]["operand_dtype"] == "bf16" and a["n_pre0"]["accum_dtype"] == "f32"  # matmul
    assert a["n_loss"] == {"accum_dtype": "f32"}  # reduction
    assert a["n_nx0"] == {"accum_dtype": "f32"}  # norm
    assert a["n_a0"] == {} and a["n_w0_new"] == {}  # elementwise: computed in the values' dtype
    assert a["n_da1"] == {"scalar": 2.0}  # other attributes survive
    meta = dict(dict(doc.graph.metadata)["memory.policy"])
    assert meta["master"] == "f32" and dict(meta["counts"])["operand_dtype=bf16"] == 2 * 2 + 1
    assert doc.provenance[-1].name == "memory.policy"


def test_overrides_by_tag_op_and_node():
    g = program_doc(two_weight_graph()).graph
    sec, _ = apply_policy(g, REG, table={"matmul": {"operand_dtype": "f16"}, "reduction": None},
                          ops_table={"test::transpose": {"accum_dtype": "f64"}},
                          nodes={"n_g1": {"operand_dtype": None}, "n_y": {"operand_dtype": "f32"}})
    a = _attrs(sec)
    assert a["n_pre"] == {"operand_dtype": "f16", "accum_dtype": "f32"}  # tag entry merged over default
    assert a["n_loss"] == {}  # reduction class dropped
    assert a["n_hT"] == {"accum_dtype": "f64"}  # per op
    assert a["n_g1"] == {"accum_dtype": "f32"}  # per node removal
    assert a["n_y"]["operand_dtype"] == "f32"
    assert a["n_dy"] == {"scalar": 2.0}
    again, _ = apply_policy(sec, REG, table={"matmul": {"operand_dtype": "f16"}, "reduction": None},
                            ops_table={"test::transpose": {"accum_dtype": "f64"}},
                            nodes={"n_g1": {"operand_dtype": None}, "n_y": {"operand_dtype": "f32"}})
    assert again.programs == sec.programs  # idempotent


def test_user_errors_name_the_culprit():
    g = program_doc(two_weight_graph()).graph
    with pytest.raises(PolicyError, match="op class 'matmull'"):
        apply_policy(g, REG, table={"matmull": {"operand_dtype": "bf16"}})
    with pytest.raises(PolicyError, match=r"table\['matmul'\].operand_dtype = 'bfloat16' is not a dtype"):
        apply_policy(g, REG, table={"matmul": {"operand_dtype": "bfloat16"}})
    with pytest.raises(PolicyError, match="has key 'dtype'"):
        apply_policy(g, REG, nodes={"n_y": {"dtype": "bf16"}})
    with pytest.raises(PolicyError, match="names 'n_nope', which is no node"):
        apply_policy(g, REG, nodes={"n_nope": {"operand_dtype": "bf16"}})
    prog = g.programs[0]
    odd = attrs.evolve(prog, nodes=[attrs.evolve(prog.nodes[1], op="other::mm")] + list(prog.nodes[2:]))
    with pytest.raises(PolicyError, match=r"node 'n_pre' \(from two_weight.py:2 in update\) uses op 'other::mm'"):
        apply_policy(attrs.evolve(g, programs=[odd]), REG)


def test_master_dtype_is_checked():
    g = program_doc(two_weight_graph()).graph
    prog = g.programs[0]
    vals = [attrs.evolve(v, dtype="bf16") if v.name == "w2" else v for v in prog.values]
    bad = attrs.evolve(g, programs=[attrs.evolve(prog, values=vals)])
    with pytest.raises(PolicyError, match="param 'w2' is bf16.*master=None"):
        apply_policy(bad, REG)
    apply_policy(bad, REG, master=None)  # the user opted out: fine
    vals = [attrs.evolve(v, dtype="bf16") if v.name == "g1" else v for v in prog.values]
    with pytest.raises(PolicyError, match="gradient 'g1' is bf16"):
        apply_policy(attrs.evolve(g, programs=[attrs.evolve(prog, values=vals)]), REG)


def test_repeat_regions_get_the_policy_inside():
    from latch_core.ir import Graph, Group, Node, Value
    from latch_memory.remat import remat_program

    body = Graph("body", [Value("h", (4, 4), "f32", "param"), Value("w", (4, 4), "f32", "param"),
                          Value("h2", (4, 4), "f32")],
                 [Node("mm", "test::matmul", ("h", "w"), ("h2",))],
                 [Group("params", ("h", "w"))], [Group("out", ("h2",))])
    top = Graph("loop", [Value("h0", (4, 4), "f32", "param"), Value("w", (4, 4), "f32", "param"),
                         Value("hN", (4, 4), "f32")],
                [Node("rep", "latch::repeat", ("h0", "w"), ("hN",), {"region": "body", "times": 3})],
                [Group("params", ("h0", "w"))], [Group("out", ("hN",))], regions=[body])
    sec, _ = apply_policy(program_doc(top).graph, REG)
    prog = sec.program("loop")
    assert prog.nodes[0].attr_dict == {"region": "body", "times": 3}
    assert prog.region("body").nodes[0].attr_dict == {"operand_dtype": "bf16", "accum_dtype": "f32"}
    g2, st = remat_program(prog, REG, budget_bytes=0)  # nothing to recompute, and no error
    assert g2 == prog and st["recomputed"] == 0
