"""The fits of the SA-transformer's runs (sa_transformer.train_sa's records) that the scripts share: power-law and
rate fits of beta(t), delta(t) on the plateau (Fig. 6b), and tau_2Gen(N) against N / log N (Fig. 6c), by the seeds'
means (fit_tau) or, where a run may have no tau, by their medians with intervals (fit_tau_censored: the transformer's
record of Fig. 6c bottom and the ladder of tau_settings.py); and for the ladder, tau = T0 + c N / log N (offset_fit:
the law's part under an N-independent one) and the slope of a rate against the theory's (rate_slope), each with
intervals that resample the seeds within each N.

A run: "t", "masked_loss", "beta", "delta", "w" (lists over evaluations), "tau", "levels" and "run".
"""
import math

import numpy as np

from analysis.estimators import line_through_medians, median_ci, median_coverage, median_rank


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


def resampled_medians(values: dict, rng) -> dict:
    """One bootstrap draw of the medians per N ({N: [value per seed]}): each N's seeds resampled with replacement
    (nan where it has none), the interval of rate_slope and offset_fit."""
    return {N: float(np.median(rng.choice(v, len(v)))) if len(v) else math.nan for N, v in values.items()}


def rate_slope(rates: dict, theory: dict, resamples: int = 2000, level: float = 0.95) -> tuple:
    """(slope, [lo, hi]): the slope of log median rate against log theory rate over the N ({N: [rate per seed]}),
    and its bootstrap percentile interval from resampling the seeds within each N (with 2 seeds: a nominal level,
    not a coverage; a resample with fewer than two positive medians is left out). (None, None) if it cannot be fitted."""
    def fit(medians: dict):
        kept = [N for N, m in medians.items() if math.isfinite(m) and m > 0]
        if len(kept) < 2:
            return None
        return float(np.polyfit(np.log([theory[N] for N in kept]), np.log([medians[N] for N in kept]), 1)[0])

    point = fit({N: float(np.median(v)) if v else math.nan for N, v in rates.items()})
    if point is None:
        return None, None
    rng = np.random.default_rng(0)
    boot = [fit(resampled_medians(rates, rng))
            for _ in range(resamples)]
    boot = np.array([b for b in boot if b is not None])
    q = (1 - level) / 2
    return point, [float(np.quantile(boot, q)), float(np.quantile(boot, 1 - q))]


def offset_fit(values: dict, resamples: int = 2000, level: float = 0.95) -> dict | None:
    """tau = T0 + c N / log N through the medians per N ({N: [tau or head per seed, None where there is none]}): an
    N-independent part T0 (steps before and after the plateau's escape) and the theory's law c N / log N. A log-log
    slope reads a large T0 as flatness even where the law holds; c (steps per unit of N / log N) and its share of tau
    at the largest N, c x / (T0 + c x), tell the two apart. Intervals: bootstrap percentiles from resampling the seeds
    within each N (with 2 seeds a nominal level, not a coverage); None with fewer than 3 N."""
    finite = {N: [x for x in v if x is not None] for N, v in values.items()}
    Ns = sorted((N for N, v in finite.items() if v), key=int)
    if len(Ns) < 3:
        return None
    x = np.array([int(N) / math.log(int(N)) for N in Ns])

    def fit(medians: list) -> tuple:
        c, T0 = np.polyfit(x, medians, 1)
        return float(T0), float(c), float(c * x[-1] / (T0 + c * x[-1]))

    T0, c, share = fit([float(np.median(finite[N])) for N in Ns])
    rng = np.random.default_rng(0)
    boot = np.array([fit(list(resampled_medians({N: finite[N] for N in Ns}, rng).values()))
                     for _ in range(resamples)])
    q = (1 - level) / 2
    lo, hi = np.quantile(boot, q, axis=0), np.quantile(boot, 1 - q, axis=0)
    return {"N": [int(N) for N in Ns], "seeds": [len(finite[N]) for N in Ns], "T0": T0, "T0_ci": [lo[0], hi[0]],
            "c": c, "c_ci": [lo[1], hi[1]], "share": share, "share_ci": [lo[2], hi[2]]}
