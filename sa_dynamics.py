"""Figs. 5b-c, 6a, A4 and A7 of the SA-transformer (sa_transformer.py) end to end: its dynamics runs, the theory beside
them and four figures (Sec. "The transition from G1 to G2"; Appendix "Minimal Network for Generalization in the Limit
K -> inf", "Dynamics of the SA-transformer", "Testing predictions"; Figs. 5b (loss and mixture weights over training),
5c and A4 (parameters over training), 6a (F_d, eq. sa_cdelta, and the loss landscape over (beta, delta)), A7
(near-origin landscapes with the (beta, delta) trajectories)).

The runs: the full model (eq. base_model) and the reduced one (eq. minimal_simple), each on the original data (control)
and with the bias ablated, at one N, and the reduced model with its mixture weights held at the full model's on the
plateau. Their beta(t) and delta(t) as powers of t, and their early rates against eq. (parameter_dynamics_simplest)
with F_1 and I (eqs. sa_cdelta, sa_cbeta), are Fig. 6b's numbers, which sa_scaling.py draws beside tau_2Gen(N).

    python sa_dynamics.py                    # quick preset (CPU: with sa_scaling.py, ~10 min on 2 cores)
    python sa_dynamics.py --preset paper     # the paper's sizes and seeds
    python sa_dynamics.py --replot           # only redraw the four figures from figures/sa_scaling.json

Its numbers go into figures/sa_scaling.json, the record it shares with sa_scaling.py (analysis/sa_record.py): the
theory, the exponents and rates, the landscapes, and the trajectories of the runs ("runs": t, masked loss, beta,
delta, w; the first control run's parameter snapshots).
"""
import json
import os
import time

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.ticker import MaxNLocator

from analysis.sa_fits import EXPONENT_WINDOWS, fit_rate, seed_exponents, seed_mean, summarize_exponents
from analysis.sa_record import DYNAMICS, FROZEN, NAME, PRESETS, TRAJECTORY, check_preset, dynamics_runs, keep, previous
from analysis.fresh_chains import fresh_batch
from plumbing import cli
from plumbing.records import settle, significant
from plumbing.rundir import write_json
from sa_transformer import (C, F1_exact, F_d, I_coefficient, Run, iters_cap, landscape, predicted_rates, train_sa,
                            w_driven)

# ----------------------------------------------------------------------------- the runs and the theory


def theory(P: dict) -> dict:
    """F_d, F_1 and I by Monte Carlo (eqs. sa_cdelta, sa_cbeta)."""
    Fd = F_d(20, P["mc_chains"])
    I = I_coefficient(P["mc_chains"])
    print(f"F_1: Monte Carlo {Fd[0]:.5f}, exact {F1_exact():.5f}; I = {I:.5f}", flush=True)
    return {"F1_mc": Fd[0], "F1_exact": F1_exact(), "F_d": Fd, "I": I}


def train_dynamics(P: dict, jobs: int) -> dict:
    """The four dynamics settings at N_dyn in one pool: the full and the reduced model, control and ablation, each to
    the step cap (twice it in the ablation) or stop_after x its tau; the full model's parameters kept at fractions of
    the cap (Figs. 5c, A4). Returns {name in DYNAMICS: runs}."""
    N_dyn, stop = P["N_dyn"], P["stop_after"]
    snaps = tuple(int(f * iters_cap(N_dyn) / 5) for f in (0, 0.5, 1, 1.5, 2, 3))
    settings = {name: [Run(N=N_dyn, seed=s, reduced=reduced, ablate=ablate, iters=iters_cap(N_dyn) * (2 if ablate else 1),
                                        eval_batch=P["eval_batch"], snapshots=snaps if not reduced else (), stop_after=stop)
                                    for s in range(P["seeds_reduced"] if reduced else P["seeds_dyn"])]
                for name, (reduced, ablate) in DYNAMICS.items()}
    t0 = time.time()
    done = iter(cli.parallel_map(train_sa, [r for runs in settings.values() for r in runs], jobs))
    print(f"{sum(map(len, settings.values()))} SA-transformer runs done in {time.time() - t0:.0f} s", flush=True)
    return {key: [next(done) for _ in runs] for key, runs in settings.items()}


