#!/usr/bin/env bash
# Set up a development environment in .venv: torch (CPU wheel, pinned), transformers (pinned),
# every Latch package editable, the demonstration third-party plugin, and the test tools.
#
# Usage: bash tools/setup.sh            (from anywhere; works on the repository it lives in)
# Environment: PYTHON   interpreter to build the venv from (default: python3; needs >= 3.10)
#              VENV     where to put the venv (default: <repo>/.venv)
# Re-running reuses an existing venv and only re-installs the Latch packages (fast).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
VENV="${VENV:-$ROOT/.venv}"
# torch is pinned exactly: any looser spec makes pip fetch GBs of CUDA wheels.
TORCH_PIN="torch==2.13.0"
# transformers (pinned; it does not depend on torch, so pip leaves torch alone): the examples
# hf_gpt2/hf_llama/hf_mixtral.py and their tests use its models unchanged. The H200 machine has
# 5.17.0 too.
TRANSFORMERS_PIN="transformers==5.17.0"

# Packages in dependency order; each is also installable alone (tools/check_isolation.sh).
PACKAGES=(latch-core latch-ops latch-schedule latch-memory latch-capture latch-check latch-codegen-h100)

"$PYTHON" - <<'PY' || { echo "setup.sh: $PYTHON is too old; Latch needs Python >= 3.10 (set PYTHON=...)" >&2; exit 1; }
import sys
sys.exit(0 if sys.version_info >= (3, 10) else 1)
PY

if [ ! -x "$VENV/bin/python" ]; then
    echo "setup.sh: creating $VENV"
    "$PYTHON" -m venv "$VENV"
fi
# pip warns about index locations of this machine's global pip configuration that do not exist;
# drop only that noise.
quiet_pip() { "$@" 2> >(grep -v "^WARNING: Location 'file:" >&2); }
PIP=(quiet_pip "$VENV/bin/python" -m pip --disable-pip-version-check)

# setuptools >= 70 builds PEP 660 editable wheels without the separate 'wheel' package, which lets
# us skip build isolation (no per-package download of a build environment).
# nvidia-cuda-cuobjdump + nvidia-cuda-nvdisasm: the disassembler (no GPU needed) that latch-pipeline sass and the machine-code
# tests read builds with.
"${PIP[@]}" install -q "setuptools>=70" "$TORCH_PIN" "$TRANSFORMERS_PIN" pytest hypothesis nvidia-cuda-cuobjdump==13.5.37 nvidia-cuda-nvdisasm==13.5.37

editable=()
for p in "${PACKAGES[@]}"; do
    editable+=(-e "$ROOT/packages/$p")
done
# The demo plugin is a stand-in for a third-party package: it reaches Latch only through its entry
# point (see tests/demo_plugin/README.md).
editable+=(-e "$ROOT/tests/demo_plugin")
"${PIP[@]}" install -q --no-build-isolation "${editable[@]}"

"$VENV/bin/python" -c "import latch_core, torch; print('setup.sh: ok: latch-core', latch_core.SCHEMA_VERSION, 'torch', torch.__version__)"
