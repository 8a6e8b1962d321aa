"""When a run leaves 2-Gen for memorization and how much of S it memorizes: the analysis of the K2* experiment's runs
(Appendix "Transience and Partial Memorization", Figs. 8a-b, A10), from their evaluations and saved models.

For K1* < K < K2* a run first enters 2-Gen and later memorizes; the time it spends in 2-Gen,

    Delta tau_K = tau_2mem - tau_2gen  ~  (K2* - K)^(-gamma)          (Fig. 8a: K2* ~ 7000, gamma ~ 2)

diverges at K2*, beyond which the model never memorizes. Independently, a chain k counts as memorized when the model
beats 2-Gen on it, Delta^k < epsilon (evaluation.per_chain_scores), and the fraction of memorized chains rises as a
sigmoid in time whose asymptote falls with K (Fig. 8b, A10).

    analyze_k2        a sweep's runs (k2.py sweep): Delta tau per run and per K, the divergence fits, epsilon from
                      the K = inf runs, the memorized fractions corrected by each model's fresh-chain null and scored
                      on two sets of sequences (saved_model_scores), their sigmoid asymptotes and zero crossings
    delta_tau_table   Delta tau of any grid of runs (k2.py dtau): medians, the divergence fits, a line through them

The rules (tau_2gen, tau_2mem, the memorized fraction, the null's correction, the two-set rule) are
analysis/thresholds.py's; the estimators (medians, the divergence and sigmoid fits, epsilon) analysis/estimators.py's.
"""
import dataclasses
import json
import math
import os

import numpy as np

import train
from analysis.estimators import (censored_median, epsilon_calibration, extrapolate_zero, fit_divergence, fit_sigmoid,
                                 line_through_medians, median_ci, median_coverage, median_rank)
from analysis.runs import load_run, read_metrics, read_per_chain
from analysis.thresholds import (NULL_ALPHA, censored_after, corrected, delta_tau, memorized_fraction, null_epsilon,
                                 score_noise, tau_2gen, tau_2mem)
from evaluation import make_per_chain_data, per_chain_scores
from markov import task_source
from plumbing import cli
from plumbing.rundir import write_atomic


def divergence_fits(Ks: list, dtau: list, bounds: list) -> tuple[dict, dict]:
    """Fig. 8a's two fits (estimators.fit_divergence): a (K2* - K)^-gamma, and the paper's form with a linear
    offset (300 bootstrap resamples: each refit searches a (K2*, gamma) grid). Too few finite medians: K2* None
    and why."""
    fits = []
    for offset in (False, True):
        try:
            fits.append(fit_divergence(Ks, dtau, bounds, offset=offset, resamples=300 if offset else 1000))
        except ValueError as e:  # too few finite medians: say so in the JSON
            fits.append({"K2_star": None, "gamma": None, "K2_star_ci": None, "gamma_ci": None, "why": str(e)})
    return fits[0], fits[1]


def converged(asymptotes: list[float | None]) -> list[float]:
    """The sigmoid asymptotes of the seeds whose fit converged (fit_sigmoid's A, None where it did not)."""
    return [a for a in asymptotes if a is not None]


# ----------------------------------------------------------------------------- a sweep's runs (Figs. 8a-b, A10)


def saved_model_scores(run_dir: str, chains: int | None = None, draw: int = 0) -> list[dict]:
    """Rows {"step", "delta"}: the run's model at every full evaluation scored like its chains of S
    (evaluation.per_chain_scores, the run's per_chain sequences per chain), on the chains of S (chains None) or on
    `chains` fixed fresh chains of D_T, which it never trained on (the null), with the sequences of draw 0 (those
    of training's per_chain.jsonl) or of draw 1, independent of them (the scores' own noise). Cached in
    run_dir/per_chain[_null][_b].jsonl (draw 0 on S is training's own file), redone when the run's evaluation
    steps or the number of chains differ."""
    name = "per_chain" + ("_null" if chains else "") + ("_b" if draw else "")
    path = os.path.join(run_dir, f"{name}.jsonl")
    trained = read_per_chain(run_dir)
    steps, n = [r["step"] for r in trained], chains or len(trained[0]["delta"])
    if os.path.exists(path):
        with open(path) as f:
            rows = [json.loads(line) for line in f]
        if [r["step"] for r in rows] == steps and all(len(r["delta"]) == n for r in rows):
            return rows
    cfg = load_run(run_dir, steps[0])[0]
    tasks = task_source(math.inf, cfg.C) if chains else task_source(cfg.K, cfg.C, seed=cfg.task_seed)
    data = make_per_chain_data(dataclasses.replace(cfg, per_chain_tasks=chains) if chains else cfg, tasks, draw)
    rows = [{"step": step, "delta": [round(v, 6) for v in per_chain_scores(load_run(run_dir, step)[2], data).tolist()]}
            for step in steps]
    write_atomic(path, "".join(json.dumps(r) + "\n" for r in rows))
    return rows


