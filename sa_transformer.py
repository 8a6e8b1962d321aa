"""The SA-transformer, eq. (base_model), its reduced form, eq. (minimal_simple), the theory of its plateau and its
training (Sec. "The transition from G1 to G2"; Appendix "Minimal Network for Generalization in the Limit K -> inf",
"Dynamics of the SA-transformer", "Testing predictions"). sa_dynamics.py draws its dynamics (Figs. 5b-c, 6a, A4, A7)
and sa_scaling.py its tau_2Gen(N) (Fig. 6b-c); tau_settings.py and tau_velocities.py ask why the transformer's
tau_2Gen(N) does not follow it.

On one-hot states x_1..x_N, predicting s_{N+1} (non-autoregressive):
    A1_{ji} = softmax_{j <= i}( x_j^T M1 x_i + P1_{i-j} )            h_i = sum_{j <= i} A1_{ji} x_j
    A2_{iN} = softmax_{i <= N}( x1_i^T M2 x1_N + P2_{N-i} )          x1_i = x_i (+) h_i   (2C-dim)
    pi = w_A x_N + w_B h_N + w_C sum_i A2_{iN} x_i + w_D sum_i A2_{iN} h_i
with (w_A..w_D) = softmax of logits (w_A's fixed at 0, three learnable, all weights 1/4 at start)
and M1 (C x C), M2 (2C x 2C), P1, P2 (relative positions) initialized at zero and unconstrained.
delta = P1 at i - j = 1 (the paper's P^(1)_{-1}); beta = mean diagonal of the M2 block that lets a
key's layer-1 content h_i meet the query's state x_N (the paper's beta^(2)_3, bottom-left block).
The reduced model keeps only beta, delta and the mixture weights.

Layer-1 attention factorizes into a content term and a position term, so all N query positions
of all B sequences cost one (N, N) @ (N, B C) product instead of B N^2 separate weights.

The theory: the coefficients F_d (eq. sa_cdelta) and I (eq. sa_cbeta), the early rates of beta and delta (eq.
parameter_dynamics_simplest), and the reduced model's loss landscape over (beta, delta) with the mixture weights
optimized (Fig. 6a, Fig. A7). Training (`train_sa`): SGD on fresh chains (K = infinity) at the last position;
tau_2Gen is the masked loss's halfway crossing from the 1-Gen plateau to 2-Gen.
"""
import math
from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from analysis.fresh_chains import C, crossing, eval_set, fresh_batch, predictor_levels
from markov import sample_chains, stationary

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


def layers(seqs: torch.Tensor, M1, P1, M2, P2, h: torch.Tensor | None = None):
    """(X, h, A2): the one-hot states (B, N, C), layer 1's output h (B, N, C; computed unless given) and layer 2's
    attention at the last position A2_iN (B, N)."""
    X = F.one_hot(seqs, C).to(P1.dtype)  # (B, N, C)
    h = layer1(seqs, X, M1, P1) if h is None else h
    x1 = torch.cat([X, h], -1)  # (B, N, 2C)
    query = x1[:, -1] @ M2.T  # (B, 2C): M2 x1_N
    scores = (x1 @ query.unsqueeze(-1)).squeeze(-1) + P2.flip(0)  # (B, N): x1_i . M2 x1_N + P2[N - i]
    return X, h, torch.softmax(scores, -1)


def expert_paths(X: torch.Tensor, h: torch.Tensor, A2: torch.Tensor) -> torch.Tensor:
    """The four experts' predictive distributions at the last position, (B, 4, C): the paths x_N, h_N,
    sum_i A2_iN x_i and sum_i A2_iN h_i through the two attention layers, from what `layers` returns."""
    A2 = A2.unsqueeze(1)  # (B, 1, N)
    return torch.stack([X[:, -1], h[:, -1], (A2 @ X).squeeze(1), (A2 @ h).squeeze(1)], 1)


