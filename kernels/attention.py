"""Fused causal relative-position attention in Triton: forward, backward, and the PyTorch oracle.

Causal softmax attention over q, k, v of shape (B, H, N, d) with the two relative-position
schemes the paper uses (Appendix "Network architecture", "Minimal Network for Generalization"):

  score(i, j) = <R_i q_i, R_j k_j> / sqrt(d) + bias[h, i - j]        for j <= i

where R_n is the rotary embedding at position n (interleaved pairs (2f, 2f + 1) rotated by the
angle n * 10000^(-2f/d)) and bias is a learned table P_{j-i} of shape (H, N). Either, both or
neither may be used.

Layout, top to bottom as in the Triton fused-attention tutorial:
  rotary kernel -> forward kernel -> backward kernels (dq with delta and the bias gradient, then
  dk/dv) -> tile table -> torch.autograd.Function -> public `attention` -> readouts -> reference.

Launches per call: forward = rotate q and k once (one launch, skipped without rotary) + the
attention kernel; backward = dq + dk/dv (+ a memset and a few small torch ops for the bias gradient).
The backward kernels work on the rotated q, k saved by the forward and rotate dq, dk back once,
when they store them (the transpose rotation, angle -theta).

The bias gradient dbias[h, r] = sum_{b, i - j = r} dS[b, h, i, j] is a reduction along diagonals,
deterministic (no atomics), by one of three methods (the tile's `diagonal`, chosen by the sweep):
  "gather"  the dq kernel skews each square (BLOCK, BLOCK) tile of dS with one in-register gather,
            so that its diagonals become columns, and writes the column sums to a private slot per
            (batch, head, query block, block lag); one fixed-order torch sum adds the slots
  "mask"    the same slots from a (BLOCK, BLOCK, BLOCK) mask (the first version; 16-row tiles only)
  "store"   the dq kernel writes dS itself (B, H, N, N), at and below the diagonal; torch sums it
            over the batch and then along the diagonals of the (H, N, N) sum through a strided view.
            More memory traffic (and a transient B H N^2 buffer: 1 GB for 64 bf16 models with a bias at
            N = 256, 4 GB at N = 512), but no in-register work and tiles of any shape. In bf16, dS is
            stored rounded to bf16, as the dq and dk dots already use it

Tile sizes, warps and pipeline stages come from `TILES`, a table written from a sweep measured on a
GPU (`python bench/bench_attention.py --sweep`; README). Every tl.dot tile is >= 16 in each
dimension (d in {16, 32, 64, 128}, blocks >= 16), so code that passes in the interpreter
(TRITON_INTERPRET=1, the CPU tests) also compiles for a GPU.
"""
import json
import math
import os
from typing import NamedTuple

import torch

try:
    import triton
    import triton.language as tl

    from kernels.common import operand  # a dot operand that also works in the interpreter
except ImportError:  # the model falls back to the reference; the kernel needs triton
    triton = None

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
ROTARY_BASE = 10000.0


