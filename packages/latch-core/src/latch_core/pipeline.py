"""The whole compiler, top to bottom: one flat list of named passes, from the user's example file
to a built program.

    pass                        registered by        what it does
    capture                     latch-capture        example file -> graph section (cached by what it reads)
    memory.policy               latch-memory         numerical policy: BF16 operands of matmul/attention
    memory.fuse_cross_entropy   latch-memory         graph rewrite: the LM head's cross-entropy, logits stored BF16
    moe.store_operands          latch-ops            graph rewrite: BF16 operands of the ragged expert products
    moe.route_split             latch-ops            graph rewrite: route_order over many SMs (chunk counts first)
    moe.fixed_order_scatters    latch-ops            graph rewrite: MoE scatters to tokens as fixed-order gathers
    ops.embedding_grad_sum      latch-ops            graph rewrite: a tied embedding's two gradients summed by its backward
    memory.weight_copies        latch-memory         graph rewrite: each weight's BF16 copy is optimizer state
    memory.remat                latch-memory         recompute cheap forward values under a byte budget
    schedule.matmul_layouts     latch-schedule       graph rewrite: transposes feeding matmuls become trans flags
    schedule.split_reductions   latch-schedule       graph rewrite: big full reductions in two levels
    schedule.matmul_configs     latch-schedule       graph rewrite: each matmul's body configuration, split-K
    schedule.fuse_views         latch-schedule       graph rewrite: fusable views cloned per reader that fuses them
    schedule.alias_views        latch-schedule       graph rewrite: contiguous views cloned per reader (alias prefixes)
    schedule                    latch-schedule       fusion, tiles, SM assignment, barriers or counters
    memory.plan                 latch-memory         liveness, in-place updates, arena offsets
    schedule.validate           latch-schedule       static hazard proof over schedule + memory plan
    build                       latch-codegen-h100   lower every node to CUDA, ninja/nvcc build (cached)

``latch-pipeline compile``, the Python API (:func:`compile`) and the GPU script run exactly this
list (less the stages a request switches off: :meth:`Request.passes`); ``latch-pipeline passes``
runs any sub-list of it (:func:`sub_list`: ``schedule..build``) or of the registered passes.

Latch-core imports no torch and no stage package: each name is resolved in the pass registry when
it runs, so a pass comes from whichever installed plugin registers it, and a missing one is an
error naming the package to install. Every pass appends its provenance record to the document,
capture and build included (``latch-pipeline show`` prints them).
"""

from __future__ import annotations

import os
from typing import Any, Callable, Mapping, Sequence

import attrs

from .document import Document
from .passes import Pass, PassError, run_pass


@attrs.frozen
class Stage:
    name: str  # the registered pass
    package: str  # the distribution that registers it
    what: str
    switch: str = ""  # empty: always runs; else the Request field that turns it on


