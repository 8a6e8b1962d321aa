"""The rules that decide the thresholds K1* and K2* from a run's evaluations (Sec. "K1* is determined by a kinetic
competition"; Appendix "Memorization to Generalization Transition", "Transience and Partial Memorization"), shared
by the K1* experiment (k1.py: Figs. 7, A9), the K2* experiment (k2.py: Figs. 8a-b, A10), the campaigns and the
analyses that reread their ledgers.

    K1*: a run enters 2-Gen when the induction-head order parameter phi_beta(2) exceeds phi_beta* = 0.45
         (generalizes: max_t phi_beta(2) > phi_beta*; tau_2gen: the first step it does)
    K2*: a run memorizes once it beats 2-Gen on held-out sequences of S (tau_2mem); Delta tau_K = tau_2mem -
         tau_2gen; a chain k counts as memorized when its score Delta^k < epsilon (memorized_fraction), corrected
         for the rate at which chains nobody memorized pass the rule (corrected, null_epsilon); scored on two
         independent sets of sequences, the rule states its own noise (score_noise)
"""
import math

import numpy as np


PHI_STAR = 0.45  # phi_beta*: the induction-head threshold


# ----------------------------------------------------------------------------- the rules
#
# K1*: a run generalizes when max_t phi_beta(2) > phi_beta*. K2*: a run memorizes once it beats 2-Gen on S;
# Delta tau_K = tau_2mem - tau_2gen; a chain counts as memorized when Delta^k < epsilon.
#
# The null: a chain's score averages a few dozen sequences, so a model that memorizes nothing could still beat
# 2-Gen on some chains by chance. The same model scored the same way on fresh chains of D_T, which it cannot have
# memorized (memorization.saved_model_scores), measures that rate: f0, the fraction of its fresh-chain scores below epsilon. If a
# fraction m of S is memorized (always passing) and the rest pass at the rate f0, the fraction of S that passes is
# f = m + (1 - m) f0, so the memorized fraction is m = (f - f0) / (1 - f0) (corrected).
#
# A second, weaker question the null answers: which chains does the model treat better than chains it never saw,
# whether or not it beats 2-Gen on them? A chain whose score is below the NULL_ALPHA-quantile of the model's
# fresh-chain scores (null_epsilon) passes by chance with probability NULL_ALPHA; the same correction gives the
# fraction of S with a chain-specific advantage.

NULL_ALPHA = 0.05  # the false-positive rate of the chain-specific-advantage rule

# The scores' own noise. The null sees chance passes among chains the model never saw; it cannot see them among the
# chains of S, which the model treats a little better than unseen ones: when most of S sits just above epsilon, a
# chain crosses it by the noise of its own few dozen sequences. So every chain of S is scored twice, on two
# independent sets of sequences (a, b; memorization.saved_model_scores), and
#   - the noise of one set's score is sigma = std(a - b) / sqrt(2) over the chains (the two sets differ only by it),
#     and the share of the chains' spread that is real is 1 - sigma^2 / var(a) (signal_share; 0: the chains differ
#     only by noise);
#   - a chain passes on one set and not the other at the rate `disagree`;
#   - the two-set rule: a chain counts as memorized when its mean score over both sets, (a + b) / 2, whose noise is
#     sigma / sqrt(2), lies below epsilon by Z_ONE_SIDED of it. A chain whose true score is epsilon passes with
#     probability 5 %; the fresh chains, scored twice the same way, give that rule's f0 for the correction above.

Z_ONE_SIDED = 1.6448536269514722  # the standard normal's 95 % quantile: a one-sided test at 5 %
# What each number is: one set's fraction (Delta^k < epsilon) estimates the memorized fraction with the scores' noise in
# it (chains near epsilon cross it both ways); the two-set rule's is a lower bound, the chains significantly below
# epsilon; noise_free_fraction estimates the fraction of chains whose noise-free score is below epsilon.


def noise_free_fraction(a: np.ndarray, b: np.ndarray, epsilon: float) -> float:
    """The fraction of chains whose noise-free score lies below epsilon, by simulation-extrapolation (SIMEX, Cook and
    Stefanski 1994) from one set of chains scored on two independent sets of sequences, a and b: the mean
    m = (a + b) / 2 carries noise of variance sigma^2 / 2, and d = (a - b) / 2 is noise of that same variance,
    independent of m for Gaussian noise, so m +- sqrt(lam) d carries (1 + lam) sigma^2 / 2 (lam = 1: a and b
    themselves). The fractions below epsilon at lam = 0, 1, 3 (both signs averaged), a quadratic in lam through them,
    extrapolated to lam = -1: no noise. Not clipped: an estimate, whose own sampling noise can take it past 0 or 1."""
    m, d = (np.asarray(a, float) + np.asarray(b, float)) / 2, (np.asarray(a, float) - np.asarray(b, float)) / 2

    def below(lam: float) -> float:
        return 0.5 * (float(np.mean(m + math.sqrt(lam) * d < epsilon)) + float(np.mean(m - math.sqrt(lam) * d < epsilon)))

    return 8 / 3 * below(0.0) - 2 * below(1.0) + 1 / 3 * below(3.0)  # the quadratic through lam = 0, 1, 3 at -1


