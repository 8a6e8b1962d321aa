"""thresholds.py's rules and its K2* analysis pinned by hand: tau_2gen, tau_2mem and Delta tau at their edges
(the same step, rows out of order), and analyze_k2 on run directories written here (config.json, dense rows,
per-chain scores) whose every number - Delta tau and its censoring, epsilon, the memorized fractions, their
asymptotes and Fig. 8b's zero crossing - is worked out in the test."""
import json
import math

import numpy as np
import pytest

import thresholds
import train
from estimators import fit_sigmoid


def dense_rows(phis, losses, level=2.0, every=10):
    return [{"step": every * i, "phi_beta_2": p, "train_loss": l, "train_loss_2gen": level, "dense": True}
            for i, (p, l) in enumerate(zip(phis, losses))]


# ----------------------------------------------------------------------------- the rules


def test_memorizing_at_the_step_the_head_forms_is_a_delta_tau_of_zero():
    """tau_2gen = tau_2mem = 20: the run memorized within the evaluation interval in which it entered 2-Gen, a
    Delta tau of 0 (estimators count it as one step), not "memorized first"."""
    rows = dense_rows([0.1, 0.2, 0.5, 0.6], [2.3, 2.2, 1.9, 1.8])
    assert thresholds.tau_2gen(rows) == 20 and thresholds.tau_2mem(rows) == 20
    assert thresholds.delta_tau(rows) == (0, "ok")
    assert thresholds.delta_tau(dense_rows([0.1, 0.2, 0.5, 0.6], [2.3, 1.9, 1.9, 1.8])) == (None, "mem first")


def test_the_rules_read_rows_in_step_order():
    """Rows as a reader may return them (a resumed run appends; dense and full rows interleave): the first
    step in time, not in the list."""
    rows = dense_rows([0.1, 0.5, 0.9, 0.7, 0.8], [2.3, 2.1, 1.95, 1.9, 1.8])
    shuffled = [rows[i] for i in (4, 2, 0, 3, 1)]
    assert thresholds.tau_2gen(shuffled) == 10 and thresholds.tau_2mem(shuffled) == 20
    assert thresholds.delta_tau(shuffled) == (10, "ok")
    assert thresholds.max_phi_beta(shuffled) == 0.9 and thresholds.max_phi_beta(shuffled, iters=20) == 0.9
    assert thresholds.max_phi_beta(shuffled, iters=19) == 0.5  # steps <= T only
    censored = dense_rows([0.1, 0.5, 0.9, 0.7, 0.8], [2.3, 2.1, 2.05, 2.0, 2.0])
    assert thresholds.censored_after([censored[i] for i in (4, 2, 0, 3, 1)]) == 40 - 10


# ----------------------------------------------------------------------------- analyze_k2 on hand-written runs

STEPS = [0, 10, 100, 1000]
EPS_SCORES = {  # K = inf models: per-chain scores, first row and last row (epsilon reads the last)
    0: ([0.5, 0.5, 0.5, 0.5], [0.01, 0.03, -0.01, 0.05]),
    1: ([-0.5, -0.5, -0.5, -0.5], [0.00, 0.02, 0.04, 0.02]),
}
RUNS = {  # (K, seed): (phi_beta_2 and train loss per dense row every 10 steps; per-chain scores at STEPS)
    (8, 0): ([0.1, 0.5, 0.6, 0.6], [2.3, 2.1, 1.9, 1.9],  # Delta tau 10
             [[0.0] * 4, [0.0, -0.03, 0.0, 0.0], [-0.03, -0.03, -0.04, 0.0], [-0.03, -0.03, -0.04, -0.05]]),
    (8, 1): ([0.1, 0.5, 0.6, 0.6], [2.3, 2.1, 2.1, 1.9],  # 20
             [[0.0] * 4, [0.0, 0.0, -0.03, 0.0], [-0.03, 0.0, -0.04, 0.0], [-0.03, -0.03, -0.04, 0.0]]),
    (16, 0): ([0.1, 0.5, 0.6, 0.6], [2.3, 2.1, 2.1, 2.1],  # censored: in 2-Gen from 10 to 30
              [[0.0] * 4, [0.0] * 4, [-0.03, 0.0, 0.0, 0.0], [-0.03, -0.02, -0.04, 0.0]]),
    (16, 1): ([0.1, 0.2, 0.2, 0.2], [2.3, 2.2, 2.1, 2.1],  # never in 2-Gen: no Delta tau
              [[0.0] * 4, [0.0] * 4, [0.0, -0.03, 0.0, 0.0], [0.0, -0.03, -0.02, 0.0]]),
    (32, 0): ([0.1, 0.5, 0.6, 0.6], [2.3, 2.1, 2.0, 1.5],  # 20
              [[0.0] * 4, [0.0] * 4, [0.0] * 4, [-0.03, 0.0, 0.0, 0.0]]),
    (32, 1): ([0.5, 0.5, 0.6, 0.6], [2.3, 2.1, 2.0, 1.5],  # 30
              [[0.0] * 4, [0.0] * 4, [0.0] * 4, [0.0] * 4]),
}


