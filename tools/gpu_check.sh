#!/usr/bin/env bash
# The ONE script for the H200 (run from the repository root, e.g. through the device tool):
#   1. install every package editable (that machine has python3 with torch, setuptools, nvcc, ninja,
#      pytest; no network: --no-deps --no-build-isolation);
#   2. per example: `latch-pipeline compile --target gpu --twice` (latch_core.pipeline: capture ->
#      policy -> split reductions -> schedule -> plan -> validate -> build, in a fresh cache: the
#      first build is cold, the second cached), then the GPU program against the FP64 reference
#      over 10 updates under both scheduling strategies (compile prints every gate table and a
#      GATES line; --bench a BENCH line): two_weight,
#      the MLP (FP32; also timed against eager PyTorch and a CUDA graph of the same eager update),
#      the small dense transformer and a small TinyMoE (BF16 matmul/attention operands; TinyMoE with
#      --routing: its expert choices are program outputs, gated as near-ties against FP64's top-k,
#      and the FP64 reference replays them for every other gate, see latch_check/gpu.py); FP32
#      examples run with --no-policy (compile's default is the BF16 policy);
#   3. pytest -m gpu (the op-by-op, runtime and acceptance tests; the 10-update gate tests are
#      deselected here because step 2 runs exactly those and prints their tables);
#   4. compute-sanitizer memcheck and racecheck on two updates of the MLP and of the small transformer
#      (summary lines "racecheck: N hazards" / "memcheck: N errors");
#   5. the MLP with 4 microbatches (both strategies), the README's main command with --target gpu,
#      profiling builds (tools/profile_report.py: time per op, waiting at synchronisation) of the MLP
#      and of the full TinyMoE-200M, and a first timing of the full TinyMoE-200M at 2 x 1024
#      (LATCH_GPU_FULL=0 skips both full-size steps);
#   5b. (issue 12) `want bench`: latch-pipeline bench, the generated program against the eager,
#      torch.compile and one-CUDA-graph controls, with the gates' torch column (fresh and trained);
#      the profile step also writes the per-SM timeline of the small transformer;
#   6. a short summary table, LAST.
# LATCH_GPU_SEED_CACHE=DIR: start the fresh build cache from the libraries tools/seed_cache.py built on
# the CPU machine (the device call carries DIR); see that tool.
# Logs go to $OUT (default ./gpu-check-out), in few files (the device tool returns at most 8):
# gpu.txt, install.log, examples.log, pytest_gpu.log, sanitizer.log, summary.txt.
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
# LATCH_GPU_ONLY=matmul,pingpong,gather,memory,attention,copies,examples,attn64,readme,pytest,sanitizer,dense,denseprof,moe,profile,full,fullprof,lmhead,bench
# runs only the steps named (default: all; fullprof: the full TinyMoE-200M's profile without its timing step).
want() { [ -z "${LATCH_GPU_ONLY:-}" ] || [[ ",${LATCH_GPU_ONLY}," == *",$1,"* ]]; }
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
export LATCH_CAPTURE_CACHE="$WORK/capture-cache"   # fresh too: the first capture of each example is real
# LATCH_GPU_SEED_CACHE=.seed-cache (a folder the device call carries): libraries built on the CPU machine
# by tools/seed_cache.py, copied into the fresh cache, so the full-size builds are fetched (their sha256
# checked) instead of compiled (~3 min each). A seed whose key matches nothing here is not used.
if [ -n "${LATCH_GPU_SEED_CACHE:-}" ]; then
    mkdir -p "$LATCH_CACHE_DIR"
    n=$(find "$LATCH_GPU_SEED_CACHE" -maxdepth 1 -name '*.so' | wc -l)
    find "$LATCH_GPU_SEED_CACHE" -maxdepth 1 \( -name '*.so' -o -name '*.json' \) -exec cp {} "$LATCH_CACHE_DIR/" \;
    say "seeded the build cache with $n librar(ies) from $LATCH_GPU_SEED_CACHE"
    row "  seeded build cache: $n librar(ies) from $LATCH_GPU_SEED_CACHE"
fi

run_example() {  # limit name scheduler steps extra-args...
    local limit="$1" name="$2" sched="$3" steps="$4"; shift 4
    # LATCH_GPU_EXAMPLES="transformer:barrier tinymoe" runs only the examples (and strategies) named
    if [ -n "${LATCH_GPU_EXAMPLES:-}" ] && [[ " ${LATCH_GPU_EXAMPLES} " != *" $name "* ]] \
        && [[ " ${LATCH_GPU_EXAMPLES} " != *" $name:$sched "* ]]; then return 0; fi
    local log="$WORK/${name}-${sched}.log"
    say "$name ($sched)"
    # python -m latch_core.cli is latch-pipeline (the console script may not be on PATH there)
    timeout "$limit" "$PY" -m latch_core.cli compile "examples/$name.py" --target gpu --twice --scheduler "$sched" \
        --steps "$steps" --dir "$WORK/build/$name-$sched" "$@" > "$log" 2>&1
    local rc=$?
    { echo "===== $name $sched (exit $rc)"; cat "$log"; } >> "$OUT/examples.log"
    grep -E "^(GATES|BENCH)|cached rebuild|capture .* build" "$log"
    [ $rc -eq 0 ] || { echo "gpu_check: $name $sched exited $rc; last lines:"; tail -25 "$log"; }
    grep -E "^GATES" "$log" | sed 's/^/  /' >> "$SUMMARY" || row "  GATES $name $sched: no result (rc $rc)"
    grep -E "^BENCH" "$log" | sed 's/^/  /' >> "$SUMMARY" || true
    grep -E "cached rebuild" "$log" | sed "s/^/  $sched: /" >> "$SUMMARY" || true
}

row "latch gpu_check $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(head -1 "$OUT/gpu.txt")"

