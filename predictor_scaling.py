"""The appendix figure "Scaling of the four predictor losses" (Appendix "Scaling of the four Bayesian
predictors"): the losses of 1-Gen, 2-Gen, 1-Mem and 2-Mem (bayes.py) against the number of training chains K
and against the context length N, with 2-Gen's and 1-Gen's N -> infinity limits.

    python predictor_scaling.py                  # quick: K to 2^12, N to 2^13, 256 sequences
    python predictor_scaling.py --preset paper   # K to 2^13, N to 2^14, 2048 sequences
    python predictor_scaling.py --replot         # only redraw the figure from figures/predictor_scaling.json

The first line says what the run will cost (on a CPU, from the seconds a unit of work took on the development VM),
then a line with the ETA every 30 s or so (cli.WorkProgress).

Writes FIGURES/predictor_scaling.png and its numbers, predictor_scaling.json.
"""
import os
import time

import matplotlib.pyplot as plt
import torch

from bayes import PREDICTORS, ar_loss, asymptotic_loss_1gen, asymptotic_loss_2gen, nll, predict
from markov import TaskSet
from plumbing import cli
from plumbing.rundir import write_json
from plumbing.style import COLORS, LABELS

PRESETS = {
    # Ks: the loss against K at N = N_for_K; Ns: against N at K = K_for_N, on 4 x seqs sequences (one position each);
    # dists: task distributions (task-set seeds) averaged over
    "quick": dict(Ks=[2**i for i in range(13)], Ns=[2**i for i in range(14)], N_for_K=256, K_for_N=128, seqs=256, dists=8),
    "paper": dict(Ks=[2**i for i in range(14)], Ns=[2**i for i in range(15)], N_for_K=256, K_for_N=128, seqs=2048, dists=8),
}

K0 = 64  # a predictor pass costs ~ sequences x positions x (K + K0): the memorizing ones are linear in K
# seconds per units() on the 2-core development VM, (lo, hi): of CPU time, and of wall time with its cores shared with
# other jobs; the N sweep's batches cost what the K sweep's do per unit, so one pair of ranges serves both sweeps
CPU_SECONDS_PER_UNIT = (133, 279)
SHARED_SECONDS_PER_UNIT = (213, 422)


def units(n_seqs: int, length: int, K: int) -> float:
    """The cost of the four predictors on n_seqs sequences of `length` states against K chains, in 10^9 units."""
    return n_seqs * length * (K + K0) / 1e9


def work(Ks, Ns, N_for_K: int, K_for_N: int, n_dists: int, n_seqs: int) -> dict:
    """The units() main's two sweeps report to their progress: the N sweep's 4 x n_seqs sequences of max(N) + 1 states."""
    return {"loss vs K": n_dists * sum(units(n_seqs, N_for_K + 1, K) for K in Ks),
            "loss vs N": n_dists * units(4 * n_seqs, max(Ns) + 1, K_for_N)}


def span(lo: float, hi: float) -> str:
    """A range of seconds in minutes, or in hours past 90 minutes."""
    return f"{lo / 60:.0f}-{hi / 60:.0f} min" if hi < 5400 else f"{lo / 3600:.1f}-{hi / 3600:.1f} h"


def estimate(total: dict, device) -> str:
    """What the first line says the run will take: on a CPU, its CPU time and its time on 2 shared cores as measured
    (less on free ones)."""
    if device.type != "cpu":
        return "not timed on a GPU"
    cost = sum(total.values())
    return (f"~{span(*(cost * c for c in CPU_SECONDS_PER_UNIT))} of CPU time, "
            f"~{span(*(cost * c for c in SHARED_SECONDS_PER_UNIT))} on 2 cores shared with other jobs")


def scaling_with_K(Ks, N: int, n_dists: int, n_seqs: int, device, progress=None) -> dict:
    """Autoregressive loss (length N + 1 sequences from S) of each predictor vs K, per task distribution.
    progress: called with the units() of each K done."""
    losses = {name: [[0.0] * len(Ks) for _ in range(n_dists)] for name in PREDICTORS}
    for d in range(n_dists):
        full = TaskSet.create(max(Ks), seed=d, device=device)  # nested: S(K) = first K chains
        g = torch.Generator(device).manual_seed(10_000 + d)
        for j, K in enumerate(Ks):
            tasks = TaskSet(T=full.T[:K], p=full.p[:K])
            seqs, _ = tasks.batch(n_seqs, N + 1, g)
            for name in PREDICTORS:
                losses[name][d][j] = ar_loss(predict(name, seqs, tasks.T), seqs).item()
            if progress:
                progress(units(n_seqs, N + 1, K))
    return losses


def scaling_with_N(Ns, K: int, n_dists: int, n_seqs: int, device, batch: int = 64, progress=None) -> dict:
    """Non-autoregressive loss -log pi(s_N | s_0..s_{N-1}) of each predictor vs N at fixed K.

    One set of length max(N) + 1 sequences serves every N: the prediction at position N - 1
    only sees s_0..s_{N-1}. progress: called with the units() of each batch done."""
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
            if progress:
                progress(units(seqs.shape[0], max(Ns) + 1, K))
        for name in PREDICTORS:
            losses[name].append((totals[name] / n_seqs).tolist())
    return losses


