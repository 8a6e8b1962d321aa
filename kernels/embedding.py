"""The token embedding x0 = W_E x_n (eq. model_start) in Triton: a row lookup, and its weight gradient without
atomics.

    forward   x[t] = W_E[s_t]                                    (W_E (C, D), one row per state)
    backward  dW_E[c] = sum over positions t with s_t = c of dx[t]

Why: torch's lookup under torch.func.vmap (an ensemble, engine/ensemble.py) is a gather that reached ~0.4 TB/s on an
H100, and its backward sorts every position by state before summing: together ~7 % of a 64-model training
step (bench/bench_train.py --profile). Here the forward writes each row once; the backward gives each program
one slice of the positions and all C classes: it adds a tile of gradient rows into a (C, D) accumulator through
a one-hot matrix product (exact fp32 products, input_precision="ieee"), writes its partial sum, and torch adds
the slices in a fixed order (deterministic). A leading axis E of independent tables (the members) is a grid
axis; the vmap rule stacks the members' positions and tables.
"""
import torch

from kernels.common import row_slices

try:
    import triton
    import triton.language as tl
except ImportError:
    triton = None

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
BLOCK_T = 64  # positions per tile
PROGRAMS = None  # the backward splits the positions until about this many programs run (None: common.row_slices' default)


if triton is not None:

    @triton.jit
    def _embed_forward_kernel(S, W, X, T, C, D, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr):
        rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
        e = tl.program_id(1)
        cols = tl.arange(0, BLOCK_D)
        mask = (rows[:, None] < T) & (cols[None, :] < D)
        s = tl.load(S + e * T + rows, mask=rows < T, other=0)
        w = tl.load(W + (e * C + s[:, None]) * D + cols[None, :], mask=mask)
        tl.store(X + (e * T + rows[:, None]).to(tl.int64) * D + cols[None, :], w.to(X.dtype.element_ty), mask=mask)

    @triton.jit
    def _embed_backward_kernel(S, DX, PARTS, T, C, D, ROWS_PER_SLICE,
                               BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_D: tl.constexpr):
        """PARTS[e, slice] (C, D) = the sum of dx over this slice's positions, by state."""
        sl, e = tl.program_id(0), tl.program_id(1)
        classes = tl.arange(0, BLOCK_C)
        cols = tl.arange(0, BLOCK_D)
        acc = tl.zeros((BLOCK_C, BLOCK_D), tl.float32)
        start = sl * ROWS_PER_SLICE
        for t0 in range(start, tl.minimum(start + ROWS_PER_SLICE, T), BLOCK_T):
            rows = t0 + tl.arange(0, BLOCK_T)
            s = tl.load(S + e * T + rows, mask=rows < T, other=-1)  # -1: no state, a zero column
            dx = tl.load(DX + (e * T + rows[:, None]).to(tl.int64) * D + cols[None, :],
                         mask=(rows[:, None] < T) & (cols[None, :] < D), other=0.0).to(tl.float32)
            one_hot = (classes[:, None] == s[None, :]).to(tl.float32)  # (BLOCK_C, BLOCK_T)
            acc = tl.dot(one_hot, dx, acc, input_precision="ieee")
        slot = ((e * tl.num_programs(0) + sl) * C + classes[:, None]).to(tl.int64) * D + cols[None, :]
        tl.store(PARTS + slot, acc, mask=(classes[:, None] < C) & (cols[None, :] < D))


def _blocks(C: int, D: int) -> dict:
    return dict(BLOCK_T=BLOCK_T, BLOCK_C=max(16, triton.next_power_of_2(C)), BLOCK_D=max(16, triton.next_power_of_2(D)))


class _Embedding(torch.autograd.Function):
    """x = W[s] for E tables at once: s (E, T) int64, W (E, C, D) -> x (E, T, D) in out_dtype."""

    @staticmethod
    def forward(s, w, out_dtype):
        s, w = s.contiguous(), w.contiguous()
        (E, T), (C, D) = s.shape, w.shape[1:]
        x = torch.empty(E, T, D, device=w.device, dtype=out_dtype)
        blocks = _blocks(C, D)
        _embed_forward_kernel[(triton.cdiv(T, BLOCK_T), E)](s, w, x, T, C, D, BLOCK_T=BLOCK_T, BLOCK_D=blocks["BLOCK_D"])
        return x

    @staticmethod
    def setup_context(ctx, inputs, output):
        s, w, _ = inputs
        ctx.save_for_backward(s.contiguous())
        ctx.w_shape, ctx.w_dtype = w.shape, w.dtype

    @staticmethod
    def backward(ctx, dx):
        (s,), (E, C, D) = ctx.saved_tensors, ctx.w_shape
        T = s.shape[1]
        slices, rows = row_slices(T, E, BLOCK_T, s.device, PROGRAMS)
        parts = torch.empty(E, slices, C, D, device=dx.device, dtype=torch.float32)
        _embed_backward_kernel[(slices, E)](s, dx.contiguous(), parts, T, C, D, rows, **_blocks(C, D))
        return None, parts.sum(1).to(ctx.w_dtype), None

    @staticmethod
    def vmap(info, in_dims, s, w, out_dtype):
        """The members of a vmap are more tables: (E, 1, T) positions and (E, 1, C, D) tables -> E of each (an
        input shared by all members is expanded)."""
        E = info.batch_size
        s, w = (t.movedim(d, 0) if d is not None else t.expand(E, *t.shape) for t, d in zip((s, w), in_dims))
        x = _Embedding.apply(s.flatten(0, 1), w.flatten(0, 1), out_dtype)
        return x.unflatten(0, (E, -1)), 0


def embedding(s: torch.Tensor, w: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """W[s]: s integer states of any shape, W (C, D) -> (*s.shape, D); differentiable in W (as torch's
    F.embedding without its options). The states must lie in [0, C): checking them would make the GPU wait.
    The rows are stored in out_dtype (default W's; engine/fastpath.py looks up an fp32 table's rows in bf16 under
    autocast), W's gradient summed in fp32 and returned in W's dtype. Works under torch.func.vmap."""
    if triton is None:
        raise RuntimeError("the embedding kernel needs triton")
    out_dtype = out_dtype or w.dtype
    if w.dim() != 2 or w.dtype not in DTYPES or out_dtype not in DTYPES or s.dtype not in (torch.int64, torch.int32) \
            or s.numel() == 0:
        raise ValueError(f"embedding takes integer states and a (C, D) table of fp32, bf16 or fp16, got {s.dtype} "
                         f"{tuple(s.shape)} and {w.dtype} {tuple(w.shape)} (rows in {out_dtype})")
    x = _Embedding.apply(s.reshape(1, -1).long(), w[None], out_dtype)
    return x.view(*s.shape, w.shape[1])
