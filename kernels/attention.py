"""Fused causal relative-position attention in Triton: forward, backward, and the PyTorch oracle.

Causal softmax attention over q, k, v of shape (B, H, N, d) with the two relative-position
schemes the paper uses (Appendix "Network architecture", "Minimal Network for Generalization"):

  score(i, j) = <R_i q_i, R_j k_j> / sqrt(d) + bias[h, i - j]        for j <= i

where R_n is the rotary embedding at position n (interleaved pairs (2f, 2f + 1) rotated by the
angle n * 10000^(-2f/d); applied inside the kernels, so no rotated copies of q or k are stored)
and bias is a learned table P_{j-i} of shape (H, N). Either, both or neither may be used.

Layout, top to bottom as in the Triton fused-attention tutorial:
  forward kernel -> backward kernels (dk/dv, then dq with the bias gradient)
  -> torch.autograd.Function -> public `attention` -> readout helper -> PyTorch reference.

The bias gradient dbias[h, r] = sum_{b, i - j = r} dS[b, h, i, j] is a reduction along diagonals.
The dq kernel reduces each (BLOCK, BLOCK) tile of dS along its 2 BLOCK - 1 diagonals in registers
and writes the sums to a private slot per (tile, batch, head); a fixed-order torch sum then adds
the slots. Deterministic, and no atomics at all.

Every tl.dot tile is >= 16 in each dimension (d in {16, 32, 64, 128}, blocks >= 16), so code that
passes in the interpreter (TRITON_INTERPRET=1, the CPU tests) also compiles for a GPU.
"""
import math
import os

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # the model falls back to the reference; the kernel needs triton
    triton = None

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
ROTARY_BASE = 10000.0
# software-pipelining depth on GPUs: at 3 the fp32 forward with rotary and bias needs 240 KB of
# shared memory per block, over an H100/H200's 227 KB
STAGES = 2


