"""The four Bayes predictors that define the algorithmic phases (Appendix "Defining the four
algorithmic phases", eq. Tinference with the task set's prior for the memorizing two and D_T's for the generalizing
two, eq. 2-Gen) and the losses measured against them.

Each predictor maps sequences (B, L) to log-probabilities (B, L, C): out[:, n] is the predictive
distribution of s_{n+1} given s_0..s_n (0-indexed; the appendix counts from 1).

  1-Gen  (n_tau + 1) / (n + 1 + C)          n_tau: occurrences of tau in s_0..s_n (n + 1 states)
  2-Gen  (m_{tau mu} + 1) / (n_mu + C)      mu = s_n; m: transition counts mu -> tau inside s_0..s_n
  1-Mem  sum_k P(k | s_0..s_n) T^k[:, s_n]  likelihood prod_i p_k(s_i)            (uniform prior on S)
  2-Mem  sum_k P(k | s_0..s_n) T^k[:, s_n]  likelihood p_k(s_0) prod_i T^k[s_i, s_{i-1}]

Everything is vectorized over sequences, positions and chains, in log space, and chunked over
sequences so that memory stays bounded (at K = 8192, B = 32, L = 257 the two memorizing predictors add ~40 MB). The
engine's fastdata.predict computes the same predictors faster, for the large evaluations of train.py.

The appendix figure "Scaling of the four predictor losses" is predictor_scaling.py's.
"""
import math

import torch
import torch.nn.functional as F

from markov import check_int, check_seqs, stationary

CHUNK_ELEMENTS = 2**20  # elements of the largest per-chunk array (4 MB in float32: stays in cache)
PREDICTORS = ("1gen", "2gen", "1mem", "2mem")


