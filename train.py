"""Train the 2-layer transformer on K Markov chains and follow it through the algorithmic phases
(Sec. "Identifying in-context memorization and generalization regimes", Fig. 2; Appendix
"Training Process", "Phase Identification").

    python train.py --K 256                     # quick preset on a CPU, paper preset on CUDA
    python train.py --K 1024 --preset paper     # the appendix's hyper-parameters
    python train.py --K 256 --resume            # continue a killed run exactly where it stopped
    python train.py --K 256 --overwrite         # start afresh where a run is (otherwise an error)
    python train.py --K 64,80,94 --seeds 0-15 --out runs/k1   # a (K, seed) grid, one run directory per model
    python train.py --K inf --per-chain 64      # K = infinity, with the per-chain memorization scores
    python train.py --sweep                     # Fig. 2b/2c: the preset's K grid, then heat maps

The first lines of a run say its preset, steps and output directory. A directory that already holds a
run is only reused with --resume or --overwrite, and never by two processes at once (OUT/.lock).
Each run writes to runs/<name>/: config.json, metrics.jsonl (one JSON object per evaluation),
ckpt.pt (latest resumable state: model, optimizer, RNG, step; written atomically),
model_<step>.pt (weights at every evaluation step) and fig2a.png.

A grid (lists and ranges in --K and --seeds) writes OUT/K<K>_s<seed>/ per model. On CUDA its models train
together in one process as an ensemble (ensemble.py), --group at a time, with one atomic checkpoint
OUT/ckpt_group<i>.pt; on a CPU they run as one-thread processes, --jobs at a time, unless --ensemble.

metrics.jsonl rows: the log-spaced full evaluations {"step", "train_loss", "gen_loss", "kl_<predictor>",
"phi_delta_1", ..., "n_A_2"}, and with --eval-every M also, every M steps and at the last, dense rows {"step", "dense": true,
"train_loss", "gen_loss", "phi_delta_1", "phi_delta_2", "phi_beta_1", "phi_beta_2", "train_loss_2gen"} on a smaller
held-out set (eval_dense sequences; train_loss_2gen: the 2-Gen predictor's loss on the same sequences from S).
read_metrics(dir) returns the full rows, read_metrics(dir, dense=True) the dense. With --per-chain P, per_chain.jsonl
holds at every full evaluation {"step", "delta": [Delta^k for every chain of S]} (per_chain_scores), read by
read_per_chain(dir).

--K inf trains at K = infinity: every training sequence from a fresh chain (markov.FreshChains). There is no S,
so "train" evaluations are on fresh chains too, the memorizing predictors (1-Mem, 2-Mem) are dropped from the
rows, and the per-chain scores are taken on per_chain_tasks fixed chains of D_T (the paper's calibration of
the memorization threshold epsilon).
"""
import argparse
import fcntl
import inspect
import json
import math
import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, fields

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.colors import LogNorm

import cli
import fastdata
from bayes import COLORS, LABELS, PREDICTORS, nll, predict
from ensemble import Ensemble, GraphedStep, Single
from evaluation import evaluate, make_dense_data, make_eval_data, make_per_chain_data, per_chain_scores
from markov import FreshChains, TaskSet, check_int, task_source
from transformer import Transformer


@dataclass
class Config:
    K: int | float = 256  # number of training chains |S|; math.inf: a fresh chain of D_T for every sequence
    preset: str = "quick"  # "quick" (CPU-sized) or "paper" (the appendix's hyper-parameters)
    N: int = 128  # predictions per sequence; sequences hold N + 1 states
    iters: int = 2000  # optimizer steps
    batch: int = 128  # sequences per step
    lr: float = 1e-3  # AdamW learning rate
    beta1: float = 0.9  # AdamW
    beta2: float = 0.95  # AdamW
    weight_decay: float = 1e-3  # AdamW
    D: int = 64  # embedding dimension
    mlp_width: int = 0  # hidden units of both MLPs (0: the paper's 4 D); fewer store fewer chains (Fig. 8d-f's D_phi)
    C: int = 10  # Markov states
    seed: int = 0  # model initialization and training batches
    task_seed: int = 0  # the chains of S (nested across K)
    evals: int = 40  # log-spaced evaluation / checkpoint steps
    eval_every: int = 0  # also dense readouts every this many steps (0: off), for threshold searches
    eval_dense: int = 128  # held-out sequences from S and from D_T for the dense readouts
    ckpt_every: int = 500  # also checkpoint at least this often (a killed run loses at most this many steps)
    eval_train: int = 512  # held-out sequences from S (0: 8 K, at most 8192, the paper's choice)
    eval_gen: int = 512  # held-out sequences from fresh chains of D_T (the paper: 2048)
    # the memorization scores Delta^k of Appendix "Transience and Partial Memorization", at the full evaluations:
    per_chain: int = 0  # held-out sequences per chain of S (0: off; the paper: 64, i.e. 64 K sequences)
    per_chain_tasks: int = 1024  # with K = inf: how many fixed chains of D_T are scored (the paper: 10^4)
    # the kinetic perturbations of Fig. 7c (Appendix "Gradient Reweighting", "Task Injection"):
    prev_weight: float = 1.0  # w: gradient through layer 1's previous-token attention scaled by w, forward unchanged
    base_iters: int = 0  # with w < 1, iters = base_iters / w (the paper's x 1/w budget); 0 when not scaled
    task_injection: bool = False  # a learned D-vector per chain of S added to MLP1's input
    device: str = "cpu"  # cpu, cuda or cuda:<i> (the command line's default: cuda if available)
    tf32: bool = False  # CUDA: the model's matmuls in TF32 (10-bit mantissa), as the attention kernel's dots already are
    bf16: bool = False  # mixed precision: the training step's forward in bfloat16 (ensemble.mixed_precision); evaluations in fp32
    out: str = ""  # the run directory (default runs/K<K>_s<seed>); a grid's: OUT/K<K>_s<seed> (default OUT runs/sweep)