def asymptotic_levels(K: int, n_dists: int) -> dict:
    """The N -> infinity losses of 1-Gen and 2-Gen over the chains of the n_dists task sets of K chains (seeds
    0..n_dists - 1, the sets scaling_with_N draws from)."""
    T = torch.cat([TaskSet.create(K, seed=d).T for d in range(n_dists)])
    return {"1gen": asymptotic_loss_1gen(T).item(), "2gen": asymptotic_loss_2gen(T).item()}


def summarize(per_dist: list[list[float]]) -> dict:
    """The figure's points and error bars: the mean over task distributions and their (sample) standard deviation."""
    x = torch.tensor(per_dist)
    return {"mean": x.mean(0).tolist(), "std": x.std(0).tolist() if len(per_dist) > 1 else [0.0] * x.shape[1]}


def plot_scaling(result: dict, path: str):
    """The appendix figure "Scaling of the four predictor losses": each predictor's loss against K (left) and N (right,
    with the asymptotic 1-Gen and 2-Gen losses), mean and standard deviation over task distributions."""
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
    parser = cli.ArgumentParser(description="Appendix figure: scaling of the four Bayes predictor losses with K and N.", runs=(
        "Default run: about 1-2 h on the 2-core development VM with its cores shared, ~40-80 min of CPU time (its "
        "first line's estimate, from its loss vs K, 17 min there on 2026-11-27; not timed whole) (quick preset: K to "
        "4096 at N = 256, N to 8192 at K = 128, 8 task distributions, 256 sequences); writes "
        "figures/predictor_scaling.png and figures/predictor_scaling.json.\n--replot: seconds, computes nothing."))
    cli.add_preset(parser, PRESETS, "quick: K to 2^12, N to 2^13, 256 sequences; paper: K to 2^13, N to 2^14, 2048 "
                                    "sequences")
    parser.add_argument("--dists", type=cli.at_least(1), default=None,
                        help="task distributions (task-set seeds) to average over (default: 8 in both presets)")
    parser.add_argument("--seqs", type=cli.at_least(1), default=None,
                        help="sequences per task distribution at each K (default: quick 256, paper 2048); the N sweep uses 4x")
    cli.add_device(parser)
    cli.add_threads(parser)
    cli.add_figures(parser)
    cli.add_replot(parser, "FIGURES/predictor_scaling.json", "the figure")
    args = parser.parse_args()
    if args.replot is not None:
        cli.replot(args, "predictor_scaling.json", ("K", "N", "loss_vs_K", "loss_vs_N", "asymptotic"),
                   "predictor_scaling.py", plot_scaling)
        return
    preset = cli.preset(args.preset)
    device = torch.device(cli.device(args.device))
    cli.set_threads(args.threads)
    P = PRESETS[preset]
    Ks, Ns, N_for_K, K_for_N = P["Ks"], P["Ns"], P["N_for_K"], P["K_for_N"]
    n_seqs, n_dists = args.seqs or P["seqs"], args.dists or P["dists"]
    out = cli.writable_dir(args.figures, "--figures")
    total = work(Ks, Ns, N_for_K, K_for_N, n_dists, n_seqs)
    cli.announce(preset, f"K to {Ks[-1]}, N to {Ns[-1]}, {n_dists} task distributions, {n_seqs} sequences, on "
                 f"{device}; {estimate(total, device)}", f"{out}/predictor_scaling.png and .json")
    progress = cli.WorkProgress(total)
    t0 = progress.t0
    vs_K = scaling_with_K(Ks, N_for_K, n_dists, n_seqs, device, progress=lambda u: progress.add("loss vs K", u))
    print(f"loss vs K done in {time.time() - t0:.0f} s", flush=True)
    # the non-autoregressive loss is a single position per sequence, hence 4x the sequences
    vs_N = scaling_with_N(Ns, K_for_N, n_dists, 4 * n_seqs, device, progress=lambda u: progress.add("loss vs N", u))
    print(f"loss vs N done in {time.time() - t0:.0f} s", flush=True)

    result = {
        "config": {"dists": n_dists, "seqs_per_K": n_seqs, "seqs_per_N": 4 * n_seqs, "N_for_K": N_for_K, "K_for_N": K_for_N,
                   "paper": preset == "paper"},
        "K": Ks, "loss_vs_K": {name: summarize(vs_K[name]) for name in PREDICTORS},
        "N": Ns, "loss_vs_N": {name: summarize(vs_N[name]) for name in PREDICTORS},
        "asymptotic": asymptotic_levels(K_for_N, n_dists),
        "seconds": round(time.time() - t0, 1),
    }
    write_json(os.path.join(out, "predictor_scaling.json"), result, indent=1)
    plot_scaling(result, os.path.join(out, "predictor_scaling.png"))
    for j, K in enumerate(Ks):
        print(f"K={K:5d}  " + "  ".join(f"{n}={result['loss_vs_K'][n]['mean'][j]:.4f}" for n in PREDICTORS))
    for j, N in enumerate(Ns):
        print(f"N={N:5d}  " + "  ".join(f"{n}={result['loss_vs_N'][n]['mean'][j]:.4f}" for n in PREDICTORS))
    print(f"wrote {out}/predictor_scaling.png and .json in {result['seconds']} s")


if __name__ == "__main__":
    cli.run(main)
