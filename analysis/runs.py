"""Runs read back as data, for the analysis scripts (circuits.py, task_vectors.py, k1.py, k2.py, ...): a run
directory's metrics and memorization scores, the predictor closest to the model at an evaluation, a model at an
evaluation step, and the preset's runs the scripts default to (runs/K<K>_s0), found or trained where missing.
"""
import argparse
import json
import os
from dataclasses import fields

import torch

import train
from bayes import PREDICTORS
from markov import FreshChains, TaskSet, task_source
from plumbing.rundir import load_data
from transformer import Transformer


def read_metrics(run_dir: str, dense: bool = False) -> tuple[dict, list[dict]]:
    """(config, rows): the full evaluations, or with dense=True the --eval-every rows."""
    with open(os.path.join(run_dir, "config.json")) as f:
        cfg = json.load(f)
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return cfg, [r for r in map(json.loads, f) if r.get("dense", False) == dense]


def run_dirs(root: str) -> list[str]:
    """The run directories directly under root (each with a metrics.jsonl), in name order; [] where root is none."""
    names = sorted(os.listdir(root)) if os.path.isdir(root) else []
    return [os.path.join(root, name) for name in names if os.path.isfile(os.path.join(root, name, "metrics.jsonl"))]


def read_per_chain(run_dir: str) -> list[dict]:
    """The memorization scores of a run with --per-chain: rows {"step", "delta": [Delta^k per chain]}."""
    path = os.path.join(run_dir, "per_chain.jsonl")
    if not os.path.exists(path):
        raise ValueError(f"{run_dir!r} has no per_chain.jsonl (train it with --per-chain)")
    with open(path) as f:
        return list(map(json.loads, f))


def closest_predictor(row: dict) -> str:
    """The one of the four Bayes predictors (bayes.PREDICTORS) whose divergence kl_<name> to the model is the lowest at
    an evaluation row: the phase the model is nearest there (Sec. "Identifying in-context memorization and
    generalization regimes"; Fig. 2b)."""
    return min(PREDICTORS, key=lambda name: row[f"kl_{name}"])


def load_run(run_dir: str, step: int | None = None,
             device: str = "cpu") -> "tuple[train.Config, list[dict], Transformer, TaskSet | FreshChains]":
    """A finished or partial run: (train.Config, metrics rows, the model at evaluation step `step` (default:
    the last saved one) in eval mode, its task set S (TaskSet, or FreshChains with K = inf))."""
    if not os.path.exists(os.path.join(run_dir, "config.json")) or not os.path.exists(os.path.join(run_dir, "metrics.jsonl")):
        raise ValueError(f"{run_dir!r} is not a run directory (no config.json / metrics.jsonl)")
    saved, rows = read_metrics(run_dir)
    cfg = train.Config(**{f.name: saved[f.name] for f in fields(train.Config) if f.name in saved})
    steps = [r["step"] for r in rows if os.path.exists(os.path.join(run_dir, f"model_{r['step']:07d}.pt"))]
    if not steps:
        raise ValueError(f"{run_dir!r} holds no model_<step>.pt")
    step = steps[-1] if step is None else step
    if step not in steps:
        raise ValueError(f"{run_dir!r} has no checkpoint at step {step} (saved: {steps[0]}..{steps[-1]})")
    model = train.build_model(cfg)
    model.load_state_dict(load_data(os.path.join(run_dir, f"model_{step:07d}.pt"), device))
    tasks = task_source(cfg.K, cfg.C, seed=cfg.task_seed, device=device)
    return cfg, rows, model.to(device).eval(), tasks


def ensure_run(run_dir: str | None, K: int, seed: int = 0) -> str:
    """run_dir if given (it must exist); else runs/K<K>_s<seed>, trained now with the quick preset on the
    CPU unless it is already complete (resumed if a checkpoint is there). The default inputs of the
    analysis scripts, so that they run end to end from a fresh clone."""
    if run_dir is not None:
        load_run(run_dir)  # fails with a one-line error on a directory that is not a run
        return run_dir
    cfg = train.Config(**{**train.PRESETS["quick"], "K": K, "seed": seed, "preset": "quick"})
    cfg.out = os.path.join("runs", f"K{K}_s{seed}")
    metrics = os.path.join(cfg.out, "metrics.jsonl")
    if os.path.exists(metrics) and read_metrics(cfg.out)[1][-1]["step"] == cfg.iters:
        return cfg.out
    print(f"training the missing quick run {cfg.out} (python train.py --K {K} --seed {seed} --preset quick)", flush=True)
    resume = os.path.exists(os.path.join(cfg.out, "ckpt.pt"))
    train.train(cfg, resume=resume, overwrite=not resume)  # a partial run without a checkpoint is redone
    return cfg.out


# what training a missing default run costs, as the scripts announce it
TRAIN_TIME = {"quick": "5-10 min on a CPU core", "paper": "10^6 steps, 20-50 min on an H100"}


def find_run(run_dir: str | None, K: int, preset: str, flag: str) -> tuple[str, bool]:
    """(the run an analysis reads, whether it must be trained first): run_dir if given (it must hold a run),
    else runs/K<K>_s0, where `python train.py --K <K> --preset <preset>` writes it. Checked before anything
    runs: a run of the other preset there is refused rather than resumed with the wrong hyper-parameters,
    and a paper run (10^6 steps) is only trained where CUDA is available. flag: the script's flag that names a run."""
    if run_dir is not None:
        load_run(run_dir)  # a one-line error on a directory that is not a run
        return run_dir, False
    out = os.path.join("runs", f"K{K}_s0")
    if os.path.exists(os.path.join(out, "metrics.jsonl")):
        saved, rows = read_metrics(out)
        if saved.get("preset", train.Config.preset) != preset:
            raise ValueError(f"--preset {preset}: {out} holds a {saved.get('preset')} run; move it away, "
                             f"or name the run to read with {flag}")
        if rows and rows[-1]["step"] == saved["iters"]:
            return out, False
    if preset == "paper" and not torch.cuda.is_available():
        raise ValueError(f"--preset paper: {out} is missing or unfinished and its 10^6 steps need a GPU (train it there "
                         f"with `python train.py --K {K} --preset paper`), or name a run with {flag}")
    return out, True


def train_run(K: int, preset: str) -> str:
    """Train, or finish, the preset's run runs/K<K>_s0 that find_run found missing."""
    if preset == "quick":
        return ensure_run(None, K)
    args = argparse.Namespace(**{f.name: None for f in fields(train.Config)})
    args.K, args.preset, args.out = K, "paper", os.path.join("runs", f"K{K}_s0")
    resume = os.path.exists(os.path.join(args.out, "ckpt.pt"))
    print(f"training the missing paper run {args.out} (python train.py --K {K} --preset paper)", flush=True)
    train.train(train.make_config(args), resume=resume, overwrite=not resume)  # a partial run without a checkpoint is redone
    return args.out
