"""The fast path: the transformer of transformer.py with the Triton kernels of kernels/ plugged in from outside.

    fastpath.accelerate(model)    # in place: same parameters, state_dict and optimizer; the kernels' forward

train.py calls it in its CUDA block, and engine/ensemble.py's trainers on CUDA. tests/test_fastpath.py pins the
accelerated model to the plain one, in values and gradients, also under an ensemble's vmap.

accelerate re-classes the model and its blocks to the subclasses below. They add no parameters or buffers, so
the state_dict keys, checkpoints and the optimizer's references stay what they were:
  Embedding    x0 = W_E[s] by kernels/embedding.py: torch's lookup under an ensemble's vmap is a slow gather,
               and its backward sorts the positions
  Attention    kernels/attention.py; the weights A (cache=True) only when asked for, from the saved
               log-sum-exp. Gradient reweighting (prev_weight < 1) edits A itself and keeps the reference.
               W_Q, W_K, W_V run as one projection (fuse_qkv): the kernel reads q, k, v in place from its
               output and writes their gradient as one tensor, so that the backward is one matmul to LN(x),
               not three and two adds of their results (the parameters stay three, as transformer.py has them)
  MLP          kernels/mlp.py, which never stores the hidden layer
  Transformer  the same forward, with each residual add and the LayerNorm of the block that reads its result
               in one kernel (kernels/layer_norm.add_layer_norm: the fp32 residual stream is the largest tensor
               a step moves); the blocks get their normalized input from it (normed=). Layer 1's LN(x0) is
               LN(W_E)[s], the norm of the table's C rows looked up (norm_table); under autocast the last add,
               x2 = y2 + MLP2(y2), is stored in the dtype W_U's matmul would cast it to (fuse_add)

The precision choices that transformer.py does not make are made here:
  - under CUDA autocast (train.py --bf16) the LayerNorm kernels store LN(x) in the autocast dtype, which every
    consumer (the projections, MLP's W_in) would cast it to anyway;
  - the MLP kernel runs where its matmuls run on tensor cores anyway: in bf16 or fp16 (autocast), or in fp32
    with TF32 allowed (train.py --tf32); exact fp32 and fp64 stay with torch's matmuls;
  - every kernel leaves to torch what it does not take: other dtypes, tensors off CUDA (except in Triton's
    interpreter, TRITON_INTERPRET=1, which runs them on the CPU for the tests), D > 64 for the MLP, D not in
    {16, 32, 64, 128} for the attention.
Kernels(...) turns each piece off on its own (bench/bench_train.py times what each one bought).
"""
import os
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

import transformer
from kernels import attention as attention_kernel
from kernels import embedding as embedding_kernel
from kernels import layer_norm as layer_norm_kernel
from kernels import mlp as mlp_kernel

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


@dataclass(frozen=True)
class Kernels:
    """Which pieces run as Triton kernels; all by default."""
    embedding: bool = True
    attention: bool = True
    mlp: bool = True
    layer_norm: bool = True  # off: torch's LayerNorm, and the residual adds apart from it
    fuse_add: bool = True  # each residual add inside the LayerNorm kernel that follows it
    fuse_qkv: bool = True  # W_Q, W_K, W_V as one projection, whose output the attention kernel reads in place
    norm_table: bool = True  # LN(x0) as LN(W_E)[s] where both kernels run: the norm of W_E's C rows, looked up

    def __post_init__(self):
        if self.fuse_add and not self.layer_norm:
            raise ValueError("fuse_add puts the residual add into the layer norm kernel: it needs layer_norm=True")


# ----------------------------------------------------------------------------- what each kernel takes


def _takes(kernel, *xs: torch.Tensor, dtypes=(torch.float32, torch.bfloat16, torch.float16)) -> bool:
    """Whether `kernel`'s module can run on xs: Triton present, CUDA tensors (or the interpreter), dtypes it takes."""
    return kernel.triton is not None and all((x.is_cuda or INTERPRET) and x.dtype in dtypes for x in xs)


def _autocast_dtype() -> torch.dtype | None:
    return torch.get_autocast_dtype("cuda") if torch.is_autocast_enabled("cuda") else None


def _tf32() -> bool:
    """Whether torch runs fp32 CUDA matmuls as TF32 (train.py --tf32), set by either of torch's two switches."""
    try:
        return torch.backends.cuda.matmul.allow_tf32
    except RuntimeError:  # a process that set the newer fp32_precision switch may not read the older flag
        return torch.backends.cuda.matmul.fp32_precision == "tf32"


def layer_norm(x: torch.Tensor, kernels: "Kernels") -> torch.Tensor:
    """transformer.layer_norm, by kernels/layer_norm.py where it takes x (torch's is slow on rows of D = 64)."""
    if kernels.layer_norm and _takes(layer_norm_kernel, x):
        return layer_norm_kernel.layer_norm(x, eps=transformer.EPS, out_dtype=_autocast_dtype())
    return transformer.layer_norm(x)


