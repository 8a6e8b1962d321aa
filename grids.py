"""The engine behind train.py's grids: many runs at once, as ensembles on a GPU or as one-thread processes on a
CPU, and Fig. 2b/2c drawn from a grid's runs. train.py trains one run top to bottom; its main() hands a grid here.

    train_ensemble                 E runs trained together as one ensemble (ensemble.py) through train.py's loop:
                                   each member is the single run of train.train with its K and seed (tests/test_ensemble.py)
    member_commands, run_processes, train_grid, main    the (K, seed) grids of --K and --seeds lists: ensembles of
                                   --group models on CUDA (or with --ensemble), one-thread processes (--jobs) on a CPU;
                                   --print-commands, --sweep and --plot-sweep
    plot_sweep, sweep_summary, draw_sweep               Fig. 2b/2c from the runs of a grid (or a campaign's ledger)

A grid writes OUT/K<K>_s<seed>/ per model (default OUT runs/sweep), each a run directory as train.py writes it;
an ensemble also keeps the resumable state of all its members in one atomic checkpoint OUT/ckpt_group<i>.pt.
"""
import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from dataclasses import fields

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.colors import LogNorm

import bayes
import cli
import fastdata
import rundir
import runs
import train
from ensemble import Ensemble, sampled_step
from markov import check_int, task_source

# ----------------------------------------------------------------------------- ensembles


def train_ensemble(cfgs: list[train.Config], ckpt_path: str, resume: bool = False, quiet: bool = False,
                   fast: bool = True, overwrite: bool = False, plot: bool = True) -> list[list[dict]]:
    """Train the runs `cfgs` together as one ensemble (ensemble.Ensemble: one vmapped step of all), each model the
    same as its single run (train.train: the same initial weights, batches, evaluations and files) and writing its
    own run directory through train.py's loop; the resumable state of all of them is the one file ckpt_path.
    fast (CUDA): the step replayed as a CUDA graph with the sampler inside (the Triton kernels stay either way).
    plot=False: no member draws its fig2a.png (~0.5 s of the host's time each: half a minute of a 64-model ensemble's).
    Returns each model's metrics rows."""
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
    members, locks = rundir.open_runs(cfgs, ckpt_path, resume, overwrite)
    if rundir.complete(cfgs, members, ckpt_path, quiet):
        for lock in locks:
            lock.close()
        return [rundir.read_rows(os.path.join(cfg.out, "metrics.jsonl")) for cfg in cfgs]
    c0, E = cfgs[0], len(cfgs)
    start = members[0]["step"] if resume else 0
    progress = rundir.Progress(cfgs, f"{E} runs as one ensemble, writing {os.path.dirname(c0.out)}/K*_s*/, checkpoint "
                                     f"{ckpt_path}", start, start if resume else None,
                               set(train.eval_steps(c0.iters, c0.evals)), quiet)
    device = torch.device(c0.device)
    graph = fast and device.type == "cuda"
    torch.backends.cuda.matmul.allow_tf32 = c0.tf32  # process-wide; only CUDA matmuls read it
    tasks = [task_source(cfg.K, cfg.C, seed=cfg.task_seed, device=device) for cfg in cfgs]
    trainer = Ensemble([train.init_model(cfg, device) for cfg in cfgs], bf16=c0.bf16, lr=c0.lr,
                       betas=(c0.beta1, c0.beta2), weight_decay=c0.weight_decay, capturable=graph)
    gens = [torch.Generator(device).manual_seed(cfg.seed) for cfg in cfgs]
    if resume:
        trainer.load_member_states(members)
        for g, member in zip(gens, members):
            g.set_state(member["rng"].cpu())
    shared = {}  # the held-out sets of members at one K, built once
    records = [train.Record(cfg, t, start if resume else None, fastdata.predict if fast else bayes.predict, shared)
               for cfg, t in zip(cfgs, tasks)]
    if c0.eval_every:
        dense = [torch.stack(split) for split in zip(*(r.dense for r in records))]  # (E, n, N + 1) and chains (E, n)

    def readouts() -> dict[str, list[float]]:
        return {k: v.tolist() for k, v in trainer.readouts(*dense).items()}  # the one wait for the device

    step = sampled_step(trainer, tasks, gens, (E, c0.batch, c0.N + 1), device, graph)  # each member's own batch
    states = train.loop(records, step, trainer.model, readouts, lambda: [trainer.member_state(e) for e in range(E)],
                        gens, start, resume, ckpt_path, progress,
                        lambda states: rundir.save_atomic({"step": states[0]["step"], "members": states}, ckpt_path))
    for record, state in zip(records, states):  # each finished member looks like a finished single run
        rundir.save_atomic(state, os.path.join(record.cfg.out, "ckpt.pt"))
        if plot:
            record.plot()
    progress.done(plot)
    for lock in locks:  # now: the frame may outlive the call (reference cycles), and a caller may train here next
        lock.close()
    return [record.rows for record in records]


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


