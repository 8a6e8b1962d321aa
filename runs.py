"""The engine behind train.py's command line: many runs at once, run directories, and runs read back as
data. train.py trains one run top to bottom; what only serves scale or safety lives here.

    open_run_dir, load_checkpoint   a run directory is written only on purpose (--resume, --overwrite) and by
                                    one process at a time (OUT/.lock); a checkpoint is loaded as data only
                                    (weights_only) and must belong to the run that resumes it
    Progress                        the progress lines of a run or an ensemble, with an ETA
    sampled_step, graphed           the sampler and the step captured once as one CUDA graph (ensemble.GraphedStep):
                                    an ensemble's, and train.py's plain step's
    train_ensemble                  E runs trained together as one ensemble (ensemble.py): each member is the
                                    single run of train.train with its K and seed (tests/test_ensemble.py)
    make_configs, main              the (K, seed) grids of --K and --seeds lists: ensembles of --group models on
                                    CUDA (or with --ensemble), one-thread processes (--jobs) on a CPU;
                                    --print-commands, --sweep and --plot-sweep (Fig. 2b/2c, plot_sweep)
    read_metrics, read_per_chain, load_run, ensure_run    runs as a library (trace.py, task_vectors.py, ...)

A grid writes OUT/K<K>_s<seed>/ per model (default OUT runs/sweep), each a run directory as train.py writes it;
an ensemble also keeps the resumable state of all its members in one atomic checkpoint OUT/ckpt_group<i>.pt.

train.py and runs.py import each other (a run uses the run-directory helpers; a grid builds train.py's
configs and models); each reads the other's names only inside functions, so either may be imported first.
"""
import argparse
import fcntl
import json
import math
import os
import re
import shlex
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict, fields
from types import SimpleNamespace

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.colors import LogNorm

import cli
import fastdata
import train
from bayes import nll, predict
from ensemble import Ensemble, GraphedStep
from evaluation import evaluate, make_dense_data, make_eval_data, make_per_chain_data, per_chain_scores
from markov import FreshChains, TaskSet, check_int, task_source
from transformer import Transformer

# ----------------------------------------------------------------------------- run directories and checkpoints

RUN_FILES = ("config.json", "metrics.jsonl", "ckpt.pt")  # a directory holding any of them holds a run
CKPT_KEYS = {"model", "optimizer", "rng", "step", "config"}  # of each model in a checkpoint


def check_run_dir(out: str, resume: bool, overwrite: bool):
    """A directory that holds a run is only written again on purpose: two runs with the same K and seed
    would otherwise truncate each other's metrics and checkpoints."""
    if resume and overwrite:
        raise ValueError("--resume and --overwrite exclude each other")
    if not (resume or overwrite) and any(os.path.exists(os.path.join(out, f)) for f in RUN_FILES):
        raise ValueError(f"{out} already holds a run: --resume continues it, --overwrite starts it afresh")


def open_run_dir(out: str, resume: bool = False, overwrite: bool = False):
    """Create `out` and lock it for this process; returns the open lock file, to be held while training.
    A one-line error now, rather than a traceback at the first evaluation, on a directory that cannot be
    written, that holds a run (unless resume or overwrite), or that another process is training in.
    flock belongs to the open file, so the OS releases it when the process dies, even by kill -9: a lock
    file left behind is no lock."""
    check_run_dir(out, resume, overwrite)
    try:
        os.makedirs(out, exist_ok=True)
        lock = open(os.path.join(out, ".lock"), "w")
    except OSError as e:
        raise ValueError(f"cannot write to output directory {out!r} ({e.strerror})") from None
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        raise ValueError(f"another process is training in {out} (it holds {out}/.lock)") from None
    if overwrite:  # the old run's evaluation checkpoints would otherwise mix with the new run's
        for name in os.listdir(out):
            if name in RUN_FILES or name == "fig2a.png" or re.fullmatch(r"model_\d+\.pt|ckpt\.pt\.tmp", name):
                os.remove(os.path.join(out, name))
    return lock


