"""Run directories, checkpoints and progress lines: the bookkeeping of a run (train.py) and of an ensemble
(runners/grids.py) that is not the science. Imports no script of this repository.

    check_run_dir, RunDir          a run directory is written only on purpose (--resume, --overwrite) and by one
                                   process at a time (OUT/.lock)
    load_data, load_checkpoint     a checkpoint is loaded as data only (weights_only) and must belong to the run
                                   that resumes it
    save_atomic, append_row, read_rows, rewrite_rows    files written so that a kill never leaves half of one
    check_finite, interrupted      a diverged run stops before it records NaN; Ctrl-C's one line, read from the disk
    Progress                       the progress lines of a run or an ensemble, with an honest ETA
"""
import fcntl
import json
import math
import os
import re
import time
from contextlib import contextmanager
from dataclasses import fields

import torch

# ----------------------------------------------------------------------------- run directories and checkpoints

RUN_FILES = ("config.json", "metrics.jsonl", "ckpt.pt")  # a directory holding any of them holds a run
CKPT_KEYS = {"model", "optimizer", "rng", "step", "config"}  # of each model in a checkpoint


def holds_run(out: str, ckpt: str | None = None) -> bool:
    """Whether `out` holds a run that can be resumed: its files and a checkpoint (ckpt: the run's resumable state,
    an ensemble's group file; out/ckpt.pt either way). A run stopped before its first checkpoint left nothing to
    resume, and its directory is started afresh without a flag."""
    checkpoints = [os.path.join(out, "ckpt.pt")] + ([ckpt] if ckpt else [])
    return any(os.path.exists(c) for c in checkpoints) and any(os.path.exists(os.path.join(out, f)) for f in RUN_FILES)


def check_run_dir(out: str, resume: bool, overwrite: bool, ckpt: str | None = None):
    """A directory that holds a run is only written again on purpose: two runs with the same K and seed
    would otherwise truncate each other's metrics and checkpoints."""
    if resume and overwrite:
        raise ValueError("--resume and --overwrite exclude each other")
    if not (resume or overwrite) and holds_run(out, ckpt):
        raise ValueError(f"{out} already holds a run: --resume continues it, --overwrite starts it afresh")


def open_run_dir(out: str, resume: bool = False, overwrite: bool = False, ckpt: str | None = None):
    """Create `out` and lock it for this process; returns the open lock file, to be held while training.
    A one-line error now, rather than a traceback at the first evaluation, on a directory that cannot be
    written, that holds a run (unless resume or overwrite), or that another process is training in.
    flock belongs to the open file, so the OS releases it when the process dies, even by kill -9: a lock
    file left behind is no lock."""
    check_run_dir(out, resume, overwrite, ckpt)
    path = os.path.join(out, ".lock")
    while True:
        try:
            os.makedirs(out, exist_ok=True)
            lock = open(path, "w")
        except OSError as e:
            raise ValueError(f"cannot write to output directory {out!r} ({e.strerror})") from None
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            raise ValueError(f"another process is training in {out} (it holds {out}/.lock)") from None
        try:  # a run that ends removes its .lock (release_run_dir): the lock taken must be on the file still there
            if os.fstat(lock.fileno()).st_ino == os.stat(path).st_ino:
                break
        except FileNotFoundError:
            pass
        lock.close()
    if overwrite or not resume:  # the old run's files (a run that never checkpointed) would otherwise mix with the new
        remove_run_files(out)
    return lock


def remove_run_files(out: str):
    """Remove what a run writes in `out` (RUN_FILES, per_chain.jsonl, fig2a.png, model_<step>.pt), nothing else."""
    for name in os.listdir(out):
        if name in RUN_FILES or name in ("per_chain.jsonl", "fig2a.png") or re.fullmatch(r"model_\d+\.pt|ckpt\.pt\.tmp", name):
            os.remove(os.path.join(out, name))


def release_run_dir(lock):
    """Remove OUT/.lock while still holding it, then let it go: a finished or stopped run leaves no lock file behind
    (open_run_dir takes a lock only on the file still at the path, so a process that opened the removed one retries)."""
    try:
        os.remove(lock.name)
    except FileNotFoundError:
        pass
    lock.close()


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
        first = str(e).strip().splitlines()[0] if str(e).strip() else "no message"
        what = first.split(". ")[0].rstrip(".")  # torch's first sentence: its advice is about other files
        raise ValueError(f"{path} is not a complete torch checkpoint, truncated or not one at all ({type(e).__name__}: "
                         f"{what})") from None


