"""A redraw from a committed JSON leaves that JSON byte for byte as it was (a clone's `git status` stays clean after
a pure redraw) and says what it wrote: sa_dynamics.py, sa_scaling.py, mem_minimal.py, task_vectors.py and
circuits.py."""
import json
import os
import shutil

import pytest

import circuits
import mem_minimal as mm
import sa_dynamics as sd
import sa_scaling as sa
import task_vectors as tv
from stand_ins import run  # noqa: F401 (a fixture)

FIGURES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "figures")


def committed(tmp_path, **copies) -> dict:
    """The committed figures/<source> copied to tmp_path/<name> for each name=source; {name: its bytes}."""
    for name, source in copies.items():
        shutil.copy(os.path.join(FIGURES, source), tmp_path / name)
    return {name: (tmp_path / name).read_bytes() for name in copies}


def assert_unchanged(tmp_path, before: dict):
    assert sorted(p.name for p in tmp_path.glob("*.json")) == sorted(before)
    for name, text in before.items():
        assert (tmp_path / name).read_bytes() == text, f"{name} rewritten by a redraw"


def scaled(value, factor: float):
    """value with every float multiplied by factor."""
    if isinstance(value, dict):
        return {k: scaled(v, factor) for k, v in value.items()}
    if isinstance(value, list):
        return [scaled(v, factor) for v in value]
    return value * factor if isinstance(value, float) else value


def test_sa_transformer_replots_leave_their_json_as_it_was(tmp_path, capsys):
    """sa_dynamics.py's four figures and sa_scaling.py's one, each redrawn from the record they share."""
    before = committed(tmp_path, **{"sa_scaling.json": "sa_scaling.json"})
    sd.replot(str(tmp_path / "sa_scaling.json"))
    sa.replot(str(tmp_path / "sa_scaling.json"))
    assert_unchanged(tmp_path, before)
    assert capsys.readouterr().out == (
        f"wrote {tmp_path}/sa_dynamics.png, sa_parameters.png, sa_theory.png, sa_trajectories.png from "
        f"{tmp_path}/sa_scaling.json (each seed's exponents re-derived: the same numbers, the JSON left as it was)\n"
        f"wrote {tmp_path}/sa_scaling.png from {tmp_path}/sa_scaling.json (tau refitted: the same numbers, the JSON "
        "left as it was)\n")
    assert len(list(tmp_path.glob("sa_*.png"))) == 5


def test_sa_scaling_replot_rewrites_its_json_for_a_new_number_not_for_float_noise(tmp_path, monkeypatch):
    """A refit on another machine moved the last digits (relative 1.2e-13): the record stays. A refit that changes
    a number (here one slope by 1e-6) goes into it, and that line alone changes: the others keep their digits."""
    before = committed(tmp_path, **{"sa_scaling.json": "sa_scaling.json"})
    fit = sa.fit_tau
    monkeypatch.setattr(sa, "fit_tau", lambda taus: scaled(fit(taus), 1 + 1.2e-13))
    sa.replot(str(tmp_path / "sa_scaling.json"))
    assert_unchanged(tmp_path, before)

    old = json.loads(before["sa_scaling.json"])

    def moved(taus):
        out = scaled(fit(taus), 1 + 1.2e-13)
        if taus == old["tau_ablation"]:
            out["slope_vs_N"] += 1e-6
        return out

    monkeypatch.setattr(sa, "fit_tau", moved)
    sa.replot(str(tmp_path / "sa_scaling.json"))
    lines_before = before["sa_scaling.json"].decode().splitlines()
    lines_after = (tmp_path / "sa_scaling.json").read_text().splitlines()
    assert len(lines_before) == len(lines_after)
    changed = [(a, b) for a, b in zip(lines_before, lines_after) if a != b]
    slope = old["tau_fits"]["tau_ablation"]["slope_vs_N"]
    assert len(changed) == 1 and json.loads("{" + changed[0][1].rstrip(",") + "}")["slope_vs_N"] == pytest.approx(slope + 1e-6)


