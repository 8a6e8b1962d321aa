"""tau_velocities.py: the theory's coordinates measured. A velocity is the coordinate's change along -grad L (a
central difference), each coordinate is what it says (loops, the models' own attention), the measure hooks leave the
runs as they were, and the slopes against N come out of hand-made velocities as they were made."""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import tau_velocities as tv
from analysis import fresh_chains as fc
from analysis import transformer_paths as tp
from analysis import transformer_tau as st


def random_transformer(N, seed):
    model = st.model_for(N, seed)
    with torch.no_grad():  # position biases off zero, so that every path of the coordinates is exercised
        for P in (model.att1.P, model.att2.P):
            P.normal_(0.0, 0.5, generator=torch.Generator().manual_seed(seed))
    return model, dict(model.named_parameters())


def random_sa(N, seed, dtype=torch.float32):
    model = tv.SATransformer(N).to(dtype)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(0.5 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model, dict(model.named_parameters())


def test_a_velocity_is_the_coordinates_change_along_minus_the_mean_gradient():
    """dq/dt = -<grad q, grad L> against a central difference of q along -grad L (L the mean over both batches), for
    every coordinate of both models; the velocity of the loss itself is -|grad L|^2 < 0."""
    batches = [fc.fresh_batch(16, 10, torch.Generator().manual_seed(s)) for s in (1, 2)]
    context = batches[0][0]
    cases = []
    model, params = random_transformer(10, 0)
    cases.append((params, lambda c, y, p=params: F.cross_entropy(st.last_position(p, c)[0], y),
                  lambda p=params, m=model: tv.transformer_coordinates(m, p, context)))
    sa, sa_params = random_sa(10, 1)
    cases.append((sa_params, lambda c, y, m=sa: tv.target_loss(m(c), y)[0].mean(),
                  lambda m=sa: tv.sa_coordinates(m, context)))
    for params, loss, coordinates in cases:
        out = tp.velocities(loss, coordinates(), params, batches)
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
        self_rate = tp.velocities(loss, {"loss": sum(loss(c, y) for c, y in batches) / 2}, params, batches)["loss"]
        assert self_rate["velocity"] == pytest.approx(-norm ** 2, rel=1e-5)


def test_the_coordinates_are_what_they_say():
    """The transformer's: beta against a loop over query and key states, delta the lag-1 entry of layer 1's bias,
    phi_beta(2) the induction readout of last_position's attention, phi_delta(1) the full model's layer-1 attention of
    the last position on the one before. The SA-transformer's: M2's h.x diagonal, P1[1], and its layer-2 attention."""
    model, params = random_transformer(9, 4)
    context = fc.fresh_batch(32, 9, torch.Generator().manual_seed(5))[0]
    got = {k: float(v.detach()) for k, v in tv.transformer_coordinates(model, params, context).items()}
    model.requires_grad_(False)  # the checks below read the parameters as numbers
    E = tv.layer_norm(params["W_E.weight"])
    D = E.shape[1]
    with torch.no_grad():
        score = [[float(params["att2.W_Q.weight"] @ E[a] @ (params["att2.W_K.weight"]
                        @ tv.layer_norm(params["att1.W_V.weight"] @ E[b]))) / math.sqrt(D) for b in range(fc.C)]
                 for a in range(fc.C)]
    diag = np.mean([score[a][a] for a in range(fc.C)])
    off = np.mean([score[a][b] for a in range(fc.C) for b in range(fc.C) if a != b])
    assert got["beta"] == pytest.approx(diag - off, rel=1e-5)
    assert got["delta"] == float(params["att1.P"][0, 1]) != float(params["att1.P"][0, 0])
    A2 = st.last_position(params, context)[1]
    assert got["phi_beta2"] == pytest.approx(float(st.phi_beta_last(A2, context)), rel=1e-6)
    A1 = model(context, cache=True)[1]["A1"]
    assert got["phi_delta1"] == pytest.approx(float(A1[:, -1, -2].mean()), rel=1e-6)
    assert got["phi_delta1"] != pytest.approx(float(A1[:, -1, -1].mean()), rel=1e-3)  # not the diagonal
    sa, sa_params = random_sa(9, 6)
    out = {k: float(v.detach()) for k, v in tv.sa_coordinates(sa, context).items()}
    sa.requires_grad_(False)
    assert out["beta"] == pytest.approx(float(np.mean([float(sa.M2[fc.C + i, i]) for i in range(fc.C)])), rel=1e-6)
    assert out["delta"] == float(sa.P1[1])
    A2 = tv.layers(context, *sa.attention_parameters())[2]
    match = np.array([[float(s[i - 1] == s[-1]) for i in range(1, 9)] for s in context.tolist()])
    assert out["phi_beta2"] == pytest.approx(float((A2[:, 1:].detach().numpy() * match).sum(1).mean()), rel=1e-6)


def test_the_measure_hooks_read_the_run_without_changing_it():
    """A measured run (velocities at t = 0 and 4) is the unmeasured run, step for step, in both models."""
    torch.set_num_threads(1)
    batches = [fc.fresh_batch(8, 8, torch.Generator().manual_seed(9))]
    template, seen = st.model_for(8, 0), []

    def hook(t, params):
        if t in (0, 4):
            loss = lambda c, y: F.cross_entropy(st.last_position(params, c)[0], y)  # noqa: E731
            seen.append(tp.velocities(loss, tv.transformer_coordinates(template, params, batches[0][0]), params, batches))

    training = {**st.TRAINING, "eval_every": 2}
    assert st.train_one(8, 0, 8, 64, training, measure=hook) == st.train_one(8, 0, 8, 64, training) and len(seen) == 2
    run = tv.Run(N=8, iters=8, eval_every=2, eval_batch=64)

    def sa_hook(t, model):
        loss = lambda c, y: tv.target_loss(model(c), y)[0].mean()  # noqa: E731
        seen.append(tp.velocities(loss, tv.sa_coordinates(model, batches[0][0]), dict(model.named_parameters()), batches))

    assert tv.train_sa(run, sa_hook)["beta"] == tv.train_sa(run)["beta"] and len(seen) == 7


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
                     lambda N, s=s: (1 + 0.01 * s) * (tv.harmonic(N) / N) ** 2) for N in Ns for s in (0, 1, 2)]
    runs += [measured("sa", N, 3, lambda N, i: 100.0, lambda N: 1.0) for N in Ns]  # an outlier seed: the median
    # ignores it (three seeds and it: the median is the mean of the two middle seeds, the same factor at every N)
    out = tv.measure_summary(runs, {})["sa"]
    assert [row["slope"] for row in out["beta"]] == pytest.approx([-1.0, -1.5, -2.0], abs=1e-3)
    assert out["delta"][0]["theory"] == -1.0
    assert out["beta"][0]["theory"] == pytest.approx(np.polyfit(np.log(Ns), np.log([tv.harmonic(N) / N for N in Ns]),
                                                                1)[0])
    assert out["early_phi"]["slope_vs_HN_over_N"] == pytest.approx(2.0, abs=0.02)
    assert "record_match" not in out


