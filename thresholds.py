"""The critical data diversity K1* and its kinetic perturbations (Sec. "K1* is determined by a kinetic
competition", Fig. 7a-c; Appendix "Memorization to Generalization Transition", "Task Injection",
"Gradient Reweighting", Fig. A9).

K1* separates the runs that leave the 1-Gen plateau for 1-Mem (K < K1*) from those that form the
statistical induction head and enter 2-Gen (K > K1*). The paper's rule: a run is in 2-Gen when the
induction-head order parameter phi_beta(2) exceeds phi_beta* = 0.45, and

    K > K1*  iff  max_{t <= T} phi_beta(2)(t) > phi_beta*        (T = 10^4 steps in the paper)

so K1* is found per seed by a binary search over integer K on nested task sets. tau_2gen, the step at
which phi_beta(2) first exceeds phi_beta*, is bimodal near K1* (Fig. 7b). Two perturbations move K1* by
changing the kinetics of one of the competing circuits (Fig. 7c): gradient reweighting of layer 1's
previous-token attention by w (slower 2-Gen; iterations x 1/w) and task injection (faster 1-Mem).

    python thresholds.py k1                    # quick preset on the CPU: figures/k1.png and .json
    python thresholds.py k1 --print-commands   # the paper preset's runs, one command line each
"""
from collections.abc import Callable
from dataclasses import dataclass, field

PHI_STAR = 0.45  # phi_beta*: the induction-head threshold


# ----------------------------------------------------------------------------- the rule and the search


def max_phi_beta(rows: list[dict], iters: int | None = None) -> float:
    """max over the evaluation rows with step <= iters (all rows if None) of phi_beta(2)."""
    values = [r["phi_beta_2"] for r in rows if iters is None or r["step"] <= iters]
    if not values:
        raise ValueError("no evaluation rows to read phi_beta(2) from")
    return max(values)


def tau_2gen(rows: list[dict], phi_star: float = PHI_STAR) -> int | None:
    """tau_2gen: the first evaluation step at which phi_beta(2) > phi_star (None: never within the run)."""
    return next((r["step"] for r in sorted(rows, key=lambda r: r["step"]) if r["phi_beta_2"] > phi_star), None)


@dataclass
class Search:
    """Binary search over integers for K1* = the largest K in [lo, hi] whose run does not generalize,
    assuming that the outcome is monotone in K (no 2-Gen up to K1*, 2-Gen above).

    Driven from outside so that the searches of many seeds advance in lockstep, each round's runs
    trained together: `pending()` is what to run next (lo and hi first, then one midpoint a round),
    `record(K, generalizes)` takes an outcome, `result()` the answer."""

    lo: int
    hi: int
    probes: dict = field(default_factory=dict)  # K -> generalizes

    def __post_init__(self):
        if not 1 <= self.lo < self.hi:
            raise ValueError(f"the search needs 1 <= lo < hi, got lo = {self.lo}, hi = {self.hi}")

    def pending(self) -> list[int]:
        ends = [K for K in (self.lo, self.hi) if K not in self.probes]
        if ends:
            return ends
        if self.probes[self.lo] or not self.probes[self.hi]:
            return []  # K1* is outside [lo, hi]
        below = max(K for K, up in self.probes.items() if not up)
        above = min(K for K, up in self.probes.items() if up)
        return [(below + above) // 2] if above - below > 1 else []

    def record(self, K: int, generalizes: bool):
        self.probes[K] = bool(generalizes)

    def result(self) -> dict:
        """{"K1_star": int or None, "bound": None | "below" | "above", "probes": {K: bool}}; bound "below"
        when the run at lo already generalizes (K1* < lo), "above" when the run at hi does not (K1* >= hi)."""
        if self.pending():
            raise ValueError("the search is not finished")
        probes = dict(sorted(self.probes.items()))
        if probes[self.lo]:
            return {"K1_star": None, "bound": "below", "probes": probes}
        if not probes[self.hi]:
            return {"K1_star": None, "bound": "above", "probes": probes}
        return {"K1_star": max(K for K, up in probes.items() if not up), "bound": None, "probes": probes}


def search_threshold(generalizes: Callable[[int], bool], lo: int, hi: int) -> dict:
    """One search run to the end with a function K -> generalizes (tests, and a single seed)."""
    search = Search(lo, hi)
    while todo := search.pending():
        for K in todo:
            search.record(K, generalizes(K))
    return search.result()
