"""campaigns: a campaign interrupted after every piece ends with the same ledger and figures as one uninterrupted
call (K1* searches replayed from the ledger as they ran; fixed grids); ledgers of another spec are refused; the
circuits campaigns' figures come from their ledgers alone; the figure scripts compute what they draw of a grid
campaign on known ledgers; a piece's cost is calibrated on the pieces measured on its card, and the pieces are
sized by it."""
import json
import sys
import tarfile
import time

import numpy as np
import pytest

import circuits
import k1
import sweep
import task_vectors
from campaigns import campaign, records, specs
from plumbing import cli
from runners import probes
from stand_ins import tiny_campaigns  # noqa: F401 (the fixture below)

pytestmark = pytest.mark.usefixtures("tiny_campaigns")  # campaign.SPECS with the CPU-sized campaigns


def _stable(ledger: dict) -> list:
    """The ledger's probe records without the per-call fields (card, date, timings), in a fixed order."""
    records = [r for piece in ledger["pieces"] for r in piece.get("probes", [])]
    return sorted(records, key=lambda r: (r["condition"], r["K"], r["seed"]))


def _run_to_the_end(tmp_path, name: str, max_probes: int, max_pieces: int = 10**6) -> int:
    """Calls of `python -m campaigns run` until one says nothing is left; returns their number."""
    return _calls(lambda: campaign.run(name, 5, "cpu", str(tmp_path / "runs"), jobs=1, max_probes=max_probes,
                                       max_pieces=max_pieces, ledgers=str(tmp_path / "ledgers")))


DRAWN_BY = {"k1": k1.ledger_figures, "reweight": k1.ledger_figures, "tau": k1.ledger_figures,
            "sweep": sweep.ledger_figures}  # each kind's figure script, as records.drawn_by names it


def _calls(call) -> int:
    """call() until it says nothing is left; the number of calls."""
    calls, message = 0, ""
    while not message.startswith("nothing left"):
        message = call()
        calls += 1
        assert calls < 50, message
        assert calls < 50, message
    return calls


@pytest.fixture
def rule_on_K(monkeypatch):
    """Searches with a known answer whatever the tiny runs learn: K1* = 4 + seed (several rounds each)."""
    monkeypatch.setattr(specs, "probe_generalizes", lambda record: record["K"] > 4 + record["seed"])


def test_an_interrupted_k1_campaign_equals_an_uninterrupted_one(tmp_path, rule_on_K):
    one, many = tmp_path / "one", tmp_path / "many"
    assert _run_to_the_end(one, "k1_tiny", max_probes=10**6) == 1  # one call runs every piece
    calls = _run_to_the_end(many, "k1_tiny", max_probes=4, max_pieces=1)  # a call stopped after every piece
    ledger_one = json.load(open(one / "ledgers" / "k1_tiny.json"))
    ledger_many = json.load(open(many / "ledgers" / "k1_tiny.json"))
    assert calls == len(ledger_many["pieces"]) > len(ledger_one["pieces"])
    assert _stable(ledger_one) == _stable(ledger_many)
    drawn = [k1.ledger_figures("k1_tiny", str(d / "figures"), str(d / "ledgers")) for d in (one, many)]
    for r in drawn:
        r.pop("pieces")
    assert drawn[0] == drawn[1]
    assert {c: [s["K1_star"] for s in seeds] for c, seeds in drawn[0]["seeds"].items()} == {"control": [4, 5], "inject": [4]}
    assert (one / "figures" / "k1_tiny.png").exists()
    # the searches replayed from the ledger are a lockstep search with the same rule, probe for probe
    searches, outcomes = campaign.k1_state(campaign.SPECS["k1_tiny"], ledger_many)
    direct = probes.new_searches(campaign.SPECS["k1_tiny"]["probe"], campaign.SPECS["k1_tiny"]["plan"])
    while todo := probes.pending_probes(direct):
        for cond, K, seed in todo:
            direct[cond, seed].record(K, K > 4 + seed)
    assert {k: s.result() for k, s in searches.items()} == {k: s.result() for k, s in direct.items()}
    assert set(outcomes) == {(c, K, s) for (c, s), search in direct.items() for K in search.probes}


