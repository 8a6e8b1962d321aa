"""The minimal model of the task-recognition head and its K2_hat (Fig. 8d-f): Sec. "K2* and the representational
capacity of the task recognition head", eq. (minimal_task_head), and Appendix "Minimal Model for 2-Point Memorization"
(the minimal network, and K2_hat's threshold < L_train - L^{2-Gen} >_1000 < 0).

The encoder-pool-decoder of eq. (2memcirc), made concrete as eq. (minimal_task_head), autoregressive over s_0..s_N:
    x0_n  = W_E x_n                                     fixed random Gaussian embedding (C -> D)
    phi_n = mean_{1 <= i <= n} MLP1(x0_i (+) x0_{i-1})  the task vector: pooled pair embeddings (D_phi)
    z_n   = MLP2(x0_n (+) phi_n)                        C logits for s_{n+1}
phi_0 = 0 (no pair yet). MLP1 has l1 hidden layers, MLP2 l2 (the reference is l1 = 1, l2 = 2), all of one width.
MLP1 only ever sees the C^2 distinct pairs, so it is evaluated on those and gathered; the running mean is a cumulative
sum. Likewise the x0_n part of MLP2's first layer is a C-row table.

K2_hat (the minimal model's K2*) is the largest K at which the model still beats 2-Gen on its own training sequences,
< L_train - L^{2-Gen} > < 0 over the last iterations: bisect_K, a binary search over powers of two.

Three modes, each a figure and its JSON in figures/ (with --replot, only the figure redrawn from the JSON):
    python mem_minimal.py                  # Fig. 8d-f: the K2_hat searches over (l1, l2) x D_phi x seeds, then the
                                           # D_phi x K heat maps of seed 0 (mem_heatmaps.png, mem_minimal.json)
    python mem_minimal.py --depths-only --iters 6000 --seeds 0   # Fig. 8f alone at 4x the budget (mem_depths_6000)
    python mem_minimal.py --trend          # the heat map's large-K, large-D_phi corner against the budget (mem_trend)
    python mem_minimal.py --preset paper   # the paper's sizes (N = 256, 4 x 10^5 iterations); default: quick
A call first says what it trains and how long that should take (cli.estimate), then progress lines with an ETA.
"""
import json
import math
import os
import time
from dataclasses import asdict, dataclass, replace

import matplotlib.pyplot as plt
import matplotlib.ticker as ticker
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from bayes import nll, two_gen
from markov import TaskSet
from plumbing import cli
from plumbing.rundir import write_json

# ----------------------------------------------------------------------------- the model


