"""Why the transformer's tau_2Gen(N) does not grow with N (Fig. 6c bottom; Sec. "The transition from G1 to G2",
Appendix "Testing predictions"): the runs of Fig. 6c bottom again at other settings, each a rung that can restore the
theory's tau ~ N / log N, and the theory's coordinates measured in both models.

At the settings of the committed record (sa_transformer.py --transformer-only: SGD, lr 0.05, momentum 0.9, batch
128, ours; the paper says only "SGD with momentum") the induction head forms at ~2300-3000 steps at every N = 32..256,
while the theory's rate H_N / N falls x5.3 over that range. Which difference from the theory's regime takes the runs
out of it? The SGD settings first:

    gradient noise   one target per sequence: batch 512 quarters the gradient's variance at the same lr.
    the optimizer    momentum 0 at lr 0.5, the same step in the small-lr limit (lr / (1 - momentum)); and lr 0.0125
                     and 0.003125 at momentum 0.9, a quarter and a sixteenth of the step (towards gradient flow,
                     slower in steps: in that limit 4x and 16x the steps).
    position bias    layer 2's held at zero: the theory's layer 2 attends uniformly over the N positions at the start
                     (the SA-transformer's P2 starts at zero); a learned recency window would cut the 1 / N dilution.
then the model's differences from the SA-transformer (knock-outs):
    the start        the theory starts at uniform attention and the 1-Gen readout: W_Q, W_K of both layers x 0.05
                     (attention near uniform) and W_U at zero.
    layer 1          a recency window: layer 1's position bias learns at lags 0 and 1 only.
and the readout: phi_beta(2)'s early growth on the plateau against the theory's (H_N / N)^2 (RESULTS.md derives it),
from every run here and from the committed record's. A rung restores the law when the head's slope against
N / log N is >= 0.6; <= 0.3 it does not.

    python tau_settings.py                  # every setting at N = 32, 64, 128, seeds 0-1 (CPU, ~5 h on 2 cores), then
                                            # figures/tau_settings.png and .json
    python tau_settings.py --settings window1   # only those settings' runs, added to the committed JSON's
    python tau_settings.py --measure        # the theory's coordinates (MEASURE), figures/tau_velocities.png and .json
    python tau_settings.py --replot         # only redraw both figures from their JSON

Each run is train_one's (analysis/transformer_tau.py) with the setting: its own seed's model, batches and
evaluation set, so a setting's run is paired with the committed record's run of the same (N, seed). Each finished run
is kept as ROOT/<setting>_N<N>_s<seed>.json (a killed screen resumes from them); the figure's JSON holds them all.
"""
import json
import math
import os
import re

import matplotlib.pyplot as plt
import numpy as np

import torch
import torch.nn.functional as F

from analysis.estimators import median_ci
from analysis.sa_model import C, SATransformer, layers, target_loss
from analysis.sa_analysis import fit_tau_censored
from analysis.transformer_tau import (TRAINING, fresh_batch, induction, last_position, model_for, rounded_run,
                                      tau_2gen_drop, train_one)
from markov import check_int
from plumbing import cli
from sa_transformer import Run, train_sa, transformer_summary
from transformer import layer_norm

SETTINGS = {  # name: (the SGD settings, what it tests)
    "batch512": ({**TRAINING, "batch": 512}, "gradient noise / 4"),
    "momentum0": ({**TRAINING, "lr": 0.5, "momentum": 0.0}, "no momentum, the same small-lr step"),
    "lr0.0125": ({**TRAINING, "lr": 0.0125}, "a quarter of the step"),
    "lr0.003125": ({**TRAINING, "lr": 0.003125}, "a sixteenth of the step"),
    "frozenP2": ({**TRAINING, "frozen": ["att2.P"]}, "layer 2's position bias held at zero"),
    "smallstart": ({**TRAINING, "init": {"scale": {f"att{l}.W_{m}.weight": 0.05 for l in (1, 2) for m in "QK"},
                                         "zero": ["W_U.weight"]}}, "the theory's start: W_Q, W_K x 0.05, W_U at zero"),
    "window1": ({**TRAINING, "trainable": {"att1.P": [0, 1]}}, "layer 1's position bias learns at lags 0-1 only"),
}
CAPS = {"batch512": 6000, "momentum0": 6000, "lr0.0125": 20000, "lr0.003125": 40000,  # steps: in gradient flow a
        "frozenP2": 20000, "smallstart": 20000, "window1": 20000}  # step of 1/4 (1/16) needs 4x (16x) the record's
# ~2500 to the head; the knock-outs get the record's paper-protocol cap
HYBRIDS = {  # the SA-transformer's side of the ladder: name: (its readout, what it tests); "sa", the parent, is the
    # committed record's (figures/sa_scaling.json's tau)
    "sa_softmax": ("softmax", "the SA-transformer with a learned readout and a softmax (the transformer's kind)"),
}
HYBRID_CAP = 12000  # steps: the SA-transformer's tau at N = 128 is ~2800; a run stops at 1.2 x its tau
DESCRIBE = {**{name: what for name, (_, what) in SETTINGS.items()}, **{name: what for name, (_, what) in HYBRIDS.items()},
            "sa": "the SA-transformer itself (the record's control tau)"}
