"""The choices behind a figure that a test of the parts cannot see, each against an independent computation: the
k of the task vectors' k-NN separability (Fig. 4's bottom panel, the README's "5-NN separability 0.47"), what each
panel of Fig. 2a draws and at which scale, the SA prefactor a of tau = a N / log N (README: a = 109 and 122) and the
residuals that pick the law, and the minimal model's tail window (Fig. 8d-f's criterion)."""
import math

import numpy as np
import pytest
import torch
from sklearn.model_selection import StratifiedKFold
from test_circuits import tiny_run

import circuits
import mem_minimal as mm
import task_vectors as tv
import train
from analysis import runs, sa_fits
from bayes import PREDICTORS

# ----------------------------------------------------------------------------- Fig. 4: k-NN separability


def knn_accuracy(X, labels, k, folds=5, seed=0):
    """The cross-validated k-nearest-neighbour accuracy written out: for each of the stratified folds (shuffled with
    `seed`), each held-out point takes the majority chain of its k nearest training points (Euclidean; a tie goes
    to the smallest label), and the folds' accuracies are averaged."""
    accuracies = []
    for fit, held in StratifiedKFold(folds, shuffle=True, random_state=seed).split(X, labels):
        dist = ((X[held][:, None] - X[fit][None]) ** 2).sum(-1)  # (held, fit)
        nearest = labels[fit][np.argsort(dist, 1)[:, :k]]  # (held, k)
        votes = np.array([np.bincount(row, minlength=labels.max() + 1).argmax() for row in nearest])
        accuracies.append((votes == labels[held]).mean())
    return float(np.mean(accuracies))


def silhouette(X, labels):
    """Mean over points of (b - a) / max(a, b): a the mean distance to the rest of its cluster, b to the nearest
    other cluster."""
    dist = np.sqrt(((X[:, None] - X[None]) ** 2).sum(-1))
    s = []
    for i in range(len(X)):
        own = labels == labels[i]
        a = dist[i, own].sum() / (own.sum() - 1)
        b = min(dist[i, labels == c].mean() for c in np.unique(labels) if c != labels[i])
        s.append((b - a) / max(a, b))
    return float(np.mean(s))


def test_separability_is_the_5_nearest_neighbours_accuracy_over_5_folds():
    """Three overlapping clouds of task vectors (10 per chain, 6 dimensions): the accuracy depends on k and on the
    folds here (17 of 30 at k = 5, 5 folds shuffled with seed 0), so the hand computation tells them apart."""
    labels = np.repeat(np.arange(3), 10)
    X = np.random.default_rng(0).normal(size=(30, 6)) + 1.2 * np.eye(3, 6)[labels]
    got = tv.separability(X, labels)
    want = knn_accuracy(X, labels, k=5)
    assert got["knn"] == pytest.approx(want, abs=1e-12)
    assert want == pytest.approx(17 / 30)
    others = ([knn_accuracy(X, labels, k) for k in (1, 3, 4, 6, 7)] + [knn_accuracy(X, labels, 5, folds=f) for f in (3, 10)]
              + [knn_accuracy(X, labels, 5, seed=1)])  # other k, other folds, other shuffles: 0.40 to 0.53
    assert all(abs(o - want) > 0.01 for o in others), (want, others)
    assert got["silhouette"] == pytest.approx(silhouette(X, labels), rel=1e-9)
    assert got["chance"] == 1 / 3


# ----------------------------------------------------------------------------- Fig. 2a's four panels


def test_fig2a_panels_draw_each_quantity_at_its_scale(tmp_path, monkeypatch):
    """plot_run's panels read back: L_train and L_gen with the four predictors' levels (from the first row), the
    divergence to each predictor, and the readouts phi_delta(1) and phi_beta(2) as they are, n_A(1) and n_A(2)
    divided by N (the fraction of the context attended to). Every logged value is a distinct number."""
    N = 16
    keys = (["train_loss", "gen_loss"] + [f"{s}_loss_{p}" for s in ("train", "gen") for p in PREDICTORS]
            + [f"kl_{p}" for p in PREDICTORS] + ["phi_delta_1", "phi_beta_2", "n_A_1", "n_A_2"])
    rows = [{"step": step, **{k: 1 + i + 0.01 * j + (10 * i if k.startswith("n_A") else 0) for j, k in enumerate(keys)}}
            for i, step in enumerate((0, 3, 30))]
    figures = []
    monkeypatch.setattr(train.plt, "close", figures.append)
    train.plot_run(rows, train.Config(K=8, N=N), str(tmp_path / "fig2a.png"))
    loss_train, loss_gen, divergence, readouts = figures[0].axes

    def lines(ax):
        return {line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in ax.get_lines()}

    steps = [0, 3, 30]
    for ax, split in ((loss_train, "train"), (loss_gen, "gen")):
        drawn = lines(ax)
        assert drawn["transformer"] == (steps, [r[f"{split}_loss"] for r in rows])
        levels = sorted(y[0] for label, (_, y) in drawn.items() if label != "transformer")
        assert levels == sorted(rows[0][f"{split}_loss_{p}"] for p in PREDICTORS)
    assert sorted(y for _, y in lines(divergence).values()) == sorted([r[f"kl_{p}"] for r in rows] for p in PREDICTORS)
    drawn = lines(readouts)
    assert drawn == {"phi_delta (1)": (steps, [r["phi_delta_1"] for r in rows]),
                     "phi_beta (2)": (steps, [r["phi_beta_2"] for r in rows]),
                     "n_A (1) / N": (steps, [r["n_A_1"] / N for r in rows]),
                     "n_A (2) / N": (steps, [r["n_A_2"] / N for r in rows])}


