"""Analysis and figures of the SA-transformer runs (sa_transformer.py): power-law and rate fits of
beta(t), delta(t) on the plateau, the fit of tau_2Gen(N) against N / log N (Fig. 6c), the paper's
normalized views of P1, M1 and M2 (Fig. 5c, A4), and the figures: loss and mixture weights (Fig. 5b),
parameters over training (Fig. 5c, A4), F_d and the landscape (Fig. 6a), the (beta, delta)
trajectories over the near-origin landscapes (Fig. A7) and the dynamics and scaling (Fig. 6b-c).

A run is the dict sa_transformer.train_sa returns: "t", "loss", "masked_loss", "beta", "delta", "w"
(lists over evaluations), "tau", "levels", "run" and, for the full model, "snapshots" {t: {"M1", "P1",
"M2", "P2"}}.
"""
import math

import matplotlib.pyplot as plt
import numpy as np
import torch

from sa_model import C


def fit_rate(t, y, lo: float, hi: float) -> float:
    """Slope of y against t over lo <= t <= hi (nan with fewer than 3 points)."""
    t, y = np.asarray(t, float), np.asarray(y, float)
    keep = (t >= lo) & (t <= hi)
    return float(np.polyfit(t[keep], y[keep], 1)[0]) if keep.sum() >= 3 else math.nan


def fit_power(t, y, lo: float, hi: float) -> float:
    """Slope of log y against log t over lo <= t <= hi (points with y > 0 and t > 0)."""
    t, y = np.asarray(t, float), np.asarray(y, float)
    keep = (t >= lo) & (t <= hi) & (y > 0) & (t > 0)
    if keep.sum() < 3:
        return math.nan
    return float(np.polyfit(np.log(t[keep]), np.log(y[keep]), 1)[0])


def seed_mean(runs: list[dict], key: str) -> tuple[np.ndarray, np.ndarray]:
    """(t, mean over seeds of runs[*][key]) on the evaluation steps all seeds reached (early
    stopping makes the trajectories end at different steps)."""
    n = min(len(r["t"]) for r in runs)
    return np.asarray(runs[0]["t"][:n], float), np.mean([np.asarray(r[key][:n], float) for r in runs], 0)


def summarize_exponents(runs: list[dict], windows: list[tuple[float, float]], tau: float | None = None) -> dict:
    """beta(t) and delta(t) averaged over seeds, fitted as powers of t over windows given as
    fractions of tau (default: the seeds' mean tau), i.e. on the plateau before the nonlinear regime."""
    if tau is None:
        taus = [r["tau"] for r in runs if np.isfinite(r["tau"])]
        tau = float(np.mean(taus)) if taus else math.nan
    out = {"tau_mean": tau}
    for key in ("beta", "delta"):
        t, mean = seed_mean(runs, key)
        out[key] = {f"{lo:g}-{hi:g}": fit_power(t, mean, lo * tau, hi * tau) for lo, hi in windows}
    return out


def fit_tau(tau_by_N: dict) -> dict:
    """tau_2Gen(N) against the prediction tau ~ N / H_N ~ N / log N: the slope of log(mean tau) against
    log(N / log N) (1 if the prediction holds) and against log N, and the prefactor a of the
    one-parameter fit tau = a N / log N (geometric mean of tau log N / N). Seeds that never crossed are
    left out; an N with no crossing is left out; nan with fewer than two N."""
    Ns, means = [], []
    for N, taus in tau_by_N.items():
        finite = [t for t in taus if np.isfinite(t)]
        if finite:
            Ns.append(int(N))
            means.append(float(np.mean(finite)))
    if len(Ns) < 2:
        return {"slope_vs_N_over_logN": math.nan, "slope_vs_N": math.nan, "prefactor": math.nan, "N": Ns}
    Ns, means = np.array(Ns, float), np.array(means)
    x = Ns / np.log(Ns)
    return {"slope_vs_N_over_logN": float(np.polyfit(np.log(x), np.log(means), 1)[0]),
            "slope_vs_N": float(np.polyfit(np.log(Ns), np.log(means), 1)[0]),
            "prefactor": float(np.exp(np.mean(np.log(means / x)))), "N": Ns.astype(int).tolist()}


def normalized_parameters(snapshot: dict) -> dict:
    """The views of Fig. 5c: P1 as the attention the last position pays by position alone,
    softmax over lags i - j of P1 ("P1", (N,)); and the h.x block of M2 (beta's) as the attention a
    query in state mu pays to a key whose layer-1 content is state nu, softmax over nu for each mu
    ("M2_hx", (C, C), [nu, mu], columns sum to 1). Likewise M1 as layer-1 attention by content,
    softmax over the key state for each query state ("M1", [key, query])."""
    P1, M1, M2 = (torch.tensor(snapshot[k], dtype=torch.float64) for k in ("P1", "M1", "M2"))
    return {"P1": torch.softmax(P1, 0).tolist(), "M1": torch.softmax(M1, 0).tolist(),
            "M2_hx": torch.softmax(M2[C:, :C], 0).tolist()}


