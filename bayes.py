"""The four Bayes predictors that define the algorithmic phases (Appendix "Defining the four
algorithmic phases") and the losses measured against them.

Each predictor maps sequences (B, L) to log-probabilities (B, L, C): out[:, n] is the predictive
distribution of s_{n+1} given s_0..s_n (0-indexed; the appendix counts from 1).

  1-Gen  (n_tau + 1) / (n + 1 + C)          n_tau: occurrences of tau in s_0..s_n (n + 1 states)
  2-Gen  (m_{tau mu} + 1) / (n_mu + C)      mu = s_n; m: transition counts mu -> tau inside s_0..s_n
  1-Mem  sum_k P(k | s_0..s_n) T^k[:, s_n]  likelihood prod_i p_k(s_i)            (uniform prior on S)
  2-Mem  sum_k P(k | s_0..s_n) T^k[:, s_n]  likelihood p_k(s_0) prod_i T^k[s_i, s_{i-1}]

Everything is vectorized over sequences, positions and chains, in log space, and chunked over
sequences so that memory stays bounded (K = 8192, B = 256, L = 257 fits in well under 4 GB). The
engine's fastdata.predict computes the same predictors faster, for the large evaluations of train.py.

Run `python bayes.py` for the appendix figure "Scaling of the four predictor losses".
"""
import json
import math
import os
import time

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F

import cli
from markov import TaskSet, check_int, check_seqs, stationary

CHUNK_ELEMENTS = 2**20  # elements of the largest per-chunk array (4 MB in float32: stays in cache)
PREDICTORS = ("1gen", "2gen", "1mem", "2mem")
LABELS = {"1gen": "1-Gen", "2gen": "2-Gen", "1mem": "1-Mem", "2mem": "2-Mem"}
COLORS = {"1gen": "tab:green", "2gen": "tab:blue", "1mem": "tab:orange", "2mem": "tab:red"}  # the same in every figure