PIPELINE: tuple[Stage, ...] = (
    Stage("capture", "latch-capture", "example file -> graph section (cached by what it reads)"),
    Stage("memory.policy", "latch-memory", "numerical policy: BF16 operands of matmul/attention", "policy"),
    Stage("memory.fuse_cross_entropy", "latch-memory",
          "graph rewrite: the LM head's cross-entropy as one op pair over logits stored BF16", "fuse_cross_entropy"),
    Stage("moe.store_operands", "latch-ops", "graph rewrite: BF16 operands of the ragged expert products stored",
          "policy"),
    Stage("moe.route_split", "latch-ops",
          "graph rewrite: route_order over many SMs (per-chunk counts, then place, rows and offsets)", "route_split"),
    Stage("moe.fixed_order_scatters", "latch-ops",
          "graph rewrite: MoE scatters back to tokens as gathers summed in a fixed order (no atomics)"),
    Stage("ops.embedding_grad_sum", "latch-ops",
          "graph rewrite: a tied embedding's two gradients summed by the embedding backward itself"),
    Stage("memory.weight_copies", "latch-memory",
          "graph rewrite: each weight's BF16 copy is optimizer state, written by the update", "weight_copies"),
    Stage("memory.remat", "latch-memory", "recompute cheap forward values under a byte budget", "remat_budget"),
    Stage("schedule.matmul_layouts", "latch-schedule", "graph rewrite: transposes feeding matmuls become trans flags",
          "matmul_layouts"),
    Stage("schedule.split_reductions", "latch-schedule", "graph rewrite: big full reductions in two levels",
          "split_reductions"),
    Stage("schedule.matmul_configs", "latch-schedule",
          "graph rewrite: each matmul's body configuration (cost model) and split-K factor", "matmul_configs"),
    Stage("schedule.fuse_views", "latch-schedule",
          "graph rewrite: a fusable view read by several nodes cloned per reader that fuses it (no view "
          "materialises inside elementwise chains)", "fuse_views"),
    Stage("schedule.alias_views", "latch-schedule",
          "graph rewrite: a contiguous view read by several nodes cloned per reader (alias prefixes)", "alias_views"),
    Stage("schedule", "latch-schedule", "fusion, tiles, SM assignment, barriers or counters"),
    Stage("memory.plan", "latch-memory", "liveness, in-place updates, arena offsets"),
    Stage("schedule.validate", "latch-schedule", "static hazard proof over schedule + memory plan"),
    Stage("build", "latch-codegen-h100", "lower every node to CUDA, ninja/nvcc build (cached)", "build"),
)

NAMES: tuple[str, ...] = tuple(s.name for s in PIPELINE)
DEFAULT_NUM_SMS = 132


def stage(name: str) -> Stage:
    for s in PIPELINE:
        if s.name == name:
            return s
    raise PassError(f"{name!r} is not a stage of the pipeline; its stages: {', '.join(NAMES)}")


@attrs.frozen
class Request:
    """What one compilation of an example file asks for; :meth:`passes` and :meth:`options` turn
    it into the pass list and each pass's keyword options."""

    example: str
    overrides: Mapping[str, Any] = attrs.field(factory=dict, converter=dict)
    scheduler: str | None = None
    num_sms: int = DEFAULT_NUM_SMS
    policy: bool = True
    remat_budget: int | None = None
    fuse_cross_entropy: bool = True
    route_split: bool = True  # moe.route_split: route_order over many SMs where it has two chunks or more
    split_reductions: bool = True
    matmul_layouts: bool = True
    matmul_configs: bool = True
    alias_views: bool = True  # contiguous views fold into their reader's operand address (schedule option)
    fuse_views: bool = True  # schedule.fuse_views + schedule option fuse_concat (issue 11: views and concats fused)
    weight_copies: bool = True  # BF16 weight copies as optimizer state (memory.weight_copies)
    attention_storage: bool = True  # memory.policy option attention: attention's operands stored in BF16
    store_products: bool = False  # memory.policy option products: products feeding only BF16 consumers write BF16
    row_groups: bool = True  # a row reduction, its statistic's chain and its consumer in one group (schedule option)
    build: bool = True
    build_dir: str | None = None  # default: build/<example>-<strategy>
    routing: bool | str = "auto"  # expose routing decisions as outputs ("auto": when the update routes)
    grads: bool = True  # gradients as outputs, so the checks can gate each of them
    cache: bool = True  # capture and build caches
    progress: Callable[[str], None] | None = attrs.field(default=None, eq=False)

    def passes(self) -> list[str]:
        on = {"policy": self.policy, "fuse_cross_entropy": self.fuse_cross_entropy, "remat_budget": self.remat_budget is not None,
              "split_reductions": self.split_reductions, "matmul_layouts": self.matmul_layouts,
              "matmul_configs": self.matmul_configs, "alias_views": self.alias_views, "fuse_views": self.fuse_views,
              "build": self.build, "weight_copies": self.weight_copies, "route_split": self.route_split}
        return [s.name for s in PIPELINE if not s.switch or on[s.switch]]

    def options(self) -> dict[str, dict[str, Any]]:
        opts: dict[str, dict[str, Any]] = {
            "capture": {"example": str(self.example), "overrides": dict(self.overrides), "grads": self.grads,
                        "routing": self.routing, "cache": self.cache, "progress": self.progress},
            "schedule.split_reductions": {"num_sms": self.num_sms},
            "schedule.matmul_configs": {"num_sms": self.num_sms},
            "schedule": {"num_sms": self.num_sms, "alias_views": self.alias_views, "row_groups": self.row_groups,
                         "fuse_concat": self.fuse_views},
            "build": {"directory": self.build_dir, "use_cache": self.cache, "progress": self.progress},
        }
        if not self.attention_storage:
            opts["memory.policy"] = {"attention": False}
        if self.store_products:
            opts.setdefault("memory.policy", {})["products"] = True
        if self.scheduler:
            opts["schedule"]["scheduler"] = self.scheduler
        if self.remat_budget is not None:
            opts["memory.remat"] = {"budget_bytes": int(self.remat_budget)}
        return opts