def load_data(path: str, device: str):
    """torch.load of a checkpoint or model file as data only (weights_only=True): a file from elsewhere may
    carry pickled code (an object whose unpickling calls a function), which is refused without being run."""
    try:
        return torch.load(path, map_location=device, weights_only=True)
    except Exception as e:
        code = re.search(r"GLOBAL ([\w.]+)|Unsupported class ([\w.]+)", str(e))  # what weights_only refused
        if code:
            raise ValueError(f"{path} holds a pickled object ({code[1] or code[2]}), not only tensors and plain "
                             f"values: refused unread (checkpoints are loaded as data, never as code)") from None
        what = str(e).strip().splitlines()[0][:200] if str(e).strip() else "no message"
        raise ValueError(f"{path} is not a complete torch checkpoint ({type(e).__name__}: {what})") from None


def load_checkpoint(path: str, cfgs: list) -> list[dict]:
    """The per-model entries of the checkpoint at `path` (a single run's, or an ensemble's list of
    them), after checking that they belong to the runs `cfgs` (train.Config)."""
    if not os.path.exists(path):
        raise ValueError(f"--resume: no checkpoint at {path} (--overwrite starts the run afresh)")
    try:
        ckpt = load_data(path, cfgs[0].device)
    except ValueError as e:
        raise ValueError(f"--resume: {e}; --overwrite starts the run afresh") from None
    members = ckpt.get("members", [ckpt]) if isinstance(ckpt, dict) else [None]
    for member in members:
        missing = CKPT_KEYS - set(member) if isinstance(member, dict) else CKPT_KEYS
        if missing:
            raise ValueError(f"--resume: {path} is not a train.py checkpoint (it lacks {', '.join(sorted(missing))})")
    if len(members) != len(cfgs):
        raise ValueError(f"--resume: checkpoint {path} holds {len(members)} models, this run has {len(cfgs)}")
    for member, cfg in zip(members, cfgs):
        saved = member.get("config", {})
        # a field the checkpoint predates had its default then
        mismatched = [f.name for f in fields(cfg) if f.name not in ("device", "out")
                      and saved.get(f.name, f.default) != getattr(cfg, f.name)]
        if mismatched:
            diffs = ", ".join(f"{k}: checkpoint {saved.get(k)!r} vs now {getattr(cfg, k)!r}" for k in mismatched)
            hint = "; --fp32, --tf32, --bf16 name its precision" if {"tf32", "bf16"} & set(mismatched) else ""
            raise ValueError(f"--resume: checkpoint {path} does not match this run ({diffs}{hint})")
    return members


def open_runs(cfgs: list, ckpt_path: str, resume: bool, overwrite: bool) -> tuple[list[dict] | None, list]:
    """The start of a run or ensemble: (the checkpoint's member entries with resume, else None; the held
    locks of the run directories). Every check comes before anything is written."""
    for cfg in cfgs:  # before reading the checkpoint: --resume --overwrite is one error, not two
        check_run_dir(cfg.out, resume, overwrite)
    members = load_checkpoint(ckpt_path, cfgs) if resume else None
    return members, [open_run_dir(cfg.out, resume, overwrite) for cfg in cfgs]


def complete(cfgs: list, members: list[dict] | None, ckpt_path: str, quiet: bool) -> bool:
    """Whether a resumed checkpoint is already at the last step (then say so: nothing is redone or rewritten)."""
    if members is None or members[0]["step"] < cfgs[0].iters:
        return False
    if not quiet:
        where = cfgs[0].out if len(cfgs) == 1 else os.path.dirname(cfgs[0].out) + "/K*_s*"
        print(f"{where} is already complete ({cfgs[0].iters} steps, {ckpt_path}); nothing to do", flush=True)
    return True


def save_atomic(obj, path: str):
    """torch.save to a temporary file, then rename: a kill never leaves a half-written checkpoint."""
    tmp = path + ".tmp"
    torch.save(obj, tmp)
    os.replace(tmp, path)


def append_row(path: str, row: dict):
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")


def read_rows(path: str, last_step: float = math.inf) -> list[dict]:
    """The JSON-lines rows of `path` up to step last_step."""
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [r for r in map(json.loads, f) if r["step"] <= last_step]


def rewrite_rows(path: str, last_step: int) -> list[dict]:
    """Keep the JSON-lines rows of `path` up to step last_step (-1: none, a fresh file); returns them."""
    kept = read_rows(path, last_step)
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in kept)
    return kept


