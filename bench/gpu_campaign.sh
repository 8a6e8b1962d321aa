#!/usr/bin/env bash
# One GPU call of the paper-scale campaigns (campaigns/campaign.py), inside a lease's 10-minute command limit:
#   1. the commit, the card, torch and Triton; the engine's tests compiled on the card (the ensembles, the fast
#      path, the packed attention, the embedding; TESTS=0 skips them): where they fail no campaign runs, so that no
#      ledger takes a piece trained by a broken engine; the sampler's walk kernel's tests always (where they fail,
#      the campaign samples with the scan: MARKOV_ICL_WALK=0)
#   2. one process for the K1* searches and the fixed grids in CAMPAIGNS (default "k1_paper tau_paper
#      reweight_paper sweep_paper"): `python -m campaigns call`, pieces of one ensemble of up to SLOTS models (default 64)
#      filled across the campaigns (the searches' next probes, the grids' runs that train the same way, then wider
#      rounds of the searches), while the next piece fits the time left before TOTAL seconds from the start (default
#      540), each piece's time predicted from the pieces the ledgers measured on this card (specs.piece_rate)
#   3. after every piece, the ledgers packed into $OUT/campaign.tar.gz, so a call cut short returns every piece it
#      finished; the log is $OUT/campaign.log. The figures are drawn here, afterwards, from the ledgers (each
#      campaign's script: `python -m campaigns status <campaign>` names it)
# A circuits campaign is a piece of its own: CAMPAIGNS=circuits_mem_paper TESTS=0 TOTAL=560 runs it with `run`.
# Pass COMMIT=$(git rev-parse HEAD) where the copy on the card has no .git. Stage limits: tests 150 s, walk 60 s,
# the campaigns TOTAL less the time spent, so the whole stays under TOTAL + 15 s.
# Unpack here with: tar -xzf <files_at>/campaign.tar.gz   (ledgers/ of the repository)
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-runs/gpu_campaign}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
TOTAL=${TOTAL:-540}
LOG="$OUT/campaign.log"
source bench/gpu_common.sh
stage() { echo "== $1 (at ${SECONDS}s)" | tee -a "$LOG"; }
pack() { $PY -c "from campaigns import campaign; campaign.pack('$OUT', ['$1'], 'ledgers')"; }  # OUT/campaign.tar.gz

stage card
echo "$HEADER" | tee -a "$LOG"
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

CAMPAIGNS=${CAMPAIGNS:-k1_paper tau_paper reweight_paper sweep_paper}
left=$((TOTAL - SECONDS))
if [ "$engine_ok" = 1 ] && [ "$left" -gt 60 ]; then
    case "$CAMPAIGNS" in
        # one piece: training, then circuits.py and task_vectors.py on the runs; the ledger packed after it
        circuits_*) stage "campaign $CAMPAIGNS ($left s left)"
            budget=$($PY -c "print(round(($left - 5) / 60, 2))")
            timeout "$left" $PY -m campaigns run $CAMPAIGNS --budget-min "$budget" 2>&1 | grep -v "^step " | tee -a "$LOG"
            echo "run: exit ${PIPESTATUS[0]}" | tee -a "$LOG"
            pack "$CAMPAIGNS";;
        *) stage "campaigns $CAMPAIGNS in one process ($left s left)"
            budget=$($PY -c "print(round(($left - 5) / 60, 2))")
            timeout "$left" $PY -m campaigns call $CAMPAIGNS --budget-min "$budget" --slots "${SLOTS:-64}" \
                --out "$OUT" 2>&1 | grep -v "^step " | tee -a "$LOG"
            echo "campaigns: exit ${PIPESTATUS[0]}" | tee -a "$LOG";;
    esac
else
    echo "no campaign: engine ok $engine_ok, $left s left" | tee -a "$LOG"
fi
echo "gpu_campaign: ${SECONDS}s in all" | tee -a "$LOG"
