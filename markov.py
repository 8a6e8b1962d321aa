"""Random Markov chains and the sequences they emit (Appendix "Data generation").

Convention of the paper: T[tau, mu] = P(mu -> tau), so every *column* of a transition matrix
is a distribution over the next state. The ensemble D_T draws each column i.i.d. from a
symmetric Dirichlet(alpha) (alpha = 1, C = 10 states). A task set S holds K chains drawn once
from D_T; training sequences come from a chain of S chosen uniformly, out-of-distribution
("generalization") sequences each from a fresh chain of D_T. A sequence starts from the
chain's stationary distribution p (T p = p), and each later state is drawn from the column of
the previous one: the sampler is a loop over positions (`_sample_from`). The engine's
fastdata.batches draws the same sequences from the same random numbers, faster.

Every random draw takes an explicit torch.Generator; nothing touches the global RNG.
"""
import math
from dataclasses import dataclass

import torch

# ----------------------------------------------------------------------------- chains


def _sample_gamma(alpha: float, n: int, generator, device) -> torch.Tensor:
    """n draws of Gamma(alpha, 1) by Marsaglia & Tsang's rejection method.

    torch's own gamma sampler takes no generator, so we build it from normal and uniform
    draws; for alpha < 1 we use Gamma(alpha) = Gamma(alpha + 1) * U^(1 / alpha)."""
    a = alpha + 1.0 if alpha < 1 else alpha
    d = a - 1.0 / 3.0
    c = 1.0 / (9.0 * d) ** 0.5
    out = torch.empty(n, device=device, dtype=torch.float64)
    todo = torch.arange(n, device=device)
    while todo.numel():
        x = torch.randn(todo.numel(), generator=generator, device=device, dtype=torch.float64)
        u = torch.rand(todo.numel(), generator=generator, device=device, dtype=torch.float64)
        v = (1 + c * x) ** 3
        ok = (v > 0) & (u.log() < 0.5 * x * x + d - d * v + d * v.clamp_min(1e-300).log())
        out[todo[ok]] = d * v[ok]
        todo = todo[~ok]
    if alpha < 1:
        u = torch.rand(n, generator=generator, device=device, dtype=torch.float64)
        out = out * u ** (1.0 / alpha)
    return out


def sample_chains(K: int, C: int = 10, alpha: float = 1.0, generator=None, device=None) -> torch.Tensor:
    """K transition matrices from D_T, shape (K, C, C), columns ~ Dirichlet(alpha) (float32).

    Draws happen on `device` (default: the generator's device, else the CPU)."""
    check_int("K", K, 1)
    check_int("C", C, 2)
    if not isinstance(alpha, (int, float)) or not alpha > 0:
        raise ValueError(f"alpha must be > 0, got {alpha!r}")
    if device is None:
        device = generator.device if generator is not None else torch.device("cpu")
    g = _sample_gamma(float(alpha), K * C * C, generator, device).view(K, C, C)
    return (g / g.sum(1, keepdim=True)).float()  # normalize each column (over tau)


def stationary(T: torch.Tensor) -> torch.Tensor:
    """Stationary distributions p (T p = p, sum p = 1) of T (..., C, C), shape (..., C).

    Solved exactly in float64: the last equation of (T - I) p = 0 is replaced by sum p = 1."""
    check_chains(T)
    C = T.shape[-1]
    A = T.double() - torch.eye(C, dtype=torch.float64, device=T.device)
    A[..., -1, :] = 1.0
    b = torch.zeros(*T.shape[:-1], dtype=torch.float64, device=T.device)
    b[..., -1] = 1.0
    p = torch.linalg.solve(A, b)
    return p.clamp_min(0).to(T.dtype)


# ----------------------------------------------------------------------------- sequences


