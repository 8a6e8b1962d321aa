"""K2*: K = inf training, the per-chain memorization scores and the analysis of a sweep (analysis/memorization.py),
tau_2mem / Delta tau, the divergence and sigmoid fits (analysis/estimators.py), epsilon, and `k2.py sweep` end to end
on a tiny preset."""
import argparse
import json
import math
import os

import numpy as np
import pytest
import scipy.optimize
import torch

import evaluation
import k2
import train
from analysis import estimators, memorization, runs, thresholds
from analysis.estimators import (censored_median, divergence, epsilon_calibration, extrapolate_zero, fit_divergence,
                                 fit_sigmoid, median_ci, sigmoid)
from analysis.thresholds import censored_after, delta_tau, memorized_fraction, score_noise, tau_2mem
from bayes import nll, two_gen
from markov import FreshChains, TaskSet, task_source
from plumbing import cli
from plumbing.records import finite_json


def tiny(out, **kw) -> train.Config:
    values = dict(preset="quick", K=4, N=8, batch=4, iters=10, evals=3, eval_train=8, eval_gen=8, eval_every=5, eval_dense=8,
                  per_chain=3, per_chain_tasks=5, out=str(out))
    values.update(kw)
    return train.make_config(argparse.Namespace(**values))


# ----------------------------------------------------------------------------- K = inf


def bigram_estimates(seqs: torch.Tensor, C: int = 10) -> torch.Tensor:
    """Each sequence's empirical transition matrix (add-one), (B, C, C)."""
    counts = torch.ones(seqs.shape[0], C, C)
    for b in range(seqs.shape[0]):
        counts[b].index_put_((seqs[b, 1:], seqs[b, :-1]), torch.ones(seqs.shape[1] - 1), accumulate=True)
    return counts / counts.sum(1, keepdim=True)


def test_k_inf_draws_a_fresh_chain_for_every_sequence():
    """Long sequences reveal their chain: from fresh chains no two sequences of a batch (or of two batches)
    share one, while from a task set of 4 chains, 16 sequences must repeat chains (the same estimate up to
    sampling noise)."""
    g = torch.Generator().manual_seed(0)

    def closest_pair(seqs):
        est = bigram_estimates(seqs)
        d = (est[:, None] - est[None]).abs().sum((-1, -2)) / 10  # mean L1 distance between columns
        return d[~torch.eye(len(est), dtype=torch.bool)].min().item()

    fresh = FreshChains()
    a, idx = fresh.batch(16, 4000, g)
    b, _ = fresh.batch(16, 4000, g)
    assert (idx == -1).all()
    noise = closest_pair(TaskSet.create(4, seed=0).batch(16, 4000, g)[0])  # repeated chains: only sampling noise
    assert noise < 0.15
    assert closest_pair(a) > 2 * noise and closest_pair(torch.cat([a, b])) > 2 * noise


def test_k_inf_config_and_run(tmp_path):
    cfg = tiny(tmp_path / "inf", K=math.inf)
    assert cfg.out and isinstance(task_source(cfg.K), FreshChains)
    assert train.make_config(argparse.Namespace(preset="quick", K=math.inf, eval_train=0)).eval_train == 8192  # 8 K, capped
    rows = train.train(cfg, quiet=True)
    full = [r for r in rows if not r.get("dense")]
    assert "train_loss_2gen" in full[-1] and "kl_2mem" not in full[-1] and "train_loss_1mem" not in full[-1]
    assert json.load(open(tmp_path / "inf" / "config.json"))["K"] == math.inf
    scores = runs.read_per_chain(str(tmp_path / "inf"))
    assert [r["step"] for r in scores] == [r["step"] for r in full] and len(scores[-1]["delta"]) == 5
    loaded_cfg, _, model, tasks = runs.load_run(str(tmp_path / "inf"))
    assert loaded_cfg.K == math.inf and isinstance(tasks, FreshChains)
    with pytest.raises(ValueError, match="task injection"):
        tiny(tmp_path / "x", K=math.inf, task_injection=True)
    assert cli.parse_list("--K", "64,inf", inf=True) == [64, math.inf]
    with pytest.raises(ValueError):
        cli.parse_list("--seeds", "inf")


# ----------------------------------------------------------------------------- per-chain scores, dense 2-Gen level


