"""The critical data diversity K1* and its kinetic perturbations (Sec. "K1* is determined by a kinetic
competition", Fig. 7a-c; Appendix "Memorization to Generalization Transition", "Task Injection",
"Gradient Reweighting", Fig. A9).

K1* separates the runs that leave the 1-Gen plateau for 1-Mem (K < K1*) from those that form the
statistical induction head and enter 2-Gen (K > K1*). The paper's rule (analysis/thresholds.py): a run is in 2-Gen when
the induction-head order parameter phi_beta(2) exceeds phi_beta* = 0.45, and

    K > K1*  iff  max_{t <= T} phi_beta(2)(t) > phi_beta*        (T = 10^4 steps in the paper)

so K1* is found per seed by a binary search over integer K on nested task sets. tau_2gen, the step at
which phi_beta(2) first exceeds phi_beta*, is bimodal near K1* (Fig. 7b). Two perturbations move K1* by
changing the kinetics of one of the competing circuits (Fig. 7c): gradient reweighting of layer 1's
previous-token attention by w (slower 2-Gen; iterations x 1/w) and task injection (faster 1-Mem).

    python k1.py search                    # quick preset on the CPU: figures/k1.png and .json
    python k1.py search --print-commands   # the paper preset's runs, one command line each
    python k1.py search --replot           # redraw figures/k1.png from figures/k1.json
    python k1.py grid --K 45,64,96         # probes on a fixed (condition, K, seed) grid, no search
    python k1.py grid --replot figures/k1_grid_h100.json   # redraw a grid (this one trained on an H100)
    python k1.py ledger k1_paper           # the paper-scale searches (campaigns/) from ledgers/k1_paper.json

The estimators (the binary search) are in analysis/estimators.py; runners/probes.py schedules the probes,
campaigns/campaign.py the paper-scale ones across GPU leases, whose ledgers `ledger` draws (reweight_paper: Fig. 7c
on a fixed grid at w = 1/10; tau_paper: Fig. 7b over 64 seeds).
"""
import os
import shlex
import statistics
import textwrap
import time

import matplotlib.pyplot as plt
import numpy as np

from analysis.runs import read_metrics
from analysis.thresholds import PHI_STAR, generalizes, grid_brackets, grid_table, k1_runs, tau_2gen
from campaigns import records
from campaigns.specs import LEDGERS, grid_records
from plumbing import cli
from plumbing.records import finite_json
from plumbing.rundir import write_json
from runners.grids import add_grid_flags, grid_args
from runners.probes import (CONDITIONS, K1_PRESETS, finished, probe_command, probe_config, run_probes, search_K1,
                            search_rows)

COLORS = {"control": "k", "reweight": "tab:blue", "inject": "tab:red"}  # the conditions, in every panel
PAPER_K1 = 94  # the paper's K1* at N = 256 (Fig. 7), drawn beside the paper-scale searches


# ----------------------------------------------------------------------------- the search (Figs. 7a-c, A9)


def k1_result(preset: str, p: dict, rows: dict[str, list[dict]], runs: list[dict]) -> dict:
    """The K1* experiment's numbers: per condition each seed's search (rows, search_rows': K1*, None outside [lo, hi],
    its bound, the smallest K that generalized, its bracket), as a campaign's are recorded; the probes' summaries
    `runs` (k1_runs)."""
    return {"preset": preset, "iters": p["iters"], "N": p["N"], "phi_star": PHI_STAR, "weight": p["weight"],
            "search": {"lo": p["lo"], "hi": p["hi"], "ratio": p["ratio"]}, "seeds": rows, "runs": runs}


def tau_histogram(preset: str, root: str, K: int, jobs: int, device: str | None = None) -> list[int | None]:
    """tau_2gen of tau_seeds control runs at one K (Fig. 7b), each followed for tau_iters steps."""
    p = K1_PRESETS[preset]
    where = root if p["tau_iters"] == p["iters"] else os.path.join(root, "tau")  # same runs as the search's: reuse
    cfgs = [probe_config(preset, p, "control", K, seed, where, iters=p["tau_iters"], device=device)
            for seed in range(p["tau_seeds"])]
    return [tau_2gen(rows) for rows in run_probes(cfgs, jobs)]


