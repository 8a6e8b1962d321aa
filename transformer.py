"""The 2-layer transformer of Appendix "Network architecture" and its readouts (Appendix
"Behavioral readouts", "Mechanistic readouts").

Residual stream, eqs. (model_start)-(model_end):
    x0 = W_E x_n
    y1 = x0 + Att1(x0)          x1 = y1 + MLP1(y1)
    y2 = x1 + Att2(x1)          x2 = y2 + MLP2(y2)          logits = W_U^T x2
Each block normalizes its input with a LayerNorm without affine parameters (eq. layernorm, eps 1e-5).
Attention is single-head with W_Q, W_K, W_V in R^{D x D}, rotary positions on queries and keys,
scores / sqrt(D), a causal softmax and no output projection (eq. full_att_func). MLPs are D -> 4D -> D
with GELU and no biases; there is no final LayerNorm. GPT-2 initialization: N(0, 1/D), and N(0, 1/(4D))
for the weights that write into the residual stream (W_V and the MLP output). C = 10, D = 64: 91,392
parameters.

Options used by later experiments (all off by default):
  position="bias"   learned additive relative-position bias P_{i-j} instead of rotary (Fig. 6c)
  mlp1=False        no MLP1 (Fig. 6c bottom)
  mlp_width=W       W hidden units in both MLPs instead of 4D: the width D_phi that sets how many chains the
                    minimal memorization model of Fig. 8d-f can store (mem_minimal.py), here in the full model
  n_tasks=K         task injection: a learned D-vector per chain added to MLP1's input (Sec. "Task Injection")
  prev_weight=w     gradient reweighting of layer-1 previous-token attention (Sec. "Gradient Reweighting"):
                    A_{i,i-1} = w A' + (1 - w) detach(A'), forward unchanged

This file is plain PyTorch and imports only torch. On CUDA, train.py (unless --plain) and the ensembles run the
same model with Triton kernels swapped in from outside (engine/fastpath.py), tested equal to this one to the kernels'
precision (the attention kernel's fp32 dots run in TF32); the kernels' tests compare against `attention_scores`
and `attend` here.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

EPS = 1e-5  # LayerNorm's epsilon
ROTARY_BASE = 10000.0  # rotary angles n * base^(-2f/d)


def layer_norm(x: torch.Tensor) -> torch.Tensor:
    """LN(x) = (x - mu) / sqrt(sigma^2 + eps) over the last axis, no affine parameters (eq. layernorm)."""
    return F.layer_norm(x, x.shape[-1:], eps=EPS)


def rotary_tables(N: int, d: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the rotary angles n * base^(-2f/d) of positions n < N and pairs f < d/2, each (N, d/2) in fp32."""
    inv_freq = ROTARY_BASE ** (-torch.arange(0, d, 2, dtype=torch.float32, device=device) / d)
    angle = torch.arange(N, dtype=torch.float32, device=device)[:, None] * inv_freq[None, :]
    return angle.cos(), angle.sin()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """R_n x in fp32 for rows x (..., N, d) and their angles' cos, sin (N, d/2): each interleaved pair (2f, 2f + 1)
    rotated by its angle."""
    x0, x1 = x.float().unflatten(-1, (-1, 2)).unbind(-1)
    return torch.stack([x0 * cos - x1 * sin, x1 * cos + x0 * sin], -1).flatten(-2)


def attention_scores(q, k, bias=None, rotary=False) -> torch.Tensor:
    """The scores s(i, j) = <R_i q_i, R_j k_j> / sqrt(d) + P_{i-j}, causally masked (-inf for j > i): (B, H, N, N) in
    fp32 for q, k (B, H, N, d). rotary: R_n the rotary embedding, else the identity; bias: the learned table P (H, N),
    or None."""
    B, H, N, d = q.shape
    if rotary:
        cos, sin = rotary_tables(N, d, q.device)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)  # fp32
    s = (q.float() @ k.float().transpose(-1, -2)) / math.sqrt(d)  # (B, H, N, N)
    positions = torch.arange(N, device=q.device)
    rel = positions.view(-1, 1) - positions.view(1, -1)  # i - j
    if bias is not None:
        s = s + bias[:, rel.clamp(0, N - 1)].float().unsqueeze(0)
    return s.masked_fill(rel < 0, float("-inf"))