def test_per_chain_scores_equal_a_direct_computation_per_chain(tmp_path):
    """Delta^k from the batched, chunked scorer against a loop over chains: the model's and 2-Gen's loss on
    each of the chain's sequences, one sequence at a time (task injection on, so the chain index must
    reach the model too)."""
    cfg = tiny(tmp_path, K=5, per_chain=4, task_injection=True)
    tasks = TaskSet.create(cfg.K, seed=cfg.task_seed)
    model = train.build_model(cfg)
    model.reset_parameters(torch.Generator().manual_seed(3))
    with torch.no_grad():
        model.task_embedding.weight.normal_(0, 1, generator=torch.Generator().manual_seed(4))
    data = evaluation.make_per_chain_data(cfg, tasks)
    scores = evaluation.per_chain_scores(model.eval(), data, chunk=7)
    assert data["seqs"].shape == (cfg.K * cfg.per_chain, cfg.N + 1)
    for k in range(cfg.K):
        diffs = []
        for seq in data["seqs"][data["chain"] == k]:
            with torch.no_grad():
                logq = torch.log_softmax(model(seq[None, :-1], task=torch.tensor([k])), -1)
            diffs.append(nll(logq, seq[None]).mean() - nll(two_gen(seq[None], 10)[:, :-1], seq[None]).mean())
        assert scores[k].item() == pytest.approx(torch.stack(diffs).mean().item(), abs=1e-5)
    # the sequences of chain k come from chain k: on long sequences its own chain explains them best
    long = evaluation.make_per_chain_data(tiny(tmp_path, K=5, per_chain=4, N=300), tasks)
    seqs = long["seqs"]
    nll_per_chain = torch.stack([-torch.log(tasks.T[j][seqs[:, 1:], seqs[:, :-1]]).sum(1) for j in range(cfg.K)], 1)
    assert torch.equal(nll_per_chain.argmin(1), long["chain"])


def test_the_fresh_chain_null_scores_each_saved_model_on_chains_outside_S(tmp_path):
    """saved_model_scores on fresh chains (the null) against a direct computation: for every full evaluation, the
    saved model's mean loss minus 2-Gen's over per_chain sequences of each of `chains` fresh chains, one sequence
    at a time; the chains are none of S's; the cache is reused, and redone for another number of chains."""
    cfg = tiny(tmp_path / "run", K=4, per_chain=3)
    train.train(cfg, quiet=True)
    rows = memorization.saved_model_scores(cfg.out, 6)
    steps = [r["step"] for r in runs.read_per_chain(cfg.out)]
    assert [r["step"] for r in rows] == steps and all(len(r["delta"]) == 6 for r in rows)
    fresh = evaluation.make_per_chain_data(train.Config(**{**vars(cfg), "per_chain_tasks": 6}), FreshChains())
    seqs = fresh["seqs"].view(6, cfg.per_chain, -1)
    for row in rows:
        model = runs.load_run(cfg.out, row["step"])[2]
        for k in range(6):
            diffs = []
            for seq in seqs[k]:
                with torch.no_grad():
                    logq = torch.log_softmax(model(seq[None, :-1]), -1)
                diffs.append(nll(logq, seq[None]).mean() - nll(two_gen(seq[None], 10)[:, :-1], seq[None]).mean())
            assert row["delta"][k] == pytest.approx(torch.stack(diffs).mean().item(), abs=1e-5)
    # fresh chains, not S's: scoring S's chains instead would draw the run's own per-chain sequences
    own = evaluation.make_per_chain_data(cfg, TaskSet.create(cfg.K, seed=cfg.task_seed))["seqs"]
    assert not any(torch.equal(a, b) for a in fresh["seqs"] for b in own)
    stamp = os.path.getmtime(os.path.join(cfg.out, "per_chain_null.jsonl"))
    assert memorization.saved_model_scores(cfg.out, 6) == rows  # from the cache
    assert os.path.getmtime(os.path.join(cfg.out, "per_chain_null.jsonl")) == stamp
    assert [len(r["delta"]) for r in memorization.saved_model_scores(cfg.out, 4)] == [4] * len(steps)  # redone


def test_a_second_set_scores_the_same_chains_on_sequences_of_their_own(tmp_path):
    """draw 1: the same chains (S's, or the null's fresh ones) on new sequences, none of draw 0's. On S, training's
    per_chain.jsonl is the scoring of draw 0 and saved_model_scores(draw 1) the same scoring of the second set, a
    different number; each set is cached in its own file."""
    cfg = tiny(tmp_path / "run", K=4, per_chain=3)
    train.train(cfg, quiet=True)
    S = TaskSet.create(cfg.K, seed=cfg.task_seed)
    fresh_cfg = train.Config(**{**vars(cfg), "per_chain_tasks": 6})
    for c, tasks in ((cfg, S), (fresh_cfg, FreshChains())):
        a, b = (evaluation.make_per_chain_data(c, tasks, draw) for draw in (0, 1))
        assert torch.equal(a["T"], b["T"]) and torch.equal(a["chain"] if a["chain"] is not None else torch.zeros(1),
                                                              b["chain"] if b["chain"] is not None else torch.zeros(1))
        assert not any(torch.equal(x, y) for x in a["seqs"] for y in b["seqs"])
    assert torch.equal(evaluation.make_per_chain_data(cfg, S)["T"], S.T)
    trained = runs.read_per_chain(cfg.out)
    second = memorization.saved_model_scores(cfg.out, None, 1)
    data = evaluation.make_per_chain_data(cfg, S, 1)
    for row, first in zip(second, trained):
        model = runs.load_run(cfg.out, row["step"])[2]
        assert row["delta"] == pytest.approx(evaluation.per_chain_scores(model, data).tolist(), abs=1e-6)
        redone = evaluation.per_chain_scores(model, evaluation.make_per_chain_data(cfg, S)).tolist()
        assert first["delta"] == pytest.approx(redone, abs=2e-6) and row["delta"] != first["delta"]
    null, null_b = memorization.saved_model_scores(cfg.out, 6, 0), memorization.saved_model_scores(cfg.out, 6, 1)
    assert all(x["delta"] != y["delta"] for x, y in zip(null, null_b))
    assert {f for f in os.listdir(cfg.out) if f.startswith("per_chain")} == {
        "per_chain.jsonl", "per_chain_b.jsonl", "per_chain_null.jsonl", "per_chain_null_b.jsonl"}


