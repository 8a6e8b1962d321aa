"""Train the 2-layer transformer on K Markov chains and follow it through the algorithmic phases
(Sec. "Identifying in-context memorization and generalization regimes", Fig. 2; Appendix
"Training Process", "Phase Identification").

    python train.py --K 256                     # quick preset on a CPU; on CUDA the paper preset, in bf16 (--fp32)
    python train.py --K 1024 --preset paper     # the appendix's hyper-parameters
    python train.py --K 256 --resume            # continue a stopped run from its last checkpoint, exactly
    python train.py --K 256 --overwrite         # start afresh where a run is (otherwise an error)
    python train.py --K inf --per-chain 64      # K = infinity, with the per-chain memorization scores
    python train.py --K 64,80,94 --seeds 0-15 --out runs/k1   # a (K, seed) grid, one run directory per model
    python train.py --sweep                     # Fig. 2b/2c: the preset's K grid, then heat maps
    python train.py --replot figures/fig2a_K256.json   # redraw a run's Fig. 2a from its rows

This file is one run, top to bottom: the Config and its presets, the data, the model and its optimizer, the
training step on the page (`train`), what a run evaluates and writes (`Record`) and the loop (`loop`), which the
ensembles of a grid (grids.py) run too. Run directories, checkpoints and progress lines are rundir.py's. The
engine is imported only where it is used: the speed block of `train` (--plain turns it off) and main()'s grids.

A run writes to runs/K<K>_s<seed>/ (or --out): config.json, metrics.jsonl (one JSON object per evaluation),
ckpt.pt (latest resumable state: model, optimizer, RNG, step, config; written atomically), model_<step>.pt
(weights at every evaluation step) and fig2a.png. Its first lines say the preset, steps, precision and directory; a
directory that holds a run is only reused with --resume or --overwrite, and never by two processes at once.

metrics.jsonl rows: the log-spaced full evaluations {"step", "train_loss", "gen_loss", "kl_<predictor>",
"phi_delta_1", ..., "n_A_2"}, and with --eval-every M also, every M steps and at the last, dense rows {"step", "dense": true,
"train_loss", "gen_loss", "phi_delta_1", "phi_delta_2", "phi_beta_1", "phi_beta_2", "train_loss_2gen"} on a smaller
held-out set (eval_dense sequences; train_loss_2gen: the 2-Gen predictor's loss on the same sequences from S).
runs.read_metrics(dir) returns the full rows, read_metrics(dir, dense=True) the dense. With --per-chain P,
per_chain.jsonl holds at every full evaluation {"step", "delta": [Delta^k for every chain of S]} (per_chain_scores).

--K inf trains at K = infinity: every training sequence from a fresh chain (markov.FreshChains). There is no S,
so "train" evaluations are on fresh chains too, the memorizing predictors (1-Mem, 2-Mem) are dropped from the
rows, and the per-chain scores are taken on per_chain_tasks fixed chains of D_T (the paper's calibration of
the memorization threshold epsilon).
"""
import argparse
import inspect
import json
import math
import os
import re
from dataclasses import asdict, dataclass, fields

import matplotlib.pyplot as plt
import torch
from matplotlib.ticker import FixedLocator

import bayes
import cli
import rundir
from bayes import COLORS, LABELS, PREDICTORS, nll
from evaluation import evaluate, lm_loss, make_dense_data, make_eval_data, make_per_chain_data, per_chain_scores
from evaluation import readouts as dense_readouts
from markov import check_int, task_source
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
    # precision: on CUDA the command line's default is both (CUDA_PRECISION; --fp32 turns both off), on a CPU neither
    tf32: bool = False  # CUDA: the model's matmuls in TF32 (10-bit mantissa), as the attention kernel's dots already are
    bf16: bool = False  # mixed precision: the training step's forward in bfloat16 (train_step's ctx); evaluations in fp32
    out: str = ""  # the run directory (default runs/K<K>_s<seed>); a grid's: OUT/K<K>_s<seed> (default OUT runs/sweep)


MAX_K = 2**16  # S is K C x C chains, and the 1-Mem / 2-Mem predictors weigh all K for every sequence
MINIMUM = dict(N=2, D=1, mlp_width=0, C=2, seed=0, task_seed=0, batch=1, iters=1, evals=1, eval_train=1, eval_gen=1,
               ckpt_every=1, eval_every=0, eval_dense=1, per_chain=0, per_chain_tasks=1)  # of the integer fields

