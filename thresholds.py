"""The critical data diversity K1* and its kinetic perturbations (Sec. "K1* is determined by a kinetic
competition", Fig. 7a-c; Appendix "Memorization to Generalization Transition", "Task Injection",
"Gradient Reweighting", Fig. A9).

K1* separates the runs that leave the 1-Gen plateau for 1-Mem (K < K1*) from those that form the
statistical induction head and enter 2-Gen (K > K1*). The paper's rule: a run is in 2-Gen when the
induction-head order parameter phi_beta(2) exceeds phi_beta* = 0.45, and

    K > K1*  iff  max_{t <= T} phi_beta(2)(t) > phi_beta*        (T = 10^4 steps in the paper)

so K1* is found per seed by a binary search over integer K on nested task sets. tau_2gen, the step at
which phi_beta(2) first exceeds phi_beta*, is bimodal near K1* (Fig. 7b). Two perturbations move K1* by
changing the kinetics of one of the competing circuits (Fig. 7c): gradient reweighting of layer 1's
previous-token attention by w (slower 2-Gen; iterations x 1/w) and task injection (faster 1-Mem).

K2* (Appendix "Transience and Partial Memorization", Fig. 8a-b, A10): above K1* a run enters 2-Gen and leaves
it for memorization after Delta tau_K steps, which diverges at K2* (fitted as a (K2* - K)^-gamma, and in the
paper's form with a linear offset b + c K); the fraction of memorized chains has an asymptote that falls with K
(the section "K2*" below).

    python thresholds.py k1                    # quick preset on the CPU: figures/k1.png and .json
    python thresholds.py k1 --print-commands   # the paper preset's runs, one command line each
    python thresholds.py k2                    # quick preset on the CPU: figures/k2.png and .json
    python thresholds.py dtau runs/k2_paper    # Delta tau of any K*_s* runs (a grid trained elsewhere)
    python thresholds.py grid bench/results/2026-11-26_h100_k1_grid_d.json   # Fig. 7a / A9 of the H100 grid

This file states the rules (at the top: phi_beta*, tau_2gen, tau_2mem, Delta tau, the memorized fraction), reads the
runs and draws the figures. The estimators (the binary search, the divergence and sigmoid fits, epsilon) are in
estimators.py; probes.py schedules the training runs, campaign.py the paper-scale ones across GPU leases.
"""
import dataclasses
import json
import math
import os
import shlex
import statistics
import textwrap
import time

import matplotlib.pyplot as plt
import numpy as np

import cli
import train
from estimators import (censored_median, divergence, epsilon_calibration, extrapolate_zero, fit_divergence,
                        fit_sigmoid, line_through_medians, median_ci)
from evaluation import make_per_chain_data, per_chain_scores
from markov import check_int, task_source
from probes import CONDITIONS, finished, probe_command, probe_config, run_config, run_probes, search_K1
from runs import load_run, read_metrics, read_per_chain

PHI_STAR = 0.45  # phi_beta*: the induction-head threshold


# ----------------------------------------------------------------------------- the rules
#
# K1*: a run generalizes when max_t phi_beta(2) > phi_beta*. K2*: a run memorizes once it beats 2-Gen on S;
# Delta tau_K = tau_2mem - tau_2gen; a chain counts as memorized when Delta^k < epsilon.
#
# The null: a chain's score averages a few dozen sequences, so a model that memorizes nothing could still beat
# 2-Gen on some chains by chance. The same model scored the same way on fresh chains of D_T, which it cannot have
# memorized (null_scores), measures that rate: f0, the fraction of its fresh-chain scores below epsilon. If a
# fraction m of S is memorized (always passing) and the rest pass at the rate f0, the fraction of S that passes is
# f = m + (1 - m) f0, so the memorized fraction is m = (f - f0) / (1 - f0) (corrected).
#
# A second, weaker question the null answers: which chains does the model treat better than chains it never saw,
# whether or not it beats 2-Gen on them? A chain whose score is below the NULL_ALPHA-quantile of the model's
# fresh-chain scores (null_epsilon) passes by chance with probability NULL_ALPHA; the same correction gives the
# fraction of S with a chain-specific advantage.

NULL_ALPHA = 0.05  # the false-positive rate of the chain-specific-advantage rule


def max_phi_beta(rows: list[dict], iters: int | None = None) -> float:
    """max over the evaluation rows with step <= iters (all rows if None) of phi_beta(2)."""
    values = [r["phi_beta_2"] for r in rows if iters is None or r["step"] <= iters]
    if not values:
        raise ValueError("no evaluation rows to read phi_beta(2) from")
    return max(values)


def tau_2gen(rows: list[dict], phi_star: float = PHI_STAR) -> int | None:
    """tau_2gen: the first evaluation step at which phi_beta(2) > phi_star (None: never within the run)."""
    return next((r["step"] for r in sorted(rows, key=lambda r: r["step"]) if r["phi_beta_2"] > phi_star), None)


def tau_2mem(rows: list[dict]) -> int | None:
    """tau_2mem: the first evaluation step at which L_train < L^{2-Gen} on the same held-out sequences from
    S, which no in-context predictor can do (None: never within the run). Reads dense rows (train.py
    --eval-every), each of which carries the 2-Gen level of its sequences."""
    return next((r["step"] for r in sorted(rows, key=lambda r: r["step"]) if r["train_loss"] < r["train_loss_2gen"]), None)


def delta_tau(rows: list[dict]) -> tuple[int | None, str]:
    """(Delta tau_K, status) of one run from its dense rows: status "ok"; "censored" (in 2-Gen at the end,
    Delta tau_K > the rest of the run: None); "no 2-gen" (never formed the induction head, K < K1*: None);
    "mem first" (memorized before the induction head formed: None)."""
    t_gen, t_mem = tau_2gen(rows), tau_2mem(rows)
    if t_gen is None:
        return None, "no 2-gen"
    if t_mem is None:
        return None, "censored"
    if t_mem < t_gen:
        return None, "mem first"
    return t_mem - t_gen, "ok"


def censored_after(rows: list[dict]) -> int | None:
    """A run still in 2-Gen at its end: the steps it spent there, a lower bound on its Delta tau_K (None for
    any other status)."""
    if delta_tau(rows)[1] != "censored":
        return None
    return max(r["step"] for r in rows) - tau_2gen(rows)


def memorized_fraction(chain_rows: list[dict], epsilon: float | list[float]) -> tuple[list[int], list[float]]:
    """(steps, fraction of chains with Delta^k < epsilon) from a run's per_chain.jsonl rows; epsilon one value,
    or one per row in step order (null_epsilon's)."""
    rows = sorted(chain_rows, key=lambda r: r["step"])
    eps = epsilon if isinstance(epsilon, list) else [epsilon] * len(rows)
    return [r["step"] for r in rows], [float(np.mean(np.array(r["delta"]) < e)) for r, e in zip(rows, eps)]


def null_epsilon(null_rows: list[dict], alpha: float = NULL_ALPHA) -> list[float]:
    """Per evaluation step (in step order): the alpha-quantile of the model's scores on fresh chains."""
    return [float(np.quantile(r["delta"], alpha)) for r in sorted(null_rows, key=lambda r: r["step"])]


