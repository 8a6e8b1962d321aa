"""The values of Fig. 2's numbers (evaluation.make_eval_data, evaluation.evaluate, train.eval_steps), not only
their keys: a stub model whose logits are one Bayes predictor's log-probabilities must sit at that
predictor, at every position."""
import math

import pytest
import torch

import evaluation
from bayes import PREDICTORS, nll, predict
from engine import fastdata
from markov import TaskSet
from train import Config, eval_steps


class PredictorModel(torch.nn.Module):
    """Logits = the log-probabilities of the Bayes predictor `name` on the model's own input
    s_0..s_{N-1}, computed here from scratch: position n sees s_0..s_n, nothing else. Attention is
    uniform causal (the readouts need some A1, A2). It takes, and ignores, the chains (task injection)."""

    def __init__(self, name: str, T: torch.Tensor):
        super().__init__()
        self.name, self.T = name, T

    def forward(self, seqs, cache=False, task=None):
        logits = predict(self.name, seqs, self.T)  # (B, N, C)
        B, N = seqs.shape
        A = torch.tril(torch.ones(N, N)) / torch.arange(1, N + 1).view(N, 1)
        return logits, {"A1": A.expand(B, N, N), "A2": A.expand(B, N, N)}


def setup(K=5, N=12, eval_train=24, eval_gen=20):
    cfg = Config(K=K, N=N, eval_train=eval_train, eval_gen=eval_gen)
    tasks = TaskSet.create(cfg.K, cfg.C, seed=cfg.task_seed)
    return cfg, tasks, evaluation.make_eval_data(cfg, tasks)


@pytest.mark.parametrize("name", PREDICTORS)
def test_stored_predictions_are_the_predictor_at_every_position(name):
    """data[f"{split}_{name}"][:, n] is the predictor's distribution of s_{n+1} given s_0..s_n, and the
    stored level is its mean NLL of s_{n+1}, counted position by position."""
    cfg, tasks, data = setup()
    for split in ("train", "gen"):
        seqs = data[split]
        assert seqs.shape[1] == cfg.N + 1
        stored = data[f"{split}_{name}"]
        assert stored.shape == (seqs.shape[0], cfg.N, cfg.C)
        for n in (0, 1, cfg.N // 2, cfg.N - 1):  # the predictor on the prefix s_0..s_n alone, last position
            prefix = predict(name, seqs[:, : n + 1], tasks.T)[:, -1]
            torch.testing.assert_close(stored[:, n], prefix, atol=1e-5, rtol=0)
        level = sum(-stored[b, n, seqs[b, n + 1]].item() for b in range(seqs.shape[0]) for n in range(cfg.N))
        assert data[f"{split}_loss_{name}"] == pytest.approx(level / (seqs.shape[0] * cfg.N), rel=1e-5)


@pytest.mark.parametrize("name", PREDICTORS)
def test_a_model_that_is_a_predictor_has_zero_divergence_to_it_and_its_losses(name):
    cfg, tasks, data = setup()
    m = evaluation.evaluate(PredictorModel(name, tasks.T), data, chunk=7)  # ragged chunks
    assert m[f"kl_{name}"] == pytest.approx(0.0, abs=1e-5)
    for other in PREDICTORS:
        if other != name:
            assert m[f"kl_{other}"] > 1e-3  # the four predictors differ on these sequences
    for split in ("train", "gen"):
        assert m[f"{split}_loss"] == pytest.approx(m[f"{split}_loss_{name}"], rel=1e-5)
        # and the level is the predictor's own NLL on the held-out sequences, from the stub's logits
        seqs = data[split]
        own = nll(predict(name, seqs[:, :-1], tasks.T), seqs).mean().item()
        assert m[f"{split}_loss_{name}"] == pytest.approx(own, rel=1e-5)
    # uniform causal attention: phi_delta = mean over n >= 1 of 1 / (n + 1), n_A = N
    assert m["phi_delta_1"] == pytest.approx(sum(1 / (n + 1) for n in range(1, cfg.N)) / (cfg.N - 1), rel=1e-5)
    assert m["n_A_2"] == pytest.approx(cfg.N, rel=1e-5)


def test_divergence_is_the_mean_of_the_two_splits():
    """D(pi_hat, pi_theta) = 1/2 <KL>_S + 1/2 <KL>_{D_T}, each averaged over positions and sequences:
    a model that is 2-Gen on every sequence is checked against the KL written out by hand."""
    cfg, tasks, data = setup(eval_train=6, eval_gen=4)
    m = evaluation.evaluate(PredictorModel("2gen", tasks.T), data, chunk=5)
    halves = []
    for split in ("train", "gen"):
        p, q = data[f"{split}_1gen"], data[f"{split}_2gen"]
        B = p.shape[0]
        kl = sum((p[b, n].exp() * (p[b, n] - q[b, n])).sum().item() for b in range(B) for n in range(cfg.N))
        halves.append(kl / (B * cfg.N))
    assert m["kl_1gen"] == pytest.approx(0.5 * halves[0] + 0.5 * halves[1], rel=1e-4)


def test_evaluation_data_takes_its_predictors_from_the_predict_argument():
    """make_eval_data computes the predictors with bayes.predict, or with the `predict` it is given (train.py
    passes the engine's fastdata.predict): the same sequences, each set of levels exactly its own predictor's,
    and the two within float32 rounding of each other."""
    cfg, tasks, plain = setup()
    fast = evaluation.make_eval_data(cfg, tasks, predict=fastdata.predict)
    for split in ("train", "gen"):
        seqs = plain[split]
        assert torch.equal(fast[split], seqs)
        for name in PREDICTORS:
            assert torch.equal(plain[f"{split}_{name}"], predict(name, seqs, tasks.T)[:, :-1])
            assert torch.equal(fast[f"{split}_{name}"], fastdata.predict(name, seqs, tasks.T)[:, :-1])
            torch.testing.assert_close(fast[f"{split}_{name}"], plain[f"{split}_{name}"], atol=1e-5, rtol=0)
            assert fast[f"{split}_loss_{name}"] == pytest.approx(plain[f"{split}_loss_{name}"], rel=1e-6)


def test_eval_steps_are_log_spaced():
    """Written out: 10^(0.2 i) rounded, i = 1..20, after step 0 (linear spacing would be 0, 500, 1000, ...)."""
    assert eval_steps(10_000, 20) == [0, 2, 3, 4, 6, 10, 16, 25, 40, 63, 100, 158, 251, 398, 631, 1000, 1585, 2512,
                                      3981, 6310, 10_000]
    assert eval_steps(1000, 3) == [0, 10, 100, 1000]
    s = eval_steps(2000, 40)[1:]
    ratios = [b / a for a, b in zip(s, s[1:]) if a >= 200]
    assert all(abs(math.log(r) - math.log(2000) / 40) < 0.01 for r in ratios)  # geometric where rounding is small
    assert eval_steps(1, 5) == [0, 1]
    assert eval_steps(5, 40) == [0, 1, 2, 3, 4, 5]  # duplicates after rounding merge