def sub_list(spec: str, registered: Sequence[str] = ()) -> list[str]:
    """Pass names from a comma-separated ``spec``; each item is a pass name, ``pipeline`` (the whole
    list), or a range ``a..b`` of the pipeline (either end may be left out: ``schedule..``)."""
    out: list[str] = []
    for item in (x.strip() for x in spec.split(",")):
        if not item:
            continue
        # `pipeline` and a range hold the stages a default compile runs: an optional stage that is
        # off by default and needs an option to run (memory.remat: a byte budget) is named alone
        default = Request("").passes()
        if item == "pipeline":
            out += default
        elif ".." in item:
            a, b = (x.strip() for x in item.split("..", 1))
            i = NAMES.index(stage(a).name) if a else 0
            j = NAMES.index(stage(b).name) if b else len(NAMES) - 1
            if j < i:
                raise PassError(f"range {item!r} runs backwards: {b} comes before {a} in the pipeline "
                                f"({', '.join(NAMES)})")
            out += [n for n in NAMES[i:j + 1] if n in default or n in (NAMES[i], NAMES[j])]
        else:
            out.append(item)
    return out


def resolve(names: Sequence[str], registry=None) -> list[Pass]:
    """The registered passes named ``names``; a pipeline stage nobody registered names its package."""
    if registry is None:
        from .plugins import registries

        registry = registries().passes
    out = []
    for n in names:
        if n not in registry:
            try:
                s = stage(n)
            except PassError:
                registry.get(n)  # raises: no pass named n, listing the registered ones
                raise
            raise PassError(f"pass {n!r} ({s.what}) is registered by {s.package}, which is not installed (or "
                            f"excluded by LATCH_PLUGINS={os.environ.get('LATCH_PLUGINS', '')!r}); install {s.package}")
        out.append(registry.get(n))
    return out


def run(names: Sequence[str], doc: Document | None = None, options: Mapping[str, Mapping[str, Any]] | None = None,
        *, on_pass: Callable[[Pass, Document], None] | None = None, registry=None) -> Document:
    """Run the passes ``names`` in order on ``doc`` (default: an empty document, for capture);
    ``options[name]`` are that pass's keyword options; ``on_pass(pass, doc)`` after each."""
    doc = Document() if doc is None else doc
    options = options or {}
    for p in resolve(names, registry):
        doc = run_pass(p, doc, **dict(options.get(p.name, {})))
        if on_pass is not None:
            on_pass(p, doc)
    return doc


def compile(request: Request, *, on_pass: Callable[[Pass, Document], None] | None = None,
            registry=None) -> Document:
    """The whole pipeline for one request: ``run(request.passes(), Document(), request.options())``."""
    return run(request.passes(), None, request.options(), on_pass=on_pass, registry=registry)


def went_through(doc: Document) -> list[str]:
    """The passes a document went through, in order (its provenance)."""
    return [p.name for p in doc.provenance]
