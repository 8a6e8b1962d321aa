"""The gradient of the attention kernel's relative-position bias (kernels/attention.py, position="bias"):

    dbias[h, r] = sum_{b, i - j = r} dS[b, h, i, j]

a reduction along the diagonals of every dS tile that the dq kernel computes, deterministic (no atomics), by one
of three methods (a tile's `diagonal`, chosen by the sweep of bench/bench_attention.py):
  "gather"  the dq kernel skews each square (BLOCK, BLOCK) tile of dS with one in-register gather, so that its
            diagonals become columns, and writes the column sums to a private slot per (batch, head, query
            block, block lag), zeros to the slots of the lags it has no tile for (no memset); one fixed-order
            torch sum over a strided view of the slots gives dbias (one launch)
  "mask"    the same slots from a (BLOCK, BLOCK, BLOCK) mask (the first version; 16-row tiles only)
  "store"   the dq kernel writes dS itself (B, H, N, N), at and below the diagonal; torch sums it over the batch
            and then along the diagonals of the (H, N, N) sum through a strided view. More memory traffic (and a
            transient B H N^2 buffer: 1 GB for 64 bf16 models with a bias at N = 256, 4 GB at N = 512), but no
            in-register work and tiles of any shape. In bf16, dS is stored rounded to bf16, as the dq and dk
            dots already use it
The three stay until a GPU measurement picks one (the tile table holds the sweep's choice per dtype and length).
"""
import torch

try:
    import triton
    import triton.language as tl
except ImportError:
    triton = None

DIAGONALS = ("gather", "mask", "store")


if triton is not None:

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
    def _slot(DBias, bh, pid_m, lag, N, BLOCK: tl.constexpr):
        """Slot (bh, query block pid_m, block lag) of the (B H, m, lag, 2, BLOCK) buffer: n_blocks + 1 lags, the
        last one all zeros (for _sum_slots' view)."""
        n_blocks = tl.cdiv(N, BLOCK)
        return DBias + ((bh * n_blocks + pid_m) * (n_blocks + 1) + lag).to(tl.int64) * (2 * BLOCK)

    @triton.jit
    def store_tile(ds, DBias, bh, pid_m, start_n, offs_m, offs_n, N, row_mask,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DIAGONAL: tl.constexpr):
        """What the bias gradient needs of the dS tile (query block pid_m, keys from start_n) of sequence and
        head bh. "store": the tile itself, into DBias[bh] (N, N) at its rows and columns. Otherwise the tiles
        are square (BLOCK_M = BLOCK_N = BLOCK) and tile (m, n) at block lag L = m - n holds
        i - j = L BLOCK + (a - c): its lower sums go to r = L BLOCK + t, its upper sums to r = (L - 1) BLOCK + t.
        Both land in slot (bh, m, L), which no other program writes (_sum_slots adds them)."""
        if DIAGONAL == "store":
            tl.store(DBias + bh * N * N + offs_m[:, None] * N + offs_n[None, :], ds.to(DBias.dtype.element_ty),
                     mask=row_mask & (offs_n[None, :] < N))
        else:
            lower, upper = _diagonal_sums(ds, BLOCK_M, DIAGONAL == "gather")
            slot = _slot(DBias, bh, pid_m, pid_m - start_n // BLOCK_N, N, BLOCK_M)
            t = tl.arange(0, BLOCK_M)
            tl.store(slot + t, lower)
            tl.store(slot + BLOCK_M + t, upper)

    @triton.jit
    def zero_slots(DBias, bh, pid_m, N, BLOCK: tl.constexpr, DIAGONAL: tl.constexpr):
        """After query block pid_m's tiles (lags 0 .. pid_m): zeros in its slots of the lags beyond, up to the
        padding lag n_blocks, so that the buffer needs no memset ("store" writes no slots)."""
        if DIAGONAL != "store":
            zeros = tl.zeros([2 * BLOCK], tl.float32)
            for lag in range(pid_m + 1, tl.cdiv(N, BLOCK) + 1):
                tl.store(_slot(DBias, bh, pid_m, lag, N, BLOCK) + tl.arange(0, 2 * BLOCK), zeros)


def buffer(tile, B: int, H: int, N: int, device, dtype) -> torch.Tensor:
    """What store_tile and zero_slots write into for the dq tile `tile` (kernels/tiles.Tile): dS (B H, N, N) in
    the inputs' dtype ("store"), or the slots (B H, m, lag, 2, BLOCK) in fp32, n_blocks + 1 lags, every slot
    written by the kernel."""
    if tile.diagonal not in DIAGONALS:
        raise ValueError(f"a tile's diagonal method must be one of {DIAGONALS}, got {tile.diagonal!r}")
    if tile.diagonal == "store":  # the kernel writes dS at and below the diagonal; the rest is never read
        return torch.empty(B * H, N, N, device=device, dtype=dtype)
    if tile.block_m != tile.block_n:
        raise ValueError(f"the bias gradient by {tile.diagonal!r} needs square dq tiles, got {tile}")
    n_blocks = triton.cdiv(N, tile.block_m)
    return torch.empty(B * H, n_blocks, n_blocks + 1, 2, tile.block_m, device=device)


def dbias(tile, written: torch.Tensor, B: int, H: int, N: int) -> torch.Tensor:
    """dbias (H, N) in fp32 from what the dq kernel wrote into buffer(tile, ...)."""
    return (_sum_stored if tile.diagonal == "store" else _sum_slots)(written, B, H, N)


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
    """dbias (H, N) from the dq kernel's slots (B * H, m, lag, 2, BLOCK), n_blocks + 1 lags, in one fixed-order
    sum: r = L BLOCK + t gets lag L's lower sums and lag L + 1's upper sums. In a slot row, lag L's lower half
    starts at L 2 BLOCK and lag L + 1's upper half at (L + 1) 2 BLOCK + BLOCK = L 2 BLOCK + 3 BLOCK: a view whose
    "half" axis has stride 3 BLOCK pairs them (the padding lag n_blocks, zeros, pairs with the last lag)."""
    _, nb, lags, _, block = slots.shape
    s_bh, s_m = slots.stride(0), slots.stride(1)
    pairs = slots.as_strided((B, H, nb, lags - 1, 2, block), (H * s_bh, s_bh, s_m, 2 * block, 3 * block, 1))
    return pairs.sum((0, 2, 4)).reshape(H, (lags - 1) * block)[:, :N]
