"""Train the 2-layer transformer on K Markov chains and follow it through the algorithmic phases
(Sec. "Identifying in-context memorization and generalization regimes", Fig. 2a; Appendix "Training Process",
"Phase Identification").

    python train.py --K 256                     # quick preset on a CPU; on CUDA the paper preset, in bf16 (--fp32)
    python train.py --K 1024 --preset paper     # the appendix's hyper-parameters
    python train.py --K 256 --resume            # continue a stopped run from its last checkpoint, exactly
    python train.py --K inf --per-chain 64      # K = infinity (a fresh chain per sequence), with Delta^k scores
    python train.py --replot figures/fig2a_K256.json   # redraw a run's Fig. 2a from its rows

One run, top to bottom: the Config and its presets; `train`: the data, the model, AdamW, the step, the one speed
block (--plain turns it off) and the loop; `Record`: what a run evaluates and writes (an ensemble's members too,
runners/grids.py); Fig. 2a. A run writes to runs/K<K>_s<seed>/ (or --out; one process at a time, reused only with
--resume or --overwrite: plumbing/rundir.py): config.json; metrics.jsonl, a row per full evaluation (evaluate) and
with --eval-every a "dense" row every M steps (dense_readouts; train_loss_2gen, the 2-Gen loss on its sequences);
per_chain.jsonl (--per-chain: per_chain_scores); ckpt.pt, the resumable state; model_<step>.pt at every full
evaluation; fig2a.png. With K = inf there is no S: "train" evaluations are on fresh chains, without 1-Mem and 2-Mem.
"""
import argparse
import math
import os
from dataclasses import asdict, dataclass, fields

import matplotlib.pyplot as plt
import torch
from matplotlib.ticker import FixedLocator

import bayes
from bayes import PREDICTORS
from evaluation import dense_readouts, evaluate, held_out_sets, lm_loss, per_chain_scores
from markov import check_int, task_source
from plumbing import cli, rundir
from plumbing.style import COLORS, LABELS
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
    evals: int = 40  # log-spaced full evaluations (and checkpoints); steps that round to one count once
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
    out: str = ""  # the run directory (default runs/K<K>_s<seed>); a grid's: OUT/K<K>_s<seed> (sweep.py)


MAX_K = 2**16  # S is K C x C chains, and the 1-Mem / 2-Mem predictors weigh all K for every sequence
MINIMUM = dict(N=2, D=1, mlp_width=0, C=2, seed=0, task_seed=0, batch=1, iters=1, evals=1, eval_train=1, eval_gen=1,
               ckpt_every=1, eval_every=0, eval_dense=1, per_chain=0, per_chain_tasks=1)  # of the integer fields

# the command line's precision on CUDA when no flag names one (why: bench/README.md, the same tau_2gen and max phi_beta(2))
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


def dense_due(cfg: Config, t: int) -> bool:
    """Whether step t has dense readouts (--eval-every): every eval_every steps and at the last."""
    return cfg.eval_every > 0 and (t % cfg.eval_every == 0 or t == cfg.iters)


def build_model(cfg: Config) -> Transformer:
    """The run's transformer, with the perturbations its config asks for (weights still to be set)."""
    return Transformer(cfg.C, cfg.D, max_len=cfg.N, prev_weight=cfg.prev_weight,
                       n_tasks=cfg.K if cfg.task_injection else 0, mlp_width=cfg.mlp_width)


def init_model(cfg: Config, device: torch.device) -> Transformer:
    """The run's transformer with its initial weights, drawn on the CPU so that every device starts from the same."""
    model = build_model(cfg)
    model.reset_parameters(torch.Generator().manual_seed(cfg.seed))
    return model.to(device)