def check_finite(cfg, step: int, ckpt_path: str, loss: float | None = None, weights: dict | None = None):
    """Stop a diverged run before an evaluation or checkpoint records it: a non-finite loss, or weights gone
    to NaN after a finite last loss."""
    what = (f"loss ({loss})" if loss is not None and not math.isfinite(loss) else
            "weights" if weights is not None and not all(v.isfinite().all() for v in weights.values() if v.is_floating_point())
            else None)
    if what:
        raise ValueError(f"training diverged: {cfg.out} has non-finite {what} at step {step}; stopped, {ckpt_path} "
                         f"(if any) keeps the last good state; a lower --lr with --overwrite starts afresh")


def interrupted(step: int, saved: int | None, ckpt_path: str) -> KeyboardInterrupt:
    """Ctrl-C's one line (cli.run prints it, exit 130): checkpoints are written atomically, so the last one stands."""
    if saved is None:
        return KeyboardInterrupt(f"interrupted at step {step}, before the first checkpoint; --overwrite starts afresh")
    return KeyboardInterrupt(f"interrupted at step {step}; --resume continues from step {saved} ({ckpt_path})")


# ----------------------------------------------------------------------------- progress

PROGRESS_SECONDS = 30  # a progress line at least this often: late log-spaced evaluations are far apart


def run_header(cfgs: list, where: str, resume_step: int | None) -> str:
    """The first lines of a run: what it will do (the same command is a 10^6-step run on a GPU) and where it writes."""
    c0 = cfgs[0]
    what = (f"preset {c0.preset}: {c0.iters} steps of batch {c0.batch} at N = {c0.N}, {c0.evals} log-spaced "
            f"evaluations, on {c0.device} in {precision(c0)}")
    return "\n".join([what, where] + ([] if resume_step is None else [f"resuming from step {resume_step}"]))


def precision(cfg) -> str:
    """What a run's training step computes in (train.Config's tf32, bf16; evaluations are fp32 either way)."""
    if cfg.bf16:
        return "bf16 mixed precision" + (" with TF32 matmuls" if cfg.tf32 else "")
    return "TF32 matmuls" if cfg.tf32 else "fp32"


def progress_rate(steps_done: int, steps_left: int, seconds: float, eval_seconds: float, evals_done: int,
                  evals_left: int) -> tuple[float, float]:
    """(training steps per second, seconds left). The rate leaves the evaluations' time out: they are
    log-spaced, dense early and sparse late, so folded into the rate they would inflate the ETA of a young
    run; the remaining evaluations are added at their measured mean cost."""
    rate = steps_done / max(seconds - eval_seconds, 1e-9)
    return rate, steps_left / max(rate, 1e-9) + evals_left * eval_seconds / max(evals_done, 1)


def print_progress(step: int, iters: int, losses: list[float], rows: list[list[dict]], rate: float, eta: float):
    """One line: a single run's numbers, or an ensemble's ranges over its models. eta in seconds."""
    full = [[r for r in run if not r.get("dense")][-1] for run in rows]
    if len(full) == 1:
        r = full[0]
        mem = f", 2-Mem {r['train_loss_2mem']:.4f}" if "train_loss_2mem" in r else ""  # none with K = inf
        print(f"step {step:>7d}/{iters} | batch loss {losses[0]:.4f} | L_train {r['train_loss']:.4f} "
              f"(2-Gen {r['train_loss_2gen']:.4f}{mem}) | L_gen {r['gen_loss']:.4f} "
              f"| phi_delta1 {r['phi_delta_1']:.2f} phi_beta2 {r['phi_beta_2']:.2f} | {rate:.2f} it/s | "
              f"ETA {eta / 60:.1f} min", flush=True)
        return

    def span(key):
        return f"{min(r[key] for r in full):.3f}..{max(r[key] for r in full):.3f}"

    print(f"step {step:>7d}/{iters} | {len(full)} models | batch loss {min(losses):.4f}..{max(losses):.4f} "
          f"| L_train {span('train_loss')} | L_gen {span('gen_loss')} | phi_beta2 {span('phi_beta_2')} "
          f"| {rate * len(full):.1f} model-steps/s | ETA {eta / 60:.1f} min", flush=True)


