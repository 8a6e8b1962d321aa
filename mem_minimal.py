"""Minimal model of the task-recognition head: 2-Mem, the D_phi x K heat maps and K2_hat
(Sec. "K2* and the representational capacity of the task recognition head"; Appendix "Minimal
Model for 2-Point Memorization"; Fig. 8d-f).

The encoder-pool-decoder network of eq. (minimal_task_head), autoregressive over s_0..s_N:
    x0_n  = W_E x_n                                   fixed random Gaussian embedding (C -> D)
    phi_n = mean_{1 <= i <= n} MLP1(x0_i (+) x0_{i-1})  the task vector: pooled pair embeddings (D_phi)
    z_n   = MLP2(x0_n (+) phi_n)                       C logits for s_{n+1}
phi_0 = 0 (no pair yet). MLP1 has l1 hidden layers, MLP2 l2 (the reference is l1 = 1, l2 = 2),
all of one width. MLP1 only ever sees the C^2 distinct pairs, so it is evaluated on those and
gathered; the running mean is a cumulative sum. Likewise the x0_n part of MLP2's first layer is a
C-row table.

K2_hat (the minimal model's K2*) is the largest K at which the model still beats 2-Gen on its own
training sequences: < L_train - L^{2-Gen} > < 0 over the last iterations, found by binary search in K
(powers of two) with the zero crossing interpolated in log K between the bracketing runs.

    python mem_minimal.py                  # quick preset (CPU, ~15 min on 2 cores)
    python mem_minimal.py --preset paper   # the paper's sizes (N = 256, 4 x 10^5 iterations)
    python mem_minimal.py --depths-only --iters 6000 --seeds 0   # K2_hat against depth at 4x the budget
"""
import json
import math
import os
import time
from dataclasses import asdict, dataclass, replace

import matplotlib.pyplot as plt
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import cli
from bayes import nll, two_gen
from markov import TaskSet, check_int
from train import parse_list

# ----------------------------------------------------------------------------- the model


def mlp(d_in: int, width: int, d_out: int, hidden_layers: int) -> nn.Sequential:
    layers, d = [], d_in
    for _ in range(hidden_layers):
        layers += [nn.Linear(d, width), nn.GELU()]
        d = width
    return nn.Sequential(*layers, nn.Linear(d, d_out))


def pooled(seqs: torch.Tensor, pair_table: torch.Tensor) -> torch.Tensor:
    """phi (B, N, d): phi_n = mean over the pairs (s_{i-1}, s_i), 1 <= i <= n, of pair_table[s_{i-1} C + s_i];
    phi_0 = 0. A causal running mean: a cumulative sum divided by the pair count."""
    B, N = seqs.shape
    C = math.isqrt(pair_table.shape[0])
    pairs = pair_table[seqs[:, :-1] * C + seqs[:, 1:]]  # (B, N - 1, d): the pair ending at position i
    counts = torch.arange(1, N, device=seqs.device, dtype=pairs.dtype).view(1, N - 1, 1)
    return torch.cat([pairs.new_zeros(B, 1, pairs.shape[-1]), pairs.cumsum(1) / counts], 1)


