"""The figures and numbers of campaigns/campaign.py's campaigns, from their ledgers alone (no run directory, no GPU):
one function per kind of report, each returning what figures/<campaign>.json holds and drawing its figures with
the drawing code of the experiment's own module (k1.py, sweep.py, circuits.py, task_vectors.py, train.py).
"""
import os
import statistics

import matplotlib.pyplot as plt
import numpy as np

import circuits
import k1
import sweep
import task_vectors
import train
from analysis import thresholds
from plumbing.rundir import write_json

VOLATILE = ("card", "date", "seconds", "model_steps", "predicted")  # a piece's fields that differ between two identical runs


def stamps(pieces: list[dict], runs_key: str | None = None) -> list[dict]:
    """Each piece's card, date and timings (and how many runs it trained, under runs_key)."""
    return [{k: p.get(k) for k in VOLATILE} | ({runs_key: len(p[runs_key])} if runs_key else {}) for p in pieces]


# ----------------------------------------------------------------------------- K1* searches (k1)

def k1_search(spec: dict, searches: dict, outcomes: dict, pieces: list[dict]) -> dict:
    """Per condition and seed: K1* when its search ended, else the bracket so far; the probes' summaries. searches,
    outcomes: the searches replayed from the ledger (campaign.k1_state)."""
    probe_runs = k1.k1_runs(outcomes)
    seeds = {}
    for (cond, seed), s in searches.items():
        below = [K for K, up in s.probes.items() if not up]
        above = [K for K, up in s.probes.items() if up]
        seeds.setdefault(cond, []).append({
            "seed": seed, "done": not s.pending(), **(s.result() if not s.pending() else {}),
            "bracket": [max(below) if below else None, min(above) if above else None], "probes": len(s.probes)})
    K1 = {c: [r.get("K1_star") for r in rows if r["done"]] for c, rows in seeds.items()}
    p = spec["probe"]
    return {"preset": spec["preset"], "iters": p["iters"], "N": p["N"], "phi_star": thresholds.PHI_STAR,
            "search": {"lo": p["lo"], "hi": p["hi"], "ratio": p["ratio"]}, "seeds": seeds,
            "median_K1_star": {c: statistics.median([v for v in vs if v is not None]) if any(v is not None for v in vs)
                               else None for c, vs in K1.items()},
            "runs": probe_runs, "pieces": stamps(pieces, "probes")}