MAX_K = 2**16  # S is K C x C chains, and the 1-Mem / 2-Mem predictors weigh all K for every sequence

PRESETS = {
    "quick": dict(N=128, iters=2000, evals=40, eval_train=512, eval_gen=512, ckpt_every=500),
    "paper": dict(N=256, iters=1_000_000, evals=100, eval_train=0, eval_gen=2048, ckpt_every=10_000),
}


def make_config(args: argparse.Namespace) -> Config:
    """Preset values, then every explicitly given flag on top."""
    preset = args.preset or ("paper" if torch.cuda.is_available() else "quick")
    values = dict(PRESETS[preset], preset=preset)
    values.update({f.name: getattr(args, f.name) for f in fields(Config) if getattr(args, f.name, None) is not None})
    values["device"] = cli.device(values.get("device"))  # default: where the preset was chosen for
    cfg = Config(**values)
    if not 0 < cfg.prev_weight <= 1:
        raise ValueError(f"prev_weight must be in (0, 1], got {cfg.prev_weight}")
    if cfg.prev_weight < 1 and cfg.base_iters == 0:  # the slower dynamics get 1/w times the iterations
        cfg.base_iters, cfg.iters = cfg.iters, math.ceil(cfg.iters / cfg.prev_weight)
    if cfg.eval_train == 0:
        cfg.eval_train = min(8 * cfg.K, 8192)  # the paper evaluates L_train on 8 K sequences
    if cfg.K != math.inf:
        check_int("K", cfg.K, 1)
        if cfg.K > MAX_K:
            raise ValueError(f"K must be <= {MAX_K} (the chains of S and the memorizing predictors grow with K), "
                             f"or inf, got {cfg.K}")
    elif cfg.task_injection:
        raise ValueError("task injection learns a vector per chain of S; with K = inf there is no S")
    check_int("N", cfg.N, 2)
    check_int("D", cfg.D, 1)
    check_int("mlp_width", cfg.mlp_width, 0)
    check_int("C", cfg.C, 2)
    check_int("seed", cfg.seed, 0)
    check_int("task_seed", cfg.task_seed, 0)
    check_int("batch", cfg.batch, 1)
    check_int("iters", cfg.iters, 1)
    check_int("evals", cfg.evals, 1)
    check_int("eval_train", cfg.eval_train, 1)
    check_int("eval_gen", cfg.eval_gen, 1)
    check_int("ckpt_every", cfg.ckpt_every, 1)
    check_int("eval_every", cfg.eval_every, 0)
    check_int("eval_dense", cfg.eval_dense, 1)
    check_int("per_chain", cfg.per_chain, 0)
    check_int("per_chain_tasks", cfg.per_chain_tasks, 1)
    if not 0 < cfg.lr < math.inf:  # an infinite rate trains on NaN
        raise ValueError(f"lr must be finite and > 0, got {cfg.lr}")
    for name in ("beta1", "beta2"):
        if not 0 <= getattr(cfg, name) < 1:
            raise ValueError(f"{name} must be in [0, 1), got {getattr(cfg, name)}")
    if not 0 <= cfg.weight_decay < math.inf:
        raise ValueError(f"weight_decay must be finite and >= 0, got {cfg.weight_decay}")
    cfg.out = cfg.out or os.path.join("runs", f"K{cfg.K}_s{cfg.seed}")
    return cfg


