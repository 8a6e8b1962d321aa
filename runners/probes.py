"""The engine of the threshold experiments: their training runs ("probes") and the order they are trained in.

analysis/thresholds.py states the rules (K1* criterion, tau_2gen, Delta tau), k1.py and k2.py read the runs; this file only
schedules them. A probe is one train.py run of an experiment preset (a dict of train.Config values and the
experiment's own settings), in root/<condition>/K<K>_s<seed>. On CUDA a round's probes train together as
ensembles (engine/ensemble.py), one per training schedule; on a CPU as one-thread processes. A finished probe is read
back, never trained again, so a killed search or a rerun redoes nothing that is done.

K1*'s binary searches (estimators.Search), one per (condition, seed), advance in lockstep: each round trains the
pending probes of all searches together. campaigns/campaign.py runs the same rounds a piece at a time across GPU leases.
"""
import argparse
import os
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import fields

import train
from analysis import runs
from analysis.estimators import Search
from plumbing import cli
from runners import grids

CONDITIONS = ("control", "reweight", "inject")

K1_PRESETS = {  # the K1* probe's protocol (k1.py; campaigns/specs.py's paper campaigns)
    # sized for the 2-core CPU (README): N = 64, batch 64 and lr 3e-3 so that a probe takes ~1.5 min of one core
    # and large K still form the induction head well inside the budget (at N = 32, K = 256 does not within 1500
    # steps); the reweighting is milder than the paper's (its 1/w budget multiplies the cost)
    "quick": dict(N=64, batch=64, lr=3e-3, iters=1200, eval_every=50, eval_dense=128, evals=4, eval_train=128,
                  eval_gen=128, lo=16, hi=256, ratio=1.5, seeds=4, perturbed_seeds=2, weight=0.5, tau_seeds=6,
                  tau_iters=1200),
    # the paper: N = 256, 10^4 steps, phi_beta every 100 steps on 4096 sequences, 16 seeds (4 per
    # perturbation), w = 1/10, 64 seeds for tau_2gen followed for 5 x 10^4 steps
    "paper": dict(N=256, batch=128, lr=1e-3, iters=10_000, eval_every=100, eval_dense=4096, evals=4, eval_train=1024,
                  eval_gen=1024, lo=16, hi=4096, ratio=1.0, seeds=16, perturbed_seeds=4, weight=0.1, tau_seeds=64,
                  tau_iters=50_000),
}


def run_config(preset: str, p: dict, K: int | float, seed: int, out: str, **flags) -> train.Config:
    """The train.py run of one (K, seed) of an experiment preset p: p's values of train.Config's fields,
    then `flags` (device among them), through train.make_config (so the reweighting's x 1/w budget and every
    check are the command line's)."""
    values = {f.name: p[f.name] for f in fields(train.Config) if f.name in p}
    values.update(preset=preset, K=K, seed=seed, out=out, **flags)
    return train.make_config(argparse.Namespace(**values))


def probe_config(preset: str, p: dict, condition: str, K: int, seed: int, root: str, **flags) -> train.Config:
    """The run of one K1* probe, in root/<condition>/K<K>_s<seed>: gradient reweighting by p["weight"], or
    task injection, or neither (control)."""
    if condition == "reweight":
        flags["prev_weight"] = p["weight"]
    elif condition == "inject":
        flags["task_injection"] = True
    elif condition != "control":
        raise ValueError(f"unknown condition {condition!r}; conditions are {', '.join(CONDITIONS)}")
    return run_config(preset, p, K, seed, os.path.join(root, condition, f"K{K}_s{seed}"), **flags)


def finished(cfg: train.Config) -> bool:
    path = os.path.join(cfg.out, "metrics.jsonl")
    return os.path.exists(path) and any(r["step"] == cfg.iters for r in runs.read_metrics(cfg.out, dense=True)[1])


def run_probe(cfg: train.Config) -> list[dict]:
    """The probe's dense rows, training it first unless it already finished (a probe killed midway resumes
    from its checkpoint)."""
    if not finished(cfg):
        resume = os.path.exists(os.path.join(cfg.out, "ckpt.pt"))
        train.train(cfg, resume=resume, overwrite=not resume, quiet=True, plot=False)  # without a checkpoint: redone
    return runs.read_metrics(cfg.out, dense=True)[1]


def schedule(cfg: train.Config) -> tuple:
    """What the members of one ensemble share (grids.train_ensemble checks it): every setting but K, the seed, the
    directory and the evaluation-set size that follows from K (task injection's K x D tables included: the
    ensemble pads them to the largest K)."""
    return tuple((f.name, getattr(cfg, f.name)) for f in fields(cfg) if f.name not in ("K", "seed", "out", "eval_train"))


def ensemble_groups(cfgs: list[train.Config]) -> list[list[train.Config]]:
    """The probes that can train as one ensemble: one schedule each, in the order of their first probe."""
    groups = {}
    for cfg in cfgs:
        groups.setdefault(schedule(cfg), []).append(cfg)
    return list(groups.values())


