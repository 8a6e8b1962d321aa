"""Random Markov chains and the sequences they emit (Appendix "Data generation").

Convention of the paper: T[tau, mu] = P(mu -> tau), so every *column* of a transition matrix
is a distribution over the next state. The ensemble D_T draws each column i.i.d. from a
symmetric Dirichlet(alpha) (alpha = 1, C = 10 states). A task set S holds K chains drawn once
from D_T; training sequences come from a chain of S chosen uniformly, out-of-distribution
("generalization") sequences each from a fresh chain of D_T. A sequence starts from the
chain's stationary distribution p (T p = p).

Every random draw takes an explicit torch.Generator; nothing touches the global RNG.
"""
import math
from dataclasses import dataclass

import torch

# ----------------------------------------------------------------------------- validation


def check_int(name: str, value, minimum: int) -> int:
    """One-line ValueError naming the argument unless `value` is an int >= minimum."""
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


def _inverse_cdf(cdf: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """State = number of cdf entries <= u (inverse-CDF sampling); cdf (..., C), u (..., n)."""
    return torch.searchsorted(cdf.contiguous(), u.contiguous(), right=True).clamp_max_(cdf.shape[-1] - 1)


def sample_sequences(T: torch.Tensor, n: int, length: int, generator=None, chain_idx=None):
    """n sequences of `length` states from the chains T (K, C, C).

    Each sequence uses chain chain_idx[b] (default: uniform over the K chains) and starts
    from that chain's stationary distribution. Returns (seqs (n, length) long, chain_idx (n,)).

    All positions are drawn at once: with one uniform u_t per position, step t is a fixed map
    f_t: {0..C-1} -> {0..C-1} (inverse CDF of column mu at u_t), and s_t = f_t o ... o f_1 (s_0);
    the prefix compositions come from a blocked scan over positions (`_compose`)."""
    check_chains(T)
    check_int("n", n, 1)
    check_int("length", length, 1)
    K, C = T.shape[0], T.shape[-1]
    device = T.device
    if chain_idx is None:
        chain_idx = torch.randint(K, (n,), generator=generator, device=device)
    else:
        chain_idx = torch.as_tensor(chain_idx, device=device).long()
        if chain_idx.shape != (n,) or chain_idx.min() < 0 or chain_idx.max() >= K:
            raise ValueError(f"chain_idx must have shape ({n},) with entries in [0, {K})")
    Tb = T[chain_idx]  # (n, C, C)
    return _sample_from(Tb, stationary(Tb), length, generator), chain_idx


def _sample_from(Tb: torch.Tensor, p: torch.Tensor, length: int, generator=None) -> torch.Tensor:
    """Sequences (n, length) from the validated chains Tb (n, C, C) with stationary distributions p (n, C)."""
    return _states(Tb, p, *_uniforms(Tb.shape[0], length, generator, p.dtype, Tb.device), length)


def _scan_layout(length: int) -> tuple[int, int]:
    """Positions 1..length-1 laid out as (block, nb) for the scan of `_compose`: block ~ sqrt(length)."""
    block = max(1, round((length - 1) ** 0.5))
    return block, -(-(length - 1) // block)


def _uniforms(n: int, length: int, generator, dtype, device) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The random numbers of n sequences, in the order they are drawn: u0 (n, 1) for the first states,
    then u (block, nb, n, 1), one per later position (None when length = 1)."""
    u0 = torch.rand(n, 1, generator=generator, device=device, dtype=dtype)
    if length == 1:
        return u0, None
    return u0, torch.rand(*_scan_layout(length), n, 1, generator=generator, device=device, dtype=dtype)


def _states(Tb: torch.Tensor, p: torch.Tensor, u0: torch.Tensor, u: torch.Tensor | None, length: int) -> torch.Tensor:
    """The sequences (n, length) that the uniforms of `_uniforms` pick from the chains Tb (n, C, C), p (n, C)."""
    n, C = Tb.shape[0], Tb.shape[-1]
    s0 = _inverse_cdf(p.cumsum(-1), u0)  # (n, 1)
    if u is None:
        return s0
    # Position k * block + j + 1 sits at [j, k]. step[j, k, b, mu] is the state there when the previous
    # position holds mu: the inverse CDF of column mu at one uniform u[j, k, b] (= the number of cdf
    # entries <= u).
    block, nb = u.shape[:2]
    cdf = Tb.cumsum(1).transpose(0, 1).contiguous()  # (C_tau, n, C_mu)
    u = u.expand(block, nb, n, C).contiguous()  # compares that broadcast only the leading axes run faster
    step = torch.zeros(block, nb, n, C, dtype=torch.uint8, device=Tb.device)
    for tau in range(C - 1):  # cheaper than one broadcast compare summed over a short last axis
        step += (cdf[tau] <= u).view(torch.uint8)
    return _compose(s0[:, 0], step)[:, :length]


def _compose(s0: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
    """States s_t = step_t o ... o step_1 (s_0) for s0 (n,) and per-position maps step (block, nb, n, C)
    of any integer dtype.

    Depth ~3 sqrt(L) instead of L, each step vectorized over blocks and sequences: (1) every block's
    whole map, for all blocks at once (block - 1 compositions of C-entry maps); (2) the state entering
    each block, carried from block to block (nb - 1 steps); (3) the states inside all blocks, run
    forward from their entry states (block steps on single states). Only (1) touches whole maps, and it
    keeps one (nb, n, C) map, not one per position. Returns (n, 1 + nb * block)."""
    block, nb, n, C = step.shape
    whole = step[0].long()  # (nb, n, C): block entry -> position j of the block
    for j in range(1, block):
        whole = step[j].gather(2, whole).long()
    start = s0.new_empty(nb, n, 1)  # state entering each block
    start[0, :, 0] = s0
    for k in range(1, nb):
        start[k] = whole[k - 1].gather(1, start[k - 1])
    inside = s0.new_empty(n, nb, block)
    s = start
    for j in range(block):
        s = step[j].gather(2, s).long()
        inside[:, :, j] = s[..., 0].T
    return torch.cat([s0[:, None], inside.reshape(n, nb * block)], 1)


def ablate_bias(seqs: torch.Tensor, p: torch.Tensor, generator=None) -> torch.Tensor:
    """Bias ablation (Sec. "Ablating the first-order contribution in delta").

    seqs (n, N + 1) holds a context s_1..s_N followed by its target s_{N+1}; returns a copy in
    which s_{N-1} (the context's second-to-last state, seqs[:, -3]) is redrawn from the chain's
    stationary distribution p (n, C), independently of its neighbours. This removes the
    short-range correlation between s_{N-1} and s_{N+1} (the F_1 bias) and nothing else."""
    if seqs.dim() != 2 or seqs.shape[1] < 3:
        raise ValueError("seqs must be (n, N + 1) with N >= 2 for the bias ablation")
    if p.shape != (seqs.shape[0], p.shape[-1]):
        raise ValueError(f"p must have shape ({seqs.shape[0]}, C), got {tuple(p.shape)}")
    out = seqs.clone()
    u = torch.rand(seqs.shape[0], 1, generator=generator, device=seqs.device, dtype=p.dtype)
    out[:, -3] = _inverse_cdf(p.cumsum(-1), u)[:, 0]
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
    """The K training chains S with their stationary distributions (Appendix "Phase Identification").

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


def batches(sources: list, n: int, length: int, generators: list) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch from each of E task sources at once: (seqs (E, n, length), chain_idx (E, n)), member e's being
    exactly sources[e].batch(n, length, generators[e]). Each member's random numbers are drawn from its own
    generator in the order batch() draws them, its chains looked up in its own task set; the work after
    that (inverse CDFs, the scan) is batched over the members, one launch per operation instead of E. This is how an ensemble
    samples its step (train.py), where E separate batch() calls cost more than the step itself.
    K = inf sources draw their chains by rejection, so a list with one goes member by member."""
    if len(generators) != len(sources):
        raise ValueError(f"batches() needs one generator per source, got {len(generators)} for {len(sources)}")
    if not all(isinstance(t, TaskSet) for t in sources):
        return tuple(torch.stack(x) for x in zip(*(t.batch(n, length, g) for t, g in zip(sources, generators))))
    check_int("n", n, 1)
    check_int("length", length, 1)
    if len({(t.C, t.T.device, t.p.dtype) for t in sources}) != 1:
        raise ValueError("batches() needs task sets with one number of states C, one device and one dtype")
    chain_idx, T, p, u0, u = [], [], [], [], []
    for t, g in zip(sources, generators):
        chain_idx.append(torch.randint(t.K, (n,), generator=g, device=t.T.device))
        T.append(t.T[chain_idx[-1]])  # per member: concatenating all members' chains would copy them every step
        p.append(t.p[chain_idx[-1]])
        first, later = _uniforms(n, length, g, t.p.dtype, t.T.device)
        u0.append(first)
        u.append(later)
    u = torch.cat(u, 2) if length > 1 else None  # (block, nb, E n, 1): sequence e n + b, as T and p
    return _states(torch.cat(T), torch.cat(p), torch.cat(u0), u, length).view(len(sources), n, length), torch.stack(chain_idx)