def eval_steps(iters: int, n: int) -> list[int]:
    """Step 0, then n log-spaced steps up to and including iters."""
    steps = {0, iters} | {int(round(10 ** (math.log10(iters) * i / n))) for i in range(1, n + 1)}
    return sorted(s for s in steps if s <= iters)


# ----------------------------------------------------------------------------- checkpoints


def save_atomic(obj, path: str):
    """torch.save to a temporary file, then rename: a kill never leaves a half-written checkpoint."""
    tmp = path + ".tmp"
    torch.save(obj, tmp)
    os.replace(tmp, path)


CKPT_KEYS = {"model", "optimizer", "rng", "step", "config"}  # of each model in a checkpoint


def load_checkpoint(path: str, cfgs: list[Config]) -> list[dict]:
    """The per-model entries of the checkpoint at `path` (a single run's, or an ensemble's list of
    them), after checking that they belong to the runs `cfgs`."""
    if not os.path.exists(path):
        raise ValueError(f"--resume: no checkpoint at {path} (--overwrite starts the run afresh)")
    try:
        ckpt = torch.load(path, map_location=cfgs[0].device, weights_only=False)
    except Exception as e:
        what = str(e).strip().splitlines()[0][:200] if str(e).strip() else "no message"
        raise ValueError(f"--resume: {path} is not a complete torch checkpoint ({type(e).__name__}: {what}); "
                         f"--overwrite starts the run afresh") from None
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
        mismatched = [f.name for f in fields(Config) if f.name not in ("device", "out")
                      and saved.get(f.name, f.default) != getattr(cfg, f.name)]
        if mismatched:
            diffs = ", ".join(f"{k}: checkpoint {saved.get(k)!r} vs now {getattr(cfg, k)!r}" for k in mismatched)
            raise ValueError(f"--resume: checkpoint {path} does not match this run ({diffs})")
    return members


RUN_FILES = ("config.json", "metrics.jsonl", "ckpt.pt")  # a directory holding any of them holds a run


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


# ----------------------------------------------------------------------------- training


def train(cfg: Config, resume: bool = False, quiet: bool = False, graph: bool = True,
          overwrite: bool = False) -> list[dict]:
    """Train one model; returns the metrics rows (also in metrics.jsonl). graph: capture the step in a
    CUDA graph (on CUDA only). A directory that holds a run needs resume or overwrite."""
    return fit([cfg], os.path.join(cfg.out, "ckpt.pt"), ensemble=False, resume=resume, quiet=quiet, graph=graph,
               overwrite=overwrite)[0]


def train_ensemble(cfgs: list[Config], ckpt_path: str, resume: bool = False, quiet: bool = False,
                   graph: bool = True, overwrite: bool = False) -> list[list[dict]]:
    """Train the runs `cfgs` together as one ensemble (ensemble.py), each model the same as its single run
    and writing its own run directory; the resumable state of all of them is the one file ckpt_path."""
    step_shape = ("N", "batch", "D", "C", "mlp_width")  # the shapes of a batched step
    common = [f.name for f in fields(Config) if f.name not in ("K", "seed", "out", "eval_train")]
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
    return fit(cfgs, ckpt_path, ensemble=True, resume=resume, quiet=quiet, graph=graph, overwrite=overwrite)


def build_model(cfg: Config) -> Transformer:
    """The run's transformer, with the perturbations its config asks for (weights still to be set)."""
    return Transformer(cfg.C, cfg.D, max_len=cfg.N, prev_weight=cfg.prev_weight,
                       n_tasks=cfg.K if cfg.task_injection else 0, mlp_width=cfg.mlp_width)


