"""Benchmark (not a test): the sampler (markov.TaskSet.batch) and the 2-Mem predictor (bayes.two_mem)
against simple baselines, timed in the same run, interleaved:

  strongest simple baseline   the fastest of the few-line torch versions a researcher would write:
                              sampler: a loop over positions, vectorized over the batch;
                              2-Mem:   a loop over positions, the posterior over the K chains of all
                                       sequences updated by one transition at a time
  other simple baseline       2-Mem: a loop over sequences, vectorized over chains and positions
                              (log-likelihoods by a gather and a cumsum); slower than the position loop
  per-token                   one token at a time, the style of most public code:
                              sampler: one np.random.choice per token;
                              2-Mem:   a loop over sequences and positions, the posterior over the
                                       K chains updated one transition at a time

    python bench/bench_data.py [--rounds R] [--threads N]

Times are CPU seconds of this process (time.process_time), medians over the rounds, with one torch
thread by default: the development VM has 2 cores shared with other jobs (load 6-7), where wall
times mostly measure waiting and two threads make the multi-threaded calls up to 20x slower
(TaskSet.batch: 12-22 ms wall with one thread, 230-480 ms with two). Prints each method's speed-up
over each baseline (> 1: the method is faster).
"""
import os
import platform
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import cli  # noqa: E402
from bayes import two_mem  # noqa: E402
from markov import TaskSet, check_int, stationary  # noqa: E402


def interleaved_medians(fns: dict, repeats: dict, rounds: int) -> dict:
    """Median CPU time in seconds of each fn, after one warm-up each. Every round runs each fn
    repeats[name] times in turn, so that a busy spell of a shared machine (cache and memory
    bandwidth taken by other jobs) slows all alike and the ratios stay meaningful."""
    for fn in fns.values():
        fn()
    times = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            for _ in range(repeats[name]):
                t0 = time.process_time()
                fn()
                times[name].append(time.process_time() - t0)
    return {name: float(np.median(t)) for name, t in times.items()}


# ----------------------------------------------------------------------------- sampler baselines


def sample_positions(tasks: TaskSet, B: int, L: int, g: torch.Generator) -> torch.Tensor:
    """Strongest simple baseline: a loop over the L positions, each step one inverse-CDF draw for
    all B sequences at once (a gather of the column of the previous state and a searchsorted)."""
    idx = torch.randint(tasks.K, (B,), generator=g)
    cdf = tasks.T[idx].cumsum(1).transpose(1, 2).contiguous()  # (B, C_mu, C_tau): column mu's CDF as a row
    seqs = torch.empty(B, L, dtype=torch.long)
    u = torch.rand(L, B, 1, generator=g)
    s = torch.searchsorted(tasks.p[idx].cumsum(-1), u[0], right=True).clamp_max_(tasks.C - 1)[:, 0]
    seqs[:, 0] = s
    rows = torch.arange(B)
    for t in range(1, L):
        s = torch.searchsorted(cdf[rows, s], u[t], right=True).clamp_max_(tasks.C - 1)[:, 0]
        seqs[:, t] = s
    return seqs


def sample_per_token(T: np.ndarray, p: np.ndarray, B: int, L: int, rng: np.random.RandomState) -> np.ndarray:
    """Per-token: one np.random.choice per token."""
    K, C = T.shape[0], T.shape[-1]
    seqs = np.empty((B, L), dtype=np.int64)
    for b in range(B):
        k = rng.randint(K)
        seqs[b, 0] = rng.choice(C, p=p[k])
        for t in range(1, L):
            seqs[b, t] = rng.choice(C, p=T[k, :, seqs[b, t - 1]])
    return seqs


# ----------------------------------------------------------------------------- 2-Mem baselines


def two_mem_positions(seqs: torch.Tensor, T: torch.Tensor) -> torch.Tensor:
    """Strongest simple baseline: a loop over positions; the posterior over the K chains of all B
    sequences multiplied by the new transition's probability, renormalized, and mixed."""
    B, L = seqs.shape
    p = stationary(T)  # (K, C)
    by_state = T.permute(2, 0, 1).contiguous()  # (C_mu, K, C_tau): by_state[mu, k] = T_k[:, mu]
    out = torch.empty(B, L, T.shape[-1])
    post = p[:, seqs[:, 0]].T  # (B, K)
    post = post / post.sum(1, keepdim=True)
    out[:, 0] = torch.bmm(post.unsqueeze(1), by_state[seqs[:, 0]]).squeeze(1)  # (B, 1, K) @ (B, K, C)
    for n in range(1, L):
        post = post * T[:, seqs[:, n], seqs[:, n - 1]].T
        post = post / post.sum(1, keepdim=True)
        out[:, n] = torch.bmm(post.unsqueeze(1), by_state[seqs[:, n]]).squeeze(1)
    return out.log()


