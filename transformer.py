"""The 2-layer transformer of Appendix "Network architecture" and its readouts (Appendix
"Behavioral readouts", "Mechanistic readouts").

Residual stream, eqs. (model_start)-(model_end):
    x0 = W_E x_n
    y1 = x0 + Att1(x0)          x1 = y1 + MLP1(y1)
    y2 = x1 + Att2(x1)          x2 = y2 + MLP2(y2)          logits = W_U^T x2
Each block normalizes its input with a LayerNorm without affine parameters (eps 1e-5).
Attention is single-head with W_Q, W_K, W_V in R^{D x D}, rotary positions on queries and keys,
scores / sqrt(D), a causal softmax and no output projection. MLPs are D -> 4D -> D with GELU and
no biases; there is no final LayerNorm. GPT-2 initialization: N(0, 1/D), and N(0, 1/(4D)) for the
weights that write into the residual stream (W_V and the MLP output). C = 10, D = 64: 91,392
parameters.

Options used by later experiments (all off by default):
  position="bias"   learned additive relative-position bias P_{i-j} instead of rotary (Fig. 6c)
  mlp1=False        no MLP1 (Fig. 6c bottom)
  mlp_width=W       W hidden units in both MLPs instead of 4D: the width D_phi that sets how many chains the
                    minimal memorization model of Fig. 8d-f can store (mem_minimal.py), here in the full model
  n_tasks=K         task injection: a learned D-vector per chain added to MLP1's input (Sec. "Task Injection")
  prev_weight=w     gradient reweighting of layer-1 previous-token attention (Sec. "Gradient Reweighting"):
                    A_{i,i-1} = w A' + (1 - w) detach(A'), forward unchanged
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from bayes import kl_div
from kernels import attention as kernel
from kernels import embedding as embedding_kernel
from kernels import layer_norm as ln_kernel
from kernels import mlp as mlp_kernel

# ----------------------------------------------------------------------------- attention switch point


def use_kernel(q: torch.Tensor) -> bool:
    """The Triton kernel on CUDA, the PyTorch reference elsewhere (same semantics)."""
    return q.is_cuda and kernel.triton is not None


def attend(q, k, v, bias=None, rotary=False, need_weights=False, prev_weight=1.0):
    """Causal attention over (B, H, N, d) -> (out, A), A (B, H, N, N) when need_weights else None.

    The one place that picks the implementation. Gradient reweighting has to edit A itself, so
    it always takes the reference path."""
    if use_kernel(q) and prev_weight == 1.0:
        if not need_weights:
            return kernel.attention(q, k, v, bias, rotary), None
        out, lse = kernel.attention_forward(q, k, v, bias, rotary)
        return out, kernel.attention_rows(q, k, lse, torch.arange(q.shape[2], device=q.device), bias, rotary)
    A = torch.softmax(kernel.attention_scores(q, k, bias, rotary), -1)  # (B, H, N, N) fp32
    if prev_weight != 1.0:  # scale the gradient through A_{i,i-1} by w, keep its value
        N = q.shape[2]
        prev = torch.eye(N, dtype=torch.bool, device=q.device).roll(-1, 1).tril(-1)  # (i, i - 1)
        A = torch.where(prev, prev_weight * A + (1 - prev_weight) * A.detach(), A)
    return (A @ v.float()).to(v.dtype), A


# ----------------------------------------------------------------------------- blocks


def use_embedding_kernel(W: torch.Tensor) -> bool:
    """The Triton embedding on CUDA tables of the dtypes it takes, torch's elsewhere."""
    return W.is_cuda and W.dtype in embedding_kernel.DTYPES and embedding_kernel.triton is not None


def embed(seqs: torch.Tensor, W_E: torch.Tensor) -> torch.Tensor:
    """x0 = W_E x_n, the row of each state (eq. model_start): on CUDA the Triton kernel (kernels/embedding.py,
    whose gradient needs no sort; torch's lookup is slow under an ensemble's vmap), elsewhere F.embedding."""
    if use_embedding_kernel(W_E):
        return embedding_kernel.embedding(seqs, W_E)
    return F.embedding(seqs, W_E)


def use_layer_norm_kernel(*xs: torch.Tensor) -> bool:
    """The Triton layer norm on CUDA tensors of the dtypes it stores, torch's elsewhere."""
    return all(x.is_cuda and x.dtype in ln_kernel.DTYPES for x in xs) and ln_kernel.triton is not None


def _autocast_dtype() -> torch.dtype | None:
    return torch.get_autocast_dtype("cuda") if torch.is_autocast_enabled("cuda") else None


def layer_norm(x: torch.Tensor) -> torch.Tensor:
    """LN(x) = (x - mu) / sqrt(sigma^2 + eps), no affine parameters (eq. layernorm). On CUDA the Triton
    kernel (kernels/layer_norm.py: torch's is slow on rows of D = 64), elsewhere (and in fp64) torch's; the same
    function. Under CUDA autocast (train.py --bf16) the kernel stores LN(x) in the autocast dtype, which every
    consumer (the projections, MLP's W_in) would cast it to anyway."""
    if use_layer_norm_kernel(x):
        return ln_kernel.layer_norm(x, eps=1e-5, out_dtype=_autocast_dtype())
    return F.layer_norm(x, x.shape[-1:], eps=1e-5)


