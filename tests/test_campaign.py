"""campaign.py: a campaign interrupted after every piece ends with the same ledger and figures as one uninterrupted
call, its searches replayed from the ledger as they ran; ledgers of another spec are refused; the circuits
campaign's figures come from its ledger alone."""
import json

import pytest

import campaign
import probes


def _stable(ledger: dict) -> list:
    """The ledger's probe records without the per-call fields (card, date, timings), in a fixed order."""
    records = [r for piece in ledger["pieces"] for r in piece.get("probes", [])]
    return sorted(records, key=lambda r: (r["condition"], r["K"], r["seed"]))


def _run_to_the_end(tmp_path, name: str, max_probes: int, max_pieces: int = 10**6) -> int:
    """Calls of `campaign.py run` until one says nothing is left; returns their number."""
    calls, message = 0, ""
    while not message.startswith("nothing left"):
        message = campaign.run(name, 5, "cpu", str(tmp_path / "runs"), jobs=1, max_probes=max_probes,
                               max_pieces=max_pieces, figures=str(tmp_path / "figures"), ledgers=str(tmp_path / "ledgers"))
        calls += 1
        assert calls < 50, message
    return calls


@pytest.fixture
def rule_on_K(monkeypatch):
    """Searches with a known answer whatever the tiny runs learn: K1* = 4 + seed (several rounds each)."""
    monkeypatch.setattr(campaign, "probe_generalizes", lambda record: record["K"] > 4 + record["seed"])


def test_an_interrupted_k1_campaign_equals_an_uninterrupted_one(tmp_path, rule_on_K):
    one, many = tmp_path / "one", tmp_path / "many"
    assert _run_to_the_end(one, "k1_tiny", max_probes=10**6) == 1  # one call runs every piece
    calls = _run_to_the_end(many, "k1_tiny", max_probes=4, max_pieces=1)  # a call stopped after every piece
    ledger_one = json.load(open(one / "ledgers" / "k1_tiny.json"))
    ledger_many = json.load(open(many / "ledgers" / "k1_tiny.json"))
    assert calls == len(ledger_many["pieces"]) > len(ledger_one["pieces"])
    assert _stable(ledger_one) == _stable(ledger_many)
    reports = [campaign.report("k1_tiny", str(d / "figures"), str(d / "ledgers")) for d in (one, many)]
    for r in reports:
        r.pop("pieces")
    assert reports[0] == reports[1]
    assert {c: [s["K1_star"] for s in seeds] for c, seeds in reports[0]["seeds"].items()} == {"control": [4, 5], "inject": [4]}
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


def test_the_circuits_campaign_is_one_piece_and_its_figures_come_from_the_ledger(tmp_path):
    """Train, trace and task vectors in one piece; a second call trains nothing; the report redraws everything
    from the ledger alone (the run directories deleted), twice with the same numbers."""
    kw = dict(figures=str(tmp_path / "figures"), ledgers=str(tmp_path / "ledgers"))
    assert campaign.run("circuits_tiny", 5, "cpu", str(tmp_path / "runs"), **kw).endswith("nothing left")
    assert campaign.run("circuits_tiny", 5, "cpu", str(tmp_path / "runs"), **kw).startswith("nothing left")
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())  # a call empties the scratch runs: the ledger is the record
    ledger = json.load(open(tmp_path / "ledgers" / "circuits_tiny.json"))
    assert len(ledger["pieces"]) == 1 and set(ledger["pieces"][0]["phases"]) == {"1gen", "2gen", "1mem", "2mem"}
    first = campaign.report("circuits_tiny", **kw)
    again = campaign.report("circuits_tiny", **kw)
    assert first == again
    for ph, m in first["margins"].items():  # the margin is the runner-up's divergence less the phase's own
        row = next(r for r in ledger["pieces"][0]["runs"][m["run"]]["rows"] if r["step"] == m["step"])
        others = [row[f"kl_{p}"] for p in ("1gen", "2gen", "1mem", "2mem") if p != ph]
        assert m["margin"] == pytest.approx(min(others) - row[f"kl_{ph}"])
    for name in ("circuits_tiny.png", "task_vectors_tiny.png", "fig2a_tiny_K64.png", "fig2a_tiny_K4.png"):
        assert (tmp_path / "figures" / name).exists()