def corrected(fraction: list[float], false_rate: list[float]) -> list[float]:
    """m = (f - f0) / (1 - f0) per step: the fraction of S that passes a rule, f, corrected for the rate f0 at which
    chains nobody memorized pass it (unclipped: below 0 where fewer chains pass than the null's rate)."""
    return [(f - f0) / (1 - f0) for f, f0 in zip(fraction, false_rate)]


# ----------------------------------------------------------------------------- the experiments' presets

PRESETS = {  # K1*
    # calibrated on the 2-core CPU (README): N = 64, batch 64 and lr 3e-3 so that a probe takes ~1.5 min of one
    # core and large K still form the induction head well inside the budget (N = 32 did not: K = 256 never
    # did within 1500 steps); the reweighting is milder than the paper's (its 1/w budget multiplies the cost)
    "quick": dict(N=64, batch=64, lr=3e-3, iters=1200, eval_every=50, eval_dense=128, evals=4, eval_train=128,
                  eval_gen=128, lo=16, hi=256, ratio=1.5, seeds=4, perturbed_seeds=2, weight=0.5, tau_seeds=6,
                  tau_iters=1200),
    # the paper: N = 256, 10^4 steps, phi_beta every 100 steps on 4096 sequences, 16 seeds (4 per
    # perturbation), w = 1/10, 64 seeds for tau_2gen followed for 5 x 10^4 steps
    "paper": dict(N=256, batch=128, lr=1e-3, iters=10_000, eval_every=100, eval_dense=4096, evals=4, eval_train=1024,
                  eval_gen=1024, lo=16, hi=4096, ratio=1.0, seeds=16, perturbed_seeds=4, weight=0.1, tau_seeds=64,
                  tau_iters=50_000),
}


K2_PRESETS = {
    # calibrated on the 2-core CPU (README): the K1* quick setting (N = 64, batch 64, lr 3e-3) with MLPs 8 wide
    # instead of 256. Wider MLPs left 2-Gen whenever the budget allowed: at width 32, Delta tau grew ~140 steps per
    # unit of K up to the end of 3000-, 5000- and 6000-step runs (the wall moved with the budget, log Delta tau
    # concave, no finite K2*). Eight hidden units store few chains: single 3000-4000-step pilots left 2-Gen after
    # 500, 900 and 2600 steps at K = 24, 32, 40 (log Delta tau convex), and sat above it at K = 48 and 56 (gap
    # +0.005, +0.008) and on a plateau at K = 96 (+0.016; K = inf +0.026)
    "quick": dict(N=64, batch=64, lr=3e-3, mlp_width=8, iters=4000, eval_every=100, eval_dense=256, evals=16,
                  eval_train=256, eval_gen=256, per_chain=32, per_chain_tasks=128, Ks=[24, 28, 32, 36, 40, 48], seeds=4,
                  inf_seeds=2, inf_iters=4000, null_chains=256),
    # the paper: N = 256; runs long enough to see Delta tau near K2*; 3 models at K = inf for 10^6 steps, scored
    # on 10^4 fixed chains
    "paper": dict(N=256, batch=128, lr=1e-3, iters=1_000_000, eval_every=1000, eval_dense=1024, evals=60,
                  eval_train=1024, eval_gen=1024, per_chain=64, per_chain_tasks=10_000,
                  Ks=[128, 256, 512, 1024, 2048, 4096], seeds=4, inf_seeds=3, inf_iters=1_000_000, null_chains=1024),
}


# ----------------------------------------------------------------------------- the K1* experiment


def k1_runs(outcomes: dict) -> list[dict]:
    """Per probe (Figs. 7a, A9): its K, seed and condition, max_t phi_beta(2), min_t L_gen and tau_2gen."""
    return [{"K": K, "seed": seed, "condition": cond, "max_phi_beta": max_phi_beta(rows),
             "min_gen_loss": min(r["gen_loss"] for r in rows), "tau_2gen": tau_2gen(rows)}
            for (cond, K, seed), rows in sorted(outcomes.items())]


def k1_result(preset: str, p: dict, plan: dict[str, list[int]], searches: dict, runs: list[dict]) -> dict:
    """The K1* experiment's numbers: per condition and seed K1* (None outside [lo, hi]), its bound and the
    smallest K that generalized; the probes' summaries `runs` (k1_runs)."""
    def per_seed(key):
        return {c: [searches[c, s][key] for s in seeds] for c, seeds in plan.items()}

    return {"preset": preset, "iters": p["iters"], "N": p["N"], "phi_star": PHI_STAR, "weight": p["weight"],
            "search": {"lo": p["lo"], "hi": p["hi"], "ratio": p["ratio"]}, "seeds": plan,
            "K1_star": per_seed("K1_star"), "bounds": per_seed("bound"), "above": per_seed("above"), "runs": runs}


def generalizes(rows: list[dict]) -> bool:
    """The paper's rule: the run entered 2-Gen, max_t phi_beta(2) > phi_beta*."""
    return max_phi_beta(rows) > PHI_STAR


def tau_histogram(preset: str, root: str, K: int, jobs: int, device: str | None = None) -> list[int | None]:
    """tau_2gen of tau_seeds control runs at one K (Fig. 7b), each followed for tau_iters steps."""
    p = PRESETS[preset]
    where = root if p["tau_iters"] == p["iters"] else os.path.join(root, "tau")  # same runs as the search's: reuse
    cfgs = [probe_config(preset, p, "control", K, seed, where, iters=p["tau_iters"], device=device)
            for seed in range(p["tau_seeds"])]
    return [tau_2gen(rows) for rows in run_probes(cfgs, jobs)]


