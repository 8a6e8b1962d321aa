"""The SA-transformer, eq. (base_model), and its reduced form, eq. (minimal_simple) (Sec. "The
transition from G1 to G2"; Appendix "Minimal Network for Generalization in the Limit K -> inf").

On one-hot states x_1..x_N, predicting s_{N+1} (non-autoregressive):
    A1_{ji} = softmax_{j <= i}( x_j^T M1 x_i + P1_{i-j} )            h_i = sum_{j <= i} A1_{ji} x_j
    A2_{iN} = softmax_{i <= N}( x1_i^T M2 x1_N + P2_{N-i} )          x1_i = x_i (+) h_i   (2C-dim)
    pi = w_A x_N + w_B h_N + w_C sum_i A2_{iN} x_i + w_D sum_i A2_{iN} h_i
with (w_A..w_D) = softmax of logits (w_A's fixed at 0, three learnable, all weights 1/4 at start)
and M1 (C x C), M2 (2C x 2C), P1, P2 (relative positions) initialized at zero and unconstrained.
delta = P1 at i - j = 1 (the paper's P^(1)_{-1}); beta = mean diagonal of the M2 block that lets a
key's layer-1 content h_i meet the query's state x_N (the paper's beta^(2)_3, bottom-left block).
The reduced model keeps only beta, delta and the mixture weights.

Layer-1 attention factorizes into a content term and a position term, so all N query positions
of all B sequences cost one (N, N) @ (N, B C) product instead of B N^2 separate weights.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

C = 10


def layer1(seqs: torch.Tensor, X: torch.Tensor, M1: torch.Tensor, P1: torch.Tensor) -> torch.Tensor:
    """h_i = sum_{j <= i} A1_{ji} x_j at every position i: (B, N, C); X = one_hot(seqs).

    A1_{ji} is proportional to exp(M1[s_j, s_i]) exp(P1[i - j]), so the numerator for state tau is
    exp(M1[tau, s_i]) (E X)_{i tau} with E_{ij} = exp(P1[i - j]) (j <= i) shared by all sequences."""
    B, N = seqs.shape
    lag = torch.arange(N, device=seqs.device).view(N, 1) - torch.arange(N, device=seqs.device).view(1, N)
    pos = P1[lag.clamp(min=0)].masked_fill(lag < 0, -math.inf)  # (N, N): P1[i - j], causal
    E = torch.exp(pos - pos.max())  # one global shift: cancels in every row's normalization
    Y = (E @ X.transpose(0, 1).reshape(N, B * C)).view(N, B, C).transpose(0, 1)  # (B, N, C): sum_j E_ij [s_j = tau]
    content = torch.exp(M1 - M1.max(0, keepdim=True).values)  # column mu shifted by its max: cancels per query state
    numerator = content.T[seqs] * Y  # (B, N, C): exp(M1[tau, s_i]) (E X)_{i tau}
    return numerator / numerator.sum(-1, keepdim=True)


def layers(seqs: torch.Tensor, M1, P1, M2, P2, h: torch.Tensor | None = None):
    """(X, h, A2): the one-hot states (B, N, C), layer 1's output h (B, N, C; computed unless given) and layer 2's
    attention at the last position A2_iN (B, N)."""
    X = F.one_hot(seqs, C).to(P1.dtype)  # (B, N, C)
    h = layer1(seqs, X, M1, P1) if h is None else h
    x1 = torch.cat([X, h], -1)  # (B, N, 2C)
    query = x1[:, -1] @ M2.T  # (B, 2C): M2 x1_N
    scores = (x1 @ query.unsqueeze(-1)).squeeze(-1) + P2.flip(0)  # (B, N): x1_i . M2 x1_N + P2[N - i]
    return X, h, torch.softmax(scores, -1)


def experts(seqs: torch.Tensor, M1, P1, M2, P2, h: torch.Tensor | None = None) -> torch.Tensor:
    """The four experts' predictive distributions at the last position, (B, 4, C): the paths
    x_N, h_N, sum_i A2_iN x_i and sum_i A2_iN h_i through the two attention layers (h: layer 1's
    output, when already computed)."""
    X, h, A2 = layers(seqs, M1, P1, M2, P2, h)
    A2 = A2.unsqueeze(1)  # (B, 1, N)
    return torch.stack([X[:, -1], h[:, -1], (A2 @ X).squeeze(1), (A2 @ h).squeeze(1)], 1)


READOUTS = ("mixture", "softmax", "softmax_scalar", "softmax_matched")


class SATransformer(nn.Module):
    """Eq. (base_model). reduced=True: eq. (minimal_simple), parameters beta, delta and the weights.
    readout="softmax": a hybrid with the transformer's kind of readout in place of the mixture, pi = softmax(W_R e)
    of the four experts' outputs e (4C) through a learned map W_R (C x 4C, at zero: the uniform prediction), for
    tau_settings.py's ladder; the mixture weights then take no part.
    readout="softmax_scalar": that hybrid split once more, the softmax without the map between states:
    pi = softmax(sum_k a_k e_k), one learned scalar a_k per expert (at zero: the uniform prediction), i.e. W_R held
    at [a_1 I, a_2 I, a_3 I, a_4 I].
    readout="softmax_matched": softmax_scalar started at a_k = C / 4, where it equals the mixture at its start (all
    w = 1/4) to first order in the experts' departures from uniform: softmax(z) = (1 + z - mean z) / C + O(z^2), so
    a = C / 4 gives 1/C + (sum_k e_k - 4 / C) / 4 = sum_k e_k / 4. It tells the readout's zero start (no gradient
    reaches the layers until a grows) from the softmax itself."""

    def __init__(self, N: int, reduced: bool = False, readout: str = "mixture"):
        super().__init__()
        if readout not in READOUTS:
            raise ValueError(f"readout must be one of {READOUTS}, got {readout!r}")
        self.N, self.reduced, self.readout = N, reduced, readout
        self.W_R = nn.Parameter(torch.zeros(C, 4 * C)) if readout == "softmax" else None
        self.a = (nn.Parameter(torch.full((4,), C / 4 if readout == "softmax_matched" else 0.0))
                  if readout in ("softmax_scalar", "softmax_matched") else None)
        self.logits = nn.Parameter(torch.zeros(3))  # w_B, w_C, w_D relative to w_A (fixed logit 0)
        self.fixed_weights = None  # set to a (4,) tensor to hold w_A..w_D fixed
        if reduced:
            self.beta = nn.Parameter(torch.zeros(()))
            self.delta = nn.Parameter(torch.zeros(()))
        else:
            self.M1 = nn.Parameter(torch.zeros(C, C))
            self.P1 = nn.Parameter(torch.zeros(N))  # P1[i - j], i - j = 0..N-1
            self.M2 = nn.Parameter(torch.zeros(2 * C, 2 * C))
            self.P2 = nn.Parameter(torch.zeros(N))

    def weights(self) -> torch.Tensor:
        """(w_A, w_B, w_C, w_D)."""
        if self.fixed_weights is not None:
            return self.fixed_weights
        return torch.softmax(torch.cat([self.logits.new_zeros(1), self.logits]), 0)

    def attention_parameters(self):
        """(M1, P1, M2, P2); the reduced model's are zero but for P1[1] = delta and M2's beta block."""
        if not self.reduced:
            return self.M1, self.P1, self.M2, self.P2
        z = self.beta.new_zeros
        P1 = z(self.N).index_put((torch.tensor([1]),), self.delta.view(1))
        M2 = z(2 * C, 2 * C).index_put((torch.arange(C, 2 * C), torch.arange(C)), self.beta.expand(C))
        return z(C, C), P1, M2, z(self.N)

    def beta_delta(self) -> tuple[float, float]:
        """delta = P1[1] (attention to the previous state); beta = mean diagonal of M2[C:, :C]."""
        _, P1, M2, _ = self.attention_parameters()
        return torch.diagonal(M2[C:, :C]).mean().item(), P1[1].item()

    def forward(self, seqs: torch.Tensor) -> torch.Tensor:
        """pi (B, C): the predictive distribution of s_{N+1} given seqs (B, N)."""
        e = experts(seqs, *self.attention_parameters())  # (B, 4, C)
        if self.readout == "softmax":
            return torch.softmax(e.flatten(1) @ self.W_R.T, -1)
        if self.a is not None:
            return torch.softmax(torch.einsum("k,bkc->bc", self.a, e), -1)
        return torch.einsum("e,bec->bc", self.weights(), e)


def target_loss(pi: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(raw, present): -log pi(target) clamped at 1e-12, and whether the target occurs in the context.

    pi has no smoothing: a target absent from the context gets probability 0 and no gradient, so
    the masked loss over `present` samples is the meaningful one (tau is defined on it)."""
    p = pi.gather(1, target.view(-1, 1)).squeeze(1)
    return -p.clamp_min(1e-12).log(), p > 0