# ----------------------------------------------------------------------------- one run
def train(cfg: Config, resume: bool = False, quiet: bool = False, fast: bool = True, overwrite: bool = False,
          plot: bool = True) -> list[dict]:
    """Train one model; returns its metrics rows (also in metrics.jsonl). resume: from OUT/ckpt.pt, exactly as if
    never stopped; overwrite: start afresh where a run is. fast: the speed block below (the same computation to float
    rounding); fast=False (--plain): this file and the modules it imports, alone. plot=False: no fig2a.png (probes)."""
    ckpt_path = os.path.join(cfg.out, "ckpt.pt")
    with rundir.RunDir([cfg], ckpt_path, resume, overwrite) as run:  # checks, then OUT/.lock until the end
        if run.complete(quiet):  # --resume of a finished run: nothing to redo
            return rundir.read_rows(os.path.join(cfg.out, "metrics.jsonl"))
        ckpt = run.members[0] if resume else None
        start = ckpt["step"] if ckpt else 0
        evals = set(eval_steps(cfg.iters, cfg.evals))
        progress = rundir.Progress([cfg], f"writing {cfg.out}/ (config.json, metrics.jsonl, ckpt.pt, model_<step>.pt"
                                   + (", fig2a.png)" if plot else ")"), start, start if ckpt else None, evals, quiet)
        device = torch.device(cfg.device)
        torch.backends.cuda.matmul.allow_tf32 = cfg.tf32  # process-wide; only CUDA matmuls read it

        # the data (S: K chains, or fresh chains with K = inf), the model and AdamW (App. "Training Process")
        tasks = task_source(cfg.K, cfg.C, seed=cfg.task_seed, device=device)
        generator = torch.Generator(device).manual_seed(cfg.seed)  # the training batches
        model = init_model(cfg, device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(cfg.beta1, cfg.beta2),
                                      weight_decay=cfg.weight_decay)
        if ckpt:  # where the run stopped; AdamW keeps its own param_groups: the Config's, and plain (not capturable)
            model.load_state_dict(ckpt["model"])
            optimizer.load_state_dict({**ckpt["optimizer"], "param_groups": optimizer.state_dict()["param_groups"]})
            generator.set_state(ckpt["rng"].cpu())

        def train_step(seqs: torch.Tensor, chains: torch.Tensor) -> torch.Tensor:
            """One AdamW step on evaluation.lm_loss of seqs (B, N + 1) from the chains (B,) (task injection reads
            them). --bf16: the forward in bfloat16, without the cast cache a CUDA graph would replay stale."""
            with torch.autocast(device.type, torch.bfloat16, enabled=cfg.bf16, cache_enabled=False):
                loss = lm_loss(model, seqs, chains)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            return loss.detach()

        def step() -> torch.Tensor:
            seqs, chains = tasks.batch(cfg.batch, cfg.N + 1, generator)
            return train_step(seqs, chains)

        predict = bayes.predict  # the Bayes predictors of the evaluations
        if fast:  # the speed block: the engine, imported only here; the same computation to float rounding
            from engine.ensemble import accelerate_run
            step, predict = accelerate_run(model, optimizer, step, train_step, tasks, generator, (cfg.batch, cfg.N + 1))

        record = Record(cfg, held_out_sets(cfg, tasks, predict), start if ckpt else None, ckpt_path)
        loss = None  # the last step's
        progress.begin()
        try:
            for t in range(start, cfg.iters + 1):
                unwritten = t > start or not ckpt  # a resumed run's files hold its first step's rows
                full = t in evals and unwritten  # the full evaluation against the predictors
                dense = dense_due(cfg, t) and unwritten  # the cheap readouts of --eval-every
                save = t > start and (t in evals or t % cfg.ckpt_every == 0 or t == cfg.iters)  # resumable from here
                show = progress.due(t)
                if loss is not None and (full or dense or save or show):  # a diverged run stops before it writes
                    rundir.check_finite(cfg, t, ckpt_path, loss=loss.item())  # waits for the device: only here
                if full:
                    with progress.evaluation():
                        record.evaluate(t, model)
                if dense:
                    with progress.readout():
                        values = {k: v.item() for k, v in dense_readouts(model, *record.dense).items()}
                    record.log_dense(t, values)
                if save:
                    with progress.evaluation(count=False):
                        save_state(cfg, t, model, optimizer, generator, ckpt_path)
                if show:
                    progress.show(t, [loss.item()], [record.rows])
                if t == cfg.iters:
                    break
                loss = step()
        except KeyboardInterrupt:  # Ctrl-C: one line; the last checkpoint, written atomically, stands
            raise rundir.interrupted(t, ckpt_path) from None
        progress.end()
        if plot:
            record.plot()
        progress.done(plot)
    return record.rows


