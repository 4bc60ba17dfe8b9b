"""What the machine code of a build really holds: wgmma, TMA, the register split, spills.

    latch-pipeline sass BUILD_DIR          # the report below, from BUILD_DIR/program.so

``cuobjdump`` (the CUDA toolkit's, or the pip wheel ``nvidia-cuda-cuobjdump``, which runs on a
machine without a GPU) disassembles the kernel; :func:`report` counts what matters for speed:

- ``HGMMA`` instructions by shape (tensor-core products; a matrix body without them is on the slow
  path) and how many are issued back to back without a wait between them (``serialized`` counts an
  HGMMA followed at once by ``WARPGROUP.DEPBAR.LE gsb0, 0x0``: ptxas serialises wgmma when it cannot
  prove the warpgroup converged, C7510/C7518);
- ``UTMALDG`` (TMA loads) and ``SYNCS`` (mbarrier operations);
- ``USETMAXREG`` allocations and deallocations (the producer/consumer register split: ptxas drops it
  silently in some forms, e.g. calls across separately compiled units);
- ``LDL``/``STL`` (local memory: spills or arrays indexed at run time) and the registers and stack
  of the kernel from the resource usage.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import attrs


class SassError(RuntimeError):
    pass


def find_cuobjdump() -> str:
    """LATCH_CUOBJDUMP, else the ``nvidia-cuda-cuobjdump`` wheel's binary, else cuobjdump on PATH or
    in $CUDA_HOME/bin."""
    explicit = os.environ.get("LATCH_CUOBJDUMP")
    if explicit:
        if not os.access(explicit, os.X_OK):
            raise SassError(f"LATCH_CUOBJDUMP={explicit!r} is not an executable file")
        return explicit
    import importlib.util

    spec = importlib.util.find_spec("nvidia")  # the namespace package of NVIDIA's CUDA wheels, if any
    for root in (spec.submodule_search_locations or []) if spec is not None else []:
        for p in sorted(Path(root).glob("*/bin/cuobjdump")):
            if os.access(p, os.X_OK):
                return str(p)
    for cand in (shutil.which("cuobjdump"),
                 os.path.join(os.environ["CUDA_HOME"], "bin", "cuobjdump") if os.environ.get("CUDA_HOME") else None):
        if cand and os.access(cand, os.X_OK):
            return cand
    raise SassError("cuobjdump not found: `pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm` (they run "
                    "without a GPU), put the CUDA toolkit's cuobjdump on PATH, or set LATCH_CUOBJDUMP")


@attrs.frozen
class SassReport:
    hgmma: dict[str, int]  # shape (e.g. "64x128x16.F32.BF16") -> count
    hgmma_serialized: int
    utmaldg: int
    syncs: int
    setmaxreg_alloc: tuple[int, ...]  # register counts the consumers grow to
    setmaxreg_dealloc: tuple[int, ...]  # ... the producer shrinks to
    local_loads: int
    local_stores: int
    registers: int
    stack: int
    utmastg: int = 0  # TMA stores (the matmul epilogue through shared memory)
    ldg128: int = 0  # 16-byte global loads (LDG.E.128: the vector paths of the memory-bound bodies)
    stg128: int = 0  # 16-byte global stores

    def lines(self) -> list[str]:
        g = ", ".join(f"{k} x{v}" for k, v in sorted(self.hgmma.items())) or "none"
        return [
            f"HGMMA (tensor-core products)  {sum(self.hgmma.values())}: {g}",
            f"  serialized (a wait after each) {self.hgmma_serialized}",
            f"UTMALDG (TMA loads)           {self.utmaldg}",
            f"UTMASTG (TMA stores)          {self.utmastg}",
            f"SYNCS (mbarrier operations)   {self.syncs}",
            f"USETMAXREG                    grow to {list(self.setmaxreg_alloc)}, shrink to {list(self.setmaxreg_dealloc)}",
            f"LDG.E.128 / STG.E.128         {self.ldg128} / {self.stg128}",
            f"local memory (LDL / STL)      {self.local_loads} / {self.local_stores}",
            f"kernel registers / stack      {self.registers} / {self.stack} bytes",
        ]


def _env(tool: str) -> dict:
    """cuobjdump runs nvdisasm for -sass: point it at the one beside it or in the wheels' tree."""
    env = dict(os.environ)
    if "NVDISASM_PATH" not in env and not shutil.which("nvdisasm"):
        here = Path(tool).parent
        cands = [here] + [Path(p).parent for p in sorted(here.parent.parent.glob("*/bin/nvdisasm"))]
        for d in cands:
            if (d / "nvdisasm").exists():
                env["NVDISASM_PATH"] = str(d)
                env["PATH"] = f"{d}{os.pathsep}{env.get('PATH', '')}"
                break
    return env


