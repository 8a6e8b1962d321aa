"""The model's MLP block in Triton, its hidden layer never stored (Appendix "Network architecture"):

    MLP(h) = W_out GELU(W_in h),   h: rows of D (the block's normalized input), W_in (F, D), W_out (D, F), no biases
    GELU(u) = u Phi(u) = u (1 + erf(u / sqrt 2)) / 2,   GELU'(u) = Phi(u) + u exp(-u^2 / 2) / sqrt(2 pi)

Why: at the paper's width F = 4D the hidden layer is 4x the block's input and output. Done as two matmuls
and a GELU, a training step writes it (pre-activation), reads and writes it (GELU), reads it (W_out), and
in the backward writes, reads and writes its gradient and reads it twice more: ~10 passes over F-wide rows
per MLP, the largest memory traffic of the step (64 models at the paper preset: ~1 GB per pass in bf16).
Here each program keeps a tile of rows' hidden units in registers, F/BLOCK_F columns at a time, and what
goes to memory is D wide: h in, y out. The price is recomputation (matmuls with an inner dimension of D or
of BLOCK_F, on tensor cores):

    forward   per row block:  for each F-chunk c:  u_c = h W_in,c^T;  y += GELU(u_c) W_out,c^T
    dh        per row block:  for each c:  u_c;  du_c = (dy W_out,c) * GELU'(u_c);  dh += du_c W_in,c
    dW        per F-chunk and slice of rows:  u_c, du_c as above;  dW_in,c += du_c^T h;  dW_out,c^T += GELU(u_c)^T dy

9 matmul passes instead of 6. The weight gradients are sums over all rows: each (chunk, slice) program
writes its partial sum and torch adds the slices (deterministic, no atomics). Products run on tensor cores
in the inputs' dtype (bf16 under autocast; fp32 inputs as TF32, which is why the model uses this kernel for
fp32 only when torch's matmuls are TF32 too), sums in fp32; the hidden activations are rounded to the
inputs' dtype before W_out, as torch's bf16 path rounds them.

A leading axis E of independent weight sets (an ensemble's members, engine/ensemble.py) is a grid axis: the vmap
rule stacks the members' rows and weights, and every program reads only its member's.
"""
import json
import os

import torch

from kernels.common import row_slices

try:
    import triton
    import triton.language as tl

    from kernels.common import operand
except ImportError:
    triton = None

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
MAX_D = 64  # a row of D stays in registers; the widest compiled and tested on a GPU (the model's D)
# rows per program, hidden units per chunk and warps of the forward and dh kernels (TILES) and of the dW kernel
# (TILES_DW): mlp_tiles.json beside this file when a sweep wrote one (python bench/bench_mlp.py --sweep
# --write-tiles kernels/mlp_tiles.json, on a GPU), else these defaults
TILES_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mlp_tiles.json")
TILES = dict(BLOCK_M=64, BLOCK_F=64, num_warps=4)
TILES_DW = dict(BLOCK_M=64, BLOCK_F=64, num_warps=4)
if os.path.isfile(TILES_FILE):
    with open(TILES_FILE) as f:
        _table = json.load(f)
    TILES, TILES_DW = _table["TILES"], _table["TILES_DW"]
# the tile sets bench/bench_mlp.py --sweep times (each is forced in tests/test_mlp.py)
SWEEP_TILES = [dict(BLOCK_M=m, BLOCK_F=f, num_warps=w) for m, f, w in
               ((64, 32, 4), (64, 64, 4), (64, 128, 4), (128, 32, 4), (128, 64, 8), (128, 128, 8))]
PROGRAMS = None  # the dW kernel splits the rows until about this many programs run (None: common.row_slices' default)


