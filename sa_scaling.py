"""Figs. 5, 6, A4 and A7 of the SA-transformer (sa_transformer.py) end to end: its training series, the scaling of
tau_2Gen with N, the theory beside the runs, and the five figures (Sec. "The transition from G1 to G2"; Appendix
"Minimal Network for Generalization in the Limit K -> inf", "Dynamics of the SA-transformer", "Testing predictions";
Figs. 5b-c (loss, mixture weights and parameters over training), 6 (F_d and the landscape, the dynamics of beta and
delta, tau_2Gen(N)), A4 (parameters over training), A7 (near-origin landscapes with the (beta, delta) trajectories)).

The series: the control and bias-ablation runs of tau_2Gen(N) fitted against N / log N, the dynamics runs (full and
reduced model, control and ablation) and the reduced model with the mixture weights held at the plateau's; beside
them the runs of the non-autoregressive transformer without MLP1 (Fig. 6c bottom; its data, training, criterion and
record in analysis/transformer_tau.py).

    python sa_scaling.py                     # quick preset (CPU: ~10 min on 2 cores; --transformer: ~2.5 h more, in a
                                             # --figures DIR of its own: the committed record's runs are the paper's)
    python sa_scaling.py --transformer-only --preset paper   # only the transformer's (N, seed) missing from
                                             # figures/sa_scaling.json (CPU: N = 32-128 in 80 min on 2 cores)
    python sa_scaling.py --transformer-only --preset paper --device cuda   # 8 seeds of an N as one batched model
    python sa_scaling.py --preset paper      # the paper's sizes and seeds
    python sa_scaling.py --replot            # only redraw the five figures from figures/sa_scaling.json

figures/sa_scaling.json holds every number the figures draw: the fits, the landscapes and the trajectories of the
dynamics runs ("runs": t, masked loss, beta, delta, w; the first control run's parameter snapshots) and of the
transformer runs ("transformer_runs": t, loss, phi; "transformer_tau" re-reads them).
"""
import contextlib
import json
import math
import os
import time

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.ticker import MaxNLocator

from analysis.sa_fits import EXPONENT_WINDOWS, fit_rate, fit_tau, seed_exponents, seed_mean, summarize_exponents
from analysis.transformer_tau import (add_transformer_runs, check_protocol, fresh_batch, merge_transformer_runs,
                                      previous_transformer_runs, train_transformers, transformer_summary)
from plumbing import cli
from plumbing.records import settle, significant
from plumbing.rundir import write_json
from sa_transformer import (C, F1_exact, F_d, I_coefficient, Run, iters_cap, landscape, predicted_rates, train_sa,
                            w_driven)

# ----------------------------------------------------------------------------- the series


PRESETS = {
    # N_tau: lengths for tau_2Gen(N), control and bias ablation; N_dyn: length of the dynamics runs (seeds_dyn for
    # the full model, seeds_reduced for the reduced and frozen-weight ones); the transformer runs (Fig. 6c bottom, in
    # the quick preset only with --transformer) each to its drop's window's end or its step cap transformer_iters,
    # ~4x the slowest head of 8 seeds at the paper's (RESULTS.md)
    "quick": dict(N_tau=[32, 64, 128, 256], seeds_tau=2, N_dyn=64, seeds_dyn=3, seeds_reduced=2, transformer=False,
                  N_transformer=[24, 32, 48, 64, 128, 256], seeds_transformer=2, transformer_iters=6000,
                  transformer_eval_batch=1024, eval_batch=1024, landscape_batch=4096, mc_chains=200_000, stop_after=1.2),
    "paper": dict(N_tau=[32, 64, 128, 256, 512, 1024], seeds_tau=8, N_dyn=128, seeds_dyn=5, seeds_reduced=5, transformer=True,
                  N_transformer=[32, 64, 128, 256], seeds_transformer=8, transformer_iters=20_000,
                  transformer_eval_batch=2048, eval_batch=4096, landscape_batch=16384, mc_chains=1_000_000, stop_after=2.0),
}


def theory(P: dict) -> dict:
    """F_d, F_1 and I by Monte Carlo (eqs. sa_cdelta, sa_cbeta)."""
    Fd = F_d(20, P["mc_chains"])
    I = I_coefficient(P["mc_chains"])
    print(f"F_1: Monte Carlo {Fd[0]:.5f}, exact {F1_exact():.5f}; I = {I:.5f}", flush=True)
    return {"F1_mc": Fd[0], "F1_exact": F1_exact(), "F_d": Fd, "I": I}


