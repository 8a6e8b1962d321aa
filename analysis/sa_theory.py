"""Theory of the SA-transformer's plateau (Appendix "Dynamics of the SA-transformer", "Testing
predictions"): the coefficients F_d (eq. sa_cdelta) and I (eq. sa_cbeta), the early rates of beta and
delta (eq. parameter_dynamics_simplest), and the reduced model's loss landscape over (beta, delta)
with the mixture weights optimized (Fig. 6a and the near-origin landscapes of Fig. A7).
"""
import numpy as np
import torch
import torch.nn.functional as F

from analysis.sa_model import C, SATransformer, experts, layer1
from markov import sample_chains, stationary


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