# The command line's precision on CUDA when no flag names one: bf16 mixed precision with TF32 matmuls, whose graphed
# step (one fixed batch) ran at 1.43-1.98x TF32's rate for 1 to 64 models on an H100 (0.97-1.82x with sampling
# outside the graph; bench/results/2026-11-27_h100_bench_train_c.log, bench/README.md). Its evidence: the same 4
# paper-preset models (K = 94, 3000 steps) trained in TF32 and in bf16 on an H100 reached the same tau_2gen for 3 of
# 4 seeds and max phi_beta(2) within 0.0014; the fourth (the latest to generalize) 300 steps later and 0.013 lower,
# where two TF32 runs of it differed by 200 steps (bench/results/2026-11-27_h100_grid_a.log, 2026-11-26_h100_grid_e.log).
CUDA_PRECISION = dict(tf32=True, bf16=True)

PRESETS = {
    "quick": dict(N=128, iters=2000, evals=40, eval_train=512, eval_gen=512, ckpt_every=500),
    "paper": dict(N=256, iters=1_000_000, evals=100, eval_train=0, eval_gen=2048, ckpt_every=10_000),
}


def make_config(args: argparse.Namespace) -> Config:
    """Preset values, then every explicitly given flag on top; a bad value is a ValueError."""
    preset = cli.preset(args.preset)
    values = dict(PRESETS[preset], preset=preset)
    values.update({f.name: getattr(args, f.name) for f in fields(Config) if getattr(args, f.name, None) is not None})
    values["device"] = cli.device(values.get("device"))  # default: where the preset was chosen for
    named = [f"--{k}" for k in CUDA_PRECISION if k in values]
    if getattr(args, "fp32", False):
        if named:
            raise ValueError(f"--fp32 excludes {' and '.join(named)}")
    elif values["device"].startswith("cuda") and not named:
        values.update(CUDA_PRECISION)
    cfg = Config(**values)
    if not 0 < cfg.prev_weight <= 1:
        raise ValueError(f"prev_weight must be in (0, 1], got {cfg.prev_weight}")
    if cfg.prev_weight < 1 and cfg.base_iters == 0:  # the slower dynamics get 1/w times the iterations
        cfg.base_iters, cfg.iters = cfg.iters, math.ceil(cfg.iters / cfg.prev_weight)
    if cfg.eval_train == 0:
        cfg.eval_train = min(8 * cfg.K, 8192)  # the paper evaluates L_train on 8 K sequences
    if cfg.K != math.inf and check_int("K", cfg.K, 1) > MAX_K:
        raise ValueError(f"K must be <= {MAX_K} (the chains of S and the memorizing predictors grow with K), or inf, "
                         f"got {cfg.K}")
    if cfg.K == math.inf and cfg.task_injection:
        raise ValueError("task injection learns a vector per chain of S; with K = inf there is no S")
    for name, low in MINIMUM.items():
        check_int(name, getattr(cfg, name), low)
    for name, ok, rule in (("lr", 0 < cfg.lr < math.inf, "finite and > 0"), ("beta1", 0 <= cfg.beta1 < 1, "in [0, 1)"),
                           ("beta2", 0 <= cfg.beta2 < 1, "in [0, 1)"),
                           ("weight_decay", 0 <= cfg.weight_decay < math.inf, "finite and >= 0")):
        if not ok:  # an infinite learning rate trains on NaN
            raise ValueError(f"{name} must be {rule}, got {getattr(cfg, name)}")
    cfg.out = cfg.out or os.path.join("runs", f"K{cfg.K}_s{cfg.seed}")
    return cfg


def eval_steps(iters: int, n: int) -> list[int]:
    """Step 0 and up to n log-spaced steps up to and including iters (steps that round to the same one count once)."""
    steps = {0, iters} | {int(round(10 ** (math.log10(iters) * i / n))) for i in range(1, n + 1)}
    return sorted(s for s in steps if s <= iters)


def build_model(cfg: Config) -> Transformer:
    """The run's transformer, with the perturbations its config asks for (weights still to be set)."""
    return Transformer(cfg.C, cfg.D, max_len=cfg.N, prev_weight=cfg.prev_weight,
                       n_tasks=cfg.K if cfg.task_injection else 0, mlp_width=cfg.mlp_width)