def rotary_tables(N: int, d: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the rotary angles n * base^(-2f/d), each (N, d/2) in float32."""
    inv_freq = ROTARY_BASE ** (-torch.arange(0, d, 2, dtype=torch.float32, device=device) / d)
    angle = torch.arange(N, dtype=torch.float32, device=device)[:, None] * inv_freq[None, :]
    return angle.cos(), angle.sin()


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


if triton is not None:

    @triton.jit
    def _swap_pairs(x, BLOCK: tl.constexpr, D: tl.constexpr):
        """A (BLOCK, D) tile with the columns of each pair (2f, 2f + 1) exchanged."""
        x0, x1 = tl.split(tl.reshape(x, (BLOCK, D // 2, 2)))
        return tl.reshape(tl.join(x1, x0), (BLOCK, D))

    @triton.jit
    def _load_rows(ptr, offs, N, D: tl.constexpr, DT: tl.constexpr, UPCAST: tl.constexpr):
        """Rows offs of a contiguous (N, D) matrix as a dot operand; rows past N read as zero."""
        offs_d = tl.arange(0, D)
        x = tl.load(ptr + offs[:, None] * D + offs_d[None, :], mask=offs[:, None] < N, other=0.0)
        return operand(x, DT, UPCAST)

    @triton.jit
    def _load_angles(Cos, Sin, pos, mask, D: tl.constexpr):
        """Rows pos of the (N, D) tables cos and -+sin (_kernel_rotary_tables)."""
        offs_d = tl.arange(0, D)
        cos = tl.load(Cos + pos[:, None] * D + offs_d[None, :], mask=mask[:, None], other=1.0)
        sin = tl.load(Sin + pos[:, None] * D + offs_d[None, :], mask=mask[:, None], other=0.0)
        return cos, sin

    # ------------------------------------------------------------------------- rotary pre-pass

    @triton.jit
    def _rotate_rows(X, XR, idx, mask, cos, sin, SEQS: tl.constexpr, BLOCK: tl.constexpr, D: tl.constexpr):
        """XR = x * cos + x_swapped * (-+sin) in fp32 for a (SEQS, BLOCK, D) tile, x_swapped (each pair
        exchanged) shuffled in registers: a second load through the column index c ^ 1 could not be
        vectorized and held the pre-pass to ~0.9 TB/s in bf16 (bench_attention.py --rotate)."""
        x = tl.load(X + idx, mask=mask, other=0.0).to(tl.float32)
        x_swapped = tl.reshape(_swap_pairs(tl.reshape(x, (SEQS * BLOCK, D)), SEQS * BLOCK, D), (SEQS, BLOCK, D))
        tl.store(XR + idx, (x * cos + x_swapped * sin).to(XR.dtype.element_ty), mask=mask)

    @triton.jit
    def _rotate_kernel(Q, K, QR, KR, Cos, Sin, S, N, D: tl.constexpr, BLOCK: tl.constexpr, SEQS: tl.constexpr):
        """QR, KR = R_n q, R_n k at the BLOCK positions n of one block, in SEQS of the S = B * H sequences
        of the (S, N, D) tensors, as (SEQS, BLOCK, D) tiles: the angles are loaded once for all SEQS
        sequences, and every load of the program is issued at once."""
        pos = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        seq = tl.program_id(1) * SEQS + tl.arange(0, SEQS)
        offs_d = tl.arange(0, D)
        cos, sin = _load_angles(Cos, Sin, pos, pos < N, D)
        idx = (seq[:, None, None].to(tl.int64) * N + pos[None, :, None]) * D + offs_d[None, None, :]
        mask = (seq[:, None, None] < S) & (pos[None, :, None] < N)
        _rotate_rows(Q, QR, idx, mask, cos[None], sin[None], SEQS, BLOCK, D)
        _rotate_rows(K, KR, idx, mask, cos[None], sin[None], SEQS, BLOCK, D)

    @triton.jit
    def _unrotate(dx, Cos, Sin, offs, N, ROTARY: tl.constexpr, D: tl.constexpr, BLOCK: tl.constexpr):
        """The gradient with respect to the unrotated rows: the transpose rotation (angle -theta)."""
        if ROTARY:
            cos, sin = _load_angles(Cos, Sin, offs, offs < N, D)
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
    def _fwd_kernel(Q, K, V, Bias, Out, Lse, N, H, scale,
                    HAS_BIAS: tl.constexpr, D: tl.constexpr, UPCAST: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
        """One program per query block: online softmax over the key blocks up to the diagonal."""
        start_m = tl.program_id(0) * BLOCK_M
        bh = tl.program_id(1)
        h = bh % H
        offset = bh * N * D
        offs_m = start_m + tl.arange(0, BLOCK_M)
        DT: tl.constexpr = Q.dtype.element_ty
        q = _load_rows(Q + offset, offs_m, N, D, DT, UPCAST)

        m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)  # running max
        l_i = tl.zeros((BLOCK_M,), tl.float32)  # running normalizer
        acc = tl.zeros((BLOCK_M, D), tl.float32)
        for start_n in range(0, tl.minimum(start_m + BLOCK_M, N), BLOCK_N):
            offs_n = start_n + tl.arange(0, BLOCK_N)
            k = _load_rows(K + offset, offs_n, N, D, DT, UPCAST)
            v = _load_rows(V + offset, offs_n, N, D, DT, UPCAST)
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
    def _bwd_probs(q, k, v, do, lse, delta, Bias, h, offs_m, offs_n, N, scale, HAS_BIAS: tl.constexpr):
        """Recompute P = exp(S - lse) for a tile and dS = P (dP - delta) with dP = dO V^T."""
        s, valid = _scores(q, k, Bias, h, offs_m, offs_n, N, scale, HAS_BIAS)
        p = tl.where(valid, tl.exp(s - lse[:, None]), 0.0)
        dp = tl.dot(do, tl.trans(v))
        return p, p * (dp - delta[:, None])

    @triton.jit
    def _diagonal_sums(ds, BLOCK: tl.constexpr, GATHER: tl.constexpr):
        """Sums along the diagonals of a square (BLOCK, BLOCK) tile, row a, column c:
        lower[t] over a - c = t, upper[t] over a - c = t - BLOCK (t in [0, BLOCK); upper[0] = 0).

        GATHER: skew the tile, G[a, t] = ds[a, (a - t) mod BLOCK], so that each diagonal is the part
        of a column above or below the main diagonal of G (BLOCK^2 work). Otherwise: a (BLOCK,
        BLOCK, BLOCK) mask per half, only sensible at BLOCK = 16 (the first version's method)."""
        a = tl.arange(0, BLOCK)[:, None]
        t = tl.arange(0, BLOCK)[None, :]
        if GATHER:
            g = tl.gather(ds, (a - t + BLOCK) % BLOCK, axis=1)
            lower = tl.sum(tl.where(a >= t, g, 0.0), axis=0)
            upper = tl.sum(tl.where(a < t, g, 0.0), axis=0)
        else:
            lag = a[:, :, None] - tl.arange(0, BLOCK)[None, :, None]  # (a, c, 1): a - c
            t3 = tl.arange(0, BLOCK)[None, None, :]
            lower = tl.sum(tl.sum(tl.where(lag == t3, ds[:, :, None], 0.0), axis=0), axis=0)
            upper = tl.sum(tl.sum(tl.where(lag == t3 - BLOCK, ds[:, :, None], 0.0), axis=0), axis=0)
        return lower, upper

    @triton.jit
    def _bwd_dq_kernel(Q, K, V, Bias, Cos, Sin, Out, DO, Lse, Delta, DQ, DBias, N, H, scale,
                       HAS_BIAS: tl.constexpr, ROTARY: tl.constexpr, D: tl.constexpr, UPCAST: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DIAGONAL: tl.constexpr):
        """One program per query block: delta = rowsum(dO * O) (stored for the dk/dv kernel),
        dQ = dS K / sqrt(d) rotated back, and with a bias what the bias gradient needs of every dS tile.

        DIAGONAL "store": the tile itself, into DBias[bh] (N, N) at its rows and columns. Otherwise
        the tiles are square (BLOCK_M = BLOCK_N = BLOCK) and tile (m, n) at block lag L = m - n holds
        i - j = L BLOCK + (a - c): its lower sums go to r = L BLOCK + t, its upper sums to
        r = (L - 1) BLOCK + t. Both land in DBias[bh, m, L, 0:2, :], a slot no other program writes
        (_sum_slots adds them)."""
        pid_m = tl.program_id(0)
        start_m = pid_m * BLOCK_M
        bh = tl.program_id(1)
        h = bh % H
        offset = bh * N * D
        offs_m = start_m + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, D)
        DT: tl.constexpr = Q.dtype.element_ty
        q = _load_rows(Q + offset, offs_m, N, D, DT, UPCAST)
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
            k = _load_rows(K + offset, offs_n, N, D, DT, UPCAST)
            v = _load_rows(V + offset, offs_n, N, D, DT, UPCAST)
            p, ds = _bwd_probs(q, k, v, do, lse, delta, Bias, h, offs_m, offs_n, N, scale, HAS_BIAS)
            dq += tl.dot(operand(ds, DT, UPCAST), k)
            if HAS_BIAS and DIAGONAL == "store":
                tl.store(DBias + bh * N * N + offs_m[:, None] * N + offs_n[None, :], ds.to(DBias.dtype.element_ty),
                         mask=row_mask & (offs_n[None, :] < N))
            elif HAS_BIAS:
                lower, upper = _diagonal_sums(ds, BLOCK_M, DIAGONAL == "gather")
                n_blocks = tl.cdiv(N, BLOCK_M)
                slot = DBias + ((bh * n_blocks + pid_m) * n_blocks + pid_m - start_n // BLOCK_N) * (2 * BLOCK_M)
                t = tl.arange(0, BLOCK_M)
                tl.store(slot + t, lower)
                tl.store(slot + BLOCK_M + t, upper)
        dq = _unrotate(dq * scale, Cos, Sin, offs_m, N, ROTARY, D, BLOCK_M)
        tl.store(DQ + offset + offs_m[:, None] * D + offs_d[None, :], dq.to(DQ.dtype.element_ty), mask=row_mask)

    @triton.jit
    def _bwd_dkdv_kernel(Q, K, V, Bias, Cos, Sin, DO, Lse, Delta, DK, DV, N, H, scale,
                         HAS_BIAS: tl.constexpr, ROTARY: tl.constexpr, D: tl.constexpr, UPCAST: tl.constexpr,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
        """One program per key block: dV = P^T dO and dK = dS^T Q / sqrt(d) (rotated back), summed
        over the query blocks at and below the diagonal."""
        start_n = tl.program_id(0) * BLOCK_N
        bh = tl.program_id(1)
        h = bh % H
        offset = bh * N * D
        offs_n = start_n + tl.arange(0, BLOCK_N)
        DT: tl.constexpr = Q.dtype.element_ty
        k = _load_rows(K + offset, offs_n, N, D, DT, UPCAST)
        v = _load_rows(V + offset, offs_n, N, D, DT, UPCAST)
        dk = tl.zeros((BLOCK_N, D), tl.float32)
        dv = tl.zeros((BLOCK_N, D), tl.float32)
        for start_m in range((start_n // BLOCK_M) * BLOCK_M, N, BLOCK_M):
            offs_m = start_m + tl.arange(0, BLOCK_M)
            q = _load_rows(Q + offset, offs_m, N, D, DT, UPCAST)
            do = _load_rows(DO + offset, offs_m, N, D, DT, UPCAST)
            lse = tl.load(Lse + bh * N + offs_m, mask=offs_m < N, other=float("inf"))  # rows past N: P = 0
            delta = tl.load(Delta + bh * N + offs_m, mask=offs_m < N, other=0.0)
            p, ds = _bwd_probs(q, k, v, do, lse, delta, Bias, h, offs_m, offs_n, N, scale, HAS_BIAS)
            dv += tl.dot(tl.trans(operand(p, DT, UPCAST)), do)
            dk += tl.dot(tl.trans(operand(ds, DT, UPCAST)), q)
        dk = _unrotate(dk * scale, Cos, Sin, offs_n, N, ROTARY, D, BLOCK_N)
        offs_d = tl.arange(0, D)
        mask = offs_n[:, None] < N
        tl.store(DK + offset + offs_n[:, None] * D + offs_d[None, :], dk.to(DK.dtype.element_ty), mask=mask)
        tl.store(DV + offset + offs_n[:, None] * D + offs_d[None, :], dv.to(DV.dtype.element_ty), mask=mask)


# ----------------------------------------------------------------------------- tiles


DIAGONALS = ("gather", "mask", "store")  # the bias gradient's methods (module docstring)


class Tile(NamedTuple):
    """One kernel's launch shape: query rows and key rows per tile, warps, software-pipelining
    stages, and (dq with a bias only) the bias gradient's method, one of DIAGONALS."""
    block_m: int
    block_n: int
    warps: int = 4
    stages: int = 2
    diagonal: str = "gather"


TILES_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tiles.json")


def load_tiles(path: str = TILES_FILE) -> dict[tuple[str, str, bool, bool], "Tile"]:
    """The tile table (kernel, dtype, bias, long) -> Tile, long = N > 512, from the JSON file that
    `bench_attention.py --sweep` writes (README: the card, the candidates, the times); empty if absent."""
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        entries = json.load(f)["tiles"]
    return {(e["kernel"], e["dtype"], e["bias"], e["long"]): Tile(*e["tile"][:4], *map(_diagonal, e["tile"][4:]))
            for e in entries}


def _diagonal(method) -> str:
    """A table's diagonal method; tables written before "store" existed hold a bool, gather or not."""
    return {True: "gather", False: "mask"}[method] if isinstance(method, bool) else method


def save_tiles(tiles: dict, path: str, **about):
    """Write a tile table in load_tiles' format, with `about` (device, versions) beside it."""
    entries = [{"kernel": k[0], "dtype": k[1], "bias": k[2], "long": k[3], "tile": list(t)} for k, t in sorted(tiles.items())]
    with open(path, "w") as f:
        json.dump({**about, "tiles": entries}, f, indent=1)


TILES = load_tiles()  # absent keys fall back to DEFAULT_TILE
DEFAULT_TILE = Tile(64, 64, 4, 2)
INTERPRET_TILE = Tile(64, 64)  # the interpreter runs a program's tile as one numpy array: larger is faster


def _tile(kernel: str, dtype: torch.dtype, has_bias: bool, N: int) -> Tile:
    if INTERPRET:
        return INTERPRET_TILE
    return TILES.get((kernel, str(dtype).removeprefix("torch."), has_bias, N > 512), DEFAULT_TILE)


# ----------------------------------------------------------------------------- launchers


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


ROTATE_BLOCK, ROTATE_SEQS = 32, 4  # positions and sequences per program of the rotary pre-pass (powers of 2)


def _rotate(q, k, seqs=ROTATE_SEQS, block=ROTATE_BLOCK):
    """(R q, R k) in the input dtype, one launch for both."""
    B, H, N, d = q.shape
    cos, sin = _kernel_rotary_tables(N, d, q.device)
    qr, kr = torch.empty_like(q), torch.empty_like(k)
    grid = (triton.cdiv(N, block), triton.cdiv(B * H, seqs))
    _rotate_kernel[grid](q, k, qr, kr, cos, sin, B * H, N, D=d, BLOCK=block, SEQS=seqs)
    return qr, kr


def _forward(q, k, v, bias, tile=None):
    """(out, lse) of already rotated q, k."""
    B, H, N, d = q.shape
    tile = tile or _tile("fwd", q.dtype, bias is not None, N)
    out = torch.empty_like(q)
    lse = torch.empty(B, H, N, device=q.device, dtype=torch.float32)
    _fwd_kernel[(triton.cdiv(N, tile.block_m), B * H)](
        q, k, v, bias if bias is not None else q, out, lse, N, H, 1.0 / math.sqrt(d),
        HAS_BIAS=bias is not None, D=d, UPCAST=_upcast(q), BLOCK_M=tile.block_m, BLOCK_N=tile.block_n,
        num_warps=tile.warps, num_stages=tile.stages)
    return out, lse


def _backward_dq(q, k, v, bias, rotary, out, lse, do, tile=None):
    """(dq, delta, dbias): dq rotated back, delta = rowsum(dO * O), and with a bias its gradient (H, N)
    in fp32 (else None), from the kernel's slots (_sum_slots) or its stored dS (_sum_stored)."""
    B, H, N, d = q.shape
    tile = tile or _tile("dq", q.dtype, bias is not None, N)
    store = tile.diagonal == "store"
    if tile.diagonal not in DIAGONALS:
        raise ValueError(f"a tile's diagonal method must be one of {DIAGONALS}, got {tile.diagonal!r}")
    if bias is not None and not store and tile.block_m != tile.block_n:
        raise ValueError(f"the bias gradient by {tile.diagonal!r} needs square dq tiles, got {tile}")
    cos, sin = _kernel_rotary_tables(N, d, q.device) if rotary else (q, q)  # dummies when unused
    n_blocks = triton.cdiv(N, tile.block_m)
    if bias is None:
        partial = q  # a dummy, never touched
    elif store:  # the kernel writes dS at and below the diagonal; the rest is never read
        partial = torch.empty(B * H, N, N, device=q.device, dtype=q.dtype)
    else:
        partial = torch.zeros(B * H, n_blocks, n_blocks, 2, tile.block_m, device=q.device)
    dq = torch.empty_like(q)
    delta = torch.empty(B, H, N, device=q.device, dtype=torch.float32)
    _bwd_dq_kernel[(n_blocks, B * H)](
        q, k, v, bias if bias is not None else q, cos, sin, out, do, lse, delta, dq, partial, N, H, 1.0 / math.sqrt(d),
        HAS_BIAS=bias is not None, ROTARY=rotary, D=d, UPCAST=_upcast(q), BLOCK_M=tile.block_m,
        BLOCK_N=tile.block_n, DIAGONAL=tile.diagonal, num_warps=tile.warps, num_stages=tile.stages)
    if bias is None:
        return dq, delta, None
    return dq, delta, (_sum_stored if store else _sum_slots)(partial, B, H, N)


def _backward_dkdv(q, k, v, bias, rotary, lse, delta, do, tile=None):
    B, H, N, d = q.shape
    tile = tile or _tile("dkdv", q.dtype, bias is not None, N)
    cos, sin = _kernel_rotary_tables(N, d, q.device) if rotary else (q, q)
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    _bwd_dkdv_kernel[(triton.cdiv(N, tile.block_n), B * H)](
        q, k, v, bias if bias is not None else q, cos, sin, do, lse, delta, dk, dv, N, H, 1.0 / math.sqrt(d),
        HAS_BIAS=bias is not None, ROTARY=rotary, D=d, UPCAST=_upcast(q), BLOCK_M=tile.block_m,
        BLOCK_N=tile.block_n, num_warps=tile.warps, num_stages=tile.stages)
    return dk, dv


def _sum_stored(ds: torch.Tensor, B: int, H: int, N: int) -> torch.Tensor:
    """dbias (H, N) from dS (B * H, N, N) as the dq kernel stored it: valid at and below the diagonal,
    never written above it. Summed over the batch first (elementwise, so whatever sits above the
    diagonal stays there), then along diagonals: in the (H, N, N) sum padded with N * N zeros, the
    view (h, r, j) -> offset r N + j (N + 1) reads element (j + r, j), on diagonal r, while j + r < N,
    and the zero padding after that; it never reads above the diagonal."""
    total = ds.view(B, H, N, N).sum(0, dtype=torch.float32).view(H, N * N)
    padded = torch.cat([total, total.new_zeros(H, N * N)], 1)  # (H, 2 N^2)
    return padded.as_strided((H, N, N), (2 * N * N, N, N + 1)).sum(-1)


def _sum_slots(slots: torch.Tensor, B: int, H: int, N: int) -> torch.Tensor:
    """dbias (H, N) from the dq kernel's slots (B * H, m, lag, 2, BLOCK), in a fixed order: lag L's
    lower sums are r = L BLOCK + t, its upper sums r = (L - 1) BLOCK + t."""
    _, nb, _, _, block = slots.shape
    per_lag = slots.view(B, H, nb, nb, 2, block).sum((0, 2))  # (H, lag, 2, BLOCK)
    dbias = per_lag[:, :, 0].reshape(H, nb * block)
    dbias[:, : (nb - 1) * block] += per_lag[:, 1:, 1].reshape(H, (nb - 1) * block)
    return dbias[:, :N]


class _Attention(torch.autograd.Function):
    """(out, lse) of the kernels, and with rotary also the rotated q, k (saved for the backward);
    differentiable in q, k, v and bias through out only."""

    @staticmethod
    def forward(q, k, v, bias, rotary):
        """(out, lse), and with rotary the rotated q, k that the backward works on."""
        if not rotary:
            return _forward(q, k, v, bias)
        q, k = _rotate(q, k)
        return (*_forward(q, k, v, bias), q, k)

    @staticmethod
    def setup_context(ctx, inputs, output):
        q, k, v, bias, rotary = inputs
        if rotary:
            out, lse, q, k = output
            ctx.mark_non_differentiable(lse, q, k)
        else:
            out, lse = output
            ctx.mark_non_differentiable(lse)
        ctx.save_for_backward(q, k, v, bias, out, lse)
        ctx.rotary = rotary
        ctx.set_materialize_grads(False)  # no zero tensors for the gradients of lse and rotated q, k

    @staticmethod
    def backward(ctx, do, *_):
        if do is None:  # only lse (or the rotated q, k) was used: nothing flows back
            return None, None, None, None, None
        q, k, v, bias, out, lse = ctx.saved_tensors
        do = do.contiguous()
        dq, delta, dbias = _backward_dq(q, k, v, bias, ctx.rotary, out, lse, do)
        dk, dv = _backward_dkdv(q, k, v, bias, ctx.rotary, lse, delta, do)
        return dq, dk, dv, dbias.to(bias.dtype) if bias is not None else None, None

    @staticmethod
    def vmap(info, in_dims, q, k, v, bias, rotary):
        """torch.func.vmap over a leading model axis E (an ensemble, ensemble.py): E models of B sequences
        are E * B sequences, (E, B, H, N, d) -> (E * B, H, N, d), a view when the member axis leads (as
        the model's projections leave it), and the kernels run unchanged. A bias differs per model, and
        the kernels index it by head, so with a bias the member axis folds into the head axis instead:
        (B, E * H, N, d) and bias (E, H, N) -> (E * H, N), at the price of a copy of q, k, v and of the
        outputs' layout."""
        E = info.batch_size
        q_dim, k_dim, v_dim, bias_dim, _ = in_dims
        axis = 1 if bias is not None else 0  # the kernels' axis that takes the members: heads or sequences

        def fold(x, dim):  # member axis at `dim` (None: shared by all members) -> merged into `axis`
            x = x.movedim(dim, 0) if dim is not None else x.expand(E, *x.shape)
            return x.movedim(0, axis).flatten(axis, axis + 1).contiguous()

        if bias is not None:
            bias = bias.movedim(bias_dim, 0) if bias_dim is not None else bias.expand(E, -1, -1)
            bias = bias.flatten(0, 1).contiguous()  # (E * H, N)
        outputs = _Attention.apply(fold(q, q_dim), fold(k, k_dim), fold(v, v_dim), bias, rotary)

        def unfold(x):  # the merged axis -> (E, B, H, ...)
            return x.unflatten(axis, (E, -1)).movedim(axis, 0)

        return tuple(unfold(x) for x in outputs), (0,) * len(outputs)


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


@torch.no_grad()
def attention_forward(q, k, v, bias=None, rotary=False):
    """The kernel's forward only: (out, lse), lse (B, H, N) the per-row log-sum-exp of the scores."""
    return _apply(q, k, v, bias, rotary)


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
