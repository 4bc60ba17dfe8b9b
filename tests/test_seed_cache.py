"""tools/seed_cache.py: a library built into a seed cache is what a later build of the same example
fetches instead of compiling (the H200 run starts from it: tools/gpu_check.sh LATCH_GPU_SEED_CACHE)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from latch_codegen_h100 import have_nvcc

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.skipif(not have_nvcc(), reason="needs nvcc")


def test_a_seeded_cache_serves_the_build_of_another_machine(tmp_path):
    seed = tmp_path / "seed"
    out = subprocess.run([sys.executable, str(ROOT / "tools" / "seed_cache.py"), "examples/two_weight.py",
                          "--no-policy", "--cache", str(seed), "--dir", str(tmp_path / "seed-build")],
                         cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-2000:]
    libs = sorted(p.name for p in seed.glob("*.so"))
    assert len(libs) == 1 and (seed / libs[0].replace(".so", ".json")).exists(), sorted(os.listdir(seed))
    # the device run: a fresh cache holding only the seed's files (as gpu_check.sh copies them), another
    # build directory, another unit split's worth of cores: fetched, not compiled
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    for p in seed.iterdir():
        if p.suffix in (".so", ".json"):
            shutil.copy(p, fresh / p.name)
    env = dict(os.environ, LATCH_CACHE_DIR=str(fresh), LATCH_CAPTURE_CACHE=str(tmp_path / "capture"))
    code = ("from latch_check.pipeline import compile_example\n"
            "c = compile_example('examples/two_weight.py', policy=False, build_dir=%r)\n"
            "print('CACHED', dict(c.doc.build.stats).get('cached'))\n" % str(tmp_path / "device-build"))
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "CACHED cache" in out.stdout, out.stdout[-2000:]
