"""The estimators of the K1* and K2* experiments (k1.py, k2.py), pure numpy/scipy and tested on synthetic data
(tests/test_thresholds.py, tests/test_k2.py, and tests/test_pins_estimators.py against hand and independent
computations): what turns the runs' readouts into K1*, K2*, gamma, epsilon and the memorized asymptotes.

    Search                     the per-seed binary search for K1* (Sec. "K1* is determined by a kinetic
                               competition": K > K1* iff max_t phi_beta(2) > phi_beta*)
    median_ci, censored_median medians of Delta tau_K over seeds, seeds still in 2-Gen at the end included, and
                               the median's exact order-statistic interval (median_rank, median_coverage)
    divergence, fit_divergence Fig. 8a: Delta tau_K = a (K2* - K)^(-gamma) [+ b + c K], censored K as bounds
    sigmoid, fit_sigmoid       Fig. A10: the memorized fraction's rise in log time and its asymptote
    extrapolate_zero           Fig. 8b: where the asymptotes, linear in log K, reach zero
    epsilon_calibration        epsilon from the per-chain scores of K = inf models
(Appendix "Transience and Partial Memorization" for the last five.)
"""
import math
import warnings
from dataclasses import dataclass, field

import numpy as np

# ----------------------------------------------------------------------------- K1*: the binary search


@dataclass
class Search:
    """Search over integers for K1* = the largest K in [lo, hi] whose run does not generalize, assuming that the
    outcome is monotone in K (no 2-Gen up to K1*, 2-Gen above).

    Driven from outside so that the searches of many seeds advance in lockstep, each round's runs trained
    together: `pending(width)` is what to run next (lo and hi first, then a round's probes inside the bracket),
    `record(K, generalizes)` takes an outcome, `result()` the answer. width 1 is the paper's binary search (the
    bracket's log-midpoint a round); a wider round probes `width` Ks that cut the bracket into width + 1 equal parts
    in log K, so an ensemble's spare slots shorten the search by rounds. The answer depends only on the probes, not
    on the order or width they came in: wherever the outcome is monotone in K, every width ends with the binary
    search's bracket at ratio 1 (the paper's: neighbouring integers), and with a bracket no wider than the ratio
    otherwise."""

    lo: int
    hi: int
    ratio: float = 1.0  # stop once above / below <= ratio (1: down to neighbouring integers, the paper's search)
    probes: dict = field(default_factory=dict)  # K -> generalizes

    def __post_init__(self):
        if not 1 <= self.lo < self.hi:
            raise ValueError(f"the search needs 1 <= lo < hi, got lo = {self.lo}, hi = {self.hi}")
        if not self.ratio >= 1:
            raise ValueError(f"the search's stopping ratio must be >= 1, got {self.ratio}")

    def bracket(self) -> tuple[int, int]:
        """(below, above): the smallest K that generalized and the largest below it that did not. With outcomes
        that are not monotone in K, the lowest such crossing."""
        above = min(K for K, up in self.probes.items() if up)
        return max(K for K, up in self.probes.items() if not up and K < above), above

    def pending(self, width: int = 1) -> list[int]:
        ends = [K for K in (self.lo, self.hi) if K not in self.probes]
        if ends:
            return ends
        if self.probes[self.lo] or not self.probes[self.hi]:
            return []  # K1* is outside [lo, hi]
        below, above = self.bracket()
        if above - below <= 1 or above <= self.ratio * below:
            return []
        if width == 1:
            return [min(max(round(math.sqrt(below * above)), below + 1), above - 1)]  # bisect in log K
        cuts = {round(below * (above / below) ** (i / (width + 1))) for i in range(1, width + 1)}
        return sorted({min(max(K, below + 1), above - 1) for K in cuts})

    def record(self, K: int, generalizes: bool):
        self.probes[K] = bool(generalizes)

    def result(self) -> dict:
        """{"K1_star": the largest K below the bracket's top that did not generalize, "above": the smallest that did,
        "bound", "monotone", "probes": {K: bool}}; bound is None, or "below" when the run at lo already generalizes
        (K1* < lo), "above" when the run at hi does not (K1* >= hi), and then K1_star and above are None; monotone:
        whether the probes agree with an outcome monotone in K (False: some K above K1* did not generalize)."""
        if self.pending():
            raise ValueError("the search is not finished")
        probes = dict(sorted(self.probes.items()))
        monotone = max((K for K, up in probes.items() if not up), default=0) < min((K for K, up in probes.items() if up),
                                                                                  default=math.inf)
        if probes[self.lo]:
            return {"K1_star": None, "above": None, "bound": "below", "monotone": monotone, "probes": probes}
        if not probes[self.hi]:
            return {"K1_star": None, "above": None, "bound": "above", "monotone": monotone, "probes": probes}
        below, above = self.bracket()
        return {"K1_star": below, "above": above, "bound": None, "monotone": monotone, "probes": probes}


