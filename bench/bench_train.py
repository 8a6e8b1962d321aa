"""Benchmark (not a test): milliseconds per training step of train.py's transformer at the quick
and paper presets, and the achieved GFLOP/s against this machine's matmul rate measured in the
same run.

    python bench/bench_train.py [--device cuda] [--threads 1]
"""
import argparse
import os
import platform
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from markov import TaskSet  # noqa: E402
from train import PRESETS  # noqa: E402
from transformer import Transformer  # noqa: E402


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed(fn, device, repeats):
    fn()
    sync(device)
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    sync(device)
    return (time.perf_counter() - t0) / repeats


def step_flops(B: int, N: int, C: int, D: int) -> float:
    """FLOPs of one training step (forward + backward ~ 3x forward): the weight matmuls per token,
    plus the two attention products QK^T and AV over the full N x N map per layer."""
    weight_macs = 2 * (3 * D * D + 8 * D * D) + D * C  # per token: W_Q, W_K, W_V, MLP in/out per layer; W_U
    attention_macs = 2 * (2 * N * D)  # per token: two layers of (q . k over N keys) + (sum of N values)
    return 3 * 2 * B * N * (weight_macs + attention_macs)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    name = torch.cuda.get_device_name() if device.type == "cuda" else f"{platform.machine()} CPU, {os.cpu_count()} cores"
    print(f"device: {name}, torch {torch.__version__}, {torch.get_num_threads()} threads")

    a = torch.randn(4096, 4096, device=device)
    peak = 2 * 4096**3 / timed(lambda: a @ a, device, 5) / 1e9
    print(f"fp32 matmul 4096^3: {peak:.0f} GFLOP/s")

    g = torch.Generator(device).manual_seed(0)
    tasks = TaskSet.create(256, device=device)
    for preset in ("quick", "paper"):
        N, B = PRESETS[preset]["N"], 128
        model = Transformer().to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=1e-3)
        seqs, _ = tasks.batch(B, N + 1, g)

        def step():
            loss = F.cross_entropy(model(seqs[:, :-1]).reshape(-1, 10), seqs[:, 1:].reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

        dt = timed(step, device, args.repeats)
        flops = step_flops(B, N, 10, 64)
        print(f"{preset:>6} preset (B={B}, N={N}): {dt * 1e3:7.1f} ms/step, {flops / dt / 1e9:6.1f} GFLOP/s "
              f"= {flops / dt / 1e9 / peak:.0%} of the matmul rate")


if __name__ == "__main__":
    main()