def plot_k1(result: dict, path: str):
    """Fig. 7a (max phi_beta against K - K1*, per seed), Fig. A9 (min L_gen against K - K1*), Fig. 7b (tau_2gen
    near K1*) and Fig. 7c (K1* per condition and seed)."""
    fig, axes = plt.subplots(1, 4, figsize=(20, 4.2))
    K1 = {(c, s): v for c, values in result["K1_star"].items() for s, v in enumerate(values)}
    colors = {"control": "k", "reweight": "tab:blue", "inject": "tab:red"}
    for cond in result["K1_star"]:
        for seed in sorted({r["seed"] for r in result["runs"] if r["condition"] == cond}):
            if K1[cond, seed] is None:
                continue
            rs = sorted((r for r in result["runs"] if r["condition"] == cond and r["seed"] == seed), key=lambda r: r["K"])
            x = [r["K"] - K1[cond, seed] for r in rs]
            style = dict(color=colors[cond], marker=".", lw=1, alpha=0.8 if cond == "control" else 0.5)
            axes[0].plot(x, [r["max_phi_beta"] for r in rs], **style)
            axes[1].plot(x, [r["min_gen_loss"] for r in rs], **style)
    axes[0].axhline(result["phi_star"], color="gray", ls="--", lw=1, label="phi_beta* = 0.45")
    for ax, label in ((axes[0], "max_t phi_beta(2)"), (axes[1], "min_t L_gen")):
        ax.axvline(0.5, color="gray", ls=":", lw=1)
        ax.set_xscale("symlog", linthresh=8)
        ax.set_xticks([-100, -10, 0, 10, 100], ["-100", "-10", "0", "10", "100"])
        ax.set_xlabel("K - K1* (each seed shifted by its own K1*)")
        ax.set_ylabel(label)
    axes[0].set_title("Fig. 7a: the induction head appears above K1*")
    axes[1].set_title("Fig. A9: generalization loss drops above K1*")
    for cond in result["K1_star"]:
        axes[0].plot([], [], color=colors[cond], label=cond)
    axes[0].legend(fontsize=8)
    draw_tau_histogram(axes[2], result["tau_2gen"]["tau"], result["tau_2gen"]["iters"], result["tau_2gen"]["K"])
    lo, hi = result["search"]["lo"], result["search"]["hi"]
    for i, cond in enumerate(result["K1_star"]):
        values = result["K1_star"][cond]
        bounds = result["bounds"][cond]
        xs = i + np.linspace(-0.15, 0.15, len(values)) if len(values) > 1 else [i]
        for x, v, b in zip(xs, values, bounds):
            if v is not None:
                axes[3].plot(x, v, "o", color=colors[cond])
            else:  # outside the searched range: drawn at its edge
                axes[3].plot(x, lo if b == "below" else hi, "v" if b == "below" else "^", color=colors[cond], mfc="none")
        found = [v for v in values if v is not None]
        if found:
            axes[3].hlines(statistics.median(found), i - 0.3, i + 0.3, color=colors[cond])
    axes[3].set_xticks(range(len(result["K1_star"])),
                       [f"{c}\n(w = {result['weight']})" if c == "reweight" else c for c in result["K1_star"]])
    axes[3].plot([], [], "^", color="gray", mfc="none", label=f"K1* >= {hi}: no 2-Gen even at K = {hi}")
    axes[3].plot([], [], "v", color="gray", mfc="none", label=f"K1* < {lo}: 2-Gen already at K = {lo}")
    axes[3].legend(fontsize=8, loc="lower right")
    axes[3].set_yscale("log", base=2)
    axes[3].set_ylim(lo / 1.3, hi * 1.3)
    axes[3].set_ylabel("K1* (largest K without 2-Gen)")
    axes[3].set_title("Fig. 7c: K1* per seed and condition (bar: median)")
    fig.suptitle(f"K1*: binary search per seed, rule max phi_beta(2) > {result['phi_star']} within {result['iters']} steps "
                 f"(preset {result['preset']}, N = {result['N']})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def tau_bins(iters: int) -> np.ndarray:
    """Fig. 7b's bins of tau_2gen: ten over the run."""
    return np.linspace(0, iters, 11)


def draw_tau_histogram(ax, taus: list[int | None], iters: int, K: int):
    """Fig. 7b on ax: the seeds' tau_2gen in tau_bins(iters), and those that never entered 2-Gen (None) as one bar
    past the end of the run."""
    reached = [t for t in taus if t is not None]
    edges = tau_bins(iters)
    ax.hist(reached, bins=edges, color="tab:blue", label="entered 2-Gen")
    width = edges[1] - edges[0]
    ax.bar(edges[-1] + width, len(taus) - len(reached), width=width * 0.9, color="tab:orange", label="never (within the run)")
    ax.set_xlabel(f"tau_2gen (step at which phi_beta(2) first exceeds {PHI_STAR})")
    ax.set_ylabel("seeds")
    ax.set_title(f"Fig. 7b: K = {K} (about K1*), {len(taus)} seeds")
    ax.legend(fontsize=8)


def common_args(args, presets: dict, name: str) -> tuple[str, str, dict, int, str, list[int]]:
    """The flags k1 and k2 share, checked: (preset, root, the preset's values, jobs, device, seeds)."""
    preset = cli.preset(args.preset)
    root = args.root or os.path.join("runs", f"{name}_{preset}")
    p = presets[preset]
    jobs = check_int("--jobs", args.jobs, 1)
    device = cli.device(args.device)
    if preset == "paper" and not device.startswith("cuda") and not args.print_commands:
        raise ValueError("the paper preset needs a GPU (ensembles); without one, --print-commands prints the runs")
    seeds = cli.parse_list("--seeds", args.seeds) if args.seeds is not None else list(range(p["seeds"]))
    return preset, root, p, jobs, device, seeds


def k1(args):
    preset, root, p, jobs, device, seeds = common_args(args, PRESETS, "k1")
    conditions = args.conditions.split(",")
    if "control" not in conditions or set(conditions) - set(CONDITIONS) or len(set(conditions)) < len(conditions):
        raise ValueError(f"--conditions: distinct names among {', '.join(CONDITIONS)}, control included; got {args.conditions!r}")
    perturbed = (cli.parse_list("--perturbed-seeds", args.perturbed_seeds) if args.perturbed_seeds is not None
                 else list(range(p["perturbed_seeds"])))
    plan = {c: seeds if c == "control" else perturbed for c in CONDITIONS if c in conditions}
    cli.writable_dir(args.figures, "--figures")
    if not args.print_commands:
        cli.announce(preset, f"K1* searches of {p['iters']} steps per probe, runs in {root}", f"{args.figures}/k1.png and .json")
    t0 = time.time()
    found = search_K1(preset, p, root, jobs, plan, generalizes, print_only=args.print_commands, device=device)
    if found is None:
        return
    K1 = {c: [found["searches"][c, s]["K1_star"] for s in seeds] for c, seeds in plan.items()}
    control = [v for v in K1["control"] if v is not None]
    if not control:
        raise ValueError(f"no control seed has K1* inside [{p['lo']}, {p['hi']}]; widen the preset's range")
    K_tau = round(statistics.median(control))
    print(f"searches done in {(time.time() - t0) / 60:.1f} min; K1*: {K1}; tau_2gen at K = {K_tau}", flush=True)
    taus = tau_histogram(preset, root, K_tau, jobs, device)
    result = {**k1_result(preset, p, plan, found["searches"], k1_runs(found["outcomes"])),
              "tau_2gen": {"K": K_tau, "iters": p["tau_iters"], "tau": taus},
              "minutes_this_call": round((time.time() - t0) / 60, 1)}  # finished probes are reused, not timed
    plot_k1(result, os.path.join(args.figures, "k1.png"))
    with open(os.path.join(args.figures, "k1.json"), "w") as f:
        json.dump(result, f, indent=1)
    for c in K1:
        print(f"K1* {c}: {K1[c]} (median {statistics.median([v for v in K1[c] if v is not None] or [float('nan')])})")
    print(f"tau_2gen at K = {K_tau}: {taus}")
    print(f"wrote {args.figures}/k1.png and k1.json in {result['minutes_this_call']} min")


# ----------------------------------------------------------------------------- K2*: transient 2-Gen and partial memorization
#
# Appendix "Transience and Partial Memorization". For K1* < K < K2* a run first enters 2-Gen and later
# memorizes; the time it spends in 2-Gen,
#
#     Delta tau_K = tau_2mem - tau_2gen  ~  (K2* - K)^(-gamma)          (Fig. 8a: K2* ~ 7000, gamma ~ 2)
#
# diverges at K2*, beyond which the model never memorizes. Independently, a chain k counts as memorized when
# the model beats 2-Gen on it, Delta^k < epsilon (evaluation.per_chain_scores), and the fraction of memorized
# chains rises as a sigmoid in time whose asymptote falls with K (Fig. 8b, A10).


def k2_runs(preset: str, root: str, seeds: list[int], device: str | None = None) -> list[train.Config]:
    """The runs of the K2* experiment: the preset's K grid x seeds, then the K = inf calibration models."""
    p = K2_PRESETS[preset]
    cfgs = [run_config(preset, p, K, seed, os.path.join(root, f"K{K}_s{seed}"), device=device)
            for K in p["Ks"] for seed in seeds]
    return cfgs + [run_config(preset, p, math.inf, seed, os.path.join(root, f"Kinf_s{seed}"), iters=p["inf_iters"],
                              device=device) for seed in range(p["inf_seeds"])]


def divergence_fits(Ks: list, dtau: list, bounds: list) -> tuple[dict, dict]:
    """Fig. 8a's two fits (estimators.fit_divergence): a (K2* - K)^-gamma, and the paper's form with a linear
    offset (300 bootstrap resamples: each refit searches a (K2*, gamma) grid). Too few finite medians: K2* None
    and why."""
    fits = []
    for offset in (False, True):
        try:
            fits.append(fit_divergence(Ks, dtau, bounds, offset=offset, resamples=300 if offset else 1000))
        except ValueError as e:  # too few finite medians: say so in the JSON
            fits.append({"K2_star": None, "gamma": None, "K2_star_ci": None, "gamma_ci": None, "why": str(e)})
    return fits[0], fits[1]


def null_scores(run_dir: str, chains: int) -> list[dict]:
    """The null of the memorized fraction: rows {"step", "delta"} of the run's model at every full evaluation
    scored like its chains of S (evaluation.per_chain_scores, the run's per_chain sequences per chain) on `chains`
    fixed fresh chains of D_T, which it never trained on. Cached in run_dir/per_chain_null.jsonl, redone when
    the run's evaluation steps or the number of chains differ."""
    path = os.path.join(run_dir, "per_chain_null.jsonl")
    steps = [r["step"] for r in read_per_chain(run_dir)]
    if os.path.exists(path):
        with open(path) as f:
            rows = [json.loads(line) for line in f]
        if [r["step"] for r in rows] == steps and all(len(r["delta"]) == chains for r in rows):
            return rows
    cfg = load_run(run_dir, steps[0])[0]
    fresh = make_per_chain_data(dataclasses.replace(cfg, per_chain_tasks=chains), task_source(math.inf, cfg.C))
    rows = [{"step": step, "delta": [round(v, 6) for v in per_chain_scores(load_run(run_dir, step)[2], fresh).tolist()]}
            for step in steps]
    with open(path + ".tmp", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    os.replace(path + ".tmp", path)
    return rows


def _null_job(job: tuple[str, int]) -> list[dict]:
    return null_scores(*job)


def analyze_k2(cfgs: list[train.Config], null_chains: int, jobs: int = 1) -> dict:
    """Delta tau per run, medians and intervals per K, the divergence fit, epsilon from the K = inf runs, and the
    memorized fractions corrected by each model's fresh-chain null, with their sigmoid asymptotes (and beside them
    the raw fractions, the null's false-positive rates and the chain-specific advantage), from the runs' metrics.
    delta_tau[K] holds the seeds with a Delta tau (None: still in 2-Gen at the end, censored_after[K] the steps
    it spent there); a seed that never formed the induction head or memorized first is left out of it (its
    status is in runs)."""
    finite = [c for c in cfgs if c.K != math.inf]
    eps = epsilon_calibration([read_per_chain(c.out)[-1]["delta"] for c in cfgs if c.K == math.inf])
    nulls = cli.parallel_map(_null_job, [(c.out, null_chains) for c in finite], jobs, progress="fresh-chain scores")
    Ks = sorted({c.K for c in finite})
    runs, dtau, bound, asymptote, curves = [], {K: [] for K in Ks}, {K: [] for K in Ks}, {}, {}
    for c, null in zip(finite, nulls):
        dense = read_metrics(c.out, dense=True)[1]
        value, status = delta_tau(dense)
        if status in ("ok", "censored"):  # a run that never formed the head, or memorized first, has no Delta tau
            dtau[c.K].append(value)
            bound[c.K].append(censored_after(dense))
        chain_rows = read_per_chain(c.out)
        steps, raw = memorized_fraction(chain_rows, eps["value"])
        false = memorized_fraction(null, eps["value"])[1]  # the rule on chains nobody memorized
        fraction = corrected(raw, false)
        eps_null = null_epsilon(null)
        specific = corrected(memorized_fraction(chain_rows, eps_null)[1], [NULL_ALPHA] * len(steps))
        A = fit_sigmoid(steps, fraction)["A"]
        runs.append({"K": c.K, "seed": c.seed, "tau_2gen": tau_2gen(dense), "tau_2mem": tau_2mem(dense),
                     "delta_tau": value, "status": status, "memorized_final": fraction[-1], "memorized_asymptote": A,
                     "memorized_final_raw": raw[-1], "false_positive_final": false[-1], "specific_final": specific[-1],
                     "epsilon_null_final": eps_null[-1],
                     # L_train - L^2-Gen on the dense readouts' sequences from S at every eighth of the run
                     "gap_to_2gen": [[r["step"], round(r["train_loss"] - r["train_loss_2gen"], 5)] for r in dense
                                     if r["step"] % max(c.iters // 8, 1) == 0]})
        asymptote.setdefault(c.K, []).append(A)
        curves.setdefault(c.K, []).append({"step": steps, "fraction": fraction, "fraction_raw": raw,
                                           "false_positive": false, "specific": specific, "epsilon_null": eps_null})
    measured = [K for K in Ks if dtau[K]]
    medians = {K: median_ci(dtau[K]) if dtau[K] else (math.nan,) * 3 for K in Ks}
    fit, fit_offset = divergence_fits(measured, [dtau[K] for K in measured], [bound[K] for K in measured])

    def zero(values: dict, average) -> float | None:
        return extrapolate_zero(Ks, [float(average(values[K])) for K in Ks])

    return {"K": Ks, "delta_tau": dtau, "censored_after": bound, "median": {K: medians[K] for K in Ks},
            "median_lower_bound": {K: censored_median(dtau[K], bound[K])[0] for K in measured}, "fit": fit,
            "fit_offset": fit_offset, "epsilon": eps, "null": {"alpha": NULL_ALPHA, "chains": null_chains},
            "memorized_asymptote": asymptote, "memorized_zero": zero(asymptote, np.mean),
            # the same through the seeds' medians: a sigmoid fitted to a curve still steep at the end can run to A = 1
            "memorized_zero_median": zero(asymptote, np.median),
            "memorized_curves": curves, "runs": runs}


def plot_k2(result: dict, path: str):
    """Fig. 8a (Delta tau against K with the divergence fit, and against K2* - K), Fig. 8b (memorized
    asymptotes against K), Fig. A10 (memorized fraction against step) and the epsilon calibration. result:
    analyze_k2's, or k2.json as loaded (K as strings, null for an unbounded value). The inset is left out
    when there is no finite K2* to plot against."""
    def per_K(d: dict) -> dict:
        return {int(K): v for K, v in d.items()}

    Ks, fit = [int(K) for K in result["K"]], result["fit"]
    off = result.get("fit_offset") or {"K2_star": None}  # JSONs written before the offset fit have none
    dtau, lower = per_K(result["delta_tau"]), per_K(result["median_lower_bound"])
    medians = {K: (math.nan if m is None else m, math.nan if lo is None else lo, math.inf if hi is None else hi)
               for K, (m, lo, hi) in per_K(result["median"]).items()}
    asymptote, curves_by_K = per_K(result["memorized_asymptote"]), per_K(result["memorized_curves"])
    cmap = plt.get_cmap("viridis")
    color = {K: cmap(i / max(len(Ks) - 1, 1)) for i, K in enumerate(Ks)}
    with plt.rc_context({"font.size": 11, "axes.titlesize": 11, "legend.fontsize": 9}):
        fig = plt.figure(figsize=(13, 8.6))  # 1300 px: read at a README's ~900 px width
        grid = fig.add_gridspec(2, 6)
        if fit["K2_star"] is not None:
            ax8a, inset = fig.add_subplot(grid[0, :4]), fig.add_subplot(grid[0, 4:])
            ax8b, ax10, axeps = (fig.add_subplot(grid[1, 2 * i: 2 * i + 2]) for i in range(3))
        else:
            inset = None
            ax8a, ax8b = fig.add_subplot(grid[0, :3]), fig.add_subplot(grid[0, 3:])
            ax10, axeps = fig.add_subplot(grid[1, :3]), fig.add_subplot(grid[1, 3:])

        for K in Ks:
            seeds = [v for v in dtau[K] if v is not None]
            ax8a.plot([K] * len(seeds), seeds, ".", color="gray", alpha=0.6)
            med, lo, hi = medians[K]
            if math.isfinite(med):
                ax8a.errorbar(K, med, yerr=[[med - lo], [min(hi, 10 * med) - med]], fmt="o", color="k", capsize=3)
            elif K in lower:  # longer than the run: an arrow up from its lower bound (what the fit uses)
                ax8a.annotate("", (K, 2 * lower[K]), (K, lower[K]), arrowprops=dict(arrowstyle="->", color="k"))
            censored = sum(v is None for v in dtau[K])
            if censored:  # still in 2-Gen at the end: Delta tau longer than the run
                ax8a.annotate(f"{censored}/{len(dtau[K])}", (K, 0.03), ha="center", va="bottom",
                              xycoords=("data", "axes fraction"), fontsize=9)
        title = "Fig. 8a: time spent in 2-Gen (median, 95% CI)"
        if any(v is None for K in Ks for v in dtau[K]):
            title += "\nk/n at the bottom: seeds still in 2-Gen at the end; arrows: lower bounds"
        if "exponential_rate" in fit:
            title += f"\nno finite K2*: Delta tau ~ exp({fit['exponential_rate']:.3f} K)"
        elif fit["K2_star"] is None:
            title += "\nno fit: " + fit["why"].split(" (")[0][:70]
        ax8a.set_title(title)
        if fit["K2_star"] is not None:
            grid_K = np.linspace(min(Ks), min(fit["K2_star"] * 0.999, max(Ks) * 1.15), 200)  # the axes' range, up to K2*
            ax8a.plot(grid_K, divergence(grid_K, fit["log_a"], fit["K2_star"], fit["gamma"]), "k--", lw=1,
                      label=f"fit: K2* = {fit['K2_star']:.0f}, gamma = {fit['gamma']:.2f}")
            ax8a.axvline(fit["K2_star"], color="tab:red", ls=":", lw=1)
            finite = [K for K in Ks if math.isfinite(medians[K][0])]
            x = np.array([fit["K2_star"] - K for K in finite], float)
            inset.loglog(x, [medians[K][0] for K in finite], "ko")
            inset.loglog(x, divergence(fit["K2_star"] - x, fit["log_a"], fit["K2_star"], fit["gamma"]), "k--", lw=1,
                         label=f"slope -gamma = {-fit['gamma']:.2f}")
            for K, xi in zip(finite, x):
                inset.annotate(f"K = {K}", (xi, medians[K][0]), xytext=(5, 4), textcoords="offset points", fontsize=8)
            inset.set_xticks(x, [f"{v:.0f}" for v in x])  # K2* - K often spans less than a decade
            inset.set_xticks([], minor=True)
            inset.set_xlabel("K2* - K")
            inset.set_ylabel("median Delta tau_K")
            inset.set_title("Fig. 8a inset: the divergence")
            inset.legend(loc="upper right")
        if off["K2_star"] is not None:  # the paper's form, with its linear offset
            grid_K = np.linspace(min(Ks), min(off["K2_star"] * 0.999, max(Ks) * 1.15), 200)
            ax8a.plot(grid_K, divergence(grid_K, off["log_a"], off["K2_star"], off["gamma"], off["b"], off["c"]), ":",
                      color="tab:purple", lw=1, label=f"with offset: K2* = {off['K2_star']:.0f}, gamma = {off['gamma']:.2f}")
        ax8a.set_xscale("log", base=2)
        ax8a.set_xlim(min(Ks) / 1.15, max(Ks) * 1.15)  # the arrows and labels of censored K do not autoscale
        shown = [v for K in Ks for v in dtau[K] if v] + list(lower.values())
        if shown:  # limits set after the log scale, from the values: a linear autoscale's bottom can be <= 0
            ax8a.set_yscale("log")
            ax8a.set_ylim(0.5 * min(shown), 3 * max(shown))  # room for the arrows; a bar to an unbounded CI is cut
        ax8a.set_xlabel("K")
        ax8a.set_ylabel("Delta tau_K = tau_2mem - tau_2gen (steps)")
        if fit["K2_star"] is not None or off["K2_star"] is not None:
            ax8a.legend(loc="upper left")

        eps = result["epsilon"]
        null = "null" in result  # a JSON written before the fresh-chain null has neither correction nor panel
        means = [float(np.mean(asymptote[K])) for K in Ks]
        ax8b.errorbar(Ks, means, yerr=[float(np.std(asymptote[K])) for K in Ks], fmt="ko-", capsize=3)
        zero = result["memorized_zero"]
        if zero is not None:
            top = int(np.argmax(means))
            ax8b.plot([Ks[top], zero], [means[top], 0], "k--", lw=1, label=f"linear in log K: 0 at K = {zero:.0f}")
            ax8b.legend()
        ax8b.set_xscale("log", base=2)
        ax8b.set_xlim(min(Ks) / 1.15, max(Ks) * 1.15)  # the line to the zero crossing runs on beyond: its K is in the legend
        ax8b.set_xlabel("K")
        ax8b.set_ylabel("memorized fraction at convergence\n(sigmoid asymptote)")
        ax8b.set_title("Fig. 8b: fraction of chains memorized")
        for ax in (ax8a, ax8b):  # one tick per K: a log-2 axis alone labels only its powers of 2
            ax.set_xticks(Ks, [str(K) for K in Ks])

        for K in Ks:
            curves = curves_by_K[K]
            for c in curves:
                ax10.plot(np.maximum(c["step"], 1), c["fraction"], color=color[K], lw=0.5, alpha=0.6)
            ax10.plot(np.maximum(curves[0]["step"], 1), np.mean([c["fraction"] for c in curves], 0), color=color[K], lw=2,
                      label=f"K = {K}")
        ax10.set_xscale("log")
        ax10.set_xlabel("step")
        ax10.set_ylabel(f"fraction with Delta^k < epsilon = {eps['value']:.2g}" + ("\n(corrected by the fresh-chain null)" if null else ""))
        ax10.set_title("Fig. A10: memorized fraction over training")
        ax10.legend(ncol=2)
        if null:  # at the end of the runs: the rule on S and on fresh chains, and the chain-specific advantage
            def at_end(key):
                return [float(np.mean([c[key][-1] for c in curves_by_K[K]])) for K in Ks]

            axeps.plot(Ks, at_end("fraction_raw"), "ko-", label=f"S: Delta^k < {eps['value']:.2g}")
            axeps.plot(Ks, at_end("false_positive"), "x--", color="tab:red", label="fresh chains: Delta^k < epsilon")
            axeps.plot(Ks, at_end("specific"), "s:", color="tab:blue",
                       label=f"S: below the fresh chains'\n{NULL_ALPHA:.0%} quantile (corrected)")
            axeps.set_xscale("log", base=2)
            axeps.set_xticks(Ks, [str(K) for K in Ks])
            axeps.set_ylim(-0.05, 1.05)
            axeps.set_xlabel("K")
            axeps.set_ylabel("fraction of chains at the end")
            axeps.set_title(f"the null: each model on {result['null']['chains']} fresh chains\n"
                            f"(epsilon from {len(eps['per_model'])} models at K = inf)", fontsize=10)
            axeps.legend(fontsize=8, loc="lower left", bbox_to_anchor=(0, 0.06))
        else:
            axeps.hist(eps["scores"], bins=40, color="tab:blue")
            axeps.axvline(eps["value"], color="tab:red", ls="--", label=f"epsilon = mean - 2 std\n= {eps['value']:.3g}")
            axeps.set_xlabel("Delta^k of K = inf models (fixed fresh chains)")
            axeps.set_ylabel("chains")
            axeps.set_title(f"epsilon: {len(eps['per_model'])} models at K = inf\nmean {eps['mean']:.3g}, std {eps['std']:.3g}")
            axeps.legend()
        width = f"MLPs {result['mlp_width']} wide" if result.get("mlp_width") else "MLPs 4 D wide"
        fig.suptitle(f"K2*: transient 2-Gen and partial memorization (preset {result['preset']}, N = {result['N']}, "
                     f"{width}, {result['iters']} steps)", fontsize=12)
        fig.tight_layout()
        fig.savefig(path, dpi=100)
    plt.close(fig)


def finite_json(value):
    """value with every infinite or NaN float as None (null: "beyond the run"), so that the JSON is standard."""
    if isinstance(value, dict):
        return {k: finite_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_json(v) for v in value]
    return None if isinstance(value, float) and not math.isfinite(value) else value


def delta_tau_table(run_dirs: list[str]) -> dict:
    """Delta tau_K of any set of train.py runs with dense rows (--eval-every): a grid trained from the printed
    commands, or with flags of its own. Per run tau_2gen, tau_2mem, Delta tau and status; per K the seeds' Delta
    tau (None: still in 2-Gen at the end) and their median with a 95 % interval; the divergence fit (>= 4 K with a
    finite median), and a straight line through the finite medians (slope, and the K where it reaches 0, with
    bootstrap intervals over seeds). The runs must share their protocol (every setting but K, seed, the directory,
    the device and what follows from K): seeds of different lengths or models pooled into one median would make it
    meaningless."""
    runs, first = [], None
    own = {"K", "seed", "out", "device", "eval_train", "ckpt_every"}
    for run_dir in run_dirs:
        cfg, dense = read_metrics(run_dir, dense=True)
        first = first or (run_dir, cfg)
        differ = sorted(k for k in set(cfg) | set(first[1]) if k not in own and cfg.get(k) != first[1].get(k))
        if differ:
            raise ValueError(f"{run_dir} and {first[0]} differ in {', '.join(differ)}: analyse runs of one protocol together")
        if not dense:
            raise ValueError(f"{run_dir} has no dense rows (train it with --eval-every)")
        value, status = delta_tau(dense)
        runs.append({"run": os.path.basename(os.path.normpath(run_dir)), "K": cfg["K"], "seed": cfg["seed"],
                     "iters": cfg["iters"], "tau_2gen": tau_2gen(dense), "tau_2mem": tau_2mem(dense),
                     "delta_tau": value, "status": status, "censored_after": censored_after(dense)})
    return delta_tau_summary(runs)


def delta_tau_summary(runs: list[dict]) -> dict:
    """delta_tau_table's numbers from its per-run rows (also those of a JSON it wrote)."""
    dtau, bound = {}, {}
    for r in runs:
        if r["status"] in ("ok", "censored") and r["K"] != math.inf:
            dtau.setdefault(r["K"], []).append(r["delta_tau"])
            bound.setdefault(r["K"], []).append(r.get("censored_after"))
    Ks = sorted(dtau)
    fit, fit_offset = divergence_fits(Ks, [dtau[K] for K in Ks], [bound[K] for K in Ks])
    medians = {K: median_ci(dtau[K]) for K in Ks}  # a bootstrap each: computed once
    line = line_through_medians(Ks, [dtau[K] for K in Ks])
    return {"runs": sorted(runs, key=lambda r: (r["K"], r["seed"])), "K": Ks, "delta_tau": {K: dtau[K] for K in Ks},
            "median_ci": medians, "fit": fit, "fit_offset": fit_offset, "line": line}


def dtau(args):
    if os.path.isfile(args.root):  # a JSON this command wrote: its analysis redone from its per-run rows
        with open(args.root) as f:
            saved = json.load(f)
        if "runs" not in saved:
            raise ValueError(f"{args.root!r} is not a JSON written by thresholds.py dtau (it has no runs)")
        result = delta_tau_summary([{**r, "censored_after": r.get("censored_after", r["iters"] - r["tau_2gen"]
                                                                  if r["status"] == "censored" else None)}
                                    for r in saved["runs"]])
    else:
        runs = sorted(os.listdir(args.root)) if os.path.isdir(args.root) else []
        run_dirs = [os.path.join(args.root, d) for d in runs if os.path.isfile(os.path.join(args.root, d, "metrics.jsonl"))]
        if not run_dirs:
            raise ValueError(f"{args.root!r} holds no run directories (each with a metrics.jsonl)")
        result = delta_tau_table(run_dirs)
    for r in result["runs"]:
        print(f"{r['run']:>12}: tau_2gen {r['tau_2gen']}, tau_2mem {r['tau_2mem']}, Delta tau {r['delta_tau']} ({r['status']})")
    for K in result["K"]:
        m, lo, hi = result["median_ci"][K]
        print(f"K = {K}: Delta tau {result['delta_tau'][K]}, median {m:g} [{lo:g}, {hi:g}]")
    print(f"fit: {result['fit']}")
    print(f"fit with the linear offset: {result['fit_offset']}")
    print(f"line through the medians: {result['line']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(finite_json({"root": args.root, **result}), f, indent=1)
        print(f"wrote {args.json}")


def k2(args):
    preset, root, p, jobs, device, seeds = common_args(args, K2_PRESETS, "k2")
    cfgs = k2_runs(preset, root, seeds, device)
    if args.print_commands:
        print("\n".join(shlex.join(probe_command(cfg)) for cfg in cfgs if not finished(cfg)))
        return
    cli.writable_dir(args.figures, "--figures")
    todo = [cfg for cfg in cfgs if not finished(cfg)]
    cli.announce(preset, f"K2*: {len(cfgs)} runs of {p['iters']} steps ({len(todo)} to train) in {root}",
                 f"{args.figures}/k2.png and .json")
    t0 = time.time()
    run_probes(cfgs, jobs)
    result = {"preset": preset, "N": p["N"], "mlp_width": p.get("mlp_width", 0), "iters": p["iters"], "seeds": seeds,
              **analyze_k2(cfgs, p["null_chains"], jobs),
              "minutes_this_call": round((time.time() - t0) / 60, 1)}  # finished runs are reused, not timed
    plot_k2(result, os.path.join(args.figures, "k2.png"))
    with open(os.path.join(args.figures, "k2.json"), "w") as f:
        json.dump(finite_json(result), f, indent=1)
    fit = result["fit"]
    for K in result["K"]:
        print(f"K = {K}: Delta tau {result['delta_tau'][K]}, memorized asymptote "
              f"{[round(a, 3) for a in result['memorized_asymptote'][K]]}")
    for name, f in (("fit", fit), ("fit with the linear offset", result["fit_offset"])):
        print(f"{name}: K2* = {f['K2_star']} (95% {f['K2_star_ci']}), gamma = {f['gamma']} (95% {f['gamma_ci']})"
              + ("" if f["K2_star"] else f"; {f.get('why', '')}"))
    print(f"memorized fraction reaches 0 at K = {result['memorized_zero']}; epsilon {result['epsilon']['value']:.4g}")
    print(f"wrote {args.figures}/k2.png and k2.json in {result['minutes_this_call']} min")


def grid_table(members: list[dict]) -> dict:
    """Per K of a fixed (K, seed) grid: the seeds' max phi_beta(2) over the dense readouts, their L_gen and how
    many formed the induction head. members: {"K", "seed", "max_phi_beta", "gen_loss", "gen_loss_2gen"}."""
    table = {}
    for m in sorted(members, key=lambda m: (m["K"], m["seed"])):
        row = table.setdefault(m["K"], {"seed": [], "max_phi_beta": [], "gen_loss": [], "gen_loss_2gen": m["gen_loss_2gen"]})
        row["seed"].append(m["seed"])
        row["max_phi_beta"].append(m["max_phi_beta"])
        row["gen_loss"].append(m["gen_loss"])
    for row in table.values():
        row["heads"] = sum(v > PHI_STAR for v in row["max_phi_beta"])
    return table


def bench_members(grid: dict) -> list[dict]:
    """grid_table's members from a train.py grid's summary (bench/results/*_k1_grid_*.json): L_gen at the end."""
    return [{"K": m["K"], "seed": m["seed"], "max_phi_beta": m["max_phi_beta_2_dense"], "gen_loss": m["gen_loss"],
             "gen_loss_2gen": m["gen_loss_2gen"]} for m in grid["members"].values()]


def plot_grid(tables: dict[str, dict], title: str, path: str, loss_label: str = "L_gen at the end",
              brackets: dict[str, dict] | None = None):
    """Fig. 7a / A9 of fixed grids, one table (grid_table's) per condition: max phi_beta(2) and L_gen against K,
    one line per seed (one condition: a colour per seed; several: a colour per condition, a marker per seed),
    each seed drawn at the K it has (a grid still being trained lacks some); with brackets ({condition: {seed:
    grid_brackets' [lo, hi]}}) a third panel, Fig. 7c per seed: the interval of K that holds each seed's K1*."""
    Ks = sorted({K for table in tables.values() for K in table})
    fig, axes = plt.subplots(1, 3 if brackets else 2, figsize=(15 if brackets else 10, 3.8))
    markers = ".osd^v"
    for c, (condition, table) in enumerate(tables.items()):
        for i, seed in enumerate(sorted({s for row in table.values() for s in row["seed"]})):
            at = [(K, table[K]["seed"].index(seed)) for K in sorted(table) if seed in table[K]["seed"]]
            color, marker = (f"C{i}", ".") if len(tables) == 1 else (f"C{c}", markers[i % len(markers)])
            label = f"seed {seed}" if len(tables) == 1 else f"{condition}, seed {seed}"
            for ax, key in zip(axes, ("max_phi_beta", "gen_loss")):
                ax.plot([K for K, _ in at], [table[K][key][j] for K, j in at], marker=marker, ls="-", color=color,
                        label=label)
    axes[0].axhline(PHI_STAR, color="gray", ls="--", lw=1, label="phi_beta* = 0.45")
    level = {K: table[K]["gen_loss_2gen"] for table in tables.values() for K in table}
    axes[1].plot(Ks, [level[K] for K in Ks], "k:", label="2-Gen")
    for ax, label in zip(axes, ("max_t phi_beta(2)", loss_label)):
        ax.set_xscale("log", base=2)
        ax.set_xticks(Ks, [str(K) for K in Ks])
        ax.set_xlabel("K")
        ax.set_ylabel(label)
        ax.legend(fontsize=7)
    axes[0].set_title("Fig. 7a: the induction head forms above K1*", fontsize=10)
    axes[1].set_title("Fig. A9: L_gen drops to 2-Gen above K1*", fontsize=10)
    if brackets:
        draw_brackets(axes[2], brackets, Ks)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def draw_brackets(ax, brackets: dict[str, dict], Ks: list):
    """Fig. 7c from a fixed grid: per condition and seed a bar over [the largest K without the head, the smallest K
    with it]; an end the grid does not give runs to the panel's edge."""
    lo_edge, hi_edge = min(Ks) / 1.6, max(Ks) * 1.6
    labels = []
    for c, (condition, per_seed) in enumerate(brackets.items()):
        for seed, (lo, hi) in per_seed.items():
            ax.plot([lo or lo_edge, hi or hi_edge], [len(labels)] * 2, color=f"C{c}", lw=6, solid_capstyle="butt")
            labels.append(f"{condition}, seed {seed}")
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    ax.set_ylim(-0.7, len(labels) - 0.3)
    ax.set_xscale("log", base=2)
    ax.set_xlim(lo_edge, hi_edge)
    ax.set_xticks(Ks, [str(K) for K in Ks])
    ax.set_xlabel("K")
    ax.set_title("Fig. 7c: where each seed's K1* lies\n(largest K without the head, smallest K with it)", fontsize=10)


def grid_brackets(table: dict) -> dict[int, list]:
    """Per seed of a grid_table: K1*'s bracket [the largest K without the induction head, the smallest K with it]
    (None where the grid has no such K; the first above the second where the seed is not monotone in K)."""
    brackets = {}
    for seed in sorted({s for row in table.values() for s in row["seed"]}):
        head = {K: row["max_phi_beta"][row["seed"].index(seed)] > PHI_STAR for K, row in table.items() if seed in row["seed"]}
        below, above = [K for K, h in head.items() if not h], [K for K, h in head.items() if h]
        brackets[seed] = [max(below) if below else None, min(above) if above else None]
    return brackets


def grid(args):
    with open(args.json) as f:
        summary = json.load(f)
    table = grid_table(bench_members(summary))
    cli.writable_dir(args.figures, "--figures")
    name = args.name
    title = textwrap.fill(f"{summary['device']}: {summary['command']}", 120)
    plot_grid({"control": table}, title, os.path.join(args.figures, f"{name}.png"))
    with open(os.path.join(args.figures, f"{name}.json"), "w") as f:
        json.dump({"source": args.json, "device": summary["device"], "command": summary["command"], "K": table}, f, indent=1)
    for K, row in table.items():
        print(f"K = {K}: max phi_beta(2) {row['max_phi_beta']}, induction head in {row['heads']}/{len(row['seed'])}")
    print(f"wrote {args.figures}/{name}.png and .json")


def k1_grid(args):
    """K1* probes on a fixed (condition, K, seed) grid, no search: per run max phi_beta(2), min L_gen and
    tau_2gen; per condition and seed the bracket of K1* the grid gives (Fig. 7a and, per seed, Fig. 7c)."""
    preset, root, p, jobs, device, seeds = common_args(args, PRESETS, "k1grid")
    Ks = cli.parse_list("--K", args.K)
    conditions = [c.strip() for c in args.conditions.split(",")]
    if any(c not in CONDITIONS for c in conditions):
        raise ValueError(f"--conditions: unknown condition among {args.conditions!r}; conditions are {', '.join(CONDITIONS)}")
    weight = p["weight"] if args.weight is None else args.weight
    if not 0 < weight <= 1:
        raise ValueError(f"--weight must be in (0, 1], got {weight}")
    p = dict(p, weight=weight)
    root = args.root or os.path.join("runs", f"k1grid_{preset}_w{weight:g}")
    keys = [(c, K, s) for c in conditions for K in Ks for s in seeds]
    cfgs = [probe_config(preset, p, c, K, s, root, device=device) for c, K, s in keys]
    if args.print_commands:
        print("\n".join(shlex.join(probe_command(cfg)) for cfg in cfgs if not finished(cfg)))
        return
    cli.writable_dir(args.figures, "--figures")
    cli.announce(preset, f"K1* grid: {len(cfgs)} probes ({', '.join(conditions)}; K = {Ks}; seeds {seeds}; w = {weight:g}) "
                 f"in {root}", f"{args.figures}/{args.name}.png and .json")
    t0 = time.time()
    probes = k1_runs(dict(zip(keys, run_probes(cfgs, jobs))))
    cfg_of = dict(zip(keys, cfgs))
    for probe in probes:  # the 2-Gen level of L_gen, from the run's last full evaluation
        cfg = cfg_of[probe["condition"], probe["K"], probe["seed"]]
        probe["gen_loss_2gen"], probe["iters"] = read_metrics(cfg.out)[1][-1]["gen_loss_2gen"], cfg.iters
    tables = {c: grid_table([dict(r, gen_loss=r["min_gen_loss"]) for r in probes if r["condition"] == c]) for c in conditions}
    result = {"preset": preset, "N": p["N"], "iters": p["iters"], "weight": weight, "K": Ks, "seeds": seeds,
              "runs": probes, "table": tables, "brackets": {c: grid_brackets(t) for c, t in tables.items()},
              "minutes_this_call": round((time.time() - t0) / 60, 1)}
    title = (f"K1* on a fixed grid (preset {preset}, N = {p['N']}, {p['iters']} steps; reweight: w = {weight:g}, "
             f"x {1 / weight:g} steps)")
    plot_grid(tables, title, os.path.join(args.figures, f"{args.name}.png"), loss_label="min_t L_gen",
              brackets=result["brackets"])
    with open(os.path.join(args.figures, f"{args.name}.json"), "w") as f:
        json.dump(finite_json(result), f, indent=1)
    for c in conditions:
        for K, row in tables[c].items():
            taus = [r["tau_2gen"] for r in probes if r["condition"] == c and r["K"] == K]
            print(f"{c} K = {K}: max phi_beta(2) {[round(v, 3) for v in row['max_phi_beta']]}, tau_2gen {taus}, "
                  f"head in {row['heads']}/{len(row['seed'])}")
        print(f"{c}: K1* brackets per seed {result['brackets'][c]}")
    print(f"wrote {args.figures}/{args.name}.png and .json in {result['minutes_this_call']} min")


def add_run_flags(p, seeds: str):
    """The flags of a subcommand that trains a fixed set of runs: where, how many at a time, its figure, its seeds."""
    cli.add_device(p)
    cli.add_jobs(p)
    cli.add_threads(p)
    cli.add_figures(p)
    cli.add_seeds(p, None, seeds)
    p.add_argument("--print-commands", action="store_true", help="print the train.py commands of the unfinished runs and exit")


def main():
    parser = cli.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("k1", help="K1* per seed for control, gradient reweighting and task injection (Fig. 7, A9)")
    cli.add_preset(p, PRESETS, "quick: calibrated on the CPU, N = 64, 1200 steps; paper: N = 256, 10^4 steps, needs a GPU")
    p.add_argument("--root", default=None, help="where the probes' runs go (default runs/k1_<preset>)")
    cli.add_device(p)
    cli.add_jobs(p)
    cli.add_threads(p)
    cli.add_figures(p)
    p.add_argument("--conditions", default=",".join(CONDITIONS), help="comma-separated subset, control included")
    cli.add_seeds(p, None, "control seeds (default: quick 0-3, paper 0-15)")
    cli.add_seeds(p, None, "seeds of each perturbation (default: quick 0-1, paper 0-3)", "--perturbed-seeds")
    p.add_argument("--print-commands", action="store_true",
                   help="print the train.py commands of the next round of probes (for a scheduler) and exit")
    p = sub.add_parser("k2", help="Delta tau_K, its divergence at K2*, memorized fractions and epsilon (Fig. 8a, 8b, A10)")
    cli.add_preset(p, K2_PRESETS, "quick: calibrated on the CPU, N = 64, MLPs 8 wide, 4000 steps, K = 24..48; "
                                  "paper: N = 256, 10^6 steps, K = 128..4096, needs a GPU")
    p.add_argument("--root", default=None, help="where the runs go (default runs/k2_<preset>)")
    add_run_flags(p, "seeds at every K (default: 0-3)")
    p = sub.add_parser("k1grid", help="K1* probes on a fixed (condition, K, seed) grid, no search (Fig. 7a, 7c per seed)")
    cli.add_preset(p, PRESETS, "the K1* presets (quick: N = 64, 1200 steps; paper: N = 256, 10^4 steps, needs a GPU)")
    p.add_argument("--K", required=True, help="the grid's K, e.g. 45,64,96")
    p.add_argument("--conditions", default="control,reweight", help="comma-separated subset of control, reweight, inject")
    p.add_argument("--weight", type=float, default=None, help="reweight's w (default: the preset's; the paper: 0.1)")
    p.add_argument("--root", default=None, help="where the probes' runs go (default runs/k1grid_<preset>_w<w>)")
    p.add_argument("--name", default="k1_grid", help="the figure's name: FIGURES/NAME.png and .json")
    add_run_flags(p, "seeds at every K (default: the preset's control seeds)")
    p = sub.add_parser("dtau", help="Delta tau_K, its medians and the divergence fit of the runs K*_s*/ in ROOT (any flags)")
    p.add_argument("root", help="a directory of train.py runs with dense rows, e.g. a grid's --out, or a JSON this "
                   "command wrote (its analysis redone from the per-run rows)")
    p.add_argument("--json", default=None, help="also write everything to this JSON file")
    p = sub.add_parser("grid", help="Figs. 7a / A9 of a fixed (K, seed) grid from its summary JSON (bench/results/*_k1_grid_*.json)")
    p.add_argument("json", help="the grid's summary, e.g. bench/results/2026-11-26_h100_k1_grid_d.json")
    p.add_argument("--name", default="k1_grid_h100", help="the figure's name: FIGURES/NAME.png and .json")
    cli.add_figures(p)
    args = parser.parse_args()
    cli.set_threads(getattr(args, "threads", None))
    {"k1": k1, "k2": k2, "k1grid": k1_grid, "dtau": dtau, "grid": grid}[args.command](args)


if __name__ == "__main__":
    cli.run(main)
