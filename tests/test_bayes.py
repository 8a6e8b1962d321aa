"""bayes.py against brute-force loops written from the appendix formulas (float64), and the engine's fast memorizing
predictors (engine/fastdata.py) against the same loops and against bayes.py."""
import math
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

import bayes
from bayes import ar_loss, asymptotic_loss_1gen, asymptotic_loss_2gen, kl_div, nll, one_gen, one_mem, two_gen, two_mem
from engine import fastdata
from markov import TaskSet, sample_chains, sample_sequences, stationary
from stand_ins import fast_mixed_mem


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def brute_gen(seqs, C, two_point):
    """(n_tau + 1) / (n + C) or (m_{tau mu} + 1) / (n_mu + C), counted by hand."""
    B, L = seqs.shape
    out = torch.empty(B, L, C, dtype=torch.float64)
    for b in range(B):
        for n in range(L):
            s = seqs[b, : n + 1].tolist()
            for tau in range(C):
                if two_point:
                    mu = s[-1]
                    m = sum(1 for i in range(1, len(s)) if s[i - 1] == mu and s[i] == tau)
                    n_mu = sum(1 for i in range(1, len(s)) if s[i - 1] == mu)
                    out[b, n, tau] = (m + 1) / (n_mu + C)
                else:
                    out[b, n, tau] = (s.count(tau) + 1) / (len(s) + C)
    return out.log()


def brute_mem(seqs, T, two_point, state_seqs=None):
    """Posterior over the K chains from the likelihood of s_0..s_n, then sum_k P(k) T_k[:, s'_n] with
    s' = state_seqs (default seqs)."""
    K, C = T.shape[0], T.shape[-1]
    p = stationary(T)
    B, L = seqs.shape
    state_seqs = seqs if state_seqs is None else state_seqs
    out = torch.empty(B, L, C, dtype=torch.float64)
    for b in range(B):
        s = seqs[b].tolist()
        for n in range(L):
            loglik = []
            for k in range(K):
                ll = math.log(p[k, s[0]])
                for i in range(1, n + 1):
                    ll += math.log(T[k, s[i], s[i - 1]]) if two_point else math.log(p[k, s[i]])
                loglik.append(ll)
            post = torch.softmax(torch.tensor(loglik, dtype=torch.float64), 0)
            for tau in range(C):
                out[b, n, tau] = sum(post[k] * T[k, tau, state_seqs[b, n]] for k in range(K))
    return out.log()


CASES = [(1, 4, 1), (3, 4, 9), (7, 3, 12), (5, 10, 1), (16, 10, 20)]  # (K, C, L)
FAST = SimpleNamespace(one_mem=fastdata.one_mem, two_mem=fastdata.two_mem, mixed_mem=fast_mixed_mem)
MEMORIZING = [pytest.param(bayes, id="plain"), pytest.param(FAST, id="fast")]  # with one_mem, two_mem, mixed_mem


@pytest.mark.parametrize("K, C, L", CASES)
def test_generalizing_predictors_match_brute_force(K, C, L):
    seqs, _ = sample_sequences(sample_chains(K, C, 1.0, gen(K)), 3, L, gen(L))
    torch.testing.assert_close(one_gen(seqs, C, torch.float64), brute_gen(seqs, C, False))
    torch.testing.assert_close(two_gen(seqs, C, torch.float64), brute_gen(seqs, C, True))
    counts = torch.nn.functional.one_hot(seqs, C).double().cumsum(1)
    torch.testing.assert_close(one_gen(seqs, C, torch.float64, alpha=0.0).exp(), counts / counts.sum(-1, keepdim=True))


@pytest.mark.parametrize("mem", MEMORIZING)
@pytest.mark.parametrize("K, C, L", CASES)
def test_memorizing_predictors_match_brute_force(K, C, L, mem):
    T = sample_chains(K, C, 1.0, gen(K + 100)).double()
    T = T / T.sum(1, keepdim=True)
    seqs, _ = sample_sequences(T, 3, L, gen(L + 100))
    torch.testing.assert_close(mem.one_mem(seqs, T), brute_mem(seqs, T, False))
    torch.testing.assert_close(mem.two_mem(seqs, T), brute_mem(seqs, T, True))


@pytest.mark.parametrize("mem", MEMORIZING)
@pytest.mark.parametrize("K, C, L", CASES)
def test_mixed_memorizing_predictor_matches_brute_force(K, C, L, mem):
    """Posterior from one batch, current state from another (Appendix "Patching")."""
    T = sample_chains(K, C, 1.0, gen(K + 200)).double()
    T = T / T.sum(1, keepdim=True)
    post, _ = sample_sequences(T, 3, L, gen(L + 200))
    state, _ = sample_sequences(T, 3, L, gen(L + 300))
    for two_point in (True, False):
        torch.testing.assert_close(mem.mixed_mem(post, state, T, two_point), brute_mem(post, T, two_point, state))