def save_state(cfg: Config, t: int, model: Transformer, optimizer, generator: torch.Generator, ckpt_path: str):
    """Step t's resumable state, written atomically once its weights are checked finite."""
    state = dict(model=model.state_dict(), optimizer=optimizer.state_dict(), rng=generator.get_state(), step=t,
                 config=asdict(cfg))
    rundir.check_finite(cfg, t, ckpt_path, weights=state["model"])
    rundir.save_atomic(state, ckpt_path)


# ----------------------------------------------------------------------------- what a run evaluates and writes
class Record:
    """What a run evaluates and writes, the same for the single run and every member of an ensemble: on its held-out
    sets (held_out_sets), config.json, the rows of metrics.jsonl and per_chain.jsonl (finite, or the run stops: the
    message names ckpt_path) and model_<step>.pt. start: the step a resumed run continues from, None afresh."""

    def __init__(self, cfg: Config, held: dict, start: int | None, ckpt_path: str):
        self.cfg, self.data, self.scored, self.ckpt_path = cfg, held["eval"], held.get("per_chain"), ckpt_path
        self.dense, self.dense_2gen = held.get("dense"), held.get("dense_2gen")
        self.metrics_path, self.chain_path = (os.path.join(cfg.out, f) for f in ("metrics.jsonl", "per_chain.jsonl"))
        rundir.write_json(os.path.join(cfg.out, "config.json"), asdict(cfg), indent=1)
        self.rows = rundir.rewrite_rows(self.metrics_path, -1 if start is None else start)
        if cfg.per_chain:
            rundir.rewrite_rows(self.chain_path, -1 if start is None else start)

    def log(self, row: dict):
        rundir.check_finite(self.cfg, row["step"], self.ckpt_path, row=row)
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


