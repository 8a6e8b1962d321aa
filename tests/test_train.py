"""train.py: a tiny end-to-end run, exact resume after a kill, the grid commands, bad input."""
import argparse
import json
import os

import matplotlib.pyplot as plt
import pytest
import torch
from matplotlib.figure import Figure

import train
from analysis import runs
from bayes import PREDICTORS
from engine import fastdata
from markov import TaskSet
from plumbing import rundir
from plumbing.style import COLORS
from runners import grids, probes
from stand_ins import run  # noqa: F401 (a fixture: a script's command line in this process)
from train import Config, eval_steps

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KEYS = ["step", "train_loss", "gen_loss", "train_loss_1gen", "train_loss_2gen", "train_loss_1mem", "train_loss_2mem",
        "gen_loss_1gen", "gen_loss_2gen", "gen_loss_1mem", "gen_loss_2mem", "kl_1gen", "kl_2gen", "kl_1mem", "kl_2mem",
        "phi_delta_1", "phi_delta_2", "phi_beta_1", "phi_beta_2", "n_A_1", "n_A_2"]


def tiny(out, **kw) -> Config:
    return Config(**{**dict(K=4, N=12, iters=30, batch=8, D=16, evals=6, eval_train=16, eval_gen=16,
                            ckpt_every=5, out=str(out)), **kw})


def read(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def test_tiny_training_run(tmp_path):
    rows = train.train(tiny(tmp_path), quiet=True)
    assert [r["step"] for r in rows] == eval_steps(30, 6)
    assert all(set(KEYS) <= set(r) for r in rows)
    assert rows[-1]["train_loss"] < rows[0]["train_loss"]
    assert read(tmp_path / "metrics.jsonl") == rows
    for name in ["config.json", "ckpt.pt", "fig2a.png", "model_0000030.pt"]:
        assert (tmp_path / name).exists()
    assert not any(p.suffix == ".tmp" for p in tmp_path.iterdir())
    ckpt = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    assert ckpt["step"] == 30 and set(ckpt) >= {"model", "optimizer", "rng", "step", "config"}


def test_plain_run_is_the_fast_run_to_float_rounding(tmp_path, monkeypatch):
    """--plain (fast=False) runs the reader's path alone: bayes.predict for the evaluations' predictors (the fast
    run's fastdata.predict is never called), on the same batches and steps, so that on a CPU everything the model
    computes is the same bits and the memorizing predictors' levels agree to float32 rounding."""
    cfg = tiny(tmp_path / "fast", eval_every=10, per_chain=2)
    fast = train.train(cfg, quiet=True)

    def refuse(*args):
        raise AssertionError("the plain run called the engine's predictors")

    monkeypatch.setattr(fastdata, "predict", refuse)
    plain = train.train(tiny(tmp_path / "plain", eval_every=10, per_chain=2), quiet=True, fast=False)
    levels = {k for k in KEYS if "loss_" in k or k.startswith("kl_")}  # the predictors' levels and divergences
    assert [r["step"] for r in plain] == [r["step"] for r in fast]
    for a, b in zip(plain, fast):
        assert {k: v for k, v in a.items() if k not in levels} == {k: v for k, v in b.items() if k not in levels}
        for k in levels & set(a):
            assert a[k] == pytest.approx(b[k], rel=1e-5, abs=1e-6), k
    assert read(tmp_path / "plain" / "per_chain.jsonl") == read(tmp_path / "fast" / "per_chain.jsonl")
    mem = [k for k in levels if "mem" in k]
    assert any(a[k] != b[k] for a, b in zip(plain, fast) if not a.get("dense") for k in mem)  # two computations


class Killed(Exception):
    pass


def train_until_killed(cfg, monkeypatch, kill_after: int):
    """Train cfg's run until the process "dies" after kill_after optimizer steps (its checkpoint stays behind)."""
    step = torch.optim.AdamW.step
    count = {"n": 0}

    def dying_step(self, *args, **kwargs):
        if count["n"] == kill_after:
            raise Killed
        count["n"] += 1
        return step(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.AdamW, "step", dying_step)
    with pytest.raises(Killed):
        train.train(cfg, quiet=True)
    monkeypatch.setattr(torch.optim.AdamW, "step", step)


@pytest.mark.parametrize("kill_after", [13, 20])
def test_resume_after_a_kill_reproduces_the_straight_run(tmp_path, monkeypatch, kill_after, same_numbers):
    straight = train.train(tiny(tmp_path / "straight"), quiet=True)
    train_until_killed(tiny(tmp_path / "killed"), monkeypatch, kill_after)
    resumed = train.train(tiny(tmp_path / "killed"), resume=True, quiet=True)
    assert same_numbers(resumed, straight)
    assert same_numbers(read(tmp_path / "killed" / "metrics.jsonl"), straight)
    a = torch.load(tmp_path / "straight" / "ckpt.pt", weights_only=True)["model"]
    b = torch.load(tmp_path / "killed" / "ckpt.pt", weights_only=True)["model"]
    for k in a:
        torch.testing.assert_close(a[k], b[k])



def test_a_checkpoint_written_by_a_cuda_graph_run_resumes_on_a_cpu(tmp_path, monkeypatch, same_numbers):
    """A checkpoint carries the AdamW capturable flag of the run that wrote it (True on CUDA with the graph); the
    resumed run takes its own (capturable AdamW refuses CPU parameters), and still equals the straight run."""
    straight = train.train(tiny(tmp_path / "straight"), quiet=True)
    train_until_killed(tiny(tmp_path / "killed"), monkeypatch, 13)
    path = tmp_path / "killed" / "ckpt.pt"
    ckpt = torch.load(path, weights_only=True)
    for group in ckpt["optimizer"]["param_groups"]:  # as a CUDA-graph run writes it
        group["capturable"] = True
    torch.save(ckpt, path)
    resumed = train.train(tiny(tmp_path / "killed"), resume=True, quiet=True)
    assert same_numbers(resumed, straight)
    assert not torch.load(path, weights_only=True)["optimizer"]["param_groups"][0]["capturable"]


def test_resume_of_a_finished_ensemble_rewrites_nothing(tmp_path, capsys):
    cfgs = [tiny(tmp_path / f"K4_s{seed}", seed=seed, iters=4, evals=2) for seed in (0, 1)]
    rows = grids.train_ensemble(cfgs, str(tmp_path / "ckpt_group0.pt"), quiet=True)
    files = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in tmp_path.rglob("*") if p.is_file() and p.name != ".lock"}
    assert grids.train_ensemble(cfgs, str(tmp_path / "ckpt_group0.pt"), resume=True) == rows
    assert "already complete" in capsys.readouterr().out
    assert {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in tmp_path.rglob("*") if p.is_file() and p.name != ".lock"} == files

