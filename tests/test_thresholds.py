"""analysis/thresholds.py and estimators.py: the K1* search on synthetic monotone rules, and the rule read from metrics rows."""
import argparse
import json
import math
import os

import numpy as np
import pytest

import k1
from analysis import runs, thresholds
from analysis.estimators import Search
from analysis.thresholds import PHI_STAR, max_phi_beta, tau_2gen
from runners import probes
from stand_ins import search_threshold

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("true_K1", [16, 17, 40, 93, 94, 127])
def test_search_finds_the_threshold_of_a_monotone_rule(true_K1):
    calls = []

    def generalizes(K):
        calls.append(K)
        return K > true_K1

    result = search_threshold(generalizes, 16, 128)
    assert (result["K1_star"], result["above"], result["bound"]) == (true_K1, true_K1 + 1, None)
    assert len(calls) == len(set(calls)) <= 2 + 8  # lo, hi, then ~log2(112) midpoints (in log K: one more)
    assert all(result["probes"][K] == (K > true_K1) for K in calls)


@pytest.mark.parametrize("true_K1", [20, 45, 100])
def test_a_coarse_search_brackets_the_threshold_within_its_ratio(true_K1):
    result = search_threshold(lambda K: K > true_K1, 16, 128, ratio=1.25)
    assert result["K1_star"] <= true_K1 < result["above"] <= 1.25 * result["K1_star"]
    assert len(result["probes"]) <= 2 + 4  # log2(log 8 / log 1.25) ~ 3.2 midpoints


def test_search_reports_never_and_always():
    assert search_threshold(lambda K: True, 16, 128) == {"K1_star": None, "above": None, "bound": "below",
                                                         "monotone": True, "probes": {16: True, 128: True}}
    never = search_threshold(lambda K: False, 16, 128)
    assert never["K1_star"] is None and never["bound"] == "above"
    with pytest.raises(ValueError, match="lo < hi"):
        Search(8, 8)


def rounds(search: Search, generalizes, width: int) -> int:
    """Drive the search to its end, `width` probes a round; returns the rounds after the ends'."""
    n = 0
    while todo := search.pending(width):
        n += todo != [search.lo, search.hi] and todo != [search.lo] and todo != [search.hi]
        for K in todo:
            search.record(K, generalizes(K))
    return n


@pytest.mark.parametrize("width", [1, 2, 3, 7, 15])
@pytest.mark.parametrize("true_K1", [16, 17, 40, 94, 127, 1000, 4095])
def test_a_wider_search_ends_at_the_binary_searchs_K1(width, true_K1):
    """A round of `width` probes (an ensemble's spare slots) ends, wherever the rule is monotone in K, with the
    paper's binary search's answer: the same K1*, above = K1* + 1 (ratio 1), in no more rounds."""
    binary, wide = Search(16, 4096), Search(16, 4096)
    n_binary = rounds(binary, lambda K: K > true_K1, 1)
    n_wide = rounds(wide, lambda K: K > true_K1, width)
    assert wide.result()["K1_star"] == binary.result()["K1_star"] == (true_K1 if 16 <= true_K1 < 4096 else None)
    assert wide.result()["above"] == binary.result()["above"]
    assert wide.result()["monotone"] and n_wide <= n_binary
    if width >= 7 and 16 < true_K1 < 4095:
        assert n_wide <= (n_binary + 2) // 3  # log(width + 1) / log 2 = 3 halvings a round


def test_the_width_1_round_is_the_log_midpoint():
    search = Search(16, 4096)
    search.record(16, False)
    search.record(4096, True)
    assert search.pending() == search.pending(1) == [256]
    assert search.pending(3) == [64, 256, 1024]  # the bracket cut into 4 equal parts in log K


@pytest.mark.parametrize("width", [1, 3, 8])
def test_a_non_monotone_seed_ends_at_a_crossing_and_says_so(width):
    """A seed that forms the head in a window of K below its threshold (2-Gen in [30, 35], and above 200): every
    width ends at a true crossing of its rule (K1* does not generalize, K1* + 1 does), the lowest its probes saw, and
    says whether the probes contradicted monotonicity."""
    def rule(K):
        return 30 <= K <= 35 or K > 200

    search = Search(16, 4096)
    rounds(search, rule, width)
    result = search.result()
    assert not rule(result["K1_star"]) and rule(result["above"]) and result["above"] == result["K1_star"] + 1
    assert all(not rule(K) for K in search.probes if K < result["K1_star"])  # the lowest crossing probed
    ups, downs = [K for K in search.probes if rule(K)], [K for K in search.probes if not rule(K)]
    assert result["monotone"] == (max(downs) < min(ups))
    if width == 8:  # this width probes inside the window: its answer is the window's edge, flagged
        assert (result["K1_star"], result["monotone"]) == (29, False)


