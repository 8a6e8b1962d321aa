"""The command line as a new user meets it: every bad input is one line on stderr and exit code 2, with
nothing created; a run directory is never clobbered; a diverging run stops; the shared flags are spelled
the same in every script (cli.py). Each script's main() runs in this process as its `__main__` does
(through cli.run), which is ~5x faster than a subprocess per case; one test runs real processes."""
import argparse
import fcntl
import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch

import cli
import train

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ["--K", "4", "--iters", "3", "--N", "8", "--batch", "4", "--evals", "2", "--eval-train", "8", "--eval-gen", "8"]


def load(script):
    """The script as a module (bench/ scripts are not importable by name)."""
    name, path = os.path.splitext(os.path.basename(script))[0], os.path.join(ROOT, script)
    if getattr(sys.modules.get(name), "__file__", None) == path:  # not the standard library's trace
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[name] = module  # one module per script: what a test patches is what main() runs
    return module


class Result:
    def __init__(self, returncode, stdout, stderr):
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


@pytest.fixture
def run(monkeypatch, capsys):
    """run(script, *args, cwd=...): `python script args` as its __main__ runs it, in this process."""
    def call(script, *args, cwd=ROOT):
        module = load(script)
        monkeypatch.chdir(cwd)
        monkeypatch.setattr(sys, "argv", [script, *map(str, args)])
        capsys.readouterr()
        try:
            cli.run(lambda: module.main())
            code = 0
        except SystemExit as e:
            code = e.code or 0
        out, err = capsys.readouterr()
        return Result(code, out, err)
    return call


def assert_one_line_error(proc, *words):
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and len(lines) == 1, proc.stderr
    for word in words:
        assert word in lines[0], lines[0]


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
    (["--seed", "-1"], ["--seeds"]),
    (["--task-seed", "-1"], ["task_seed"]),
    (["--resume", "--overwrite"], ["exclude each other"]),
    (["--resume"], ["no checkpoint"]),
], ids=["D0", "mlp-width-neg", "C1", "meta", "foo", "lr-inf", "lr-nan", "beta2", "K-huge", "K-bound", "seed-neg", "task-seed-neg", "resume-overwrite",
        "resume-nothing"])
def test_train_bad_input_creates_nothing(tmp_path, flags, words, run):
    out = tmp_path / "run"
    assert_one_line_error(run("train.py", *TINY, "--out", out, *flags), *words)
    assert not out.exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.parametrize("script, flags", [("train.py", [*TINY, "--out", "X"]), ("bayes.py", []), ("bench/bench_train.py", [])])
def test_cuda_without_a_gpu(tmp_path, script, flags, run):
    flags = [str(tmp_path / "run") if f == "X" else f for f in flags]
    assert_one_line_error(run(script, "--device", "cuda", *flags), "CUDA is not available")
    assert not (tmp_path / "run").exists()


def test_sweep_grid_of_K_0_prints_no_command(run):
    proc = run("train.py", "--sweep", "--K", "0", "--print-commands")
    assert_one_line_error(proc, "K must be")
    assert proc.stdout == ""


def test_plot_sweep_without_the_sweep_directory(tmp_path, run):
    assert_one_line_error(run("train.py", "--plot-sweep", "--out", tmp_path / "missing", "--figures", tmp_path / "figs"),
                          "no sweep directory")
    assert not (tmp_path / "missing").exists() and not (tmp_path / "figs").exists()


def bad_figures(tmp_path):
    """--figures values that cannot be a directory: under /proc (no directory can be made there) and a file."""
    afile = tmp_path / "afile"
    afile.write_text("not a directory")
    return ["/proc/forbidden", str(afile)]


@pytest.mark.parametrize("script, flags", [("bayes.py", []), ("sa_transformer.py", []), ("mem_minimal.py", []),
                                           ("train.py", ["--plot-sweep", "--out", "."]),
                                           ("thresholds.py", ["k1", "--preset", "quick"]),
                                           ("thresholds.py", ["k2", "--preset", "quick"]),
                                           ("task_vectors.py", ["--run", "missing-run"])])
@pytest.mark.parametrize("which", [0, 1])
def test_figures_directory_that_cannot_be_written(tmp_path, script, flags, which, run):
    path = bad_figures(tmp_path)[which]
    before = sorted(os.listdir(tmp_path))
    assert_one_line_error(run(script, *flags, "--figures", path, cwd=tmp_path), "--figures", path)
    assert sorted(os.listdir(tmp_path)) == before  # nothing created (no runs/, no figures/)


