"""Figs. 2b-c, the phase diagram: runs over a grid of K, their divergences to the four predictors and their readouts
against step and K (Sec. "Identifying in-context memorization and generalization regimes"); and any (K, seed) grid
of train.py runs, one run directory per model.

    python sweep.py                                           # the preset's K grid, then figures/fig2bc.png
    python sweep.py --K 64,80,94 --seeds 0-3 --out runs/k1    # a grid (no figure unless --plot)
    python sweep.py --K 64,80 --seeds 0-15 --print-commands   # one train.py command line per model, for a scheduler
    python sweep.py --K 64,80 --seeds 0-1 --ensemble          # on a CPU, one process training an ensemble
    python sweep.py --K 64,80 --seeds 0-15 --resume           # continue a killed grid
    python sweep.py --plot-only --out runs/sweep              # only draw the heat maps from the runs in OUT
    python sweep.py --replot figures/fig2bc.json              # only redraw them from their numbers
    python sweep.py --ledger sweep_paper                      # the paper-scale grid's (campaigns/) from its ledger

Every model is the single run of train.py with its K and seed (`python train.py --K 64 --seed 3` trains the same).
On CUDA the grid trains in one process as ensembles of --group models (runners/grids.py); on a CPU as one-thread
train.py processes, --jobs at a time, unless --ensemble. The heat maps (draw_sweep) are the seeds' means over
(K, step); each K's band is centred on it on the log axis, each step's on its step.
"""
import argparse
import math
import os
import shlex

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import LogNorm

import train
from analysis import runs
from campaigns import records
from campaigns.specs import LEDGERS, grid_records
from plumbing import cli
from plumbing.records import finite_json
from plumbing.rundir import write_json
from plumbing.style import LABELS
from runners import grids

SWEEP_KS = {"quick": [4, 16, 64, 256, 1024], "paper": [2**i for i in range(3, 11)]}
OUT = os.path.join("runs", "sweep")


def make_configs(args: argparse.Namespace) -> list[train.Config]:
    """One Config per (K, seed) of --K (default: the preset's K grid) and --seeds, K-major, each in
    OUT/K<K>_s<seed>."""
    Ks = (cli.parse_list("--K", args.K, inf=True, rule=f"K: integers from 1 to {train.MAX_K}, or inf") if args.K
          else SWEEP_KS[cli.preset(args.preset)])
    return [train.make_config(argparse.Namespace(**{**vars(args), "K": K, "seed": seed,
                                                    "out": os.path.join(args.out, f"K{K}_s{seed}")}))
            for K in Ks for seed in cli.parse_list("--seeds", args.seeds)]


# ----------------------------------------------------------------------------- Figs. 2b-c


def plot_sweep(sweep_dir: str, path: str):
    """Figs. 2b-c from the run directories under sweep_dir: the figure at path, its numbers next to it (.json)."""
    if not os.path.isdir(sweep_dir):
        raise ValueError(f"no sweep directory {sweep_dir} (--out names it; default {OUT})")
    by_K = {}
    for d in runs.run_dirs(sweep_dir):
        cfg, rows = runs.read_metrics(d)
        by_K.setdefault(cfg["K"], []).append((cfg, rows))
    if not by_K:
        raise ValueError(f"no runs with metrics.jsonl under {sweep_dir}")
    summary = sweep_summary(by_K)
    draw_sweep(summary, path)
    write_json(os.path.splitext(path)[0] + ".json", summary)


SWEEP_KEYS = (("kl_1gen", "D(1-Gen)"), ("kl_2gen", "D(2-Gen)"), ("kl_1mem", "D(1-Mem)"), ("kl_2mem", "D(2-Mem)"),
              ("phi_delta_1", "phi_delta (1)"), ("phi_beta_2", "phi_beta (2)"), ("n_A_1", "n_A (1) / N"),
              ("n_A_2", "n_A (2) / N"))