if triton is not None:

    @triton.jit
    def _gelu(u, DERIVATIVE: tl.constexpr):
        phi = 0.5 * (1.0 + tl.math.erf(u * 0.7071067811865476))  # Phi(u), the normal CDF
        if DERIVATIVE:
            return phi + u * tl.exp(-0.5 * u * u) * 0.3989422804014327  # + u * normal pdf
        return u * phi

    @triton.jit
    def _rows(X, e, m0, M, D, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, UPCAST: tl.constexpr):
        """Member e's rows m0 .. m0 + BLOCK_M of an (E, M, D) tensor, zero-padded: (BLOCK_M, BLOCK_D)."""
        rows = m0 + tl.arange(0, BLOCK_M)
        cols = tl.arange(0, BLOCK_D)
        offsets = (e * M + rows[:, None]).to(tl.int64) * D + cols[None, :]
        x = tl.load(X + offsets, mask=(rows[:, None] < M) & (cols[None, :] < D), other=0.0)
        return operand(x, X.dtype.element_ty, UPCAST)

    @triton.jit
    def _weights(W_IN, W_OUT, e, f0, D, F, BLOCK_F: tl.constexpr, BLOCK_D: tl.constexpr, UPCAST: tl.constexpr):
        """Member e's hidden units f0 .. f0 + BLOCK_F: rows of W_in (BLOCK_F, D) and the same columns of
        W_out, transposed to (BLOCK_F, D); zero past F, so padded units contribute nothing."""
        fs = f0 + tl.arange(0, BLOCK_F)
        cols = tl.arange(0, BLOCK_D)
        mask = (fs[:, None] < F) & (cols[None, :] < D)
        w_in = tl.load(W_IN + e * F * D + fs[:, None] * D + cols[None, :], mask=mask, other=0.0)
        w_out_t = tl.load(W_OUT + e * D * F + cols[None, :] * F + fs[:, None], mask=mask, other=0.0)
        return operand(w_in, W_IN.dtype.element_ty, UPCAST), operand(w_out_t, W_IN.dtype.element_ty, UPCAST)

    @triton.jit
    def _mlp_forward_kernel(H, W_IN, W_OUT, Y, M, D, F,
                        BLOCK_M: tl.constexpr, BLOCK_F: tl.constexpr, BLOCK_D: tl.constexpr, UPCAST: tl.constexpr):
        m0, e = tl.program_id(0) * BLOCK_M, tl.program_id(1)
        h = _rows(H, e, m0, M, D, BLOCK_M, BLOCK_D, UPCAST)
        y = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
        for f0 in range(0, F, BLOCK_F):
            w_in, w_out_t = _weights(W_IN, W_OUT, e, f0, D, F, BLOCK_F, BLOCK_D, UPCAST)
            u = tl.dot(h, tl.trans(w_in))  # (BLOCK_M, BLOCK_F) pre-activations
            y = tl.dot(operand(_gelu(u, False), H.dtype.element_ty, UPCAST), w_out_t, y)
        rows = m0 + tl.arange(0, BLOCK_M)
        cols = tl.arange(0, BLOCK_D)
        tl.store(Y + (e * M + rows[:, None]).to(tl.int64) * D + cols[None, :], y.to(Y.dtype.element_ty),
                 mask=(rows[:, None] < M) & (cols[None, :] < D))

    @triton.jit
    def _mlp_dh_kernel(H, W_IN, W_OUT, DY, DH, M, D, F,
                            BLOCK_M: tl.constexpr, BLOCK_F: tl.constexpr, BLOCK_D: tl.constexpr, UPCAST: tl.constexpr):
        m0, e = tl.program_id(0) * BLOCK_M, tl.program_id(1)
        h = _rows(H, e, m0, M, D, BLOCK_M, BLOCK_D, UPCAST)
        dy = _rows(DY, e, m0, M, D, BLOCK_M, BLOCK_D, UPCAST)
        dh = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
        for f0 in range(0, F, BLOCK_F):
            w_in, w_out_t = _weights(W_IN, W_OUT, e, f0, D, F, BLOCK_F, BLOCK_D, UPCAST)
            u = tl.dot(h, tl.trans(w_in))
            du = tl.dot(dy, tl.trans(w_out_t)) * _gelu(u, True)  # dL/du = (dy W_out) * GELU'(u)
            dh = tl.dot(operand(du, H.dtype.element_ty, UPCAST), w_in, dh)
        rows = m0 + tl.arange(0, BLOCK_M)
        cols = tl.arange(0, BLOCK_D)
        tl.store(DH + (e * M + rows[:, None]).to(tl.int64) * D + cols[None, :], dh.to(DH.dtype.element_ty),
                 mask=(rows[:, None] < M) & (cols[None, :] < D))

    @triton.jit
    def _mlp_dw_kernel(H, W_IN, W_OUT, DY, DW_IN, DW_OUT_T, M, D, F, ROWS_PER_SLICE,
                            BLOCK_M: tl.constexpr, BLOCK_F: tl.constexpr, BLOCK_D: tl.constexpr, UPCAST: tl.constexpr):
        """Partial sums of one F-chunk's weight gradients over one slice of member e's rows, written to
        slot (e, slice): DW_IN, DW_OUT_T (E, slices, F, D)."""
        f0, s, e = tl.program_id(0) * BLOCK_F, tl.program_id(1), tl.program_id(2)
        w_in, w_out_t = _weights(W_IN, W_OUT, e, f0, D, F, BLOCK_F, BLOCK_D, UPCAST)
        dw_in = tl.zeros((BLOCK_F, BLOCK_D), tl.float32)
        dw_out_t = tl.zeros((BLOCK_F, BLOCK_D), tl.float32)
        start = s * ROWS_PER_SLICE
        for m0 in range(start, tl.minimum(start + ROWS_PER_SLICE, M), BLOCK_M):
            h = _rows(H, e, m0, M, D, BLOCK_M, BLOCK_D, UPCAST)
            dy = _rows(DY, e, m0, M, D, BLOCK_M, BLOCK_D, UPCAST)
            u = tl.dot(h, tl.trans(w_in))
            du = tl.dot(dy, tl.trans(w_out_t)) * _gelu(u, True)
            dw_in = tl.dot(tl.trans(operand(du, H.dtype.element_ty, UPCAST)), h, dw_in)  # sum over rows of du^T h
            dw_out_t = tl.dot(tl.trans(operand(_gelu(u, False), H.dtype.element_ty, UPCAST)), dy, dw_out_t)  # of GELU(u)^T dy
        fs = f0 + tl.arange(0, BLOCK_F)
        cols = tl.arange(0, BLOCK_D)
        slot = ((e * tl.num_programs(1) + s) * F + fs[:, None]).to(tl.int64) * D + cols[None, :]
        mask = (fs[:, None] < F) & (cols[None, :] < D)
        tl.store(DW_IN + slot, dw_in, mask=mask)
        tl.store(DW_OUT_T + slot, dw_out_t, mask=mask)