def test_grid_prints_one_command_per_run(run):
    out = run("sweep.py", "--preset", "quick", "--K", "4,16", "--seeds", "0-1", "--iters", "50", "--out", "runs/g",
              "--print-commands")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 4
    assert all("--threads 1" in line and "--iters 50" in line for line in lines)
    assert "--K 16 --seed 1" in lines[-1] and "--out runs/g/K16_s1" in lines[-1]


@pytest.mark.parametrize("args, words", [
    (["--preset", "fast"], "preset"),
    (["--K", "0"], "K"),
    (["--N", "1"], "N"),
    (["--batch", "0"], "batch"),
    (["--K", "two"], "K"),
    (["--device", "cuda:7"] if not torch.cuda.is_available() else ["--device", "tpu"], "device"),
    (["--fp32", "--bf16"], "--fp32 excludes --bf16"),
])
def test_bad_input_is_one_line_and_exit_2(run, args, words):
    r = run("train.py", *args)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and words in r.stderr


def test_bad_resume_and_output_dir(run, tmp_path):
    r = run("train.py", "--resume", "--out", tmp_path / "nothing")
    assert r.returncode == 2 and "no checkpoint" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    train.train(tiny(tmp_path / "run"), quiet=True)
    r = run("train.py", "--resume", "--out", tmp_path / "run", "--K", "8", "--N", "12", "--iters", "30", "--D", "16")
    assert r.returncode == 2 and "does not match" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    (tmp_path / "file").write_text("")
    r = run("train.py", "--out", tmp_path / "file" / "sub", "--iters", "1")
    assert r.returncode == 2 and "cannot write" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_a_probe_draws_no_figure_and_a_run_without_one_is_the_same_run(tmp_path, capsys):
    """A search's probes (probes.run_probes, on the CPU and as CUDA ensembles) leave Fig. 2a out: each plot costs
    ~1 s of the host, a minute of a 64-model ensemble's. plot=False changes nothing else, and says so."""
    cfg = tiny(tmp_path / "probe", iters=6, evals=2, eval_every=3, eval_dense=8)
    rows = probes.run_probes([cfg], 1)[0]
    assert not (tmp_path / "probe" / "fig2a.png").exists() and [r["step"] for r in rows] == [0, 3, 6]
    train.train(tiny(tmp_path / "plain", iters=6, evals=2, eval_every=3, eval_dense=8))
    assert capsys.readouterr().out.rstrip().endswith("metrics.jsonl, fig2a.png")
    train.train(tiny(tmp_path / "quiet", iters=6, evals=2, eval_every=3, eval_dense=8), plot=False)
    assert capsys.readouterr().out.rstrip().endswith("metrics.jsonl")
    assert read(tmp_path / "quiet" / "metrics.jsonl") == read(tmp_path / "plain" / "metrics.jsonl")
    assert (tmp_path / "plain" / "fig2a.png").exists() and not (tmp_path / "quiet" / "fig2a.png").exists()


