"""tau_settings.py: Fig. 6c bottom at other SGD settings. Each setting bites (it changes the run of the same seed),
a diverged run stops and says so, and the two numbers the comparison rests on (the head against the baseline run of
the same (N, seed), phi's early growth rate) come out of hand-made trajectories as they were made."""
import math

import numpy as np
import pytest
import torch

import tau_settings as ts
from analysis import transformer_tau as st


def trajectory(N, seed, head, slope, cap=4000, every=50):
    """A stored run: phi rising at `slope` per step from 0.1 until half the head's time, then twice as fast (what the
    early rate must leave out), jumping to 0.8 when the head forms at `head` (None: never); the loss on its plateau."""
    t = list(range(0, cap + 1, every))
    bend = 0.5 * head if head is not None else math.inf
    phi = [0.8 if head is not None and s >= head else 0.1 + slope * min(s, bend) + 2 * slope * max(0.0, s - bend)
           for s in t]
    return {"N": N, "seed": seed, "cap": cap, "eval_batch": 64, **st.TRAINING,
            "levels": {"loss_best_1gen": 2.30, "loss_2gen": 2.10}, "t": t, "loss": [2.30] * len(t), "phi": phi}


def test_the_early_rate_is_phis_slope_before_half_the_heads_time():
    run = trajectory(32, 0, head=2025, slope=2e-5)
    assert st.tau_2gen_drop(run)["head"] == pytest.approx(2000, abs=50)  # phi passes 0.5 between 2000 and 2050
    assert ts.early_rate(run) == pytest.approx(2e-5, rel=1e-6)  # not 3e-5 (the later, steeper half)
    assert ts.early_rate(trajectory(32, 0, head=None, slope=1e-5)) == pytest.approx(1e-5, rel=1e-6)  # no head: all


def test_compare_pairs_each_run_with_the_baselines_of_its_N_and_seed():
    baseline = {"32": {"0": trajectory(32, 0, 2025, 1e-5), "1": trajectory(32, 1, 3025, 1e-5)},
                "64": {"0": trajectory(64, 0, 2525, 1e-5), "1": trajectory(64, 1, 1025, 1e-5)}}
    runs = {"batch512": {"32": {"1": trajectory(32, 1, 1525, 3e-5)}, "64": {"0": trajectory(64, 0, 1025, 3e-5)}}}
    out = ts.compare(runs, baseline)
    ratio = out["batch512"]["head_vs_baseline"]
    assert ratio["32"]["1"] == pytest.approx(1500 / 3000, rel=0.03) and ratio["64"]["0"] == pytest.approx(1000 / 2500, rel=0.05)
    assert out["batch512"]["early_rate"]["64"] == [pytest.approx(3e-5, rel=1e-6)]
    assert out["baseline"]["theory_rate"]["64"] == pytest.approx(sum(1 / k for k in range(1, 65)) / 64)


@pytest.mark.parametrize("name", sorted(ts.SETTINGS))
def test_every_setting_changes_the_run_of_the_same_seed(name):
    """Twelve steps at N = 8, evaluated every 4: the setting's trajectory is not the record's."""
    torch.set_num_threads(1)
    base = st.train_one(8, 0, 12, eval_batch=64, training={**st.TRAINING, "eval_every": 4})
    other = st.train_one(8, 0, 12, eval_batch=64, training={**ts.SETTINGS[name][0], "eval_every": 4})
    if "init" in ts.SETTINGS[name][0]:  # a knock-out of the start: W_U at zero predicts uniformly, loss log C
        assert other["loss"][0] == pytest.approx(math.log(st.C), abs=1e-6) != base["loss"][0]
    else:
        assert base["t"][0] == other["t"][0] == 0 and base["loss"][0] == other["loss"][0]  # the same model and eval set
    assert len(other["loss"]) < len(base["loss"]) or not np.allclose(base["loss"][1:], other["loss"][1:], rtol=1e-6)


def test_a_frozen_parameter_stays_where_training_moves_it_and_a_diverged_run_stops(monkeypatch):
    models = []
    make = st.model_for
    monkeypatch.setattr(st, "model_for", lambda N, seed, init=None: models.append(make(N, seed, init)) or models[-1])
    for training in (st.TRAINING, ts.SETTINGS["frozenP2"][0]):
        st.train_one(8, 0, 12, eval_batch=64, training={**training, "eval_every": 4})
    moved, held = (m.att2.P.detach() for m in models)
    assert not torch.equal(moved, torch.zeros_like(moved)) and torch.equal(held, torch.zeros_like(held))
    run = st.train_one(8, 0, 400, eval_batch=64, training={**st.TRAINING, "lr": 1e4, "eval_every": 4})
    assert not math.isfinite(run["loss"][-1]) and run["t"][-1] < 400  # stopped at its first non-finite evaluation
    assert st.tau_2gen_drop(run)["status"] == "diverged"
