"""Well-formedness checks for graphs (``Graph.lint`` in the tinygrad / torch.fx sense).

``lint`` returns every problem it finds (not just the first); ``check`` raises LintError with them.
Each problem names the program, the node (with its source line when known) and what is wrong.
"""

from __future__ import annotations

from .ir import INPUT_ROLES, INTERMEDIATE, Graph, GraphSection, TensorType
from .registry import Registry, ShapeError
from .errors import UserError


class LintError(UserError, ValueError):
    def __init__(self, problems: list[str]):
        self.problems = problems
        head = f"{len(problems)} problem(s) in the graph:\n  " + "\n  ".join(problems[:20])
        if len(problems) > 20:
            head += f"\n  ... and {len(problems) - 20} more"
        super().__init__(head)


def _where(prog: Graph, node) -> str:
    src = f" (from {node.source})" if node.source else ""
    return f"program {prog.name!r} node {node.name!r} ({node.op}){src}"


def lint(graph: Graph, ops: Registry | None = None, *, require_known_ops: bool = False) -> list[str]:
    problems: list[str] = []
    p = problems.append
    names = [v.name for v in graph.values]
    seen_names = set()
    for n in names:
        if n in seen_names:
            p(f"program {graph.name!r}: value {n!r} is declared twice")
        seen_names.add(n)

    defined: set[str] = set()
    inputs = graph.input_names()
    for g in graph.inputs:
        for v in g.values:
            if not graph.has_value(v):
                p(f"program {graph.name!r}: input group {g.name!r} names undeclared value {v!r}")
                continue
            if v in defined:
                p(f"program {graph.name!r}: value {v!r} is a program input twice")
            role = graph.value(v).role
            if role not in INPUT_ROLES:
                p(f"program {graph.name!r}: input {v!r} has role {role!r}; inputs must be one of {sorted(INPUT_ROLES)}")
            defined.add(v)
    for v in graph.values:
        if v.role == "const" and v.name not in defined:
            if v.data is None:
                p(f"program {graph.name!r}: constant {v.name!r} has no data")
            defined.add(v.name)

    node_names = set()
    for node in graph.nodes:
        w = _where(graph, node)
        if node.name in node_names:
            p(f"{w}: node name used twice")
        node_names.add(node.name)
        for i in node.inputs:
            if i is None:
                continue
            if not graph.has_value(i):
                p(f"{w}: reads undeclared value {i!r}")
            elif i not in defined:
                p(f"{w}: reads {i!r} before it is defined (nodes must be in topological order)")
        for o in node.outputs:
            if not graph.has_value(o):
                p(f"{w}: writes undeclared value {o!r}")
                continue
            if o in defined:
                p(f"{w}: value {o!r} is defined more than once")
            if graph.value(o).role != INTERMEDIATE:
                p(f"{w}: output {o!r} has role {graph.value(o).role!r}; node outputs are intermediates")
            defined.add(o)
        if ops is not None:
            if node.op not in ops:
                if require_known_ops:
                    p(f"{w}: unknown op {node.op!r}; install the plugin that provides it")
                continue
            spec = ops.get(node.op)
            in_types = [None if i is None or not graph.has_value(i) else graph.value(i).type for i in node.inputs]
            try:
                expected = spec.check(in_types, node.attr_dict)
            except ShapeError as e:
                p(f"{w}: operands do not fit the op: {e}")
                continue
            except Exception as e:  # a shape rule that crashes is a bug in that rule: say whose
                p(f"{w}: shape rule of {node.op} raised {type(e).__name__}: {e}")
                continue
            got = [graph.value(o).type if graph.has_value(o) else None for o in node.outputs]
            if len(expected) != len(got):
                p(f"{w}: op produces {len(expected)} outputs, node declares {len(got)}")
            else:
                for o, e_t, g_t in zip(node.outputs, expected, got):
                    if g_t is not None and TensorType(e_t.shape, e_t.dtype) != g_t:
                        p(f"{w}: output {o!r} declared {g_t}, the op's rule gives {e_t}")

    for v in graph.values:
        if v.name not in defined:
            p(f"program {graph.name!r}: value {v.name!r} is declared but never defined")
    for g in graph.outputs:
        for v in g.values:
            if v not in defined:
                p(f"program {graph.name!r}: output group {g.name!r} names undefined value {v!r}")
    input_set = set(inputs)
    for new, old in graph.inplace:
        if not (graph.has_value(new) and graph.has_value(old)):
            p(f"program {graph.name!r}: in-place pair ({new!r} -> {old!r}) names an undeclared value")
            continue
        if old not in input_set:
            p(f"program {graph.name!r}: in-place pair ({new!r} -> {old!r}): {old!r} is not a program input")
        if new not in graph.output_names():
            p(f"program {graph.name!r}: in-place pair ({new!r} -> {old!r}): {new!r} is not a program output")
        if graph.value(new).type != graph.value(old).type:
            p(f"program {graph.name!r}: in-place pair ({new!r} -> {old!r}): {graph.value(new).type} != {graph.value(old).type}")
    olds = [o for _, o in graph.inplace]
    if len(olds) != len(set(olds)):
        p(f"program {graph.name!r}: an input is overwritten by two in-place outputs")
    for r in graph.regions:
        problems.extend(lint(r, ops, require_known_ops=require_known_ops))
    return problems


def lint_section(section: GraphSection, ops: Registry | None = None, *, require_known_ops: bool = False) -> list[str]:
    problems: list[str] = []
    layout = {v.name: v for v in section.layout}
    prog_names = [p.name for p in section.programs]
    if len(prog_names) != len(set(prog_names)):
        problems.append(f"graph section: program names repeat: {prog_names}")
    for prog in section.programs:
        problems.extend(lint(prog, ops, require_known_ops=require_known_ops))
        for name in prog.input_names():
            if prog.has_value(name) and prog.value(name).role in ("param", "state") and layout:
                lv = layout.get(name)
                if lv is None:
                    problems.append(f"program {prog.name!r}: {name!r} is a {prog.value(name).role} but not in the layout")
                elif lv.type != prog.value(name).type:
                    problems.append(f"program {prog.name!r}: {name!r} is {prog.value(name).type} but the layout says {lv.type}")
    return problems


def check(graph_or_section, ops: Registry | None = None, *, require_known_ops: bool = False) -> None:
    if isinstance(graph_or_section, GraphSection):
        problems = lint_section(graph_or_section, ops, require_known_ops=require_known_ops)
    else:
        problems = lint(graph_or_section, ops, require_known_ops=require_known_ops)
    if problems:
        raise LintError(problems)
