"""latch-core's own registrations: the graph lint as a validator pass."""

from .hookspecs import hookimpl
from .lint import LintError, lint_section
from .passes import Pass


def _lint_pass(doc, **_):
    from .plugins import registries

    problems = lint_section(doc.graph, registries().ops)
    if problems:
        raise LintError(problems)
    return doc


LINT = Pass("core.lint", _lint_pass, requires={"graph"}, ensures={"graph"}, validator=True,
            doc="graph well-formedness: topological order, single definition, shape rules")


@hookimpl
def latch_register_passes(register):
    register(LINT)
