"""Many runs at once: the (K, seed) grids of sweep.py and the threshold searches' probes (runners/probes.py), as
ensembles on a GPU or as one-thread processes on a CPU. train.py trains one run top to bottom; this is the engine
above it.

    train_ensemble, held_keys      E runs trained together as one ensemble (engine/ensemble.py) with train.train's loop
                                   over the members, each writing through train.Record: every member is the single
                                   run of train.train with its K and seed (tests/test_ensemble.py)
    member_commands, run_processes, train_grid    a grid as ensembles of --group models on CUDA (or with --ensemble),
                                   or as one-thread train.py processes (--jobs) on a CPU; one command line per model
    add_grid_flags, grid_args      the flags of a script's subcommand that trains a set of runs (k1.py, k2.py)

A grid writes OUT/K<K>_s<seed>/ per model, each a run directory as train.py writes it; an ensemble also keeps the
resumable state of all its members in one atomic checkpoint OUT/ckpt_group<i>.pt.
"""
import argparse
import os
import shlex
import subprocess
import sys
import time
from dataclasses import asdict, fields

import torch

import bayes
import evaluation
import train
from engine import fastdata
from engine.ensemble import Ensemble, sampled_step
from markov import task_source
from plumbing import cli, rundir

# ----------------------------------------------------------------------------- ensembles