SCREEN = dict(N=(32, 64, 128), seeds=(0, 1), eval_batch=2048,  # eval_batch: the committed record's (its eval sets)
              eval_every=50)  # the hybrids' (the transformer's: TRAINING's)
HEAD_FRACTION = 0.5  # the early rate: phi's slope over the evaluations before this fraction of the head's formation


def run_path(root: str, name: str, N: int, seed: int) -> str:
    return os.path.join(root, f"{name}_N{N}_s{seed}.json")


def _run_job(job: tuple) -> dict:
    return _hybrid_job(job) if job[1] in HYBRIDS else _train_job(job)


def _train_job(job: tuple) -> dict:
    root, name, N, seed = job
    run = rounded_run(train_one(N, seed, CAPS[name], SCREEN["eval_batch"], training=SETTINGS[name][0]))
    path = run_path(root, name, N, seed)
    with open(path + ".tmp", "w") as f:
        json.dump(run, f)
    os.replace(path + ".tmp", path)  # atomic: a killed screen leaves whole runs only
    return run


def _hybrid_job(job: tuple) -> dict:
    """One SA-transformer run of the ladder (sa_transformer.train_sa: its own SGD, lr 1, batch 256, and its own tau,
    the masked loss's halfway crossing from the 1-Gen frequencies to 2-Gen, run to 1.2 x tau or the cap), with
    phi_beta(2) on its evaluation set beside the loss. The SA-transformer's phi stays below PHI_FORMED (~0.26 at
    N = 32 after 10,000 steps: its beta reaches ~2, not an attention that picks the matching positions alone), so
    the SA side is compared by its tau, the parent's from the committed record."""
    root, name, N, seed = job
    context = fresh_batch(SCREEN["eval_batch"], N, torch.Generator().manual_seed(10**6 + N))[0]  # train_sa's eval set
    phi = []

    def measure(t, model):
        with torch.no_grad():
            phi.append(round(float(sa_coordinates(model, context)["phi_beta2"]), 4))

    out = train_sa(Run(N=N, seed=seed, iters=HYBRID_CAP, eval_every=SCREEN["eval_every"],
                       eval_batch=SCREEN["eval_batch"], stop_after=1.2, readout=HYBRIDS[name][0]), measure)
    run = {"N": N, "seed": seed, "cap": HYBRID_CAP, "readout": HYBRIDS[name][0], "levels": out["levels"],
           "t": out["t"], "masked_loss": [round(y, 5) for y in out["masked_loss"]], "phi": phi,
           "tau": None if math.isnan(out["tau"]) else out["tau"]}
    path = run_path(root, name, N, seed)
    with open(path + ".tmp", "w") as f:
        json.dump(run, f)
    os.replace(path + ".tmp", path)
    return run


def hybrid_summary(hybrid_runs: dict, record_tau: dict) -> dict:
    """The SA side of the ladder: {name: fit_tau_censored of its taus per N} for the hybrids' runs ({name: {N: {seed:
    run}}}, a run without a tau counted as longer than its cap) and for "sa", the record's SA-transformer (its
    control taus at the same N)."""
    Ns = sorted({N for by_N in hybrid_runs.values() for N in by_N}, key=int)
    out = {"sa": fit_tau_censored({N: list(record_tau[N]) for N in Ns if N in record_tau})}
    for name, by_N in hybrid_runs.items():
        out[name] = fit_tau_censored({N: [r["tau"] for r in by_N[N].values()] for N in sorted(by_N, key=int)})
    return out


def early_rate(run: dict) -> float:
    """phi_beta(2)'s growth per step on the plateau: the least-squares slope of phi against t over the evaluations
    before HEAD_FRACTION of the head's formation (all of them for a run whose head never formed)."""
    head = tau_2gen_drop(run)["head"]
    t, phi = np.asarray(run["t"], float), np.asarray(run["phi"], float)
    keep = t <= HEAD_FRACTION * head if head is not None else np.ones_like(t, bool)
    return float(np.polyfit(t[keep], phi[keep], 1)[0]) if keep.sum() >= 2 else math.nan


def harmonic(N: int) -> float:
    return sum(1 / k for k in range(1, N + 1))


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
    boot = [fit({N: float(np.median(rng.choice(v, len(v)))) if v else math.nan for N, v in rates.items()})
            for _ in range(resamples)]
    boot = np.array([b for b in boot if b is not None])
    q = (1 - level) / 2
    return point, [float(np.quantile(boot, q)), float(np.quantile(boot, 1 - q))]


def head_ratio(run: dict, base: dict) -> float | None:
    """The head's formation in `run` as a multiple of the baseline run's (None where either never formed)."""
    head, base_head = tau_2gen_drop(run)["head"], tau_2gen_drop(base)["head"]
    return None if head is None or base_head is None else head / base_head