def test_dense_rows_carry_the_2gen_level_of_their_sequences(tmp_path):
    cfg = tiny(tmp_path, eval_dense=6)
    rows = [r for r in train.train(cfg, quiet=True) if r.get("dense")]
    seqs = evaluation.make_dense_data(cfg, TaskSet.create(cfg.K, seed=cfg.task_seed))[0]
    level = nll(two_gen(seqs, 10)[:, :-1], seqs).mean().item()
    assert all(r["train_loss_2gen"] == pytest.approx(level, abs=1e-6) for r in rows)


# ----------------------------------------------------------------------------- tau_2mem, Delta tau, medians


def rows_of(losses, phis, level=2.0, every=10):
    return [{"step": every * i, "train_loss": l, "train_loss_2gen": level, "phi_beta_2": p}
            for i, (l, p) in enumerate(zip(losses, phis))]


def test_tau_2mem_and_delta_tau_on_synthetic_rows():
    phis = [0.1, 0.2, 0.5, 0.6, 0.6, 0.6]
    ok = rows_of([2.3, 2.2, 2.05, 2.01, 1.99, 1.95], phis)
    assert tau_2mem(ok) == 40 and delta_tau(ok) == (20, "ok")  # tau_2gen = 20 (phi_beta > 0.45)
    assert tau_2mem(list(reversed(ok))) == 40  # row order does not matter
    equal = rows_of([2.3, 2.2, 2.0, 2.0, 2.0, 2.0], phis)  # touching the level is not beating it
    assert tau_2mem(equal) is None and delta_tau(equal) == (None, "censored")
    assert censored_after(equal) == 30 and censored_after(ok) is None  # in 2-Gen from step 20 to the last, 50
    assert delta_tau(rows_of([2.3, 2.2, 1.9, 1.9, 1.9, 1.9], [0.1] * 6)) == (None, "no 2-gen")
    assert delta_tau(rows_of([2.3, 1.9, 1.9, 1.9, 1.9, 1.9], phis)) == (None, "mem first")


def test_median_counts_censored_seeds_as_longer_than_the_run():
    assert median_ci([100, 300, 200, 400])[0] == 250
    med, lo, hi = median_ci([100, 200, None, None, None])
    assert med == math.inf and hi == math.inf and lo >= 100
    med, lo, hi = median_ci([100, 200, 300, None, None])
    assert med == 300 and lo <= 300 <= hi


# ----------------------------------------------------------------------------- fits


@pytest.mark.parametrize("K2, gamma", [(5000, 2.0), (120, 1.0)])
def test_the_divergence_fit_recovers_K2_star_and_gamma(K2, gamma):
    """Delta tau = a (K2* - K)^-gamma for 4 seeds at 6 K below K2*, each seed off by a log-normal factor
    (sigma 0.2): over 10 draws the true K2* and gamma lie within the fit's 95 % bootstrap intervals at least
    8 times, and the point estimates are close."""
    K = K2 * np.array([0.1, 0.3, 0.5, 0.7, 0.85, 0.93])
    true = divergence(K, math.log(1e3) + gamma * math.log(K2 / 10), K2, gamma)
    covered, estimates = 0, []
    for seed in range(10):
        rng = np.random.default_rng(seed)
        fit = fit_divergence(list(K), [list(v * np.exp(rng.normal(0, 0.2, 4))) for v in true], resamples=100)
        covered += fit["K2_star_ci"][0] <= K2 <= fit["K2_star_ci"][1] and fit["gamma_ci"][0] <= gamma <= fit["gamma_ci"][1]
        estimates.append((fit["K2_star"], fit["gamma"]))
    assert covered >= 8
    K2_hat, gamma_hat = np.median(estimates, axis=0)
    assert K2_hat == pytest.approx(K2, rel=0.05) and gamma_hat == pytest.approx(gamma, abs=0.3)
    exact = fit_divergence(list(K), [[v] for v in true], resamples=10)
    assert fit_divergence(list(K), [[v] for v in true], resamples=0)["K2_star_ci"] == [None, None]  # no resamples: no interval
    assert exact["K2_star"] == pytest.approx(K2, rel=0.003) and exact["gamma"] == pytest.approx(gamma, abs=0.02)
    with pytest.raises(ValueError, match=">= 4 K"):  # three parameters: four medians at least
        fit_divergence(list(K), [[1.0], [2.0], [None], [None], [3.0], [None]])
    # Delta tau growing exponentially in K has no finite K2*: the fit says so instead of reporting the grid's edge
    growth = fit_divergence([48, 56, 64, 72, 80], [[100 * math.exp(0.04 * k)] for k in (48, 56, 64, 72, 80)], resamples=10)
    assert growth["K2_star"] is None and growth["K2_star_ci"][1] is None and growth["gamma"] is None
    assert growth["exponential_rate"] == pytest.approx(0.04, rel=0.05)
    with pytest.raises(ValueError, match="growing"):  # shorter and shorter: no divergence to fit
        fit_divergence(list(K), [[v] for v in reversed(true)], resamples=10)