def test_lockstep_search_probes_both_ends_first():
    search = Search(10, 20)
    assert search.pending() == [10, 20]
    search.record(10, False)
    assert search.pending() == [20]
    search.record(20, True)
    assert search.pending() == [14]  # round(sqrt(10 * 20)): bisection in log K
    with pytest.raises(ValueError, match="not finished"):
        search.result()


def test_the_rule_reads_max_phi_beta_from_the_rows_up_to_T():
    rows = [{"step": 0, "phi_beta_2": 0.1}, {"step": 100, "phi_beta_2": 0.5}, {"step": 200, "phi_beta_2": 0.3},
            {"step": 300, "phi_beta_2": 0.9}]
    assert max_phi_beta(rows) == 0.9
    assert max_phi_beta(rows, iters=250) == 0.5
    assert max_phi_beta(rows[::-1], iters=99) == 0.1
    assert tau_2gen(rows) == 100 and tau_2gen(rows, phi_star=0.6) == 300 and tau_2gen(rows, phi_star=0.95) is None
    assert tau_2gen([{"step": 5, "phi_beta_2": PHI_STAR}]) is None  # "exceeds": equality is not 2-Gen
    with pytest.raises(ValueError):
        max_phi_beta(rows, iters=-1)


def test_k1_end_to_end_on_a_tiny_preset(tmp_path, monkeypatch, capsys):
    """The whole pipeline (probe configs, lockstep rounds, reruns that reuse finished probes, tau, figure,
    JSON) on runs of a few steps; the rule itself is replaced by one on K so that the searches have a
    known answer whatever the tiny runs learn."""
    tiny = dict(N=8, batch=4, lr=1e-3, iters=6, eval_every=3, eval_dense=4, evals=1, eval_train=4, eval_gen=4, lo=2, hi=9,
                ratio=1.0, seeds=2, perturbed_seeds=1, weight=0.5, tau_seeds=2, tau_iters=6)
    monkeypatch.setitem(k1.K1_PRESETS, "quick", tiny)
    monkeypatch.setattr(thresholds, "max_phi_beta", lambda rows: 1.0 if rows[0]["K"] > 4 else 0.0)
    monkeypatch.setattr(runs, "read_metrics", _with_K(runs.read_metrics))  # as runners/probes.py reads the probes
    monkeypatch.chdir(tmp_path)
    args = type("Args", (), dict(replot=None, preset="quick", root=str(tmp_path / "runs"), jobs=1, print_commands=False,
                                 conditions="control,reweight,inject", seeds=None, perturbed_seeds=None,
                                 figures="figures", device=None))
    k1.k1(args)
    assert capsys.readouterr().out.startswith(f"preset quick: K1* searches of 6 steps per probe, runs in {tmp_path / 'runs'}")
    result = json.load(open(tmp_path / "figures" / "k1.json"))
    assert {c: [r["K1_star"] for r in rows] for c, rows in result["seeds"].items()} == {
        "control": [4, 4], "reweight": [4], "inject": [4]}
    assert result["tau_2gen"]["K"] == 4 and len(result["tau_2gen"]["tau"]) == 2
    reweighted = k1.read_metrics(str(tmp_path / "runs" / "reweight" / "K4_s0"))[0]
    assert reweighted["iters"] == 12 and reweighted["prev_weight"] == 0.5
    assert k1.read_metrics(str(tmp_path / "runs" / "inject" / "K4_s0"))[0]["task_injection"]
    stamp = os.path.getmtime(tmp_path / "runs" / "control" / "K4_s0" / "metrics.jsonl")
    k1.k1(args)  # everything is finished: nothing is trained again
    assert os.path.getmtime(tmp_path / "runs" / "control" / "K4_s0" / "metrics.jsonl") == stamp
    assert (tmp_path / "figures" / "k1.png").exists()


