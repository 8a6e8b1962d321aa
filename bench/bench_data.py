"""Benchmark (not a test): the plain sampler and memorizing predictors of the reader's path (markov.py, bayes.py)
against the engine's fast ones (engine/fastdata.py), which compute the same numbers, timed in the same run, interleaved:

  sampler         markov's loop over positions (TaskSet.batch) vs fastdata's sqrt(L)-depth scan (batches);
                  and for an ensemble, one TaskSet.batch per member vs one fastdata.batches call for all
  1-Mem, 2-Mem    bayes's posterior from the cumulative log-likelihood of every chain at every position
                  vs fastdata's anchored sums (bayes.predict vs fastdata.predict)

    python bench/bench_data.py [--rounds R] [--threads N]

Times are CPU seconds of this process (time.process_time), medians over the rounds, with one torch
thread by default: on a shared machine wall times mostly measure waiting, and two threads on two
busy cores can make the small multi-threaded calls many times slower. Prints the speed-up of the
fast version over the plain one (> 1: fastdata is faster).
"""
import os
import platform
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import bayes  # noqa: E402
from engine import fastdata  # noqa: E402
from markov import TaskSet  # noqa: E402
from plumbing import cli  # noqa: E402
from plumbing.style import LABELS  # noqa: E402


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


def report(what: str, t: dict):
    print(f"{what:<46} plain {t['plain'] * 1e3:8.1f} ms | fast {t['fast'] * 1e3:8.1f} ms | x{t['plain'] / t['fast']:.1f}")


def main():
    parser = cli.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("--rounds", type=cli.at_least(1), default=5, help="interleaved rounds (medians over them)")
    cli.add_threads(parser, 1, ", for every method: see below")
    args = parser.parse_args()
    cli.set_threads(args.threads)
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    K, L = 1024, 257
    tasks = TaskSet.create(K, seed=0)

    B = 128
    g_plain, g_fast = torch.Generator().manual_seed(0), torch.Generator().manual_seed(0)
    assert torch.equal(tasks.batch(B, L, g_plain)[0], fastdata.batches([tasks], B, L, [g_fast])[0][0])
    t = interleaved_medians({"plain": lambda: tasks.batch(B, L, g_plain),
                             "fast": lambda: fastdata.batches([tasks], B, L, [g_fast])}, {"plain": 3, "fast": 3}, args.rounds)
    report(f"sampler, K={K} B={B} L={L}", t)

    E = 16
    members = [TaskSet.create(K, seed=e) for e in range(E)]
    gens = [torch.Generator().manual_seed(e) for e in range(E)]
    t = interleaved_medians({"plain": lambda: [m.batch(B, L, g) for m, g in zip(members, gens)],
                             "fast": lambda: fastdata.batches(members, B, L, gens)}, {"plain": 1, "fast": 1}, args.rounds)
    report(f"ensemble sampler, E={E} members of K={K} B={B}", t)

    B = 16
    seqs, _ = tasks.batch(B, L, torch.Generator().manual_seed(1))
    for name in ("1mem", "2mem"):
        plain, fast = bayes.predict(name, seqs, tasks.T), fastdata.predict(name, seqs, tasks.T)
        assert torch.allclose(plain, fast, atol=1e-4), (plain - fast).abs().max()
        t = interleaved_medians({"plain": lambda: bayes.predict(name, seqs, tasks.T),
                                 "fast": lambda: fastdata.predict(name, seqs, tasks.T)}, {"plain": 2, "fast": 4}, args.rounds)
        report(f"{LABELS[name]}, K={K} B={B} L={L}", t)


if __name__ == "__main__":
    cli.run(main)
