"""LayerNorm without affine parameters in Triton, forward and backward (the model's eq. layernorm).

    y = LN(x) = (x - mu) / sqrt(sigma^2 + eps),   mu, sigma^2 the mean and variance of a row of D

Why a kernel for four lines of algebra: the model's rows are short (D = 64) and there are many of them
(B N = 32768 per model and step at the paper preset, 64 times that in an ensemble). PyTorch's CUDA
layer norm gives each row a whole thread block, which for rows of 64 reaches ~340 GB/s on an H100
(measured: 3.1 ms per call for a 64-model ensemble, a quarter of its training step; README). Here one
program normalizes a (ROWS, D) tile: one read and one write per element, at memory speed.

Backward, with y the forward's output and g = dL/dy (one row):
    dL/dx = rstd * (g - mean(g) - y * mean(g * y)),   rstd = 1 / sqrt(sigma^2 + eps)
so the backward needs y (which the next linear layer keeps anyway) and one float per row, not x.
All arithmetic is in fp32; dx takes the input's dtype (fp32, bf16 or fp16), and so does y unless out_dtype
asks for another: under autocast (train.py --bf16) an fp32 residual stream gives bf16 rows straight to the
next matmuls, which would otherwise each cast them (and each cast their gradients back). In bf16 the
backward reads y as stored, rounded to bf16, where torch recomputes it from x: dx differs from torch's by ~1e-2.
Works under torch.func.vmap (engine/ensemble.py): the rows of all members are just more rows.

add_layer_norm(x, r) = (s, LN(s)) with s = x + r: the model's residual add and the next block's norm in one
pass (the residual stream, fp32 and D wide, is the largest tensor a training step moves). Its backward takes
ds (from s's later uses) and dy and writes ds + LN'(dy) once per summand dtype:
    one kernel for what were four passes over the stream: the add, the norm, autograd's sum of the two
    gradients of s, and the cast of that sum to a bf16 block output's dtype.
"""
import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # the model falls back to torch's layer norm; the kernel needs triton
    triton = None

