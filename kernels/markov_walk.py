"""The Markov chain sampler's walk in Triton (Appendix "Data generation"): positions 1..L-1 of n sequences, each
program walking a tile of sequences along its chain, position after position.

    s_t = #{tau < C - 1 : cdf[b, tau, s_{t-1}] <= u_t}      cdf[b] = T_b cumulated over tau (columns mu)

which is inverse-CDF sampling of column s_{t-1} of sequence b's chain: the state markov.py's loop and
fastdata._states' scan draw from the same uniforms, bit for bit (both compare the same cumulated numbers with
the same uniforms; nothing is rounded differently).

Why: fastdata._states runs the walk as a sqrt(L)-depth scan of small torch operations, ~150 launches for the
paper's L = 257. Inside the training step's CUDA graph each still costs a few microseconds, about a third of a
single run's step. Here one launch walks every sequence: a program keeps its tile's C x C cumulated tables in
registers and picks column s_{t-1} by a compare against a one-hot mask, so the serial chain of L - 1
positions never waits on memory; the uniforms of the next position do not depend on the walk and load ahead.

The uniforms come in markov.uniforms' layout, u (block, nb, n): position t = k * block + j + 1 takes u[j, k, b].
"""
import torch

try:
    import triton
    import triton.language as tl
except ImportError:
    triton = None

BLOCK_N = 16  # sequences per program: their tables, BLOCK_N x 16 x 16 numbers, stay in registers


if triton is not None:

    @triton.jit
    def _walk_kernel(CDF, S0, U, SEQS, n, length, block, nb, C, BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr):
        rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        mu = tl.arange(0, BLOCK_C)  # the previous state (column)
        tau = tl.arange(0, BLOCK_C)  # the entry of the column's CDF
        live = rows < n
        # cdf[b, tau, mu] at b C^2 + tau C + mu, held as [b, mu, tau]; the last entry (tau = C - 1) and the
        # padding read as 2 > any uniform, so that they are never counted
        where = rows[:, None, None].to(tl.int64) * C * C + tau[None, None, :] * C + mu[None, :, None]
        keep = live[:, None, None] & (mu[None, :, None] < C) & (tau[None, None, :] < C - 1)
        cdf = tl.load(CDF + where, mask=keep, other=2.0)
        s = tl.load(S0 + rows, mask=live, other=0)
        out = SEQS + rows.to(tl.int64) * length
        tl.store(out, s, mask=live)
        for t in range(1, length):
            i = t - 1
            u = tl.load(U + ((i % block) * nb + i // block).to(tl.int64) * n + rows, mask=live, other=0.0)
            hit = (mu[None, :, None] == s[:, None, None]) & (cdf <= u[:, None, None])
            s = tl.sum(tl.sum(hit.to(tl.int32), 2), 1).to(s.dtype)
            tl.store(out + t, s, mask=live)


def walk(cdf: torch.Tensor, s0: torch.Tensor, u: torch.Tensor, length: int) -> torch.Tensor:
    """Sequences (n, length), int64: s0 (n,) int64 the first states, then the walk through the chains' cumulated
    columns cdf (n, C, C) (cdf[b, tau, mu] = sum over tau' <= tau of T_b[tau', mu]) with the uniforms u
    (block, nb, n) of markov.uniforms (block * nb >= length - 1), cdf and u of one floating dtype. C <= 16."""
    if triton is None:
        raise RuntimeError("the Markov walk kernel needs triton")
    n, C = cdf.shape[0], cdf.shape[-1]
    if (cdf.shape != (n, C, C) or s0.shape != (n,) or s0.dtype != torch.int64 or u.dim() != 3 or u.shape[2] != n
            or u.shape[0] * u.shape[1] < length - 1 or u.dtype != cdf.dtype or not cdf.is_floating_point() or C > 16):
        raise ValueError(f"walk takes cdf (n, C, C) with C <= 16, s0 (n,) int64 and u (block, nb, n) of cdf's dtype "
                         f"covering length - 1 = {length - 1} positions, got {tuple(cdf.shape)} {cdf.dtype}, "
                         f"{tuple(s0.shape)} {s0.dtype}, {tuple(u.shape)} {u.dtype}")
    seqs = torch.empty(n, length, dtype=torch.int64, device=cdf.device)
    block, nb = u.shape[:2]
    _walk_kernel[(triton.cdiv(n, BLOCK_N),)](cdf.contiguous(), s0.contiguous(), u.contiguous(), seqs, n, length,
                                             block, nb, C, BLOCK_N=BLOCK_N, BLOCK_C=16)
    return seqs