def mlp(d_in: int, width: int, d_out: int, hidden_layers: int) -> nn.Sequential:
    """d_in -> d_out through `hidden_layers` GELU layers of `width` (0: a single Linear)."""
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
    """Eq. (minimal_task_head): encoder MLP1 on neighbouring pairs, pooling, decoder MLP2, over C states."""

    def __init__(self, C: int, D: int = 32, D_phi: int = 16, width: int = 128, depth1: int = 1, depth2: int = 2,
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
        """PyTorch's default Linear init, U(+-1/sqrt(fan_in)), drawn from `generator`, not the global RNG."""
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


# ----------------------------------------------------------------------------- training and the K2_hat search


@dataclass
class MemRun:
    K: int = 16  # chains in the task set S
    D_phi: int = 16  # task-vector dimension
    depth1: int = 1  # l1: hidden layers of MLP1, the encoder
    depth2: int = 2  # l2: hidden layers of MLP2, the decoder
    seed: int = 0  # model initialization (W_E included) and training batches
    task_seed: int = 0  # the chains of S (and the held-out sequences' stream)
    N: int = 64  # predictions per sequence (sequences of N + 1 states)
    iters: int = 2000  # AdamW steps
    batch: int = 64  # sequences per step
    lr: float = 1e-3  # AdamW learning rate
    width: int = 128  # hidden width of MLP1 and MLP2
    D: int = 32  # dimension of the fixed embedding W_E
    tail: int = 200  # iterations averaged in the K2_hat criterion (the paper: 1000 of 4 x 10^5)
    eval_seqs: int = 512  # held-out sequences for each final loss


def train_mem(run: MemRun) -> dict:
    """AdamW on K chains; the criterion <L_train - L^{2-Gen}> over the last `tail` batches, and the
    final losses on held-out sequences from S and from fresh chains, each against 2-Gen on the same sequences."""
    g = torch.Generator().manual_seed(run.seed)
    tasks = TaskSet.create(run.K, seed=run.task_seed)
    C = tasks.C  # the number of states, the paper's 10
    model = TaskHead(C, D=run.D, D_phi=run.D_phi, width=run.width, depth1=run.depth1, depth2=run.depth2, generator=g)
    opt = torch.optim.AdamW(model.parameters(), lr=run.lr, betas=(0.9, 0.95), weight_decay=1e-3)
    gap = []
    for t in range(run.iters):
        seqs, _ = tasks.batch(run.batch, run.N + 1, g)
        loss = F.cross_entropy(model(seqs[:, :-1]).reshape(-1, C), seqs[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if t >= run.iters - run.tail:
            gap.append(loss.item() - nll(two_gen(seqs, C), seqs).mean().item())
    g_eval = torch.Generator().manual_seed(999_983 + run.task_seed)  # by S alone: every model of S sees the same sets
    out = {"run": asdict(run), "criterion": float(np.mean(gap))}
    with torch.no_grad():
        for split, (seqs, _) in (("train", tasks.batch(run.eval_seqs, run.N + 1, g_eval)),
                                 ("gen", tasks.gen_batch(run.eval_seqs, run.N + 1, g_eval))):
            model_loss = nll(F.log_softmax(model(seqs[:, :-1]), -1), seqs).mean().item()
            out[f"{split}_minus_2gen"] = model_loss - nll(two_gen(seqs, C), seqs).mean().item()
    return out


def criterion(run: MemRun) -> float:
    """The K2_hat criterion of one training: < L_train - L^{2-Gen} > over its last `tail` batches (< 0: beats 2-Gen)."""
    return train_mem(run)["criterion"]


def bisect_K(run: MemRun, K_lo: int, K_hi: int, evaluate) -> tuple[float, list]:
    """K2_hat by binary search over log2 K in [K_lo, K_hi] (powers of two) for a criterion that holds (model beats
    2-Gen: < 0) at small K and fails at large K, its zero crossing interpolated linearly in log2 K between the last
    passing and the first failing K. Returns (K2_hat, [(K, criterion), ...]); beyond the range, K_lo / sqrt(2) or
    K_hi * sqrt(2). Not K1*'s estimators.Search, which bisects any integer K on a yes/no outcome (so other probes)."""
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
    # D_phis x Ks: the heat maps (seed 0); search_D_phis x depths x search_seeds: the K2_hat searches of
    # Fig. 8f over K_range; trend_iters: budgets at which the heat map's large-K, large-D_phi corner is
    # retrained (Fig. 8d-e at longer budgets)
    "quick": dict(base=MemRun(N=64, iters=1500, batch=64, width=64, D=32, tail=150), D_phis=[2, 8, 32, 128],
                  Ks=[4, 16, 64, 256, 1024], search_D_phis=[2, 8, 32, 128], search_D_phi=8, search_seeds=3,
                  K_range=(2, 512), corner=(1024, 128), trend_iters=[1500, 3000, 6000, 12000]),
    "paper": dict(base=MemRun(N=256, iters=400_000, batch=128, width=256, D=64, tail=1000),
                  D_phis=[4, 8, 16, 32, 64, 128], Ks=[2**i for i in range(2, 15)],
                  search_D_phis=[4, 8, 16, 32, 64, 128], search_D_phi=32, search_seeds=3, K_range=(2, 2**15),
                  corner=(2**14, 128), trend_iters=[25_000, 100_000, 400_000]),
}


def heatmap(base: MemRun, D_phis: list, Ks: list, jobs: int) -> dict:
    """Fig. 8d-e: L_train - L^2-Gen and L_gen - L^2-Gen (and the training criterion) over D_phi x K, seed 0."""
    runs = cli.parallel_map(train_mem, [replace(base, K=K, D_phi=d) for d in D_phis for K in Ks], jobs, "heat map runs")
    return {"D_phi": D_phis, "K": Ks, **{key: np.array([r[key] for r in runs]).reshape(len(D_phis), len(Ks)).tolist()
                                        for key in ("train_minus_2gen", "gen_minus_2gen", "criterion")}}


def k2_search(job: tuple) -> dict:
    """One K2_hat search, a parallel_map job (run, K_lo, K_hi)."""
    run, K_lo, K_hi = job
    K2, history = bisect_K(run, K_lo, K_hi, criterion)
    return {"run": asdict(run), "K2_hat": K2, "history": history}


def _search_key(run: dict) -> str:  # a search is known by its whole run configuration
    return json.dumps(run, sort_keys=True)


def pending_searches(base: MemRun, depths: list, D_phis: list, seeds: list[int], K_range: tuple,
                     done: list[dict] = ()) -> list[tuple]:
    """The searches (run, K_lo, K_hi) of every (l1, l2), D_phi and seed that `done` does not hold, deeper first."""
    known = {_search_key(f["run"]) for f in done}
    searches = [(replace(base, D_phi=d, depth1=l1, depth2=l2, seed=s), *K_range)
                for l1, l2 in depths for d in D_phis for s in seeds]
    todo = [a for a in searches if _search_key(asdict(a[0])) not in known]
    return sorted(todo, key=lambda a: -(a[0].depth1 + a[0].depth2))  # deeper first: the longest searches start early


def k2_searches(base: MemRun, depths: list, D_phis: list, seeds: list[int], K_range: tuple, jobs: int,
                done: list[dict] = ()) -> dict:
    """Fig. 8f: K2_hat for every (l1, l2), D_phi and seed. Returns {"K2_hat": {"l1,l2": {"D_phi": [per seed]}},
    "searches": [...]}. `done`: searches found earlier (their "run" configurations and K2_hat), reused
    instead of retrained, and kept in the result with the new ones (each search is deterministic)."""
    known = {_search_key(f["run"]): f for f in done}
    todo = pending_searches(base, depths, D_phis, seeds, K_range, done)
    for f in cli.parallel_map(k2_search, todo, jobs, "K2_hat searches"):
        known[_search_key(f["run"])] = f
    found = sorted(known.values(), key=lambda f: tuple(f["run"][k] for k in ("depth1", "depth2", "D_phi", "seed")))
    K2 = {}
    for f in found:
        r = f["run"]
        K2.setdefault(f"{r['depth1']},{r['depth2']}", {}).setdefault(str(r["D_phi"]), []).append(f["K2_hat"])
    return {"K2_hat": K2, "searches": found}


def trend_runs(base: MemRun, K: int, D_phi: int, iters: list) -> list[MemRun]:
    return [replace(base, K=K, D_phi=D_phi, iters=n, tail=max(1, n // 10)) for n in iters]


def budget_trend(base: MemRun, K: int, D_phi: int, iters: list, jobs: int) -> dict:
    """The heat map's corner (large K, large D_phi) retrained at several budgets (the criterion always
    over the last 10% of the run): how fast L_train and L_gen approach 2-Gen with training."""
    runs = cli.parallel_map(train_mem, trend_runs(base, K, D_phi, iters), jobs, "trend runs", cost=iters)
    return {"K": K, "D_phi": D_phi, "iters": iters,
            **{key: [r[key] for r in runs] for key in ("train_minus_2gen", "gen_minus_2gen")}}


def geometric_stats(values: list) -> tuple[float, float]:
    """(geometric mean, standard deviation of log2) of positive values."""
    logs = np.log2(values)
    return float(2 ** logs.mean()), float(logs.std())


# ----------------------------------------------------------------------------- figures

TRAIN_GAP, GEN_GAP = r"$L_\mathrm{train} - L^\text{2-Gen}$", r"$L_\mathrm{gen} - L^\text{2-Gen}$"  # mathtext
D_PHI, K2_HAT = r"$D_\phi$", r"$\hat K_2$"


def save(fig, path: str):
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def budget_note(preset: str, iters: int) -> str:
    return (f"quick preset: {iters} iterations - how fast memorization happens, not the asymptotic capacity"
            if preset == "quick" else f"{iters} iterations")


def plot_k2_hat(ax, K2: dict):
    """Fig. 8f: K2_hat against D_phi for every (l1, l2): geometric mean over seeds, error bars one standard
    deviation of log2 K2_hat; gray dots: the seeds."""
    for k, (depth, by_D) in enumerate(sorted(K2.items())):
        D = sorted(by_D, key=int)
        stats = [geometric_stats(by_D[d]) for d in D]
        x = np.array([int(d) for d in D]) * 1.06 ** (k - 1.5)  # small offsets keep the error bars apart
        mean, sd = np.array(stats).T  # (len(D),) each
        line, = ax.plot(x, mean, "o-", label=f"({depth})")
        ax.errorbar(x, mean, yerr=[mean * (1 - 2.0**-sd), mean * (2.0**sd - 1)], fmt="none", capsize=3,
                    color=line.get_color())
        for xi, d in zip(x, D):
            ax.plot([xi] * len(by_D[d]), by_D[d], ".", color="gray", alpha=0.5)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    D_phis = sorted({int(d) for by_D in K2.values() for d in by_D})
    ax.set_xticks(D_phis, [str(d) for d in D_phis])
    # K2_hat spans less than two octaves: ticks at 1, 1.25, 1.5, 1.75 x 2^k, not at the powers of 2 alone
    ax.yaxis.set_major_locator(ticker.LogLocator(base=2, subs=(1.0, 1.25, 1.5, 1.75)))
    ax.yaxis.set_major_formatter(ticker.FormatStrFormatter("%g"))
    ax.set_xlabel(D_PHI)
    ax.set_ylabel(K2_HAT)
    ax.legend(title=r"($l_1$, $l_2$)", fontsize=8)
    ax.set_title(f"{K2_HAT} (geometric mean over seeds, $\\pm$1 sd of $\\log_2$)", fontsize=9)


def plot_heatmaps(result: dict, path: str):
    """Fig. 8d-e (heat maps) and 8f (K2_hat against D_phi for every (l1, l2): geometric mean over seeds,
    error bars one standard deviation of log2 K2_hat; dots: seeds). Returns the figure (closed)."""
    H = result["heatmap"]
    fig, axes = plt.subplots(1, 3, figsize=(17, 4.2))
    lim = max(1e-3, np.nanmax(np.abs(np.array(H["train_minus_2gen"] + H["gen_minus_2gen"]))))
    for ax, key, title in ((axes[0], "train_minus_2gen", TRAIN_GAP), (axes[1], "gen_minus_2gen", GEN_GAP)):
        im = ax.pcolormesh(np.arange(len(H["K"])), np.arange(len(H["D_phi"])), np.array(H[key]), shading="nearest",
                           cmap="RdBu_r", vmin=-lim, vmax=lim)
        fig.colorbar(im, ax=ax)
        ax.set_xticks(range(len(H["K"])), H["K"])
        ax.set_yticks(range(len(H["D_phi"])), H["D_phi"])
        ax.set_xlabel("K")
        ax.set_ylabel(D_PHI)
        ax.set_title(f"{title} (blue: beats 2-Gen)")
    plot_k2_hat(axes[2], result["K2_hat"])
    fig.suptitle(f"Minimal task-recognition head ({budget_note(result['preset'], result['iters'])})", fontsize=10)
    save(fig, path)
    return fig


def plot_depths(result: dict, path: str):
    """Fig. 8f alone, for a --depths-only call (its budget in the title)."""
    fig, ax = plt.subplots(figsize=(6, 4.2))
    plot_k2_hat(ax, result["K2_hat"])
    note = budget_note(result["preset"], result["config"]["iters"])
    fig.suptitle(f"Minimal task-recognition head\n({note})", fontsize=9)
    save(fig, path)


def plot_trend(trend: dict, path: str):
    """The corner's L - L^2-Gen on train and fresh chains against the training budget (ticks at the budgets)."""
    fig, ax = plt.subplots(figsize=(5.5, 4))
    for key, label in (("train_minus_2gen", "training chains (S)"), ("gen_minus_2gen", "fresh chains")):
        ax.plot(trend["iters"], trend[key], "o-", label=label)
    ax.axhline(0, color="k", lw=0.8, label="2-Gen")
    ax.set_xscale("log", base=2)
    ax.set_xticks(trend["iters"], [str(n) for n in trend["iters"]])
    ax.xaxis.set_minor_locator(ticker.NullLocator())
    ax.set_xlabel("training steps")
    ax.set_ylabel(r"$L - L^\text{2-Gen}$ (nats)")
    ax.set_title(f"Minimal task-recognition head, Fig. 8d-e's corner K = {trend['K']}, {D_PHI} = {trend['D_phi']}:\n"
                 "the loss gap to 2-Gen against the training budget", fontsize=9)
    ax.legend()
    save(fig, path)


# ----------------------------------------------------------------------------- the command line


def replot(figures: str, mode: str = "heatmaps", iters: int | None = None, path: str | None = None):
    """--replot [JSON]: a mode's figure again from its JSON (default in FIGURES), the PNG beside it (it writes no JSON),
    or one line on what is missing or broken."""
    name, keys, draw, writer = {  # keys: what the plot reads; writer: the call that writes the JSON
        "heatmaps": ("mem_minimal", ("preset", "iters", "heatmap", "K2_hat"), plot_heatmaps, "mem_minimal.py"),
        "trend": ("mem_trend", ("K", "D_phi", "iters", "train_minus_2gen", "gen_minus_2gen"), plot_trend,
                  "mem_minimal.py --trend"),
        "depths": (f"mem_depths_{iters}", ("preset", "config", "K2_hat"), plot_depths,
                   f"mem_minimal.py --depths-only --iters {iters}")}[mode]
    path = path or os.path.join(figures, f"{name}.json")
    png = os.path.join(os.path.dirname(path), "mem_heatmaps.png" if mode == "heatmaps" else f"{name}.png")
    cli.redraw(path, keys, writer, lambda result: draw(result, png))
    print(f"wrote {png} from {path}")


SEARCH_NOTE = ", at most: a search ends early when K2_hat is outside its range"  # the estimate's, when it searches


def search_trainings(K_lo: int, K_hi: int) -> int:
    """The most trainings bisect_K makes over [K_lo, K_hi]: both ends, then a halving of the octaves between them
    (fewer when the criterion fails at K_lo or holds at K_hi)."""
    octaves = int(math.log2(K_hi)) - int(math.log2(K_lo))
    return 2 + math.ceil(math.log2(octaves)) if octaves > 1 else 2


def step_seconds(run: MemRun) -> float:
    """Seconds a training step of `run` takes on one thread here (cli.step_seconds); D_phi moves it most (x1.5-2)."""
    return cli.step_seconds(lambda n: train_mem(replace(run, iters=n, tail=1, eval_seqs=8)))


def run_trend(preset: str, base: MemRun, P: dict, jobs: int, figures: str):
    """--trend: the heat map's corner retrained at the preset's budgets (mem_trend.json and .png)."""
    cli.announce(preset, f"the corner K = {P['corner'][0]}, D_phi = {P['corner'][1]} at {P['trend_iters']} steps, "
                 f"{cli.processes(jobs)}", f"{figures}/mem_trend.json and .png")
    trend_jobs = [(run, 1) for run in trend_runs(base, *P["corner"], P["trend_iters"])]
    print(cli.estimate([trend_jobs], jobs, step_seconds, "D_phi"), flush=True)
    t0 = time.time()
    trend = budget_trend(base, *P["corner"], P["trend_iters"], jobs)
    trend["seconds"] = round(time.time() - t0, 1)
    write_json(os.path.join(figures, "mem_trend.json"), trend, indent=1)
    plot_trend(trend, os.path.join(figures, "mem_trend.png"))
    print(json.dumps(trend))


def run_depths(preset: str, base: MemRun, grid: dict, jobs: int, figures: str):
    """--depths-only: the K2_hat searches of `grid` alone (Fig. 8f at a budget: mem_depths_<iters>.json and .png),
    reusing those an earlier call with the same budget and model (all but depth, D_phi and seed) left in the file."""
    path = os.path.join(figures, f"mem_depths_{base.iters}.json")
    cli.announce(preset, f"{base.iters} steps per run, seeds {grid['seeds']}, {cli.processes(jobs)}", path)
    if done := cli.earlier_results(path, asdict(base), "searches"):
        print(f"reusing the {len(done)} searches already in {path}", flush=True)
    if searches := [(run, search_trainings(*grid["K_range"])) for run, *_ in pending_searches(base, **grid, done=done)]:
        print(cli.estimate([searches], jobs, step_seconds, "D_phi", SEARCH_NOTE), flush=True)
    t0 = time.time()
    found = k2_searches(base, **grid, jobs=jobs, done=done)
    print(f"K2_hat searches done in {time.time() - t0:.0f} s:", json.dumps(found["K2_hat"]), flush=True)
    result = {"preset": preset, "config": asdict(base), **found, "seconds": round(time.time() - t0, 1),
              "reused": len(done)}  # seconds: this call's, which trained only the searches it did not reuse
    write_json(path, result, indent=1)
    plot_depths(result, path.replace(".json", ".png"))
    print(f"K2_hat at D_phi = {grid['D_phis']}, {base.iters} iterations; wrote {path} and .png in "
          f"{(time.time() - t0) / 60:.1f} min")


def run_heatmaps(preset: str, base: MemRun, P: dict, grid: dict, jobs: int, figures: str):
    """The default call: the K2_hat searches of `grid`, then the D_phi x K heat map (Fig. 8d-f, mem_heatmaps.png)."""
    cli.announce(preset, f"{base.iters} steps per run, seeds {grid['seeds']}, {cli.processes(jobs)}",
                 f"{figures}/mem_heatmaps.png and mem_minimal.json")
    searches = [(run, search_trainings(*grid["K_range"])) for run, *_ in pending_searches(base, **grid)]
    heat = [(replace(base, K=K, D_phi=d), 1) for d in P["D_phis"] for K in P["Ks"]]
    print(cli.estimate([stage for stage in (searches, heat) if stage], jobs, step_seconds, "D_phi",
                       SEARCH_NOTE if searches else ""), flush=True)
    t0 = time.time()
    found = k2_searches(base, **grid, jobs=jobs)
    print(f"K2_hat searches done in {time.time() - t0:.0f} s:", json.dumps(found["K2_hat"]), flush=True)
    result = {"preset": preset, "iters": base.iters, "config": asdict(base),
              "heatmap": heatmap(base, P["D_phis"], P["Ks"], jobs), **found, "seconds": round(time.time() - t0, 1)}
    write_json(os.path.join(figures, "mem_minimal.json"), result, indent=1)
    plot_heatmaps(result, os.path.join(figures, "mem_heatmaps.png"))
    H = result["heatmap"]
    for i, d in enumerate(H["D_phi"]):
        print(f"D_phi={d:4d}  train-2gen " + " ".join(f"{v:+.3f}" for v in H["train_minus_2gen"][i])
              + "   gen-2gen " + " ".join(f"{v:+.3f}" for v in H["gen_minus_2gen"][i]))
    print(f"wrote {figures}/mem_heatmaps.png and mem_minimal.json in {result['seconds'] / 60:.1f} min")


def depth_pair(text: str) -> tuple[int, int]:
    """'l1,l2' -> (l1, l2): hidden layers of MLP1 and MLP2, each >= 1."""
    parts = text.split(",")
    if len(parts) != 2 or not all(p.strip().isdigit() and int(p) >= 1 for p in parts):
        raise ValueError(f"--depths: expected pairs like 1,2 (hidden layers of MLP1 and MLP2, each >= 1), got {text!r}")
    return int(parts[0]), int(parts[1])


def parse_args():
    parser = cli.ArgumentParser(description="Minimal model of the task-recognition head: heat maps and K2_hat "
                                            "(Fig. 8d-f); runs on the CPU, as one-thread processes.", runs=(
        "Default run: 31 min 54 s from a fresh clone on the 2-core development VM, its cores otherwise idle "
        "(2026-11-26) (quick preset: 48 K2_hat searches, then the D_phi x K heat map; 1500 steps a run, N = 64, "
        "width 64); writes figures/mem_heatmaps.png and figures/mem_minimal.json.\n--replot: seconds, trains nothing."))
    cli.add_preset(parser, PRESETS, "quick: 1500 steps, N = 64, width 64; paper: 4 x 10^5 steps, N = 256, width 256")
    parser.add_argument("--iters", type=cli.at_least(1), default=None,
                        help="iterations per run (default: quick 1500, paper 400000)")
    cli.add_jobs(parser)
    cli.add_threads(parser)
    cli.add_figures(parser)
    cli.add_replot(parser, "FIGURES/mem_minimal.json; with --trend mem_trend.json, with --depths-only mem_depths_"
                           "<iters>.json", "a figure (mem_heatmaps.png, mem_trend.png, mem_depths_<iters>.png)")
    parser.add_argument("--depths-only", action="store_true",
                        help="only the K2_hat searches over (l1, l2) at the preset's search_D_phi (or --D-phis), "
                             "for budget studies with --iters; writes FIGURES/mem_depths_<iters>.json and .png, "
                             "reusing the searches an earlier call with the same budget left there")
    parser.add_argument("--D-phis", type=cli.at_least(1), nargs="+", default=None,
                        help="D_phi values of the K2_hat searches (default: quick 2 8 32 128, paper 4..128)")
    parser.add_argument("--trend", action="store_true", help="only the heat map's large-K, large-D_phi corner at the "
                                                             "preset's budgets; writes FIGURES/mem_trend.json and .png")
    parser.add_argument("--depths", nargs="+", default=["1,1", "1,2", "2,1", "2,2"], help="(l1, l2) pairs as l1,l2")
    cli.add_seeds(parser, None, "seeds of each (l1, l2, D_phi) search (default: 0-2)")
    return parser.parse_args()


def main():
    args = parse_args()
    cli.set_threads(args.threads)
    preset = cli.preset(args.preset)
    P = PRESETS[preset]
    base = P["base"]
    if args.iters is not None:  # the criterion keeps averaging the same fraction of the run
        base = replace(base, iters=args.iters, tail=max(1, round(base.tail * args.iters / base.iters)))
    mode = "trend" if args.trend else "depths" if args.depths_only else "heatmaps"
    if args.replot is not None:
        return replot(args.figures, mode, base.iters, args.replot or None)
    seeds = list(range(P["search_seeds"])) if args.seeds is None else cli.parse_list("--seeds", args.seeds)
    D_phis = args.D_phis or ([P["search_D_phi"]] if args.depths_only else P["search_D_phis"])
    grid = dict(depths=[depth_pair(d) for d in args.depths], D_phis=D_phis, seeds=seeds, K_range=P["K_range"])
    cli.writable_dir(args.figures, "--figures")
    if mode == "trend":
        run_trend(preset, base, P, args.jobs, args.figures)
    elif mode == "depths":
        run_depths(preset, base, grid, args.jobs, args.figures)
    else:
        run_heatmaps(preset, base, P, grid, args.jobs, args.figures)


if __name__ == "__main__":
    cli.run(main)