# The ping-pong matmul body (latch_gemm_pingpong.cuh, results/pp.md): every width in the three
# layouts at ragged shapes against FP64, bit-identical repeats (LATCH_GPU_ONLY=pingpong; bench-matmul
# compares it with the cooperative body through LATCH_GPU_MATMUL_ARGS="--classic"). Before the
# matmul step: a body that hangs or is wrong shows here first, in a small build.
if want pingpong; then
    say "pingpong GPU test"
    LATCH_SPIN_TIMEOUT_S=5 timeout "${LATCH_GPU_PP_S:-120}" "$PY" -m pytest -q -m gpu packages/latch-check/tests/test_gpu_pingpong.py \
        -p no:cacheprovider > "$WORK/pingpong.log" 2>&1
    rc=$?
    { echo "===== pingpong GPU test (exit $rc)"; cat "$WORK/pingpong.log"; } >> "$OUT/examples.log"
    tail -5 "$WORK/pingpong.log"
    row "  PINGPONG test_gpu_pingpong.py (exit $rc): $(tail -1 "$WORK/pingpong.log")"
fi

# The gathers' row path and the embedding backward's compacted walk (lower_indexing.py, results/ix.md):
# every gather against FP64 and bit-exact, row path and scalar loop, ragged tiles, odd widths,
# misaligned run starts, a converting gather, index errors; dW in index order, same bits twice
# (LATCH_GPU_ONLY=gather; ~40 s). LATCH_GPU_ONLY=gather,full adds the TinyMoE-200M profile to time them.
if want gather; then
    say "gather GPU test"
    LATCH_SPIN_TIMEOUT_S=5 timeout "${LATCH_GPU_GATHER_S:-150}" "$PY" -m pytest -q -m gpu \
        packages/latch-codegen-h100/tests/test_gpu_gather.py -p no:cacheprovider > "$WORK/gather.log" 2>&1
    rc=$?
    { echo "===== gather GPU test (exit $rc)"; cat "$WORK/gather.log"; } >> "$OUT/examples.log"
    tail -5 "$WORK/gather.log"
    row "  GATHER test_gpu_gather.py (exit $rc): $(tail -1 "$WORK/gather.log")"
fi

# The matrix products of TinyMoE-200M's dense path as Latch tasks (TMA + wgmma bodies on the worker)
# against torch.mm in a CUDA graph: correctness (FP32 output vs torch's FP32 product of the same BF16
# operands) and time per product (latch_check/bench_matmul.py). LATCH_GPU_TOKENS picks the sizes.
# LATCH_GPU_MATMUL_EPI="8 ...": the same cases again with every product's epilogue_slots set
# (shared-memory output boxes per consumer warp; more slots, fewer ring stages), one build each;
# LATCH_GPU_MATMUL_DEFAULT=0 skips the default run.
if want matmul; then
    variants=()
    [ "${LATCH_GPU_MATMUL_DEFAULT:-1}" = 1 ] && variants+=(default)
    for slots in ${LATCH_GPU_MATMUL_EPI:-}; do variants+=("$slots"); done
    for v in ${variants[@]+"${variants[@]}"}; do
        if [ "$v" = default ]; then
            tag=""; extra=(); what="bench-matmul"; label="MATMUL"
        else
            tag="-e$v"; extra=(--epilogue-slots "$v"); what="bench-matmul --epilogue-slots $v"; label="MATMUL epilogue_slots=$v"
        fi
        say "$what"
        LATCH_SPIN_TIMEOUT_S=5 timeout "${LATCH_GPU_MATMUL_S:-300}" "$PY" -m latch_core.cli bench-matmul \
            --tokens "${LATCH_GPU_TOKENS:-2048,32768}" ${extra[@]+"${extra[@]}"} --dir "$WORK/build/bench-matmul$tag" \
            --json "$OUT/matmul$tag.json" ${LATCH_GPU_MATMUL_ARGS:-} > "$WORK/matmul$tag.log" 2>&1
        rc=$?
        { echo "===== $what (exit $rc)"; cat "$WORK/matmul$tag.log"; } >> "$OUT/examples.log"
        tail -40 "$WORK/matmul$tag.log"
        { echo "  $label (exit $rc):"; grep -E "ring" "$WORK/matmul$tag.log" | sed 's/^/    /'
          sed -n '/^case /,$p' "$WORK/matmul$tag.log" | sed 's/^/    /'; } >> "$SUMMARY"
    done
fi

# Issue 11: the LM head fused with cross-entropy (memory.fuse_cross_entropy, latch_xent.cuh) and the
# deterministic embedding backward: their GPU tests (tests/test_lmhead_gpu.py), then bench-lmhead
# (2048 x 768 x 49152, BF16 products) against torch.compile's head + cross-entropy, with peak memory.
if want lmhead && [ "${LATCH_GPU_LMHEAD_TEST:-1}" = 1 ]; then
    say "lmhead: pytest -m gpu tests/test_lmhead_gpu.py"
    timeout "${LATCH_GPU_LMHEAD_TEST_S:-150}" "$PY" -m pytest -q -m gpu tests/test_lmhead_gpu.py > "$WORK/lmhead_pytest.log" 2>&1
    rc=$?
    { echo "===== lmhead pytest (exit $rc)"; cat "$WORK/lmhead_pytest.log"; } >> "$OUT/examples.log"
    tail -5 "$WORK/lmhead_pytest.log"
    row "  LMHEAD pytest (exit $rc): $(tail -1 "$WORK/lmhead_pytest.log")"
fi
if want lmhead; then  # LATCH_GPU_LMHEAD_TEST=0: the bench alone
    say "bench-lmhead"
    LATCH_SPIN_TIMEOUT_S=5 timeout "${LATCH_GPU_LMHEAD_S:-200}" "$PY" -m latch_core.cli bench-lmhead \
        --dir "$WORK/build/bench-lmhead" --json "$OUT/lmhead.json" > "$WORK/lmhead.log" 2>&1
    rc=$?
    { echo "===== bench-lmhead (exit $rc)"; cat "$WORK/lmhead.log"; } >> "$OUT/examples.log"
    tail -14 "$WORK/lmhead.log"
    { echo "  BENCH-LMHEAD (exit $rc):"; sed -n '/^bench-lmhead /,$p' "$WORK/lmhead.log" | sed 's/^/    /'; } >> "$SUMMARY"
