"""task_vectors.py: patching against the model's own forward (no-op into itself, never a silent no-op),
the mixed predictors' roles, the similarity, the Gaussian task-vector model against multinomial draws,
the mutual-information estimator at its limits and on a 1-D quadrature, the separability metric, and a
tiny end-to-end run."""
import json
import math
import os

import numpy as np
import pytest
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from threadpoolctl import threadpool_limits

import bayes
import task_vectors as tv
import train
from analysis.edges import run_edges
from analysis.runs import closest_predictor
from markov import TaskSet, sample_chains, sample_sequences
from plumbing import cli
from transformer import Transformer

C, D = 5, 16


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


@pytest.fixture
def model():
    m = Transformer(C, D, max_len=32)
    m.reset_parameters(gen(1))
    return m.eval()


@pytest.fixture
def batches():
    tasks = TaskSet.create(6, C, seed=2)
    return tasks, *tv.patch_pair(tasks, 7, 21, gen(3))  # (tasks, S_A, S_B), 20 predictions each


# ----------------------------------------------------------------------------- patching


@pytest.mark.parametrize("block", ["A1", "A2"])
def test_patching_a_batch_into_itself_changes_nothing(model, batches, block):
    _, seqs_A, _ = batches
    runs = tv.patched_runs(model, seqs_A, seqs_A, block)
    for name in tv.CONDITIONS:
        torch.testing.assert_close(runs[name], runs["S_A"], rtol=0, atol=1e-6)


@torch.no_grad()
def reference_patch(model, x_into, x_from, block):
    """Logits of x_into with `block`'s output taken from x_from, written with transformer.py's own blocks."""
    _, into = model(x_into, cache=True)
    _, src = model(x_from, cache=True)
    if block == "A2":
        y2 = into["x1"] + src["att2"]
    else:
        y1 = into["x0"] + src["att1"]
        x1 = y1 + model.mlp1(y1)
        y2 = x1 + model.att2(x1)[0]
    return torch.log_softmax(model.W_U(y2 + model.mlp2(y2)), -1)


@pytest.mark.parametrize("block", ["A1", "A2"])
def test_patches_match_the_model_forward_and_change_the_output(model, batches, block):
    """The right block, the right direction, and a visible effect on a random model."""
    _, seqs_A, seqs_B = batches
    runs = tv.patched_runs(model, seqs_A, seqs_B, block)
    x_A, x_B = seqs_A[:, :-1], seqs_B[:, :-1]
    torch.testing.assert_close(runs["S_A"], torch.log_softmax(model(x_A), -1), rtol=0, atol=1e-5)
    torch.testing.assert_close(runs["S_B + phi_A"], reference_patch(model, x_B, x_A, block), rtol=0, atol=1e-5)
    torch.testing.assert_close(runs["S_A + phi_B"], reference_patch(model, x_A, x_B, block), rtol=0, atol=1e-5)
    for patched, own in (("S_B + phi_A", "S_B"), ("S_A + phi_B", "S_A")):
        assert (runs[patched] - runs[own]).abs().max() > 1e-2, f"{block}: {patched} equals {own}"


def test_mixed_predictors_take_the_posterior_from_the_first_letter():
    """Two distinct chains and long sequences: the posterior collapses, so "AB" is chain A's
    transition column at B's current state."""
    T = sample_chains(2, C, 1.0, gen(4))
    seqs_A, _ = sample_sequences(T, 3, 300, gen(5), chain_idx=torch.zeros(3, dtype=torch.long))
    seqs_B, _ = sample_sequences(T, 3, 300, gen(6), chain_idx=torch.ones(3, dtype=torch.long))
    preds = tv.mixed_predictors(seqs_A, seqs_B, T, two_point=True)
    n = seqs_A.shape[1] - 2  # the last of the model's predictions
    for name in tv.PAIRS:
        post, state = {"A": 0, "B": 1}[name[0]], {"A": seqs_A, "B": seqs_B}[name[1]]
        expected = T[post][:, state[:, n]].T.log()  # (3, C)
        torch.testing.assert_close(preds[name][:, n], expected, rtol=0, atol=1e-4)


def test_similarity_is_one_for_agreement_and_e_inverse_for_uniform():
    logq = torch.log_softmax(torch.randn(4, 9, C, generator=gen(7)), -1)
    logp = torch.log_softmax(torch.randn(4, 9, C, generator=gen(8)), -1)
    uniform = torch.full_like(logq, -math.log(C))
    torch.testing.assert_close(tv.similarity(logq, logq), torch.ones(4))
    torch.testing.assert_close(tv.similarity(uniform, logq), torch.full((4,), math.exp(-1)))
    kl = lambda a, b: (a.exp() * (a - b)).sum(-1).mean(1)  # per sequence, mean over positions
    torch.testing.assert_close(tv.similarity(logp, logq), torch.exp(-kl(logp, logq) / kl(uniform, logq)))