# ----------------------------------------------------------------------------- Fig. 2a
def plot_run(rows: list[dict], cfg: Config, path: str):
    """Fig. 2a/2c for one K: losses against the predictor levels, and the readouts, vs step."""
    steps = [r["step"] for r in rows]
    names = [name for name in PREDICTORS if f"kl_{name}" in rows[0]]  # K = inf: no memorizing predictors
    fig, axes = plt.subplots(1, 4, figsize=(18, 4.8))
    for ax, split, title in ((axes[0], "train", "L_train (sequences from S)"), (axes[1], "gen", "L_gen (fresh chains)")):
        ax.plot(steps, [r[f"{split}_loss"] for r in rows], "k.-", label="transformer")
        drawn = {}
        for name in names:  # a level within 0.002 nats of one drawn before is on its line: the label says so
            level = rows[0][f"{split}_loss_{name}"]
            near = [other for other, at in drawn.items() if abs(at - level) < 2e-3]
            label = LABELS[name] + (f" (on {LABELS[near[0]]}'s line, {level - drawn[near[0]]:+.3f})" if near else "")
            # generalizing levels dashed, memorizing dotted: where levels coincide the dashes' colour shows through
            ax.axhline(level, color=COLORS[name], ls="--" if "gen" in name else ":", lw=1.5, label=label)
            drawn[name] = level
        ax.set(title=title, ylabel="loss (nats)")
    for name in names:
        axes[2].plot(steps, [r[f"kl_{name}"] for r in rows], color=COLORS[name], label=LABELS[name])
    axes[2].set(yscale="log", title="divergence D(predictor, model)", ylabel="D (nats)")
    for key, label, style in (("phi_delta_1", "phi_delta (1)", "tab:purple"), ("phi_beta_2", "phi_beta (2)", "tab:blue"),
                              ("n_A_1", "n_A (1) / N", "tab:gray"), ("n_A_2", "n_A (2) / N", "k")):
        scale = cfg.N if key.startswith("n_A") else 1
        axes[3].plot(steps, [r[key] / scale for r in rows], color=style, label=label)
    axes[3].set(title="mechanistic readouts", ylabel="order parameter, n_A / N")
    for ax in axes:
        ax.set_xscale("symlog", linthresh=1, linscale=0.3)  # log-spaced steps, with step 0 at x = 0 (not on top of step 1)
        ax.xaxis.set_major_locator(FixedLocator([0] + [10**k for k in range(1, 8)]))  # no 10^0: it would cover "0"
        ax.set(xlim=(0, None), xlabel="step")
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3, frameon=False)  # covers no curve
    fig.suptitle(f"K = {cfg.K}, N = {cfg.N}, preset {cfg.preset}, seed {cfg.seed}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ----------------------------------------------------------------------------- command line
def add_run_flags(parser: argparse.ArgumentParser):
    """The flags of a run's Config, its precision, device and run directory (sweep.py's grids take them too)."""
    cli.add_preset(parser, PRESETS, "the preset sets N, iters, evals, eval_train, eval_gen, ckpt_every")
    cli.add_fields(parser, Config, PRESETS, skip=("preset", "K", "seed", "base_iters", "device"))  # base_iters: from w
    parser.add_argument("--fp32", action="store_true", help="plain fp32: no TF32 matmuls, no bf16 (on CUDA the default "
                        "is --tf32 --bf16, on a CPU fp32)")
    cli.add_device(parser)
    cli.add_threads(parser)
    parser.add_argument("--resume", action="store_true", help="continue from the checkpoint(s) under OUT")
    parser.add_argument("--overwrite", action="store_true", help="start afresh in a run directory that holds a run, "
                        "deleting its files (without --resume or --overwrite such a directory is an error)")
    parser.add_argument("--plain", action="store_true", help="no speed block: the reader's path alone (on CUDA no Triton "
                        "kernels, no CUDA graph; an ensemble keeps its kernels and loses its CUDA graph)")


def main():
    parser = cli.ArgumentParser(description=__doc__.split("\n\n")[0], runs=(
        "Default run: 5 min 49 s on the 2-core development VM, quiet (2026-11-29) (K = 256, seed 0, quick preset: "
        "N = 128, 2000 steps of batch 128; on CUDA the paper preset's 10^6 steps); writes runs/K256_s0/ (config.json, "
        "metrics.jsonl, ckpt.pt, model_<step>.pt, fig2a.png).\n--replot: seconds, trains nothing."))
    parser.add_argument("--K", default=str(Config.K), help=f"the number of chains of S, at most {MAX_K}; inf: a fresh "
                        "chain for every sequence (a list is a grid: sweep.py)")
    cli.add_seeds(parser, "0", "the model seed (a list is a grid: sweep.py)", "--seed", "--seeds")
    add_run_flags(parser)
    cli.add_replot(parser, "figures/fig2a_K256.json", "a run's Fig. 2a (a JSON of its config and rows: figures/fig2a_K*.json)")
    args = parser.parse_args()
    if args.replot is not None:
        cli.replot(args, "fig2a_K256.json", ("config", "rows"), "train.py", lambda saved, png: plot_run(
            [r for r in saved["rows"] if not r.get("dense")],
            Config(**{f.name: saved["config"][f.name] for f in fields(Config) if f.name in saved["config"]}), png))
        return
    Ks = cli.parse_list("--K", args.K, inf=True, rule=f"K: an integer from 1 to {MAX_K}, or inf")
    seeds = cli.parse_list("--seed", args.seed)
    if len(Ks) * len(seeds) > 1:
        grid = f"--K {args.K}" + (f" --seeds {args.seed}" if len(seeds) > 1 else "")
        raise ValueError(f"{grid} is a grid of {len(Ks) * len(seeds)} runs: python sweep.py {grid} trains it")
    cli.set_threads(args.threads)
    cfg = make_config(argparse.Namespace(**{**vars(args), "K": Ks[0], "seed": seeds[0]}))
    train(cfg, resume=args.resume, fast=not args.plain, overwrite=args.overwrite)


if __name__ == "__main__":
    cli.run(main)