@pytest.mark.parametrize("mode, name, png", [("heatmaps", "mem_minimal.json", "mem_heatmaps.png"),
                                             ("trend", "mem_trend.json", "mem_trend.png"),
                                             ("depths", "mem_depths_6000.json", "mem_depths_6000.png")])
def test_mem_minimal_replot_says_what_it_wrote_and_leaves_its_json(tmp_path, capsys, mode, name, png):
    before = committed(tmp_path, **{name: name})
    mm.replot(str(tmp_path), mode, 6000)
    assert_unchanged(tmp_path, before)
    assert capsys.readouterr().out == f"wrote {tmp_path}/{png} from {tmp_path}/{name}\n"
    assert (tmp_path / png).exists()


@pytest.mark.parametrize("source", ["task_vectors.json", "task_vectors_K4.json", "task_vectors_paper.json"])
def test_task_vectors_replot_leaves_its_json(tmp_path, capsys, source):
    before = committed(tmp_path, **{"task_vectors.json": source})
    tv.main(["--replot", "--figures", str(tmp_path)])
    assert_unchanged(tmp_path, before)
    assert capsys.readouterr().out == f"wrote {tmp_path}/task_vectors.png from {tmp_path}/task_vectors.json\n"


def test_trace_replot_leaves_its_json(tmp_path, capsys):
    before = committed(tmp_path, **{"circuits.json": "circuits.json"})
    circuits.replot(str(tmp_path / "circuits.json"))
    assert_unchanged(tmp_path, before)
    assert capsys.readouterr().out == f"wrote {tmp_path}/circuits.png from {tmp_path}/circuits.json\n"


# ----------------------------------------------------------------------------- the documented redraw commands


@pytest.mark.parametrize("script, args, jsons, pngs", [
    ("train.py", ["--replot", "{tmp}/fig2a_K256.json"], ["fig2a_K256.json"], ["fig2a_K256.png"]),
    ("sweep.py", ["--replot", "{tmp}/fig2bc.json"], ["fig2bc.json"], ["fig2bc.png"]),
    ("k2.py", ["sweep", "--replot", "{tmp}/k2.json"], ["k2.json"], ["k2.png"]),
    *[("k2.py", ["sweep", "--replot", f"{{tmp}}/{name}.json"], [f"{name}.json"], [f"{name}.png"])  # scored on one set
      for name in ("k2_width32_3000", "k2_width32_5000", "k2_width256_4000")],
    ("k1.py", ["search", "--replot", "--figures", "{tmp}"], ["k1.json"], ["k1.png"]),
    *[("k1.py", ["grid", "--replot", f"{{tmp}}/{name}.json"], [f"{name}.json"], [f"{name}.png"])
      for name in ("k1_grid_h100", "k1_grid_w0.1")],
])
def test_a_documented_redraw_writes_its_png_and_leaves_the_numbers_as_committed(tmp_path, run, script, args, jsons, pngs):
    """Each documented redraw, pointed at a copy of figures/, leaves every committed JSON byte for byte as it was and
    writes no file but its PNG: a clone's `git status` stays clean after it, but for PNGs drawn by an older drawing
    code or another matplotlib (their pixels are not pinned: fonts and versions differ between machines)."""
    before = committed(tmp_path, **{name: name for name in jsons})
    proc = run(script, *[a.format(tmp=tmp_path) for a in args])
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(jsons + pngs)
    for name, text in before.items():
        assert (tmp_path / name).read_bytes() == text, f"{name} differs from the committed one"


@pytest.mark.parametrize("script, name, rows", [("tau_settings.py", "tau_settings", None),
                                                ("tau_velocities.py", "tau_velocities", 16)])