def fit(cfgs: list[Config], ckpt_path: str, ensemble: bool, resume: bool, quiet: bool, graph: bool,
        overwrite: bool = False) -> list[list[dict]]:
    """The training loop of one run (ensemble=False, one config) or of an ensemble: per model its task set
    S, generator, evaluation data and run directory; evaluations and checkpoints at common steps."""
    for cfg in cfgs:  # before reading the checkpoint: --resume --overwrite is one error, not two
        check_run_dir(cfg.out, resume, overwrite)
    members = load_checkpoint(ckpt_path, cfgs) if resume else None  # fail fast on a missing or mismatched checkpoint
    locks = [open_run_dir(cfg.out, resume, overwrite) for cfg in cfgs]  # held until the end (or the process)
    c0, E = cfgs[0], len(cfgs)
    if not quiet:
        where = (f"writing {c0.out}/ (config.json, metrics.jsonl, ckpt.pt, model_<step>.pt, fig2a.png)" if E == 1 else
                 f"{E} runs as one ensemble, writing {os.path.dirname(c0.out)}/K*_s*/, checkpoint {ckpt_path}")
        print(run_header(cfgs, where, members[0]["step"] if resume else None), flush=True)
    device = torch.device(c0.device)
    graph = graph and device.type == "cuda"
    torch.backends.cuda.matmul.allow_tf32 = c0.tf32  # process-wide; only CUDA matmuls read it
    tasks = [task_source(cfg.K, cfg.C, seed=cfg.task_seed, device=device) for cfg in cfgs]
    models = []
    for cfg in cfgs:
        model = build_model(cfg)
        model.reset_parameters(torch.Generator().manual_seed(cfg.seed))  # on the CPU: same init on every device
        models.append(model.to(device))
    adamw = dict(lr=c0.lr, betas=(c0.beta1, c0.beta2), weight_decay=c0.weight_decay, capturable=graph)
    trainer = Ensemble(models, bf16=c0.bf16, **adamw) if ensemble else Single(models[0], bf16=c0.bf16, **adamw)
    gens = [torch.Generator(device).manual_seed(cfg.seed) for cfg in cfgs]
    data = [make_eval_data(cfg, t, predict=fastdata.predict) for cfg, t in zip(cfgs, tasks)]
    if c0.eval_every:
        dense = [torch.stack(split) for split in zip(*(make_dense_data(cfg, t) for cfg, t in zip(cfgs, tasks)))]
        # the 2-Gen predictor's loss on the same sequences, the level that defines tau_2mem (thresholds.py)
        dense_2gen = [nll(predict("2gen", seqs, t.T)[:, :-1], seqs).mean().item() for seqs, t in zip(dense[0], tasks)]
    if c0.per_chain:
        scored = [make_per_chain_data(cfg, t) for cfg, t in zip(cfgs, tasks)]
    metrics_paths = [os.path.join(cfg.out, "metrics.jsonl") for cfg in cfgs]
    chain_paths = [os.path.join(cfg.out, "per_chain.jsonl") for cfg in cfgs]
    start, rows = 0, [[] for _ in cfgs]
    if resume:
        trainer.load_member_states(members)
        for g, member in zip(gens, members):
            g.set_state(member["rng"].cpu())
        start = members[0]["step"]
    for cfg, run_rows, path, chain_path in zip(cfgs, rows, metrics_paths, chain_paths):
        with open(os.path.join(cfg.out, "config.json"), "w") as f:
            json.dump(asdict(cfg), f, indent=1)
        run_rows += rewrite_rows(path, start if resume else -1)  # rows logged after the checkpoint will be redone
        if cfg.per_chain:
            rewrite_rows(chain_path, start if resume else -1)

    def log(e: int, row: dict):
        rows[e].append(row)
        append_row(metrics_paths[e], row)

    def checkpoint(step: int) -> list[dict]:
        states = [{**trainer.member_state(e), "rng": g.get_state(), "step": step, "config": asdict(cfg)}
                  for e, (cfg, g) in enumerate(zip(cfgs, gens))]
        for cfg, state in zip(cfgs, states):  # weights gone to NaN after a finite last loss
            if not all(v.isfinite().all() for v in state["model"].values() if v.is_floating_point()):
                raise ValueError(diverged(cfg, step, "weights", ckpt_path))
        save_atomic({"step": step, "members": states} if ensemble else states[0], ckpt_path)
        return states

    shape = (E, c0.batch, c0.N + 1)
    step_fn = GraphedStep(trainer, shape, device).step if graph else trainer.step
    evals = set(eval_steps(c0.iters, c0.evals))
    dense_steps = set(range(0, c0.iters + 1, c0.eval_every)) | {c0.iters} if c0.eval_every else set()  # and the end
    t0 = t_print = time.time()
    eval_seconds, evals_done = 0.0, 0  # this process's full evaluations: log-spaced, so not in the step rate
    loss = torch.full((E,), float("nan"))
    for step in range(start, c0.iters + 1):
        show = not quiet and step > start and (step in evals or step == c0.iters or time.time() - t_print >= PROGRESS_SECONDS)
        if step > start and (show or step in evals or step in dense_steps or step % c0.ckpt_every == 0):
            losses = loss.tolist()  # waits for the device: only where the step waits anyway or prints
            for cfg, value in zip(cfgs, losses):
                if not math.isfinite(value):  # stop before the evaluation or checkpoint would record it
                    raise ValueError(diverged(cfg, step, f"loss ({value})", ckpt_path))
        if step in evals and not (resume and step == start):
            t_eval = time.time()
            for e, cfg in enumerate(cfgs):
                model = trainer.model(e)
                log(e, {"step": step, **evaluate(model, data[e])})
                if cfg.per_chain:
                    delta = per_chain_scores(model, scored[e]).tolist()
                    append_row(chain_paths[e], {"step": step, "delta": [round(v, 6) for v in delta]})
                save_atomic(model.state_dict(), os.path.join(cfg.out, f"model_{step:07d}.pt"))
            eval_seconds, evals_done = eval_seconds + time.time() - t_eval, evals_done + 1
        if step in dense_steps and not (resume and step == start):
            values = {k: v.tolist() for k, v in trainer.readouts(*dense).items()}  # the one wait for the device
            for e in range(E):
                log(e, {"step": step, "dense": True, **{k: v[e] for k, v in values.items()}, "train_loss_2gen": dense_2gen[e]})
        if (step in evals or step % c0.ckpt_every == 0) and step > start or step == c0.iters:
            states = checkpoint(step)
        if show:
            rate, eta = progress_rate(step - start, c0.iters - step, time.time() - t0, eval_seconds, evals_done,
                                      sum(s > step for s in evals))
            print_progress(step, c0.iters, losses, rows, rate, eta)
            t_print = time.time()
        if step == c0.iters:
            break
        seqs, chains = fastdata.batches(tasks, c0.batch, c0.N + 1, gens)  # each member's own batch, drawn together
        loss = step_fn(seqs, chains)  # seqs (E, B, N + 1), their chains (E, B)
    for e, cfg in enumerate(cfgs):
        if ensemble:  # each finished member looks like a finished single run
            save_atomic(states[e], os.path.join(cfg.out, "ckpt.pt"))
        plot_run([r for r in rows[e] if not r.get("dense")], cfg, os.path.join(cfg.out, "fig2a.png"))
    if not quiet:
        where = cfgs[0].out if E == 1 else os.path.dirname(cfgs[0].out) + "/K*_s*"
        print(f"done in {(time.time() - t0) / 60:.1f} min: {where}/metrics.jsonl, fig2a.png")
    for lock in locks:  # now: the frame may outlive the call (reference cycles), and a caller may train here next
        lock.close()
    return rows