fi
# ---- memory.weight_copies (wc, issue 9): BF16 weight copies kept as optimizer state. The GPU test
# (two updates with copies against two without: every shared tensor compared, the copies bit for bit
# bf16(new weight); the gates; the runtime), then TinyMoE-200M timed with and without the copies
# (--steps 0: its gates are the bench step's; LATCH_GPU_COPIES_BENCH=0 skips the timing).
if want copies; then
    say "copies: pytest -m gpu tests/test_weight_copies_gpu.py"
    timeout "${LATCH_GPU_COPIES_TEST_S:-200}" "$PY" -m pytest -q -s -m gpu -p no:cacheprovider \
        tests/test_weight_copies_gpu.py > "$WORK/copies_pytest.log" 2>&1
    rc=$?
    { echo "===== copies pytest (exit $rc)"; cat "$WORK/copies_pytest.log"; } >> "$OUT/examples.log"
    grep -E "^weight copies|passed|failed|^FAILED" "$WORK/copies_pytest.log" | tail -8
    row "  COPIES pytest (exit $rc): $(tail -1 "$WORK/copies_pytest.log")"
    grep -E "^weight copies" "$WORK/copies_pytest.log" | sed 's/^/    /' >> "$SUMMARY" || true
    if [ "${LATCH_GPU_COPIES_BENCH:-1}" = 1 ]; then
        for flag in --weight-copies --no-weight-copies; do
            timeout "${LATCH_GPU_COPIES_S:-180}" "$PY" -m latch_core.cli compile examples/tinymoe.py --target gpu \
                --steps 0 --bench --no-eager --iters 10 "$flag" --dir "$WORK/build/copies$flag" \
                > "$WORK/copies$flag.log" 2>&1
            rc=$?
            { echo "===== tinymoe-200M $flag (exit $rc)"; cat "$WORK/copies$flag.log"; } >> "$OUT/examples.log"
            grep -E "^BENCH|memory.weight_copies|error" "$WORK/copies$flag.log" | head -4
            row "  COPIES tinymoe-200M $flag (exit $rc): $(grep -E '^BENCH' "$WORK/copies$flag.log" | tail -1)"
        done
    fi
fi
# ---- issue 10: attention alone inside the persistent kernel (latch_check/bench_attention.py):
# the GPU tests of the attention bodies (FP64 gates at odd lengths, both head dims, causal and not,
# grouped-query, bit-identical backward), then forward and forward + backward times against torch's
# flash SDPA replayed from a CUDA graph (LATCH_GPU_ONLY=attention runs it alone; the pytest step
# below deselects test_gpu_attention.py, which runs here).
if want attention; then
    say "attention: pytest test_gpu_attention.py"
    # LATCH_GPU_ATTN_TEST_K: a pytest -k expression, e.g. "wgmma or mma_glse" (the build then holds
    # only the selected variants' programs)
    LATCH_SPIN_TIMEOUT_S=30 timeout "${LATCH_GPU_ATTN_TEST_S:-180}" "$PY" -m pytest -m gpu -q -p no:cacheprovider \
        ${LATCH_GPU_ATTN_TEST_K:+-k "$LATCH_GPU_ATTN_TEST_K"} \
        packages/latch-check/tests/test_gpu_attention.py > "$WORK/attention_pytest.log" 2>&1
    rc=$?
    { echo "===== test_gpu_attention.py (exit $rc)"; cat "$WORK/attention_pytest.log"; } >> "$OUT/examples.log"
    grep -E "^(FAILED|ERROR)|passed|failed" "$WORK/attention_pytest.log" | tail -12
    row "  attention GPU tests (exit $rc): $(grep -E '(passed|failed|error)' "$WORK/attention_pytest.log" | tail -1)"
    say "bench-attention"
    LATCH_SPIN_TIMEOUT_S=30 timeout "${LATCH_GPU_ATTN_S:-150}" "$PY" -m latch_core.cli bench-attention \
        --dir "$WORK/build/bench-attention" --json "$OUT/attention.json" ${LATCH_GPU_ATTN_ARGS:-} > "$WORK/attention.log" 2>&1
    rc=$?
    { echo "===== bench-attention (exit $rc)"; cat "$WORK/attention.log"; } >> "$OUT/examples.log"
    tail -30 "$WORK/attention.log"
    { echo "  ATTENTION (exit $rc):"; sed -n '/^case /,$p' "$WORK/attention.log" | sed 's/^/    /'; } >> "$SUMMARY"
    # LATCH_GPU_ATTN_NCU=<case substring>: Nsight Compute on that case's kernels (speed of light, warp
    # stall reasons, tensor-pipe use) into $OUT/attention-ncu.txt
    if [ -n "${LATCH_GPU_ATTN_NCU:-}" ] && command -v ncu > /dev/null; then
        say "attention: ncu on ${LATCH_GPU_ATTN_NCU}"
        timeout "${LATCH_GPU_ATTN_NCU_S:-150}" ncu --kernel-name latch_kernel --launch-count "${LATCH_GPU_ATTN_NCU_N:-8}" \
            --section SpeedOfLight --section WarpStateStats --section ComputeWorkloadAnalysis --section LaunchStats \
            "$PY" -m latch_core.cli bench-attention --only "$LATCH_GPU_ATTN_NCU" --iters 1 \
            --dir "$WORK/build/bench-attention" ${LATCH_GPU_ATTN_ARGS:-} > "$OUT/attention-ncu.txt" 2>&1
        rc=$?
        row "  attention ncu (exit $rc): $(grep -c 'latch_kernel' "$OUT/attention-ncu.txt") kernel reports in attention-ncu.txt"
    fi
