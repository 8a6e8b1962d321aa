#!/usr/bin/env bash
# The checks that need a CUDA GPU, as one script for a short lease: the kernel and model tests
# compiled on the GPU, the attention benchmark, the training-step benchmark and a short training
# run at the paper preset. Logs go to $OUT (default: runs/gpu_check).
#
#     bash bench/gpu_check.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-runs/gpu_check}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/gpu.txt"
$PY -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())" | tee -a "$OUT/gpu.txt"
timeout 200 $PY -m pytest -q -rf --tb=short tests/test_attention.py tests/test_transformer.py 2>&1 | tee "$OUT/tests.log"
timeout 200 $PY bench/bench_attention.py 2>&1 | tee "$OUT/bench_attention.log"
for s in 1 3; do timeout 60 $PY bench/bench_attention.py --only-kernel --stages $s 2>&1 | tee -a "$OUT/bench_stages.log"; done
timeout 60 $PY bench/bench_train.py 2>&1 | tee "$OUT/bench_train.log"
timeout 90 $PY train.py --K 256 --preset paper --iters 300 --evals 3 --out /tmp/gpu_check_run 2>&1 | tail -n 12 | tee "$OUT/train.log"
cp /tmp/gpu_check_run/metrics.jsonl "$OUT/" 2>/dev/null || true
