"""The command line as a new user meets it: every bad input is one line on stderr and exit code 2, with
nothing created; a run directory is never clobbered; a diverging run stops; the shared flags are spelled
the same in every script (plumbing/cli.py). Each script's main() runs in this process as its `__main__` does
(through cli.run), which is ~5x faster than a subprocess per case; one test runs real processes."""
import argparse
import fcntl
import json
import math
import os
import re
import signal
import subprocess
import sys
from types import SimpleNamespace

import matplotlib
import numpy as np
import pytest
import torch

import evaluation
import train
from analysis import runs
from engine import ensemble
from plumbing import cli, rundir
from plumbing.style import COLORS
from runners import grids
from stand_ins import ROOT, assert_one_line_error, load, run  # noqa: F401 (run: a fixture)

TINY = ["--K", "4", "--iters", "3", "--N", "8", "--batch", "4", "--evals", "2", "--eval-train", "8", "--eval-gen", "8"]



def test_as_processes_bad_input_is_one_line_and_help_starts_nothing(tmp_path):
    """The real thing once: `python train.py --D 0` and `python bench/bench_data.py --help` as processes."""
    def process(script, *args):
        return subprocess.run([sys.executable, os.path.join(ROOT, script), *map(str, args)], cwd=tmp_path,
                              capture_output=True, text=True, timeout=120)
    assert_one_line_error(process("train.py", *TINY, "--D", "0"), "D must be")
    helped = process("bench/bench_data.py", "--help")
    assert helped.returncode == 0 and helped.stdout.startswith("usage:")
    assert os.listdir(tmp_path) == []


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("flags, words", [
    (["--D", "0"], ["D must be"]),
    (["--mlp-width", "-1"], ["mlp_width must be"]),
    (["--C", "1"], ["C must be"]),
    (["--device", "meta"], ["--device"]),
    (["--device", "foo"], ["--device"]),
    (["--lr", "inf"], ["lr must be finite"]),
    (["--lr", "nan"], ["lr must be finite"]),
    (["--beta2", "1"], ["beta2"]),
    (["--K", "99999999999999999999"], ["K must be <= 65536"]),
    (["--K", "65537"], ["K must be <= 65536"]),
    (["--seed", "-1"], ["--seed", "-1"]),
    (["--task-seed", "-1"], ["task_seed"]),
    (["--resume", "--overwrite"], ["exclude each other"]),
    (["--resume"], ["no checkpoint"]),
    (["--iter", "5"], ["unrecognized arguments: --iter 5"]),
    (["--i", "5"], ["unrecognized arguments: --i 5"]),
    (["--over"], ["unrecognized arguments: --over"]),
], ids=["D0", "mlp-width-neg", "C1", "meta", "foo", "lr-inf", "lr-nan", "beta2", "K-huge", "K-bound", "seed-neg", "task-seed-neg", "resume-overwrite",
        "resume-nothing", "abbrev-iter", "abbrev-i", "abbrev-over"])
def test_train_bad_input_creates_nothing(tmp_path, flags, words, run):
    out = tmp_path / "run"
    assert_one_line_error(run("train.py", *TINY, "--out", out, *flags), *words)
    assert not out.exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.parametrize("script, flags", [("train.py", [*TINY, "--out", "X"]), ("predictor_scaling.py", []), ("bench/bench_train.py", [])])
def test_cuda_without_a_gpu(tmp_path, script, flags, run):
    flags = [str(tmp_path / "run") if f == "X" else f for f in flags]
    assert_one_line_error(run(script, "--device", "cuda", *flags), "CUDA is not available")
    assert not (tmp_path / "run").exists()


def test_sweep_grid_of_K_0_prints_no_command(run):
    proc = run("sweep.py", "--K", "0", "--print-commands")
    assert_one_line_error(proc, "K must be")
    assert proc.stdout == ""


def test_plot_sweep_without_the_sweep_directory(tmp_path, run):
    assert_one_line_error(run("sweep.py", "--plot-only", "--out", tmp_path / "missing", "--figures", tmp_path / "figs"),
                          "no sweep directory")
    assert not (tmp_path / "missing").exists() and not (tmp_path / "figs").exists()


def bad_figures(tmp_path):
    """--figures values that cannot be a directory: under /proc (no directory can be made there) and a file."""
    afile = tmp_path / "afile"
    afile.write_text("not a directory")
    return ["/proc/forbidden", str(afile)]


@pytest.mark.parametrize("script, flags", [("predictor_scaling.py", []), ("sa_dynamics.py", []), ("sa_scaling.py", []),
                                           ("mem_minimal.py", []),
                                           ("sweep.py", ["--plot-only", "--out", "."]),
                                           ("k1.py", ["search", "--preset", "quick"]),
                                           ("k2.py", ["sweep", "--preset", "quick"]),
                                           ("task_vectors.py", ["--run", "missing-run"])])
@pytest.mark.parametrize("which", [0, 1])
def test_figures_directory_that_cannot_be_written(tmp_path, script, flags, which, run):
    path = bad_figures(tmp_path)[which]
    before = sorted(os.listdir(tmp_path))
    assert_one_line_error(run(script, *flags, "--figures", path, cwd=tmp_path), "--figures", path)
    assert sorted(os.listdir(tmp_path)) == before  # nothing created (no runs/, no figures/)


@pytest.mark.parametrize("script", ["predictor_scaling.py", "bench/bench_train.py"])
def test_unknown_device(script, run):
    assert_one_line_error(run(script, "--device", "foo"), "--device must be cpu, cuda or cuda:<i>")


@pytest.mark.parametrize("content, words", [("{", ["is not valid JSON"]), ('{"preset": "quick"}', ["lacks", "heatmap"]),
                                            ("[1, 2]", ["lacks"])])
def test_mem_minimal_replot_of_a_bad_json(tmp_path, content, words, run):
    (tmp_path / "mem_minimal.json").write_text(content)
    path = str(tmp_path / "mem_minimal.json")
    assert_one_line_error(run("mem_minimal.py", "--replot", "--figures", tmp_path), path, *words)
    assert not (tmp_path / "mem_heatmaps.png").exists()