def test_a_ledger_of_another_spec_is_refused(tmp_path, monkeypatch):
    ledgers = str(tmp_path)
    ledger = campaign.load_ledger("k1_tiny", ledgers)
    ledger["spec"]["probe"]["iters"] += 1
    campaign.save_ledger(ledger, ledgers)
    with pytest.raises(ValueError, match="another spec"):
        campaign.load_ledger("k1_tiny", ledgers)
    with pytest.raises(ValueError, match="unknown campaign"):
        campaign.load_ledger("k1_nothing", ledgers)


def test_a_piece_that_does_not_fit_is_not_started(tmp_path):
    message = campaign.run("k1_tiny", 1e-4, "cpu", str(tmp_path / "runs"), ledgers=str(tmp_path / "ledgers"))
    assert "none fits" in message
    assert not (tmp_path / "ledgers" / "k1_tiny.json").exists()


@pytest.mark.parametrize("name, phases, figures", [
    ("circuits_tiny", {"1gen", "2gen", "1mem", "2mem"}, ("circuits_tiny", "task_vectors_tiny", "fig2a_tiny_K64", "fig2a_tiny_K4")),
    ("circuits_mem_tiny", {"1mem", "2mem"}, ("circuits_mem_tiny", "task_vectors_mem_tiny", "fig2a_mem_tiny_K4"))])
def test_the_circuits_campaign_is_one_piece_and_its_figures_come_from_the_ledger(tmp_path, name, phases, figures):
    """Train, then circuits.py and task_vectors.py on the runs, in one piece; a second call trains nothing; the two
    scripts redraw everything from the ledger alone (the run directories deleted), twice with the same numbers. A
    memorizing run alone (circuits_mem_*) is traced in its two phases."""
    drawn_to, ledgers = str(tmp_path / "figures"), str(tmp_path / "ledgers")
    assert campaign.run(name, 5, "cpu", str(tmp_path / "runs"), ledgers=ledgers).endswith("nothing left")
    assert campaign.run(name, 5, "cpu", str(tmp_path / "runs"), ledgers=ledgers).startswith("nothing left")
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())  # a call empties the scratch runs: the ledger is the record
    ledger = json.load(open(tmp_path / "ledgers" / f"{name}.json"))
    assert len(ledger["pieces"]) == 1 and set(ledger["pieces"][0]["phases"]) == phases
    first = circuits.ledger_figures(name, drawn_to, ledgers)
    again = circuits.ledger_figures(name, drawn_to, ledgers)
    assert first == again
    assert task_vectors.ledger_figures(name, drawn_to, ledgers) == ledger["pieces"][0]["task_vectors"]
    assert campaign.status(name, ledgers).endswith(f"figures: {records.drawn_by(name)}")
    for ph, m in first["margins"].items():  # the margin is the runner-up's divergence less the phase's own
        row = next(r for r in ledger["pieces"][0]["runs"][m["run"]]["rows"] if r["step"] == m["step"])
        others = [row[f"kl_{p}"] for p in ("1gen", "2gen", "1mem", "2mem") if p != ph]
        assert m["margin"] == pytest.approx(min(others) - row[f"kl_{ph}"])
    for ph, d in first["phases"].items():  # the JSON lists the figure's edges: the cut and the paths drawn under it
        if "importance" not in ledger["pieces"][0]["phases"][ph]:  # a phase the tiny runs never reach: not traced
            assert d["in_phase"] is False and d["why"].startswith("no checkpoint in") and "circuit" not in d
            continue
        assert d["circuit"] == circuits.circuit_edges(ledger["pieces"][0]["phases"][ph]["importance"]) and d["circuit"]["kept"]
    for figure in figures:
        assert (tmp_path / "figures" / f"{figure}.png").exists()


def test_a_script_draws_only_its_own_campaigns_and_only_from_pieces(tmp_path):
    """A figure script refuses another's campaign, a missing ledger and an empty one, each in one line and before it
    writes anything."""
    figures, ledgers = str(tmp_path / "figures"), str(tmp_path / "ledgers")
    with pytest.raises(ValueError, match="'k1_tiny' is not a campaign this script draws; it draws sweep_paper, sweep_tiny"):
        sweep.ledger_figures("k1_tiny", figures, ledgers)
    with pytest.raises(ValueError, match="no ledger"):
        k1.ledger_figures("k1_tiny", figures, ledgers)
    campaign.save_ledger(campaign.load_ledger("k1_tiny", ledgers), ledgers)
    with pytest.raises(ValueError, match="holds no piece yet"):
        k1.ledger_figures("k1_tiny", figures, ledgers)
    assert not (tmp_path / "figures").exists()