def add_layer_norm(x: torch.Tensor, r: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + r, LN(x + r)): a residual add and the normalization the next block applies to its result. On CUDA
    one kernel, forward and backward (the residual stream is the largest tensor the step moves; done apart,
    the add, the norm, their gradients' sum and its cast to a bf16 block's dtype each read and write it)."""
    if use_layer_norm_kernel(x, r):
        return ln_kernel.add_layer_norm(x, r, eps=1e-5, out_dtype=_autocast_dtype())
    s = x + r
    return s, layer_norm(s)


def _tf32() -> bool:
    """Whether torch runs fp32 CUDA matmuls as TF32 (train.py --tf32), set by either of torch's two switches."""
    try:
        return torch.backends.cuda.matmul.allow_tf32
    except RuntimeError:  # a process that set the newer fp32_precision switch may not read the older flag
        return torch.backends.cuda.matmul.fp32_precision == "tf32"


def use_mlp_kernel(h: torch.Tensor, dtype: torch.dtype) -> bool:
    """The Triton MLP on CUDA when its matmuls run on tensor cores anyway: in bf16 or fp16 (autocast), or in
    fp32 with TF32 allowed (train.py --tf32); exact fp32 and fp64 stay with torch, and so does D > MAX_D."""
    if not h.is_cuda or mlp_kernel.triton is None or h.shape[-1] > mlp_kernel.MAX_D:
        return False
    return dtype in (torch.bfloat16, torch.float16) or (dtype == torch.float32 and _tf32())


def mlp(h: torch.Tensor, W_in: torch.Tensor, W_out: torch.Tensor) -> torch.Tensor:
    """W_out GELU(W_in h), the MLP block on its normalized input: the Triton kernel (kernels/mlp.py, which never
    stores the hidden layer) where use_mlp_kernel says so, torch's matmuls and GELU elsewhere. The same function.
    Under autocast the matmuls' dtype is the autocast dtype, as torch's would be (fp64 is not autocast)."""
    autocast = _autocast_dtype()
    dtype = autocast if autocast is not None and h.dtype in mlp_kernel.DTYPES else h.dtype
    if use_mlp_kernel(h, dtype):
        return mlp_kernel.mlp(h.to(dtype), W_in.to(dtype), W_out.to(dtype))
    return F.linear(F.gelu(F.linear(h, W_in)), W_out)


class Attention(nn.Module):
    """Att(x)_n = sum_{i <= n} A_ni W_V LN(x)_i with A from LN(x) W_Q, LN(x) W_K (eq. full_att_func)."""

    def __init__(self, D: int, position: str, max_len: int, prev_weight: float = 1.0):
        super().__init__()
        self.W_Q = nn.Linear(D, D, bias=False)
        self.W_K = nn.Linear(D, D, bias=False)
        self.W_V = nn.Linear(D, D, bias=False)
        self.rotary = position == "rotary"
        self.P = nn.Parameter(torch.zeros(1, max_len)) if position == "bias" else None  # P_{i-j}, one head
        self.prev_weight = prev_weight

    def forward(self, x: torch.Tensor, need_weights: bool = False, normed: torch.Tensor | None = None):
        """normed: LN(x), when the caller has it already (add_layer_norm)."""
        B, N, D = x.shape
        h = layer_norm(x) if normed is None else normed
        q, k, v = (W(h).view(B, 1, N, D) for W in (self.W_Q, self.W_K, self.W_V))  # (B, 1, N, D)
        bias = self.P[:, :N] if self.P is not None else None
        out, A = attend(q, k, v, bias, self.rotary, need_weights, self.prev_weight)
        return out.view(B, N, D), (A[:, 0] if A is not None else None)


class MLP(nn.Module):
    """MLP(y) = W_out GELU(W_in LN(y)), D -> width (the paper: 4D) -> D, no biases."""

    def __init__(self, D: int, width: int):
        super().__init__()
        self.W_in = nn.Linear(D, width, bias=False)
        self.W_out = nn.Linear(width, D, bias=False)

    def forward(self, y: torch.Tensor, normed: torch.Tensor | None = None) -> torch.Tensor:
        """normed: LN(y), when the caller has it already (add_layer_norm)."""
        h = layer_norm(y) if normed is None else normed
        return mlp(h, self.W_in.weight, self.W_out.weight)


