"""Train the 2-layer transformer on K Markov chains and follow it through the algorithmic phases
(Sec. "Identifying in-context memorization and generalization regimes", Fig. 2; Appendix
"Training Process", "Phase Identification").

    python train.py --K 256                     # quick preset on a CPU, paper preset on CUDA
    python train.py --K 1024 --preset paper     # the appendix's hyper-parameters
    python train.py --K 256 --resume            # continue a killed run exactly where it stopped
    python train.py --sweep                     # Fig. 2b/2c: the K grid as independent processes, then heat maps

Each run writes to runs/<name>/: config.json, metrics.jsonl (one JSON object per evaluation),
ckpt.pt (latest resumable state: model, optimizer, RNG, step; written atomically),
model_<step>.pt (weights at every evaluation step) and fig2a.png.
"""
import argparse
import json
import math
import os
import shlex
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, fields

import matplotlib.pyplot as plt
import numpy as np
import torch
import torch.nn.functional as F
from matplotlib.colors import LogNorm

import cli
from bayes import COLORS, LABELS, PREDICTORS, kl_div, nll, predict
from markov import TaskSet, check_int
from transformer import Transformer, n_A, phi_beta, phi_delta


@dataclass
class Config:
    K: int = 256  # number of training chains |S|
    preset: str = "quick"  # "quick" (CPU-sized) or "paper" (the appendix's hyper-parameters)
    N: int = 128  # predictions per sequence; sequences hold N + 1 states
    iters: int = 2000  # optimizer steps
    batch: int = 128
    lr: float = 1e-3
    beta1: float = 0.9
    beta2: float = 0.95
    weight_decay: float = 1e-3
    D: int = 64
    C: int = 10
    seed: int = 0  # model initialization and training batches
    task_seed: int = 0  # the chains of S (nested across K)
    evals: int = 40  # log-spaced evaluation / checkpoint steps
    ckpt_every: int = 500  # also checkpoint at least this often (a killed run loses at most this many steps)
    eval_train: int = 512  # held-out sequences from S (the paper: 8 K)
    eval_gen: int = 512  # held-out sequences from fresh chains of D_T (the paper: 2048)
    device: str = "cpu"
    out: str = ""  # default runs/K<K>_s<seed>


PRESETS = {
    "quick": dict(N=128, iters=2000, evals=40, eval_train=512, eval_gen=512, ckpt_every=500),
    "paper": dict(N=256, iters=1_000_000, evals=100, eval_train=0, eval_gen=2048, ckpt_every=10_000),
}


def make_config(args: argparse.Namespace) -> Config:
    """Preset values, then every explicitly given flag on top."""
    preset = args.preset or ("paper" if torch.cuda.is_available() else "quick")
    values = dict(PRESETS[preset], preset=preset)
    values.update({f.name: getattr(args, f.name) for f in fields(Config) if getattr(args, f.name, None) is not None})
    values.setdefault("device", "cuda" if torch.cuda.is_available() else "cpu")  # where the preset was chosen for
    cfg = Config(**values)
    if cfg.eval_train == 0:
        cfg.eval_train = min(8 * cfg.K, 8192)  # the paper evaluates L_train on 8 K sequences
    check_int("K", cfg.K, 1)
    check_int("N", cfg.N, 2)
    check_int("batch", cfg.batch, 1)
    check_int("iters", cfg.iters, 1)
    check_int("evals", cfg.evals, 1)
    check_int("eval_train", cfg.eval_train, 1)
    check_int("eval_gen", cfg.eval_gen, 1)
    check_int("ckpt_every", cfg.ckpt_every, 1)
    if not cfg.lr > 0:
        raise ValueError(f"lr must be > 0, got {cfg.lr}")
    if cfg.device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {cfg.device!r} requested but CUDA is not available")
    try:
        torch.device(cfg.device)
    except RuntimeError:
        raise ValueError(f"unknown device {cfg.device!r}") from None
    cfg.out = cfg.out or os.path.join("runs", f"K{cfg.K}_s{cfg.seed}")
    return cfg


def eval_steps(iters: int, n: int) -> list[int]:
    """Step 0, then n log-spaced steps up to and including iters."""
    steps = {0, iters} | {int(round(10 ** (math.log10(iters) * i / n))) for i in range(1, n + 1)}
    return sorted(s for s in steps if s <= iters)


# ----------------------------------------------------------------------------- evaluation