def _with_K(read_metrics):
    """read_metrics whose rows also carry the run's K (for the stand-in rule above)."""
    def read(run_dir, dense=False):
        cfg, rows = read_metrics(run_dir, dense)
        return cfg, [{**r, "K": cfg["K"]} for r in rows]
    return read


def test_the_grid_table_counts_heads_per_K_keeps_seed_order_and_redraws(tmp_path, monkeypatch):
    """A grid's table: per K the seeds' max phi_beta(2) in seed order and the number above phi_beta* (strictly);
    `k1.py grid --replot` draws it, one line per seed, the grid's source in the title, the JSON left as it was."""
    members = [{"K": K, "seed": s, "max_phi_beta": v, "gen_loss": 2.3 - v / 10, "gen_loss_2gen": 2.12}
               for K, values in ((80, [0.2, PHI_STAR, 0.6]), (64, [0.1, 0.15, 0.2])) for s, v in reversed(list(enumerate(values)))]
    table = k1.grid_table(members)
    assert list(table) == [64, 80]
    assert table[80]["seed"] == [0, 1, 2] and table[80]["max_phi_beta"] == [0.2, PHI_STAR, 0.6]
    assert table[80]["heads"] == 1 and table[64]["heads"] == 0
    record = {"source": "bench/results/grid.json", "device": "card", "command": "python train.py --K 64,80", "preset": "paper",
              "N": 256, "iters": 100, "loss": "L_gen at the end", "table": {"control": table},
              "brackets": {"control": k1.grid_brackets(table)}}
    path = tmp_path / "g.json"
    path.write_text(json.dumps(record))
    figures = []
    monkeypatch.setattr(k1.plt, "close", figures.append)
    k1.k1_grid(argparse.Namespace(replot=str(path), name="k1_grid", figures=str(tmp_path)))
    assert json.loads(path.read_text()) == json.loads(json.dumps(record)) and (tmp_path / "g.png").exists()
    fig = figures[0]
    assert [line.get_ydata().tolist() for line in fig.axes[0].get_lines()[:3]] == [[0.1, 0.2], [0.15, PHI_STAR], [0.2, 0.6]]
    assert "card: python train.py --K 64,80" in fig._suptitle.get_text() and fig.axes[1].get_ylabel() == "L_gen at the end"


def test_k1_grid_on_a_tiny_preset(tmp_path, monkeypatch, capsys):
    """k1.py grid: every (condition, K, seed) probe trained once, the reweighted ones for x 1/w steps;
    heads and K1* brackets per condition and seed from a stand-in rule on K, condition and seed (control:
    K > 3 + 2 seed, reweight: K > 5 + 2 seed); figure and JSON; a rerun trains nothing."""
    tiny = dict(N=8, batch=4, lr=1e-3, iters=6, eval_every=3, eval_dense=4, evals=1, eval_train=4, eval_gen=4, lo=2, hi=9,
                ratio=1.0, seeds=2, perturbed_seeds=1, weight=0.5, tau_seeds=2, tau_iters=6)
    monkeypatch.setitem(k1.K1_PRESETS, "quick", tiny)

    def read(run_dir, dense=False, read_metrics=runs.read_metrics):  # rows that carry their run's K, seed and w
        cfg, rows = read_metrics(run_dir, dense)
        return cfg, [{**r, "K": cfg["K"], "seed": cfg["seed"], "w": cfg["prev_weight"]} for r in rows]

    def rule(rows):
        return 1.0 if rows[0]["K"] > (3 if rows[0]["w"] == 1 else 5) + 2 * rows[0]["seed"] else 0.0

    monkeypatch.setattr(runs, "read_metrics", read)
    monkeypatch.setattr(thresholds, "max_phi_beta", rule)
    figures = []
    monkeypatch.setattr(k1.plt, "close", figures.append)
    monkeypatch.chdir(tmp_path)
    args = type("Args", (), dict(preset="quick", root=None, jobs=1, print_commands=False, K="2,4,6,8",
                                 conditions="control,reweight", weight=0.25, seeds="0,1", figures="figures",
                                 name="grid", device=None, replot=None))
    k1.k1_grid(args)
    result = json.load(open(tmp_path / "figures" / "grid.json"))
    assert result["brackets"] == {"control": {"0": [2, 4], "1": [4, 6]}, "reweight": {"0": [4, 6], "1": [6, 8]}}
    bars = figures[0].axes[2].lines  # Fig. 7c: one bar per condition and seed over its bracket
    assert [list(bar.get_xdata()) for bar in bars] == [[2, 4], [4, 6], [4, 6], [6, 8]]
    assert result["table"]["reweight"]["6"]["heads"] == 1 and result["table"]["control"]["6"]["heads"] == 2
    assert len(result["runs"]) == 16 and result["weight"] == 0.25
    root = tmp_path / "runs" / "k1grid_quick_w0.25"
    assert runs.read_metrics(str(root / "reweight" / "K8_s1"))[0]["iters"] == 24  # 6 steps x 1/w
    assert runs.read_metrics(str(root / "control" / "K8_s1"))[0]["iters"] == 6
    stamp = os.path.getmtime(root / "reweight" / "K2_s0" / "metrics.jsonl")
    k1.k1_grid(args)
    assert os.path.getmtime(root / "reweight" / "K2_s0" / "metrics.jsonl") == stamp
    assert (tmp_path / "figures" / "grid.png").exists()
    args.conditions = "control,nonsense"
    with pytest.raises(ValueError, match="unknown condition"):
        k1.k1_grid(args)