def train_grid(args: argparse.Namespace, cfgs: list):
    """On CUDA (or with --ensemble) the grid as ensembles of --group models, one after the other, each
    resumable from its own OUT/ckpt_group<i>.pt; otherwise as one-thread processes."""
    jobs, size = check_int("--jobs", args.jobs, 1), check_int("--group", args.group, 1)
    ensembles = args.ensemble or cfgs[0].device.startswith("cuda")
    for i, cfg in enumerate(cfgs):  # one line now, not one failed process per run that exists
        group = os.path.join(train.grid_dir(args), f"ckpt_group{i // size}.pt") if ensembles else None
        rundir.check_run_dir(cfg.out, args.resume, args.overwrite, group)
    os.makedirs(train.grid_dir(args), exist_ok=True)
    if not ensembles:
        out = train.grid_dir(args)
        print(rundir.run_header(cfgs, f"{len(cfgs)} runs as one-thread processes, {jobs} at a time, writing {out}/K*_s*/ "
                                      f"(their output in {out}/K*_s*.log)", None), flush=True)
        run_processes(member_commands(args, cfgs), jobs)
        return
    for i in range(0, len(cfgs), size):
        ckpt = os.path.join(train.grid_dir(args), f"ckpt_group{i // size}.pt")
        train_ensemble(cfgs[i : i + size], ckpt, resume=args.resume, fast=not args.plain, overwrite=args.overwrite)


def main(args: argparse.Namespace, cfgs: list):
    """train.py's command line beyond one run: a grid, --print-commands, --sweep, --plot-sweep."""
    if args.print_commands:
        print("\n".join(shlex.join(c) for c in member_commands(args, cfgs)))
        return
    if args.plot_sweep and not os.path.isdir(train.grid_dir(args)):
        raise ValueError(f"--plot-sweep: no sweep directory {train.grid_dir(args)} (--out names it)")
    if args.sweep or args.plot_sweep:
        cli.writable_dir(args.figures, "--figures")
    if not args.plot_sweep:
        train_grid(args, cfgs)
    if args.sweep or args.plot_sweep:
        path = os.path.join(args.figures, "fig2bc.png")
        plot_sweep(train.grid_dir(args), path)
        print(f"wrote {path} and its .json")


def plot_sweep(sweep_dir: str, path: str):
    """Fig. 2b/2c from the run directories under sweep_dir: the figure at path, its numbers next to it (.json)."""
    if not os.path.isdir(sweep_dir):
        raise ValueError(f"no sweep directory {sweep_dir} (--out names it; default runs/sweep)")
    by_K = {}
    for name in sorted(os.listdir(sweep_dir)):
        d = os.path.join(sweep_dir, name)
        if os.path.exists(os.path.join(d, "metrics.jsonl")):
            cfg, rows = runs.read_metrics(d)
            by_K.setdefault(cfg["K"], []).append((cfg, rows))
    if not by_K:
        raise ValueError(f"no runs with metrics.jsonl under {sweep_dir}")
    summary = sweep_summary(by_K)
    draw_sweep(summary, path)
    with open(os.path.splitext(path)[0] + ".json", "w") as f:
        json.dump(summary, f)


SWEEP_KEYS = (("kl_1gen", "D(1-Gen)"), ("kl_2gen", "D(2-Gen)"), ("kl_1mem", "D(1-Mem)"), ("kl_2mem", "D(2-Mem)"),
              ("phi_delta_1", "phi_delta (1)"), ("phi_beta_2", "phi_beta (2)"), ("n_A_1", "n_A (1) / N"),
              ("n_A_2", "n_A (2) / N"))


def sweep_summary(by_K: dict) -> dict:
    """Fig. 2b/2c's numbers from {K: [(config, full evaluation rows), one per seed]} (run directories, or a
    campaign's ledger): per readout the seeds' mean over (K, step), n_A as a fraction of N. The runs share their
    evaluation steps."""
    Ks = sorted(by_K)
    steps = [r["step"] for r in by_K[Ks[0]][0][1]]
    summary = {"K": Ks, "step": steps}
    for key, _ in SWEEP_KEYS:
        summary[key] = [[float(np.mean([rows[i][key] / (cfg["N"] if key.startswith("n_A") else 1) for cfg, rows in by_K[K]]))
                         for i in range(len(steps))] for K in Ks]
    return summary


def draw_sweep(summary: dict, path: str):
    """Fig. 2b/2c: the divergence to each predictor and the readouts over (K, step), from sweep_summary's numbers."""
    fig, axes = plt.subplots(2, 4, figsize=(18, 7))
    for ax, (key, title) in zip(axes.flat, SWEEP_KEYS):
        if key.startswith("kl"):  # darker = closer to the predictor; each panel's own range, on a log scale
            values = np.asarray(summary[key], dtype=float)
            low, high = max(np.nanmin(values), 1e-4), max(np.nanmax(values), 2e-4)
            im = ax.pcolormesh(np.maximum(summary["step"], 1), summary["K"], values, shading="nearest",
                               cmap="Greys_r", norm=LogNorm(vmin=low, vmax=max(high, 1.01 * low)))
        else:
            im = ax.pcolormesh(np.maximum(summary["step"], 1), summary["K"], summary[key], shading="nearest",
                               cmap="viridis", vmin=0, vmax=1)
        fig.colorbar(im, ax=ax)
        ax.set_xscale("log")
        ax.set_yscale("log", base=2)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.set_ylabel("K")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