# ----------------------------------------------------------------------------- figures

COLORS = {"control": "tab:blue", "ablation": "tab:red"}


def plot_dynamics(dyn: dict, path: str):
    """Fig. 5b and the w_A..w_D figure: masked loss vs iterations against the 1-Gen / 2-Gen levels
    (every seed, control and ablation), and the mixture weights of the full model."""
    fig, axes = plt.subplots(1, 3, figsize=(16, 4))
    for ax, ablate in ((axes[0], False), (axes[1], True)):
        runs = dyn[(False, ablate)]
        for i, r in enumerate(runs):
            ax.plot(r["t"], r["masked_loss"], color="k", alpha=1.0 if i == 0 else 0.35, lw=1)
        ax.axhline(np.mean([r["levels"]["masked_loss_frequencies"] for r in runs]), color="tab:green", ls=":",
                   label="raw frequencies (the SA 1-Gen plateau)")
        ax.axhline(np.mean([r["levels"]["masked_loss_1gen"] for r in runs]), color="tab:green", ls="--", label="1-Gen (Bayes)")
        ax.axhline(np.mean([r["levels"]["masked_loss_2gen"] for r in runs]), color="tab:blue", ls="--", label="2-Gen (Bayes)")
        ax.set_title(f"SA-transformer, N = {runs[0]['run']['N']}, {'bias ablation' if ablate else 'control'}")
        ax.set_xlabel("iteration")
        ax.set_ylabel("loss on samples whose target is in the context")
        ax.legend()
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