def make_eval_data(cfg: Config, tasks: TaskSet) -> dict:
    """Fixed held-out batches from S and from D_T, and the four predictors on them (computed once)."""
    g = torch.Generator(tasks.T.device).manual_seed(1_000_003 * (cfg.task_seed + 1) + 7)
    data = {"train": tasks.batch(cfg.eval_train, cfg.N + 1, g)[0], "gen": tasks.gen_batch(cfg.eval_gen, cfg.N + 1, g)[0]}
    for split in ("train", "gen"):
        seqs = data[split]
        for name in PREDICTORS:
            logp = predict(name, seqs, tasks.T)[:, :-1]  # aligned with the model's N predictions
            data[f"{split}_{name}"] = logp
            data[f"{split}_loss_{name}"] = nll(logp, seqs).mean().item()
    return data


@torch.no_grad()
def evaluate(model: Transformer, data: dict, chunk: int = 256) -> dict:
    """Losses, behavioral divergences to the predictors, and attention readouts of both layers."""
    model.eval()
    metrics = {}
    kl = {name: 0.0 for name in PREDICTORS}
    readouts = {key: 0.0 for key in ("phi_delta_1", "phi_delta_2", "phi_beta_1", "phi_beta_2", "entropy_1", "entropy_2")}
    for split in ("train", "gen"):
        seqs = data[split]
        n = seqs.shape[0]
        loss = 0.0
        for start in range(0, n, chunk):
            s = seqs[start : start + chunk]
            w = s.shape[0] / n
            logits, cache = model(s[:, :-1], cache=True)
            logq = F.log_softmax(logits.float(), -1)
            loss += nll(logq, s).mean().item() * w
            for name in PREDICTORS:  # D(pi_hat, pi_theta) = 1/2 <KL>_S + 1/2 <KL>_{D_T}
                kl[name] += 0.5 * w * kl_div(data[f"{split}_{name}"][start : start + chunk], logq).item()
            if split == "train":  # the mechanistic readouts average over sequences from S
                for layer, A in ((1, cache["A1"]), (2, cache["A2"])):
                    readouts[f"phi_delta_{layer}"] += w * phi_delta(A).item()
                    readouts[f"phi_beta_{layer}"] += w * phi_beta(A, s[:, :-1]).item()
                    readouts[f"entropy_{layer}"] += w * math.log(n_A(A).item())
        metrics[f"{split}_loss"] = loss
        for name in PREDICTORS:
            metrics[f"{split}_loss_{name}"] = data[f"{split}_loss_{name}"]
    metrics.update({f"kl_{name}": kl[name] for name in PREDICTORS})
    for layer in (1, 2):
        metrics[f"phi_delta_{layer}"] = readouts[f"phi_delta_{layer}"]
        metrics[f"phi_beta_{layer}"] = readouts[f"phi_beta_{layer}"]
        metrics[f"n_A_{layer}"] = math.exp(readouts[f"entropy_{layer}"])  # exp of the expected entropy
    model.train()
    return metrics


# ----------------------------------------------------------------------------- checkpoints


def save_atomic(obj, path: str):
    """torch.save to a temporary file, then rename: a kill never leaves a half-written checkpoint."""
    tmp = path + ".tmp"
    torch.save(obj, tmp)
    os.replace(tmp, path)


def load_checkpoint(cfg: Config) -> dict:
    path = os.path.join(cfg.out, "ckpt.pt")
    if not os.path.exists(path):
        raise ValueError(f"--resume: no checkpoint at {path}")
    try:
        ckpt = torch.load(path, map_location=cfg.device, weights_only=False)
    except Exception as e:
        raise ValueError(f"--resume: cannot read {path} ({type(e).__name__})") from None
    saved = ckpt.get("config", {})
    mismatched = [k for k in asdict(cfg) if k not in ("device", "out") and saved.get(k) != getattr(cfg, k)]
    if mismatched:
        diffs = ", ".join(f"{k}: checkpoint {saved.get(k)!r} vs now {getattr(cfg, k)!r}" for k in mismatched)
        raise ValueError(f"--resume: checkpoint {path} does not match this run ({diffs})")
    return ckpt


# ----------------------------------------------------------------------------- training