def test_the_paths_of_layer_1s_output_split_its_gradient_exactly():
    """last_position(path=...): the same logits, and gradients into layer 1 through that use of x1 alone; the four
    paths' gradients on every layer-1 parameter sum to the full gradient (to float32's rounding), each path's is
    nonzero on a random model (a detach that bites), and a layer-2 parameter's gradient is the full one on every path."""
    model, params = random_transformer(12, 3)
    context, target = fc.fresh_batch(32, 12, torch.Generator().manual_seed(4))
    full_logits = st.last_position(params, context)[0]
    layer1 = ["att1.P", "att1.W_Q.weight", "att1.W_K.weight", "att1.W_V.weight", "W_E.weight"]
    full = torch.autograd.grad(F.cross_entropy(full_logits, target), [params[n] for n in layer1 + ["att2.W_K.weight"]])
    parts = []
    for path in st.PATHS:
        logits = st.last_position(params, context, path)[0]
        assert torch.equal(logits, full_logits)
        grads = torch.autograd.grad(F.cross_entropy(logits, target), [params[n] for n in layer1 + ["att2.W_K.weight"]],
                                    allow_unused=True)
        assert all(float(g.abs().max()) > 1e-4 for g in grads[:4]), path  # P, W_Q, W_K, W_V of layer 1
        torch.testing.assert_close(grads[-1], full[-1], rtol=1e-5, atol=1e-8)  # layer 2's: every path's is the full one
        parts.append(grads[:-1])
    for name, total, *each in zip(layer1, full, *parts):
        torch.testing.assert_close(sum(each), total, rtol=1e-4, atol=1e-7, msg=name)