def draw_phi_beta_and_loss(axes, curves: list[tuple], phi_star: float, loss_label: str):
    """Figs. 7a and A9 on axes[0] and axes[1]: one line per seed, curves [(x, its max_t phi_beta(2), its L_gen, the
    line's style)], and the rule's threshold phi_beta* dashed across Fig. 7a."""
    for x, phi_beta, gen_loss, style in curves:
        axes[0].plot(x, phi_beta, **style)
        axes[1].plot(x, gen_loss, **style)
    axes[0].axhline(phi_star, color="gray", ls="--", lw=1, label=f"phi_beta* = {phi_star}")
    axes[0].set_ylabel("max_t phi_beta(2)")
    axes[1].set_ylabel(loss_label)


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


def draw_K1_per_seed(ax, rows: dict[str, list[dict]], result: dict):
    """Fig. 7c on ax: per condition with a probe each seed's K1* (dot), a search that ended outside [lo, hi] as a
    triangle at that edge, one still running as a bar over its bracket so far; the median of the K1* found (line)."""
    lo, hi = result["search"]["lo"], result["search"]["hi"]
    ticks, edges = [], set()
    begun = {cond: seeds for cond, seeds in rows.items() if any(r["probes"] for r in seeds)}  # the others: no column
    for i, (cond, seeds) in enumerate(begun.items()):
        started = [r for r in seeds if r["probes"]]
        xs = i + np.linspace(-0.2, 0.2, len(started)) if len(started) > 1 else [i]
        for x, r in zip(xs, started):
            if r["K1_star"] is not None:
                ax.plot(x, r["K1_star"], "o", color=COLORS[cond])
            elif r["done"]:  # outside the searched range: drawn at its edge
                edges.add(r["bound"])
                ax.plot(x, lo if r["bound"] == "below" else hi, "v" if r["bound"] == "below" else "^",
                        color=COLORS[cond], mfc="none")
            else:
                below, above = r["bracket"]
                ax.vlines(x, below or lo / 1.3, above or hi * 1.3, color=COLORS[cond], lw=2, alpha=0.5)
        found = [r["K1_star"] for r in started if r["K1_star"] is not None]
        if found:
            ax.hlines(statistics.median(found), i - 0.3, i + 0.3, color=COLORS[cond])
        ended, waiting = sum(r["done"] for r in seeds), len(seeds) - len(started)
        ticks.append((f"{cond}\n(w = {result['weight']})" if cond == "reweight" else cond)
                     + ("" if ended == len(seeds) else f"\n{ended} ended, {len(started) - ended} running"
                        + (f", {waiting} not started" if waiting else "")))
    if "above" in edges:
        ax.plot([], [], "^", color="gray", mfc="none", label=f"K1* >= {hi}: no 2-Gen even at K = {hi}")
    if "below" in edges:
        ax.plot([], [], "v", color="gray", mfc="none", label=f"K1* < {lo}: 2-Gen already at K = {lo}")
    if result["preset"] == "paper":
        ax.axhline(PAPER_K1, color="gray", ls=":", lw=1, label=f"the paper's K1* ~ {PAPER_K1}")
    ax.set_xticks(range(len(ticks)), ticks, fontsize=9)
    ax.set_xlim(-0.5, len(ticks) - 0.5)
    ax.set_yscale("log", base=2)
    ax.set_ylim(lo / 1.3, hi * 1.3)
    ax.set_ylabel("K1* (dot) or its bracket so far (bar)")
    ax.set_title("Fig. 7c: K1* per seed and condition (line: median)")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8, loc="lower right")