@pytest.mark.parametrize("script", ["bayes.py", "bench/bench_train.py"])
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
    ("thresholds.py", ["k1", "--seeds", "x"], ["--seeds"]),
    ("thresholds.py", ["k1", "--perturbed-seeds", "-1"], ["--perturbed-seeds"]),
    ("thresholds.py", ["k2", "--seeds", "3-1"], ["--seeds"]),
    ("thresholds.py", ["k2", "--jobs", "0"], ["--jobs"]),
    ("thresholds.py", ["k2", "--preset", "paper", "--device", "cpu"], ["paper preset needs a GPU"]),
    ("thresholds.py", ["dtau", "no-such-dir"], ["no run directories"]),
    ("trace.py", ["circuits", "--seed", "-1"], ["--seed"]),
    ("bench/bench_data.py", ["--threads", "0"], ["--threads"]),
    ("bench/bench_attention.py", ["--compile-jobs", "0"], ["--compile-jobs"]),
    ("bench/bench_attention.py", ["--previous", "missing.py"], ["--previous"]),
    ("bench/bench_attention.py", ["--N", "300"], ["--N"]),
    ("bench/bench_attention.py", ["--sweep-kernels", "dq,skew"], ["--sweep-kernels"]),
    ("sa_transformer.py", ["--jobs", "0"], ["--jobs"]),
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
    assert resumed.returncode == 0 and "resuming from step 3" in resumed.stdout.splitlines()[2]
    assert run("train.py", *TINY, "--out", out, "--overwrite").returncode == 0
    assert not (out / "model_0000999.pt").exists()  # the old run's files are gone, not mixed in
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert same_numbers(rows, [json.loads(line) for line in metrics.splitlines()])  # the same seed, the same run


def test_a_grid_refuses_before_starting_any_process(tmp_path, run):
    tiny_run(run, tmp_path / "K5_s0")
    proc = run("train.py", *TINY[2:], "--K", "4,5", "--out", tmp_path)
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


@pytest.mark.parametrize("content, words", [(b"garbage", ["not a complete torch checkpoint"]), (None, ["lacks", "model"])])
def test_resume_on_a_corrupt_checkpoint_says_what_is_wrong(tmp_path, content, words, run):
    out = tmp_path / "run"
    tiny_run(run, out)
    if content is None:
        torch.save({"step": 3}, out / "ckpt.pt")
    else:
        (out / "ckpt.pt").write_bytes(content)
    assert_one_line_error(run("train.py", *TINY, "--out", out, "--resume"), str(out / "ckpt.pt"), *words)


def tiny_config(out, **kw):
    return train.Config(**{**dict(K=3, N=8, iters=12, batch=4, evals=3, eval_train=8, eval_gen=8, ckpt_every=4,
                                  out=str(out)), **kw})


@pytest.mark.parametrize("poison", ["loss", "weights"])
def test_a_diverging_run_stops_and_keeps_the_last_good_checkpoint(tmp_path, monkeypatch, poison):
    """From the 7th step on the loss is NaN (or the weights are, the loss reported finite): the run stops
    with a message at the next check (step 8, a checkpoint step) before writing a NaN row or checkpoint;
    ckpt.pt keeps step 5 (evaluations at 0, 2, 5, 12; checkpoints also every 4 steps), all finite."""
    step, calls = train.Single.step, []

    def poisoned(self, seqs, task):
        loss = step(self, seqs, task)
        calls.append(1)
        if len(calls) >= 7:
            if poison == "loss":
                return loss * float("nan")
            with torch.no_grad():
                next(self.module.parameters()).fill_(float("nan"))
            return torch.zeros_like(loss)
        return loss

    monkeypatch.setattr(train.Single, "step", poisoned)
    cfg = tiny_config(tmp_path / "run")
    with pytest.raises(ValueError, match=f"diverged.*non-finite {poison}"):
        train.train(cfg, quiet=True)
    ckpt = torch.load(tmp_path / "run" / "ckpt.pt", weights_only=False)
    assert ckpt["step"] == 5 and all(v.isfinite().all() for v in ckpt["model"].values() if v.is_floating_point())
    rows = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    assert [r["step"] for r in rows] == [0, 2, 5] and all(r["train_loss"] == r["train_loss"] for r in rows)