def test_the_key_drive_scales_the_position_biass_key_path_alone():
    """last_position(key_drive=s): the same logits and attention; layer 1's position bias gets its gradient with the
    part through layer 2's keys times s (full - (1 - s) x the key path's, path="key"), every other parameter its full
    gradient; on a random model the key path bites (the bias's gradient moves)."""
    model, params = random_transformer(12, 3)
    context, target = fc.fresh_batch(32, 12, torch.Generator().manual_seed(5))
    names = ["att1.P", "att1.W_Q.weight", "att1.W_K.weight", "att1.W_V.weight", "W_E.weight", "att2.W_K.weight",
             "W_U.weight"]

    def grads(**kw):
        logits, A2 = st.last_position(params, context, **kw)
        return logits, A2, torch.autograd.grad(F.cross_entropy(logits, target), [params[n] for n in names],
                                               allow_unused=True)

    logits, A2, full = grads()
    key = grads(path="key")[2][0]
    driven_logits, driven_A2, driven = grads(key_drive=0.25)
    assert torch.equal(driven_logits, logits) and torch.equal(driven_A2, A2)
    torch.testing.assert_close(driven[0], full[0] - 0.75 * key, rtol=1e-4, atol=1e-7)
    assert float((driven[0] - full[0]).abs().max()) > 1e-4  # the key path carries part of the bias's gradient
    for name, g, f in zip(names[1:], driven[1:], full[1:]):
        torch.testing.assert_close(g, f, rtol=1e-5, atol=1e-6, msg=name)  # to float32 rounding (sums reordered)


def test_delta_paths_sum_to_deltas_velocity():
    """delta_paths' four velocities sum to delta's from `velocities` on the same batches (whose sign says it is
    -dL/dP1[1]), path by path the mean over the batches of -dL/dP1[1] through that use."""
    model, params = random_transformer(10, 5)
    batches = [fc.fresh_batch(16, 10, torch.Generator().manual_seed(s)) for s in (6, 7)]
    loss = lambda c, y: F.cross_entropy(st.last_position(params, c)[0], y)  # noqa: E731
    delta = tp.velocities(loss, {"delta": params["att1.P"][0, 1]}, params, batches)["delta"]["velocity"]
    paths = tp.delta_paths(params, batches)
    assert set(paths) == set(st.PATHS)
    assert sum(p["velocity"] for p in paths.values()) == pytest.approx(delta, rel=1e-4, abs=1e-9)
    by_hand = np.mean([-float(torch.autograd.grad(F.cross_entropy(st.last_position(params, c, "key")[0], y),
                                                  params["att1.P"])[0][0, 1]) for c, y in batches])
    assert paths["key"]["velocity"] == pytest.approx(by_hand, rel=1e-6)


def test_the_summary_and_table_split_deltas_velocity_by_path():
    """delta_paths summarised per stage as the coordinates are (slopes of the seeds' medians against log N), and the
    table's share of delta's velocity per N at the last stage."""
    Ns = (32, 64, 128)
    runs = [measured("transformer", N, s, lambda N, i: -N ** -0.5, lambda N: 1.0) for N in Ns for s in (0, 1)]
    power = {"query": -1.0, "key": -0.5, "value": 0.0, "skip": -2.0}
    for run in runs:
        for stage in run["times"].values():
            stage["delta_paths"] = {p: {"velocity": run["N"] ** power[p], "se": 0.0} for p in st.PATHS}
    out = tv.measure_summary(runs, {})["transformer"]
    assert [out["delta_paths"][p][-1]["slope"] for p in st.PATHS] == pytest.approx([-1.0, -0.5, 0.0, -2.0], abs=1e-9)
    table = tv.velocity_table({"measure": {"fractions": [0.0, 0.25, 0.5]}, "summary": {"transformer": out}})
    keys = next(row for row in table if "layer 2's keys" in row)
    assert "per N: −1.00, −1.00, −1.00" in keys and "| −0.50, −0.50 |" in keys  # N^-0.5 / -N^-0.5; both stages