def train_ensemble(cfgs: list[train.Config], ckpt_path: str, resume: bool = False, quiet: bool = False,
                   fast: bool = True, overwrite: bool = False, plot: bool = True) -> list[list[dict]]:
    """Train the runs `cfgs` together as one ensemble (ensemble.Ensemble: one vmapped step of all), each model the
    same as its single run (train.train: the same initial weights, batches, evaluations and files, written through
    train.Record); the resumable state of all of them is the one file ckpt_path. The loop is train.train's, over
    the members. fast (CUDA): the step replayed as a CUDA graph with the sampler inside (the Triton kernels stay
    either way). plot=False: no member draws its fig2a.png (~0.5 s of the host's time each: half a minute of a
    64-model ensemble's). Returns each model's metrics rows."""
    step_shape = ("N", "batch", "D", "C", "mlp_width")  # the shapes of a batched step
    common = [f.name for f in fields(cfgs[0]) if f.name not in ("K", "seed", "out", "eval_train")]
    for cfg in cfgs[1:]:
        differ = [k for k in common if getattr(cfg, k) != getattr(cfgs[0], k)]
        if differ:
            why = "shapes of the batched step" if set(differ) & set(step_shape) else "the common training schedule"
            raise ValueError(f"ensemble members differ in {', '.join(differ)} ({why}); train them in separate groups")
    outs = [cfg.out for cfg in cfgs]
    if len(set(outs)) != len(outs):
        raise ValueError("ensemble members need distinct output directories")
    with rundir.RunDir(cfgs, ckpt_path, resume, overwrite) as run:
        if run.complete(quiet):
            return [rundir.read_rows(os.path.join(cfg.out, "metrics.jsonl")) for cfg in cfgs]
        c0, E = cfgs[0], len(cfgs)
        start = run.members[0]["step"] if resume else 0
        evals = set(train.eval_steps(c0.iters, c0.evals))
        progress = rundir.Progress(cfgs, f"{E} runs as one ensemble, writing {os.path.dirname(c0.out)}/K*_s*/, "
                                         f"checkpoint {ckpt_path}", start, start if resume else None, evals, quiet)
        device = torch.device(c0.device)
        graph = fast and device.type == "cuda"
        torch.backends.cuda.matmul.allow_tf32 = c0.tf32  # process-wide; only CUDA matmuls read it
        tasks = [task_source(cfg.K, cfg.C, seed=cfg.task_seed, device=device) for cfg in cfgs]
        trainer = Ensemble([train.init_model(cfg, device) for cfg in cfgs], bf16=c0.bf16, lr=c0.lr,
                           betas=(c0.beta1, c0.beta2), weight_decay=c0.weight_decay, capturable=graph)
        gens = [torch.Generator(device).manual_seed(cfg.seed) for cfg in cfgs]
        if resume:
            trainer.load_member_states(run.members)
            for g, member in zip(gens, run.members):
                g.set_state(member["rng"].cpu())
        predict, held = fastdata.predict if fast else bayes.predict, {}  # members of one S share their held-out sets
        for cfg, t, key in zip(cfgs, tasks, held_keys(cfgs)):
            if key not in held:
                held[key] = evaluation.held_out_sets(cfg, t, predict)
        records = [train.Record(cfg, held[key], start if resume else None, ckpt_path)
                   for cfg, key in zip(cfgs, held_keys(cfgs))]
        if c0.eval_every:
            dense = [torch.stack(split) for split in zip(*(r.dense for r in records))]  # (E, n, N + 1), chains (E, n)
        step = sampled_step(trainer, tasks, gens, (E, c0.batch, c0.N + 1), device, graph)  # each member's own batch
        losses = None  # the last step's, (E,)
        progress.begin()
        try:
            for t in range(start, c0.iters + 1):
                new, show = t > start or not resume, progress.due(t)  # new: not yet in the runs' files
                if t > start and (show or t in evals or train.dense_due(c0, t) or t % c0.ckpt_every == 0):
                    values = losses.tolist()  # waits for the device: only where the step waits anyway or prints
                    for cfg, value in zip(cfgs, values):
                        rundir.check_finite(cfg, t, ckpt_path, loss=value)
                if t in evals and new:
                    with progress.evaluation():
                        for e, record in enumerate(records):
                            record.evaluate(t, trainer.model(e))
                if train.dense_due(c0, t) and new:
                    with progress.readout():
                        readouts = {k: v.tolist() for k, v in trainer.dense_readouts(*dense).items()}  # one wait
                    for e, record in enumerate(records):
                        record.log_dense(t, {k: v[e] for k, v in readouts.items()})
                if t > start and (t in evals or t % c0.ckpt_every == 0 or t == c0.iters):  # resumable from here
                    with progress.evaluation(count=False):
                        states = [{**trainer.member_state(e), "rng": g.get_state(), "step": t, "config": asdict(cfg)}
                                  for e, (g, cfg) in enumerate(zip(gens, cfgs))]
                        for cfg, state in zip(cfgs, states):
                            rundir.check_finite(cfg, t, ckpt_path, weights=state["model"])
                        rundir.save_atomic({"step": t, "members": states}, ckpt_path)
                if show:
                    progress.show(t, values, [r.rows for r in records])
                if t == c0.iters:
                    break
                losses = step()
        except KeyboardInterrupt:
            raise rundir.interrupted(t, ckpt_path) from None
        progress.end()
        for record, state in zip(records, states):  # each finished member looks like a finished single run
            rundir.save_atomic(state, os.path.join(record.cfg.out, "ckpt.pt"))
            if plot:
                record.plot()
        progress.done(plot)
    return [record.rows for record in records]


def held_keys(cfgs: list[train.Config]) -> list[tuple]:
    """What decides a run's held-out sets (evaluation.held_out_sets): runs with the same key share them."""
    return [(cfg.K, cfg.C, cfg.task_seed, cfg.N, cfg.eval_train, cfg.eval_gen, cfg.eval_dense, cfg.per_chain,
             cfg.per_chain_tasks) for cfg in cfgs]


# ----------------------------------------------------------------------------- grids


def member_commands(args: argparse.Namespace, cfgs: list) -> list[list[str]]:
    """One independent `python train.py` per model of the grid, each a line a scheduler can run as is."""
    passthrough = []
    for f in fields(train.Config):
        value = getattr(args, f.name, None)
        if value is not None and f.name not in ("K", "seed", "out", "preset"):
            passthrough += [f"--{f.name.replace('_', '-')}"] + ([] if f.type is bool else [str(value)])
    passthrough += ["--resume"] * args.resume + ["--overwrite"] * args.overwrite + ["--plain"] * args.plain
    passthrough += ["--fp32"] * getattr(args, "fp32", False)  # else a CUDA member would take CUDA's default precision
    return [[sys.executable, os.path.abspath(train.__file__), "--K", str(cfg.K), "--seed", str(cfg.seed), "--preset",
             cfg.preset, "--out", cfg.out, "--threads", "1", *passthrough] for cfg in cfgs]