class Progress:
    """The progress lines of a run (or ensemble) from step `start`: at every full evaluation, at the end, and
    at least every PROGRESS_SECONDS; the rate leaves the evaluations' time out (progress_rate), and the set-up
    before begin() too (evaluation data, compilation, the CUDA graph's capture): on a GPU it can outlast
    thousands of steps, and counted in it would make a young run's ETA hundreds of times too long."""

    def __init__(self, cfgs: list, where: str, start: int, resume_step: int | None, evals: set[int], quiet: bool):
        self.cfgs, self.start, self.evals, self.quiet = cfgs, start, evals, quiet
        self.t0 = self.t_train = self.t_print = self.t_end = time.time()
        self.eval_seconds, self.evals_done = 0.0, 0  # this process's full evaluations
        self.readout_seconds = 0.0  # and dense readouts
        if not quiet:
            print(run_header(cfgs, where, resume_step), flush=True)

    def begin(self):
        """The training loop starts now: the rate is counted from here."""
        self.t_train = time.time()

    def end(self):
        """The training loop is over; what follows (the last checkpoints, the figures) is writing."""
        self.t_end = time.time()

    def due(self, step: int) -> bool:
        iters = self.cfgs[0].iters
        return not self.quiet and step > self.start and (
            step in self.evals or step == iters or time.time() - self.t_print >= PROGRESS_SECONDS)

    @contextmanager
    def evaluation(self):
        t = time.time()
        yield
        self.eval_seconds, self.evals_done = self.eval_seconds + time.time() - t, self.evals_done + 1

    @contextmanager
    def readout(self):
        t = time.time()
        yield
        self.readout_seconds += time.time() - t

    def phases(self) -> dict[str, float]:
        """Seconds of the set-up (the evaluation data, the models, compilation and capture), of the steps, of the
        dense readouts, of the full evaluations (the steps' time is the loop's less theirs) and of the writing
        after the loop."""
        loop = self.t_end - self.t_train
        return {"set-up": self.t_train - self.t0, "steps": loop - self.readout_seconds - self.eval_seconds,
                "readouts": self.readout_seconds, "evaluations": self.eval_seconds, "writing": time.time() - self.t_end}

    def show(self, step: int, losses: list[float], rows: list[list[dict]]):
        iters = self.cfgs[0].iters
        rate, eta = progress_rate(step - self.start, iters - step, time.time() - self.t_train, self.eval_seconds,
                                  self.evals_done, sum(s > step for s in self.evals))
        print_progress(step, iters, losses, rows, rate, eta)
        self.t_print = time.time()

    def done(self):
        if not self.quiet:
            c0 = self.cfgs[0]
            where = c0.out if len(self.cfgs) == 1 else os.path.dirname(c0.out) + "/K*_s*"
            phases = ", ".join(f"{name} {seconds:.0f} s" for name, seconds in self.phases().items())
            print(f"done in {(time.time() - self.t0) / 60:.1f} min ({phases}): {where}/metrics.jsonl, fig2a.png")


# ----------------------------------------------------------------------------- speed


def sampled_step(trainer, tasks: list, gens: list[torch.Generator], shape: tuple[int, int, int], device: torch.device,
                 graph: bool):
    """() -> losses (E,): every member's batch drawn from its task source and generator (fastdata.batches: member
    e's is tasks[e].batch(B, N + 1, gens[e]), shape (E, B, N + 1)), then one step of `trainer`. graph (CUDA): the
    step replayed as a CUDA graph (ensemble.GraphedStep) with the sampler captured inside it, so that sampling costs
    no host launches; K = inf's rejection sampling waits for the device and cannot be captured, so its batches
    are drawn before each replay."""
    def sample():
        return fastdata.batches(tasks, shape[1], shape[2], gens)

    if not graph:
        return lambda: trainer.step(*sample())
    if all(isinstance(t, TaskSet) for t in tasks):
        return GraphedStep(trainer, shape, device, sample=sample, generators=gens).step
    replay = GraphedStep(trainer, shape, device).step
    return lambda: replay(*sample())


def graphed(step, model: Transformer, optimizer: torch.optim.Optimizer, tasks, gen: torch.Generator,
            shape: tuple[int, int], device: torch.device):
    """() -> loss: one model's training step(seqs (B, N + 1), chains (B,)) on the batch tasks.batch(*shape, gen)
    draws, on CUDA, sampler and step captured once as a CUDA graph and replayed (sampled_step: forward, backward
    and AdamW in one launch, the same computation on the same batches). The optimizer must be created with
    capturable=True."""
    trainer = SimpleNamespace(parameters=lambda: list(model.parameters()), opt=optimizer,  # an ensemble of one
                              step=lambda seqs, chains: step(seqs[0], chains[0])[None])
    replay = sampled_step(trainer, [tasks], [gen], (1, *shape), device, graph=True)
    return lambda: replay()[0]