fi
# LATCH_GPU_ONLY=attndiag: tools/diag_attention.py, every case of LATCH_GPU_DIAG_CASES (name:B:H:Hkv:T:D:causal,
# space-separated) in its own process (a faulting case cannot poison the next), then the first
# LATCH_GPU_DIAG_SAN cases again under compute-sanitizer memcheck (the faulting PC); DIAG lines to the summary.
if want attndiag; then
    say "attention diagnosis: build"
    DIAG="$WORK/build/diag-attention"
    timeout 200 "$PY" tools/diag_attention.py build "$DIAG" ${LATCH_GPU_DIAG_ARGS:-} ${LATCH_GPU_DIAG_CASES} \
        > "$WORK/diag.log" 2>&1
    rc=$?
    tail -3 "$WORK/diag.log"
    row "  attention diagnosis build (exit $rc)"
    say "attention diagnosis: run"
    timeout "${LATCH_GPU_DIAG_S:-200}" "$PY" tools/diag_attention.py run "$DIAG" ${LATCH_GPU_DIAG_RUN_ARGS:-} \
        ${LATCH_GPU_DIAG_CASES} > "$WORK/diag-run.log" 2>&1
    cat "$WORK/diag-run.log" | tee -a "$SUMMARY" | head -80
    if [ -n "${LATCH_GPU_DIAG_SAN:-}" ]; then
        say "attention diagnosis: compute-sanitizer"
        LATCH_DIAG_SANITIZE=memcheck LATCH_DIAG_S=120 timeout 250 "$PY" tools/diag_attention.py run "$DIAG" \
            ${LATCH_GPU_DIAG_RUN_ARGS:-} ${LATCH_GPU_DIAG_SAN} > "$WORK/diag-san.log" 2>&1
        cat "$WORK/diag-san.log" | tee -a "$SUMMARY" | head -80
    fi
    for d in "$DIAG"/d*; do [ -f "$d/program.so" ] && cp "$d/program.so" "$OUT/diag-$(basename "$d").so"; done
fi
# ---- end issue 10
# The bandwidth-bound bodies (latch_check/bench_memory.py): the clip + AdamW over TinyMoE-200M's
# 207.7M parameters (one fused pass per parameter, the clip scale folded in; with the BF16 weight copy;
# the norm alone) and the transformer update's row/elementwise bodies at 32 x 1024 tokens, each
# FP64-checked and timed inside the persistent kernel against its bytes floor at 4.27 TB/s; the
# control: torch's fused capturable AdamW + clip_grad_norm_(foreach) replayed from one CUDA graph.
if want memory; then
    say "bench-memory"
    LATCH_SPIN_TIMEOUT_S=5 timeout "${LATCH_GPU_MEMORY_S:-200}" "$PY" -m latch_core.cli bench-memory \
        --dir "$WORK/build/bench-memory" --json "$OUT/memory.json" ${LATCH_GPU_MEMORY_ARGS:-} > "$WORK/memory.log" 2>&1
    rc=$?
    { echo "===== bench-memory (exit $rc)"; cat "$WORK/memory.log"; } >> "$OUT/examples.log"
    tail -30 "$WORK/memory.log"
    { echo "  MEMORY (exit $rc):"; sed -n '/^body /,$p' "$WORK/memory.log" | sed 's/^/    /'; } >> "$SUMMARY"
fi

if want examples; then
run_example 60 two_weight barrier 1 --no-policy
run_example 100 mlp barrier 10 --no-policy --bench --iters 100
run_example 80 mlp dataflow 10 --no-policy --bench --iters 100
run_example 100 transformer barrier 10 --policy
run_example 80 transformer dataflow 10 --policy
MOE_SMALL=(--set vocab=256 --set d_model=64 --set layers=2 --set heads=4 --set experts=4 --set expert_hidden=32
           --set seq=32 --set device=cpu)
run_example 100 tinymoe barrier 10 --policy --routing "${MOE_SMALL[@]}"
run_example 80 tinymoe dataflow 10 --policy --routing "${MOE_SMALL[@]}"
# Ticketed phases (--scheduler tickets, latch_codegen_h100.tickets) on 8 SM lists, so that phases hold
# several tasks per list and the queues are real (the grid's other blocks take part in the barriers only)
run_example 100 transformer tickets 10 --policy --num-sms 8
run_example 100 tinymoe tickets 10 --policy --routing "${MOE_SMALL[@]}" --num-sms 8

# ---- issue 13: transformers' GPT-2, Llama and Mixtral, unchanged (examples/hf_*.py, tiny configs,
# BF16 policy, 10 updates; Mixtral with --routing). Needs transformers on the machine (5.17.0 there);
# LATCH_GPU_HF=0 skips, LATCH_GPU_HF=2 also runs the dataflow strategy. Gated as the dense step is:
# the fresh updates with the torch column, and the update from the state after 200 eager FP32
# updates (docs/GATES.md: where the update itself is gated); LATCH_GPU_HF_ARGS replaces those flags.
if [ "${LATCH_GPU_HF:-1}" != 0 ] && "$PY" -c 'import transformers' > /dev/null 2>&1; then
    HF_SCHEDS=(barrier)
    [ "${LATCH_GPU_HF:-1}" = 2 ] && HF_SCHEDS+=(dataflow)
    read -r -a HF_ARGS <<< "${LATCH_GPU_HF_ARGS:---torch-column --trained 200}"
    for sched in "${HF_SCHEDS[@]}"; do
        run_example 120 hf_gpt2 "$sched" 10 --policy "${HF_ARGS[@]}"
        run_example 120 hf_llama "$sched" 10 --policy "${HF_ARGS[@]}"
        run_example 150 hf_mixtral "$sched" 10 --policy --routing "${HF_ARGS[@]}"
    done
else
    row "  hf_gpt2/hf_llama/hf_mixtral: not run (LATCH_GPU_HF=${LATCH_GPU_HF:-1}, or transformers missing)"
fi
# ---- end issue 13