def write_run(path, K, seed, dense, per_chain):
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"K": K, "seed": seed, "iters": 30}))
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in dense))
    (path / "per_chain.jsonl").write_text("".join(json.dumps({"step": s, "delta": d}) + "\n" for s, d in zip(STEPS, per_chain)))


def test_analyze_k2_on_hand_written_runs(tmp_path):
    cfgs = []
    for (K, seed), (phis, losses, scores) in RUNS.items():
        write_run(tmp_path / f"K{K}_s{seed}", K, seed, dense_rows(phis, losses), scores)
        cfgs.append(train.Config(K=K, seed=seed, out=str(tmp_path / f"K{K}_s{seed}")))
    for seed, (first, last) in EPS_SCORES.items():
        write_run(tmp_path / f"Kinf_s{seed}", math.inf, seed, dense_rows([0.1] * 4, [2.3] * 4),
                  [first, first, first, last])
        cfgs.append(train.Config(K=math.inf, seed=seed, out=str(tmp_path / f"Kinf_s{seed}")))
    result = thresholds.analyze_k2(cfgs)

    assert result["K"] == [8, 16, 32]
    assert result["delta_tau"] == {8: [10, 20], 16: [None], 32: [20, 30]}
    assert result["censored_after"] == {8: [None, None], 16: [20], 32: [None, None]}
    assert [r["status"] for r in result["runs"]] == ["ok", "ok", "censored", "no 2-gen", "ok", "ok"]
    assert {K: m[0] for K, m in result["median"].items()} == {8: 15, 16: math.inf, 32: 25}
    assert result["median_lower_bound"] == {8: 15, 16: 20, 32: 25}

    # epsilon: the last scores of the K = inf models, 8 chains: mean 0.02, population std sqrt(0.00035) = 0.01871
    x = np.array(EPS_SCORES[0][1] + EPS_SCORES[1][1])
    assert result["epsilon"]["value"] == pytest.approx(0.02 - 2 * math.sqrt(0.00035), rel=1e-9)
    assert result["epsilon"]["value"] == pytest.approx(x.mean() - 2 * x.std(), rel=1e-9)
    eps = result["epsilon"]["value"]  # -0.01742: -0.02 and below count as memorized, -0.01 and above do not
    # memorized fractions, chain by chain against epsilon, and their sigmoid asymptotes
    expected = {(K, s): [float(np.mean(np.array(d) < eps)) for d in scores] for (K, s), (_, _, scores) in RUNS.items()}
    assert expected[8, 0] == [0, 0.25, 0.75, 1.0] and expected[16, 0] == [0, 0, 0.25, 0.75]
    for r, curve in zip(result["memorized_curves"][8] + result["memorized_curves"][16] + result["memorized_curves"][32],
                        expected.values()):
        assert r == {"step": STEPS, "fraction": curve}
    A = {key: fit_sigmoid(STEPS, curve)["A"] for key, curve in expected.items()}
    assert result["memorized_asymptote"] == {K: [pytest.approx(A[K, 0]), pytest.approx(A[K, 1])] for K in (8, 16, 32)}
    assert [r["memorized_final"] for r in result["runs"]] == [c[-1] for c in expected.values()]
    # Fig. 8b: the line through the seeds' mean asymptotes against log K, from the largest on, at zero
    mean_A = [np.mean([A[K, 0], A[K, 1]]) for K in (8, 16, 32)]
    top = int(np.argmax(mean_A))
    slope, intercept = np.polyfit(np.log([8, 16, 32][top:]), mean_A[top:], 1)
    assert result["memorized_zero"] == pytest.approx(math.exp(-intercept / slope), rel=1e-6)