@pytest.mark.parametrize("mem", MEMORIZING)
def test_mixed_memorizing_predictor_on_one_batch_is_the_plain_one(mem):
    tasks = TaskSet.create(30, seed=4)
    seqs, _ = tasks.batch(5, 50, gen(9))
    assert torch.equal(mem.mixed_mem(seqs, seqs, tasks.T), mem.two_mem(seqs, tasks.T))
    assert torch.equal(mem.mixed_mem(seqs, seqs, tasks.T, two_point=False), mem.one_mem(seqs, tasks.T))
    with pytest.raises(ValueError, match="state_seqs"):
        mem.mixed_mem(seqs, seqs[:, :-1], tasks.T)


@pytest.mark.parametrize("mem", MEMORIZING)
def test_float32_memorizing_predictors_are_close_to_float64(mem):
    T = TaskSet.create(300, seed=1).T
    seqs, _ = sample_sequences(T, 8, 257, gen(1))
    T64 = T.double() / T.double().sum(1, keepdim=True)
    for f in (mem.one_mem, mem.two_mem):
        torch.testing.assert_close(f(seqs, T), f(seqs, T64).float(), atol=2e-4, rtol=0)


@pytest.mark.parametrize("K, C, L", CASES + [(1, 2, 5), (64, 2, 1), (130, 10, 257)])
def test_fast_predictors_are_the_plain_ones(K, C, L):
    """fastdata.predict = bayes.predict for every predictor, and fastdata's mixed posterior = bayes.mixed_mem: to float64
    rounding, and in float32 to the rounding of bayes.py's cumulative log-likelihood (|log p| ~ 10^2 at L = 257)."""
    T = sample_chains(K, C, 1.0, gen(K + 400))
    seqs, _ = sample_sequences(T, 6, L, gen(L + 400))
    state, _ = sample_sequences(T, 6, L, gen(L + 500))
    T64 = T.double() / T.double().sum(1, keepdim=True)
    for chains, tol in ((T64, 1e-10), (T, 1e-4)):
        for name in bayes.PREDICTORS:
            torch.testing.assert_close(fastdata.predict(name, seqs, chains), bayes.predict(name, seqs, chains),
                                       atol=tol, rtol=0)
        for two_point in (True, False):
            torch.testing.assert_close(fast_mixed_mem(seqs, state, chains, two_point),
                                       bayes.mixed_mem(seqs, state, chains, two_point), atol=tol, rtol=0)


@pytest.mark.parametrize("anchor_every, chunk", [(1, 2**20), (3, 40 * 7), (7, 2**20), (7, 40 * 3)])
def test_fast_memorizing_anchors_and_chunks_match_brute_force(monkeypatch, anchor_every, chunk):
    """Every anchor spacing of fastdata's predictors (1: all positions are anchors) and chunks of whole
    sequences and of a few positions give the predictor of the formulas."""
    T = sample_chains(40, 5, 1.0, gen(7)).double()
    T = T / T.sum(1, keepdim=True)
    seqs, _ = sample_sequences(T, 4, 17, gen(8))
    monkeypatch.setattr(fastdata, "ANCHOR_EVERY", anchor_every)
    monkeypatch.setattr(bayes, "CHUNK_ELEMENTS", chunk)
    torch.testing.assert_close(fastdata.one_mem(seqs, T), brute_mem(seqs, T, False))
    torch.testing.assert_close(fastdata.two_mem(seqs, T), brute_mem(seqs, T, True))


@pytest.mark.parametrize("mem", MEMORIZING)
def test_chunking_does_not_change_the_result(monkeypatch, mem):
    T = TaskSet.create(40, seed=2).T
    seqs, _ = sample_sequences(T, 9, 33, gen(2))
    full = [f(seqs, T) for f in (mem.one_mem, mem.two_mem)] + [two_gen(seqs, 10)]
    monkeypatch.setattr(bayes, "CHUNK_ELEMENTS", 40 * 33 * 2)  # two sequences per chunk, ragged end
    chunked = [f(seqs, T) for f in (mem.one_mem, mem.two_mem)] + [two_gen(seqs, 10)]
    for a, b in zip(full, chunked):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("predict", [bayes.predict, fastdata.predict], ids=["plain", "fast"])
def test_predictors_are_normalized_and_predict_dispatches_to_the_formulas(predict):
    tasks = TaskSet.create(50, seed=3)
    seqs, _ = tasks.batch(6, 40, gen(3))
    for name in bayes.PREDICTORS:
        logp = predict(name, seqs, tasks.T)
        assert logp.shape == (6, 40, 10) and logp.dtype == tasks.T.dtype
        torch.testing.assert_close(logp.exp().sum(-1), torch.ones(6, 40))
    # each name is its own formula (a normalized but wrong predictor passes the check above)
    T = tasks.T[:4].double()
    T = T / T.sum(1, keepdim=True)
    s = seqs[:2, :9]
    brute = {"1gen": brute_gen(s, 10, False), "2gen": brute_gen(s, 10, True),
             "1mem": brute_mem(s, T, False), "2mem": brute_mem(s, T, True)}
    for name in bayes.PREDICTORS:
        torch.testing.assert_close(predict(name, s, T), brute[name])


