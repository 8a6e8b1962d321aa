#!/usr/bin/env bash
# The checks that need a CUDA GPU, as one script for a short lease (about 8 min on an H100 before the e2e stage and
# bench_train's 5 runs per case were added; MLP=0 ATTENTION=0 GRID=0 keeps the tests, e2e and bench_train):
#   1. the kernel, layer norm, MLP, embedding, Markov walk, model, fast path, ensemble and sampler tests, compiled on the GPU (with the card's name),
#      and the transformer's batched seeds (transformer_tau.train_seeds) on the card against the CPU
#   2. bench_mlp.py: the MLP kernel against torch's matmuls and GELU; MLP_SWEEP=1 (default) times its tile sets
#      first and writes kernels/mlp_tiles.json, which the kernel reads (MLP=0 skips the stage); PREVIOUS_MLP=<file>
#      times an earlier kernels/mlp.py beside it, with the same tiles
#   3. the default command end to end: `train.py --K 256 --preset paper` for E2E_ITERS steps (default
#      20000) with 10 evaluations, in its CUDA default (bf16, TF32 matmuls) and with --fp32: the first lines (the
#      precision it states), the progress lines' it/s (evaluations left out) and the wall time (E2E=0 skips it);
#      (E2E_FP32=0: the default alone); then bench_train.py with TF32 matmuls (BENCH_ARGS: more flags, such as
#      "--sizes 64 --runs 5"; BENCH_TIMEOUT, default 360 s): single eager / graphed, ensembles of 8, 32, 64 graphed, peak memory,
#      the variants (torch's layer norm, the residual adds unfused, torch's MLP, torch's embedding, three Q, K, V
#      projections, layer 1's norm on x0's rows, per-member sampling, bf16 mixed precision, PREVIOUS's attention) and a profile of the largest ensemble's eager step
#      in both precisions and of the single run's in bf16; each case 5 runs (median and spread), the sampler
#      inside the step's graph ("with sampling"), the same with fastdata's scan instead of the walk kernel ("scan
#      sampling"), outside it ("host sampling"), and a torch.compile'd whole step; BENCH_ONLY="this,bf16,..." keeps
#      those variants only (bench_train.py --only)
#   4. bench_attention.py: the kernel against eager, SDPA and FlexAttention at ATTENTION_N (default 256,1024;
#      ATTENTION=0 skips it); SWEEP=1 re-runs the tile sweep first (all kernels, ~2.5 min, or
#      SWEEP_KERNELS="dq bias" for one) and writes kernels/tiles.json, which the kernel reads;
#      PREVIOUS_ATTENTION=<file> times an earlier kernel beside it (with the tiles.json beside that file);
#      ATTENTION_ARGS: more flags (--only-kernel: the kernel alone, eager and graphed; --rotate: the rotary
#      pre-pass alone first, its block/sequence candidates against PREVIOUS_ATTENTION's and a copy)
#   5. a 4-model graphed grid at the paper preset (K = 94, seeds 0-3, 3000 steps), TF32 and then --bf16:
#      wall time, and per member max phi_beta(2) and tau_2gen, so that bf16 is judged on the physics too
#      (GRID=0 skips it)
# Logs go to $OUT (default: runs/gpu_check), at most 8 files (what the lease returns).
#
#     bash bench/gpu_check.sh
#     MLP=0 ATTENTION=0 GRID=0 bash bench/gpu_check.sh      # the sampler in the graph, the default command's rate
#     MLP=0 ATTENTION=0 GRID=0 E2E_ITERS=60000 BENCH_ONLY="this,bf16,scan sampling,bf16 scan sampling,bf16 compiled" \
#         bash bench/gpu_check.sh                           # the walk kernel's worth, ~6 min predicted
#     MLP=0 ATTENTION=0 GRID=0 E2E=0 BENCH_ONLY="bf16,bf16 unfused QKV,bf16 norm of x0,bf16 unfused add" \
#         bash bench/gpu_check.sh                           # what fuse_qkv, norm_table and add_cast buy
#     git show <commit>:kernels/mlp.py > .gpu/old_mlp.py; PREVIOUS_MLP=.gpu/old_mlp.py MLP_SWEEP=0 bash bench/gpu_check.sh
#     git show <commit>:kernels/attention.py > .gpu/old.py; PREVIOUS=.gpu/old.py SWEEP=1 bash bench/gpu_check.sh
#     SWEEP=1 SWEEP_KERNELS="dq bias" ATTENTION_N=256 PREVIOUS_ATTENTION=.gpu/old.py bash bench/gpu_check.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-runs/gpu_check}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
PREV=${PREVIOUS:+--previous $PREVIOUS}
PREV_ATTENTION=${PREVIOUS_ATTENTION:+--previous $PREVIOUS_ATTENTION}
start=$SECONDS
source bench/gpu_common.sh
stage() { echo "== $1 (at ${SECONDS}s)"; }
# a log's first lines: the commit, the card, torch and Triton (HEADER), then the stage
open_log() { { echo "$HEADER"; stage "$1"; } | tee "$OUT/$2"; }