# ----------------------------------------------------------------------------- Fig. 6c: the SA prefactor and the law


def test_the_prefactor_is_the_least_squares_of_log_tau_at_slope_one():
    """tau = a N / log N fitted in log tau with the slope held at 1: log a = mean over N of log(tau log N / N), the
    geometric mean of the ratios. Ratios 2, 8, 32 at N = 16, 64, 256 (two seeds each, their mean the ratio): a = 8,
    where their arithmetic mean would be 14 and a least squares in tau itself ~31. The free fits' slopes,
    prefactors and residual sums by the closed forms of a line through three points."""
    Ns = [16, 64, 256]
    ratio = {16: 2.0, 64: 8.0, 256: 32.0}
    taus = {N: [ratio[N] * N / math.log(N) * f for f in (0.5, 1.5)] for N in Ns}  # seed mean: ratio N / log N
    fit = sa_fits.fit_tau(taus)
    assert fit["prefactor"] == pytest.approx(8.0, rel=1e-12)
    y = np.log([ratio[N] * N / math.log(N) for N in Ns])
    for name, x in (("N_over_logN", np.log([N / math.log(N) for N in Ns])), ("N", np.log(Ns))):
        xc, yc = x - x.mean(), y - y.mean()
        slope = (xc * yc).sum() / (xc * xc).sum()
        assert fit[f"slope_vs_{name}"] == pytest.approx(slope, rel=1e-9)
        assert fit[f"prefactor_vs_{name}"] == pytest.approx(math.exp(y.mean() - slope * x.mean()), rel=1e-9)
        assert fit[f"rss_vs_{name}"] == pytest.approx((yc * yc).sum() - (xc * yc).sum() ** 2 / (xc * xc).sum(), rel=1e-6)
    assert fit["rss_vs_N"] > 1e-3 and fit["rss_vs_N_over_logN"] > 1e-3  # neither law is exact here: both sums live


# ----------------------------------------------------------------------------- Fig. 8d-f: the tail window


def test_the_criterion_averages_exactly_the_last_tail_batches(monkeypatch):
    """train_mem's criterion <L_train - L^2-Gen> over the last `tail` of `iters` training batches, for windows of
    one, two and three batches: the losses of every step and the 2-Gen losses of the batches in the window are
    recorded as the model computes them, and the criterion is their mean difference."""
    losses, levels = [], []
    cross_entropy, nll = mm.F.cross_entropy, mm.nll

    class Spy:  # mem_minimal's torch.nn.functional, recording the training losses
        def __getattr__(self, name):
            return getattr(torch.nn.functional, name)

        @staticmethod
        def cross_entropy(*args, **kwargs):
            loss = cross_entropy(*args, **kwargs)
            losses.append(loss.item())
            return loss

    def recorded_nll(logp, seqs):
        out = nll(logp, seqs)
        levels.append(out.mean().item())
        return out

    monkeypatch.setattr(mm, "F", Spy())
    monkeypatch.setattr(mm, "nll", recorded_nll)
    for tail in (1, 2, 3):
        losses.clear()
        levels.clear()
        out = mm.train_mem(mm.MemRun(K=4, iters=6, tail=tail, eval_seqs=8, width=16, N=12))
        assert len(losses) == 6  # one per step
        window = levels[:-4]  # the 2-Gen losses of the window's batches; then the held-out sets' model and 2-Gen
        assert len(window) == tail
        assert out["criterion"] == pytest.approx(np.mean(np.subtract(losses[-tail:], window)), rel=1e-12)


# ----------------------------------------------------------------------------- Fig. 3: the traced sequences


def test_a_phase_is_traced_on_n_seqs_fresh_sequences_from_its_runs_S_drawn_from_the_seed(tmp_path, monkeypatch):
    """trace_phases ablates every edge on n_seqs sequences of the checkpoint's run, drawn from its S by the
    generator of `seed` (the same draws for every phase of a run), the model reading s_0..s_{N-1}."""
    run = tmp_path / "run"
    tiny_run(run)
    fed = []
    importance = circuits.edge_importance
    monkeypatch.setattr(circuits, "edge_importance", lambda model, seqs: fed.append(seqs) or importance(model, seqs))
    monkeypatch.setattr(circuits, "phase_checkpoint", circuits.closest_checkpoint)  # a tiny run reaches no phase's floor
    result = circuits.trace_phases({"r": str(run)}, n_seqs=5, seed=2, phases=("2gen", "1gen"))
    cfg, _, model, tasks = runs.load_run(str(run), result["2gen"]["step"])
    want = tasks.batch(5, cfg.N + 1, torch.Generator().manual_seed(2))[0][:, :-1]
    assert len(fed) == 2 and all(torch.equal(seqs, want) for seqs in fed)
    assert result["2gen"]["importance"] == importance(model, want)
