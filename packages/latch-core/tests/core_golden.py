"""The golden documents, built in code, and the files under ``golden/`` that freeze them.

File names carry the schema version that wrote them: ``NAME.vMAJOR_MINOR.latch.json``. The tests
require, for every builder here, a file of the CURRENT version whose bytes equal
``dumps(builder(), indent=1)`` (a format change without a version bump fails), and they require
every older file to keep loading (habit 2 in STYLE.md: never delete or rewrite an old golden file).
``corrupt_*.latch.json`` are deliberately broken files for the error-message tests.
``schema.vMAJOR_MINOR.json`` stores the schema (every record's fields) of each version as data, so a
test can tell a compatible change (a field added with a default) from a breaking one.

Regenerate after a deliberate schema change (writes only versioned files that do not exist yet, and
rewrites the text-form goldens ``NAME.show.txt``):

    python packages/latch-core/tests/core_golden.py --write
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

from latch_core.document import SCHEMA_VERSION, Document, Provenance, dumps, load
from latch_core.ir import Graph, GraphSection, Group, Node, Value
from latch_core.sections import (
    Access, BuildSection, Counter, FusionGroup, MemorySection, Placement, ProgramMemory, ProgramSchedule,
    ScheduleSection, Task,
)
from latch_core.text import format_document

GOLDEN = Path(__file__).resolve().parent / "golden"
SRC = "examples/linreg.py"


def version_tag(version: tuple[int, int] = SCHEMA_VERSION) -> str:
    return f"v{version[0]}_{version[1]}"


def golden_path(name: str, version: tuple[int, int] = SCHEMA_VERSION) -> Path:
    return GOLDEN / f"{name}.{version_tag(version)}.latch.json"


def _linreg_values(prefix: str = "") -> list[Value]:
    return [
        Value("w", (4, 3), "f32", "param"),
        Value("b", (3,), "f32", "param"),
        Value("x", (8, 4), "f32", "batch"),
        Value("y", (8, 3), "f32", "batch"),
        Value("lr", (), "f32", "hyper"),
        Value("two_over_n", (), "f32", "const", data=[1 / 12]),
    ]


def small_graph() -> Document:
    """One SGD step of linear regression with a mean-squared-error loss: forward, backward, update."""
    f32 = "f32"
    values = _linreg_values() + [
        Value("mm", (8, 3), f32), Value("pred", (8, 3), f32), Value("diff", (8, 3), f32),
        Value("sq", (8, 3), f32), Value("loss", (), f32), Value("gpred", (8, 3), f32),
        Value("gclip", (8, 3), f32), Value("gw", (4, 3), f32), Value("gb", (3,), f32),
        Value("uw", (4, 3), f32), Value("new_w", (4, 3), f32), Value("ub", (3,), f32),
        Value("new_b", (3,), f32),
    ]
    nodes = [
        Node("n0", "latch::matmul", ["x", "w"], ["mm"], {"transpose_a": False}, f"{SRC}:14 in forward"),
        Node("n1", "latch::add", ["mm", "b"], ["pred"], {}, f"{SRC}:14 in forward"),
        Node("n2", "latch::sub", ["pred", "y"], ["diff"], {}, f"{SRC}:19 in objective"),
        Node("n3", "latch::mul", ["diff", "diff"], ["sq"], {}, f"{SRC}:19 in objective"),
        Node("n4", "latch::mean", ["sq"], ["loss"], {"dims": [0, 1], "keepdim": False}, f"{SRC}:19 in objective"),
        Node("n5", "latch::mul", ["diff", "two_over_n"], ["gpred"], {}, f"{SRC}:19 in objective"),
        Node("n6", "latch::clamp", ["gpred"], ["gclip"], {"min": -math.inf, "max": math.inf,
                                                          "note": None, "why": {"kind": "clip", "at": [1.0]}}),
        Node("n7", "latch::matmul", ["x", "gclip"], ["gw"], {"transpose_a": True}, f"{SRC}:14 in forward"),
        Node("n8", "latch::sum", ["gclip"], ["gb"], {"dims": [0], "keepdim": False}, f"{SRC}:14 in forward"),
        Node("n9", "latch::mul", ["gw", "lr"], ["uw"], {}, f"{SRC}:25 in sgd"),
        Node("n10", "latch::sub", ["w", "uw"], ["new_w"], {}, f"{SRC}:25 in sgd"),
        Node("n11", "latch::mul", ["gb", "lr"], ["ub"], {}, f"{SRC}:25 in sgd"),
        Node("n12", "latch::sub", ["b", "ub"], ["new_b"], {}, f"{SRC}:25 in sgd"),
    ]
    prog = Graph(
        "update", values, nodes,
        inputs=[Group("params", ["w", "b"]), Group("batch", ["x", "y"]), Group("hyper", ["lr"])],
        outputs=[Group("new_params", ["new_w", "new_b"]), Group("loss", ["loss"])],
        inplace=[("new_w", "w"), ("new_b", "b")],
    )
    section = GraphSection(
        programs=[prog],
        layout=[Value("w", (4, 3), "f32", "param"), Value("b", (3,), "f32", "param")],
        metadata={"example": "linreg", "microbatches": 1, "hyper_defaults": {"lr": 0.1}},
    )
    return Document(graph=section, provenance=[Provenance("capture", "2026-12-01T00:00:00+00:00", 0.012, "linreg")])


def _relu_sum_graph() -> Graph:
    return Graph(
        "update",
        values=[Value("x", (4, 8), "f32", "batch"), Value("h", (4, 8), "f32"), Value("s", (4,), "f32")],
        nodes=[
            Node("n0", "latch::relu", ["x"], ["h"], source="examples/tiny.py:3 in forward"),
            Node("n1", "latch::sum", ["h"], ["s"], {"dims": [1], "keepdim": False}, "examples/tiny.py:4 in forward"),
        ],
        inputs=[Group("batch", ["x"])],
        outputs=[Group("metrics", ["s"])],
    )


def scheduled() -> Document:
    """A two-node graph with schedule, memory and build sections (2 SMs, one barrier, one counter)."""
    g = _relu_sum_graph()
    sched = ScheduleSection(
        strategy="barrier",
        num_sms=2,
        programs=[ProgramSchedule(
            program="update",
            groups=[
                FusionGroup(0, ["n0"], ["x"], ["h"], "h", "latch::relu/f32[4,8]"),
                FusionGroup(1, ["n1"], ["h"], ["s"], "s", "latch::sum/f32[4,8]/dims=1"),
            ],
            tasks=[
                Task(0, 0, [(0, 2), (0, 8)], [Access("x", [(0, 2), (0, 8)])], [Access("h", [(0, 2), (0, 8)])], 1.5e-7, 0),
                Task(1, 0, [(2, 4), (0, 8)], [Access("x", [(2, 4), (0, 8)])], [Access("h", [(2, 4), (0, 8)])], 1.5e-7, 0),
                Task(2, 1, [(0, 4)], [Access("h", [(0, 4), (0, 8)])], [Access("s", [(0, 4)])], 2e-7, 1),
            ],
            sms=[
                [("task", 0), ("signal", 0), ("barrier", 0), ("wait", 0, 1), ("task", 2)],
                [("task", 1), ("barrier", 0)],
            ],
            counters=[Counter(0, 1)],
            num_barriers=1,
        )],
        stats={"tasks": 3, "critical_path_s": 3.5e-7},
    )
    mem = MemorySection(
        alignment=256,
        arena_bytes=256,
        programs=[ProgramMemory(
            program="update",
            placements=[
                Placement("x", "x", 0, 128),
                Placement("h", "arena", 0, 128, 0, 2),
                Placement("s", "s", 0, 16, 2, -1),
            ],
            arena_bytes=256,
            peak_live_bytes=272,
        )],
        stats={"reused_bytes": 0},
    )
    build = BuildSection(
        directory="build/tiny", key="0f" * 32, units=["unit_0.cu", "unit_1.cu"],
        flags=["-O3", "-arch=sm_90a"], toolkit="cuda 13.0", stats={"compile_s": 2.5},
    )
    return Document(
        graph=GraphSection(programs=[g]), schedule=sched, memory=mem, build=build,
        provenance=[
            Provenance("capture", "2026-12-01T00:00:00+00:00", 0.004),
            Provenance("schedule", "2026-12-01T00:00:01+00:00", 0.0021, "scheduler=barrier"),
            Provenance("memory.arena", "2026-12-01T00:00:02+00:00", 0.0007),
            Provenance("codegen-h100.build", "2026-12-01T00:00:03+00:00", 2.5),
        ],
    )


def programs_regions() -> Document:
    """Two programs over one layout (accumulate / accumulate_and_update) and a repeated region.

    ``accumulate`` adds x's row sums into the accumulator ``grad_acc.w``; ``accumulate_and_update``
    runs a region 3 times carrying ``w`` (each iteration: w <- w - lr * x[i]) and zeroes the
    accumulator. Exercises every value role, regions, in-place pairs on state and a const.
    """
    layout = [Value("w", (4,), "f32", "param"), Value("grad_acc.w", (4,), "f32", "state")]
    acc = Graph(
        "accumulate",
        values=layout + [Value("x", (3, 4), "f32", "batch"), Value("gsum", (4,), "f32"),
                         Value("new_acc", (4,), "f32")],
        nodes=[
            Node("n0", "latch::sum", ["x"], ["gsum"], {"dims": [0], "keepdim": False}),
            Node("n1", "latch::add", ["grad_acc.w", "gsum"], ["new_acc"]),
        ],
        inputs=[Group("params", ["w"]), Group("state", ["grad_acc.w"]), Group("batch", ["x"])],
        outputs=[Group("new_state", ["new_acc"])],
        inplace=[("new_acc", "grad_acc.w")],
    )
    body = Graph(
        "sgd_step",
        values=[Value("w_c", (4,), "f32", "state"), Value("x_i", (4,), "f32", "batch"),
                Value("lr", (), "f32", "hyper"), Value("u", (4,), "f32"), Value("w_next", (4,), "f32")],
        nodes=[
            Node("r0", "latch::mul", ["x_i", "lr"], ["u"]),
            Node("r1", "latch::sub", ["w_c", "u"], ["w_next"]),
        ],
        inputs=[Group("carried", ["w_c"]), Group("per_iteration", ["x_i"]), Group("invariant", ["lr"])],
        outputs=[Group("carried", ["w_next"])],
    )
    upd = Graph(
        "accumulate_and_update",
        values=layout + [Value("x", (3, 4), "f32", "batch"), Value("lr", (), "f32", "hyper"),
                         Value("zero", (4,), "f32", "const", data=[0.0, 0.0, 0.0, 0.0]),
                         Value("new_w", (4,), "f32"), Value("new_acc", (4,), "f32")],
        nodes=[
            Node("n0", "latch::repeat", ["w", "x", "lr"], ["new_w"],
                 {"region": "sgd_step", "times": 3, "carried": 1, "per_iteration": 1}),
            Node("n1", "latch::mul", ["grad_acc.w", "zero"], ["new_acc"]),
        ],
        inputs=[Group("params", ["w"]), Group("state", ["grad_acc.w"]), Group("batch", ["x"]),
                Group("hyper", ["lr"])],
        outputs=[Group("new_params", ["new_w"]), Group("new_state", ["new_acc"])],
        inplace=[("new_w", "w"), ("new_acc", "grad_acc.w")],
        regions=[body],
    )
    return Document(graph=GraphSection(
        programs=[acc, upd], layout=layout,
        metadata={"example": "regions", "microbatches": 2, "hyper_defaults": {"lr": 0.5}},
    ))


BUILDERS = {"small_graph": small_graph, "scheduled": scheduled, "programs_regions": programs_regions}
# Text-form goldens: what `latch-pipeline show` prints (source shown as "<golden>").
SHOWN = ("small_graph", "scheduled", "programs_regions")


def schema() -> dict[str, list[list]]:
    """The document's schema as data: every record reachable from Document, each field as
    ``[name, type, required]``. Stored per version as ``golden/schema.vMAJOR_MINOR.json``."""
    import typing

    import attrs

    out: dict[str, list[list]] = {}
    todo = [Document]
    while todo:
        cls = todo.pop()
        if cls.__name__ in out:
            continue
        hints = typing.get_type_hints(cls)
        fields = []
        for f in attrs.fields(cls):
            if not f.init:
                continue
            tp = hints[f.name]
            fields.append([f.name, _type_name(tp), f.default is attrs.NOTHING])
            todo.extend(t for t in _records_in(tp) if t.__name__ not in out)
        out[cls.__name__] = fields
    return dict(sorted(out.items()))


def _records_in(tp):
    import typing

    import attrs

    if isinstance(tp, type) and attrs.has(tp):
        yield tp
    for a in typing.get_args(tp):
        yield from _records_in(a)


def _type_name(tp) -> str:
    import typing

    args = typing.get_args(tp)
    if tp is type(None):
        return "None"
    if not args:
        return getattr(tp, "__name__", repr(tp))
    origin = typing.get_origin(tp)
    name = "Union" if origin is not tuple and origin is not dict else origin.__name__
    return f"{name}[{', '.join('...' if a is Ellipsis else _type_name(a) for a in args)}]"


def format_schema(sch: dict[str, list[list]]) -> str:
    """One record per line: reviewable in a diff."""
    import json

    rows = [f" {json.dumps(k)}: [{', '.join(json.dumps(f) for f in v)}]" for k, v in sch.items()]
    return "{\n" + ",\n".join(rows) + "\n}\n"


def schema_path(version: tuple[int, int] = SCHEMA_VERSION) -> Path:
    return GOLDEN / f"schema.{version_tag(version)}.json"


def encoded(name: str) -> str:
    return dumps(BUILDERS[name](), indent=1) + "\n"


def shown(name: str) -> str:
    return format_document(load(golden_path(name)), source="<golden>") + "\n"


def _write(argv: list[str]) -> None:
    if argv != ["--write"]:
        sys.exit(__doc__)
    for name in BUILDERS:
        p = golden_path(name)
        if p.exists():
            print(f"keep   {p.name} (exists; golden files are never rewritten)")
        else:
            p.write_text(encoded(name))
            print(f"wrote  {p.name}")
    p = schema_path()
    if p.exists():
        print(f"keep   {p.name} (exists; golden files are never rewritten)")
    else:
        import json

        p.write_text(format_schema(schema()))
        print(f"wrote  {p.name}")
    for name in SHOWN:
        p = GOLDEN / f"{name}.show.txt"
        p.write_text(shown(name))
        print(f"wrote  {p.name}")


if __name__ == "__main__":
    _write(sys.argv[1:])