open_log tests tests.log
# compiles dominate the tests: 8 processes when pytest-xdist is there
XDIST=$($PY -c "import xdist" 2>/dev/null && echo "-n 8")
timeout 180 $PY -m pytest -q $XDIST -rf --tb=short tests/test_attention.py tests/test_layer_norm.py tests/test_mlp.py tests/test_embedding.py tests/test_transformer.py \
    tests/test_fastpath.py tests/test_ensemble.py tests/test_markov.py tests/test_markov_walk.py tests/test_train.py::test_the_graphed_run_trains_on_the_plain_runs_batches \
    tests/test_sa_transformer.py::test_batched_seeds_on_cuda_are_the_cpus_on_the_same_batches \
    2>&1 | tee -a "$OUT/tests.log"

if [ "${MLP:-1}" = 1 ]; then
    open_log bench_mlp bench_mlp.log
    MLP_ARGS=()
    [ "${MLP_SWEEP:-1}" = 1 ] && MLP_ARGS=(--sweep --write-tiles kernels/mlp_tiles.json)
    [ -n "${PREVIOUS_MLP:-}" ] && MLP_ARGS+=(--previous "$PREVIOUS_MLP")
    timeout 200 $PY bench/bench_mlp.py "${MLP_ARGS[@]}" 2>&1 | tee -a "$OUT/bench_mlp.log"
    [ -f kernels/mlp_tiles.json ] && cp kernels/mlp_tiles.json "$OUT/mlp_tiles.json"
fi

# the e2e runs and bench_train.py share one log (the lease returns at most 8 files)
echo "$HEADER" > "$OUT/bench_train.log"
if [ "${E2E:-1}" = 1 ]; then
    stage e2e | tee -a "$OUT/bench_train.log"
    precisions=("")
    [ "${E2E_FP32:-1}" = 1 ] && precisions+=("--fp32")
    for precision in "${precisions[@]}"; do
        t0=$SECONDS
        timeout 150 $PY train.py --K 256 --preset paper --iters "${E2E_ITERS:-20000}" --evals 10 $precision --overwrite \
            --out "/tmp/gpu_check_e2e$precision" 2>&1 | tee -a "$OUT/bench_train.log"
        echo "e2e ${precision:-default}: exit ${PIPESTATUS[0]}, $((SECONDS - t0)) s wall" | tee -a "$OUT/bench_train.log"
    done
fi

stage bench_train | tee -a "$OUT/bench_train.log"
timeout "${BENCH_TIMEOUT:-360}" $PY bench/bench_train.py --tf32 --profile $PREV ${BENCH_ONLY:+--only "$BENCH_ONLY"} ${BENCH_ARGS:-} 2>&1 \
    | tee -a "$OUT/bench_train.log"

if [ "${ATTENTION:-1}" = 1 ]; then
    open_log bench_attention bench_attention.log
    if [ "${SWEEP:-0}" = 1 ]; then
        SWEEP_ARGS=(--sweep --sweep-kernels "${SWEEP_KERNELS:-fwd,dkdv,dq,dq bias}" --write-tiles kernels/tiles.json)
    else
        SWEEP_ARGS=()
    fi
    timeout ${ATTENTION_TIMEOUT:-330} $PY bench/bench_attention.py "${SWEEP_ARGS[@]}" --N "${ATTENTION_N:-256,1024}" --json "$OUT/bench_attention.json" $PREV_ATTENTION ${ATTENTION_ARGS:-} 2>&1 \
        | tee -a "$OUT/bench_attention.log"
    [ "${SWEEP:-0}" = 1 ] && cp kernels/tiles.json "$OUT/tiles.json"
fi

[ "${GRID:-1}" = 1 ] || { echo "gpu_check: ${SECONDS}s in all"; exit 0; }
# the real-use rate, and bf16 against TF32 on the same 4 models
open_log grid grid.log
for precision in "" "--bf16"; do
    t0=$SECONDS
    timeout 75 $PY sweep.py --K 94 --seeds 0-3 --preset paper --iters 3000 --evals 5 --eval-every 100 --tf32 $precision \
        --overwrite --out "/tmp/gpu_check_grid$precision" 2>&1 | tail -n 6 | tee -a "$OUT/grid.log"
    echo "grid ${precision:-tf32}: exit ${PIPESTATUS[0]}, $((SECONDS - t0)) s wall (a killed grid's rows are partial)" | tee -a "$OUT/grid.log"
done
$PY - "$OUT/grid.json" <<'EOF' 2>&1 | tee -a "$OUT/grid.log"
import glob, json, os, sys
from analysis import runs, thresholds
summary = {}
for precision in ("", "--bf16"):
    for run in sorted(glob.glob(f"/tmp/gpu_check_grid{precision}/K*_s*/")):
        cfg, dense = runs.read_metrics(run, dense=True)
        last = dense[-1]
        summary[f"{precision or 'tf32'} {os.path.basename(os.path.dirname(run))}"] = dict(
            max_phi_beta_2=round(max(r["phi_beta_2"] for r in dense), 4), tau_2gen=thresholds.tau_2gen(dense),
            train_loss=round(last["train_loss"], 4), gen_loss=round(last["gen_loss"], 4))
for name, row in summary.items():
    print(name, row)
json.dump(summary, open(sys.argv[1], "w"), indent=1)
EOF
echo "gpu_check: ${SECONDS}s in all (from ${start}s)"