def plot_theory(result: dict, path: str):
    """F_d against d with the closed form F_1, and the loss landscape over (beta, delta) with w
    optimized (Fig. 6a); the near-origin landscapes are Fig. A7's (`plot_trajectories`)."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    d = np.arange(1, len(result["F_d"]) + 1)
    axes[0].semilogy(d, np.abs(result["F_d"]), "o-", label="|F_d| (Monte Carlo)")
    axes[0].axhline(result["F1_exact"], color="k", ls="--", label="F_1 = (C-1)/(C^2 alpha + C)")
    axes[0].set_xlabel("d")
    axes[0].set_title("F_d = <sum_mu (T^{d+1})_{mu mu}> - 1")
    axes[0].legend(fontsize=8)
    L = result["landscape"]
    im = axes[1].pcolormesh(L["beta"], L["delta"], np.array(L["loss"]), shading="nearest", cmap="viridis")
    fig.colorbar(im, ax=axes[1])
    axes[1].set_xlabel("beta")
    axes[1].set_ylabel("delta")
    axes[1].set_title(f"loss at N = {L['N']}, w_A..w_D optimized", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_parameters(run: dict, path: str):
    """Fig. 5c and Fig. A4 over training: the paper's normalized views (P1 as positional attention,
    M2's h.x block as attention by content, M1 likewise; `normalized_parameters`), then the raw
    P1, P2 and the four C x C blocks of M2 (key . query)."""
    snaps = sorted(run["snapshots"].items(), key=lambda kv: int(kv[0]))
    fig, axes = plt.subplots(len(snaps), 8, figsize=(21, 2.4 * len(snaps)), squeeze=False)
    for row, (t, p) in zip(axes, snaps):
        view = normalized_parameters(p)
        P1, P2, M2 = np.array(p["P1"]), np.array(p["P2"]), np.array(p["M2"])
        row[0].bar(range(8), view["P1"][:8])
        row[0].set_ylim(0, 1)
        row[0].set_title(f"t = {t}: softmax P1, lag i - j < 8", fontsize=8)
        for ax, key, title in ((row[1], "M2_hx", "M2 h.x normalized (beta)"), (row[2], "M1", "M1 normalized")):
            ax.imshow(np.array(view[key]), cmap="viridis", vmin=0, vmax=1)
            ax.set_title(f"{title}: key x query", fontsize=8)
            ax.set_xticks([])
            ax.set_yticks([])
        row[3].bar(range(8), P1[:8], color="gray")
        row[3].bar(range(8), P2[:8], color="tab:orange", alpha=0.6)
        row[3].set_title("raw P1 (gray), P2[N - i] (orange)", fontsize=8)
        lim = max(1e-6, np.abs(M2).max())
        for k, (name, block) in enumerate((("x.x", M2[:C, :C]), ("x.h", M2[:C, C:]), ("h.x (beta)", M2[C:, :C]), ("h.h", M2[C:, C:]))):
            row[4 + k].imshow(block, cmap="RdBu_r", vmin=-lim, vmax=lim)
            row[4 + k].set_title(f"raw M2 {name} (key . query)", fontsize=8)
            row[4 + k].set_xticks([])
            row[4 + k].set_yticks([])
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


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
        fig.colorbar(im, ax=ax)
        for (label, group), ls in zip(runs[setting].items(), ("--", ":", "-.")):
            _, beta = seed_mean(group, "beta")
            _, delta = seed_mean(group, "delta")
            ax.plot(beta, delta, color="w", ls=ls, lw=1.5, label=label)
        ax.set_xlim(min(origin["beta"]), max(origin["beta"]))
        ax.set_ylim(min(origin["delta"]), max(origin["delta"]))
        ax.set_xlabel("beta")
        ax.set_ylabel("delta")
        ax.set_title(f"{'bias ablation' if setting == 'ablation' else 'original data'}, N = {origin['N']}: "
                     "loss minus loss at 0, (beta, delta)(t)", fontsize=9)
        ax.legend(fontsize=7, facecolor="0.6")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return fig


def plot_scaling(dyn: dict, frozen: dict, result: dict, path: str):
    """Fig. 6b-c: beta and delta against t (control vs ablation; full, reduced and frozen-w models),
    tau_2Gen against N for the SA-transformer (control and ablation, Fig. 6c top) and the transformer
    (Fig. 6c bottom), each with its fit tau = a N / log N. Returns the figure (closed)."""
    fig, axes = plt.subplots(1, 4, figsize=(19, 4))
    for col, key in ((0, "beta"), (1, "delta")):
        ax = axes[col]
        for (reduced, ablate), runs in dyn.items():
            label = f"{'reduced' if reduced else 'full'}, {'ablation' if ablate else 'control'}"
            t, mean = seed_mean(runs, key)
            keep = (t > 0) & (mean > 0)
            ax.loglog(t[keep], mean[keep], color=COLORS["ablation" if ablate else "control"], ls=":" if reduced else "-", label=label)
        for ablate, runs in frozen.items():
            t, mean = seed_mean(runs, key)
            keep = (t > 0) & (mean > 0)
            ax.loglog(t[keep], mean[keep], color=COLORS["ablation" if ablate else "control"], ls="--", lw=1,
                      label=f"reduced, w frozen, {'ablation' if ablate else 'control'}")
        t, mean = seed_mean(dyn[(False, False)], key)
        keep = (t > 0) & (mean > 0)
        if keep.any():  # guides through the control curve's first point
            t_ref = np.array([t[keep][0], t[keep][-1]])
            ax.loglog(t_ref, mean[keep][0] * (t_ref / t_ref[0]), "k:", lw=0.8, label="~ t")
            ax.loglog(t_ref, mean[keep][0] * (t_ref / t_ref[0]) ** 2, "k-.", lw=0.8, label="~ t^2")
        ax.set_ylim(bottom=max(1e-5, ax.get_ylim()[0]))
        ax.set_xlabel("iteration t")
        ax.set_title(f"{key} (mean over seeds); exponents in sa_scaling.json", fontsize=9)
        ax.legend(fontsize=6)
    panels = ((axes[2], (("tau", "control"), ("tau_ablation", "ablation")), "SA-transformer"),
              (axes[3], (("tau_transformer", "control"),), "transformer, no MLP1, non-AR"))
    for ax, series, title in panels:
        slopes = []
        for key, setting in series:
            points = [(int(N), tau) for N, taus in result[key].items() for tau in taus if np.isfinite(tau)]
            fit = result["tau_fits"][key]
            if not points or not np.isfinite(fit["prefactor"]):
                continue
            ax.plot(*zip(*points), "o", color=COLORS[setting], alpha=0.5, label=f"{setting} (seeds)")
            Ns = np.array(fit["N"], float)
            ax.plot(Ns, fit["prefactor"] * Ns / np.log(Ns), "--", color=COLORS[setting], label=f"{fit['prefactor']:.0f} N / log N")
            slopes.append(f"{setting} {fit['slope_vs_N_over_logN']:.2f}")
        if not slopes:
            ax.text(0.5, 0.5, "not run (add --transformer)" if not result[series[0][0]] else "no transition within the budget",
                    ha="center", transform=ax.transAxes)
            ax.set_title(title)
            continue
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("N")
        ax.set_ylabel("tau_2Gen (iterations)")
        ax.set_title(f"{title}: slope vs N / log N: {', '.join(slopes)}", fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return fig