# ----------------------------------------------------------------------------- one run


def init_model(cfg: Config, device: torch.device) -> Transformer:
    """The run's transformer with its initial weights, drawn on the CPU so that every device starts from the same."""
    model = build_model(cfg)
    model.reset_parameters(torch.Generator().manual_seed(cfg.seed))
    return model.to(device)


def train(cfg: Config, resume: bool = False, quiet: bool = False, fast: bool = True, overwrite: bool = False,
          plot: bool = True) -> list[dict]:
    """Train one model; returns its metrics rows (also in metrics.jsonl). resume: from OUT/ckpt.pt, exactly as if
    never stopped; overwrite: start afresh where a run is. fast: the engine's speed (the speed block below), the
    same computation to float rounding; fast=False (--plain) is this file and the modules it imports, alone.
    plot=False: no fig2a.png (a probe of a search: its figure is the search's, and a plot costs ~0.5 s)."""
    ckpt_path = os.path.join(cfg.out, "ckpt.pt")
    members, locks = rundir.open_runs([cfg], ckpt_path, resume, overwrite)  # checks, then OUT/.lock until the end
    if rundir.complete([cfg], members, ckpt_path, quiet):  # --resume of a finished run: nothing to redo
        locks[0].close()
        return rundir.read_rows(os.path.join(cfg.out, "metrics.jsonl"))
    ckpt = members[0] if resume else None
    start = ckpt["step"] if ckpt else 0
    progress = rundir.Progress([cfg], f"writing {cfg.out}/ (config.json, metrics.jsonl, ckpt.pt, model_<step>.pt"
                                      + (", fig2a.png)" if plot else ")"), start, start if ckpt else None, set(eval_steps(cfg.iters, cfg.evals)), quiet)
    device = torch.device(cfg.device)
    torch.backends.cuda.matmul.allow_tf32 = cfg.tf32  # process-wide; only CUDA matmuls read it

    # the data (S: K chains, or fresh chains with K = inf), the model and its optimizer (App. "Training Process": AdamW)
    tasks = task_source(cfg.K, cfg.C, seed=cfg.task_seed, device=device)
    gen = torch.Generator(device).manual_seed(cfg.seed)  # the training batches
    model = init_model(cfg, device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), weight_decay=cfg.weight_decay)
    if ckpt:
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(rundir.with_capturable(ckpt["optimizer"], False))
        gen.set_state(ckpt["rng"].cpu())
    ctx = torch.autocast(device.type, torch.bfloat16, enabled=cfg.bf16, cache_enabled=False)  # --bf16: train_step

    def train_step(seqs: torch.Tensor, chains: torch.Tensor) -> torch.Tensor:
        """One AdamW step on the training loss (evaluation.lm_loss: the cross-entropy of s_{n+1} given s_0..s_n,
        averaged over the N predictions of the B sequences). chains (B,): each sequence's chain (task injection).
        --bf16: the forward in bfloat16, weights, gradients and loss in fp32; no cast cache, which a CUDA graph
        would replay stale after AdamW changed the weights."""
        with ctx:
            loss = lm_loss(model, seqs, chains)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return loss.detach()

    # one step: the batch, seqs (B, N + 1) from the chains (B,) of S it drew, then one AdamW step on it
    step, predict = (lambda: train_step(*tasks.batch(cfg.batch, cfg.N + 1, gen))), bayes.predict
    if fast:  # the speed block: the engine, imported only here; the same computation to float rounding
        from ensemble import accelerate_run  # noqa: PLC0415
        step, predict = accelerate_run(model, optimizer, train_step, tasks, gen, (cfg.batch, cfg.N + 1), device)

    # the held-out data and the run's files; then the loop, with this model as an ensemble of one
    record = Record(cfg, tasks, start if ckpt else None, predict)

    def states() -> list[dict]:
        return [{"model": model.state_dict(), "optimizer": optimizer.state_dict()}]

    def readouts() -> dict[str, list[float]]:
        with torch.no_grad():
            return {k: [v.item()] for k, v in dense_readouts(model, *record.dense).items()}

    loop([record], step, lambda e: model, readouts, states, [gen], start, ckpt is not None, ckpt_path, progress,
         lambda saved: rundir.save_atomic(saved[0], ckpt_path))
    if plot:
        record.plot()
    progress.done(plot)
    locks[0].close()  # now: the frame may outlive the call, and a caller may train here next
    return record.rows


