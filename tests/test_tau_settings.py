"""tau_settings.py: the ladder of Fig. 6c bottom (SGD settings, knock-outs of the model, the SA side). Each setting
bites (it changes the run of the same seed), a knock-out changes what it says and nothing else, a diverged run stops
and says so, the hybrid is its parent's experts read through its map, and the numbers the comparison rests on (the
head against the baseline run of the same (N, seed), phi's early growth rate and its interval) come out of hand-made
inputs as they were made."""
import functools
import json
import math
import os
import shutil

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import sa_hybrids
import sa_transformer as sat
import tau_settings as ts
import tau_velocities as tv
from analysis import fresh_chains as fc
from analysis import sa_fits
from analysis import transformer_tau as st
from transformer import attention_scores, layer_norm

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
    assert st.early_rate(run) == pytest.approx(2e-5, rel=1e-6)  # not 3e-5 (the later, steeper half)
    assert st.early_rate(trajectory(32, 0, head=None, slope=1e-5)) == pytest.approx(1e-5, rel=1e-6)  # no head: all


def test_compare_pairs_each_run_with_the_baselines_of_its_N_and_seed():
    baseline = {"32": {"0": trajectory(32, 0, 2025, 1e-5), "1": trajectory(32, 1, 3025, 1e-5)},
                "64": {"0": trajectory(64, 0, 2525, 1e-5), "1": trajectory(64, 1, 1025, 1e-5)}}
    runs = {"batch512": {"32": {"1": trajectory(32, 1, 1525, 3e-5)}, "64": {"0": trajectory(64, 0, 1025, 3e-5)}}}
    out = ts.compare(runs, baseline)
    ratio = out["batch512"]["head_vs_baseline"]
    assert ratio["32"]["1"] == pytest.approx(1500 / 3000, rel=0.03) and ratio["64"]["0"] == pytest.approx(1000 / 2500, rel=0.05)
    assert out["batch512"]["early_rate"]["64"] == [pytest.approx(3e-5, rel=1e-6)]
    assert out["baseline"]["theory_rate"]["64"] == pytest.approx(sum(1 / k for k in range(1, 65)) / 64)


@pytest.mark.parametrize("name", sorted(set(ts.SETTINGS) - {"record"}))
def test_every_setting_changes_the_run_of_the_same_seed(name):
    """Twelve steps at N = 8, evaluated every 4: the setting's trajectory is not the record's."""
    torch.set_num_threads(1)
    base = st.train_one(8, 0, 12, eval_batch=64, training={**st.TRAINING, "eval_every": 4})
    other = st.train_one(8, 0, 12, eval_batch=64, training={**ts.SETTINGS[name][0], "eval_every": 4})
    if "init" in ts.SETTINGS[name][0]:  # a knock-out of the start: W_U at zero predicts uniformly, loss log C
        assert other["loss"][0] == pytest.approx(math.log(fc.C), abs=1e-6) != base["loss"][0]
    elif ts.SETTINGS[name][0].get("balance"):  # other data: its own eval set and levels
        assert other["levels"] != base["levels"] and other["loss"][0] != base["loss"][0]
    elif ts.SETTINGS[name][0].get("final_norm"):  # another model from the start: a layer norm before the readout
        assert other["levels"] == base["levels"] and other["loss"][0] != base["loss"][0]
    else:
        assert base["t"][0] == other["t"][0] == 0 and base["loss"][0] == other["loss"][0]  # the same model and eval set
    assert len(other["loss"]) < len(base["loss"]) or not np.allclose(base["loss"][1:], other["loss"][1:], rtol=1e-6)


def test_balanced_chains_are_doubly_stochastic_and_keep_their_cross_ratios():
    """fresh_chains.balanced: rows and columns sum to 1, the stationary distribution is uniform, and the chain is its
    draw rescaled by rows and columns (Sinkhorn: every cross-ratio T_ij T_kl / (T_il T_kj) kept), not a new one; on
    such data the best 1-point predictor gains nothing over uniform while 2-Gen still does."""
    T = fc.sample_chains(64, fc.C, 1.0, torch.Generator().manual_seed(3)).double()
    B = fc.balanced(T)
    assert torch.allclose(B.sum(-1), torch.ones(64, fc.C, dtype=B.dtype), atol=1e-9)
    assert torch.allclose(B.sum(-2), torch.ones(64, fc.C, dtype=B.dtype), atol=1e-9)
    assert torch.allclose(fc.stationary(B), torch.full((64, fc.C), 1 / fc.C, dtype=B.dtype), atol=1e-9)
    ratio = lambda X: X[:, 0, 0] * X[:, 1, 2] / (X[:, 0, 2] * X[:, 1, 0])  # noqa: E731
    assert torch.allclose(ratio(B), ratio(T), rtol=1e-6)
    assert not torch.allclose(B, torch.full_like(B, 1 / fc.C), atol=0.05)
    levels = fc.predictor_levels(*fc.eval_set(4096, 32, balance=True))
    assert levels["loss_best_1gen"] == pytest.approx(math.log(fc.C), abs=0.005)
    assert levels["loss_2gen"] < math.log(fc.C) - 0.05


def test_the_unigram_free_rung_trains_and_evaluates_on_balanced_chains(monkeypatch):
    """unigram_free: every training batch and the eval set are drawn with balance (the record: without)."""
    seen, draw = [], st.fresh_batch
    monkeypatch.setattr(st, "fresh_batch", lambda B, N, g, balance=False, iid=False: seen.append(balance) or
                        draw(B, N, g, balance=balance, iid=iid))
    run = st.train_one(8, 0, 6, eval_batch=64, training={**ts.SETTINGS["unigram_free"][0], "eval_every": 3})
    assert seen == [True] * 6
    assert run["levels"] == st.predictor_levels(*fc.eval_set(64, 8, balance=True))


