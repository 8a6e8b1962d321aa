"""The kernel tests run the Triton kernels through the interpreter on the CPU; the flag must be
set before triton is imported anywhere. With CUDA present they run compiled on the GPU instead."""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