def test_status_names_the_script_that_draws_each_campaign(tmp_path):
    """records.drawn_by's commands, for every campaign: each names a script that takes the campaign (its
    ledger_figures gets past the kind check to the missing ledger)."""
    modules = {"k1.py": k1, "sweep.py": sweep, "circuits.py": circuits, "task_vectors.py": task_vectors}
    for name in campaign.SPECS:
        for command in records.drawn_by(name).split("; "):
            _, script, *rest = command.split()
            assert rest[-1] == name and rest[:-1] in (["ledger"], ["--ledger"]), command
            with pytest.raises(ValueError, match="no ledger"):
                modules[script].ledger_figures(name, str(tmp_path), str(tmp_path))


def test_a_circuits_piece_that_does_not_fit_with_its_analysis_is_not_started(tmp_path):
    """The budget counts the tracing and task vectors after the training (circuits_mem_tiny: 1.2 s + 5 s)."""
    message = campaign.run("circuits_mem_tiny", 4 / 60, "cpu", str(tmp_path / "runs"), ledgers=str(tmp_path / "ledgers"))
    assert "does not fit" in message and not (tmp_path / "ledgers").exists()


@pytest.mark.parametrize("flags, word", [(["--max-probes", "0"], "--max-probes"), (["--max-pieces", "-1"], "--max-pieces"),
                                         (["--budget-min", "0"], "--budget-min")])
def test_bad_run_flags_are_one_line_and_start_nothing(tmp_path, monkeypatch, capsys, flags, word):
    monkeypatch.setattr(sys, "argv", ["python -m campaigns", "run", "tau_tiny", "--budget-min", "1", "--device", "cpu",
                                      "--root", str(tmp_path / "runs"), "--ledgers", str(tmp_path / "ledgers"), *flags])
    with pytest.raises(SystemExit) as stop:
        cli.run(campaign.main)
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(err) == 1 and word in err[0] and "Traceback" not in err[0]
    assert not any(tmp_path.iterdir())


# ----------------------------------------------------------------------------- fixed grids