def compare(runs: dict, baseline: dict) -> dict:
    """Per setting ({name: {N: {seed: run}}}, and "baseline", the committed record's {N: {seed: run}}): the
    head's formation and tau (transformer_summary), each run's head against the baseline run of the same (N, seed)
    (their ratio), and the early rates of phi per N: their medians, and the slope of log median against
    log(H_N / N), which is 2 if phi grows at the theory's rate."""
    out = {}
    for name, by_N in {"baseline": baseline, **runs}.items():
        summary = transformer_summary(by_N)
        rates = {N: [early_rate(r) for r in by_N[N].values()] for N in by_N}
        medians = {N: median_ci(v)[0] for N, v in rates.items()}
        row = {"summary": summary, "early_rate": rates, "early_rate_median": medians,
               "theory_rate": {N: harmonic(int(N)) / int(N) for N in by_N}}
        row["early_rate_slope"], row["early_rate_slope_ci"] = rate_slope(rates, row["theory_rate"])
        if name != "baseline":
            row["head_vs_baseline"] = {N: {s: head_ratio(r, baseline[N][s]) for s, r in by_N[N].items()}
                                       for N in by_N if N in baseline}
        out[name] = row
    return out


RESTORES, DOES_NOT = 0.6, 0.3  # a rung's slope against N / log N that restores the law, and one that does not