@pytest.mark.parametrize("script, flags, words", [
    ("mem_minimal.py", ["--seeds", "2-1"], ["--seeds"]),
    ("k1.py", ["search", "--seeds", "x"], ["--seeds"]),
    ("k1.py", ["search", "--perturbed-seeds", "-1"], ["--perturbed-seeds"]),
    ("k2.py", ["sweep", "--seeds", "3-1"], ["--seeds"]),
    ("k2.py", ["sweep", "--jobs", "0"], ["--jobs"]),
    ("k2.py", ["sweep", "--preset", "paper", "--device", "cpu"], ["paper preset needs a GPU"]),
    ("k2.py", ["dtau", "no-such-dir"], ["no run directories"]),
    ("circuits.py", ["--seed", "-1"], ["--seed"]),
    ("circuits.py", ["--phases", "2gen,3gen"], ["--phases", "3gen"]),
    ("k1.py", ["ledger", "sweep_paper"], ["sweep_paper", "not a campaign this script draws", "k1_paper"]),
    ("k1.py", ["grid"], ["--K", "required", "--replot"]),
    ("k1.py", ["grid", "--replot", "missing.json"], ["--replot", "missing.json"]),
    ("sweep.py", ["--ledger", "k1_paper"], ["k1_paper", "not a campaign this script draws", "sweep_paper"]),
    ("sweep.py", ["--ledger", "sweep_paper"], ["no ledger ledgers/sweep_paper.json", "where the command runs"]),
    ("task_vectors.py", ["--ledger", "nothing"], ["nothing", "circuits_paper"]),
    ("bench/bench_data.py", ["--threads", "0"], ["--threads"]),
    ("bench/bench_attention.py", ["--compile-jobs", "0"], ["--compile-jobs"]),
    ("bench/bench_attention.py", ["--previous", "missing.py"], ["--previous"]),
    ("bench/bench_attention.py", ["--N", "300"], ["--N"]),
    ("bench/bench_attention.py", ["--sweep-kernels", "dq,skew"], ["--sweep-kernels"]),
    ("sa_dynamics.py", ["--jobs", "0"], ["--jobs"]),
    ("sa_scaling.py", ["--jobs", "0"], ["--jobs"]),
    ("tau_settings.py", ["--N", "1"], ["--N 1", "at least 2"]),
    ("tau_velocities.py", ["--models", "sa,x"], ["--models", "'sa,x'"]),
    ("tau_velocities.py", ["--N", "48"], ["--N", "'48'"]),
    ("tau_settings.py", ["--settings", "record", "--N", "512x"], ["--N", "'512x' cannot be read"]),
    # abbreviated flags (values that fail fast should an abbreviation be taken for the flag again)
    ("k2.py", ["sweep", "--see", "x"], ["unrecognized arguments: --see x"]),  # a sub-command's flags too
    ("mem_minimal.py", ["--seed", "2-1"], ["unrecognized arguments: --seed 2-1"]),  # --seeds
    ("bench/bench_data.py", ["--thread", "0"], ["unrecognized arguments: --thread 0"]),
])
def test_other_scripts_bad_input(tmp_path, script, flags, words, run):
    assert_one_line_error(run(script, *flags, cwd=tmp_path), *words)
    assert os.listdir(tmp_path) == []


# ----------------------------------------------------------------------------- run directories


def tiny_run(run, out):
    proc = run("train.py", *TINY, "--out", out)
    assert proc.returncode == 0, proc.stderr
    return proc


def test_a_run_refuses_a_directory_holding_a_run_and_resume_or_overwrite_reuse_it(tmp_path, same_numbers, run):
    out = tmp_path / "run"
    first = tiny_run(run, out)
    lines = first.stdout.splitlines()
    assert lines[0].startswith("preset quick: 3 steps") and lines[1].startswith(f"writing {out}/")
    metrics = (out / "metrics.jsonl").read_text()
    (out / "model_0000999.pt").write_text("left by an older run")
    assert_one_line_error(run("train.py", *TINY, "--out", out), "already holds a run", "--resume", "--overwrite")
    assert (out / "metrics.jsonl").read_text() == metrics
    resumed = run("train.py", *TINY, "--out", out, "--resume")
    assert resumed.returncode == 0 and "already complete" in resumed.stdout
    assert run("train.py", *TINY, "--out", out, "--overwrite").returncode == 0
    assert not (out / "model_0000999.pt").exists()  # the old run's files are gone, not mixed in
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert same_numbers(rows, [json.loads(line) for line in metrics.splitlines()])  # the same seed, the same run


def test_a_run_stopped_before_its_first_checkpoint_is_started_afresh_by_the_same_command(tmp_path, run):
    """Such a directory has nothing to resume: every message says so, and the same command reuses it (its files
    removed, not mixed in); --resume names the missing checkpoint."""
    out = tmp_path / "run"
    out.mkdir()
    (out / "config.json").write_text("{}")
    (out / "metrics.jsonl").write_text('{"step": 0, "left": "by a run killed in its set-up"}\n')
    (out / "model_0000999.pt").write_text("left by that run")
    assert_one_line_error(run("train.py", *TINY, "--out", out, "--resume"), "no checkpoint", "nothing to resume")
    assert "before the first checkpoint: nothing to resume; the same command starts afresh" in str(
        rundir.interrupted(0, str(out / "ckpt.pt")))
    assert tiny_run(run, out).returncode == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert "left" not in rows[0] and rows[-1]["step"] == 3 and not (out / "model_0000999.pt").exists()
    assert str(rundir.interrupted(5, str(out / "ckpt.pt"))) == f"interrupted at step 5; --resume continues from step 3 ({out / 'ckpt.pt'})"
    assert_one_line_error(run("train.py", *TINY, "--out", out), "already holds a run")  # now it has a checkpoint


