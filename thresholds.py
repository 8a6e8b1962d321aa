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

This file trains and reads the runs and draws the figures; the estimators (the binary search, the divergence
and sigmoid fits, epsilon) are in estimators.py.
"""
import argparse
import json
import math
import os
import shlex
import statistics
import sys
import time
from dataclasses import fields

import matplotlib.pyplot as plt
import numpy as np

import cli
import train
from estimators import (Search, censored_median, divergence, epsilon_calibration, extrapolate_zero, fit_divergence,
                        fit_sigmoid, median_ci)
from markov import check_int
from runs import read_metrics, read_per_chain, train_ensemble

PHI_STAR = 0.45  # phi_beta*: the induction-head threshold


# ----------------------------------------------------------------------------- the rule


def max_phi_beta(rows: list[dict], iters: int | None = None) -> float:
    """max over the evaluation rows with step <= iters (all rows if None) of phi_beta(2)."""
    values = [r["phi_beta_2"] for r in rows if iters is None or r["step"] <= iters]
    if not values:
        raise ValueError("no evaluation rows to read phi_beta(2) from")
    return max(values)


def tau_2gen(rows: list[dict], phi_star: float = PHI_STAR) -> int | None:
    """tau_2gen: the first evaluation step at which phi_beta(2) > phi_star (None: never within the run)."""
    return next((r["step"] for r in sorted(rows, key=lambda r: r["step"]) if r["phi_beta_2"] > phi_star), None)


# ----------------------------------------------------------------------------- probes: one training run per (condition, K, seed)

PRESETS = {
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
CONDITIONS = ("control", "reweight", "inject")


def run_config(preset: str, p: dict, K: int | float, seed: int, out: str, **flags) -> train.Config:
    """The train.py run of one (K, seed) of an experiment preset p: p's values of train.Config's fields,
    then `flags` (device among them), through train.make_config (so the reweighting's x 1/w budget and every
    check are the command line's)."""
    values = {f.name: p[f.name] for f in fields(train.Config) if f.name in p}
    values.update(preset=preset, K=K, seed=seed, out=out, **flags)
    return train.make_config(argparse.Namespace(**values))


def probe_config(preset: str, condition: str, K: int, seed: int, root: str, iters: int | None = None,
                 device: str | None = None) -> train.Config:
    """The run of one K1* probe, in root/<condition>/K<K>_s<seed>."""
    flags = {"device": device} if iters is None else {"device": device, "iters": iters}
    if condition == "reweight":
        flags["prev_weight"] = PRESETS[preset]["weight"]
    elif condition == "inject":
        flags["task_injection"] = True
    elif condition != "control":
        raise ValueError(f"unknown condition {condition!r}; conditions are {', '.join(CONDITIONS)}")
    return run_config(preset, PRESETS[preset], K, seed, os.path.join(root, condition, f"K{K}_s{seed}"), **flags)


def finished(cfg: train.Config) -> bool:
    path = os.path.join(cfg.out, "metrics.jsonl")
    return os.path.exists(path) and any(r["step"] == cfg.iters for r in read_metrics(cfg.out, dense=True)[1])


def run_probe(cfg: train.Config) -> list[dict]:
    """The probe's dense rows, training it first unless it already finished (a killed search redoes nothing
    that is done; a probe killed midway resumes from its checkpoint)."""
    if not finished(cfg):
        resume = os.path.exists(os.path.join(cfg.out, "ckpt.pt"))
        train.train(cfg, resume=resume, overwrite=not resume, quiet=True)  # a probe without a checkpoint is redone
    return read_metrics(cfg.out, dense=True)[1]


def run_probes(cfgs: list[train.Config], jobs: int) -> list[list[dict]]:
    """All probes of one round: on CUDA as ensembles (one per condition, and per K with task injection,
    whose embedding table is K x D); on a CPU as `jobs` one-thread processes."""
    todo = [cfg for cfg in cfgs if not finished(cfg)]
    if todo and todo[0].device.startswith("cuda"):
        groups = {}
        for cfg in todo:
            groups.setdefault((cfg.iters, cfg.prev_weight, cfg.task_injection, cfg.K if cfg.task_injection else 0), []).append(cfg)
        for i, group in enumerate(groups.values()):
            root = os.path.dirname(group[0].out)
            train_ensemble(group, os.path.join(root, f"ckpt_round{i}.pt"), quiet=True, overwrite=True)  # unfinished: redone
    elif todo:
        cli.parallel_map(run_probe, todo, jobs)
    return [run_probe(cfg) for cfg in cfgs]


# ----------------------------------------------------------------------------- the K1* experiment


def search_K1(preset: str, root: str, jobs: int, plan: dict[str, list[int]], print_only: bool = False,
              device: str | None = None) -> dict | None:
    """The binary searches of plan's conditions, one per seed in plan[condition], advanced in lockstep: each round
    trains the pending probes of all searches together. print_only: print the next round's train.py
    commands and return None."""
    p = PRESETS[preset]
    searches = {(cond, seed): Search(p["lo"], p["hi"], p["ratio"]) for cond, seeds in plan.items() for seed in seeds}
    outcomes = {}  # (condition, K, seed) -> dense rows
    for round_ in range(1, 100):
        pending = [(cond, K, seed) for (cond, seed), s in searches.items() for K in s.pending()]
        for key in pending:  # finished probes are read back without training
            cfg = probe_config(preset, *key, root, device=device)
            if finished(cfg):
                outcomes[key] = run_probe(cfg)
                searches[key[0], key[2]].record(key[1], max_phi_beta(outcomes[key]) > PHI_STAR)
        pending = [key for key in pending if key not in outcomes]
        if not pending:
            if any(s.pending() for s in searches.values()):
                continue
            break
        cfgs = [probe_config(preset, *key, root, device=device) for key in pending]
        if print_only:
            print(f"# round {round_}: {len(cfgs)} runs; run them, then this command again for the next round")
            print("\n".join(shlex.join(probe_command(cfg)) for cfg in cfgs))
            return None
        t0 = time.time()
        print(f"round {round_}: {len(cfgs)} probes " + " ".join(f"{c}:K{K}:s{s}" for c, K, s in pending), flush=True)
        for key, rows in zip(pending, run_probes(cfgs, jobs)):
            outcomes[key] = rows
            searches[key[0], key[2]].record(key[1], max_phi_beta(rows) > PHI_STAR)
        print(f"round {round_} done in {time.time() - t0:.0f} s", flush=True)
    results = {key: s.result() for key, s in searches.items()}
    runs = [{"K": K, "seed": seed, "condition": cond, "max_phi_beta": max_phi_beta(rows),
             "min_gen_loss": min(r["gen_loss"] for r in rows), "tau_2gen": tau_2gen(rows)}
            for (cond, K, seed), rows in sorted(outcomes.items())]
    return {"searches": results, "runs": runs}


def probe_command(cfg: train.Config) -> list[str]:
    """The train.py command line that trains exactly this run (for a scheduler): every field of the
    config that differs from the preset's value, and the iterations before train.py's x 1/w."""
    base = train.Config(**train.PRESETS[cfg.preset])
    flags = ["--K", str(cfg.K), "--seed", str(cfg.seed), "--preset", cfg.preset, "--out", cfg.out,
             "--iters", str(cfg.base_iters or cfg.iters)]
    for f in fields(train.Config):
        value = getattr(cfg, f.name)
        if f.name in ("K", "seed", "preset", "out", "iters", "base_iters", "device") or value == getattr(base, f.name):
            continue
        flags += [f"--{f.name.replace('_', '-')}"] + ([] if f.type is bool else [str(value)])
    return [sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "train.py"), *flags]


