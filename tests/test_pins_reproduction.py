"""The committed numbers recomputed by the current code: the cheap, deterministic parts of figures/*.json, each
within seconds. A change of a constant that moves every number at once (how chains are drawn, a seed or its offset,
an evaluation-set size, a grid, a bootstrap's draws) passes the tests of the parts and fails here.

Exact where the computation is bit-for-bit the committed one (the same ops in the same order on one thread: the
minimal model, the searches and tables replayed from committed rows); to float64 rounding (1e-12) for the SA
theory's Monte Carlo (its matrix powers sum in another order on one thread); within 1e-6 where the committed run
summed float32 in another order (torch on the 2-core VM with two threads against one here, or another BLAS inside
scipy's fits: ~2e-7 there), or read values stored rounded (epsilon's scores: 5 decimals); within 1e-5 for the SA
trajectories stored to 6 significant digits. A wrong seed or constant moves these numbers by 1e-3 or more.
"""
import argparse
import json
import math
import os
from dataclasses import asdict, replace

import numpy as np
import pytest
import torch

import bayes
import evaluation
import k1
import k2
import mem_minimal as mm
import predictor_scaling
import sa_dynamics as sd
import train
from analysis.estimators import Search, epsilon_calibration, extrapolate_zero, fit_sigmoid, median_ci
from analysis.memorization import divergence_fits
from sa_transformer import F1_exact, F_d, I_coefficient, predicted_rates
from analysis.thresholds import PHI_STAR, corrected, memorized_fraction, null_epsilon
from plumbing.records import finite_json
from bayes import PREDICTORS
from engine import fastdata
from markov import task_source

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def committed(name: str) -> dict:
    with open(os.path.join(ROOT, "figures", name)) as f:
        return json.load(f)


def as_json(value):
    """A result as its JSON file holds it: None for an unbounded value, string keys."""
    return json.loads(json.dumps(finite_json(value)))


