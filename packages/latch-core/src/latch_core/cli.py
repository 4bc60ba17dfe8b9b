"""``latch-pipeline``: a click group with chained subcommands.

Core provides ``plugins``, ``show``, ``validate`` and ``passes`` (run a named sequence of passes on
a file). Stage packages add subcommands through ``latch_register_commands``; installing only
latch-core gives a working CLI with fewer commands.

Startup is kept light: plugin modules import nothing heavy, registries fill per hook on first use
(``--help`` reads only the commands), and commands import their work when they run; ``--help``,
``show``, ``validate``, ``schedule``, ``plan`` and ``passes`` over core, schedule and memory passes
never import torch (test_cli_startup.py).

Chaining: ``latch-pipeline show a.latch.json validate a.latch.json``. Commands that transform a
document read ``-i/--input`` and write ``-o/--output``; chained commands run in order, so a later
command can read what an earlier one wrote. A chained command cannot take a variable number of
arguments (it would swallow the commands after it): lists are one comma-separated argument.
"""

from __future__ import annotations

import sys

import click

from . import document as _document
from . import errors as _errors
from . import plugins as _plugins
from .lint import lint_section
from .passes import PassError
from .text import format_document


class LatchGroup(click.Group):
    """Adds the commands plugins register, lazily, so ``--help`` lists them; shows a
    :class:`~latch_core.errors.UserError` from any command as a message, not a traceback."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except _errors.UserError as e:
            sys.exit(_errors.report(e))
        except SystemExit as e:
            _errors.show_context(e)
            raise

    def _plugin_commands(self) -> dict[str, click.Command]:
        return {name: cmd for name, cmd in registries_or_exit().commands.items()}

    def list_commands(self, ctx):
        return sorted(set(super().list_commands(ctx)) | set(self._plugin_commands()))

    def get_command(self, ctx, name):
        cmd = super().get_command(ctx, name)
        if cmd is not None:
            return cmd
        return self._plugin_commands().get(name)


def registries_or_exit() -> _plugins.Registries:
    """The plugin registries; a broken plugin ends the command with its own message, not a traceback."""
    try:
        return _plugins.registries()
    except Exception as e:  # a broken plugin must not take the whole CLI down silently
        click.echo(f"latch-pipeline: error loading plugins: {e}", err=True)
        sys.exit(2)


class InterspersedCommand(click.Command):
    """Lets options follow the positional argument (``capture ex.py -o out.json``) inside the chained
    ``latch-pipeline`` group (a plugin command with options after its argument uses it), where click would otherwise stop at the first positional. Parsing of
    this command ends at the first token that names another latch-pipeline command, so chaining
    (``capture a.py -o a.json show a.json``) keeps working."""

    def parse_args(self, ctx, args):
        names: set[str] = set()
        parent = ctx.parent
        if parent is not None and isinstance(parent.command, click.Group):
            names = set(parent.command.list_commands(parent))
        cut = next((i for i, a in enumerate(args) if i > 0 and a in names), len(args))
        head, tail = list(args[:cut]), list(args[cut:])
        ctx.allow_interspersed_args = True
        super().parse_args(ctx, head)
        ctx.args = [*ctx.args, *tail]
        return ctx.args


@click.group(cls=LatchGroup, chain=True)
@click.option("-q", "--quiet", is_flag=True, help="no progress bars (they are drawn only on a terminal anyway)")
@click.option("--debug", is_flag=True, help="show Python tracebacks for errors (also LATCH_DEBUG=1)")
def main(quiet, debug):
    """Latch: compile a PyTorch training update into one persistent Hopper kernel.

    The compiler is one list of passes (latch_core.pipeline): `compile` runs all of it,
    `passes` any part of it."""
    from . import progress

    progress.set_quiet(quiet)
    _errors.set_debug(debug)


def load_or_exit(path: str) -> _document.Document:
    try:
        return _document.load(path)
    except _document.DocumentError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(2)


def transform_file(inp: str, out: str, steps, summary=None) -> None:
    """The body of a stage's file-to-file command: load ``inp``, run ``steps`` (``(pass, options)``
    pairs, with provenance), print ``summary(doc)`` lines and the time, save ``out``. A pass error
    exits 1 naming the input file."""
    import time

    doc = load_or_exit(inp)
    t0 = time.perf_counter()
    try:
        for p, options in steps:
            doc = p(doc, **options)
    except (PassError, ValueError) as e:
        click.echo(f"error: {inp}: {e}", err=True)
        sys.exit(1)
    for line in summary(doc) if summary else ():
        click.echo(line)
    click.echo(f"  took {(time.perf_counter() - t0) * 1000:.1f} ms")
    _document.save(doc, out)
    click.echo(f"wrote {out}")


@main.command("plugins")
def plugins_cmd():
    """List installed plugins and what each registers."""
    regs = registries_or_exit()
    owners: dict[str, dict[str, list[str]]] = {}
    for hook, registry in regs.by_hook().items():
        kind = hook.removeprefix("latch_register_")
        for owner, names in registry.by_owner().items():
            owners.setdefault(owner, {})[kind] = names
    for name, dist in regs.plugins:
        click.echo(f"{name}  ({dist})")
        for kind, names in sorted(owners.get(name, {}).items()):
            shown = ", ".join(names[:12]) + (f", ... (+{len(names) - 12})" if len(names) > 12 else "")
            click.echo(f"    {kind} [{len(names)}]: {shown}")
        if not owners.get(name):
            click.echo("    (registers nothing)")


@main.command("show")
@click.argument("file", type=click.Path(dir_okay=False))
def show_cmd(file):
    """Print a document as readable text: one line per node, then schedule and memory."""
    doc = load_or_exit(file)
    click.echo(format_document(doc, source=file))


@main.command("validate")
@click.argument("file", type=click.Path(dir_okay=False))
def validate_cmd(file):
    """Check a document: schema, graph lint, and every registered validator pass."""
    doc = load_or_exit(file)
    regs = registries_or_exit()
    problems: list[str] = []
    if doc.graph is not None:
        problems += lint_section(doc.graph, regs.ops)
    for name, p in regs.passes.items():
        if getattr(p, "validator", False) and set(p.requires) <= doc.sections():
            try:
                p.run(doc)
            except Exception as e:
                problems.append(f"{name}: {e}")
    if problems:
        click.echo(f"{file}: INVALID", err=True)
        for pr in problems:
            click.echo(f"  {pr}", err=True)
        sys.exit(1)
    click.echo(f"{file}: ok ({', '.join(sorted(doc.sections()))})")


@main.command("passes")
@click.option("-i", "--input", "inp", type=click.Path(dir_okay=False),
              help="document to read (default: an empty one, for a sequence starting with capture)")
@click.option("-o", "--output", "out", type=click.Path(dir_okay=False), help="document to write")
@click.option("-O", "--option", "pass_options", multiple=True, metavar="PASS.KEY=VALUE",
              help="an option of one pass, e.g. -O schedule.scheduler=dataflow -O capture.example=ex.py")
@click.option("--list", "list_only", is_flag=True, help="list the pipeline's stages and every registered pass, and exit")
@click.argument("sequence", required=False)
def passes_cmd(inp, out, pass_options, list_only, sequence):
    """Run a comma-separated SEQUENCE of named passes, in order: -i IN -o OUT a,b,c.

    An item may be a pass name, `pipeline` (the whole compiler, latch_core.pipeline) or a range of
    the pipeline, `a..b` (`schedule..build`, `..memory.plan`). The sequence is one argument (not one
    per pass) so that further chained commands can follow:
    ``latch-pipeline passes -i a.latch.json -o b.latch.json core.lint show b.latch.json``.
    """
    from . import pipeline

    regs = registries_or_exit()
    if list_only:
        click.echo("pipeline (latch_core.pipeline), in order:")
        for st in pipeline.PIPELINE:
            state = "" if st.name in regs.passes else f"   [not installed: {st.package}]"
            click.echo(f"  {st.name:<26s} {st.package:<19s} {st.what}{state}")
        click.echo("registered passes:")
        for name, p in regs.passes.items():
            click.echo(f"{name}: requires {sorted(p.requires)} ensures {sorted(p.ensures)}  [{regs.passes.owner(name)}]")
        return
    if not (out and sequence):
        missing = [what for what, v in (("-o/--output", out), ("SEQUENCE", sequence)) if not v]
        raise click.UsageError(f"passes: missing {', '.join(missing)}; e.g. passes -i in.latch.json -o out.latch.json core.lint")
    try:
        names = pipeline.sub_list(sequence)
        options = _pass_options(pass_options, names)
        doc = load_or_exit(inp) if inp else _document.Document()
        doc = pipeline.run(names, doc, options, registry=regs.passes,
                           on_pass=lambda p, d: click.echo(f"  {p.name}: {d.provenance[-1].seconds * 1000:.1f} ms"
                                                           + (f"  {d.provenance[-1].detail}" if d.provenance[-1].detail else "")))
    except (PassError, ValueError) as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(1)
    _document.save(doc, out)
    click.echo(f"wrote {out}")


def _pass_options(items, names) -> dict[str, dict]:
    """``["schedule.scheduler=dataflow", "capture.example=ex.py"]`` -> per-pass option dicts; the pass
    is the longest name of the sequence that prefixes the key (pass names contain dots)."""
    out: dict[str, dict] = {}
    for item in items:
        key, eq, raw = item.partition("=")
        owner = max((n for n in names if key.startswith(n + ".")), key=len, default=None)
        if not eq or owner is None:
            raise click.UsageError(f"option {item!r} is not PASS.KEY=VALUE for a pass of the sequence ({', '.join(names)})")
        out.setdefault(owner, {})[key[len(owner) + 1:]] = parse_value(raw)
    return out


def parse_value(v: str):
    """A command-line value: true/false, none, an int, a float, else the string itself
    (``-O PASS.KEY=VALUE`` and an example's ``--set KEY=VALUE`` read values alike)."""
    low = v.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    if low == "none":
        return None
    for conv in (int, float):
        try:
            return conv(v)
        except ValueError:
            pass
    return v


if __name__ == "__main__":  # pragma: no cover
    main()