class SATransformer(nn.Module):
    """Eq. (base_model). reduced=True: eq. (minimal_simple), parameters beta, delta and the weights.
    attention: a module returning what `layers` returns, (X, h, A2), in place of M1, P1, M2, P2 (sa_hybrids.py's
    hybrid on the transformer's attention); sa_hybrids.py's readouts replace the mixture by subclassing `forward`."""

    def __init__(self, N: int, reduced: bool = False, attention: nn.Module | None = None):
        super().__init__()
        self.N, self.reduced = N, reduced
        self.logits = nn.Parameter(torch.zeros(3))  # w_B, w_C, w_D relative to w_A (fixed logit 0)
        self.freeze_weights = None  # a (4,) tensor: w_A..w_D held at it (Run.freeze_weights)
        self.attention = attention  # a module returning (X, h, A2) in place of M1, P1, M2, P2 (TransformerAttention)
        if attention is None and reduced:
            self.beta = nn.Parameter(torch.zeros(()))
            self.delta = nn.Parameter(torch.zeros(()))
        elif attention is None:
            self.M1 = nn.Parameter(torch.zeros(C, C))
            self.P1 = nn.Parameter(torch.zeros(N))  # P1[i - j], i - j = 0..N-1
            self.M2 = nn.Parameter(torch.zeros(2 * C, 2 * C))
            self.P2 = nn.Parameter(torch.zeros(N))

    def weights(self) -> torch.Tensor:
        """(w_A, w_B, w_C, w_D)."""
        if self.freeze_weights is not None:
            return self.freeze_weights
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
        """delta = P1[1] (attention to the previous state); beta = mean diagonal of M2[C:, :C] (nan with
        another attention: it has no M2)."""
        if self.attention is not None:
            return math.nan, self.attention.P1[1].item()
        _, P1, M2, _ = self.attention_parameters()
        return torch.diagonal(M2[C:, :C]).mean().item(), P1[1].item()

    def layer_outputs(self, seqs: torch.Tensor):
        """(X, h, A2) of `layers` with this model's attention."""
        return layers(seqs, *self.attention_parameters()) if self.attention is None else self.attention(seqs)

    def forward(self, seqs: torch.Tensor) -> torch.Tensor:
        """pi (B, C): the predictive distribution of s_{N+1} given seqs (B, N)."""
        return torch.einsum("e,bec->bc", self.weights(), expert_paths(*self.layer_outputs(seqs)))


