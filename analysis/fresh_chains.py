"""The data Fig. 6's two models train on and the levels their tau is measured between (Sec. "The transition from G1
to G2", Appendix "Testing predictions"): fresh chains (K = infinity, every sequence from its own chain of D_T) scored at
the last position against the Bayes 1-Gen and 2-Gen predictors (eqs. 1-Gen, 2-Gen), and the first crossing of a level.
Shared by the SA-transformer (sa_transformer.py) and the transformer of Fig. 6c bottom (analysis/transformer_tau.py).
"""
import math

import torch

from bayes import nll, one_gen, two_gen
from markov import ablate_bias, sample_chains, sample_sequences, stationary

C = 10  # the chains' states in Fig. 6's setting (the paper's C)


BALANCE_ITERS = 200  # Sinkhorn sweeps: a Dirichlet(1) chain of C = 10 balances to ~1e-12 in float64 well before


def balanced(T: torch.Tensor) -> torch.Tensor:
    """T (..., C, C) made doubly stochastic by Sinkhorn's alternating normalization of its columns and rows (float64,
    returned in T's dtype): every chain's stationary distribution becomes uniform, so a context's state counts say
    nothing about its next state (the 1-Gen predictor's gain over uniform is zero) while its transitions still do
    (2-Gen keeps its gain). Not a distribution of the paper's: a control of ours (tau_settings.py's `unigram_free`)."""
    X = T.double()
    for _ in range(BALANCE_ITERS):
        X = X / X.sum(-2, keepdim=True)  # columns (over tau, as sample_chains)
        X = X / X.sum(-1, keepdim=True)  # rows
    return X.to(T.dtype)


def independent(T: torch.Tensor) -> torch.Tensor:
    """T (..., C, C) with every column (the next state's distribution from each state) replaced by T's stationary
    distribution p: its states are drawn independently from p. The same state frequencies as T's sequences, so a
    context's counts predict as well as on T (the 1-Gen plateau's signal), and no transitions (2-Gen gains nothing
    over 1-Gen). Not a distribution of the paper's: the first phase of tau_settings.py's `readout_first`."""
    return stationary(T).unsqueeze(-1).expand_as(T).contiguous()


def fresh_batch(B: int, N: int, generator, ablate: bool = False, balance: bool = False, iid: bool = False):
    """K = infinity: every sequence from its own chain of D_T (balance: the chain made doubly stochastic, `balanced`;
    iid: its states drawn independently from its stationary distribution, `independent`).
    Returns (context (B, N), target (B,))."""
    T = sample_chains(B, C, 1.0, generator)
    if balance:
        T = balanced(T)
    if iid:
        T = independent(T)
    seqs, _ = sample_sequences(T, B, N + 1, generator, chain_idx=torch.arange(B, device=T.device))
    if ablate:
        seqs = ablate_bias(seqs, stationary(T), generator)
    return seqs[:, :N], seqs[:, N]


def eval_set(B: int, N: int, ablate: bool = False, balance: bool = False):
    """The evaluation set of every run at N, of both models and every seed and device: fresh_batch from the seed
    10^6 + N (apart from any training seed), so runs at one N (on one kind of data) are measured on the same
    sequences."""
    return fresh_batch(B, N, torch.Generator().manual_seed(10**6 + N), ablate, balance)


ALPHAS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0)


def predictor_levels(context: torch.Tensor, target: torch.Tensor) -> dict:
    """Losses at the last position, over all samples and over those whose target occurs in the
    context ("masked"), of the Bayes 1-Gen and 2-Gen predictors and of the two plateaus that tau is
    measured from: the SA-transformer's 1-Gen solution (raw frequencies k_tau / N, which is what
    its experts compute at beta = delta = 0) and the best smoothed frequencies (n_tau + alpha') /
    (N + C alpha') over alpha' (the 1-point predictor a transformer can learn on its plateau)."""
    seqs = torch.cat([context, target[:, None]], 1)
    present = (context == target[:, None]).any(1)

    def last(logp):
        loss = nll(logp, seqs)[:, -1]
        return loss.mean().item(), loss[present].mean().item()

    out = {}
    out["loss_1gen"], out["masked_loss_1gen"] = last(one_gen(seqs, C))
    out["loss_2gen"], out["masked_loss_2gen"] = last(two_gen(seqs, C))
    out["masked_loss_frequencies"] = last(one_gen(seqs, C, alpha=0.0))[1]
    out["loss_best_1gen"] = min(last(one_gen(seqs, C, alpha=a))[0] for a in ALPHAS)
    return out



def crossing(t: list, y: list, level: float) -> float:
    """First time y(t) falls below level, linearly interpolated between evaluations; nan if never."""
    for i in range(1, len(t)):
        if y[i] < level <= y[i - 1]:
            return t[i - 1] + (y[i - 1] - level) / (y[i - 1] - y[i]) * (t[i] - t[i - 1])
    return math.nan
