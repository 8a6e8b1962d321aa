"""mem_minimal.py: the encoder-pool-decoder model against direct computations, and the search."""
import json
import math
import sys
import time

import numpy as np
import pytest
import torch

import mem_minimal as mm
from mem_minimal import MemRun, TaskHead, bisect_K, pooled
from plumbing import cli
from stand_ins import run  # noqa: F401 (a fixture: a script's command line in this process)


def seqs(B=4, N=25, seed=0):
    return torch.randint(10, (B, N), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("depth1, depth2", [(1, 1), (1, 2), (2, 1), (2, 2)])
def test_shapes_and_pair_lookup_equals_the_direct_evaluation(depth1, depth2):
    g = torch.Generator().manual_seed(1)
    model = TaskHead(10, D=8, D_phi=6, width=16, depth1=depth1, depth2=depth2, generator=g)
    s = seqs()
    logits, phi = model(s, return_phi=True)
    assert logits.shape == (4, 25, 10) and phi.shape == (4, 25, 6)
    x0 = model.W_E[s]  # (B, N, D)
    pairs = model.mlp1(torch.cat([x0[:, 1:], x0[:, :-1]], -1))  # MLP1(x0_i (+) x0_{i-1}) at every position
    direct_phi = torch.cat([torch.zeros(4, 1, 6), pairs.cumsum(1) / torch.arange(1, 25).view(1, 24, 1)], 1)
    torch.testing.assert_close(phi, direct_phi)
    direct = model.mlp2_rest(model.mlp2_in(torch.cat([x0, direct_phi], -1)))
    torch.testing.assert_close(logits, direct)
    assert sum(1 for m in model.mlp1 if isinstance(m, torch.nn.Linear)) == depth1 + 1
    assert not model.W_E.requires_grad and "W_E" not in dict(model.named_parameters())


def test_running_mean_is_causal():
    model = TaskHead(10, D=8, D_phi=6, width=16)
    s = seqs()
    _, phi = model(s, return_phi=True)
    for n in [0, 5, 23]:
        s2 = s.clone()
        s2[:, n + 1] = (s2[:, n + 1] + 3) % 10
        _, phi2 = model(s2, return_phi=True)
        torch.testing.assert_close(phi2[:, : n + 1], phi[:, : n + 1])
        assert not torch.allclose(phi2[:, n + 1], phi[:, n + 1])


def test_one_hot_pair_embedding_pools_the_empirical_pair_frequencies():
    """With D_phi >= C^2 and one-hot pairs, phi_n holds the transition counts / n: 2-Gen is representable."""
    s = seqs(B=3, N=40)
    phi = pooled(s, torch.eye(100))
    for b in range(3):
        for n in [1, 10, 39]:
            counts = torch.zeros(100)
            for i in range(1, n + 1):
                counts[s[b, i - 1] * 10 + s[b, i]] += 1
            torch.testing.assert_close(phi[b, n], counts / n)
    assert torch.equal(phi[:, 0], torch.zeros(3, 100))


def test_binary_search_on_a_monotone_criterion():
    calls = []

    def crit(run):
        calls.append(run.K)
        return math.log2(run.K) - 5.5  # < 0 (beats 2-Gen) up to K = 32

    K2, history = bisect_K(MemRun(), 2, 2048, crit)
    assert K2 == pytest.approx(2**5.5) and len(calls) <= 6 and history[0][0] == 2
    K2, _ = bisect_K(MemRun(), 2, 2048, lambda r: math.log2(r.K) - 5.25)  # crossing interpolated in log K
    assert K2 == pytest.approx(2**5.25)
    assert bisect_K(MemRun(), 2, 64, lambda r: -1.0)[0] == pytest.approx(64 * math.sqrt(2))
    assert bisect_K(MemRun(), 4, 64, lambda r: 1.0)[0] == pytest.approx(4 / math.sqrt(2))


def test_binary_search_asks_powers_of_two_and_a_tie_does_not_beat_2gen():
    """The probes, in order: both ends, then the middle octave of the bracket. A criterion of exactly 0 at the first
    middle (K = 64) does not beat 2-Gen (strictly < 0 does), so the search goes on below 64, not above it."""
    history = bisect_K(MemRun(), 2, 2048, lambda r: math.log2(r.K) - 5.5)[1]
    assert [K for K, _ in history] == [2, 2048, 64, 8, 16, 32]
    K2, history = bisect_K(MemRun(), 2, 2048, lambda r: math.log2(r.K) - 6)
    assert [K for K, _ in history] == [2, 2048, 64, 8, 16, 32] and K2 == pytest.approx(64)
    assert bisect_K(MemRun(), 4, 64, lambda r: 0.0)[0] == pytest.approx(4 / math.sqrt(2))  # a tie at K_lo: below


def test_runs_depend_only_on_their_seed(same_numbers):
    run = MemRun(K=8, iters=20, tail=10, eval_seqs=32, width=32)
    torch.manual_seed(1)
    a = mm.train_mem(run)
    torch.manual_seed(2)  # the global RNG must not matter
    assert same_numbers(mm.train_mem(run), a)


def test_small_K_memorizes_and_large_K_does_not():
    small = mm.train_mem(MemRun(K=2, iters=150, tail=50, eval_seqs=128, width=64))
    large = mm.train_mem(MemRun(K=2048, iters=150, tail=50, eval_seqs=128, width=64))
    assert small["train_minus_2gen"] < 0 < small["gen_minus_2gen"]
    assert large["train_minus_2gen"] > small["train_minus_2gen"]


@pytest.mark.parametrize("args", [["--preset", "huge"], ["--jobs", "0"], ["--iters", "0"], ["--seeds", "1-0"], ["--seeds", "-1"],
                                  ["--depths", "1,x"], ["--depths", "0,2"], ["--D-phis", "0"]])
def test_bad_input(run, args):
    r = run("mem_minimal.py", *args)
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_depths_only_writes_the_searches(run, tmp_path):
    r = run("mem_minimal.py", "--depths-only", "--iters", "4", "--seeds", "0", "--depths", "1,1", "2,1", "--jobs", "1",
            "--figures", tmp_path)
    assert r.returncode == 0, r.stderr
    with open(tmp_path / "mem_depths_4.json") as f:
        result = json.load(f)
    assert sorted(result["K2_hat"]) == ["1,1", "2,1"]
    assert all(list(v) == ["8"] and len(v["8"]) == 1 for v in result["K2_hat"].values())  # the preset's search_D_phi
    assert result["config"]["iters"] == 4 and result["config"]["tail"] == 1  # 150 of 1500 -> 10% of the run


def test_depths_only_reports_each_pairs_own_search(tmp_path, monkeypatch, capsys):
    """With a criterion whose zero crossing is known for each (l1, l2), log2 K2_hat = 3 + l1 + l2 / 4
    (when the runs carry --iters 4 and tail 1), the file holds each pair's own K2_hat under its key."""
    def criterion(run):
        assert run.D_phi == mm.PRESETS["quick"]["search_D_phi"]
        return math.log2(run.K) - (3 + run.depth1 + run.depth2 / 4) - (0 if (run.iters, run.tail) == (4, 1) else 100)

    monkeypatch.setattr(mm, "criterion", criterion)
    monkeypatch.setattr(mm.cli, "parallel_map", lambda fn, jobs, processes, progress="": [fn(j) for j in jobs])
    monkeypatch.setattr(sys, "argv", ["mem_minimal.py", "--preset", "quick", "--depths-only", "--iters", "4", "--seeds",
                                      "0-1", "--depths", "1,2", "2,1", "--figures", str(tmp_path)])
    mm.main()
    with open(tmp_path / "mem_depths_4.json") as f:
        result = json.load(f)
    assert result["K2_hat"]["1,2"]["8"] == pytest.approx([2**4.5] * 2)
    assert result["K2_hat"]["2,1"]["8"] == pytest.approx([2**5.25] * 2)
    assert sorted((r["run"]["depth1"], r["run"]["depth2"], r["run"]["seed"]) for r in result["searches"]) == [
        (1, 2, 0), (1, 2, 1), (2, 1, 0), (2, 1, 1)]
    out = capsys.readouterr().out
    assert "K2_hat at D_phi" in out
    assert out.startswith(f"preset quick: 4 steps per run, seeds [0, 1], 2 processes; writing {tmp_path}/mem_depths_4.json")


def test_depths_only_reuses_the_searches_of_an_earlier_call(tmp_path, monkeypatch):
    """A second --depths-only call with the same budget trains only the searches the file lacks and keeps
    the earlier ones (cli.earlier_results: a budget study can be made in several calls); another model reuses nothing."""
    trained = []

    def criterion(run):
        trained.append((run.D_phi, run.iters))
        return math.log2(run.K) - (3 + run.depth1 + math.log2(run.D_phi) / 2)

    monkeypatch.setattr(mm, "criterion", criterion)
    monkeypatch.setattr(mm.cli, "parallel_map", lambda fn, jobs, processes, progress="": [fn(j) for j in jobs])

    def call(preset, iters, *D_phis):
        monkeypatch.setattr(sys, "argv", ["mem_minimal.py", "--preset", preset, "--depths-only", "--iters", str(iters),
                                          "--seeds", "0", "--depths", "1,1", "--D-phis", *map(str, D_phis), "--figures", str(tmp_path)])
        trained.clear()
        mm.main()
        with open(tmp_path / f"mem_depths_{iters}.json") as f:
            return json.load(f), {d for d, _ in trained}

    first, trained_first = call("quick", 4, 8)
    second, trained_second = call("quick", 4, 2, 8)
    assert trained_first == {8} and trained_second == {2}
    assert second["K2_hat"]["1,1"]["8"] == first["K2_hat"]["1,1"]["8"]
    assert second["K2_hat"]["1,1"]["2"] == pytest.approx([2 ** 4.5])
    assert (tmp_path / "mem_depths_4.png").exists()
    other, trained_other = call("paper", 4, 2, 8)  # same file name, another model (width, N): all retrained,
    assert trained_other == {2, 8}
    assert all(f["run"]["width"] == mm.PRESETS["paper"]["base"].width for f in other["searches"])  # none of quick's kept


def test_k2_searches_file_every_depth_D_phi_and_seed_under_its_own_key(monkeypatch, tmp_path):
    """Fig. 8f: with a criterion whose crossing is known, log2 K2_hat = 2 + l1 + 2 l2 + log2(D_phi) / 2 + seed / 4,
    every (l1, l2) x D_phi x seed lands in K2_hat["l1,l2"]["D_phi"][seed], and the figure draws, for each
    (l1, l2), the geometric mean over seeds against D_phi."""
    def criterion(run):
        return math.log2(run.K) - (2 + run.depth1 + 2 * run.depth2 + math.log2(run.D_phi) / 2 + run.seed / 4)

    monkeypatch.setattr(mm, "criterion", criterion)
    monkeypatch.setattr(mm.cli, "parallel_map", lambda fn, jobs, processes, progress="": [fn(j) for j in jobs])
    out = mm.k2_searches(MemRun(), [(1, 1), (2, 2), (1, 2)], [4, 16], [0, 1, 2], (2, 2**14), jobs=1)
    assert sorted(out["K2_hat"]) == ["1,1", "1,2", "2,2"]
    for depth, by_D in out["K2_hat"].items():
        l1, l2 = map(int, depth.split(","))
        assert sorted(by_D) == ["16", "4"]
        for d, values in by_D.items():
            assert values == pytest.approx([2 ** (2 + l1 + 2 * l2 + math.log2(int(d)) / 2 + s / 4) for s in range(3)])
    result = {"preset": "quick", "iters": 10, "heatmap": {"D_phi": [2, 8], "K": [4, 16], "train_minus_2gen": [[-0.1, 0.1], [0, 0.2]],
                                                          "gen_minus_2gen": [[0.2, 0.1], [0.1, 0.05]]}, **out}
    fig = mm.plot_heatmaps(result, str(tmp_path / "h.png"))
    lines = {line.get_label(): line for line in fig.axes[2].get_lines() if line.get_label().startswith("(")}
    assert sorted(lines) == ["(1,1)", "(1,2)", "(2,2)"]
    np.testing.assert_allclose(lines["(2,2)"].get_ydata(), [2 ** (8 + 1 + 0.25), 2 ** (8 + 2 + 0.25)])  # mean over seeds


def test_budget_trend_retrains_the_corner_at_each_budget(monkeypatch):
    """The corner (K, D_phi) at every budget, with the criterion over the last 10% of each run."""
    seen = []

    def fake(run):
        seen.append((run.K, run.D_phi, run.iters, run.tail))
        return {"train_minus_2gen": 1.0 / run.iters, "gen_minus_2gen": 2.0 / run.iters}

    monkeypatch.setattr(mm, "train_mem", fake)
    monkeypatch.setattr(mm.cli, "parallel_map", lambda fn, jobs, processes, progress="", cost=None: [fn(j) for j in jobs])
    trend = mm.budget_trend(MemRun(), 1024, 128, [100, 400], jobs=1)
    assert seen == [(1024, 128, 100, 10), (1024, 128, 400, 40)]
    assert trend["train_minus_2gen"] == [0.01, 0.0025] and trend["gen_minus_2gen"] == [0.02, 0.005]


def test_the_k2_hat_axes_label_the_values_they_show(tmp_path, monkeypatch):
    """Fig. 8f: K2_hat spans 10..21, less than two octaves; a log-2 axis ticked at its powers of 2 alone showed
    one label (2^4). Several round values, as plain numbers, and one tick per D_phi."""
    K2 = {"1,1": {"2": [10.5, 11.0], "8": [12.7], "32": [13.9]}, "2,2": {"2": [14.3], "8": [16.1], "32": [17.4, 21.0]}}
    result = {"preset": "quick", "iters": 1500, "K2_hat": K2,
              "heatmap": {"K": [4, 16], "D_phi": [2, 8], "train_minus_2gen": [[-0.1, 0.1], [-0.2, 0.05]],
                          "gen_minus_2gen": [[0.2, 0.1], [0.2, 0.05]]}}
    monkeypatch.setattr(mm.plt, "close", lambda fig: None)
    ax = mm.plot_heatmaps(result, str(tmp_path / "h.png")).axes[2]
    low, high = ax.get_ylim()
    shown = [(t, label.get_text()) for t, label in zip(ax.get_yticks(), ax.get_yticklabels()) if low <= t <= high]
    assert len(shown) >= 3 and all(text == f"{t:g}" for t, text in shown), shown
    assert list(ax.get_xticks()) == [2, 8, 32] and [t.get_text() for t in ax.get_xticklabels()] == ["2", "8", "32"]


@pytest.mark.parametrize("K_lo, K_hi", [(2, 512), (2, 2**15), (2, 4), (4, 16), (8, 8), (2, 2**10)])
def test_search_trainings_is_the_most_a_search_makes(K_lo, K_hi):
    """The estimate counts search_trainings per search: the largest number of runs bisect_K makes, whichever K
    the criterion crosses at (below the range, inside it or above)."""
    counts = []
    for crossing in np.arange(0.25, math.log2(K_hi) + 1.5, 0.5):
        history = bisect_K(MemRun(), K_lo, K_hi, lambda run: math.log2(run.K) - crossing)[1]
        counts.append(len(history))
    assert max(counts) == mm.search_trainings(K_lo, K_hi)


def test_makespan_takes_the_jobs_in_order_on_the_first_free_worker():
    """cli.makespan, the estimate's model of parallel_map's pool."""
    assert cli.makespan([4, 3, 2, 1], 2) == 5  # 4 then 1 on one worker, 3 then 2 on the other
    assert cli.makespan([1, 1, 10], 2) == 11 and cli.makespan([1, 2, 3], 1) == 6 and cli.makespan([5], 3) == 5


def test_step_seconds_leaves_out_what_does_not_grow_with_the_steps(monkeypatch):
    """A run's set-up and evaluation cost the same at any length; cli.step_seconds times two lengths and keeps the
    slope, here of mem_minimal's training (its step_seconds)."""
    monkeypatch.setattr(mm, "train_mem", lambda run: time.sleep(0.05 + 0.004 * run.iters))
    assert mm.step_seconds(MemRun()) == pytest.approx(0.004, rel=0.5)  # all of it over 10 steps: 0.009


@pytest.mark.parametrize("args, line", [
    (["--trend", "--jobs", "1"], "estimate: 4 trainings of 1500, 3000, 6000, 12000 steps at 20 ms a step (measured "
                                 "here on one thread): ~7.5 min with 1 process"),  # 22500 steps
    (["--trend"], "estimate: 4 trainings of 1500, 3000, 6000, 12000 steps at 20 ms a step (measured here on one "
                  "thread): ~5.0 min with 2 processes"),  # 1500 + 6000 on one worker, 3000 + 12000 on the other
    (["--depths-only", "--depths", "1,1", "--D-phis", "2", "65", "128", "--seeds", "0", "--jobs", "1"],
     "estimate: 15 trainings of 1500 steps at 10-20 ms a step (measured here on one thread): ~5.6 min with 1 "
     "process, at most: a search ends early when K2_hat is outside its range"),  # 5 trainings at 15, 22.5 and 30 s
])
def test_a_call_says_how_long_it_will_take_before_it_trains(tmp_path, monkeypatch, capsys, args, line):
    """The line after the announcement: every training's steps at the step time measured at the smallest and the
    largest D_phi (here 10 and 20 ms), spread over the processes."""
    def stop(*args, **kwargs):
        raise RuntimeError("stopped before training")

    monkeypatch.setattr(mm, "step_seconds", lambda run: 0.01 + 0.01 * (run.D_phi - 2) / 126)
    monkeypatch.setattr(mm.cli, "parallel_map", stop)
    monkeypatch.setattr(sys, "argv", ["mem_minimal.py", "--preset", "quick", "--figures", str(tmp_path), *args])
    with pytest.raises(RuntimeError, match="stopped before training"):
        mm.main()
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("preset quick: ") and out[1] == line