def _chunks(B: int, per_sequence: int):
    """Slices over the batch so that a chunk holds at most CHUNK_ELEMENTS elements."""
    step = max(1, CHUNK_ELEMENTS // max(1, per_sequence))
    return [slice(b, min(B, b + step)) for b in range(0, B, step)]


# ----------------------------------------------------------------------------- generalizing predictors


def one_gen(seqs: torch.Tensor, C: int, dtype=torch.float32, alpha: float = 1.0) -> torch.Tensor:
    """1-Gen: (n_tau + alpha') / (n + 1 + C alpha') from the counts over s_0..s_n, alpha' = 1 in the
    paper (a Dirichlet(alpha') prior on the stationary distribution; alpha' = 0 gives the raw
    frequencies). Returns (B, L, C)."""
    check_int("C", C, 2)
    seqs = check_seqs(seqs, C)
    if not alpha >= 0:
        raise ValueError(f"alpha must be >= 0, got {alpha!r}")
    L = seqs.shape[1]
    counts = F.one_hot(seqs, C).to(dtype).cumsum(1)  # (B, L, C): n_tau over s_0..s_n
    n = torch.arange(1, L + 1, dtype=dtype, device=seqs.device).view(1, L, 1)
    return (counts + alpha).log() - (n + C * alpha).log()


def two_gen(seqs: torch.Tensor, C: int, dtype=torch.float32) -> torch.Tensor:
    """2-Gen: (m_{tau mu} + 1) / (n_mu + C) with mu = s_n. Returns (B, L, C)."""
    check_int("C", C, 2)
    seqs = check_seqs(seqs, C)
    B, L = seqs.shape
    out = torch.empty(B, L, C, dtype=dtype, device=seqs.device)
    for sl in _chunks(B, L * C * C):
        s = seqs[sl]
        b = s.shape[0]
        pair = s[:, :-1] * C + s[:, 1:]  # transition s_{i-1} = mu -> s_i = tau, as mu * C + tau
        m = F.one_hot(pair, C * C).to(dtype).cumsum(1)  # (b, L - 1, C*C): counts inside s_0..s_i
        m = torch.cat([m.new_zeros(b, 1, C * C), m], 1).view(b, L, C, C)  # position 0 has none
        row = m.gather(2, s.view(b, L, 1, 1).expand(b, L, 1, C)).squeeze(2)  # (b, L, C): m_{tau, s_n}
        out[sl] = (row + 1).log() - (row.sum(-1, keepdim=True) + C).log()
    return out


# ----------------------------------------------------------------------------- memorizing predictors


def _memorizing(seqs: torch.Tensor, T: torch.Tensor, two_point: bool, state_seqs: torch.Tensor | None = None) -> torch.Tensor:
    """The memorizing Bayes predictor (Appendix "Defining the four algorithmic phases", "Memorization"): Eq.
    (Tinference) with the prior P(T) = 1/K sum_k delta(T - T^(k)) over the K chains T (K, C, C),

        out[:, n] = sum_k P(k | s_0..s_n) T_k[:, s'_n],   P(k | s_0..s_n) = softmax_k log P(s_0..s_n | T_k),

    s' = state_seqs (default: seqs). The log-likelihood is a sum of one term per position: log p_k(s_0),
    then log T_k[s_i, s_{i-1}] (2-Mem, "2-point memorization") or log p_k(s_i) (1-Mem, "1-point
    memorization"), p_k the stationary distribution of chain k. In T's dtype, chunked over sequences. A
    context that no chain can emit (zero likelihood under all K) has no posterior: NaN."""
    K, C = T.shape[0], T.shape[-1]
    log_p = stationary(T).log().T.contiguous()  # (C, K): log p_k(tau) at [tau, k]; stationary() checks T
    log_T = T.log().permute(1, 2, 0).contiguous()  # (C, C, K): log T_k[tau, mu] at [tau, mu, k]
    seqs = check_seqs(seqs, C).to(T.device)
    state_seqs = seqs if state_seqs is None else check_seqs(state_seqs, C, "state_seqs").to(T.device)
    if state_seqs.shape != seqs.shape:
        raise ValueError(f"state_seqs must have the shape of seqs {tuple(seqs.shape)}, got {tuple(state_seqs.shape)}")
    B, L = seqs.shape
    out = torch.empty(B, L, C, dtype=T.dtype, device=T.device)
    for sl in _chunks(B, L * K):
        s, now, pred = seqs[sl], state_seqs[sl], out[sl]
        loglik = log_p[s]  # (b, L, K): the 1-Mem term log p_k(s_i) of every position i
        if two_point:
            loglik[:, 1:] = log_T[s[:, 1:], s[:, :-1]]  # the 2-Mem term log T_k[s_i, s_{i-1}] after s_0
        posterior = torch.softmax(loglik.cumsum(1), -1)  # (b, L, K): P(k | s_0..s_n), uniform prior over S
        for mu in range(C):  # the positions whose current state is mu mix the columns T_k[:, mu]
            at = now == mu
            pred[at] = posterior[at] @ T[:, :, mu]  # (m, K) @ (K, C)
    return out.log()


def one_mem(seqs: torch.Tensor, T: torch.Tensor) -> torch.Tensor:
    """1-Mem: posterior over the chains of T from prod_i p_k(s_i). Returns (B, L, C)."""
    return _memorizing(seqs, T, two_point=False)


def two_mem(seqs: torch.Tensor, T: torch.Tensor) -> torch.Tensor:
    """2-Mem: posterior over the chains of T from p_k(s_0) prod_i T_k[s_i, s_{i-1}]. Returns (B, L, C)."""
    return _memorizing(seqs, T, two_point=True)


def mixed_mem(post_seqs: torch.Tensor, state_seqs: torch.Tensor, T: torch.Tensor, two_point: bool = True) -> torch.Tensor:
    """The memorizing predictor with its two inputs taken from different sequences (Appendix "Patching"):
    out[:, n] = sum_k P(k | post_seqs[:, :n+1]) T_k[:, state_seqs[:, n]], with the 2-Mem likelihood (or
    the 1-Mem one if not two_point). Equal to two_mem / one_mem when both are the same. Returns (B, L, C)."""
    return _memorizing(post_seqs, T, two_point, state_seqs)


def predict(name: str, seqs: torch.Tensor, T: torch.Tensor) -> torch.Tensor:
    """Log-probabilities of the predictor `name` in PREDICTORS; T is the task set's chains."""
    if name == "1gen":
        return one_gen(seqs, T.shape[-1], T.dtype)
    if name == "2gen":
        return two_gen(seqs, T.shape[-1], T.dtype)
    if name == "1mem":
        return one_mem(seqs, T)
    if name == "2mem":
        return two_mem(seqs, T)
    raise KeyError(name)


# ----------------------------------------------------------------------------- losses


def nll(logp: torch.Tensor, seqs: torch.Tensor) -> torch.Tensor:
    """Per-position negative log-likelihood of the next state, (B, L - 1): -log logp[:, n, s_{n+1}].

    logp is (B, L, C) (a predictor on all of seqs) or (B, L - 1, C) (a model fed seqs[:, :-1])."""
    return -logp[:, : seqs.shape[1] - 1].gather(2, seqs[:, 1:, None].to(logp.device)).squeeze(2)


def ar_loss(logp: torch.Tensor, seqs: torch.Tensor) -> torch.Tensor:
    """Autoregressive loss: mean NLL of s_{n+1} over the L - 1 positions that have a target."""
    return nll(logp, seqs).mean()


def kl_div(logp: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
    """D_KL^{S_N}(p || q) (Appendix "Behavioral readouts"): the KL divergence between two
    predictors' next-state distributions, averaged over positions and sequences. logp, logq:
    (B, L, C) aligned position by position (slice a predictor's [:, :-1] to match a model)."""
    terms = logp.exp() * (logp - logq)
    return torch.where(logp == -math.inf, 0.0, terms).sum(-1).mean()


def asymptotic_loss_1gen(T: torch.Tensor) -> torch.Tensor:
    """L^{1-Gen} = -< sum_tau p_tau log p_tau > over the chains T (K, C, C)."""
    p = stationary(T)
    return -torch.special.xlogy(p, p).sum(-1).mean()


def asymptotic_loss_2gen(T: torch.Tensor) -> torch.Tensor:
    """L^{2-Gen} = -< sum_{mu, tau} p_mu T_{tau mu} log T_{tau mu} > over the chains T (K, C, C)."""
    p = stationary(T)
    return -(p[:, None, :] * torch.special.xlogy(T, T)).sum((-2, -1)).mean()