def load_checkpoint(path: str, cfgs: list) -> list[dict]:
    """The per-model entries of the checkpoint at `path` (a single run's, or an ensemble's list of
    them), after checking that they belong to the runs `cfgs` (train.Config)."""
    if not os.path.exists(path):
        raise ValueError(f"--resume: no checkpoint at {path}, nothing to resume (without --resume the run starts afresh)")
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


class RunDir:
    """The run directories of a run or an ensemble, held for the training (`with RunDir(...) as run:`): every check
    before anything is written, then each directory locked (OUT/.lock) until the end. members: the checkpoint's
    entries with resume, else None. An interrupt before the training loop (the set-up: the held-out data, the
    predictors, compilation) says what is on disk and what the same command will do, and leaves no directory that
    holds nothing but its lock."""

    def __init__(self, cfgs: list, ckpt_path: str, resume: bool, overwrite: bool):
        for cfg in cfgs:  # before reading the checkpoint: --resume --overwrite is one error, not two
            check_run_dir(cfg.out, resume, overwrite, ckpt_path)
        self.cfgs, self.ckpt_path = cfgs, ckpt_path
        self.members = load_checkpoint(ckpt_path, cfgs) if resume else None
        self.new = [cfg.out for cfg in cfgs if not os.path.exists(cfg.out)]
        self.locks = [open_run_dir(cfg.out, resume, overwrite, ckpt_path) for cfg in cfgs]

    def __enter__(self):
        return self

    def __exit__(self, kind, error, trace):
        for lock in self.locks:  # now: the frame may outlive the call, and a caller may train here next
            release_run_dir(lock)
        if kind is not None and issubclass(kind, KeyboardInterrupt) and not os.path.exists(self.ckpt_path):
            for cfg in self.cfgs:  # stopped before the first checkpoint: nothing to resume, so nothing left behind
                remove_run_files(cfg.out)
            for out in self.new:
                if not os.listdir(out):
                    os.rmdir(out)
        if kind is not None and issubclass(kind, KeyboardInterrupt) and not str(error):  # not yet the loop's message
            raise interrupted(None, self.ckpt_path) from None
        return False

    def complete(self, quiet: bool) -> bool:
        """Whether a resumed checkpoint is already at the last step (then say so: nothing is redone or rewritten)."""
        c0 = self.cfgs[0]
        if self.members is None or self.members[0]["step"] < c0.iters:
            return False
        if not quiet:
            where = c0.out if len(self.cfgs) == 1 else os.path.dirname(c0.out) + "/K*_s*"
            print(f"{where} is already complete ({c0.iters} steps, {self.ckpt_path}); nothing to do", flush=True)
        return True


def save_atomic(obj, path: str):
    """torch.save to a temporary file, then rename: a kill never leaves a half-written checkpoint."""
    tmp = path + ".tmp"
    torch.save(obj, tmp)
    os.replace(tmp, path)


def write_atomic(path: str, text: str):
    """Text written whole or not at all (a temporary file renamed over the path): a kill leaves the previous file."""
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


def write_json(path: str, obj, indent: int | None = None):
    """write_atomic of obj as JSON: every figure's, run's and ledger's JSON is written this way."""
    write_atomic(path, json.dumps(obj, indent=indent))


def append_row(path: str, row: dict):
    """One JSON line, strict JSON: a NaN or infinity is an error here, never a bare NaN token in the file."""
    with open(path, "a") as f:
        f.write(json.dumps(row, allow_nan=False) + "\n")


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


def check_finite(cfg, step: int, ckpt_path: str, loss: float | None = None, weights: dict | None = None,
                 row: dict | None = None):
    """Stop a diverged run before an evaluation or checkpoint records it: a non-finite loss, weights gone to NaN after
    a finite last loss, or an evaluation row (metrics.jsonl's) with a non-finite number, e.g. of weights ~1e9 whose
    loss is finite but whose evaluation overflows. The message says which checkpoint, read from the disk, is left."""
    bad = [k for k, v in (row or {}).items() if isinstance(v, float) and not math.isfinite(v)]
    what = (f"loss ({loss})" if loss is not None and not math.isfinite(loss) else
            "weights" if weights is not None and not all(v.isfinite().all() for v in weights.values() if v.is_floating_point())
            else f"evaluation ({', '.join(bad[:3])}{', ...' if len(bad) > 3 else ''})" if bad else None)
    if what:
        left = (f"{ckpt_path} keeps step {saved_step(ckpt_path)}, the last finite state" if os.path.exists(ckpt_path)
                else "no checkpoint was written before it")
        raise ValueError(f"training diverged: {cfg.out} has non-finite {what} at step {step}; stopped before writing "
                         f"it ({left}); a lower --lr with --overwrite starts afresh")