def _run(cmd: list[str]) -> str:
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=_env(cmd[0]))
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SassError(f"{cmd[0]} failed: {e}") from None
    if p.returncode != 0:
        raise SassError(f"{' '.join(cmd)} failed: {p.stderr.strip()[-400:]}")
    return p.stdout


def parse(sass: str, resources: str) -> SassReport:
    """Count what the report shows from cuobjdump's ``-sass`` and ``-res-usage`` output."""
    instrs = [ln.split(";")[0].strip() for ln in sass.splitlines() if re.match(r"\s*/\*[0-9a-f]{4,}\*/", ln)]
    instrs = [re.sub(r"^/\*[0-9a-f]+\*/\s*", "", x) for x in instrs]
    hgmma: dict[str, int] = {}
    serialized, prev_gsb = 0, False
    for x in instrs:
        m = re.search(r"\bHGMMA\.(\S+)", x)
        if m:
            hgmma[m.group(1)] = hgmma.get(m.group(1), 0) + 1
            # A pipelined group of wgmma marks only its last HGMMA (gsb0) for the wait; serialised
            # code marks and waits for every one, so two marked HGMMAs in a row mean serialisation.
            gsb = "gsb0" in x
            serialized += gsb and prev_gsb
            prev_gsb = gsb
    alloc = tuple(int(m.group(1), 16) for m in re.finditer(r"USETMAXREG\.TRY_ALLOC\S*\s+\S+,\s*(0x[0-9a-f]+)", sass))
    dealloc = tuple(int(m.group(1), 16) for m in re.finditer(r"USETMAXREG\.DEALLOC\S*\s+(0x[0-9a-f]+)", sass))
    m = re.search(r"Function latch_kernel:\s*\n\s*REG:(\d+)\s+STACK:(\d+)", resources)
    return SassReport(
        hgmma=hgmma, hgmma_serialized=serialized,
        utmaldg=sum(1 for x in instrs if x.startswith("UTMALDG") or " UTMALDG" in x),
        utmastg=sum(1 for x in instrs if re.search(r"\bUTMASTG\b", x)),
        syncs=sum(1 for x in instrs if "SYNCS." in x),
        setmaxreg_alloc=alloc, setmaxreg_dealloc=dealloc,
        local_loads=sum(1 for x in instrs if re.search(r"\bLDL\b", x)),
        local_stores=sum(1 for x in instrs if re.search(r"\bSTL\b", x)),
        registers=int(m.group(1)) if m else -1, stack=int(m.group(2)) if m else -1,
        ldg128=sum(1 for x in instrs if re.search(r"\bLDG\.E\S*\.128\b", x)),
        stg128=sum(1 for x in instrs if re.search(r"\bSTG\.E\S*\.128\b", x)),
    )


def sass_report(library: str | Path, cuobjdump: str | None = None) -> SassReport:
    """The machine-code report of a built ``program.so`` (or object file)."""
    tool = cuobjdump or find_cuobjdump()
    lib = str(library)
    if not Path(lib).exists():
        raise SassError(f"{lib}: no such file; build the document first")
    return parse(_run([tool, "-sass", lib]), _run([tool, "-res-usage", lib]))


__all__ = ["SassReport", "SassError", "find_cuobjdump", "parse", "sass_report"]
