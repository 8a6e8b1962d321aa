#!/usr/bin/env bash
# One GPU call under 10 minutes (a command's limit where GPU time comes in 15-minute slots, start-up included), in the order
# of the GPU checks and runs, each stage packed into $OUT as it ends so that a call cut short returns what it did:
#   1. the default CUDA path checked (gpu_check.sh with MLP=0 ATTENTION=0 GRID=0): every kernel's tests compiled on
#      the card (and the transformer's batched seeds against the CPU), `train.py --K 256` end to end in the default
#      precision for E2E_ITERS steps (default 30000: over 30 s of steps), bench_train.py for 1 and 64 models, TF32
#      and bf16, with the sampler in the graph (5 runs each)                       -> tests.log, bench_train.log
#      Where a test fails nothing below trains: no ledger or record takes a run from a broken engine.
#   2. the campaigns (gpu_campaign.sh, its tests skipped: stage 1 ran them) in the time left before LIMIT seconds
#      from the start (default 570)                                                 -> campaign.log, campaign.tar.gz
# With session.log, five files, under the eight a call returns.
# Pass COMMIT=$(git rev-parse HEAD) where the copy on the card has no .git.
#
#     bash bench/gpu_session.sh                 # run(command="COMMIT=<sha> bash bench/gpu_session.sh", timeout_s=590)
#     STAGES=campaign bash bench/gpu_session.sh   # a second call on the same machine: skip the check
# Here, afterwards: tar -xzf <files_at>/campaign.tar.gz; python -m campaigns status <campaign> names its figures' command.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-runs/gpu_session}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
LIMIT=${LIMIT:-570}
STAGES=${STAGES:-check campaign}
source bench/gpu_common.sh  # HEADER, read once here and passed on to gpu_check.sh and gpu_campaign.sh
{ echo "$HEADER"; echo "stages: $STAGES, limit ${LIMIT} s"; } | tee "$OUT/session.log"

if [[ " $STAGES " == *" check "* ]]; then
    OUT="$OUT" MLP=0 ATTENTION=0 GRID=0 E2E_FP32=0 E2E_ITERS="${E2E_ITERS:-30000}" BENCH_ONLY="this,bf16" \
        BENCH_ARGS="--sizes 64 --runs 5" BENCH_TIMEOUT="${BENCH_TIMEOUT:-150}" bash bench/gpu_check.sh > /dev/null 2>&1
    # pytest's summary line: any "failed" or "error" in it, or none at all (a timeout), stops the training stages
    summary=$(grep -E "^(=+ )?[0-9]+ (passed|failed)" "$OUT/tests.log" | tail -n 1)
    echo "check: ${summary:-no pytest summary (timed out?)} (at ${SECONDS}s)" | tee -a "$OUT/session.log"
    if [ -z "$summary" ] || [[ "$summary" == *failed* ]] || [[ "$summary" == *error* ]]; then
        echo "the default CUDA path failed its tests: nothing trains" | tee -a "$OUT/session.log"
        exit 1
    fi
fi

if [[ " $STAGES " == *" campaign "* ]]; then
    total=$(( LIMIT - SECONDS ))
    echo "== campaigns, ${total} s left (at ${SECONDS}s)" | tee -a "$OUT/session.log"
    OUT="$OUT" TESTS=0 TOTAL="$total" bash bench/gpu_campaign.sh > /dev/null 2>&1
    tail -n 3 "$OUT/campaign.log" | tee -a "$OUT/session.log"
fi
echo "gpu_session: ${SECONDS}s in all" | tee -a "$OUT/session.log"
