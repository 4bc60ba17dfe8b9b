"""Every `latch-pipeline` subcommand that an installed plugin registers fits the chained CLI:
it has help text, `--help` works through the console entry, and it takes no variable-length
argument (in a chained group that would swallow the commands after it)."""

import click
import pytest
from click.testing import CliRunner

from latch_core import cli, plugins


@pytest.fixture(scope="module")
def commands():
    plugins.reset()
    regs = plugins.registries()
    yield {name: (cmd, regs.commands.owner(name)) for name, cmd in regs.commands.items()}
    plugins.reset()


def test_plugin_commands_do_not_shadow_core_commands(commands):
    core = set(cli.main.commands)
    assert core >= {"plugins", "show", "validate", "passes"}
    clash = {n: owner for n, (_, owner) in commands.items() if n in core}
    assert not clash, f"plugin commands named like core commands (core wins, theirs is unreachable): {clash}"


def test_plugin_commands_are_chain_safe_and_documented(commands):
    problems = []
    for name, (cmd, owner) in commands.items():
        if not isinstance(cmd, click.Command) or isinstance(cmd, click.Group):
            problems.append(f"{name} ({owner}): registered {type(cmd).__name__}; register a click.Command")
            continue
        if not (cmd.help or "").strip():
            problems.append(f"{name} ({owner}): no help text")
        for p in cmd.params:
            if isinstance(p, click.Argument) and p.nargs == -1:
                problems.append(f"{name} ({owner}): argument {p.name!r} takes nargs=-1, which swallows the chained "
                                "commands after it; take one comma-separated argument or repeated options")
    assert not problems, "\n".join(problems)


def test_each_plugin_command_answers_help(commands):
    for name in commands:
        r = CliRunner().invoke(cli.main, [name, "--help"])
        assert r.exit_code == 0, f"latch-pipeline {name} --help: {r.output}"
        assert f"Usage: main {name}" in r.output or f"Usage: latch-pipeline {name}" in r.output