def test_independent_states_keep_the_chains_frequencies_and_drop_their_transitions():
    """fresh_chains.independent: every column of the chain is its stationary distribution, which it keeps; on such
    data the Bayes 2-Gen predictor does worse than 1-Gen (it splits the same counts by the previous state), where on
    the chains it does better, and the best 1-point predictor gains over uniform about what it gains on the chains."""
    T = fc.sample_chains(64, fc.C, 1.0, torch.Generator().manual_seed(3))
    p = fc.stationary(T)
    independent = fc.independent(T)
    assert torch.allclose(independent, p.unsqueeze(-1).expand(-1, -1, fc.C))
    assert not torch.allclose(p, torch.full_like(p, 1 / fc.C), atol=0.02)  # not the uniform distribution
    assert torch.allclose(fc.stationary(independent), p, atol=1e-5)
    chains = fc.predictor_levels(*fc.eval_set(4096, 32))
    g = torch.Generator().manual_seed(10**6 + 32)  # eval_set's generator: the same chains, their states independent
    iid = fc.predictor_levels(*fc.fresh_batch(4096, 32, g, iid=True))
    assert chains["loss_2gen"] < chains["loss_1gen"] and iid["loss_2gen"] > iid["loss_1gen"]
    gain = lambda levels: math.log(fc.C) - levels["loss_best_1gen"]  # noqa: E731
    assert 0.5 < gain(iid) / gain(chains) < 2