# ----------------------------------------------------------------------------- K2*: Delta tau's divergence


def median_coverage(n: int, j: int) -> float:
    """The coverage of [x_(j), x_(n+1-j)], the j-th smallest and j-th largest of n values, as an interval for the
    median of any continuous distribution they are drawn from: 1 - 2 P(Binomial(n, 1/2) < j), whatever the
    distribution. With n = 4, [min, max] (j = 1) covers 1 - 2 / 16 = 87.5 %, and no narrower pair covers more."""
    return 1 - 2 * sum(math.comb(n, i) for i in range(j)) / 2**n


def median_rank(n: int, level: float = 0.95) -> int:
    """The largest j <= (n + 1) / 2 whose order-statistic interval [x_(j), x_(n+1-j)] covers the median with at
    least `level`, or 1 (the seeds' range) when even that covers less: n values cannot give more than
    median_coverage(n, 1) = 1 - 2^(1-n) (87.5 % at n = 4, 50 % at n = 2)."""
    return max([j for j in range(1, (n + 1) // 2 + 1) if median_coverage(n, j) >= level] or [1])


def median_ci(values: list[float | None], level: float = 0.95) -> tuple:
    """(median, lo, hi) over seeds, None meaning "longer than the run" (+inf: a censored value still counts in the
    ranks); [lo, hi] the exact distribution-free interval of the median, the order statistics of median_rank, whose
    coverage (median_coverage) is what the number of seeds allows: with 4 seeds the seeds' range, 87.5 %, whatever
    `level` asks for. inf where it is beyond the run."""
    x = np.sort([math.inf if v is None else v for v in values]).astype(float)
    j = median_rank(len(x), level)
    return float(np.median(x)), float(x[j - 1]), float(x[len(x) - j])


def line_through_medians(Ks: list, values: list[list[float | None]], level: float = 0.95, resamples: int = 2000,
                         seed: int = 0) -> dict | None:
    """A straight line through the per-K medians of seeds' values (None: longer than the run), its slope and the K
    where it reaches zero, with bootstrap percentile intervals from resampling the seeds within each K, and the
    number of seeds at each K ("seeds") the resampling had: with a handful, the percentiles are a nominal level, not
    a coverage. None with fewer than two finite medians; a resample with fewer, or a flat line, is left out of the
    intervals."""
    def fit(medians):
        finite = [(K, m) for K, m in zip(Ks, medians) if math.isfinite(m)]
        if len(finite) < 2:
            return None
        slope, intercept = np.polyfit(*zip(*finite), 1)
        return float(slope), float(-intercept / slope) if slope else None

    x = [np.array([math.inf if v is None else v for v in vs], float) for vs in values]
    point = fit([np.median(v) for v in x])
    if point is None:
        return None
    rng = np.random.default_rng(seed)
    boot = [fit([np.median(rng.choice(v, len(v))) for v in x]) for _ in range(resamples)]
    boot = [b for b in boot if b is not None and b[1] is not None]
    q = (1 - level) / 2
    slopes, zeros = np.array([b[0] for b in boot]), np.array([b[1] for b in boot])
    return {"slope": point[0], "K_at_zero": point[1],
            "slope_ci": [float(np.quantile(slopes, q)), float(np.quantile(slopes, 1 - q))],
            "K_at_zero_ci": [float(np.quantile(zeros, q)), float(np.quantile(zeros, 1 - q))], "resamples": len(boot),
            "seeds": [len(v) for v in x]}

def divergence(K, log_a, K2_star, gamma, b=0.0, c=0.0):
    """The divergence of Fig. 8a: Delta tau = a (K2* - K)^(-gamma), a = exp(log_a); with the paper's linear
    offset b + c K when b, c are given."""
    K = np.asarray(K, float)
    return np.exp(log_a - gamma * np.log(K2_star - K)) + b + c * K


def censored_median(values: list[float | None], bounds: list[float | None]) -> tuple[float, bool]:
    """(median, censored) over seeds: a seed still in 2-Gen at the end (None) is longer than the run; when
    that makes the median itself longer than the run, the median of the values with each such seed at its
    bound (the steps it had spent in 2-Gen) is a lower bound on it, returned with censored = True."""
    x = np.array([math.inf if v is None else v for v in values], float)
    if np.isfinite(np.median(x)):
        return float(np.median(x)), False
    return float(np.median([(b or 0.0) if v is None else v for v, b in zip(values, bounds)])), True


def _solve(M, v):
    """Batched M x = v: M (G, p, p), v (G, p)."""
    return np.linalg.solve(M, v[..., None])[..., 0]


def _censored_lstsq(X, y, w, finite, below, nonneg_first=False, ridge=0.0):
    """Weighted least squares of y (n,) on the columns of X (G, n, p), for G candidate (K2*, gamma) at once, with
    censored points: a point that is not `finite` is a lower bound, no cost where its K >= K2* (below[g, i] False)
    and else the squared shortfall of the fit below it. The hinge is solved by active sets: censored points below
    the fit are dropped, those above it fitted as data, until the set is stable. nonneg_first: the first
    coefficient >= 0 (where it comes out negative, the fit without that column). ridge: added to the normal
    equations' diagonal, for nearly collinear columns. Returns (coefficients, cost)."""
    active = np.broadcast_to(finite, below.shape)
    ridge = ridge * np.eye(X.shape[2])
    for _ in range(20):
        wa = active * w
        theta = _solve(np.einsum("gni,gn,gnj->gij", X, wa, X) + ridge, np.einsum("gni,gn,n->gi", X, wa, y))
        if nonneg_first and (neg := theta[:, 0] < 0).any():
            Xr, wr = X[neg][..., 1:], wa[neg]
            rest = _solve(np.einsum("gni,gn,gnj->gij", Xr, wr, Xr) + ridge[1:, 1:], np.einsum("gni,gn,n->gi", Xr, wr, y))
            theta[neg] = np.concatenate([np.zeros((len(rest), 1)), rest], 1)
        pred = np.einsum("gni,gi->gn", X, theta)
        update = finite | (below & (pred < y))
        if (update == active).all():
            break
        active = update
    shortfall = np.where(finite, y - pred, np.where(below, np.maximum(y - pred, 0.0), 0.0))
    return theta, (w * shortfall**2).sum(1)


def _fit_power(K: np.ndarray, y: np.ndarray, finite: np.ndarray) -> tuple | None:
    """Delta tau = a (K2* - K)^-gamma on medians y (finite: not censored): for a given K2*, log Delta tau =
    log a - gamma log(K2* - K) is a straight line, so the least squares in log Delta tau (relative errors: Delta tau
    spans decades) are a line fit for every K2* on a log grid from just above the largest finite K to 1000 times
    it, and the K2* of least cost. (log a, K2*, gamma, gamma / K2*); K2* = gamma = inf when the grid's last K2* wins."""
    if finite.sum() < 4:
        return None
    grid = K[finite].max() * np.logspace(1e-3, 3, 3000)[:, None]  # K2* candidates, 0.23 % apart
    below = grid > K[None]
    x = np.log(np.where(below, grid - K[None], 1.0))
    xm = x[:, finite].mean(1, keepdims=True)  # centred: log(K2* - K) varies by 1e-4 of itself at the grid's far end
    theta, sse = _censored_lstsq(np.stack([np.ones_like(x), x - xm], -1), np.log(y), np.ones_like(y), finite, below)
    sse[theta[:, 1] >= 0] = np.inf  # gamma > 0: a divergence, not a decay
    i = int(np.argmin(sse))
    if not np.isfinite(sse[i]):
        return None
    log_a, gamma = theta[i, 0] - theta[i, 1] * xm[i, 0], -theta[i, 1]
    if i == len(grid) - 1:  # no finite divergence: K2* -> inf with gamma / K2* fixed, log Delta tau linear in K
        return log_a, math.inf, math.inf, gamma / grid[i, 0]
    return log_a, grid[i, 0], gamma, gamma / grid[i, 0]


GAMMAS = np.linspace(0.2, 8, 40)  # the offset fit's gamma grid


def _fit_offset(K: np.ndarray, y: np.ndarray, finite: np.ndarray) -> tuple | None:
    """The paper's form, Delta tau = a (K2* - K)^-gamma + b + c K with a >= 0: for a given (K2*, gamma) it is
    linear in (a, b, c), so a weighted linear fit (weights 1/Delta tau^2: relative errors) for every (K2*, gamma)
    on a grid (K2* over _fit_power's range, 1.2 % apart; gamma in GAMMAS). (log a, K2*, gamma, b, c); K2* = gamma
    = inf when a straight line fits best (a = 0) or the grid's last K2* wins. Five parameters: at least six
    finite medians."""
    if finite.sum() < 6:
        return None
    K2, gamma = (g.ravel()[:, None] for g in np.meshgrid(K[finite].max() * np.logspace(1e-3, 3, 600), GAMMAS, indexing="ij"))
    below = K2 > K[None]
    x = np.where(below, np.maximum(K2 - K[None], 1e-12), 1.0) ** -gamma * below
    scale = x[:, finite].max(1, keepdims=True)
    X = np.stack([x / scale, np.ones_like(x), np.broadcast_to(K / K.max(), x.shape)], -1)
    unit = y[finite].max()  # all columns and y of order 1, so that the ridge is negligible at any scale of Delta tau
    theta, sse = _censored_lstsq(X, y / unit, (unit / y) ** 2, finite, below, nonneg_first=True, ridge=1e-12)
    theta *= unit
    i = int(np.argmin(sse))
    a = theta[i, 0] / scale[i, 0]
    if a <= 0 or K2[i, 0] == K2.max():  # the line b + c K alone
        line, _ = _censored_lstsq(X[:1, :, 1:], y / unit, (unit / y) ** 2, finite, np.ones((1, len(K)), bool))
        return -math.inf, math.inf, math.inf, line[0, 0] * unit, line[0, 1] * unit / K.max()
    return math.log(a), K2[i, 0], gamma[i, 0], theta[i, 1], theta[i, 2] / K.max()


def fit_divergence(K: list[float], dtau: list[list[float | None]], bounds: list[list[float | None]] | None = None,
                   offset: bool = False, resamples: int = 1000, seed: int = 0) -> dict:
    """Fit Fig. 8a's divergence to the median Delta tau over seeds at each K: a (K2* - K)^-gamma (_fit_power),
    or with offset the paper's a (K2* - K)^-gamma + b + c K (_fit_offset). None: a seed still in 2-Gen at the end,
    longer than the run; bounds[i][j] says by how much (the steps it had spent in 2-Gen), default 0.

    A K whose median is beyond the run is censored data (a Tobit-like fit): no cost when K >= K2* (never
    memorizing is what a divergence predicts there), else the squared shortfall of the fit below the median's
    lower bound (censored_median) - so a run that stays in 2-Gen far longer than the finite K's trend predicts is
    evidence for a divergence below it, and the fit uses it. Nominal 95 % intervals: bootstrap over seeds (resample
    the seeds at every K, refit the medians; "seeds" says how many each K had); a resample with too few finite medians cannot be fitted and is left out
    (their number is "resamples_fitted"; such resamples lean to a smaller K2*, so the interval sits too high when
    many are lost). With a handful of K the offset's parameters are barely identifiable (the offset and a distant
    divergence are both nearly straight lines): gamma often runs to the grid's bound."""
    K = np.asarray(K, float)
    bounds = bounds or [[None] * len(v) for v in dtau]
    fit = _fit_offset if offset else _fit_power

    def fit_medians(picks: list[np.ndarray]) -> tuple | None:
        points = [censored_median([vs[j] for j in pick], [bs[j] for j in pick]) for vs, bs, pick in zip(dtau, bounds, picks)]
        y = np.maximum([m for m, _ in points], 1.0)  # Delta tau of 0 (in one evaluation interval): 1 step
        return fit(K, y, ~np.array([c for _, c in points]))

    params = fit_medians([np.arange(len(vs)) for vs in dtau])
    if params is None:
        raise ValueError(f"the fit needs a finite, growing median Delta tau at >= {6 if offset else 4} K "
                         f"(finite at {sum(not censored_median(vs, bs)[1] for vs, bs in zip(dtau, bounds))})")
    rng = np.random.default_rng(seed)
    boot = np.array([p for p in (fit_medians([rng.integers(0, len(vs), len(vs)) for vs in dtau]) for _ in range(resamples))
                     if p is not None]).reshape(-1, len(params))
    lo, hi = ((np.quantile(boot, 0.025, axis=0, method="lower"), np.quantile(boot, 0.975, axis=0, method="higher"))
              if len(boot) else (np.full(len(params), math.nan),) * 2)
    log_a, K2, gamma = params[:3]

    def finite(value: float) -> float | None:  # None: unbounded (no finite divergence), or no resample fitted
        return float(value) if math.isfinite(value) else None

    out = {"K2_star": finite(K2), "gamma": finite(gamma), "log_a": float(log_a) if math.isfinite(K2) else None,
           "K2_star_ci": [finite(lo[1]), finite(hi[1])], "gamma_ci": [finite(lo[2]), finite(hi[2])],
           "resamples_fitted": len(boot), "seeds": [len(v) for v in dtau]}
    if offset:
        out.update(b=float(params[3]), c=float(params[4]))
        if not math.isfinite(K2):
            out["why"] = "no finite divergence: a straight line (the offset alone) fits best"
    elif not math.isfinite(K2):  # K2* -> inf with gamma / K2* fixed: log Delta tau linear in K, an exponential
        out.update(exponential_rate=float(params[3]),
                   why="no finite divergence: the least squares prefer K2* -> inf (log Delta tau linear in K)")
    return out


# ----------------------------------------------------------------------------- partial memorization


def sigmoid(t, A, log_t0, width):
    """A sigmoid in log time, rising to its asymptote A (the memorized fraction at convergence)."""
    return A / (1 + np.exp(-(np.log(t) - log_t0) / width))


def fit_sigmoid(steps: list[int], fraction: list[float], maxfev: int = 20_000) -> dict:
    """The asymptote A of `sigmoid` fitted to a memorized-fraction curve (steps > 0), A in [0, 1]; a curve that
    never rises above 0 (a null-corrected fraction can sit just below it) has A = 0. A fit that has not converged
    after maxfev evaluations (a curve that rises only in its last points can need thousands) has A = None and
    says why: no asymptote, rather than scipy's last guess or an error that ends the analysis of every run."""
    t, f = np.asarray(steps, float), np.asarray(fraction, float)
    t, f = t[t > 0], f[t > 0]
    if f.max() <= 0:
        return {"A": 0.0, "log_t0": None, "width": None}  # nothing memorized: no sigmoid to place
    half = t[np.argmax(f >= f.max() / 2)]
    # least squares with bounds; imported here, not at the top: ~0.6 s that k1.py's, k2.py's and sa_scaling.py's
    # --help (and every other use of this module) does not need
    from scipy.optimize import OptimizeWarning, curve_fit
    with warnings.catch_warnings():  # few points make the covariance singular; only the asymptote is used
        warnings.simplefilter("ignore", OptimizeWarning)
        try:
            params, _ = curve_fit(sigmoid, t, f, p0=[f.max(), math.log(half), 0.5],
                                  bounds=([0, math.log(t.min()) - 5, 0.01], [1, math.log(t.max()) + 10, 10]),
                                  maxfev=maxfev)
        except RuntimeError as e:  # scipy's "Optimal parameters not found: ..."
            return {"A": None, "log_t0": None, "width": None, "why": f"the sigmoid fit did not converge: {e}"}
    return {"A": float(params[0]), "log_t0": float(params[1]), "width": float(params[2])}


def epsilon_calibration(scores: list[list[float]]) -> dict:
    """epsilon from the per-chain scores of models trained at K = inf (which cannot memorize), scored at the
    end of training on fixed fresh chains: their mean and spread, and the threshold
    epsilon = mean - 2 std: a chain counts as memorized when the model beats 2-Gen on it by more than a model
    that cannot memorize does on 97.7 % of chains. (The paper, whose K = inf models have mean and std ~ 10^-3,
    sets epsilon = 10^-3, the scale of those fluctuations.)"""
    x = np.concatenate([np.asarray(v, float) for v in scores])
    per_model = [{"mean": float(np.mean(v)), "std": float(np.std(v))} for v in scores]
    mean, std = float(x.mean()), float(x.std())
    return {"mean": mean, "std": std, "value": mean - 2 * std, "per_model": per_model, "chains": len(scores[0]),
            "scores": [round(float(v), 5) for v in x]}


def extrapolate_zero(Ks: list[float], fraction: list[float]) -> float | None:
    """Fig. 8b's extrapolation: the K at which a line through the mean memorized asymptotes against log K,
    from the largest asymptote on, reaches zero (None: fewer than two points, or not falling)."""
    top = int(np.argmax(fraction))
    x, y = np.log(np.asarray(Ks[top:], float)), np.asarray(fraction[top:], float)
    if len(x) < 2:
        return None
    slope, intercept = np.polyfit(x, y, 1)
    return float(math.exp(-intercept / slope)) if slope < 0 else None