# Microbatches: `accumulate` K-1 times, then `accumulate_and_update`, gated per update.
# (own build directories: the sanitizer below runs the K = 1 MLP build of mlp-barrier)
run_example 120 mlp barrier 5 --no-policy --set microbatches=4 --dir "$WORK/build/mlp-k4-barrier"
run_example 100 mlp dataflow 5 --no-policy --set microbatches=4 --dir "$WORK/build/mlp-k4-dataflow"
fi  # examples

# ---- the ring's wgmma attention inside a model, gated (LATCH_GPU_ONLY=attn64): head dim 64 (d_model 128,
# 2 heads), where memory.policy stores attention in BF16 and the lowering picks the wgmma bodies (the
# examples step's small models have head dim 16: SIMT attention). Own build directories and logs.
if want attn64; then
run_example 150 transformer barrier 10 --policy --set d_model=128 --set heads=2 --set seq=128 --set layers=2 \
    --dir "$WORK/build/transformer-d64"
if [ "${LATCH_GPU_ATTN64_MOE:-1}" = 1 ]; then  # LATCH_GPU_ATTN64_MOE=0: the transformer alone
run_example 150 tinymoe barrier 10 --policy --routing --set vocab=256 --set d_model=128 --set layers=2 --set heads=2 \
    --set experts=4 --set expert_hidden=32 --set seq=128 --set device=cpu --dir "$WORK/build/tinymoe-d64"
fi
fi

if want readme; then
say "README's main command on the GPU"
timeout 150 "$PY" -m latch_core.cli compile examples/mlp.py --target gpu --steps 2 \
    --build-dir "$WORK/build/readme-mlp" > "$WORK/readme.log" 2>&1
rc=$?
{ echo "===== latch-pipeline compile examples/mlp.py --target gpu (exit $rc)"; cat "$WORK/readme.log"; } >> "$OUT/examples.log"
tail -3 "$WORK/readme.log"
row "  README main command on the GPU (exit $rc): $(grep -E '^latch compile' "$WORK/readme.log" | tail -1)"
fi

if want pytest; then
say "pytest -m gpu"
# --maxfail: a device fault poisons the CUDA context, and every later test fails slowly after it;
# stopping early leaves the time for pytest to print the first failures' tracebacks.
# LATCH_GPU_PYTEST_FILES: the test paths (default: every package and tests/); LATCH_GPU_PYTEST_K: a -k expression
read -r -a PYTEST_FILES <<< "${LATCH_GPU_PYTEST_FILES:-packages tests}"
PYTEST_K=()
[ -n "${LATCH_GPU_PYTEST_K:-}" ] && PYTEST_K=(-k "$LATCH_GPU_PYTEST_K")
timeout "${LATCH_GPU_PYTEST_S:-200}" "$PY" -m pytest -m gpu -q -p no:cacheprovider --continue-on-collection-errors \
    --maxfail="${LATCH_GPU_PYTEST_MAXFAIL:-5}" "${PYTEST_FILES[@]}" "${PYTEST_K[@]}" \
    --deselect "packages/latch-check/tests/test_gpu_compare.py::test_gates_over_ten_updates" \
    --deselect "packages/latch-check/tests/test_routing_gpu.py::test_tinymoe_bf16_with_routing_passes_its_gates_on_the_gpu" \
    --deselect "packages/latch-check/tests/test_gpu_attention.py" \
    > "$OUT/pytest_gpu.log" 2>&1
echo "pytest exit $?"
grep -E "passed|failed|error" "$OUT/pytest_gpu.log" | tail -3
grep -E "^(FAILED|ERROR)" "$OUT/pytest_gpu.log" | head -20
row "  pytest -m gpu: $(grep -E '(passed|failed)' "$OUT/pytest_gpu.log" | tail -1)"
fi

# compute-sanitizer memcheck and racecheck on two updates of the MLP (FP32, SIMT bodies) and of the
# small transformer (examples/transformer.py defaults, --policy: BF16, the TMA + wgmma products on
# the worker's ring), from the example builds; a build the examples step did not make (e.g.
# LATCH_GPU_ONLY=sanitizer) is made here first, gated over 2 updates (barrier strategy). Each run's
# verdict is a summary line "racecheck: N hazards (...)" / "memcheck: N errors (...)".
if want sanitizer && command -v compute-sanitizer > /dev/null; then
    for target in mlp-barrier transformer-barrier; do
        dir="$WORK/build/$target"
        if [ ! -f "$dir/program.so" ]; then
            case "$target" in mlp-*) ex=mlp; pol=--no-policy ;; *) ex=transformer; pol=--policy ;; esac
            say "build $target for the sanitizer"
            timeout 150 "$PY" -m latch_core.cli compile "examples/$ex.py" --target gpu --scheduler barrier --steps 2 \
                "$pol" --dir "$dir" > "$WORK/sanitizer-build.log" 2>&1
            rc=$?
            { echo "===== build $target (exit $rc)"; cat "$WORK/sanitizer-build.log"; } >> "$OUT/sanitizer.log"
            grep -E "^GATES" "$WORK/sanitizer-build.log" | sed 's/^/  /' >> "$SUMMARY"
            [ -f "$dir/program.so" ] || { row "  compute-sanitizer $target: not run (its build failed, rc $rc)"; continue; }
        fi
        say "compute-sanitizer on $target"
        for tool in racecheck memcheck; do
            LATCH_SPIN_TIMEOUT_S=300 timeout 120 compute-sanitizer --tool "$tool" --kernel-name kns=latch_kernel \
                "$PY" -m latch_core.cli run "$dir" --steps 2 > "$WORK/sanitizer-$tool.log" 2>&1
            rc=$?
            { echo "===== $target $tool (exit $rc)"; cat "$WORK/sanitizer-$tool.log"; } >> "$OUT/sanitizer.log"
            echo "$tool exit $rc"
            tail -4 "$WORK/sanitizer-$tool.log"
            verdict="$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$WORK/sanitizer-$tool.log" | tail -1)"
            row "  compute-sanitizer $tool ($target, 2 updates, exit $rc): $verdict"
            if [ "$tool" = racecheck ]; then  # "RACECHECK SUMMARY: 8 hazards displayed (8 errors, 0 warnings)"
                n="$(sed -nE 's/.*RACECHECK SUMMARY: ([0-9]+) hazards?.*/\1/p' <<< "$verdict")"
            else                              # "ERROR SUMMARY: 0 errors"
                n="$(sed -nE 's/.*ERROR SUMMARY: ([0-9]+) errors?.*/\1/p' <<< "$verdict")"
            fi
            steps="$(grep -cE '^step [0-9]+:' "$WORK/sanitizer-$tool.log")"
            if [ -z "$n" ]; then
                row "  $tool: no result ($target, exit $rc)"
            elif [ "$tool" = racecheck ]; then
                row "  racecheck: $n hazards ($target, $steps of 2 updates, exit $rc)"
            else
                row "  memcheck: $n errors ($target, $steps of 2 updates, exit $rc)"
            fi
        done
    done