@pytest.mark.parametrize("name", ["reweight_tiny", "tau_tiny", "sweep_tiny"])
def test_an_interrupted_grid_campaign_equals_an_uninterrupted_one(tmp_path, name):
    """The same runs, configs and rows in the ledger, and the same figure JSON, whether one call trains the whole
    grid or every call stops after a piece of at most two runs."""
    one, many = tmp_path / "one", tmp_path / "many"
    assert _run_to_the_end(one, name, max_probes=10**6) == 1
    calls = _run_to_the_end(many, name, max_probes=2, max_pieces=1)
    ledgers = [json.load(open(d / "ledgers" / f"{name}.json")) for d in (one, many)]
    assert calls == len(ledgers[1]["pieces"]) == -(-len(campaign.grid_keys(campaign.SPECS[name])) // 2)

    def members(ledger):
        return sorted(campaign.grid_records(ledger), key=lambda m: (m["condition"], m["K"], m["seed"]))

    assert members(ledgers[0]) == members(ledgers[1])
    assert [(m["condition"], m["K"], m["seed"]) for m in members(ledgers[0])] == sorted(campaign.grid_keys(campaign.SPECS[name]))
    figure_json = []
    for d in (one, many):
        DRAWN_BY[campaign.SPECS[name]["report"]](name, str(d / "figures"), str(d / "ledgers"))
        figure_json.append({k: v for k, v in json.load(open(d / "figures" / f"{name}.json")).items() if k != "pieces"})
    assert figure_json[0] == figure_json[1]
    n = len(campaign.grid_keys(campaign.SPECS[name]))
    assert f"{n}/{n} runs; next: 0 runs" in campaign.status(name, str(many / "ledgers"))


def _member(cond: str, K: int, seed: int, phi: list[float], gen_loss: list[float], N: int = 8, iters: int = 6) -> dict:
    """A grid run as the ledger keeps it: dense readouts phi_beta(2) at steps 0, 3, 6, ..., full evaluations with
    L_gen at their steps and known divergences (kl_<p> = K / 1000 + seed / 100 + step / 10^4 + a per-predictor
    offset), n_A = N / 2."""
    dense = [{"step": 3 * i, "phi_beta_2": v, "gen_loss": 2.0, "train_loss": 2.0} for i, v in enumerate(phi)]
    full = [{"step": 3 * i, "gen_loss": g, "gen_loss_2gen": 2.1, "train_loss": 2.0,
             **{f"kl_{p}": K / 1000 + seed / 100 + 3 * i / 1e4 + j / 10 for j, p in enumerate(("1gen", "2gen", "1mem", "2mem"))},
             "phi_delta_1": 0.1, "phi_beta_2": v, "n_A_1": N / 2, "n_A_2": N / 4} for i, (g, v) in enumerate(zip(gen_loss, phi))]
    return {"condition": cond, "K": K, "seed": seed, "config": {"K": K, "seed": seed, "N": N, "iters": iters},
            "dense": dense, "full": full}


def _ledger(tmp_path, name: str, members: list[dict]) -> str:
    """A ledger of campaign `name` holding `members` (two pieces), as `python -m campaigns run` writes one."""
    ledgers = str(tmp_path / "ledgers")
    ledger = campaign.load_ledger(name, ledgers)
    half = len(members) // 2
    for part in (members[:half], members[half:]):
        ledger["pieces"].append({"members": part, "card": "cpu", "date": "2026-11-27", "seconds": 1.0,
                                 "model_steps": 6 * len(part), "predicted": 1.0})
    campaign.save_ledger(ledger, ledgers)
    return ledgers


@pytest.fixture
def drawn(monkeypatch):
    """The drawing functions the scripts call on a ledger, recording their arguments (and still drawing)."""
    calls = {}
    for module, fn in ((k1, "plot_grid"), (k1, "draw_tau_histogram"), (sweep, "draw_sweep")):
        real = getattr(module, fn)

        def spy(*args, _real=real, _fn=fn):
            calls.setdefault(_fn, []).append(args)
            return _real(*args)
        monkeypatch.setattr(module, fn, spy)
    return calls


def test_the_reweight_figure_draws_each_conditions_max_phi_beta_and_brackets_K1(tmp_path, drawn):
    """max phi_beta(2) over the dense readouts, L_gen at the last full evaluation, tau_2gen at the first readout
    above phi_beta* (strictly), and per seed the bracket (largest K without the head, smallest K with it]."""
    phi = {("control", 3): [0.1, 0.3, 0.2], ("control", 6): [0.1, 0.6, 0.5], ("reweight", 3): [0.1, 0.2, 0.45],
           ("reweight", 6): [0.1, 0.2, 0.3]}
    members = [_member(c, K, s, [v + (0.2 if (c, K, s) == ("reweight", 6, 1) else 0) for v in phi[c, K]], [2.5, 2.3, 2.2 - s / 10])
               for c in ("control", "reweight") for s in (0, 1) for K in (3, 6)]
    figures = tmp_path / "figures"
    result = k1.ledger_figures("reweight_tiny", str(figures), _ledger(tmp_path, "reweight_tiny", members))
    assert result["brackets"] == {"control": {0: [3, 6], 1: [3, 6]}, "reweight": {0: [6, None], 1: [3, 6]}}
    control = result["table"]["control"]
    assert control[6]["max_phi_beta"] == [0.6, 0.6] and control[3]["max_phi_beta"] == [0.3, 0.3]
    assert control[6]["gen_loss"] == [2.2, 2.1] and control[6]["heads"] == 2
    assert result["table"]["reweight"][3]["heads"] == 0  # 0.45 is not above phi_beta* = 0.45
    taus = {(r["condition"], r["K"], r["seed"]): r["tau_2gen"] for r in result["runs"]}
    assert taus["control", 6, 0] == 3 and taus["reweight", 6, 1] == 6 and taus["reweight", 3, 0] is None
    (tables, title, _, loss, brackets), = drawn["plot_grid"]  # one figure: both conditions and the brackets
    assert tables == result["table"] and brackets == result["brackets"]  # what the figure draws is what the JSON says
    assert "reweight: w = 0.5, x 2 steps" in title and loss == "L_gen at the end"
    assert (figures / "reweight_tiny.png").exists()
    saved = json.load(open(figures / "reweight_tiny.json"))
    assert saved["brackets"]["reweight"]["0"] == [6, None] and saved["table"]["control"]["6"]["heads"] == 2


def test_the_tau_figure_counts_never_apart_and_draws_its_histogram(tmp_path, drawn):
    """tau_2gen per seed in seed order, the histogram over tau_bins and the 'never' seeds counted apart; the
    figure is given the same numbers."""
    phis = {0: [0.1, 0.5, 0.6], 1: [0.1, 0.2, 0.3], 2: [0.1, 0.2, 0.9]}  # tau 3, never, 6
    result = k1.ledger_figures("tau_tiny", str(tmp_path / "figures"),
                               _ledger(tmp_path, "tau_tiny", [_member("control", 4, s, phis[s], [2.3, 2.2, 2.1]) for s in (2, 0, 1)]))
    assert result["seed"] == [0, 1, 2] and result["tau_2gen"] == [3, None, 6] and result["never"] == 1
    assert result["bins"] == pytest.approx(list(np.linspace(0, 6, 11)))
    assert result["counts"] == [0, 0, 0, 0, 0, 1, 0, 0, 0, 1]  # 3 in [3.0, 3.6); 6 in the last, closed bin
    assert drawn["draw_tau_histogram"][0][1:] == ([3, None, 6], 6, 4)
    assert json.load(open(tmp_path / "figures" / "tau_tiny.json"))["tau_2gen"] == [3, None, 6]


def test_the_sweep_figure_averages_the_seeds_full_evaluations_per_K(tmp_path, drawn):
    """Figs. 2b-c from the ledger: per K and step the seeds' mean of each divergence (n_A over N), the K trained
    so far only; the heat maps are drawn from the JSON's numbers."""
    members = [_member("control", K, s, [0.1, 0.2, 0.3], [2.3, 2.2, 2.1]) for K in (2, 8) for s in (0, 1)]
    members.append(_member("control", 4, 0, [0.1, 0.2, 0.3], [2.3, 2.2, 2.1]))
    result = sweep.ledger_figures("sweep_tiny", str(tmp_path / "figures"), _ledger(tmp_path, "sweep_tiny", members))
    assert result["K"] == [2, 4, 8] and result["step"] == [0, 3, 6] and result["seeds"] == {2: [0, 1], 4: [0], 8: [0, 1]}
    for i, K in enumerate((2, 4, 8)):
        seed_mean = 0.005 if K != 4 else 0.0  # seeds 0 and 1: + 0.01 / 2
        assert result["kl_2mem"][i] == pytest.approx([K / 1000 + seed_mean + 3 * j / 1e4 + 0.3 for j in range(3)])
        assert result["n_A_1"][i] == pytest.approx([0.5] * 3)
    summary = drawn["draw_sweep"][0][0]
    assert {k: summary[k] for k in ("K", "step", "kl_2mem")} == {k: result[k] for k in ("K", "step", "kl_2mem")}


# ----------------------------------------------------------------------------- the calibrated cost of a piece

H100 = "NVIDIA H100 80GB HBM3"
K1_PAPER = [(8, 106.1, 117.3), (2, 51.4, 29.3), (6, 89.7, 88.0), (3, 68.3, 44.0), (8, 101.7, 117.3), (8, 93.3, 117.3),
            (8, 94.1, 117.3), (4, 61.9, 58.7), (2, 50.6, 29.3), (3, 58.8, 44.0),
            (1, 41.2, 14.7)]  # ledgers/k1_paper.json's pieces on an H100: (control probes, seconds, predicted)


def _piece(seconds: float, predicted: float, controls: int = 1, inject: tuple = (), card: str = H100) -> dict:
    """A k1_paper piece as far as the calibration reads it: `controls` control probes (one ensemble) and injected
    probes at the K in `inject` (another)."""
    records = [{"condition": "control", "K": 16, "seed": s} for s in range(controls)]
    records += [{"condition": "inject", "K": K, "seed": 0} for K in inject]
    return {"probes": records, "card": card, "seconds": seconds, "predicted": predicted}


def _calibration(pieces: list[dict], card: str = H100) -> specs.Calibration:
    spec = campaign.SPECS["k1_paper"]
    return campaign.calibration({"pieces": pieces}, card, lambda keys: campaign.k1_ensembles(spec, keys))


def test_the_calibration_is_the_least_squares_line_raised_by_its_largest_overrun():
    """Pieces predicted at 10, 20, 30 s took 30, 44, 50 s: the line 64/3 + 1 x predicted (residuals -4/3, 8/3, -4/3)
    raised by the largest residual, 8/3; a piece on another card changes nothing."""
    pieces = [_piece(30, 10), _piece(44, 20), _piece(50, 30)]
    assert _calibration(pieces) == pytest.approx((64 / 3, 1, 8 / 3))
    assert _calibration(pieces).seconds(1, 40) == pytest.approx(64)
    assert _calibration(pieces + [_piece(500, 20, card="cpu")]) == pytest.approx((64 / 3, 1, 8 / 3))


def test_the_fixed_cost_is_paid_per_ensemble():
    """Control probes train as one ensemble and injected ones as another, whatever their K (their tables padded to the
    largest; k1_train), each paying the fixed cost: pieces at 20 s per ensemble + 1 x predicted, one of them of two
    ensembles, give back a = 20, c = 1 exactly."""
    keys = [("control", 16, s) for s in range(5)] + [("inject", K, s) for s in range(4) for K in (16, 4096)]
    assert campaign.k1_ensembles(campaign.SPECS["k1_paper"], keys) == 2
    fit = _calibration([_piece(30, 10), _piece(50, 30), _piece(80, 40, controls=2, inject=(16, 4096))])
    assert fit == pytest.approx((20, 1, 0), abs=1e-9)
    assert fit.seconds(3, 50) == pytest.approx(110)


def test_the_calibration_has_no_negative_fixed_cost():
    """Pieces predicted at 10 and 30 s that took 5 and 40 s: the line -12.5 + 1.75 x predicted would promise a
    three-ensemble piece predicted at 10 s in -20 s; the fit without a fixed cost is 1.25 x predicted, raised by 2.5."""
    assert _calibration([_piece(5, 10), _piece(40, 30)]) == pytest.approx((0, 1.25, 2.5))


def test_without_a_line_the_calibration_is_the_slowest_pieces_factor():
    """No piece on this card: the spec's rate (another card's pieces count for nothing). Pieces of one predicted
    seconds, or a line with a slope <= 0 (larger pieces measured faster): the slowest measured / predicted."""
    other = _piece(300, 10, card="cpu")
    assert _calibration([]) == (0, 1, 0)
    assert _calibration([other]) == (0, 1, 0)
    assert _calibration([_piece(30, 10), _piece(45, 10), other]) == pytest.approx((0, 4.5, 0))
    assert _calibration([_piece(60, 10), _piece(50, 30), other]) == pytest.approx((0, 6, 0))


def test_k1_papers_pieces_predict_an_8_probe_piece_within_15_s():
    """The H100's 11 pieces fit 35.7 s per ensemble + 0.546 x predicted (8 s per probe): an 8-probe piece, 117.3 s at
    the spec's rate and 93-106 s measured, is predicted no faster than the slowest of them and within 15 s of their
    mean (the slowest piece's factor, 41.2 / 14.7, predicted 329 s); no measured piece is above its prediction."""
    fit = _calibration([_piece(seconds, predicted, controls=n) for n, seconds, predicted in K1_PAPER])
    assert fit.a == pytest.approx(35.7, abs=0.05) and fit.c == pytest.approx(0.546, abs=0.001)
    eight = [seconds for n, seconds, _ in K1_PAPER if n == 8]
    assert max(eight) <= fit.seconds(1, 117.3) <= np.mean(eight) + 15
    assert all(seconds <= fit.seconds(1, predicted) for _, seconds, predicted in K1_PAPER)


@pytest.mark.parametrize("todo, take, seconds", [
    ([("control", 16, s) for s in range(10)], 4, 64),
    ([("control", 16, 0), ("control", 16, 1)] + [("inject", K, s) for s in range(4) for K in (16, 4096)], 2, 44)])
def test_the_chooser_takes_as_many_runs_as_the_calibrated_cost_fits(tmp_path, capsys, todo, take, seconds):
    """Calibrated at 64/3 s per ensemble + 1 x predicted + 8/3 (above), runs predicted at 10 s each, 73 s left.
    Control probes (one ensemble): a piece of 4 (64 s; 5 would take 74), where the spec's rate would take 7, the
    line without its margin 5, and the slowest piece's factor (3) 2. Two control probes, then injected ones: 2
    (44 s), since the first injected probe adds an ensemble (75 s)."""
    ledger = {"campaign": "k1_tiny", "pieces": [_piece(30, 10, card="cpu"), _piece(44, 20, card="cpu"),
                                                _piece(50, 30, card="cpu")]}
    trained = []

    def train_piece(keys):
        trained.append(keys)
        return {"probes": [{"condition": c, "K": K, "seed": s} for c, K, s in keys]}, len(keys)

    spec = campaign.SPECS["k1_paper"]
    campaign.run_pieces(ledger, "cpu", time.time() + 73, 10**6, 1, str(tmp_path), "probe", lambda: todo,
                        lambda keys: 10 * len(keys), lambda keys: campaign.k1_ensembles(spec, keys), train_piece)
    assert trained == [todo[:take]]
    assert f"piece 4: {take} of {len(todo)} pending probes (~{seconds} s predicted)" in capsys.readouterr().out


def test_status_estimates_the_next_piece_calibrated_on_the_ledgers_card(tmp_path):
    """tau_tiny's seeds 0 and 1 in pieces predicted at 10 and 20 s that took 30 and 44 s (16 s per ensemble + 1.4 x
    predicted): seed 2's run, 1.06 s at the spec's rate (1 s per ensemble + 6 steps x 0.01 s), is ~17.5 s on that
    card; before any piece, the spec's rate."""
    ledgers = _ledger(tmp_path, "tau_tiny", [_member("control", 4, s, [0.1], [2.0]) for s in (0, 1)])
    ledger = campaign.load_ledger("tau_tiny", ledgers)
    for piece, (seconds, predicted) in zip(ledger["pieces"], [(30, 10), (44, 20)]):
        piece.update(seconds=seconds, predicted=predicted)
    campaign.save_ledger(ledger, ledgers)
    assert campaign.progress("tau_tiny", ledgers).endswith("2/3 runs; next: 1 runs (~0.3 min on cpu)")
    before = campaign.progress("tau_tiny", str(tmp_path / "none"))
    assert before.endswith("0/3 runs; next: 3 runs (~0.0 min at the spec's rate)")


# ----------------------------------------------------------------------------- a call: ensembles filled across campaigns


def _call_to_the_end(d, names: list[str], slots: int, max_pieces: int = 10**6) -> int:
    """Calls of `python -m campaigns call` until one says nothing is left; returns their number."""
    return _calls(lambda: campaign.call(names, 5, "cpu", str(d / "runs"), slots=slots, max_pieces=max_pieces,
                                        ledgers_dir=str(d / "ledgers"), out=str(d / "out")))


def test_a_piece_is_one_ensemble_filled_across_campaigns(tmp_path):
    """The first pending run's schedule leads: k1_tiny's control probes (both ends of both searches), then the
    grid that trains the same way; the injected probes (another schedule) wait; at most `slots` runs."""
    names = ["k1_tiny", "tau_same_tiny"]
    ledgers = {name: campaign.load_ledger(name, str(tmp_path)) for name in names}
    piece = campaign.fill(names, ledgers, slots=64)
    assert [(s.campaign, s.key) for s in piece] == [("k1_tiny", ("control", K, seed)) for seed in (0, 1) for K in (2, 9)] + [
        ("tau_same_tiny", ("control", 4, seed)) for seed in (0, 1, 2)]
    assert len({probes.schedule(s.cfg) for s in piece}) == 1
    assert [s.key for s in campaign.fill(names, ledgers, slots=5)] == [s.key for s in piece[:5]]


def test_spare_slots_widen_the_searches_and_the_answer_is_the_binary_searchs(tmp_path, rule_on_K):
    """With the grid done and slots to spare, a piece probes every K the searches' brackets hold in one round:
    the control searches end two pieces after their ends, at the lockstep binary search's K1* (4 + seed), and an
    interrupted call (a piece a call) writes the same ledgers as one call."""
    names = ["k1_tiny", "tau_same_tiny"]
    one, many = tmp_path / "one", tmp_path / "many"
    assert _call_to_the_end(one, names, slots=64) == 1
    calls = _call_to_the_end(many, names, slots=64, max_pieces=1)
    ledgers = {d: {n: json.load(open(d / "ledgers" / f"{n}.json")) for n in names} for d in (one, many)}
    assert calls == len(ledgers[many]["k1_tiny"]["pieces"]) + 1
    assert _stable(ledgers[one]["k1_tiny"]) == _stable(ledgers[many]["k1_tiny"])
    assert ledgers[one]["tau_same_tiny"]["pieces"][0]["members"] == ledgers[many]["tau_same_tiny"]["pieces"][0]["members"]
    pieces = ledgers[one]["k1_tiny"]["pieces"]
    control = [p for p in pieces if any(r["condition"] == "control" for r in p["probes"])]
    assert len(control) == 2 and len(control[1]["probes"]) == 2 * 6  # K = 3..8 of both seeds in one round
    assert pieces[0]["shared"]["campaigns"] == names and pieces[0]["shared"]["ensembles"] == 1
    searches, _ = campaign.k1_state(campaign.SPECS["k1_tiny"], ledgers[one]["k1_tiny"])
    assert {k: s.result()["K1_star"] for k, s in searches.items()} == {("control", 0): 4, ("control", 1): 5, ("inject", 0): 4}
    with tarfile.open(one / "out" / "campaign.tar.gz") as tar:  # the ledgers, as the repository keeps them
        assert sorted(tar.getnames()) == [f"ledgers/{n}.json" for n in names]


def test_a_call_cut_short_returns_the_pieces_it_finished(tmp_path, monkeypatch):
    """A call killed in its second piece: out/campaign.tar.gz holds the ledgers with the first."""
    trained = probes.run_probes
    count = [0]

    def dying(*args, **kwargs):
        count[0] += 1
        if count[0] == 2:
            raise KeyboardInterrupt
        return trained(*args, **kwargs)

    monkeypatch.setattr(probes, "run_probes", dying)
    with pytest.raises(KeyboardInterrupt):
        campaign.call(["k1_tiny"], 5, "cpu", str(tmp_path / "runs"), ledgers_dir=str(tmp_path / "ledgers"),
                      out=str(tmp_path / "out"))
    with tarfile.open(tmp_path / "out" / "campaign.tar.gz") as tar:
        ledger = json.load(tar.extractfile("ledgers/k1_tiny.json"))
    assert len(ledger["pieces"]) == 1 and len(ledger["pieces"][0]["probes"]) == 4


def test_no_piece_starts_unless_it_fits(tmp_path):
    message = campaign.call(["k1_tiny"], 1e-4, "cpu", str(tmp_path / "runs"), ledgers_dir=str(tmp_path / "ledgers"))
    assert message == "the next piece does not fit the time left"
    assert not (tmp_path / "ledgers" / "k1_tiny.json").exists()


def test_the_piece_rate_counts_a_shared_piece_once():
    shared = {"card": "card", "seconds": 80.0, "model_steps": 600, "predicted": 1.0, "probes": [],
              "shared": {"id": "x", "ensembles": 1, "model_steps": 900, "campaigns": ["k1_tiny", "tau_tiny"]}}
    own = {"card": "card", "seconds": 30.0, "model_steps": 12, "predicted": 1.0,
           "probes": [{"condition": "control", "K": 3, "seed": 0}, {"condition": "inject", "K": 3, "seed": 0}]}
    small = {"card": "card", "seconds": 60.0, "model_steps": 1000, "predicted": 1.0,
             "probes": [{"condition": "control", "K": 5, "seed": 1}]}
    other_card = {**own, "card": "other"}
    ledgers = {"k1_tiny": {"pieces": [shared, own, small, other_card]}, "tau_tiny": {"pieces": [{**shared, "members": []}]}}
    assert campaign.piece_rate(ledgers, "card") == specs.fit_seconds([(1, 900, 80.0), (2, 12, 30.0), (1, 1000, 60.0)])
    assert campaign.piece_rate(ledgers, "none") is None

