"""markov.py against independent computations: numpy eigenvectors, sequential loops, sample statistics; and the
engine's fast sampler (engine/fastdata.py) against markov.py's loop, bit for bit."""
import numpy as np
import pytest
import torch

import markov
from engine import fastdata
from markov import TaskSet, ablate_bias, sample_chains, sample_sequences, stationary


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("alpha", [1.0, 0.5, 3.0])
def test_chains_are_column_stochastic_dirichlet(alpha):
    C = 10
    T = sample_chains(4000, C, alpha, gen(1))
    assert T.shape == (4000, C, C) and T.dtype == torch.float32
    assert (T >= 0).all()
    torch.testing.assert_close(T.sum(1), torch.ones(4000, C))
    # Dirichlet(alpha) marginals: mean 1/C, variance (C - 1) / (C^2 (C alpha + 1))
    var = (C - 1) / (C**2 * (C * alpha + 1))
    assert abs(T.mean().item() - 1 / C) < 1e-4
    assert abs(T.var().item() - var) / var < 0.03


def test_stationary_matches_numpy_eigenvector():
    T = sample_chains(20, 7, 1.0, gen(2))
    p = stationary(T)
    for k in range(20):
        w, v = np.linalg.eig(T[k].double().numpy())
        ref = np.real(v[:, np.argmin(np.abs(w - 1))])
        ref = ref / ref.sum()
        np.testing.assert_allclose(p[k].numpy(), ref, atol=1e-6)
    torch.testing.assert_close(torch.einsum("kij,kj->ki", T, p), p, atol=1e-6, rtol=0)
    torch.testing.assert_close(p.sum(-1), torch.ones(20))


