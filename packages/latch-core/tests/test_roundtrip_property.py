"""Property: every valid document survives the JSON round trip exactly (``loads(dumps(d)) == d``)."""

import json

import attrs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core_strategies import (
    attr_values, build_sections, documents, graph_sections, graphs, memory_sections, schedule_sections,
)
from latch_core.document import Document, dumps, loads
from latch_core.ir import NAN, Graph, GraphSection, Node, freeze_attrs
from latch_core.lint import lint, lint_section

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(graphs())
def test_random_graphs_are_valid_and_round_trip(g):
    assert lint(g) == []  # the strategy makes valid graphs: the property is about valid ones
    doc = Document(graph=GraphSection(programs=[g]))
    text = dumps(doc)
    back = loads(text)
    assert back == doc
    assert dumps(back) == text  # the encoding is canonical: stable under a second trip


@SETTINGS
@given(graph_sections())
def test_multi_program_sections_lint_clean_and_round_trip(section):
    assert lint_section(section) == []
    doc = Document(graph=section)
    assert loads(dumps(doc)) == doc


@SETTINGS
@given(documents())
def test_whole_documents_round_trip_compact_and_indented(doc):
    assert loads(dumps(doc)) == doc
    assert loads(dumps(doc, indent=1)) == doc
    json.loads(dumps(doc), parse_constant=_no_constants)  # strict JSON: no NaN/Infinity literals


def _no_constants(name):
    raise AssertionError(f"dumps wrote the non-JSON literal {name}")


@SETTINGS
@given(schedule_sections(), memory_sections(), build_sections)
def test_each_stage_section_round_trips_alone(schedule, memory, build):
    for doc in (Document(schedule=schedule), Document(memory=memory), Document(build=build)):
        assert loads(dumps(doc)) == doc


@SETTINGS
@given(attr_values)
def test_any_attribute_value_round_trips_inside_a_node(v):
    n = Node("n", "latch::x", [], [], {"a": v})
    doc = Document(graph=GraphSection(programs=[Graph("p", [], [n], [], [])]))
    assert loads(dumps(doc)).graph.programs[0].nodes[0] == n


def test_nan_attributes_compare_equal_after_the_round_trip():
    # NaN != NaN; the IR keeps one canonical NaN object so equal records stay equal.
    def make():
        return Node("n", "latch::x", [], [], {"x": float("nan"), "y": [float("nan")]})

    a = make()
    assert a.attr("x") is NAN and a.attr("y")[0] is NAN
    assert a == make() and hash(a) == hash(make())
    doc = Document(graph=GraphSection(programs=[Graph("p", [], [a], [], [])]))
    assert loads(dumps(doc)) == doc


def test_dicts_become_sorted_pairs_so_key_order_does_not_matter():
    assert freeze_attrs({"b": 1, "a": {"y": 2, "x": [3]}}) == (("a", (("x", (3,)), ("y", 2))), ("b", 1))
    assert Node("n", "a::b", [], [], {"p": {"b": 1, "a": 2}}) == Node("n", "a::b", [], [], {"p": {"a": 2, "b": 1}})


@settings(max_examples=30, deadline=None)
@given(graphs(), st.sampled_from(["name", "value", "attr"]))
def test_a_changed_document_does_not_compare_equal(g, what):
    # The round-trip property would hold vacuously if equality ignored fields: check it does not.
    doc = Document(graph=GraphSection(programs=[g]))
    if what == "name":
        g2 = attrs.evolve(g, name=g.name + "x")
    elif what == "value":
        v = g.values[0]
        g2 = attrs.evolve(g, values=(attrs.evolve(v, shape=v.shape + (7,)),) + g.values[1:])
    else:
        g2 = attrs.evolve(g, nodes=g.nodes + (Node("extra", "latch::x", [], [], {"k": 1}),))
    other = Document(graph=GraphSection(programs=[g2]))
    assert loads(dumps(other)) != doc
