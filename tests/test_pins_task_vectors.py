"""task_vectors.py: what the experiments are fed and where they read (Fig. 4, A8; Appendix "Task Vector",
"Patching", "Information Content"), and the values of task_vectors.json on a tiny run recomputed here from the
run's checkpoints with transformer.py's own forward, bayes' predictors and the formulas written out.

Chains that reveal themselves: with C = 5, chain k moves every state mu to mu + k + 1 (mod 5), so any one
transition of a sequence names its chain."""
import json
import math

import numpy as np
import pytest
import torch
from test_task_vectors import reference_patch  # the patched forward written with transformer.py's blocks

import task_vectors as tv
import train
from analysis import runs
from bayes import mixed_mem
from markov import TaskSet, stationary
from transformer import Transformer

C = 5


def shift_chains(K: int) -> TaskSet:
    """K deterministic cycles on C = 5 states, chain k: mu -> mu + k + 1 (mod 5); each visits every state."""
    T = torch.zeros(K, C, C)
    for k in range(K):
        T[k, (torch.arange(C) + k + 1) % C, torch.arange(C)] = 1.0
    return TaskSet(T=T, p=stationary(T))


def chain_of(seqs: torch.Tensor) -> torch.Tensor:
    """The chain of each sequence of shift_chains, checked to be the same at every transition."""
    shifts = (seqs[:, 1:] - seqs[:, :-1] - 1) % C
    assert (shifts == shifts[:, :1]).all(), "a sequence mixes chains"
    return shifts[:, 0]


def gen(seed):
    return torch.Generator().manual_seed(seed)


# ----------------------------------------------------------------------------- what the experiments are fed


@pytest.mark.parametrize("K", [2, 4])
def test_the_two_batches_of_a_patching_pair_never_share_a_chain(K):
    """Sequence i of S_B comes from another chain than sequence i of S_A, every other chain in turn (not one
    fixed partner), and both batches have the length asked for."""
    seqs_A, seqs_B = tv.patch_pair(shift_chains(K), 600, 6, gen(K))
    assert seqs_A.shape == seqs_B.shape == (600, 6)
    a, b = chain_of(seqs_A), chain_of(seqs_B)
    assert (a != b).all()
    pairs = {(i, j) for i, j in zip(a.tolist(), b.tolist())}
    assert pairs == {(i, j) for i in range(K) for j in range(K) if i != j}


def test_chain_batch_labels_each_sequence_with_its_chain():
    tasks = shift_chains(4)
    seqs, chains = tv.chain_batch(tasks, 3, 7, gen(0))
    assert seqs.shape == (12, 7) and torch.equal(chain_of(seqs), chains)
    assert torch.bincount(chains, minlength=4).tolist() == [3, 3, 3, 3]


def test_the_task_vector_is_att2s_output_at_the_last_token():
    """Appendix "Task Vector": the cached output of Att2 at the last token of each sequence, here from the
    model's own forward (transformer.py), not from circuits.py's explicit one."""
    model = Transformer(C, 16, max_len=16)
    model.reset_parameters(gen(1))
    model.eval()
    seqs = torch.randint(C, (6, 11), generator=gen(2))
    with torch.no_grad():
        _, cache = model(seqs, cache=True)
    torch.testing.assert_close(tv.last_task_vectors(model, seqs), cache["att2"][:, -1], atol=1e-6, rtol=0)


def test_the_tsne_panels():
    """Fig. 4a's panels: the first step >= 10, the 1-Mem checkpoint, the saved step nearest the geometric mean of
    the two checkpoints in log step (sqrt(10 * 1000) = 100, not the arithmetic 505), and the 2-Mem checkpoint."""
    rows = [{"step": s} for s in (0, 2, 5, 10, 30, 100, 300, 1000)]
    assert tv.tsne_choice(rows, 10, 1000) == [10, 100, 1000]
    assert tv.tsne_choice(rows, 30, 300) == [10, 30, 100, 300]  # sqrt(9000) = 95: nearest 100


# ----------------------------------------------------------------------------- task_vectors.json, value by value


def closest(row):
    return min(("1gen", "2gen", "1mem", "2mem"), key=lambda name: row[f"kl_{name}"])


def checkpoint(rows, name):
    """The saved step nearest predictor `name` among those where it is the nearest of the four, else overall."""
    own = [r for r in rows if closest(r) == name] or rows
    return min(own, key=lambda r: r[f"kl_{name}"])["step"]




def mean_similarity(logp, logq):
    """< exp(-KL(p || q) / KL(uniform || q)) > over sequences, each KL averaged over positions."""
    kl = (logp.exp() * (logp - logq)).sum(-1).mean(1)
    kl_uniform = ((math.log(1 / C) - logq) / C).sum(-1).mean(1)
    return torch.exp(-kl / kl_uniform).mean().item()


