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

    python thresholds.py k1                    # quick preset on the CPU: figures/k1.png and .json
    python thresholds.py k1 --print-commands   # the paper preset's runs, one command line each
"""
import argparse
import json
import math
import os
import shlex
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import matplotlib.pyplot as plt
import numpy as np
import torch

import cli
import train
from markov import check_int

PHI_STAR = 0.45  # phi_beta*: the induction-head threshold


# ----------------------------------------------------------------------------- the rule and the search


def max_phi_beta(rows: list[dict], iters: int | None = None) -> float:
    """max over the evaluation rows with step <= iters (all rows if None) of phi_beta(2)."""
    values = [r["phi_beta_2"] for r in rows if iters is None or r["step"] <= iters]
    if not values:
        raise ValueError("no evaluation rows to read phi_beta(2) from")
    return max(values)


def tau_2gen(rows: list[dict], phi_star: float = PHI_STAR) -> int | None:
    """tau_2gen: the first evaluation step at which phi_beta(2) > phi_star (None: never within the run)."""
    return next((r["step"] for r in sorted(rows, key=lambda r: r["step"]) if r["phi_beta_2"] > phi_star), None)


@dataclass
class Search:
    """Binary search over integers for K1* = the largest K in [lo, hi] whose run does not generalize,
    assuming that the outcome is monotone in K (no 2-Gen up to K1*, 2-Gen above).

    Driven from outside so that the searches of many seeds advance in lockstep, each round's runs
    trained together: `pending()` is what to run next (lo and hi first, then one midpoint a round),
    `record(K, generalizes)` takes an outcome, `result()` the answer."""

    lo: int
    hi: int
    ratio: float = 1.0  # stop once above / below <= ratio (1: down to neighbouring integers, the paper's search)
    probes: dict = field(default_factory=dict)  # K -> generalizes

    def __post_init__(self):
        if not 1 <= self.lo < self.hi:
            raise ValueError(f"the search needs 1 <= lo < hi, got lo = {self.lo}, hi = {self.hi}")
        if not self.ratio >= 1:
            raise ValueError(f"the search's stopping ratio must be >= 1, got {self.ratio}")

    def pending(self) -> list[int]:
        ends = [K for K in (self.lo, self.hi) if K not in self.probes]
        if ends:
            return ends
        if self.probes[self.lo] or not self.probes[self.hi]:
            return []  # K1* is outside [lo, hi]
        below = max(K for K, up in self.probes.items() if not up)
        above = min(K for K, up in self.probes.items() if up)
        if above - below <= 1 or above <= self.ratio * below:
            return []
        return [min(max(round(math.sqrt(below * above)), below + 1), above - 1)]  # bisect in log K

    def record(self, K: int, generalizes: bool):
        self.probes[K] = bool(generalizes)

    def result(self) -> dict:
        """{"K1_star": the largest K that did not generalize, "above": the smallest that did, "bound", "probes":
        {K: bool}}; bound is None, or "below" when the run at lo already generalizes (K1* < lo), "above" when
        the run at hi does not (K1* >= hi), and then K1_star and above are None."""
        if self.pending():
            raise ValueError("the search is not finished")
        probes = dict(sorted(self.probes.items()))
        if probes[self.lo]:
            return {"K1_star": None, "above": None, "bound": "below", "probes": probes}
        if not probes[self.hi]:
            return {"K1_star": None, "above": None, "bound": "above", "probes": probes}
        below = max(K for K, up in probes.items() if not up)
        return {"K1_star": below, "above": min(K for K, up in probes.items() if up), "bound": None, "probes": probes}


def search_threshold(generalizes: Callable[[int], bool], lo: int, hi: int, ratio: float = 1.0) -> dict:
    """One search run to the end with a function K -> generalizes (tests, and a single seed)."""
    search = Search(lo, hi, ratio)
    while todo := search.pending():
        for K in todo:
            search.record(K, generalizes(K))
    return search.result()


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


def probe_config(preset: str, condition: str, K: int, seed: int, root: str, iters: int | None = None) -> train.Config:
    """The train.py run of one probe, in root/<condition>/K<K>_s<seed> (through train.make_config, so the
    reweighting's x 1/w budget and every check are the command line's)."""
    p = PRESETS[preset]
    flags = {k: p[k] for k in ("N", "batch", "lr", "iters", "eval_every", "eval_dense", "evals", "eval_train", "eval_gen")}
    flags.update(preset="quick" if preset == "quick" else "paper", K=K, seed=seed, out=os.path.join(root, condition, f"K{K}_s{seed}"))
    if iters is not None:
        flags["iters"] = iters
    if condition == "reweight":
        flags["prev_weight"] = p["weight"]
    elif condition == "inject":
        flags["task_injection"] = True
    elif condition != "control":
        raise ValueError(f"unknown condition {condition!r}; conditions are {', '.join(CONDITIONS)}")
    return train.make_config(argparse.Namespace(**flags))


def finished(cfg: train.Config) -> bool:
    path = os.path.join(cfg.out, "metrics.jsonl")
    return os.path.exists(path) and any(r["step"] == cfg.iters for r in train.read_metrics(cfg.out, dense=True)[1])


def run_probe(cfg: train.Config) -> list[dict]:
    """The probe's dense rows, training it first unless it already finished (a killed search redoes nothing
    that is done; a probe killed midway resumes from its checkpoint)."""
    if not finished(cfg):
        train.train(cfg, resume=os.path.exists(os.path.join(cfg.out, "ckpt.pt")), quiet=True)
    return train.read_metrics(cfg.out, dense=True)[1]


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
            train.train_ensemble(group, os.path.join(root, f"ckpt_round{i}.pt"), quiet=True)
    elif todo:
        cli.parallel_map(run_probe, todo, jobs)
    return [run_probe(cfg) for cfg in cfgs]


# ----------------------------------------------------------------------------- the K1* experiment


def search_K1(preset: str, root: str, jobs: int, plan: dict[str, int], print_only: bool = False) -> dict | None:
    """The binary searches of plan's conditions, plan[condition] seeds each, advanced in lockstep: each round
    trains the pending probes of all searches together. print_only: print the next round's train.py
    commands and return None."""
    p = PRESETS[preset]
    searches = {(cond, seed): Search(p["lo"], p["hi"], p["ratio"]) for cond, n in plan.items() for seed in range(n)}
    outcomes = {}  # (condition, K, seed) -> dense rows
    for round_ in range(1, 100):
        pending = [(cond, K, seed) for (cond, seed), s in searches.items() for K in s.pending()]
        for key in pending:  # finished probes are read back without training
            cfg = probe_config(preset, *key, root)
            if finished(cfg):
                outcomes[key] = run_probe(cfg)
                searches[key[0], key[2]].record(key[1], max_phi_beta(outcomes[key]) > PHI_STAR)
        pending = [key for key in pending if key not in outcomes]
        if not pending:
            if any(s.pending() for s in searches.values()):
                continue
            break
        cfgs = [probe_config(preset, *key, root) for key in pending]
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
    """The train.py command line that trains exactly this probe (for a scheduler)."""
    flags = ["--K", str(cfg.K), "--seed", str(cfg.seed), "--preset", cfg.preset, "--out", cfg.out]
    for name in ("N", "batch", "lr", "eval_every", "eval_dense", "evals", "eval_train", "eval_gen"):
        flags += [f"--{name.replace('_', '-')}", str(getattr(cfg, name))]
    flags += ["--iters", str(cfg.base_iters or cfg.iters)]  # train.py applies the x 1/w itself
    if cfg.prev_weight != 1:
        flags += ["--prev-weight", str(cfg.prev_weight)]
    if cfg.task_injection:
        flags += ["--task-injection"]
    return [sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "train.py"), *flags]


def tau_histogram(preset: str, root: str, K: int, jobs: int) -> list[int | None]:
    """tau_2gen of tau_seeds control runs at one K (Fig. 7b), each followed for tau_iters steps."""
    p = PRESETS[preset]
    where = root if p["tau_iters"] == p["iters"] else os.path.join(root, "tau")  # same runs as the search's: reuse
    cfgs = [probe_config(preset, "control", K, seed, where, iters=p["tau_iters"]) for seed in range(p["tau_seeds"])]
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


def k1(args):
    preset, root = args.preset, args.root or os.path.join("runs", f"k1_{args.preset}")
    p = PRESETS[preset]
    jobs = check_int("--jobs", args.jobs, 1)
    if preset == "paper" and not torch.cuda.is_available() and not args.print_commands:
        raise ValueError("the paper preset needs a GPU (ensembles); without one, --print-commands prints the runs")
    conditions = args.conditions.split(",")
    if "control" not in conditions or set(conditions) - set(CONDITIONS) or len(set(conditions)) < len(conditions):
        raise ValueError(f"--conditions: distinct names among {', '.join(CONDITIONS)}, control included; got {args.conditions!r}")
    seeds = check_int("--seeds", args.seeds if args.seeds is not None else p["seeds"], 1)
    perturbed = check_int("--perturbed-seeds", args.perturbed_seeds if args.perturbed_seeds is not None
                          else p["perturbed_seeds"], 1)
    plan = {c: seeds if c == "control" else perturbed for c in CONDITIONS if c in conditions}
    t0 = time.time()
    found = search_K1(preset, root, jobs, plan, print_only=args.print_commands)
    if found is None:
        return
    K1 = {c: [found["searches"][c, s]["K1_star"] for s in range(n)] for c, n in plan.items()}
    control = [v for v in K1["control"] if v is not None]
    if not control:
        raise ValueError(f"no control seed has K1* inside [{p['lo']}, {p['hi']}]; widen the preset's range")
    K_tau = round(statistics.median(control))
    print(f"searches done in {(time.time() - t0) / 60:.1f} min; K1*: {K1}; tau_2gen at K = {K_tau}", flush=True)
    taus = tau_histogram(preset, root, K_tau, jobs)
    result = {"preset": preset, "iters": p["iters"], "N": p["N"], "phi_star": PHI_STAR, "weight": p["weight"],
              "search": {"lo": p["lo"], "hi": p["hi"], "ratio": p["ratio"]},
              "K1_star": K1, "bounds": {c: [found["searches"][c, s]["bound"] for s in range(len(K1[c]))] for c in K1},
              "above": {c: [found["searches"][c, s]["above"] for s in range(len(K1[c]))] for c in K1},
              "tau_2gen": {"K": K_tau, "iters": p["tau_iters"], "tau": taus}, "runs": found["runs"],
              "minutes_this_call": round((time.time() - t0) / 60, 1)}  # finished probes are reused, not timed
    os.makedirs("figures", exist_ok=True)
    plot_k1(result, os.path.join("figures", "k1.png"))
    with open(os.path.join("figures", "k1.json"), "w") as f:
        json.dump(result, f, indent=1)
    for c in K1:
        print(f"K1* {c}: {K1[c]} (median {statistics.median([v for v in K1[c] if v is not None] or [float('nan')])})")
    print(f"tau_2gen at K = {K_tau}: {taus}")
    print(f"wrote figures/k1.png and figures/k1.json in {result['minutes_this_call']} min")


def main():
    parser = cli.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("k1", help="K1* per seed for control, gradient reweighting and task injection (Fig. 7, A9)")
    p.add_argument("--preset", choices=sorted(PRESETS), default="quick", help="quick (CPU, calibrated) or paper (GPU)")
    p.add_argument("--root", default=None, help="where the probes' runs go (default runs/k1_<preset>)")
    p.add_argument("--jobs", type=int, default=2, help="CPU: probes trained at a time, one thread each")
    p.add_argument("--conditions", default=",".join(CONDITIONS), help="comma-separated subset, control included")
    p.add_argument("--seeds", type=int, default=None, help="control seeds (default: the preset's, quick 4, paper 16)")
    p.add_argument("--perturbed-seeds", type=int, default=None, help="seeds per perturbation (quick 2, paper 4)")
    p.add_argument("--print-commands", action="store_true",
                   help="print the train.py commands of the next round of probes (for a scheduler) and exit")
    args = parser.parse_args()
    k1(args)


if __name__ == "__main__":
    cli.run(main)
