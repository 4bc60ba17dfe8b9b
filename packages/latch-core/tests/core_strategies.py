"""Hypothesis strategies for random VALID documents (they pass ``lint`` with no op registry).

Coverage is the point: every dtype and role, attributes of every JSON kind (None, bool, int, float
incl. inf/-inf/nan, str incl. non-ASCII, nested lists, dicts, which the IR keeps as sorted pairs),
consts with data, optional operands (None inputs), several outputs per node, regions, in-place
pairs, multi-program sections, and the schedule, memory and build sections.

Float fields of section records (``Task.cost``, ``Provenance.seconds``) draw no NaN: NaN is only
equal to itself by identity, which the codec guarantees for attribute data (one canonical NaN
object, ``latch_core.ir.NAN``) but not for a plain float field constructed by the caller.
"""

from __future__ import annotations

from hypothesis import strategies as st

from latch_core.document import Document, Provenance
from latch_core.ir import DTYPES, Graph, GraphSection, Group, Node, Value
from latch_core.sections import (
    Access, BuildSection, Counter, FusionGroup, MemorySection, Placement, ProgramMemory, ProgramSchedule,
    ScheduleSection, Task,
)

INPUT_ROLES = ("param", "state", "batch", "hyper")
GROUP_OF = {"param": "params", "state": "state", "batch": "batch", "hyper": "hyper"}

text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=6)
dtypes = st.sampled_from(sorted(DTYPES))
shapes = st.lists(st.integers(0, 5), max_size=3).map(tuple)
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True), text,
)
attr_values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(text, children, max_size=3),
    max_leaves=8,
)
attr_dicts = st.dictionaries(text, attr_values, max_size=4)
finite = st.floats(allow_nan=False, allow_infinity=False, width=64)


@st.composite
def graphs(draw, name: str = "update", *, depth: int = 1, prefix: str = "") -> Graph:
    tag = draw(text)  # odd characters in every name: the codec must not care
    values: list[Value] = []
    groups: dict[str, list[str]] = {}
    defined: list[str] = []

    def fresh(kind: str) -> str:
        return f"{prefix}{kind}{len(values)}{tag}"

    for role in draw(st.lists(st.sampled_from(INPUT_ROLES), min_size=1, max_size=5)):
        v = Value(fresh(role[0]), draw(shapes), draw(dtypes), role)
        values.append(v)
        groups.setdefault(GROUP_OF[role], []).append(v.name)
        defined.append(v.name)
    for _ in range(draw(st.integers(0, 2))):
        data = draw(st.lists(st.one_of(finite, st.integers(-100, 100), st.booleans()), max_size=4))
        v = Value(fresh("c"), (len(data),), draw(dtypes), "const", data=data)
        values.append(v)
        defined.append(v.name)

    nodes: list[Node] = []
    for k in range(draw(st.integers(0, 6))):
        ins = draw(st.lists(st.one_of(st.none(), st.sampled_from(defined)), max_size=3))
        outs = []
        for _ in range(draw(st.integers(1, 2))):
            v = Value(fresh("t"), draw(shapes), draw(dtypes))
            values.append(v)
            outs.append(v.name)
        op = f"{draw(st.sampled_from(['latch', 'demo', 'x.y']))}::{draw(text)}"
        nodes.append(Node(f"n{k}{tag}", op, ins, outs, draw(attr_dicts), draw(st.none() | text)))
        defined.extend(outs)

    # In-place pairs: a fresh output of exactly the overwritten input's type.
    inplace = []
    new_values = []
    for old_name in draw(st.lists(st.sampled_from([v.name for v in values if v.role in ("param", "state")] or ["-"]),
                                  unique=True, max_size=2)):
        if old_name == "-":
            continue
        old = next(v for v in values if v.name == old_name)
        new = Value(fresh("new"), old.shape, old.dtype)
        values.append(new)
        nodes.append(Node(f"u{len(nodes)}{tag}", "latch::copy", [old_name], [new.name]))
        inplace.append((new.name, old_name))
        new_values.append(new.name)

    outputs = [Group("out", draw(st.lists(st.sampled_from(defined), max_size=3)))]
    if new_values:
        outputs.insert(0, Group("new_params", new_values))
    regions = []
    if depth > 0:
        regions = draw(st.lists(graphs(name="region", depth=depth - 1), max_size=1))
    inputs = [Group(g, groups[g]) for g in ("params", "state", "batch", "hyper") if g in groups]
    return Graph(name, values, nodes, inputs, outputs, inplace, regions)