def gaussians(model, tasks, N=128, kept=0.9):
    """The task-vector Gaussians of Appendix "Information Content": E from MLP1's output at the last token of
    every two-state sequence (mu, tau), p^k(mu, tau) = p^k_mu T^k_{tau mu}, the principal components that keep
    90 % of the embeddings' variance, and phi ~ N(E p^k, E (diag p^k - p^k p^kT) E^T / N) at N = 128."""
    E = torch.zeros(C * C, 16, dtype=torch.float64)
    with torch.no_grad():
        for mu in range(C):
            for tau in range(C):
                E[mu * C + tau] = model(torch.tensor([[mu, tau]]), cache=True)[1]["mlp1"][0, -1].double()
    P = torch.stack([tasks.p[k, mu].double() * tasks.T[k, tau, mu].double() for mu in range(C) for tau in range(C)
                     for k in range(tasks.K)]).view(C * C, tasks.K).T  # (K, C^2)
    Z = E - E.mean(0)
    _, S, Vt = torch.linalg.svd(Z, full_matrices=False)
    share = np.cumsum(S.numpy() ** 2) / (S.numpy() ** 2).sum()
    d = int(np.argmax(share >= kept)) + 1
    Z = Z @ Vt[:d].T
    covs = torch.stack([Z.T @ (torch.diag(p) - torch.outer(p, p)) @ Z / N for p in P])
    return P @ Z, covs


def test_task_vectors_json_values_on_a_tiny_run(tmp_path, monkeypatch):
    run = tmp_path / "run"
    cfg = train.Config(K=3, C=C, N=12, iters=12, batch=8, D=16, evals=4, eval_train=16, eval_gen=16, out=str(run))
    train.train(cfg, quiet=True)
    fed = {}

    def recorded(name, fn):
        def call(*args, **kwargs):
            fed[name] = fn(*args, **kwargs)
            return fed[name]
        return call

    monkeypatch.setattr(tv, "patch_pair", recorded("patch_pair", tv.patch_pair))
    monkeypatch.setattr(tv, "chain_batch", recorded("chain_batch", tv.chain_batch))
    threads = torch.get_num_threads()
    tv.main(["--run", str(run), "--runs", str(run), "--per-chain", "8", "--patch-seqs", "6", "--seed", "3",
             "--figures", str(tmp_path)])
    torch.set_num_threads(threads)  # main sets it for the process
    result = json.loads((tmp_path / "task_vectors.json").read_text())
    _, rows, _, tasks = runs.load_run(str(run))
    steps = [r["step"] for r in rows]
    assert result["phase"] == {str(r["step"]): closest(r) for r in rows}

    # geometry: per_chain sequences of the training length from every chain, task vectors at the last token
    seqs, chains = fed["chain_batch"]
    assert torch.equal(seqs, tv.chain_batch(tasks, 8, cfg.N, gen(3))[0])  # --seed 3: the geometry's draws
    assert seqs.shape == (3 * 8, cfg.N) and torch.bincount(chains).tolist() == [8, 8, 8]
    for step in steps:
        model = runs.load_run(str(run), step)[2]
        with torch.no_grad():
            phi = model(seqs, cache=True)[1]["att2"][:, -1].numpy()
        assert result["separability"][str(step)] == pytest.approx(tv.separability(phi, chains.numpy(), seed=3)["knn"])

    # patching: Att2 at the 2-Mem checkpoint against the 2-Mem predictors, Att1 at the 1-Mem one against 1-Mem's
    seqs_A, seqs_B = fed["patch_pair"]
    assert all(map(torch.equal, (seqs_A, seqs_B), tv.patch_pair(tasks, 6, cfg.N + 1, gen(4))))  # a stream of their own: 3 + 1
    assert seqs_A.shape == seqs_B.shape == (6, cfg.N + 1)  # N predictions from N + 1 states
    batches = {"A": seqs_A, "B": seqs_B}
    for name, block, two_point in (("2mem", "A2", True), ("1mem", "A1", False)):
        step = checkpoint(rows, name)
        assert result["checkpoints"][name]["step"] == step
        model = runs.load_run(str(run), step)[2]
        x = {k: v[:, :-1] for k, v in batches.items()}
        with torch.no_grad():
            outputs = {"S_A": torch.log_softmax(model(x["A"]), -1), "S_B": torch.log_softmax(model(x["B"]), -1),
                    "S_B + phi_A": reference_patch(model, x["B"], x["A"], block),
                    "S_A + phi_B": reference_patch(model, x["A"], x["B"], block)}
        for condition, logq in outputs.items():
            for pair in ("AA", "AB", "BA", "BB"):
                logp = mixed_mem(batches[pair[0]], batches[pair[1]], tasks.T, two_point)[:, :-1]
                want = mean_similarity(logp, logq)
                assert result[f"patching_{name}"][condition][pair] == pytest.approx(want, rel=1e-4), (name, condition, pair)

    # information: I(K; phi) / log2 K at every saved step, both estimators on the same 1000 draws (--seed)
    for step in steps:
        model = runs.load_run(str(run), step)[2]
        means, covs = gaussians(model, tasks)
        assert result["information_pc_dims"]["3"][str(step)] == means.shape[1]
        for key, paired in (("information", True), ("information_unpaired", False)):
            info, err = tv.mutual_information(means, covs, n_samples=1000, generator=gen(3), paired=paired)
            assert result[key]["3"][str(step)] == pytest.approx(info / math.log2(3), rel=1e-4, abs=1e-6), (key, step)
            assert result[key + "_stderr"]["3"][str(step)] == pytest.approx(err / math.log2(3), rel=1e-4)