# ----------------------------------------------------------------------------- ensembles


def train_ensemble(cfgs: list, ckpt_path: str, resume: bool = False, quiet: bool = False,
                   graph: bool = True, overwrite: bool = False) -> list[list[dict]]:
    """Train the runs `cfgs` together as one ensemble (ensemble.py), each model the same as its single run
    (train.train) and writing its own run directory; the resumable state of all of them is the one file
    ckpt_path. Returns each model's metrics rows."""
    step_shape = ("N", "batch", "D", "C", "mlp_width")  # the shapes of a batched step
    common = [f.name for f in fields(cfgs[0]) if f.name not in ("K", "seed", "out", "eval_train")]
    for cfg in cfgs[1:]:
        differ = [k for k in common if getattr(cfg, k) != getattr(cfgs[0], k)]
        if differ:
            why = "shapes of the batched step" if set(differ) & set(step_shape) else "the common training schedule"
            raise ValueError(f"ensemble members differ in {', '.join(differ)} ({why}); train them in separate groups")
    if cfgs[0].task_injection and len({cfg.K for cfg in cfgs}) > 1:
        raise ValueError("with task injection the embedding table is (K, D), a shape of the batched step: "
                         "members must share K; train them in separate groups")
    outs = [cfg.out for cfg in cfgs]
    if len(set(outs)) != len(outs):
        raise ValueError("ensemble members need distinct output directories")
    members, locks = open_runs(cfgs, ckpt_path, resume, overwrite)
    if complete(cfgs, members, ckpt_path, quiet):
        for lock in locks:
            lock.close()
        return [read_rows(os.path.join(cfg.out, "metrics.jsonl")) for cfg in cfgs]
    c0, E = cfgs[0], len(cfgs)
    start = members[0]["step"] if resume else 0
    evals = set(train.eval_steps(c0.iters, c0.evals))
    progress = Progress(cfgs, f"{E} runs as one ensemble, writing {os.path.dirname(c0.out)}/K*_s*/, checkpoint {ckpt_path}",
                        start, start if resume else None, evals, quiet)
    device = torch.device(c0.device)
    graph = graph and device.type == "cuda"
    torch.backends.cuda.matmul.allow_tf32 = c0.tf32  # process-wide; only CUDA matmuls read it
    tasks = [task_source(cfg.K, cfg.C, seed=cfg.task_seed, device=device) for cfg in cfgs]
    models = []
    for cfg in cfgs:
        model = train.build_model(cfg)
        model.reset_parameters(torch.Generator().manual_seed(cfg.seed))  # as train.train: the same init on every device
        models.append(model.to(device))
    trainer = Ensemble(models, bf16=c0.bf16, lr=c0.lr, betas=(c0.beta1, c0.beta2), weight_decay=c0.weight_decay,
                       capturable=graph)
    gens = [torch.Generator(device).manual_seed(cfg.seed) for cfg in cfgs]
    data = [make_eval_data(cfg, t, predict=fastdata.predict) for cfg, t in zip(cfgs, tasks)]  # as train.train's
    if c0.eval_every:
        dense = [torch.stack(split) for split in zip(*(make_dense_data(cfg, t) for cfg, t in zip(cfgs, tasks)))]
        # the 2-Gen predictor's loss on the same sequences, the level that defines tau_2mem (thresholds.py)
        dense_2gen = [nll(predict("2gen", seqs, t.T)[:, :-1], seqs).mean().item() for seqs, t in zip(dense[0], tasks)]
    if c0.per_chain:
        scored = [make_per_chain_data(cfg, t) for cfg, t in zip(cfgs, tasks)]
    metrics_paths = [os.path.join(cfg.out, "metrics.jsonl") for cfg in cfgs]
    chain_paths = [os.path.join(cfg.out, "per_chain.jsonl") for cfg in cfgs]
    if resume:
        trainer.load_member_states(members)
        for g, member in zip(gens, members):
            g.set_state(member["rng"].cpu())
    rows = []
    for cfg, path, chain_path in zip(cfgs, metrics_paths, chain_paths):
        with open(os.path.join(cfg.out, "config.json"), "w") as f:
            json.dump(asdict(cfg), f, indent=1)
        rows.append(rewrite_rows(path, start if resume else -1))  # rows logged after the checkpoint will be redone
        if cfg.per_chain:
            rewrite_rows(chain_path, start if resume else -1)

    def log(e: int, row: dict):
        rows[e].append(row)
        append_row(metrics_paths[e], row)

    def checkpoint(step: int) -> list[dict]:
        states = [{**trainer.member_state(e), "rng": g.get_state(), "step": step, "config": asdict(cfg)}
                  for e, (cfg, g) in enumerate(zip(cfgs, gens))]
        for cfg, state in zip(cfgs, states):
            check_finite(cfg, step, ckpt_path, weights=state["model"])
        save_atomic({"step": step, "members": states}, ckpt_path)
        return states

    step_fn = sampled_step(trainer, tasks, gens, (E, c0.batch, c0.N + 1), device, graph)  # each member's own batch
    dense_steps = set(range(0, c0.iters + 1, c0.eval_every)) | {c0.iters} if c0.eval_every else set()  # and the end
    saved, loss = start if resume else None, None  # the last checkpoint's step; the last step's losses
    progress.begin()
    try:
        for step in range(start, c0.iters + 1):
            show, new = progress.due(step), step > start or not resume  # new: not yet in the run's files
            if step > start and (show or step in evals or step in dense_steps or step % c0.ckpt_every == 0):
                losses = loss.tolist()  # waits for the device: only where the step waits anyway or prints
                for cfg, value in zip(cfgs, losses):
                    check_finite(cfg, step, ckpt_path, loss=value)
            if step in evals and new:
                with progress.evaluation():
                    for e, cfg in enumerate(cfgs):
                        model = trainer.model(e)
                        log(e, {"step": step, **evaluate(model, data[e])})
                        if cfg.per_chain:
                            delta = per_chain_scores(model, scored[e]).tolist()
                            append_row(chain_paths[e], {"step": step, "delta": [round(v, 6) for v in delta]})
                        save_atomic(model.state_dict(), os.path.join(cfg.out, f"model_{step:07d}.pt"))
            if step in dense_steps and new:
                with progress.readout():
                    values = {k: v.tolist() for k, v in trainer.readouts(*dense).items()}  # the one wait for the device
                for e in range(E):
                    log(e, {"step": step, "dense": True, **{k: v[e] for k, v in values.items()},
                            "train_loss_2gen": dense_2gen[e]})
            if step > start and (step in evals or step % c0.ckpt_every == 0 or step == c0.iters):
                states, saved = checkpoint(step), step
            if show:
                progress.show(step, losses, rows)
            if step == c0.iters:
                break
            loss = step_fn()  # every member's batch drawn, then one step of all: losses (E,)
    except KeyboardInterrupt:
        raise interrupted(step, saved, ckpt_path) from None
    progress.end()
    for e, cfg in enumerate(cfgs):  # each finished member looks like a finished single run
        save_atomic(states[e], os.path.join(cfg.out, "ckpt.pt"))
        train.plot_run([r for r in rows[e] if not r.get("dense")], cfg, os.path.join(cfg.out, "fig2a.png"))
    progress.done()
    for lock in locks:  # now: the frame may outlive the call (reference cycles), and a caller may train here next
        lock.close()
    return rows


