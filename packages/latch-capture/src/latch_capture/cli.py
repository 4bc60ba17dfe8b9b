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
@click.option("-q", "--quiet", is_flag=True, help="no progress messages")
def capture_cmd(example, out, overrides, microbatches, grads, quiet):
    """Capture EXAMPLE.py's training update (its build(**overrides)) into a Latch document."""
    from latch_core.document import save

    from .errors import CaptureError
    from .examples import load_example, parse_overrides

    t0 = time.perf_counter()

    def say(msg: str) -> None:
        if not quiet:
            click.echo(f"[{time.perf_counter() - t0:6.1f}s] {msg}", err=True)

    try:
        say(f"capture: loading {example}")
        ex = load_example(example, **parse_overrides(list(overrides)))
        kw = {"grads": grads, "progress": say}
        if microbatches is not None:
            kw["microbatches"] = microbatches
        doc = ex.capture(**kw)
    except CaptureError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(1)
    save(doc, out)
    sizes = ", ".join(f"{p.name} {len(p.nodes)} nodes" for p in doc.graph.programs)
    click.echo(f"wrote {out} ({sizes})")