def test_grid_brackets_of_K1_star_per_seed():
    """[largest K without the head, smallest K with it] per seed: heads from the smallest K on, none on the
    grid, a seed whose heads are not monotone (the first above the second), a seed missing at one K."""
    heads = {16: [0.1, 0.5, 0.1, 0.1], 32: [0.2, 0.6, 0.5, 0.2], 64: [0.6, 0.7, 0.3, 0.3], 128: [0.7, 0.8, 0.9, 0.4]}
    table = {K: {"seed": [0, 1, 2, 3], "max_phi_beta": v} for K, v in heads.items()}
    assert k1.grid_brackets(table) == {0: [32, 64], 1: [None, 16], 2: [64, 32], 3: [128, None]}
    table[64] = {"seed": [1, 2, 3], "max_phi_beta": [0.7, 0.3, 0.3]}  # seed 0 not trained at K = 64 yet
    assert k1.grid_brackets(table)[0] == [32, 128]


def test_k1_replot_draws_the_committed_json_with_a_legend_of_what_is_drawn(tmp_path, monkeypatch, capsys):
    """k1.py search --replot redraws figures/k1.png from its JSON, which it leaves as it was; Fig. 7a's legend names
    the conditions that have curves (injection's K1* is above the searched range for every seed: no curve) and says
    which have none."""
    committed = os.path.join(ROOT, "figures", "k1.json")
    (tmp_path / "k1.json").write_bytes(open(committed, "rb").read())
    figures = []
    monkeypatch.setattr(k1.plt, "close", figures.append)
    k1.k1(argparse.Namespace(replot="", figures=str(tmp_path)))
    assert (tmp_path / "k1.json").read_bytes() == open(committed, "rb").read() and (tmp_path / "k1.png").exists()
    legend = figures[0].axes[0].get_legend()
    labels = [t.get_text() for t in legend.get_texts()]
    assert "inject" not in labels and {"control", "reweight"} <= set(labels)
    assert legend.get_title().get_text() == "inject: no K1* in range"
    assert "wrote" in capsys.readouterr().out


def test_search_rows_give_an_ended_search_its_result_and_a_running_one_its_bracket():
    """runners.probes.search_rows: a running search has no K1* and the bracket of its probes so far (the largest K
    without the head, the smallest with it), an ended one Search.result()'s K1* and bound, each its probe count."""
    running, ended = Search(16, 4096), Search(16, 4096)
    for K, up in ((16, False), (4096, True), (256, True), (64, False), (1024, True)):
        running.record(K, up)
    for K, up in ((16, True), (4096, True)):
        ended.record(K, up)
    rows = probes.search_rows({("control", 5): running, ("inject", 2): ended})
    assert rows["control"] == [{"seed": 5, "done": False, "K1_star": None, "bound": None, "bracket": [64, 256],
                                "probes": 5}]
    (row,) = rows["inject"]
    assert (row["done"], row["K1_star"], row["bound"], row["bracket"], row["probes"]) == (True, None, "below",
                                                                                          [None, 16], 2)


