"""The fits behind Fig. 6b-c (analysis/sa_fits.py) and Fig. 8f (mem_minimal.py) at the choices a symmetric test
cannot see: which seeds' statistic (a mean, not a median), which points a window holds (both ends), the spread
drawn as error bars, and the sign of the K2_hat criterion."""
import math

import numpy as np
import pytest

import mem_minimal as mm
from analysis import sa_fits


def test_tau_fit_averages_the_seeds():
    """Three seeds at 1/3, 2/3 and 2 times 3 N / log N: their mean is 3 N / log N (prefactor 3, slope 1), their
    median 2 N / log N, their geometric mean (4/9)^(1/3) 3 N / log N."""
    Ns = [32, 64, 128, 256]
    fit = sa_fits.fit_tau({N: [f * 3 * N / math.log(N) for f in (1 / 3, 2 / 3, 2)] for N in Ns})
    assert fit["prefactor"] == pytest.approx(3.0) and fit["slope_vs_N_over_logN"] == pytest.approx(1.0)


def test_rate_and_power_windows_include_both_ends():
    """The window lo <= t <= hi holds its end points: here the points at t = lo and t = hi sit off the line
    through the inside ones, so the slope is the least squares over all five (by hand: S_ty / S_tt)."""
    t = [0, 10, 20, 30, 40, 50, 60]
    y = [100.0, 4.0, 2.0, 3.0, 4.0, 9.0, -100.0]  # window [10, 50]: (10, 4), (20, 2), (30, 3), (40, 4), (50, 9)
    # mean t 30, mean y 4.4; S_ty = (-20)(-0.4) + (-10)(-2.4) + 0 + 10(-0.4) + 20(4.6) = 120, S_tt = 1000
    assert sa_fits.fit_rate(t, y, 10, 50) == pytest.approx(0.12)
    logs = np.log([10, 20, 30, 40, 50]), np.log(y[1:6])
    assert sa_fits.fit_power(t, y, 10, 50) == pytest.approx(np.polyfit(*logs, 1)[0])


def test_tau_of_the_exponent_windows_is_the_mean_over_seeds():
    """Windows given as fractions of tau, tau the mean over the seeds that crossed (100, 200, 600: 300)."""
    t = list(range(0, 1001, 10))
    runs = [{"t": t, "beta": [x * (1 + i) for x in t], "delta": [x**2 for x in t], "tau": tau}
            for i, tau in enumerate((100.0, 200.0, 600.0, math.nan))]
    assert sa_fits.summarize_exponents(runs, [(0.1, 1.0)])["tau_mean"] == 300.0


def test_geometric_stats_are_the_mean_and_spread_in_log2():
    """Fig. 8f: the geometric mean over seeds and the (population) standard deviation of log2 K2_hat."""
    assert mm.geometric_stats([2.0, 8.0]) == pytest.approx((4.0, 1.0))
    assert mm.geometric_stats([1.0, 4.0, 16.0]) == pytest.approx((4.0, math.sqrt(8 / 3)))  # log2: 0, 2, 4


def test_the_k2_hat_criterion_is_the_training_loss_minus_2gen():
    """K2_hat's criterion (the model beats 2-Gen on its training batches: < 0) has the sign of the held-out
    train_minus_2gen on a run that clearly memorizes (K = 2) and on one that cannot (K = 2048)."""
    small = mm.train_mem(mm.MemRun(K=2, iters=150, tail=50, eval_seqs=64, width=64))
    large = mm.train_mem(mm.MemRun(K=2048, iters=30, tail=20, eval_seqs=64, width=64))
    assert small["criterion"] < 0 and small["train_minus_2gen"] < 0
    assert large["criterion"] > 0 and large["train_minus_2gen"] > 0


def test_heat_maps_are_indexed_D_phi_by_K(monkeypatch):
    """Fig. 8d-e: entry [i][j] is the run at D_phi[i], K[j] (each fake run reports its own D_phi and K), with the
    base run's other settings."""
    seen = []

    def fake(run):
        seen.append(run)
        return {"train_minus_2gen": run.D_phi + run.K / 1000, "gen_minus_2gen": -run.D_phi - run.K / 1000,
                "criterion": run.K * 10.0 + run.D_phi}

    monkeypatch.setattr(mm, "train_mem", fake)
    monkeypatch.setattr(mm.cli, "parallel_map", lambda fn, jobs, processes, progress="": [fn(j) for j in jobs])
    H = mm.heatmap(mm.MemRun(iters=7, width=5), [2, 8], [4, 16, 64], jobs=1)
    assert H["D_phi"] == [2, 8] and H["K"] == [4, 16, 64]
    assert H["train_minus_2gen"] == [[2.004, 2.016, 2.064], [8.004, 8.016, 8.064]]
    assert H["gen_minus_2gen"] == [[-2.004, -2.016, -2.064], [-8.004, -8.016, -8.064]]
    assert H["criterion"] == [[42.0, 162.0, 642.0], [48.0, 168.0, 648.0]]
    assert all((r.iters, r.width) == (7, 5) for r in seen) and len(seen) == 6