def append_row(path: str, row: dict):
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")


def rewrite_rows(path: str, last_step: int) -> list[dict]:
    """Keep the JSON-lines rows of `path` up to step last_step (-1: none, a fresh file); returns them."""
    kept = []
    if os.path.exists(path):
        with open(path) as f:
            kept = [r for r in map(json.loads, f) if r["step"] <= last_step]
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in kept)
    return kept


PROGRESS_SECONDS = 30  # a progress line at least this often: late log-spaced evaluations are far apart


def run_header(cfgs: list[Config], where: str, resume_step: int | None) -> str:
    """The first lines of a run: what it will do (the same command is a 10^6-step run on a GPU) and where it writes."""
    c0 = cfgs[0]
    what = (f"preset {c0.preset}: {c0.iters} steps of batch {c0.batch} at N = {c0.N}, {c0.evals} log-spaced "
            f"evaluations, on {c0.device}")
    return "\n".join([what, where] + ([] if resume_step is None else [f"resuming from step {resume_step}"]))


def progress_rate(steps_done: int, steps_left: int, seconds: float, eval_seconds: float, evals_done: int,
                  evals_left: int) -> tuple[float, float]:
    """(training steps per second, seconds left). The rate leaves the evaluations' time out: they are
    log-spaced, dense early and sparse late, so folded into the rate they would inflate the ETA of a young
    run; the remaining evaluations are added at their measured mean cost."""
    rate = steps_done / max(seconds - eval_seconds, 1e-9)
    return rate, steps_left / max(rate, 1e-9) + evals_left * eval_seconds / max(evals_done, 1)


def diverged(cfg: Config, step: int, what: str, ckpt_path: str) -> str:
    return (f"training diverged: {cfg.out} has non-finite {what} at step {step}; stopped, {ckpt_path} (if any) "
            f"keeps the last good state; a lower --lr with --overwrite starts afresh")


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


# ----------------------------------------------------------------------------- figures