def test_key_push_reads_the_same_parameters_on_shorter_sequences():
    """key_push at N' < N is the key path of the same weights with the position biases cut to N' (a model of length
    N'), and at N' = N delta_paths' key path; the two lengths differ (the push is read on each length's batches)."""
    model, params = random_transformer(16, 3)
    by_length = {n: [fc.fresh_batch(32, n, torch.Generator().manual_seed(n))] for n in (8, 16)}
    push = tp.key_push(params, by_length)
    cut = {k: (v[..., :8] if k.endswith(".P") else v).detach().clone().requires_grad_(True) for k, v in params.items()}
    assert set(push) == {"8", "16"}
    assert push["8"]["velocity"] == pytest.approx(tp.path_velocity(cut, by_length[8], "key")["velocity"], rel=1e-6)
    assert push["16"]["velocity"] == pytest.approx(tp.delta_paths(params, by_length[16])["key"]["velocity"], rel=1e-6)
    assert push["8"]["velocity"] != pytest.approx(push["16"]["velocity"], rel=1e-3)


def test_key_swaps_name_the_part_that_differs():
    """Two runs that differ in W_U alone (one trained at N = 16, one at 8: position biases cut to the batches): W_U
    carries the whole difference in the key push, every other part none; the groups cover every parameter once."""
    _, other = random_transformer(16, 4)
    base = {k: (v[..., :8] if k.endswith(".P") else v).detach().clone() for k, v in other.items()}
    with torch.no_grad():
        other["W_U.weight"].mul_(3.0).add_(0.2)
    names = [k for group in tp.PARAMETER_GROUPS.values() for k in group]
    assert sorted(names) == sorted(base) and len(names) == len(set(names))
    batches = [fc.fresh_batch(64, 8, torch.Generator().manual_seed(11))]
    out = tp.key_swaps(base, other, batches)
    assert abs(out["other"] - out["base"]) > 1e-3 * abs(out["base"])
    assert out["shares"]["W_U"] == pytest.approx(1.0, abs=1e-6)
    assert all(abs(v) < 1e-6 for k, v in out["shares"].items() if k != "W_U")


def transfer_runs(a, b, Ns=(32, 64, 128)):
    """Stored runs whose key push at their last stage is N'^-a N^b: dilution a at fixed parameters, growth b."""
    runs = []
    for N in Ns:
        for seed in (0, 1):
            run = measured("transformer", N, seed, lambda N, i: 1.0, lambda N: 1.0)
            for stage in run["times"].values():
                stage["key_push"] = {str(n): {"velocity": (1 + 0.1 * seed) * n ** -a * N ** b, "se": 0.0}
                                     for n in Ns if n <= N}
            runs.append(run)
    return runs


def test_the_key_transfer_summary_separates_dilution_from_growth():
    """Pushes N'^-0.8 N^0.6: the dilution's slope -0.8 per trained N (against N', not N), the growth's 0.6 (against
    N on the shortest length), the theory's H_N' / N' slope beside them, and the table's rows."""
    out = tv.measure_summary(transfer_runs(0.8, 0.6), {})["transformer"]["key_transfer"]
    assert out["growth"]["slope"] == pytest.approx(0.6, abs=1e-9)
    assert out["dilution"]["32"]["median"] is None and out["dilution"]["32"]["lengths"] == [32]
    assert out["dilution"]["128"]["median"] == pytest.approx(-0.8, abs=1e-9)
    assert out["dilution"]["128"]["theory"] == pytest.approx(tv.theory_slope("beta", [32, 64, 128]), abs=1e-12)
    assert out["growth"]["flat_needs"] == pytest.approx(-out["dilution"]["128"]["theory"], abs=1e-12)
    assert out["dilution"]["64"]["median_push"] == pytest.approx([1.05 * n ** -0.8 * 64 ** 0.6 for n in (32, 64)])
    table = tv.velocity_table({"measure": {"fractions": [0.0, 0.25, 0.5]}, "summary": {"transformer": {
        "key_transfer": out}}})
    assert any("| transformer | 0.60 |" in row for row in table)
    assert any("| transformer | −0.80, −0.80 |" in row for row in table)


def test_a_measurement_run_keeps_the_key_push_at_every_length_and_its_last_parameters(tmp_path, monkeypatch):
    """_measure_job (small batches): key_push at every MEASURE length up to N, its own length equal to delta_paths'
    key path, and the parameters saved at the last stage are the run's at that step."""
    torch.set_num_threads(1)
    monkeypatch.setitem(tv.MEASURE, "N", (8, 16))
    monkeypatch.setattr(tv, "measurement_batches", lambda n: [fc.fresh_batch(32, n, torch.Generator().manual_seed(n))])
    out = tv._measure_job((str(tmp_path), "transformer", 16, 0, [0, 4], []))
    for stage in out["times"].values():
        assert set(stage["key_push"]) == {"8", "16"}
        assert stage["key_push"]["16"] == stage["delta_paths"]["key"]
    seen = {}
    st.train_one(16, 0, 4, tv.MEASURE["eval_batch"],
                 measure=lambda t, params: seen.update({t: {k: p.detach().clone() for k, p in params.items()}}))
    saved = torch.load(tv.params_path(str(tmp_path), 16, 0))
    assert all(torch.equal(saved[k], seen[4][k]) for k in saved) and not torch.equal(saved["W_U.weight"],
                                                                                   seen[0]["W_U.weight"])


