"""The numbers behind two figures that no other test reads back: Fig. 2b-c's grid (sweep.plot_sweep's JSON: seed
means per (K, step), n_A as a fraction of N) on hand-written run directories, and the appendix figure "Scaling of
the four predictor losses" (predictor_scaling.scaling_with_K / scaling_with_N) against the losses recomputed from the very
sequences the predictors were given. And the layout of figures/k1_paper.png (k1.plot_search)."""
import json
import os
import types

import pytest
import torch

import bayes
import k1
import predictor_scaling
import sweep
from bayes import PREDICTORS
from markov import TaskSet
from plumbing import cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KEYS = ("kl_1gen", "kl_2gen", "kl_1mem", "kl_2mem", "phi_delta_1", "phi_beta_2", "n_A_1", "n_A_2")


def test_sweep_grid_is_the_seed_mean_with_n_A_over_N(tmp_path):
    """Two K, two seeds at K = 4 and one at K = 16, three evaluation steps; every readout a distinct number."""
    scales = {(4, 0): 1.0, (4, 1): 3.0, (16, 0): 10.0}
    N = 8
    for (K, seed), scale in scales.items():
        d = tmp_path / "sweep" / f"K{K}_s{seed}"
        d.mkdir(parents=True)
        (d / "config.json").write_text(json.dumps({"K": K, "seed": seed, "N": N}))
        rows = [{"step": step, **{key: scale * (i + 1) + 0.01 * j for j, key in enumerate(KEYS)}}
                for i, step in enumerate((0, 10, 100))]
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    sweep.plot_sweep(str(tmp_path / "sweep"), str(tmp_path / "fig2bc.png"))
    summary = json.loads((tmp_path / "fig2bc.json").read_text())
    assert summary["K"] == [4, 16] and summary["step"] == [0, 10, 100]
    for j, key in enumerate(KEYS):
        per_N = N if key.startswith("n_A") else 1
        want = [[(2.0 * (i + 1) + 0.01 * j) / per_N for i in range(3)],  # K = 4: mean of scales 1 and 3
                [(10.0 * (i + 1) + 0.01 * j) / per_N for i in range(3)]]
        assert [pytest.approx(row, rel=1e-12) for row in want] == summary[key], key


@pytest.fixture
def spy(monkeypatch):
    """bayes.predict as predictor_scaling.py calls it, recording the sequences each predictor is given."""
    seen, real = [], bayes.predict

    def predict(name, seqs, T):
        seen.append((name, seqs.clone(), T.clone()))
        return real(name, seqs, T)

    monkeypatch.setattr(predictor_scaling, "predict", predict)
    return seen


def test_each_divergence_panel_spans_its_own_values(monkeypatch):
    """Fig. 2b: each divergence's log colour scale runs from its own smallest to largest value (a common 1e-3..1
    scale left D(2-Mem), 0.06-0.7 in the quick sweep, one flat grey); the readouts keep 0..1."""
    figures = []
    monkeypatch.setattr(sweep.plt, "close", figures.append)
    summary = {"K": [4, 16], "step": [0, 10], "kl_1gen": [[0.5, 0.1], [0.4, 0.05]], "kl_2gen": [[0.6, 0.3], [0.5, 0.02]],
               "kl_1mem": [[0.7, 0.2], [0.6, 0.3]], "kl_2mem": [[0.7, 0.4], [0.65, 0.06]],
               **{key: [[0.1, 0.5], [0.2, 0.9]] for key in ("phi_delta_1", "phi_beta_2", "n_A_1", "n_A_2")}}
    sweep.draw_sweep(summary, os.devnull)
    norms = [ax.collections[0].norm for ax in figures[0].axes[:8]]  # the panels (their colour bars follow)
    assert [(n.vmin, n.vmax) for n in norms[:4]] == [(0.05, 0.5), (0.02, 0.6), (0.2, 0.7), (0.06, 0.7)]
    assert all((n.vmin, n.vmax) == (0, 1) for n in norms[4:])


def test_loss_vs_K_is_the_autoregressive_loss_on_its_sequences(spy):
    """scaling_with_K: per task distribution and K, each predictor's mean NLL over the N positions of N + 1
    states drawn from the first K chains of the distribution's task set."""
    Ks, N = [2, 5], 6
    losses = predictor_scaling.scaling_with_K(Ks, N, n_dists=2, n_seqs=3, device="cpu")
    assert len(spy) == 2 * len(Ks) * len(PREDICTORS)
    calls = iter(list(spy))  # the checks below call predict again
    for d in range(2):
        for j, K in enumerate(Ks):
            for name in PREDICTORS:
                called, seqs, T = next(calls)
                assert called == name and seqs.shape == (3, N + 1)
                assert torch.equal(T, TaskSet.create(max(Ks), seed=d).T[:K])  # S(K): the first K chains
                logp = bayes.predict(name, seqs, T)
                nll = [-logp[b, n, seqs[b, n + 1]].item() for b in range(3) for n in range(N)]
                assert losses[name][d][j] == pytest.approx(sum(nll) / len(nll), rel=1e-5)