def _scores_job(job: tuple[str, int | None, int]) -> list[dict]:  # parallel_map's one-argument form
    return saved_model_scores(*job)


def analyze_k2(cfgs: list[train.Config], null_chains: int, jobs: int = 1) -> dict:
    """Delta tau per run, medians and intervals per K, the divergence fit, epsilon from the K = inf runs, and the
    memorized fractions corrected by each model's fresh-chain null, with their sigmoid asymptotes (and beside them
    the raw fractions, the null's false-positive rates and the chain-specific advantage), from the runs' metrics.
    delta_tau[K] holds the seeds with a Delta tau (None: still in 2-Gen at the end, censored_after[K] the steps
    it spent there); a seed that never formed the induction head or memorized first is left out of it (its
    status is in runs). A memorized fraction whose sigmoid fit did not converge has no asymptote (None, its run's
    "memorized_asymptote_why" says why; memorized_not_converged[K] lists such seeds), and the zero crossings go
    through the seeds that have one. Every chain of S and of the null is scored on a second set of sequences too
    (saved_model_scores, draw 1): the two-set rule's fractions, asymptotes and zero crossings (*_two_sets) and the
    noise they state (thresholds.score_noise: disagree, sigma, signal_share)."""
    finite = [c for c in cfgs if c.K != math.inf]
    eps = epsilon_calibration([read_per_chain(c.out)[-1]["delta"] for c in cfgs if c.K == math.inf])
    wanted = [(c.out, chains, draw) for c in finite for chains, draw in ((null_chains, 0), (null_chains, 1), (None, 1))]
    scored = cli.parallel_map(_scores_job, wanted, jobs, progress="fresh-chain scores and second sets")
    scored = [scored[3 * i: 3 * i + 3] for i in range(len(finite))]  # per run: the null's two sets, S's second set
    Ks = sorted({c.K for c in finite})
    runs, dtau, bound, asymptote, asymptote_two, curves = [], {K: [] for K in Ks}, {K: [] for K in Ks}, {}, {}, {}
    for c, (null, null_b, chain_b) in zip(finite, scored):
        dense = read_metrics(c.out, dense=True)[1]
        value, status = delta_tau(dense)
        if status in ("ok", "censored"):  # a run that never formed the head, or memorized first, has no Delta tau
            dtau[c.K].append(value)
            bound[c.K].append(censored_after(dense))
        chain_rows = read_per_chain(c.out)
        steps, raw = memorized_fraction(chain_rows, eps["value"])
        false = memorized_fraction(null, eps["value"])[1]  # the rule on chains nobody memorized
        fraction = corrected(raw, false)
        eps_null = null_epsilon(null)
        specific = corrected(memorized_fraction(chain_rows, eps_null)[1], [NULL_ALPHA] * len(steps))
        sigmoid = fit_sigmoid(steps, fraction)  # A None: the fit did not converge (its "why" goes to the run's row)
        A = sigmoid["A"]
        noise, noise_null = score_noise(chain_rows, chain_b, eps["value"]), score_noise(null, null_b, eps["value"])
        two_sets = corrected(noise["fraction"], noise_null["fraction"])
        sigmoid_two = fit_sigmoid(steps, two_sets)
        A_two = sigmoid_two["A"]
        runs.append({"K": c.K, "seed": c.seed, "tau_2gen": tau_2gen(dense), "tau_2mem": tau_2mem(dense),
                     "delta_tau": value, "status": status, "memorized_final": fraction[-1], "memorized_asymptote": A,
                     **({"memorized_asymptote_why": sigmoid["why"]} if A is None else {}),
                     "memorized_final_raw": raw[-1], "false_positive_final": false[-1], "specific_final": specific[-1],
                     "epsilon_null_final": eps_null[-1], "memorized_two_sets_final": two_sets[-1],
                     "memorized_two_sets_asymptote": A_two,
                     **({"memorized_two_sets_asymptote_why": sigmoid_two["why"]} if A_two is None else {}),
                     "disagree_final": noise["disagree"][-1], "sigma_final": noise["sigma"][-1],
                     "signal_share_final": noise["signal_share"][-1],
                     # L_train - L^2-Gen on the dense readouts' sequences from S at every eighth of the run
                     "gap_to_2gen": [[r["step"], round(r["train_loss"] - r["train_loss_2gen"], 5)] for r in dense
                                     if r["step"] % max(c.iters // 8, 1) == 0]})
        asymptote.setdefault(c.K, []).append(A)
        asymptote_two.setdefault(c.K, []).append(A_two)
        curves.setdefault(c.K, []).append({"step": steps, "fraction": fraction, "fraction_raw": raw,
                                           "false_positive": false, "specific": specific, "epsilon_null": eps_null,
                                           "two_sets": two_sets, "two_sets_raw": noise["fraction"],
                                           "two_sets_false_positive": noise_null["fraction"],
                                           "noise_free": corrected(noise["noise_free"], noise_null["noise_free"]),
                                           **{key: noise[key] for key in ("disagree", "sigma", "signal_share")}})
    measured = [K for K in Ks if dtau[K]]
    medians = {K: median_ci(dtau[K]) if dtau[K] else (math.nan,) * 3 for K in Ks}
    fit, fit_offset = divergence_fits(measured, [dtau[K] for K in measured], [bound[K] for K in measured])

    def zero(values: dict, average) -> float | None:  # over the seeds whose sigmoid converged, at the K with any
        fitted = [K for K in Ks if converged(values[K])]
        return extrapolate_zero(fitted, [float(average(converged(values[K]))) for K in fitted])

    return {"K": Ks, "delta_tau": dtau, "censored_after": bound, "median": {K: medians[K] for K in Ks},
            "median_lower_bound": {K: censored_median(dtau[K], bound[K])[0] for K in measured}, "fit": fit,
            "fit_offset": fit_offset, "epsilon": eps, "null": {"alpha": NULL_ALPHA, "chains": null_chains},
            "memorized_asymptote": asymptote, "memorized_zero": zero(asymptote, np.mean),
            "memorized_not_converged": {K: [r["seed"] for r in runs if r["K"] == K and r["memorized_asymptote"] is None]
                                        for K in Ks},
            # the same through the seeds' medians: a sigmoid fitted to a curve still steep at the end can run to A = 1
            "memorized_zero_median": zero(asymptote, np.median),
            # the two-set rule (thresholds.score_noise): its asymptotes and zero crossings
            "memorized_asymptote_two_sets": asymptote_two, "memorized_zero_two_sets": zero(asymptote_two, np.mean),
            "memorized_zero_median_two_sets": zero(asymptote_two, np.median),
            "memorized_two_sets_not_converged": {K: [r["seed"] for r in runs if r["K"] == K
                                                     and r["memorized_two_sets_asymptote"] is None] for K in Ks},
            "memorized_curves": curves, "runs": runs}


# ----------------------------------------------------------------------------- any grid of runs: Delta tau alone


def delta_tau_table(run_dirs: list[str]) -> dict:
    """Delta tau_K of any set of train.py runs with dense rows (--eval-every): a grid trained from the printed
    commands, or with flags of its own. Per run tau_2gen, tau_2mem, Delta tau and status; per K the seeds' Delta
    tau (None: still in 2-Gen at the end) and their median with its exact order-statistic interval and that
    interval's coverage (95 % where the seeds allow it; 87.5 %, their range, with 4); the divergence fit (>= 4 K with
    a finite median), and a straight line through the finite medians (slope, and the K where it reaches 0, with
    bootstrap intervals over the seeds at each K, their number said). The runs must share their protocol (every
    setting but K, seed, the directory, the device and what follows from K): seeds of different lengths or models
    pooled into one median would make it meaningless."""
    runs, first = [], None
    own = {"K", "seed", "out", "device", "eval_train", "ckpt_every"}
    for run_dir in run_dirs:
        cfg, dense = read_metrics(run_dir, dense=True)
        first = first or (run_dir, cfg)
        differ = sorted(k for k in set(cfg) | set(first[1]) if k not in own and cfg.get(k) != first[1].get(k))
        if differ:
            raise ValueError(f"{run_dir} and {first[0]} differ in {', '.join(differ)}: analyse runs of one protocol together")
        if not dense:
            raise ValueError(f"{run_dir} has no dense rows (train it with --eval-every)")
        value, status = delta_tau(dense)
        runs.append({"run": os.path.basename(os.path.normpath(run_dir)), "K": cfg["K"], "seed": cfg["seed"],
                     "iters": cfg["iters"], "tau_2gen": tau_2gen(dense), "tau_2mem": tau_2mem(dense),
                     "delta_tau": value, "status": status, "censored_after": censored_after(dense)})
    return delta_tau_summary(runs)


def delta_tau_summary(runs: list[dict]) -> dict:
    """delta_tau_table's numbers from its per-run rows (also those of a JSON it wrote)."""
    dtau, bound = {}, {}
    for r in runs:
        if r["status"] in ("ok", "censored") and r["K"] != math.inf:
            dtau.setdefault(r["K"], []).append(r["delta_tau"])
            bound.setdefault(r["K"], []).append(r["censored_after"])
    Ks = sorted(dtau)
    fit, fit_offset = divergence_fits(Ks, [dtau[K] for K in Ks], [bound[K] for K in Ks])
    medians = {K: median_ci(dtau[K]) for K in Ks}
    coverage = {K: median_coverage(len(dtau[K]), median_rank(len(dtau[K]))) for K in Ks}
    line = line_through_medians(Ks, [dtau[K] for K in Ks])
    return {"runs": sorted(runs, key=lambda r: (r["K"], r["seed"])), "K": Ks, "delta_tau": {K: dtau[K] for K in Ks},
            "median_ci": medians, "median_coverage": coverage, "fit": fit, "fit_offset": fit_offset, "line": line}