def max_phi_beta(rows: list[dict], iters: int | None = None) -> float:
    """max over the evaluation rows with step <= iters (all rows if None) of phi_beta(2)."""
    values = [r["phi_beta_2"] for r in rows if iters is None or r["step"] <= iters]
    if not values:
        raise ValueError("no evaluation rows to read phi_beta(2) from")
    return max(values)


def tau_2gen(rows: list[dict], phi_star: float = PHI_STAR) -> int | None:
    """tau_2gen: the first evaluation step at which phi_beta(2) > phi_star (None: never within the run)."""
    return next((r["step"] for r in sorted(rows, key=lambda r: r["step"]) if r["phi_beta_2"] > phi_star), None)


def tau_2mem(rows: list[dict]) -> int | None:
    """tau_2mem: the first evaluation step at which L_train < L^{2-Gen} on the same held-out sequences from
    S, which no in-context predictor can do (None: never within the run). Reads dense rows (train.py
    --eval-every), each of which carries the 2-Gen level of its sequences."""
    return next((r["step"] for r in sorted(rows, key=lambda r: r["step"]) if r["train_loss"] < r["train_loss_2gen"]), None)


def delta_tau(rows: list[dict]) -> tuple[int | None, str]:
    """(Delta tau_K, status) of one run from its dense rows: status "ok"; "censored" (in 2-Gen at the end,
    Delta tau_K > the rest of the run: None); "no 2-gen" (never formed the induction head, K < K1*: None);
    "mem first" (memorized before the induction head formed: None)."""
    t_gen, t_mem = tau_2gen(rows), tau_2mem(rows)
    if t_gen is None:
        return None, "no 2-gen"
    if t_mem is None:
        return None, "censored"
    if t_mem < t_gen:
        return None, "mem first"
    return t_mem - t_gen, "ok"


def censored_after(rows: list[dict]) -> int | None:
    """A run still in 2-Gen at its end: the steps it spent there, a lower bound on its Delta tau_K (None for
    any other status)."""
    if delta_tau(rows)[1] != "censored":
        return None
    return max(r["step"] for r in rows) - tau_2gen(rows)


def memorized_fraction(chain_rows: list[dict], epsilon: float | list[float]) -> tuple[list[int], list[float]]:
    """(steps, fraction of chains with Delta^k < epsilon) from a run's per_chain.jsonl rows; epsilon one value,
    or one per row in step order (null_epsilon's)."""
    rows = sorted(chain_rows, key=lambda r: r["step"])
    eps = epsilon if isinstance(epsilon, list) else [epsilon] * len(rows)
    return [r["step"] for r in rows], [float(np.mean(np.array(r["delta"]) < e)) for r, e in zip(rows, eps)]


def score_noise(a_rows: list[dict], b_rows: list[dict], epsilon: float, z: float = Z_ONE_SIDED) -> dict:
    """The two-set rule and the noise it states, per evaluation step (in step order), from the rows {"step", "delta"}
    of one set of chains scored on two independent sets of sequences: {"step", "fraction" (the two-set rule's
    passing fraction), "disagree" (the fraction passing Delta^k < epsilon on exactly one set), "sigma" (one set's
    noise), "signal_share", "noise_free" (noise_free_fraction)}."""
    a_rows, b_rows = (sorted(rows, key=lambda r: r["step"]) for rows in (a_rows, b_rows))
    if [r["step"] for r in a_rows] != [r["step"] for r in b_rows]:
        raise ValueError("the two sets of scores are not of the same steps")
    out = {"step": [], "fraction": [], "disagree": [], "sigma": [], "signal_share": [], "noise_free": []}
    for ra, rb in zip(a_rows, b_rows):
        a, b = np.asarray(ra["delta"], float), np.asarray(rb["delta"], float)
        sigma = float(np.std(a - b, ddof=1) / math.sqrt(2)) if len(a) > 1 else math.nan
        var = float(np.var(a, ddof=1)) if len(a) > 1 else math.nan
        out["step"].append(ra["step"])
        out["fraction"].append(float(np.mean((a + b) / 2 < epsilon - z * sigma / math.sqrt(2))))
        out["disagree"].append(float(np.mean((a < epsilon) != (b < epsilon))))
        out["sigma"].append(sigma)
        out["signal_share"].append(max(0.0, 1 - sigma**2 / var) if var > 0 else 0.0)
        out["noise_free"].append(noise_free_fraction(a, b, epsilon))
    return out


