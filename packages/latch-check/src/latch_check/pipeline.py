"""One example compiled, run and checked: the Python API behind ``latch-pipeline compile``.

    compiled = compile_example("examples/mlp.py", scheduler="dataflow")   # latch_core.pipeline, whole
    result = run_checks(compiled, resolve_target("auto"), steps=2)        # gates vs the FP64 reference

``compile_example`` runs exactly ``latch_core.pipeline.compile``: the one flat list of passes from
capture to build (``latch_core.pipeline.PIPELINE``), less the stages switched off. What the checks
compare, by target (``--target``):
- ``sim`` (the CPU): the arena simulator runs the exact schedule and memory plan (tasks in a random
  legal order, freed bytes poisoned) and is gated against Latch's FP64 reference interpreter on the
  same inputs. Both compute in float64 with the ops' torch references, so the numerical policy
  (BF16 operands) is NOT simulated: the gates check the schedule, the memory plan and the build
  inputs, not rounding. (``latch-pipeline check`` is the comparison of the captured graph with
  eager PyTorch.)
- ``gpu``: the built kernel runs on the CUDA device and is gated against the FP64 reference, with
  thresholds for the document's policy (``latch_check.gpu``).
``auto`` picks ``gpu`` when torch sees a CUDA device and ``sim`` otherwise, and says which; asking
for ``gpu`` without one is an error, never a quiet switch to the CPU.

An unchanged experiment re-run is instant: capture and build are cached (``latch_capture.cache``,
the build's request key), and so is a simulator check of an identical document on identical inputs
(``latch_check.results``; a GPU run is never cached).
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any, Callable, Mapping

import attrs

from latch_core import pipeline
from latch_core.document import Document

TARGETS = ("auto", "gpu", "sim")


class PipelineError(RuntimeError):
    pass


@attrs.define
class Compiled:
    request: pipeline.Request
    doc: Document
    build_dir: Path | None
    times: dict[str, float]

    @property
    def example(self):
        """The example the document was captured from (loaded once per process; imports torch)."""
        from latch_capture.examples import load_example_once

        return load_example_once(self.request.example, **dict(self.request.overrides))

    @property
    def name(self) -> str:
        return str(self.doc.graph.meta("example", "") or Path(self.request.example).stem)


def _gpu_device_files() -> bool:
    """Whether this machine could have a CUDA device at all, without importing torch: no NVIDIA
    driver node means torch cannot see one either."""
    return any(Path(p).exists() for p in ("/dev/nvidiactl", "/dev/nvidia0", "/proc/driver/nvidia/gpus", "/dev/dxg"))


def device_sms() -> int | None:
    """The SM count of CUDA device 0 as torch sees it, None without one (or without torch)."""
    if not _gpu_device_files():
        return None
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_properties(0).multi_processor_count
    except Exception:  # torch missing or broken: no usable device
        return None
    return None


def resolve_target(target: str) -> str:
    if target not in TARGETS:
        raise PipelineError(f"unknown target {target!r}; choose one of {TARGETS}")
    if target == "sim":
        return "sim"
    has_gpu = device_sms() is not None
    if target == "gpu" and not has_gpu:
        raise PipelineError("--target gpu was asked for, but torch sees no CUDA device; "
                            "run on a machine with a Hopper GPU or use --target sim (the CPU arena simulator)")
    return "gpu" if has_gpu else "sim"


def compile_example(example_path: str | Path, *, overrides: Mapping[str, Any] | None = None,
                    scheduler: str | None = None, num_sms: int | None = None, policy: bool = True,
                    remat_budget: int | None = None, split_reductions: bool = True,
                    build_dir: str | Path | None = None, build: bool = True, routing: bool | str | None = None,
                    cache: bool = True, say: Callable[[str], None] = lambda m: None,
                    alias_views: bool = True, row_groups: bool = True, fuse_views: bool = True,
                    weight_copies: bool = True, attention_storage: bool = True,
                    store_products: bool = False) -> Compiled:
    """Run the whole pipeline (``latch_core.pipeline``) on one example; ``say`` gets one line per pass.

    ``routing``: expose routing decisions as outputs (``None``: exactly when the update routes tokens).
    """
    request = pipeline.Request(
        example=str(example_path), overrides=dict(overrides or {}), scheduler=scheduler,
        num_sms=num_sms or device_sms() or pipeline.DEFAULT_NUM_SMS, policy=policy, remat_budget=remat_budget,
        split_reductions=split_reductions, build=build, build_dir=None if build_dir is None else str(build_dir),
        routing="auto" if routing is None else routing, cache=cache, progress=say, alias_views=alias_views,
        row_groups=row_groups, fuse_views=fuse_views, weight_copies=weight_copies,
        attention_storage=attention_storage, store_products=store_products)

    def on_pass(p, doc):
        rec = doc.provenance[-1]
        say(f"{p.name:<26s} {rec.seconds:7.2f} s  {_summary(p.name, doc, rec.detail)}")

    doc = pipeline.compile(request, on_pass=on_pass)
    times = {rec.name: rec.seconds for rec in doc.provenance}
    out_dir = Path(doc.build.directory) if doc.build is not None else None
    return Compiled(request, doc, out_dir, times)


def _summary(name: str, doc: Document, detail: str) -> str:
    if name == "schedule" and doc.schedule is not None:
        s = doc.schedule
        tasks = sum(len(p.tasks) for p in s.programs)
        bars = sum(p.num_barriers for p in s.programs)
        ctrs = sum(len(p.counters) for p in s.programs)
        return f"{s.strategy}: {tasks} tasks on {s.num_sms} SMs, {bars} barriers, {ctrs} counters"
    if name == "memory.plan" and doc.memory is not None:
        peak = max((p.peak_live_bytes for p in doc.memory.programs), default=0)
        return f"arena {doc.memory.arena_bytes:,} bytes (peak live {peak:,})"
    if name == "schedule.validate":
        return "hazard-free"
    return detail


def summary_line(c: Compiled) -> str:
    """``NAME: capture X s, schedule+plan Y s (STRATEGY), build Z s (cached: ..., N bodies)`` (the GPU
    script greps it)."""
    t = c.times
    plan_s = sum(v for k, v in t.items() if k not in ("capture", "build"))
    line = f"{c.name}: capture {t.get('capture', 0.0):.2f} s, schedule+plan {plan_s:.2f} s ({c.doc.schedule.strategy})"
    if c.doc.build is not None:
        st = dict(c.doc.build.stats)
        line += f", build {t.get('build', 0.0):.2f} s (cached: {st.get('cached')}, {st.get('bodies')} bodies)"
    return line


def policy_note(doc: Document, target: str) -> str:
    """What the numerical policy means where the check runs (empty when nothing needs saying)."""
    from .policy import policy_of

    if target == "sim" and policy_of(doc) == "bf16":
        return ("note: the BF16 policy is NOT simulated: the arena simulator and the FP64 interpreter both compute "
                "in float64 and ignore operand_dtype, so these gates check the schedule and the memory plan, not "
                "BF16 rounding (that needs --target gpu)")
    return ""


_STEP = re.compile(r"step (\d+)")


def run_checks(compiled: Compiled, target: str, *, steps: int, seed: int = 0, cache: bool = True,
               say: Callable[[str], None] = lambda m: None, torch_column: bool = False, trained: int = 0):
    """Run ``steps`` updates on ``target`` and gate them against the FP64 reference; returns
    ``(CompareResult or results.Cached, cached: bool)``. GPU only: ``torch_column`` (PyTorch's own
    update as a column) and ``trained`` (one more update at a trained state; ``gpu.gpu_compare``)."""
    from latch_core import progress

    if target == "gpu":
        if compiled.build_dir is None:
            raise PipelineError("the GPU target needs a build; drop --no-build")
        from .gpu import gpu_compare

        with progress.task("gpu updates", total=steps + (1 if trained else 0)) as bar:
            result = gpu_compare(compiled.example, compiled.build_dir, steps=steps,
                                 progress=_stepper(bar, say, 1), torch_column=torch_column, trained=trained)
        return result, False
    if torch_column or trained:
        raise PipelineError("the torch column and the trained state are GPU checks; on the CPU use "
                            "latch_check.qualify.cpu_tables (tools/qualify_gates.py)")
    from . import results

    key = results.key(compiled, steps=steps, seed=seed) if cache else None
    hit = results.lookup(key) if key else None
    if hit is not None:
        return hit, True
    from .simulator import check_example

    K = int(compiled.doc.graph.meta("microbatches", 1))
    with progress.task("simulate", total=steps * K) as bar:
        result = check_example(compiled.example, compiled.doc, steps=steps, seed=seed, progress=_stepper(bar, say, K))
    if key:
        results.store(key, result)
    return result, False


def _stepper(bar, say, per_step: int):
    runs = {"n": 0}

    def tell(msg: str) -> None:
        if _STEP.search(msg):
            runs["n"] += 1
            bar.update(completed=runs["n"] if per_step > 1 else int(_STEP.search(msg).group(1)) + 1, note=msg)
        if not bar.drawn:
            say(msg)

    return tell


def verdict(result) -> str:
    """``PASS`` or ``FAIL (N gates)``; where some failures are torch-level (fresh-state sign-like gates
    within ``gates.FRESH_FACTOR`` x PyTorch's own error) the count says so. They stay failures."""
    fails = sum(len(t.failures()) for t in result.tables) if hasattr(result, "tables") else result.failures
    if result.passed:
        return "PASS"
    level = sum(1 for t in getattr(result, "tables", ()) for g in t.failures() if getattr(g, "torch_level", False))
    if level:
        return f"FAIL ({fails} gates, {level} torch-level: PyTorch's own BF16 update fails them too, docs/GATES.md)"
    return f"FAIL ({fails} gates)"


def gates_line(c: Compiled, result, *, steps: int) -> str:
    """``GATES NAME STRATEGY policy=P[ routing=replayed]: PASS over N updates`` (the GPU script greps it)."""
    from .policy import has_routing, policy_of

    routed = " routing=replayed" if has_routing(c.doc.graph.programs[-1]) else ""
    return f"GATES {c.name} {c.doc.schedule.strategy} policy={policy_of(c.doc)}{routed}: {verdict(result)} over {steps} updates"