class Record:
    """What one run evaluates, logs and writes, the same for the single run and every member of an ensemble
    (grids.py): its held-out data (evaluation.py), config.json, the rows of metrics.jsonl and per_chain.jsonl, and
    model_<step>.pt. start: the step a resumed run continues from (rows logged after it are redone), None afresh.
    shared: a dict in which runs of one S (the same K, chains and sizes: an ensemble's seeds at one K) build their
    held-out sets once; each set is drawn from its own seeded generator, so the shared sets are the runs' own."""

    def __init__(self, cfg: Config, tasks, start: int | None, predict, shared: dict | None = None):
        def once(key: tuple, make):
            if shared is None:
                return make()
            if key not in shared:
                shared[key] = make()
            return shared[key]

        self.cfg = cfg
        S = (cfg.K, cfg.C, cfg.task_seed, cfg.N)
        self.data = once(("eval", *S, cfg.eval_train, cfg.eval_gen, predict),  # predict: bayes.predict, or the engine's
                         lambda: make_eval_data(cfg, tasks, predict=predict))
        if cfg.eval_every:  # and the 2-Gen predictor's loss on its sequences, the level that defines tau_2mem (thresholds.py)
            self.dense, self.dense_2gen = once(("dense", *S, cfg.eval_dense), lambda: self.dense_data(cfg, tasks))
        self.scored = once(("per_chain", *S, cfg.per_chain, cfg.per_chain_tasks),
                           lambda: make_per_chain_data(cfg, tasks)) if cfg.per_chain else None
        self.metrics_path, self.chain_path = (os.path.join(cfg.out, f) for f in ("metrics.jsonl", "per_chain.jsonl"))
        with open(os.path.join(cfg.out, "config.json"), "w") as f:
            json.dump(asdict(cfg), f, indent=1)
        self.rows = rundir.rewrite_rows(self.metrics_path, -1 if start is None else start)
        if cfg.per_chain:
            rundir.rewrite_rows(self.chain_path, -1 if start is None else start)

    @staticmethod
    def dense_data(cfg: Config, tasks) -> tuple[tuple, float]:
        dense = make_dense_data(cfg, tasks)
        return dense, nll(bayes.predict("2gen", dense[0], tasks.T)[:, :-1], dense[0]).mean().item()

    def log(self, row: dict):
        self.rows.append(row)
        rundir.append_row(self.metrics_path, row)

    def evaluate(self, step: int, model: Transformer):
        """The full evaluation against the predictors, the memorization scores (--per-chain) and the weights."""
        self.log({"step": step, **evaluate(model, self.data)})
        if self.scored is not None:
            delta = per_chain_scores(model, self.scored).tolist()
            rundir.append_row(self.chain_path, {"step": step, "delta": [round(v, 6) for v in delta]})
        rundir.save_atomic(model.state_dict(), os.path.join(self.cfg.out, f"model_{step:07d}.pt"))

    def log_dense(self, step: int, values: dict[str, float]):
        self.log({"step": step, "dense": True, **values, "train_loss_2gen": self.dense_2gen})

    def plot(self):
        plot_run([r for r in self.rows if not r.get("dense")], self.cfg, os.path.join(self.cfg.out, "fig2a.png"))