def two_mem_per_sequence(seqs: torch.Tensor, T: torch.Tensor) -> torch.Tensor:
    """Other simple baseline: one sequence at a time; its log-likelihood under all K chains at all
    positions by a gather and a cumsum, a softmax over chains, and the mixture as one einsum."""
    log_T, log_p = T.log(), stationary(T).log()
    out = []
    for s in seqs:
        loglik = torch.cat([log_p[:, s[:1]], log_T[:, s[1:], s[:-1]]], 1).cumsum(1)  # (K, L)
        post = torch.softmax(loglik, 0)
        out.append(torch.einsum("kn,kcn->nc", post, T[:, :, s]).log())
    return torch.stack(out)


def two_mem_per_token(seqs: torch.Tensor, T: torch.Tensor) -> torch.Tensor:
    """Per-token: for each sequence and position, the posterior over the K chains multiplied by the
    new transition's probability and renormalized, then the predictive distribution."""
    p = stationary(T)
    out = torch.empty(*seqs.shape, T.shape[-1])
    for b, s in enumerate(seqs.tolist()):
        post = p[:, s[0]] / p[:, s[0]].sum()
        out[b, 0] = post @ T[:, :, s[0]]
        for n in range(1, len(s)):
            post = post * T[:, s[n], s[n - 1]]
            post = post / post.sum()
            out[b, n] = post @ T[:, :, s[n]]
    return out.log()


def main():
    parser = cli.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (medians over them)")
    cli.add_threads(parser, 1, ", for every method: see below")
    args = parser.parse_args()
    check_int("--rounds", args.rounds, 1)
    cli.set_threads(args.threads)
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    g = torch.Generator().manual_seed(0)
    tasks = TaskSet.create(1024, seed=0)
    L = 257

    B = 128
    T_np, p_np = tasks.T.double().numpy(), tasks.p.double().numpy()
    T_np, p_np = T_np / T_np.sum(1, keepdims=True), p_np / p_np.sum(1, keepdims=True)
    rng = np.random.RandomState(0)
    assert sample_positions(tasks, 4, L, g).shape == (4, L)
    t = interleaved_medians({"method": lambda: tasks.batch(B, L, g), "simple": lambda: sample_positions(tasks, B, L, g),
                             "per_token": lambda: sample_per_token(T_np, p_np, B, L, rng)},
                            {"method": 10, "simple": 3, "per_token": 1}, args.rounds)
    print(f"sampler, B={B} L={L}, CPU ms: TaskSet.batch {t['method'] * 1e3:.1f} | strongest simple (position loop over "
          f"the batch) {t['simple'] * 1e3:.1f}, x{t['simple'] / t['method']:.1f} | per-token np.random.choice "
          f"{t['per_token'] * 1e3:.0f}, x{t['per_token'] / t['method']:.0f}")

    B = 16
    seqs, _ = tasks.batch(B, L, g)
    fast = two_mem(seqs, tasks.T)
    assert torch.allclose(fast, two_mem_positions(seqs, tasks.T), atol=1e-4)
    assert torch.allclose(fast, two_mem_per_sequence(seqs, tasks.T), atol=1e-4)
    assert torch.allclose(fast[:2], two_mem_per_token(seqs[:2], tasks.T), atol=1e-4)
    t = interleaved_medians({"method": lambda: two_mem(seqs, tasks.T), "simple": lambda: two_mem_positions(seqs, tasks.T),
                             "per_sequence": lambda: two_mem_per_sequence(seqs, tasks.T),
                             "per_token": lambda: two_mem_per_token(seqs, tasks.T)},
                            {"method": 6, "simple": 1, "per_sequence": 1, "per_token": 1}, args.rounds)
    print(f"2-Mem, K=1024 B={B} L={L}, CPU ms: bayes.two_mem {t['method'] * 1e3:.1f} | strongest simple (position loop "
          f"over sequences and chains) {t['simple'] * 1e3:.0f}, x{t['simple'] / t['method']:.1f} | loop over sequences, "
          f"vectorized over chains {t['per_sequence'] * 1e3:.0f}, x{t['per_sequence'] / t['method']:.1f} | per-token "
          f"posterior update {t['per_token'] * 1e3:.0f}, x{t['per_token'] / t['method']:.1f}")


if __name__ == "__main__":
    cli.run(main)