def plot_run(rows: list[dict], cfg: Config, path: str):
    """Fig. 2a/2c for one K: losses against the predictor levels, and the readouts, vs step."""
    steps = [r["step"] for r in rows]
    names = [name for name in PREDICTORS if f"kl_{name}" in rows[0]]  # K = inf: no memorizing predictors
    fig, axes = plt.subplots(1, 4, figsize=(18, 4.8))
    for ax, split, title in ((axes[0], "train", "L_train (sequences from S)"), (axes[1], "gen", "L_gen (fresh chains)")):
        ax.plot(steps, [r[f"{split}_loss"] for r in rows], "k.-", label="transformer")
        for name in names:
            ax.axhline(rows[0][f"{split}_loss_{name}"], color=COLORS[name], ls="--", lw=1, label=LABELS[name])
        ax.set_title(title)
        ax.set_ylabel("loss (nats)")
        legend_below(ax)
    for name in names:
        axes[2].plot(steps, [r[f"kl_{name}"] for r in rows], color=COLORS[name], label=LABELS[name])
    axes[2].set_yscale("log")
    axes[2].set_title("divergence D(predictor, model)")
    legend_below(axes[2])
    for key, label, style in (("phi_delta_1", "phi_delta (1)", "tab:purple"), ("phi_beta_2", "phi_beta (2)", "tab:blue"),
                              ("n_A_1", "n_A (1) / N", "tab:gray"), ("n_A_2", "n_A (2) / N", "k")):
        scale = cfg.N if key.startswith("n_A") else 1
        axes[3].plot(steps, [r[key] / scale for r in rows], color=style, label=label)
    axes[3].set_title("mechanistic readouts")
    legend_below(axes[3])
    for ax in axes:
        ax.set_xscale("symlog", linthresh=1, linscale=0.3)  # log-spaced steps, with step 0 at x = 0 (not on top of step 1)
        ax.set_xlim(left=0)
        ax.set_xlabel("step")
    fig.suptitle(f"K = {cfg.K}, N = {cfg.N}, preset {cfg.preset}, seed {cfg.seed}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def legend_below(ax):
    """The legend under the panel, where it covers no curve."""
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3, frameon=False)


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


# ----------------------------------------------------------------------------- runs as a library (trace.py, ...)


def load_run(run_dir: str, step: int | None = None, device: str = "cpu") -> tuple[Config, list[dict], Transformer, TaskSet | FreshChains]:
    """A finished or partial run: (config, metrics rows, the model at evaluation step `step` (default:
    the last saved one) in eval mode, its task set S)."""
    if not os.path.exists(os.path.join(run_dir, "config.json")) or not os.path.exists(os.path.join(run_dir, "metrics.jsonl")):
        raise ValueError(f"{run_dir!r} is not a run directory (no config.json / metrics.jsonl)")
    saved, rows = read_metrics(run_dir)
    cfg = Config(**{f.name: saved[f.name] for f in fields(Config) if f.name in saved})
    steps = [r["step"] for r in rows if os.path.exists(os.path.join(run_dir, f"model_{r['step']:07d}.pt"))]
    if not steps:
        raise ValueError(f"{run_dir!r} holds no model_<step>.pt")
    step = steps[-1] if step is None else step
    if step not in steps:
        raise ValueError(f"{run_dir!r} has no checkpoint at step {step} (saved: {steps[0]}..{steps[-1]})")
    model = build_model(cfg)
    model.load_state_dict(torch.load(os.path.join(run_dir, f"model_{step:07d}.pt"), map_location=device))
    tasks = task_source(cfg.K, cfg.C, seed=cfg.task_seed, device=device)
    return cfg, rows, model.to(device).eval(), tasks


def ensure_run(run_dir: str | None, K: int, seed: int = 0) -> str:
    """run_dir if given (it must exist); else runs/K<K>_s<seed>, trained now with the quick preset on the
    CPU unless it is already complete (resumed if a checkpoint is there). The default inputs of the
    analysis scripts, so that they run end to end from a fresh clone."""
    if run_dir is not None:
        load_run(run_dir)  # fails with a one-line error on a directory that is not a run
        return run_dir
    cfg = Config(**{**PRESETS["quick"], "K": K, "seed": seed, "preset": "quick"})
    cfg.out = os.path.join("runs", f"K{K}_s{seed}")
    metrics = os.path.join(cfg.out, "metrics.jsonl")
    if os.path.exists(metrics) and read_metrics(cfg.out)[1][-1]["step"] == cfg.iters:
        return cfg.out
    print(f"training the missing quick run {cfg.out} (python train.py --K {K} --seed {seed} --preset quick)", flush=True)
    resume = os.path.exists(os.path.join(cfg.out, "ckpt.pt"))
    train(cfg, resume=resume, overwrite=not resume)  # a partial run without a checkpoint is redone
    return cfg.out


