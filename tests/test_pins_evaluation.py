"""evaluation.evaluate's mechanistic readouts (Fig. 2's phi_delta, phi_beta, n_A; phi_beta(2) is the K1* rule)
against loops written from Appendix "Mechanistic readouts": on which sequences (the model's inputs from S, not
the D_T ones), from which layer, averaged how. A stub model with different, content-dependent attention in its
two layers makes each of those choices visible."""
import math

import pytest
import torch

import evaluation
from bayes import predict
from markov import TaskSet
from train import Config


def causal_softmax(scores):
    N = scores.shape[-1]
    return torch.softmax(scores.masked_fill(torch.ones(N, N).triu(1).bool(), -math.inf), -1)


class StubModel(torch.nn.Module):
    """Logits of 1-Gen; layer 1 attends mostly to the previous position and to large states, layer 2 to the
    positions after earlier occurrences of the current state (an induction-like head): both depend on the
    sequence, so a readout taken on other sequences, or from the other layer, comes out different."""

    def __init__(self, T):
        super().__init__()
        self.T = T

    def forward(self, seqs, cache=False, task=None):
        B, N = seqs.shape
        s = seqs.float()
        n, i = torch.arange(N).view(N, 1), torch.arange(N).view(1, N)
        A1 = causal_softmax(2.0 * (n - i == 1).float() + 0.3 * s[:, None, :])
        prev = torch.cat([seqs[:, :1] * 0 - 1, seqs[:, :-1]], 1)  # s_{i-1}, none at i = 0
        A2 = causal_softmax(2.5 * (seqs[:, :, None] == prev[:, None, :]).float() - 0.1 * s[:, None, :])
        logits = predict("1gen", seqs, self.T)
        return (logits, {"A1": A1, "A2": A2}) if cache else logits


def loop_readouts(A, seqs):
    """phi_delta, phi_beta and log n_A of one layer, averaged over the sequences, by loops."""
    B, N = seqs.shape
    delta = sum(A[b, n, n - 1].item() for b in range(B) for n in range(1, N)) / (B * (N - 1))
    beta = sum(A[b, n, i].item() for b in range(B) for n in range(1, N) for i in range(1, n + 1)
               if seqs[b, n] == seqs[b, i - 1]) / (B * N)
    entropy = -sum(A[b, -1, i].item() * math.log(A[b, -1, i].item()) for b in range(B) for i in range(N)) / B
    return delta, beta, entropy


def test_readouts_are_those_of_each_layer_on_the_models_inputs_from_S():
    cfg = Config(K=5, N=10, eval_train=11, eval_gen=9)
    tasks = TaskSet.create(cfg.K, cfg.C, seed=cfg.task_seed)
    data = evaluation.make_eval_data(cfg, tasks)
    model = StubModel(tasks.T)
    m = evaluation.evaluate(model, data, chunk=4)  # ragged chunks: 4 + 4 + 3 sequences
    inputs = data["train"][:, :-1]  # what the model reads: s_0..s_{N-1} of the held-out sequences from S
    with torch.no_grad():
        _, cache = model(inputs, cache=True)
    for layer in (1, 2):
        delta, beta, entropy = loop_readouts(cache[f"A{layer}"], inputs)
        assert m[f"phi_delta_{layer}"] == pytest.approx(delta, rel=1e-5)
        assert m[f"phi_beta_{layer}"] == pytest.approx(beta, rel=1e-5)
        assert m[f"n_A_{layer}"] == pytest.approx(math.exp(entropy), rel=1e-5)  # exp of the mean entropy
    # the choices are visible here: the two layers differ, and so do other sequences' readouts
    assert abs(m["phi_beta_2"] - m["phi_beta_1"]) > 0.05 and abs(m["phi_delta_1"] - m["phi_delta_2"]) > 0.05
    with torch.no_grad():
        _, gen_cache = model(data["gen"][:, :-1], cache=True)
        _, shifted = model(data["train"][:, 1:], cache=True)
    assert abs(loop_readouts(gen_cache["A2"], data["gen"][:, :-1])[1] - m["phi_beta_2"]) > 1e-3
    assert abs(loop_readouts(shifted["A2"], data["train"][:, :-1])[1] - m["phi_beta_2"]) > 1e-3