def test_replot_redraws_a_runs_fig2a_from_its_json(tmp_path, run):
    (tmp_path / "fig2a_K16.json").write_bytes(open(os.path.join(ROOT, "figures", "fig2a_K16.json"), "rb").read())
    proc = run("train.py", "--replot", tmp_path / "fig2a_K16.json")
    assert proc.returncode == 0 and (tmp_path / "fig2a_K16.png").exists() and "wrote" in proc.stdout
    (tmp_path / "bad.json").write_text('{"rows": []}')
    assert_one_line_error(run("train.py", "--replot", tmp_path / "bad.json"), "lacks config")
    assert not (tmp_path / "bad.png").exists()


def test_a_grid_refuses_before_starting_any_process(tmp_path, run):
    tiny_run(run, tmp_path / "K5_s0")
    proc = run("sweep.py", *TINY[2:], "--K", "4,5", "--out", tmp_path)
    assert_one_line_error(proc, "K5_s0 already holds a run")
    assert not (tmp_path / "K4_s0").exists()


def test_a_live_run_directory_is_locked_and_a_dead_lock_is_none(tmp_path, run):
    out = tmp_path / "run"
    tiny_run(run, out)
    with open(out / ".lock", "w") as held:  # a live process training there
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert_one_line_error(run("train.py", *TINY, "--out", out, "--resume"), "another process is training")
    # the lock file stays; its lock died with its holder (flock: as after kill -9)
    assert (out / ".lock").exists()
    assert run("train.py", *TINY, "--out", out, "--resume").returncode == 0


def test_resume_of_a_finished_run_says_so_and_rewrites_nothing(tmp_path, run):
    out = tmp_path / "run"
    tiny_run(run, out)
    files = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in out.iterdir() if p.name != ".lock"}
    proc = run("train.py", *TINY, "--out", out, "--resume")
    assert proc.returncode == 0 and proc.stderr == ""
    assert proc.stdout.splitlines() == [f"{out} is already complete (3 steps, {out / 'ckpt.pt'}); nothing to do"]
    assert {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in out.iterdir() if p.name != ".lock"} == files


CTRL_C = ["--K", "4", "--iters", "12", "--N", "8", "--batch", "4", "--evals", "3", "--eval-train", "8", "--eval-gen", "8",
          "--ckpt-every", "4"]  # evaluations at 0, 2, 5, 12; checkpoints at 2, 4, 5, 8, 12


