"""``latch-pipeline capture EXAMPLE.py -o OUT.latch.json``: capture an example file's update."""

from __future__ import annotations

import sys
import time

import click


from latch_core.cli import InterspersedCommand


@click.command("capture", cls=InterspersedCommand)
@click.argument("example", type=click.Path(dir_okay=False))
@click.option("-o", "--output", "out", required=True, type=click.Path(dir_okay=False), help="document to write")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help="argument for the example's build()")
@click.option("--microbatches", type=int, default=None, help="override the example's microbatch count")
@click.option("--grads", is_flag=True, help="also output the gradients (group 'grads'), for checking")
@click.option("--no-cache", is_flag=True, help="capture even when the capture cache holds this example")
@click.option("-q", "--quiet", is_flag=True, help="no progress messages")
def capture_cmd(example, out, overrides, microbatches, grads, no_cache, quiet):
    """Capture EXAMPLE.py's training update (its build(**overrides)) into a Latch document.

    Runs the pipeline's ``capture`` pass (latch_core.pipeline), cached by what it reads."""
    from latch_core import progress
    from latch_core.document import Document, save
    from latch_core.passes import run_pass

    from .errors import CaptureError
    from .examples import parse_overrides
    from .passes import CAPTURE

    t0 = time.perf_counter()
    quiet = quiet or progress.quiet()

    def say(msg: str) -> None:
        if not quiet:
            click.echo(f"[{time.perf_counter() - t0:6.1f}s] {msg}", err=True)

    try:
        doc = run_pass(CAPTURE, Document(), example=example, overrides=parse_overrides(list(overrides)), grads=grads,
                       routing=False, microbatches=microbatches, cache=not no_cache, progress=say)
    except CaptureError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(1)
    save(doc, out)
    click.echo(f"wrote {out} ({doc.provenance[-1].detail})")