def plot_k1_campaign(result: dict, path: str):
    """Fig. 7a (max phi_beta(2) against K), A9 (min L_gen against K) per seed, and each seed's K1* or bracket. A
    condition none of whose searches has a probe yet has no legend entry and no column: the figure names it as not
    started."""
    colors = {"control": "k", "reweight": "tab:blue", "inject": "tab:red"}
    started = {c: rows for c, rows in result["seeds"].items() if any(r["probes"] for r in rows)}
    waiting = [f"{c} ({len(rows)} seeds)" for c, rows in result["seeds"].items() if c not in started]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.6))
    for cond in started:
        for seed in sorted({r["seed"] for r in result["runs"] if r["condition"] == cond}):
            rs = sorted((r for r in result["runs"] if r["condition"] == cond and r["seed"] == seed), key=lambda r: r["K"])
            style = dict(color=colors[cond], marker=".", lw=0.8, alpha=0.7)
            axes[0].plot([r["K"] for r in rs], [r["max_phi_beta"] for r in rs], **style)
            axes[1].plot([r["K"] for r in rs], [r["min_gen_loss"] for r in rs], **style)
        axes[0].plot([], [], color=colors[cond], label=cond)
    axes[0].axhline(result["phi_star"], color="gray", ls="--", lw=1, label=f"phi_beta* = {result['phi_star']}")
    for ax, label in ((axes[0], "max_t phi_beta(2)"), (axes[1], "min_t L_gen")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("K")
        ax.set_ylabel(label)
    axes[0].legend(fontsize=9, title=f"not started: {', '.join(waiting)}" if waiting else None, title_fontsize=9)
    axes[0].set_title("Fig. 7a: max phi_beta(2) per probe")
    axes[1].set_title("Fig. A9: min L_gen per probe")
    ax = axes[2]
    ticks = []
    for i, (cond, rows) in enumerate(started.items()):
        drawn = [r for r in rows if r["probes"]]  # a search with no probe yet has nothing to draw
        xs = i + np.linspace(-0.25, 0.25, len(drawn)) if len(drawn) > 1 else [i]
        for x, r in zip(xs, drawn):
            lo, hi = r["bracket"]
            if r["done"] and r.get("K1_star") is not None:
                ax.plot(x, r["K1_star"], "o", color=colors[cond])
            else:  # a search still running (or outside [lo, hi]): its bracket
                ax.vlines(x, lo or result["search"]["lo"] / 1.3, hi or result["search"]["hi"] * 1.3, color=colors[cond],
                          lw=2, alpha=0.5)
        if result["median_K1_star"].get(cond) is not None:
            ax.hlines(result["median_K1_star"][cond], i - 0.3, i + 0.3, color=colors[cond])
        ended = sum(r["done"] for r in rows)
        ticks.append(f"{cond}: {ended} ended, {len(drawn) - ended} running"
                     + (f", {len(rows) - len(drawn)} not started" if len(drawn) < len(rows) else ""))
    ax.axhline(94, color="gray", ls=":", lw=1, label="the paper's K1* ~ 94")
    ax.set_xticks(range(len(ticks)), ticks, fontsize=9)
    ax.set_xlim(-0.5, len(ticks) - 0.5)
    ax.set_yscale("log", base=2)
    ax.set_ylabel("K1* (dot) or its bracket so far (bar)")
    ax.set_title("Fig. 7c: K1* per seed\n(line: median of the ended searches)")
    ax.legend(fontsize=8)
    done = sum(r["done"] for rows in result["seeds"].values() for r in rows)
    total = sum(len(rows) for rows in result["seeds"].values())
    fig.suptitle(f"K1* at the paper's scale (N = {result['N']}, {result['iters']} steps per probe): {done}/{total} "
                 f"searches ended, {len(result['runs'])} probes", fontsize=14)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# ----------------------------------------------------------------------------- circuits and task vectors


def margins(rows: list[dict], phases: dict) -> dict:
    """For each traced phase: the divergence of its checkpoint to the phase's predictor and to the runner-up."""
    out = {}
    for ph, d in phases.items():
        if d.get("step") is None:  # not traced: no checkpoint in the phase
            continue
        row = next(r for r in rows[d["run"]] if r["step"] == d["step"])
        others = {p: row[f"kl_{p}"] for p in ("1gen", "2gen", "1mem", "2mem") if p != ph}
        runner = min(others, key=others.get)
        out[ph] = {"step": d["step"], "run": d["run"], "divergence": row[f"kl_{ph}"], "runner_up": runner,
                   "runner_up_divergence": others[runner], "margin": others[runner] - row[f"kl_{ph}"]}
    return out


def circuit_phases(spec: dict, piece: dict) -> dict:
    """The piece's traced phases under circuits.py's rule, applied today to the ledger's rows: a phase with no checkpoint
    in it is circuits.no_checkpoint's entry, the ledger's trace of it kept apart ("ledger_trace", not drawn); a phase
    traced at another checkpoint than the rule's keeps its trace, with the rule's checkpoint and a note saying so.
    circuit: the figure's edges, chosen once (circuits.circuit_edges)."""
    named = {run: f"K{spec['Ks'][run]}" for run in piece["runs"]}
    rows = {named[run]: piece["runs"][run]["rows"] for run in piece["runs"]}
    phases = {}
    for ph, d in piece["phases"].items():
        traced = {**d, "run": named.get(d["run"], d["run"])}
        if "importance" in d:
            row = next(r for r in rows[traced["run"]] if r["step"] == d["step"])
            ratio, margin = circuits.closeness(row, ph)
            traced.update(ratio=ratio, margin=margin, circuit=circuits.circuit_edges(d["importance"]))
        found = circuits.phase_checkpoint(rows, ph)
        if found is None:
            phases[ph] = circuits.no_checkpoint(rows, ph) | ({"ledger_trace": traced} if "importance" in d else {})
            if "importance" in d:
                phases[ph]["note"] = (f"the ledger's trace ({traced['run']} step {d['step']}, x{traced['ratio']:.2f}) "
                                      "is in the JSON, not drawn")
            continue
        run, row = found
        phases[ph] = traced
        if (run, row["step"]) != (traced["run"], d["step"]):
            ratio = circuits.closeness(row, ph)[0]
            traced["rule_checkpoint"] = {"run": run, "step": row["step"], "ratio": ratio}
            traced["note"] = f"not the rule's checkpoint ({run} step {row['step']}, x{ratio:.2f}: not traced)"
    return phases


def circuits_report(spec: dict, pieces: list[dict], figures: str, name: str) -> dict:
    """The circuits (Figs. 3, A2, A3), each run's Fig. 2a and the task vectors (Figs. 4, A8) of the one piece."""
    piece = pieces[0]
    rows = {run: piece["runs"][run]["rows"] for run in piece["runs"]}
    phases = circuit_phases(spec, piece)
    circuits.plot_circuits(phases, os.path.join(figures, f"{name}.png"))
    for run, cfg in piece["runs"].items():
        config = train.Config(**{**cfg["config"], "out": ""})
        train.plot_run(rows[run], config, os.path.join(figures, f"{name.replace('circuits', 'fig2a')}_K{config.K}.png"))
    tv_name = name.replace("circuits", "task_vectors")
    task_vectors.plot(piece["task_vectors"], os.path.join(figures, f"{tv_name}.png"))
    write_json(os.path.join(figures, f"{tv_name}.json"), piece["task_vectors"], indent=1)
    return {"iters": spec["iters"], "Ks": spec["Ks"], "phases": phases, "margins": margins(rows, piece["phases"]),
            "final": {run: {k: rs[-1][k] for k in ("step", "train_loss", "gen_loss", "kl_1gen", "kl_2gen", "kl_1mem",
                                                      "kl_2mem", "phi_beta_2")} for run, rs in rows.items()},
            "pieces": stamps(pieces)}




# ----------------------------------------------------------------------------- fixed grids (kind "grid")


def grid_runs(records: list[dict]) -> list[dict]:
    """Per run of a grid, in (condition, K, seed) order: its steps, max_t phi_beta(2), whether it entered 2-Gen
    (the paper's rule) and tau_2gen from its dense readouts; L_gen and the 2-Gen level at its last full evaluation."""
    return [{"condition": m["condition"], "K": m["K"], "seed": m["seed"], "iters": m["config"]["iters"],
             "max_phi_beta": thresholds.max_phi_beta(m["dense"]), "head": thresholds.generalizes(m["dense"]),
             "tau_2gen": thresholds.tau_2gen(m["dense"]), "gen_loss": m["full"][-1]["gen_loss"],
             "gen_loss_2gen": m["full"][-1]["gen_loss_2gen"]}
            for m in sorted(records, key=lambda m: (m["condition"], m["K"], m["seed"]))]


def reweight(spec: dict, records: list[dict], pieces: list[dict], figures: str, name: str) -> dict:
    """Fig. 7c on a fixed grid: per condition Fig. 7a / A9 (k1.grid_table and plot_grid, to
    figures/<name>_<condition>.png) and each seed's K1* bracket, in the figure's title and the JSON."""
    rows = grid_runs(records)
    tables, brackets, iters = {}, {}, {}
    for cond in spec["conditions"]:
        mine = [r for r in rows if r["condition"] == cond]
        if not mine:  # not trained yet
            continue
        tables[cond] = k1.grid_table(mine)
        brackets[cond] = k1.grid_brackets(tables[cond])
        iters[cond] = mine[0]["iters"]
        w = f" (w = {spec['train']['weight']})" if cond == "reweight" else ""
        title = (f"{cond}{w}, {iters[cond]} steps, N = {spec['train']['N']}; K1* bracket per seed: "
                 + ", ".join(f"seed {s} ({lo}, {hi}]" for s, (lo, hi) in brackets[cond].items()))
        k1.plot_grid({cond: tables[cond]}, title, os.path.join(figures, f"{name}_{cond}.png"))
    return {"preset": spec["preset"], "N": spec["train"]["N"], "weight": spec["train"]["weight"],
            "phi_star": thresholds.PHI_STAR, "iters": iters, "K1_bracket": brackets, "K": tables, "runs": rows,
            "pieces": stamps(pieces, "members")}


def tau(spec: dict, records: list[dict], pieces: list[dict], figures: str, name: str) -> dict:
    """Fig. 7b: the seeds' tau_2gen at one K in k1.tau_bins, those that never entered 2-Gen counted apart
    (k1.draw_tau_histogram); beside it every seed's phi_beta(2) against step."""
    rows = grid_runs(records)
    taus = [r["tau_2gen"] for r in rows]
    K, iters = spec["Ks"][0], rows[0]["iters"]
    edges = k1.tau_bins(iters)
    counts = np.histogram([t for t in taus if t is not None], edges)[0]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    k1.draw_tau_histogram(axes[0], taus, iters, K)
    for m in sorted(records, key=lambda m: m["seed"]):
        reached = thresholds.tau_2gen(m["dense"]) is not None
        axes[1].plot([r["step"] for r in m["dense"]], [r["phi_beta_2"] for r in m["dense"]], lw=0.6, alpha=0.6,
                     color="tab:blue" if reached else "tab:orange")
    axes[1].axhline(thresholds.PHI_STAR, color="gray", ls="--", lw=1)
    axes[1].set_xlabel("step")
    axes[1].set_ylabel("phi_beta(2)")
    axes[1].set_title("each seed (blue: entered 2-Gen, orange: never)")
    fig.suptitle(f"tau_2gen at K = {K}, N = {spec['train']['N']}, {iters} steps, phi_beta(2) every "
                 f"{spec['train']['eval_every']} steps on {spec['train']['eval_dense']} sequences", fontsize=10)
    fig.tight_layout()
    fig.savefig(os.path.join(figures, f"{name}.png"), dpi=100)
    plt.close(fig)
    return {"preset": spec["preset"], "K": K, "iters": iters, "N": spec["train"]["N"], "phi_star": thresholds.PHI_STAR,
            "seed": [r["seed"] for r in rows], "tau_2gen": taus, "max_phi_beta": [r["max_phi_beta"] for r in rows],
            "bins": edges.tolist(), "counts": counts.tolist(), "never": sum(t is None for t in taus),
            "pieces": stamps(pieces, "members")}


def phase_diagram(spec: dict, records: list[dict], pieces: list[dict], figures: str, name: str) -> dict:
    """Figs. 2b, 2c: sweep.sweep_summary and draw_sweep on the ledger's full evaluations (the seeds trained so far
    averaged at each K)."""
    by_K = {}
    for m in sorted(records, key=lambda m: (m["K"], m["seed"])):
        by_K.setdefault(m["K"], []).append((m["config"], m["full"]))
    summary = sweep.sweep_summary(by_K)
    sweep.draw_sweep(summary, os.path.join(figures, f"{name}.png"))
    return {"preset": spec["preset"], "iters": spec["train"]["iters"], **summary,
            "seeds": {K: [cfg["seed"] for cfg, _ in members] for K, members in by_K.items()},
            "pieces": stamps(pieces, "members")}


GRID = {"reweight": reweight, "tau": tau, "sweep": phase_diagram}  # a grid spec's "report"