def loop(records: list[Record], step, model, readouts, states, gens: list[torch.Generator], start: int, resumed: bool,
         ckpt_path: str, progress: rundir.Progress, save) -> list[dict]:
    """The training loop of a run (train) or an ensemble (grids.train_ensemble), from `start` to the last step: at
    every step, what is due (a full evaluation of each model, the dense readouts, a checkpoint, a progress line),
    then one step. step() -> the losses (E,) (one run: a 0-dim loss); model(e) -> model e; readouts() -> the dense
    readouts of every model {name: [E values]}; states() -> each model's {"model", "optimizer"}; save(states) writes
    the checkpoint of the states with their "rng", "step", "config". Returns the last states."""
    cfgs = [r.cfg for r in records]
    c0 = cfgs[0]
    evals = set(eval_steps(c0.iters, c0.evals))
    dense_steps = set(range(0, c0.iters + 1, c0.eval_every)) | {c0.iters} if c0.eval_every else set()  # and the end
    saved, loss, last = start if resumed else None, None, None  # the last checkpoint's step and states; the last losses
    progress.begin()
    try:
        for t in range(start, c0.iters + 1):
            show, new = progress.due(t), t > start or not resumed  # new: not yet in the run's files
            if t > start and (show or t in evals or t in dense_steps or t % c0.ckpt_every == 0):
                losses = loss.reshape(-1).tolist()  # waits for the device: only where the step waits anyway or prints
                for cfg, value in zip(cfgs, losses):
                    rundir.check_finite(cfg, t, ckpt_path, loss=value)
            if t in evals and new:  # the full evaluation against the predictors
                with progress.evaluation():
                    for e, record in enumerate(records):
                        record.evaluate(t, model(e))
            if t in dense_steps and new:  # the cheap readouts of --eval-every
                with progress.readout():
                    values = readouts()
                for e, record in enumerate(records):
                    record.log_dense(t, {k: v[e] for k, v in values.items()})
            if t > start and (t in evals or t % c0.ckpt_every == 0 or t == c0.iters):  # resumable exactly from here
                last = [{**state, "rng": g.get_state(), "step": t, "config": asdict(cfg)}
                        for state, g, cfg in zip(states(), gens, cfgs)]
                for cfg, state in zip(cfgs, last):
                    rundir.check_finite(cfg, t, ckpt_path, weights=state["model"])
                save(last)
                saved = t
            if show:
                progress.show(t, losses, [r.rows for r in records])
            if t == c0.iters:
                break
            loss = step()
    except KeyboardInterrupt:  # Ctrl-C: one line; the last checkpoint, written atomically, stands
        raise rundir.interrupted(t, saved, ckpt_path) from None
    progress.end()
    return last


# ----------------------------------------------------------------------------- Fig. 2a


def plot_run(rows: list[dict], cfg: Config, path: str):
    """Fig. 2a/2c for one K: losses against the predictor levels, and the readouts, vs step."""
    steps = [r["step"] for r in rows]
    names = [name for name in PREDICTORS if f"kl_{name}" in rows[0]]  # K = inf: no memorizing predictors
    # generalizing predictors' levels dashed, memorizing ones' dotted: where levels coincide (1-Gen and 1-Mem
    # on fresh chains) the dots leave the dashes' colour showing
    dashes = {"1gen": "--", "2gen": "--", "1mem": ":", "2mem": ":"}
    fig, axes = plt.subplots(1, 4, figsize=(18, 4.8))
    for ax, split, title in ((axes[0], "train", "L_train (sequences from S)"), (axes[1], "gen", "L_gen (fresh chains)")):
        ax.plot(steps, [r[f"{split}_loss"] for r in rows], "k.-", label="transformer")
        for name in names:
            ax.axhline(rows[0][f"{split}_loss_{name}"], color=COLORS[name], ls=dashes[name], lw=1.5, label=LABELS[name])
        ax.set_title(title)
        ax.set_ylabel("loss (nats)")
        legend_below(ax)
    for name in names:
        axes[2].plot(steps, [r[f"kl_{name}"] for r in rows], color=COLORS[name], label=LABELS[name])
    axes[2].set_yscale("log")
    axes[2].set_title("divergence D(predictor, model)")
    axes[2].set_ylabel("D (nats)")
    legend_below(axes[2])
    for key, label, style in (("phi_delta_1", "phi_delta (1)", "tab:purple"), ("phi_beta_2", "phi_beta (2)", "tab:blue"),
                              ("n_A_1", "n_A (1) / N", "tab:gray"), ("n_A_2", "n_A (2) / N", "k")):
        scale = cfg.N if key.startswith("n_A") else 1
        axes[3].plot(steps, [r[key] / scale for r in rows], color=style, label=label)
    axes[3].set_title("mechanistic readouts")
    axes[3].set_ylabel("order parameter, n_A / N")
    legend_below(axes[3])
    for ax in axes:
        ax.set_xscale("symlog", linthresh=1, linscale=0.3)  # log-spaced steps, with step 0 at x = 0 (not on top of step 1)
        ax.xaxis.set_major_locator(FixedLocator([0] + [10**k for k in range(1, 8)]))  # no 10^0: it would cover "0"
        ax.set_xlim(left=0)
        ax.set_xlabel("step")
    fig.suptitle(f"K = {cfg.K}, N = {cfg.N}, preset {cfg.preset}, seed {cfg.seed}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def legend_below(ax):
    """The legend under the panel, where it covers no curve."""
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3, frameon=False)


