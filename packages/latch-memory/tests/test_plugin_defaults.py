"""The torch-free, import-light plugin module repeats the plan's default alignment: keep them equal."""

import importlib


def test_plugin_alignment_is_the_plans():
    from latch_memory import plugin

    plan_module = importlib.import_module("latch_memory.plan")  # the module (latch_memory.plan is the function)
    assert plugin.DEFAULT_ALIGNMENT == plan_module.DEFAULT_ALIGNMENT