def sweep_summary(by_K: dict) -> dict:
    """Figs. 2b-c's numbers from {K: [(config, full evaluation rows), one per seed]} (run directories, or a
    campaign's ledger): per readout the seeds' mean over (K, step), n_A as a fraction of N. The runs share their
    evaluation steps."""
    Ks = sorted(by_K)
    steps = [r["step"] for r in by_K[Ks[0]][0][1]]
    summary = {"K": Ks, "step": steps}
    for key, _ in SWEEP_KEYS:
        def value(cfg: dict, row: dict) -> float:  # n_A as a fraction of N
            return row[key] / (cfg["N"] if key.startswith("n_A") else 1)

        summary[key] = [[float(np.mean([value(cfg, rows[i]) for cfg, rows in by_K[K]])) for i in range(len(steps))]
                        for K in Ks]
    return summary


def log_edges(centres: list[float]) -> np.ndarray:
    """Cell edges that centre each value on a log axis: geometric midpoints between neighbours, and the outer edges as
    far beyond the first and last as their neighbours' midpoints are (one value: a factor 2 either side)."""
    x = np.log(np.asarray(centres, float))
    if len(x) == 1:
        return np.exp([x[0] - math.log(2), x[0] + math.log(2)])
    mid = (x[1:] + x[:-1]) / 2
    return np.exp(np.concatenate([[x[0] - (mid[0] - x[0])], mid, [x[-1] + (x[-1] - mid[-1])]]))


def draw_sweep(summary: dict, path: str):
    """Figs. 2b-c: the divergence to each predictor and the readouts over (K, step), from sweep_summary's numbers;
    step 0 drawn at step 1/2, so that the log axis can show it."""
    steps = log_edges([max(s, 0.5) for s in summary["step"]])
    Ks = log_edges(summary["K"])
    readouts = {  # the bottom row's titles and colour-bar labels: the paper's symbols, and in words what they measure
        "phi_delta_1": (r"$\phi_\delta^{(1)}$: layer 1, previous state",
                        "layer 1's attention on\nthe previous state (0 to 1)"),
        "phi_beta_2": (r"$\phi_\beta^{(2)}$: layer 2, induction head",
                       "layer 2's attention on the states\nthat followed the current one (0 to 1)"),
        "n_A_1": (r"$n_A^{(1)} / N$: layer 1, positions attended",
                  "layer 1's effective number of\nattended positions / N (0 to 1)"),
        "n_A_2": (r"$n_A^{(2)} / N$: layer 2, positions attended",
                  "layer 2's effective number of\nattended positions / N (0 to 1)")}
    fig, axes = plt.subplots(2, 4, figsize=(19, 8))
    for ax, (key, title) in zip(axes.flat, SWEEP_KEYS):
        values = np.asarray(summary[key], dtype=float)
        if key.startswith("kl"):  # darker = closer to the predictor; each panel's own range, on a log scale
            low, high = max(np.nanmin(values), 1e-4), max(np.nanmax(values), 2e-4)
            im = ax.pcolormesh(steps, Ks, values, cmap="Greys_r", norm=LogNorm(vmin=low, vmax=max(high, 1.01 * low)))
            predictor = LABELS[key.removeprefix("kl_")]
            title = f"{title}: the model's divergence from {predictor}"
            bar = f"D_KL({predictor} || model), nats\n(log; this panel's range; dark: close)"
        else:
            im = ax.pcolormesh(steps, Ks, values, cmap="viridis", vmin=0, vmax=1)
            title, bar = readouts.get(key, (title, title))
        fig.colorbar(im, ax=ax, label=bar)
        ax.set_xscale("log")
        ax.set_yscale("log", base=2)
        ax.set_yticks(summary["K"], [str(K) for K in summary["K"]])
        ax.set_title(title, fontsize=11)
        ax.set_xlabel("training step (log scale; step 0 drawn at 1/2)")
        ax.set_ylabel("K (chains in the training set)")
    fig.suptitle("Figs. 2b-c: the phase diagram over K and training, each cell the seeds' mean. Top (2b): how far the "
                 "model's predictions are from each predictor; bottom (2c): the attention readouts", fontsize=13)
    fig.tight_layout(w_pad=2.5)  # a colour bar's label apart from the next panel's K axis
    fig.savefig(path, dpi=110)
    plt.close(fig)