def test_progress_at_least_every_PROGRESS_SECONDS(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(train, "PROGRESS_SECONDS", 0)  # every step is 'late'
    train.train(tiny_config(tmp_path / "run"))
    steps = [line.split()[1] for line in capsys.readouterr().out.splitlines() if line.startswith("step")]
    assert steps == [f"{s}/12" for s in range(1, 13)]


def test_eta_is_the_step_rate_without_evaluations_plus_the_evaluations_left():
    """100 steps in 30 s of which 20 s were 4 evaluations: 10 steps/s; 900 steps and 6 evaluations left
    take 90 s + 6 x 5 s (folded into one rate, the evaluations would make it 270 s)."""
    assert train.progress_rate(100, 900, 30.0, 20.0, 4, 6) == pytest.approx((10.0, 120.0))


def test_fig2a_panels_each_have_a_legend_below_and_step_0_at_0(tmp_path, monkeypatch):
    figs = []
    monkeypatch.setattr(train.plt, "close", figs.append)
    rows = train.train(tiny_config(tmp_path / "run"), quiet=True)
    axes = figs[-1].axes
    assert rows[0]["step"] == 0 and len(axes) == 4
    for ax in axes:
        assert ax.get_legend() is not None and ax.get_legend().get_bbox_to_anchor().y0 < ax.get_window_extent().y0
        assert ax.get_xscale() == "symlog" and ax.get_xlim()[0] == 0


# ----------------------------------------------------------------------------- one convention


SHARED = {
    "train.py": ["--preset", "--device", "--threads", "--jobs", "--seeds", "--figures", "--out", "--overwrite"],
    "bayes.py": ["--preset", "--device", "--threads", "--figures"],
    "sa_transformer.py": ["--preset", "--threads", "--jobs", "--figures"],
    "mem_minimal.py": ["--preset", "--threads", "--jobs", "--seeds", "--figures"],
    "thresholds.py k1": ["--preset", "--device", "--threads", "--jobs", "--seeds", "--perturbed-seeds", "--figures", "--root"],
    "thresholds.py k2": ["--preset", "--device", "--threads", "--jobs", "--seeds", "--figures", "--root"],
    "trace.py circuits": ["--threads", "--figures", "--seed"],
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
    proc = run("train.py", "--plot-sweep", "--out", tmp_path / "sweep", "--figures", tmp_path / "figs")
    assert proc.returncode == 0, proc.stderr
    assert sorted(os.listdir(tmp_path / "figs")) == ["fig2bc.json", "fig2bc.png"]


@pytest.mark.parametrize("field", ["seed", "task_seed"])
def test_make_config_rejects_negative_seeds_from_library_callers(field):
    """thresholds.py and others build configs through make_config without the command line's parse_list."""
    values = {f.name: None for f in train.fields(train.Config)}
    with pytest.raises(ValueError, match=f"{field} must be an integer >= 0"):
        train.make_config(argparse.Namespace(**{**values, "preset": "quick", field: -1}))


@pytest.mark.parametrize("script, first_call, words", [
    ("bayes.py", "scaling_with_K", "preset quick: K to 4096, N to 8192, 8 task distributions, 256 sequences, on cpu; writing"),
    ("sa_transformer.py", "F_d", "preset quick: tau_2Gen at N = [32, 64, 128, 256], dynamics at N = 64, 2 processes; writing"),
])
def test_figure_scripts_say_their_preset_before_computing(tmp_path, monkeypatch, run, script, first_call, words):
    def stop(*args, **kwargs):
        raise ValueError("stopped before computing")
    monkeypatch.setattr(load(script), first_call, stop)
    proc = run(script, "--preset", "quick", "--figures", tmp_path)
    assert proc.stdout.startswith(words) and "stopped before computing" in proc.stderr


def _square(x):
    return x * x


def test_parallel_map_keeps_the_order_and_reports_progress(capsys):
    assert cli.parallel_map(_square, range(5), 2, progress="squares") == [0, 1, 4, 9, 16]
    assert "squares: 5/5 done" in capsys.readouterr().out
    assert cli.parallel_map(_square, [3], 1) == [9] and capsys.readouterr().out == ""