@st.composite
def graph_sections(draw) -> GraphSection:
    names = draw(st.lists(st.sampled_from(["update", "accumulate", "accumulate_and_update"]),
                          min_size=1, max_size=3, unique=True))
    # A per-program prefix keeps value names distinct across programs, so one layout can list
    # every program's params and state without two entries of one name.
    programs = [draw(graphs(n, prefix=f"{i}_")) for i, n in enumerate(names)]
    layout = [v for p in programs for v in p.values if v.role in ("param", "state")]
    return GraphSection(programs=programs, layout=layout, metadata=draw(attr_dicts))


boxes = st.lists(st.tuples(st.integers(0, 64), st.integers(0, 64)), max_size=3)


@st.composite
def schedule_sections(draw) -> ScheduleSection:
    programs = []
    for name in draw(st.lists(text, min_size=1, max_size=2, unique=True)):
        groups = [FusionGroup(i, draw(st.lists(text, max_size=3)), draw(st.lists(text, max_size=2)),
                              draw(st.lists(text, max_size=2)), draw(text), draw(text))
                  for i in range(draw(st.integers(0, 3)))]
        tasks = [Task(i, draw(st.integers(0, 3)), draw(boxes),
                      draw(st.lists(st.builds(Access, text, boxes), max_size=2)),
                      draw(st.lists(st.builds(Access, text, boxes), max_size=2)),
                      draw(finite), draw(st.integers(-1, 5)))
                 for i in range(draw(st.integers(0, 4)))]
        instr = st.one_of(
            st.tuples(st.just("task"), st.integers(0, 9)),
            st.tuples(st.just("barrier"), st.integers(0, 9)),
            st.tuples(st.just("wait"), st.integers(0, 9), st.integers(0, 9)),
            st.tuples(st.just("signal"), st.integers(0, 9)),
        )
        sms = draw(st.lists(st.lists(instr, max_size=5), max_size=3))
        counters = [Counter(i, draw(st.integers(0, 9))) for i in range(draw(st.integers(0, 2)))]
        programs.append(ProgramSchedule(name, groups, tasks, sms, counters, draw(st.integers(0, 9))))
    return ScheduleSection(draw(text), draw(st.integers(1, 132)), programs, draw(attr_dicts))


@st.composite
def memory_sections(draw) -> MemorySection:
    placement = st.builds(Placement, text, text, st.integers(0, 2**40), st.integers(0, 2**40),
                          st.integers(-1, 99), st.integers(-1, 99))
    programs = [ProgramMemory(n, draw(st.lists(placement, max_size=4)), draw(st.integers(0, 2**40)),
                              draw(st.integers(0, 2**40)))
                for n in draw(st.lists(text, min_size=1, max_size=2, unique=True))]
    return MemorySection(draw(st.sampled_from([16, 128, 256])), draw(st.integers(0, 2**40)), programs,
                         draw(attr_dicts))


build_sections = st.builds(BuildSection, text, text, st.lists(text, max_size=3), st.lists(text, max_size=3),
                           text, attr_dicts)
provenance = st.builds(Provenance, text, text, finite, text)


@st.composite
def documents(draw) -> Document:
    return Document(
        graph=draw(st.none() | graph_sections()),
        schedule=draw(st.none() | schedule_sections()),
        memory=draw(st.none() | memory_sections()),
        build=draw(st.none() | build_sections),
        provenance=draw(st.lists(provenance, max_size=3)),
    )
