"""Fused causal relative-position attention in Triton (Appendix "Network architecture", "Minimal Network for
Generalization"): the kernels that compute the model's attention. The score formula and its plain-torch
reference are transformer.py's (`attention_scores`, `attend`); the tests compare these kernels against them.

Causal softmax attention over q, k, v of shape (B, H, N, d):

  score(i, j) = <R_i q_i, R_j k_j> / sqrt(d) + bias[h, i - j]        for j <= i
  A_ij = softmax_j score(i, j),   out_i = sum_{j <= i} A_ij v_j

where R_n is the rotary embedding at position n (interleaved pairs (2f, 2f + 1) rotated by the
angle n * 10000^(-2f/d)) and bias is a learned table P_{i-j} of shape (H, N). Either, both or
neither may be used.

Top to bottom, in the order of the Triton fused-attention tutorial:
  the inputs' checks and the rotary tables -> forward kernels (the rotary pre-pass, the online softmax) ->
  backward kernels (dq with delta and the bias gradient, then dk/dv) -> launchers (`rotate_pass`, `forward_pass`,
  `backward_dq_pass`, `backward_dkdv_pass`: bench/bench_attention.py times each) -> torch.autograd.Function
  and its vmap rule -> the public `attention`, `attention_packed` and `attention_forward` (out and the rows'
  log-sum-exp, from which engine/fastpath.py reads the attention weights).

The kernels take q, k, v with any batch and head strides and contiguous rows (the row stride a compile-time
constant), so `attention_packed` reads them in place from one projection's output (3, B, H, N, d), rows 3 H d
apart, and writes their gradient into one tensor of that layout.

Launches per call: forward = rotate q and k once (one launch, skipped without rotary) + the
attention kernel; backward = dq + dk/dv (+ one or three small torch ops for the bias gradient).
The backward kernels work on the rotated q, k saved by the forward and rotate dq, dk back once,
when they store them (the transpose rotation, angle -theta).

The bias gradient dbias[h, r] = sum_{b, i - j = r} dS[b, h, i, j], a sum along the diagonals of dS, is
kernels/bias_gradient.py (three methods, one per tile). Tile sizes, warps and pipeline stages come from
`TILES`, the table kernels/tiles.py reads, written from a sweep measured on a GPU. Every tl.dot tile is >= 16
in each dimension (d in {16, 32, 64, 128}, blocks >= 16), so code that passes in the interpreter
(TRITON_INTERPRET=1, the CPU tests) also compiles for a GPU.
"""
import math
import os

import torch

from kernels import bias_gradient
from kernels.tiles import Tile, load_tiles

try:
    import triton
    import triton.language as tl

    from kernels.bias_gradient import store_tile, zero_slots  # what the bias gradient needs of a dS tile
    from kernels.common import operand  # a dot operand that also works in the interpreter
except ImportError:  # the model's plain path is transformer.py's; the kernels need triton
    triton = None

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
ROTARY_BASE = 10000.0


# ----------------------------------------------------------------------------- the inputs