def plot_search(result: dict, path: str):
    """Figs. 7a and A9 (max_t phi_beta(2) and min_t L_gen against K - K1*, each seed shifted by its own K1* as in the
    paper), Fig. 7b (tau_2gen near K1*) where the result holds it, and Fig. 7c (draw_K1_per_seed). result: a search's
    (k1_result, with "tau_2gen") or a campaign's (records.k1_search). A condition with no curve is named in Fig. 7a's
    legend, with why: not started, no search ended yet, or K1* outside the searched range."""
    rows = result["seeds"]
    tau = result.get("tau_2gen")  # a campaign's tau_2gen histogram is a campaign of its own (draw_tau)
    fig, axes = plt.subplots(1, 4 if tau else 3, figsize=(20 if tau else 15, 4.6))
    curves, missing = [], []
    for cond, seeds in rows.items():
        shifted = [r for r in seeds if r["K1_star"] is not None]
        if shifted:
            axes[0].plot([], [], color=COLORS[cond], label=cond)
        else:
            missing.append(f"{cond}: " + ("not started" if not any(r["probes"] for r in seeds) else
                                          "no K1* in range" if all(r["done"] for r in seeds) else "no search ended"))
        for r in shifted:
            rs = sorted((p for p in result["runs"] if p["condition"] == cond and p["seed"] == r["seed"]),
                        key=lambda p: p["K"])
            curves.append(([p["K"] - r["K1_star"] for p in rs], [p["max_phi_beta"] for p in rs],
                           [p["min_gen_loss"] for p in rs],
                           dict(color=COLORS[cond], marker=".", lw=1, alpha=0.8 if cond == "control" else 0.5)))
    draw_phi_beta_and_loss(axes, curves, result["phi_star"], "min_t L_gen")
    shifts = [x for c in curves for x in c[0]]
    for ax in axes[:2]:
        ax.axvline(0.5, color="gray", ls=":", lw=1)
        ax.set_xscale("symlog", linthresh=8)
        ticks = [t for t in (-1000, -100, -10, 0, 10, 100, 1000) if shifts and min(shifts) <= t <= max(shifts)]
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.set_xlabel("K - K1* (each seed shifted by its own K1*)")
    axes[0].set_title("Fig. 7a: the induction head appears above K1*")
    axes[1].set_title("Fig. A9: generalization loss drops above K1*")
    axes[0].legend(fontsize=8, title="; ".join(missing) or None, title_fontsize=8)
    if tau:
        draw_tau_histogram(axes[2], tau["tau"], tau["iters"], tau["K"])
    draw_K1_per_seed(axes[-1], rows, result)
    done = sum(r["done"] for seeds in rows.values() for r in seeds)
    total = sum(len(seeds) for seeds in rows.values())
    fig.suptitle(f"K1* per seed: max phi_beta(2) > {result['phi_star']} within {result['iters']} steps (preset "
                 f"{result['preset']}, N = {result['N']}); {done}/{total} searches ended, {len(result['runs'])} probes",
                 fontsize=14)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def k1(args):
    """The `search` command: a K1* search per (condition, seed) (Fig. 7a's criterion, analysis/thresholds.py), then
    tau_2Gen's histogram at the control's median K1* (Fig. 7b); figures/k1.png and .json (--replot: from the JSON)."""
    if args.replot is not None:  # Figs. 7a-c, A9 from the JSON a search wrote
        cli.replot(args, "k1.json", ("seeds", "runs", "tau_2gen", "search", "phi_star"), "k1.py search", plot_search)
        return
    preset, root, p, jobs, device, seeds = grid_args(args, K1_PRESETS, "k1")
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
    rows = search_rows(found["searches"])
    K1 = {c: [r["K1_star"] for r in seeds] for c, seeds in rows.items()}
    control = [v for v in K1["control"] if v is not None]
    if not control:
        raise ValueError(f"no control seed has K1* inside [{p['lo']}, {p['hi']}]; widen the preset's range")
    K_tau = round(statistics.median(control))
    print(f"searches done in {(time.time() - t0) / 60:.1f} min; K1*: {K1}; tau_2gen at K = {K_tau}", flush=True)
    taus = tau_histogram(preset, root, K_tau, jobs, device)
    result = {**k1_result(preset, p, rows, k1_runs(found["outcomes"])),
              "tau_2gen": {"K": K_tau, "iters": p["tau_iters"], "tau": taus},
              "minutes_this_call": round((time.time() - t0) / 60, 1)}  # finished probes are reused, not timed
    plot_search(result, os.path.join(args.figures, "k1.png"))
    write_json(os.path.join(args.figures, "k1.json"), result, indent=1)
    for c in K1:
        print(f"K1* {c}: {K1[c]} (median {statistics.median([v for v in K1[c] if v is not None] or [float('nan')])})")
    print(f"tau_2gen at K = {K_tau}: {taus}")
    print(f"wrote {args.figures}/k1.png and k1.json in {result['minutes_this_call']} min")


# ----------------------------------------------------------------------------- a fixed grid (Figs. 7a, A9; 7c per seed)


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