@pytest.mark.parametrize("mem", MEMORIZING)
def test_memorizing_with_one_chain_is_that_chain(mem):
    T = sample_chains(1, 6, 1.0, gen(4))
    seqs, _ = sample_sequences(T, 4, 30, gen(5))
    expected = T[0][:, seqs].permute(1, 2, 0).log()  # T[:, s_n]
    torch.testing.assert_close(mem.one_mem(seqs, T), expected)
    torch.testing.assert_close(mem.two_mem(seqs, T), expected)


def test_losses_and_divergence_match_loops():
    tasks = TaskSet.create(20, seed=6)
    seqs, _ = tasks.batch(5, 12, gen(6))
    p, q = two_mem(seqs, tasks.T), one_gen(seqs, 10)
    ref_nll = torch.tensor([[-p[b, n, seqs[b, n + 1]].item() for n in range(11)] for b in range(5)])
    torch.testing.assert_close(nll(p, seqs), ref_nll)
    torch.testing.assert_close(nll(p[:, :-1], seqs), ref_nll)  # a model's predictions for seqs[:, :-1]
    torch.testing.assert_close(ar_loss(p, seqs), ref_nll.mean())
    ref_kl = sum(
        sum(p[b, n, c].exp() * (p[b, n, c] - q[b, n, c]) for c in range(10)) for b in range(5) for n in range(12)
    ) / 60
    torch.testing.assert_close(kl_div(p, q), ref_kl)
    assert kl_div(p, p).abs() < 1e-7 and kl_div(p, q) > 0


def test_asymptotic_losses():
    T = sample_chains(50, 10, 1.0, gen(7)).double()
    T = T / T.sum(1, keepdim=True)
    p = stationary(T)
    l1 = sum(-sum(p[k, t] * math.log(p[k, t]) for t in range(10)) for k in range(50)) / 50
    l2 = sum(-sum(p[k, m] * T[k, t, m] * math.log(T[k, t, m]) for t in range(10) for m in range(10))
             for k in range(50)) / 50
    torch.testing.assert_close(asymptotic_loss_1gen(T), torch.as_tensor(l1, dtype=torch.float64))
    torch.testing.assert_close(asymptotic_loss_2gen(T), torch.as_tensor(l2, dtype=torch.float64))
    assert asymptotic_loss_2gen(T) < asymptotic_loss_1gen(T)


def test_two_gen_converges_to_the_true_chain():
    T = sample_chains(1, 10, 1.0, gen(8))
    seqs, _ = sample_sequences(T, 64, 4000, gen(9))
    per_position = nll(two_gen(seqs, 10), seqs)
    early, late = per_position[:, :200].mean(), per_position[:, -200:].mean()
    assert abs(late - asymptotic_loss_2gen(T)) < 0.03 and early > late


@pytest.mark.parametrize("mem", ["bayes", "engine.fastdata"])
def test_large_K_fits_in_memory(mem):
    """K = 8192, B = 32, L = 257: the plain and the fast memorizing predictors add under 128 MB to the peak resident
    memory of a fresh process (bayes.CHUNK_ELEMENTS per chunk): without their chunks one (B, L, K) float32 array is
    270 MB, and the two add 790 and 340 MB; so memory stays bounded at any B, L, K."""
    code = (
        f"import resource, torch; from markov import TaskSet; from {mem} import two_mem, one_mem\n"
        "t = TaskSet.create(8192, seed=0); s, _ = t.batch(32, 257, torch.Generator().manual_seed(0))\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "a = two_mem(s, t.T); b = one_mem(s, t.T); assert a.isfinite().all() and b.isfinite().all()\n"
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    added_mb = int(out.stdout.strip()) / 2**10
    assert added_mb < 128, f"the predictors added {added_mb:.0f} MB"


@pytest.mark.parametrize("call", [
    lambda: one_gen(torch.tensor([[0, 1, 10]]), 10),
    lambda: two_gen(torch.tensor([[0, -1]]), 10),
    lambda: two_mem(torch.tensor([[0, 1]]), torch.rand(3, 10, 10)),
    lambda: one_mem(torch.tensor([[0, 1]]), torch.ones(3, 10, 9) / 10),
    lambda: one_gen(torch.tensor([[0.0, 1.0]]), 10),
    lambda: one_gen(torch.tensor([[0, 1]]), 1),
    lambda: fastdata.two_mem(torch.tensor([[0, 1]]), torch.rand(3, 10, 10)),
    lambda: fastdata.one_mem(torch.tensor([[0, 1]]), torch.ones(3, 10, 9) / 10),
    lambda: fastdata.two_mem(torch.tensor([[0, 10]]), torch.ones(3, 10, 10) / 10),
    lambda: bayes.two_mem(torch.tensor([[0, 10]]), torch.ones(3, 10, 10) / 10),
])
def test_bad_input_is_a_one_line_value_error(call):
    with pytest.raises(ValueError) as err:
        call()
    assert "\n" not in str(err.value)