def test_the_search_figure_shifts_each_seed_by_its_own_K1_star(monkeypatch):
    """Fig. 7a of a search over seeds 3 and 7 (not 0 and 1): each seed's curve against K - its K1*; a search still
    running (a campaign's row) has no curve and a bar over its bracket in Fig. 7c."""
    runs = [{"condition": "control", "seed": s, "K": K, "max_phi_beta": phi, "min_gen_loss": 2.3 - phi / 10}
            for s, K, phi in ((3, 8, 0.1), (3, 16, 0.6), (7, 32, 0.2), (7, 64, 0.7), (7, 48, 0.4))]
    ended = {"done": True, "bound": None, "monotone": True}
    result = {"preset": "quick", "iters": 100, "N": 64, "phi_star": PHI_STAR, "weight": 0.5,
              "search": {"lo": 4, "hi": 128, "ratio": 1.0}, "runs": runs,
              "seeds": {"control": [{"seed": 3, **ended, "K1_star": 10, "above": 11, "bracket": [10, 11], "probes": 2},
                                    {"seed": 7, **ended, "K1_star": 48, "above": 49, "bracket": [48, 49], "probes": 3}]}}
    figures = []
    monkeypatch.setattr(k1.plt, "close", figures.append)
    k1.plot_search(result, os.devnull)
    def curves(fig):  # the seeds' lines of Fig. 7a (the threshold and K1* guides have no markers)
        return [list(line.get_xdata()) for line in fig.axes[0].get_lines() if line.get_marker() == "."]


    assert curves(figures[0]) == [[-2, 6], [-16, 0, 16]]
    rows = {"control": [{"seed": 3, "done": True, "K1_star": 10, "bound": None, "bracket": [10, 11], "probes": 2},
                        {"seed": 7, "done": False, "K1_star": None, "bound": None, "bracket": [32, 64], "probes": 3}]}
    k1.plot_search({**result, "seeds": rows}, os.devnull)
    assert curves(figures[1]) == [[-2, 6]]
    (bar,) = figures[1].axes[2].collections[:1]
    assert bar.get_segments()[0][:, 1].tolist() == [32, 64]


# ----------------------------------------------------------------------------- the memorized fraction without its noise


def simulated_chains(rng, n, share, noise, epsilon=-0.001):
    """n chains: a share memorized, their true scores below epsilon by ~0.01 (spread 0.005), the rest above it by
    ~0.015; each scored twice with Gaussian noise. Returns (true fraction, a, b)."""
    memorized = rng.random(n) < share
    mu = np.where(memorized, rng.normal(epsilon - 0.01, 0.005, n), rng.normal(epsilon + 0.015, 0.005, n))
    return float(np.mean(mu < epsilon)), mu + rng.normal(0, noise, n), mu + rng.normal(0, noise, n)


def test_without_noise_the_noise_free_fraction_is_the_plain_one():
    a = np.random.default_rng(1).normal(0, 0.01, 101)
    assert thresholds.noise_free_fraction(a, a, 0.003) == pytest.approx(np.mean(a < 0.003), abs=1e-12)


@pytest.mark.parametrize("share, one_set_misses", [(0.3, False), (0.6, True), (0.8, True)])
def test_the_noise_free_fraction_recovers_a_known_fraction_where_one_set_and_the_two_set_rule_miss(share, one_set_misses):
    """On simulated chains whose true fraction is known (noise 0.007, comparable to the chains' spread, as in the
    quick k2 sweep): over 200 draws of 256 chains the estimate's mean error is under 0.01, while one set's is 0.02-0.05
    at 60 and 80 % (chains near epsilon cross it both ways, not in equal numbers; at 30 % they happen to cancel) and
    the two-set rule's is 0.1-0.2 below (a bound)."""
    rng, eps, errors = np.random.default_rng(int(10 * share)), -0.001, {"simex": [], "one": [], "two": []}
    for _ in range(200):
        truth, a, b = simulated_chains(rng, 256, share, 0.007, eps)
        sigma = np.std(a - b, ddof=1) / math.sqrt(2)
        errors["simex"].append(thresholds.noise_free_fraction(a, b, eps) - truth)
        errors["one"].append(np.mean(a < eps) - truth)
        errors["two"].append(np.mean((a + b) / 2 < eps - thresholds.Z_ONE_SIDED * sigma / math.sqrt(2)) - truth)
    bias = {k: abs(float(np.mean(v))) for k, v in errors.items()}
    assert bias["simex"] < 0.01 and (bias["one"] > 0.02) == one_set_misses and bias["two"] > 0.09, bias
    assert np.sqrt(np.mean(np.square(errors["simex"]))) < 0.04


