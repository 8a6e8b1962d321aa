"""sa_transformer.py: exact limits of the SA-transformer, its factorized attention, the theory."""
import math
import os
import subprocess
import sys

import pytest
import torch

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
    torch.testing.assert_close(sa.layer1(seqs, X, M1, P1), A1 @ X)


def test_at_initialization_the_experts_are_one_point_statistics():
    seqs = batch()
    N = seqs.shape[1]
    e = sa.experts(seqs, *sa.SATransformer(N).attention_parameters())
    X = torch.nn.functional.one_hot(seqs, 10).float()
    freq = X.mean(1)
    torch.testing.assert_close(e[:, 0], X[:, -1])
    torch.testing.assert_close(e[:, 1], freq)  # uniform layer-1 attention at the last position
    torch.testing.assert_close(e[:, 2], freq)  # uniform layer-2 attention
    H = torch.tensor([sum(1 / i for i in range(j + 1, N + 1)) for j in range(N)])  # sum_{i >= j} 1 / i
    torch.testing.assert_close(e[:, 3], (X * H.view(1, N, 1)).sum(1) / N)  # running means, averaged
    model = sa.SATransformer(N)
    torch.testing.assert_close(model.weights(), torch.full((4,), 0.25))


def test_large_beta_delta_with_w_C_is_the_empirical_two_point_estimate():
    seqs = batch(B=40, N=60, seed=2)
    model = sa.SATransformer(60, reduced=True)
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
    reduced = sa.SATransformer(25, reduced=True)
    with torch.no_grad():
        reduced.beta.fill_(1.7)
        reduced.delta.fill_(0.8)
        reduced.logits.copy_(torch.tensor([0.3, -0.2, 0.5]))
    full = sa.SATransformer(25)
    M1, P1, M2, P2 = reduced.attention_parameters()
    with torch.no_grad():
        for name, value in zip(("M1", "P1", "M2", "P2"), (M1, P1, M2, P2)):
            getattr(full, name).copy_(value)
        full.logits.copy_(reduced.logits)
    torch.testing.assert_close(full(seqs), reduced(seqs))
    assert reduced.beta_delta() == pytest.approx((1.7, 0.8))
    # eq. (minimal_simple): A1_{ji} = ((e^delta - 1) [j = i - 1] + 1) / (i + e^delta - 1), i = positions seen
    X = torch.nn.functional.one_hot(seqs, 10).float()
    h = sa.layer1(seqs, X, M1, P1)
    i = 7  # 0-indexed position 7 sees 8 states
    expected = (X[:, : i + 1].sum(1) + (math.exp(0.8) - 1) * X[:, i - 1]) / (i + 1 + math.exp(0.8) - 1)
    torch.testing.assert_close(h[:, i], expected)


def test_gradients_are_finite_and_masked_samples_carry_none():
    g = torch.Generator().manual_seed(4)
    context, target = sa.fresh_batch(64, 12, g)
    model = sa.SATransformer(12)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 1, generator=g)
    raw, present = sa.target_loss(model(context), target)
    assert (~present).any() and present.any()
    raw.mean().backward()
    assert all(p.grad.isfinite().all() for p in model.parameters())
    model.zero_grad()
    raw, _ = sa.target_loss(model(context[~present]), target[~present])
    raw.sum().backward()
    assert all((p.grad == 0).all() for p in model.parameters())


def test_F1_monte_carlo_matches_the_closed_form():
    F1 = sa.F_d(3, 200_000)[0]
    assert abs(F1 - sa.F1_exact()) / sa.F1_exact() < 0.02
    assert sa.F1_exact() == pytest.approx(9 / 110)
    assert sa.I_coefficient(50_000) > 0


def test_power_fit_and_crossing():
    t = [1, 2, 4, 8, 16]
    assert sa.fit_power(t, [3 * x**2 for x in t], 1, 16) == pytest.approx(2.0)
    assert sa.crossing([0, 10, 20], [2.0, 1.5, 1.0], 1.25) == pytest.approx(15.0)
    assert math.isnan(sa.crossing([0, 10], [2.0, 1.9], 1.0))


@pytest.mark.parametrize("args", [["--N", "1"], ["--preset", "tiny"], ["--jobs", "0"]])
def test_bad_input(args):
    r = subprocess.run([sys.executable, "sa_transformer.py", *args], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
