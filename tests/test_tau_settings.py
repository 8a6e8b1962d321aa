"""tau_settings.py: the ladder of Fig. 6c bottom (SGD settings, knock-outs of the model, the SA side) and the
measurement of the theory's coordinates. Each setting bites (it changes the run of the same seed), a knock-out
changes what it says and nothing else, a diverged run stops and says so, the numbers the comparison rests on (the
head against the baseline run of the same (N, seed), phi's early growth rate and its interval, the velocities and
their slopes) come out of hand-made inputs as they were made, and a velocity is a central difference."""
import json
import math
import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import tau_settings as ts
from analysis import transformer_tau as st

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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


# ----------------------------------------------------------------------------- the knock-outs


def test_the_knockouts_change_what_they_say_and_nothing_else(monkeypatch):
    """smallstart: W_Q, W_K of both layers at 0.05 x the seed's draw, W_U at zero, the rest the seed's; window1: after
    training, layer 1's position bias has moved at lags 0 and 1 and nowhere else."""
    init = ts.SETTINGS["smallstart"][0]["init"]
    base, small = st.model_for(8, 3), st.model_for(8, 3, init)
    for (name, a), b in zip(base.named_parameters(), small.parameters()):
        factor = 0.0 if name == "W_U.weight" else init["scale"].get(name, 1.0)
        assert torch.equal(b, a * factor), name
    assert sum(f != 1.0 for f in init["scale"].values()) == 4
    models = []
    make = st.model_for
    monkeypatch.setattr(st, "model_for", lambda N, seed, init=None: models.append(make(N, seed, init)) or models[-1])
    st.train_one(8, 0, 12, eval_batch=64, training={**ts.SETTINGS["window1"][0], "eval_every": 4})
    P = models[0].att1.P.detach()[0]
    assert (P[:2] != 0).all() and torch.equal(P[2:], torch.zeros_like(P[2:]))
    assert (models[0].att2.P.detach() != 0).any()  # layer 2's bias trains as before


# ----------------------------------------------------------------------------- the theory's coordinates, measured


def random_transformer(N, seed):
    model = st.model_for(N, seed)
    with torch.no_grad():  # position biases off zero, so that every path of the coordinates is exercised
        for P in (model.att1.P, model.att2.P):
            P.normal_(0.0, 0.5, generator=torch.Generator().manual_seed(seed))
    return model, dict(model.named_parameters())


