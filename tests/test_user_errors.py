"""Every error a user can cause is a message, not a Python traceback (``--debug`` shows it).

The cases of issue 14: a syntax error in the user's example file, an exception raised by its
build(), an unknown --set key and a zero-size dimension (``--set batch=0``), each through the
capture, check and simulate commands; and the general mechanism (latch_core.errors): a UserError
raised by any command is shown as ``error: ...`` with exit status 2.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

pytest.importorskip("torch")
pytest.importorskip("latch_capture")

from latch_core.cli import main  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MLP = str(ROOT / "examples" / "mlp.py")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("user_files")
    (d / "syntax.py").write_text("def build(:\n    pass\n")
    (d / "raises.py").write_text("def helper(n):\n    raise ValueError(f'n={n} must be even')\n\n\n"
                                 "def build(n=1):\n    return helper(n)\n")
    return d


def _run(args):
    from latch_core import errors

    try:
        r = CliRunner().invoke(main, args)
    finally:
        errors.set_debug(False)
    return r, r.output


def _cases(files, tmp_path):
    out = str(tmp_path / "o.latch.json")
    return {
        "syntax error": ([str(files / "syntax.py")], ["does not parse", "syntax.py:1"]),
        "exception in build()": ([str(files / "raises.py")], ["build() raised ValueError: n=1 must be even",
                                                               "raises.py:2 in helper"]),
        "unknown --set key": ([MLP, "--set", "nosuch=3"], ["unknown --set key(s) ['nosuch']", "build() takes batch"]),
        "zero-size dimension": ([MLP, "--set", "batch=0"], ["input 'input' has shape [0, 32]", "zero-size"]),
        "_out": out,
    }


@pytest.mark.parametrize("command", ["capture", "check", "simulate"])
@pytest.mark.parametrize("case", ["syntax error", "exception in build()", "unknown --set key", "zero-size dimension"])
def test_user_mistakes_are_messages_without_tracebacks(files, tmp_path, command, case):
    cases = _cases(files, tmp_path)
    args, expected = cases[case]
    extra = ["-o", cases["_out"]] if command == "capture" else []
    r, text = _run([command, *args, *extra])
    assert r.exit_code in (1, 2), text
    assert isinstance(r.exception, SystemExit)
    assert "Traceback" not in text, text
    for e in expected:
        assert e in text, text


def test_debug_shows_the_traceback(files, tmp_path):
    r, text = _run(["--debug", "capture", str(files / "raises.py"), "-o", str(tmp_path / "o.json")])
    assert r.exit_code == 1 and "Traceback" in text and "ValueError: n=1 must be even" in text


def test_a_user_error_from_any_command_is_a_message():
    import click

    from latch_core import errors

    @click.command("boom")
    def boom():
        raise errors.UserError("the file frob.latch.json names op x::y, which no plugin registers; install it")

    main.add_command(boom)
    try:
        r, text = _run(["boom"])
        assert r.exit_code == 2 and "error: the file frob.latch.json names op x::y" in text and "Traceback" not in text
        r, text = _run(["--debug", "boom"])
        assert r.exit_code == 2 and "Traceback" in text
    finally:
        main.commands.pop("boom", None)
        errors.set_debug(False)