# ----------------------------------------------------------------------------- command line


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


SWEEP_KS = {"quick": [4, 16, 64, 256, 1024], "paper": [2**i for i in range(3, 11)]}


def grid_dir(args: argparse.Namespace) -> str:
    return args.out or os.path.join("runs", "sweep")


def make_configs(args: argparse.Namespace) -> list:
    """One Config per (K, seed) of the grid given by --K and --seeds, K-major. A grid puts each model
    in OUT/K<K>_s<seed>; a single (K, seed) is a single run in OUT (default runs/K<K>_s<seed>)."""
    preset = cli.preset(args.preset)
    Ks = cli.parse_list("--K", args.K, inf=True) if args.K else SWEEP_KS[preset] if args.sweep else [Config.K]
    seeds = cli.parse_list("--seeds", args.seeds)
    grid = len(Ks) * len(seeds) > 1 or args.sweep
    cfgs = []
    for K in Ks:
        for seed in seeds:
            out = os.path.join(grid_dir(args), f"K{K}_s{seed}") if grid else args.out
            cfgs.append(make_config(argparse.Namespace(**{**vars(args), "K": K, "seed": seed, "out": out})))
    return cfgs


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
    parser.add_argument("--fp32", action="store_true", help="plain fp32: no TF32 matmuls, no bf16 (on CUDA the default "
                        "is --tf32 --bf16, on a CPU fp32)")
    cli.add_device(parser)
    cli.add_threads(parser)
    cli.add_jobs(parser)
    cli.add_figures(parser)
    parser.add_argument("--resume", action="store_true", help="continue from the checkpoint(s) under OUT")
    parser.add_argument("--overwrite", action="store_true",
                        help="start afresh in a run directory that holds a run, deleting its files (without "
                             "--resume or --overwrite such a directory is an error)")
    parser.add_argument("--plain", action="store_true", help="no speed block: this file's step and the reader's path alone "
                        "(bayes.py's predictors; on CUDA no Triton kernels, the per-position sampler, no CUDA graph); "
                        "an ensemble keeps its kernels and loses its CUDA graph")
    parser.add_argument("--ensemble", action="store_true", help="train a grid as one-process ensembles on the CPU too")
    parser.add_argument("--group", type=int, default=64, help="grid: models per ensemble")
    parser.add_argument("--print-commands", action="store_true", help="print one command per model of the grid and exit")
    parser.add_argument("--sweep", action="store_true",
                        help="Fig. 2b/2c: train the grid (default: the preset's Ks) in OUT (default runs/sweep), "
                             "then draw FIGURES/fig2bc.png")
    parser.add_argument("--plot-sweep", action="store_true", help="only draw the Fig. 2b/2c heat maps from the runs in OUT")
    parser.add_argument("--replot", metavar="JSON", help="only redraw a run's Fig. 2a from a JSON of its config and "
                        "full evaluation rows (figures/fig2a_K*.json), as a PNG beside it")
    args = parser.parse_args()
    if args.replot:
        saved = cli.read_json(args.replot, ("config", "rows"), "a run's metrics (see figures/fig2a_K256.json)")
        cfg = Config(**{f.name: saved["config"][f.name] for f in fields(Config) if f.name in saved["config"]})
        path = os.path.splitext(args.replot)[0] + ".png"
        plot_run([r for r in saved["rows"] if not r.get("dense")], cfg, path)
        print(f"wrote {path} from {args.replot}")
        return
    cli.set_threads(args.threads)
    cfgs = make_configs(args)  # one per (K, seed) of --K and --seeds
    if len(cfgs) == 1 and not (args.sweep or args.plot_sweep or args.print_commands):
        train(cfgs[0], resume=args.resume, fast=not args.plain, overwrite=args.overwrite)
    else:  # a grid, its commands, Fig. 2b/2c: the engine, which imports this file
        import grids  # noqa: PLC0415
        grids.main(args, cfgs)


if __name__ == "__main__":
    cli.run(main)
