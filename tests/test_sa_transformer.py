"""sa_model.py, sa_theory.py, sa_analysis.py, sa_transformer.py: exact limits of the SA-transformer, its
factorized attention, the theory, the fits and figures."""
import itertools
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import sa_analysis
import sa_model
import sa_theory
import sa_transformer as sa
from markov import sample_chains, sample_sequences

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def batch(B=6, N=30, seed=0):
    g = torch.Generator().manual_seed(seed)
    seqs, _ = sample_sequences(sample_chains(B, 10, 1.0, g), B, N, g, chain_idx=torch.arange(B))
    return seqs


def test_factorized_layer1_equals_explicit_attention():
    g = torch.Generator().manual_seed(1)
    seqs = batch()
    B, N = seqs.shape
    M1, P1 = torch.randn(10, 10, generator=g), 2 * torch.randn(N, generator=g)
    X = torch.nn.functional.one_hot(seqs, 10).float()
    lag = torch.arange(N).view(N, 1) - torch.arange(N).view(1, N)
    scores = M1[seqs.unsqueeze(1), seqs.unsqueeze(2)] + P1[lag.clamp(min=0)]  # [b, i, j] = M1[s_j, s_i] + P1[i - j]
    A1 = torch.softmax(scores.masked_fill(lag < 0, -math.inf), -1)
    torch.testing.assert_close(sa_model.layer1(seqs, X, M1, P1), A1 @ X)


def test_at_initialization_the_experts_are_one_point_statistics():
    seqs = batch()
    N = seqs.shape[1]
    e = sa_model.experts(seqs, *sa_model.SATransformer(N).attention_parameters())
    X = torch.nn.functional.one_hot(seqs, 10).float()
    freq = X.mean(1)
    torch.testing.assert_close(e[:, 0], X[:, -1])
    torch.testing.assert_close(e[:, 1], freq)  # uniform layer-1 attention at the last position
    torch.testing.assert_close(e[:, 2], freq)  # uniform layer-2 attention
    H = torch.tensor([sum(1 / i for i in range(j + 1, N + 1)) for j in range(N)])  # sum_{i >= j} 1 / i
    torch.testing.assert_close(e[:, 3], (X * H.view(1, N, 1)).sum(1) / N)  # running means, averaged
    model = sa_model.SATransformer(N)
    torch.testing.assert_close(model.weights(), torch.full((4,), 0.25))


def test_large_beta_delta_with_w_C_is_the_empirical_two_point_estimate():
    seqs = batch(B=40, N=60, seed=2)
    model = sa_model.SATransformer(60, reduced=True)
    with torch.no_grad():
        model.beta.fill_(80.0)
        model.delta.fill_(40.0)
    model.fixed_weights = torch.tensor([0.0, 0.0, 1.0, 0.0])
    pi = model(seqs)
    checked = 0
    for b in range(40):
        s = seqs[b].tolist()
        mu = s[-1]
        n_mu = sum(1 for i in range(1, 60) if s[i - 1] == mu)
        if s[0] == mu or n_mu == 0:  # position 0 attends to itself: a boundary term the estimate lacks
            continue
        m = torch.tensor([sum(1 for i in range(1, 60) if s[i - 1] == mu and s[i] == tau) for tau in range(10)], dtype=torch.float)
        torch.testing.assert_close(pi[b], m / n_mu, atol=1e-4, rtol=0)
        checked += 1
    assert checked > 20


def test_reduced_model_is_the_full_model_with_constrained_parameters():
    seqs = batch(N=25, seed=3)
    reduced = sa_model.SATransformer(25, reduced=True)
    with torch.no_grad():
        reduced.beta.fill_(1.7)
        reduced.delta.fill_(0.8)
        reduced.logits.copy_(torch.tensor([0.3, -0.2, 0.5]))
    full = sa_model.SATransformer(25)
    M1, P1, M2, P2 = reduced.attention_parameters()
    with torch.no_grad():
        for name, value in zip(("M1", "P1", "M2", "P2"), (M1, P1, M2, P2)):
            getattr(full, name).copy_(value)
        full.logits.copy_(reduced.logits)
    torch.testing.assert_close(full(seqs), reduced(seqs))
    assert reduced.beta_delta() == pytest.approx((1.7, 0.8))
    # eq. (minimal_simple): A1_{ji} = ((e^delta - 1) [j = i - 1] + 1) / (i + e^delta - 1), i = positions seen
    X = torch.nn.functional.one_hot(seqs, 10).float()
    h = sa_model.layer1(seqs, X, M1, P1)
    i = 7  # 0-indexed position 7 sees 8 states
    expected = (X[:, : i + 1].sum(1) + (math.exp(0.8) - 1) * X[:, i - 1]) / (i + 1 + math.exp(0.8) - 1)
    torch.testing.assert_close(h[:, i], expected)


def test_gradients_are_finite_and_masked_samples_carry_none():
    g = torch.Generator().manual_seed(4)
    context, target = sa.fresh_batch(64, 12, g)
    model = sa_model.SATransformer(12)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 1, generator=g)
    raw, present = sa_model.target_loss(model(context), target)
    assert (~present).any() and present.any()
    raw.mean().backward()
    assert all(p.grad.isfinite().all() for p in model.parameters())
    model.zero_grad()
    raw, _ = sa_model.target_loss(model(context[~present]), target[~present])
    raw.sum().backward()
    assert all((p.grad == 0).all() for p in model.parameters())