def test_the_offset_fit_recovers_the_paper_form_and_prefers_a_line_without_divergence():
    """The paper's form a (K2* - K)^-gamma + b + c K: exact data at 8 K recover K2* within the grid's spacing and
    gamma and the offset closely; a straight line has no divergence; five parameters need six finite medians."""
    K = 7000 * np.array([0.2, 0.35, 0.5, 0.6, 0.7, 0.8, 0.87, 0.93])
    true = divergence(K, math.log(1e4 * 700.0**2), 7000, 2.0, -14_000, 20.0)  # the divergence 1e4 at K2* - K = 700
    fit = fit_divergence(list(K), [[v] for v in true], offset=True, resamples=0)
    assert fit["K2_star"] == pytest.approx(7000, rel=0.03) and fit["gamma"] == pytest.approx(2.0, abs=0.3)
    assert fit["b"] == pytest.approx(-14_000, rel=0.05) and fit["c"] == pytest.approx(20.0, rel=0.05)
    assert divergence(K, fit["log_a"], fit["K2_star"], fit["gamma"], fit["b"], fit["c"]) == pytest.approx(true, rel=0.01)
    for unit in (1e-3, 1e3):  # Delta tau in other units (the paper's runs are 10^6 steps): the same fit, scaled
        scaled = fit_divergence(list(K), [[v * unit] for v in true], offset=True, resamples=0)
        assert (scaled["K2_star"], scaled["gamma"]) == (fit["K2_star"], fit["gamma"])
        assert scaled["b"] == pytest.approx(fit["b"] * unit, rel=1e-6) and scaled["c"] == pytest.approx(fit["c"] * unit, rel=1e-6)
    line = fit_divergence(list(K), [[v] for v in 22.7 * (K - 94)], offset=True, resamples=10)
    assert line["K2_star"] is None and line["why"].startswith("no finite divergence")
    assert line["c"] == pytest.approx(22.7, rel=1e-3) and line["b"] == pytest.approx(-22.7 * 94, rel=1e-3)
    with pytest.raises(ValueError, match=">= 6 K"):
        fit_divergence(list(K[:5]), [[v] for v in true[:5]], offset=True)
    # concave data with a convex last point: the least squares with a >= 0 (scipy's bounded solver at every
    # fourth K2* of the grid, all gamma) fit a divergence; an unconstrained a < 0 would fit the concavity better
    K = np.array([40.0, 48, 56, 64, 72, 80, 88, 96])
    y = 100 * (K - 20) - (K - 40) ** 2
    y[-1] *= 1.3
    fit = fit_divergence(list(K), [[v] for v in y], offset=True, resamples=0)
    assert fit["K2_star"] is not None

    def cost(K2, gamma):  # the least weighted squared error of a (K2* - K)^-gamma + b + c K with a >= 0
        X = np.stack([(K2 - K) ** -gamma, np.ones_like(K), K], 1) / y[:, None]
        res = scipy.optimize.lsq_linear(X / X.max(0), np.ones_like(K), bounds=([0, -np.inf, -np.inf], np.inf))
        return 2 * res.cost
    best = min(cost(K2, g) for K2 in K.max() * np.logspace(1e-3, 3, 600)[::4] for g in estimators.GAMMAS)
    assert cost(fit["K2_star"], fit["gamma"]) <= best * (1 + 1e-6)


def test_censored_medians_are_lower_bounds():
    assert censored_median([100, 200, None], [None, None, 900]) == (200, False)  # a finite median: the value
    assert censored_median([100, 200, None, None], [None, None, 500, 700]) == (350, True)  # beyond the run: >= 350
    assert censored_median([None, None], [None, None]) == (0, True)  # no bound known: at least 0