def plot(result: dict, path: str):
    """Left: the head's formation against N per setting (each seed, and the medians), with the theory's N / log N
    through the baseline's first median; middle: phi's early growth rate against N, with (H_N / N)^2 likewise;
    right: the ladder, each setting's slope against N / log N with its nominal 95 % interval and its seeds per N."""
    fig, (left, right, ladder) = plt.subplots(1, 3, figsize=(18, 5.4), gridspec_kw={"width_ratios": [1, 1, 0.8]})
    colours = {"baseline": "k", "batch512": "tab:blue", "momentum0": "tab:orange", "lr0.0125": "tab:green",
               "lr0.003125": "tab:olive", "frozenP2": "tab:purple", "smallstart": "tab:red", "window1": "tab:cyan",
               "sa": "tab:brown", "sa_softmax": "tab:pink"}
    names = list(result["compare"]) + list(result.get("hybrids", {}))
    for name, row in result["compare"].items():  # the transformer's rungs: the head's formation
        label = "lr 0.05, momentum 0.9, batch 128 (the record)" if name == "baseline" else f"{name}: {DESCRIBE[name]}"
        heads = row["summary"]["N"]
        Ns = sorted(heads, key=int)
        for N in Ns:
            done = [h for h in heads[N]["head"] if h is not None]
            left.plot([int(N)] * len(done), done, "o", color=colours[name], alpha=0.35)
            for status, head in zip(heads[N]["status"], heads[N]["head"]):
                if head is None and status != "diverged":  # never formed by the cap: the cap, a lower bound
                    left.plot(int(N), CAPS[name], "^", color=colours[name])
        if any(s == "diverged" for row_N in heads.values() for s in row_N["status"]):
            label += " (diverged: not drawn)"
        medians = [median_ci([h for h in heads[N]["head"]])[0] for N in Ns]
        left.plot([int(N) for N in Ns], medians, "-", color=colours[name], label=label)
        rates = row["early_rate_median"]
        right.plot([int(N) for N in Ns], [rates[N] for N in Ns], "o-", color=colours[name], label=label)
        line = row["summary"]["fit_head"]["vs_N_over_logN"]
        y = len(names) - 1 - names.index(name)
        if line:
            lo, hi = line["slope_ci"]
            ladder.errorbar(line["slope"], y, xerr=[[line["slope"] - lo], [hi - line["slope"]]], fmt="o",
                            color=colours[name], capsize=3)
            ladder.annotate(f"{line['slope']:.2f}, seeds {'/'.join(str(k) for k in line['seeds'])}",
                            (line["slope"], y), textcoords="offset points", xytext=(0, 6), ha="center", fontsize=7)
        else:
            ladder.annotate("no slope (diverged)", (0.5, y), ha="center", va="center", fontsize=7, color=colours[name])
    for name, fit in result.get("hybrids", {}).items():  # the SA side: tau, the SA-transformer's own criterion
        y = len(names) - 1 - names.index(name)
        Ns = sorted(fit["N"], key=int)
        left.plot([int(N) for N in Ns], [fit["N"][N]["median"] for N in Ns], "s--", color=colours[name],
                  label=f"{name}: {DESCRIBE[name]}, tau (the SA's halfway crossing)")
        line = fit["vs_N_over_logN"]
        if line:
            lo, hi = line["slope_ci"]
            ladder.errorbar(line["slope"], y, xerr=[[line["slope"] - lo], [hi - line["slope"]]], fmt="s",
                            color=colours[name], capsize=3)
            ladder.annotate(f"{line['slope']:.2f}, seeds {'/'.join(str(k) for k in line['seeds'])} (tau)",
                            (line["slope"], y), textcoords="offset points", xytext=(0, 6), ha="center", fontsize=7)
    base = result["compare"]["baseline"]
    Ns = np.array(sorted(int(N) for N in base["summary"]["N"]), float)
    first = median_ci(base["summary"]["N"][str(int(Ns[0]))]["head"])[0]
    left.plot(Ns, first * (Ns / np.log(Ns)) / (Ns[0] / np.log(Ns[0])), "--", color="gray", label="theory: N / log N")
    r0 = base["early_rate_median"][str(int(Ns[0]))]
    right.plot(Ns, [r0 * (harmonic(int(n)) / n / (harmonic(int(Ns[0])) / Ns[0])) ** 2 for n in Ns], "--", color="gray",
               label="theory: (H_N / N)^2")
    every_N = sorted({int(N) for fit in result.get("hybrids", {}).values() for N in fit["N"]} | set(map(int, Ns)))
    for ax, what, ticks in ((left, "head formed (steps; ^: not by the cap); SA side: tau", every_N),
                            (right, "phi_beta(2)'s early growth per step", Ns)):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(ticks, [str(int(n)) for n in ticks])
        ax.set_xlabel("N")
        ax.set_ylabel(what)
    left.set_title("the induction head's formation against N, per setting")
    right.set_title(f"phi's growth on the plateau (slope before {HEAD_FRACTION:g} x the head's time)")
    for x, style, text in ((1.0, "--", "theory"), (RESTORES, ":", "restores"), (DOES_NOT, ":", "does not")):
        ladder.axvline(x, color="gray", ls=style, lw=1)
        ladder.annotate(text, (x, len(names) - 0.4), ha="center", fontsize=7, color="gray")
    ladder.set_yticks(range(len(names)), list(reversed(names)), fontsize=8)
    ladder.set_ylim(-0.6, len(names) - 0.2)
    ladder.set_xlabel("slope of the head's medians against N / log N\n(nominal 95 % interval, seeds per N)")
    ladder.set_title("the ladder: does a rung restore tau ~ N / log N?")
    handles, labels = left.get_legend_handles_labels()  # one legend for the panels: the settings' colours are shared
    fig.legend(handles, labels, fontsize=8, loc="lower center", ncol=3, frameon=False)
    right.legend(*[x[-1:] for x in right.get_legend_handles_labels()], fontsize=8, loc="lower left")  # the theory
    fig.tight_layout(rect=(0, 0.15, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def table(result: dict) -> list[str]:
    """The comparison as markdown rows (RESULTS.md's table): per setting the head's formation at each N for seeds 0
    and 1, its range as a multiple of the record's run of the same seed, the slope of the head's medians against
    N / log N with its interval and seeds, and the early rate's slope against H_N / N (the theory's: 2)."""
    def num(x: float) -> str:  # a typographic minus, as the tables write it
        return f"{x:.2f}".replace("-", "−")

    rows = []
    for name, row in result["compare"].items():
        by_N = row["summary"]["N"]
        heads = " / ".join(", ".join("—" if h is None else f"{h:.0f}" for s, h in zip(v["seeds"], v["head"]) if s < 2)
                           for v in by_N.values())
        ratios = [r for by_seed in row.get("head_vs_baseline", {}).values() for r in by_seed.values() if r is not None]
        diverged = [steps for v in by_N.values() for status, steps in zip(v["status"], v["steps"]) if status == "diverged"]
        line = row["summary"]["fit_head"]["vs_N_over_logN"]
        slope = f"{num(line['slope'])} [{num(line['slope_ci'][0])}, {num(line['slope_ci'][1])}], seeds {line['seeds']}" \
            if line else "—"
        ci = row.get("early_rate_slope_ci")  # a JSON collected before the intervals has none
        rate = "—" if row["early_rate_slope"] is None else num(row["early_rate_slope"]) + \
            (f" [{num(ci[0])}, {num(ci[1])}]" if ci else "")
        what = "the record: lr 0.05, momentum 0.9, batch 128" if name == "baseline" else f"{name}: {DESCRIBE[name]}"
        times = "1" if name == "baseline" else f"{min(ratios):.2f}–{max(ratios):.2f}" if ratios else \
            f"diverged by step {max(diverged)}" if diverged else "—"
        rows.append(f"| {what} | {heads} | {times} | {slope} | {rate} |")
    for name, fit in result.get("hybrids", {}).items():  # the SA side: its tau (the SA-transformer's criterion)
        taus = result["hybrid_runs"][name] if name in result.get("hybrid_runs", {}) else None
        per_N = " / ".join(", ".join("—" if r["tau"] is None else f"{r['tau']:.0f}" for r in taus[N].values())
                           for N in sorted(taus, key=int)) if taus else \
            " / ".join(f"{fit['N'][N]['median']:.0f}" for N in sorted(fit["N"], key=int)) + " (medians)"
        line = fit["vs_N_over_logN"]
        slope = f"{num(line['slope'])} [{num(line['slope_ci'][0])}, {num(line['slope_ci'][1])}], seeds {line['seeds']}" \
            if line else "—"
        rows.append(f"| {name}: {DESCRIBE[name]} | tau {per_N} | (the SA's criterion) | {slope} | — |")
    return rows


# ----------------------------------------------------------------------------- the theory's coordinates, measured
# Before changing the model, measure it: how fast the quantities the theory is written in move on the plateau, in the
# transformer and in the SA-transformer, at the same stages of their runs (fractions of the transformer's head time
# and of the SA-transformer's tau, each N's median in the committed record), on one large fixed batch per N.
# The theory (eq. c_delta and the c_beta above it, at w_B = w_C = 1/3): d beta / dt ~ H_N / N, d delta / dt ~ F_1 / N,
# and phi_beta(2)'s early growth ~ (H_N / N)^2 (RESULTS.md derives the square). A velocity that is N-flat where the
# theory's falls with N names the quantity that carries the flatness.

MEASURE = dict(N=(32, 64, 128, 256), seeds=(0, 1), fractions=(0.0, 0.1, 0.25, 0.5), batch=16384, chunk=1024)
THEORY_POWER = {"beta": 1, "delta": None, "phi_beta2": 2, "phi_delta1": None}  # velocity ~ (H_N / N)^power; None: 1 / N


def velocities(loss_fn, quantities: dict, params: dict, batches: list) -> dict:
    """How fast each quantity q(params) moves under gradient flow on the loss: dq/dt = -<grad q, grad L> per unit of
    learning rate, L the mean of loss_fn(context, target) over the equal-sized `batches`. {name: {"value",
    "velocity", "se"}}, se the standard error of the velocity over the batches."""
    leaves = [p for p in params.values() if p.requires_grad]
    grads = [torch.autograd.grad(loss_fn(c, y), leaves, allow_unused=True) for c, y in batches]
    out = {}
    for name, q in quantities.items():
        dq = torch.autograd.grad(q, leaves, retain_graph=True, allow_unused=True)
        v = np.array([-sum(float((a * b).sum()) for a, b in zip(dq, g) if a is not None and b is not None)
                      for g in grads])
        out[name] = {"value": float(q.detach()), "velocity": float(v.mean()),
                     "se": float(v.std(ddof=1) / math.sqrt(len(v))) if len(v) > 1 else math.nan}
    return out


def transformer_coordinates(template, params: dict, context: torch.Tensor) -> dict:
    """The theory's coordinates read off the transformer (template: a model_for module that functional_call runs
    with `params`), differentiable in params:
      delta        layer 1's position bias at lag 1, P1[1] (the SA-transformer's delta is its P1[1]);
      beta         the induction score of layer 2 read through the embeddings: for a query of state a,
                   q_a = W_Q2 LN(W_E a), and a key whose layer-1 attention sits on state b, k_b = W_K2 LN(W_V1 LN(W_E b)),
                   the mean of q_a . k_a / sqrt(D) minus the mean over a != b (the SA's beta: M2's h.x diagonal);
      phi_beta2    the induction readout at the last position on `context` (eq. iha at n = N);
      phi_delta1   layer 1's attention of the last position on the previous one (eq. pta at n = N)."""
    E = layer_norm(params["W_E.weight"])  # (C, D)
    q = E @ params["att2.W_Q.weight"].T
    k = layer_norm(E @ params["att1.W_V.weight"].T) @ params["att2.W_K.weight"].T
    S = q @ k.T / math.sqrt(q.shape[1])  # (C, C): query state a, layer-1 content b
    off = ~torch.eye(S.shape[0], dtype=torch.bool)
    _, cache = torch.func.functional_call(template, params, (context,), {"cache": True})
    return {"beta": S.diagonal().mean() - S[off].mean(), "delta": params["att1.P"][0, 1],
            "phi_beta2": induction(cache["A2"][:, -1], context), "phi_delta1": cache["A1"][:, -1, -2].mean()}


def sa_coordinates(model: SATransformer, context: torch.Tensor) -> dict:
    """The same for the SA-transformer: beta (mean diagonal of M2's h.x block), delta (P1[1]), phi_beta2 (its layer-2
    attention at the last position through `induction`)."""
    beta_delta = model.attention_parameters()
    M2, P1 = beta_delta[2], beta_delta[1]
    A2 = layers(context, *beta_delta)[2]
    return {"beta": M2[C:, :C].diagonal().mean(), "delta": P1[1], "phi_beta2": induction(A2, context)}


def measurement_batches(N: int) -> list:
    """MEASURE["batch"] fresh sequences of length N + 1 in chunks, from their own generator: one set per N, the same
    for every seed, time and model."""
    g = torch.Generator().manual_seed(2 * 10**6 + N)
    return [fresh_batch(MEASURE["chunk"], N, g) for _ in range(MEASURE["batch"] // MEASURE["chunk"])]


def stage_times(figures: str) -> dict:
    """{model: {N: the steps at MEASURE's fractions}}: of the transformer's head (the record's median at N, on its
    50-step grid) and of the SA-transformer's tau (its control seeds' mean, on a 25-step grid)."""
    with open(os.path.join(figures, "sa_scaling.json")) as f:
        record = json.load(f)
    heads = transformer_summary(record["transformer_runs"])["N"]
    out = {"transformer": {}, "sa": {}}
    for N in MEASURE["N"]:
        scale = {"transformer": (median_ci(heads[str(N)]["head"])[0], 50),
                 "sa": (float(np.mean(record["tau"][str(N)])), 25)}
        for model, (tau, grid) in scale.items():
            out[model][N] = sorted({int(f * tau // grid * grid) for f in MEASURE["fractions"]})
    return out


def _measure_job(job: tuple) -> dict:
    """One (model, N, seed): its run to the last of `times` at the record's settings, the coordinates' values and
    velocities at each of them, and (SA) phi_beta(2) at every evaluation for its early rate."""
    root, model_name, N, seed, times = job
    batches, rows = measurement_batches(N), {}
    context = batches[0][0]
    if model_name == "transformer":
        template = model_for(N, seed)

        def measure(t, params):
            if t in times:
                loss = lambda c, y: F.cross_entropy(last_position(params, c)[0], y)  # noqa: E731
                rows[t] = velocities(loss, transformer_coordinates(template, params, context), params, batches)
                rows[t]["P1"] = params["att1.P"][0, :8].tolist()

        run = rounded_run(train_one(N, seed, max(times), SCREEN["eval_batch"], measure=measure))
        out = {"t": run["t"], "phi": run["phi"], "loss": run["loss"]}
    else:
        phi = []

        def measure(t, model):
            if t in times:
                loss = lambda c, y: target_loss(model(c), y)[0].mean()  # noqa: E731
                rows[t] = velocities(loss, sa_coordinates(model, context), dict(model.named_parameters()), batches)
            with torch.no_grad():
                phi.append(float(sa_coordinates(model, context)["phi_beta2"]))

        run = train_sa(Run(N=N, seed=seed, iters=max(times), eval_every=25, eval_batch=1024), measure)
        out = {"t": run["t"], "phi": phi, "loss": run["masked_loss"]}
    result = {"model": model_name, "N": N, "seed": seed, "times": {str(t): rows[t] for t in times}, **out}
    path = os.path.join(root, f"measure_{model_name}_N{N}_s{seed}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(result, f)
    os.replace(path + ".tmp", path)
    return result


def theory_slope(name: str, Ns) -> float:
    """The theory's slope of log |velocity| against log N over Ns: THEORY_POWER's power of H_N / N, or 1 / N's -1."""
    power = THEORY_POWER[name]
    if power is None:
        return -1.0
    return float(power * np.polyfit(np.log(Ns), np.log([harmonic(int(N)) / N for N in Ns]), 1)[0])


def measure_summary(measured: list, record: dict) -> dict:
    """{model: {coordinate: [per stage: {"N", "velocities" (per N, the seeds'), "median", "slope", "theory"}]}}: the
    slope of log |median velocity| against log N beside the theory's; "early_phi": phi_beta(2)'s early rate per N
    (its least-squares slope over the measurement run, which ends at half the head's time or tau) and the slope of
    its medians against log(H_N / N) (the theory: 2); "record_match": the largest difference between a transformer
    measurement run's losses and the committed record's run of its (N, seed) (the same run: 0 to rounding)."""
    out = {}
    for model in sorted({m["model"] for m in measured}):
        runs = [m for m in measured if m["model"] == model]
        Ns = sorted({m["N"] for m in runs})
        by_N = {N: [m for m in runs if m["N"] == N] for N in Ns}
        stages = min(len(m["times"]) for m in runs)
        row = {}
        for name in runs[0]["times"][next(iter(runs[0]["times"]))]:
            if name == "P1":
                continue
            row[name] = []
            for i in range(stages):
                v = {N: [m["times"][sorted(m["times"], key=int)[i]][name]["velocity"] for m in by_N[N]] for N in Ns}
                median = [float(np.median(v[N])) for N in Ns]
                ok = [j for j, x in enumerate(median) if x != 0]
                slope = float(np.polyfit(np.log([Ns[j] for j in ok]), np.log([abs(median[j]) for j in ok]), 1)[0]) \
                    if len(ok) >= 2 else None
                row[name].append({"N": Ns, "velocities": [v[N] for N in Ns], "median": median, "slope": slope,
                                  "theory": theory_slope(name, Ns)})
        rates = {N: [float(np.polyfit(m["t"], m["phi"], 1)[0]) for m in by_N[N]] for N in Ns}
        medians = [float(np.median(rates[N])) for N in Ns]
        row["early_phi"] = {"N": Ns, "rates": [rates[N] for N in Ns], "median": medians,
                            "slope_vs_HN_over_N": float(np.polyfit(np.log([harmonic(N) / N for N in Ns]),
                                                                   np.log(medians), 1)[0])
                            if all(x > 0 for x in medians) and len(Ns) >= 2 else None}
        if model == "transformer":
            diffs = []
            for m in runs:
                base = record.get(str(m["N"]), {}).get(str(m["seed"]))
                if base is not None:
                    n = min(len(m["loss"]), len(base["loss"]))
                    diffs.append(max(abs(a - b) for a, b in zip(m["loss"][:n], base["loss"][:n])))
            row["record_match"] = max(diffs) if diffs else None
        out[model] = row
    return out


COORDINATE_LABELS = {"beta": "beta (transformer: layer 2's induction score via the embeddings)",
                     "delta": "delta = P1[1], layer 1's lag-1 bias", "phi_beta2": "phi_beta(2), the induction readout",
                     "phi_delta1": "phi_delta(1), layer 1 on the previous position"}


def plot_velocities(summary: dict, fractions, path: str):
    """One panel per coordinate: |dq/dt| per unit of learning rate against N, the seeds' median at each stage of
    the run (fractions of the head's time or tau; open markers: the velocity is negative), the transformer in black,
    the SA-transformer in blue, and the theory's scaling through the SA's (or the transformer's) middle stage."""
    names = list(COORDINATE_LABELS)
    fig, axes = plt.subplots(1, len(names), figsize=(4.2 * len(names), 4.4))
    for ax, name in zip(axes, names):
        for model, colour in (("transformer", "k"), ("sa", "tab:blue")):
            for i, stage in enumerate(summary.get(model, {}).get(name, [])):
                if i == 0:
                    continue  # t = 0: the start, not the plateau
                Ns, median = np.array(stage["N"], float), np.array(stage["median"])
                alpha = 0.35 + 0.65 * i / (len(fractions) - 1)
                ax.plot(Ns, np.abs(median), "-", color=colour, alpha=alpha,
                        label=f"{'transformer' if model == 'transformer' else 'SA'} at {fractions[i]:g} x "
                              f"{'head' if model == 'transformer' else 'tau'}"
                              + ("" if stage["slope"] is None else f", slope {stage['slope']:.2f}"))
                for n, m in zip(Ns, median):
                    ax.plot(n, abs(m), "o", color=colour, alpha=alpha, mfc=colour if m > 0 else "none")
        ref = summary.get("sa", {}).get(name) or summary.get("transformer", {}).get(name)
        if ref:
            mid = ref[len(ref) // 2]
            Ns = np.array(mid["N"], float)
            ax.plot(Ns, abs(mid["median"][0]) * (Ns / Ns[0]) ** mid["theory"], "--", color="gray",
                    label=f"theory: slope {mid['theory']:.2f}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        Ns = sorted({N for model in summary.values() for stage in model.get(name, [])[:1] for N in stage["N"]})
        ax.set_xticks(Ns, [str(N) for N in Ns])
        ax.set_xlabel("N")
        ax.set_title(COORDINATE_LABELS[name], fontsize=9)
        ax.legend(fontsize=6.5, loc="lower left")
    axes[0].set_ylabel("|d q / d t| per unit of learning rate (median of seeds)")
    fig.suptitle("How fast the theory's coordinates move on the plateau (open markers: moving down)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def velocity_table(measured: dict) -> list[str]:
    """The measurement as markdown rows (RESULTS.md's table): per coordinate and model, the slope of log |median
    velocity| against log N at each stage of the plateau (the sign of the medians where any is negative), the theory's
    slope, and phi's early rate's slope against H_N / N (the theory's 2)."""
    def num(x) -> str:
        return "—" if x is None else f"{x:.2f}".replace("-", "−")

    rows, fractions = [], measured["measure"]["fractions"]
    for name, label in COORDINATE_LABELS.items():
        for model in ("sa", "transformer"):
            stages = measured["summary"].get(model, {}).get(name)
            if not stages:
                continue
            slopes = ", ".join(num(st["slope"]) + (" (−)" if any(m < 0 for m in st["median"]) else "")
                               for f, st in zip(fractions, stages) if f > 0)
            rows.append(f"| {label} | {'SA-transformer' if model == 'sa' else 'transformer'} | {slopes} | "
                        f"{num(stages[0]['theory'])} |")
    for model in ("sa", "transformer"):
        early = measured["summary"].get(model, {}).get("early_phi")
        if early:
            rows.append(f"| phi_beta(2)'s early rate against H_N / N | "
                        f"{'SA-transformer' if model == 'sa' else 'transformer'} | {num(early['slope_vs_HN_over_N'])} | "
                        f"2.00 |")
    return rows


def collect_measurements(root: str, figures: str) -> dict:
    """Every measurement run under root into FIGURES/tau_velocities.json and .png."""
    measured = []
    for name in sorted(os.listdir(root)):
        if name.startswith("measure_") and name.endswith(".json"):
            with open(os.path.join(root, name)) as f:
                measured.append(json.load(f))
    if not measured:
        raise ValueError(f"no measurement runs under {root}: `python tau_settings.py --measure` trains them")
    with open(os.path.join(figures, "sa_scaling.json")) as f:
        record = json.load(f)["transformer_runs"]
    result = {"measure": {k: list(v) if isinstance(v, tuple) else v for k, v in MEASURE.items()},
              "runs": measured, "summary": measure_summary(measured, record)}
    with open(os.path.join(figures, "tau_velocities.json"), "w") as f:
        json.dump(result, f)
    plot_velocities(result["summary"], MEASURE["fractions"], os.path.join(figures, "tau_velocities.png"))
    return result


def collect(root: str, figures: str) -> dict:
    """Every finished run under root, added to the runs FIGURES/tau_settings.json already holds (a run under root
    replaces the stored one of its setting, N and seed), set beside the committed record's runs of the same N, into
    FIGURES/tau_settings.json and .png: the settings' runs in "runs" and "compare", the hybrids' in "hybrid_runs"
    and "hybrids"."""
    with open(os.path.join(figures, "sa_scaling.json")) as f:
        record = json.load(f)
    stored_path = os.path.join(figures, "tau_settings.json")
    stored = cli.read_json(stored_path, ("runs",), "tau_settings.py") if os.path.exists(stored_path) else {}
    runs = {name: by_N for name, by_N in stored.get("runs", {}).items() if name in SETTINGS}
    hybrid_runs = {name: by_N for name, by_N in stored.get("hybrid_runs", {}).items() if name in HYBRIDS}
    for file in sorted(os.listdir(root)) if os.path.isdir(root) else []:  # <name>_N<N>_s<seed>.json, any N and seed
        match = re.fullmatch(r"(.+)_N(\d+)_s(\d+)\.json", file)
        if match and match[1] in [*SETTINGS, *HYBRIDS]:
            with open(os.path.join(root, file)) as f:
                into = hybrid_runs if match[1] in HYBRIDS else runs
                into.setdefault(match[1], {}).setdefault(match[2], {})[match[3]] = json.load(f)
    for by_N in [*runs.values(), *hybrid_runs.values()]:  # N and seeds in numerical order
        for N in list(by_N):
            by_N[N] = dict(sorted(by_N[N].items(), key=lambda kv: int(kv[0])))
        order = sorted(by_N, key=int)
        by_N.update({N: by_N.pop(N) for N in order})
    if not runs:
        raise ValueError(f"no runs under {root}: `python tau_settings.py` trains them")
    transformer = record["transformer_runs"]
    baseline = {N: transformer[N] for N in sorted({N for by_N in runs.values() for N in by_N}, key=int) if N in transformer}
    result = {"settings": {name: SETTINGS[name][0] | {"cap": CAPS[name], "tests": SETTINGS[name][1]} for name in runs},
              "baseline": "figures/sa_scaling.json's transformer_runs (all their seeds)", "runs": runs,
              "compare": compare(runs, baseline)}
    if hybrid_runs:
        result["hybrid_runs"] = hybrid_runs
        result["hybrids"] = hybrid_summary(hybrid_runs, record["tau"])
    with open(stored_path, "w") as f:
        json.dump(result, f)
    plot(result, os.path.join(figures, "tau_settings.png"))
    return result


def main():
    parser = cli.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default=os.path.join("runs", "tau_settings"), help="where each run's JSON goes")
    cli.add_jobs(parser)
    cli.add_figures(parser)
    parser.add_argument("--replot", action="store_true", help="only redraw from FIGURES/tau_settings.json")
    parser.add_argument("--measure", action="store_true", help="measure the theory's coordinates instead (MEASURE: "
                        "~1 h on one core) into FIGURES/tau_velocities.png and .json")
    trainable = [*SETTINGS, *HYBRIDS]
    parser.add_argument("--settings", default=",".join(trainable),
                        help=f"the settings and hybrids to train, comma-separated (default all: {','.join(trainable)})")
    args = parser.parse_args()
    names = args.settings.split(",")
    if any(name not in trainable for name in names):
        parser.error(f"--settings {args.settings}: each must be one of {', '.join(trainable)}")
    cli.writable_dir(args.figures, "--figures")
    if args.replot:
        result = cli.read_json(os.path.join(args.figures, "tau_settings.json"), ("compare", "runs"), "tau_settings.py")
        plot(result, os.path.join(args.figures, "tau_settings.png"))
        print(f"wrote {args.figures}/tau_settings.png from {args.figures}/tau_settings.json")
        print("\n".join(table(result)))
        path = os.path.join(args.figures, "tau_velocities.json")
        if os.path.exists(path):
            measured = cli.read_json(path, ("measure", "summary"), "tau_settings.py --measure")
            plot_velocities(measured["summary"], measured["measure"]["fractions"], path[:-4] + "png")
            print(f"\nwrote {path[:-4]}png from {path}")
            print("\n".join(velocity_table(measured)))
        return
    os.makedirs(args.root, exist_ok=True)
    if args.measure:
        times = stage_times(args.figures)
        jobs = [(args.root, model, N, seed, times[model][N]) for model in ("sa", "transformer") for N in MEASURE["N"]
                for seed in MEASURE["seeds"]
                if not os.path.exists(os.path.join(args.root, f"measure_{model}_N{N}_s{seed}.json"))]
        print(f"the theory's coordinates measured: {len(jobs)} runs ({args.jobs} at a time; N = {list(MEASURE['N'])}, "
              f"seeds {list(MEASURE['seeds'])}), writing {args.root}/ and {args.figures}/tau_velocities.png and .json",
              flush=True)
        cli.parallel_map(_measure_job, jobs, check_int("--jobs", args.jobs, 1), progress="runs",
                         cost=[j[4][-1] * j[2] * (1 + j[2] / 128) * (0.3 if j[1] == "sa" else 1) for j in jobs])
        measured = collect_measurements(args.root, args.figures)
        print(f"wrote {args.figures}/tau_velocities.png and .json")
        print("\n".join(velocity_table(measured)))
        return
    jobs = [(args.root, name, N, seed) for name in names for N in SCREEN["N"] for seed in SCREEN["seeds"]
            if not os.path.exists(run_path(args.root, name, N, seed))]
    print(f"Fig. 6c bottom at other settings: {len(jobs)} runs to train ({', '.join(names)}; N = "
          f"{list(SCREEN['N'])}, seeds {list(SCREEN['seeds'])}), {args.jobs} at a time on the CPU; writing {args.root}/ "
          f"and {args.figures}/tau_settings.png and .json", flush=True)
    cli.parallel_map(_run_job, jobs, check_int("--jobs", args.jobs, 1), progress="runs",
                     cost=[CAPS[j[1]] * j[2] if j[1] in CAPS else 0.1 * HYBRID_CAP * j[2] for j in jobs])
    result = collect(args.root, args.figures)
    print(f"wrote {args.figures}/tau_settings.png and .json")
    print("\n".join(table(result)))


if __name__ == "__main__":
    cli.run(main)