def test_load_run_returns_the_saved_model_and_task_set(tmp_path):
    cfg = tiny(tmp_path)
    rows = train.train(cfg, quiet=True)
    step = rows[2]["step"]
    got_cfg, got_rows, model, tasks = runs.load_run(str(tmp_path), step)
    assert got_cfg == cfg and got_rows == rows and not model.training
    saved = torch.load(tmp_path / f"model_{step:07d}.pt", weights_only=True)
    assert all(torch.equal(v, saved[k]) for k, v in model.state_dict().items())
    assert torch.equal(tasks.T, TaskSet.create(cfg.K, cfg.C, seed=cfg.task_seed).T)
    assert runs.load_run(str(tmp_path))[0].iters == cfg.iters  # default: the last step
    with pytest.raises(ValueError, match="no checkpoint at step 7"):
        runs.load_run(str(tmp_path), 7)
    with pytest.raises(ValueError, match="not a run directory"):
        runs.load_run(str(tmp_path / "missing"))
    narrow = tiny(tmp_path / "narrow", mlp_width=8)  # an option of the model is rebuilt from config.json
    train.train(narrow, quiet=True)
    assert runs.load_run(narrow.out)[2].mlp2.W_in.weight.shape == (8, narrow.D)


def test_tf32_is_recorded_and_set(tmp_path):
    """--tf32 reaches the process's CUDA matmul setting and config.json (a resumed run checks it)."""
    before = torch.backends.cuda.matmul.allow_tf32
    try:
        cfg = Config(K=4, N=12, iters=2, batch=4, D=16, evals=2, eval_train=8, eval_gen=8, tf32=True, out=str(tmp_path))
        train.train(cfg, quiet=True)
        assert torch.backends.cuda.matmul.allow_tf32 is True
        assert runs.read_metrics(str(tmp_path))[0]["tf32"] is True
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


def test_bf16_reaches_the_step_and_config(tmp_path):
    """--bf16 trains in mixed precision (other losses than the fp32 run from the same seed, close to them) and is
    recorded in config.json (a resumed run checks it)."""
    losses = {}
    for bf16 in (False, True):
        cfg = Config(K=4, N=12, iters=5, batch=4, D=16, evals=2, eval_train=8, eval_gen=8, bf16=bf16, out=str(tmp_path / str(bf16)))
        rows = train.train(cfg, quiet=True)
        losses[bf16] = rows[-1]["train_loss"]
        assert runs.read_metrics(cfg.out)[0]["bf16"] is bf16
    assert losses[True] != losses[False] and losses[True] == pytest.approx(losses[False], rel=2e-2)