ELEMENTS = 4096  # elements per program: 64 rows of D = 64
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _tile(D: int) -> tuple[int, int]:
    """(ROWS, BLOCK_D): D padded to a power of two, rows filling ELEMENTS."""
    block_d = triton.next_power_of_2(D)
    return max(1, ELEMENTS // block_d), block_d


if triton is not None:

    @triton.jit
    def _tile_of_rows(M, D, ROWS: tl.constexpr, BLOCK_D: tl.constexpr):
        """This program's rows (ROWS,), the mask of its (ROWS, BLOCK_D) tile and the tile's offsets."""
        rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
        cols = tl.arange(0, BLOCK_D)
        mask = (rows[:, None] < M) & (cols[None, :] < D)
        return rows, mask, rows[:, None].to(tl.int64) * D + cols[None, :]

    @triton.jit
    def _ln_forward_kernel(X, R, S, Y, RSTD, M, D, eps, ROWS: tl.constexpr, BLOCK_D: tl.constexpr, ADD: tl.constexpr):
        """Y = LN(X), or with ADD: S = X + R and Y = LN(S) (the residual add fused in: one read of each input)."""
        rows, mask, offsets = _tile_of_rows(M, D, ROWS, BLOCK_D)
        x = tl.load(X + offsets, mask=mask, other=0.0).to(tl.float32)
        if ADD:  # Y normalizes S as stored (rounded, when S is bf16 or fp16), as LN(x + r) would
            x = (x + tl.load(R + offsets, mask=mask, other=0.0).to(tl.float32)).to(S.dtype.element_ty)
            tl.store(S + offsets, x, mask=mask)
            x = x.to(tl.float32)
        mean = tl.sum(x, 1) / D
        xc = tl.where(mask, x - mean[:, None], 0.0)  # padding columns must not enter the variance
        rstd = 1.0 / tl.sqrt(tl.sum(xc * xc, 1) / D + eps)
        tl.store(Y + offsets, (xc * rstd[:, None]).to(Y.dtype.element_ty), mask=mask)
        tl.store(RSTD + rows, rstd, mask=rows < M)

    @triton.jit
    def _ln_backward_kernel(Y, DY, RSTD, DS, DX, DR, M, D, ROWS: tl.constexpr, BLOCK_D: tl.constexpr,
                            ADD: tl.constexpr, STORE_DR: tl.constexpr):
        """DX = LN'(DY), or with ADD: DX = DS + LN'(DY) (the gradient that flows through the residual add, summed
        with the normalization's, to both summands), with STORE_DR stored again as DR in the other summand's dtype."""
        rows, mask, offsets = _tile_of_rows(M, D, ROWS, BLOCK_D)
        y = tl.load(Y + offsets, mask=mask, other=0.0).to(tl.float32)
        g = tl.load(DY + offsets, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(RSTD + rows, mask=rows < M, other=0.0)
        mean_g = tl.sum(g, 1) / D
        mean_gy = tl.sum(g * y, 1) / D
        dx = rstd[:, None] * (g - mean_g[:, None] - y * mean_gy[:, None])
        if ADD:
            dx += tl.load(DS + offsets, mask=mask, other=0.0).to(tl.float32)
        if STORE_DR:
            tl.store(DR + offsets, dx.to(DR.dtype.element_ty), mask=mask)
        tl.store(DX + offsets, dx.to(DX.dtype.element_ty), mask=mask)


def _backward(y, rstd, dy, dx_dtype, ds=None, dr_dtype=None):
    """LN'(dy) in dx_dtype from LN's output y and rstd; with ds, (ds + LN'(dy) in dx_dtype, the same in dr_dtype:
    one tensor for both when the dtypes agree, as autograd's add would give)."""
    D = y.shape[-1]
    M = y.numel() // D
    dx = torch.empty_like(y, dtype=dx_dtype)
    store_dr = ds is not None and dr_dtype != dx_dtype
    dr = torch.empty_like(y, dtype=dr_dtype) if store_dr else dx
    rows, block_d = _tile(D)
    _ln_backward_kernel[(triton.cdiv(M, rows),)](y, dy.contiguous(), rstd, ds.contiguous() if ds is not None else dy, dx, dr,
                                                 M, D, ROWS=rows, BLOCK_D=block_d, ADD=ds is not None, STORE_DR=store_dr)
    return dx, dr


class _LayerNorm(torch.autograd.Function):
    """y = LN(x) over the last axis; the rows are all other axes."""

    @staticmethod
    def forward(x, eps, out_dtype):
        x = x.contiguous()
        D = x.shape[-1]
        M = x.numel() // D
        y = torch.empty_like(x, dtype=out_dtype)
        rstd = torch.empty(x.shape[:-1], device=x.device, dtype=torch.float32)
        rows, block_d = _tile(D)
        _ln_forward_kernel[(triton.cdiv(M, rows),)](x, x, x, y, rstd, M, D, eps, ROWS=rows, BLOCK_D=block_d, ADD=False)
        return y, rstd

    @staticmethod
    def setup_context(ctx, inputs, output):
        y, rstd = output
        ctx.mark_non_differentiable(rstd)
        ctx.save_for_backward(y, rstd)
        ctx.x_dtype = inputs[0].dtype
        ctx.set_materialize_grads(False)

    @staticmethod
    def backward(ctx, dy, _):
        if dy is None:
            return None, None, None
        y, rstd = ctx.saved_tensors
        return _backward(y, rstd, dy, ctx.x_dtype)[0], None, None

    @staticmethod
    def vmap(info, in_dims, x, eps, out_dtype):
        """A vmapped axis is one more row axis: move it to the front, normalize, say it is there."""
        x_dim = in_dims[0]  # eps and out_dtype are not tensors, so x is the batched input
        return _LayerNorm.apply(x.movedim(x_dim, 0), eps, out_dtype), (0, 0)


class _AddLayerNorm(torch.autograd.Function):
    """(s, y) = (x + r, LN(x + r)): a residual add and the normalization of its result in one pass. The
    backward gets ds (from s's later uses) and dy, and writes ds + LN'(dy) once per input dtype, the add that
    autograd would otherwise do on its own, and the cast that the bf16 summand's gradient would need."""

    @staticmethod
    def forward(x, r, eps, out_dtype):
        x, r = x.contiguous(), r.contiguous()
        D = x.shape[-1]
        M = x.numel() // D
        s = torch.empty_like(x, dtype=torch.result_type(x, r))
        y = torch.empty_like(x, dtype=out_dtype)
        rstd = torch.empty(x.shape[:-1], device=x.device, dtype=torch.float32)
        rows, block_d = _tile(D)
        _ln_forward_kernel[(triton.cdiv(M, rows),)](x, r, s, y, rstd, M, D, eps, ROWS=rows, BLOCK_D=block_d, ADD=True)
        return s, y, rstd

    @staticmethod
    def setup_context(ctx, inputs, output):
        _, y, rstd = output
        ctx.mark_non_differentiable(rstd)
        ctx.save_for_backward(y, rstd)
        ctx.dtypes = inputs[0].dtype, inputs[1].dtype
        ctx.set_materialize_grads(False)

    @staticmethod
    def backward(ctx, ds, dy, _):
        x_dtype, r_dtype = ctx.dtypes
        if dy is None:  # only the sum was used
            return (None,) * 4 if ds is None else (ds.to(x_dtype), ds.to(r_dtype), None, None)
        y, rstd = ctx.saved_tensors
        if ds is None:  # only the normalization was used
            dx = _backward(y, rstd, dy, x_dtype)[0]
            return dx, dx.to(r_dtype), None, None
        return *_backward(y, rstd, dy, x_dtype, ds, r_dtype), None, None

    @staticmethod
    def vmap(info, in_dims, x, r, eps, out_dtype):
        """Rows again: both summands with the member axis in front (one shared by all members is expanded)."""
        x, r = (t.movedim(d, 0) if d is not None else t.expand(info.batch_size, *t.shape) for t, d in zip((x, r), in_dims))
        return _AddLayerNorm.apply(x, r, eps, out_dtype), (0, 0, 0)


def layer_norm(x: torch.Tensor, eps: float = 1e-5, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """LN(x) over the last axis, no affine parameters; differentiable in x. x: fp32, bf16 or fp16, any shape;
    the result in out_dtype (one of the same; default x's)."""
    if triton is None:
        raise RuntimeError("the layer norm kernel needs triton")
    if x.dim() == 0 or x.shape[-1] == 0 or x.numel() == 0:
        raise ValueError(f"layer_norm needs a non-empty last axis, got shape {tuple(x.shape)}")
    out_dtype = out_dtype or x.dtype
    if x.dtype not in DTYPES or out_dtype not in DTYPES:
        raise ValueError(f"layer_norm computes in fp32 and stores fp32, bf16 or fp16, got {x.dtype} -> {out_dtype}")
    return _LayerNorm.apply(x, float(eps), out_dtype)[0]


def add_layer_norm(x: torch.Tensor, r: torch.Tensor, eps: float = 1e-5,
                   out_dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + r, LN(x + r)), differentiable in both: the sum in torch's promoted dtype of the two (an fp32 residual
    stream plus a bf16 block output is fp32), the normalized rows in out_dtype (default: the sum's)."""
    if triton is None:
        raise RuntimeError("the layer norm kernel needs triton")
    if x.shape != r.shape:
        raise ValueError(f"add_layer_norm adds tensors of one shape, got {tuple(x.shape)} and {tuple(r.shape)}")
    if x.dim() == 0 or x.shape[-1] == 0 or x.numel() == 0:
        raise ValueError(f"add_layer_norm needs a non-empty last axis, got shape {tuple(x.shape)}")
    out_dtype = out_dtype or torch.result_type(x, r)
    if any(dtype not in DTYPES for dtype in (x.dtype, r.dtype, out_dtype)):
        raise ValueError(f"add_layer_norm computes in fp32 and reads and stores fp32, bf16 or fp16, got "
                         f"{x.dtype} + {r.dtype} -> {out_dtype}")
    s, y, _ = _AddLayerNorm.apply(x, r, float(eps), out_dtype)
    return s, y