def test_similarity_counts_a_state_the_predictor_rules_out_as_zero():
    """0 log 0 = 0, as in bayes.kl_div: a predictor with a state at probability 0 (a memorizing predictor whose
    chains never move there) is compared on the other states, not turned into NaN, and each sequence alone."""
    logq = torch.log_softmax(torch.randn(3, 6, C, generator=gen(9)), -1)
    probs = torch.softmax(torch.randn(3, 6, C, generator=gen(10)), -1)
    probs[0, :, 2] = 0.0
    logp = (probs / probs.sum(-1, keepdim=True)).log()  # sequence 0: state 2 ruled out at every position
    got = tv.similarity(logp, logq)
    uniform = torch.full_like(logq, -math.log(C))
    for b in range(3):
        want = math.exp(-bayes.kl_div(logp[b:b + 1], logq[b:b + 1]) / bayes.kl_div(uniform[b:b + 1], logq[b:b + 1]))
        assert torch.isfinite(got[b]) and got[b].item() == pytest.approx(want, rel=1e-6), b


def test_the_patching_checkpoint_is_the_lowest_divergence_inside_the_phase():
    """circuits.py's rows: 2-Mem is closest only at b's step 15 (x1.11, under circuits' floor, so circuits traces
    no 2-Mem), and patching takes it, not step 25, the lowest 2-Mem divergence but 1-Mem's. Without step 25 no row is
    1-Mem's: the lowest 1-Mem divergence overall (step 15, 2-Mem's), flagged in_phase False. Each row's nearest
    predictor is closest_predictor's."""
    def row(step, g1, g2, m1, m2):
        return {"step": step, "kl_1gen": g1, "kl_2gen": g2, "kl_1mem": m1, "kl_2mem": m2}

    rows = [row(0, 0.5, 0.9, 0.6, 0.9), row(10, 0.10, 0.3, 0.11, 0.5), row(20, 0.2, 0.05, 0.3, 0.4),
            row(5, 0.15, 0.3, 0.4, 0.5), row(15, 0.3, 0.2, 0.1, 0.09), row(25, 0.3, 0.2, 0.07, 0.08)]
    assert [closest_predictor(r) for r in rows] == ["1gen", "1gen", "2gen", "1gen", "2mem", "1mem"]
    assert tv.lowest_divergence_checkpoint(rows, "2mem") == {
        "step": 15, "in_phase": True, "phase": "2mem", "kl": {"1gen": 0.3, "2gen": 0.2, "1mem": 0.1, "2mem": 0.09}}
    assert tv.lowest_divergence_checkpoint(rows, "1mem")["step"] == 25  # in 1-Mem there
    del rows[5]
    assert tv.lowest_divergence_checkpoint(rows, "1mem") == {
        "step": 15, "in_phase": False, "phase": "2mem", "kl": {"1gen": 0.3, "2gen": 0.2, "1mem": 0.1, "2mem": 0.09}}


# ----------------------------------------------------------------------------- information content


def test_pair_embeddings_and_distributions_are_indexed_mu_times_C_plus_tau(model):
    E = tv.pair_embeddings(model)
    for mu, tau in [(0, 3), (4, 1), (2, 2)]:
        _, acts = run_edges(model, torch.tensor([[mu, tau]]), cache=True)
        torch.testing.assert_close(E[:, mu * C + tau], acts["MLP1"][0, -1].double(), rtol=0, atol=1e-6)
    tasks = TaskSet.create(3, C, seed=9)
    P = tv.pair_distributions(tasks)
    for k, mu, tau in [(0, 1, 4), (2, 3, 0)]:
        assert math.isclose(P[k, mu * C + tau], tasks.p[k, mu] * tasks.T[k, tau, mu], rel_tol=1e-6)
    torch.testing.assert_close(P.sum(1), torch.ones(3, dtype=torch.float64))


