#!/usr/bin/env bash
# The checks that need a CUDA GPU, as one script for a short lease (about 4 min on an H100): the kernel,
# layer norm, model and ensemble tests compiled on the GPU; the training benchmark (single eager / graphed,
# ensembles of 8, 32, 64 graphed, peak memory, and the variants that put one earlier piece back: torch's
# layer norm, per-member sampling, PREVIOUS's attention); the same with TF32 matmuls and a profile of the
# largest ensemble's step; a graphed 4-model grid at the paper preset. SWEEP=1 also re-runs the kernel's
# tile sweep (written to kernels/tiles.json, which the kernel reads; ~2.5 min) and its comparison with
# eager, SDPA and FlexAttention. Logs go to $OUT (default: runs/gpu_check).
#
#     bash bench/gpu_check.sh
#     git show <commit>:kernels/attention.py > /tmp/old.py; PREVIOUS=/tmp/old.py SWEEP=1 bash bench/gpu_check.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-runs/gpu_check}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
PREV=${PREVIOUS:+--previous $PREVIOUS}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/gpu.txt"
$PY -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())" | tee -a "$OUT/gpu.txt"
# compiles dominate the tests: 8 processes when pytest-xdist is there
XDIST=$($PY -c "import xdist" 2>/dev/null && echo "-n 8")
timeout 150 $PY -m pytest -q $XDIST -rf --tb=short tests/test_attention.py tests/test_layer_norm.py tests/test_transformer.py \
    tests/test_ensemble.py tests/test_markov.py 2>&1 | tee "$OUT/tests.log"
if [ "${SWEEP:-0}" = 1 ]; then
    timeout 330 $PY bench/bench_attention.py --sweep --write-tiles kernels/tiles.json --json "$OUT/bench_attention.json" $PREV 2>&1 | tee "$OUT/bench_attention.log"
    cp kernels/tiles.json "$OUT/tiles.json" 2>/dev/null
fi
timeout 150 $PY bench/bench_train.py $PREV 2>&1 | tee "$OUT/bench_train.log"
timeout 120 $PY bench/bench_train.py --tf32 --profile 2>&1 | tee "$OUT/bench_train_tf32.log"
# a 4-model grid as one graphed ensemble, with dense readouts; its wall time is the real-use rate
timeout 60 $PY train.py --K 64,94 --seeds 0-1 --preset paper --iters 500 --evals 3 --eval-every 100 --out /tmp/gpu_check_grid 2>&1 | tail -n 8 | tee "$OUT/train_grid.log"