def rotary_tables(N: int, d: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the rotary angles n * base^(-2f/d), each (N, d/2) in float32."""
    inv_freq = ROTARY_BASE ** (-torch.arange(0, d, 2, dtype=torch.float32, device=device) / d)
    angle = torch.arange(N, dtype=torch.float32, device=device)[:, None] * inv_freq[None, :]
    return angle.cos(), angle.sin()


def _kernel_rotary_tables(N: int, d: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernels' (N, d) tables, one entry per column so that tiles load contiguously:
    cos at both columns of a pair, and -sin, +sin at its first and second column."""
    cos, sin = rotary_tables(N, d, device)
    return cos.repeat_interleave(2, -1).contiguous(), torch.stack([-sin, sin], -1).reshape(N, d).contiguous()


if triton is not None:

    @triton.jit
    def _swap_pairs(x, BLOCK: tl.constexpr, D: tl.constexpr):
        """A (BLOCK, D) tile with the columns of each pair (2f, 2f + 1) exchanged."""
        x0, x1 = tl.split(tl.reshape(x, (BLOCK, D // 2, 2)))
        return tl.reshape(tl.join(x1, x0), (BLOCK, D))

    @triton.jit
    def _operand(x, DTYPE: tl.constexpr, UPCAST: tl.constexpr):
        """x rounded to the input dtype for a tensor-core dot (fp32 accumulation). The interpreter's
        bf16 dot multiplies raw bit patterns, so there the rounded values enter as fp32: the same
        products and sums."""
        x = x.to(DTYPE)
        if UPCAST:
            x = x.to(tl.float32)
        return x

    @triton.jit
    def _load_rows(ptr, offs, N, D: tl.constexpr):
        """Rows offs of a contiguous (N, D) matrix as fp32; rows past N read as zero."""
        offs_d = tl.arange(0, D)
        return tl.load(ptr + offs[:, None] * D + offs_d[None, :], mask=offs[:, None] < N, other=0.0).to(tl.float32)

    @triton.jit
    def _load_angles(Cos, Sin, offs, N, D: tl.constexpr):
        """Rows offs of the (N, D) tables cos and -+sin (_kernel_rotary_tables)."""
        offs_d = tl.arange(0, D)
        mask = offs[:, None] < N
        cos = tl.load(Cos + offs[:, None] * D + offs_d[None, :], mask=mask, other=1.0)
        sin = tl.load(Sin + offs[:, None] * D + offs_d[None, :], mask=mask, other=0.0)
        return cos, sin

    @triton.jit
    def _load_rotated(ptr, offs, N, Cos, Sin, ROTARY: tl.constexpr, D: tl.constexpr, DT: tl.constexpr,
                      UPCAST: tl.constexpr):
        """Rows offs of q or k, rotated to their own positions when ROTARY, as a dot operand.

        The rotation is written elementwise, x * cos + x_swapped * (-+sin), with x_swapped (each
        pair exchanged) loaded through the column index c ^ 1: Triton 3.6 cannot lay out a tile
        made by reshape and join (_swap_pairs) as a dot operand on sm_90 (a compiler error on an H200)."""
        x = _load_rows(ptr, offs, N, D)
        if ROTARY:
            offs_d = tl.arange(0, D)
            x_swapped = tl.load(ptr + offs[:, None] * D + (offs_d ^ 1)[None, :], mask=offs[:, None] < N,
                                other=0.0).to(tl.float32)
            cos, sin = _load_angles(Cos, Sin, offs, N, D)
            x = x * cos + x_swapped * sin
        return _operand(x, DT, UPCAST)

    @triton.jit
    def _unrotate(dx, Cos, Sin, offs, N, ROTARY: tl.constexpr, D: tl.constexpr, BLOCK: tl.constexpr):
        """The gradient with respect to the unrotated rows: the transpose rotation (angle -theta)."""
        if ROTARY:
            cos, sin = _load_angles(Cos, Sin, offs, N, D)
            dx = dx * cos - _swap_pairs(dx, BLOCK, D) * sin
        return dx

    @triton.jit
    def _scores(q, k, Bias, h, offs_m, offs_n, N, scale, HAS_BIAS: tl.constexpr):
        """Scores of a (BLOCK_M, BLOCK_N) tile with the causal mask (-inf where j > i or j >= N)."""
        s = tl.dot(q, tl.trans(k)) * scale
        rel = offs_m[:, None] - offs_n[None, :]  # i - j
        valid = (rel >= 0) & (offs_n[None, :] < N)
        if HAS_BIAS:
            s += tl.load(Bias + h * N + rel, mask=valid & (rel < N), other=0.0)
        return tl.where(valid, s, float("-inf")), valid

    # ------------------------------------------------------------------------- forward

    @triton.jit
    def _fwd_kernel(Q, K, V, Bias, Cos, Sin, Out, Lse, N, H, scale,
                    HAS_BIAS: tl.constexpr, ROTARY: tl.constexpr, D: tl.constexpr, UPCAST: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
        start_m = tl.program_id(0) * BLOCK_M
        bh = tl.program_id(1)
        h = bh % H
        Q += bh * N * D
        K += bh * N * D
        V += bh * N * D
        offs_m = start_m + tl.arange(0, BLOCK_M)
        DT: tl.constexpr = Q.dtype.element_ty
        q = _load_rotated(Q, offs_m, N, Cos, Sin, ROTARY, D, DT, UPCAST)

        m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)  # running max
        l_i = tl.zeros((BLOCK_M,), tl.float32)  # running normalizer
        acc = tl.zeros((BLOCK_M, D), tl.float32)
        for start_n in range(0, tl.minimum(start_m + BLOCK_M, N), BLOCK_N):
            offs_n = start_n + tl.arange(0, BLOCK_N)
            k = _load_rotated(K, offs_n, N, Cos, Sin, ROTARY, D, DT, UPCAST)
            v = _operand(_load_rows(V, offs_n, N, D), DT, UPCAST)
            s, _ = _scores(q, k, Bias, h, offs_m, offs_n, N, scale, HAS_BIAS)
            m_new = tl.maximum(m_i, tl.max(s, 1))
            p = tl.exp(s - m_new[:, None])
            alpha = tl.exp(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + tl.dot(_operand(p, DT, UPCAST), v)
            m_i = m_new
        offs_d = tl.arange(0, D)
        mask = offs_m < N
        tl.store(Out + bh * N * D + offs_m[:, None] * D + offs_d[None, :],
                 (acc / l_i[:, None]).to(Out.dtype.element_ty), mask=mask[:, None])
        tl.store(Lse + bh * N + offs_m, m_i + tl.log(l_i), mask=mask)

    # ------------------------------------------------------------------------- backward

    @triton.jit
    def _bwd_probs(q, k, v, do, lse, delta, Bias, h, offs_m, offs_n, N, scale, HAS_BIAS: tl.constexpr):
        """Recompute P = exp(S - lse) for a tile and dS = P (dP - delta) with dP = dO V^T."""
        s, valid = _scores(q, k, Bias, h, offs_m, offs_n, N, scale, HAS_BIAS)
        p = tl.where(valid, tl.exp(s - lse[:, None]), 0.0)
        dp = tl.dot(do, tl.trans(v))
        return p, p * (dp - delta[:, None])

    @triton.jit
    def _load_query_block(Q, DO, Lse, Delta, Cos, Sin, offset, bh, offs_m, N,
                          ROTARY: tl.constexpr, D: tl.constexpr, DT: tl.constexpr, UPCAST: tl.constexpr):
        """What both backward kernels read for a block of queries: rotated q, dO, lse and delta."""
        q = _load_rotated(Q + offset, offs_m, N, Cos, Sin, ROTARY, D, DT, UPCAST)
        do = _operand(_load_rows(DO + offset, offs_m, N, D), DT, UPCAST)
        lse = tl.load(Lse + bh * N + offs_m, mask=offs_m < N, other=0.0)
        delta = tl.load(Delta + bh * N + offs_m, mask=offs_m < N, other=0.0)
        return q, do, lse, delta

    @triton.jit
    def _bwd_dkdv_kernel(Q, K, V, Bias, Cos, Sin, DO, Lse, Delta, DK, DV, N, H, scale,
                         HAS_BIAS: tl.constexpr, ROTARY: tl.constexpr, D: tl.constexpr, UPCAST: tl.constexpr,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
        """One program per key block: dV = P^T dO and dK = dS^T Q / sqrt(d), summed over the query blocks."""
        start_n = tl.program_id(0) * BLOCK_N
        bh = tl.program_id(1)
        h = bh % H
        offset = bh * N * D
        offs_n = start_n + tl.arange(0, BLOCK_N)
        DT: tl.constexpr = Q.dtype.element_ty
        k = _load_rotated(K + offset, offs_n, N, Cos, Sin, ROTARY, D, DT, UPCAST)
        v = _operand(_load_rows(V + offset, offs_n, N, D), DT, UPCAST)
        dk = tl.zeros((BLOCK_N, D), tl.float32)
        dv = tl.zeros((BLOCK_N, D), tl.float32)
        for start_m in range((start_n // BLOCK_M) * BLOCK_M, N, BLOCK_M):
            offs_m = start_m + tl.arange(0, BLOCK_M)
            q, do, lse, delta = _load_query_block(Q, DO, Lse, Delta, Cos, Sin, offset, bh, offs_m, N,
                                                  ROTARY, D, DT, UPCAST)
            p, ds = _bwd_probs(q, k, v, do, lse, delta, Bias, h, offs_m, offs_n, N, scale, HAS_BIAS)
            dv += tl.dot(tl.trans(_operand(p, DT, UPCAST)), do)
            dk += tl.dot(tl.trans(_operand(ds, DT, UPCAST)), q)
        dk = _unrotate(dk * scale, Cos, Sin, offs_n, N, ROTARY, D, BLOCK_N)
        offs_d = tl.arange(0, D)
        mask = offs_n[:, None] < N
        tl.store(DK + offset + offs_n[:, None] * D + offs_d[None, :], dk.to(DK.dtype.element_ty), mask=mask)
        tl.store(DV + offset + offs_n[:, None] * D + offs_d[None, :], dv.to(DV.dtype.element_ty), mask=mask)

    @triton.jit
    def _bwd_dq_kernel(Q, K, V, Bias, Cos, Sin, DO, Lse, Delta, DQ, DBias, N, H, scale,
                       HAS_BIAS: tl.constexpr, ROTARY: tl.constexpr, D: tl.constexpr, UPCAST: tl.constexpr,
                       BLOCK: tl.constexpr):
        """One program per query block: dQ = dS K / sqrt(d), and the diagonal sums of every dS tile.

        Tile (m, n) holds i - j = (m - n) * BLOCK + t - (BLOCK - 1) at t = a - c + BLOCK - 1 for
        its local row a and column c; its 2 BLOCK diagonal sums (the last always 0) go to
        DBias[bh, m, n, :], a slot no other program writes."""
        pid_m = tl.program_id(0)
        start_m = pid_m * BLOCK
        bh = tl.program_id(1)
        h = bh % H
        offset = bh * N * D
        offs_m = start_m + tl.arange(0, BLOCK)
        DT: tl.constexpr = Q.dtype.element_ty
        q, do, lse, delta = _load_query_block(Q, DO, Lse, Delta, Cos, Sin, offset, bh, offs_m, N,
                                              ROTARY, D, DT, UPCAST)
        dq = tl.zeros((BLOCK, D), tl.float32)
        if HAS_BIAS:
            n_blocks = tl.cdiv(N, BLOCK)
            t = tl.arange(0, 2 * BLOCK)
            on_diagonal = (tl.arange(0, BLOCK)[:, None, None] - tl.arange(0, BLOCK)[None, :, None]
                           + BLOCK - 1) == t[None, None, :]  # (a, c, t)
        for start_n in range(0, tl.minimum(start_m + BLOCK, N), BLOCK):
            offs_n = start_n + tl.arange(0, BLOCK)
            k = _load_rotated(K + offset, offs_n, N, Cos, Sin, ROTARY, D, DT, UPCAST)
            v = _operand(_load_rows(V + offset, offs_n, N, D), DT, UPCAST)
            p, ds = _bwd_probs(q, k, v, do, lse, delta, Bias, h, offs_m, offs_n, N, scale, HAS_BIAS)
            dq += tl.dot(_operand(ds, DT, UPCAST), k)
            if HAS_BIAS:
                diag = tl.sum(tl.sum(tl.where(on_diagonal, ds[:, :, None], 0.0), axis=0), axis=0)
                slot = ((bh * n_blocks + pid_m) * n_blocks + start_n // BLOCK) * (2 * BLOCK)
                tl.store(DBias + slot + t, diag)
        dq = _unrotate(dq * scale, Cos, Sin, offs_m, N, ROTARY, D, BLOCK)
        offs_d = tl.arange(0, D)
        tl.store(DQ + offset + offs_m[:, None] * D + offs_d[None, :], dq.to(DQ.dtype.element_ty),
                 mask=offs_m[:, None] < N)


# ----------------------------------------------------------------------------- launchers


def _blocks() -> tuple[int, int, int]:
    """(forward BLOCK_M = BLOCK_N, dk/dv BLOCK, dq BLOCK). The dq tile's diagonal reduction holds
    BLOCK^2 * 2 BLOCK values, so it stays at 16 on a GPU; the interpreter prefers large blocks."""
    return (64, 64, 64) if INTERPRET else (64, 64, 16)


def _upcast(q) -> bool:
    return INTERPRET and q.dtype == torch.bfloat16


def _check(q, k, v, bias):
    if not (q.shape == k.shape == v.shape and q.dim() == 4):
        raise ValueError(f"q, k, v must share a shape (B, H, N, d), got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    B, H, N, d = q.shape
    if d not in (16, 32, 64, 128):
        raise ValueError(f"head dimension d must be 16, 32, 64 or 128, got {d}")
    if bias is not None and bias.shape != (H, N):
        raise ValueError(f"bias must have shape (H, N) = ({H}, {N}), got {tuple(bias.shape)}")


def _forward(q, k, v, bias, rotary):
    B, H, N, d = q.shape
    cos, sin = _kernel_rotary_tables(N, d, q.device) if rotary else (q, q)  # dummies when unused
    out = torch.empty_like(q)
    lse = torch.empty(B, H, N, device=q.device, dtype=torch.float32)
    block, _, _ = _blocks()
    bias_arg = bias.float().contiguous() if bias is not None else q
    _fwd_kernel[(triton.cdiv(N, block), B * H)](
        q, k, v, bias_arg, cos, sin, out, lse, N, H, 1.0 / math.sqrt(d),
        HAS_BIAS=bias is not None, ROTARY=rotary, D=d, UPCAST=_upcast(q), BLOCK_M=block, BLOCK_N=block,
        num_stages=STAGES)
    return out, lse


def _backward(q, k, v, bias, rotary, out, lse, do):
    B, H, N, d = q.shape
    cos, sin = _kernel_rotary_tables(N, d, q.device) if rotary else (q, q)
    do = do.contiguous()
    delta = (do.float() * out.float()).sum(-1)  # (B, H, N): rowsum(dO * O) = rowsum(P * dP)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    _, block_kv, block_q = _blocks()
    scale = 1.0 / math.sqrt(d)
    bias_arg = bias.float().contiguous() if bias is not None else q
    _bwd_dkdv_kernel[(triton.cdiv(N, block_kv), B * H)](
        q, k, v, bias_arg, cos, sin, do, lse, delta, dk, dv, N, H, scale,
        HAS_BIAS=bias is not None, ROTARY=rotary, D=d, UPCAST=_upcast(q), BLOCK_M=block_kv, BLOCK_N=block_kv,
        num_stages=STAGES)
    n_blocks = triton.cdiv(N, block_q)
    slots = torch.zeros(B * H, n_blocks, n_blocks, 2 * block_q, device=q.device) if bias is not None else q
    _bwd_dq_kernel[(n_blocks, B * H)](
        q, k, v, bias_arg, cos, sin, do, lse, delta, dq, slots, N, H, scale,
        HAS_BIAS=bias is not None, ROTARY=rotary, D=d, UPCAST=_upcast(q), BLOCK=block_q, num_stages=STAGES)
    dbias = _sum_diagonals(slots.view(B, H, n_blocks, n_blocks, 2 * block_q), N).to(bias.dtype) if bias is not None else None
    return dq, dk, dv, dbias


def _sum_diagonals(slots: torch.Tensor, N: int) -> torch.Tensor:
    """dbias (H, N) from the per-tile diagonal sums slots (B, H, m, n, 2 BLOCK), in a fixed order."""
    B, H, nb, _, two_block = slots.shape
    block = two_block // 2
    per_tile = slots.sum(0)  # (H, m, n, 2 BLOCK)
    m = torch.arange(nb, device=slots.device).view(nb, 1)
    lag = torch.arange(nb, device=slots.device).view(1, nb)  # lag = m - n, the block diagonal
    n = (m - lag).clamp_min(0)
    index = n.view(1, nb, nb, 1).expand(H, nb, nb, two_block)
    per_lag = (per_tile.gather(2, index) * (m >= lag).view(1, nb, nb, 1)).sum(1)  # (H, lag, 2 BLOCK)
    # lag L holds i - j = L * BLOCK + t - (BLOCK - 1): t >= BLOCK - 1 falls in block L, t < BLOCK - 1 in block L - 1
    dbias = per_lag[..., block - 1 : 2 * block - 1].clone()
    dbias[:, :-1, 1:] += per_lag[:, 1:, : block - 1]
    return dbias.reshape(H, nb * block)[:, :N]


class _Attention(torch.autograd.Function):
    """(out, lse) of the kernels; differentiable in q, k, v and bias (lse is not)."""

    @staticmethod
    def forward(q, k, v, bias, rotary):
        return _forward(q, k, v, bias, rotary)

    @staticmethod
    def setup_context(ctx, inputs, output):
        q, k, v, bias, rotary = inputs
        out, lse = output
        ctx.save_for_backward(q, k, v, bias, out, lse)
        ctx.rotary = rotary
        ctx.mark_non_differentiable(lse)

    @staticmethod
    def backward(ctx, do, _):
        q, k, v, bias, out, lse = ctx.saved_tensors
        dq, dk, dv, dbias = _backward(q, k, v, bias, ctx.rotary, out, lse, do)
        return dq, dk, dv, dbias, None

    @staticmethod
    def vmap(info, in_dims, q, k, v, bias, rotary):
        """torch.func.vmap over a leading model axis E (an ensemble, ensemble.py): the heads of E
        models are E * H independent heads, so the axis folds into the head axis, (E, B, H, N, d)
        -> (B, E * H, N, d) and bias (E, H, N) -> (E * H, N), and the kernels run unchanged."""
        E = info.batch_size

        def fold(x, dim):  # member axis at `dim` (None: shared by all members) -> (B, E * H, N, d)
            x = x.movedim(dim, 1) if dim is not None else x.unsqueeze(1).expand(-1, E, -1, -1, -1)
            return x.flatten(1, 2).contiguous()

        q_dim, k_dim, v_dim, bias_dim, _ = in_dims
        if bias is not None:
            bias = bias.movedim(bias_dim, 0) if bias_dim is not None else bias.expand(E, -1, -1)
            bias = bias.flatten(0, 1).contiguous()  # (E * H, N)
        out, lse = _Attention.apply(fold(q, q_dim), fold(k, k_dim), fold(v, v_dim), bias, rotary)

        def unfold(x):  # (B, E * H, ...) -> (E, B, H, ...)
            return x.unflatten(1, (E, -1)).movedim(1, 0)

        return (unfold(out), unfold(lse)), (0, 0)


def attention(q, k, v, bias=None, rotary=False):
    """Causal attention with optional relative bias bias[h, i - j] (H, N) and rotary q, k; the
    Triton kernels, differentiable in q, k, v and bias. q, k, v: (B, H, N, d), fp32 or bf16.
    Works under torch.func.vmap (see _Attention.vmap)."""
    if triton is None:
        raise RuntimeError("the attention kernel needs triton")
    _check(q, k, v, bias)
    return _Attention.apply(q.contiguous(), k.contiguous(), v.contiguous(), bias, rotary)[0]


@torch.no_grad()
def attention_forward(q, k, v, bias=None, rotary=False):
    """The kernel's forward only: (out, lse), lse (B, H, N) the per-row log-sum-exp of the scores."""
    _check(q, k, v, bias)
    return _Attention.apply(q.contiguous(), k.contiguous(), v.contiguous(), bias, rotary)


# ----------------------------------------------------------------------------- readouts and reference


def _rotate_reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x0, x1 = x.float().unflatten(-1, (-1, 2)).unbind(-1)
    return torch.stack([x0 * cos - x1 * sin, x1 * cos + x0 * sin], -1).flatten(-2)


def attention_scores(q, k, bias=None, rotary=False, rows=None) -> torch.Tensor:
    """Causally masked scores (B, H, len(rows), N) of the query rows `rows` (default: all), in fp32."""
    B, H, N, d = q.shape
    if rows is not None:
        rows = torch.as_tensor(rows, device=q.device)
        q = q[:, :, rows]
    else:
        rows = torch.arange(N, device=q.device)
    if rotary:
        cos, sin = rotary_tables(N, d, q.device)
        q, k = _rotate_reference(q, cos[rows], sin[rows]), _rotate_reference(k, cos, sin)  # fp32
    s = (q.float() @ k.float().transpose(-1, -2)) / math.sqrt(d)
    rel = rows.view(-1, 1) - torch.arange(N, device=q.device).view(1, -1)  # i - j
    if bias is not None:
        s = s + bias[:, rel.clamp(0, N - 1)].float().unsqueeze(0)
    return s.masked_fill(rel < 0, float("-inf"))


def attention_rows(q, k, lse, rows, bias=None, rotary=False) -> torch.Tensor:
    """Readout helper: attention weights A[b, h, i, :] of the rows i from q, k and the forward's
    saved log-sum-exp, without materializing the full matrix during training."""
    rows = torch.as_tensor(rows, device=q.device)
    return (attention_scores(q, k, bias, rotary, rows) - lse[:, :, rows, None]).exp()


def attention_reference(q, k, v, bias=None, rotary=False):
    """Plain-PyTorch oracle with the semantics of `attention` (and the model's path without CUDA)."""
    _check(q, k, v, bias)
    A = torch.softmax(attention_scores(q, k, bias, rotary), -1)
    return (A @ v.float()).to(v.dtype)