def close(a, b, rel: float) -> bool:
    """Nested dicts and lists equal, floats within `rel` of each other relative to their size (no absolute floor:
    the SA rates are ~1e-4)."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(close(a[k], b[k], rel) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(close(x, y, rel) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, (int, float)):
        return math.isclose(a, b, rel_tol=rel, abs_tol=0) or (math.isnan(a) and math.isnan(b))
    return a == b


# ----------------------------------------------------------------------------- Fig. 2a: a run's first evaluations


@pytest.mark.parametrize("K", [16, 64, 256, 1024])
def test_fig2a_runs_are_the_command_lines_config(K):
    """Each Fig. 2a JSON's config is what its command (`python train.py --K <K>` on a CPU) makes today: the quick
    preset's sizes and the Config's defaults (an evaluation set, a learning rate, a seed) are the committed ones."""
    d = committed(f"fig2a_K{K}.json")
    assert d["command"] == f"python train.py --K {K}"
    cfg = train.make_config(argparse.Namespace(K=K, seed=0, preset="quick", device="cpu"))  # a CPU's defaults
    assert asdict(cfg) == d["config"]


def test_fig2a_K256_first_steps_are_the_committed_run(tmp_path, same_numbers):
    """`python train.py --K 256` (quick, CPU, the speed block's fastdata.predict) for one step: the evaluations at
    steps 0 and 1 - the chains of S, both held-out sets and the four predictors' levels on them, the initial
    weights, the first batch and AdamW's first update, and every loss, divergence and readout taken there - are the
    committed run's first two rows. (AdamW's first update is lr times the gradient's sign: its betas and weight
    decay move the second step's rows by less than the tolerance; the config test pins them.)"""
    d = committed("fig2a_K256.json")
    cfg = train.Config(**{**d["config"], "iters": 1, "evals": 1, "out": str(tmp_path / "run")})
    rows = train.train(cfg, quiet=True)
    assert [r["step"] for r in rows] == [0, 1]
    assert same_numbers(rows, d["rows"][:2])


@pytest.mark.parametrize("K", [16, 64, 1024])
def test_fig2a_step_0_at_every_K(K, same_numbers):
    """The other Fig. 2a runs at step 0, built as train.py builds them (its Config, task_source, init_model,
    evaluation.make_eval_data with the CPU's predictors), without training."""
    d = committed(f"fig2a_K{K}.json")
    cfg = train.Config(**d["config"])
    tasks = task_source(cfg.K, cfg.C, seed=cfg.task_seed)
    data = evaluation.make_eval_data(cfg, tasks, predict=fastdata.predict)
    row = {"step": 0, **evaluation.evaluate(train.init_model(cfg, torch.device("cpu")), data)}
    assert same_numbers(row, d["rows"][0])


def test_fig2bc_grid_is_the_fig2a_runs_and_K4_at_step_0(same_numbers):
    """Fig. 2b-c's grid (one seed per K, quick): its K = 16..1024 rows are the Fig. 2a runs' evaluations (n_A over
    N), and its K = 4 row starts where the initial model on K = 4's data starts."""
    d = committed("fig2bc.json")
    keys = [k for k in d if k not in ("K", "step")]
    for i, K in enumerate(d["K"]):
        if K == 4:
            cfg = train.make_config(argparse.Namespace(K=4, seed=0, preset="quick", device="cpu"))
            data = evaluation.make_eval_data(cfg, task_source(cfg.K, cfg.C, seed=cfg.task_seed), predict=fastdata.predict)
            row = evaluation.evaluate(train.init_model(cfg, torch.device("cpu")), data)
            assert same_numbers({k: row[k] / (cfg.N if k.startswith("n_A") else 1) for k in keys},
                                {k: d[k][i][0] for k in keys})
            continue
        rows = committed(f"fig2a_K{K}.json")["rows"]
        assert [r["step"] for r in rows] == d["step"]
        assert same_numbers({k: d[k][i] for k in keys},  # the sweep's own runs: the same to float32 rounding
                            {k: [r[k] / (128 if k.startswith("n_A") else 1) for r in rows] for k in keys})


# ----------------------------------------------------------------------------- the appendix's predictor scaling


def test_predictor_scaling_at_small_K_and_the_asymptotes():
    """predictor_scaling.json's losses against K for K = 1..16 (S nested, the first 16 chains of each of the 8 task
    sets; the draws of a K come after those of the smaller K, so a prefix of the K list draws the same sequences)
    and the N -> infinity levels of 1-Gen and 2-Gen over the 8 task sets at K = 128."""
    d = committed("predictor_scaling.json")
    cfg = d["config"]
    Ks = d["K"][:5]
    assert Ks == [1, 2, 4, 8, 16]
    losses = predictor_scaling.scaling_with_K(Ks, cfg["N_for_K"], cfg["dists"], cfg["seqs_per_K"], "cpu")
    for name in PREDICTORS:
        got, want = predictor_scaling.summarize(losses[name]), d["loss_vs_K"][name]
        assert got["mean"] == pytest.approx(want["mean"][:5], rel=1e-6), name
        assert got["std"] == pytest.approx(want["std"][:5], rel=1e-4), name  # a difference of near values
    assert predictor_scaling.asymptotic_levels(cfg["K_for_N"], cfg["dists"]) == d["asymptotic"]


# ----------------------------------------------------------------------------- the SA theory (Fig. 6a)


def test_sa_theory_F_d_I_and_the_predicted_rates():
    """F_d (d = 1..20) and I by Monte Carlo over the committed 200,000 chains (seed 0): the same draws, the same
    numbers to float64 rounding (the chains' matrix powers sum in another order on one thread); F_1's closed form;
    and the early rates at the paper's and the plateau's mixture weights."""
    d = committed("sa_scaling.json")
    assert F_d(20, 200_000) == pytest.approx(d["F_d"], rel=1e-12) and d["F1_mc"] == d["F_d"][0]
    assert F1_exact() == d["F1_exact"] == 9 / 110  # (C - 1) / (C^2 + C), C = 10
    I = I_coefficient(200_000)
    assert I == pytest.approx(d["I"], rel=1e-12)
    rates = d["rates"]["predicted"]
    w = d["rates"]["w_plateau"]  # w_A..w_D
    assert predicted_rates(64, I) == rates["paper (w_B = w_C = 1/3)"]
    assert predicted_rates(64, I, w_B=w[1], w_C=w[2]) == rates["at w_plateau"]


def test_sa_dynamics_numbers_from_the_committed_trajectories():
    """Fig. 5b, 6b and RESULTS.md's exponent table from sa_scaling.json's own trajectories (stored to 6
    significant digits: within 1e-5): the plateau's mixture weights that freeze the reduced model, the power-law
    exponents of beta and delta over the three windows, the measured and predicted early rates, tau of the
    dynamics seeds and the final and early weights."""
    d = committed("sa_scaling.json")
    dyn, frozen = sd.dynamics_runs(d)
    N_dyn = sd.PRESETS[d["preset"]]["N_dyn"]
    w_plateau, tau_control = sd.plateau_weights(dyn["full_control"], N_dyn)
    out = sd.dynamics_summary(dyn, frozen, w_plateau, tau_control, d["I"], N_dyn)
    assert close(json.loads(json.dumps(out)), {k: d[k] for k in out}, rel=1e-5)


# ----------------------------------------------------------------------------- Fig. 8d-e: the minimal model


def test_mem_minimal_heat_map_corner_is_the_committed_run():
    """The heat map's cell D_phi = 2, K = 4 (1500 steps): the task set, the model's draws, the batches, AdamW, the
    criterion's tail window and the held-out sets (their own generator) give the committed numbers to float32
    rounding. Not bit for bit: another CPU's kernels round one ulp differently (0.2608144283 against the committed
    0.2608141899), and 1500 AdamW steps carry such a difference on; 1e-5 nats is ~40 float32 ulps of a loss of 2.5,
    while another seed, batch or task set moves these numbers by 1e-3 and more."""
    d = committed("mem_minimal.json")
    H = d["heatmap"]
    assert (H["D_phi"][0], H["K"][0]) == (2, 4)
    out = mm.train_mem(replace(mm.MemRun(**d["config"]), K=4, D_phi=2))
    got = [out["train_minus_2gen"], out["gen_minus_2gen"], out["criterion"]]
    want = [H["train_minus_2gen"][0][0], H["gen_minus_2gen"][0][0], H["criterion"][0][0]]
    assert got == pytest.approx(want, rel=0, abs=1e-5)


@pytest.mark.parametrize("name", ["mem_minimal.json", "mem_depths_6000.json"])
def test_mem_minimal_K2_hat_searches_replayed_from_their_criteria(name):
    """Fig. 8f: each K2_hat search replayed with its recorded criteria (the training it would do answered from its
    history): the same Ks asked in the same order, the same interpolated zero crossing; and the table of K2_hat
    per (l1, l2), D_phi and seed built from those searches (k2_searches, nothing left to train) is the committed
    one (README: K2_hat 10.7-21.2 at 1500 steps)."""
    d = committed(name)
    base = mm.MemRun(**d["config"])
    for search in d["searches"]:
        criteria = dict(search["history"])
        K2, history = mm.bisect_K(mm.MemRun(**search["run"]), *mm.PRESETS["quick"]["K_range"], lambda run: criteria[run.K])
        assert (K2, [list(h) for h in history]) == (search["K2_hat"], search["history"])
    seeds = sorted({s["run"]["seed"] for s in d["searches"]})
    D_phis = sorted({s["run"]["D_phi"] for s in d["searches"]})
    depths = [tuple(int(v) for v in key.split(",")) for key in d["K2_hat"]]
    table = mm.k2_searches(base, depths, D_phis, seeds, mm.PRESETS["quick"]["K_range"], jobs=1, done=d["searches"])
    assert table["K2_hat"] == d["K2_hat"]


# ----------------------------------------------------------------------------- Fig. 8a-b, A10: the K2* analyses


K2_SWEEPS = ["k2.json", "k2_width32_3000.json", "k2_width32_5000.json", "k2_width256_4000.json"]


@pytest.mark.parametrize("name", K2_SWEEPS)
def test_k2_sweep_memorized_fractions_asymptotes_and_epsilon(name):
    """From each k2 sweep's own per-run rows: the null-corrected fractions, their sigmoid asymptotes, Fig. 8b's
    zero crossings through the seeds' means and medians, and epsilon from the K = inf models' scores (stored
    rounded to 5 decimals: within 1e-6)."""
    d = committed(name)
    Ks, curves = d["K"], d["memorized_curves"]
    A = {}
    for K in Ks:
        for c in curves[str(K)] if "fraction_raw" in curves[str(K)][0] else []:  # written before the null: no raw
            assert corrected(c["fraction_raw"], c["false_positive"]) == pytest.approx(c["fraction"], rel=1e-12, abs=1e-15)
        A[K] = [fit_sigmoid(c["step"], c["fraction"])["A"] for c in curves[str(K)]]
        assert A[K] == pytest.approx(d["memorized_asymptote"][str(K)], rel=1e-6, abs=1e-9), K
    for key, average in (("memorized_zero", np.mean), ("memorized_zero_median", np.median)):
        assert extrapolate_zero(Ks, [float(average(A[K])) for K in Ks]) == pytest.approx(d[key], rel=1e-6), key
    eps, n = d["epsilon"], d["epsilon"]["chains"]
    scores = [eps["scores"][i * n:(i + 1) * n] for i in range(len(eps["per_model"]))]
    assert epsilon_calibration(scores)["value"] == pytest.approx(eps["value"], abs=1e-6)


def test_k2_quick_run_at_step_0_dense_readouts_and_fresh_chain_null():
    """k2.json's run K = 24, seed 0 at step 0, rebuilt from the quick preset (k2.k2_runs): the gap L_train -
    L^2-Gen on the dense readouts' own held-out set (evaluation.held_out_sets), and the fresh-chain null of the memorized
    fraction (memorization.saved_model_scores: the per-chain sequences of 256 fixed fresh chains, scored to 6
    decimals) - its 5 % quantile, epsilon_null, and the rate at which it passes epsilon."""
    d = committed("k2.json")
    cfg = next(c for c in k2.k2_runs("quick", "runs/k2_quick", [0], device="cpu") if (c.K, c.seed) == (24, 0))
    run = next(r for r in d["runs"] if (r["K"], r["seed"]) == (24, 0))
    curve = d["memorized_curves"]["24"][[r["seed"] for r in d["runs"] if r["K"] == 24].index(0)]
    tasks = task_source(cfg.K, cfg.C, seed=cfg.task_seed)
    model = train.init_model(cfg, torch.device("cpu"))
    held = evaluation.held_out_sets(cfg, tasks, bayes.predict)
    with torch.no_grad():
        gap = evaluation.dense_readouts(model, *held["dense"])["train_loss"].item() - held["dense_2gen"]
    # stored rounded (the gap to 5 decimals, the scores to 6): compared within the rounding, since a value one float32
    # ulp from a rounding boundary rounds the other way on another CPU
    assert run["gap_to_2gen"][0][0] == 0 and run["gap_to_2gen"][0][1] == pytest.approx(gap, rel=0, abs=1e-5)
    fresh = evaluation.make_per_chain_data(replace(cfg, per_chain_tasks=d["null"]["chains"]), task_source(math.inf, cfg.C))
    null = evaluation.per_chain_scores(model, fresh).tolist()
    assert null_epsilon([{"step": 0, "delta": null}]) == pytest.approx([curve["epsilon_null"][0]], rel=0, abs=2e-6)
    # the false-positive rate counts chains past epsilon: exact, as long as no score sits within rounding of it
    assert min(abs(v - d["epsilon"]["value"]) for v in null) > 1e-5
    assert memorized_fraction([{"step": 0, "delta": null}], d["epsilon"]["value"])[1] == [curve["false_positive"][0]]


def test_k2_quick_divergence_fit_and_medians(same_numbers):
    """Fig. 8a of the quick sweep (README: K2* = 72, [37, open), gamma = 4.7) refitted from the committed
    Delta tau and censoring bounds: the same grid, the same bootstrap draws, the same numbers; and each K's median
    with its interval."""
    d = committed("k2.json")
    Ks = [K for K in d["K"] if d["delta_tau"][str(K)]]
    fit, offset = divergence_fits(Ks, [d["delta_tau"][str(K)] for K in Ks], [d["censored_after"][str(K)] for K in Ks])
    for mine, theirs in ((fit, d["fit"]), (offset, d["fit_offset"])):
        assert same_numbers({k: v for k, v in as_json(mine).items() if k in theirs}, theirs, rel=1e-9)
    assert as_json({K: median_ci(d["delta_tau"][str(K)]) for K in Ks}) == {str(K): d["median"][str(K)] for K in Ks}


@pytest.mark.parametrize("name", ["dtau_paper_h100.json", "k2_width8_6000_wall.json"])
def test_dtau_tables_from_their_runs(name, tmp_path, capsys, same_numbers):
    """`python k2.py dtau figures/<name> --json OUT`: the per-K medians, the divergence fits and the line through
    the medians (its bootstrap included) redone from the JSON's own per-run rows equal the committed ones."""
    out = tmp_path / name
    k2.dtau(argparse.Namespace(root=os.path.join(ROOT, "figures", name), json=str(out)))
    assert same_numbers(json.loads(out.read_text()), committed(name))


# ----------------------------------------------------------------------------- Figs. 7a-c, A9: K1*


def test_k1_searches_replayed_from_their_probes():
    """k1.json's K1* per condition and seed, replayed: each seed's binary search (the preset's lo, hi, ratio) asks
    for its probes round by round, each answered by whether that probe's max phi_beta(2) exceeded phi_beta* =
    0.45; where it stops, its K1*, bound, smallest generalizing K, bracket and number of probes are the committed
    ones, and every probe it asked for is one the JSON holds."""
    d = committed("k1.json")
    assert d["phi_star"] == PHI_STAR
    up = {(r["condition"], r["seed"], r["K"]): r["max_phi_beta"] > PHI_STAR for r in d["runs"]}
    asked = set()
    for condition, rows in d["seeds"].items():
        for row in rows:
            seed = row["seed"]
            search = Search(d["search"]["lo"], d["search"]["hi"], d["search"]["ratio"])
            while todo := search.pending():
                for K in todo:
                    search.record(K, up[condition, seed, K])
                    asked.add((condition, seed, K))
            result = search.result()
            below = max((K for K, u in search.probes.items() if not u), default=None)
            above = min((K for K, u in search.probes.items() if u), default=None)
            assert (result["K1_star"], result["bound"], result["above"], [below, above], len(search.probes), True) == (
                row["K1_star"], row["bound"], row["above"], row["bracket"], row["probes"], row["done"]), (condition, seed)
    assert asked == set(up)


def test_k1_grid_h100_from_its_bench_summary():
    """figures/k1_grid_h100.json, the grid trained on an H100 by train.py: its table of Fig. 7a (max phi_beta(2) from
    the dense readouts, L_gen at the end, the heads per K; README: the head in 0, 1, 4, 4, 4 of 4 seeds) and each
    seed's K1* bracket, from the members of the summary it names."""
    d = committed("k1_grid_h100.json")
    with open(os.path.join(ROOT, d["source"])) as f:
        bench = json.load(f)
    assert (d["device"], d["command"]) == (bench["device"], bench["command"])
    members = [{"K": m["K"], "seed": m["seed"], "max_phi_beta": m["max_phi_beta_2_dense"], "gen_loss": m["gen_loss"],
                "gen_loss_2gen": m["gen_loss_2gen"]} for m in bench["members"].values()]
    table = k1.grid_table(members)
    assert as_json(table) == d["table"]["control"] and as_json(k1.grid_brackets(table)) == d["brackets"]["control"]
    assert [row["heads"] for row in d["table"]["control"].values()] == [0, 1, 4, 4, 4]


def test_k1_grid_w01_tables_and_brackets_from_its_runs():
    """k1_grid_w0.1.json's per-K tables (min_t L_gen, heads) and each seed's K1* bracket, from its own runs."""
    d = committed("k1_grid_w0.1.json")
    for condition in d["table"]:
        table = k1.grid_table([dict(r, gen_loss=r["min_gen_loss"]) for r in d["runs"] if r["condition"] == condition])
        assert as_json(table) == d["table"][condition]
        assert as_json(k1.grid_brackets(table)) == d["brackets"][condition]