def test_a_measurement_with_a_part_held_trains_it_held_and_keeps_its_own_figure(tmp_path, monkeypatch):
    """--frozen W_U.weight: the run trains with the unembedding at its start (its saved last-stage W_U is the seed's
    draw, its other parameters the frozenWU run's), says so in its JSON, and its measurement goes to
    tau_velocities_frozen_W_U.json beside no record_match; runs measured otherwise under the same root are refused."""
    torch.set_num_threads(1)
    monkeypatch.setitem(tv.MEASURE, "N", (8, 16))
    monkeypatch.setattr(tv, "measurement_batches", lambda n: [fc.fresh_batch(32, n, torch.Generator().manual_seed(n))])
    root, figures = tmp_path / "runs", tmp_path / "figures"
    root.mkdir(), figures.mkdir()
    out, _ = (tv._measure_job((str(root), "transformer", N, 0, [0, 4], ["W_U.weight"])) for N in (8, 16))
    assert out["frozen"] == ["W_U.weight"]
    seen = {}
    st.train_one(8, 0, 4, tv.MEASURE["eval_batch"], training={**st.TRAINING, "frozen": ["W_U.weight"]},
                 measure=lambda t, params: seen.update({t: {k: p.detach().clone() for k, p in params.items()}}))
    saved = torch.load(tv.params_path(str(root), 8, 0))
    assert all(torch.equal(saved[k], seen[4][k]) for k in saved)
    assert torch.equal(saved["W_U.weight"], st.model_for(8, 0).W_U.weight.detach())
    assert not torch.equal(saved["att2.W_V.weight"], st.model_for(8, 0).att2.W_V.weight.detach())
    result = tv.collect_measurements(str(root), str(figures), ["W_U.weight"])
    assert tv.figure_name(["W_U.weight"]) == "tau_velocities_frozen_W_U" and tv.figure_name([]) == "tau_velocities"
    assert sorted(p.name for p in figures.iterdir()) == ["tau_velocities_frozen_W_U.json", "tau_velocities_frozen_W_U.png"]
    assert result["frozen"] == ["W_U.weight"] and result["summary"]["transformer"]["record_match"] is None
    with pytest.raises(ValueError, match="held"):
        tv.collect_measurements(str(root), str(figures))


def test_swap_summary_reads_the_saved_parameters(tmp_path, monkeypatch):
    """swap_summary pairs each seed's run at the larger N with its own at the smallest, from the saved files."""
    monkeypatch.setattr(tv, "measurement_batches", lambda n: [fc.fresh_batch(32, n, torch.Generator().manual_seed(n))])
    _, params = random_transformer(16, 5)
    for N, seed, scale in ((8, 0, 1.0), (16, 0, 2.0), (8, 1, 1.0)):
        torch.save({k: (v[..., :N] if k.endswith(".P") else v * (scale if k == "W_U.weight" else 1.0)).detach()
                    for k, v in params.items()}, tv.params_path(str(tmp_path), N, seed))
    runs = [{"model": "transformer", "N": N, "seed": s} for N, s in ((8, 0), (16, 0), (8, 1))]
    out = tv.swap_summary(str(tmp_path), runs)
    assert out["N"] == [8, 16] and out["seeds"] == [0] and [(r["N"], r["seed"]) for r in out["runs"]] == [(16, 0)]
    assert out["median"]["W_U"] == pytest.approx(1.0, abs=1e-6) and abs(out["median"]["V2"]) < 1e-6
    small = {k: v.clone().requires_grad_(True) for k, v in torch.load(tv.params_path(str(tmp_path), 8, 0)).items()}
    assert out["runs"][0]["base"] == pytest.approx(tp.path_velocity(small, tv.measurement_batches(8), "key")["velocity"])
    assert out["runs"][0]["other"] != pytest.approx(out["runs"][0]["base"], rel=1e-3)
