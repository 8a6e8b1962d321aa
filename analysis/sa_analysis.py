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
from matplotlib.ticker import MaxNLocator

from analysis.estimators import line_through_medians, median_ci, median_coverage, median_rank
from analysis.sa_model import C


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


EXPONENT_WINDOWS = [(0.05, 0.5), (0.02, 0.3), (0.1, 0.7)]  # the plateau, in fractions of the mean tau; the first stated


def seed_exponents(runs: dict, exponents: dict, window: tuple[float, float] = EXPONENT_WINDOWS[0]) -> dict:
    """Each seed's own power of t for beta and delta, {setting: {key: [one per seed]}}, over the window (fractions of
    the setting's mean tau, exponents[setting]["tau_mean"]) in which summarize_exponents fits the seeds' mean: the
    spread the seeds give beside the windows' (three seeds: a spread, not an interval)."""
    lo, hi = window
    return {name: {key: [fit_power(r["t"], r[key], lo * exponents[name]["tau_mean"], hi * exponents[name]["tau_mean"])
                         for r in rs] for key in ("beta", "delta")}
            for name, rs in runs.items() if name in exponents}


def fit_tau(tau_by_N: dict) -> dict:
    """tau_2Gen(N) against the prediction tau ~ N / H_N ~ N / log N: the slope of log(mean tau) against
    log(N / log N) (1 if the prediction holds; tau = prefactor_vs_N_over_logN (N / log N)^slope) and against
    log N and against log(N / H_N) (the harmonic number, the theory's form before H_N ~ log N), and the prefactor a of
    the one-parameter fit tau = a N / log N (geometric mean of tau log N / N). Seeds that
    never crossed are left out; an N with no crossing is left out; nan with fewer than two N. Each fit has its
    residual sum of squares in log tau (which of the two laws the points follow better).

    The spread: with two or three seeds per N no interval has a stated coverage, so each slope is also fitted to
    each seed alone (seed i: the i-th tau at every N; nan for a seed missing at some N), and "..._seeds" lists them
    and "..._range" gives their [min, max], which says how much the seeds disagree and nothing more."""
    finite = {int(N): np.array([t for t in taus if np.isfinite(t)], float) for N, taus in tau_by_N.items()}
    finite = {N: t for N, t in sorted(finite.items()) if len(t)}
    if len(finite) < 2:
        return {"slope_vs_N_over_logN": math.nan, "prefactor_vs_N_over_logN": math.nan, "slope_vs_N": math.nan,
                "prefactor_vs_N": math.nan, "prefactor": math.nan, "N": list(finite)}
    Ns = np.array(list(finite), float)
    x = Ns / np.log(Ns)
    x_H = Ns / np.array([sum(1 / k for k in range(1, int(N) + 1)) for N in Ns])  # N / H_N, the theory's own form

    def slopes(means):
        return (np.polyfit(np.log(x), np.log(means), 1)[0], np.polyfit(np.log(Ns), np.log(means), 1)[0],
                np.polyfit(np.log(x_H), np.log(means), 1)[0])

    means = np.array([t.mean() for t in finite.values()])
    slope, intercept = np.polyfit(np.log(Ns), np.log(means), 1)
    intercept_x = np.polyfit(np.log(x), np.log(means), 1)[1]
    rows = [np.asarray(tau_by_N.get(N, tau_by_N.get(str(N))), float) for N in finite]
    n_seeds = max(len(r) for r in rows)
    per_seed = np.array([slopes([r[i] for r in rows]) if all(len(r) > i and np.isfinite(r[i]) for r in rows)
                         else (math.nan, math.nan, math.nan) for i in range(n_seeds)])

    def rss(X):
        return float(np.sum((np.log(means) - np.polyval(np.polyfit(np.log(X), np.log(means), 1), np.log(X))) ** 2))

    def spread(col):
        return [float(np.nanmin(col)), float(np.nanmax(col))] if np.isfinite(col).any() else [math.nan, math.nan]

    return {"slope_vs_N_over_logN": float(slopes(means)[0]), "prefactor_vs_N_over_logN": float(np.exp(intercept_x)),
            "slope_vs_N": float(slope),
            "prefactor_vs_N": float(np.exp(intercept)),  # tau = prefactor_vs_N N^slope_vs_N
            "prefactor": float(np.exp(np.mean(np.log(means / x)))), "N": Ns.astype(int).tolist(),
            "slope_vs_N_over_logN_seeds": per_seed[:, 0].tolist(), "slope_vs_N_seeds": per_seed[:, 1].tolist(),
            "slope_vs_N_over_logN_range": spread(per_seed[:, 0]), "slope_vs_N_range": spread(per_seed[:, 1]),
            "slope_vs_N_over_HN": float(slopes(means)[2]), "slope_vs_N_over_HN_range": spread(per_seed[:, 2]),
            "rss_vs_N_over_logN": rss(x), "rss_vs_N": rss(Ns)}