def _chunks(B: int, per_sequence: int):
    """Slices over the batch so that a chunk holds at most CHUNK_ELEMENTS elements."""
    step = max(1, CHUNK_ELEMENTS // max(1, per_sequence))
    return [slice(b, min(B, b + step)) for b in range(0, B, step)]


# ----------------------------------------------------------------------------- generalizing predictors


def one_gen(seqs: torch.Tensor, C: int, dtype=torch.float32, alpha: float = 1.0) -> torch.Tensor:
    """1-Gen: (n_tau + alpha') / (n + 1 + C alpha') from the counts over s_0..s_n, alpha' = 1 in the
    paper (a Dirichlet(alpha') prior on the stationary distribution; alpha' = 0 gives the raw
    frequencies). Returns (B, L, C)."""
    check_int("C", C, 2)
    seqs = check_seqs(seqs, C)
    if not alpha >= 0:
        raise ValueError(f"alpha must be >= 0, got {alpha!r}")
    L = seqs.shape[1]
    counts = F.one_hot(seqs, C).to(dtype).cumsum(1)  # (B, L, C): n_tau over s_0..s_n
    n = torch.arange(1, L + 1, dtype=dtype, device=seqs.device).view(1, L, 1)
    return (counts + alpha).log() - (n + C * alpha).log()


def two_gen(seqs: torch.Tensor, C: int, dtype=torch.float32) -> torch.Tensor:
    """2-Gen: (m_{tau mu} + 1) / (n_mu + C) with mu = s_n. Returns (B, L, C)."""
    check_int("C", C, 2)
    seqs = check_seqs(seqs, C)
    B, L = seqs.shape
    out = torch.empty(B, L, C, dtype=dtype, device=seqs.device)
    for sl in _chunks(B, L * C * C):
        s = seqs[sl]
        b = s.shape[0]
        pair = s[:, :-1] * C + s[:, 1:]  # transition s_{i-1} = mu -> s_i = tau, as mu * C + tau
        m = F.one_hot(pair, C * C).to(dtype).cumsum(1)  # (b, L - 1, C*C): counts inside s_0..s_i
        m = torch.cat([m.new_zeros(b, 1, C * C), m], 1).view(b, L, C, C)  # position 0 has none
        row = m.gather(2, s.view(b, L, 1, 1).expand(b, L, 1, C)).squeeze(2)  # (b, L, C): m_{tau, s_n}
        out[sl] = (row + 1).log() - (row.sum(-1, keepdim=True) + C).log()
    return out


# ----------------------------------------------------------------------------- memorizing predictors


def _memorizing(seqs: torch.Tensor, T: torch.Tensor, two_point: bool, state_seqs: torch.Tensor | None = None) -> torch.Tensor:
    """The memorizing Bayes predictor (Appendix "Defining the four algorithmic phases", "Memorization"): Eq.
    (Tinference) with the prior P(T) = 1/K sum_k delta(T - T^(k)) over the K chains T (K, C, C),

        out[:, n] = sum_k P(k | s_0..s_n) T_k[:, s'_n],   P(k | s_0..s_n) = softmax_k log P(s_0..s_n | T_k),

    s' = state_seqs (default: seqs). The log-likelihood is a sum of one term per position: log p_k(s_0),
    then log T_k[s_i, s_{i-1}] (2-Mem, "2-point memorization") or log p_k(s_i) (1-Mem, "1-point
    memorization"), p_k the stationary distribution of chain k. In T's dtype, chunked over sequences. A
    context that no chain can emit (zero likelihood under all K) has no posterior: NaN."""
    K, C = T.shape[0], T.shape[-1]
    log_p = stationary(T).log().T.contiguous()  # (C, K): log p_k(tau) at [tau, k]; stationary() checks T
    log_T = T.log().permute(1, 2, 0).contiguous()  # (C, C, K): log T_k[tau, mu] at [tau, mu, k]
    seqs = check_seqs(seqs, C).to(T.device)
    state_seqs = seqs if state_seqs is None else check_seqs(state_seqs, C, "state_seqs").to(T.device)
    if state_seqs.shape != seqs.shape:
        raise ValueError(f"state_seqs must have the shape of seqs {tuple(seqs.shape)}, got {tuple(state_seqs.shape)}")
    B, L = seqs.shape
    out = torch.empty(B, L, C, dtype=T.dtype, device=T.device)
    for sl in _chunks(B, L * K):
        s, now, pred = seqs[sl], state_seqs[sl], out[sl]
        loglik = log_p[s]  # (b, L, K): the 1-Mem term log p_k(s_i) of every position i
        if two_point:
            loglik[:, 1:] = log_T[s[:, 1:], s[:, :-1]]  # the 2-Mem term log T_k[s_i, s_{i-1}] after s_0
        posterior = torch.softmax(loglik.cumsum(1), -1)  # (b, L, K): P(k | s_0..s_n), uniform prior over S
        for mu in range(C):  # the positions whose current state is mu mix the columns T_k[:, mu]
            at = now == mu
            pred[at] = posterior[at] @ T[:, :, mu]  # (m, K) @ (K, C)
    return out.log()


def one_mem(seqs: torch.Tensor, T: torch.Tensor) -> torch.Tensor:
    """1-Mem: posterior over the chains of T from prod_i p_k(s_i). Returns (B, L, C)."""
    return _memorizing(seqs, T, two_point=False)


def two_mem(seqs: torch.Tensor, T: torch.Tensor) -> torch.Tensor:
    """2-Mem: posterior over the chains of T from p_k(s_0) prod_i T_k[s_i, s_{i-1}]. Returns (B, L, C)."""
    return _memorizing(seqs, T, two_point=True)


def mixed_mem(post_seqs: torch.Tensor, state_seqs: torch.Tensor, T: torch.Tensor, two_point: bool = True) -> torch.Tensor:
    """The memorizing predictor with its two inputs taken from different sequences (Appendix "Patching"):
    out[:, n] = sum_k P(k | post_seqs[:, :n+1]) T_k[:, state_seqs[:, n]], with the 2-Mem likelihood (or
    the 1-Mem one if not two_point). Equal to two_mem / one_mem when both are the same. Returns (B, L, C)."""
    return _memorizing(post_seqs, T, two_point, state_seqs)


def predict(name: str, seqs: torch.Tensor, T: torch.Tensor) -> torch.Tensor:
    """Log-probabilities of the predictor `name` in PREDICTORS; T is the task set's chains."""
    C = T.shape[-1]
    return {"1gen": lambda: one_gen(seqs, C, T.dtype), "2gen": lambda: two_gen(seqs, C, T.dtype),
            "1mem": lambda: one_mem(seqs, T), "2mem": lambda: two_mem(seqs, T)}[name]()


# ----------------------------------------------------------------------------- losses


def nll(logp: torch.Tensor, seqs: torch.Tensor) -> torch.Tensor:
    """Per-position negative log-likelihood of the next state, (B, L - 1): -log logp[:, n, s_{n+1}].

    logp is (B, L, C) (a predictor on all of seqs) or (B, L - 1, C) (a model fed seqs[:, :-1])."""
    return -logp[:, : seqs.shape[1] - 1].gather(2, seqs[:, 1:, None].to(logp.device)).squeeze(2)


def ar_loss(logp: torch.Tensor, seqs: torch.Tensor) -> torch.Tensor:
    """Autoregressive loss: mean NLL of s_{n+1} over the L - 1 positions that have a target."""
    return nll(logp, seqs).mean()


def kl_div(logp: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
    """D_KL^{S_N}(p || q) (Appendix "Behavioral readouts"): the KL divergence between two
    predictors' next-state distributions, averaged over positions and sequences. logp, logq:
    (B, L, C) aligned position by position (slice a predictor's [:, :-1] to match a model)."""
    terms = logp.exp() * (logp - logq)
    return torch.where(logp == -math.inf, 0.0, terms).sum(-1).mean()


def asymptotic_loss_1gen(T: torch.Tensor) -> torch.Tensor:
    """L^{1-Gen} = -< sum_tau p_tau log p_tau > over the chains T (K, C, C)."""
    p = stationary(T)
    return -torch.special.xlogy(p, p).sum(-1).mean()


def asymptotic_loss_2gen(T: torch.Tensor) -> torch.Tensor:
    """L^{2-Gen} = -< sum_{mu, tau} p_mu T_{tau mu} log T_{tau mu} > over the chains T (K, C, C)."""
    p = stationary(T)
    return -(p[:, None, :] * torch.special.xlogy(T, T)).sum((-2, -1)).mean()


# ----------------------------------------------------------------------------- figure: predictor scaling


def scaling_with_K(Ks, N: int, n_dists: int, n_seqs: int, device) -> dict:
    """Autoregressive loss (length N + 1 sequences from S) of each predictor vs K, per task distribution."""
    losses = {name: [[0.0] * len(Ks) for _ in range(n_dists)] for name in PREDICTORS}
    for d in range(n_dists):
        full = TaskSet.create(max(Ks), seed=d, device=device)  # nested: S(K) = first K chains
        g = torch.Generator(device).manual_seed(10_000 + d)
        for j, K in enumerate(Ks):
            tasks = TaskSet(T=full.T[:K], p=full.p[:K])
            seqs, _ = tasks.batch(n_seqs, N + 1, g)
            for name in PREDICTORS:
                losses[name][d][j] = ar_loss(predict(name, seqs, tasks.T), seqs).item()
    return losses


def scaling_with_N(Ns, K: int, n_dists: int, n_seqs: int, device, batch: int = 64) -> dict:
    """Non-autoregressive loss -log pi(s_N | s_0..s_{N-1}) of each predictor vs N at fixed K.

    One set of length max(N) + 1 sequences serves every N: the prediction at position N - 1
    only sees s_0..s_{N-1}."""
    cols = torch.tensor(Ns, device=device) - 1
    losses = {name: [] for name in PREDICTORS}
    for d in range(n_dists):
        tasks = TaskSet.create(K, seed=d, device=device)
        g = torch.Generator(device).manual_seed(20_000 + d)
        totals = {name: torch.zeros(len(Ns), device=device) for name in PREDICTORS}
        for start in range(0, n_seqs, batch):
            seqs, _ = tasks.batch(min(batch, n_seqs - start), max(Ns) + 1, g)
            for name in PREDICTORS:
                totals[name] += nll(predict(name, seqs, tasks.T), seqs)[:, cols].sum(0)
        for name in PREDICTORS:
            losses[name].append((totals[name] / n_seqs).tolist())
    return losses


def plot_scaling(result: dict, path: str):
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, x, key, title in [
        (axes[0], result["K"], "loss_vs_K", f"autoregressive, N = {result['config']['N_for_K']}"),
        (axes[1], result["N"], "loss_vs_N", f"non-autoregressive, K = {result['config']['K_for_N']}"),
    ]:
        for name in PREDICTORS:
            mean, std = result[key][name]["mean"], result[key][name]["std"]
            ax.errorbar(x, mean, yerr=std, color=COLORS[name], label=LABELS[name], marker="o", ms=3, capsize=2)
        ax.set_xscale("log", base=2)
        ax.set_title(title)
        ax.set_ylabel("loss (nats)")
    for name, ls in [("1gen", ":"), ("2gen", "--")]:
        axes[1].axhline(result["asymptotic"][name], color=COLORS[name], ls=ls, lw=1, label=f"L^{LABELS[name]} (N -> inf)")
    axes[0].set_xlabel("K (number of training chains)")
    axes[1].set_xlabel("N (context length)")
    axes[1].legend(fontsize=8)
    fig.suptitle(f"Scaling of the four predictor losses ({result['config']['dists']} task distributions)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main():
    parser = cli.ArgumentParser(description="Appendix figure: scaling of the four Bayes predictor losses with K and N.")
    cli.add_preset(parser, ("quick", "paper"), "quick: K to 2^12, N to 2^13, 256 sequences; paper: K to 2^13, "
                                               "N to 2^14, 2048 sequences")
    parser.add_argument("--dists", type=int, default=8, help="task distributions (task-set seeds) to average over")
    parser.add_argument("--seqs", type=int, default=None,
                        help="sequences per task distribution at each K (default: quick 256, paper 2048); the N sweep uses 4x")
    cli.add_device(parser)
    cli.add_threads(parser)
    cli.add_figures(parser)
    args = parser.parse_args()
    check_int("--dists", args.dists, 1)
    paper = cli.preset(args.preset) == "paper"
    device = torch.device(cli.device(args.device))
    cli.set_threads(args.threads)
    Ks = [2**i for i in range(14 if paper else 13)]
    Ns = [2**i for i in range(15 if paper else 14)]
    n_seqs = check_int("--seqs", args.seqs, 1) if args.seqs is not None else (2048 if paper else 256)
    # the non-autoregressive loss is a single position per sequence, hence more sequences
    N_for_K, K_for_N = 256, 128
    out = cli.writable_dir(args.figures, "--figures")
    cli.announce("paper" if paper else "quick", f"K to {Ks[-1]}, N to {Ns[-1]}, {args.dists} task distributions, "
                 f"{n_seqs} sequences, on {device}", f"{out}/predictor_scaling.png and .json")
    t0 = time.time()
    vs_K = scaling_with_K(Ks, N_for_K, args.dists, n_seqs, device)
    print(f"loss vs K done in {time.time() - t0:.0f} s", flush=True)
    vs_N = scaling_with_N(Ns, K_for_N, args.dists, 4 * n_seqs, device)
    print(f"loss vs N done in {time.time() - t0:.0f} s", flush=True)
    asymptotic_T = torch.cat([TaskSet.create(K_for_N, seed=d).T for d in range(args.dists)])

    def summary(per_dist):
        x = torch.tensor(per_dist)
        return {"mean": x.mean(0).tolist(), "std": x.std(0).tolist() if len(per_dist) > 1 else [0.0] * x.shape[1]}

    result = {
        "config": {"dists": args.dists, "seqs_per_K": n_seqs, "seqs_per_N": 4 * n_seqs, "N_for_K": N_for_K, "K_for_N": K_for_N, "paper": paper},
        "K": Ks, "loss_vs_K": {name: summary(vs_K[name]) for name in PREDICTORS},
        "N": Ns, "loss_vs_N": {name: summary(vs_N[name]) for name in PREDICTORS},
        "asymptotic": {"1gen": asymptotic_loss_1gen(asymptotic_T).item(), "2gen": asymptotic_loss_2gen(asymptotic_T).item()},
        "seconds": round(time.time() - t0, 1),
    }
    with open(os.path.join(out, "predictor_scaling.json"), "w") as f:
        json.dump(result, f, indent=1)
    plot_scaling(result, os.path.join(out, "predictor_scaling.png"))
    for j, K in enumerate(Ks):
        print(f"K={K:5d}  " + "  ".join(f"{n}={result['loss_vs_K'][n]['mean'][j]:.4f}" for n in PREDICTORS))
    for j, N in enumerate(Ns):
        print(f"N={N:5d}  " + "  ".join(f"{n}={result['loss_vs_N'][n]['mean'][j]:.4f}" for n in PREDICTORS))
    print(f"wrote {out}/predictor_scaling.png and .json in {result['seconds']} s")


if __name__ == "__main__":
    cli.run(main)
