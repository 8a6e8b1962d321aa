# Sourced by gpu_check.sh, gpu_campaign.sh and gpu_session.sh. HEADER: what every GPU log opens with, the commit
# (COMMIT where the copy on the card has no .git), the card, its driver, torch and Triton; read once per call (torch's
# import takes seconds) and passed on to the scripts this one starts.
gpu_header() {
    echo "commit $(git rev-parse HEAD 2>/dev/null || echo "${COMMIT:-unknown}")"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1
    ${PY:-python3} -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())" 2>&1
}
export HEADER="${HEADER:-$(gpu_header)}"