def _check(q, k, v, bias):
    if not (q.shape == k.shape == v.shape and q.dim() == 4):
        raise ValueError(f"q, k, v must share a shape (B, H, N, d), got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    B, H, N, d = q.shape
    if d not in (16, 32, 64, 128):
        raise ValueError(f"head dimension d must be 16, 32, 64 or 128, got {d}")
    if bias is not None and bias.shape != (H, N):
        raise ValueError(f"bias must have shape (H, N) = ({H}, {N}), got {tuple(bias.shape)}")


def rotary_tables(N: int, d: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the rotary angles n * base^(-2f/d), each (N, d/2) in fp32: the kernels' own copy of
    transformer.rotary_tables (kernels import nothing of the model's; tests/test_attention.py checks the two agree)."""
    inv_freq = ROTARY_BASE ** (-torch.arange(0, d, 2, dtype=torch.float32, device=device) / d)
    angle = torch.arange(N, dtype=torch.float32, device=device)[:, None] * inv_freq[None, :]
    return angle.cos(), angle.sin()


# ----------------------------------------------------------------------------- the kernels


if triton is not None:

    @triton.jit
    def _swap_pairs(x, BLOCK: tl.constexpr, D: tl.constexpr):
        """A (BLOCK, D) tile with the columns of each pair (2f, 2f + 1) exchanged."""
        x0, x1 = tl.split(tl.reshape(x, (BLOCK, D // 2, 2)))
        return tl.reshape(tl.join(x1, x0), (BLOCK, D))

    @triton.jit
    def _first_row(bh, H, stride_b, stride_h):
        """Offset of sequence bh = b H + h (the grid's axis over batch and heads) in a tensor whose batch and
        head axes have strides stride_b, stride_h: a packed q, k, v's views are not contiguous."""
        return (bh // H).to(tl.int64) * stride_b + (bh % H).to(tl.int64) * stride_h

    @triton.jit
    def _load_rows(ptr, offs, stride, N, D: tl.constexpr, DT: tl.constexpr, UPCAST: tl.constexpr):
        """Rows offs (row stride `stride`, columns contiguous) of an (N, D) matrix as a dot operand; rows past N
        read as zero."""
        offs_d = tl.arange(0, D)
        x = tl.load(ptr + offs[:, None] * stride + offs_d[None, :], mask=offs[:, None] < N, other=0.0)
        return operand(x, DT, UPCAST)

    @triton.jit
    def _load_angles(Cos, Sin, pos, mask, D: tl.constexpr):
        """Rows pos of the (N, D) tables cos and -+sin (_kernel_rotary_tables)."""
        offs_d = tl.arange(0, D)
        cos = tl.load(Cos + pos[:, None] * D + offs_d[None, :], mask=mask[:, None], other=1.0)
        sin = tl.load(Sin + pos[:, None] * D + offs_d[None, :], mask=mask[:, None], other=0.0)
        return cos, sin

    # ------------------------------------------------------------------------- forward: the rotary pre-pass

    @triton.jit
    def _rotate_rows(X, XR, idx, idx_r, mask, cos, sin, SEQS: tl.constexpr, BLOCK: tl.constexpr, D: tl.constexpr):
        """XR[idx_r] = x * cos + x_swapped * (-+sin) in fp32 for the (SEQS, BLOCK, D) tile x = X[idx], x_swapped
        (each pair exchanged) shuffled in registers, since a second load through the column index c ^ 1 cannot be
        vectorized (bench_attention.py --rotate)."""
        x = tl.load(X + idx, mask=mask, other=0.0).to(tl.float32)
        x_swapped = tl.reshape(_swap_pairs(tl.reshape(x, (SEQS * BLOCK, D)), SEQS * BLOCK, D), (SEQS, BLOCK, D))
        tl.store(XR + idx_r, (x * cos + x_swapped * sin).to(XR.dtype.element_ty), mask=mask)

    @triton.jit
    def _rotate_kernel(Q, K, QR, KR, Cos, Sin, S, N, H, stride_b, stride_h,
                       STRIDE_N: tl.constexpr, D: tl.constexpr, BLOCK: tl.constexpr, SEQS: tl.constexpr):
        """QR, KR = R_n q, R_n k at the BLOCK positions n of one block, in SEQS of the S = B * H sequences,
        as (SEQS, BLOCK, D) tiles: q, k read with the inputs' strides, QR, KR written contiguous (S, N, D).
        The angles are loaded once for all SEQS sequences, and every load of the program is issued at once."""
        pos = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        seq = tl.program_id(1) * SEQS + tl.arange(0, SEQS)
        offs_d = tl.arange(0, D)
        cos, sin = _load_angles(Cos, Sin, pos, pos < N, D)
        first = _first_row(seq, H, stride_b, stride_h)
        idx = first[:, None, None] + pos[None, :, None] * STRIDE_N + offs_d[None, None, :]
        idx_r = (seq[:, None, None].to(tl.int64) * N + pos[None, :, None]) * D + offs_d[None, None, :]
        mask = (seq[:, None, None] < S) & (pos[None, :, None] < N)
        _rotate_rows(Q, QR, idx, idx_r, mask, cos[None], sin[None], SEQS, BLOCK, D)
        _rotate_rows(K, KR, idx, idx_r, mask, cos[None], sin[None], SEQS, BLOCK, D)

    # ------------------------------------------------------------------------- forward: the online softmax

    @triton.jit
    def _scores(q, k, Bias, h, offs_m, offs_n, N, scale, HAS_BIAS: tl.constexpr):
        """Scores of a (BLOCK_M, BLOCK_N) tile with the causal mask (-inf where j > i or j >= N)."""
        s = tl.dot(q, tl.trans(k)) * scale
        rel = offs_m[:, None] - offs_n[None, :]  # i - j
        valid = (rel >= 0) & (offs_n[None, :] < N)
        if HAS_BIAS:
            s += tl.load(Bias + h * N + rel, mask=valid & (rel < N), other=0.0)
        return tl.where(valid, s, float("-inf")), valid

    @triton.jit
    def _fwd_kernel(Q, K, V, Bias, Out, Lse, N, H, scale, sqk_b, sqk_h, sv_b, sv_h,
                    SQK_N: tl.constexpr, SV_N: tl.constexpr, HAS_BIAS: tl.constexpr, D: tl.constexpr,
                    UPCAST: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
        """One program per query block: online softmax over the key blocks up to the diagonal. Q and K have the
        batch, head and row strides sqk_b, sqk_h, SQK_N, V has sv_b, sv_h, SV_N; Out is contiguous (B, H, N, D)."""
        start_m = tl.program_id(0) * BLOCK_M
        bh = tl.program_id(1)
        h = bh % H
        offset = bh * N * D
        qk, vb = _first_row(bh, H, sqk_b, sqk_h), _first_row(bh, H, sv_b, sv_h)
        offs_m = start_m + tl.arange(0, BLOCK_M)
        DT: tl.constexpr = Q.dtype.element_ty
        q = _load_rows(Q + qk, offs_m, SQK_N, N, D, DT, UPCAST)

        m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)  # running max
        l_i = tl.zeros((BLOCK_M,), tl.float32)  # running normalizer
        acc = tl.zeros((BLOCK_M, D), tl.float32)
        for start_n in range(0, tl.minimum(start_m + BLOCK_M, N), BLOCK_N):
            offs_n = start_n + tl.arange(0, BLOCK_N)
            k = _load_rows(K + qk, offs_n, SQK_N, N, D, DT, UPCAST)
            v = _load_rows(V + vb, offs_n, SV_N, N, D, DT, UPCAST)
            s, _ = _scores(q, k, Bias, h, offs_m, offs_n, N, scale, HAS_BIAS)
            m_new = tl.maximum(m_i, tl.max(s, 1))
            p = tl.exp(s - m_new[:, None])
            alpha = tl.exp(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + tl.dot(operand(p, DT, UPCAST), v)
            m_i = m_new
        offs_d = tl.arange(0, D)
        mask = offs_m < N
        tl.store(Out + offset + offs_m[:, None] * D + offs_d[None, :],
                 (acc / l_i[:, None]).to(Out.dtype.element_ty), mask=mask[:, None])
        tl.store(Lse + bh * N + offs_m, m_i + tl.log(l_i), mask=mask)

    # ------------------------------------------------------------------------- backward

    @triton.jit
    def _unrotate(dx, Cos, Sin, offs, N, ROTARY: tl.constexpr, D: tl.constexpr, BLOCK: tl.constexpr):
        """The gradient with respect to the unrotated rows: the transpose rotation (angle -theta)."""
        if ROTARY:
            cos, sin = _load_angles(Cos, Sin, offs, offs < N, D)
            dx = dx * cos - _swap_pairs(dx, BLOCK, D) * sin
        return dx

    @triton.jit
    def _bwd_probs(q, k, v, do, lse, delta, Bias, h, offs_m, offs_n, N, scale, HAS_BIAS: tl.constexpr):
        """Recompute P = exp(S - lse) for a tile and dS = P (dP - delta) with dP = dO V^T."""
        s, valid = _scores(q, k, Bias, h, offs_m, offs_n, N, scale, HAS_BIAS)
        p = tl.where(valid, tl.exp(s - lse[:, None]), 0.0)
        dp = tl.dot(do, tl.trans(v))
        return p, p * (dp - delta[:, None])

    @triton.jit
    def _bwd_dq_kernel(Q, K, V, Bias, Cos, Sin, Out, DO, Lse, Delta, DQ, DBias, N, H, scale,
                       sqk_b, sqk_h, sv_b, sv_h, SQK_N: tl.constexpr, SV_N: tl.constexpr,
                       HAS_BIAS: tl.constexpr, ROTARY: tl.constexpr, D: tl.constexpr, UPCAST: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DIAGONAL: tl.constexpr):
        """One program per query block: delta = rowsum(dO * O) (stored for the dk/dv kernel),
        dQ = dS K / sqrt(d) rotated back, and with a bias what the bias gradient needs of every dS tile
        (bias_gradient.store_tile, by the method DIAGONAL). Strides as in _fwd_kernel; DQ has V's."""
        pid_m = tl.program_id(0)
        start_m = pid_m * BLOCK_M
        bh = tl.program_id(1)
        h = bh % H
        offset = bh * N * D
        qk, vb = _first_row(bh, H, sqk_b, sqk_h), _first_row(bh, H, sv_b, sv_h)
        offs_m = start_m + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, D)
        DT: tl.constexpr = Q.dtype.element_ty
        q = _load_rows(Q + qk, offs_m, SQK_N, N, D, DT, UPCAST)
        row_mask = offs_m[:, None] < N
        do_raw = tl.load(DO + offset + offs_m[:, None] * D + offs_d[None, :], mask=row_mask, other=0.0)
        o = tl.load(Out + offset + offs_m[:, None] * D + offs_d[None, :], mask=row_mask, other=0.0)
        delta = tl.sum(do_raw.to(tl.float32) * o.to(tl.float32), 1)  # rowsum(dO * O) = rowsum(P * dP)
        tl.store(Delta + bh * N + offs_m, delta, mask=offs_m < N)
        do = operand(do_raw, DT, UPCAST)
        lse = tl.load(Lse + bh * N + offs_m, mask=offs_m < N, other=float("inf"))  # rows past N: P = 0

        dq = tl.zeros((BLOCK_M, D), tl.float32)
        for start_n in range(0, tl.minimum(start_m + BLOCK_M, N), BLOCK_N):
            offs_n = start_n + tl.arange(0, BLOCK_N)
            k = _load_rows(K + qk, offs_n, SQK_N, N, D, DT, UPCAST)
            v = _load_rows(V + vb, offs_n, SV_N, N, D, DT, UPCAST)
            p, ds = _bwd_probs(q, k, v, do, lse, delta, Bias, h, offs_m, offs_n, N, scale, HAS_BIAS)
            dq += tl.dot(operand(ds, DT, UPCAST), k)
            if HAS_BIAS:
                store_tile(ds, DBias, bh, pid_m, start_n, offs_m, offs_n, N, row_mask, BLOCK_M, BLOCK_N, DIAGONAL)
        if HAS_BIAS:
            zero_slots(DBias, bh, pid_m, N, BLOCK_M, DIAGONAL)
        dq = _unrotate(dq * scale, Cos, Sin, offs_m, N, ROTARY, D, BLOCK_M)
        tl.store(DQ + vb + offs_m[:, None] * SV_N + offs_d[None, :], dq.to(DQ.dtype.element_ty), mask=row_mask)

    @triton.jit
    def _bwd_dkdv_kernel(Q, K, V, Bias, Cos, Sin, DO, Lse, Delta, DK, DV, N, H, scale,
                         sqk_b, sqk_h, sv_b, sv_h, SQK_N: tl.constexpr, SV_N: tl.constexpr,
                         HAS_BIAS: tl.constexpr, ROTARY: tl.constexpr, D: tl.constexpr, UPCAST: tl.constexpr,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
        """One program per key block: dV = P^T dO and dK = dS^T Q / sqrt(d) (rotated back), summed
        over the query blocks at and below the diagonal. Strides as in _fwd_kernel; DK and DV have V's."""
        start_n = tl.program_id(0) * BLOCK_N
        bh = tl.program_id(1)
        h = bh % H
        offset = bh * N * D
        qk, vb = _first_row(bh, H, sqk_b, sqk_h), _first_row(bh, H, sv_b, sv_h)
        offs_n = start_n + tl.arange(0, BLOCK_N)
        DT: tl.constexpr = Q.dtype.element_ty
        k = _load_rows(K + qk, offs_n, SQK_N, N, D, DT, UPCAST)
        v = _load_rows(V + vb, offs_n, SV_N, N, D, DT, UPCAST)
        dk = tl.zeros((BLOCK_N, D), tl.float32)
        dv = tl.zeros((BLOCK_N, D), tl.float32)
        for start_m in range((start_n // BLOCK_M) * BLOCK_M, N, BLOCK_M):
            offs_m = start_m + tl.arange(0, BLOCK_M)
            q = _load_rows(Q + qk, offs_m, SQK_N, N, D, DT, UPCAST)
            do = _load_rows(DO + offset, offs_m, D, N, D, DT, UPCAST)
            lse = tl.load(Lse + bh * N + offs_m, mask=offs_m < N, other=float("inf"))  # rows past N: P = 0
            delta = tl.load(Delta + bh * N + offs_m, mask=offs_m < N, other=0.0)
            p, ds = _bwd_probs(q, k, v, do, lse, delta, Bias, h, offs_m, offs_n, N, scale, HAS_BIAS)
            dv += tl.dot(tl.trans(operand(p, DT, UPCAST)), do)
            dk += tl.dot(tl.trans(operand(ds, DT, UPCAST)), q)
        dk = _unrotate(dk * scale, Cos, Sin, offs_n, N, ROTARY, D, BLOCK_N)
        offs_d = tl.arange(0, D)
        mask = offs_n[:, None] < N
        tl.store(DK + vb + offs_n[:, None] * SV_N + offs_d[None, :], dk.to(DK.dtype.element_ty), mask=mask)
        tl.store(DV + vb + offs_n[:, None] * SV_N + offs_d[None, :], dv.to(DV.dtype.element_ty), mask=mask)


# ----------------------------------------------------------------------------- launchers


TILES = load_tiles()  # (kernel, dtype, bias, N > 512) -> Tile; absent keys fall back to DEFAULT_TILE
DEFAULT_TILE = Tile(64, 64, 4, 2)
INTERPRET_TILE = Tile(64, 64)  # the interpreter runs a program's tile as one numpy array: larger is faster


def _tile(kernel: str, dtype: torch.dtype, has_bias: bool, N: int) -> Tile:
    if INTERPRET:
        return INTERPRET_TILE
    return TILES.get((kernel, str(dtype).removeprefix("torch."), has_bias, N > 512), DEFAULT_TILE)


def _upcast(q) -> bool:
    return INTERPRET and q.dtype == torch.bfloat16


_TABLES: dict[tuple[int, int, torch.device], tuple[torch.Tensor, torch.Tensor]] = {}


def _kernel_rotary_tables(N: int, d: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernels' (N, d) tables, one entry per column so that tiles load contiguously: cos at
    both columns of a pair, and -sin, +sin at its first and second column. Cached (building them
    is ten small launches, more than the rotation itself), never evicted (a captured CUDA graph may
    read them), and not cached when first built inside a capture (they would hold nothing until the
    graph's first replay)."""
    key = (N, d, device)
    if key not in _TABLES:
        cos, sin = rotary_tables(N, d, device)
        tables = cos.repeat_interleave(2, -1).contiguous(), torch.stack([-sin, sin], -1).reshape(N, d).contiguous()
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return tables
        _TABLES[key] = tables
    return _TABLES[key]


ROTATE_BLOCK, ROTATE_SEQS = 32, 4  # positions and sequences per program of the rotary pre-pass (powers of 2)


def _strides(x) -> tuple[int, int]:
    """(batch, head) strides of a (B, H, N, d) tensor whose rows are contiguous (its row stride, x.stride(2), is a
    compile-time constant of the kernels: d or, for a packed qkv, 3 H d)."""
    return x.stride()[:2]


def rotate_pass(q, k, seqs=ROTATE_SEQS, block=ROTATE_BLOCK):
    """(R q, R k) in the input dtype, contiguous, one launch for both; q and k share their strides."""
    B, H, N, d = q.shape
    cos, sin = _kernel_rotary_tables(N, d, q.device)
    qr, kr = torch.empty(q.shape, device=q.device, dtype=q.dtype), torch.empty(k.shape, device=k.device, dtype=k.dtype)
    grid = (triton.cdiv(N, block), triton.cdiv(B * H, seqs))
    _rotate_kernel[grid](q, k, qr, kr, cos, sin, B * H, N, H, *_strides(q), STRIDE_N=q.stride(2), D=d, BLOCK=block,
                         SEQS=seqs)
    return qr, kr


def forward_pass(q, k, v, bias, tile=None):
    """(out, lse) of already rotated q, k (sharing their strides; v may have others); out contiguous."""
    B, H, N, d = q.shape
    tile = tile or _tile("fwd", q.dtype, bias is not None, N)
    out = torch.empty(q.shape, device=q.device, dtype=q.dtype)
    lse = torch.empty(B, H, N, device=q.device, dtype=torch.float32)
    _fwd_kernel[(triton.cdiv(N, tile.block_m), B * H)](
        q, k, v, bias if bias is not None else q, out, lse, N, H, 1.0 / math.sqrt(d), *_strides(q), *_strides(v),
        SQK_N=q.stride(2), SV_N=v.stride(2), HAS_BIAS=bias is not None, D=d, UPCAST=_upcast(q), BLOCK_M=tile.block_m,
        BLOCK_N=tile.block_n, num_warps=tile.warps, num_stages=tile.stages)
    return out, lse


def _same_layout(x):
    """An empty tensor with x's strides: the backward kernels write the gradients with their inputs' strides."""
    return torch.empty_strided(x.shape, x.stride(), device=x.device, dtype=x.dtype)


def backward_dq_pass(q, k, v, bias, rotary, out, lse, do, tile=None, dq=None):
    """(dq, delta, dbias): dq rotated back (written into `dq` when given, which has v's strides), delta =
    rowsum(dO * O), and with a bias its gradient (H, N) in fp32 (else None), from what the kernel wrote for it
    (kernels/bias_gradient.py)."""
    B, H, N, d = q.shape
    dq = _same_layout(v) if dq is None else dq
    tile = tile or _tile("dq", q.dtype, bias is not None, N)
    cos, sin = _kernel_rotary_tables(N, d, q.device) if rotary else (q, q)  # dummies when unused
    written = bias_gradient.buffer(tile, B, H, N, q.device, q.dtype) if bias is not None else q  # q: a dummy
    delta = torch.empty(B, H, N, device=q.device, dtype=torch.float32)
    _bwd_dq_kernel[(triton.cdiv(N, tile.block_m), B * H)](
        q, k, v, bias if bias is not None else q, cos, sin, out, do, lse, delta, dq, written, N, H, 1.0 / math.sqrt(d),
        *_strides(q), *_strides(v), SQK_N=q.stride(2), SV_N=v.stride(2),
        HAS_BIAS=bias is not None, ROTARY=rotary, D=d, UPCAST=_upcast(q), BLOCK_M=tile.block_m,
        BLOCK_N=tile.block_n, DIAGONAL=tile.diagonal, num_warps=tile.warps, num_stages=tile.stages)
    return dq, delta, bias_gradient.dbias(tile, written, B, H, N) if bias is not None else None


def backward_dkdv_pass(q, k, v, bias, rotary, lse, delta, do, tile=None, dk=None, dv=None):
    """(dk, dv), dk rotated back (written into `dk`, `dv` when given, which have v's strides)."""
    B, H, N, d = q.shape
    dk, dv = (_same_layout(v) if x is None else x for x in (dk, dv))
    tile = tile or _tile("dkdv", q.dtype, bias is not None, N)
    cos, sin = _kernel_rotary_tables(N, d, q.device) if rotary else (q, q)
    _bwd_dkdv_kernel[(triton.cdiv(N, tile.block_n), B * H)](
        q, k, v, bias if bias is not None else q, cos, sin, do, lse, delta, dk, dv, N, H, 1.0 / math.sqrt(d),
        *_strides(q), *_strides(v), SQK_N=q.stride(2), SV_N=v.stride(2),
        HAS_BIAS=bias is not None, ROTARY=rotary, D=d, UPCAST=_upcast(q), BLOCK_M=tile.block_m,
        BLOCK_N=tile.block_n, num_warps=tile.warps, num_stages=tile.stages)
    return dk, dv


# ----------------------------------------------------------------------------- autograd and vmap


class _Attention(torch.autograd.Function):
    """(out, lse) of the kernels, and with rotary also the rotated q, k (saved for the backward);
    differentiable in the inputs and bias through out only. The inputs are q, k, v (B, H, N, d), or, with
    k = v = None, the three packed in one tensor qkv (3, B, H, N, d): then the gradient is one tensor of
    qkv's layout too, which the kernels write in place (no stack of dq, dk, dv). The price, with rotary: the
    backward keeps qkv (v is a view of it) besides the rotated q, k, 5 B H N d elements where separate inputs
    keep 3 (1 GiB more for 64 bf16 models at the paper preset, two layers)."""

    @staticmethod
    def forward(qkv, k, v, bias, rotary):
        """(out, lse), and with rotary the rotated q, k that the backward works on."""
        q, k, v = qkv.unbind(0) if k is None else (qkv, k, v)
        if not rotary:
            return forward_pass(q, k, v, bias)
        q, k = rotate_pass(q, k)
        return (*forward_pass(q, k, v, bias), q, k)

    @staticmethod
    def setup_context(ctx, inputs, output):
        qkv, k, v, bias, rotary = inputs
        ctx.packed = k is None
        q, k, v = qkv.unbind(0) if ctx.packed else (qkv, k, v)
        if rotary:
            out, lse, q, k = output
            ctx.mark_non_differentiable(lse, q, k)
        else:
            out, lse = output
            ctx.mark_non_differentiable(lse)
        # packed: qkv itself (v is a view of it, so it stays alive anyway) for the gradient's layout
        ctx.save_for_backward(q, k, qkv if ctx.packed else v, bias, out, lse)
        ctx.rotary = rotary
        ctx.set_materialize_grads(False)  # no zero tensors for the gradients of lse and rotated q, k

    @staticmethod
    def backward(ctx, do, *_):
        if do is None:  # only lse (or the rotated q, k) was used: nothing flows back
            return None, None, None, None, None
        q, k, v, bias, out, lse = ctx.saved_tensors
        dq = dk = dv = None
        if ctx.packed:  # v is qkv: one gradient with its strides, which the kernels write as v's
            dqkv = _same_layout(v)
            v, (dq, dk, dv) = v[2], dqkv.unbind(0)
        do = do.contiguous()
        dq, delta, dbias = backward_dq_pass(q, k, v, bias, ctx.rotary, out, lse, do, dq=dq)
        dk, dv = backward_dkdv_pass(q, k, v, bias, ctx.rotary, lse, delta, do, dk=dk, dv=dv)
        dbias = dbias.to(bias.dtype) if bias is not None else None
        return (dqkv, None, None, dbias, None) if ctx.packed else (dq, dk, dv, dbias, None)

    @staticmethod
    def vmap(info, in_dims, qkv, k, v, bias, rotary):
        """torch.func.vmap over a leading model axis E (an ensemble, engine/ensemble.py): E models of B sequences
        are E * B sequences, (E, B, H, N, d) -> (E * B, H, N, d), a view when the member axis leads (as
        the model's projections leave it), and the kernels run unchanged. A bias differs per model, and
        the kernels index it by head, so with a bias the member axis folds into the head axis instead:
        (B, E * H, N, d) and bias (E, H, N) -> (E * H, N); separate q, k, v are copied then, a packed qkv
        (3, ...) is a view still where H = 1 (the kernels take any batch and head strides)."""
        E = info.batch_size
        packed = k is None
        qkv_dim, k_dim, v_dim, bias_dim, _ = in_dims
        axis = (1 if bias is not None else 0) + packed  # the kernels' axis that takes the members: heads or sequences

        def fold(x, dim):  # member axis at `dim` (None: shared by all members) -> merged into `axis`
            x = x.movedim(dim, 0) if dim is not None else x.expand(E, *x.shape)
            x = x.movedim(0, axis).flatten(axis, axis + 1)  # a view where the strides allow it
            return x if packed and x.stride(-1) == 1 and 0 not in x.stride() else x.contiguous()

        if bias is not None:
            bias = bias.movedim(bias_dim, 0) if bias_dim is not None else bias.expand(E, -1, -1)
            bias = bias.flatten(0, 1).contiguous()  # (E * H, N)
        inputs = (fold(qkv, qkv_dim), None, None) if packed else (fold(qkv, qkv_dim), fold(k, k_dim), fold(v, v_dim))
        outputs = _Attention.apply(*inputs, bias, rotary)
        axis -= packed  # the outputs are (B, H, N, d) (or (B, H, N))

        def unfold(x):  # the merged axis -> (E, B, H, ...)
            return x.unflatten(axis, (E, -1)).movedim(axis, 0)

        return tuple(unfold(x) for x in outputs), (0,) * len(outputs)


# ----------------------------------------------------------------------------- public functions


def _apply(q, k, v, bias, rotary):
    if triton is None:
        raise RuntimeError("the attention kernel needs triton")
    _check(q, k, v, bias)
    if bias is not None:
        bias = bias.float().contiguous()
    return _Attention.apply(q.contiguous(), k.contiguous(), v.contiguous(), bias, rotary)[:2]


def attention(q, k, v, bias=None, rotary=False):
    """Causal attention with optional relative bias bias[h, i - j] (H, N) and rotary q, k; the
    Triton kernels, differentiable in q, k, v and bias. q, k, v: (B, H, N, d), fp32 or bf16.
    Works under torch.func.vmap (see _Attention.vmap)."""
    return _apply(q, k, v, bias, rotary)[0]


def attention_packed(qkv, bias=None, rotary=False):
    """attention(*qkv, bias, rotary) for q, k, v packed in one tensor qkv (3, B, H, N, d) of any strides with
    contiguous rows, as one projection's output leaves them (engine/fastpath.py: LN(x) W_QKV^T, (B, N, 3 D) viewed as
    (3, B, 1, N, D)): the kernels read the three in place, and the gradient is one tensor of qkv's layout,
    written in place, that the projection's backward takes in one matmul. Out (B, H, N, d) contiguous."""
    if triton is None:
        raise RuntimeError("the attention kernel needs triton")
    if qkv.dim() != 5 or qkv.shape[0] != 3:
        raise ValueError(f"qkv must have shape (3, B, H, N, d), got {tuple(qkv.shape)}")
    _check(*qkv.unbind(0), bias)
    if bias is not None:
        bias = bias.float().contiguous()
    if qkv.stride(-1) != 1 or 0 in qkv.stride():  # the gradient is written with qkv's strides: no overlaps
        qkv = qkv.contiguous()
    return _Attention.apply(qkv, None, None, bias, rotary)[0]


@torch.no_grad()
def attention_forward(q, k, v, bias=None, rotary=False):
    """The kernel's forward only: (out, lse), lse (B, H, N) the per-row log-sum-exp of the scores."""
    return _apply(q, k, v, bias, rotary)
