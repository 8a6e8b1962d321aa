"""SA-transformer: the symmetry-constrained attention-only transformer, its theory, and the
scaling of tau_2Gen (Sec. "The transition from G1 to G2"; Appendix "Minimal Network for
Generalization in the Limit K -> inf", "Dynamics of the SA-transformer", "Testing predictions";
Figs. 5b-c, 6 and the appendix figures on w_A..w_D, F_d and the near-origin landscape).

The model, eq. (base_model), on one-hot states x_1..x_N, predicting s_{N+1} (non-autoregressive):
    A1_{ji} = softmax_{j <= i}( x_j^T M1 x_i + P1_{i-j} )            h_i = sum_{j <= i} A1_{ji} x_j
    A2_{iN} = softmax_{i <= N}( x1_i^T M2 x1_N + P2_{N-i} )          x1_i = x_i (+) h_i   (2C-dim)
    pi = w_A x_N + w_B h_N + w_C sum_i A2_{iN} x_i + w_D sum_i A2_{iN} h_i
with (w_A..w_D) = softmax of logits (w_A's fixed at 0, three learnable, all weights 1/4 at start)
and M1 (C x C), M2 (2C x 2C), P1, P2 (relative positions) initialized at zero and unconstrained.
delta = P1 at i - j = 1 (the paper's P^(1)_{-1}); beta = mean diagonal of the M2 block that lets a
key's layer-1 content h_i meet the query's state x_N (the paper's beta^(2)_3, bottom-left block).
The reduced model, eq. (minimal_simple), keeps only beta, delta and the mixture weights.

Layer-1 attention factorizes into a content term and a position term, so all N query positions
of all B sequences cost one (N, N) @ (N, B C) product instead of B N^2 separate weights.

    python sa_transformer.py                 # quick preset (CPU, ~15 min on 2 cores)
    python sa_transformer.py --preset paper  # the paper's sizes and seeds
"""
import json
import math
import os
import time
from dataclasses import asdict, dataclass

import matplotlib.pyplot as plt
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import cli
from bayes import nll, one_gen, two_gen
from markov import ablate_bias, check_int, sample_chains, sample_sequences, stationary
from transformer import Transformer

C = 10

# ----------------------------------------------------------------------------- the model


def layer1(seqs: torch.Tensor, X: torch.Tensor, M1: torch.Tensor, P1: torch.Tensor) -> torch.Tensor:
    """h_i = sum_{j <= i} A1_{ji} x_j at every position i: (B, N, C); X = one_hot(seqs).

    A1_{ji} is proportional to exp(M1[s_j, s_i]) exp(P1[i - j]), so the numerator for state tau is
    exp(M1[tau, s_i]) (E X)_{i tau} with E_{ij} = exp(P1[i - j]) (j <= i) shared by all sequences."""
    B, N = seqs.shape
    lag = torch.arange(N, device=seqs.device).view(N, 1) - torch.arange(N, device=seqs.device).view(1, N)
    pos = P1[lag.clamp(min=0)].masked_fill(lag < 0, -math.inf)  # (N, N): P1[i - j], causal
    E = torch.exp(pos - pos.max())  # one global shift: cancels in every row's normalization
    Y = (E @ X.transpose(0, 1).reshape(N, B * C)).view(N, B, C).transpose(0, 1)  # (B, N, C): sum_j E_ij [s_j = tau]
    content = torch.exp(M1 - M1.max(0, keepdim=True).values)  # column mu shifted by its max: cancels per query state
    numerator = content.T[seqs] * Y  # (B, N, C): exp(M1[tau, s_i]) (E X)_{i tau}
    return numerator / numerator.sum(-1, keepdim=True)


def experts(seqs: torch.Tensor, M1, P1, M2, P2, h: torch.Tensor | None = None) -> torch.Tensor:
    """The four experts' predictive distributions at the last position, (B, 4, C): the paths
    x_N, h_N, sum_i A2_iN x_i and sum_i A2_iN h_i through the two attention layers (h: layer 1's
    output, when already computed)."""
    B, N = seqs.shape
    X = F.one_hot(seqs, C).to(P1.dtype)  # (B, N, C)
    h = layer1(seqs, X, M1, P1) if h is None else h
    x1 = torch.cat([X, h], -1)  # (B, N, 2C)
    query = x1[:, -1] @ M2.T  # (B, 2C): M2 x1_N
    scores = (x1 @ query.unsqueeze(-1)).squeeze(-1) + P2.flip(0)  # (B, N): x1_i . M2 x1_N + P2[N - i]
    A2 = torch.softmax(scores, -1).unsqueeze(1)  # (B, 1, N)
    return torch.stack([X[:, -1], h[:, -1], (A2 @ X).squeeze(1), (A2 @ h).squeeze(1)], 1)