def test_the_divergence_fit_uses_censored_K_below_and_above_K2_star():
    # K2* = 200 inside the grid: K = 192 stays in 2-Gen past the budget (3300 steps), K = 224 forever
    K2, gamma, budget = 200.0, 2.0, 3300.0
    K = [64, 96, 128, 160, 192, 224]
    covered, estimates = 0, []
    for seed in range(6):
        rng = np.random.default_rng(seed)
        dtau, bounds = [], []
        for k in K:
            v = [float(divergence(k, math.log(1500 * 40**2), K2, gamma)) * math.exp(rng.normal(0, 0.2)) if k < K2
                 else math.inf for _ in range(4)]
            dtau.append([x if x < budget else None for x in v])
            bounds.append([None if x < budget else budget for x in v])
        fit = fit_divergence(K, dtau, bounds, resamples=100)
        covered += fit["K2_star_ci"][0] <= K2 <= (fit["K2_star_ci"][1] or math.inf)  # None: unbounded above
        estimates.append(fit["K2_star"])
    assert covered >= 5 and np.median(estimates) == pytest.approx(K2, rel=0.1)
    # Delta tau exponential in K over K = 48..80 has no finite K2* - unless a larger K stays in 2-Gen far longer
    # than the exponential reaches: then only a divergence below it explains the data
    Ks = [48, 56, 64, 72, 80, 96]
    growth = [[100 * math.exp(0.04 * k)] for k in Ks[:-1]]
    for bound, finite in ((1000, False), (50_000, True)):  # exp(0.04 * 96) * 100 = 4650 steps
        fit = fit_divergence(Ks, growth + [[None]], [[None]] * 5 + [[bound]], resamples=10)
        assert (fit["K2_star"] is not None) == finite
    # a censored K just past the finite ones, 3x above their trend: the least squares trade the trend against the
    # bound (the hinge is active at the optimum); no (K2*, a, gamma) near the fit's does better, up to the K2* grid
    Ks = [48, 56, 64, 72, 80, 88, 96]
    y = np.log([100 * math.exp(0.04 * k) for k in Ks[:-1]] + [3 * 100 * math.exp(0.04 * 96)])

    def cost(params):
        K2, log_a, gamma = params
        pred = log_a - gamma * np.log(np.maximum(K2 - np.array(Ks, float), 1e-12))
        return ((y - pred)[:-1] ** 2).sum() + (max(y[-1] - pred[-1], 0.0) ** 2 if K2 > Ks[-1] else 0.0)

    fit = fit_divergence(Ks, [[math.exp(v)] for v in y[:-1]] + [[None]], [[None]] * 6 + [[math.exp(y[-1])]], resamples=10)
    params = [fit["K2_star"], fit["log_a"], fit["gamma"]]
    best = scipy.optimize.minimize(cost, params, method="Nelder-Mead", options=dict(xatol=1e-10, fatol=1e-14, maxiter=20000))
    assert 96 < fit["K2_star"] < 110 and cost(params) <= 1.005 * best.fun  # without the active sets: x 1.02


def test_sigmoid_asymptote_and_memorized_fraction():
    t = np.unique(np.round(np.logspace(0, 4, 25)))
    for A in (0.3, 0.8):
        fit = fit_sigmoid(list(t), list(sigmoid(t, A, math.log(800), 0.4)))
        assert fit["A"] == pytest.approx(A, abs=0.01)
        assert fit["log_t0"] == pytest.approx(math.log(800), abs=0.05) and fit["width"] == pytest.approx(0.4, abs=0.05)
    # a curve still rising at the end extrapolates above its last value
    t_short = t[t <= 1500]
    assert fit_sigmoid(list(t_short), list(sigmoid(t_short, 0.8, math.log(800), 0.4)))["A"] == pytest.approx(0.8, abs=0.05)
    assert fit_sigmoid([1, 10, 100], [0, 0, 0])["A"] == 0
    rows = [{"step": 10, "delta": [0.1, -0.2, 0.0]}, {"step": 0, "delta": [0.1, 0.1, 0.1]}]
    assert memorized_fraction(rows, epsilon=0.0) == ([0, 10], [0.0, 1 / 3])  # strictly below epsilon


def test_the_json_has_no_infinities():
    assert finite_json({"m": (math.inf, 2.0), "x": [{"y": float("nan")}, 3, None]}) == {
        "m": [None, 2.0], "x": [{"y": None}, 3, None]}


def test_epsilon_and_the_zero_crossing():
    eps = epsilon_calibration([[0.0, 0.02], [0.01, 0.03]])
    assert eps["mean"] == pytest.approx(0.015) and eps["std"] == pytest.approx(np.std([0, 0.02, 0.01, 0.03]))
    assert eps["value"] == pytest.approx(eps["mean"] - 2 * eps["std"]) and len(eps["per_model"]) == 2
    # 0.8 at K = 64, falling by 0.2 per factor e of K: zero at 64 e^4
    Ks = [16, 64, 64 * math.e, 64 * math.e ** 2]
    assert extrapolate_zero(Ks, [0.5, 0.8, 0.6, 0.4]) == pytest.approx(64 * math.e ** 4)
    assert extrapolate_zero([16, 64], [0.1, 0.5]) is None  # not falling


# ----------------------------------------------------------------------------- the command