def run_processes(commands: list[list[str]], jobs: int):
    """Run the commands as parallel processes, `jobs` at a time, one torch thread each."""
    pending, running, failed = list(commands), [], []
    while pending or running:
        while pending and len(running) < jobs:
            cmd = pending.pop(0)
            log = open(os.path.join(cmd[cmd.index("--out") + 1] + ".log"), "w")
            running.append((cmd, subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT), log))
            print("started:", shlex.join(cmd), flush=True)
        time.sleep(1)
        for item in list(running):
            cmd, proc, log = item
            if proc.poll() is not None:
                running.remove(item)
                log.close()
                (failed if proc.returncode else []).append(cmd)
                print(f"finished (exit {proc.returncode}):", cmd[cmd.index("--out") + 1], flush=True)
    if failed:
        raise ValueError(f"{len(failed)} grid runs failed; see their .log files")


def train_grid(args: argparse.Namespace, cfgs: list, out: str):
    """On CUDA (or with --ensemble) the grid as ensembles of --group models, one after the other, each
    resumable from its own OUT/ckpt_group<i>.pt; otherwise as one-thread processes."""
    jobs, size = args.jobs, args.group  # checked by sweep.py's parser (cli.at_least)
    ensembles = args.ensemble or cfgs[0].device.startswith("cuda")
    for i, cfg in enumerate(cfgs):  # one line now, not one failed process per run that exists
        group = os.path.join(out, f"ckpt_group{i // size}.pt") if ensembles else None
        rundir.check_run_dir(cfg.out, args.resume, args.overwrite, group)
    os.makedirs(out, exist_ok=True)
    if not ensembles:
        print(rundir.run_header(cfgs, f"{len(cfgs)} runs as one-thread processes, {jobs} at a time, writing {out}/K*_s*/ "
                                      f"(their output in {out}/K*_s*.log)", None,
                                len(train.eval_steps(cfgs[0].iters, cfgs[0].evals))), flush=True)
        run_processes(member_commands(args, cfgs), jobs)
        return
    for i in range(0, len(cfgs), size):
        ckpt = os.path.join(out, f"ckpt_group{i // size}.pt")
        train_ensemble(cfgs[i : i + size], ckpt, resume=args.resume, fast=not args.plain, overwrite=args.overwrite)


# ----------------------------------------------------------------------------- a script's flags for a set of runs


def grid_args(args, presets: dict, name: str) -> tuple[str, str, dict, int, str, list[int]]:
    """The flags of k1.py's and k2.py's runs (add_grid_flags', --preset and --root), checked: (preset, root, the
    preset's values, jobs, device, seeds); --jobs is checked by its parser."""
    preset = cli.preset(args.preset)
    root = args.root or os.path.join("runs", f"{name}_{preset}")
    p = presets[preset]
    jobs = args.jobs
    device = cli.device(args.device)
    if preset == "paper" and not device.startswith("cuda") and not args.print_commands:
        raise ValueError("the paper preset needs a GPU (ensembles); without one, --print-commands prints the runs")
    seeds = cli.parse_list("--seeds", args.seeds) if args.seeds is not None else list(range(p["seeds"]))
    return preset, root, p, jobs, device, seeds


def add_grid_flags(p, seeds: str):
    """The flags of a subcommand that trains a fixed set of runs: where, how many at a time, its figure, its seeds."""
    cli.add_device(p)
    cli.add_jobs(p)
    cli.add_threads(p)
    cli.add_figures(p)
    cli.add_seeds(p, None, seeds)
    p.add_argument("--print-commands", action="store_true", help="print the train.py commands of the unfinished runs and exit")