def plot_sweep(sweep_dir: str, path: str):
    """Fig. 2b/2c: divergence to each predictor and the readouts over (K, step), from the runs' metrics
    (seeds averaged)."""
    if not os.path.isdir(sweep_dir):
        raise ValueError(f"no sweep directory {sweep_dir} (--out names it; default runs/sweep)")
    runs = {}
    for name in sorted(os.listdir(sweep_dir)):
        d = os.path.join(sweep_dir, name)
        if os.path.exists(os.path.join(d, "metrics.jsonl")):
            cfg, rows = read_metrics(d)
            runs.setdefault(cfg["K"], []).append((cfg, rows))
    if not runs:
        raise ValueError(f"no runs with metrics.jsonl under {sweep_dir}")
    Ks = sorted(runs)
    steps = [r["step"] for r in runs[Ks[0]][0][1]]
    keys = [("kl_1gen", "D(1-Gen)"), ("kl_2gen", "D(2-Gen)"), ("kl_1mem", "D(1-Mem)"), ("kl_2mem", "D(2-Mem)"),
            ("phi_delta_1", "phi_delta (1)"), ("phi_beta_2", "phi_beta (2)"), ("n_A_1", "n_A (1) / N"), ("n_A_2", "n_A (2) / N")]
    fig, axes = plt.subplots(2, 4, figsize=(18, 7))
    summary = {"K": Ks, "step": steps}
    for ax, (key, title) in zip(axes.flat, keys):
        grid = np.array([[np.mean([rows[i][key] / (cfg["N"] if key.startswith("n_A") else 1) for cfg, rows in runs[K]])
                          for i in range(len(steps))] for K in Ks])
        summary[key] = grid.tolist()
        if key.startswith("kl"):  # darker = closer to the predictor
            im = ax.pcolormesh(np.maximum(steps, 1), Ks, grid, shading="nearest", cmap="Greys_r",
                               norm=LogNorm(vmin=1e-3, vmax=1.0))
        else:
            im = ax.pcolormesh(np.maximum(steps, 1), Ks, grid, shading="nearest", cmap="viridis", vmin=0, vmax=1)
        fig.colorbar(im, ax=ax)
        ax.set_xscale("log")
        ax.set_yscale("log", base=2)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.set_ylabel("K")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    with open(os.path.splitext(path)[0] + ".json", "w") as f:
        json.dump(summary, f)


# ----------------------------------------------------------------------------- command line


SWEEP_KS = {"quick": [4, 16, 64, 256, 1024], "paper": [2**i for i in range(3, 11)]}


def parse_list(flag: str, text: str, inf: bool = False) -> list[int | float]:
    """'64,80,94', '0-15' or mixed '0-3,7' -> the integers in that order (ranges inclusive); with inf=True
    the item 'inf' is math.inf (K = inf). A malformed item, an empty range or a repeated value is an error."""
    values = []
    for item in text.split(","):
        if inf and item.strip() == "inf":
            values.append(math.inf)
            continue
        m = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", item)
        if m is None:
            raise ValueError(f"{flag}: cannot read {item!r} in {text!r} (write e.g. 64,80,94 or 0-15 or 0-3,7)")
        lo, hi = int(m[1]), int(m[2] or m[1])
        if hi < lo:
            raise ValueError(f"{flag}: empty range {item!r} (write low-high)")
        values += range(lo, hi + 1)
    repeated = sorted({v for v in values if values.count(v) > 1})
    if repeated:
        raise ValueError(f"{flag}: {', '.join(map(str, repeated))} listed more than once in {text!r}")
    return values


def make_configs(args: argparse.Namespace) -> list[Config]:
    """One Config per (K, seed) of the grid given by --K and --seeds, K-major. A grid puts each model
    in OUT/K<K>_s<seed>; a single (K, seed) is a single run in OUT (default runs/K<K>_s<seed>)."""
    preset = args.preset or ("paper" if torch.cuda.is_available() else "quick")
    Ks = parse_list("--K", args.K, inf=True) if args.K else SWEEP_KS[preset] if args.sweep else [Config.K]
    seeds = parse_list("--seeds", args.seeds)
    grid = len(Ks) * len(seeds) > 1 or args.sweep
    cfgs = []
    for K in Ks:
        for seed in seeds:
            out = os.path.join(grid_dir(args), f"K{K}_s{seed}") if grid else args.out
            cfgs.append(make_config(argparse.Namespace(**{**vars(args), "K": K, "seed": seed, "out": out})))
    return cfgs


def grid_dir(args: argparse.Namespace) -> str:
    return args.out or os.path.join("runs", "sweep")


