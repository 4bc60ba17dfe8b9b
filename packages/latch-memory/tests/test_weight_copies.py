"""memory.weight_copies: a parameter's casts become one BF16 state input, the program that updates
the parameter writes the copy (a cast of the new value, in place over the state), the section's
layout and metadata say so; microbatch programs read it and the last one writes it. Torch-free
(hand-built graphs; the pipeline on the real examples: tests/test_weight_copies.py)."""

from __future__ import annotations

import pytest

from latch_core.document import Document
from latch_core.ir import Graph, GraphSection, Group, Node, Value
from latch_core.lint import check
from latch_memory.weight_copies import META, OUTPUT_GROUP, WeightCopyError, copies_of, make_copies, weight_copies_pass


def _program(name: str, *, update: bool = True, cast_out: bool = False, dtype: str = "bf16") -> Graph:
    """w, v: params; m: state. Forward: y = x.bf16 @ cast(w); z = y @ cast(w) again (a second cast
    of w, as moe.store_operands and memory.policy may each make one) + v (FP32, never cast).
    Update (when ``update``): w_new = w - g, m_new = m + g."""
    V = Value
    values = [V("w", (4, 4), "f32", "param"), V("v", (4, 4), "f32", "param"), V("m", (4, 4), "f32", "state"),
              V("x", (4, 4), "f32", "batch"),
              V("w.bf16", (4, 4), dtype), V("x.bf16", (4, 4), dtype), V("y", (4, 4), "f32"), V("w.bf16_", (4, 4), dtype),
              V("y.bf16", (4, 4), dtype), V("z", (4, 4), "f32"), V("zv", (4, 4), "f32"), V("g", (4, 4), "f32")]
    nodes = [
        Node("cast.w", "latch::cast", ("w",), ("w.bf16",), {"dtype": dtype}, source="model.py:3 in forward"),
        Node("cast.x", "latch::cast", ("x",), ("x.bf16",), {"dtype": dtype}),
        Node("mm", "latch::matmul", ("x.bf16", "w.bf16"), ("y",), {"operand_dtype": dtype}),
        Node("cast.w2", "latch::cast", ("w",), ("w.bf16_",), {"dtype": dtype}),
        Node("cast.y", "latch::cast", ("y",), ("y.bf16",), {"dtype": dtype}),
        Node("mm2", "latch::matmul", ("y.bf16", "w.bf16_"), ("z",), {"operand_dtype": dtype}),
        Node("addv", "latch::add", ("z", "v"), ("zv",)),
        Node("grad", "latch::mul", ("zv", "x"), ("g",)),
    ]
    outputs = [Group("loss", ("zv",))]
    inplace = []
    if update:
        values += [V("new.w", (4, 4), "f32"), V("new.m", (4, 4), "f32")]
        nodes += [Node("sub", "latch::sub", ("w", "g"), ("new.w",), source="optim.py:7 in update"),
                  Node("add", "latch::add", ("m", "g"), ("new.m",))]
        outputs = [Group("new_params", ("new.w",)), Group("new_state", ("new.m",))] + outputs
        inplace = [("new.w", "w"), ("new.m", "m")]
    if cast_out:
        outputs.append(Group("extra", ("w.bf16",)))
    return Graph(name, values, nodes,
                 inputs=[Group("params", ("w", "v")), Group("state", ("m",)), Group("batch", ("x",))],
                 outputs=outputs, inplace=inplace)


def _section(*programs: Graph) -> GraphSection:
    layout = (Value("w", (4, 4), "f32", "param"), Value("v", (4, 4), "f32", "param"), Value("m", (4, 4), "f32", "state"))
    return GraphSection(programs=programs, layout=layout, metadata={"example": "t"})


def test_casts_of_a_parameter_become_one_state_input_the_update_writes():
    before = _section(_program("update"))
    section, report = make_copies(before)
    check(section)  # lint: defined once, topological, in-place pairs well-formed, layout agrees
    g = section.program("update")
    casts = [n for n in g.nodes if n.op == "latch::cast"]
    assert [n.inputs[0] for n in casts] == ["x", "y", "new.w"]  # activations keep theirs; w's two are gone
    assert {n.name: n.inputs for n in g.nodes if n.op == "latch::matmul"} == {
        "mm": ("x.bf16", "w.bf16"), "mm2": ("y.bf16", "w.bf16")}
    assert g.group("state").values == ("m", "w.bf16")
    assert g.value("w.bf16").role == "state" and g.value("w.bf16").dtype == "bf16"
    assert [(v.name, v.role, v.dtype) for v in section.layout][-1] == ("w.bf16", "state", "bf16")
    # the copy is written right after the new weight, from it, with the optimizer's source line
    names = [n.name for n in g.nodes]
    write = g.nodes[names.index("sub") + 1]
    assert write.op == "latch::cast" and write.inputs == ("new.w",) and write.outputs == ("new.w.bf16",)
    assert write.attr("dtype") == "bf16" and write.source == "optim.py:7 in update"
    assert g.group(OUTPUT_GROUP, outputs=True).values == ("new.w.bf16",)
    assert ("new.w.bf16", "w.bf16") in g.inplace
    assert copies_of(section) == {"w.bf16": "w"}
    assert report["programs"] == {"update": {"casts_removed": 2, "copies_written": 1}}
    assert report["never_updated"] == [] and dict(report["dtypes"]) == {"w.bf16": "bf16"}
    assert before == _section(_program("update"))  # the input section is untouched