# The estimator on true scores from a skewed distribution, shift + Exp(scale) + N(0, spread^2) (an exponentially
# modified Gaussian: a peak of chains just below 0 and a long tail above), whose distribution after Gaussian noise of
# any variance is known in closed form: the true fraction below epsilon, and the estimator's expectation, are exact.
EMG_SHIFT, EMG_SCALE, EMG_SPREAD = -0.015, 0.012, 0.003


def emg_below(x: float, noise_var: float = 0.0) -> float:
    """P(shift + Exp(scale) + N(0, spread^2 + noise_var) < x)."""
    s = math.sqrt(EMG_SPREAD**2 + noise_var)
    z = (x - EMG_SHIFT) / s
    phi = lambda u: 0.5 * math.erfc(-u / math.sqrt(2))  # noqa: E731
    return phi(z) - math.exp(-(x - EMG_SHIFT) / EMG_SCALE + s * s / (2 * EMG_SCALE**2)) * phi(z - s / EMG_SCALE)


# |estimate - the chains' true fraction| allowed, per noise: the quadratic extrapolation's own bias on these chains
# (largest over the three epsilons, from emg_below: 0.0003 at sigma 0.002, 0.0027 at 0.005, 0.027 at 0.01) plus ~4.5 sd
# of the estimate's sampling noise at 200k chains (sd of (estimate - truth) - (expectation - truth) over 300 seeds, the
# largest over the epsilons: 0.0010, 0.0014, 0.0018; its mean within 0.0002 of 0, the largest deviation 3.0 sd); and
# |(estimate - truth) - (its expectation - truth)| allowed, ~4.5 of those sd alone.
SIMEX_TO_TRUTH = {0.002: 0.005, 0.005: 0.009, 0.01: 0.035}
SIMEX_TO_EXPECTATION = {0.002: 0.0045, 0.005: 0.0065, 0.01: 0.0085}


@pytest.mark.parametrize("sigma", [0.002, 0.005, 0.01])
@pytest.mark.parametrize("eps", [-0.012, -0.006, 0.01])  # true fractions 0.22 (at the peak), 0.51, 0.87 (in the tail)
def test_the_noise_free_fraction_of_skewed_chains_is_their_true_fraction_up_to_the_extrapolations_bias(sigma, eps):
    """200k chains of skewed true scores (spread 0.0125), each scored twice with independent Gaussian noise of sigma
    0.002, 0.005, 0.01 (small to large against the spread): the estimate is within the extrapolation's bias plus
    its sampling noise of the chains' true fraction below epsilon, and, tighter, its error is the one its expectation
    predicts: the quadratic through the fractions of scores with noise variance (1 + lam) sigma^2 / 2 at lam = 0, 1,
    3, extrapolated to lam = -1, exact for these scores. Where the noise is not small the estimate is closer to the
    truth than the plain fraction of (a + b) / 2 below epsilon (errors 0.006 to 0.048 there)."""
    rng = np.random.default_rng([59, round(1e3 * sigma), round(1e3 * eps) + 100])
    n = 200_000
    mu = EMG_SHIFT + rng.exponential(EMG_SCALE, n) + rng.normal(0, EMG_SPREAD, n)
    a, b = mu + rng.normal(0, sigma, n), mu + rng.normal(0, sigma, n)
    truth, truth_pop = float(np.mean(mu < eps)), emg_below(eps)
    estimate = thresholds.noise_free_fraction(a, b, eps)
    expectation = (8 / 3 * emg_below(eps, sigma**2 / 2) - 2 * emg_below(eps, sigma**2)
                   + 1 / 3 * emg_below(eps, 2 * sigma**2))
    assert abs(truth - truth_pop) < 0.005  # the draw is of the distribution emg_below describes
    assert abs(estimate - truth) < SIMEX_TO_TRUTH[sigma], (estimate, truth)
    error, expected_error = estimate - truth, expectation - truth_pop
    assert abs(error - expected_error) < SIMEX_TO_EXPECTATION[sigma], (error, expected_error)
    naive = float(np.mean((a + b) / 2 < eps))
    if sigma >= 0.005:
        assert abs(estimate - truth) < abs(naive - truth), (estimate - truth, naive - truth)