def test_task_vector_gaussians_match_multinomial_draws():
    """Mean and covariance of phi = (1/N) E n with n ~ Multinomial(N, p^k), sampled. All the variance is
    kept, so the PC projection is an isometry on the embeddings' span: compare distances and spectra."""
    N, draws, C3, D3 = 16, 40_000, 3, 4
    E = torch.randn(D3, C3 * C3, generator=gen(10), dtype=torch.float64)
    P = tv.pair_distributions(TaskSet.create(2, C3, seed=11))
    means, covs = tv.task_vector_gaussians(E, P, N=N, var_kept=1 - 1e-9)
    assert means.shape[1] == D3
    g = gen(12)
    phis = []
    for k in range(2):
        idx = torch.multinomial(P[k], N * draws, replacement=True, generator=g).view(draws, N)
        counts = torch.nn.functional.one_hot(idx, C3 * C3).sum(1).double()  # (draws, C^2)
        phis.append(counts @ E.T / N)  # (draws, D)
        spectrum = torch.linalg.eigvalsh(torch.cov(phis[k].T))
        torch.testing.assert_close(torch.linalg.eigvalsh(covs[k]), spectrum, rtol=0.05, atol=1e-4)
    gap = (phis[0].mean(0) - phis[1].mean(0)).norm()
    torch.testing.assert_close((means[0] - means[1]).norm(), gap, rtol=0.03, atol=0)


@pytest.mark.parametrize("paired", [True, False])
def test_mutual_information_is_log2_K_for_separated_and_zero_for_identical_gaussians(paired):
    K, d = 16, 3
    A = torch.randn(K, d, d, generator=gen(13), dtype=torch.float64)
    covs = A @ A.transpose(1, 2) + 0.1 * torch.eye(d, dtype=torch.float64)  # (K, d, d), SPD
    separated = 1000 * torch.randn(K, d, generator=gen(14), dtype=torch.float64)
    info, err = tv.mutual_information(separated, covs, generator=gen(15), paired=paired)
    assert abs(info - math.log2(K)) <= 4 * err + 1e-6 and err < 0.1, (info, err)
    same_cov = covs[:1].expand(K, d, d)
    info, err = tv.mutual_information(torch.zeros(K, d, dtype=torch.float64), same_cov, generator=gen(16), paired=paired)
    assert abs(info) <= 4 * err + 1e-9 and err < 0.1, (info, err)


@pytest.mark.parametrize("paired", [True, False])
def test_mutual_information_matches_quadrature_in_one_dimension(paired):
    """Two unit Gaussians at -1 and +1: I = H(mixture) - H(component) by numerical integration."""
    x = np.linspace(-12, 12, 200_001)
    comp = lambda m: np.exp(-0.5 * (x - m) ** 2) / math.sqrt(2 * math.pi)
    mix = 0.5 * (comp(-1) + comp(1))
    exact = (-np.trapezoid(mix * np.log(mix), x) - 0.5 * math.log(2 * math.pi * math.e)) / math.log(2)
    means = torch.tensor([[-1.0], [1.0]], dtype=torch.float64)
    info, err = tv.mutual_information(means, torch.ones(2, 1, 1, dtype=torch.float64), 20_000, gen(17), paired)
    assert abs(info - exact) < 4 * err, (info, exact, err)


def test_paired_estimator_has_the_smaller_error():
    """The same draws in 15 dims: the control variate shrinks the Monte Carlo error several-fold."""
    K, d = 4, 15
    means = 0.3 * torch.randn(K, d, generator=gen(19), dtype=torch.float64)
    covs = torch.eye(d, dtype=torch.float64).expand(K, d, d) * 0.01
    _, err_paired = tv.mutual_information(means, covs, generator=gen(20), paired=True)
    _, err = tv.mutual_information(means, covs, generator=gen(20), paired=False)
    assert err_paired < err / 5, (err_paired, err)


# ----------------------------------------------------------------------------- geometry


def test_separability_is_high_for_clusters_and_chance_for_shuffled_labels():
    rng = np.random.default_rng(18)
    K, per, dim = 4, 100, 8
    labels = np.repeat(np.arange(K), per)
    centres = 10 * rng.standard_normal((K, dim))
    X = centres[labels] + rng.standard_normal((K * per, dim))
    s = tv.separability(X, labels)
    assert s["knn"] > 0.95 and s["silhouette"] > 0.5 and s["chance"] == 0.25
    s = tv.separability(X, rng.permutation(labels))
    assert abs(s["knn"] - 0.25) < 0.1 and abs(s["silhouette"]) < 0.1, s


# ----------------------------------------------------------------------------- end to end


