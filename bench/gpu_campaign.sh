#!/usr/bin/env bash
# One GPU call of the paper-scale campaigns (campaign.py), sized to a lease of ~10 minutes:
#   1. the card, and the engine's tests compiled on it (the ensembles, the fast path, the packed attention, the
#      embedding; TESTS=0 skips them): where they fail no campaign runs, so that no ledger takes a piece trained by
#      a broken engine; the sampler's walk kernel's tests always (where they fail, the campaign samples with the
#      scan: MARKOV_ICL_WALK=0)
#   2. the next pieces of each campaign in CAMPAIGNS (default "k1_paper reweight_paper tau_paper sweep_paper": the
#      K1* searches' pending probes first, then the fixed grids), each given the time left before TOTAL seconds
#      (default 500) from the start, less ANALYSIS seconds (default 20) for the reports; K1* pieces of at most
#      MAX_PROBES probes (default 16). Each ensemble pays a fixed cost once: k1_paper's 11 pieces on an H100 fit
#      35.7 s per ensemble + 0.546 x the spec's prediction (8.0 s a probe), with an 8.6 s margin
#      (campaign.calibration), so 16 probes are predicted at 172 s (10.8 s a probe) and 8 at 108 s (13.5 s a probe);
#      16 holds a round's control probes in one ensemble and keeps a killed piece's loss, and the fit's
#      extrapolation beyond the 8 probes measured, moderate;
#      grid pieces of at most MAX_RUNS runs (default: as many as fit). circuits_mem_paper (~8 min) and
#      circuits_paper (done) are not in the default: CAMPAIGNS=circuits_mem_paper TESTS=0 TOTAL=560 runs the former
#      in a call of its own
#   3. the reports (figures from the ledgers), then the ledgers, figures and logs into $OUT/campaign.tar.gz
#      (a lease returns at most 8 files) and the log into $OUT/campaign.log
# Unpack here with: tar -xzf <files_at>/campaign.tar.gz   (ledgers/ and figures/ of the repository)
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-runs/gpu_campaign}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
TOTAL=${TOTAL:-500}
ANALYSIS=${ANALYSIS:-20}
LOG="$OUT/campaign.log"
stage() { echo "== $1 (at ${SECONDS}s)" | tee -a "$LOG"; }

stage card
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 | tee -a "$LOG"
$PY -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())" 2>&1 | tee -a "$LOG"
engine_ok=1
if [ "${TESTS:-1}" = 1 ]; then
    stage tests
    XDIST=$($PY -c "import xdist" 2>/dev/null && echo "-n 8")
    timeout 150 $PY -m pytest -q -x $XDIST tests/test_ensemble.py tests/test_markov.py tests/test_fastpath.py \
        tests/test_embedding.py tests/test_attention.py::test_packed_qkv_is_the_reference \
        tests/test_attention.py::test_packed_qkv_in_bf16 2>&1 | tail -n 5 | tee -a "$LOG"
    [ "${PIPESTATUS[0]}" = 0 ] || { engine_ok=0; echo "engine tests failed: no campaign runs" | tee -a "$LOG"; }
fi
# the sampler's walk kernel (kernels/markov_walk.py) is in every probe's step: where it fails here, the scan
timeout 60 $PY -m pytest -q tests/test_markov_walk.py 2>&1 | tail -n 2 | tee -a "$LOG"
[ "${PIPESTATUS[0]}" = 0 ] || { export MARKOV_ICL_WALK=0; echo "walk kernel failed: MARKOV_ICL_WALK=0" | tee -a "$LOG"; }

CAMPAIGNS=${CAMPAIGNS:-k1_paper reweight_paper tau_paper sweep_paper}
for name in $CAMPAIGNS; do
    [ "$engine_ok" = 1 ] || break
    left=$((TOTAL - ANALYSIS - SECONDS))
    if [ "$left" -lt 30 ]; then echo "no time left for $name" | tee -a "$LOG"; continue; fi
    stage "campaign $name ($left s left)"
    budget=$($PY -c "print(round(($left - 15) / 60, 2))")
    extra=""
    case "$name" in
        k1_*) extra="--max-probes ${MAX_PROBES:-16}";;
        *) extra="${MAX_RUNS:+--max-probes $MAX_RUNS}";;
    esac
    timeout $((left + 10)) $PY campaign.py run "$name" --budget-min "$budget" $extra 2>&1 | grep -v "^step " | tee -a "$LOG"
    echo "$name: exit ${PIPESTATUS[0]}" | tee -a "$LOG"
done

stage reports
for name in $CAMPAIGNS; do
    timeout 60 $PY campaign.py report "$name" 2>&1 | tail -n 3 | tee -a "$LOG"
done
ls -l ledgers figures/*_paper* 2>&1 | tee -a "$LOG"
tar -czf "$OUT/campaign.tar.gz" ledgers $(ls figures/*_paper* 2>/dev/null)
echo "gpu_campaign: ${SECONDS}s in all" | tee -a "$LOG"