def plot_grid(tables: dict[str, dict], title: str, path: str, loss_label: str, brackets: dict[str, dict]):
    """Figs. 7a / A9 of a fixed grid, one table (grid_table's) per condition: max phi_beta(2) and L_gen (loss_label
    says which) against K, one line per seed (one condition: a colour per seed; several: a colour per condition, a
    marker per seed), each seed drawn at the K it has (a grid still being trained lacks some); Fig. 7c per seed from
    brackets ({condition: {seed: grid_brackets' [lo, hi]}}): the interval of K that holds each seed's K1*."""
    Ks = sorted({K for table in tables.values() for K in table})
    fig, axes = plt.subplots(1, 3, figsize=(15, 3.8))
    markers, curves = ".osd^v", []
    for c, (condition, table) in enumerate(tables.items()):
        for i, seed in enumerate(sorted({s for row in table.values() for s in row["seed"]})):
            at = [(K, table[K]["seed"].index(seed)) for K in sorted(table) if seed in table[K]["seed"]]
            color, marker = (f"C{i}", ".") if len(tables) == 1 else (f"C{c}", markers[i % len(markers)])
            label = f"seed {seed}" if len(tables) == 1 else f"{condition}, seed {seed}"
            curves.append(([K for K, _ in at], [table[K]["max_phi_beta"][j] for K, j in at],
                           [table[K]["gen_loss"][j] for K, j in at],
                           dict(marker=marker, ls="-", color=color, label=label)))
    draw_phi_beta_and_loss(axes, curves, PHI_STAR, loss_label)
    level = {K: table[K]["gen_loss_2gen"] for table in tables.values() for K in table}
    axes[1].plot(Ks, [level[K] for K in Ks], "k:", label="2-Gen")
    for ax in axes[:2]:
        ax.set_xscale("log", base=2)
        ax.set_xticks(Ks, [str(K) for K in Ks])
        ax.set_xlabel("K")
        ax.legend(fontsize=7)
    axes[0].set_title("Fig. 7a: the induction head forms above K1*", fontsize=10)
    axes[1].set_title("Fig. A9: L_gen drops to 2-Gen above K1*", fontsize=10)
    draw_brackets(axes[2], brackets, Ks)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def grid_title(result: dict) -> str:
    """A grid's figure title: its protocol, and where a grid trained elsewhere ("source": the summary it was read
    from) ran."""
    title = f"K1* on a fixed grid (preset {result['preset']}, N = {result['N']}, {result['iters']} steps"
    if "reweight" in result["table"]:
        title += f"; reweight: w = {result['weight']:g}, x {1 / result['weight']:g} steps"
    title += ")"
    if "source" in result:
        title += "\n" + textwrap.fill(f"trained on {result['device']}: {result['command']}", 150)
    return title


def plot_grid_record(result: dict, path: str):
    """Figs. 7a, A9 and 7c per seed from a grid's JSON (k1_grid's; `grid --replot`)."""
    tables = {c: {int(K): row for K, row in table.items()} for c, table in result["table"].items()}
    plot_grid(tables, grid_title(result), path, result["loss"], result["brackets"])


def k1_grid(args):
    """K1* probes on a fixed (condition, K, seed) grid, no search: per run max phi_beta(2), min L_gen and
    tau_2gen; per condition and seed the bracket of K1* the grid gives (Fig. 7a and, per seed, Fig. 7c). --replot:
    the figure from the JSON a grid wrote."""
    if args.replot is not None:
        cli.replot(args, f"{args.name}.json", ("table", "brackets", "preset", "N", "iters", "loss"), "k1.py grid",
                   plot_grid_record)
        return
    if args.K is None:
        raise ValueError("--K: the grid's K are required, e.g. --K 45,64,96 (or --replot to redraw a grid's JSON)")
    preset, root, p, jobs, device, seeds = grid_args(args, K1_PRESETS, "k1grid")
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
    result = finite_json({"preset": preset, "N": p["N"], "iters": p["iters"], "weight": weight, "K": Ks, "seeds": seeds,
                          "runs": probes, "table": tables, "brackets": {c: grid_brackets(t) for c, t in tables.items()},
                          "loss": "min_t L_gen", "minutes_this_call": round((time.time() - t0) / 60, 1)})
    plot_grid_record(result, os.path.join(args.figures, f"{args.name}.png"))
    write_json(os.path.join(args.figures, f"{args.name}.json"), result, indent=1)
    for c in conditions:
        for K, row in tables[c].items():
            taus = [r["tau_2gen"] for r in probes if r["condition"] == c and r["K"] == K]
            print(f"{c} K = {K}: max phi_beta(2) {[round(v, 3) for v in row['max_phi_beta']]}, tau_2gen {taus}, "
                  f"head in {row['heads']}/{len(row['seed'])}")
        print(f"{c}: K1* brackets per seed {result['brackets'][c]}")
    print(f"wrote {args.figures}/{args.name}.png and .json in {result['minutes_this_call']} min")