class TaskHead(nn.Module):
    """Eq. (minimal_task_head): encoder MLP1 on neighbouring pairs, pooling, decoder MLP2."""

    def __init__(self, C: int = 10, D: int = 32, D_phi: int = 16, width: int = 128, depth1: int = 1, depth2: int = 2,
                 generator=None):
        super().__init__()
        self.C, self.D = C, D
        self.register_buffer("W_E", torch.randn(C, D, generator=generator) / math.sqrt(D))  # fixed, not trained
        self.mlp1 = mlp(2 * D, width, D_phi, depth1)
        self.mlp2_in = nn.Linear(D + D_phi, width)  # MLP2's first layer, on x0_n (+) phi_n
        self.mlp2_rest = nn.Sequential(nn.GELU(), *mlp(width, width, C, depth2 - 1))
        self.reset_parameters(generator)

    @torch.no_grad()
    def reset_parameters(self, generator=None):
        """PyTorch's default Linear initialization, U(-1/sqrt(fan_in), 1/sqrt(fan_in)), drawn from
        `generator` instead of the global RNG."""
        for layer in self.modules():
            if isinstance(layer, nn.Linear):
                bound = 1 / math.sqrt(layer.in_features)
                layer.weight.uniform_(-bound, bound, generator=generator)
                layer.bias.uniform_(-bound, bound, generator=generator)

    def pair_table(self) -> torch.Tensor:
        """MLP1(x0_cur (+) x0_prev) for all C^2 pairs, row prev * C + cur: (C^2, D_phi)."""
        C = self.C
        prev, cur = torch.arange(C).repeat_interleave(C), torch.arange(C).repeat(C)
        return self.mlp1(torch.cat([self.W_E[cur], self.W_E[prev]], -1))

    def forward(self, seqs: torch.Tensor, return_phi: bool = False):
        """logits (B, N, C); logits[:, n] predicts s_{n+1} from s_0..s_n."""
        phi = pooled(seqs, self.pair_table())
        W_x, W_phi = self.mlp2_in.weight[:, : self.D], self.mlp2_in.weight[:, self.D :]
        state_part = (self.W_E @ W_x.T)[seqs]  # (B, N, width): the x0_n part as a C-row table
        logits = self.mlp2_rest(state_part + phi @ W_phi.T + self.mlp2_in.bias)
        return (logits, phi) if return_phi else logits


# ----------------------------------------------------------------------------- training


@dataclass
class MemRun:
    K: int = 16
    D_phi: int = 16
    depth1: int = 1
    depth2: int = 2
    seed: int = 0  # model initialization, embedding and batches
    task_seed: int = 0
    N: int = 64  # predictions per sequence
    iters: int = 2000
    batch: int = 64
    lr: float = 1e-3
    width: int = 128
    D: int = 32
    tail: int = 200  # iterations averaged in the K2_hat criterion (the paper: 1000 of 4 x 10^5)
    eval_seqs: int = 512