class Transformer(nn.Module):
    """The paper's two-layer transformer on sequences of C states.

    forward(seqs) -> logits (B, N, C); logits[:, n] predicts s_{n+1} from s_0..s_n.
    forward(seqs, cache=True) -> (logits, cache) with the intermediates, each (B, N, D) unless noted:
        x0 token embedding       A1, A2 attention weights (B, N, N), row = query position
        att1, mlp1, att2, mlp2   block outputs written into the residual stream
        y1, x1, y2, x2           residual stream after each block
    `task` (B,) gives the chain of each sequence when task injection is on; task=None (sequences from
    fresh chains of D_T, whose identity the model cannot have learned) injects the mean of the K learned
    embeddings, the one input that carries no chain identity and stays on the scale seen in training."""

    def __init__(self, C: int = 10, D: int = 64, position: str = "rotary", mlp1: bool = True,
                 n_tasks: int = 0, prev_weight: float = 1.0, max_len: int = 1024, mlp_width: int = 0):
        super().__init__()
        if position not in ("rotary", "bias"):
            raise ValueError(f"position must be 'rotary' or 'bias', got {position!r}")
        if not 0.0 <= prev_weight <= 1.0:
            raise ValueError(f"prev_weight must be in [0, 1], got {prev_weight}")
        self.C, self.D, self.max_len = C, D, max_len
        self.W_E = nn.Embedding(C, D)
        self.att1 = Attention(D, position, max_len, prev_weight)
        width = mlp_width or 4 * D
        if width < 1:
            raise ValueError(f"mlp_width must be >= 1 (0: 4 D), got {mlp_width}")
        self.mlp1 = MLP(D, width) if mlp1 else None
        self.att2 = Attention(D, position, max_len)
        self.mlp2 = MLP(D, width)
        self.W_U = nn.Linear(D, C, bias=False)
        self.task_embedding = nn.Embedding(n_tasks, D) if n_tasks > 0 else None
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self, generator=None):
        """GPT-2 initialization; residual-stream writers (W_V, MLP W_out) get variance 1/(4D)."""
        for name, param in self.named_parameters():
            if name.endswith(".P"):
                param.zero_()
                continue
            writes_residual = name.endswith("W_V.weight") or name.endswith("W_out.weight")
            std = 1 / math.sqrt(4 * self.D) if writes_residual else 1 / math.sqrt(self.D)
            param.normal_(0.0, std, generator=generator)

    def forward(self, seqs: torch.Tensor, cache: bool = False, task: torch.Tensor | None = None):
        if seqs.shape[1] > self.max_len and self.att1.P is not None:
            raise ValueError(f"sequence length {seqs.shape[1]} exceeds max_len {self.max_len}")
        x0 = embed(seqs, self.W_E.weight)
        att1, A1 = self.att1(x0, need_weights=cache)
        y1, ln_y1 = add_layer_norm(x0, att1)  # y1 and the LN(y1) that MLP1 reads
        if self.mlp1 is None:
            mlp1 = torch.zeros_like(y1)
            x1, ln_x1 = y1, ln_y1
        else:
            if self.task_embedding is None:
                mlp1 = self.mlp1(y1, normed=ln_y1)
            else:  # a sequence of unknown chain (D_T) gets the mean over S
                inject = self.task_embedding(task).unsqueeze(1) if task is not None else self.task_embedding.weight.mean(0)
                mlp1 = self.mlp1(y1 + inject)
            x1, ln_x1 = add_layer_norm(y1, mlp1)
        att2, A2 = self.att2(x1, need_weights=cache, normed=ln_x1)
        y2, ln_y2 = add_layer_norm(x1, att2)
        mlp2 = self.mlp2(y2, normed=ln_y2)
        x2 = y2 + mlp2
        logits = self.W_U(x2)
        if not cache:
            return logits
        return logits, dict(x0=x0, A1=A1, att1=att1, y1=y1, mlp1=mlp1, x1=x1, A2=A2, att2=att2, y2=y2, mlp2=mlp2, x2=x2)


# ----------------------------------------------------------------------------- readouts (Appendix "Mechanistic readouts")


def phi_delta(A: torch.Tensor) -> torch.Tensor:
    """Previous-state order parameter: < (1/(N-1)) sum_{n>=1} A[n, n-1] >, A (B, N, N)."""
    return torch.diagonal(A, -1, 1, 2).mean()


def phi_beta(A: torch.Tensor, seqs: torch.Tensor) -> torch.Tensor:
    """Induction-head order parameter: < (1/N) sum_{n>=1} sum_{1<=i<=n} [s_n = s_{i-1}] A[n, i] >:
    the attention a position pays to states that followed earlier occurrences of its own state."""
    N = A.shape[-1]
    match = seqs[:, :, None] == seqs[:, None, :-1]  # (B, n, i - 1)
    return (A[:, :, 1:] * match).sum((1, 2)).mean() / N  # row n = 0 has no i >= 1 to attend to


def n_A(A: torch.Tensor) -> torch.Tensor:
    """Effective number of attended positions at the last position: exp of the expected entropy."""
    last = A[:, -1]
    return torch.exp(-torch.special.xlogy(last, last).sum(-1).mean())


def behavioral_divergence(logp_S: torch.Tensor, logq_S: torch.Tensor, logp_D: torch.Tensor, logq_D: torch.Tensor):
    """D(pi_hat, pi_theta) = 1/2 <D_KL^{S_N}(pi_hat || pi_theta)>_S + 1/2 <...>_{D_T}: logp_* are
    the predictor's and logq_* the model's log-probabilities on sequences from S and from D_T."""
    return 0.5 * kl_div(logp_S, logq_S) + 0.5 * kl_div(logp_D, logq_D)