def member_commands(args: argparse.Namespace, cfgs: list[Config]) -> list[list[str]]:
    """One independent `python train.py` per model of the grid, each a line a scheduler can run as is."""
    passthrough = []
    for f in fields(Config):
        value = getattr(args, f.name, None)
        if value is not None and f.name not in ("K", "seed", "out", "preset"):
            passthrough += [f"--{f.name.replace('_', '-')}"] + ([] if f.type is bool else [str(value)])
    passthrough += ["--resume"] * args.resume + ["--overwrite"] * args.overwrite + ["--no-graph"] * args.no_graph
    return [[sys.executable, os.path.abspath(__file__), "--K", str(cfg.K), "--seed", str(cfg.seed), "--preset", cfg.preset,
             "--out", cfg.out, "--threads", "1", *passthrough] for cfg in cfgs]


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


def train_grid(args: argparse.Namespace, cfgs: list[Config]):
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


def flag_help() -> dict[str, str]:
    """Each Config field's flag help: its comment in the dataclass (written once, there), then the default,
    or the quick and paper presets' values where the preset sets it."""
    comments = dict(re.findall(r"^    (\w+): [^#\n]+#\s*(.+)$", inspect.getsource(Config), re.M))
    out = {}
    for f in fields(Config):
        if f.name in PRESETS["quick"]:
            default = f"quick {PRESETS['quick'][f.name]}, paper {PRESETS['paper'][f.name]}"
        else:
            default = f"default {f.default}"
        text = comments.get(f.name, "")
        out[f.name] = text if "default" in text or f.type is bool else f"{text} ({default})"
    return out


def main():
    parser = cli.ArgumentParser(description=__doc__.split("\n\n")[0])
    cli.add_preset(parser, PRESETS, "the preset sets N, iters, evals, eval_train, eval_gen, ckpt_every")
    parser.add_argument("--K", default=None, help="K, or a list / ranges for a grid: 64,80,94 or 16-20 "
                        f"(default {Config.K}; --sweep: quick {SWEEP_KS['quick']}, paper 8..1024; at most {MAX_K}); "
                        "inf: a fresh chain for every sequence")
    cli.add_seeds(parser, "0", "model seeds, one run each", "--seeds", "--seed")
    helps = flag_help()
    for f in fields(Config):
        flag = f"--{f.name.replace('_', '-')}"
        if f.type is bool:
            parser.add_argument(flag, action="store_true", default=None, dest=f.name, help=helps[f.name])
        elif f.name not in ("preset", "K", "seed", "base_iters", "device"):  # base_iters is set from --prev-weight
            parser.add_argument(flag, type=type(f.default), default=None, dest=f.name, help=helps[f.name])
    cli.add_device(parser)
    cli.add_threads(parser)
    cli.add_jobs(parser)
    cli.add_figures(parser)
    parser.add_argument("--resume", action="store_true", help="continue from the checkpoint(s) under OUT")
    parser.add_argument("--overwrite", action="store_true",
                        help="start afresh in a run directory that holds a run, deleting its files (without "
                             "--resume or --overwrite such a directory is an error)")
    parser.add_argument("--no-graph", action="store_true", help="CUDA: run the step eagerly, not as a CUDA graph")
    parser.add_argument("--ensemble", action="store_true", help="train a grid as one-process ensembles on the CPU too")
    parser.add_argument("--group", type=int, default=64, help="grid: models per ensemble")
    parser.add_argument("--print-commands", action="store_true", help="print one command per model of the grid and exit")
    parser.add_argument("--sweep", action="store_true",
                        help="Fig. 2b/2c: train the grid (default: the preset's Ks) in OUT (default runs/sweep), "
                             "then draw FIGURES/fig2bc.png")
    parser.add_argument("--plot-sweep", action="store_true", help="only draw the Fig. 2b/2c heat maps from the runs in OUT")
    args = parser.parse_args()
    cli.set_threads(args.threads)
    cfgs = make_configs(args)
    if args.print_commands:
        print("\n".join(shlex.join(c) for c in member_commands(args, cfgs)))
        return
    if args.plot_sweep and not os.path.isdir(grid_dir(args)):
        raise ValueError(f"--plot-sweep: no sweep directory {grid_dir(args)} (--out names it)")
    if args.sweep or args.plot_sweep:
        cli.writable_dir(args.figures, "--figures")
    if not args.plot_sweep:
        if len(cfgs) == 1 and not args.sweep:
            train(cfgs[0], resume=args.resume, graph=not args.no_graph, overwrite=args.overwrite)
            return
        train_grid(args, cfgs)
    if args.sweep or args.plot_sweep:
        path = os.path.join(args.figures, "fig2bc.png")
        plot_sweep(grid_dir(args), path)
        print(f"wrote {path} and its .json")


if __name__ == "__main__":
    cli.run(main)