def test_k2_end_to_end_on_a_tiny_preset(tmp_path, monkeypatch):
    """Runs, reuse, analysis, figure and JSON on runs of a few steps; Delta tau is replaced by a known
    divergence in K so that the fit has something to find whatever the tiny runs learn."""
    tiny_preset = dict(N=8, batch=4, lr=1e-3, iters=8, eval_every=4, eval_dense=4, evals=2, eval_train=4, eval_gen=4,
                       per_chain=2, per_chain_tasks=6, Ks=[2, 3, 4, 5, 6, 7], seeds=1, inf_seeds=2, inf_iters=8,
                       null_chains=5)
    monkeypatch.setitem(k2.PRESETS, "quick", tiny_preset)
    monkeypatch.setattr(memorization, "read_metrics", _with_K(memorization.read_metrics))
    monkeypatch.setattr(memorization, "delta_tau", lambda rows: (float(divergence(rows[0]["K"], 5.0, 8.0, 1.5)), "ok"))
    monkeypatch.setattr(memorization, "fit_divergence",  # the fitted values are checked, not their intervals
                        lambda *a, **kw: estimators.fit_divergence(*a, **{**kw, "resamples": 20}))
    monkeypatch.chdir(tmp_path)
    args = argparse.Namespace(replot=None, preset="quick", root=str(tmp_path / "runs"), jobs=1, seeds=None,
                              print_commands=False, device="cpu", figures=str(tmp_path / "figures"))
    k2.k2(args)
    text = (tmp_path / "figures" / "k2.json").read_text()
    assert "Infinity" not in text and "NaN" not in text  # standard JSON: beyond-the-run values are null
    result = json.loads(text)
    assert result["fit"]["K2_star"] == pytest.approx(8.0, rel=3e-3) and result["fit"]["gamma"] == pytest.approx(1.5, abs=0.02)
    assert result["fit_offset"]["K2_star"] == pytest.approx(8.0, rel=0.03)  # six K: the paper's form is fitted too
    assert sorted(result["delta_tau"]) == ["2", "3", "4", "5", "6", "7"] and len(result["delta_tau"]["2"]) == 1
    assert len(result["epsilon"]["per_model"]) == 2 and len(result["epsilon"]["scores"]) == 12
    assert len(result["runs"]) == 6 and (tmp_path / "figures" / "k2.png").exists()
    assert runs.read_metrics(str(tmp_path / "runs" / "Kinf_s1"))[0]["K"] == math.inf
    stamp = os.path.getmtime(tmp_path / "runs" / "K2_s0" / "metrics.jsonl")
    k2.k2(args)  # everything finished: nothing is trained again
    assert os.path.getmtime(tmp_path / "runs" / "K2_s0" / "metrics.jsonl") == stamp
    # a run that memorized before it formed the induction head has no Delta tau: left out, not "longer than the run"
    monkeypatch.setattr(memorization, "delta_tau", lambda rows: (None, "mem first") if rows[0]["K"] == 2
                        else (float(divergence(rows[0]["K"], 5.0, 8.0, 1.5)), "ok"))
    result = memorization.analyze_k2(k2.k2_runs("quick", str(tmp_path / "runs"), [0]), null_chains=5)
    assert result["delta_tau"][2] == [] and result["delta_tau"][3] != [] and [r["status"] for r in result["runs"]][0] == "mem first"
    # Fig. 8a with a finite median whose interval is unbounded (a censored seed among finite ones): the log axis
    # must span the values (its limits once came from a linear autoscale whose bottom was below 0)
    result["median"][5] = (result["median"][5][0], result["median"][5][1], math.inf)
    figures = []
    monkeypatch.setattr(k2.plt, "close", figures.append)
    k2.plot_k2({**result, "preset": "quick", "N": 8, "mlp_width": 0, "iters": 8}, str(tmp_path / "unbounded.png"))
    low, high = figures[0].axes[0].get_ylim()
    shown = [v for vs in result["delta_tau"].values() for v in vs if v]
    assert 0 < low <= min(shown) and high >= max(shown)
    assert len(figures[0].axes[1].lines) == 2  # the inset: medians against K2* - K and the fit
    # scored with the fresh-chain null and on two sets: Fig. A10 draws the two-set rule, the bottom row the null
    ax10, axeps = figures[0].axes[3], figures[0].axes[4]
    assert ax10.get_ylabel().startswith("memorized: the two-set rule") and axeps.get_title().startswith("the null")


def _with_K(read_metrics):
    def read(run_dir, dense=False):
        cfg, rows = read_metrics(run_dir, dense)
        return cfg, [{**r, "K": cfg["K"]} for r in rows]
    return read