def random_sa(N, seed, dtype=torch.float32):
    model = ts.SATransformer(N).to(dtype)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(0.5 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model, dict(model.named_parameters())


def test_a_velocity_is_the_coordinates_change_along_minus_the_mean_gradient():
    """dq/dt = -<grad q, grad L> against a central difference of q along -grad L (L the mean over both batches), for
    every coordinate of both models; the velocity of the loss itself is -|grad L|^2 < 0."""
    batches = [ts.fresh_batch(16, 10, torch.Generator().manual_seed(s)) for s in (1, 2)]
    context = batches[0][0]
    cases = []
    model, params = random_transformer(10, 0)
    cases.append((params, lambda c, y, p=params: F.cross_entropy(st.last_position(p, c)[0], y),
                  lambda p=params, m=model: ts.transformer_coordinates(m, p, context)))
    sa, sa_params = random_sa(10, 1)
    cases.append((sa_params, lambda c, y, m=sa: ts.target_loss(m(c), y)[0].mean(),
                  lambda m=sa: ts.sa_coordinates(m, context)))
    for params, loss, coordinates in cases:
        out = ts.velocities(loss, coordinates(), params, batches)
        leaves = list(params.values())
        grad = torch.autograd.grad(sum(loss(c, y) for c, y in batches) / len(batches), leaves)
        norm = math.sqrt(sum(float((g * g).sum()) for g in grad))
        eps = 2e-3 / norm  # a step of 2e-3 along -grad L: float32's rounding well below the change it makes
        shifted = {}
        for sign in (1, -1):
            with torch.no_grad():
                for p, g in zip(leaves, grad):
                    p.sub_(sign * eps * g)
                shifted[sign] = {k: float(v) for k, v in coordinates().items()}
                for p, g in zip(leaves, grad):
                    p.add_(sign * eps * g)
        for name, row in out.items():
            finite = (shifted[1][name] - shifted[-1][name]) / (2 * eps)
            assert row["velocity"] == pytest.approx(finite, rel=0.02, abs=1e-4 * norm), name
            assert row["value"] == pytest.approx(float(coordinates()[name].detach()), rel=1e-6)
        assert any(abs(row["velocity"]) > 1e-6 for row in out.values())
        self_rate = ts.velocities(loss, {"loss": sum(loss(c, y) for c, y in batches) / 2}, params, batches)["loss"]
        assert self_rate["velocity"] == pytest.approx(-norm ** 2, rel=1e-5)


def test_the_coordinates_are_what_they_say():
    """The transformer's: beta against a loop over query and key states, delta the lag-1 entry of layer 1's bias,
    phi_beta(2) the induction readout of last_position's attention, phi_delta(1) the full model's layer-1 attention of
    the last position on the one before. The SA-transformer's: M2's h.x diagonal, P1[1], and its layer-2 attention."""
    model, params = random_transformer(9, 4)
    context = ts.fresh_batch(32, 9, torch.Generator().manual_seed(5))[0]
    got = {k: float(v) for k, v in ts.transformer_coordinates(model, params, context).items()}
    E = ts.layer_norm(params["W_E.weight"])
    D = E.shape[1]
    score = [[float(params["att2.W_Q.weight"] @ E[a] @ (params["att2.W_K.weight"]
                    @ ts.layer_norm(params["att1.W_V.weight"] @ E[b]))) / math.sqrt(D) for b in range(st.C)]
             for a in range(st.C)]
    diag = np.mean([score[a][a] for a in range(st.C)])
    off = np.mean([score[a][b] for a in range(st.C) for b in range(st.C) if a != b])
    assert got["beta"] == pytest.approx(diag - off, rel=1e-5)
    assert got["delta"] == float(params["att1.P"][0, 1]) != float(params["att1.P"][0, 0])
    assert got["phi_beta2"] == pytest.approx(float(st.induction(st.last_position(params, context)[1], context)), rel=1e-6)
    A1 = model(context, cache=True)[1]["A1"]
    assert got["phi_delta1"] == pytest.approx(float(A1[:, -1, -2].mean()), rel=1e-6)
    assert got["phi_delta1"] != pytest.approx(float(A1[:, -1, -1].mean()), rel=1e-3)  # not the diagonal
    sa, sa_params = random_sa(9, 6)
    out = {k: float(v) for k, v in ts.sa_coordinates(sa, context).items()}
    assert out["beta"] == pytest.approx(float(np.mean([float(sa.M2[st.C + i, i]) for i in range(st.C)])), rel=1e-6)
    assert out["delta"] == float(sa.P1[1])
    A2 = ts.layers(context, *sa.attention_parameters())[2]
    match = np.array([[float(s[i - 1] == s[-1]) for i in range(1, 9)] for s in context.tolist()])
    assert out["phi_beta2"] == pytest.approx(float((A2[:, 1:].detach().numpy() * match).sum(1).mean()), rel=1e-6)


def test_the_measure_hooks_read_the_run_without_changing_it():
    """A measured run (velocities at t = 0 and 4) is the unmeasured run, step for step, in both models."""
    torch.set_num_threads(1)
    batches = [ts.fresh_batch(8, 8, torch.Generator().manual_seed(9))]
    template, seen = st.model_for(8, 0), []

    def hook(t, params):
        if t in (0, 4):
            loss = lambda c, y: F.cross_entropy(st.last_position(params, c)[0], y)  # noqa: E731
            seen.append(ts.velocities(loss, ts.transformer_coordinates(template, params, batches[0][0]), params, batches))

    training = {**st.TRAINING, "eval_every": 2}
    assert st.train_one(8, 0, 8, 64, training, measure=hook) == st.train_one(8, 0, 8, 64, training) and len(seen) == 2
    run = ts.Run(N=8, iters=8, eval_every=2, eval_batch=64)

    def sa_hook(t, model):
        loss = lambda c, y: ts.target_loss(model(c), y)[0].mean()  # noqa: E731
        seen.append(ts.velocities(loss, ts.sa_coordinates(model, batches[0][0]), dict(model.named_parameters()), batches))

    assert ts.train_sa(run, sa_hook)["beta"] == ts.train_sa(run)["beta"] and len(seen) == 7


def measured(model, N, seed, velocity, phi_rate, stages=3):
    """A stored measurement run: every coordinate's velocity velocity(N, stage), phi rising at phi_rate(N)."""
    t = list(range(0, 500, 25))
    return {"model": model, "N": N, "seed": seed, "t": t, "phi": [0.1 + phi_rate(N) * s for s in t],
            "loss": [2.3] * len(t), "times": {str(100 * i): {name: {"value": 0.0, "velocity": velocity(N, i), "se": 0.0}
                                                          for name in ("beta", "delta")} for i in range(stages)}}


def test_the_velocities_scaling_against_N_and_phis_early_rate_against_HN_over_N():
    """Slopes of log |median over seeds| against log N (a falling velocity and a negative one alike), the theory's
    slopes (beta: that of H_N / N, delta: -1), and phi's early rate growing as (H_N / N)^2 read as 2."""
    Ns = (32, 64, 128)
    runs = [measured("sa", N, s, lambda N, i, s=s: -(1 + 0.1 * s) * N ** -(1 + i / 2),
                     lambda N, s=s: (1 + 0.01 * s) * (ts.harmonic(N) / N) ** 2) for N in Ns for s in (0, 1, 2)]
    runs += [measured("sa", N, 3, lambda N, i: 100.0, lambda N: 1.0) for N in Ns]  # an outlier seed: the median
    # ignores it (three seeds and it: the median is the mean of the two middle seeds, the same factor at every N)
    out = ts.measure_summary(runs, {})["sa"]
    assert [row["slope"] for row in out["beta"]] == pytest.approx([-1.0, -1.5, -2.0], abs=1e-3)
    assert out["delta"][0]["theory"] == -1.0
    assert out["beta"][0]["theory"] == pytest.approx(np.polyfit(np.log(Ns), np.log([ts.harmonic(N) / N for N in Ns]),
                                                                1)[0])
    assert out["early_phi"]["slope_vs_HN_over_N"] == pytest.approx(2.0, abs=0.02)
    assert "record_match" not in out


# ----------------------------------------------------------------------------- the hybrids


def test_the_softmax_hybrid_reads_the_parents_experts_through_its_map():
    """readout="softmax": uniform at W_R = 0; with W_R selecting one expert (expert-major columns, as e.flatten(1)
    lays them out) at scale s, softmax(s x that expert) of the parent's experts; the mixture readout is the parent."""
    N = 12
    seqs = ts.fresh_batch(64, N, torch.Generator().manual_seed(3))[0]
    hybrid, _ = random_sa(N, 7)
    hybrid.W_R = torch.nn.Parameter(torch.zeros(st.C, 4 * st.C))
    hybrid.readout = "softmax"
    assert torch.allclose(hybrid(seqs), torch.full((64, st.C), 1 / st.C))
    parent = ts.SATransformer(N)
    parent.load_state_dict({k: v for k, v in hybrid.state_dict().items() if k != "W_R"})
    e = ts.layers(seqs, *parent.attention_parameters())
    experts = torch.stack([e[0][:, -1], e[1][:, -1], (e[2].unsqueeze(1) @ e[0]).squeeze(1),
                           (e[2].unsqueeze(1) @ e[1]).squeeze(1)], 1)  # (B, 4, C), from the layers alone
    with torch.no_grad():
        hybrid.W_R.zero_()
        hybrid.W_R[:, 2 * st.C:3 * st.C] = 5.0 * torch.eye(st.C)  # the third expert, sum_i A2_iN x_i
    assert torch.allclose(hybrid(seqs), torch.softmax(5.0 * experts[:, 2], -1), atol=1e-6)
    assert torch.allclose(parent(seqs), torch.einsum("e,bec->bc", parent.weights(), experts), atol=1e-6)
    assert not torch.allclose(hybrid(seqs), parent(seqs), atol=1e-3)
    with pytest.raises(ValueError, match="readout"):
        ts.SATransformer(N, readout="mlp")


def test_a_hybrid_run_records_its_tau_and_phi_and_the_ladder_fits_it_beside_the_records_sa(monkeypatch, tmp_path):
    """A hybrid run is train_sa's with the hybrid's readout (its tau, the masked loss's halfway crossing, and phi on
    the run's evaluation set), written whole; hybrid_summary fits its taus and the record's SA taus alike."""
    torch.set_num_threads(1)
    monkeypatch.setitem(ts.SCREEN, "eval_batch", 256)
    monkeypatch.setitem(ts.SCREEN, "eval_every", 20)
    monkeypatch.setattr(ts, "HYBRID_CAP", 60)
    run = ts._hybrid_job((str(tmp_path), "sa_softmax", 16, 0))
    assert run["t"] == list(range(0, 61, 20)) and run["readout"] == "softmax" and len(run["phi"]) == len(run["t"])
    with torch.no_grad():
        start = ts.sa_coordinates(ts.SATransformer(16), ts.fresh_batch(
            256, 16, torch.Generator().manual_seed(10**6 + 16))[0])["phi_beta2"]
    assert run["phi"][0] == pytest.approx(float(start), abs=1e-4)
    assert run["masked_loss"][0] == pytest.approx(math.log(st.C), abs=1e-4)  # W_R at zero: uniform
    with open(tmp_path / "sa_softmax_N16_s0.json") as fh:
        assert json.load(fh) == run
    hybrid = {"sa_softmax": {str(N): {"0": {"tau": 100.0 * N / math.log(N)}, "1": {"tau": None}}
                             for N in (32, 64, 128)}}
    record = {str(N): [10.0 * N, 11.0 * N] for N in (32, 64, 128)}
    out = ts.hybrid_summary(hybrid, record)
    assert out["sa"]["vs_N"]["slope"] == pytest.approx(1.0) and sorted(out) == ["sa", "sa_softmax"]
    assert out["sa_softmax"]["N"]["64"]["median"] > 100.0 * 64 / math.log(64)  # the censored seed counts as longer


def test_the_early_rates_slope_and_its_interval_resample_the_seeds_within_each_N():
    """Rates (H_N / N)^2 times a seed factor: slope 2; the interval from resampling the seeds is the spread the seed
    factors allow (here they move N = 128's median only, so the interval's ends are the slopes with 128's seeds alone);
    one N: no slope."""
    theory = {N: ts.harmonic(N) / N for N in (32, 64, 128)}
    rates = {32: [theory[32] ** 2] * 2, 64: [theory[64] ** 2] * 2, 128: [0.5 * theory[128] ** 2, 2 * theory[128] ** 2]}
    slope, ci = ts.rate_slope(rates, theory)
    x = np.log([theory[N] for N in (32, 64, 128)])

    def with_128(factor):
        return np.polyfit(x, np.log([theory[32] ** 2, theory[64] ** 2, factor * theory[128] ** 2]), 1)[0]

    assert slope == pytest.approx(with_128(1.25))  # the median of 0.5 and 2 (not their geometric mean 1)
    assert ci == pytest.approx([with_128(2.0), with_128(0.5)])
    assert ts.rate_slope({32: [1e-5, 2e-5]}, theory) == (None, None)


def test_collect_adds_the_runs_under_root_to_the_committed_ones(tmp_path):
    """The committed JSON's runs stay; a setting's run under root (any N) joins them and is compared with the record's
    run of its (N, seed); a hybrid's run goes to hybrid_runs and its fit, beside the record's SA taus."""
    import shutil
    figures, root = tmp_path / "figures", tmp_path / "root"
    figures.mkdir()
    root.mkdir()
    for name in ("tau_settings.json", "sa_scaling.json"):
        shutil.copy(os.path.join(ROOT, "figures", name), figures / name)
    with open(figures / "tau_settings.json") as fh:
        committed = json.load(fh)
    run = {**committed["runs"]["frozenP2"]["64"]["1"], "note": "a window1 run"}
    (root / "window1_N64_s1.json").write_text(json.dumps(run))
    hybrid = {"N": 32, "seed": 0, "t": [0, 50], "masked_loss": [2.3, 2.2], "phi": [0.1, 0.2], "tau": 4000.0}
    (root / "sa_softmax_N32_s0.json").write_text(json.dumps(hybrid))
    (root / "sa_softmax_N64_s0.json").write_text(json.dumps({**hybrid, "N": 64, "tau": 5000.0}))
    (root / "notes.txt").write_text("not a run")
    result = ts.collect(str(root), str(figures))
    for name, by_N in committed["runs"].items():
        assert result["runs"][name] == by_N, name
    assert result["runs"]["window1"] == {"64": {"1": run}}
    ratio = result["compare"]["window1"]["head_vs_baseline"]["64"]["1"]
    assert ratio == pytest.approx(committed["compare"]["frozenP2"]["head_vs_baseline"]["64"]["1"])
    assert sorted(result["hybrid_runs"]["sa_softmax"]) == ["32", "64"]
    assert result["hybrids"]["sa_softmax"]["N"]["64"]["median"] == 5000.0
    assert result["hybrids"]["sa"]["N"]["32"]["median"] == pytest.approx(np.median(json.load(open(
        figures / "sa_scaling.json"))["tau"]["32"]))
    with open(figures / "tau_settings.json") as fh:
        assert json.load(fh) == json.loads(json.dumps(result))
    assert (figures / "tau_settings.png").exists()