def tau_histogram(preset: str, root: str, K: int, jobs: int, device: str | None = None) -> list[int | None]:
    """tau_2gen of tau_seeds control runs at one K (Fig. 7b), each followed for tau_iters steps."""
    p = PRESETS[preset]
    where = root if p["tau_iters"] == p["iters"] else os.path.join(root, "tau")  # same runs as the search's: reuse
    cfgs = [probe_config(preset, "control", K, seed, where, iters=p["tau_iters"], device=device) for seed in range(p["tau_seeds"])]
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
    taus = result["tau_2gen"]["tau"]
    reached = [t for t in taus if t is not None]
    never = len(taus) - len(reached)
    edges = np.linspace(0, result["tau_2gen"]["iters"], 11)
    axes[2].hist(reached, bins=edges, color="tab:blue", label="entered 2-Gen")
    width = edges[1] - edges[0]
    axes[2].bar(edges[-1] + width, never, width=width * 0.9, color="tab:orange", label="never (within the run)")
    axes[2].set_xlabel("tau_2gen (step at which phi_beta(2) first exceeds 0.45)")
    axes[2].set_ylabel("seeds")
    axes[2].set_title(f"Fig. 7b: K = {result['tau_2gen']['K']} (about K1*), {len(taus)} seeds")
    axes[2].legend(fontsize=8)
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
    found = search_K1(preset, root, jobs, plan, print_only=args.print_commands, device=device)
    if found is None:
        return
    K1 = {c: [found["searches"][c, s]["K1_star"] for s in seeds] for c, seeds in plan.items()}
    control = [v for v in K1["control"] if v is not None]
    if not control:
        raise ValueError(f"no control seed has K1* inside [{p['lo']}, {p['hi']}]; widen the preset's range")
    K_tau = round(statistics.median(control))
    print(f"searches done in {(time.time() - t0) / 60:.1f} min; K1*: {K1}; tau_2gen at K = {K_tau}", flush=True)
    taus = tau_histogram(preset, root, K_tau, jobs, device)
    result = {"preset": preset, "iters": p["iters"], "N": p["N"], "phi_star": PHI_STAR, "weight": p["weight"],
              "search": {"lo": p["lo"], "hi": p["hi"], "ratio": p["ratio"]},
              "seeds": plan, "K1_star": K1, "bounds": {c: [found["searches"][c, s]["bound"] for s in plan[c]] for c in K1},
              "above": {c: [found["searches"][c, s]["above"] for s in plan[c]] for c in K1},
              "tau_2gen": {"K": K_tau, "iters": p["tau_iters"], "tau": taus}, "runs": found["runs"],
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


def memorized_fraction(chain_rows: list[dict], epsilon: float) -> tuple[list[int], list[float]]:
    """(steps, fraction of chains with Delta^k < epsilon) from a run's per_chain.jsonl rows."""
    rows = sorted(chain_rows, key=lambda r: r["step"])
    return [r["step"] for r in rows], [float(np.mean(np.array(r["delta"]) < epsilon)) for r in rows]


K2_PRESETS = {
    # calibrated on the 2-core CPU (README): the K1* quick setting (N = 64, batch 64, lr 3e-3) with MLPs 8 wide
    # instead of 256. Wider MLPs left 2-Gen whenever the budget allowed: at width 32, Delta tau grew ~140 steps per
    # unit of K up to the end of 3000-, 5000- and 6000-step runs (the wall moved with the budget, log Delta tau
    # concave, no finite K2*). Eight hidden units store few chains: single 3000-4000-step pilots left 2-Gen after
    # 500, 900 and 2600 steps at K = 24, 32, 40 (log Delta tau convex), and sat above it at K = 48 and 56 (gap
    # +0.005, +0.008) and on a plateau at K = 96 (+0.016; K = inf +0.026)
    "quick": dict(N=64, batch=64, lr=3e-3, mlp_width=8, iters=4000, eval_every=100, eval_dense=256, evals=16,
                  eval_train=256, eval_gen=256, per_chain=32, per_chain_tasks=128, Ks=[24, 28, 32, 36, 40, 48], seeds=4,
                  inf_seeds=2, inf_iters=4000),
    # the paper: N = 256; runs long enough to see Delta tau near K2*; 3 models at K = inf for 10^6 steps, scored
    # on 10^4 fixed chains
    "paper": dict(N=256, batch=128, lr=1e-3, iters=1_000_000, eval_every=1000, eval_dense=1024, evals=60,
                  eval_train=1024, eval_gen=1024, per_chain=64, per_chain_tasks=10_000,
                  Ks=[128, 256, 512, 1024, 2048, 4096], seeds=4, inf_seeds=3, inf_iters=1_000_000),
}


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


def analyze_k2(cfgs: list[train.Config]) -> dict:
    """Delta tau per run, medians and intervals per K, the divergence fit, epsilon from the K = inf runs,
    and the memorized fractions with their sigmoid asymptotes, from the runs' metrics. delta_tau[K] holds the
    seeds with a Delta tau (None: still in 2-Gen at the end, censored_after[K] the steps it spent there); a
    seed that never formed the induction head or memorized first is left out of it (its status is in runs)."""
    finite = [c for c in cfgs if c.K != math.inf]
    eps = epsilon_calibration([read_per_chain(c.out)[-1]["delta"] for c in cfgs if c.K == math.inf])
    Ks = sorted({c.K for c in finite})
    runs, dtau, bound, asymptote, curves = [], {K: [] for K in Ks}, {K: [] for K in Ks}, {}, {}
    for c in finite:
        dense = read_metrics(c.out, dense=True)[1]
        value, status = delta_tau(dense)
        if status in ("ok", "censored"):  # a run that never formed the head, or memorized first, has no Delta tau
            dtau[c.K].append(value)
            bound[c.K].append(censored_after(dense))
        steps, fraction = memorized_fraction(read_per_chain(c.out), eps["value"])
        A = fit_sigmoid(steps, fraction)["A"]
        runs.append({"K": c.K, "seed": c.seed, "tau_2gen": tau_2gen(dense), "tau_2mem": tau_2mem(dense),
                     "delta_tau": value, "status": status, "memorized_final": fraction[-1], "memorized_asymptote": A})
        asymptote.setdefault(c.K, []).append(A)
        curves.setdefault(c.K, []).append({"step": steps, "fraction": fraction})
    measured = [K for K in Ks if dtau[K]]
    medians = {K: median_ci(dtau[K]) if dtau[K] else (math.nan,) * 3 for K in Ks}
    fit, fit_offset = divergence_fits(measured, [dtau[K] for K in measured], [bound[K] for K in measured])
    mean_A = [float(np.mean(asymptote[K])) for K in Ks]
    return {"K": Ks, "delta_tau": dtau, "censored_after": bound, "median": {K: medians[K] for K in Ks},
            "median_lower_bound": {K: censored_median(dtau[K], bound[K])[0] for K in measured}, "fit": fit,
            "fit_offset": fit_offset, "epsilon": eps,
            "memorized_asymptote": asymptote, "memorized_zero": extrapolate_zero(Ks, mean_A),
            # the same through the seeds' medians: a sigmoid fitted to a curve still steep at the end can run to A = 1
            "memorized_zero_median": extrapolate_zero(Ks, [float(np.median(asymptote[K])) for K in Ks]),
            "memorized_curves": curves, "runs": runs}


def plot_k2(result: dict, path: str):
    """Fig. 8a (Delta tau against K with the divergence fit, and against K2* - K), Fig. 8b (memorized
    asymptotes against K), Fig. A10 (memorized fraction against step) and the epsilon calibration."""
    fig, axes = plt.subplots(1, 5, figsize=(25, 4.4))
    Ks, fit = result["K"], result["fit"]
    cmap = plt.get_cmap("viridis")
    color = {K: cmap(i / max(len(Ks) - 1, 1)) for i, K in enumerate(Ks)}
    for K in Ks:
        seeds = [v for v in result["delta_tau"][K] if v is not None]
        axes[0].plot([K] * len(seeds), seeds, ".", color="gray", alpha=0.6)
        med, lo, hi = result["median"][K]
        if math.isfinite(med):
            axes[0].errorbar(K, med, yerr=[[med - lo], [min(hi, 10 * med) - med]], fmt="o", color="k", capsize=3)
        elif K in result["median_lower_bound"]:  # longer than the run: an arrow up from its lower bound (what the fit uses)
            axes[0].annotate("", (K, 2 * result["median_lower_bound"][K]), (K, result["median_lower_bound"][K]),
                             arrowprops=dict(arrowstyle="->", color="k"))
        censored = sum(v is None for v in result["delta_tau"][K])
        if censored:  # still in 2-Gen at the end: Delta tau longer than the run
            axes[0].annotate(f"{censored} in 2-Gen at the end", (K, 0.02), xycoords=("data", "axes fraction"),
                             fontsize=7, ha="center", rotation=90)
    title = "Fig. 8a: time spent in 2-Gen (median, 95% CI)"
    if "exponential_rate" in fit:
        title += f"\nno finite K2*: Delta tau ~ exp({fit['exponential_rate']:.3f} K)"
    elif fit["K2_star"] is None:
        title += "\nno fit: " + fit["why"].split(" (")[0][:70]
    axes[0].set_title(title, fontsize=9)
    if fit["K2_star"] is not None:
        grid = np.linspace(min(Ks), min(fit["K2_star"] * 0.999, max(Ks) * 1.15), 200)  # the axes' range, up to K2*
        curve = divergence(grid, fit["log_a"], fit["K2_star"], fit["gamma"])
        axes[0].plot(grid, curve, "k--", lw=1, label=f"fit: K2* = {fit['K2_star']:.0f}, gamma = {fit['gamma']:.2f}")
        axes[0].axvline(fit["K2_star"], color="tab:red", ls=":", lw=1)
        finite = [K for K in Ks if math.isfinite(result["median"][K][0])]
        axes[1].loglog([fit["K2_star"] - K for K in finite], [result["median"][K][0] for K in finite], "ko")
        x = np.array([fit["K2_star"] - K for K in finite], float)
        axes[1].loglog(x, divergence(fit["K2_star"] - x, fit["log_a"], fit["K2_star"], fit["gamma"]), "k--", lw=1, label=f"slope -gamma = {-fit['gamma']:.2f}")
        axes[1].xaxis.set_minor_formatter(plt.FormatStrFormatter("%g"))  # K2* - K often spans less than a decade
        axes[1].legend(fontsize=8)
    off = result.get("fit_offset", {"K2_star": None})  # JSONs written before the offset fit have none
    if off["K2_star"] is not None:  # the paper's form, with its linear offset
        grid = np.linspace(min(Ks), min(off["K2_star"] * 0.999, max(Ks) * 1.15), 200)
        axes[0].plot(grid, divergence(grid, off["log_a"], off["K2_star"], off["gamma"], off["b"], off["c"]), ":",
                     color="tab:purple", lw=1, label=f"with offset: K2* = {off['K2_star']:.0f}, gamma = {off['gamma']:.2f}")
    axes[0].set_xscale("log", base=2)
    axes[0].set_xlim(min(Ks) / 1.15, max(Ks) * 1.15)  # the arrows and labels of censored K do not autoscale
    shown = [v for K in Ks for v in result["delta_tau"][K] if v] + list(result["median_lower_bound"].values())
    if shown:  # limits set after the log scale, from the values: a linear autoscale's bottom can be <= 0
        axes[0].set_yscale("log")
        axes[0].set_ylim(0.5 * min(shown), 3 * max(shown))  # room for the arrows; a bar to an unbounded CI is cut
    axes[0].set_xlabel("K")
    axes[0].set_ylabel("Delta tau_K = tau_2mem - tau_2gen (steps)")
    if fit["K2_star"] is not None or off["K2_star"] is not None:
        axes[0].legend(fontsize=8, loc="upper left")
    if fit["K2_star"] is None:
        axes[1].text(0.5, 0.5, "no finite K2* to plot against", ha="center", transform=axes[1].transAxes)
    axes[1].set_xlabel("K2* - K")
    axes[1].set_ylabel("median Delta tau_K")
    axes[1].set_title("Fig. 8a inset: the divergence")
    means = [float(np.mean(result["memorized_asymptote"][K])) for K in Ks]
    stds = [float(np.std(result["memorized_asymptote"][K])) for K in Ks]
    axes[2].errorbar(Ks, means, yerr=stds, fmt="ko-", capsize=3)
    zero = result["memorized_zero"]
    if zero is not None:
        top = int(np.argmax(means))
        axes[2].plot([Ks[top], zero], [means[top], 0], "k--", lw=1, label=f"linear in log K: 0 at K = {zero:.0f}")
        axes[2].legend(fontsize=8)
    axes[2].set_xscale("log", base=2)
    axes[2].set_xlabel("K")
    axes[2].set_ylabel("memorized fraction at convergence (sigmoid asymptote)")
    axes[2].set_title("Fig. 8b: fraction of chains memorized")
    for K in Ks:
        curves = result["memorized_curves"][K]
        for c in curves:
            axes[3].plot(np.maximum(c["step"], 1), c["fraction"], color=color[K], lw=0.5, alpha=0.6)
        axes[3].plot(np.maximum(curves[0]["step"], 1), np.mean([c["fraction"] for c in curves], 0), color=color[K], lw=2,
                     label=f"K = {K}")
    axes[3].set_xscale("log")
    axes[3].set_xlabel("step")
    axes[3].set_ylabel(f"fraction with Delta^k < epsilon = {result['epsilon']['value']:.3g}")
    axes[3].set_title("Fig. A10: memorized fraction over training")
    axes[3].legend(fontsize=8)
    eps = result["epsilon"]
    axes[4].hist(eps["scores"], bins=40, color="tab:blue")
    axes[4].axvline(eps["value"], color="tab:red", ls="--", label=f"epsilon = mean - 2 std = {eps['value']:.3g}")
    axes[4].set_xlabel("Delta^k of K = inf models (fixed fresh chains)")
    axes[4].set_ylabel("chains")
    axes[4].set_title(f"epsilon: {len(eps['per_model'])} models at K = inf, mean {eps['mean']:.3g}, std {eps['std']:.3g}")
    axes[4].legend(fontsize=8)
    width = f"MLPs {result['mlp_width']} wide" if result.get("mlp_width") else "MLPs 4 D wide"
    fig.suptitle(f"K2*: transient 2-Gen and partial memorization (preset {result['preset']}, N = {result['N']}, "
                 f"{width}, {result['iters']} steps)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
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
    finite median), and a straight line through the finite medians (slope, and the K where it reaches 0). The runs
    must share their protocol (every setting but K, seed, the directory, the device and what follows from K):
    seeds of different lengths or models pooled into one median would make it meaningless."""
    runs, dtau, bound, first = [], {}, {}, None
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
                     "delta_tau": value, "status": status})
        if status in ("ok", "censored") and cfg["K"] != math.inf:
            dtau.setdefault(cfg["K"], []).append(value)
            bound.setdefault(cfg["K"], []).append(censored_after(dense))
    Ks = sorted(dtau)
    fit, fit_offset = divergence_fits(Ks, [dtau[K] for K in Ks], [bound[K] for K in Ks])
    medians = {K: median_ci(dtau[K]) for K in Ks}  # a bootstrap each: computed once
    finite = [(K, m[0]) for K, m in medians.items() if math.isfinite(m[0])]
    line = None
    if len(finite) >= 2:
        slope, intercept = np.polyfit(*zip(*finite), 1)
        line = {"slope": float(slope), "K_at_zero": float(-intercept / slope) if slope else None}
    return {"runs": sorted(runs, key=lambda r: (r["K"], r["seed"])), "K": Ks, "delta_tau": {K: dtau[K] for K in Ks},
            "median_ci": medians, "fit": fit, "fit_offset": fit_offset, "line": line}


def dtau(args):
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
              **analyze_k2(cfgs),
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
    cli.add_device(p)
    cli.add_jobs(p)
    cli.add_threads(p)
    cli.add_figures(p)
    cli.add_seeds(p, None, "seeds at every K (default: 0-3)")
    p.add_argument("--print-commands", action="store_true", help="print the train.py commands of the unfinished runs and exit")
    p = sub.add_parser("dtau", help="Delta tau_K, its medians and the divergence fit of the runs K*_s*/ in ROOT (any flags)")
    p.add_argument("root", help="a directory of train.py runs with dense rows, e.g. a grid's --out")
    p.add_argument("--json", default=None, help="also write everything to this JSON file")
    args = parser.parse_args()
    cli.set_threads(getattr(args, "threads", None))
    {"k1": k1, "k2": k2, "dtau": dtau}[args.command](args)


if __name__ == "__main__":
    cli.run(main)
