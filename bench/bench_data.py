"""Benchmark (not a test): the vectorized sampler and 2-Mem predictor against the straightforward
implementations, timed in the same run; prints the speed-up ratios.

    python bench/bench_data.py
"""
import os
import platform
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bayes import two_mem  # noqa: E402
from markov import TaskSet, stationary  # noqa: E402


def paired_medians(slow, fast, rounds: int, fast_repeats: int) -> tuple[float, float]:
    """Median wall times in seconds of slow() and fast(), after one warm-up each. The two are
    timed alternately, one slow() then fast_repeats fast() per round, so that a busy spell of a
    shared machine slows both alike and the ratio stays meaningful."""
    slow(), fast()
    t_slow, t_fast = [], []
    for _ in range(rounds):
        t0 = time.perf_counter()
        slow()
        t_slow.append(time.perf_counter() - t0)
        for _ in range(fast_repeats):
            t0 = time.perf_counter()
            fast()
            t_fast.append(time.perf_counter() - t0)
    return float(np.median(t_slow)), float(np.median(t_fast))


def sample_loop(T: np.ndarray, p: np.ndarray, B: int, L: int, rng: np.random.RandomState) -> np.ndarray:
    """The usual public-code sampler: one np.random.choice per token."""
    K, C = T.shape[0], T.shape[-1]
    seqs = np.empty((B, L), dtype=np.int64)
    for b in range(B):
        k = rng.randint(K)
        seqs[b, 0] = rng.choice(C, p=p[k])
        for t in range(1, L):
            seqs[b, t] = rng.choice(C, p=T[k, :, seqs[b, t - 1]])
    return seqs


def two_mem_loop(seqs: torch.Tensor, T: torch.Tensor) -> torch.Tensor:
    """2-Mem, one sequence and one chain at a time: log-likelihood, cumsum, softmax, mixture."""
    K = T.shape[0]
    log_T, log_p = T.log(), stationary(T).log()
    out = []
    for s in seqs:
        loglik = torch.stack([torch.cat([log_p[k, s[:1]], log_T[k, s[1:], s[:-1]]]).cumsum(0) for k in range(K)])
        post = torch.softmax(loglik, 0)  # (K, L)
        out.append(torch.einsum("kn,kcn->nc", post, T[:, :, s]).log())
    return torch.stack(out)


def main():
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    g = torch.Generator().manual_seed(0)

    tasks = TaskSet.create(1024, seed=0)
    B, L = 128, 257
    T_np, p_np = tasks.T.double().numpy(), tasks.p.double().numpy()
    T_np, p_np = T_np / T_np.sum(1, keepdims=True), p_np / p_np.sum(1, keepdims=True)
    rng = np.random.RandomState(0)  # np.random.choice's own generator, seeded
    t_loop, t_vec = paired_medians(lambda: sample_loop(T_np, p_np, B, L, rng), lambda: tasks.batch(B, L, g), 5, 10)
    print(f"sampler  B={B} L={L}: per-token np.random.choice {t_loop * 1e3:8.1f} ms | "
          f"TaskSet.batch (markov) {t_vec * 1e3:6.2f} ms | x{t_loop / t_vec:.0f}")

    B = 16
    seqs, _ = tasks.batch(B, L, g)
    assert torch.allclose(two_mem(seqs, tasks.T), two_mem_loop(seqs, tasks.T), atol=1e-4)
    t_loop, t_vec = paired_medians(lambda: two_mem_loop(seqs, tasks.T), lambda: two_mem(seqs, tasks.T), 5, 6)
    print(f"2-Mem    K=1024 B={B} L={L}: loop over sequences and chains {t_loop * 1e3:8.1f} ms | "
          f"bayes.two_mem {t_vec * 1e3:6.2f} ms | x{t_loop / t_vec:.0f}")


if __name__ == "__main__":
    main()