@pytest.mark.parametrize("flags, cuda, cpu", [
    ({}, (True, True), (False, False)),  # the default: bf16 with TF32 matmuls on CUDA, fp32 on a CPU
    ({"fp32": True}, (False, False), (False, False)),
    ({"bf16": True}, (False, True), (False, True)),  # a flag given is taken as it is, the other stays off
    ({"tf32": True}, (True, False), (True, False)),
])
def test_cuda_trains_in_bf16_unless_told_and_the_first_line_says_so(monkeypatch, flags, cuda, cpu):
    """The command line's precision (train.CUDA_PRECISION): (tf32, bf16) of the config, and the run's first line."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # cli.device accepts "cuda"; nothing runs there
    for device, want in (("cuda", cuda), ("cpu", cpu)):
        cfg = train.make_config(argparse.Namespace(preset="paper", K=4, device=device, **flags))
        assert (cfg.tf32, cfg.bf16) == want, device
        words = {(True, True): "bf16 mixed precision with TF32 matmuls", (False, True): "bf16 mixed precision",
                 (True, False): "TF32 matmuls", (False, False): "fp32"}[want]
        threads = f" ({torch.get_num_threads()} thread{'s' if torch.get_num_threads() > 1 else ''})"  # the CPU's alone
        assert rundir.run_header([cfg], "", None, 101).splitlines()[0].endswith(
            f"on {device}{threads if device == 'cpu' else ''} in {words}")


def test_a_grid_passes_fp32_on_to_its_members(run):
    out = run("sweep.py", "--K", "4,16", "--fp32", "--print-commands")
    assert out.returncode == 0 and all(line.endswith("--fp32") for line in out.stdout.strip().splitlines())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (the graphed run)")
def test_the_graphed_run_trains_on_the_plain_runs_batches(tmp_path, same_numbers):
    """On CUDA the single run samples inside its CUDA graph (ensemble.accelerate_run): it draws the batches of the plain path's
    tasks.batch (so its losses are the plain run's, to the kernels' TF32 rounding) and leaves the generator, which
    its checkpoint saves, exactly where the plain run leaves it."""
    rows = {}
    for graph in (True, False):
        cfg = tiny(tmp_path / str(graph), device="cuda")
        rows[graph] = train.train(cfg, quiet=True, fast=graph)
    assert same_numbers(rows[True], rows[False], rel=1e-2)
    a, b = (torch.load(tmp_path / str(graph) / "ckpt.pt", weights_only=True) for graph in (True, False))
    assert torch.equal(a["rng"], b["rng"])


def test_resuming_in_another_precision_names_the_precision_flags(tmp_path):
    """A run begun in fp32 on CUDA before bf16 became the default there is resumed with --fp32: the error says so."""
    train.train(tiny(tmp_path, iters=2, evals=1), quiet=True)
    with pytest.raises(ValueError, match="bf16: checkpoint False vs now True; --fp32, --tf32, --bf16 name its precision"):
        train.train(tiny(tmp_path, iters=2, evals=1, bf16=True), resume=True, quiet=True)


@pytest.mark.parametrize("args, grid", [(["--K", "64,80"], "python sweep.py --K 64,80 trains it"),
                                        (["--seeds", "0-3"], "python sweep.py --K 256 --seeds 0-3 trains it")])
def test_a_grid_given_to_train_names_the_command_that_trains_it(run, tmp_path, args, grid):
    r = run("train.py", *args, "--out", tmp_path / "run")
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and f"is a grid of {2 if args[0] == '--K' else 4} runs: {grid}" in lines[0]
    assert not (tmp_path / "run").exists()


# ----------------------------------------------------------------------------- Fig. 2a: levels that share a line


def fig2a_levels(tmp_path, monkeypatch, train_levels: dict, gen_levels: dict) -> list[list[tuple]]:
    """plot_run on three evaluation rows whose predictor levels are train_levels on S and gen_levels on fresh
    chains: per loss panel (L_train, L_gen), the (label, level, colour, style) of each level's line in drawing
    order, checked to be horizontal and to be what the panel's legend lists after the transformer."""
    rows = [{"step": step, "train_loss": 2.9 - 0.1 * i, "gen_loss": 2.95 - 0.1 * i, "phi_delta_1": 0.1, "phi_beta_2": 0.2,
             "n_A_1": 4.0, "n_A_2": 8.0, **{f"train_loss_{p}": train_levels[p] for p in PREDICTORS},
             **{f"gen_loss_{p}": gen_levels[p] for p in PREDICTORS}, **{f"kl_{p}": 0.1 for p in PREDICTORS}}
            for i, step in enumerate((0, 10, 100))]
    figures, written = [], []
    plt.switch_backend("agg")  # the headless default, said: nothing is shown
    monkeypatch.setattr(train.plt, "close", figures.append)
    monkeypatch.setattr(Figure, "savefig", lambda fig, path, **kw: written.append(path))  # half the time, not the labels
    train.plot_run(rows, Config(K=8, N=16), str(tmp_path / "fig2a.png"))
    assert written == [str(tmp_path / "fig2a.png")] and len(figures) == 1
    panels = []
    for ax in figures[0].axes[:2]:
        lines = [line for line in ax.get_lines() if line.get_label() != "transformer"]
        assert all(line.get_ydata()[0] == line.get_ydata()[1] for line in lines)  # axhline: one level, the width
        assert [t.get_text() for t in ax.get_legend().get_texts()] == ["transformer"] + [line.get_label() for line in lines]
        assert not ax.texts  # the labels are the legend's, nothing written on the panel
        panels.append([(line.get_label(), line.get_ydata()[0], line.get_color(), line.get_linestyle()) for line in lines])
    for panel in panels:  # each level on its own line, in its own colour and style, whatever its label says
        assert [(c, s) for _, _, c, s in panel] == [(COLORS[p], {"1gen": "--", "2gen": "--", "1mem": ":", "2mem": ":"}[p])
                                                   for p in PREDICTORS]
    return [[(label, level) for label, level, _, _ in panel] for panel in panels]