elif want sanitizer; then
    row "  compute-sanitizer: not on this machine"
fi

# The dense transformer of TARGETS.md (d_model 768, 8 layers, 12 heads, vocab 49,152, 2 x 1024
# tokens; BF16 policy) as ONE kernel: its gates over one update against the FP64 reference, and its
# update time against the strongest control (the compiled model, fused AdamW, the whole update in
# one CUDA graph) in the same process.
if want dense; then
    # LATCH_GPU_DENSE_TRAINED (default 200): also gate one update at the state after that many eager
    # FP32 updates (docs/GATES.md: where the update is gated; 0: the fresh state only).
    # LATCH_GPU_DENSE_SCHEDULERS (default: barrier): one compile per strategy; the second one's
    # build is a cache hit (the bodies are the same), so it costs the run and the gates only.
    # LATCH_GPU_DENSE_FLAGS: extra compile flags (e.g. --no-alias-views, to time without issue 11's aliases).
    DENSE=(--set d_model=768 --set layers=8 --set heads=12 --set vocab=49152 --set seq=1024 --set batch=2
           --set mlp_hidden=2048)
    for dsched in ${LATCH_GPU_DENSE_SCHEDULERS:-barrier}; do
    say "dense transformer, full size ($dsched)"
    timeout "${LATCH_GPU_DENSE_S:-420}" "$PY" -m latch_core.cli compile examples/transformer.py --target gpu "${DENSE[@]}" \
        --scheduler "$dsched" --steps 1 --torch-column --trained "${LATCH_GPU_DENSE_TRAINED:-200}" \
        --bench --strongest --no-eager --iters 5 \
        ${LATCH_GPU_DENSE_FLAGS:-} --dir "$WORK/build/dense-$dsched" > "$OUT/dense-$dsched.log" 2>&1
    rc=$?
    cp "$OUT/dense-$dsched.log" "$WORK/dense.log"  # in $OUT as it runs: a call cut by its time limit keeps it
    { echo "===== dense transformer $dsched (exit $rc)"; cat "$WORK/dense.log"; } >> "$OUT/examples.log"
    grep -E "^(GATES|BENCH|STRONGEST)|capture |build |schedule |FAIL" "$WORK/dense.log" | head -20
    [ $rc -eq 0 ] || { echo "gpu_check: dense exited $rc; last lines:"; tail -25 "$WORK/dense.log"; }
    grep -E "^(GATES|BENCH|STRONGEST)" "$WORK/dense.log" | sed 's/^/  dense: /' >> "$SUMMARY" || row "  dense $dsched: no result (rc $rc)"
    done
fi

# TinyMoE-200M's expert layer (examples/moe_layer.py: router, top-2, route_order, the three ragged
# products as grouped wgmma, combine; forward + backward + SGD) in the persistent kernel: the ragged
# bodies' GPU tests, then bench-moe (FP64 gates, two runs bit-identical, ms against torch _grouped_mm
# replayed from a CUDA graph; latch_check/bench_moe.py).
if want moe; then
    say "moe: ragged bodies (pytest) and bench-moe"
    LATCH_SPIN_TIMEOUT_S=5 timeout "${LATCH_GPU_MOE_S:-200}" "$PY" -m pytest -q -m gpu -p no:cacheprovider \
        packages/latch-codegen-h100/tests/test_moe_bodies.py > "$WORK/moe-pytest.log" 2>&1
    rc=$?
    { echo "===== moe pytest (exit $rc)"; cat "$WORK/moe-pytest.log"; } >> "$OUT/examples.log"
    tail -15 "$WORK/moe-pytest.log"
    row "  MOE pytest (exit $rc): $(tail -1 "$WORK/moe-pytest.log")"
    LATCH_SPIN_TIMEOUT_S=5 timeout "${LATCH_GPU_MOE_S:-200}" "$PY" -m latch_core.cli bench-moe \
        --dir "$WORK/build/bench-moe" --json "$OUT/moe.json" ${LATCH_GPU_MOE_ARGS:-} > "$WORK/moe.log" 2>&1
    rc=$?
    { echo "===== bench-moe (exit $rc)"; cat "$WORK/moe.log"; } >> "$OUT/examples.log"
    tail -40 "$WORK/moe.log"
    { echo "  MOE bench-moe (exit $rc):"; sed -n '/^bench-moe:/,$p' "$WORK/moe.log" | sed 's/^/    /'; } >> "$SUMMARY"
fi