class SATransformer(nn.Module):
    """Eq. (base_model). reduced=True: eq. (minimal_simple), parameters beta, delta and the weights."""

    def __init__(self, N: int, reduced: bool = False):
        super().__init__()
        self.N, self.reduced = N, reduced
        self.logits = nn.Parameter(torch.zeros(3))  # w_B, w_C, w_D relative to w_A (fixed logit 0)
        self.fixed_weights = None  # set to a (4,) tensor to hold w_A..w_D fixed
        if reduced:
            self.beta = nn.Parameter(torch.zeros(()))
            self.delta = nn.Parameter(torch.zeros(()))
        else:
            self.M1 = nn.Parameter(torch.zeros(C, C))
            self.P1 = nn.Parameter(torch.zeros(N))  # P1[i - j], i - j = 0..N-1
            self.M2 = nn.Parameter(torch.zeros(2 * C, 2 * C))
            self.P2 = nn.Parameter(torch.zeros(N))

    def weights(self) -> torch.Tensor:
        """(w_A, w_B, w_C, w_D)."""
        if self.fixed_weights is not None:
            return self.fixed_weights
        return torch.softmax(torch.cat([self.logits.new_zeros(1), self.logits]), 0)

    def attention_parameters(self):
        """(M1, P1, M2, P2); the reduced model's are zero but for P1[1] = delta and M2's beta block."""
        if not self.reduced:
            return self.M1, self.P1, self.M2, self.P2
        z = self.beta.new_zeros
        P1 = z(self.N).index_put((torch.tensor([1]),), self.delta.view(1))
        M2 = z(2 * C, 2 * C).index_put((torch.arange(C, 2 * C), torch.arange(C)), self.beta.expand(C))
        return z(C, C), P1, M2, z(self.N)

    def beta_delta(self) -> tuple[float, float]:
        """delta = P1[1] (attention to the previous state); beta = mean diagonal of M2[C:, :C]."""
        _, P1, M2, _ = self.attention_parameters()
        return torch.diagonal(M2[C:, :C]).mean().item(), P1[1].item()

    def forward(self, seqs: torch.Tensor) -> torch.Tensor:
        """pi (B, C): the predictive distribution of s_{N+1} given seqs (B, N)."""
        return torch.einsum("e,bec->bc", self.weights(), experts(seqs, *self.attention_parameters()))