# ----------------------------------------------------------------------------- grids

SWEEP_KS = {"quick": [4, 16, 64, 256, 1024], "paper": [2**i for i in range(3, 11)]}


def grid_dir(args: argparse.Namespace) -> str:
    return args.out or os.path.join("runs", "sweep")


def make_configs(args: argparse.Namespace) -> list:
    """One train.Config per (K, seed) of the grid given by --K and --seeds, K-major. A grid puts each model
    in OUT/K<K>_s<seed>; a single (K, seed) is a single run in OUT (default runs/K<K>_s<seed>)."""
    preset = cli.preset(args.preset)
    Ks = cli.parse_list("--K", args.K, inf=True) if args.K else SWEEP_KS[preset] if args.sweep else [train.Config.K]
    seeds = cli.parse_list("--seeds", args.seeds)
    grid = len(Ks) * len(seeds) > 1 or args.sweep
    cfgs = []
    for K in Ks:
        for seed in seeds:
            out = os.path.join(grid_dir(args), f"K{K}_s{seed}") if grid else args.out
            cfgs.append(train.make_config(argparse.Namespace(**{**vars(args), "K": K, "seed": seed, "out": out})))
    return cfgs


def member_commands(args: argparse.Namespace, cfgs: list) -> list[list[str]]:
    """One independent `python train.py` per model of the grid, each a line a scheduler can run as is."""
    passthrough = []
    for f in fields(train.Config):
        value = getattr(args, f.name, None)
        if value is not None and f.name not in ("K", "seed", "out", "preset"):
            passthrough += [f"--{f.name.replace('_', '-')}"] + ([] if f.type is bool else [str(value)])
    passthrough += ["--resume"] * args.resume + ["--overwrite"] * args.overwrite + ["--no-graph"] * args.no_graph
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
    for cfg in cfgs:  # one line now, not one failed process per run that exists
        check_run_dir(cfg.out, args.resume, args.overwrite)
    os.makedirs(grid_dir(args), exist_ok=True)
    if not (args.ensemble or cfgs[0].device.startswith("cuda")):
        print(run_header(cfgs, f"{len(cfgs)} runs as one-thread processes, {jobs} at a time, writing "
                               f"{grid_dir(args)}/K*_s*/ (their output in {grid_dir(args)}/K*_s*.log)", None), flush=True)
        run_processes(member_commands(args, cfgs), jobs)
        return
    for i in range(0, len(cfgs), size):
        ckpt = os.path.join(grid_dir(args), f"ckpt_group{i // size}.pt")
        train_ensemble(cfgs[i : i + size], ckpt, resume=args.resume, graph=not args.no_graph, overwrite=args.overwrite)