# Profiling builds (tools/profile_report.py, -DLATCH_PROFILE=1): where the kernel's time goes per op,
# and the share of SM-time spent waiting at barriers and counters (TARGETS.md: < 5%). The MLP under
# both strategies, then the full TinyMoE-200M at 2 x 1024 (barrier, BF16 policy), bounded by what is
# left of the call minus what the timing step below needs. Tables go to the summary too.
run_profile() {  # limit tag example args...
    local limit="$1" tag="$2" name="$3"; shift 3
    local log="$WORK/profile-$tag.log"
    say "profile $tag"
    timeout "$limit" "$PY" tools/profile_report.py "examples/$name.py" --dir "$WORK/build/profile-$tag" "$@" \
        > "$log" 2>&1
    local rc=$?
    { echo "===== profile $tag (exit $rc)"; cat "$log"; } >> "$OUT/examples.log"
    if grep -q "^PROFILE" "$log"; then
        sed -n '/^PROFILE/,$p' "$log"
        { echo "  PROFILE TABLES $tag (exit $rc):"; sed -n '/^PROFILE/,$p' "$log" | sed 's/^/    /'; } >> "$SUMMARY"
    else
        echo "gpu_check: profile $tag exited $rc; last lines:"; tail -25 "$log"
        row "  PROFILE $tag: no result (rc $rc): $(tail -1 "$log")"
    fi
}
if want profile; then
run_profile 90 mlp-barrier mlp --scheduler barrier --updates 3
run_profile 90 mlp-dataflow mlp --scheduler dataflow --updates 3
# ---- issue 12: the per-SM timeline of one update (trace.json for Perfetto, timeline.png, summary.json)
run_profile 120 transformer-small-barrier transformer --scheduler barrier --policy --updates 2 \
    --trace-dir "$OUT/timeline-transformer"
fi
# The full-size dense transformer's profiling build (LATCH_GPU_ONLY=denseprof): time per op, waiting,
# and its per-SM timeline (trace.json, timeline.png, summary.json in $OUT/timeline-dense).
if want denseprof; then
run_profile "${LATCH_GPU_DENSEPROF_S:-300}" dense-barrier transformer --scheduler barrier --policy --updates 2 \
    --set d_model=768 --set layers=8 --set heads=12 --set vocab=49152 --set seq=1024 --set batch=2 \
    --set mlp_hidden=2048 --trace-dir "$OUT/timeline-dense"
fi
TIMING_S=150  # what the full TinyMoE-200M timing step below takes (capture + build twice + bench)
want full || TIMING_S=0  # fullprof alone: no timing step after the profile
LEFT=$(( ${LATCH_GPU_BUDGET_S:-570} - SECONDS - TIMING_S ))
if { want full || want fullprof; } && [ "${LATCH_GPU_FULL:-1}" = 1 ] && [ "$LEFT" -gt 60 ]; then
    # LATCH_GPU_FULL_SCHEDULER=tickets: the same profile with ticketed phases (latch_codegen_h100.tickets)
    FSCHED="${LATCH_GPU_FULL_SCHEDULER:-barrier}"
    # LATCH_GPU_FULL_PROFILE_ARGS: more profile_report arguments (e.g. "--set batch=32 --set seq=1024
    # --set microbatches=1": the 32 x 1024 profile); LATCH_GPU_FULL_TRACE=0: the summary, no trace
    TRACE_ARGS=(--trace-dir "$OUT/timeline-tinymoe")
    [ "${LATCH_GPU_FULL_TRACE:-1}" = 1 ] || TRACE_ARGS=()
    # LATCH_GPU_FULL_PHASES=1: tools/trace_phases.py on the trace, on the device (phases-tinymoe.txt, every table in .json); the
    # trace and the planned document then stay there (at 32 x 1024 they pass what a call returns)
    [ "${LATCH_GPU_FULL_PHASES:-0}" = 1 ] && TRACE_ARGS=(--trace-dir "$WORK/timeline-tinymoe" --phases "$OUT/phases-tinymoe.txt")
    run_profile "$LEFT" "tinymoe-200M-$FSCHED" tinymoe --scheduler "$FSCHED" --policy --updates 2 \
        ${LATCH_GPU_FULL_PROFILE_ARGS:-} "${TRACE_ARGS[@]}"
    # ~100k tasks: the trace can pass the 16 MiB a returned file may have; Perfetto opens it gzipped
    [ -f "$OUT/timeline-tinymoe/trace.json" ] && gzip -f "$OUT/timeline-tinymoe/trace.json"
else
    row "  PROFILE tinymoe-200M: not run (LATCH_GPU_FULL=${LATCH_GPU_FULL:-1}, ${LEFT}s left of the call after the timing's ${TIMING_S}s)"
fi

# TinyMoE-200M at 2 x 1024, full size: a first timing of the simple bodies (no gates: the FP64
# reference of 200M parameters on this CPU would take minutes). Not a speed claim against the
# strongest control (torch.compile + one CUDA graph); eager and its CUDA graph are timed alongside.
LEFT=$(( ${LATCH_GPU_BUDGET_S:-570} - SECONDS ))
if want full && [ "${LATCH_GPU_FULL:-1}" = 1 ] && [ "$LEFT" -gt 60 ]; then
    run_example "$LEFT" tinymoe barrier 0 --policy --bench --iters 5
else
    row "  tinymoe-200M: not run (LATCH_GPU_FULL=${LATCH_GPU_FULL:-1}, ${LEFT}s left of the call)"
fi