def test_tiny_end_to_end(tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    train.train(train.Config(K=3, N=12, iters=12, batch=8, D=16, evals=4, eval_train=16, eval_gen=16, out=str(run)),
                quiet=True)
    threads = torch.get_num_threads()
    tv.main(["--preset", "quick", "--run", str(run), "--runs", str(run), "--per-chain", "8", "--patch-seqs", "6",
             "--figures", str(tmp_path)])
    torch.set_num_threads(threads)  # main sets it for the process
    assert capsys.readouterr().out.startswith(f"preset quick: geometry and patching of {run}, information curves of {run}; "
                                              "the experiments")
    with open(tmp_path / "task_vectors.json") as f:
        result = json.load(f)
    steps = [str(s) for s in train.eval_steps(12, 4)]
    assert list(result["separability"]) == steps and list(result["information"]["3"]) == steps
    for key in ("patching_2mem", "patching_1mem"):
        assert list(result[key]) == list(tv.CONDITIONS)
        assert all(list(row) == list(tv.PAIRS) and all(0 < v <= 1 for v in row.values()) for row in result[key].values())
    assert (tmp_path / "task_vectors.png").exists()
    # the t-SNE layouts are in the JSON: --replot draws the same figure from it alone
    assert sorted(result["tsne"], key=int) == [str(s) for s in result["checkpoints"]["tsne"]]
    assert all(len(xy) == 3 * 8 == len(result["tsne_chain"]) for xy in result["tsne"].values())
    figures = []
    monkeypatch.setattr(tv.plt, "close", figures.append)
    png = (tmp_path / "task_vectors.png").read_bytes()
    tv.main(["--replot", "--figures", str(tmp_path)])
    assert (tmp_path / "task_vectors.png").read_bytes() == png
    first = sorted(result["tsne"], key=int)[0]
    np.testing.assert_array_equal(figures[0].axes[0].collections[0].get_offsets(), result["tsne"][first])
    separability = figures[0].axes[4]
    assert "steps of the t-SNE panels above" in [t.get_text() for t in separability.get_legend().get_texts()]


@pytest.mark.parametrize("argv", [["--per-chain", "0"], ["--Ks", "4,x"], ["--Ks", "1"], ["--bogus"],
                                  ["--preset", "huge"], ["--preset", "paper"], ["--replot"]])
def test_bad_input_is_one_line_and_exit_2(argv, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no runs here, and no figures/task_vectors.json to replot
    monkeypatch.setattr(tv.torch.cuda, "is_available", lambda: False)  # the paper's runs are missing: a GPU would train them
    with pytest.raises(SystemExit) as e:
        cli.run(lambda: tv.main(argv + ["--figures", str(tmp_path / "figs")]))
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1, err
    assert os.listdir(tmp_path) in ([], ["figs"]) and not os.path.exists(tmp_path / "runs")  # nothing trained


def test_tsne_layout_is_the_same_whatever_the_thread_limit():
    """A rerun must redraw the same Fig. 4a: t-SNE on one thread (on two, the PCA and the Barnes-Hut gradient
    sum in another order, and on these 16 overlapping clouds that rounding moved points by ~30 units)."""
    rng = np.random.default_rng(0)
    X = (rng.normal(size=(256, 64)) + np.repeat(rng.normal(size=(16, 64)), 16, 0)).astype(np.float32)
    with threadpool_limits(1):
        first = tv.tsne_2d(X, seed=0)
    with threadpool_limits(2):
        np.testing.assert_array_equal(tv.tsne_2d(X, seed=0), first)


def renderer(fig):
    """A renderer that has drawn `fig` (the scripts close their figures, which leaves them without one)."""
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return canvas.get_renderer()


@pytest.mark.parametrize("name", ["task_vectors.json", "task_vectors_K4.json", "task_vectors_paper.json"])
def test_the_committed_figures_show_every_title_and_tell_the_chains_apart(name, tmp_path):
    """The rightmost t-SNE title and the left y label were clipped; at K = 128 the panels coloured 128 chains from
    one hue circle, which no reader tells apart: there, ten chains in tab10's colours and the rest grey."""
    with open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "figures", name)) as f:
        result = json.load(f)
    fig = tv.plot(result, str(tmp_path / "tv.png"))
    drawn = renderer(fig)
    ink, (width, height) = fig.get_tightbbox(drawn), fig.get_size_inches()
    assert ink.x0 >= 0 and ink.y0 >= 0 and ink.x1 <= width and ink.y1 <= height  # nothing cut at the edges
    label, panel = fig.axes[0].yaxis.label.get_window_extent(drawn), fig.axes[0].get_window_extent(drawn)
    assert panel.y0 <= label.y0 and label.y1 <= panel.y1  # the label no longer than its panel
    K = result["config"]["K_geometry"]
    colours = {tuple(c) for c in fig.axes[0].collections[0].get_facecolors()}
    assert len(colours) == (K if K <= 20 else tv.COLOURED + 1)  # + the grey
    if K > 20:
        assert "chains 0-9 coloured, the rest grey" in fig.axes[0].get_ylabel()
