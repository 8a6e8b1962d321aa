"""The engine's data path: the fast sampler.

It computes exactly what its plain twin on the reader's path computes (tests/test_markov.py pins them
equal), only faster:

    batches(sources, n, length, generators)   the batches of E task sources at once, member e's the
                                              sequences of sources[e].batch(n, length, generators[e]),
                                              bit for bit: markov.py's loop over positions, run as a
                                              sqrt(L)-depth scan and batched over the members

train.py's ensembles sample through `batches` (E separate batch() calls cost more than the step itself).
"""
import torch

from markov import TaskSet, check_int, inverse_cdf, uniforms

# ----------------------------------------------------------------------------- sampler


def _states(Tb: torch.Tensor, p: torch.Tensor, u0: torch.Tensor, u: torch.Tensor | None, length: int) -> torch.Tensor:
    """markov._sample_from's sequences (n, length) from the chains Tb (n, C, C), p (n, C) and the uniforms
    u0 (n, 1), u (block, nb, n) of markov.uniforms, all positions at once.

    With one uniform per position, step t is a fixed map f_t: {0..C-1} -> {0..C-1} (the inverse CDF of
    column mu at u_t), and s_t = f_t o ... o f_1 (s_0): `_compose` runs that as a blocked scan."""
    n, C = Tb.shape[0], Tb.shape[-1]
    s0 = inverse_cdf(p.cumsum(-1), u0)  # (n, 1)
    if u is None:
        return s0
    # Position k * block + j + 1 sits at [j, k]. step[j, k, b, mu] is the state there when the previous
    # position holds mu: the number of entries <= u[j, k, b] among the first C - 1 of column mu's CDF.
    block, nb = u.shape[:2]
    cdf = Tb.cumsum(1).transpose(0, 1).contiguous()  # (C_tau, n, C_mu)
    u = u[..., None].expand(block, nb, n, C).contiguous()  # compares that broadcast only the leading axes run faster
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


def batches(sources: list, n: int, length: int, generators: list) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch from each of E task sources at once: (seqs (E, n, length), chain_idx (E, n)), member e's being
    exactly sources[e].batch(n, length, generators[e]). Each member's random numbers are drawn from its own
    generator in the order batch() draws them, its chains looked up in its own task set; the work after
    that (inverse CDFs, the scan) is batched over the members, one launch per operation instead of E.
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
        first, later = uniforms(n, length, g, t.p.dtype, t.T.device)
        u0.append(first)
        u.append(later)
    u = torch.cat(u, 2) if length > 1 else None  # (block, nb, E n): sequence e n + b, as T and p
    seqs = _states(torch.cat(T), torch.cat(p), torch.cat(u0), u, length)
    return seqs.view(len(sources), n, length), torch.stack(chain_idx)
