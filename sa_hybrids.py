"""The SA-transformer's hybrids with one part of the transformer's: our extension, not the paper's (tau_settings.py's
ladder, beside Appendix "Testing predictions"): which part of the transformer takes tau_2Gen(N) out of the theory's
N / log N, asked from the side of the model that follows it (sa_transformer.py, eq. base_model). Each hybrid is the
SA-transformer with one part swapped, and equals its parent where the swapped part is the parent's
(tests/test_tau_settings.py):

    SoftmaxReadout    the transformer's kind of readout in place of the mixture of the four experts e_k:
                      "softmax"          pi = softmax(W_R e), a learned map W_R (C x 4C) from zero (the uniform
                                         prediction);
                      "softmax_scalar"   pi = softmax(sum_k a_k e_k), one learned scalar per expert: W_R held at
                                         [a_1 I, a_2 I, a_3 I, a_4 I], no map between states;
                      "softmax_matched"  softmax_scalar from a_k = C / 4, where it equals the mixture's start (all
                                         w = 1/4) to first order: softmax(z) = (1 + z - mean z) / C + O(z^2), so
                                         a = C / 4 gives 1/C + (sum_k e_k - 4 / C) / 4 = sum_k e_k / 4. It tells the
                                         readout's zero start (no gradient reaches the layers until a grows) from the
                                         softmax itself.
    TransformerAttention   the transformer's attention (embeddings, layer norm, factorised W_Q, W_K, W_V, its
                      start) in place of the SA-transformer's layers: SATransformer(N, attention=...) under the
                      mixture, or SoftmaxReadout(N, readout, attention=...); from that draw or from the
                      theory's start (W_Q, W_K x 0.05).
    drive             the converse of tau_settings.py's drive1: delta's drive made N-flat. The theory pushes delta at
                      w_B F_1 / N (eq. parameter_dynamics_simplest); tau_velocities.py measures the transformer's
                      layer 1 pushed without the 1 / N. drive=N0 multiplies the gradient of P1 (every lag) by
                      N / N0, so the push equals the SA-transformer's own at N = N0 and does not fall with N.

`hybrid(N, seed, readout=..., attention=..., drive=...)` builds the one a rung names.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from analysis.fresh_chains import C
from analysis.transformer_tau import model_for
from sa_transformer import SATransformer, expert_paths
from transformer import attention_scores, layer_norm

READOUTS = ("softmax", "softmax_scalar", "softmax_matched")


class SoftmaxReadout(SATransformer):
    """The SA-transformer's two layers read out by a softmax (the module docstring's three kinds); the mixture
    weights take no part."""

    def __init__(self, N: int, readout: str, attention: nn.Module | None = None):
        super().__init__(N, attention=attention)
        if readout not in READOUTS:
            raise ValueError(f"readout must be one of {READOUTS}, got {readout!r}")
        self.readout = readout
        self.W_R = nn.Parameter(torch.zeros(C, 4 * C)) if readout == "softmax" else None
        self.a = None if readout == "softmax" else nn.Parameter(
            torch.full((4,), C / 4 if readout == "softmax_matched" else 0.0))

    def forward(self, seqs: torch.Tensor) -> torch.Tensor:
        """pi (B, C)."""
        e = expert_paths(*self.layer_outputs(seqs))  # (B, 4, C)
        if self.W_R is not None:
            return torch.softmax(e.flatten(1) @ self.W_R.T, -1)
        return torch.softmax(torch.einsum("k,bkc->bc", self.a, e), -1)


class TransformerAttention(nn.Module):
    """The attention of Fig. 6c bottom's transformer (analysis/transformer_tau.last_position) as the SA-transformer's
    two layers: under SATransformer(N, attention=...), the SA-transformer's readout (the mixture of its four
    experts) on the transformer's learned embeddings W_E read through layer norm, factorised W_Q, W_K, W_V and
    relative-position biases, started at the transformer's draw for `seed`. It returns what `layers` returns:
    layer 1's attention of every position, as one-hot states averaged (h), and layer 2's at the last position.

    Layer 1 is the transformer's (transformer.attention_scores, a softmax per query); its score depends only on the
    two states, so it is the SA's layer 1 with M1[a, b] = k(a) . q(b) / sqrt(d), q(b) = W_Q1 LN(W_E[b]),
    k(a) = W_K1 LN(W_E[a]), and P1 the bias table;
    layer 2 reads the transformer's residual stream x0 + A1 v = W_E[s_i] + W_V1 LN(W_E)^T h_i through layer norm:
        A2_iN = softmax_i( W_K2 LN(r_i) . W_Q2 LN(r_N) / sqrt(d) + P2[N - 1 - i] ).
    Nothing of the transformer's readout (W_V2, MLP2, W_U) takes part."""

    def __init__(self, N: int, seed: int, start: float = 1.0):
        """start: W_Q, W_K of both layers times this at the draw (0.05: the theory's start, attention near uniform,
        as tau_settings.py's smallstart knock-out of the transformer)."""
        super().__init__()
        transformer = dict(model_for(N, seed, {"scale": {f"att{l}.W_{m}.weight": start for l in (1, 2) for m in "QK"}})
                           .named_parameters())
        self.W_E = nn.Parameter(transformer["W_E.weight"].detach().clone())  # (C, d)
        for name in ("W_Q", "W_K", "W_V"):
            setattr(self, f"{name}1", nn.Parameter(transformer[f"att1.{name}.weight"].detach().clone()))
        for name in ("W_Q", "W_K"):
            setattr(self, f"{name}2", nn.Parameter(transformer[f"att2.{name}.weight"].detach().clone()))
        self.P1 = nn.Parameter(transformer["att1.P"].detach()[0, :N].clone())  # P1[i - j]
        self.P2 = nn.Parameter(transformer["att2.P"].detach()[0, :N].clone())

    def forward(self, seqs: torch.Tensor):
        """(X, h, A2) as `layers`."""
        d = self.W_E.shape[1]
        e = layer_norm(self.W_E)  # (C, d): what layer 1 reads of each state
        x = e[seqs]  # (B, N, d): LN(W_E[s_i])
        q, k = x @ self.W_Q1.T, x @ self.W_K1.T
        A1 = torch.softmax(attention_scores(q[:, None], k[:, None], self.P1[None]), -1)[:, 0]  # the transformer's layer 1
        X = F.one_hot(seqs, C).to(e.dtype)
        h = A1 @ X  # (B, N, C)
        r = layer_norm(F.embedding(seqs, self.W_E) + h @ (e @ self.W_V1.T))  # (B, N, d): LN of the residual stream
        scores = (r @ self.W_K2.T) @ (self.W_Q2 @ r[:, -1].unsqueeze(-1)) / math.sqrt(d)  # (B, N, 1)
        return X, h, torch.softmax(scores.squeeze(-1) + self.P2.flip(0), -1)


def hybrid(N: int, seed: int, readout: str = "mixture", attention: str = "sa", drive: int | None = None
           ) -> SATransformer:
    """The hybrid a rung names: readout "mixture" or one of READOUTS; attention "sa" (the SA-transformer's, from
    zero), "transformer" (TransformerAttention at the transformer's draw for the seed) or "transformer_small" (that
    draw with W_Q, W_K x 0.05); drive N0: P1's gradient times N / N0 at every step (the module docstring)."""
    starts = {"transformer": 1.0, "transformer_small": 0.05}
    if attention not in ("sa", *starts):
        raise ValueError(f"attention must be 'sa', 'transformer' or 'transformer_small', got {attention!r}")
    swapped = TransformerAttention(N, seed, starts[attention]) if attention in starts else None
    model = SATransformer(N, attention=swapped) if readout == "mixture" else SoftmaxReadout(N, readout, swapped)
    if drive is not None:
        P1 = model.P1 if swapped is None else swapped.P1
        P1.register_hook(lambda grad: grad * (N / drive))  # before the optimizer sees it: P1's step x N / N0
    return model
