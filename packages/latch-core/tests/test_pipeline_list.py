"""latch_core.pipeline: the list, what a request switches off, sub-lists, and a missing stage's
package named (latch-core alone registers none of the stages)."""

import pytest

from latch_core import pipeline
from latch_core.document import Document
from latch_core.passes import Pass, PassError
from latch_core.registry import Registry


def test_the_list_reads_top_to_bottom():
    assert pipeline.NAMES == ("capture", "memory.policy", "memory.fuse_cross_entropy", "moe.store_operands",
                              "moe.route_split", "moe.fixed_order_scatters", "ops.embedding_grad_sum", "memory.weight_copies", "memory.remat",
                              "schedule.matmul_layouts",
                              "schedule.split_reductions", "schedule.matmul_configs", "schedule.fuse_views", "schedule.alias_views",
                              "schedule",
                              "memory.plan", "schedule.validate", "build")
    r = pipeline.Request("ex.py")
    assert r.passes() == [n for n in pipeline.NAMES if n != "memory.remat"]
    assert pipeline.Request("ex.py", policy=False, build=False, split_reductions=False, remat_budget=10).passes() == [
        "capture", "memory.fuse_cross_entropy", "moe.route_split", "moe.fixed_order_scatters", "ops.embedding_grad_sum",
        "memory.weight_copies", "memory.remat",
        "schedule.matmul_layouts",
        "schedule.matmul_configs", "schedule.fuse_views", "schedule.alias_views", "schedule", "memory.plan",
        "schedule.validate"]
    assert pipeline.Request("ex.py", matmul_layouts=False, matmul_configs=False, fuse_cross_entropy=False,
                            alias_views=False, fuse_views=False, weight_copies=False, route_split=False).passes() == [
        "capture", "memory.policy", "moe.store_operands", "moe.fixed_order_scatters", "ops.embedding_grad_sum",
        "schedule.split_reductions",
        "schedule", "memory.plan", "schedule.validate",
        "build"]
    opts = pipeline.Request("ex.py", scheduler="dataflow", num_sms=8, remat_budget=10).options()
    assert opts["schedule"] == {"num_sms": 8, "scheduler": "dataflow", "alias_views": True, "row_groups": True,
                               "fuse_concat": True} and \
        opts["memory.remat"] == {"budget_bytes": 10}
    assert opts["capture"]["example"] == "ex.py"
    assert pipeline.Request("ex.py", alias_views=False).options()["schedule"]["alias_views"] is False
    assert pipeline.Request("ex.py", row_groups=False).options()["schedule"]["row_groups"] is False
    assert pipeline.Request("ex.py", fuse_views=False).options()["schedule"]["fuse_concat"] is False
    assert "schedule.fuse_views" not in pipeline.Request("ex.py", fuse_views=False).passes()


def test_sub_lists():
    assert pipeline.sub_list("schedule..build") == ["schedule", "memory.plan", "schedule.validate", "build"]
    assert pipeline.sub_list("..memory.policy,core.lint") == ["capture", "memory.policy", "core.lint"]
    # the whole list and a range hold what a default compile runs: memory.remat (off unless given a
    # byte budget) only when named, or as a range's end
    assert pipeline.sub_list("pipeline") == [n for n in pipeline.NAMES if n != "memory.remat"]
    assert "memory.remat" not in pipeline.sub_list("..schedule.validate")
    assert pipeline.sub_list("memory.weight_copies..memory.remat") == ["memory.weight_copies", "memory.remat"]
    assert pipeline.sub_list("memory.remat") == ["memory.remat"]
    with pytest.raises(PassError, match="runs backwards"):
        pipeline.sub_list("build..capture")
    with pytest.raises(PassError, match="not a stage of the pipeline"):
        pipeline.sub_list("nope..build")


def test_run_resolves_names_and_names_a_missing_package():
    reg = Registry("pass")
    seen = []
    reg.add("memory.policy", Pass("memory.policy", lambda d, **o: (seen.append(o) or d, "ran")), "test")
    doc = pipeline.run(["memory.policy"], Document(), {"memory.policy": {"x": 1}}, registry=reg)
    assert seen == [{"x": 1}] and doc.provenance[-1].name == "memory.policy" and doc.provenance[-1].detail == "ran"
    with pytest.raises(PassError, match="pass 'build' .* is registered by latch-codegen-h100, which is not installed"):
        pipeline.run(["memory.policy", "build"], Document(), registry=reg)
    assert len(seen) == 1  # resolved before anything runs
    with pytest.raises(Exception, match="no pass named 'typo'"):
        pipeline.run(["typo"], Document(), registry=reg)