def test_microbatch_programs_read_the_copy_and_only_the_update_writes_it():
    section, report = make_copies(_section(_program("accumulate", update=False), _program("accumulate_and_update")))
    check(section)
    acc, last = section.program("accumulate"), section.program("accumulate_and_update")
    for g in (acc, last):
        assert "w.bf16" in g.group("state").values
        assert not [n for n in g.nodes if n.op == "latch::cast" and n.inputs[0] == "w"]
    assert OUTPUT_GROUP not in {grp.name for grp in acc.outputs} and not any(o == "w.bf16" for _, o in acc.inplace)
    assert last.group(OUTPUT_GROUP, outputs=True).values == ("new.w.bf16",)
    assert report["programs"] == {"accumulate": {"casts_removed": 2, "copies_written": 0},
                                  "accumulate_and_update": {"casts_removed": 2, "copies_written": 1}}


def test_a_parameter_no_program_updates_keeps_its_copy_and_is_reported():
    section, report = make_copies(_section(_program("forward", update=False)))
    check(section)
    assert copies_of(section) == {"w.bf16": "w"} and report["never_updated"] == ["w"]
    assert section.program("forward").inplace == ()


def test_f16_copies_and_the_name_taken_by_the_removed_cast():
    section, _ = make_copies(_section(_program("update", dtype="f16")))
    check(section)
    assert copies_of(section) == {"w.f16": "w"}
    assert section.program("update").value("w.f16").dtype == "f16"


def test_a_cast_that_is_a_program_output_is_left_alone():
    section, report = make_copies(_section(_program("update", cast_out=True)))
    check(section)
    g = section.program("update")
    assert [n.name for n in g.nodes if n.op == "latch::cast" and n.inputs[0] == "w"] == ["cast.w"]
    assert report["programs"]["update"]["casts_removed"] == 1  # the other cast of w still goes
    assert copies_of(section) == {"w.bf16_": "w"}  # "w.bf16" stays the kept cast's output


def test_without_casts_nothing_changes_but_the_record():
    # a program with no casts at all (the FP32 policy)
    plain = Graph("update", [Value("w", (4, 4), "f32", "param"), Value("m", (4, 4), "f32", "state"),
                             Value("new.w", (4, 4), "f32")],
                  [Node("sub", "latch::sub", ("w", "m"), ("new.w",))],
                  [Group("params", ("w",)), Group("state", ("m",))], [Group("new_params", ("new.w",))],
                  [("new.w", "w")])
    sec = GraphSection(programs=(plain,), layout=(Value("w", (4, 4), "f32", "param"), Value("m", (4, 4), "f32", "state")))
    out, report = make_copies(sec)
    assert out.programs == sec.programs and out.layout == sec.layout
    assert copies_of(out) == {} and dict(dict(report["programs"])["update"]) == {"casts_removed": 0, "copies_written": 0}


def test_the_pass_runs_once_and_says_what_it_did():
    doc = Document(graph=_section(_program("update")))
    out, detail = weight_copies_pass(doc)
    assert detail == "1 weight copies as state (16 elements); update: 2 casts removed, 1 copies written"
    assert out.graph.meta(META) is not None
    with pytest.raises(WeightCopyError, match="ran"):
        weight_copies_pass(out)


def test_registered_and_in_the_pipeline_with_its_switch():
    from latch_core import pipeline
    from latch_core.plugins import registries

    assert "memory.weight_copies" in registries().passes
    assert "memory.weight_copies" in pipeline.Request("ex.py").passes()
    assert "memory.weight_copies" not in pipeline.Request("ex.py", weight_copies=False).passes()
    names = list(pipeline.NAMES)
    # after every pass that stores operands, before anything that schedules
    assert names.index("moe.store_operands") < names.index("memory.weight_copies") < names.index("memory.remat")