def saved_step(ckpt_path: str) -> str:
    """The step of the checkpoint at ckpt_path, as text ("?" where it cannot be read)."""
    try:
        return str(load_data(ckpt_path, "cpu")["step"])
    except (ValueError, KeyError, TypeError):
        return "?"


def interrupted(step: int | None, ckpt_path: str) -> KeyboardInterrupt:
    """Ctrl-C's one line (cli.run prints it, exit 130), read from the disk: checkpoints are written atomically, so
    the one at ckpt_path, if any, stands and --resume continues from it; without one the same command starts
    afresh. step: where the training loop was (None: in the set-up, before it)."""
    where = "during the set-up" if step is None else f"at step {step}"
    if not os.path.exists(ckpt_path):
        return KeyboardInterrupt(f"interrupted {where}, before the first checkpoint: nothing to resume; the same "
                                 "command starts afresh")
    step = saved_step(ckpt_path)
    saved = "its checkpoint" if step == "?" else f"step {step}"
    return KeyboardInterrupt(f"interrupted {where}; --resume continues from {saved} ({ckpt_path})")


# ----------------------------------------------------------------------------- progress

PROGRESS_SECONDS = 30  # a progress line at least this often: late log-spaced evaluations are far apart


def run_header(cfgs: list, where: str, resume_step: int | None, evals: int) -> str:
    """The first lines of a run: what it will do (the same command is a 10^6-step run on a GPU) and where it writes.
    evals: how many full evaluations it writes (log-spaced steps that round to the same one count once)."""
    c0 = cfgs[0]
    what = (f"preset {c0.preset}: {c0.iters} steps of batch {c0.batch} at N = {c0.N}, {evals} full evaluations at "
            f"log-spaced steps, on {c0.device}{threads(c0.device)} in {precision(c0)}")
    return "\n".join([what, where] + ([] if resume_step is None else [f"resuming from step {resume_step}"]))


def threads(device: str) -> str:
    """On a CPU, how many torch threads the steps run on (--threads, or one per core not busy at the start)."""
    n = torch.get_num_threads()
    return f" ({n} thread{'s' if n > 1 else ''})" if device == "cpu" else ""


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
            print(run_header(cfgs, where, resume_step, len(evals)), flush=True)

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
    def evaluation(self, count: bool = True):
        """A full evaluation (count=False: a checkpoint's writing, which comes with each evaluation and is counted
        with them, not in the steps' rate: at the dense early evaluations it would halve a young run's rate)."""
        t = time.time()
        yield
        self.eval_seconds, self.evals_done = self.eval_seconds + time.time() - t, self.evals_done + count

    @contextmanager
    def readout(self):
        t = time.time()
        yield
        self.readout_seconds += time.time() - t

    def phases(self) -> dict[str, float]:
        """Seconds of the set-up (the evaluation data, the models, compilation and capture), of the steps, of the
        dense readouts, of the full evaluations and checkpoints (the steps' time is the loop's less theirs) and of
        the writing after the loop."""
        loop = self.t_end - self.t_train
        return {"set-up": self.t_train - self.t0, "steps": loop - self.readout_seconds - self.eval_seconds,
                "readouts": self.readout_seconds, "evaluations": self.eval_seconds, "writing": time.time() - self.t_end}

    def show(self, step: int, losses: list[float], rows: list[list[dict]]):
        iters = self.cfgs[0].iters
        rate, eta = progress_rate(step - self.start, iters - step, time.time() - self.t_train, self.eval_seconds,
                                  self.evals_done, sum(s > step for s in self.evals))
        print_progress(step, iters, losses, rows, rate, eta)
        self.t_print = time.time()

    def done(self, plotted: bool = True):
        """The last line: the time, its phases and the files each run wrote (fig2a.png when plotted)."""
        if not self.quiet:
            c0 = self.cfgs[0]
            where = c0.out if len(self.cfgs) == 1 else os.path.dirname(c0.out) + "/K*_s*"
            phases = ", ".join(f"{name} {seconds:.0f} s" for name, seconds in self.phases().items())
            print(f"done in {(time.time() - self.t0) / 60:.1f} min ({phases}): {where}/metrics.jsonl"
                  + (", fig2a.png" if plotted else ""))