def fit_tau_censored(tau_by_N: dict, level: float = 0.95, resamples: int = 2000) -> dict:
    """tau_2Gen(N) over seeds where a run may have no tau (None: censored at its step cap, or a drop the induction
    readout did not confirm; counted as longer than any tau, never fitted as a value). Per N: the seeds, how many have
    no tau, the median and its exact order-statistic interval with the coverage the seeds allow (estimators.median_ci,
    median_coverage: 8 seeds at 95 % give [min, max], 99.2 %, [x_(2), x_(7)] covering 93 %; inf where the median is
    beyond the runs). The slopes of
    log(median tau) against log(N / log N) (1 if the paper's law holds) and against log N (the power of N), each with
    the 95 % bootstrap interval of resampling the seeds within each N ("seeds": how many it rests on per N; with a
    handful a nominal level, not a coverage), through the N whose median is finite; those left out are listed."""
    Ns = sorted(tau_by_N, key=int)
    values = [list(tau_by_N[N]) for N in Ns]
    per_N = {}
    for N, v in zip(Ns, values):
        median, lo, hi = median_ci(v, level)
        per_N[str(N)] = {"seeds": len(v), "no_tau": sum(x is None for x in v), "median": median, "interval": [lo, hi],
                         "coverage": median_coverage(len(v), median_rank(len(v), level))}
    kept = [i for i, N in enumerate(Ns) if math.isfinite(per_N[str(N)]["median"])]
    out = {"N": per_N, "left_out": [int(Ns[i]) for i in range(len(Ns)) if i not in kept]}
    logs = [[None if x is None else math.log(x) for x in values[i]] for i in kept]
    n = np.array([int(Ns[i]) for i in kept], float)
    for name, x in (("vs_N_over_logN", np.log(n / np.log(n))), ("vs_N", np.log(n))):
        line = line_through_medians(x.tolist(), logs, level, resamples) if len(kept) >= 2 else None
        out[name] = None if line is None else {key: line[key] for key in ("slope", "slope_ci", "seeds", "resamples")}
    if out["vs_N_over_logN"] is not None:  # tau = a N / log N through the medians (geometric mean of the ratios)
        out["prefactor"] = float(np.exp(np.mean([math.log(per_N[str(Ns[i])]["median"]) for i in kept] - np.log(n / np.log(n)))))
    return out


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
        for axis in (ax.xaxis, ax.yaxis):  # nine ticks on a 4-inch axis ran together
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
        held = result.get("w_third", {}).get("runs", {})  # the full model with w held at 1/3, at the dynamics runs' N
        for setting, runs in (held.get(str(dyn[(False, False)][0]["run"]["N"]), {}) if held else {}).items():
            t, mean = seed_mean(runs, key)
            keep = (t > 0) & (mean > 0)
            ax.loglog(t[keep], mean[keep], color=COLORS[setting], ls=(0, (5, 1, 1, 1, 1, 1)), lw=1.2,
                      label=f"full, w held at 1/3, {setting}")
        t, mean = seed_mean(dyn[(False, False)], key)
        keep = (t > 0) & (mean > 0)
        if keep.any():  # guides through the control curve's first point
            t_ref = np.array([t[keep][0], t[keep][-1]])
            ax.loglog(t_ref, mean[keep][0] * (t_ref / t_ref[0]), "k:", lw=0.8, label=r"$\propto t$")
            ax.loglog(t_ref, mean[keep][0] * (t_ref / t_ref[0]) ** 2, "k-.", lw=0.8, label=r"$\propto t^2$")
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
    """Fig. 6c bottom from the transformer's runs re-read (sa_transformer.transformer_summary): each seed's
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