# ---- issue 12: `latch-pipeline bench`: the generated program against eager PyTorch, torch.compile +
# fused AdamW, and the compiled model with the whole update in ONE CUDA graph (graph-safe MoE), same
# weights and batches, plus the gates with PyTorch's own BF16 update as the torch column (fresh
# state and after LATCH_GPU_TRAINED updates) on a small TinyMoE. LATCH_GPU_BENCH_SHAPES (full size;
# default 2x1024,32x1024; the published 16x8x1024 needs a call of its own while the generated kernel
# takes ~1 s per 2 x 1024 tokens) and LATCH_GPU_BENCH_ARGS choose. The JSON is rewritten after every
# shape, so a timeout keeps the shapes done. Files in $OUT: bench.json, timeline-transformer/ (3).
if want bench; then
    say "bench"
    MOE_SMALL_B=(--set vocab=256 --set d_model=64 --set layers=2 --set heads=4 --set experts=4 --set expert_hidden=32)
    if [ "${LATCH_GPU_BENCH_SMALL:-1}" = 1 ]; then   # LATCH_GPU_BENCH_SMALL=0: the full-size bench alone
        timeout "${LATCH_GPU_BENCH_SMALL_S:-200}" "$PY" -m latch_core.cli bench examples/tinymoe.py "${MOE_SMALL_B[@]}" \
            --shapes "${LATCH_GPU_BENCH_SMALL_SHAPES:-2x32,4x2x32}" --iters 20 --gate-steps 1 --trained "${LATCH_GPU_TRAINED:-200}" \
            ${LATCH_GPU_BENCH_SMALL_ARGS:-} \
            --dir "$WORK/build/bench-small" --json "$WORK/bench-small.json" > "$WORK/bench-small.log" 2>&1
        rc=$?
        { echo "===== bench tinymoe small (exit $rc)"; cat "$WORK/bench-small.log"; } >> "$OUT/examples.log"
        sed -n '/^BENCH TABLE/,$p' "$WORK/bench-small.log"; grep -E "^GATES|error" "$WORK/bench-small.log"
        { echo "  BENCH tinymoe small (exit $rc):"; grep -E "^GATES" "$WORK/bench-small.log" | sed 's/^/    /'
          sed -n '/^BENCH TABLE/,$p' "$WORK/bench-small.log" | sed 's/^/    /'; } >> "$SUMMARY"
    fi
    LEFT=$(( ${LATCH_GPU_BUDGET_S:-570} - SECONDS ))
    if [ "${LATCH_GPU_FULL:-1}" = 1 ] && [ "$LEFT" -gt 90 ]; then
        timeout "$LEFT" "$PY" -m latch_core.cli bench examples/tinymoe.py --shapes "${LATCH_GPU_BENCH_SHAPES:-2x1024,32x1024}" \
            ${LATCH_GPU_BENCH_ARGS:---iters 10} --dir "$WORK/build/bench" --json "$OUT/bench.json" \
            > "$WORK/bench.log" 2>&1
        rc=$?
        { echo "===== bench tinymoe (exit $rc)"; cat "$WORK/bench.log"; } >> "$OUT/examples.log"
        sed -n '/^BENCH TABLE/,$p' "$WORK/bench.log"; grep -E "error" "$WORK/bench.log" | head -5
        { echo "  BENCH tinymoe-200M (exit $rc):"; sed -n '/^BENCH TABLE/,$p' "$WORK/bench.log" | sed 's/^/    /'
          [ $rc -eq 0 ] || tail -3 "$WORK/bench.log" | sed 's/^/    /'; } >> "$SUMMARY"
    else
        row "  BENCH tinymoe-200M: not run (LATCH_GPU_FULL=${LATCH_GPU_FULL:-1}, ${LEFT}s left of the call)"
    fi
    # LATCH_GPU_BENCH_VARIANTS="store-products": the same shapes built with bench's --VARIANT flag, each
    # against the strongest control (graph) timed again in the same process; bench-<variant>.json in $OUT
    for V in ${LATCH_GPU_BENCH_VARIANTS:-}; do
        LEFT=$(( ${LATCH_GPU_BUDGET_S:-570} - SECONDS ))
        if [ "$LEFT" -le 90 ]; then row "  BENCH tinymoe-200M --$V: not run (${LEFT}s left of the call)"; continue; fi
        timeout "$LEFT" "$PY" -m latch_core.cli bench examples/tinymoe.py --shapes "${LATCH_GPU_BENCH_SHAPES:-2x1024,32x1024}" \
            ${LATCH_GPU_BENCH_ARGS:---iters 10} "--$V" --controls graph --dir "$WORK/build/bench-$V" \
            --json "$OUT/bench-$V.json" > "$WORK/bench-$V.log" 2>&1
        rc=$?
        { echo "===== bench tinymoe --$V (exit $rc)"; cat "$WORK/bench-$V.log"; } >> "$OUT/examples.log"
        { echo "  BENCH tinymoe-200M --$V (exit $rc):"; sed -n '/^BENCH TABLE/,$p' "$WORK/bench-$V.log" | sed 's/^/    /'
          [ $rc -eq 0 ] || tail -3 "$WORK/bench-$V.log" | sed 's/^/    /'; } >> "$SUMMARY"
    done
    # LATCH_GPU_BENCH_SCHEDULERS="dataflow tickets_data": the same shapes (or LATCH_GPU_BENCH_SCHEDULER_SHAPES)
    # under other schedulers, each against the strongest control (graph) timed again in the same
    # process (a ratio is always against a control of the same run); bench-<scheduler>.json in $OUT
    for S in ${LATCH_GPU_BENCH_SCHEDULERS:-}; do
        LEFT=$(( ${LATCH_GPU_BUDGET_S:-570} - SECONDS ))
        if [ "$LEFT" -le 90 ]; then row "  BENCH tinymoe-200M $S: not run (${LEFT}s left of the call)"; continue; fi
        timeout "$LEFT" "$PY" -m latch_core.cli bench examples/tinymoe.py \
            --shapes "${LATCH_GPU_BENCH_SCHEDULER_SHAPES:-${LATCH_GPU_BENCH_SHAPES:-2x1024,32x1024}}" \
            ${LATCH_GPU_BENCH_ARGS:---iters 10} --scheduler "$S" --controls graph --dir "$WORK/build/bench-$S" \
            --json "$OUT/bench-$S.json" > "$WORK/bench-$S.log" 2>&1
        rc=$?
        { echo "===== bench tinymoe $S (exit $rc)"; cat "$WORK/bench-$S.log"; } >> "$OUT/examples.log"
        { echo "  BENCH tinymoe-200M --scheduler $S (exit $rc):"; sed -n '/^BENCH TABLE/,$p' "$WORK/bench-$S.log" | sed 's/^/    /'
          [ $rc -eq 0 ] || tail -3 "$WORK/bench-$S.log" | sed 's/^/    /'; } >> "$SUMMARY"
    done
fi
# ---- end issue 12

rm -rf "$WORK"
say "summary"
cat "$SUMMARY"
