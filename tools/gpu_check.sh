#!/usr/bin/env bash
# The ONE script for the H200 (run from the repository root, e.g. through the device tool):
#   1. install every package editable (that machine has python3 with torch, setuptools, nvcc, ninja,
#      pytest; no network: --no-deps --no-build-isolation);
#   2. per example: capture -> schedule -> plan -> build (a fresh cache: the first build is cold,
#      the second cached), then the GPU program against the FP64 reference over 10 updates under
#      both scheduling strategies (python -m latch_check.gpu prints every gate table); the MLP also
#      timed against eager PyTorch and a CUDA graph of the same eager update;
#   3. pytest -m gpu (the op-by-op, runtime and acceptance tests; the 10-update gate tests are
#      deselected here because step 2 runs exactly those and prints their tables);
#   4. compute-sanitizer memcheck and racecheck on two MLP updates;
#   5. a short summary table, LAST.
# Logs go to $OUT (default ./gpu-check-out): one file per step, and summary.txt.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT="${OUT:-$PWD/gpu-check-out}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/latch-gpu.XXXXXX")"
export LATCH_CACHE_DIR="$WORK/cache"   # fresh: cold builds are really cold
export PYTHONUNBUFFERED=1
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"
say() { echo "== [gpu_check ${SECONDS}s] $*"; }
row() { echo "$*" >> "$SUMMARY"; }

say "host: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee "$OUT/gpu.txt"
"$PY" -c 'import torch, sys; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "sms", torch.cuda.get_device_properties(0).multi_processor_count)' 2>&1 | tee -a "$OUT/gpu.txt"
nvcc --version | tail -2 | tee -a "$OUT/gpu.txt"

say "install"
EDITABLE=()
for p in latch-core latch-ops latch-schedule latch-memory latch-capture latch-check latch-codegen-h100; do
    EDITABLE+=(-e "packages/$p")
done
if ! "$PY" -m pip install -q --no-deps --no-build-isolation "${EDITABLE[@]}" > "$OUT/install.log" 2>&1; then
    tail -20 "$OUT/install.log"; echo "gpu_check: install failed" >&2; exit 2
fi
"$PY" -c 'import latch_core, latch_codegen_h100, latch_check.gpu; print("install ok")'

run_example() {  # name scheduler steps extra-args...
    local name="$1" sched="$2" steps="$3"; shift 3
    local log="$OUT/${name}-${sched}.log"
    say "$name ($sched)"
    timeout 240 "$PY" -m latch_check.gpu "examples/$name.py" --scheduler "$sched" --steps "$steps" \
        --dir "$WORK/build/$name-$sched" "$@" > "$log" 2>&1
    local rc=$?
    grep -E "^(GATES|BENCH)|cached rebuild|capture .* build" "$log"
    [ $rc -eq 0 ] || { echo "gpu_check: $name $sched exited $rc; last lines:"; tail -25 "$log"; }
    grep -E "^GATES" "$log" | sed 's/^/  /' >> "$SUMMARY" || row "  GATES $name $sched: no result (rc $rc)"
    grep -E "^BENCH" "$log" | sed 's/^/  /' >> "$SUMMARY" || true
    grep -E "cached rebuild" "$log" | sed "s/^/  $sched: /" >> "$SUMMARY" || true
}

row "latch gpu_check $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(head -1 "$OUT/gpu.txt")"
run_example two_weight barrier 1
run_example mlp barrier 10 --bench --iters 100
run_example mlp dataflow 10 --bench --iters 100
run_example transformer barrier 10 --policy
run_example transformer dataflow 10 --policy
# two_weight's acceptance figure: the weights after one GPU update
grep -E "two_weight" "$OUT/two_weight-barrier.log" | head -3

say "pytest -m gpu"
timeout 200 "$PY" -m pytest -m gpu -q -p no:cacheprovider packages tests \
    --deselect "packages/latch-check/tests/test_gpu_compare.py::test_gates_over_ten_updates" \
    > "$OUT/pytest_gpu.log" 2>&1
echo "pytest exit $?"
grep -E "passed|failed|error" "$OUT/pytest_gpu.log" | tail -3
grep -E "^(FAILED|ERROR)" "$OUT/pytest_gpu.log" | head -20
row "  pytest -m gpu: $(grep -E '(passed|failed)' "$OUT/pytest_gpu.log" | tail -1)"

say "compute-sanitizer on the MLP"
MLP_DIR="$WORK/build/mlp-barrier"
if command -v compute-sanitizer > /dev/null && [ -f "$MLP_DIR/program.so" ]; then
    for tool in memcheck racecheck; do
        LATCH_SPIN_TIMEOUT_S=300 timeout 150 compute-sanitizer --tool "$tool" --kernel-name kns=latch_kernel \
            "$PY" -m latch_core.cli run "$MLP_DIR" --steps 2 > "$OUT/sanitizer-$tool.log" 2>&1
        echo "$tool exit $?"
        tail -4 "$OUT/sanitizer-$tool.log"
        row "  compute-sanitizer $tool (MLP, 2 updates): $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitizer-$tool.log" | tail -1)"
    done
else
    row "  compute-sanitizer: not run (tool or MLP build missing)"
fi

rm -rf "$WORK"
say "summary"
cat "$SUMMARY"