def embedded_layer_norm(W_E: nn.Embedding, seqs: torch.Tensor, kernels: "Kernels") -> torch.Tensor | None:
    """LN(x0) = LN(W_E)[s] (None where the kernels do not take it: the block normalizes x0 itself). x0's rows are
    rows of W_E, so the norm runs on its C rows, once, and the B N positions only look up; their gradients meet
    in the (C, D) table, where done on x0 they are a norm's backward over the positions and autograd's sum with
    the residual's gradient of x0, each a pass over the fp32 stream."""
    if not (kernels.norm_table and kernels.embedding and kernels.layer_norm and _takes(embedding_kernel, W_E.weight)
            and _takes(layer_norm_kernel, W_E.weight)):
        return None
    table = layer_norm_kernel.layer_norm(W_E.weight, eps=transformer.EPS)  # (C, D) in fp32
    return embedding_kernel.embedding(seqs, table, out_dtype=_autocast_dtype())


class _AddCast(torch.autograd.Function):
    """x + r (one shape) computed in their promoted dtype and stored in out_dtype, one pass (torch's add writes into an
    out tensor of another dtype; out= has no autograd, hence this Function). The gradient goes back in each one's
    dtype."""

    @staticmethod
    def forward(x, r, out_dtype):
        return torch.add(x, r, out=torch.empty(x.shape, device=x.device, dtype=out_dtype))

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.dtypes = inputs[0].dtype, inputs[1].dtype

    @staticmethod
    def backward(ctx, g):
        return g.to(ctx.dtypes[0]), g.to(ctx.dtypes[1]), None

    @staticmethod
    def vmap(info, in_dims, x, r, out_dtype):
        x, r = (t.movedim(d, 0) if d is not None else t.expand(info.batch_size, *t.shape) for t, d in zip((x, r), in_dims))
        return _AddCast.apply(x, r, out_dtype), 0


def add_cast(x: torch.Tensor, r: torch.Tensor, kernels: "Kernels") -> torch.Tensor:
    """x + r for a matmul under autocast: stored in the autocast dtype, which the matmul would cast the fp32 sum to
    (the last residual add, x2 = y2 + MLP2(y2), read only by W_U). The same bits, a pass fewer each way."""
    dtype = _autocast_dtype()
    if kernels.fuse_add and dtype is not None and dtype != torch.result_type(x, r) and x.shape == r.shape:
        return _AddCast.apply(x, r, dtype)
    return x + r


def add_layer_norm(x: torch.Tensor, r: torch.Tensor, kernels: "Kernels") -> tuple[torch.Tensor, torch.Tensor]:
    """(x + r, LN(x + r)): a residual add and the normalization the next block applies to its result, in one
    kernel, forward and backward (done apart, the add, the norm, their gradients' sum and its cast to a bf16
    block output's dtype each read and write the stream)."""
    if kernels.fuse_add and _takes(layer_norm_kernel, x, r):
        return layer_norm_kernel.add_layer_norm(x, r, eps=transformer.EPS, out_dtype=_autocast_dtype())
    s = x + r
    return s, layer_norm(s, kernels)


# ----------------------------------------------------------------------------- the kernel-backed modules


class Embedding(nn.Embedding):
    """x0 = W_E[s] by kernels/embedding.py, whose gradient needs no sort."""
    kernels: Kernels

    def forward(self, seqs: torch.Tensor) -> torch.Tensor:
        if self.kernels.embedding and _takes(embedding_kernel, self.weight):
            return embedding_kernel.embedding(seqs, self.weight)
        return super().forward(seqs)


def attention_rows(q, k, lse, bias=None, rotary=False, rows=None) -> torch.Tensor:
    """The attention weights A[b, h, i, :] of the query rows i in `rows` (default: all) from q, k and the kernel
    forward's log-sum-exp of each row (kernels/attention.attention_forward): the readouts' A without a softmax,
    exp(s(i, j) - lse_i), the scores s of transformer.attention_scores."""
    s = transformer.attention_scores(q, k, bias, rotary)  # (B, H, N, N)
    if rows is not None:
        rows = torch.as_tensor(rows, device=q.device)
        s, lse = s[:, :, rows], lse[:, :, rows]
    return (s - lse[..., None]).exp()