def _constants(h: torch.Tensor) -> dict:
    """BLOCK_D, D padded to a power of two of at least 16 (tl.dot's smallest), and UPCAST (the interpreter in bf16/fp16)."""
    return dict(BLOCK_D=max(16, triton.next_power_of_2(h.shape[-1])), UPCAST=INTERPRET and h.dtype != torch.float32)


class _MLP(torch.autograd.Function):
    """y = W_out GELU(W_in h) for E weight sets at once: h (E, M, D), W_in (E, F, D), W_out (E, D, F), one dtype."""

    @staticmethod
    def forward(h, w_in, w_out):  # contiguous inputs (mlp and the vmap rule make them so)
        E, M, D = h.shape
        y = torch.empty_like(h)
        _mlp_forward_kernel[(triton.cdiv(M, TILES["BLOCK_M"]), E)](h, w_in, w_out, y, M, D, w_in.shape[1],
                                                                 **_constants(h), **TILES)
        return y

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs)

    @staticmethod
    def backward(ctx, dy):
        h, w_in, w_out = ctx.saved_tensors
        dy = dy.contiguous()
        E, M, D = h.shape
        F = w_in.shape[1]
        dh = dw_in = dw_out = None
        if ctx.needs_input_grad[0]:
            dh = torch.empty_like(h)
            _mlp_dh_kernel[(triton.cdiv(M, TILES["BLOCK_M"]), E)](h, w_in, w_out, dy, dh, M, D, F,
                                                                      **_constants(h), **TILES)
        if ctx.needs_input_grad[1] or ctx.needs_input_grad[2]:
            chunks = triton.cdiv(F, TILES_DW["BLOCK_F"])
            slices, rows = row_slices(M, E * chunks, TILES_DW["BLOCK_M"], h.device, PROGRAMS)
            parts = torch.empty((2, E, slices, F, D), device=h.device, dtype=torch.float32)
            _mlp_dw_kernel[(chunks, slices, E)](h, w_in, w_out, dy, parts[0], parts[1], M, D, F, rows,
                                                     **_constants(h), **TILES_DW)
            total = parts.sum(2)  # (2, E, F, D): the slices added in a fixed order
            dw_in, dw_out = total[0].to(w_in.dtype), total[1].transpose(1, 2).to(w_out.dtype)
        return dh, dw_in, dw_out

    @staticmethod
    def vmap(info, in_dims, h, w_in, w_out):
        """The members of a vmap are more weight sets: (E, 1, M, D) -> (E, M, D) for the rows and the same for
        the weights (an input shared by all members is expanded: a copy)."""
        E = info.batch_size
        h, w_in, w_out = (t.movedim(d, 0) if d is not None else t.expand(E, *t.shape)
                          for t, d in zip((h, w_in, w_out), in_dims))
        y = _MLP.apply(*(t.flatten(0, 1).contiguous() for t in (h, w_in, w_out)))
        return y.unflatten(0, (E, -1)), 0


def mlp(h: torch.Tensor, w_in: torch.Tensor, w_out: torch.Tensor) -> torch.Tensor:
    """W_out GELU(W_in h) over the last axis of h (..., D), W_in (F, D), W_out (D, F) (nn.Linear's layouts), all
    of one dtype; differentiable in all three. Works under torch.func.vmap."""
    if triton is None:
        raise RuntimeError("the MLP kernel needs triton")
    D, F = h.shape[-1], w_in.shape[0]
    if w_in.shape != (F, D) or w_out.shape != (D, F) or h.numel() == 0:
        raise ValueError(f"mlp takes h (..., D), W_in (F, D), W_out (D, F), got {tuple(h.shape)}, "
                         f"{tuple(w_in.shape)}, {tuple(w_out.shape)}")
    if D > MAX_D or not h.dtype == w_in.dtype == w_out.dtype or h.dtype not in DTYPES:
        raise ValueError(f"mlp takes D <= {MAX_D} and one dtype of fp32, bf16, fp16, got D = {D}, "
                         f"{h.dtype}, {w_in.dtype}, {w_out.dtype}")
    y = _MLP.apply(h.reshape(1, -1, D).contiguous(), w_in[None].contiguous(), w_out[None].contiguous())
    return y.view(h.shape)