# ----------------------------------------------------------------------------- the paper-scale campaigns' figures


def campaign_grid(spec: dict, rows: list[dict]) -> dict:
    """A reweighting campaign's fixed grid (Fig. 7c at w = 1/10) as `grid` writes one: per condition trained so far its
    table (grid_table) and each seed's K1* bracket (grid_brackets). rows: campaigns.records.grid_runs."""
    tables = {c: grid_table([r for r in rows if r["condition"] == c]) for c in spec["conditions"]
              if any(r["condition"] == c for r in rows)}
    return {"preset": spec["preset"], "N": spec["train"]["N"], "iters": spec["train"]["iters"],
            "weight": spec["train"]["weight"], "K": spec["Ks"], "seeds": spec["seeds"], "loss": "L_gen at the end",
            "table": tables, "brackets": {c: grid_brackets(t) for c, t in tables.items()}, "runs": rows}


def draw_tau(spec: dict, rows: list[dict], members: list[dict], path: str) -> dict:
    """Fig. 7b from a tau campaign: the seeds' tau_2gen at one K in tau_bins, those that never entered 2-Gen counted
    apart (draw_tau_histogram); beside it every seed's phi_beta(2) against step. rows: records.grid_runs; members:
    the ledger's runs (their dense readouts)."""
    taus = [r["tau_2gen"] for r in rows]
    K, iters = spec["Ks"][0], rows[0]["iters"]
    edges = tau_bins(iters)
    counts = np.histogram([t for t in taus if t is not None], edges)[0]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    draw_tau_histogram(axes[0], taus, iters, K)
    for m in sorted(members, key=lambda m: m["seed"]):
        reached = tau_2gen(m["dense"]) is not None
        axes[1].plot([r["step"] for r in m["dense"]], [r["phi_beta_2"] for r in m["dense"]], lw=0.6, alpha=0.6,
                     color="tab:blue" if reached else "tab:orange")
    axes[1].axhline(PHI_STAR, color="gray", ls="--", lw=1)
    axes[1].set_xlabel("step")
    axes[1].set_ylabel("phi_beta(2)")
    axes[1].set_title("each seed (blue: entered 2-Gen, orange: never)")
    fig.suptitle(f"tau_2gen at K = {K}, N = {spec['train']['N']}, {iters} steps, phi_beta(2) every "
                 f"{spec['train']['eval_every']} steps on {spec['train']['eval_dense']} sequences", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return {"preset": spec["preset"], "K": K, "iters": iters, "N": spec["train"]["N"], "phi_star": PHI_STAR,
            "seed": [r["seed"] for r in rows], "tau_2gen": taus, "max_phi_beta": [r["max_phi_beta"] for r in rows],
            "bins": edges.tolist(), "counts": counts.tolist(), "never": sum(t is None for t in taus)}


def ledger_figures(name: str, figures: str = "figures", ledgers: str = LEDGERS) -> dict:
    """The `ledger` command: a K1* campaign's figures/<name>.png and figures/<name>.json from ledgers/<name>.json
    alone; returns what the JSON holds."""
    spec, ledger = records.pieces_of(name, ("k1", "reweight", "tau"), ledgers)
    cli.writable_dir(figures, "--figures")
    if spec["kind"] == "k1":
        result = records.k1_search(spec, ledger)
        plot_search(result, os.path.join(figures, f"{name}.png"))
    elif spec["report"] == "reweight":
        result = {**campaign_grid(spec, records.grid_runs(ledger)), "pieces": records.stamps(ledger["pieces"], "members")}
        plot_grid_record(result, os.path.join(figures, f"{name}.png"))
    else:
        result = {**draw_tau(spec, records.grid_runs(ledger), grid_records(ledger), os.path.join(figures, f"{name}.png")),
                  "pieces": records.stamps(ledger["pieces"], "members")}
    write_json(os.path.join(figures, f"{name}.json"), finite_json(result), indent=1)
    return result


def ledger(args):
    """The `ledger` command: ledger_figures, and where it wrote."""
    ledger_figures(args.campaign, args.figures, args.ledgers)
    print(f"wrote {args.figures}/{args.campaign}*.png and {args.campaign}.json from {args.ledgers}/{args.campaign}.json")


# ----------------------------------------------------------------------------- the command line


def add_search(sub):
    """k1.py search (k1): its flags."""
    p = sub.add_parser("search", help="K1* per seed for control, gradient reweighting and task injection (Fig. 7, A9)",
                       runs="Default run: 31 min 39 s from a fresh clone on the 2-core development VM, its cores "
                            "otherwise idle (2026-11-26) (quick preset: K1* searched in K = 16..256 for 4 control seeds "
                            "and 2 each with reweighting, w = 1/2, and injection; N = 64, 1200 steps a probe; tau_2gen "
                            "over 6 seeds); writes figures/k1.png and figures/k1.json, and the probes' runs "
                            "runs/k1_quick/<condition>/K<K>_s<seed>/ (config.json, metrics.jsonl, ckpt.pt, "
                            "model_<step>.pt).\n--replot: seconds, trains nothing.")
    cli.add_preset(p, K1_PRESETS, "quick: calibrated on the CPU, N = 64, 1200 steps; paper: N = 256, 10^4 steps, needs a GPU")
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
    cli.add_replot(p, "FIGURES/k1.json", "Figs. 7a-c, A9 (k1.png)")


def add_grid(sub):
    """k1.py grid (k1_grid): its flags."""
    p = sub.add_parser("grid", help="K1* probes on a fixed (condition, K, seed) grid, no search (Fig. 7a, 7c per seed)",
                       runs="Default run: none, --K is required; about 8 min per K on the 2-core development VM (an "
                            "estimate from search's 31 min 39 s for 34 probes, ~1.4 min of one core per 1200 steps: a K "
                            "is 4 control probes and 4 reweighted ones, w = 1/2, of twice the steps, two at a time) "
                            "(quick preset); writes figures/k1_grid.png and figures/k1_grid.json (--name), and the runs "
                            "runs/k1grid_quick_w0.5/<condition>/K<K>_s<seed>/ (as search's).\n--replot: seconds, "
                            "trains nothing.")
    cli.add_preset(p, K1_PRESETS, "the K1* presets (quick: N = 64, 1200 steps; paper: N = 256, 10^4 steps, needs a GPU)")
    p.add_argument("--K", default=None, help="the grid's K, e.g. 45,64,96 (required unless --replot)")
    p.add_argument("--conditions", default="control,reweight", help="comma-separated subset of control, reweight, inject")
    p.add_argument("--weight", type=float, default=None, help="reweight's w (default: the preset's; the paper: 0.1)")
    p.add_argument("--root", default=None, help="where the probes' runs go (default runs/k1grid_<preset>_w<w>)")
    p.add_argument("--name", default="k1_grid", help="the figure's name: FIGURES/NAME.png and .json")
    add_grid_flags(p, "seeds at every K (default: the preset's control seeds)")
    cli.add_replot(p, "FIGURES/NAME.json", "Figs. 7a, A9 and 7c per seed (NAME.png)")


def add_ledger(sub):
    """k1.py ledger (ledger): its flags."""
    p = sub.add_parser("ledger", help="Figs. 7a-c, A9 at the paper's scale from a campaign's ledger (campaigns/)",
                       runs="Default run: none, the campaign is required; about 5 s on the 2-core development VM (an "
                            "estimate: a process's imports, ~4 s there by tests/stand_ins.py, and one figure), trains "
                            "nothing; writes figures/<campaign>.png and "
                            "figures/<campaign>.json from ledgers/<campaign>.json.")
    p.add_argument("campaign", help="k1_paper (the searches), reweight_paper (Fig. 7c's grid) or tau_paper (Fig. 7b)")
    p.add_argument("--ledgers", default=LEDGERS, help="where the ledgers are (default ledgers/)")
    cli.add_figures(p)


def main():
    parser = cli.ArgumentParser(description=__doc__.split("\n\n")[0], runs=(
        "Default run: k1.py search, 31 min 39 s from a fresh clone on the 2-core development VM (2026-11-26); writes "
        "figures/k1.png and figures/k1.json and its probes' runs under runs/k1_quick/ (grid, ledger: their --help)."))
    sub = parser.add_subparsers(dest="command", required=True)
    add_search(sub)
    add_grid(sub)
    add_ledger(sub)
    args = parser.parse_args()
    cli.set_threads(getattr(args, "threads", None))
    {"search": k1, "grid": k1_grid, "ledger": ledger}[args.command](args)


if __name__ == "__main__":
    cli.run(main)