def test_delta_tau_table_of_run_directories(tmp_path, capsys):
    """k2.py dtau ROOT: per run the definitions above, per K the seeds' Delta tau (a censored seed as None,
    a seed that never formed the head left out), medians, and a line through them; on run directories as
    train.py writes them (config.json, dense rows in metrics.jsonl)."""
    phis = [0.1, 0.2, 0.5, 0.6, 0.6, 0.6, 0.6]
    runs = {  # (K, seed): losses; level 2.0; tau_2gen = 20
        (4, 0): [2.3, 2.2, 2.1, 1.9, 1.9, 1.9, 1.9],  # Delta tau 10
        (8, 0): [2.3, 2.2, 2.1, 1.9, 1.9, 1.9, 1.9],  # Delta tau 10
        (8, 1): [2.3, 2.2, 2.1, 2.1, 1.9, 1.9, 1.9],  # 20
        (16, 0): [2.3, 2.2, 2.1, 2.1, 2.1, 1.9, 1.9],  # 30
        (16, 1): [2.3, 2.2, 2.1, 2.1, 2.1, 2.1, 2.1],  # censored after 40
    }
    for (K, seed), losses in runs.items():
        run = tmp_path / f"K{K}_s{seed}"
        run.mkdir()
        (run / "config.json").write_text(json.dumps({"K": K, "seed": seed, "iters": 60}))
        (run / "metrics.jsonl").write_text("".join(json.dumps({**r, "dense": True}) + "\n" for r in rows_of(losses, phis)))
    never = tmp_path / "K16_s2"  # never forms the induction head: not in Delta tau
    never.mkdir()
    (never / "config.json").write_text(json.dumps({"K": 16, "seed": 2, "iters": 60}))
    (never / "metrics.jsonl").write_text("".join(json.dumps({**r, "dense": True}) + "\n" for r in rows_of([2.3] * 7, [0.1] * 7)))
    table = memorization.delta_tau_table(sorted(str(p) for p in tmp_path.iterdir()))
    assert [(r["K"], r["seed"], r["delta_tau"], r["status"]) for r in table["runs"]] == [
        (4, 0, 10, "ok"), (8, 0, 10, "ok"), (8, 1, 20, "ok"), (16, 0, 30, "ok"), (16, 1, None, "censored"), (16, 2, None, "no 2-gen")]
    assert table["delta_tau"] == {4: [10], 8: [10, 20], 16: [30, None]}
    assert table["median_ci"][8][0] == 15 and table["median_ci"][16][0] == math.inf
    assert {k: table["line"][k] for k in ("slope", "K_at_zero")} == pytest.approx({"slope": 1.25, "K_at_zero": -4.0})  # (4, 10), (8, 15)
    assert table["runs"][4]["censored_after"] == 40
    assert "needs" in table["fit"]["why"]  # two finite medians: no divergence fit
    args = argparse.Namespace(root=str(tmp_path), json=str(tmp_path / "dtau.json"))
    k2.dtau(args)
    assert "K = 8: Delta tau [10, 20], median 15" in capsys.readouterr().out
    saved = json.load(open(tmp_path / "dtau.json"))
    assert saved["median_ci"]["16"][0] is None  # beyond the run: null
    k2.dtau(argparse.Namespace(root=str(tmp_path / "dtau.json"), json=str(tmp_path / "again.json")))
    assert json.load(open(tmp_path / "again.json")) == saved  # from its own rows; root: where the runs were
    assert saved["median_coverage"] == {"4": 0.0, "8": 0.5, "16": 0.5}  # 1 and 2 seeds: their range, 0 % and 50 %
    (never / "config.json").write_text(json.dumps({"K": 16, "seed": 2, "iters": 90}))  # another protocol: refused
    with pytest.raises(ValueError, match="differ in iters"):
        memorization.delta_tau_table(sorted(str(p) for p in tmp_path.iterdir() if p.is_dir()))
    (tmp_path / "rows.json").write_text('{"runs": [{"K": 4}]}')  # not this command's rows: one line, no traceback
    with pytest.raises(ValueError, match="rows.json does not hold k2.py dtau's per-run rows"):
        k2.dtau(argparse.Namespace(root=str(tmp_path / "rows.json"), json=None))


def test_the_line_through_the_medians_and_its_bootstrap_over_seeds():
    """The line is least squares through the finite medians (a censored median, None, is left out); its intervals
    come from resampling seeds within each K: zero width when every K's seeds agree, the range of the possible lines
    when one K's seeds disagree."""
    Ks = [100, 200, 300, 400]
    line = estimators.line_through_medians(Ks, [[5, 5, 5], [900, 1000, 1100], [2000, 2000], [None, None, 3000]])
    slope, intercept = np.polyfit([100, 200, 300], [5, 1000, 2000], 1)
    assert line["slope"] == pytest.approx(slope) and line["K_at_zero"] == pytest.approx(-intercept / slope)
    exact = estimators.line_through_medians(Ks[:3], [[10, 10], [20, 20], [30, 30]])
    assert exact["slope_ci"] == pytest.approx([0.1, 0.1]) and exact["K_at_zero_ci"] == pytest.approx([0.0, 0.0], abs=1e-9)
    # K = 200's bootstrap median is 10, 20 or 30 (a quarter, a half, a quarter): slopes 0.1 exactly, zeros 100/3 +- 100/3
    spread = estimators.line_through_medians(Ks[:3], [[10, 10], [10, 30], [30, 30]])
    assert spread["slope"] == pytest.approx(0.1) and spread["slope_ci"] == pytest.approx([0.1, 0.1])
    assert spread["K_at_zero_ci"] == pytest.approx([-100 / 3, 100 / 3])
    assert estimators.line_through_medians([1, 2], [[3], [None]]) is None
    assert line["seeds"] == [3, 3, 2, 3]  # the resampling says its n