def attend(q, k, v, bias=None, rotary=False, prev_weight=1.0):
    """Causal softmax attention over q, k, v (B, H, N, d) -> (out (B, H, N, d), A (B, H, N, N) in fp32).

    prev_weight = w < 1: gradient reweighting, A_{i,i-1} = w A + (1 - w) detach(A): the same A, and the
    gradient through the previous-token entries scaled by w."""
    A = torch.softmax(attention_scores(q, k, bias, rotary), -1)  # (B, H, N, N), row i = query position
    if prev_weight != 1.0:
        N = q.shape[2]
        prev = torch.eye(N, dtype=torch.bool, device=q.device).roll(-1, 1).tril(-1)  # the entries (i, i - 1)
        A = torch.where(prev, prev_weight * A + (1 - prev_weight) * A.detach(), A)
    return (A @ v.float()).to(v.dtype), A


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

    def position_bias(self, N: int) -> torch.Tensor | None:
        """P_{i-j} for i - j < N, (1, N); None with rotary positions."""
        if self.P is None:
            return None
        if N > self.P.shape[1]:
            raise ValueError(f"sequence length {N} exceeds max_len {self.P.shape[1]}")
        return self.P[:, :N]

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Att(x) (B, N, D) and the attention weights A (B, N, N)."""
        B, N, D = x.shape
        h = layer_norm(x)
        q, k, v = (W(h).view(B, 1, N, D) for W in (self.W_Q, self.W_K, self.W_V))  # (B, 1, N, D): one head
        out, A = attend(q, k, v, self.position_bias(N), self.rotary, self.prev_weight)
        return out.view(B, N, D), A[:, 0]


class MLP(nn.Module):
    """MLP(y) = W_out GELU(W_in LN(y)), D -> width (the paper: 4D) -> D, no biases."""

    def __init__(self, D: int, width: int):
        super().__init__()
        self.W_in = nn.Linear(D, width, bias=False)
        self.W_out = nn.Linear(width, D, bias=False)

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        return self.W_out(F.gelu(self.W_in(layer_norm(y))))


class Transformer(nn.Module):
    """The paper's two-layer transformer on sequences of C states.

    forward(seqs) -> logits (B, N, C); logits[:, n] predicts s_{n+1} from s_0..s_n.
    forward(seqs, cache=True) -> (logits, cache) with the intermediates, each (B, N, D) unless noted:
        x0 token embedding       A1, A2 attention weights (B, N, N), row = query position
        att1, mlp1, att2, mlp2   block outputs written into the residual stream
        y1, x1, y2, x2           residual stream after each block
    `task` (B,) gives the chain of each sequence when task injection is on (injected)."""

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

    def injected(self, task: torch.Tensor | None) -> torch.Tensor:
        """What task injection adds to MLP1's input: the learned vector of each sequence's chain, (B, 1, D).
        task=None (sequences from fresh chains of D_T, whose identity the model cannot have learned): the mean
        of the K learned vectors, the one input that carries no chain identity and stays on the scale seen in
        training."""
        return self.task_embedding(task).unsqueeze(1) if task is not None else self.task_embedding.weight.mean(0)

    def forward(self, seqs: torch.Tensor, cache: bool = False, task: torch.Tensor | None = None):
        x0 = self.W_E(seqs)  # (B, N, D)
        att1, A1 = self.att1(x0)
        y1 = x0 + att1
        if self.mlp1 is None:
            mlp1 = torch.zeros_like(y1)
        elif self.task_embedding is None:
            mlp1 = self.mlp1(y1)
        else:
            mlp1 = self.mlp1(y1 + self.injected(task))
        x1 = y1 + mlp1
        att2, A2 = self.att2(x1)
        y2 = x1 + att2
        mlp2 = self.mlp2(y2)
        x2 = y2 + mlp2
        logits = self.W_U(x2)  # (B, N, C)
        if not cache:
            return logits
        return logits, dict(x0=x0, A1=A1, att1=att1, y1=y1, mlp1=mlp1, x1=x1, A2=A2, att2=att2, y2=y2, mlp2=mlp2, x2=x2)


# ----------------------------------------------------------------------------- readouts (Appendix "Mechanistic readouts")


def phi_delta(A: torch.Tensor) -> torch.Tensor:
    """Previous-state order parameter (eq. pta): < (1/(N-1)) sum_{n>=1} A[n, n-1] >, A (B, N, N)."""
    return torch.diagonal(A, -1, 1, 2).mean()


def phi_beta(A: torch.Tensor, seqs: torch.Tensor) -> torch.Tensor:
    """Induction-head order parameter (eq. iha): < (1/N) sum_{n>=1} sum_{1<=i<=n} [s_n = s_{i-1}] A[n, i] >:
    the attention a position pays to states that followed earlier occurrences of its own state."""
    N = A.shape[-1]
    match = seqs[:, :, None] == seqs[:, None, :-1]  # (B, n, i - 1)
    return (A[:, :, 1:] * match).sum((1, 2)).mean() / N  # row n = 0 has no i >= 1 to attend to


def n_A(A: torch.Tensor) -> torch.Tensor:
    """Effective number of attended positions at the last position (eq. na): exp of the expected entropy."""
    last = A[:, -1]
    return torch.exp(-torch.special.xlogy(last, last).sum(-1).mean())