def ledger_figures(name: str, figures: str = "figures", ledgers: str = LEDGERS) -> dict:
    """--ledger: Figs. 2b, 2c of a sweep campaign, figures/<name>.png and .json, from ledgers/<name>.json alone: the
    seeds trained so far averaged at each K (sweep_summary, draw_sweep)."""
    spec, ledger = records.pieces_of(name, ("sweep",), ledgers)
    by_K = {}
    for m in sorted(grid_records(ledger), key=lambda m: (m["K"], m["seed"])):
        by_K.setdefault(m["K"], []).append((m["config"], m["full"]))
    summary = sweep_summary(by_K)
    cli.writable_dir(figures, "--figures")
    draw_sweep(summary, os.path.join(figures, f"{name}.png"))
    result = {"preset": spec["preset"], "iters": spec["train"]["iters"], **summary,
              "seeds": {K: [cfg["seed"] for cfg, _ in members] for K, members in by_K.items()},
              "pieces": records.stamps(ledger["pieces"], "members")}
    write_json(os.path.join(figures, f"{name}.json"), finite_json(result), indent=1)
    return result


# ----------------------------------------------------------------------------- command line


def main():
    parser = cli.ArgumentParser(description=__doc__.split("\n\n")[0], runs=(
        "Default run: about 30 min on the 2-core development VM (an estimate: five runs, two at a time, as K = 1024 and "
        "16 took 7.9 and 10.7 min as such one-thread processes on 2026-11-27) (quick preset: K = 4, 16, 64, 256, 1024, "
        "seed 0, 2000 steps each); writes runs/sweep/K<K>_s0/ (train.py's files) and runs/sweep/K<K>_s0.log, then "
        "figures/fig2bc.png and figures/fig2bc.json.\n--replot: seconds, trains nothing."))
    parser.add_argument("--K", default=None, help=f"Ks and ranges: 64,80,94 or 16-20; inf: fresh chains (default: "
                        f"quick {SWEEP_KS['quick']}, paper 8..1024, and then the heat maps)")
    cli.add_seeds(parser, "0", "model seeds, one run each")
    train.add_run_flags(parser)
    cli.add_jobs(parser)
    cli.add_figures(parser)
    parser.add_argument("--ensemble", action="store_true", help="train the grid as one-process ensembles on a CPU too")
    parser.add_argument("--group", type=cli.at_least(1), default=64, help="models per ensemble")
    parser.add_argument("--print-commands", action="store_true", help="print one train.py command per model and exit")
    parser.add_argument("--plot", action="store_true", help="draw FIGURES/fig2bc.png after a grid given by --K too")
    parser.add_argument("--plot-only", action="store_true", help="only draw the heat maps from the runs in OUT")
    cli.add_replot(parser, "FIGURES/fig2bc.json", "the heat maps from their numbers")
    parser.add_argument("--ledger", default=None, metavar="CAMPAIGN", help="only draw a paper-scale sweep campaign's "
                        "heat maps, FIGURES/CAMPAIGN.png and .json, from ledgers/CAMPAIGN.json (e.g. sweep_paper)")
    args = parser.parse_args()
    if args.replot is not None:
        cli.replot(args, "fig2bc.json", ("K", "step") + tuple(k for k, _ in SWEEP_KEYS), "sweep.py", draw_sweep)
        return
    if args.ledger is not None:
        ledger_figures(args.ledger, args.figures)
        print(f"wrote {args.figures}/{args.ledger}.png and .json from ledgers/{args.ledger}.json")
        return
    args.out = args.out or OUT
    cli.set_threads(args.threads)
    cfgs = make_configs(args)
    if args.print_commands:
        print("\n".join(shlex.join(c) for c in grids.member_commands(args, cfgs)))
        return
    if args.plot_only and not os.path.isdir(args.out):
        raise ValueError(f"--plot-only: no sweep directory {args.out} (--out names it)")
    plot = args.plot or args.plot_only or not args.K
    if plot:
        cli.writable_dir(args.figures, "--figures")
    if not args.plot_only:
        grids.train_grid(args, cfgs, args.out)
    if plot:
        path = os.path.join(args.figures, "fig2bc.png")
        plot_sweep(args.out, path)
        print(f"wrote {path} and its .json")


if __name__ == "__main__":
    cli.run(main)