def plateau_weights(control: list, N_dyn: int) -> tuple[tuple, float]:
    """(w_plateau, tau_control): the full control model's mixture weights w_A..w_D at t = tau / 2 (the evaluation
    at or after it), averaged over its seeds, tau its seeds' mean tau (half the step cap if none crossed)."""
    taus = [r["tau"] for r in control if np.isfinite(r["tau"])]
    tau_control = float(np.mean(taus)) if taus else iters_cap(N_dyn) / 2.0
    w_plateau = tuple(np.mean([r["w"][int(np.searchsorted(r["t"], 0.5 * tau_control))] for r in control], 0).tolist())
    return w_plateau, tau_control


def train_frozen(P: dict, control: list, jobs: int) -> tuple[dict, tuple, float]:
    """The reduced model with w_A..w_D held at the full control model's values at t = tau / 2 (plateau_weights),
    over the plateau only. Returns ({name in FROZEN: runs}, w_plateau, the control's mean tau)."""
    w_plateau, tau_control = plateau_weights(control, P["N_dyn"])
    runs = {name: [Run(N=P["N_dyn"], seed=s, reduced=True, ablate=name == "frozen_ablation",
                       iters=int(0.75 * tau_control), eval_batch=P["eval_batch"], freeze_weights=w_plateau)
                   for s in range(P["seeds_reduced"])] for name in FROZEN}
    done = iter(cli.parallel_map(train_sa, [r for group in runs.values() for r in group], jobs))
    return {name: [next(done) for _ in group] for name, group in runs.items()}, w_plateau, tau_control


def dynamics_summary(dyn: dict, frozen: dict, w_plateau: tuple, tau_control: float, I: float, N_dyn: int) -> dict:
    """Exponents of beta(t), delta(t) over windows of the plateau (fractions of tau), the measured
    early rates against eq. (parameter_dynamics_simplest), and the mixture weights."""
    exponents = {name: summarize_exponents(runs, EXPONENT_WINDOWS) for name, runs in dyn.items()}
    exponents.update({name: summarize_exponents(runs, EXPONENT_WINDOWS, tau_control)
                      for name, runs in frozen.items()})  # on the full control model's clock
    default = f"{EXPONENT_WINDOWS[0][0]:g}-{EXPONENT_WINDOWS[0][1]:g}"
    out = {"exponents": exponents, "exponent_window": f"t in [{EXPONENT_WINDOWS[0][0]}, {EXPONENT_WINDOWS[0][1]}] x mean tau"}
    for setting in ("control", "ablation"):
        for key in ("beta", "delta"):
            out[f"{key}_exponent_{setting}"] = exponents[f"full_{setting}"][key][default]
    control = dyn["full_control"]
    lo, hi = 0.05 * exponents["full_control"]["tau_mean"], 0.5 * exponents["full_control"]["tau_mean"]
    measured = {name: {key: fit_rate(*seed_mean(runs, key), lo, hi) for key in ("beta", "delta")}
                for name, runs in (("full", control), ("frozen", frozen["frozen_control"]))}
    out["rates"] = {"predicted": {"paper (w_B = w_C = 1/3)": predicted_rates(N_dyn, I),
                                  "at w_plateau": predicted_rates(N_dyn, I, w_plateau[1], w_plateau[2])},
                    "measured": measured, "window": [lo, hi], "w_plateau": w_plateau}
    out["tau_dynamics"] = {"control": [r["tau"] for r in control], "ablation": [r["tau"] for r in dyn["full_ablation"]]}
    out["w_final"] = np.mean([r["w"][-1] for r in control], 0).tolist()
    out["w_early"] = np.mean([r["w"][int(np.searchsorted(r["t"], 0.1 * tau_control))] for r in control], 0).tolist()
    return out


LANDSCAPE_SEED = 123  # seeds the batch each loss landscape is taken on (near the origin: one draw, ablated or not)