def train(cfg: Config, resume: bool = False, quiet: bool = False) -> list[dict]:
    """Train one model; returns the metrics rows (also in metrics.jsonl)."""
    ckpt = load_checkpoint(cfg) if resume else None  # fail fast on a missing or mismatched checkpoint
    try:
        os.makedirs(cfg.out, exist_ok=True)
        probe = os.path.join(cfg.out, ".write_test")
        open(probe, "w").close()
        os.remove(probe)
    except OSError as e:
        raise ValueError(f"cannot write to output directory {cfg.out!r} ({e.strerror})") from None
    device = torch.device(cfg.device)
    tasks = TaskSet.create(cfg.K, cfg.C, seed=cfg.task_seed, device=device)
    model = Transformer(cfg.C, cfg.D, max_len=cfg.N)
    model.reset_parameters(torch.Generator().manual_seed(cfg.seed))  # on the CPU: same init on every device
    model.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), weight_decay=cfg.weight_decay)
    g = torch.Generator(device).manual_seed(cfg.seed)
    data = make_eval_data(cfg, tasks)
    metrics_path = os.path.join(cfg.out, "metrics.jsonl")
    start, rows = 0, []
    if resume:
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        g.set_state(ckpt["rng"].cpu())
        start = ckpt["step"]
        if os.path.exists(metrics_path):  # drop rows logged after the checkpoint; they will be redone
            with open(metrics_path) as f:
                rows = [r for r in map(json.loads, f) if r["step"] <= start]
    with open(os.path.join(cfg.out, "config.json"), "w") as f:
        json.dump(asdict(cfg), f, indent=1)
    with open(metrics_path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)

    evals = set(eval_steps(cfg.iters, cfg.evals))
    t0, t_last, step_last = time.time(), time.time(), start
    loss = float("nan")
    for step in range(start, cfg.iters + 1):
        if step in evals and not (resume and step == start):
            row = {"step": step, **evaluate(model, data)}
            rows.append(row)
            with open(metrics_path, "a") as f:
                f.write(json.dumps(row) + "\n")
            save_atomic(model.state_dict(), os.path.join(cfg.out, f"model_{step:07d}.pt"))
        if (step in evals or step % cfg.ckpt_every == 0) and step > start or step == cfg.iters:
            save_atomic({"model": model.state_dict(), "optimizer": opt.state_dict(), "rng": g.get_state(),
                         "step": step, "config": asdict(cfg)}, os.path.join(cfg.out, "ckpt.pt"))
        if not quiet and (step in evals or step == cfg.iters) and step > start:
            rate = (step - step_last) / max(time.time() - t_last, 1e-9)
            eta = (cfg.iters - step) / max(rate, 1e-9)
            r = rows[-1]
            print(f"step {step:>7d}/{cfg.iters} | batch loss {loss:.4f} | L_train {r['train_loss']:.4f} "
                  f"(2-Gen {r['train_loss_2gen']:.4f}, 2-Mem {r['train_loss_2mem']:.4f}) | L_gen {r['gen_loss']:.4f} "
                  f"| phi_delta1 {r['phi_delta_1']:.2f} phi_beta2 {r['phi_beta_2']:.2f} | {rate:.2f} it/s | "
                  f"ETA {eta / 60:.1f} min", flush=True)
            t_last, step_last = time.time(), step
        if step == cfg.iters:
            break
        seqs, _ = tasks.batch(cfg.batch, cfg.N + 1, g)
        logits = model(seqs[:, :-1])
        loss_t = F.cross_entropy(logits.reshape(-1, cfg.C).float(), seqs[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss_t.backward()
        opt.step()
        loss = loss_t.item()
    plot_run(rows, cfg, os.path.join(cfg.out, "fig2a.png"))
    if not quiet:
        print(f"done in {(time.time() - t0) / 60:.1f} min: {cfg.out}/metrics.jsonl, fig2a.png")
    return rows


# ----------------------------------------------------------------------------- figures


def plot_run(rows: list[dict], cfg: Config, path: str):
    """Fig. 2a/2c for one K: losses against the predictor levels, and the readouts, vs step."""
    steps = [max(r["step"], 1) for r in rows]
    fig, axes = plt.subplots(1, 4, figsize=(18, 4))
    for ax, split, title in ((axes[0], "train", "L_train (sequences from S)"), (axes[1], "gen", "L_gen (fresh chains)")):
        ax.plot(steps, [r[f"{split}_loss"] for r in rows], "k.-", label="transformer")
        for name in PREDICTORS:
            ax.axhline(rows[0][f"{split}_loss_{name}"], color=COLORS[name], ls="--", lw=1, label=LABELS[name])
        ax.set_title(title)
        ax.set_ylabel("loss (nats)")
    axes[0].legend(fontsize=8)
    for name in PREDICTORS:
        axes[2].plot(steps, [r[f"kl_{name}"] for r in rows], color=COLORS[name], label=LABELS[name])
    axes[2].set_yscale("log")
    axes[2].set_title("divergence D(predictor, model)")
    axes[2].legend(fontsize=8)
    for key, label, style in (("phi_delta_1", "phi_delta (1)", "tab:purple"), ("phi_beta_2", "phi_beta (2)", "tab:blue"),
                              ("n_A_1", "n_A (1) / N", "tab:gray"), ("n_A_2", "n_A (2) / N", "k")):
        scale = cfg.N if key.startswith("n_A") else 1
        axes[3].plot(steps, [r[key] / scale for r in rows], color=style, label=label)
    axes[3].set_title("mechanistic readouts")
    axes[3].legend(fontsize=8)
    for ax in axes:
        ax.set_xscale("log")
        ax.set_xlabel("step")
    fig.suptitle(f"K = {cfg.K}, N = {cfg.N}, preset {cfg.preset}, seed {cfg.seed}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def read_metrics(run_dir: str) -> tuple[dict, list[dict]]:
    with open(os.path.join(run_dir, "config.json")) as f:
        cfg = json.load(f)
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return cfg, [json.loads(line) for line in f]


# ----------------------------------------------------------------------------- runs as a library (trace.py, ...)


def load_run(run_dir: str, step: int | None = None, device: str = "cpu") -> tuple[Config, list[dict], Transformer, TaskSet]:
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
    model = Transformer(cfg.C, cfg.D, max_len=cfg.N)
    model.load_state_dict(torch.load(os.path.join(run_dir, f"model_{step:07d}.pt"), map_location=device))
    tasks = TaskSet.create(cfg.K, cfg.C, seed=cfg.task_seed, device=device)
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
    train(cfg, resume=os.path.exists(os.path.join(cfg.out, "ckpt.pt")))
    return cfg.out


def plot_sweep(sweep_dir: str, path: str):
    """Fig. 2b/2c: divergence to each predictor and the readouts over (K, step), from the runs' metrics
    (seeds averaged)."""
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


def sweep_commands(args: argparse.Namespace, cfg: Config) -> list[list[str]]:
    """One independent `python train.py` per (K, seed), each a line a scheduler can run as is."""
    passthrough = []
    for f in fields(Config):
        value = getattr(args, f.name, None)
        if value is not None and f.name not in ("K", "seed", "out"):
            passthrough += [f"--{f.name.replace('_', '-')}", str(value)]
    Ks = [int(k) for k in args.Ks.split(",")] if args.Ks else SWEEP_KS[cfg.preset]
    seeds = [int(s) for s in args.seeds.split(",")]
    return [[sys.executable, os.path.abspath(__file__), "--K", str(K), "--seed", str(s), "--preset", cfg.preset,
             "--out", os.path.join(args.sweep_dir, f"K{K}_s{s}"), "--threads", "1", *passthrough]
            for K in Ks for s in seeds]


def run_sweep(commands: list[list[str]], jobs: int):
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
        raise ValueError(f"{len(failed)} sweep runs failed; see their .log files")


def main():
    parser = cli.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=sorted(PRESETS), default=None, help="default: paper on CUDA, quick otherwise")
    for f in fields(Config):
        if f.name != "preset":
            parser.add_argument(f"--{f.name.replace('_', '-')}", type=type(f.default), default=None, dest=f.name)
    parser.add_argument("--resume", action="store_true", help="continue from OUT/ckpt.pt")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (the sweep gives each process 1)")
    parser.add_argument("--sweep", action="store_true", help="run the K grid as independent processes, then plot")
    parser.add_argument("--Ks", default=None, help="sweep: comma-separated K values (default by preset)")
    parser.add_argument("--seeds", default="0", help="sweep: comma-separated model seeds")
    parser.add_argument("--jobs", type=int, default=2, help="sweep: processes at a time")
    parser.add_argument("--sweep-dir", default=os.path.join("runs", "sweep"))
    parser.add_argument("--print-commands", action="store_true", help="sweep: print the per-run commands and exit")
    parser.add_argument("--plot-sweep", action="store_true", help="only draw the heat maps from --sweep-dir")
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(check_int("--threads", args.threads, 1))
    cfg = make_config(args)
    if args.plot_sweep or args.sweep:
        if args.sweep:
            commands = sweep_commands(args, cfg)
            if args.print_commands:
                print("\n".join(shlex.join(c) for c in commands))
                return
            os.makedirs(args.sweep_dir, exist_ok=True)
            run_sweep(commands, check_int("--jobs", args.jobs, 1))
        os.makedirs("figures", exist_ok=True)
        plot_sweep(args.sweep_dir, os.path.join("figures", "fig2bc.png"))
        print("wrote figures/fig2bc.png and figures/fig2bc.json")
        return
    train(cfg, resume=args.resume)


if __name__ == "__main__":
    cli.run(main)