def gaussian_noise_model(one_set: float, sigma: float, share: float, epsilon: float, z: float = Z_ONE_SIDED) -> dict:
    """What the scores' noise does to the two rules if the chains' true scores were Gaussian: from one set's passing
    fraction, the noise sigma and the signal share (score_noise's, at one step), the true scores' mean and spread
    (var(a) = sigma^2 / (1 - share), their spread share var(a)); then the two-set rule's passing fraction it
    predicts, and the fraction of true scores below epsilon (noise-free)."""
    from scipy.stats import norm  # imported here: ~0.6 s that every other use of this module does not need
    var_a = sigma**2 / max(1 - share, 1e-12)
    spread = math.sqrt(share * var_a)
    mean = epsilon - math.sqrt(var_a) * norm.ppf(min(max(one_set, 1e-9), 1 - 1e-9))
    return {"two_sets": float(norm.cdf((epsilon - z * sigma / math.sqrt(2) - mean) / math.sqrt(spread**2 + sigma**2 / 2))),
            "noise_free": float(norm.cdf((epsilon - mean) / spread)) if spread > 0 else float(mean < epsilon)}


def null_epsilon(null_rows: list[dict], alpha: float = NULL_ALPHA) -> list[float]:
    """Per evaluation step (in step order): the alpha-quantile of the model's scores on fresh chains."""
    return [float(np.quantile(r["delta"], alpha)) for r in sorted(null_rows, key=lambda r: r["step"])]


def corrected(fraction: list[float], false_rate: list[float]) -> list[float]:
    """m = (f - f0) / (1 - f0) per step: the fraction of S that passes a rule, f, corrected for the rate f0 at which
    chains nobody memorized pass it (unclipped: below 0 where fewer chains pass than the null's rate)."""
    return [(f - f0) / (1 - f0) for f, f0 in zip(fraction, false_rate)]


def generalizes(rows: list[dict]) -> bool:
    """The paper's rule: the run entered 2-Gen, max_t phi_beta(2) > phi_beta*."""
    return max_phi_beta(rows) > PHI_STAR


# ----------------------------------------------------------------------------- what k1.py and k2.py share


def k1_runs(outcomes: dict) -> list[dict]:
    """Per probe (Figs. 7a, A9): its K, seed and condition, max_t phi_beta(2), min_t L_gen and tau_2gen."""
    return [{"K": K, "seed": seed, "condition": cond, "max_phi_beta": max_phi_beta(rows),
             "min_gen_loss": min(r["gen_loss"] for r in rows), "tau_2gen": tau_2gen(rows)}
            for (cond, K, seed), rows in sorted(outcomes.items())]


def grid_table(members: list[dict]) -> dict:
    """Per K of a fixed (K, seed) grid: the seeds' max phi_beta(2) over the dense readouts, their L_gen and how
    many formed the induction head. members: {"K", "seed", "max_phi_beta", "gen_loss", "gen_loss_2gen"}."""
    table = {}
    for m in sorted(members, key=lambda m: (m["K"], m["seed"])):
        row = table.setdefault(m["K"], {"seed": [], "max_phi_beta": [], "gen_loss": [], "gen_loss_2gen": m["gen_loss_2gen"]})
        row["seed"].append(m["seed"])
        row["max_phi_beta"].append(m["max_phi_beta"])
        row["gen_loss"].append(m["gen_loss"])
    for row in table.values():
        row["heads"] = sum(v > PHI_STAR for v in row["max_phi_beta"])
    return table


def grid_brackets(table: dict) -> dict[int, list]:
    """Per seed of a grid_table: K1*'s bracket [the largest K without the induction head, the smallest K with it]
    (None where the grid has no such K; the first above the second where the seed is not monotone in K)."""
    brackets = {}
    for seed in sorted({s for row in table.values() for s in row["seed"]}):
        head = {K: row["max_phi_beta"][row["seed"].index(seed)] > PHI_STAR for K, row in table.items() if seed in row["seed"]}
        below, above = [K for K, h in head.items() if not h], [K for K, h in head.items() if h]
        brackets[seed] = [max(below) if below else None, min(above) if above else None]
    return brackets