def target_loss(pi: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(raw, present): -log pi(target) clamped at 1e-12, and whether the target occurs in the context.

    pi has no smoothing: a target absent from the context gets probability 0 and no gradient, so
    the masked loss over `present` samples is the meaningful one (tau is defined on it)."""
    p = pi.gather(1, target.view(-1, 1)).squeeze(1)
    return -p.clamp_min(1e-12).log(), p > 0


# ----------------------------------------------------------------------------- data and levels


def fresh_batch(B: int, N: int, generator, ablate: bool = False):
    """K = infinity: every sequence from its own chain of D_T. Returns (context (B, N), target (B,))."""
    T = sample_chains(B, C, 1.0, generator)
    seqs, _ = sample_sequences(T, B, N + 1, generator, chain_idx=torch.arange(B))
    if ablate:
        seqs = ablate_bias(seqs, stationary(T), generator)
    return seqs[:, :N], seqs[:, N]


ALPHAS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0)


def predictor_levels(context: torch.Tensor, target: torch.Tensor) -> dict:
    """Losses at the last position, over all samples and over those whose target occurs in the
    context ("masked"), of the Bayes 1-Gen and 2-Gen predictors and of the two plateaus that tau is
    measured from: the SA-transformer's 1-Gen solution (raw frequencies k_tau / N, which is what
    its experts compute at beta = delta = 0) and the best smoothed frequencies (n_tau + alpha') /
    (N + C alpha') over alpha' (the 1-point predictor a transformer can learn on its plateau)."""
    seqs = torch.cat([context, target[:, None]], 1)
    present = (context == target[:, None]).any(1)

    def last(logp):
        loss = nll(logp, seqs)[:, -1]
        return loss.mean().item(), loss[present].mean().item()

    out = {}
    out["loss_1gen"], out["masked_loss_1gen"] = last(one_gen(seqs, C))
    out["loss_2gen"], out["masked_loss_2gen"] = last(two_gen(seqs, C))
    out["masked_loss_frequencies"] = last(one_gen(seqs, C, alpha=0.0))[1]
    out["loss_best_1gen"] = min(last(one_gen(seqs, C, alpha=a))[0] for a in ALPHAS)
    return out


# ----------------------------------------------------------------------------- training


@dataclass
class Run:
    N: int = 64
    seed: int = 0
    reduced: bool = False
    ablate: bool = False
    iters: int = 4000
    batch: int = 256
    lr: float = 1.0
    eval_every: int = 25
    eval_batch: int = 2048
    freeze_weights: tuple | None = None  # hold (w_A..w_D) fixed (reduced model during the plateau)
    snapshots: tuple = ()  # iterations at which to store P1, P2, M2
    stop_after: float = 0.0  # if > 0, stop at stop_after x tau once the loss has crossed (saves time)


def crossing(t: list, y: list, level: float) -> float:
    """First time y(t) falls below level, linearly interpolated between evaluations; nan if never."""
    for i in range(1, len(t)):
        if y[i] < level <= y[i - 1]:
            return t[i - 1] + (y[i - 1] - level) / (y[i - 1] - y[i]) * (t[i] - t[i - 1])
    return math.nan


def train_sa(run: Run) -> dict:
    """SGD (lr 1, batch 256) on fresh chains; the trajectory of losses and parameters.

    tau_2Gen: the first time the masked eval loss falls halfway from the model's 1-Gen plateau
    (the raw frequencies its experts compute at beta = delta = 0) to the Bayes 2-Gen loss."""
    g = torch.Generator().manual_seed(run.seed)
    eval_context, eval_target = fresh_batch(run.eval_batch, run.N, torch.Generator().manual_seed(10**6 + run.N), run.ablate)
    levels = predictor_levels(eval_context, eval_target)
    threshold = 0.5 * (levels["masked_loss_frequencies"] + levels["masked_loss_2gen"])
    model = SATransformer(run.N, run.reduced)
    if run.freeze_weights is not None:
        model.fixed_weights = torch.tensor(run.freeze_weights, dtype=torch.float32)
        model.logits.requires_grad_(False)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=run.lr)
    traj = {k: [] for k in ("t", "loss", "masked_loss", "beta", "delta", "w")}
    traj["snapshots"] = {}
    for t in range(run.iters + 1):
        if t % run.eval_every == 0 or t == run.iters:
            with torch.no_grad():
                raw, present = target_loss(model(eval_context), eval_target)
            beta, delta = model.beta_delta()
            for key, value in (("t", t), ("loss", raw.mean().item()), ("masked_loss", raw[present].mean().item()),
                               ("beta", beta), ("delta", delta), ("w", model.weights().tolist())):
                traj[key].append(value)
            if t in run.snapshots and not run.reduced:
                traj["snapshots"][t] = {k: v.detach().tolist() for k, v in zip(("M1", "P1", "M2", "P2"), model.attention_parameters())}
            tau = crossing(traj["t"], traj["masked_loss"], threshold)
            if run.stop_after > 0 and t >= run.stop_after * tau:  # nan compares False
                break
        if t == run.iters:
            break
        context, target = fresh_batch(run.batch, run.N, g, run.ablate)
        raw, _ = target_loss(model(context), target)
        opt.zero_grad(set_to_none=True)
        raw.mean().backward()
        opt.step()
    return {"run": asdict(run), "levels": levels, "tau": crossing(traj["t"], traj["masked_loss"], threshold), **traj}


def train_transformer_nonautoregressive(N: int, seed: int, iters: int, lr: float = 0.1, momentum: float = 0.9,
                                        batch: int = 128, eval_every: int = 25, eval_batch: int = 1024,
                                        stop_after: float = 0.0) -> dict:
    """Fig. 6c bottom: the 2-layer transformer without MLP1 and with additive relative-position
    biases, trained on the last position only by SGD with momentum. tau_2Gen: the first time its
    eval loss falls halfway from the best smoothed 1-point predictor to the Bayes 2-Gen loss."""
    g = torch.Generator().manual_seed(seed)
    eval_context, eval_target = fresh_batch(eval_batch, N, torch.Generator().manual_seed(10**6 + N))
    levels = predictor_levels(eval_context, eval_target)
    threshold = 0.5 * (levels["loss_best_1gen"] + levels["loss_2gen"])
    model = Transformer(C, 64, position="bias", mlp1=False, max_len=N)
    model.reset_parameters(torch.Generator().manual_seed(seed))
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    t_list, losses = [], []
    for t in range(iters + 1):
        if t % eval_every == 0 or t == iters:
            with torch.no_grad():
                losses.append(F.cross_entropy(model(eval_context)[:, -1], eval_target).item())
            t_list.append(t)
            if stop_after > 0 and t >= stop_after * crossing(t_list, losses, threshold):
                break
        if t == iters:
            break
        context, target = fresh_batch(batch, N, g)
        loss = F.cross_entropy(model(context)[:, -1], target)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return {"N": N, "seed": seed, "t": t_list, "loss": losses, "levels": levels, "tau": crossing(t_list, losses, threshold)}


# ----------------------------------------------------------------------------- theory


def F_d(d_max: int, n_chains: int, alpha: float = 1.0, seed: int = 0) -> list[float]:
    """F_d = < sum_mu (T^{d+1})_{mu mu} > - 1 over D_T, d = 1..d_max, by Monte Carlo (eq. sa_cdelta)."""
    T = sample_chains(n_chains, C, alpha, torch.Generator().manual_seed(seed)).double()
    out, power = [], T @ T
    for _ in range(d_max):
        out.append((torch.diagonal(power, 0, 1, 2).sum(-1).mean() - 1).item())
        power = power @ T
    return out


def F1_exact(alpha: float = 1.0) -> float:
    """F_1 = (C - 1) / (C^2 alpha + C) for a symmetric Dirichlet(alpha) ensemble."""
    return (C - 1) / (C**2 * alpha + C)


def I_coefficient(n_chains: int, seed: int = 0) -> float:
    """I = < sum_mu p_mu^2 ( sum_tau T_{tau mu}^2 / p_tau - 1 ) > (eq. sa_cbeta), by Monte Carlo."""
    T = sample_chains(n_chains, C, 1.0, torch.Generator().manual_seed(seed)).double()
    p = stationary(T)
    return ((p**2) * ((T**2 / p.unsqueeze(-1)).sum(1) - 1)).sum(-1).mean().item()


def predicted_rates(N: int, I: float, w_B: float = 1 / 3, w_C: float = 1 / 3) -> dict:
    """Eq. (parameter_dynamics_simplest) near beta = delta = 0 with lr = 1: d beta / dt = w_C I H_N / N
    and d delta / dt = w_B F_1 / N (the paper sets w_B = w_C = 1/3). For the scalar beta of the
    reduced model; each of the C diagonal entries of the full model's M2 block gets 1/C of it."""
    H = sum(1 / i for i in range(1, N + 1))
    return {"dbeta_dt": w_C * I * H / N, "ddelta_dt": w_B * F1_exact() / N}


def landscape(context, target, betas, deltas, em_steps: int = 5000) -> np.ndarray:
    """Reduced-model loss over a (delta, beta) grid with w_A..w_D optimized at every point
    (masked samples). With the experts fixed, the optimal mixture weights come from EM:
    w_e <- < w_e p_e / sum_e' w_e' p_e' > over samples, which never decreases the likelihood.
    EM is slow where the best mixture has a weight near 0: 200 steps left the loss near the origin
    (N = 64, 2048 sequences) up to 1.2e-3 above its value after 5000 steps, as large as the slopes
    measured there; 5000 steps match an L-BFGS minimization to 1e-4 (tests)."""
    present = (context == target[:, None]).any(1)
    context, target = context[present], target[present]
    out = np.zeros((len(deltas), len(betas)))
    model = SATransformer(context.shape[1], reduced=True)
    for i, delta in enumerate(deltas):
        with torch.no_grad():
            model.delta.fill_(delta)
            M1, P1, _, _ = model.attention_parameters()
            h = layer1(context, F.one_hot(context, C).float(), M1, P1)  # depends on delta only
            per_beta = []
            for beta in betas:
                model.beta.fill_(beta)
                e = experts(context, *model.attention_parameters(), h=h)  # (B, 4, C)
                per_beta.append(e.gather(2, target.view(-1, 1, 1).expand(-1, 4, 1)).squeeze(2))  # (B, 4)
            p = torch.stack(per_beta).double()  # (G, B, 4): each expert's probability of the target
            w = torch.full((len(betas), 1, 4), 0.25, dtype=torch.float64)
            for _ in range(em_steps):
                resp = p * w / (p * w).sum(-1, keepdim=True).clamp_min(1e-300)
                w = resp.mean(1, keepdim=True)
            out[i] = (-(p * w).sum(-1).clamp_min(1e-300).log().mean(1)).numpy()
    return out


def fit_rate(t, y, lo: float, hi: float) -> float:
    """Slope of y against t over lo <= t <= hi (nan with fewer than 3 points)."""
    t, y = np.asarray(t, float), np.asarray(y, float)
    keep = (t >= lo) & (t <= hi)
    return float(np.polyfit(t[keep], y[keep], 1)[0]) if keep.sum() >= 3 else math.nan


def fit_power(t, y, lo: float, hi: float) -> float:
    """Slope of log y against log t over lo <= t <= hi (points with y > 0 and t > 0)."""
    t, y = np.asarray(t, float), np.asarray(y, float)
    keep = (t >= lo) & (t <= hi) & (y > 0) & (t > 0)
    if keep.sum() < 3:
        return math.nan
    return float(np.polyfit(np.log(t[keep]), np.log(y[keep]), 1)[0])


# ----------------------------------------------------------------------------- figures

COLORS = {"control": "tab:blue", "ablation": "tab:red"}


def plot_dynamics(dyn: dict, path: str):
    """Fig. 5b and the w_A..w_D figure: masked loss vs iterations against the 1-Gen / 2-Gen levels
    (every seed, control and ablation), and the mixture weights of the full model."""
    fig, axes = plt.subplots(1, 3, figsize=(16, 4))
    for ax, ablate in ((axes[0], False), (axes[1], True)):
        runs = dyn[(False, ablate)]
        for i, r in enumerate(runs):
            ax.plot(r["t"], r["masked_loss"], color="k", alpha=1.0 if i == 0 else 0.35, lw=1)
        ax.axhline(np.mean([r["levels"]["masked_loss_frequencies"] for r in runs]), color="tab:green", ls=":",
                   label="raw frequencies (the SA 1-Gen plateau)")
        ax.axhline(np.mean([r["levels"]["masked_loss_1gen"] for r in runs]), color="tab:green", ls="--", label="1-Gen (Bayes)")
        ax.axhline(np.mean([r["levels"]["masked_loss_2gen"] for r in runs]), color="tab:blue", ls="--", label="2-Gen (Bayes)")
        ax.set_title(f"SA-transformer, N = {runs[0]['run']['N']}, {'bias ablation' if ablate else 'control'}")
        ax.set_xlabel("iteration")
        ax.set_ylabel("loss on samples whose target is in the context")
        ax.legend()
    r = dyn[(False, False)][0]
    w = np.array(r["w"])
    for k, name in enumerate("ABCD"):
        axes[2].plot(r["t"], w[:, k], label=f"w_{name}")
    axes[2].set_title("mixture weights (control, seed 0)")
    axes[2].set_xlabel("iteration")
    axes[2].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_parameters(run: dict, path: str):
    """Fig. 5c and the appendix parameter figure: P1, P2 and the four C x C blocks of M2 over training."""
    snaps = sorted(run["snapshots"].items(), key=lambda kv: int(kv[0]))
    fig, axes = plt.subplots(len(snaps), 6, figsize=(16, 2.4 * len(snaps)), squeeze=False)
    for row, (t, p) in zip(axes, snaps):
        P1, P2, M2 = np.array(p["P1"]), np.array(p["P2"]), np.array(p["M2"])
        row[0].bar(range(12), P1[:12])
        row[0].set_title(f"t = {t}: P1[i - j], i - j < 12", fontsize=8)
        row[1].bar(range(12), P2[:12])
        row[1].set_title("P2[N - i], first 12", fontsize=8)
        lim = max(1e-6, np.abs(M2).max())
        for k, (name, block) in enumerate((("M2 x.x", M2[:C, :C]), ("M2 x.h", M2[:C, C:]), ("M2 h.x (beta)", M2[C:, :C]), ("M2 h.h", M2[C:, C:]))):
            row[2 + k].imshow(block, cmap="RdBu_r", vmin=-lim, vmax=lim)
            row[2 + k].set_title(f"{name} (key . query)", fontsize=8)
            row[2 + k].set_xticks([])
            row[2 + k].set_yticks([])
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_theory(result: dict, path: str):
    """F_d against d with the closed form F_1; the loss landscape over (beta, delta) with w optimized
    (Fig. 6a); and near the origin for the original and the bias-ablated data."""
    fig, axes = plt.subplots(1, 4, figsize=(18, 4))
    d = np.arange(1, len(result["F_d"]) + 1)
    axes[0].semilogy(d, np.abs(result["F_d"]), "o-", label="|F_d| (Monte Carlo)")
    axes[0].axhline(result["F1_exact"], color="k", ls="--", label="F_1 = (C-1)/(C^2 alpha + C)")
    axes[0].set_xlabel("d")
    axes[0].set_title("F_d = <sum_mu (T^{d+1})_{mu mu}> - 1")
    axes[0].legend(fontsize=8)
    L = result["landscape"]
    im = axes[1].pcolormesh(L["beta"], L["delta"], np.array(L["loss"]), shading="nearest", cmap="viridis")
    fig.colorbar(im, ax=axes[1])
    axes[1].set_xlabel("beta")
    axes[1].set_ylabel("delta")
    axes[1].set_title(f"loss at N = {L['N']}, w_A..w_D optimized", fontsize=9)
    O = result["landscape_origin"]
    for ax, key in ((axes[2], "control"), (axes[3], "ablation")):
        loss = np.array(O[key])
        im = ax.pcolormesh(O["beta"], O["delta"], loss - loss[len(O["delta"]) // 2, len(O["beta"]) // 2],
                           shading="nearest", cmap="RdBu_r")
        fig.colorbar(im, ax=ax)
        ax.set_xlabel("beta")
        ax.set_ylabel("delta")
        ax.set_title(f"near the origin, N = {result['landscape_origin']['N']}, {key} (minus loss at 0)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_scaling(dyn: dict, frozen: dict, result: dict, path: str):
    """Fig. 6b-c: beta and delta against t (control vs ablation; full, reduced and frozen-w models),
    and tau_2Gen against N for the SA-transformer and the transformer."""
    fig, axes = plt.subplots(1, 4, figsize=(19, 4))
    for col, key in ((0, "beta"), (1, "delta")):
        ax = axes[col]
        for (reduced, ablate), runs in dyn.items():
            label = f"{'reduced' if reduced else 'full'}, {'ablation' if ablate else 'control'}"
            t, mean = seed_mean(runs, key)
            keep = (t > 0) & (mean > 0)
            ax.loglog(t[keep], mean[keep], color=COLORS["ablation" if ablate else "control"], ls=":" if reduced else "-", label=label)
        for ablate, runs in frozen.items():
            t, mean = seed_mean(runs, key)
            keep = (t > 0) & (mean > 0)
            ax.loglog(t[keep], mean[keep], color=COLORS["ablation" if ablate else "control"], ls="--", lw=1,
                      label=f"reduced, w frozen, {'ablation' if ablate else 'control'}")
        t, mean = seed_mean(dyn[(False, False)], key)
        keep = (t > 0) & (mean > 0)
        if keep.any():  # guides through the control curve's first point
            t_ref = np.array([t[keep][0], t[keep][-1]])
            ax.loglog(t_ref, mean[keep][0] * (t_ref / t_ref[0]), "k:", lw=0.8, label="~ t")
            ax.loglog(t_ref, mean[keep][0] * (t_ref / t_ref[0]) ** 2, "k-.", lw=0.8, label="~ t^2")
        ax.set_ylim(bottom=max(1e-5, ax.get_ylim()[0]))
        ax.set_xlabel("iteration t")
        ax.set_title(f"{key} (mean over seeds); exponents in sa_scaling.json", fontsize=9)
        ax.legend(fontsize=6)
    for ax, key, title in ((axes[2], "tau", "SA-transformer"), (axes[3], "tau_transformer", "transformer, no MLP1, non-AR")):
        points = [(int(N), tau) for N, taus in result[key].items() for tau in taus if np.isfinite(tau)]
        ax.set_title(title)
        if not points:
            ax.text(0.5, 0.5, "not run (quick preset; add --transformer)" if not result[key] else "no transition within the budget",
                    ha="center", transform=ax.transAxes)
            continue
        ax.plot(*zip(*points), "o", color="k", alpha=0.5)
        Ns = np.array(sorted({N for N, _ in points}))
        mean = np.array([np.mean([tau for N2, tau in points if N2 == N]) for N in Ns])
        x = Ns / np.log(Ns)
        ax.plot(Ns, np.exp(np.mean(np.log(mean) - np.log(x))) * x, "b--", label="~ N / log N")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("N")
        ax.set_ylabel("tau_2Gen (iterations)")
        ax.set_title(f"{title}: slope vs N/log N = {result[key + '_fit_exponent']:.2f}", fontsize=9)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ----------------------------------------------------------------------------- experiments


PRESETS = {
    # N_tau: lengths for tau_2Gen(N); N_dyn: length of the dynamics / ablation runs (seeds_dyn for the
    # full model, seeds_reduced for the reduced and frozen-weight ones); the transformer runs (Fig. 6c
    # bottom) are too slow for a CPU budget and only run in the quick preset with --transformer
    "quick": dict(N_tau=[32, 64, 128, 256], seeds_tau=2, N_dyn=64, seeds_dyn=3, seeds_reduced=2, transformer=False,
                  N_transformer=[16, 32, 64], seeds_transformer=1, transformer_iters=3000,
                  eval_batch=1024, landscape_batch=4096, mc_chains=200_000, stop_after=1.2),
    "paper": dict(N_tau=[32, 64, 128, 256, 512, 1024], seeds_tau=8, N_dyn=128, seeds_dyn=5, seeds_reduced=5, transformer=True,
                  N_transformer=[32, 64, 128, 256, 512], seeds_transformer=8, transformer_iters=200_000,
                  eval_batch=4096, landscape_batch=16384, mc_chains=1_000_000, stop_after=2.0),
}


def iters_cap(N: int) -> int:
    """Iteration budget: a few times the tau measured at N = 64 (~1800), scaled as N / log N."""
    return int(5000 * (N / math.log(N)) / (64 / math.log(64)))


def _train_transformer_job(args: tuple) -> dict:
    N, seed, iters, stop_after = args
    return train_transformer_nonautoregressive(N, seed, iters, stop_after=stop_after)


def seed_mean(runs: list[dict], key: str) -> tuple[np.ndarray, np.ndarray]:
    """(t, mean over seeds of runs[*][key]) on the evaluation steps all seeds reached (early
    stopping makes the trajectories end at different steps)."""
    n = min(len(r["t"]) for r in runs)
    return np.asarray(runs[0]["t"][:n], float), np.mean([np.asarray(r[key][:n], float) for r in runs], 0)


def summarize_exponents(runs: list[dict], windows: list[tuple[float, float]], tau: float | None = None) -> dict:
    """beta(t) and delta(t) averaged over seeds, fitted as powers of t over windows given as
    fractions of tau (default: the seeds' mean tau), i.e. on the plateau before the nonlinear regime."""
    if tau is None:
        taus = [r["tau"] for r in runs if np.isfinite(r["tau"])]
        tau = float(np.mean(taus)) if taus else math.nan
    out = {"tau_mean": tau}
    for key in ("beta", "delta"):
        t, mean = seed_mean(runs, key)
        out[key] = {f"{lo:g}-{hi:g}": fit_power(t, mean, lo * tau, hi * tau) for lo, hi in windows}
    return out


def main():
    parser = cli.ArgumentParser(description="SA-transformer: dynamics, theory and tau_2Gen scaling (Figs. 5, 6); "
                                            "runs on the CPU, as one-thread processes.")
    cli.add_preset(parser, PRESETS, "quick: tau at N = 32..256, dynamics at N = 64, no transformer; paper: N = 32..1024, "
                                    "dynamics at N = 128, the transformer")
    parser.add_argument("--N", type=int, default=None, help="sequence length of the dynamics runs (default: quick 64, paper 128)")
    parser.add_argument("--transformer", action="store_true", help="quick preset: also time the transformer (Fig. 6c bottom)")
    cli.add_jobs(parser)
    cli.add_threads(parser)
    cli.add_figures(parser)
    args = parser.parse_args()
    preset = cli.preset(args.preset)
    cli.set_threads(args.threads)
    P = dict(PRESETS[preset])
    P["transformer"] = P["transformer"] or args.transformer
    if args.N is not None:
        P["N_dyn"] = check_int("N", args.N, 2)
    jobs = check_int("--jobs", args.jobs, 1)
    cli.writable_dir(args.figures, "--figures")
    cli.announce(preset, f"tau_2Gen at N = {P['N_tau']}, dynamics at N = {P['N_dyn']}, {jobs} processes",
                 f"{args.figures}/sa_*.png and sa_scaling.json")
    t0 = time.time()
    result = {"preset": preset}

    # theory (eqs. sa_cdelta, sa_cbeta, parameter_dynamics_simplest)
    Fd = F_d(20, P["mc_chains"])
    I = I_coefficient(P["mc_chains"])
    result.update(F1_mc=Fd[0], F1_exact=F1_exact(), F_d=Fd, I=I)
    print(f"F_1: Monte Carlo {Fd[0]:.5f}, exact {F1_exact():.5f}; I = {I:.5f}", flush=True)

    # training runs: tau(N) (control, full model), and the four dynamics settings at N_dyn
    N_dyn, stop = P["N_dyn"], P["stop_after"]
    snaps = tuple(int(f * iters_cap(N_dyn) / 5) for f in (0, 0.5, 1, 1.5, 2, 3))
    settings = {(reduced, ablate): [Run(N=N_dyn, seed=s, reduced=reduced, ablate=ablate, iters=iters_cap(N_dyn) * (2 if ablate else 1),
                                        eval_batch=P["eval_batch"], snapshots=snaps if not reduced else (), stop_after=stop)
                                    for s in range(P["seeds_reduced"] if reduced else P["seeds_dyn"])]
                for reduced in (False, True) for ablate in (False, True)}
    tau_runs = [Run(N=N, seed=s, iters=iters_cap(N), eval_batch=P["eval_batch"], eval_every=max(25, N // 4), stop_after=stop)
                for N in P["N_tau"] if N != N_dyn for s in range(P["seeds_tau"])]
    all_runs = sorted(tau_runs, key=lambda r: -r.N) + [r for runs in settings.values() for r in runs]  # longest first
    done = dict(zip([id(r) for r in all_runs], cli.parallel_map(train_sa, all_runs, jobs)))
    print(f"{len(all_runs)} SA-transformer runs done in {time.time() - t0:.0f} s", flush=True)
    dyn = {k: [done[id(r)] for r in runs] for k, runs in settings.items()}
    by_N = {N_dyn: dyn[(False, False)][: P["seeds_tau"]]}
    for r in tau_runs:
        by_N.setdefault(r.N, []).append(done[id(r)])

    # frozen mixture weights: the reduced model with w held at the full model's plateau values (t = tau / 2)
    control = dyn[(False, False)]
    taus = [r["tau"] for r in control if np.isfinite(r["tau"])]
    tau_control = float(np.mean(taus)) if taus else iters_cap(N_dyn) / 2.0
    w_plateau = tuple(np.mean([r["w"][int(np.searchsorted(r["t"], 0.5 * tau_control))] for r in control], 0).tolist())
    frozen_runs = [Run(N=N_dyn, seed=s, reduced=True, ablate=ablate, iters=int(0.75 * tau_control),  # the plateau only
                       eval_batch=P["eval_batch"], freeze_weights=w_plateau) for ablate in (False, True) for s in range(P["seeds_reduced"])]
    frozen_out = cli.parallel_map(train_sa, frozen_runs, jobs)
    frozen = {False: frozen_out[: P["seeds_reduced"]], True: frozen_out[P["seeds_reduced"]:]}

    # the non-autoregressive transformer without MLP1 (Fig. 6c bottom)
    tr_out = []
    if P["transformer"]:
        tr_jobs = [(N, s, P["transformer_iters"], stop) for N in P["N_transformer"] for s in range(P["seeds_transformer"])]
        tr_out = cli.parallel_map(_train_transformer_job, tr_jobs, jobs)
        print(f"transformer runs done in {time.time() - t0:.0f} s", flush=True)

    # exponents of beta(t), delta(t) over windows of the plateau (fractions of tau)
    windows = [(0.05, 0.5), (0.02, 0.3), (0.1, 0.7)]
    exponents = {f"{'reduced' if red else 'full'}_{'ablation' if abl else 'control'}": summarize_exponents(runs, windows)
                 for (red, abl), runs in dyn.items()}
    exponents.update({f"frozen_{'ablation' if abl else 'control'}": summarize_exponents(runs, windows, tau_control)
                      for abl, runs in frozen.items()})  # on the full control model's clock
    default = f"{windows[0][0]:g}-{windows[0][1]:g}"
    result["exponents"] = exponents
    for setting in ("control", "ablation"):
        for key in ("beta", "delta"):
            result[f"{key}_exponent_{setting}"] = exponents[f"full_{setting}"][key][default]
    result["exponent_window"] = f"t in [{windows[0][0]}, {windows[0][1]}] x mean tau"

    # measured early rates against eq. (parameter_dynamics_simplest)
    pred = {"paper (w_B = w_C = 1/3)": predicted_rates(N_dyn, I),
            "at w_plateau": predicted_rates(N_dyn, I, w_plateau[1], w_plateau[2])}
    lo, hi = 0.05 * exponents["full_control"]["tau_mean"], 0.5 * exponents["full_control"]["tau_mean"]
    rates = {}
    for name, runs in (("full", control), ("frozen", frozen[False])):
        rates[name] = {}
        for key in ("beta", "delta"):
            rates[name][key] = fit_rate(*seed_mean(runs, key), lo, hi)
    result["rates"] = {"predicted": pred, "measured": rates, "window": [lo, hi], "w_plateau": w_plateau}

    # tau_2Gen(N): SA-transformer and transformer, fitted against N / log N and against N
    result["tau"] = {str(N): [r["tau"] for r in runs] for N, runs in sorted(by_N.items())}
    result["tau_ablation"] = [r["tau"] for r in dyn[(False, True)]]
    result["tau_transformer"] = {}
    for r in tr_out:
        result["tau_transformer"].setdefault(str(r["N"]), []).append(r["tau"])

    def fits(tau_by_N):
        Ns = np.array([int(N) for N in tau_by_N])
        mean = np.array([np.nanmean(v) if np.isfinite(v).any() else np.nan for v in tau_by_N.values()])
        ok = np.isfinite(mean)
        if ok.sum() < 2:
            return math.nan, math.nan
        x = Ns[ok] / np.log(Ns[ok])
        return float(np.polyfit(np.log(x), np.log(mean[ok]), 1)[0]), float(np.polyfit(np.log(Ns[ok]), np.log(mean[ok]), 1)[0])

    result["tau_fit_exponent"], result["tau_power_of_N"] = fits(result["tau"])
    result["tau_transformer_fit_exponent"], result["tau_transformer_power_of_N"] = fits(result["tau_transformer"])
    largest = by_N[max(by_N)]
    result["final_loss"] = float(np.mean([r["masked_loss"][-1] for r in largest]))
    result["loss_2gen"] = float(np.mean([r["levels"]["masked_loss_2gen"] for r in largest]))
    result["loss_1gen"] = float(np.mean([r["levels"]["masked_loss_1gen"] for r in largest]))
    result["w_final"] = np.mean([r["w"][-1] for r in control], 0).tolist()
    result["w_early"] = np.mean([r["w"][int(np.searchsorted(r["t"], 0.1 * tau_control))] for r in control], 0).tolist()

    # loss landscape over (beta, delta), w optimized (Fig. 6a) at the largest N, and near the origin at N_dyn
    N_land = max(P["N_tau"])
    context, target = fresh_batch(P["landscape_batch"] // 2, N_land, torch.Generator().manual_seed(123))
    betas, deltas = np.linspace(0, 8, 17), np.linspace(0, 10, 11)
    result["landscape"] = {"N": N_land, "beta": betas.tolist(), "delta": deltas.tolist(),
                           "loss": landscape(context, target, betas, deltas).tolist()}
    context, target = fresh_batch(P["landscape_batch"], N_dyn, torch.Generator().manual_seed(123))
    near = np.linspace(-1, 1, 9)
    result["landscape_origin"] = {"N": N_dyn, "beta": near.tolist(), "delta": near.tolist(),
                                  "control": landscape(context, target, near, near).tolist()}
    context_ab, target_ab = fresh_batch(P["landscape_batch"], N_dyn, torch.Generator().manual_seed(123), ablate=True)
    result["landscape_origin"]["ablation"] = landscape(context_ab, target_ab, near, near).tolist()
    result["seconds"] = round(time.time() - t0, 1)

    plot_dynamics(dyn, os.path.join(args.figures, "sa_dynamics.png"))
    plot_parameters(control[0], os.path.join(args.figures, "sa_parameters.png"))
    plot_theory(result, os.path.join(args.figures, "sa_theory.png"))
    plot_scaling(dyn, frozen, result, os.path.join(args.figures, "sa_scaling.png"))
    with open(os.path.join(args.figures, "sa_scaling.json"), "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps({k: result[k] for k in ("F1_mc", "F1_exact", "I", "tau", "tau_fit_exponent", "tau_power_of_N",
                                             "tau_ablation", "tau_transformer", "tau_transformer_fit_exponent",
                                             "beta_exponent_control", "delta_exponent_control", "beta_exponent_ablation",
                                             "delta_exponent_ablation", "final_loss", "loss_2gen", "w_early", "w_final",
                                             "rates", "seconds")}, indent=1))
    print(f"wrote {args.figures}/sa_*.png and sa_scaling.json in {result['seconds'] / 60:.1f} min")


if __name__ == "__main__":
    cli.run(main)