def test_loss_vs_N_is_the_loss_of_the_state_after_the_first_N(spy):
    """scaling_with_N: -log pi(s_N | s_0..s_{N-1}), averaged over all sequences of all batches (ragged: 5 = 2 + 2
    + 1), for each N from one set of max(N) + 1 states."""
    Ns = [1, 3, 4]
    losses = predictor_scaling.scaling_with_N(Ns, K=3, n_dists=1, n_seqs=5, device="cpu", batch=2)
    per_name = {name: [s for n, s, _ in spy if n == name] for name in PREDICTORS}
    for name in PREDICTORS:
        seqs = torch.cat(per_name[name])
        assert seqs.shape == (5, max(Ns) + 1)
        want = []
        for N in Ns:
            logp = torch.cat([bayes.predict(name, s[:, :N], spy[0][2]) for s in per_name[name]])[:, -1]  # s_0..s_{N-1} only
            want.append(sum(-logp[b, seqs[b, N]].item() for b in range(5)) / 5)
        assert losses[name][0] == pytest.approx(want, rel=1e-5), name



def test_the_announced_work_is_what_the_sweeps_report(monkeypatch):
    """predictor_scaling.work, from which the first line's estimate and the progress's ETA come, is the sum of the
    units() the two sweeps report as main runs them (the N sweep on 4 x the sequences, in batches)."""
    Ks, Ns, N_for_K, K_for_N, n_dists, n_seqs = [1, 2, 5], [1, 3], 4, 3, 2, 20
    reported = {"loss vs K": [], "loss vs N": []}
    predictor_scaling.scaling_with_K(Ks, N_for_K, n_dists, n_seqs, "cpu", progress=reported["loss vs K"].append)
    predictor_scaling.scaling_with_N(Ns, K_for_N, n_dists, 4 * n_seqs, "cpu", batch=32,
                                     progress=reported["loss vs N"].append)
    assert len(reported["loss vs K"]) == n_dists * len(Ks)
    assert len(reported["loss vs N"]) == n_dists * 3  # batches of 32, 32, 16
    total = predictor_scaling.work(Ks, Ns, N_for_K, K_for_N, n_dists, n_seqs)
    assert total == {part: pytest.approx(sum(u)) for part, u in reported.items()}


def test_progress_eta_from_the_work_done_at_most_every_30_s(monkeypatch, capsys):
    """predictor_scaling's progress (cli.WorkProgress over work()'s parts)."""
    now = [100.0]
    monkeypatch.setattr(cli, "time", types.SimpleNamespace(time=lambda: now[0]))
    progress = cli.WorkProgress({"loss vs K": 1.0, "loss vs N": 3.0})
    for t, part, u in [(110, "loss vs K", 0.5), (140, "loss vs K", 0.5), (150, "loss vs N", 1.0), (200, "loss vs N", 1.0)]:
        now[0] = t
        progress.add(part, u)
    assert capsys.readouterr().out.splitlines() == ["loss vs K 100 %, loss vs N 0 %: 0.7 min, ETA 2.0 min",
                                                     "loss vs K 100 %, loss vs N 67 %: 1.7 min, ETA 0.6 min"]

def test_k1_paper_draws_only_started_conditions_and_nothing_is_clipped(monkeypatch):
    """figures/k1_paper.png from the committed JSON (no injected search has a probe yet): no legend entry and no Fig. 7c
    column for injection, the legend saying it has not started; a suptitle readable at README width; every title,
    label and tick label inside the figure."""
    with open(os.path.join(ROOT, "figures", "k1_paper.json")) as f:
        result = json.load(f)
    assert not any(r["probes"] for r in result["seeds"]["inject"])  # the case drawn here
    figures = []
    monkeypatch.setattr(k1.plt, "close", figures.append)
    k1.plot_search(result, os.devnull)
    fig = figures[0]
    legend = fig.axes[0].get_legend()
    assert [t.get_text() for t in legend.get_texts()] == ["control", "phi_beta* = 0.45"]
    assert legend.get_title().get_text() == "inject: not started"
    ticks = [t.get_text() for t in fig.axes[2].get_xticklabels()]
    assert ticks == ["control\n3 ended, 5 running, 8 not started"]
    assert fig._suptitle.get_fontsize() >= 14
    renderer = fig.canvas.get_renderer()
    box = fig.bbox
    texts = [fig._suptitle] + [t for ax in fig.axes for t in (ax.title, ax.xaxis.label, ax.yaxis.label,
                                                                *ax.get_xticklabels(), *ax.get_yticklabels())]
    for t in texts:
        if t.get_text() and t.get_visible():
            e = t.get_window_extent(renderer)
            assert box.x0 <= e.x0 and e.x1 <= box.x1 and box.y0 <= e.y0 and e.y1 <= box.y1, t.get_text()