def inverse_cdf(cdf: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """State = number of cdf entries <= u (inverse-CDF sampling); cdf (..., C), u (..., n)."""
    return torch.searchsorted(cdf.contiguous(), u.contiguous(), right=True).clamp_max_(cdf.shape[-1] - 1)


def uniforms(n: int, length: int, generator, dtype, device) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The random numbers of n sequences, in the order they are drawn: u0 (n, 1) for the first states, then
    u (block, nb, n) for positions 1..length-1 (None when length = 1); position t = k * block + j + 1 takes u[j, k],
    block ~ sqrt(length - 1)."""
    u0 = torch.rand(n, 1, generator=generator, device=device, dtype=dtype)
    if length == 1:
        return u0, None
    # blocks of ~sqrt(L) positions, the layout of engine/fastdata.py's scan: so its sequences are these, bit for bit
    block = max(1, round((length - 1) ** 0.5))
    nb = -(-(length - 1) // block)  # blocks; the last one may run past the end (its extra uniforms go unused)
    return u0, torch.rand(block, nb, n, generator=generator, device=device, dtype=dtype)


def _sample_from(Tb: torch.Tensor, p: torch.Tensor, length: int, generator=None) -> torch.Tensor:
    """Sequences (n, length) from the validated chains Tb (n, C, C) with stationary distributions p (n, C):
    s_0 by inverse-CDF sampling of p, then s_t by inverse-CDF sampling of column s_{t-1} of the chain."""
    n = Tb.shape[0]
    u0, u = uniforms(n, length, generator, p.dtype, Tb.device)
    seqs = torch.empty(n, length, dtype=torch.long, device=Tb.device)
    seqs[:, 0] = inverse_cdf(p.cumsum(-1), u0)[:, 0]
    if length == 1:
        return seqs
    u = u.transpose(0, 1).reshape(-1, n, 1)  # (nb * block, n, 1): u[t - 1] is position t's
    cdf = Tb.cumsum(1)  # (n, C_tau, C_mu): cdf[b, :, mu] is the CDF of column mu
    rows = torch.arange(n, device=Tb.device)
    for t in range(1, length):
        seqs[:, t] = inverse_cdf(cdf[rows, :, seqs[:, t - 1]], u[t - 1])[:, 0]  # cdf[...]: (n, C)
    return seqs


def sample_sequences(T: torch.Tensor, n: int, length: int, generator=None, chain_idx=None):
    """n sequences of `length` states from the chains T (K, C, C).

    Each sequence uses chain chain_idx[b] (default: uniform over the K chains) and starts
    from that chain's stationary distribution. Returns (seqs (n, length) long, chain_idx (n,))."""
    check_chains(T)
    check_int("n", n, 1)
    check_int("length", length, 1)
    K = T.shape[0]
    device = T.device
    if chain_idx is None:
        chain_idx = torch.randint(K, (n,), generator=generator, device=device)
    else:
        chain_idx = torch.as_tensor(chain_idx, device=device).long()
        if chain_idx.shape != (n,) or chain_idx.min() < 0 or chain_idx.max() >= K:
            raise ValueError(f"chain_idx must have shape ({n},) with entries in [0, {K})")
    Tb = T[chain_idx]  # (n, C, C)
    return _sample_from(Tb, stationary(Tb), length, generator), chain_idx


def ablate_bias(seqs: torch.Tensor, p: torch.Tensor, generator=None) -> torch.Tensor:
    """Bias ablation (Sec. "Ablating the first-order contribution in delta").

    seqs (n, N + 1) holds a context s_1..s_N followed by its target s_{N+1}; returns a copy in
    which s_{N-1} (the context's second-to-last state, seqs[:, -3]) is redrawn from the chain's
    stationary distribution p (n, C), independently of its neighbours. This removes the
    short-range correlation between s_{N-1} and s_{N+1} (the F_1 bias); it also breaks the two transitions
    into and out of s_{N-1}, which the 2-point statistics of the rest of the sequence hardly feel."""
    if seqs.dim() != 2 or seqs.shape[1] < 3:
        raise ValueError("seqs must be (n, N + 1) with N >= 2 for the bias ablation")
    if p.shape != (seqs.shape[0], p.shape[-1]):
        raise ValueError(f"p must have shape ({seqs.shape[0]}, C), got {tuple(p.shape)}")
    out = seqs.clone()
    u = torch.rand(seqs.shape[0], 1, generator=generator, device=seqs.device, dtype=p.dtype)
    out[:, -3] = inverse_cdf(p.cumsum(-1), u)[:, 0]
    return out


def fresh_sequences(n: int, length: int, C: int, alpha: float = 1.0, generator=None, device=None):
    """n sequences, each from its own fresh chain of D_T: (seqs (n, length), T_fresh (n, C, C))."""
    T = sample_chains(n, C, alpha, generator, device=device)
    seqs, _ = sample_sequences(T, n, length, generator, chain_idx=torch.arange(n, device=T.device))
    return seqs, T


# ----------------------------------------------------------------------------- task sets

CHAIN_BLOCK = 64  # chains are drawn in blocks from one stream, so S(K) is a prefix of S(K') for K < K'


@dataclass
class TaskSet:
    """The K training chains S with their stationary distributions (Appendix "Data generation"; the distributions
    enter the memorizing predictors, Appendix "Phase Identification").

    Nested: for a fixed seed, the chains at K are the first K chains at every K' > K."""

    T: torch.Tensor  # (K, C, C) transition matrices, T[k, tau, mu] = P(mu -> tau)
    p: torch.Tensor  # (K, C) stationary distributions
    alpha: float = 1.0

    @classmethod
    def create(cls, K: int, C: int = 10, alpha: float = 1.0, seed: int = 0, device=None) -> "TaskSet":
        check_int("K", K, 1)
        g = torch.Generator().manual_seed(seed)
        blocks = [sample_chains(CHAIN_BLOCK, C, alpha, g) for _ in range(-(-K // CHAIN_BLOCK))]
        T = torch.cat(blocks)[:K].to(device)
        return cls(T=T, p=stationary(T), alpha=alpha)

    @property
    def K(self) -> int:
        return self.T.shape[0]

    @property
    def C(self) -> int:
        return self.T.shape[-1]

    def batch(self, n: int, length: int, generator=None):
        """Sequences from chains of S: (seqs (n, length), chain_idx (n,)). The same draws as
        sample_sequences(self.T, n, length, generator), reusing the stored (validated) chains and p."""
        check_int("n", n, 1)
        check_int("length", length, 1)
        chain_idx = torch.randint(self.K, (n,), generator=generator, device=self.T.device)
        return _sample_from(self.T[chain_idx], self.p[chain_idx], length, generator), chain_idx

    def gen_batch(self, n: int, length: int, generator=None):
        """Out-of-distribution sequences, each from a fresh chain of D_T: (seqs, T_fresh (n, C, C))."""
        return fresh_sequences(n, length, self.C, self.alpha, generator, self.T.device)


@dataclass
class FreshChains:
    """K = infinity (Appendix "Transience and Partial Memorization"): every training sequence comes from its
    own fresh chain of D_T, so no chain is seen twice and there is nothing to memorize; the paper trains such
    models to calibrate the memorization threshold epsilon. The sampling interface of TaskSet, with S empty:
    T is (0, C, C), batch() draws like gen_batch() and returns the chain index -1 (no chain of S)."""

    C: int = 10
    alpha: float = 1.0
    device: torch.device | str | None = None

    @property
    def T(self) -> torch.Tensor:
        return torch.empty(0, self.C, self.C, device=self.device)

    @property
    def K(self) -> float:
        return math.inf

    def batch(self, n: int, length: int, generator=None):
        """(seqs (n, length), chain_idx (n,) = -1): n sequences, each from a fresh chain."""
        seqs, _ = self.gen_batch(n, length, generator)
        return seqs, torch.full((n,), -1, dtype=torch.long, device=seqs.device)

    def gen_batch(self, n: int, length: int, generator=None):
        """Out-of-distribution sequences, each from a fresh chain of D_T: (seqs, T_fresh (n, C, C))."""
        return fresh_sequences(n, length, self.C, self.alpha, generator, self.device)


def task_source(K: int | float, C: int = 10, alpha: float = 1.0, seed: int = 0, device=None) -> TaskSet | FreshChains:
    """The training distribution of a run: the task set S of K chains, or fresh chains for K = inf."""
    if K == math.inf:
        return FreshChains(C, alpha, device)
    return TaskSet.create(K, C, alpha, seed, device)


# ----------------------------------------------------------------------------- validation of the arguments above


def check_int(name: str, value, minimum: int) -> int:
    """One-line ValueError naming the argument unless `value` is an int >= minimum.
    The argument check of markov's and bayes' functions and of train.Config; scripts check flags with cli.at_least."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


def check_chains(T: torch.Tensor, name: str = "T") -> torch.Tensor:
    """T must be (..., C, C), C >= 2, non-negative, with columns summing to one."""
    if not isinstance(T, torch.Tensor) or T.dim() < 2 or T.shape[-1] != T.shape[-2]:
        shape = tuple(T.shape) if isinstance(T, torch.Tensor) else type(T).__name__
        raise ValueError(f"{name} must have shape (..., C, C), got {shape}")
    if T.shape[-1] < 2:
        raise ValueError(f"{name} must have C >= 2 states, got C = {T.shape[-1]}")
    if not T.is_floating_point() or (T < 0).any() or not torch.allclose(
        T.sum(-2), torch.ones((), dtype=T.dtype, device=T.device), atol=1e-4
    ):
        raise ValueError(f"{name} must be column-stochastic (T[tau, mu] = P(mu -> tau), columns sum to 1)")
    return T


def check_seqs(seqs: torch.Tensor, C: int, name: str = "seqs") -> torch.Tensor:
    """seqs must be a (B, L) integer tensor with states in [0, C)."""
    if not isinstance(seqs, torch.Tensor) or seqs.dim() != 2 or seqs.shape[1] < 1:
        raise ValueError(f"{name} must be a (B, L) tensor with L >= 1")
    if seqs.is_floating_point() or seqs.is_complex():
        raise ValueError(f"{name} must hold integer states, got dtype {seqs.dtype}")
    if seqs.numel() and (seqs.min() < 0 or seqs.max() >= C):
        raise ValueError(f"{name} has states outside [0, {C})")
    return seqs.long()