def test_fig2a_a_level_within_2e3_of_one_drawn_before_says_it_is_on_that_line(tmp_path, monkeypatch):
    """A level within 0.002 nats of a level drawn before it (1-Gen, 2-Gen, 1-Mem, 2-Mem in that order) is labelled as
    on that one's line, with its offset; one 0.0021 away has its own label. Asymmetric between the panels: on S
    1-Mem is 0.001 above 1-Gen and 2-Mem 0.0021 above 2-Gen, on fresh chains 1-Mem 0.0021 below 1-Gen and 2-Mem
    0.0012 below 2-Gen."""
    train_panel, gen_panel = fig2a_levels(tmp_path, monkeypatch, {"1gen": 2.320, "2gen": 2.100, "1mem": 2.321, "2mem": 2.1021},
                                          {"1gen": 2.320, "2gen": 2.100, "1mem": 2.3179, "2mem": 2.0988})
    assert train_panel == [("1-Gen", 2.320), ("2-Gen", 2.100), ("1-Mem (on 1-Gen's line, +0.001)", 2.321), ("2-Mem", 2.1021)]
    assert gen_panel == [("1-Gen", 2.320), ("2-Gen", 2.100), ("1-Mem", 2.3179), ("2-Mem (on 2-Gen's line, -0.001)", 2.0988)]


def test_fig2a_levels_exactly_2e3_apart_have_their_own_labels(tmp_path, monkeypatch):
    """The rule is strict: levels exactly 0.002 apart (0.004 and 0.002, whose difference is 0.002 in floating point)
    are not on one line; 0.0019 apart they are, and levels that coincide exactly are, at +0.000."""
    assert abs(0.002 - 0.004) == 2e-3 and abs(0.0021 - 0.004) < 2e-3
    train_panel, gen_panel = fig2a_levels(tmp_path, monkeypatch, {"1gen": 0.004, "2gen": 0.5, "1mem": 0.002, "2mem": 1.0},
                                          {"1gen": 0.004, "2gen": 0.5, "1mem": 0.0021, "2mem": 0.5})
    assert train_panel == [("1-Gen", 0.004), ("2-Gen", 0.5), ("1-Mem", 0.002), ("2-Mem", 1.0)]
    assert gen_panel == [("1-Gen", 0.004), ("2-Gen", 0.5), ("1-Mem (on 1-Gen's line, -0.002)", 0.0021),
                         ("2-Mem (on 2-Gen's line, +0.000)", 0.5)]


def test_fig2a_a_level_near_two_drawn_before_names_the_first_drawn(tmp_path, monkeypatch):
    """On S 2-Mem (2.2993) is within 0.002 of both 2-Gen (2.3, -0.0007) and 1-Mem (2.3012, -0.0019): its label
    names 2-Gen, drawn first. On fresh chains 2-Mem (2.3031) is 0.0017 above 1-Mem (2.3014) and 0.0031 above 2-Gen:
    it names 1-Mem, itself on 2-Gen's line."""
    train_panel, gen_panel = fig2a_levels(tmp_path, monkeypatch, {"1gen": 2.5, "2gen": 2.3, "1mem": 2.3012, "2mem": 2.2993},
                                          {"1gen": 2.5, "2gen": 2.3, "1mem": 2.3014, "2mem": 2.3031})
    assert train_panel == [("1-Gen", 2.5), ("2-Gen", 2.3), ("1-Mem (on 2-Gen's line, +0.001)", 2.3012),
                           ("2-Mem (on 2-Gen's line, -0.001)", 2.2993)]
    assert gen_panel == [("1-Gen", 2.5), ("2-Gen", 2.3), ("1-Mem (on 2-Gen's line, +0.001)", 2.3014),
                         ("2-Mem (on 1-Mem's line, +0.002)", 2.3031)]