@pytest.mark.parametrize("length", [1, 2, 3, 7, 11])
def test_sampler_is_the_inverse_cdf_loop_over_the_drawn_uniforms(length):
    """sample_sequences by hand, one scalar at a time: the chains, then u0 (n, 1) and u (block, nb, n) from the
    generator in that order, block = round(sqrt(length - 1)), position k * block + j + 1 taking u[j, k]; s_0 is
    the first state whose stationary CDF exceeds u0, s_t the first whose CDF in column s_{t-1} exceeds u_t.
    Lengths 7 and 11 lay positions out in 2 x 3 and 3 x 4 (a last block past the end)."""
    T = sample_chains(4, 5, 1.0, gen(20))
    n = 3
    seqs, idx = sample_sequences(T, n, length, gen(21))
    g = gen(21)
    want_idx = torch.randint(4, (n,), generator=g)
    u0 = torch.rand(n, 1, generator=g)
    block = max(1, round((length - 1) ** 0.5))
    u = torch.rand(block, -(-(length - 1) // block), n, generator=g) if length > 1 else None
    p = stationary(T)

    def first_above(probs, x):  # inverse CDF at x, the last state if rounding leaves the CDF below x
        total = 0.0
        for state, q in enumerate(probs.tolist()):
            total = np.float32(total + q)  # the CDF as torch.cumsum rounds it, in float32
            if total > x:
                return state
        return len(probs) - 1

    assert torch.equal(idx, want_idx)
    for b in range(n):
        k = want_idx[b]
        s = first_above(p[k], u0[b, 0].item())
        assert seqs[b, 0] == s
        for t in range(1, length):
            s = first_above(T[k, :, s], u[(t - 1) % block, (t - 1) // block, b].item())
            assert seqs[b, t] == s, (b, t)


def test_compose_equals_sequential_loop():
    g = gen(3)
    for L, n, C in [(2, 3, 4), (17, 5, 10), (100, 2, 3), (257, 4, 10)]:
        block = max(1, round((L - 1) ** 0.5))
        nb = -(-(L - 1) // block)
        step = torch.randint(C, (block, nb, n, C), generator=g)
        s0 = torch.randint(C, (n,), generator=g)
        flat = step.transpose(0, 1).reshape(nb * block, n, C)  # position k * block + j + 1 at [j, k]
        ref = torch.empty(n, L, dtype=torch.long)
        for b in range(n):
            s = s0[b].item()
            ref[b, 0] = s
            for t in range(1, L):
                s = flat[t - 1, b, s].item()
                ref[b, t] = s
        assert torch.equal(fastdata._compose(s0, step.clone())[:, :L], ref)


@pytest.mark.parametrize("n", [1, 5])
@pytest.mark.parametrize("length", [1, 2, 3, 7, 17, 130])
@pytest.mark.parametrize("C", [2, 10])
def test_fast_sampler_is_the_plain_loop(C, length, n):
    """fastdata's scan = markov's loop over positions, bit for bit, on chains with tiny and zero entries
    (a CDF with ties, a column summing to just under one); lengths 7 and 130 leave a last block past the
    end of the sequence (positions laid out 2 x 3 and 11 x 12)."""
    g = gen(30 + C)
    T = sample_chains(6, C, 0.1, g)  # alpha = 0.1: many entries near zero
    T[0, :, 0] = 0.0
    T[0, -1, 0] = 1.0  # a column with one certain transition
    T[1, :, 0] = 1 / C  # (so that state 1 below is not the only state that chain 1 returns to)
    T[1, :, 1] = torch.linspace(0, 1, C) / torch.linspace(0, 1, C).sum()  # a zero entry first
    tasks = TaskSet(T=T, p=stationary(T))
    want = tasks.batch(n, length, gen(40))
    got = fastdata.batches([tasks], n, length, [gen(40)])
    assert torch.equal(got[0][0], want[0]) and torch.equal(got[1][0], want[1])


def test_sampler_statistics():
    T = sample_chains(1, 10, 1.0, gen(4))
    seqs, idx = sample_sequences(T, 4000, 60, gen(5))
    assert seqs.shape == (4000, 60) and (idx == 0).all()
    counts = torch.zeros(10, 10)
    counts.index_put_((seqs[:, 1:].flatten(), seqs[:, :-1].flatten()), torch.ones(4000 * 59), accumulate=True)
    empirical = counts / counts.sum(0)
    se = (T[0] * (1 - T[0]) / counts.sum(0)).sqrt()  # binomial standard error per column
    assert ((empirical - T[0]).abs() < 5 * se + 1e-3).all()
    p = stationary(T)[0]
    for pos in [0, 30, 59]:  # stationary at every position, the first included
        freq = torch.bincount(seqs[:, pos], minlength=10) / 4000
        assert ((freq - p).abs() < 5 * (p * (1 - p) / 4000).sqrt() + 1e-3).all()


def test_sampler_chain_choice_and_determinism():
    tasks = TaskSet.create(5, seed=0)
    s1, i1 = tasks.batch(300, 20, gen(6))
    s2, i2 = tasks.batch(300, 20, gen(6))
    assert torch.equal(s1, s2) and torch.equal(i1, i2)
    s3, _ = tasks.batch(300, 20, gen(7))
    assert not torch.equal(s1, s3)
    assert set(i1.tolist()) == set(range(5))
    s5, i5 = sample_sequences(tasks.T, 300, 20, gen(6))  # batch() is the same draw on stored chains and p
    assert torch.equal(s5, s1) and torch.equal(i5, i1)
    idx = torch.tensor([3] * 10)
    _, i4 = sample_sequences(tasks.T, 10, 20, gen(8), chain_idx=idx)
    assert torch.equal(i4, idx)


@pytest.mark.parametrize("length", [1, 2, 3])
def test_short_sequences(length):
    seqs, _ = sample_sequences(sample_chains(3, 4, 1.0, gen(9)), 7, length, gen(10))
    assert seqs.shape == (7, length) and seqs.min() >= 0 and seqs.max() < 4


def test_task_sets_are_nested():
    big = TaskSet.create(200, seed=11)
    for K in [1, 63, 64, 65, 130]:
        small = TaskSet.create(K, seed=11)
        assert torch.equal(small.T, big.T[:K]) and torch.equal(small.p, big.p[:K])
    assert not torch.equal(TaskSet.create(5, seed=12).T, big.T[:5])


def test_generalization_batches_use_fresh_chains():
    tasks = TaskSet.create(4, seed=0)
    seqs, T = tasks.gen_batch(6, 30, gen(13))
    assert seqs.shape == (6, 30) and T.shape == (6, 10, 10)
    assert len({tuple(t.flatten().tolist()) for t in T}) == 6
    assert all(not torch.allclose(t, s) for t in T for s in tasks.T)
    # and sequence b came from T[b]: among the returned chains and those of S, T[b] gives it the
    # highest likelihood (long sequences: any other chain is far behind), and every transition is possible
    seqs, T = tasks.gen_batch(6, 400, gen(14))
    chains = torch.cat([T, tasks.T]).double()
    p = stationary(chains)
    for b in range(6):
        s = seqs[b]
        loglik = p[:, s[0]].log() + chains[:, s[1:], s[:-1]].log().sum(1)  # (6 + K,)
        assert loglik.argmax().item() == b
        assert (T[b][s[1:], s[:-1]] > 0).all()


def test_bias_ablation_changes_only_the_second_to_last_state():
    T = sample_chains(1, 10, 1.0, gen(14))
    seqs, _ = sample_sequences(T, 20000, 9, gen(15))
    p = stationary(T)[0]
    out = ablate_bias(seqs, p.expand(20000, 10), gen(16))
    keep = [i for i in range(9) if i != 6]
    assert torch.equal(out[:, keep], seqs[:, keep])
    assert (out[:, 6] != seqs[:, 6]).float().mean() > 0.5
    # the new state is drawn from p independently of its neighbours: P(s_{N-1} = tau | s_N = mu) = p_tau
    for mu in range(3):
        rows = out[:, 7] == mu
        freq = torch.bincount(out[rows, 6], minlength=10) / rows.sum()
        assert ((freq - p).abs() < 5 * (p * (1 - p) / rows.sum()).sqrt() + 1e-3).all()


@pytest.mark.parametrize("call, name", [
    (lambda: sample_chains(0), "K"),
    (lambda: sample_chains(3, C=1), "C"),
    (lambda: sample_chains(3, alpha=0.0), "alpha"),
    (lambda: sample_chains(3, alpha=-1), "alpha"),
    (lambda: TaskSet.create(0), "K"),
    (lambda: sample_sequences(sample_chains(2), 4, 0), "length"),
    (lambda: sample_sequences(sample_chains(2), 0, 5), "n"),
    (lambda: sample_sequences(torch.rand(2, 10, 10), 4, 5), "T"),
    (lambda: sample_sequences(torch.ones(2, 10, 9) / 10, 4, 5), "T"),
    (lambda: stationary(torch.ones(3, 3)), "T"),
    (lambda: sample_sequences(sample_chains(2), 4, 5, chain_idx=torch.tensor([0, 1, 2, 0])), "chain_idx"),
])
def test_bad_input_names_the_argument(call, name):
    with pytest.raises(ValueError) as err:
        call()
    assert name in str(err.value) and "\n" not in str(err.value)


DEVICES = ["cpu"] + ["cuda"] * torch.cuda.is_available()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("length", [1, 2, 17, 65])
def test_batches_of_many_task_sets_are_their_own_batches(length, device):
    """fastdata.batches (an ensemble's sampling) = each task set's batch() from its own generator, exactly,
    and leaves every generator where batch() leaves it; task sets of different K (one beyond a block of
    64 chains), and a K = inf source, which goes member by member. On CUDA too: batched kernels see more
    rows than one member's, which must not change a member's numbers."""
    def gens():
        return [torch.Generator(device).manual_seed(s) for s in (5, 6, 7)]

    sources = [TaskSet.create(K, seed=s, device=device) for K, s in ((3, 0), (70, 1), (9, 2))]
    for group in (sources, sources[:2] + [markov.FreshChains(device=device)]):
        got_g, want_g = gens(), gens()
        seqs, chains = fastdata.batches(group, 6, length, got_g)
        want = [t.batch(6, length, g) for t, g in zip(group, want_g)]
        assert seqs.shape == (3, 6, length) and chains.shape == (3, 6)
        for e, (s, c) in enumerate(want):
            assert torch.equal(seqs[e], s) and torch.equal(chains[e], c), e
        for a, b in zip(got_g, want_g):
            assert torch.equal(a.get_state(), b.get_state())


def test_batches_refuse_mixed_state_counts_and_missing_generators():
    with pytest.raises(ValueError, match="one number of states"):
        fastdata.batches([TaskSet.create(3), TaskSet.create(3, C=4)], 2, 5, [torch.Generator(), torch.Generator()])
    with pytest.raises(ValueError, match="one generator per source"):
        fastdata.batches([TaskSet.create(3), TaskSet.create(4)], 2, 5, [torch.Generator()])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_batches_never_wait_for_the_gpu():
    """The host samples step t + 1 while the GPU runs step t: fastdata.batches must not synchronize. A
    host-to-device copy of a CPU tensor does; with one in fastdata.batches, the single graphed run with
    sampling fell from 428 to 228 steps/s on an H100 (its step alone: 654)."""
    sources = [TaskSet.create(K, seed=s, device="cuda") for K, s in ((3, 0), (70, 1))]
    gens = [torch.Generator("cuda").manual_seed(s) for s in (0, 1)]
    fastdata.batches(sources, 4, 9, gens)  # first call: lazy initialization may synchronize
    torch.cuda.set_sync_debug_mode("error")
    try:
        fastdata.batches(sources, 4, 9, gens)
    finally:
        torch.cuda.set_sync_debug_mode("default")