def main(args: argparse.Namespace, cfgs: list):
    """train.py's command line beyond one run: a grid, --print-commands, --sweep, --plot-sweep."""
    if args.print_commands:
        print("\n".join(shlex.join(c) for c in member_commands(args, cfgs)))
        return
    if args.plot_sweep and not os.path.isdir(grid_dir(args)):
        raise ValueError(f"--plot-sweep: no sweep directory {grid_dir(args)} (--out names it)")
    if args.sweep or args.plot_sweep:
        cli.writable_dir(args.figures, "--figures")
    if not args.plot_sweep:
        train_grid(args, cfgs)
    if args.sweep or args.plot_sweep:
        path = os.path.join(args.figures, "fig2bc.png")
        plot_sweep(grid_dir(args), path)
        print(f"wrote {path} and its .json")


def plot_sweep(sweep_dir: str, path: str):
    """Fig. 2b/2c from the run directories under sweep_dir: the figure at path, its numbers next to it (.json)."""
    if not os.path.isdir(sweep_dir):
        raise ValueError(f"no sweep directory {sweep_dir} (--out names it; default runs/sweep)")
    by_K = {}
    for name in sorted(os.listdir(sweep_dir)):
        d = os.path.join(sweep_dir, name)
        if os.path.exists(os.path.join(d, "metrics.jsonl")):
            cfg, rows = read_metrics(d)
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
        if key.startswith("kl"):  # darker = closer to the predictor
            im = ax.pcolormesh(np.maximum(summary["step"], 1), summary["K"], summary[key], shading="nearest",
                               cmap="Greys_r", norm=LogNorm(vmin=1e-3, vmax=1.0))
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


# ----------------------------------------------------------------------------- runs as a library (trace.py, ...)


def read_metrics(run_dir: str, dense: bool = False) -> tuple[dict, list[dict]]:
    """(config, rows): the full evaluations, or with dense=True the --eval-every rows."""
    with open(os.path.join(run_dir, "config.json")) as f:
        cfg = json.load(f)
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return cfg, [r for r in map(json.loads, f) if r.get("dense", False) == dense]


def read_per_chain(run_dir: str) -> list[dict]:
    """The memorization scores of a run with --per-chain: rows {"step", "delta": [Delta^k per chain]}."""
    path = os.path.join(run_dir, "per_chain.jsonl")
    if not os.path.exists(path):
        raise ValueError(f"{run_dir!r} has no per_chain.jsonl (train it with --per-chain)")
    with open(path) as f:
        return list(map(json.loads, f))


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
