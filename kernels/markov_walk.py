"""The Markov chain sampler's walk in Triton (Appendix "Data generation"): positions 1..L-1 of n sequences, each
program walking a tile of sequences along its chain, position after position.

    s_t = #{tau < C - 1 : cdf[b, tau, s_{t-1}] <= u_t}      cdf[b] = T_b cumulated over tau (columns mu)

which is inverse-CDF sampling of column s_{t-1} of sequence b's chain: the state markov.py's loop and
fastdata.walk' scan draw from the same uniforms, bit for bit (both compare the same cumulated numbers with
the same uniforms; nothing is rounded differently).

Why: fastdata.walk runs the walk as a sqrt(L)-depth scan of small torch operations, ~150 launches for the
paper's L = 257. Inside the training step's CUDA graph each still costs a few microseconds, about a third of a
single run's step. Here one launch walks every sequence, a thread per sequence: at each position it loads the
C - 1 counted entries of column s_{t-1} (its table, C^2 numbers, stays in the L1 cache after the first steps), all
at once, and counts those <= u_t. The serial chain of L - 1 positions costs one cached load's latency and C - 1
compares per position (C is a compile-time constant: the loads unrolled, no shuffles); the uniforms do not
depend on the walk, and each loads one position ahead.

The uniforms come in markov.uniforms' layout, u (block, nb, n): position t = k * block + j + 1 takes u[j, k, b].
"""
import torch

try:
    import triton
    import triton.language as tl
except ImportError:
    triton = None

BLOCK_N = 32  # sequences per program (one warp: the walk is latency-bound, so small programs, many of them)


if triton is not None:

    @triton.jit
    def _walk_kernel(CDF, S0, U, SEQS, n, length, block, nb, C: tl.constexpr, BLOCK_N: tl.constexpr):
        rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)  # a thread per sequence
        live = rows < n
        table = CDF + rows.to(tl.int64) * C * C  # cdf[b, tau, mu] at b C^2 + tau C + mu
        s = tl.load(S0 + rows, mask=live, other=0)
        out = SEQS + rows.to(tl.int64) * length
        tl.store(out, s, mask=live)
        # position 1's uniform, u[0, 0]; masks are blocks, never a block and a scalar (Triton 3.9's interpreter
        # rejects the mixed ones)
        u = tl.load(U + rows, mask=live & (tl.full([BLOCK_N], 1, tl.int32) < length), other=0.0)
        for t in range(1, length):
            # position t + 1's uniform (u[t % block, t // block]) loads while position t is drawn: the walk does
            # not wait for it
            u_next = tl.load(U + ((t % block) * nb + t // block).to(tl.int64) * n + rows,
                             mask=live & (tl.full([BLOCK_N], t + 1, tl.int32) < length), other=0.0)
            # the C - 1 counted entries of column s_{t-1}, each a load of its own, all issued at once; the last
            # entry is never counted (inverse_cdf clamps to C - 1)
            count = tl.zeros([BLOCK_N], tl.int32)
            for tau in tl.static_range(C - 1):
                count += (tl.load(table + tau * C + s, mask=live, other=2.0) <= u).to(tl.int32)
            s = count.to(s.dtype)
            tl.store(out + t, s, mask=live)
            u = u_next


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
                                             block, nb, C=C, BLOCK_N=BLOCK_N, num_warps=1)
    return seqs