def test_the_why_flat_replots_leave_their_json_and_print_results_table(tmp_path, run, script, name, rows):
    """Each redraw leaves its JSON as committed, writes its PNG, and the table it prints is RESULTS.md's, row for
    row: tau_settings.py's the ladder (one row per rung: the record, every setting, the SA side), tau_velocities.py's
    the velocities' slopes and the push read at fixed parameters."""
    before = committed(tmp_path, **{f"{name}.json": f"{name}.json"})
    proc = run(script, "--replot", "--figures", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert_unchanged(tmp_path, before)
    assert [p.name for p in tmp_path.glob("*.png")] == [f"{name}.png"]
    printed = proc.stdout.strip().splitlines()[1:]
    with open(os.path.join(os.path.dirname(FIGURES), "RESULTS.md")) as fh:
        text = fh.read()
    if rows is None:
        stored = json.loads(before[f"{name}.json"])
        rows = len(stored["compare"]) + len(stored.get("hybrids", {})) + ("record_full" in stored)
    assert len(printed) == rows and all(row in text for row in printed), printed


# ----------------------------------------------------------------------------- a redraw of a JSON that is not the script's

REDRAWS = [("train.py", [], "fig2a_K256.json"), ("sweep.py", [], "fig2bc.json"), ("k2.py", ["sweep"], "k2.json"),
           ("k1.py", ["search"], "k1.json"), ("circuits.py", [], "circuits.json"),
           ("sa_dynamics.py", [], "sa_scaling.json"), ("sa_scaling.py", [], "sa_scaling.json"),
           ("mem_minimal.py", [], "mem_minimal.json"),
           ("task_vectors.py", [], "task_vectors.json"), ("tau_settings.py", [], "tau_settings.json"),
           ("tau_velocities.py", [], "tau_velocities.json"), ("predictor_scaling.py", [], "predictor_scaling.json")]


def emptied(value):
    """value with every list in it empty: the keys all there, the rows gone."""
    if isinstance(value, dict):
        return {k: emptied(v) for k, v in value.items()}
    return [] if isinstance(value, list) else value


def as_words(value):
    """value with every number (not a bool) as a word: what a hand-edited or foreign JSON could hold."""
    if isinstance(value, dict):
        return {k: as_words(v) for k, v in value.items()}
    if isinstance(value, list):
        return [as_words(v) for v in value]
    return "n/a" if isinstance(value, (int, float)) and not isinstance(value, bool) else value


def as_digits(value):
    """value with every number (not a bool) as its digits, a string: "0.5" where 0.5 was."""
    if isinstance(value, dict):
        return {k: as_digits(v) for k, v in value.items()}
    if isinstance(value, list):
        return [as_digits(v) for v in value]
    return repr(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else value


def pngs(folder) -> dict:
    return {p.name: p.read_bytes() for p in folder.glob("*.png")}


@pytest.mark.filterwarnings("ignore::RuntimeWarning", "ignore::UserWarning")  # an empty figure's means and legends
@pytest.mark.parametrize("change", [emptied, as_words, as_digits], ids=["rows emptied", "numbers as words",
                                                                        "numbers as digits"])
@pytest.mark.parametrize("script, args, name", REDRAWS, ids=[f"{s} {n}" for s, _, n in REDRAWS])
def test_a_redraw_of_a_json_it_cannot_draw_is_one_line(tmp_path, run, script, args, name, change):
    """Every script's --replot JSON on its committed JSON changed as a broken or foreign file would be: one line
    naming the file, exit 2, never a traceback, and the JSON never rewritten. Numbers as words never draw a figure;
    numbers as digits ("0.5") draw the committed JSON's figure pixel for pixel or are that one line (matplotlib
    would draw text as categories, at the wrong places); emptied rows draw (an empty figure says nothing wrong) or
    are that one line."""
    (tmp_path / "changed").mkdir()
    path = tmp_path / "changed" / name
    path.write_text(json.dumps(change(json.load(open(os.path.join(FIGURES, name))))))
    before = path.read_bytes()
    proc = run(script, *args, "--replot", path)
    lines = proc.stderr.strip().splitlines()
    assert "Traceback" not in proc.stderr
    if change is as_words or proc.returncode != 0:
        assert proc.returncode == 2 and len(lines) == 1 and str(path) in lines[0], proc.stderr
    assert path.read_bytes() == before
    if change is as_digits and proc.returncode == 0:
        (tmp_path / "committed").mkdir()
        shutil.copy(os.path.join(FIGURES, name), tmp_path / "committed" / name)
        assert run(script, *args, "--replot", tmp_path / "committed" / name).returncode == 0
        assert pngs(tmp_path / "changed") == pngs(tmp_path / "committed")
