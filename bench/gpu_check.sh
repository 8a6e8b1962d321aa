#!/usr/bin/env bash
# The checks that need a CUDA GPU, as one script for a short lease (about 8 min at most): the kernel,
# model and ensemble tests compiled on the GPU, the attention benchmark, the training benchmark (single
# eager / graphed, ensembles of 8, 32, 64 graphed, peak memory) and short training runs at the paper
# preset, one single and one ensemble. Logs go to $OUT (default: runs/gpu_check).
#
#     bash bench/gpu_check.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-runs/gpu_check}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/gpu.txt"
$PY -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())" | tee -a "$OUT/gpu.txt"
timeout 150 $PY -m pytest -q -rf --tb=short tests/test_attention.py tests/test_transformer.py tests/test_ensemble.py 2>&1 | tee "$OUT/tests.log"
timeout 100 $PY bench/bench_attention.py 2>&1 | tee "$OUT/bench_attention.log"
for s in 1 3; do timeout 35 $PY bench/bench_attention.py --only-kernel --stages $s 2>&1 | tee -a "$OUT/bench_stages.log"; done
timeout 80 $PY bench/bench_train.py 2>&1 | tee "$OUT/bench_train.log"
timeout 40 $PY train.py --K 256 --preset paper --iters 300 --evals 3 --out /tmp/gpu_check_run 2>&1 | tail -n 6 | tee "$OUT/train.log"
cp /tmp/gpu_check_run/metrics.jsonl "$OUT/" 2>/dev/null || true
# a 4-model grid as one graphed ensemble, with dense readouts; its wall time is the real-use rate
timeout 50 $PY train.py --K 64,94 --seeds 0-1 --preset paper --iters 500 --evals 3 --eval-every 100 --out /tmp/gpu_check_grid 2>&1 | tail -n 6 | tee "$OUT/train_grid.log"
for d in /tmp/gpu_check_grid/K*; do cp "$d/metrics.jsonl" "$OUT/grid_$(basename "$d").jsonl" 2>/dev/null || true; done
