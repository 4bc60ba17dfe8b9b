"""IR records: immutable, validated at construction, errors naming the record and field."""

import attrs
import pytest

import core_golden
from latch_core.ir import DTYPES, Graph, GraphSection, Group, IRError, Node, TensorType, Value


def test_records_are_immutable():
    g = core_golden.small_graph().graph.programs[0]
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        g.name = "other"
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        g.nodes[0].op = "latch::relu"
    assert isinstance(g.nodes, tuple) and isinstance(g.nodes[0].inputs, tuple)


def test_records_are_hashable_and_compare_by_content():
    a, b = core_golden.small_graph(), core_golden.small_graph()
    assert a == b and hash(a) == hash(b)
    assert a != core_golden.scheduled()


def test_source_is_not_part_of_a_nodes_meaning():
    assert Node("n", "latch::relu", ["x"], ["y"], source="a.py:1") == Node("n", "latch::relu", ["x"], ["y"], source="b.py:9")


@pytest.mark.parametrize("make,field,text", [
    (lambda: Value("v", (2,), "float32"), "dtype", "Value.dtype: unknown dtype 'float32'"),
    (lambda: Value("v", (2, -1), "f32"), "shape", "Value.shape: shape (2, -1) has a non-static or negative dimension -1"),
    (lambda: Value("v", (2, None), "f32"), "shape", "non-static"),
    (lambda: Value("v", (True,), "f32"), "shape", "non-static"),
    (lambda: Value("v", (2,), "f32", "weight"), "role", "value 'v': unknown role 'weight'"),
    (lambda: Node("n3", "matmul", [], []), "op", "node 'n3': op name 'matmul' must be namespaced, e.g. 'latch::matmul'"),
    (lambda: TensorType((1,), "complex64"), "dtype", "TensorType.dtype: unknown dtype"),
])
def test_invalid_records_fail_naming_the_field(make, field, text):
    with pytest.raises(IRError) as e:
        make()
    assert text in str(e.value)
    assert e.value.field == field


def test_attributes_must_be_json_data():
    with pytest.raises(IRError, match="attribute value .* of type set is not a JSON scalar or list"):
        Node("n", "latch::x", [], [], {"bad": {1, 2}})


def test_types_and_sizes():
    assert set(DTYPES) >= {"f64", "f32", "bf16", "f16", "i64", "i32", "i8", "u8", "bool"}
    v = Value("v", (4, 3), "bf16", "param")
    assert v.type == TensorType((4, 3), "bf16") and str(v.type) == "bf16[4,3]"
    assert (v.numel, v.nbytes) == (12, 24)
    assert Value("s", (), "f32").numel == 1 and str(TensorType((), "f32")) == "f32[]"
    assert Value("e", (0, 5), "i64").nbytes == 0


def test_lookups_and_errors_that_name_the_program():
    sec = core_golden.programs_regions().graph
    upd = sec.program("accumulate_and_update")
    assert upd.value("w").role == "param" and upd.has_value("zero") and not upd.has_value("nope")
    assert upd.group("hyper").values == ("lr",)
    assert upd.group("new_state", outputs=True).values == ("new_acc",)
    assert upd.input_names() == ["w", "grad_acc.w", "x", "lr"]
    assert upd.output_names() == ["new_w", "new_acc"]
    assert upd.region("sgd_step").name == "sgd_step"
    assert upd.producers()["new_acc"].name == "n1"
    assert [n.name for n in upd.consumers()["grad_acc.w"]] == ["n1"]
    assert sec.meta("microbatches") == 2 and sec.meta("absent", 7) == 7
    with pytest.raises(IRError, match="program 'accumulate_and_update': no value named 'q'"):
        upd.value("q")
    with pytest.raises(IRError, match="no output group 'loss'"):
        upd.group("loss", outputs=True)
    with pytest.raises(IRError, match="no input group 'batchz'"):
        upd.group("batchz")
    with pytest.raises(IRError, match="no region 'loop'"):
        upd.region("loop")
    with pytest.raises(IRError, match=r"graph section: no program 'update'; programs: \['accumulate', 'accumulate_and_update'\]"):
        sec.program("update")


def test_node_attributes():
    n = core_golden.small_graph().graph.programs[0].nodes[4]
    assert n.attr("dims") == (0, 1) and n.attr("keepdim") is False and n.attr("nope", 3) == 3
    assert n.attr_dict == {"dims": (0, 1), "keepdim": False}


def test_evolve_builds_a_new_record_and_leaves_the_old_one():
    g = core_golden.small_graph().graph.programs[0]
    g2 = attrs.evolve(g, values=g.values[:-1])
    assert g.has_value("new_b") and not g2.has_value("new_b")  # the derived lookup follows the new values


def test_group_and_section_convert_lists():
    grp = Group("params", ["a", "b"])
    assert grp.values == ("a", "b")
    sec = GraphSection(programs=[Graph("p", [], [], [grp], [])], metadata={"k": [1, {"z": 1, "a": 2}]})
    assert sec.metadata == (("k", (1, (("a", 2), ("z", 1)))),)