def run_probes(cfgs: list[train.Config], jobs: int, quiet: bool = True) -> list[list[dict]]:
    """All probes of one round, trained unless finished: on CUDA as ensembles (quiet=False: each with its header,
    progress and the phases of its time), on a CPU as `jobs` one-thread processes; no probe draws its own Fig. 2a.
    Returns each probe's dense rows."""
    todo = [cfg for cfg in cfgs if not finished(cfg)]
    if todo and todo[0].device.startswith("cuda"):
        for i, group in enumerate(ensemble_groups(todo)):
            root = os.path.dirname(group[0].out)
            grids.train_ensemble(group, os.path.join(root, f"ckpt_round{i}.pt"), quiet=quiet, overwrite=True,  # unfinished: redone
                                 plot=False)
    elif todo:
        cli.parallel_map(run_probe, todo, jobs)
    return [run_probe(cfg) for cfg in cfgs]


def probe_command(cfg: train.Config) -> list[str]:
    """The train.py command line that trains exactly this run (for a scheduler): every field of the
    config that differs from the preset's value, and the iterations before train.py's x 1/w."""
    base = train.Config(**train.PRESETS[cfg.preset])
    flags = ["--K", str(cfg.K), "--seed", str(cfg.seed), "--preset", cfg.preset, "--out", cfg.out,
             "--iters", str(cfg.base_iters or cfg.iters)]
    for f in fields(train.Config):
        value = getattr(cfg, f.name)
        if f.name in ("K", "seed", "preset", "out", "iters", "base_iters", "device") or value == getattr(base, f.name):
            continue
        flags += [f"--{f.name.replace('_', '-')}"] + ([] if f.type is bool else [str(value)])
    return [sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "train.py"), *flags]


Key = tuple[str, int, int]  # (condition, K, seed): one probe


def new_searches(p: dict, plan: dict[str, list[int]]) -> dict[tuple[str, int], Search]:
    """One binary search over [p["lo"], p["hi"]] per (condition, seed) of the plan."""
    return {(cond, seed): Search(p["lo"], p["hi"], p["ratio"]) for cond, seeds in plan.items() for seed in seeds}


def pending_probes(searches: dict[tuple[str, int], Search], width: int = 1) -> list[Key]:
    """The probes the searches ask for next (one round, `width` probes inside each open bracket), condition-major."""
    return [(cond, K, seed) for (cond, seed), s in searches.items() for K in s.pending(width)]


def search_rows(searches: dict[tuple[str, int], Search]) -> dict[str, list[dict]]:
    """Per condition, each seed's search as the K1* figures and JSONs record it: {"seed", "done", an ended search's
    Search.result() (K1_star, above, bound, monotone; K1_star and bound None while it runs), "bracket" (the largest K
    probed without the head and the smallest with it, so far), "probes" (how many)}."""
    rows = {}
    for (cond, seed), s in searches.items():
        below = [K for K, up in s.probes.items() if not up]
        above = [K for K, up in s.probes.items() if up]
        done = not s.pending()
        rows.setdefault(cond, []).append({
            "seed": seed, "done": done, **(s.result() if done else {"K1_star": None, "bound": None}),
            "bracket": [max(below) if below else None, min(above) if above else None], "probes": len(s.probes)})
    return rows


def search_K1(preset: str, p: dict, root: str, jobs: int, plan: dict[str, list[int]],
              generalizes: Callable[[list[dict]], bool], print_only: bool = False, **flags) -> dict | None:
    """Run the searches of plan's conditions to the end, a round at a time; generalizes(dense rows) is the rule.
    Returns {"searches": {(condition, seed): Search}, "outcomes": {(condition, K, seed): dense rows}}.
    print_only: print the next round's train.py commands and return None."""
    searches = new_searches(p, plan)
    outcomes = {}
    for round_ in range(1, 100):
        pending = pending_probes(searches)
        for key in pending:  # finished probes are read back without training
            cfg = probe_config(preset, p, *key, root, **flags)
            if finished(cfg):
                outcomes[key] = run_probe(cfg)
                searches[key[0], key[2]].record(key[1], generalizes(outcomes[key]))
        pending = [key for key in pending if key not in outcomes]
        if not pending:
            if any(s.pending() for s in searches.values()):
                continue
            break
        cfgs = [probe_config(preset, p, *key, root, **flags) for key in pending]
        if print_only:
            print(f"# round {round_}: {len(cfgs)} runs; run them, then this command again for the next round")
            print("\n".join(shlex.join(probe_command(cfg)) for cfg in cfgs))
            return None
        t0 = time.time()
        print(f"round {round_}: {len(cfgs)} probes " + " ".join(f"{c}:K{K}:s{s}" for c, K, s in pending), flush=True)
        for key, rows in zip(pending, run_probes(cfgs, jobs)):
            outcomes[key] = rows
            searches[key[0], key[2]].record(key[1], generalizes(rows))
        print(f"round {round_} done in {time.time() - t0:.0f} s", flush=True)
    return {"searches": searches, "outcomes": outcomes}