class Attention(transformer.Attention):
    """transformer.Attention by kernels/attention.py. need_weights: also A (else None); normed: LN(x), when
    the caller has it already."""
    kernels: Kernels

    def forward(self, x: torch.Tensor, need_weights: bool = True, normed: torch.Tensor | None = None):
        B, N, D = x.shape
        h = layer_norm(x, self.kernels) if normed is None else normed
        if self.kernels.fuse_qkv:  # LN(x) [W_Q; W_K; W_V]^T, (B, N, 3 D), seen as (3, B, 1, N, D) without a copy
            W_QKV = torch.cat([self.W_Q.weight, self.W_K.weight, self.W_V.weight])
            qkv = F.linear(h, W_QKV).view(B, N, 3, 1, D).permute(2, 0, 3, 1, 4)
            q, k, v = qkv.unbind(0)
        else:
            q, k, v = (W(h).view(B, 1, N, D) for W in (self.W_Q, self.W_K, self.W_V))  # (B, 1, N, D): one head
        bias = self.position_bias(N)
        if not (self.kernels.attention and self.prev_weight == 1.0 and D in (16, 32, 64, 128)
                and _takes(attention_kernel, q, dtypes=(torch.float32, torch.bfloat16))):
            out, A = transformer.attend(q, k, v, bias, self.rotary, self.prev_weight)
        elif need_weights:
            out, lse = attention_kernel.attention_forward(q, k, v, bias, self.rotary)
            A = attention_rows(q, k, lse, bias, self.rotary)
        elif self.kernels.fuse_qkv:  # the gradient comes back as one (B, N, 3 D) tensor: one matmul to LN(x)
            out, A = attention_kernel.attention_packed(qkv, bias, self.rotary), None
        else:
            out, A = attention_kernel.attention(q, k, v, bias, self.rotary), None
        return out.view(B, N, D), (A[:, 0] if need_weights else None)


class MLP(transformer.MLP):
    """transformer.MLP by kernels/mlp.py where its matmuls would run on tensor cores anyway (module docstring).
    normed: LN(y), when the caller has it already."""
    kernels: Kernels

    def forward(self, y: torch.Tensor, normed: torch.Tensor | None = None) -> torch.Tensor:
        h = layer_norm(y, self.kernels) if normed is None else normed
        autocast = _autocast_dtype()
        dtype = autocast if autocast is not None and h.dtype in mlp_kernel.DTYPES else h.dtype  # the matmuls' dtype
        tensor_cores = dtype in (torch.bfloat16, torch.float16) or (dtype == torch.float32 and _tf32())
        if self.kernels.mlp and tensor_cores and h.shape[-1] <= mlp_kernel.MAX_D and _takes(mlp_kernel, h):
            return mlp_kernel.mlp(h.to(dtype), self.W_in.weight.to(dtype), self.W_out.weight.to(dtype))
        return self.W_out(F.gelu(self.W_in(h)))


class Transformer(transformer.Transformer):
    """transformer.Transformer's forward with the residual adds fused into the LayerNorms that follow them."""
    kernels: Kernels

    def forward(self, seqs: torch.Tensor, cache: bool = False, task: torch.Tensor | None = None):
        x0 = self.W_E(seqs)
        att1, A1 = self.att1(x0, need_weights=cache, normed=embedded_layer_norm(self.W_E, seqs, self.kernels))
        y1, h = add_layer_norm(x0, att1, self.kernels)  # y1 and LN(y1), what MLP1 reads
        if self.mlp1 is None:
            mlp1, x1 = torch.zeros_like(y1), y1
        else:
            if self.task_embedding is None:
                mlp1 = self.mlp1(y1, normed=h)
            else:
                mlp1 = self.mlp1(y1 + self.injected(task))
            x1, h = add_layer_norm(y1, mlp1, self.kernels)
        att2, A2 = self.att2(x1, need_weights=cache, normed=h)
        y2, h = add_layer_norm(x1, att2, self.kernels)
        mlp2 = self.mlp2(y2, normed=h)
        if not cache:  # x2 only for W_U: the sum in the dtype W_U's matmul runs in
            return self.W_U(add_cast(y2, mlp2, self.kernels))
        x2 = y2 + mlp2
        logits = self.W_U(x2)
        return logits, dict(x0=x0, A1=A1, att1=att1, y1=y1, mlp1=mlp1, x1=x1, A2=A2, att2=att2, y2=y2, mlp2=mlp2, x2=x2)


# ----------------------------------------------------------------------------- the switch


def accelerate(model: transformer.Transformer, kernels: Kernels = Kernels()) -> Transformer:
    """The model with the kernels' forward, in place (the same object, returned for convenience): the model and
    its blocks re-classed to this module's subclasses, `kernels` saying which pieces run as kernels."""
    if type(model) not in (transformer.Transformer, Transformer):  # a subclass would lose its own methods
        raise TypeError(f"accelerate takes a transformer.Transformer, got {type(model).__name__}")
    swaps = [(model, Transformer), (model.W_E, Embedding)] + [(block, Attention) for block in (model.att1, model.att2)]
    swaps += [(block, MLP) for block in (model.mlp1, model.mlp2) if block is not None]
    for module, cls in swaps:
        module.__class__ = cls
        module.kernels = kernels
    return model