def k2_json(with_fit: bool) -> dict:
    """A k2.json as loaded (K as strings, null for what lies beyond the runs): Delta tau diverging towards
    K2* = 56, K = 48 still in 2-Gen in every seed, K = 40 in one."""
    Ks = [24, 28, 32, 36, 40, 48]
    dtau = {24: [450, 400], 28: [800, 700], 32: [900, 1100], 36: [2000, 2100], 40: [3000, None], 48: [None, None]}
    fit = ({"K2_star": 56.0, "log_a": math.log(5e5), "gamma": 1.5} if with_fit else
           {"K2_star": None, "why": "the fit needs a finite, growing median Delta tau at >= 4 K (finite at 3)"})
    curve = {"step": [0, 10, 100, 1000], "fraction": [0.0, 0.0, 0.2, 0.5]}
    return json.loads(json.dumps(finite_json({
        "preset": "quick", "N": 64, "mlp_width": 8, "iters": 4000, "K": Ks, "fit": fit, "fit_offset": {"K2_star": None},
        "delta_tau": dtau, "median": {K: (float(np.median([v or math.inf for v in d])), 0.9 * (d[0] or 3600), math.inf)
                                      for K, d in dtau.items()},
        "median_lower_bound": {40: 3000, 48: 3600}, "memorized_asymptote": {K: [0.8 - 0.01 * K, 0.85 - 0.01 * K] for K in Ks},
        "memorized_zero": 80.0, "memorized_curves": {K: [curve, curve] for K in Ks},
        "epsilon": {"value": 0.001, "mean": 0.02, "std": 0.01, "scores": [0.01, 0.02, 0.03], "per_model": [0.02, 0.02]}})))


@pytest.mark.parametrize("with_fit", [True, False])
def test_k2_figure_from_its_json_ticks_every_K_and_leaves_out_an_empty_inset(tmp_path, monkeypatch, with_fit):
    """Fig. 8a and 8b on log-2 axes: one labelled tick per K (2^5 alone once covered K = 24..48); the counts of
    seeds still in 2-Gen written level; without a finite K2* no inset that only says so."""
    figures = []
    monkeypatch.setattr(k2.plt, "close", figures.append)
    k2.plot_k2(k2_json(with_fit), str(tmp_path / "k2.png"))
    fig = figures[0]
    assert len(fig.axes) == (6 if with_fit else 5)  # 8a, the inset, 8b, A10, epsilon and its legend's slot
    fig_8a, fig_8b = fig.axes[0], fig.axes[2 if with_fit else 1]
    for ax in (fig_8a, fig_8b):
        assert list(ax.get_xticks()) == [24, 28, 32, 36, 40, 48]
        assert [t.get_text() for t in ax.get_xticklabels()] == ["24", "28", "32", "36", "40", "48"]
    counts = [t for t in fig_8a.texts if t.get_text()]
    assert [t.get_text() for t in counts] == ["1/2", "2/2"] and all(t.get_rotation() == 0 for t in counts)
    assert "seeds still in 2-Gen at the end" in fig_8a.get_title()
    assert not any("no finite K2*" in t.get_text() for ax in fig.axes for t in ax.texts)
    # no null in this JSON: one rule, uncorrected, and epsilon's calibration in the null's place
    ax10, axeps = fig.axes[-3], fig.axes[-2]
    assert ax10.get_ylabel().startswith("fraction of trained chains memorized") and "corrected" not in ax10.get_ylabel()
    assert axeps.get_title().startswith("$\\epsilon$ from 2 models at K = inf")
    if with_fit:  # the inset: K2* - K at the finite medians (K = 24..36), spanning less than a decade
        inset = fig.axes[1]
        assert inset.get_title() == "Fig. 8a inset: the divergence"
        assert sorted(inset.get_xticks()) == [20, 24, 28, 32] and len(inset.get_xticks(minor=True)) == 0


def test_the_gaussian_noise_model_predicts_gaussian_chains_two_rules():
    """Chains with Gaussian true scores (mean -0.004, spread 0.006; noise 0.007), simulated: from one set's fraction
    and the measured noise and signal share alone, the model gives the two-set rule's fraction and the fraction of
    true scores below epsilon that the simulation counts (within its sampling noise, 20000 chains)."""
    rng, n, eps = np.random.default_rng(4), 20000, 0.0
    mu = rng.normal(-0.004, 0.006, n)
    a, b = mu + rng.normal(0, 0.007, n), mu + rng.normal(0, 0.007, n)
    noise = score_noise([{"step": 0, "delta": a.tolist()}], [{"step": 0, "delta": b.tolist()}], eps)
    model = thresholds.gaussian_noise_model(float(np.mean(a < eps)), noise["sigma"][0], noise["signal_share"][0], eps)
    assert model["two_sets"] == pytest.approx(noise["fraction"][0], abs=0.01)
    assert model["noise_free"] == pytest.approx(np.mean(mu < eps), abs=0.01)
    assert abs(model["noise_free"] - noise["fraction"][0]) > 0.2  # the two-set rule is no estimate of it: a bound