def landscapes(P: dict) -> dict:
    """The reduced model's loss over (beta, delta) with w optimized: at the largest N (Fig. 6a) and
    near the origin at N_dyn, for the original and the bias-ablated data (Fig. A7)."""
    N_land, N_dyn = max(P["N_tau"]), P["N_dyn"]
    context, target = fresh_batch(P["landscape_batch"] // 2, N_land, torch.Generator().manual_seed(LANDSCAPE_SEED))
    betas, deltas = np.linspace(0, 8, 17), np.linspace(0, 10, 11)
    out = {"landscape": {"N": N_land, "beta": betas.tolist(), "delta": deltas.tolist(),
                         "loss": landscape(context, target, betas, deltas).tolist()}}
    near = np.linspace(-1, 1, 9)
    out["landscape_origin"] = {"N": N_dyn, "beta": near.tolist(), "delta": near.tolist()}
    for setting, ablate in (("control", False), ("ablation", True)):
        context, target = fresh_batch(P["landscape_batch"], N_dyn, torch.Generator().manual_seed(LANDSCAPE_SEED),
                                      ablate=ablate)
        out["landscape_origin"][setting] = landscape(context, target, near, near).tolist()
    return out


def run_records(dyn: dict, frozen: dict) -> dict:
    """sa_scaling.json's "runs": {setting: [trajectory of each seed]}, the dynamics runs and the frozen-w
    ones; the first control run keeps its parameter snapshots (Fig. 5c, A4)."""
    named = dict(dyn)
    named.update(frozen)
    records = {name: [significant({k: r[k] for k in TRAJECTORY}) for r in runs] for name, runs in named.items()}
    records["full_control"][0]["snapshots"] = significant(dyn["full_control"][0]["snapshots"])
    return records


def exponent_checks(record: dict) -> dict:
    """Beside the seeds' mean exponents, from the stored runs: each seed's own in the stated window ("exponents_seeds",
    the spread Fig. 6b's titles give), and those of eq. (parameter_dynamics_simplest) integrated along each full run's
    own w(t) ("exponents_w_driven": what w's drift alone does to the exponents)."""
    runs, exponents = record["runs"], record["exponents"]
    return {"exponents_seeds": seed_exponents(runs, exponents),
            "exponents_w_driven": {name: summarize_exponents([{**r, **w_driven(r, record["I"]), "tau": r["tau"]}
                                                              for r in runs[name]], EXPONENT_WINDOWS,
                                                             exponents[name]["tau_mean"])
                                   for name in ("full_control", "full_ablation")}}


# ----------------------------------------------------------------------------- the figures

def normalized_parameters(snapshot: dict) -> dict:
    """The views of Fig. 5c: P1 as the attention the last position pays by position alone,
    softmax over lags i - j of P1 ("P1", (N,)); and the h.x block of M2 (beta's) as the attention a
    query in state mu pays to a key whose layer-1 content is state nu, softmax over nu for each mu
    ("M2_hx", (C, C), [nu, mu], columns sum to 1). Likewise M1 as layer-1 attention by content,
    softmax over the key state for each query state ("M1", [key, query])."""
    P1, M1, M2 = (torch.tensor(snapshot[k], dtype=torch.float64) for k in ("P1", "M1", "M2"))
    return {"P1": torch.softmax(P1, 0).tolist(), "M1": torch.softmax(M1, 0).tolist(),
            "M2_hx": torch.softmax(M2[C:, :C], 0).tolist()}


def plot_dynamics(dyn: dict, path: str):
    """Fig. 5b and the w_A..w_D figure: masked loss vs iterations against the 1-Gen / 2-Gen levels
    (every seed, control and ablation), and the mixture weights of the full model. Returns the figure (closed)."""
    fig, axes = plt.subplots(1, 3, figsize=(16, 4))
    for ax, name in ((axes[0], "full_control"), (axes[1], "full_ablation")):
        runs = dyn[name]
        for i, r in enumerate(runs):
            ax.plot(r["t"], r["masked_loss"], color="k", alpha=1.0 if i == 0 else 0.35, lw=1,
                    label=f"SA-transformer, seed {r['run'].get('seed', i)}" if i == 0 else
                    (f"other seeds ({len(runs) - 1})" if i == 1 else None))
        ax.axhline(np.mean([r["levels"]["masked_loss_frequencies"] for r in runs]), color="tab:green", ls=":",
                   label="raw frequencies (the SA 1-Gen plateau)")
        ax.axhline(np.mean([r["levels"]["masked_loss_1gen"] for r in runs]), color="tab:green", ls="--", label="1-Gen (Bayes)")
        ax.axhline(np.mean([r["levels"]["masked_loss_2gen"] for r in runs]), color="tab:blue", ls="--", label="2-Gen (Bayes)")
        setting = "bias ablation" if name == "full_ablation" else "control"
        ax.set_title(f"SA-transformer, N = {runs[0]['run']['N']}, {setting}")
        ax.set_xlabel("iteration")
        ax.set_ylabel("loss on samples whose target is in the context")
        ax.legend(fontsize=9)
    r = dyn["full_control"][0]
    w = np.array(r["w"])
    for k, name in enumerate("ABCD"):
        axes[2].plot(r["t"], w[:, k], label=f"w_{name}")
    axes[2].set_title("mixture weights (control, seed 0)")
    axes[2].set_xlabel("iteration")
    axes[2].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return fig


def plot_theory(result: dict, path: str):
    """F_d against d with the closed form F_1, and the loss landscape over (beta, delta) with w
    optimized (Fig. 6a); the near-origin landscapes are Fig. A7's (`plot_trajectories`). Returns the
    figure (closed)."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    d = np.arange(1, len(result["F_d"]) + 1)
    axes[0].semilogy(d, np.abs(result["F_d"]), "o-", label="$|F_d|$ (Monte Carlo)")
    axes[0].axhline(result["F1_exact"], color="k", ls="--", label=r"$F_1 = (C-1)/(C^2\alpha + C)$ (exact)")
    axes[0].xaxis.set_major_locator(MaxNLocator(integer=True))
    axes[0].set_xlabel("d (lag)")
    axes[0].set_ylabel("$|F_d|$")
    axes[0].set_title(r"$F_d = \langle \sum_\mu (T^{d+1})_{\mu\mu} \rangle - 1$ over $\mathcal{D}_T$")
    axes[0].legend(fontsize=9)
    L = result["landscape"]
    im = axes[1].pcolormesh(L["beta"], L["delta"], np.array(L["loss"]), shading="nearest", cmap="viridis")
    fig.colorbar(im, ax=axes[1], label="loss")
    axes[1].set_xlabel(r"$\beta$")
    axes[1].set_ylabel(r"$\delta$")
    axes[1].set_title(f"reduced model's loss at N = {L['N']}, $w_A \\ldots w_D$ optimized (Fig. 6a)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return fig


LAGS = np.arange(8)  # the lags at which P1 and P2 are drawn


def plot_positional_attention(ax, snaps: list, colors):
    """Fig. 5c top: softmax(P1), the attention the last position pays by position alone, against the lag."""
    for (t, p), c in zip(snaps, colors):
        ax.plot(LAGS, normalized_parameters(p)["P1"][:len(LAGS)], "o-", color=c, label=f"t = {t}")
    ax.set_yscale("log")
    ax.set_xticks(LAGS)
    ax.set_xlabel("lag i - j")
    ax.set_ylabel("attention weight (softmax over all lags)")
    ax.set_title(f"Fig. 5c top: layer-1 positional attention\nsoftmax(P1) at lags 0..{LAGS[-1]}")
    ax.legend(fontsize=9)


def plot_content_attention(fig, axes, snaps: list):
    """Fig. 5c bottom: M2's h.x block as attention by content (softmax over nu) at the first, middle and last of
    snaps, one per axis of `axes`, on one colour scale; the axes left over are switched off."""
    shown = [snaps[i] for i in sorted({round(k * (len(snaps) - 1) / 2) for k in range(3)})]  # first, middle, last
    views = [np.array(normalized_parameters(p)["M2_hx"]) for _, p in shown]
    vmax = max(v.max() for v in views)
    for ax, (t, _), view in zip(axes, shown, views):
        im = ax.imshow(view, cmap="viridis", vmin=0, vmax=vmax)
        ax.set_xticks(range(0, C, 3))
        ax.set_yticks(range(0, C, 3))
        ax.set_xlabel("query state mu (x_N)")
        ax.set_ylabel("key's layer-1 content nu (h_i)")
        ax.set_title(f"Fig. 5c bottom, t = {t}: layer-2 attention\nby content, softmax over nu of M2's h.x")
        fig.colorbar(im, ax=ax, fraction=0.046, label="attention weight")
    for ax in axes[len(views):]:
        ax.axis("off")


def plot_raw_biases(ax, snaps: list, colors):
    """Fig. A4: the raw position biases P1 and P2 against the lag at each snapshot."""
    for (t, p), c in zip(snaps, colors):
        ax.plot(LAGS, np.array(p["P1"])[:len(LAGS)], "o-", color=c, label=f"P1, t = {t}")
        ax.plot(LAGS, np.array(p["P2"])[:len(LAGS)], "x--", color=c, label=f"P2, t = {t}")
    ax.axhline(0, color="k", lw=0.5)
    ax.set_xticks(LAGS)
    ax.set_xlabel("lag (P1: i - j; P2: N - i)")
    ax.set_ylabel("raw bias")
    ax.set_title("raw P1 (o, solid) and P2 (x, dashed)")
    ax.legend(fontsize=7, ncol=2)


def plot_raw_matrix(fig, ax, key: str, t: int, M: np.ndarray):
    """Fig. A4: the raw M1 or M2 (rows: the key's components, columns: the query's) at step t, on a scale symmetric
    about 0; M2's x and h blocks marked off."""
    lim = max(1e-6, np.abs(M).max())
    im = ax.imshow(M, cmap="RdBu_r", vmin=-lim, vmax=lim)
    fig.colorbar(im, ax=ax, fraction=0.046, label="raw value")
    if key == "M1":
        ax.set_xlabel("query state")
        ax.set_ylabel("key state")
    else:  # M2's rows are the key's [x; h], its columns the query's: a line between the x and the h blocks
        ax.axhline(C - 0.5, color="k", lw=0.8)
        ax.axvline(C - 0.5, color="k", lw=0.8)
        ax.set_xticks([C / 2 - 0.5, 1.5 * C - 0.5], ["x (state)", "h (layer 1)"])
        ax.set_yticks([C / 2 - 0.5, 1.5 * C - 0.5], ["x", "h"])
        ax.set_xlabel("query component")
        ax.set_ylabel("key component")
    ax.set_title(f"raw {key} at t = {t} (key . query)")


def plot_diagonals(ax, every: list):
    """Fig. A4: the mean diagonal of M1 and of each C x C block of M2 against t, from 0."""
    blocks = {"M1": ("M1", slice(None), slice(None)), "M2 x.x": ("M2", slice(None, C), slice(None, C)),
              "M2 x.h": ("M2", slice(None, C), slice(C, None)), "M2 h.x (beta)": ("M2", slice(C, None), slice(None, C)),
              "M2 h.h": ("M2", slice(C, None), slice(C, None))}  # label: (matrix, rows, columns)
    for label, (key, rows, cols) in blocks.items():
        ax.plot([t for t, _ in every], [np.diag(np.array(p[key])[rows, cols]).mean() for _, p in every], "o-",
                label=label)
    ax.axhline(0, color="k", lw=0.5)
    ax.set_xlabel("iteration t")
    ax.set_ylabel("mean diagonal entry")
    ax.set_title("Fig. A4: the diagonals of M1 and M2's blocks")
    ax.legend(fontsize=8)


def plot_parameters(run: dict, path: str):
    """Fig. 5c and Fig. A4 over training, at the run's snapshots after t = 0 (all parameters start at
    zero). Top (Fig. 5c): the paper's normalized views (`normalized_parameters`): P1 as positional
    attention against the lag, and M2's h.x block as attention by content at three times. Bottom (Fig.
    A4): raw P1 and P2 against the lag, raw M1 and M2 at the last snapshot, and the mean diagonal of M1
    and of each C x C block of M2 against t, from 0. Returns the figure (closed)."""
    every = sorted((int(t), p) for t, p in run["snapshots"].items())
    snaps = [(t, p) for t, p in every if t > 0]
    colors = plt.get_cmap("viridis")(np.linspace(0, 0.9, len(snaps)))
    fig, (top, bottom) = plt.subplots(2, 4, figsize=(17, 8.5))
    plot_positional_attention(top[0], snaps, colors)
    plot_content_attention(fig, top[1:], snaps)
    plot_raw_biases(bottom[0], snaps, colors)
    t_last, last = snaps[-1]
    for ax, key in ((bottom[1], "M1"), (bottom[2], "M2")):
        plot_raw_matrix(fig, ax, key, t_last, np.array(last[key]))
    plot_diagonals(bottom[3], every)
    fig.suptitle(f"SA-transformer parameters over training (N = {run['run']['N']}, control, seed {run['run']['seed']})")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return fig


def plot_trajectories(origin: dict, runs: dict, path: str):
    """Fig. A7: the near-origin landscapes (minus their value at the origin) of the original and the
    bias-ablated data, each with the seed-mean (beta, delta) trajectories of the runs trained on that
    data drawn over it. origin: the "landscape_origin" entry; runs: {"control": {label: [run, ...]},
    "ablation": {...}}. Returns the figure (closed) so that its lines can be read back."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    for ax, setting in zip(axes, ("control", "ablation")):
        loss = np.array(origin[setting])
        loss = loss - loss[len(origin["delta"]) // 2, len(origin["beta"]) // 2]
        lim = max(1e-12, np.abs(loss).max())  # white: the loss at the origin
        im = ax.pcolormesh(origin["beta"], origin["delta"], loss, shading="nearest", cmap="RdBu_r", vmin=-lim, vmax=lim)
        fig.colorbar(im, ax=ax, label="loss - loss at (0, 0) (nats)")
        for (label, group), ls in zip(runs[setting].items(), ("--", ":", "-.")):
            _, beta = seed_mean(group, "beta")
            _, delta = seed_mean(group, "delta")
            ax.plot(beta, delta, color="w", ls=ls, lw=1.5, label=label)
        ax.set_xlim(min(origin["beta"]), max(origin["beta"]))
        ax.set_ylim(min(origin["delta"]), max(origin["delta"]))
        for axis in (ax.xaxis, ax.yaxis):  # four ticks: nine run together on a 4-inch axis
            axis.set_major_locator(MaxNLocator(4, steps=[1, 2.5, 5, 10]))
        ax.set_xlabel(r"$\beta$")
        ax.set_ylabel(r"$\delta$")
        ax.set_title(f"{'bias ablation' if setting == 'ablation' else 'original data'}, N = {origin['N']}: "
                     r"loss minus loss at 0, $(\beta, \delta)(t)$", fontsize=9)
        ax.legend(fontsize=7, facecolor="0.6")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return fig


FIGURES = ("sa_dynamics.png", "sa_parameters.png", "sa_theory.png", "sa_trajectories.png")


def write_figures(record: dict, out: str):
    """The four figures (FIGURES) in out from `record` (sa_scaling.json's content, its trajectories under "runs")."""
    dyn, _ = dynamics_runs(record)
    plot_dynamics(dyn, os.path.join(out, "sa_dynamics.png"))
    plot_parameters(dyn["full_control"][0], os.path.join(out, "sa_parameters.png"))
    plot_theory(record, os.path.join(out, "sa_theory.png"))
    plot_trajectories(record["landscape_origin"],
                      {setting: {"full model": dyn[f"full_{setting}"], "reduced model": dyn[f"reduced_{setting}"]}
                       for setting in ("control", "ablation")},
                      os.path.join(out, "sa_trajectories.png"))


REPLOTTED = ("F_d", "F1_exact", "landscape", "landscape_origin", "runs", "exponents", "I")  # write_figures' and exponent_checks'


def replot(path: str):
    """--replot [JSON]: the four figures from the JSON at path, beside it, each seed's exponents and the w-driven
    theory's re-derived from the stored runs (exponent_checks).
    A consistency check: the JSON is rewritten only when one of those numbers changed beyond float noise (keep)."""
    record = cli.read_json(path, REPLOTTED, "sa_dynamics.py")
    before = json.loads(json.dumps(record))
    with cli.drawing(path, "sa_dynamics.py"):
        record.update(exponent_checks(record))
        record = settle(record, before)
        write_figures(record, os.path.dirname(path))
    keep(path, record, before, ", ".join(FIGURES), "each seed's exponents re-derived")


def main():
    parser = cli.ArgumentParser(description="SA-transformer: its dynamics and the theory beside them (Figs. 5b-c, 6a, "
                                            "A4, A7); runs on the CPU, as one-thread processes.", runs=(
        "Default run: not timed on its own; with sa_scaling.py's runs, 9 min 54 s on the 2-core development VM as two "
        "processes (2026-11-26) (quick preset: the dynamics at N = 64, the landscapes at N = 64 and 256); writes "
        "figures/sa_dynamics.png, figures/sa_parameters.png, figures/sa_theory.png, figures/sa_trajectories.png and "
        "its part of figures/sa_scaling.json.\n"
        "--replot: seconds, trains nothing."))
    cli.add_preset(parser, PRESETS, "quick: dynamics at N = 64, landscape at N = 256; paper: N = 128 and 1024")
    parser.add_argument("--N", type=cli.at_least(2), default=None, help="sequence length of the dynamics runs (default: quick 64, paper 128)")
    cli.add_jobs(parser)
    cli.add_threads(parser)
    cli.add_figures(parser)
    cli.add_replot(parser, f"FIGURES/{NAME}", f"the four figures ({', '.join(FIGURES)})")
    args = parser.parse_args()
    cli.writable_dir(args.figures, "--figures")
    if args.replot is not None:
        replot(cli.replot_path(args, NAME))
        return
    preset = cli.preset(args.preset)
    cli.set_threads(args.threads)
    P = dict(PRESETS[preset], N_dyn=args.N or PRESETS[preset]["N_dyn"])
    path = os.path.join(args.figures, NAME)
    check_preset(previous(path), preset, path)
    cli.announce(preset, f"dynamics at N = {P['N_dyn']}, landscapes at N = {P['N_dyn']} and {max(P['N_tau'])}, "
                         f"{args.jobs} processes", f"{args.figures}/{', '.join(FIGURES)} and {NAME}")
    t0 = time.time()
    part = {"preset": preset, **theory(P)}
    dyn = train_dynamics(P, args.jobs)
    frozen, w_plateau, tau_control = train_frozen(P, dyn["full_control"], args.jobs)
    part.update(dynamics_summary(dyn, frozen, w_plateau, tau_control, part["I"], P["N_dyn"]))
    part.update(landscapes(P))
    part["runs"] = run_records(dyn, frozen)
    part = json.loads(json.dumps(part))  # as the JSON holds it, which a redraw re-derives from
    part.update(exponent_checks(part), seconds_dynamics=round(time.time() - t0, 1))
    record = {**previous(path), **part}  # sa_scaling.py's part kept as it is
    write_json(path, record, indent=1)
    write_figures(record, args.figures)
    printed = ("beta_exponent_control", "delta_exponent_control", "beta_exponent_ablation", "delta_exponent_ablation",
               "w_early", "w_final", "rates", "seconds_dynamics")
    print(json.dumps({k: part[k] for k in printed}, indent=1))
    print(f"wrote {args.figures}/{', '.join(FIGURES)} and {NAME} in {part['seconds_dynamics'] / 60:.1f} min")


if __name__ == "__main__":
    cli.run(main)