def train_sa_series(P: dict, jobs: int) -> tuple[dict, dict]:
    """All SA-transformer runs in one pool: the four dynamics settings (full / reduced x control /
    ablation) at N_dyn, and tau_2Gen(N) of the full model, control and ablation, at the other N_tau.
    Returns (dyn {(reduced, ablate): runs}, tau_runs {ablate: {N: runs}})."""
    N_dyn, stop = P["N_dyn"], P["stop_after"]
    snaps = tuple(int(f * iters_cap(N_dyn) / 5) for f in (0, 0.5, 1, 1.5, 2, 3))
    settings = {(reduced, ablate): [Run(N=N_dyn, seed=s, reduced=reduced, ablate=ablate, iters=iters_cap(N_dyn) * (2 if ablate else 1),
                                        eval_batch=P["eval_batch"], snapshots=snaps if not reduced else (), stop_after=stop)
                                    for s in range(P["seeds_reduced"] if reduced else P["seeds_dyn"])]
                for reduced in (False, True) for ablate in (False, True)}
    tau_runs = [Run(N=N, seed=s, ablate=ablate, iters=iters_cap(N) * (2 if ablate else 1), eval_batch=P["eval_batch"],
                    eval_every=max(25, N // 4), stop_after=stop)
                for ablate in (False, True) for N in P["N_tau"] if N != N_dyn for s in range(P["seeds_tau"])]
    all_runs = sorted(tau_runs, key=lambda r: -r.N) + [r for runs in settings.values() for r in runs]  # longest first
    t0 = time.time()
    done = dict(zip([id(r) for r in all_runs], cli.parallel_map(train_sa, all_runs, jobs)))
    print(f"{len(all_runs)} SA-transformer runs done in {time.time() - t0:.0f} s", flush=True)
    dyn = {k: [done[id(r)] for r in runs] for k, runs in settings.items()}
    by_N = {ablate: {N_dyn: dyn[(False, ablate)][: P["seeds_tau"]]} for ablate in (False, True)}
    for r in tau_runs:
        by_N[r.ablate].setdefault(r.N, []).append(done[id(r)])
    return dyn, {ablate: dict(sorted(runs.items())) for ablate, runs in by_N.items()}


def plateau_weights(control: list, N_dyn: int) -> tuple[tuple, float]:
    """(w_plateau, tau_control): the full control model's mixture weights w_A..w_D at t = tau / 2 (the evaluation
    at or after it), averaged over its seeds, tau its seeds' mean tau (half the step cap if none crossed)."""
    taus = [r["tau"] for r in control if np.isfinite(r["tau"])]
    tau_control = float(np.mean(taus)) if taus else iters_cap(N_dyn) / 2.0
    w_plateau = tuple(np.mean([r["w"][int(np.searchsorted(r["t"], 0.5 * tau_control))] for r in control], 0).tolist())
    return w_plateau, tau_control


def train_frozen(P: dict, control: list, jobs: int) -> tuple[dict, tuple, float]:
    """The reduced model with w_A..w_D held at the full control model's values at t = tau / 2 (plateau_weights),
    over the plateau only. Returns ({ablate: runs}, w_plateau, the control's mean tau)."""
    w_plateau, tau_control = plateau_weights(control, P["N_dyn"])
    runs = [Run(N=P["N_dyn"], seed=s, reduced=True, ablate=ablate, iters=int(0.75 * tau_control),
                eval_batch=P["eval_batch"], freeze_weights=w_plateau) for ablate in (False, True) for s in range(P["seeds_reduced"])]
    out = cli.parallel_map(train_sa, runs, jobs)
    n = P["seeds_reduced"]
    return {False: out[:n], True: out[n:]}, w_plateau, tau_control


def dynamics_summary(dyn: dict, frozen: dict, w_plateau: tuple, tau_control: float, I: float, N_dyn: int) -> dict:
    """Exponents of beta(t), delta(t) over windows of the plateau (fractions of tau), the measured
    early rates against eq. (parameter_dynamics_simplest), and the mixture weights."""
    exponents = {f"{'reduced' if red else 'full'}_{'ablation' if abl else 'control'}":
                 summarize_exponents(runs, EXPONENT_WINDOWS) for (red, abl), runs in dyn.items()}
    exponents.update({f"frozen_{'ablation' if abl else 'control'}": summarize_exponents(runs, EXPONENT_WINDOWS, tau_control)
                      for abl, runs in frozen.items()})  # on the full control model's clock
    default = f"{EXPONENT_WINDOWS[0][0]:g}-{EXPONENT_WINDOWS[0][1]:g}"
    out = {"exponents": exponents, "exponent_window": f"t in [{EXPONENT_WINDOWS[0][0]}, {EXPONENT_WINDOWS[0][1]}] x mean tau"}
    for setting in ("control", "ablation"):
        for key in ("beta", "delta"):
            out[f"{key}_exponent_{setting}"] = exponents[f"full_{setting}"][key][default]
    control = dyn[(False, False)]
    lo, hi = 0.05 * exponents["full_control"]["tau_mean"], 0.5 * exponents["full_control"]["tau_mean"]
    measured = {name: {key: fit_rate(*seed_mean(runs, key), lo, hi) for key in ("beta", "delta")}
                for name, runs in (("full", control), ("frozen", frozen[False]))}
    out["rates"] = {"predicted": {"paper (w_B = w_C = 1/3)": predicted_rates(N_dyn, I),
                                  "at w_plateau": predicted_rates(N_dyn, I, w_plateau[1], w_plateau[2])},
                    "measured": measured, "window": [lo, hi], "w_plateau": w_plateau}
    out["tau_dynamics"] = {"control": [r["tau"] for r in control], "ablation": [r["tau"] for r in dyn[(False, True)]]}
    out["w_final"] = np.mean([r["w"][-1] for r in control], 0).tolist()
    out["w_early"] = np.mean([r["w"][int(np.searchsorted(r["t"], 0.1 * tau_control))] for r in control], 0).tolist()
    return out


def scaling_summary(tau_runs: dict) -> dict:
    """tau_2Gen(N) of the SA-transformer (control, ablation) with their fits against N / log N, and the final losses
    at the largest N. "tau_transformer" (fitted alike): the quick preset's transformer runs' first halfway crossings,
    stored as numbers (the paper preset's runs are whole trajectories in "transformer_runs", merge_transformer_runs)."""
    out = {"tau": {str(N): [r["tau"] for r in runs] for N, runs in tau_runs[False].items()},
           "tau_ablation": {str(N): [r["tau"] for r in runs] for N, runs in tau_runs[True].items()},
           "tau_transformer": {}}
    out["tau_fits"] = {key: fit_tau(out[key]) for key in ("tau", "tau_ablation", "tau_transformer")}
    largest = tau_runs[False][max(tau_runs[False])]
    for key, level in (("final_loss", None), ("loss_2gen", "masked_loss_2gen"), ("loss_1gen", "masked_loss_1gen")):
        out[key] = float(np.mean([r["masked_loss"][-1] if level is None else r["levels"][level] for r in largest]))
    return out


def landscapes(P: dict) -> dict:
    """The reduced model's loss over (beta, delta) with w optimized: at the largest N (Fig. 6a) and
    near the origin at N_dyn, for the original and the bias-ablated data (Fig. A7)."""
    N_land, N_dyn = max(P["N_tau"]), P["N_dyn"]
    context, target = fresh_batch(P["landscape_batch"] // 2, N_land, torch.Generator().manual_seed(123))
    betas, deltas = np.linspace(0, 8, 17), np.linspace(0, 10, 11)
    out = {"landscape": {"N": N_land, "beta": betas.tolist(), "delta": deltas.tolist(),
                         "loss": landscape(context, target, betas, deltas).tolist()}}
    near = np.linspace(-1, 1, 9)
    out["landscape_origin"] = {"N": N_dyn, "beta": near.tolist(), "delta": near.tolist()}
    for setting, ablate in (("control", False), ("ablation", True)):
        context, target = fresh_batch(P["landscape_batch"], N_dyn, torch.Generator().manual_seed(123), ablate=ablate)
        out["landscape_origin"][setting] = landscape(context, target, near, near).tolist()
    return out


SETTINGS = {"full_control": (False, False), "full_ablation": (False, True), "reduced_control": (True, False),
            "reduced_ablation": (True, True)}  # the dynamics runs' names in sa_scaling.json: (reduced, ablate)
TRAJECTORY = ("t", "masked_loss", "beta", "delta", "w", "levels", "tau", "run")  # what the figures read of a run


def run_records(dyn: dict, frozen: dict) -> dict:
    """sa_scaling.json's "runs": {setting: [trajectory of each seed]}, the dynamics runs and the frozen-w
    ones; the first control run keeps its parameter snapshots (Fig. 5c, A4)."""
    named = {name: dyn[key] for name, key in SETTINGS.items()}
    named.update({f"frozen_{'ablation' if ablate else 'control'}": runs for ablate, runs in frozen.items()})
    records = {name: [significant({k: r[k] for k in TRAJECTORY}) for r in runs] for name, runs in named.items()}
    records["full_control"][0]["snapshots"] = significant(dyn[(False, False)][0]["snapshots"])
    return records


W_THIRD = dict(N=(64, 128), seeds=5, w=(0.0, 1 / 3, 1 / 3, 1 / 3))  # the theory's 1-Gen weights, held fixed


def train_w_third(result: dict, jobs: int) -> dict:
    """Fig. 6b's exponents with w's drift removed: the full model (eq. base_model) with w_A..w_D held at the
    theory's (0, 1/3, 1/3, 1/3), control and ablation, W_THIRD's N and seeds, each run to 0.75 x the full model's
    mean tau at its N and setting (the record's), its exponents fitted on that tau's clock over EXPONENT_WINDOWS.
    {"runs": {N: {setting: [trajectories]}}, "exponents": {N: {setting: summarize_exponents}}}."""
    taus = {(N, ablate): float(np.mean(result["tau_ablation" if ablate else "tau"][str(N)]))
            for N in W_THIRD["N"] for ablate in (False, True)}
    runs = [Run(N=N, seed=s, ablate=ablate, iters=int(0.75 * taus[N, ablate]), freeze_weights=W_THIRD["w"],
                eval_batch=PRESETS["quick"]["eval_batch"])
            for N in W_THIRD["N"] for ablate in (False, True) for s in range(W_THIRD["seeds"])]
    done = cli.parallel_map(train_sa, runs, jobs, progress="runs with w held at (0, 1/3, 1/3, 1/3)",
                            cost=[r.iters for r in runs])
    out = {"runs": {}, "exponents": {}}
    for N in W_THIRD["N"]:
        for ablate, setting in ((False, "control"), (True, "ablation")):
            group = [d for r, d in zip(runs, done) if r.N == N and r.ablate == ablate]
            out["runs"].setdefault(str(N), {})[setting] = [significant({k: r[k] for k in TRAJECTORY}) for r in group]
            out["exponents"].setdefault(str(N), {})[setting] = summarize_exponents(group, EXPONENT_WINDOWS,
                                                                                   taus[N, ablate])
    return out


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


COLORS = {"control": "tab:blue", "ablation": "tab:red"}


def plot_dynamics(dyn: dict, path: str):
    """Fig. 5b and the w_A..w_D figure: masked loss vs iterations against the 1-Gen / 2-Gen levels
    (every seed, control and ablation), and the mixture weights of the full model. Returns the figure (closed)."""
    fig, axes = plt.subplots(1, 3, figsize=(16, 4))
    for ax, ablate in ((axes[0], False), (axes[1], True)):
        runs = dyn[(False, ablate)]
        for i, r in enumerate(runs):
            ax.plot(r["t"], r["masked_loss"], color="k", alpha=1.0 if i == 0 else 0.35, lw=1,
                    label=f"SA-transformer, seed {r['run'].get('seed', i)}" if i == 0 else
                    (f"other seeds ({len(runs) - 1})" if i == 1 else None))
        ax.axhline(np.mean([r["levels"]["masked_loss_frequencies"] for r in runs]), color="tab:green", ls=":",
                   label="raw frequencies (the SA 1-Gen plateau)")
        ax.axhline(np.mean([r["levels"]["masked_loss_1gen"] for r in runs]), color="tab:green", ls="--", label="1-Gen (Bayes)")
        ax.axhline(np.mean([r["levels"]["masked_loss_2gen"] for r in runs]), color="tab:blue", ls="--", label="2-Gen (Bayes)")
        ax.set_title(f"SA-transformer, N = {runs[0]['run']['N']}, {'bias ablation' if ablate else 'control'}")
        ax.set_xlabel("iteration")
        ax.set_ylabel("loss on samples whose target is in the context")
        ax.legend(fontsize=9)
    r = dyn[(False, False)][0]
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


def plot_parameters(run: dict, path: str):
    """Fig. 5c and Fig. A4 over training, at the run's snapshots after t = 0 (all parameters start at
    zero). Top (Fig. 5c): the paper's normalized views (`normalized_parameters`): P1 as positional
    attention against the lag, and M2's h.x block as attention by content at three times. Bottom (Fig.
    A4): raw P1 and P2 against the lag, raw M1 and M2 at the last snapshot, and the mean diagonal of M1
    and of each C x C block of M2 against t, from 0. Returns the figure (closed)."""
    every = sorted((int(t), p) for t, p in run["snapshots"].items())
    snaps = [(t, p) for t, p in every if t > 0]
    colors = plt.get_cmap("viridis")(np.linspace(0, 0.9, len(snaps)))
    lags = np.arange(8)
    fig, axes = plt.subplots(2, 4, figsize=(17, 8.5))
    top, bottom = axes

    for (t, p), c in zip(snaps, colors):
        top[0].plot(lags, normalized_parameters(p)["P1"][:8], "o-", color=c, label=f"t = {t}")
    top[0].set_yscale("log")
    top[0].set_xticks(lags)
    top[0].set_xlabel("lag i - j")
    top[0].set_ylabel("attention weight (softmax over all lags)")
    top[0].set_title("Fig. 5c top: layer-1 positional attention\nsoftmax(P1) at lags 0..7")
    top[0].legend(fontsize=9)
    shown = [snaps[i] for i in sorted({round(k * (len(snaps) - 1) / 2) for k in range(3)})]  # first, middle, last
    views = [np.array(normalized_parameters(p)["M2_hx"]) for _, p in shown]
    vmax = max(v.max() for v in views)
    for ax, (t, _), view in zip(top[1:], shown, views):
        im = ax.imshow(view, cmap="viridis", vmin=0, vmax=vmax)
        ax.set_xticks(range(0, C, 3))
        ax.set_yticks(range(0, C, 3))
        ax.set_xlabel("query state mu (x_N)")
        ax.set_ylabel("key's layer-1 content nu (h_i)")
        ax.set_title(f"Fig. 5c bottom, t = {t}: layer-2 attention\nby content, softmax over nu of M2's h.x")
        fig.colorbar(im, ax=ax, fraction=0.046, label="attention weight")
    for ax in top[1 + len(views):]:
        ax.axis("off")

    for (t, p), c in zip(snaps, colors):
        bottom[0].plot(lags, np.array(p["P1"])[:8], "o-", color=c, label=f"P1, t = {t}")
        bottom[0].plot(lags, np.array(p["P2"])[:8], "x--", color=c, label=f"P2, t = {t}")
    bottom[0].axhline(0, color="k", lw=0.5)
    bottom[0].set_xticks(lags)
    bottom[0].set_xlabel("lag (P1: i - j; P2: N - i)")
    bottom[0].set_ylabel("raw bias")
    bottom[0].set_title("raw P1 (o, solid) and P2 (x, dashed)")
    bottom[0].legend(fontsize=7, ncol=2)
    t_last, last = snaps[-1]
    for ax, key in ((bottom[1], "M1"), (bottom[2], "M2")):
        M = np.array(last[key])
        lim = max(1e-6, np.abs(M).max())
        im = ax.imshow(M, cmap="RdBu_r", vmin=-lim, vmax=lim)
        fig.colorbar(im, ax=ax, fraction=0.046, label="raw value")
        if key == "M1":
            ax.set_xlabel("query state")
            ax.set_ylabel("key state")
        else:  # rows: the key's [x; h], columns: the query's
            for edge in (C - 0.5,):
                ax.axhline(edge, color="k", lw=0.8)
                ax.axvline(edge, color="k", lw=0.8)
            ax.set_xticks([C / 2 - 0.5, 1.5 * C - 0.5], ["x (state)", "h (layer 1)"])
            ax.set_yticks([C / 2 - 0.5, 1.5 * C - 0.5], ["x", "h"])
            ax.set_xlabel("query component")
            ax.set_ylabel("key component")
        ax.set_title(f"raw {key} at t = {t_last} (key . query)")
    blocks = {"M1": ("M1", slice(None), slice(None)), "M2 x.x": ("M2", slice(None, C), slice(None, C)),
              "M2 x.h": ("M2", slice(None, C), slice(C, None)), "M2 h.x (beta)": ("M2", slice(C, None), slice(None, C)),
              "M2 h.h": ("M2", slice(C, None), slice(C, None))}
    for label, (key, rows, cols) in blocks.items():
        bottom[3].plot([t for t, _ in every], [np.diag(np.array(p[key])[rows, cols]).mean() for _, p in every], "o-",
                       label=label)
    bottom[3].axhline(0, color="k", lw=0.5)
    bottom[3].set_xlabel("iteration t")
    bottom[3].set_ylabel("mean diagonal entry")
    bottom[3].set_title("Fig. A4: the diagonals of M1 and M2's blocks")
    bottom[3].legend(fontsize=8)
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


PAPER_EXPONENTS = {"beta": ("t", "t"), "delta": ("t", "t$^2$")}  # control, ablation (Sec. "Testing predictions")


def exponent_title(key: str, result: dict) -> str:
    """A beta or delta panel's title, in words: the full model's exponents in the stated window, their range over the
    three windows the fits were tried in and over the seeds, the full model's with w held at 1/3, and the paper's."""
    lines, windows = [], [f"{a:g}-{b:g}" for a, b in EXPONENT_WINDOWS]  # the first: the stated window
    for setting in ("control", "ablation"):
        value = result.get(f"{key}_exponent_{setting}")
        fits = list(result.get("exponents", {}).get(f"full_{setting}", {}).get(key, {}).values())  # the seeds' mean
        seeds = result.get("exponents_seeds", {}).get(f"full_{setting}", {}).get(key, [])  # each seed's, stated window
        ranges = ([f"in the {len(fits)} fit windows {min(fits):.2f} to {max(fits):.2f}"] if fits else []) \
            + ([f"each of {len(seeds)} seeds alone {min(seeds):.2f} to {max(seeds):.2f}"] if seeds else [])
        lines.append(f"{setting} t$^{{{value:.2f}}}$" + (f" ({'; '.join(ranges)})" if ranges else "")
                     if value is not None and np.isfinite(value) else f"{setting}: not fitted")
    paper, held = PAPER_EXPONENTS[key], next(iter(result.get("w_third", {}).get("exponents", {}).values()), {})
    held = ", ".join(f"{setting} t$^{{{e[key]['0.05-0.5']:.2f}}}$" for setting, e in held.items())
    return (f"$\\{key}(t)$ of the full model: the seeds' mean fitted as a power of t over t = {windows[0]} x tau\n"
            + "\n".join(lines) + (f"\nthe full model with w held at 1/3: {held}" if held else "")
            + f"\n(fit windows: t = {', '.join(windows)} x the mean tau); paper: {paper[0]} (control), {paper[1]} (ablation)")


def plot_scaling(dyn: dict, frozen: dict, result: dict, path: str):
    """Fig. 6b-c: beta and delta against t (control vs ablation; full, reduced and frozen-w models),
    tau_2Gen against N for the SA-transformer (control and ablation, Fig. 6c top), each with its fit
    tau = a N / log N, and the transformer (Fig. 6c bottom) with the power law fitted to it and that law.
    Returns the figure (closed)."""
    fig, axes = plt.subplots(2, 2, figsize=(14, 10.5))
    axes = axes.ravel()  # beta, delta above; tau_2Gen(N) of the SA-transformer and of the transformer below
    def positive(runs: list, key: str) -> tuple[np.ndarray, np.ndarray]:  # the seeds' mean where a log axis shows it
        t, mean = seed_mean(runs, key)
        keep = (t > 0) & (mean > 0)
        return t[keep], mean[keep]

    for col, key in ((0, "beta"), (1, "delta")):
        ax = axes[col]
        for (reduced, ablate), runs in dyn.items():
            label = f"{'reduced' if reduced else 'full'}, {'ablation' if ablate else 'control'}"
            ax.loglog(*positive(runs, key), color=COLORS["ablation" if ablate else "control"], ls=":" if reduced else "-",
                      label=label)
        for ablate, runs in frozen.items():
            ax.loglog(*positive(runs, key), color=COLORS["ablation" if ablate else "control"], ls="--", lw=1,
                      label=f"reduced, w frozen, {'ablation' if ablate else 'control'}")
        held = result.get("w_third", {}).get("runs", {})  # the full model with w held at 1/3, at the dynamics runs' N
        for setting, runs in (held.get(str(dyn[(False, False)][0]["run"]["N"]), {}) if held else {}).items():
            ax.loglog(*positive(runs, key), color=COLORS[setting], ls=(0, (5, 1, 1, 1, 1, 1)), lw=1.2,
                      label=f"full, w held at 1/3, {setting}")
        t, mean = positive(dyn[(False, False)], key)
        if len(t):  # guides through the control curve's first point
            t_ref = np.array([t[0], t[-1]])
            ax.loglog(t_ref, mean[0] * (t_ref / t_ref[0]), "k:", lw=0.8, label=r"$\propto t$")
            ax.loglog(t_ref, mean[0] * (t_ref / t_ref[0]) ** 2, "k-.", lw=0.8, label=r"$\propto t^2$")
        ax.set_ylim(bottom=max(1e-5, ax.get_ylim()[0]))
        ax.set_xlabel("iteration t")
        ax.set_ylabel(f"$\\{key}$ (mean over seeds)")
        ax.set_title(exponent_title(key, result), fontsize=9)
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=3, frameon=False)  # off the curves
    # the transformer's panel draws the power law in N / log N its runs give (the slope the README quotes), with the
    # paper's law as a labelled reference: in the quick preset its tau falls with N (N = 24..64), and the law's fit
    # alone would draw a rising line
    panels = ((axes[2], (("tau", "control"), ("tau_ablation", "ablation")), "SA-transformer", False),
              (axes[3], (("tau_transformer", "control"),),
               "transformer, no MLP1, non-AR\nfirst halfway crossings (no trajectories stored, not re-read)", True))
    for ax, series, title, free in panels:
        slopes = []
        for key, setting in series:
            points = [(int(N), tau) for N, taus in result[key].items() for tau in taus if np.isfinite(tau)]
            fit = result["tau_fits"][key]
            if not points or not np.isfinite(fit["prefactor"]):
                continue
            ax.plot(*zip(*points), "o", color=COLORS[setting], alpha=0.5, label=f"{setting} (seeds)")
            Ns = np.array(fit["N"], float)
            if free:
                s, seeds = fit["slope_vs_N_over_logN"], fit["slope_vs_N_over_logN_seeds"]
                ax.plot(Ns, fit["prefactor_vs_N_over_logN"] * (Ns / np.log(Ns)) ** s, "-", color=COLORS[setting],
                        label=f"fit: {fit['prefactor_vs_N_over_logN']:.3g} (N / log N)$^{{{s:.2f}}}$")
                ax.plot(Ns, fit["prefactor"] * Ns / np.log(Ns), "--", color="gray",
                        label=f"paper's law: a N / log N, a = {fit['prefactor']:.0f} fitted")
                slopes.append(f"slope vs N / log N {s:.2f}; each seed alone " + ", ".join(f"{v:.2f}" for v in seeds)
                              + " (paper: 1)")
            else:
                ax.plot(Ns, fit["prefactor"] * Ns / np.log(Ns), "--", color=COLORS[setting], label=f"{fit['prefactor']:.0f} N / log N")
                slopes.append(f"{setting} {fit['slope_vs_N_over_logN']:.2f}")
        if not slopes:
            ax.text(0.5, 0.5, "not run (add --transformer)" if not result[series[0][0]] else "no transition within the budget",
                    ha="center", transform=ax.transAxes)
            ax.set_title(title)
            continue
        Ns = sorted({int(N) for key, _ in series for N in result[key]})
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(Ns, [str(N) for N in Ns])
        ax.set_xlabel("N")
        ax.set_ylabel("tau_2Gen (iterations)")
        ax.set_title(f"{title}\n{', '.join(slopes)}" if free else f"{title}\nslope vs N / log N: {', '.join(slopes)}",
                     fontsize=10)
        ax.legend(fontsize=8)
    if result.get("transformer_tau"):
        axes[3].clear()
        plot_transformer_tau(axes[3], result["transformer_tau"])
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return fig


def plot_transformer_tau(ax, summary: dict):
    """Fig. 6c bottom from the transformer's runs re-read (transformer_tau.transformer_summary): each seed's
    sustained-drop tau (filled), its first halfway crossing (hollow, the criterion it replaces), the head's formation
    (x, phi's sustained rise), runs without a tau
    as triangles at their bound (censored at the cap; 'no head': the drop's time, unconfirmed by phi), the medians
    with their order-statistic intervals, and the power law in N / log N through the medians with its slope's
    bootstrap interval and the seeds it rests on."""
    fit = summary["fit"]
    for N, row in summary["N"].items():
        n = int(N)
        for status, tau, bound, first, head in zip(row["status"], row["tau"], row["bound"], row["first_crossing"],
                                                   row["head"]):
            if status == "tau":
                ax.plot(n, tau, "o", color=COLORS["control"], alpha=0.5)
            elif status != "diverged":
                ax.plot(n, bound if status == "censored" else tau, "^", color="k" if status == "censored" else "tab:orange")
            if math.isfinite(first):
                ax.plot(n, first, "o", mfc="none", color="gray", alpha=0.6)
            if head is not None:
                ax.plot(n, head, "x", color="tab:purple", alpha=0.7)
        m = fit["N"][N]
        if math.isfinite(m["median"]):
            ax.errorbar(n, m["median"], [[m["median"] - m["interval"][0]], [max(0.0, m["interval"][1] - m["median"])]],
                        fmt="s", color="k", capsize=3)
    ax.plot([], [], "o", color=COLORS["control"], alpha=0.5, label="sustained drop, phi confirmed")
    ax.plot([], [], "o", mfc="none", color="gray", label="first halfway crossing")
    head = summary["fit_head"]["vs_N_over_logN"]
    ax.plot([], [], "x", color="tab:purple", label="head formed (phi's rise)" if head is None else  # the 95 % bootstrap
            f"head formed: slope {head['slope']:.2f} (95 % interval\n{head['slope_ci'][0]:.2f} to {head['slope_ci'][1]:.2f})")
    statuses = {status for row in summary["N"].values() for status in row["status"]}  # a marker in the legend if drawn
    if "censored" in statuses:
        ax.plot([], [], "^", color="k", label="censored at the cap (bound)")
    if "no head" in statuses:
        ax.plot([], [], "^", color="tab:orange", label="drop, no head (phi below PHI_FORMED)")
    ax.errorbar([], [], [], fmt="s", color="k", label="median over seeds, bar: its\nexact order-statistic interval")
    line = fit["vs_N_over_logN"]
    Ns = np.array(sorted(int(N) for N in summary["N"]), float)
    title = "transformer (no MLP1, non-AR): tau_2Gen = the loss's sustained drop"
    if line is not None:
        kept = np.array([N for N in Ns if int(N) not in fit["left_out"]])
        x = kept / np.log(kept)
        medians = np.array([fit["N"][str(int(N))]["median"] for N in kept])
        a = np.exp(np.mean(np.log(medians) - line["slope"] * np.log(x)))
        ax.plot(kept, a * x ** line["slope"], "-", color=COLORS["control"], label=f"fit: (N / log N)^{line['slope']:.2f}")
        ax.plot(kept, fit["prefactor"] * x, "--", color="gray", label=f"paper's law, {fit['prefactor']:.0f} N / log N")
        lo, hi = line["slope_ci"]
        seeds = set(line["seeds"])
        title += (f"\nslope vs N / log N {line['slope']:.2f} (95 % bootstrap interval {lo:.2f} to {hi:.2f}; paper: 1)"
                  f"\nslope vs N {fit['vs_N']['slope']:.2f}"
                  + (f", {seeds.pop()} seeds per N" if len(seeds) == 1 else f", seeds per N {line['seeds']}"))
    if fit["left_out"]:
        title += f"; left out (median beyond the runs): N = {fit['left_out']}"
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(Ns, [str(int(N)) for N in Ns])
    ax.set_xlabel("N")
    ax.set_ylabel("tau_2Gen (iterations)")
    ax.set_title(title, fontsize=9)
    # the legend in a band below the runs: the lowest points (the head's formation) sit at the bottom of the data
    ys = [y for artist in ax.get_lines() for y in artist.get_ydata() if 0 < y < math.inf]
    if ys:
        low, high = min(ys), max(ys)
        ax.set_ylim(low / (high / low) ** 0.6, high * (high / low) ** 0.08)
    ax.legend(fontsize=7, ncol=2, loc="lower center")


def write_figures(result: dict, out: str):
    """The five SA figures from `result` (sa_scaling.json's content, its trajectories under "runs")."""
    runs = result["runs"]
    dyn = {key: runs[name] for name, key in SETTINGS.items()}
    frozen = {ablate: runs[f"frozen_{'ablation' if ablate else 'control'}"] for ablate in (False, True)}
    plot_dynamics(dyn, os.path.join(out, "sa_dynamics.png"))
    plot_parameters(dyn[(False, False)][0], os.path.join(out, "sa_parameters.png"))
    plot_theory(result, os.path.join(out, "sa_theory.png"))
    plot_trajectories(result["landscape_origin"],
                      {setting: {"full model": dyn[(False, ablate)], "reduced model": dyn[(True, ablate)]}
                       for setting, ablate in (("control", False), ("ablation", True))},
                      os.path.join(out, "sa_trajectories.png"))
    plot_scaling(dyn, frozen, result, os.path.join(out, "sa_scaling.png"))


REPLOTTED = ("F_d", "F1_exact", "landscape", "landscape_origin", "tau", "tau_ablation", "tau_transformer", "tau_fits",
             "runs")  # what write_figures reads


def replot(path: str, train: tuple | None = None, w_third: int | None = None):
    """--replot [JSON]: the five figures from the JSON at path (FIGURES/sa_scaling.json), beside it, tau_2Gen refitted
    and the transformer's criterion re-read from its stored trajectories (cheap; a record without them keeps its first
    crossings); train: (preset, jobs, device) for --transformer-only, whose missing (N, seed) transformer runs are
    trained and merged in first, the JSON written as they finish; w_third: the number of processes for
    train_w_third's runs. The JSON is rewritten only when a number in it changed beyond float noise, and then with the
    others' last digits as they were (settle), so a pure redraw leaves a clone's record as it was."""
    figures = os.path.dirname(path)
    result = cli.read_json(path, REPLOTTED, "sa_scaling.py")
    before = json.loads(json.dumps(result))
    with cli.drawing(path, "sa_scaling.py") if train is None and w_third is None else contextlib.nullcontext():
        result = refit(result, before, path, train, w_third)
    if result == before:
        print(f"wrote {figures}/sa_*.png from {path} (tau refitted: the same numbers, the JSON left as it was)")
        return
    write_json(path, result, indent=1)
    print(f"wrote {figures}/sa_*.png and {path} (tau refitted, new numbers)")


def refit(result: dict, before: dict, path: str, train: tuple | None, w_third: int | None) -> dict:
    """replot's work: the record's fits redone (and its runs trained first, with train or w_third), the figures drawn
    beside path; returns the record to keep (settle: float noise left as it was)."""
    if train is not None:
        add_transformer_runs(result, *train, write=lambda r: write_json(path, r, indent=1))
    if "transformer_runs" in result:
        result["transformer_tau"] = transformer_summary(result["transformer_runs"])
    result["tau_fits"] = {key: fit_tau(result[key]) for key in ("tau", "tau_ablation", "tau_transformer")}
    if "runs" in result and "exponents" in result:  # each seed's exponents in the stated window, beside their mean's
        result["exponents_seeds"] = seed_exponents(result["runs"], result["exponents"])
        result["exponents_w_driven"] = {  # eq. (parameter_dynamics_simplest) along each run's own w(t)
            name: summarize_exponents([{**r, **w_driven(r, result["I"]), "tau": r["tau"]} for r in result["runs"][name]],
                                      EXPONENT_WINDOWS, result["exponents"][name]["tau_mean"])
            for name in ("full_control", "full_ablation")}
    if w_third is not None:
        result["w_third"] = train_w_third(result, w_third)
    result = settle(result, before)
    write_figures(result, os.path.dirname(path))
    return result


def main():
    parser = cli.ArgumentParser(description="SA-transformer: dynamics, theory and tau_2Gen scaling (Figs. 5, 6, A4, A7); "
                                            "runs on the CPU, as one-thread processes.", runs=(
        "Default run: 9 min 54 s on the 2-core development VM as two processes (2026-11-26) (quick preset: tau_2Gen at "
        "N = 32, 64, 128, 256, dynamics at N = 64, the theory's landscapes; --transformer ~2.5 h more); writes "
        "figures/sa_dynamics.png, figures/sa_parameters.png, figures/sa_theory.png, figures/sa_trajectories.png, "
        "figures/sa_scaling.png and figures/sa_scaling.json.\n--replot: seconds, trains nothing."))
    cli.add_preset(parser, PRESETS, "quick: tau at N = 32..256, dynamics at N = 64, no transformer; paper: N = 32..1024, "
                                    "dynamics at N = 128, the transformer")
    parser.add_argument("--N", type=cli.at_least(2), default=None, help="sequence length of the dynamics runs (default: quick 64, paper 128)")
    parser.add_argument("--transformer", action="store_true", help="quick preset: also time the transformer (Fig. 6c bottom)")
    cli.add_device(parser)
    cli.add_jobs(parser)
    cli.add_threads(parser)
    cli.add_figures(parser)
    cli.add_replot(parser, "FIGURES/sa_scaling.json", "the five figures (sa_*.png)")
    parser.add_argument("--transformer-only", action="store_true",
                        help="only the transformer runs (Fig. 6c bottom) at the preset's (N, seed) whose trajectory "
                             "FIGURES/sa_scaling.json does not hold yet, merged into it as they finish; then --replot. "
                             "On CUDA the seeds of an N train as one batched model")
    parser.add_argument("--w-third", action="store_true",
                        help="only the full model with w held at (0, 1/3, 1/3, 1/3) (W_THIRD: N = 64, 128, 5 seeds, "
                             "control and ablation; CPU ~20 min on one core), into FIGURES/sa_scaling.json; then --replot")
    args = parser.parse_args()
    device = cli.device(args.device)
    if args.replot is not None or args.transformer_only or args.w_third:
        cli.writable_dir(args.figures, "--figures")
        train = (PRESETS[cli.preset(args.preset)], args.jobs, device) if args.transformer_only else None
        replot(cli.replot_path(args, "sa_scaling.json"), train, args.jobs if args.w_third else None)
        return
    preset = cli.preset(args.preset)
    cli.set_threads(args.threads)
    P = dict(PRESETS[preset], transformer=PRESETS[preset]["transformer"] or args.transformer)
    if args.N is not None:
        P["N_dyn"] = args.N
    jobs = args.jobs
    # the record's transformer runs (hours of training) stay in the record this call rewrites; runs of another protocol
    # must not go into one fit with them
    kept = previous_transformer_runs(os.path.join(args.figures, "sa_scaling.json"))
    if P["transformer"]:
        check_protocol(kept, P)
    cli.writable_dir(args.figures, "--figures")
    cli.announce(preset, f"tau_2Gen at N = {P['N_tau']}, dynamics at N = {P['N_dyn']}, {jobs} processes",
                 f"{args.figures}/sa_*.png and sa_scaling.json")
    t0 = time.time()
    result = {"preset": preset, **theory(P)}
    dyn, tau_runs = train_sa_series(P, jobs)
    frozen, w_plateau, tau_control = train_frozen(P, dyn[(False, False)], jobs)
    result.update(dynamics_summary(dyn, frozen, w_plateau, tau_control, result["I"], P["N_dyn"]))
    result.update(scaling_summary(tau_runs))
    if kept:
        result["transformer_runs"] = kept
    if P["transformer"]:
        merge_transformer_runs(result, train_transformers(P, jobs, device))
    elif kept:
        result["transformer_tau"] = transformer_summary(kept)
    result.update(landscapes(P))
    result["runs"] = run_records(dyn, frozen)
    result["seconds"] = round(time.time() - t0, 1)
    write_json(os.path.join(args.figures, "sa_scaling.json"), result, indent=1)
    write_figures(json.loads(json.dumps(result)), args.figures)  # from the JSON, as --replot draws them
    print(json.dumps({k: result[k] for k in ("tau", "tau_ablation", "tau_transformer", "tau_fits", "beta_exponent_control",
                                             "delta_exponent_control", "beta_exponent_ablation", "delta_exponent_ablation",
                                             "final_loss", "loss_2gen", "w_early", "w_final", "rates", "seconds")}
                      | {"transformer_fit": result.get("transformer_tau", {}).get("fit")}, indent=1))
    print(f"wrote {args.figures}/sa_*.png and sa_scaling.json in {result['seconds'] / 60:.1f} min")

if __name__ == "__main__":
    cli.run(main)