def train_mem(run: MemRun) -> dict:
    """AdamW on K chains; the criterion <L_train - L^{2-Gen}> over the last `tail` batches, and the
    final losses on held-out sequences from S and from fresh chains, each against 2-Gen on the same sequences."""
    g = torch.Generator().manual_seed(run.seed)
    tasks = TaskSet.create(run.K, seed=run.task_seed)
    model = TaskHead(D=run.D, D_phi=run.D_phi, width=run.width, depth1=run.depth1, depth2=run.depth2, generator=g)
    opt = torch.optim.AdamW(model.parameters(), lr=run.lr, betas=(0.9, 0.95), weight_decay=1e-3)
    gap = []
    for t in range(run.iters):
        seqs, _ = tasks.batch(run.batch, run.N + 1, g)
        loss = F.cross_entropy(model(seqs[:, :-1]).reshape(-1, 10), seqs[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if t >= run.iters - run.tail:
            gap.append(loss.item() - nll(two_gen(seqs, 10), seqs).mean().item())
    g_eval = torch.Generator().manual_seed(999_983 + run.task_seed)
    out = {"run": asdict(run), "criterion": float(np.mean(gap))}
    with torch.no_grad():
        for split, (seqs, _) in (("train", tasks.batch(run.eval_seqs, run.N + 1, g_eval)),
                                 ("gen", tasks.gen_batch(run.eval_seqs, run.N + 1, g_eval))):
            model_loss = nll(F.log_softmax(model(seqs[:, :-1]), -1), seqs).mean().item()
            out[f"{split}_minus_2gen"] = model_loss - nll(two_gen(seqs, 10), seqs).mean().item()
    return out


def bisect_K(run: MemRun, K_lo: int, K_hi: int, evaluate) -> tuple[float, list]:
    """K2_hat by binary search over log2 K in [K_lo, K_hi] (powers of two) for a criterion that holds
    (model beats 2-Gen: < 0) at small K and fails at large K. The zero crossing is then interpolated
    linearly in log2 K between the last passing and the first failing K. Returns (K2_hat,
    [(K, criterion), ...]); beyond the range, K_lo / sqrt(2) or K_hi * sqrt(2)."""
    lo, hi = int(math.log2(K_lo)), int(math.log2(K_hi))
    history = []

    def value(e):
        v = evaluate(replace(run, K=2**e))
        history.append((2**e, v))
        return v

    v_lo = value(lo)
    if v_lo >= 0:
        return float(2**lo) / math.sqrt(2), history
    v_hi = value(hi)
    if v_hi < 0:
        return float(2**hi) * math.sqrt(2), history
    while hi - lo > 1:  # invariant: passes at lo, fails at hi
        mid = (lo + hi) // 2
        v = value(mid)
        if v < 0:
            lo, v_lo = mid, v
        else:
            hi, v_hi = mid, v
    return 2 ** (lo + v_lo / (v_lo - v_hi)), history


# ----------------------------------------------------------------------------- experiments

PRESETS = {
    "quick": dict(base=MemRun(N=64, iters=1500, batch=64, width=64, D=32, tail=150), D_phis=[2, 8, 32, 128],
                  Ks=[4, 16, 64, 256, 1024], search_D_phi=8, search_seeds=2, K_range=(2, 512)),
    "paper": dict(base=MemRun(N=256, iters=400_000, batch=128, width=256, D=64, tail=1000), D_phis=[4, 8, 16, 32, 64, 128],
                  Ks=[2**i for i in range(2, 15)], search_D_phi=32, search_seeds=3, K_range=(2, 2**15)),
}


def _criterion(run: MemRun) -> float:
    return train_mem(run)["criterion"]


def _search(args) -> dict:
    run, K_lo, K_hi = args
    K2, history = bisect_K(run, K_lo, K_hi, _criterion)
    return {"run": asdict(run), "K2_hat": K2, "history": history}


def _depth_pair(text: str) -> tuple[int, int]:
    """'l1,l2' -> (l1, l2): hidden layers of MLP1 and MLP2, each >= 1."""
    parts = text.split(",")
    if len(parts) != 2 or not all(p.strip().isdigit() and int(p) >= 1 for p in parts):
        raise ValueError(f"--depths: expected pairs like 1,2 (hidden layers of MLP1 and MLP2, each >= 1), got {text!r}")
    return int(parts[0]), int(parts[1])


def plot_heatmaps(result: dict, path: str):
    H = result["heatmap"]
    fig, axes = plt.subplots(1, 4, figsize=(20, 4.2))
    lim = max(1e-3, np.nanmax(np.abs(np.array(H["train_minus_2gen"] + H["gen_minus_2gen"]))))
    for ax, key, title in ((axes[0], "train_minus_2gen", "L_train - L^2-Gen"), (axes[1], "gen_minus_2gen", "L_gen - L^2-Gen")):
        im = ax.pcolormesh(np.arange(len(H["K"])), np.arange(len(H["D_phi"])), np.array(H[key]), shading="nearest",
                           cmap="RdBu_r", vmin=-lim, vmax=lim)
        fig.colorbar(im, ax=ax)
        ax.set_xticks(range(len(H["K"])), H["K"])
        ax.set_yticks(range(len(H["D_phi"])), H["D_phi"])
        ax.set_xlabel("K")
        ax.set_ylabel("D_phi")
        ax.set_title(f"{title} (blue: beats 2-Gen)")
    depths = sorted(result["K2_hat"])
    for i, d in enumerate(depths):
        values = result["K2_hat"][d]
        axes[2].plot([i] * len(values), values, "o", alpha=0.6)
        axes[2].plot([i], [np.exp(np.mean(np.log(values)))], "k_", ms=20)
    axes[2].set_xticks(range(len(depths)), [f"({d})" for d in depths])
    axes[2].set_yscale("log", base=2)
    axes[2].set_xlabel("(l1, l2): hidden layers of MLP1, MLP2")
    axes[2].set_title(f"K2_hat at D_phi = {result['search_D_phi']} (dots: seeds, bar: geometric mean)", fontsize=9)
    D, K = zip(*sorted((int(d), k) for d, k in result["K2_hat_vs_D_phi"].items()))
    axes[3].plot(D, K, "s-", color="tab:purple")
    axes[3].set_xscale("log", base=2)
    axes[3].set_yscale("log", base=2)
    axes[3].set_xlabel("D_phi")
    axes[3].set_title("K2_hat of (1, 2) against D_phi (seed 0)", fontsize=9)
    note = (f"quick preset: {result['iters']} iterations - how fast memorization happens, not the asymptotic capacity"
            if result["preset"] == "quick" else f"{result['iters']} iterations")
    fig.suptitle(f"Minimal task-recognition head ({note})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


HEATMAP_KEYS = ("preset", "iters", "search_D_phi", "heatmap", "K2_hat", "K2_hat_vs_D_phi")  # what plot_heatmaps reads


def replot(figures: str):
    """--replot: the figure again from FIGURES/mem_minimal.json, or one line on what is missing or broken."""
    path = os.path.join(figures, "mem_minimal.json")
    try:
        with open(path) as f:
            result = json.load(f)
    except OSError as e:
        raise ValueError(f"--replot: cannot read {path} ({e.strerror})") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"--replot: {path} is not valid JSON ({e})") from None
    missing = [k for k in HEATMAP_KEYS if not isinstance(result, dict) or k not in result]
    if missing:
        raise ValueError(f"--replot: {path} lacks {', '.join(missing)} (not written by mem_minimal.py)")
    plot_heatmaps(result, os.path.join(figures, "mem_heatmaps.png"))


def main():
    parser = cli.ArgumentParser(description="Minimal model of the task-recognition head: heat maps and K2_hat (Fig. 8d-f); "
                                            "runs on the CPU, as one-thread processes.")
    cli.add_preset(parser, PRESETS, "quick: 1500 steps, N = 64, width 64; paper: 4 x 10^5 steps, N = 256, width 256")
    parser.add_argument("--iters", type=int, default=None, help="iterations per run (default: quick 1500, paper 400000)")
    cli.add_jobs(parser)
    cli.add_threads(parser)
    cli.add_figures(parser)
    parser.add_argument("--replot", action="store_true", help="only redraw the figure from FIGURES/mem_minimal.json")
    parser.add_argument("--depths-only", action="store_true",
                        help="only the K2_hat searches over (l1, l2), for budget studies with --iters; writes FIGURES/mem_depths_<iters>.json")
    parser.add_argument("--depths", nargs="+", default=["1,1", "1,2", "2,1", "2,2"], help="(l1, l2) pairs as l1,l2")
    cli.add_seeds(parser, None, "seeds of each (l1, l2) search (default: quick 0-1, paper 0-2)")
    args = parser.parse_args()
    cli.set_threads(args.threads)
    if args.replot:
        replot(args.figures)
        return
    preset = cli.preset(args.preset)
    P = PRESETS[preset]
    base = P["base"]
    if args.iters is not None:  # the criterion keeps averaging the same fraction of the run
        iters = check_int("--iters", args.iters, 1)
        base = replace(base, iters=iters, tail=max(1, round(base.tail * iters / base.iters)))
    jobs = check_int("--jobs", args.jobs, 1)
    seeds = list(range(P["search_seeds"])) if args.seeds is None else parse_list("--seeds", args.seeds)
    depths = [_depth_pair(d) for d in args.depths]
    cli.writable_dir(args.figures, "--figures")
    cli.announce(preset, f"{base.iters} steps per run, seeds {seeds}, {jobs} processes",
                 f"{args.figures}/" + (f"mem_depths_{base.iters}.json" if args.depths_only else "mem_heatmaps.png and mem_minimal.json"))
    t0 = time.time()

    searches = [(replace(base, D_phi=P["search_D_phi"], depth1=l1, depth2=l2, seed=s), *P["K_range"])
                for l1, l2 in depths for s in seeds]
    if args.depths_only:
        found = cli.parallel_map(_search, searches, jobs)
        K2 = {}
        for f in found:
            K2.setdefault(f"{f['run']['depth1']},{f['run']['depth2']}", []).append(f["K2_hat"])
        path = os.path.join(args.figures, f"mem_depths_{base.iters}.json")
        with open(path, "w") as f:
            json.dump({"preset": preset, "config": asdict(base), "K2_hat": K2, "searches": found,
                       "seconds": round(time.time() - t0, 1)}, f, indent=1)
        print(f"K2_hat at D_phi = {P['search_D_phi']}, {base.iters} iterations:", json.dumps(K2))
        print(f"wrote {path} in {(time.time() - t0) / 60:.1f} min")
        return
    heat_runs = [replace(base, K=K, D_phi=d) for d in P["D_phis"] for K in P["Ks"]]
    searches += [(replace(base, D_phi=d), *P["K_range"]) for d in P["D_phis"] if d != P["search_D_phi"]]
    searches.sort(key=lambda s: -(s[0].depth1 + s[0].depth2))  # deeper (slower) runs first
    heat = cli.parallel_map(train_mem, heat_runs, jobs)
    print(f"heat map: {len(heat_runs)} runs in {time.time() - t0:.0f} s", flush=True)
    found = cli.parallel_map(_search, searches, jobs)
    print(f"K2_hat searches done in {time.time() - t0:.0f} s", flush=True)

    shape = (len(P["D_phis"]), len(P["Ks"]))
    result = {
        "preset": preset, "iters": base.iters, "config": asdict(base), "search_D_phi": P["search_D_phi"],
        "heatmap": {"D_phi": P["D_phis"], "K": P["Ks"],
                    "train_minus_2gen": np.array([r["train_minus_2gen"] for r in heat]).reshape(shape).tolist(),
                    "gen_minus_2gen": np.array([r["gen_minus_2gen"] for r in heat]).reshape(shape).tolist(),
                    "criterion": np.array([r["criterion"] for r in heat]).reshape(shape).tolist()},
        "K2_hat": {}, "K2_hat_vs_D_phi": {}, "searches": found,
    }
    for f in found:
        r = f["run"]
        if r["D_phi"] == P["search_D_phi"]:
            result["K2_hat"].setdefault(f"{r['depth1']},{r['depth2']}", []).append(f["K2_hat"])
        if (r["depth1"], r["depth2"]) == (1, 2) and r["seed"] == 0:
            result["K2_hat_vs_D_phi"][str(r["D_phi"])] = f["K2_hat"]
    result["seconds"] = round(time.time() - t0, 1)
    with open(os.path.join(args.figures, "mem_minimal.json"), "w") as f:
        json.dump(result, f, indent=1)
    plot_heatmaps(result, os.path.join(args.figures, "mem_heatmaps.png"))
    H = result["heatmap"]
    for i, d in enumerate(H["D_phi"]):
        print(f"D_phi={d:4d}  train-2gen " + " ".join(f"{v:+.3f}" for v in H["train_minus_2gen"][i])
              + "   gen-2gen " + " ".join(f"{v:+.3f}" for v in H["gen_minus_2gen"][i]))
    print("K2_hat:", json.dumps(result["K2_hat"]), "vs D_phi:", json.dumps(result["K2_hat_vs_D_phi"]))
    print(f"wrote {args.figures}/mem_heatmaps.png and mem_minimal.json in {result['seconds'] / 60:.1f} min")


if __name__ == "__main__":
    cli.run(main)