def target_loss(pi: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(raw, present): -log pi(target) clamped at 1e-12, and whether the target occurs in the context.

    pi has no smoothing: a target absent from the context gets probability 0 and no gradient, so
    the masked loss over `present` samples is the meaningful one (tau is defined on it)."""
    p = pi.gather(1, target.view(-1, 1)).squeeze(1)
    return -p.clamp_min(1e-12).log(), p > 0


# ----------------------------------------------------------------------------- the theory of its plateau


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


def harmonic(N: int) -> float:
    """H_N = sum_{k <= N} 1 / k, the theory's log N (eq. sa_cbeta)."""
    return sum(1 / k for k in range(1, N + 1))


def predicted_rates(N: int, I: float, w_B: float = 1 / 3, w_C: float = 1 / 3) -> dict:
    """Eq. (parameter_dynamics_simplest) near beta = delta = 0 with lr = 1: d beta / dt = w_C I H_N / N
    and d delta / dt = w_B F_1 / N (the paper sets w_B = w_C = 1/3). For the scalar beta of the
    reduced model; each of the C diagonal entries of the full model's M2 block gets 1/C of it."""
    H = harmonic(N)
    return {"dbeta_dt": w_C * I * H / N, "ddelta_dt": w_B * F1_exact() / N}


def escape_rates(N: int, I: float) -> tuple[float, float]:
    """(a, c): beta's rate a = w_C I H_N / N at w_C = 1/3 (predicted_rates) and c = b / a, b = w_B F_1 / N delta's."""
    rates = predicted_rates(N, I)
    return rates["dbeta_dt"], rates["ddelta_dt"] / rates["dbeta_dt"]


def escape_time(N: int, I: float, beta_star: float, factor: float = 1.0) -> float:
    """The plateau's end in the first-order dynamics: the time at which beta reaches beta_star from beta = delta = 0
    (lr 1, w_B = w_C = 1/3) under the gradient of the expanded loss L = L_1Gen - beta (1 + delta) a - delta b
    (Appendix "Dynamics near beta, delta = 0"), a = w_C I H_N / N and b = w_B F_1 / N, with delta's gradient times
    `factor` (sa_hybrids.py's drive=N0: factor N / N0):
        d beta / dt = a (1 + delta),    d delta / dt = factor (a beta + b).
    The printed eq. (parameter_dynamics_simplest) keeps d beta / dt = a alone, the lowest order, under which delta
    cannot move tau at all; the loss's coupling a beta delta is what lets it. With k = a sqrt(factor):
    beta(t) = (b / a)(cosh kt - 1) + sinh(kt) / sqrt(factor), solved for t in closed form. At factor 1 tau grows
    roughly as N / H_N; with delta pushed N-flat (factor ∝ N) roughly as sqrt(N / H_N)."""
    a, c = escape_rates(N, I)
    s = 1 / math.sqrt(factor)
    y = (c + beta_star + math.sqrt((c + beta_star) ** 2 - c * c + s * s)) / (c + s)  # e^{kt}: a quadratic's root
    return math.log(y) / (a * math.sqrt(factor))


def escape_threshold(N: int, I: float, tau: float) -> float:
    """beta_star with escape_time(N, I, beta_star) = tau at factor 1: the one constant escape_time's scale needs, taken
    from a measured tau (the first-order dynamics hold near the origin, not at the cliff, so beta_star is a fit)."""
    a, c = escape_rates(N, I)
    return c * (math.cosh(a * tau) - 1) + math.sinh(a * tau)


def drive_prediction(Ns: list[int], parent_taus: list, N0: int, I: float) -> dict:
    """The first-order dynamics' tau at each N of Ns for the SA-transformer with delta's gradient x N / N0 and for the
    parent (escape_time), and their ratio; the one constant, beta_star, set where the two are one model, at N0, by
    the parent's median tau there (parent_taus). sa_hybrids.py's drive scales P1 at every lag, the dynamics delta
    = P1[1] alone: the other lags' first-order push, w_B F_d / N, falls off as F_d does (eq. sa_cdelta)."""
    beta_star = escape_threshold(N0, I, float(np.median(parent_taus)))
    driven = {N: escape_time(N, I, beta_star, N / N0) for N in Ns}
    parent = {N: escape_time(N, I, beta_star) for N in Ns}
    return {"N0": N0, "beta_star": beta_star, "tau": driven, "parent": parent,
            "ratio": {N: driven[N] / parent[N] for N in Ns}}


def w_driven(run: dict, I: float) -> dict:
    """Eq. (parameter_dynamics_simplest) integrated along a run's own mixture weights w(t) (lr 1, the trapezoid rule
    over its evaluations): beta(t) = int_0^t w_C I H_N / (N C) ds (the full model's mean diagonal, predicted_rates)
    and delta(t) = int_0^t w_B F_1 / N ds. The first-order theory with w as the run had it: with w constant both
    grow as t, so their powers of t measure what w's drift alone does to the exponents."""
    t, w = np.asarray(run["t"], float), np.asarray(run["w"], float)
    per_weight = predicted_rates(run["run"]["N"], I, w_B=1.0, w_C=1.0)  # the rates are linear in w_B, w_C
    out = {"t": t.tolist()}
    for key, rate in (("beta", per_weight["dbeta_dt"] / C * w[:, 2]), ("delta", per_weight["ddelta_dt"] * w[:, 1])):
        out[key] = np.concatenate([[0.0], np.cumsum(0.5 * (rate[1:] + rate[:-1]) * np.diff(t))]).tolist()
    return out


def landscape(context, target, betas, deltas, em_steps: int = 5000) -> np.ndarray:
    """Reduced-model loss over a (delta, beta) grid with w_A..w_D optimized at every point
    (masked samples). With the experts fixed, the optimal mixture weights come from EM:
    w_e <- < w_e p_e / sum_e' w_e' p_e' > over samples, which never decreases the likelihood.
    EM is slow where the best mixture has a weight near 0: em_steps = 5000 matches an L-BFGS
    minimization to 1e-4 (tests); fewer steps leave the loss near the origin above its minimum by as
    much as the slopes measured there."""
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
                e = expert_paths(*layers(context, *model.attention_parameters(), h=h))  # (B, 4, C)
                per_beta.append(e.gather(2, target.view(-1, 1, 1).expand(-1, 4, 1)).squeeze(2))  # (B, 4)
            p = torch.stack(per_beta).double()  # (G, B, 4): each expert's probability of the target
            w = torch.full((len(betas), 1, 4), 0.25, dtype=torch.float64)
            for _ in range(em_steps):
                resp = p * w / (p * w).sum(-1, keepdim=True).clamp_min(1e-300)
                w = resp.mean(1, keepdim=True)
            out[i] = (-(p * w).sum(-1).clamp_min(1e-300).log().mean(1)).numpy()
    return out


# ----------------------------------------------------------------------------- training


def iters_cap(N: int) -> int:
    """Iteration budget: a few times the tau measured at N = 64 (~1800), scaled as N / log N."""
    return int(5000 * (N / math.log(N)) / (64 / math.log(64)))


@dataclass
class Run:
    """One training run of the SA-transformer (train_sa): the sequence length N, the seed of its batches, the model
    (reduced: eq. minimal_simple; ablate: s_{N-1} resampled, Appendix "Ablating the first-order contribution in
    delta"; balance: doubly stochastic chains, fresh_chains.balanced, tau_settings.py's control of ours), its SGD, and
    what it records."""
    N: int = 64
    seed: int = 0
    reduced: bool = False
    ablate: bool = False
    balance: bool = False
    iters: int = 4000
    batch: int = 256
    lr: float = 1.0
    momentum: float = 0.0  # SGD's; the SA-transformer's runs use none (tau_settings.py's attention hybrid: 0.9)
    eval_every: int = 25
    eval_batch: int = 2048
    freeze_weights: tuple | None = None  # hold (w_A..w_D) fixed (reduced model during the plateau)
    snapshots: tuple = ()  # iterations at which to store P1, P2, M2
    stop_after: float = 0.0  # if > 0, stop at stop_after x tau once the loss has crossed (saves time)


def train_sa(run: Run, measure=None, model: nn.Module | None = None) -> dict:
    """SGD (lr 1, batch 256) on fresh chains; the trajectory of losses and parameters. measure(t, model), if given,
    is called at every evaluation, before that step's update. model: one to train in place of
    SATransformer(run.N, run.reduced) (sa_hybrids.py's, for tau_settings.py's ladder).

    tau_2Gen: the first time the masked eval loss falls halfway from the model's 1-Gen plateau
    (the raw frequencies its experts compute at beta = delta = 0) to the Bayes 2-Gen loss."""
    g = torch.Generator().manual_seed(run.seed)
    eval_context, eval_target = eval_set(run.eval_batch, run.N, run.ablate, run.balance)
    levels = predictor_levels(eval_context, eval_target)
    threshold = 0.5 * (levels["masked_loss_frequencies"] + levels["masked_loss_2gen"])
    model = SATransformer(run.N, run.reduced) if model is None else model
    if run.freeze_weights is not None:
        model.freeze_weights = torch.tensor(run.freeze_weights, dtype=torch.float32)
        model.logits.requires_grad_(False)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=run.lr, momentum=run.momentum)
    traj = {k: [] for k in ("t", "loss", "masked_loss", "beta", "delta", "w")}
    traj["snapshots"] = {}
    for t in range(run.iters + 1):
        if t % run.eval_every == 0 or t == run.iters:
            if measure is not None:
                measure(t, model)
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
        context, target = fresh_batch(run.batch, run.N, g, run.ablate, run.balance)
        raw, _ = target_loss(model(context), target)
        opt.zero_grad(set_to_none=True)
        raw.mean().backward()
        opt.step()
    return {"run": asdict(run), "levels": levels, "tau": crossing(traj["t"], traj["masked_loss"], threshold), **traj}