@pytest.mark.parametrize("eps", [-0.012, -0.006, 0.01])
def test_without_noise_the_noise_free_fraction_of_skewed_chains_is_the_plain_fraction_strictly_below(eps):
    """a == b: every lam's fraction is the plain one, and the coefficients sum to 1. Some chains sit exactly at
    epsilon: they are not below it."""
    rng = np.random.default_rng(7)
    a = np.concatenate([EMG_SHIFT + rng.exponential(EMG_SCALE, 997), [eps] * 3])
    fraction = float(np.mean(a < eps))
    assert np.mean(a <= eps) == pytest.approx(fraction + 0.003)
    assert thresholds.noise_free_fraction(a, a.copy(), eps) == pytest.approx(fraction, abs=1e-12)


# Chains (a, b) scored against epsilon = 0, with their passing fractions at lam = 0, 1, 3: the mean of
# m + sqrt(lam) d < 0 and m - sqrt(lam) d < 0 (m = (a + b) / 2, d = (a - b) / 2), worked by hand. Dyadic values, so
# that m, d and m +- d are exact: "at" sits at epsilon (m = 0: not below at lam = 0, strict <), "edge" has
# m + d = a = 0 at lam = 1 (that side not below); "P" and "Q" pass on one side at lam = 3 but differ at lam = 2 (Q passes both, P one), "R" passes both
# at lam = 3 (sqrt(3) d = 0.43 < 0.5) and would pass one with lam for sqrt(lam) (3 d = 0.75).
HAND_CHAINS = {  # name: (a, b, (fraction at lam = 0, 1, 3))
    "below": (-1.0, -1.0, (1, 1, 1)),
    "above": (1.0, 1.0, (0, 0, 0)),
    "at": (0.0, 0.0, (0, 0, 0)),
    "P": (-0.125, -0.875, (1, 1, 0.5)),  # m -0.5, d 0.375
    "Q": (-0.1875, -0.8125, (1, 1, 0.5)),  # m -0.5, d 0.3125
    "R": (-0.25, -0.75, (1, 1, 1)),  # m -0.5, d 0.25
    "N": (1.25, -0.25, (0, 0.5, 0.5)),  # m 0.5, d 0.75
    "H": (0.25, -0.75, (1, 0.5, 0.5)),  # m -0.25, d 0.5
    "edge": (0.0, -0.5, (1, 0.5, 0.5)),  # m -0.25, d 0.25
}


@pytest.mark.parametrize("counts", [
    {"Q": 1},
    {"P": 1, "N": 1, "H": 1},
    {"below": 1, "at": 1, "edge": 2, "R": 1},
    {"above": 3, "N": 2, "Q": 1, "R": 1},
    {"at": 2, "edge": 3, "P": 1, "Q": 1, "below": 1},
    {"N": 1, "H": 2, "above": 1, "R": 3, "at": 1},
])
def test_the_noise_free_fraction_is_the_quadratic_through_lam_0_1_3_at_minus_1(counts):
    """On hand-worked chains the estimate is the value at lam = -1 of the quadratic through the passing fractions at
    lam = 0, 1, 3 (a polynomial fit, not the estimator's coefficients 8/3, -2, 1/3, which the first assertion checks
    reproduce any quadratic); a score equal to epsilon (m at lam = 0, m + d at lam = 1) does not pass. Six mixes
    of the chains, whose fractions span all three lam's."""
    q = np.polynomial.Polynomial([0.3, -1.7, 0.45])  # any quadratic: the coefficients reproduce it at -1 exactly
    assert 8 / 3 * q(0) - 2 * q(1) + 1 / 3 * q(3) == pytest.approx(q(-1), abs=1e-12)
    a = np.array([HAND_CHAINS[c][0] for c, k in counts.items() for _ in range(k)])
    b = np.array([HAND_CHAINS[c][1] for c, k in counts.items() for _ in range(k)])
    passing = np.mean([HAND_CHAINS[c][2] for c, k in counts.items() for _ in range(k)], axis=0)
    through = np.polynomial.Polynomial.fit([0, 1, 3], passing, 2)
    assert thresholds.noise_free_fraction(a, b, 0.0) == pytest.approx(through(-1), abs=1e-12), passing
    assert thresholds.noise_free_fraction(b, a, 0.0) == pytest.approx(through(-1), abs=1e-12)  # a and b alike