def test_readout_first_trains_on_independent_states_then_on_the_chains_and_counts_from_the_switch(monkeypatch):
    """readout_first: the first `pretrain` batches have independent states, the rest are the chains', the eval set is
    the chains' throughout; its times (the head, tau, the steps, the early rate) count from the switch, so a run
    pretrained S steps reads as the same run never pretrained."""
    seen, draw = [], st.fresh_batch
    monkeypatch.setattr(st, "fresh_batch", lambda B, N, g, balance=False, iid=False: seen.append(iid) or
                        draw(B, N, g, balance=balance, iid=iid))
    run = st.train_one(8, 0, 6, eval_batch=64, training={**ts.SETTINGS["readout_first"][0], "pretrain": 4,
                                                          "eval_every": 3})
    assert seen == [True] * 4 + [False] * 2
    assert run["levels"] == st.predictor_levels(*fc.eval_set(64, 8))
    plain = trajectory(32, 0, head=2025, slope=2e-5)
    plain["loss"] = [2.30 if s < 2025 else 2.10 for s in plain["t"]]  # and a drop with the head
    S = 1000  # the pretrained run: 1000 steps on the plateau first, then the same trajectory
    pretrained = {**plain, "pretrain": S, "t": list(range(0, S, 50)) + [s + S for s in plain["t"]],
                  "loss": [2.35] * (S // 50) + plain["loss"], "phi": [0.1] * (S // 50) + plain["phi"]}
    want, got = st.tau_2gen_drop(plain), st.tau_2gen_drop(pretrained)
    assert want["head"] == pytest.approx(2000, abs=50) and got == want
    assert st.early_rate(pretrained) == pytest.approx(2e-5, rel=1e-6) == st.early_rate(plain)


def test_readout_first_drive1_is_readout_first_with_drive1s_push_and_readout_first_itself_at_N0():
    """The two rungs together, nothing else: at N = N0 = 32 the drive's factor is 1 and the run is readout_first's; at
    N = 8 (factor 4) it is not."""
    rf, both = ts.SETTINGS["readout_first"][0], ts.SETTINGS["readout_first_drive1"][0]
    assert both == {**rf, **ts.SETTINGS["drive1"][0]} and ts.CAPS["readout_first_drive1"] == ts.CAPS["readout_first"]
    assert ts.SETTINGS["readout_first_frozenWU"][0] == {**rf, **ts.SETTINGS["frozenWU"][0]}
    short = {"pretrain": 2, "eval_every": 2}
    for N, same in ((32, True), (8, False)):
        runs = [st.train_one(N, 0, 4, eval_batch=64, training={**training, **short}) for training in (rf, both)]
        assert (runs[0]["loss"] == runs[1]["loss"]) == same


def test_every_rung_has_its_colour_and_its_description():
    """The figure draws each rung in its own colour and the legend says what it tests: a rung added without them
    would fail only when its runs are collected, hours later."""
    rungs = (set(ts.SETTINGS) - {"record"}) | set(ts.HYBRIDS) | {"baseline", "sa"}
    assert rungs <= set(ts.RUNG_COLORS) and len(set(ts.RUNG_COLORS.values())) == len(ts.RUNG_COLORS)
    assert (rungs - {"baseline"}) <= set(ts.DESCRIBE)


def test_the_record_setting_is_the_records_run_and_a_killed_run_resumes_to_the_same_numbers(tmp_path):
    """The "record" setting trains the record's run (at an N it does not hold); a run killed after an evaluation
    (here at t = 8, its checkpoint holding t = 0 and 4) goes on from its checkpoint to the trajectory of the run never
    stopped, number for number: the momentum, the batches' generator and the record come back with the weights."""
    torch.set_num_threads(1)
    every = {"eval_every": 4}
    base = st.train_one(8, 0, 16, eval_batch=64, training={**st.TRAINING, **every})
    assert st.train_one(8, 0, 16, eval_batch=64, training={**ts.SETTINGS["record"][0], **every}) == base
    ckpt = str(tmp_path / "run.ckpt")

    def kill(t, params):
        if t == 8:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        st.train_one(8, 0, 16, eval_batch=64, training={**st.TRAINING, **every}, measure=kill, checkpoint=ckpt)
    assert torch.load(ckpt, weights_only=False)["run"]["t"] == [0, 4]
    resumed = st.train_one(8, 0, 16, eval_batch=64, training={**st.TRAINING, **every}, checkpoint=ckpt)
    assert resumed["t"] == base["t"] == [0, 4, 8, 12, 16]
    assert resumed["loss"] == base["loss"] and resumed["phi"] == base["phi"]


def committed_figures(tmp_path, monkeypatch) -> tuple:
    """(figures, root) under tmp_path: the committed tau_settings.json and sa_scaling.json, and an empty run root; the
    intervals' bootstraps at 50 resamples (what collect's tests check is where each run goes)."""
    for module, name in ((ts, "offset_fit"), (ts, "rate_slope"), (ts, "fit_tau_censored"), (st, "fit_tau_censored")):
        monkeypatch.setattr(module, name, functools.partial(getattr(module, name), resamples=50))
    figures, root = tmp_path / "figures", tmp_path / "root"
    figures.mkdir()
    root.mkdir()
    for name in ("tau_settings.json", "sa_scaling.json"):
        shutil.copy(os.path.join(ROOT, "figures", name), figures / name)
    return figures, root


def test_collect_keeps_a_run_still_training_from_its_checkpoint(tmp_path, monkeypatch):
    """A "record" run killed (or still training) at N = 8 after its evaluations at t = 0 and 4: collect takes its
    checkpoint's record so far, marked training, into the runs and the record's row (no head yet: "none by 4"); a
    finished run of the same key, once written, replaces it; a hybrid's checkpoint is not a run."""
    figures, root = committed_figures(tmp_path, monkeypatch)
    torch.set_num_threads(1)

    def kill(t, params):
        if t == 8:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        st.train_one(8, 0, 16, eval_batch=64, training={**st.TRAINING, "eval_every": 4}, measure=kill,
                     checkpoint=str(root / "record_N8_s0.json.ckpt"))
    shutil.copy(root / "record_N8_s0.json.ckpt", root / "sa_softmax_N8_s0.json.ckpt")
    result = ts.collect(str(root), str(figures))
    run = result["runs"]["record"]["8"]["0"]
    assert run["training"] is True and run["t"] == [0, 4] and "8" not in result["hybrid_runs"]["sa_softmax"]
    assert result["record_full"]["heads"]["8"] == [None] and "8" in result["record_full"]["extended"]
    assert "N = 8: none by 4" in ts.table(result)[0]
    finished = st.train_one(8, 0, 16, eval_batch=64, training={**st.TRAINING, "eval_every": 4})
    (root / "record_N8_s0.json").write_text(json.dumps(finished))
    assert "training" not in ts.collect(str(root), str(figures))["runs"]["record"]["8"]["0"]


def test_the_record_at_an_N_it_does_not_hold_joins_its_fit_and_its_row():
    """record_full with the "record" setting's runs at N = 512: their heads beside the committed N, in the slope
    and the offset fit over N = 32-512, named in the table's first row."""
    with open(os.path.join(ROOT, "figures", "sa_scaling.json")) as fh:
        transformer = json.load(fh)["transformer_runs"]
    alone = ts.record_full(transformer)
    extension = {"512": {"0": trajectory(512, 0, 5025, 1e-5, cap=10000), "1": trajectory(512, 1, 6025, 1e-5, cap=10000)}}
    full = ts.record_full(transformer, extension)
    assert list(full["heads"]) == ["32", "64", "128", "256", "512"] and full["extended"] == ["512"]
    assert full["heads"]["512"] == [pytest.approx(5025, abs=30), pytest.approx(6025, abs=30)]
    assert full["fit_head"]["seeds"] == [8, 8, 8, 8, 2] and full["offset"]["N"][-1] == 512
    assert full["fit_head"]["slope"] > alone["fit_head"]["slope"] + 0.1  # heads at twice N = 256's steepen it
    row = ts.table({"record_full": full, "compare": {}})[0]
    assert "N = 32–512" in row and "N = 512: 5026, 6025" in row


def test_final_norm_is_a_layer_norm_between_the_residual_stream_and_the_unembedding_in_training_and_evaluation(
        monkeypatch):
    """last_position(final_norm=True) with an identity unembedding returns layer_norm of what the plain model's
    residual stream carries at the last position (so the norm sits after MLP2, before W_U alone), its logits have
    the norm |W_U h| <= ||W_U|| sqrt(D) whatever the other weights' scale, and bounded_readout's run evaluates and
    trains the normed model: its first evaluation is the normed model's loss on the eval set."""
    N, seed = 9, 2
    seqs = fc.fresh_batch(32, N, torch.Generator().manual_seed(4))[0]
    params = dict(st.model_for(N, seed).named_parameters())
    D = params["W_E.weight"].shape[1]
    identity = {**params, "W_U.weight": torch.eye(D)}
    with torch.no_grad():
        residual = st.last_position(identity, seqs)[0]
        assert torch.allclose(st.last_position(identity, seqs, final_norm=True)[0], layer_norm(residual), atol=1e-5)
        assert not torch.allclose(layer_norm(residual), residual, atol=0.1)
        big = {**params, **{name: 30 * w for name, w in params.items() if name in ("W_E.weight", "att2.W_V.weight")}}
        W_U = params["W_U.weight"]
        bound = torch.linalg.matrix_norm(W_U, 2) * math.sqrt(D)
        assert st.last_position(big, seqs)[0].norm(dim=-1).max() > bound  # the plain readout grows with them
        assert st.last_position(big, seqs, final_norm=True)[0].norm(dim=-1).max() <= bound * (1 + 1e-5)
    norms, forward = [], st.last_position
    monkeypatch.setattr(st, "last_position", lambda *a, final_norm=False, **k: norms.append(final_norm) or
                        forward(*a, final_norm=final_norm, **k))
    run = st.train_one(N, seed, 4, eval_batch=64, training={**ts.SETTINGS["bounded_readout"][0], "eval_every": 4})
    assert norms == [True] * 6  # evaluation, four steps, evaluation
    context, target = fc.eval_set(64, N)
    with torch.no_grad():
        normed = F.cross_entropy(st.last_position(params, context, final_norm=True)[0], target).item()
    assert run["loss"][0] == pytest.approx(normed, rel=1e-6)
    assert run["loss"][0] != pytest.approx(F.cross_entropy(st.last_position(params, context)[0], target).item())


def test_a_frozen_parameter_stays_where_training_moves_it_and_a_diverged_run_stops(monkeypatch):
    models = []
    make = st.model_for
    monkeypatch.setattr(st, "model_for", lambda N, seed, init=None: models.append(make(N, seed, init)) or models[-1])
    for training in (st.TRAINING, ts.SETTINGS["frozenP2"][0], ts.SETTINGS["frozenWU"][0]):
        st.train_one(8, 0, 12, eval_batch=64, training={**training, "eval_every": 4})
    moved, held = (m.att2.P.detach() for m in models[:2])
    assert not torch.equal(moved, torch.zeros_like(moved)) and torch.equal(held, torch.zeros_like(held))
    start = make(8, 0).W_U.weight.detach()  # frozenWU: the unembedding at the seed's draw (not zero), the record's moves
    assert torch.count_nonzero(start) == start.numel() and torch.equal(models[2].W_U.weight.detach(), start)
    assert not torch.equal(models[0].W_U.weight.detach(), start) and not torch.equal(models[2].att2.P, held)
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


def test_the_drive_scales_layer_1s_position_bias_step_by_N0_over_N_and_nothing_else(monkeypatch):
    """drive1: one step from the seed's model moves layer 1's position bias by 32 / N x the record's first step
    (4x at N = 8: a drive divided by N, not multiplied) and every other parameter exactly as the record's step."""
    assert ts.SETTINGS["drive1"][0]["drive"] == {"att1.P": 32}
    models = []
    make = st.model_for
    monkeypatch.setattr(st, "model_for", lambda N, seed, init=None: models.append(make(N, seed, init)) or models[-1])
    for training in (st.TRAINING, ts.SETTINGS["drive1"][0]):
        st.train_one(8, 0, 1, eval_batch=64, training={**training, "eval_every": 4})
    start = dict(make(8, 0).named_parameters())
    base, driven = (dict(m.named_parameters()) for m in models)
    for name, p in start.items():
        step, driven_step = base[name] - p, driven[name] - p
        factor = 32 / 8 if name == "att1.P" else 1.0
        assert torch.allclose(driven_step, factor * step, atol=1e-7), name
    assert (base["att1.P"] != start["att1.P"]).any()
    params = {"att1.P": torch.zeros(1, 8), "att2.P": torch.zeros(1, 8)}
    factors = st.gradient_factors(params, {"drive": {"att1.P": 32}, "trainable": {"att1.P": [0, 1]}}, 128)
    assert factors["att1.P"].tolist() == [[0.25, 0.25, 0, 0, 0, 0, 0, 0]] and "att2.P" not in factors


def test_the_key_drive_rung_moves_the_position_bias_alone_and_through_the_keys(monkeypatch):
    """drive1_keys: one step from the seed's model differs from the record's first step in layer 1's position bias
    alone, by (32 / N - 1) x lr x its gradient through layer 2's keys (N = 8: 3 x); evaluations read the plain model."""
    assert ts.SETTINGS["drive1_keys"][0]["key_drive"] == 32
    models, drives = [], []
    make, forward = st.model_for, st.last_position
    monkeypatch.setattr(st, "model_for", lambda N, seed, init=None: models.append(make(N, seed, init)) or models[-1])
    monkeypatch.setattr(st, "last_position", lambda params, seqs, path=None, key_drive=1.0, final_norm=False:
                        drives.append(key_drive) or forward(params, seqs, path, key_drive, final_norm))
    for training in (st.TRAINING, ts.SETTINGS["drive1_keys"][0]):
        st.train_one(8, 0, 1, eval_batch=64, training={**training, "eval_every": 4})
    assert drives == [1.0, 1.0, 1.0, 1.0, 4.0, 1.0]  # per run: evaluation, step, evaluation
    start = dict(make(8, 0).named_parameters())
    base, driven = (dict(m.named_parameters()) for m in models)
    context, target = fc.fresh_batch(st.TRAINING["batch"], 8, torch.Generator().manual_seed(0))  # the step's batch
    key = torch.autograd.grad(F.cross_entropy(forward(start, context, "key")[0], target), start["att1.P"])[0]
    for name, p in start.items():
        extra = -st.TRAINING["lr"] * 3 * key if name == "att1.P" else 0
        torch.testing.assert_close(driven[name] - p, base[name] - p + extra, rtol=1e-4, atol=1e-7, msg=name)
    assert float(key.abs().max()) > 1e-4


# ----------------------------------------------------------------------------- the hybrids


def test_the_softmax_hybrid_reads_the_parents_experts_through_its_map():
    """readout="softmax": uniform at W_R = 0; with W_R selecting one expert (expert-major columns, as e.flatten(1)
    lays them out) at scale s, softmax(s x that expert) of the parent's experts; the mixture readout is the parent."""
    N = 12
    seqs = fc.fresh_batch(64, N, torch.Generator().manual_seed(3))[0]
    hybrid = sa_hybrids.SoftmaxReadout(N, "softmax")
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, p in hybrid.named_parameters():
            p.copy_(0.0 if name == "W_R" else 0.5 * torch.randn(p.shape, generator=g))
    assert torch.allclose(hybrid(seqs), torch.full((64, fc.C), 1 / fc.C))
    parent = tv.SATransformer(N)
    parent.load_state_dict({k: v for k, v in hybrid.state_dict().items() if k != "W_R"})
    e = tv.layers(seqs, *parent.attention_parameters())
    experts = torch.stack([e[0][:, -1], e[1][:, -1], (e[2].unsqueeze(1) @ e[0]).squeeze(1),
                           (e[2].unsqueeze(1) @ e[1]).squeeze(1)], 1)  # (B, 4, C), from the layers alone
    with torch.no_grad():
        hybrid.W_R.zero_()
        hybrid.W_R[:, 2 * fc.C:3 * fc.C] = 5.0 * torch.eye(fc.C)  # the third expert, sum_i A2_iN x_i
    assert torch.allclose(hybrid(seqs), torch.softmax(5.0 * experts[:, 2], -1), atol=1e-6)
    assert torch.allclose(parent(seqs), torch.einsum("e,bec->bc", parent.weights(), experts), atol=1e-6)
    assert not torch.allclose(hybrid(seqs), parent(seqs), atol=1e-3)
    with pytest.raises(ValueError, match="readout"):
        sa_hybrids.SoftmaxReadout(N, "mlp")


def test_the_scalar_softmax_hybrid_is_the_softmax_hybrid_with_a_map_that_keeps_states_apart():
    """readout="softmax_scalar": uniform at a = 0; with asymmetric scalars a_k, the "softmax" hybrid whose W_R is
    [a_1 I, a_2 I, a_3 I, a_4 I] (each expert's state c to the output's state c only), on the same layers."""
    N = 12
    seqs = fc.fresh_batch(64, N, torch.Generator().manual_seed(3))[0]
    split = sa_hybrids.SoftmaxReadout(N, "softmax_scalar")
    g = torch.Generator().manual_seed(8)
    with torch.no_grad():
        for name, p in split.named_parameters():
            p.copy_(0.0 if name == "a" else 0.5 * torch.randn(p.shape, generator=g))
    assert torch.allclose(split(seqs), torch.full((64, fc.C), 1 / fc.C))
    full = sa_hybrids.SoftmaxReadout(N, "softmax")
    full.load_state_dict({k: v for k, v in split.state_dict().items() if k != "a"}, strict=False)
    a = torch.tensor([0.7, -1.3, 4.0, 2.2])  # unequal: a swapped or shared scalar reads differently
    with torch.no_grad():
        split.a.copy_(a)
        full.W_R.copy_(torch.cat([a_k * torch.eye(fc.C) for a_k in a], 1))
    assert torch.allclose(split(seqs), full(seqs), atol=1e-6)
    assert not torch.allclose(split(seqs), torch.full((64, fc.C), 1 / fc.C), atol=1e-3)
    assert {name for name, _ in split.named_parameters()} >= {"a", "M1", "P1", "M2", "P2"}
    assert "W_R" not in dict(split.named_parameters())


def test_the_matched_softmax_starts_as_the_mixture_to_first_order():
    """readout="softmax_matched" at its start (a = C / 4) against the mixture at its start (w = 1/4), on experts
    eps away from uniform: the gap shrinks as eps^2 (a quarter per halving), where a = 0 (softmax_scalar's start)
    or a = C / 2 leaves a gap of order eps."""
    g = torch.Generator().manual_seed(5)
    noise = torch.randn(256, 4, fc.C, generator=g)
    noise = noise - noise.mean(-1, keepdim=True)  # departures that keep each expert a distribution
    matched = sa_hybrids.SoftmaxReadout(8, "softmax_matched")
    assert torch.equal(matched.a.detach(), torch.full((4,), fc.C / 4))

    def gap(eps: float, a: torch.Tensor) -> float:
        e = 1 / fc.C + eps * noise
        soft = torch.softmax(torch.einsum("k,bkc->bc", a, e), -1)
        return float((soft - e.mean(1)).abs().max())  # the mixture at w = 1/4: the experts' mean

    a = matched.a.detach()
    assert 3.6 < gap(0.01, a) / gap(0.005, a) < 4.4
    for wrong in (torch.zeros(4), torch.full((4,), fc.C / 2)):
        assert 1.6 < gap(0.01, wrong) / gap(0.005, wrong) < 2.4


def test_the_attention_hybrid_is_the_transformers_attention_under_the_mixture():
    """TransformerAttention at the seed's draw, with asymmetric position biases: its h is the transformer's layer-1
    attention (computed directly, over all positions) on the one-hot states and its A2 the transformer's layer-2
    attention at the last position (last_position); under SATransformer the mixture of those four paths."""
    N, seed = 12, 5
    seqs = fc.fresh_batch(64, N, torch.Generator().manual_seed(3))[0]
    attention = sa_hybrids.TransformerAttention(N, seed)
    model = st.model_for(N, seed)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for P, into in ((attention.P1, model.att1.P), (attention.P2, model.att2.P)):
            P.copy_(torch.randn(N, generator=g))
            into[0, :N] = P
    params = dict(model.named_parameters())
    x = layer_norm(F.embedding(seqs, params["W_E.weight"]))
    q, k = (F.linear(x, params[f"att1.{W}.weight"]) for W in ("W_Q", "W_K"))
    A1 = torch.softmax(attention_scores(q[:, None], k[:, None], params["att1.P"][:, :N]), -1)[:, 0]
    X, h, A2 = attention(seqs)
    assert torch.allclose(h, A1 @ F.one_hot(seqs, fc.C).float(), atol=1e-6)
    assert torch.allclose(A2, st.last_position(params, seqs)[1], atol=1e-6)
    hybrid = sat.SATransformer(N, attention=attention)
    with torch.no_grad():
        hybrid.logits.copy_(torch.tensor([0.3, -0.7, 1.1]))
    paths = torch.stack([X[:, -1], h[:, -1], (A2.unsqueeze(1) @ X).squeeze(1), (A2.unsqueeze(1) @ h).squeeze(1)], 1)
    assert torch.allclose(hybrid(seqs), torch.einsum("e,bec->bc", hybrid.weights(), paths), atol=1e-6)
    assert {name for name, _ in hybrid.named_parameters()} == {"logits", *(f"attention.{n}" for n in (
        "W_E", "W_Q1", "W_K1", "W_V1", "W_Q2", "W_K2", "P1", "P2"))}
    assert hybrid.beta_delta()[1] == pytest.approx(attention.P1[1].item())


def test_each_rung_of_the_sa_side_builds_its_hybrid():
    """hybrid() from a rung's HYBRIDS entry: the readouts over the SA-transformer's own layers from zero, the attention
    hybrid at the transformer's draw for its seed (another seed, another draw); a softmax on the transformer's
    attention is no rung and is refused."""
    built = {name: sa_hybrids.hybrid(8, 3, **changes) for name, (changes, _) in ts.HYBRIDS.items()}
    assert built["sa_softmax"].W_R is not None and built["sa_softmax_scalar"].a.tolist() == [0.0] * 4
    assert built["sa_softmax_matched"].a.tolist() == [fc.C / 4] * 4
    assert all(torch.equal(m.M1, torch.zeros(fc.C, fc.C)) for name, m in built.items() if m.attention is None)
    drawn = built["sa_attention"].attention.W_E
    assert torch.equal(drawn, st.model_for(8, 3).W_E.weight) and not torch.equal(drawn, st.model_for(8, 4).W_E.weight)
    matched = built["sa_attention_matched"]
    assert torch.equal(matched.attention.W_E, drawn) and matched.a.tolist() == [fc.C / 4] * 4
    seqs = fc.fresh_batch(16, 8, torch.Generator().manual_seed(2))[0]
    e = sat.expert_paths(*matched.layer_outputs(seqs))
    assert torch.allclose(matched(seqs), torch.softmax(fc.C / 4 * e.sum(1), -1))  # the softmax on the new layers
    small = built["sa_attention_matched_small"].attention
    for name in ("W_Q1", "W_K1", "W_Q2", "W_K2", "W_V1", "W_E"):
        factor = 1.0 if name in ("W_V1", "W_E") else 0.05
        assert torch.allclose(getattr(small, name), factor * getattr(built["sa_attention"].attention, name)), name
    with pytest.raises(ValueError, match="attention"):
        sa_hybrids.hybrid(8, 3, attention="mlp")


def test_the_converse_drive_scales_the_sa_transformers_P1_step_by_N_over_N0_and_nothing_else():
    """sa_drive_flat: one SGD step (lr 1, the SA's) from zero moves P1 by N / 32 x the SA-transformer's own first step
    (4x at N = 128: a drive that grows with N, not falls) and every other parameter exactly as the parent's."""
    assert ts.HYBRIDS["sa_drive_flat"][0] == {"drive": 32}
    N = 128
    seqs, target = fc.fresh_batch(64, N, torch.Generator().manual_seed(5))
    models = [sat.SATransformer(N), sa_hybrids.hybrid(N, 0, **ts.HYBRIDS["sa_drive_flat"][0])]
    for model in models:
        opt = torch.optim.SGD(model.parameters(), lr=1.0)
        sat.target_loss(model(seqs), target)[0].mean().backward()
        opt.step()
    base, driven = (dict(m.named_parameters()) for m in models)
    assert base["P1"].abs().max() > 0
    for name, p in base.items():
        factor = N / 32 if name == "P1" else 1.0
        assert torch.allclose(driven[name], factor * p, atol=1e-7), name  # from zero: the step is the parameter


def test_the_attention_hybrid_trains_at_the_transformers_sgd_and_stays_finite(monkeypatch, tmp_path):
    """sa_attention's run: the transformer's lr, momentum and batch (recorded in the run), and its masked loss finite
    where the SA-transformer's lr 1 sends the factorised weights to NaN within a few dozen steps (N = 64, seed 0)."""
    torch.set_num_threads(1)
    monkeypatch.setitem(ts.SCREEN, "eval_batch", 256)
    monkeypatch.setitem(ts.SCREEN, "eval_every", 20)
    monkeypatch.setattr(ts, "HYBRID_CAP", 60)
    run = ts.hybrid_run((str(tmp_path), "sa_attention", 64, 0))
    assert (run["lr"], run["momentum"], run["batch"], run["attention"]) == (0.05, 0.9, 128, "transformer")
    assert ts.HYBRID_RUN["sa_attention_matched"] == ts.HYBRID_RUN["sa_attention"]
    assert all(math.isfinite(y) for y in run["masked_loss"]) and len(run["t"]) == 4


def test_the_unigram_free_control_trains_the_sa_transformer_on_balanced_chains(monkeypatch, tmp_path):
    """sa_unigram_free: the SA-transformer itself (from zero: phi at its start as the parent's), its batches, eval set
    and levels drawn balanced, and the run records it."""
    torch.set_num_threads(1)
    monkeypatch.setitem(ts.SCREEN, "eval_batch", 256)
    monkeypatch.setitem(ts.SCREEN, "eval_every", 20)
    monkeypatch.setattr(ts, "HYBRID_CAP", 40)
    seen, draw = [], sat.fresh_batch
    monkeypatch.setattr(sat, "fresh_batch", lambda B, N, g, ablate=False, balance=False: seen.append(balance) or
                        draw(B, N, g, ablate, balance))
    run = ts.hybrid_run((str(tmp_path), "sa_unigram_free", 16, 0))
    assert run["balance"] is True and seen == [True] * 40
    assert run["levels"] == fc.predictor_levels(*fc.eval_set(256, 16, balance=True))
    with torch.no_grad():
        start = tv.sa_coordinates(tv.SATransformer(16), fc.eval_set(256, 16, balance=True)[0])["phi_beta2"]
    assert run["phi"][0] == pytest.approx(float(start), abs=1e-4)


def test_a_hybrid_run_records_its_tau_and_phi_and_the_ladder_fits_it_beside_the_records_sa(monkeypatch, tmp_path):
    """A hybrid run is train_sa's with the hybrid's readout (its tau, the masked loss's halfway crossing, and phi on
    the run's evaluation set), written whole; hybrid_summary fits its taus and the record's SA taus alike."""
    torch.set_num_threads(1)
    monkeypatch.setitem(ts.SCREEN, "eval_batch", 256)
    monkeypatch.setitem(ts.SCREEN, "eval_every", 20)
    monkeypatch.setattr(ts, "HYBRID_CAP", 60)
    run = ts.hybrid_run((str(tmp_path), "sa_softmax", 16, 0))
    assert run["t"] == list(range(0, 61, 20)) and run["readout"] == "softmax" and len(run["phi"]) == len(run["t"])
    with torch.no_grad():
        start = tv.sa_coordinates(tv.SATransformer(16), fc.fresh_batch(
            256, 16, torch.Generator().manual_seed(10**6 + 16))[0])["phi_beta2"]
    assert run["phi"][0] == pytest.approx(float(start), abs=1e-4)
    assert run["masked_loss"][0] == pytest.approx(math.log(fc.C), abs=1e-4)  # W_R at zero: uniform
    with open(tmp_path / "sa_softmax_N16_s0.json") as fh:
        assert json.load(fh) == run
    hybrid = {"sa_softmax": {str(N): {"0": {"tau": 100.0 * N / math.log(N)}, "1": {"tau": None}}
                             for N in (32, 64, 128)}}
    record = {str(N): [10.0 * N, 11.0 * N] for N in (32, 64, 128)}
    out = ts.hybrid_summary(hybrid, record)
    assert out["sa"]["vs_N"]["slope"] == pytest.approx(1.0) and sorted(out) == ["sa", "sa_softmax"]
    assert out["sa_softmax"]["N"]["64"]["median"] > 100.0 * 64 / math.log(64)  # the censored seed counts as longer


def test_the_drive_rung_gets_the_first_order_dynamics_prediction_set_by_the_parents_median_at_N0():
    """hybrid_summary with I: sa_drive_flat's predicted tau equals the parent's median tau at N0 = 32 (the median,
    1150, not the mean of the asymmetric 1100, 1150, 1300), and at N = 64 and 128 sa_transformer.escape_time with
    delta's drive x N / 32 and the same beta_star; without I, no prediction."""
    I = 0.073
    hybrid = {"sa_drive_flat": {str(N): {"0": {"tau": 10.0 * N}, "1": {"tau": 11.0 * N}} for N in (32, 64, 128)}}
    record = {"32": [1100.0, 1150.0, 1300.0], "64": [1700.0, 1800.0], "128": [2700.0, 2800.0]}
    predicted = ts.hybrid_summary(hybrid, record, I)["sa_drive_flat"]["predicted"]
    beta_star = sat.escape_threshold(32, I, 1150.0)
    assert predicted["beta_star"] == pytest.approx(beta_star) and predicted["tau"]["32"] == pytest.approx(1150.0)
    for N, drive in (("64", 2.0), ("128", 4.0)):
        assert predicted["tau"][N] == pytest.approx(sat.escape_time(int(N), I, beta_star, drive))
        assert predicted["parent"][N] == pytest.approx(sat.escape_time(int(N), I, beta_star))
    assert 0 < predicted["ratio"]["128"] < predicted["ratio"]["64"] < 1
    assert "predicted" not in ts.hybrid_summary(hybrid, record)["sa_drive_flat"]


def test_the_early_rates_slope_and_its_interval_resample_the_seeds_within_each_N():
    """Rates (H_N / N)^2 times a seed factor: slope 2 through the medians; the interval from resampling the seeds is
    the spread the seed factors allow (here they move N = 128's median only, so the interval's ends are the slopes
    with 128's extreme seeds alone); one N: no slope."""
    theory = {N: ts.harmonic(N) / N for N in (32, 64, 128)}
    rates = {32: [theory[32] ** 2] * 2, 64: [theory[64] ** 2] * 2,
             128: [0.5 * theory[128] ** 2, theory[128] ** 2, 4 * theory[128] ** 2]}
    slope, ci = sa_fits.rate_slope(rates, theory)
    x = np.log([theory[N] for N in (32, 64, 128)])

    def with_128(factor):
        return np.polyfit(x, np.log([theory[32] ** 2, theory[64] ** 2, factor * theory[128] ** 2]), 1)[0]

    assert slope == pytest.approx(with_128(1.0))  # the median of 0.5, 1 and 4 (not their mean 1.83)
    assert ci == pytest.approx([with_128(4.0), with_128(0.5)])  # each a resample's median with probability 7/27
    assert sa_fits.rate_slope({32: [1e-5, 2e-5]}, theory) == (None, None)


def test_collect_adds_the_runs_under_root_to_the_committed_ones(tmp_path, monkeypatch):
    """The committed JSON's runs stay; a setting's run under root replaces the stored one of its (N, seed) and is
    compared with the record's run of that (N, seed); a hybrid's runs (any N) join hybrid_runs and its fit. (The
    intervals' bootstraps at 50 resamples, not 2000: what is tested here is where each run goes.)"""
    line = sa_fits.line_through_medians
    monkeypatch.setattr(sa_fits, "line_through_medians",
                        lambda Ks, values, level=0.95, resamples=2000, seed=0: line(Ks, values, level, 50, seed))
    figures, root = committed_figures(tmp_path, monkeypatch)
    with open(figures / "tau_settings.json") as fh:
        committed = json.load(fh)
    run = {**committed["runs"]["frozenP2"]["64"]["1"], "note": "a window1 run"}
    (root / "window1_N64_s1.json").write_text(json.dumps(run))
    hybrid = {"N": 16, "seed": 0, "t": [0, 50], "masked_loss": [2.3, 2.2], "phi": [0.1, 0.2], "tau": 4000.0}
    (root / "sa_softmax_N16_s0.json").write_text(json.dumps(hybrid))
    (root / "sa_softmax_N16_s1.json").write_text(json.dumps({**hybrid, "seed": 1, "tau": 5000.0}))
    (root / "notes.txt").write_text("not a run")
    result = ts.collect(str(root), str(figures))
    expected = json.loads(json.dumps(committed["runs"]))
    expected.setdefault("window1", {}).setdefault("64", {})["1"] = run
    assert result["runs"] == expected
    ratio = result["compare"]["window1"]["head_vs_baseline"]["64"]["1"]
    assert ratio == pytest.approx(committed["compare"]["frozenP2"]["head_vs_baseline"]["64"]["1"])
    assert list(result["hybrid_runs"]["sa_softmax"])[0] == "16"  # in numerical order, before the committed N
    assert result["hybrids"]["sa_softmax"]["N"]["16"]["median"] == 4500.0
    assert "16" not in result["hybrids"]["sa"]["N"]  # the record's SA-transformer has no N = 16
    with open(figures / "tau_settings.json") as fh:
        assert json.load(fh) == json.loads(json.dumps(result))
    assert (figures / "tau_settings.png").exists()


def test_the_offset_fit_finds_the_law_under_an_offset_that_flattens_the_log_log_slope():
    """Medians exactly T0 + c N / log N with T0 = 3000, c = 80 (seeds spread around them, asymmetric): offset_fit
    gives back T0 and c, and the law's share of tau at the largest N, where the log-log slope reads ~0.3 (flat by the
    ladder's rule); with no law (c = 0) c's interval holds 0; fewer than 3 N: no fit."""
    def law(N):
        return 3000 + 80 * N / math.log(N)
    spread = [-40.0, 0.0, 10.0, 25.0, 300.0]  # median 10 above the law at every N: T0 + 10, c exact
    values = {str(N): [law(N) + d for d in spread] for N in (32, 64, 128)}
    fit = sa_fits.offset_fit(values)
    assert fit["T0"] == pytest.approx(3010, abs=1e-6) and fit["c"] == pytest.approx(80, abs=1e-9)
    x = 128 / math.log(128)
    assert fit["share"] == pytest.approx(80 * x / (3010 + 80 * x))
    assert fit["c_ci"][0] <= 80 <= fit["c_ci"][1] and fit["c_ci"][0] > 0 and fit["seeds"] == [5, 5, 5]
    medians = [law(N) + 10 for N in (32, 64, 128)]
    slope = np.polyfit(np.log([N / math.log(N) for N in (32, 64, 128)]), np.log(medians), 1)[0]
    assert slope < 0.35  # the ladder's slope calls this flat
    flat = sa_fits.offset_fit({str(N): [2500 + d for d in spread] + [None] for N in (32, 64, 128)})
    assert flat["c"] == pytest.approx(0, abs=1e-9) and flat["c_ci"][0] <= 0 <= flat["c_ci"][1]
    assert sa_fits.offset_fit({"32": [1.0], "64": [2.0], "128": [None]}) is None