def test_F1_monte_carlo_matches_the_closed_form():
    F1 = sa_theory.F_d(3, 200_000)[0]
    assert abs(F1 - sa_theory.F1_exact()) / sa_theory.F1_exact() < 0.02
    assert sa_theory.F1_exact() == pytest.approx(9 / 110)
    assert sa_theory.I_coefficient(50_000) > 0


def test_power_fit_and_crossing():
    t = [1, 2, 4, 8, 16]
    assert sa_analysis.fit_power(t, [3 * x**2 for x in t], 1, 16) == pytest.approx(2.0)
    assert sa.crossing([0, 10, 20], [2.0, 1.5, 1.0], 1.25) == pytest.approx(15.0)
    assert math.isnan(sa.crossing([0, 10], [2.0, 1.9], 1.0))


@pytest.mark.parametrize("args", [["--N", "1"], ["--preset", "tiny"], ["--jobs", "0"]])
def test_bad_input(args):
    r = subprocess.run([sys.executable, "sa_transformer.py", *args], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


# ----------------------------------------------------------------------------- the numbers behind Fig. 6


def test_predictor_levels_by_hand():
    """The last-position losses of 1-Gen, 2-Gen, raw frequencies and the best smoothed 1-point
    predictor, counted sample by sample from the context, and the masked means over present targets."""
    context, target = sa.fresh_batch(60, 8, torch.Generator().manual_seed(5))
    levels = sa.predictor_levels(context, target)
    C, N = 10, 8
    rows = []
    for s, y in zip(context.tolist(), target.tolist()):
        k = s.count(y)
        mu = s[-1]
        n_mu = sum(1 for i in range(1, N) if s[i - 1] == mu)
        m = sum(1 for i in range(1, N) if s[i - 1] == mu and s[i] == y)
        rows.append((k, -math.log((k + 1) / (N + C)), -math.log((m + 1) / (n_mu + C))))
    present = [r for r in rows if r[0] > 0]
    assert 0 < len(present) < len(rows)
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    assert levels["loss_1gen"] == pytest.approx(mean([r[1] for r in rows]), rel=1e-5)
    assert levels["loss_2gen"] == pytest.approx(mean([r[2] for r in rows]), rel=1e-5)
    assert levels["masked_loss_1gen"] == pytest.approx(mean([r[1] for r in present]), rel=1e-5)
    assert levels["masked_loss_2gen"] == pytest.approx(mean([r[2] for r in present]), rel=1e-5)
    assert levels["masked_loss_frequencies"] == pytest.approx(mean([-math.log(r[0] / N) for r in present]), rel=1e-5)
    best = min(mean([-math.log((r[0] + a) / (N + C * a)) for r in rows]) for a in sa.ALPHAS)
    assert levels["loss_best_1gen"] == pytest.approx(best, rel=1e-5)


class LinearLossModel(torch.nn.Module):
    """A stand-in for the SA-transformer whose masked loss falls linearly, 4 - 0.01 t after t training
    steps. It gives probability exp(-loss) to states 0..4 and 0 to states 5..9, so samples whose
    target is 5..9 are 'absent' and the raw loss (clamped at 1e-12) differs from the masked one."""

    def __init__(self, N, reduced):
        super().__init__()
        self.steps = 0
        self.w = torch.nn.Parameter(torch.zeros(()))
        self.fixed_weights = None
        self.logits = torch.nn.Parameter(torch.zeros(3))

    def weights(self):
        return torch.full((4,), 0.25)

    def beta_delta(self):
        return 0.0, 0.0

    def forward(self, context):
        loss = 4.0 - 0.01 * self.steps
        if torch.is_grad_enabled():  # a training step
            self.steps += 1
        pi = torch.zeros(context.shape[0], 10)
        pi[:, :5] = math.exp(-loss)
        return pi + 0.0 * self.w


def test_tau_is_the_halfway_crossing_of_the_masked_loss(monkeypatch):
    """tau_2Gen on a loss curve with a known crossing: halfway between the raw-frequency plateau and
    2-Gen (both on the masked samples), interpolated between evaluations every 30 steps."""
    monkeypatch.setattr(sa, "SATransformer", LinearLossModel)
    draw = sa.fresh_batch
    one_batch = draw(4, 16, torch.Generator().manual_seed(0))
    monkeypatch.setattr(sa, "fresh_batch", lambda B, N, g, ablate=False: one_batch if B == 4 else draw(B, N, g, ablate))
    r = sa.train_sa(sa.Run(N=16, iters=400, batch=4, eval_every=30, eval_batch=256))  # the stub ignores its batches
    threshold = 0.5 * (r["levels"]["masked_loss_frequencies"] + r["levels"]["masked_loss_2gen"])
    assert r["t"][:3] == [0, 30, 60] and r["t"][-1] == 400
    torch.testing.assert_close(torch.tensor(r["masked_loss"]), 4.0 - 0.01 * torch.tensor(r["t"], dtype=torch.float))
    assert all(raw > masked + 1 for raw, masked in zip(r["loss"], r["masked_loss"]))
    assert r["tau"] == pytest.approx((4.0 - threshold) / 0.01, rel=1e-4)
    assert r["tau"] % 30 != 0  # interpolated, not an evaluation step
    r = sa.train_sa(sa.Run(N=16, iters=400, batch=4, eval_every=7, eval_batch=256, stop_after=1.1))
    assert r["t"][-2] < 1.1 * r["tau"] <= r["t"][-1] < 400  # stops at the first evaluation past 1.1 tau


def test_landscape_weights_on_experts_with_a_known_optimum(monkeypatch):
    """Two kinds of samples, half each: expert A gives the target probability 1 or 0, expert C 1/4,
    B and D 0. The best mixture is w_A = 1/3, w_C = 2/3 (d/dw_C of 1/2 log(1 - 3 w_C / 4) + 1/2 log(w_C / 4)
    vanishes there), with loss 1/2 log 12."""
    B, N = 200, 6
    target = torch.arange(B) % 10
    context = target.view(B, 1).expand(B, N).clone()  # every target occurs in its context
    e = torch.zeros(B, 4, 10)
    e[torch.arange(B), 0, target] = (torch.arange(B) % 2 == 0).float()
    e[:, 2] = 0.25 / 9
    e[torch.arange(B), 2, target] = 0.25
    monkeypatch.setattr(sa_theory, "experts", lambda context, *args, h=None: e[: context.shape[0]])
    loss = sa_theory.landscape(context, target, [0.0, 1.0], [0.0])
    assert loss.shape == (1, 2)
    assert loss[0, 0] == pytest.approx(0.5 * math.log(12), rel=1e-5)


def test_landscape_is_the_reduced_models_loss_at_its_best_mixture():
    """At each (delta, beta): the masked loss of the reduced model, minimized over w_A..w_D by L-BFGS on
    softmax logits (an independent optimizer), within 1e-4."""
    context, target = sa.fresh_batch(300, 16, torch.Generator().manual_seed(6))
    betas, deltas = [0.0, 3.0], [0.5, 2.0]
    got = sa_theory.landscape(context, target, betas, deltas)
    present = (context == target[:, None]).any(1)
    model = sa_model.SATransformer(16, reduced=True)
    for i, delta in enumerate(deltas):
        for j, beta in enumerate(betas):
            with torch.no_grad():
                model.beta.fill_(beta)
                model.delta.fill_(delta)
                e = sa_model.experts(context[present], *model.attention_parameters()).double()
            p = e[torch.arange(e.shape[0]), :, target[present]]  # (B, 4)
            z = torch.zeros(4, dtype=torch.float64, requires_grad=True)
            opt = torch.optim.LBFGS([z], max_iter=100, tolerance_grad=1e-10, tolerance_change=1e-12,
                                    line_search_fn="strong_wolfe")

            def closure():
                opt.zero_grad()
                loss = -(p @ torch.softmax(z, 0)).log().mean()
                loss.backward()
                return loss

            opt.step(closure)
            assert got[i, j] == pytest.approx(closure().item(), abs=1e-4)


def test_rate_and_exponent_fits_on_synthetic_curves():
    t = torch.arange(0, 101, 5).tolist()
    y = [3 + 0.5 * x if 10 <= x <= 50 else x**2 for x in t]  # linear only inside the window
    assert sa_analysis.fit_rate(t, y, 10, 50) == pytest.approx(0.5)
    assert math.isnan(sa_analysis.fit_rate(t, y, 10, 14))  # fewer than 3 points
    # beta ~ t and delta ~ t^2 on [0.05, 0.5] tau, something else after; two seeds, one stopped early
    t = list(range(0, 2001, 10))
    runs = [{"t": t, "beta": [2 * x if x <= 500 else x**3 for x in t], "delta": [1e-3 * x**2 if x <= 500 else x for x in t],
             "tau": 1000.0},
            {"t": t[:120], "beta": [6 * x if x <= 500 else 1.0 for x in t[:120]], "delta": [3e-3 * x**2 for x in t[:120]],
             "tau": math.nan}]
    tm, mean = sa_analysis.seed_mean(runs, "beta")
    assert len(tm) == 120 and mean[10] == pytest.approx(4 * 100)
    out = sa_analysis.summarize_exponents(runs, [(0.05, 0.5)])
    assert out["tau_mean"] == 1000.0
    assert out["beta"]["0.05-0.5"] == pytest.approx(1.0) and out["delta"]["0.05-0.5"] == pytest.approx(2.0)
    assert sa_analysis.summarize_exponents(runs, [(0.05, 0.5)], tau=200.0)["beta"]["0.05-0.5"] == pytest.approx(1.0)


def test_predicted_rates_by_hand():
    """Eq. (parameter_dynamics_simplest) at beta = 0: d beta/dt = w_C I H_N / N, d delta/dt = w_B F_1 / N."""
    r = sa_theory.predicted_rates(4, 0.3, w_B=0.2, w_C=0.5)
    assert r["dbeta_dt"] == pytest.approx(0.5 * 0.3 * (1 + 1 / 2 + 1 / 3 + 1 / 4) / 4)
    assert r["ddelta_dt"] == pytest.approx(0.2 * (9 / 110) / 4)
    assert sa_theory.predicted_rates(4, 0.3)["ddelta_dt"] == pytest.approx((9 / 110) / 12)  # the paper's w = 1/3


def lazy_chains(p, e):
    """T = (1 - e) p 1^T + e I: stationary p, eigenvalues 1 and e (C - 1 times)."""
    return (1 - e) * p.view(-1, 1).expand(-1, p.shape[0]) + e * torch.eye(p.shape[0], dtype=p.dtype)


def test_F_d_against_closed_walks_and_eigenvalues(monkeypatch):
    """F_d = <sum_mu (T^{d+1})_{mu mu}> - 1 for d = 1..3 over a fixed ensemble of three chains (sample_chains
    replaced): the trace as a sum over all closed walks mu_0 -> ... -> mu_d -> mu_0, and for lazy chains
    (1 - e) p 1^T + e I the closed form (C - 1) e^{d+1}."""
    g = torch.Generator().manual_seed(8)
    chains = torch.cat([sample_chains(2, 10, 1.0, g), lazy_chains(sample_chains(1, 10, 1.0, g)[0, :, 0], 0.6)[None]])
    monkeypatch.setattr(sa_theory, "sample_chains", lambda n, C, alpha, generator: chains)
    got = sa_theory.F_d(3, 3)
    T = chains.double().tolist()
    for d in (1, 2, 3):
        trace = [sum(math.prod(Tk[w[(i + 1) % (d + 1)]][w[i]] for i in range(d + 1))
                     for w in itertools.product(range(10), repeat=d + 1)) for Tk in T]
        assert got[d - 1] == pytest.approx(sum(trace) / 3 - 1, rel=1e-9, abs=1e-12)
    lazy = lazy_chains(torch.full((10,), 0.1, dtype=torch.float64), 0.6)
    monkeypatch.setattr(sa_theory, "sample_chains", lambda n, C, alpha, generator: lazy[None].expand(n, 10, 10))
    assert sa_theory.F_d(4, 2) == pytest.approx([9 * 0.6 ** (d + 1) for d in range(1, 5)], rel=1e-9)


def test_I_against_its_definition(monkeypatch):
    """I = < sum_mu p_mu^2 (sum_tau T_{tau mu}^2 / p_tau - 1) > (eq. sa_cbeta), with p from numpy's
    eigenvector, over a fixed ensemble; for lazy chains it is e^2 (1 - sum_mu p_mu^2)."""
    g = torch.Generator().manual_seed(9)
    p_lazy = sample_chains(1, 10, 1.0, g)[0, :, 0].double()
    chains = torch.cat([sample_chains(3, 10, 1.0, g).double(), lazy_chains(p_lazy, 0.4)[None]])
    monkeypatch.setattr(sa_theory, "sample_chains", lambda n, C, alpha, generator: chains)
    total = []
    for Tk in chains.numpy():
        w, v = np.linalg.eig(Tk)
        p = np.real(v[:, np.argmin(np.abs(w - 1))])
        p = p / p.sum()
        total.append(sum(p[m] ** 2 * (sum(Tk[t, m] ** 2 / p[t] for t in range(10)) - 1) for m in range(10)))
    assert sa_theory.I_coefficient(4) == pytest.approx(np.mean(total), rel=1e-6)
    assert total[-1] == pytest.approx(0.16 * (1 - (p_lazy**2).sum().item()), rel=1e-6)
    assert all(x > 0 for x in total)  # Cauchy-Schwarz


# ----------------------------------------------------------------------------- Figs. 5c, 6c, A7: analysis and figures


def test_fit_tau_recovers_known_exponents():
    """tau = 3 N / log N gives slope 1 and prefactor 3 against N / log N; tau = 5 N^0.7 gives slope 0.7
    against N; seeds that never crossed (nan) are left out of the means, and so is an N without any."""
    Ns = [32, 64, 128, 256]
    exact = sa_analysis.fit_tau({str(N): [3 * N / math.log(N), math.nan] for N in Ns} | {"512": [math.nan]})
    assert exact["slope_vs_N_over_logN"] == pytest.approx(1.0) and exact["prefactor"] == pytest.approx(3.0)
    assert exact["N"] == Ns
    power = sa_analysis.fit_tau({N: [5 * N**0.7 * 0.9, 5 * N**0.7 * 1.1] for N in Ns})  # two seeds around the curve
    assert power["slope_vs_N"] == pytest.approx(0.7)
    x = np.array(Ns) / np.log(Ns)  # the same data against N / log N: slope from an independent least squares
    y = np.log(5 * np.array(Ns, float) ** 0.7)
    A = np.stack([np.log(x), np.ones(len(Ns))], 1)
    assert power["slope_vs_N_over_logN"] == pytest.approx(np.linalg.lstsq(A, y, rcond=None)[0][0])
    assert math.isnan(sa_analysis.fit_tau({"32": [10.0], "64": [math.nan]})["slope_vs_N_over_logN"])


def test_fit_tau_gives_each_seeds_own_slope_and_the_residuals_pick_the_law():
    """Two seeds per N give no interval of stated coverage, so fit_tau fits each seed alone: seeds that agree give
    the slope twice; seed 1 off the curve at N = 256 alone gives its own least-squares slope (an independent
    polyfit), and the range is the two; a seed missing at some N has no slope of its own (nan), and the range is
    the other's. The residual sum of squares is ~0 for the law the data follow and not for the other."""
    Ns = [32, 64, 128, 256]
    exact = sa_analysis.fit_tau({N: [3 * N / math.log(N)] * 2 for N in Ns})
    assert exact["slope_vs_N_over_logN_seeds"] == pytest.approx([1.0, 1.0])
    assert exact["slope_vs_N_over_logN_range"] == pytest.approx([1.0, 1.0])
    assert exact["rss_vs_N_over_logN"] == pytest.approx(0.0, abs=1e-20) and exact["rss_vs_N"] > 1e-4
    power = sa_analysis.fit_tau({N: [5 * N**0.7] for N in Ns})
    assert power["rss_vs_N"] == pytest.approx(0.0, abs=1e-20) and power["rss_vs_N_over_logN"] > 1e-4
    assert power["slope_vs_N_seeds"] == pytest.approx([0.7])
    spread = sa_analysis.fit_tau({N: [5 * N**0.7, 5 * N**0.7 * (1.5 if N == 256 else 1)] for N in Ns})
    off = np.polyfit(np.log(Ns), np.log([5 * N**0.7 * (1.5 if N == 256 else 1) for N in Ns]), 1)[0]
    assert spread["slope_vs_N_seeds"] == pytest.approx([0.7, off]) and off > 0.75
    assert spread["slope_vs_N_range"] == pytest.approx([0.7, off])
    missing = sa_analysis.fit_tau({N: [5 * N**0.7, math.nan if N == 64 else 6 * N**0.7] for N in Ns})
    assert missing["slope_vs_N_seeds"][0] == pytest.approx(0.7) and math.isnan(missing["slope_vs_N_seeds"][1])
    assert missing["slope_vs_N_range"] == pytest.approx([0.7, 0.7])


def test_normalized_parameters_are_the_attention_the_blocks_imply():
    """P1 -> softmax over lags; M2's h.x block [key nu, query mu] -> softmax over nu in each column, an
    asymmetric block telling the axes apart; zero parameters give uniform attention."""
    N = 6
    P1 = [0.0, 2.0, 0.0, 0.0, 0.0, 0.0]
    M2 = torch.zeros(20, 20)
    M2[10:, :10] = 3 * torch.eye(10)
    M2[10 + 2, 5] = 3.0  # a key holding state 2 also matches a query in state 5
    M2[:10, :10] = 7.0  # other blocks do not enter
    snap = {"P1": P1, "M1": torch.zeros(10, 10).tolist(), "M2": M2.tolist(), "P2": [0.0] * N}
    view = sa_analysis.normalized_parameters(snap)
    assert view["P1"] == pytest.approx([math.exp(x) / (5 + math.exp(2)) for x in P1])
    M2_hx = torch.tensor(view["M2_hx"])
    e3 = math.exp(3)
    assert M2_hx[5, 5] == pytest.approx(e3 / (2 * e3 + 8)) and M2_hx[2, 5] == pytest.approx(e3 / (2 * e3 + 8))
    assert M2_hx[0, 0] == pytest.approx(e3 / (e3 + 9)) and M2_hx[2, 2] == pytest.approx(e3 / (e3 + 9))
    torch.testing.assert_close(M2_hx.sum(0), torch.ones(10))
    torch.testing.assert_close(torch.tensor(view["M1"]), torch.full((10, 10), 0.1))


def synthetic_run(scale: float, n_eval: int = 30) -> dict:
    """A run record with beta = scale t / 100 and delta = scale (t / 100)^2 at t = 0, 10, ..."""
    t = [10 * i for i in range(n_eval)]
    return {"t": t, "beta": [scale * x / 100 for x in t], "delta": [scale * (x / 100) ** 2 for x in t]}


def test_trajectory_overlay_draws_the_seed_means_of_the_runs_it_is_given(tmp_path):
    """Fig. A7: each landscape gets the (beta, delta) trajectories of the runs trained on its data,
    averaged over seeds on the evaluations all seeds reached."""
    near = [-1.0, 0.0, 1.0]
    origin = {"N": 8, "beta": near, "delta": near, "control": np.arange(9.0).reshape(3, 3).tolist(),
              "ablation": np.ones((3, 3)).tolist()}
    runs = {"control": {"full": [synthetic_run(1.0), synthetic_run(3.0, 20)], "reduced": [synthetic_run(0.5)]},
            "ablation": {"full": [synthetic_run(4.0)], "reduced": [synthetic_run(6.0), synthetic_run(8.0)]}}
    fig = sa_analysis.plot_trajectories(origin, runs, str(tmp_path / "a7.png"))
    assert (tmp_path / "a7.png").stat().st_size > 0
    t = np.arange(0, 200, 10) / 100
    expected = {("control", "full"): (2.0 * t, 2.0 * t**2),  # mean of scales 1 and 3 over the 20 shared evaluations
                ("control", "reduced"): (0.5 * np.arange(0, 300, 10) / 100, 0.5 * (np.arange(0, 300, 10) / 100) ** 2),
                ("ablation", "full"): (4.0 * np.arange(0, 300, 10) / 100, 4.0 * (np.arange(0, 300, 10) / 100) ** 2),
                ("ablation", "reduced"): (7.0 * np.arange(0, 300, 10) / 100, 7.0 * (np.arange(0, 300, 10) / 100) ** 2)}
    for ax, setting in zip(fig.axes[:2], ("control", "ablation")):
        lines = {line.get_label(): line for line in ax.get_lines()}
        assert set(lines) == {"full", "reduced"}
        for label, line in lines.items():
            beta, delta = expected[(setting, label)]
            np.testing.assert_allclose(line.get_xdata(), beta)
            np.testing.assert_allclose(line.get_ydata(), delta)


def test_scaling_summary_fits_each_series_and_the_figure_shows_both_settings(tmp_path):
    """Fig. 6c: the control and the ablation series of tau_2Gen(N), each fitted on its own runs (ablation
    tau = 4 N / log N, control 2 N / log N), and the transformer's; panel 3 of the figure shows both."""
    levels = {"masked_loss_2gen": 2.0, "masked_loss_1gen": 2.2}

    def runs(a, N, n=2):
        return [{"tau": a * N / math.log(N) * (1 + 0.01 * s), "masked_loss": [2.3, 2.01], "levels": levels} for s in range(n)]

    tau_runs = {False: {N: runs(2.0, N) for N in (32, 64, 128)}, True: {N: runs(4.0, N) for N in (32, 64, 128)}}
    transformer = {N: [{**r, "loss": [2.3, 2.2], "t": [0, 50]} for r in runs(30.0, N)] for N in (16, 32)}
    out = sa.scaling_summary(tau_runs, transformer)
    assert out["tau_fits"]["tau"]["prefactor"] == pytest.approx(2.0 * 1.005)
    assert out["tau_fits"]["tau_ablation"]["prefactor"] == pytest.approx(4.0 * 1.005)
    assert out["tau_fits"]["tau_transformer"]["slope_vs_N_over_logN"] == pytest.approx(1.0)
    assert out["final_loss"] == 2.01 and out["loss_2gen"] == 2.0
    dyn = {(red, abl): [synthetic_run(1.0 + red + 2 * abl)] for red in (False, True) for abl in (False, True)}
    fig = sa_analysis.plot_scaling(dyn, {False: [synthetic_run(1.0)], True: [synthetic_run(2.0)]}, out, str(tmp_path / "s.png"))
    assert (tmp_path / "s.png").stat().st_size > 0
    labels = [line.get_label() for line in fig.axes[2].get_lines()]
    assert labels == ["control (seeds)", "2 N / log N", "ablation (seeds)", "4 N / log N"]
    np.testing.assert_allclose(fig.axes[2].get_lines()[2].get_ydata(), [r["tau"] for N in (32, 64, 128) for r in tau_runs[True][N]])


def test_last_position_logits_are_the_models_own_at_the_last_position():
    """The non-autoregressive forward evaluated at position N only equals the full forward's last row,
    on a random model with nonzero position biases in both layers."""
    g = torch.Generator().manual_seed(11)
    model = sa.Transformer(10, 16, position="bias", mlp1=False, max_len=9)
    model.reset_parameters(g)
    with torch.no_grad():
        model.att1.P.normal_(0, 2, generator=g)
        model.att2.P.normal_(0, 2, generator=g)
    seqs = batch(B=5, N=9, seed=12)
    torch.testing.assert_close(sa.last_position_logits(model, seqs), model(seqs)[:, -1])


def test_the_transformer_panel_draws_the_power_law_its_runs_give_and_the_papers_law():
    """Fig. 6c bottom: quick transformer runs whose tau falls with N (here 4000 (N / log N)^-0.5) get the power law
    in N / log N fitted to them, its slope and interval in the title (the numbers the README quotes), not only a
    rising a N / log N line through them; the paper's law is drawn too, labelled as such."""
    Ns = [24, 32, 48, 64]
    laws = (("tau", 3.0, 0.8), ("tau_ablation", 4.0, 0.8), ("tau_transformer", 4000.0, -0.5))
    result = {key: {str(N): [a * (N / math.log(N)) ** p] for N in Ns} for key, a, p in laws}
    fits = {key: sa_analysis.fit_tau(result[key]) for key, _, _ in laws}
    assert fits["tau_transformer"]["prefactor_vs_N_over_logN"] == pytest.approx(4000.0)
    assert fits["tau_transformer"]["slope_vs_N_over_logN"] == pytest.approx(-0.5)
    result["tau_fits"] = fits
    dyn = {(red, abl): [synthetic_run(1.0 + red + 2 * abl)] for red in (False, True) for abl in (False, True)}
    frozen = {False: [synthetic_run(1.0)], True: [synthetic_run(2.0)]}
    ax = sa_analysis.plot_scaling(dyn, frozen, result, os.devnull).axes[3]
    lines = {line.get_label(): line for line in ax.get_lines()}
    fit_line = next(line for label, line in lines.items() if label.startswith("fit:"))
    np.testing.assert_allclose(fit_line.get_ydata(), 4000.0 * (np.array(Ns, float) / np.log(Ns)) ** -0.5)
    assert "slope vs N / log N -0.50; each seed alone -0.50 (paper: 1)" in ax.get_title()
    law = next(line for label, line in lines.items() if label.startswith("paper's law"))
    np.testing.assert_allclose(law.get_ydata(), fits["tau_transformer"]["prefactor"] * np.array(Ns) / np.log(Ns))


def test_the_committed_transformer_panel_prints_the_slope_the_readme_quotes(tmp_path):
    """README: the transformer's tau_2Gen against N / log N has slope -0.15, its two seeds alone -0.16 and -0.14;
    the panel says the same (it printed N^-0.12, the slope against N)."""
    with open(os.path.join(ROOT, "figures", "sa_scaling.json")) as f:
        result = json.load(f)
    result["tau_fits"] = {key: sa_analysis.fit_tau(result[key]) for key in ("tau", "tau_ablation", "tau_transformer")}
    dyn = {key: result["runs"][name] for name, key in sa.SETTINGS.items()}
    frozen = {ablate: result["runs"][f"frozen_{'ablation' if ablate else 'control'}"] for ablate in (False, True)}
    fig = sa_analysis.plot_scaling(dyn, frozen, result, str(tmp_path / "s.png"))
    assert "slope vs N / log N -0.15; each seed alone -0.16, -0.14 (paper: 1)" in fig.axes[3].get_title()
    assert [ax.get_ylabel() for ax in fig.axes] == [r"$\beta$ (mean over seeds)", r"$\delta$ (mean over seeds)",
                                                    "tau_2Gen (iterations)", "tau_2Gen (iterations)"]


def snapshot(scale: float, N: int = 16) -> dict:
    g = torch.Generator().manual_seed(int(10 * scale))
    return {"M1": (scale * torch.randn(10, 10, generator=g)).tolist(), "P1": (scale * torch.randn(N, generator=g)).tolist(),
            "M2": (scale * torch.randn(20, 20, generator=g)).tolist(), "P2": (scale * torch.randn(N, generator=g)).tolist()}


def test_parameter_figure_leaves_out_t0_and_gives_every_heat_map_a_colour_bar():
    """Fig. 5c/A4: parameters start at zero, so t = 0 has no panel; the positional attention is not clamped to
    [0, 1] (its early values are ~1/N); every heat map has a colour bar."""
    run = {"run": {"N": 16, "seed": 0}, "snapshots": {str(t): snapshot(t / 100) for t in (0, 100, 200, 300, 400)}}
    fig = sa_analysis.plot_parameters(run, os.devnull)
    titles = " ".join(ax.get_title() for ax in fig.axes)
    assert "t = 0" not in titles and all(f"t = {t}" in titles for t in (100, 400))  # the first and the last
    heat_maps = [ax for ax in fig.axes if ax.images]
    bars = [ax for ax in fig.axes if ax.get_label() == "<colorbar>"]
    assert len(heat_maps) == 5 and len(bars) == 5  # three normalized M2 h.x views, raw M1, raw M2
    positional = fig.axes[0]
    assert positional.get_yscale() == "log" and positional.get_ylim() != (0, 1)
    assert list(positional.get_xticks()) == list(range(8)) and positional.get_xlabel() == "lag i - j"
    assert len(positional.get_lines()) == 4  # one per snapshot after t = 0


def test_theory_figure_has_integer_lags():
    result = {"F_d": [0.08 / 3**d for d in range(20)], "F1_exact": 0.08,
              "landscape": {"N": 8, "beta": [0.0, 1.0], "delta": [0.0, 1.0], "loss": [[2.3, 2.2], [2.2, 2.1]]}}
    ax = sa_analysis.plot_theory(result, os.devnull).axes[0]
    low, high = ax.get_xlim()
    ticks = [t for t in ax.get_xticks() if low <= t <= high]
    assert len(ticks) >= 3 and all(float(t).is_integer() for t in ticks)
    assert "{mu mu}" not in ax.get_title()  # mathtext, not raw pseudo-LaTeX


def test_replot_draws_the_five_figures_from_the_json_alone(tmp_path):
    """The JSON holds every number the SA figures draw: a --replot needs no run."""
    Ns = [32, 64]
    run = lambda scale, snaps=False: {**synthetic_run(scale), "masked_loss": [2.3 - 0.001 * i for i in range(30)],
                                      "w": [[0.25] * 4] * 30, "tau": 150.0, "run": {"N": 64, "seed": 0},
                                      "levels": {"masked_loss_frequencies": 2.3, "masked_loss_1gen": 2.25, "masked_loss_2gen": 2.1},
                                      **({"snapshots": {"0": snapshot(0.0, 64), "50": snapshot(0.5, 64)}} if snaps else {})}
    runs = {name: [run(1.0, snaps=name == "full_control"), run(1.5)] for name in sa.SETTINGS}
    runs.update(frozen_control=[run(1.0)], frozen_ablation=[run(2.0)])
    near = [-1.0, 0.0, 1.0]
    taus = {key: {str(N): [a * N / math.log(N)] for N in Ns} for key, a in (("tau", 3), ("tau_ablation", 4), ("tau_transformer", 30))}
    result = {"F_d": [0.08 / 3**d for d in range(5)], "F1_exact": 0.08, "runs": runs, **taus,
              "tau_fits": {key: sa_analysis.fit_tau(value) for key, value in taus.items()},
              "landscape": {"N": 8, "beta": [0.0, 1.0], "delta": [0.0, 1.0], "loss": [[2.3, 2.2], [2.2, 2.1]]},
              "landscape_origin": {"N": 8, "beta": near, "delta": near, "control": np.ones((3, 3)).tolist(),
                                   "ablation": np.ones((3, 3)).tolist()}}
    (tmp_path / "sa_scaling.json").write_text(json.dumps(result))
    r = subprocess.run([sys.executable, "sa_transformer.py", "--replot", "--figures", str(tmp_path)], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in tmp_path.glob("*.png")) == [f"sa_{name}.png" for name in
                                                               ("dynamics", "parameters", "scaling", "theory", "trajectories")]
    (tmp_path / "sa_scaling.json").write_text(json.dumps({k: v for k, v in result.items() if k != "runs"}))
    r = subprocess.run([sys.executable, "sa_transformer.py", "--replot", "--figures", str(tmp_path)], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [f"error: --replot: {tmp_path}/sa_scaling.json lacks runs "
                                                                   "(not written by sa_transformer.py; rerun it)"]


def test_run_records_keep_what_the_figures_draw(tmp_path):
    """sa_scaling.json's "runs" from real (tiny) runs: rounded to 6 significant digits, the first control run
    with its snapshots, and enough for write_figures to draw all five figures from the JSON."""
    def tiny(seed, reduced=False, ablate=False, **kw):
        return sa.train_sa(sa.Run(N=8, seed=seed, reduced=reduced, ablate=ablate, iters=20, batch=16, eval_every=5,
                                  eval_batch=32, snapshots=() if reduced else (0, 10, 20), **kw))
    dyn = {(red, abl): [tiny(s, red, abl) for s in range(2)] for red in (False, True) for abl in (False, True)}
    frozen = {abl: [tiny(0, True, abl, freeze_weights=(0.25, 0.25, 0.25, 0.25))] for abl in (False, True)}
    records = json.loads(json.dumps(sa.run_records(dyn, frozen)))
    assert sorted(records) == sorted([*sa.SETTINGS, "frozen_control", "frozen_ablation"])
    first = records["full_control"][0]
    assert sorted(first["snapshots"]) == ["0", "10", "20"] and all("snapshots" not in r for r in records["full_control"][1:])
    np.testing.assert_allclose(first["beta"], dyn[(False, False)][0]["beta"], rtol=5e-6, atol=0)  # 6 significant digits
    np.testing.assert_allclose(records["reduced_ablation"][1]["w"], dyn[(True, True)][1]["w"], rtol=5e-6, atol=0)
    near = [-1.0, 0.0, 1.0]
    taus = {key: {"8": [10.0], "16": [20.0]} for key in ("tau", "tau_ablation", "tau_transformer")}
    sa.write_figures({"F_d": [0.1, 0.01], "F1_exact": 0.08, "runs": records, **taus,
                      "tau_fits": {key: sa_analysis.fit_tau(value) for key, value in taus.items()},
                      "landscape": {"N": 8, "beta": [0.0, 1.0], "delta": [0.0, 1.0], "loss": [[2.3, 2.2], [2.2, 2.1]]},
                      "landscape_origin": {"N": 8, "beta": near, "delta": near, "control": np.ones((3, 3)).tolist(),
                                           "ablation": np.ones((3, 3)).tolist()}}, str(tmp_path))
    assert len(list(tmp_path.glob("sa_*.png"))) == 5


def test_transformer_only_trains_the_missing_N_and_merges_them_in_order(monkeypatch):
    """--transformer-only: the N already in the record are not trained again, the others are, with the
    preset's seeds and budget, and every transformer key of the record gains them in increasing N."""
    trained = []

    def fake(P, jobs):  # train_transformers' {N: runs}, from the preset's N, seeds and budget
        trained.extend((N, s, P["transformer_iters"]) for N in P["N_transformer"] for s in range(P["seeds_transformer"]))
        return {N: [{"N": N, "seed": s, "t": [0, P["transformer_iters"]], "loss": [2.3, 2.0 + N / 1000], "levels": {"N": N},
                     "tau": 10.0 * N} for s in range(P["seeds_transformer"])] for N in P["N_transformer"]}

    monkeypatch.setattr(sa, "train_transformers", fake)
    record = {"tau_transformer": {"24": [100.0, 120.0], "64": [90.0, 95.0]}, "transformer_levels": {"24": {}, "64": {}},
              "transformer_final_loss": {"24": [2.1, 2.1], "64": [2.0, 2.0]}}
    P = dict(sa.PRESETS["quick"], N_transformer=[24, 64, 128, 32], transformer_iters=50)
    sa.add_transformer_runs(record, P, jobs=1)
    assert sorted(trained) == [(32, 0, 50), (32, 1, 50), (128, 0, 50), (128, 1, 50)]
    assert record["tau_transformer"] == {"24": [100.0, 120.0], "32": [320.0, 320.0], "64": [90.0, 95.0],
                                         "128": [1280.0, 1280.0]}
    assert list(record["transformer_final_loss"]) == ["24", "32", "64", "128"]
    assert record["transformer_final_loss"]["128"] == [2.128, 2.128] and record["transformer_steps"] == {"32": [50, 50],
                                                                                                           "128": [50, 50]}
    trained.clear()
    sa.add_transformer_runs(record, P, jobs=1)  # nothing missing: nothing trained
    assert trained == []


def test_the_dynamics_legend_names_the_model_curves(tmp_path):
    """Fig. 5b: the black (first seed) and grey (the others) loss curves are in the legend beside the levels."""
    def run(seed):
        return {**synthetic_run(1.0), "masked_loss": [2.3 - 0.001 * i for i in range(30)], "w": [[0.25] * 4] * 30,
                "run": {"N": 64, "seed": seed}, "levels": {"masked_loss_frequencies": 2.3, "masked_loss_1gen": 2.25,
                                                           "masked_loss_2gen": 2.1}}
    dyn = {(False, ablate): [run(0), run(1), run(2)] for ablate in (False, True)}
    fig = sa_analysis.plot_dynamics(dyn, str(tmp_path / "d.png"))
    for ax in fig.axes[:2]:
        texts = [t.get_text() for t in ax.get_legend().get_texts()]
        assert texts[:2] == ["SA-transformer, seed 0", "other seeds (2)"]


def test_the_trajectory_figure_has_readable_ticks_and_a_labelled_colour_bar(tmp_path):
    """Fig. A7 on the committed near-origin grid (-1..1 in nine steps): the tick labels do not run into each other,
    and the colour bar says what it shows."""
    with open(os.path.join(ROOT, "figures", "sa_scaling.json")) as f:
        result = json.load(f)
    runs = {setting: {"full model": [synthetic_run(0.5)]} for setting in ("control", "ablation")}
    fig = sa_analysis.plot_trajectories(result["landscape_origin"], runs, str(tmp_path / "a7.png"))
    fig.canvas.draw()
    for ax in fig.axes[:2]:  # the two landscapes, then their colour bars
        for axis in (ax.xaxis, ax.yaxis):
            boxes = [label.get_window_extent() for label in axis.get_ticklabels() if label.get_visible() and label.get_text()]
            assert len(boxes) >= 3
            assert not any(a.overlaps(b) for a, b in zip(boxes, boxes[1:]))
    assert [ax.get_ylabel() for ax in fig.axes[2:]] == ["loss - loss at (0, 0) (nats)"] * 2