def test_ctrl_c_is_one_line_exit_130_and_resume_continues_exactly(tmp_path, monkeypatch, run, same_numbers):
    """Ctrl-C during the 7th optimizer step (step 6 of 12): one line that says where, exit 130, ckpt.pt as the
    step-5 checkpoint left it; --resume then finishes the run with the numbers of an uninterrupted one."""
    straight = tmp_path / "straight"
    assert run("train.py", *CTRL_C, "--out", straight).returncode == 0
    out = tmp_path / "run"
    step, calls, seen = torch.optim.AdamW.step, [], {}

    def ctrl_c(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 7:
            seen["ckpt"] = (out / "ckpt.pt").read_bytes()
            raise KeyboardInterrupt
        return step(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.AdamW, "step", ctrl_c)
    try:
        proc = run("train.py", *CTRL_C, "--out", out)
    except KeyboardInterrupt:  # not handled by cli.run: fail this test, not the whole session
        pytest.fail("Ctrl-C escaped cli.run")
    assert proc.returncode == 130 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [f"interrupted at step 6; --resume continues from step 5 ({out / 'ckpt.pt'})"]
    assert (out / "ckpt.pt").read_bytes() == seen["ckpt"] and torch.load(out / "ckpt.pt", weights_only=True)["step"] == 5
    monkeypatch.setattr(torch.optim.AdamW, "step", step)
    assert run("train.py", *CTRL_C, "--out", out, "--resume").returncode == 0
    read = lambda d: [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]  # noqa: E731
    assert same_numbers(read(out), read(straight))


def interrupt_at(moment: str, monkeypatch):
    """Make the next train.py run raise KeyboardInterrupt (Ctrl-C) at `moment`."""
    calls = []

    def once(original, when=lambda *a, **k: True):
        def wrapped(*args, **kwargs):
            if when(*args, **kwargs) and not calls:
                calls.append(moment)
                if moment == "the first checkpoint, just written":
                    original(*args, **kwargs)
                raise KeyboardInterrupt
            return original(*args, **kwargs)
        return wrapped

    if moment == "the set-up":
        monkeypatch.setattr(evaluation, "make_eval_data", once(evaluation.make_eval_data))
    elif moment == "the first evaluation":
        monkeypatch.setattr(train, "evaluate", once(train.evaluate))
    elif moment == "the first checkpoint, just written":
        monkeypatch.setattr(rundir, "save_atomic", once(rundir.save_atomic, lambda obj, path: path.endswith("ckpt.pt")))
    else:  # between evaluations: the 4th optimizer step, step 3 (evaluations at 0, 2, 5, 12)
        steps = []
        monkeypatch.setattr(torch.optim.AdamW, "step", once(torch.optim.AdamW.step, lambda *a, **k: steps.append(1) or len(steps) == 4))


@pytest.mark.parametrize("moment, says", [
    ("the set-up", "interrupted during the set-up, before the first checkpoint"),
    ("the first evaluation", "interrupted at step 0, before the first checkpoint"),
    ("the first checkpoint, just written", "interrupted at step 2; --resume continues from step 2"),
    ("between evaluations", "interrupted at step 3; --resume continues from step 2")])
def test_what_an_interrupt_says_is_what_is_on_disk(tmp_path, monkeypatch, run, moment, says):
    """Whatever the moment of Ctrl-C, its one line agrees with the disk, and so does the next command: a checkpoint
    named is there with that step, and --resume continues from it (the same command alone refuses); with none, the
    same command starts afresh, and the directory the run created is gone whether the set-up or the first
    evaluation was under way; no .lock is left."""
    out = tmp_path / "run"
    interrupt_at(moment, monkeypatch)
    proc = run("train.py", *CTRL_C, "--out", out)
    monkeypatch.undo()
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 130 and len(lines) == 1 and lines[0].startswith(says), proc.stderr
    if "before the first checkpoint" in says:  # one behaviour: nothing to resume, so nothing left, the directory gone
        assert lines[0].endswith("nothing to resume; the same command starts afresh")
        assert not out.exists()
    else:
        assert not (out / ".lock").exists()
        assert torch.load(out / "ckpt.pt", weights_only=True)["step"] == int(says.split()[-1])
        assert_one_line_error(run("train.py", *CTRL_C, "--out", out), "already holds a run: --resume continues it")
    again = run("train.py", *CTRL_C, "--out", out, *(["--resume"] if "--resume" in says else []))
    assert again.returncode == 0, again.stderr


def test_sigterm_says_what_ctrl_c_says_and_exits_143(tmp_path, monkeypatch, run):
    """SIGTERM (kill, a scheduler) during the 4th optimizer step: the same one line as Ctrl-C's, read from the disk,
    exit 143; the process's own SIGTERM handler is back after cli.run; --resume then finishes the run."""
    out, step, calls = tmp_path / "run", torch.optim.AdamW.step, []

    def term(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 4:
            os.kill(os.getpid(), signal.SIGTERM)  # the handler raises at the next bytecode, here in this step
        return step(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.AdamW, "step", term)
    before = signal.getsignal(signal.SIGTERM)
    proc = run("train.py", *CTRL_C, "--out", out)
    assert signal.getsignal(signal.SIGTERM) is before
    monkeypatch.undo()
    assert proc.returncode == 143 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [f"interrupted at step 3; --resume continues from step 2 ({out / 'ckpt.pt'})"]
    assert not (out / ".lock").exists()
    assert run("train.py", *CTRL_C, "--out", out, "--resume").returncode == 0


def test_a_finished_run_leaves_no_lock_and_a_lock_taken_on_a_removed_file_is_taken_again(tmp_path, monkeypatch):
    """A run removes OUT/.lock as it ends; a process whose flock landed on a .lock file removed meanwhile (the path
    now another file, or none) opens the path again, so two processes never both hold 'the' lock."""
    out = tmp_path / "run"
    train.train(tiny_config(out), quiet=True)
    assert out.exists() and not (out / ".lock").exists()
    flock, calls = fcntl.flock, []

    def racing(f, op):  # the holder's run ends between our open and our flock: it removes the file we opened
        flock(f, op)
        calls.append(os.fstat(f.fileno()).st_ino)
        if len(calls) == 1:
            os.remove(out / ".lock")
    monkeypatch.setattr(fcntl, "flock", racing)
    lock = rundir.open_run_dir(str(out), resume=True)
    assert len(calls) == 2  # taken twice: the first file was gone
    assert os.fstat(lock.fileno()).st_ino == os.stat(out / ".lock").st_ino
    rundir.release_run_dir(lock)
    assert not (out / ".lock").exists()


def strict_rows(path) -> list[dict]:
    """The JSON lines at path, refusing NaN and infinities (not JSON, though Python's json reads them)."""
    def refuse(token):
        raise ValueError(f"{token} in {path}")
    return [json.loads(line, parse_constant=refuse) for line in open(path)]


def test_an_evaluation_that_overflows_stops_the_run_before_its_row_and_checkpoint(tmp_path, monkeypatch):
    """Weights large but finite (loss finite) whose evaluation is NaN, as --lr 1e6 gives at step 2: the run stops at
    that evaluation, writes neither the row nor that step's checkpoint or model, and says which checkpoint is left;
    the rows stay strict JSON. Evaluations at 0, 2, 5, 12 (CTRL_C's), checkpoints at 2, 4, 5, 8, 12: NaN at 5."""
    evaluate = train.evaluate

    def overflowing(model, data):
        row = evaluate(model, data)
        if len(strict_rows(tmp_path / "run" / "metrics.jsonl")) == 2:  # the third evaluation, step 5
            row = {**row, "gen_loss": float("nan"), "phi_beta_2": float("inf")}
        return row
    monkeypatch.setattr(train, "evaluate", overflowing)
    with pytest.raises(ValueError, match=r"non-finite evaluation \(gen_loss, phi_beta_2\) at step 5; stopped before "
                                         r"writing it \(.*ckpt.pt keeps step 4, the last finite state\)"):
        train.train(tiny_config(tmp_path / "run", ckpt_every=4), quiet=True)
    assert [r["step"] for r in strict_rows(tmp_path / "run" / "metrics.jsonl")] == [0, 2]
    assert torch.load(tmp_path / "run" / "ckpt.pt", weights_only=True)["step"] == 4
    assert not (tmp_path / "run" / "model_0000005.pt").exists()
    with pytest.raises(ValueError, match="Out of range float"):  # the last guard: no bare NaN token is ever written
        rundir.append_row(str(tmp_path / "rows.jsonl"), {"step": 1, "loss": float("nan")})


def test_an_enormous_learning_rate_stops_with_one_line_and_leaves_strict_json(tmp_path, run):
    proc = run("train.py", *TINY, "--lr", "1e6", "--out", tmp_path / "run")
    assert_one_line_error(proc, "training diverged", "stopped before writing it", "a lower --lr")
    rows = strict_rows(tmp_path / "run" / "metrics.jsonl")
    assert rows and all(math.isfinite(v) for r in rows for v in r.values() if isinstance(v, float))
    if (tmp_path / "run" / "ckpt.pt").exists():
        state = torch.load(tmp_path / "run" / "ckpt.pt", weights_only=True)["model"]
        assert all(v.isfinite().all() for v in state.values() if v.is_floating_point())


class Payload:
    """An object whose unpickling calls open(marker, "w"): code in a checkpoint, as a shared run directory could hold."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return open, (self.marker, "w")


def test_a_checkpoint_carrying_code_is_refused_unrun(tmp_path, run):
    """ckpt.pt and model_<step>.pt load with weights_only=True: a pickled object is a one-line error, exit 2,
    with nothing run: not its code (no marker file), not the training (the run's files unchanged)."""
    out = tmp_path / "run"
    tiny_run(run, out)
    ckpt = torch.load(out / "ckpt.pt", weights_only=True)
    torch.save({**ckpt, "step": 2, "note": Payload(tmp_path / "marker")}, out / "ckpt.pt")
    files = {p.name: p.read_bytes() for p in out.iterdir() if p.name != ".lock"}
    assert_one_line_error(run("train.py", *TINY, "--out", out, "--resume"), str(out / "ckpt.pt"), "pickled object")
    assert not (tmp_path / "marker").exists()
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.name != ".lock"} == files
    torch.save({"weights": Payload(tmp_path / "marker")}, out / "model_0000003.pt")
    with pytest.raises(ValueError, match="pickled object"):
        runs.load_run(str(out))
    assert not (tmp_path / "marker").exists()


@pytest.mark.parametrize("content, words", [("garbage", ["not a complete torch checkpoint", "Weights only load failed)"]),
                                            ("truncated", ["truncated", "failed finding central directory)"]),
                                            (None, ["lacks", "model"])])
def test_resume_on_a_corrupt_checkpoint_says_what_is_wrong(tmp_path, content, words, run):
    """One line, torch's message quoted to the end of its first sentence (not cut inside its advice)."""
    out = tmp_path / "run"
    tiny_run(run, out)
    whole = (out / "ckpt.pt").read_bytes()
    if content is None:
        torch.save({"step": 3}, out / "ckpt.pt")
    else:
        (out / "ckpt.pt").write_bytes(b"garbage" if content == "garbage" else whole[: len(whole) // 2])
    proc = run("train.py", *TINY, "--out", out, "--resume")
    assert_one_line_error(proc, str(out / "ckpt.pt"), *words)
    assert "internal miniz error" not in proc.stderr and "PyTorch 2.6" not in proc.stderr


def tiny_config(out, **kw):
    return train.Config(**{**dict(K=3, N=8, iters=12, batch=4, evals=3, eval_train=8, eval_gen=8, ckpt_every=4,
                                  out=str(out)), **kw})


@pytest.mark.parametrize("poison", ["loss", "weights"])
def test_a_diverging_run_stops_and_keeps_the_last_good_checkpoint(tmp_path, monkeypatch, poison):
    """An AdamW update sends the weights to NaN: after the 7th, the loss of step 8 is NaN; after the 8th, step 8's
    loss (computed before it) is finite and only the weights are NaN. Either way the run stops at step 8 (a
    checkpoint step) with a message, before writing a NaN row or checkpoint; ckpt.pt keeps step 5 (evaluations
    at 0, 2, 5, 12; checkpoints also every 4 steps), all finite."""
    step, calls = torch.optim.AdamW.step, []

    def poisoned(self, *args, **kwargs):
        out = step(self, *args, **kwargs)
        calls.append(1)
        if len(calls) == (7 if poison == "loss" else 8):
            with torch.no_grad():
                self.param_groups[0]["params"][0].fill_(float("nan"))
        return out

    monkeypatch.setattr(torch.optim.AdamW, "step", poisoned)
    cfg = tiny_config(tmp_path / "run")
    with pytest.raises(ValueError, match=f"diverged.*non-finite {poison}.*step 8"):
        train.train(cfg, quiet=True)
    ckpt = torch.load(tmp_path / "run" / "ckpt.pt", weights_only=True)
    assert ckpt["step"] == 5 and all(v.isfinite().all() for v in ckpt["model"].values() if v.is_floating_point())
    rows = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    assert [r["step"] for r in rows] == [0, 2, 5] and all(r["train_loss"] == r["train_loss"] for r in rows)


def test_progress_at_least_every_PROGRESS_SECONDS(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(rundir, "PROGRESS_SECONDS", 0)  # every step is 'late'
    train.train(tiny_config(tmp_path / "run"))
    steps = [line.split()[1] for line in capsys.readouterr().out.splitlines() if line.startswith("step")]
    assert steps == [f"{s}/12" for s in range(1, 13)]


@pytest.mark.parametrize("members", [1, 2])
def test_the_rate_starts_after_the_set_up(tmp_path, monkeypatch, capsys, members):
    """Set-up before the first step (here 1000 s of evaluation data on rundir.py's clock) is not in the rate, of a
    single run or of an ensemble (a GPU run's compilation and graph capture once made its first ETA ~300x too long)."""
    clock = [0.0]

    def tick():
        clock[0] += 0.01
        return clock[0]

    def slow(*args, **kwargs):
        clock[0] += 1000
        return make_eval_data(*args, **kwargs)

    make_eval_data = evaluation.make_eval_data
    monkeypatch.setattr(rundir, "time", SimpleNamespace(time=tick))
    monkeypatch.setattr(evaluation, "make_eval_data", slow)  # the single run's and every member's (held_out_sets)
    monkeypatch.setattr(rundir, "PROGRESS_SECONDS", 0)
    if members == 1:
        train.train(tiny_config(tmp_path / "run"))
    else:
        cfgs = [tiny_config(tmp_path / f"K3_s{seed}", seed=seed) for seed in range(members)]
        grids.train_ensemble(cfgs, str(tmp_path / "ckpt.pt"))
    rates = [float(re.search(r"([\d.]+) (it|model-steps)/s", line)[1]) for line in capsys.readouterr().out.splitlines()
             if line.startswith("step")]
    assert len(rates) == 12 and min(rates) > 1  # 1000 s counted in: < 0.03 steps/s


@pytest.mark.parametrize("members", [1, 2])
def test_the_last_line_says_where_the_time_went(tmp_path, monkeypatch, capsys, members):
    """On rundir.py's clock: 1000 s of evaluation data (set-up), 100 s per dense readout (eval_every = 4: steps 0, 4,
    8, 12), 10 s per full evaluation of a model (steps 0, 2, 5, 12), 3 s per file saved (each evaluation's
    model_<step>.pt, and the checkpoints at 2, 4, 5, 8, 12: counted with the evaluations, not in the steps' rate),
    7 s per figure written after the loop, and 0.01 s per reading of the clock: the last line splits the time into
    those phases, the steps' time being the rest of the loop (a campaign's log shows this for every ensemble, to find
    what a piece's fixed cost is)."""
    clock = [0.0]

    def tick():
        clock[0] += 0.01
        return clock[0]

    def costing(fn, seconds):
        def slow(*args, **kwargs):
            clock[0] += seconds
            return fn(*args, **kwargs)
        return slow

    monkeypatch.setattr(rundir, "time", SimpleNamespace(time=tick))
    monkeypatch.setattr(evaluation, "make_eval_data", costing(evaluation.make_eval_data, 1000))  # once: the members share K = 3
    monkeypatch.setattr(train, "evaluate", costing(train.evaluate, 10))
    monkeypatch.setattr(train, "plot_run", costing(train.plot_run, 7))
    monkeypatch.setattr(rundir, "save_atomic", costing(rundir.save_atomic, 3))
    if members == 1:
        monkeypatch.setattr(train, "dense_readouts", costing(train.dense_readouts, 100))
        train.train(tiny_config(tmp_path / "run", eval_every=4))
    else:
        monkeypatch.setattr(ensemble.Ensemble, "dense_readouts", costing(ensemble.Ensemble.dense_readouts, 100))
        grids.train_ensemble([tiny_config(tmp_path / f"K3_s{seed}", seed=seed, eval_every=4) for seed in range(members)],
                            str(tmp_path / "ckpt.pt"))
    last = capsys.readouterr().out.splitlines()[-1]
    phases = {name: float(value) for name, value in re.findall(r"([a-z-]+) (\d+) s", last)}
    assert phases.keys() == {"set-up", "steps", "readouts", "evaluations", "writing"}
    want = {"set-up": 1000, "steps": 0, "readouts": 400, "evaluations": 40 * members + 3 * (4 * members + 5),
            "writing": 7 * members + (3 * members if members > 1 else 0)}  # an ensemble ends with each member's ckpt.pt
    assert all(abs(phases[name] - want[name]) <= 2 for name in want), (last, want)


def test_eta_is_the_step_rate_without_evaluations_plus_the_evaluations_left():
    """100 steps in 30 s of which 20 s were 4 evaluations: 10 steps/s; 900 steps and 6 evaluations left
    take 90 s + 6 x 5 s (folded into one rate, the evaluations would make it 270 s)."""
    assert rundir.progress_rate(100, 900, 30.0, 20.0, 4, 6) == pytest.approx((10.0, 120.0))


def test_fig2a_panels_each_have_a_legend_below_and_step_0_at_0(tmp_path, monkeypatch):
    figs = []
    monkeypatch.setattr(train.plt, "close", figs.append)
    rows = train.train(tiny_config(tmp_path / "run"), quiet=True)
    axes = figs[-1].axes
    assert rows[0]["step"] == 0 and len(axes) == 4
    for ax in axes:
        assert ax.get_legend() is not None and ax.get_legend().get_bbox_to_anchor().y0 < ax.get_window_extent().y0
        assert ax.get_xscale() == "symlog" and ax.get_xlim()[0] == 0



def synthetic_rows(iters: int, levels: dict[str, float]) -> list[dict]:
    """Metrics rows of a run of `iters` steps whose predictor levels on both splits are `levels`."""
    rows = []
    for i, step in enumerate(train.eval_steps(iters, 40)):
        row = {"step": step, "train_loss": 2.9 - 0.01 * i, "gen_loss": 2.9 - 0.01 * i, "phi_delta_1": 0.1,
               "phi_beta_2": 0.2, "n_A_1": 10.0, "n_A_2": 20.0}
        for name, level in levels.items():
            row.update({f"train_loss_{name}": level, f"gen_loss_{name}": level, f"kl_{name}": 0.1})
        rows.append(row)
    return rows


def test_fig2a_coinciding_predictor_levels_both_show(tmp_path, monkeypatch):
    """On fresh chains 1-Gen and 1-Mem have nearly the same loss (~2.32): both levels must stay visible, in
    their own colours, where they coincide exactly."""
    figs = []
    monkeypatch.setattr(train.plt, "close", figs.append)
    cfg = tiny_config(tmp_path)
    train.plot_run(synthetic_rows(2000, {"1gen": 2.32, "2gen": 2.1, "1mem": 2.32, "2mem": 1.9}), cfg, str(tmp_path / "f.png"))
    fig = figs[-1]
    fig.canvas.draw()
    pixels = np.asarray(fig.canvas.buffer_rgba())[..., :3].astype(int)
    x0, y0, x1, y1 = fig.axes[1].get_window_extent().extents.astype(int)  # the L_gen panel; rows count from the top
    panel = pixels[pixels.shape[0] - y1 : pixels.shape[0] - y0, x0:x1]
    for name in ("1gen", "1mem"):
        colour = (np.array(matplotlib.colors.to_rgb(COLORS[name])) * 255).astype(int)
        assert (np.abs(panel - colour).max(-1) <= 8).sum() > 100, name


@pytest.mark.parametrize("iters", [300, 2000, 10**6])
def test_fig2a_step_tick_labels_stand_apart(tmp_path, monkeypatch, iters):
    """The symlog step axis puts step 0 at x = 0, 0.3 decades before step 1: at 10^6 steps a "10^0" label
    touched the "0". Neighbouring labels are at least a font size apart, and step 0 keeps its label."""
    figs = []
    monkeypatch.setattr(train.plt, "close", figs.append)
    train.plot_run(synthetic_rows(iters, {"1gen": 2.3, "2gen": 2.1}), tiny_config(tmp_path), str(tmp_path / "f.png"))
    fig = figs[-1]
    fig.canvas.draw()
    for ax in fig.axes:
        left, right = ax.get_window_extent().x0, ax.get_window_extent().x1
        labels = [(t.get_window_extent(), t.get_text()) for t in ax.get_xticklabels()]
        labels = sorted([(box, text) for box, text in labels if text and left - 1 <= (box.x0 + box.x1) / 2 <= right + 1],
                        key=lambda box_text: box_text[0].x0)  # the labels drawn: their ticks inside the axis
        assert labels[0][1] == "$\\mathdefault{0}$" and len(labels) >= 3
        font = ax.get_xticklabels()[0].get_fontsize() * fig.dpi / 72  # in pixels
        assert all(b.x0 - a.x1 >= font for (a, _), (b, _) in zip(labels, labels[1:])), [t for _, t in labels]

# ----------------------------------------------------------------------------- one convention


SHARED = {
    "train.py": ["--preset", "--device", "--threads", "--seed", "--out", "--overwrite"],
    "sweep.py": ["--preset", "--device", "--threads", "--jobs", "--seeds", "--figures", "--out", "--overwrite"],
    "predictor_scaling.py": ["--preset", "--device", "--threads", "--figures"],
    "sa_dynamics.py": ["--preset", "--threads", "--jobs", "--figures"],
    "sa_scaling.py": ["--preset", "--threads", "--jobs", "--figures"],
    "mem_minimal.py": ["--preset", "--threads", "--jobs", "--seeds", "--figures"],
    "k1.py search": ["--preset", "--device", "--threads", "--jobs", "--seeds", "--perturbed-seeds", "--figures", "--root"],
    "k2.py sweep": ["--preset", "--device", "--threads", "--jobs", "--seeds", "--figures", "--root"],
    "circuits.py": ["--threads", "--figures", "--seed"],
    "task_vectors.py": ["--threads", "--figures", "--seed"],
    "bench/bench_train.py": ["--preset", "--device", "--threads"],
    "bench/bench_data.py": ["--threads"],
    "bench/bench_attention.py": ["--sweep", "--compile-jobs", "--write-tiles", "--previous"],
}


@pytest.mark.parametrize("command", sorted(SHARED))
def test_help_lists_the_shared_flags_with_their_help_and_starts_nothing(tmp_path, command, run):
    script, *sub = command.split()
    proc = run(script, *sub, "--help", cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout.startswith("usage:") and os.listdir(tmp_path) == []
    for flag in SHARED[command]:
        assert f"  {flag} " in proc.stdout, flag
    text = " ".join(proc.stdout.split())
    for flag, words in (("--jobs", "(default: 2)"), ("--figures", "(default: figures)"), ("--seed", "(default: 0)"),
                        ("--preset", "default paper on CUDA, quick otherwise"), ("--seeds", "seed values, e.g. 0-15")):
        if flag in SHARED[command]:
            assert words in text, (flag, words)


def test_train_help_gives_every_field_its_default_or_preset_values(run):
    text = " ".join(run("train.py", "--help").stdout.split())
    assert "--eval-train EVAL_TRAIN held-out sequences from S (0: 8 K, at most 8192, the paper's choice) (quick 512, paper 0)" in text
    assert "--iters ITERS optimizer steps (quick 2000, paper 1000000)" in text
    assert "--lr LR AdamW learning rate (default 0.001)" in text


def test_the_sweep_figure_goes_to_figures(tmp_path, run):
    tiny_run(run, tmp_path / "sweep" / "K4_s0")
    proc = run("sweep.py", "--plot-only", "--out", tmp_path / "sweep", "--figures", tmp_path / "figs")
    assert proc.returncode == 0, proc.stderr
    assert sorted(os.listdir(tmp_path / "figs")) == ["fig2bc.json", "fig2bc.png"]


@pytest.mark.parametrize("field", ["seed", "task_seed"])
def test_make_config_rejects_negative_seeds_from_library_callers(field):
    """analysis/thresholds.py and others build configs through make_config without the command line's parse_list."""
    values = {f.name: None for f in train.fields(train.Config)}
    with pytest.raises(ValueError, match=f"{field} must be an integer >= 0"):
        train.make_config(argparse.Namespace(**{**values, "preset": "quick", field: -1}))


@pytest.mark.parametrize("script, first_call, words", [
    ("predictor_scaling.py", "scaling_with_K", "preset quick: K to 4096, N to 8192, 8 task distributions, 256 sequences, on cpu; "
                                               "~39-82 min of CPU time, ~1.0-2.1 h on 2 cores shared with other jobs; writing"),
    ("sa_dynamics.py", "F_d", "preset quick: dynamics at N = 64, landscapes at N = 64 and 256, 2 processes; writing"),
])
def test_figure_scripts_say_their_preset_before_computing(tmp_path, monkeypatch, run, script, first_call, words):
    def stop(*args, **kwargs):
        raise ValueError("stopped before computing")
    monkeypatch.setattr(load(script), first_call, stop)
    proc = run(script, "--preset", "quick", "--figures", tmp_path)
    assert proc.stdout.startswith(words) and "stopped before computing" in proc.stderr


def test_estimators_leaves_scipy_to_the_fit_that_needs_it():
    """analysis/estimators.py imports scipy.optimize in fit_sigmoid, not at its top: ~0.6 s of k1.py's, k2.py's and
    sa_scaling.py's --help (a fresh interpreter: this one has scipy already)."""
    code = "import sys; from analysis import estimators; sys.exit('scipy.optimize' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT).returncode == 0


def _square(x):
    return x * x


def test_parallel_map_keeps_the_order_and_reports_progress(capsys):
    assert cli.parallel_map(_square, range(5), 2, progress="squares") == [0, 1, 4, 9, 16]
    assert "squares: 5/5 done" in capsys.readouterr().out
    assert cli.parallel_map(_square, [3], 1) == [9] and capsys.readouterr().out == ""
    seen = []
    assert cli.parallel_map(_square, [4, 2, 3], 2, on_result=lambda job, result: seen.append((job, result))) == [16, 4, 9]
    assert seen == [(4, 16), (2, 4), (3, 9)]  # each job with its result, in order, as they come in


def test_a_redraw_reads_numeric_text_as_numbers_and_other_text_is_one_line(tmp_path):
    """Under cli.drawing, matplotlib draws no category: "0.5" and "0.7" sit at x = 0.5 and 0.7 (as categories they
    would sit at 0 and 1); a word is a ValueError naming the file; afterwards categories work again."""
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots()
    with cli.drawing(str(tmp_path / "f.json"), "x.py"):
        line, = ax.plot(["0.5", "0.7"], [1.0, 2.0])
        fig.canvas.draw()
    assert np.allclose(np.asarray(line.get_xydata())[:, 0], [0.5, 0.7])
    with pytest.raises(ValueError, match=r"--replot: .*f.json does not hold what x.py draws \(ValueError: .*; rerun x.py"):
        with cli.drawing(str(tmp_path / "f.json"), "x.py"):
            ax.plot(["a", "b"], [1.0, 2.0])
            fig.canvas.draw()
    _, other = plt.subplots()
    line, = other.plot(["a", "b"], [1.0, 2.0])
    assert np.allclose(np.asarray(line.get_xydata())[:, 0], [0, 1])
    plt.close("all")


@pytest.mark.parametrize("loadavg, busy, threads", [("0.10 0.20 0.30 1/140 123", 0, 3), ("2.00 1.50 1.00 2/140 123", 1, 2),
                                                   ("3.00 3.00 3.00 4/140 123", 3, 1), ("0.0 0.0 0.0 9/140 1", 8, 1)])
def test_the_default_threads_leave_the_busy_cores_alone(tmp_path, monkeypatch, loadavg, busy, threads):
    """busy_cores: the runnable threads of /proc/loadavg's fourth field less this process (not the lagging averages
    in front of it); set_threads(None): torch's one per core (here 3) less those, at least one; --threads wins."""
    source = tmp_path / "loadavg"
    source.write_text(loadavg + "\n")
    assert cli.busy_cores(source=str(source), every=0) == busy
    assert cli.busy_cores(source=str(tmp_path / "none")) == 0  # no /proc: as if idle
    before = torch.get_num_threads()
    try:
        monkeypatch.setattr(cli, "TORCH_THREADS", 3)
        monkeypatch.setattr(cli, "busy_cores", lambda: busy)
        cli.set_threads(None)
        assert torch.get_num_threads() == threads
        cli.set_threads(None)  # a second call counts from torch's default again, not from the first call's
        assert torch.get_num_threads() == threads
        cli.set_threads(2)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


# ----------------------------------------------------------------------------- what a default run costs

HELPED = ["train.py", "sweep.py", "circuits.py", "task_vectors.py", "k1.py", "k1.py search", "k1.py grid",
          "k2.py", "k2.py sweep", "k2.py dtau", "sa_dynamics.py", "sa_scaling.py", "tau_settings.py",
          "tau_velocities.py", "mem_minimal.py", "predictor_scaling.py", "campaigns", "campaigns status", "campaigns run",
          "campaigns call", "k1.py ledger"]


@pytest.mark.parametrize("command", HELPED)
def test_help_ends_with_how_long_the_default_run_takes_and_what_it_writes(tmp_path, monkeypatch, capsys, command, run):
    """--help's last paragraph: "Default run: <a time> ...; writes <a path> ...". `python -m campaigns --help` once
    as a process (its usage names campaigns, not __main__.py); its commands here, with the argv[0] that -m gives."""
    script, *sub = command.split()
    if command == "campaigns":
        proc = subprocess.run([sys.executable, "-m", "campaigns", "--help"], cwd=ROOT, capture_output=True, text=True,
                              timeout=120)
    elif script == "campaigns":
        from campaigns import campaign
        monkeypatch.setattr(sys, "argv", [os.path.join(ROOT, "campaigns", "__main__.py"), *sub, "--help"])
        capsys.readouterr()
        with pytest.raises(SystemExit) as stop:
            cli.run(campaign.main)
        proc = SimpleNamespace(returncode=stop.value.code, stdout=capsys.readouterr().out)
    else:
        proc = run(script, *sub, "--help", cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout.startswith("usage: "), proc
    if script == "campaigns":
        assert proc.stdout.startswith(f"usage: {command} "), proc.stdout.splitlines()[0]
    last = " ".join(proc.stdout.strip().split("\n\n")[-1].split())
    assert re.match(r"Default run: .*?\b\d+(\.\d+)? (s|min|h)\b", last), last
    assert re.search(r"\bwrites\b.*?[\w.<>*-]+/[\w.<>*-]", last), last


def test_output_piped_into_a_reader_that_stops_early_ends_quietly():
    """`script | head -1`: the reader closes the pipe, the next print fails; cli.run exits 141 with nothing on stderr
    (Python would print a BrokenPipeError traceback, and another at exit for the unflushed output)."""
    code = "from plumbing import cli\n\ndef main():\n    for i in range(10**6):\n        print('line', i)\n\ncli.run(main)\n"
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout.readline() == b"line 0\n"
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=60) == 141 and err == b"", err


@pytest.mark.parametrize("text, ok", [("3", True), (" 2 ", True), ("1", False), ("-4", False), ("2.0", False),
                                      ("1e3", False), ("", False), ("x", False)])
def test_at_least_takes_integers_from_its_minimum_up_written_in_digits(text, ok):
    """cli.at_least(2), an argparse type: 2 passes and 1 does not (>= , not >), digits only."""
    parse = cli.at_least(2)
    if ok:
        assert parse(text) == int(text)
    else:
        with pytest.raises(argparse.ArgumentTypeError, match=">= 2"):
            parse(text)


def test_write_json_leaves_the_previous_file_when_the_write_is_cut_short(tmp_path, monkeypatch):
    """rundir.write_json: the new JSON whole, or, killed before the rename (here: the rename fails), the old file as
    it was (a write straight to the path would have left the new text, or half of it)."""
    path = str(tmp_path / "x.json")
    rundir.write_json(path, {"a": [1, 2]}, indent=1)
    assert json.load(open(path)) == {"a": [1, 2]} and "\n" in open(path).read()

    def killed(src, dst):
        raise KeyboardInterrupt

    monkeypatch.setattr(rundir.os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        rundir.write_json(path, {"a": [3]})
    assert json.load(open(path)) == {"a": [1, 2]}
