"""Task vectors in the memorizing phases (Sec. "The task recognition head and the formation of task
vectors", Fig. 4; Appendix "The memorization circuit": Task Vector, Representation Geometry, Patching
with Fig. A8, Information Content with eqs. tvdecomp, tv_info_first and tv_info_last).

In 2-Mem, Att2 averages MLP1's pair embeddings over the sequence, phi_n = (1/n) sum_i lambda(s_{i-1}, s_i)
(eq. 2memcirc), and MLP2 reads the chain from phi, the task vector. Three experiments test that reading:

  geometry     phi = Att2's output at the last position of sequences from each chain of S, embedded in
               2-D by t-SNE (scikit-learn) and coloured by chain; separability measured in the original D
               dimensions by cross-validated k-nearest-neighbour chain accuracy and the silhouette.
  patching     batches S_A, S_B with chain_B != chain_A sequence by sequence; run S_B with Att2's output
               replaced by S_A's at every position ("S_B + phi_A") and the reverse, and compare every
               condition with the 2-Mem predictors named (posterior's batch, current state's batch):
               AA, AB, BA, BB (bayes.mixed_mem). Similarity per sequence
               exp(-D_KL^{S_N}(pi_hat || pi_theta) / D_KL^{S_N}(uniform || pi_theta)), averaged over the
               batch. By that definition S_B + phi_A should match AB (the posterior from A's task vector,
               the state from B's own tokens); the appendix's prose calls it "BA" in one place. The same
               with Att1's output and the 1-Mem predictors at a 1-Mem checkpoint (Fig. A8).
  information  lambda(tau, mu) = MLP1's output at the last token of the two-state sequence (mu, tau),
               the columns of E (D, C^2); E projected on the principal components that keep 90 % of the
               variance. Task vectors of chain k at N = 128 are Gaussian with mean E p^k and covariance
               (1/N) E (diag(p^k) - p^k p^kT) E^T, p^k the chain's pair distribution (the multinomial
               covariance of the pair counts; the appendix writes p^k - p^k p^kT, without the diag).
               I(K; phi) = H(phi) - H(phi | K): H(phi | K) in closed form, H(phi) by Monte Carlo
               (1000 samples) with a control variate of known mean (`mutual_information`); reported
               as I / log2 K through training, for several K.

    python task_vectors.py                   # quick runs: geometry and patching at K = 16, information at K = 4, 16, 64
    python task_vectors.py --preset paper    # the paper's runs: K = 128, information at K = 32, 64, 128 (GPU to train)
    python task_vectors.py --replot          # only redraw the figure from FIGURES/task_vectors.json
    python task_vectors.py --ledger circuits_paper   # the paper-scale run's (campaigns/), from its ledger

It writes figures/task_vectors.png and .json, the repository's committed copies; --figures DIR writes
elsewhere. The experiments run on the CPU, ~3 min on 2 cores, plus ~5 min for each quick run they have
to train first (a fresh clone: ~15 min in all).
"""
import json
import math
import os
import time

import matplotlib.pyplot as plt
import numpy as np
import torch
import torch.nn.functional as F
from sklearn.manifold import TSNE
from sklearn.metrics import silhouette_score
from sklearn.model_selection import StratifiedKFold, cross_val_score
from sklearn.neighbors import KNeighborsClassifier
from threadpoolctl import threadpool_limits  # scikit-learn's own dependency

from analysis.edges import run_edges
from analysis.runs import TRAIN_TIME, closest_predictor, find_run, load_run, train_run
from bayes import PREDICTORS, kl_div, mixed_mem
from campaigns import records
from campaigns.specs import LEDGERS
from markov import TaskSet, sample_sequences
from plumbing import cli
from plumbing.rundir import write_atomic
from plumbing.style import LABELS
from transformer import Transformer

N_INFO = 128  # sequence length of the information estimate (the appendix: midway through N = 256)
VAR_KEPT = 0.9  # principal components of the pair embeddings kept for the information estimate
MC_SAMPLES = 1000  # Monte Carlo samples of H(phi)
COLOURED = 10  # t-SNE panels at K > 20: chains 0-9 in tab10's colours, the others grey (at K = 128 no palette tells
#                all apart); at K <= 20 every chain in tab10's or tab20's
CONDITIONS = ("S_A", "S_B", "S_B + phi_A", "S_A + phi_B")  # model runs of the patching experiment
PAIRS = ("AA", "AB", "BA", "BB")  # predictors: (posterior's batch, current state's batch)


# ----------------------------------------------------------------------------- geometry (Fig. 4a)


def chain_batch(tasks: TaskSet, per_chain: int, length: int, generator: torch.Generator):
    """per_chain sequences of `length` states from every chain of S: (seqs (K * per_chain, length), chains)."""
    chains = torch.arange(tasks.K).repeat_interleave(per_chain)
    return sample_sequences(tasks.T, len(chains), length, generator, chain_idx=chains)


@torch.no_grad()
def last_task_vectors(model: Transformer, seqs: torch.Tensor) -> torch.Tensor:
    """phi at the last position: Att2's output there, (B, D) for seqs (B, L) fed to the model as they are."""
    _, acts = run_edges(model, seqs, cache=True)
    return acts["A2"][:, -1]


def separability(X: np.ndarray, labels: np.ndarray, k: int = 5, folds: int = 5, seed: int = 0) -> dict:
    """How well the chains separate in the original space: the k-nearest-neighbour chain accuracy, each
    point classified by a model fitted on the other folds (chance 1/K), and the silhouette (-1..1,
    ~0 for overlapping clouds)."""
    cv = StratifiedKFold(folds, shuffle=True, random_state=seed)
    knn = cross_val_score(KNeighborsClassifier(n_neighbors=k), X, labels, cv=cv).mean()
    return {"knn": float(knn), "silhouette": float(silhouette_score(X, labels)), "chance": 1 / len(np.unique(labels))}


def tsne_2d(X: np.ndarray, seed: int = 0) -> np.ndarray:
    """scikit-learn's t-SNE to 2-D (perplexity 30, below the number of points for tiny tests; PCA
    initialization, so no random draw decides the layout). On one thread whatever the caller's limit:
    on two, BLAS (the PCA) and OpenMP (the Barnes-Hut gradient) sum in another order, and t-SNE turns that
    rounding into another layout."""
    perplexity = min(30.0, (len(X) - 1) / 3)
    with threadpool_limits(1):
        return TSNE(n_components=2, perplexity=perplexity, init="pca", random_state=seed).fit_transform(X)


# ----------------------------------------------------------------------------- patching (Fig. 4b, Fig. A8)


def similarity(logp: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
    """Per sequence exp(-D_KL^{S_N}(p || q) / D_KL^{S_N}(uniform || q)): 1 when the predictor p and the
    model q agree, e^-1 when p is as far from q as the uniform distribution is. logp, logq (B, N, C);
    returns (B,)."""
    kl = torch.func.vmap(kl_div)  # D_KL^{S_N} of each sequence, (B, N, C) pairs -> (B,)
    uniform = torch.full_like(logq, -math.log(logq.shape[-1]))
    return torch.exp(-kl(logp, logq) / kl(uniform, logq))


def patch_pair(tasks: TaskSet, n: int, length: int, generator: torch.Generator):
    """Batches S_A, S_B of n sequences from S, sequence i of S_B from another chain than sequence i of S_A."""
    chain_A = torch.randint(tasks.K, (n,), generator=generator)
    chain_B = (chain_A + torch.randint(1, tasks.K, (n,), generator=generator)) % tasks.K
    seqs_A, _ = sample_sequences(tasks.T, n, length, generator, chain_idx=chain_A)
    seqs_B, _ = sample_sequences(tasks.T, n, length, generator, chain_idx=chain_B)
    return seqs_A, seqs_B


@torch.no_grad()
def patched_runs(model: Transformer, seqs_A: torch.Tensor, seqs_B: torch.Tensor, block: str) -> dict:
    """The four conditions: the model on S_A and on S_B, and on each with `block`'s output ("A1" or "A2")
    at every position replaced by the other batch's. Log-probabilities (B, N, C) for seqs (B, N + 1)."""
    x_A, x_B = seqs_A[:, :-1], seqs_B[:, :-1]  # the model predicts from the first N states
    logits_A, acts_A = run_edges(model, x_A, cache=True)
    logits_B, acts_B = run_edges(model, x_B, cache=True)
    logits = {"S_A": logits_A, "S_B": logits_B,
              "S_B + phi_A": run_edges(model, x_B, patch={block: acts_A[block]}),
              "S_A + phi_B": run_edges(model, x_A, patch={block: acts_B[block]})}
    return {name: F.log_softmax(l.float(), -1) for name, l in logits.items()}


def mixed_predictors(seqs_A: torch.Tensor, seqs_B: torch.Tensor, T: torch.Tensor, two_point: bool) -> dict:
    """{"AB": posterior from S_A, current state from S_B, ...}, aligned with the model's N predictions."""
    seqs = {"A": seqs_A, "B": seqs_B}
    return {name: mixed_mem(seqs[name[0]], seqs[name[1]], T, two_point)[:, :-1] for name in PAIRS}


def patching_matrix(model: Transformer, tasks: TaskSet, seqs_A, seqs_B, block: str, two_point: bool) -> dict:
    """{condition: {predictor: mean similarity}}, the 4 x 4 matrix of Fig. 4b / A8."""
    runs = patched_runs(model, seqs_A, seqs_B, block)
    preds = mixed_predictors(seqs_A, seqs_B, tasks.T, two_point)
    return {c: {p: similarity(preds[p], runs[c]).mean().item() for p in PAIRS} for c in CONDITIONS}


# ----------------------------------------------------------------------------- information content (Fig. 4c)


def pair_distributions(tasks: TaskSet) -> torch.Tensor:
    """p^k over the C^2 pairs, (K, C^2) in float64: entry mu * C + tau is P^(k)(mu, tau) = p^k_mu T^k_{tau mu}."""
    P = tasks.p.double()[:, :, None] * tasks.T.double().transpose(1, 2)  # (K, mu, tau)
    return P.reshape(tasks.K, -1)


@torch.no_grad()
def pair_embeddings(model: Transformer) -> torch.Tensor:
    """E (D, C^2): column mu * C + tau is lambda(tau, mu), MLP1's output at the last token of (mu, tau)."""
    C = model.C
    pairs = torch.cartesian_prod(torch.arange(C), torch.arange(C))  # (C^2, 2): rows (mu, tau)
    _, acts = run_edges(model, pairs, cache=True)
    return acts["MLP1"][:, -1].double().T


def task_vector_gaussians(E: torch.Tensor, P: torch.Tensor, N: int = N_INFO, var_kept: float = VAR_KEPT):
    """p(phi | k) for phi = (1/N) E n, n ~ Multinomial(N, p^k), in the principal-component space of the
    C^2 pair embeddings that keeps `var_kept` of their variance: (means (K, d), covs (K, d, d))."""
    Z = E.T - E.T.mean(0)  # (C^2, D): embeddings centred over the pairs
    _, S, Vt = torch.linalg.svd(Z, full_matrices=False)
    explained = (S**2).cumsum(0) / (S**2).sum()
    d = int((explained < var_kept).sum()) + 1
    Z = Z @ Vt[:d].T  # (C^2, d); centred, so E p^k differs from the uncentred mean by a constant
    means = P @ Z  # (K, d)
    multinomial = torch.diag_embed(P) - P[:, :, None] * P[:, None, :]  # (K, C^2, C^2): Cov(n) / N
    covs = Z.T @ multinomial @ Z / N  # (K, d, d)
    return means, covs


def mutual_information(means: torch.Tensor, covs: torch.Tensor, n_samples: int = MC_SAMPLES,
                       generator: torch.Generator | None = None, paired: bool = True) -> tuple[float, float]:
    """I(K; phi) in bits for the uniform mixture of the Gaussians N(means[k], covs[k]) (eqs. tv_info_first,
    tv_info_last), from n_samples draws x of the mixture (chain k_x). Returns (I, its Monte Carlo
    standard error).

    paired=False is the appendix's estimator: H(phi | K) in closed form, H(phi) = <-log p(x)>. Its
    error is that of an entropy estimate, ~sqrt(d / 2) nats / sqrt(n_samples): ~0.1 bit for d ~ 15 and
    1000 samples, enough to push I / log2 K above 1 at K = 4. paired=True subtracts the control variate
    -log p(x | k_x) - H(phi | K), whose mean is zero: I = <log p(x | k_x) - log p(x)>, the same
    expectation from the same draws, each term at most log K."""
    K, d = means.shape
    chol = torch.linalg.cholesky(covs)  # (K, d, d)
    logdet = 2 * chol.diagonal(dim1=-2, dim2=-1).log().sum(-1)  # (K,)
    h_given_k = (0.5 * (d * math.log(2 * math.pi * math.e) + logdet)).mean()
    k = torch.randint(K, (n_samples,), generator=generator)
    eps = torch.randn(n_samples, d, 1, generator=generator, dtype=means.dtype)
    x = means[k] + (chol[k] @ eps)[..., 0]  # (n, d) draws of the mixture
    eye = torch.eye(d, dtype=means.dtype).expand(K, d, d)
    whiten = torch.linalg.solve_triangular(chol, eye, upper=False)  # (K, d, d): L_k^-1
    z = whiten @ x.T - whiten @ means[:, :, None]  # (K, d, n): L_k^-1 (x - m_k)
    maha = z.square().sum(1).T  # (n, K)
    log_pk = -0.5 * (maha + logdet + d * math.log(2 * math.pi))  # log p(x | j)
    neg_log_mix = -(torch.logsumexp(log_pk, 1) - math.log(K))  # -log p(x)
    if paired:
        terms = log_pk[torch.arange(n_samples), k] + neg_log_mix  # log p(x | k_x) - log p(x)
        info = terms.mean()
    else:
        terms = neg_log_mix
        info = neg_log_mix.mean() - h_given_k
    return (info / math.log(2)).item(), (terms.std() / math.sqrt(n_samples) / math.log(2)).item()


def information_curve(run_dir: str, seed: int = 0) -> dict:
    """At every saved step: I(K; phi) / log2 K by the paired estimator ("fraction") and by the appendix's
    ("fraction_unpaired", the same draws), their standard errors (same units), and the PC dimension."""
    cfg, rows, _, tasks = load_run(run_dir)
    P = pair_distributions(tasks)
    out = {key: {} for key in ("fraction", "stderr", "fraction_unpaired", "stderr_unpaired", "dims")}
    for r in rows:
        _, _, model, _ = load_run(run_dir, r["step"])
        means, covs = task_vector_gaussians(pair_embeddings(model), P)
        for paired, suffix in ((True, ""), (False, "_unpaired")):
            info, err = mutual_information(means, covs, generator=torch.Generator().manual_seed(seed), paired=paired)
            out["fraction" + suffix][r["step"]] = info / math.log2(cfg.K)
            out["stderr" + suffix][r["step"]] = err / math.log2(cfg.K)
        out["dims"][r["step"]] = means.shape[1]
    return out


# ----------------------------------------------------------------------------- checkpoints, figure


def lowest_divergence_checkpoint(rows: list[dict], name: str) -> dict:
    """The evaluation of one run (rows) with the lowest divergence to predictor `name` among those where it is the
    closest of the four, else among all (in_phase False): Fig. A3's rule, "the training checkpoint with lowest
    divergence to the corresponding predictor", kept inside the phase; the paper names none for Figs. 4, A8.
    Not circuits.phase_checkpoint's ratio floor: patching compares the model with every memorizing predictor
    (PAIRS), so it needs a checkpoint in its one run even where a phase leads by a few micro-nats."""
    in_phase = [r for r in rows if closest_predictor(r) == name]
    best = min(in_phase or rows, key=lambda r: r[f"kl_{name}"])
    return {"step": best["step"], "in_phase": bool(in_phase), "phase": closest_predictor(best),
            "kl": {p: best[f"kl_{p}"] for p in PREDICTORS}}


def geometry(run_dir: str, steps: list[int], tsne_steps: list[int], per_chain: int, seed: int = 0):
    """Separability of the last-position task vectors at every step in `steps` (the same sequences at
    each), and their t-SNE embedding at tsne_steps: ({step: separability}, {step: (xy (n, 2), chains)})."""
    cfg, _, _, tasks = load_run(run_dir)
    seqs, chains = chain_batch(tasks, per_chain, cfg.N, torch.Generator().manual_seed(seed))
    labels = chains.numpy()
    scores, embedded = {}, {}
    for step in steps:
        _, _, model, _ = load_run(run_dir, step)
        phi = last_task_vectors(model, seqs).numpy()  # (K * per_chain, D)
        scores[step] = separability(phi, labels, seed=seed)
        if step in tsne_steps:
            embedded[step] = (tsne_2d(phi, seed), labels)
    return scores, embedded


def tsne_choice(rows: list[dict], step_1mem: int, step_2mem: int) -> list[int]:
    """The t-SNE panels: early training (the first step >= 10), the 1-Mem checkpoint, the saved step
    nearest the geometric mean of the two memorizing checkpoints, and the 2-Mem checkpoint."""
    steps = [r["step"] for r in rows]
    early = next((s for s in steps if s >= 10), steps[0])
    middle = min(steps, key=lambda s: abs(math.log(max(s, 1)) - 0.5 * math.log(max(step_1mem * step_2mem, 1))))
    return sorted({early, step_1mem, middle, step_2mem})


def plot(result: dict, path: str):
    """Top row: t-SNE panels (Fig. 4a). Bottom: separability vs step, the two patching matrices (Fig. 4b,
    A8) and the information curves (Fig. 4c). result: task_vectors.json as loaded (steps and K as strings),
    so that a --replot draws what the run drew. Returns the figure (closed)."""
    def by_int(d: dict) -> dict:
        return {int(k): v for k, v in d.items()}

    knn, silhouette, phases = by_int(result["separability"]), by_int(result["silhouette"]), by_int(result["phase"])
    tsne, chains = by_int(result["tsne"]), np.array(result["tsne_chain"])
    K = result["config"]["K_geometry"]
    shown = chains < (COLOURED if K > 20 else K)
    colours = plt.get_cmap("tab20" if 10 < K <= 20 else "tab10").colors
    fig, axes = plt.subplots(2, 4, figsize=(18, 9.5))
    for ax, step in zip(axes[0], sorted(tsne)):
        xy = np.array(tsne[step])
        ax.scatter(xy[:, 0], xy[:, 1], c=[colours[c] if s else "0.8" for c, s in zip(chains, shown)], s=4)
        if not shown.all():  # the coloured chains again, above the grey ones
            ax.scatter(xy[shown, 0], xy[shown, 1], c=[colours[c] for c in chains[shown]], s=6)
        ax.set_title(f"step {step} (closest to {LABELS[phases[step]]})\n"
                     f"kNN accuracy {knn[step]:.2f}, silhouette {silhouette[step]:.2f}", fontsize=10)
        ax.set_xticks([])
        ax.set_yticks([])
    for ax in axes[0][len(tsne):]:
        ax.axis("off")
    axes[0][0].set_ylabel(f"t-SNE of phi (Att2, last position), K = {K}\n"
                          + ("coloured by chain" if shown.all() else f"chains 0-{COLOURED - 1} coloured, the rest grey"))

    ax = axes[1][0]
    steps = sorted(knn)
    x = [max(s, 1) for s in steps]
    ax.plot(x, [knn[s] for s in steps], "k.-", label="5-NN chain accuracy (5-fold CV)")
    ax.plot(x, [silhouette[s] for s in steps], ".-", color="tab:purple", label="silhouette")
    ax.axhline(1 / K, color="gray", ls=":", lw=1, label="chance 1/K")
    for i, s in enumerate(sorted(tsne)):
        ax.axvline(max(s, 1), color="gray", lw=0.5, label="steps of the t-SNE panels above" if i == 0 else None)
    ax.set_xscale("log")
    ax.set_xlabel("step")
    ax.set_title(f"separability of phi in D dims, K = {K}", fontsize=10)
    ax.legend(fontsize=8)

    for ax, key, block in ((axes[1][1], "patching_2mem", "Att2"), (axes[1][2], "patching_1mem", "Att1")):
        M = np.array([[result[key][c][p] for p in PAIRS] for c in CONDITIONS])
        ax.imshow(M, cmap="viridis", vmin=0, vmax=1)
        for i in range(4):
            for j in range(4):
                ax.text(j, i, f"{M[i, j]:.2f}", ha="center", va="center", color="w" if M[i, j] < 0.6 else "k")
        ax.set_xticks(range(4), PAIRS)
        ax.set_yticks(range(4), [c.replace("phi", block) for c in CONDITIONS])
        mem = key[-4:]
        ax.set_xlabel(f"{mem[0]}-Mem predictor (posterior from, state from)")
        ax.set_title(f"patching {block} at step {result['checkpoints'][mem]['step']}: similarity", fontsize=10)

    ax = axes[1][3]
    for i, K_info in enumerate(sorted(result["information"], key=int)):
        curve, err = by_int(result["information"][K_info]), by_int(result["information_stderr"][K_info])
        unpaired = by_int(result["information_unpaired"][K_info])
        steps = sorted(curve)
        x = [max(s, 1) for s in steps]
        ax.errorbar(x, [curve[s] for s in steps], yerr=[err[s] for s in steps], color=f"C{i}", marker=".", ms=3,
                    capsize=1, label=f"K = {K_info}")
        ax.plot(x, [unpaired[s] for s in steps], "x", color=f"C{i}", ms=3, alpha=0.5,
                label="appendix's estimator (same draws)" if i == 0 else None)
    ax.axhline(1, color="gray", ls=":", lw=1)
    ax.set_xscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("I(K; phi) / log2 K")
    ax.set_title(f"information content of phi\n(N = {N_INFO}, the PCs with {VAR_KEPT:.0%} of the variance)", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return fig


def experiments(run: str, info_runs: list[str], per_chain: int, n_patch: int, seed: int, out: str):
    """The three experiments on the memorizing run `run` and the information runs; writes the figure and JSON
    and returns the JSON's contents."""
    t0 = time.time()

    cfg, rows, _, tasks = load_run(run)
    if cfg.K < 2:
        raise ValueError(f"{run} has K = 1: there is no chain to recognize")
    checkpoints = {name: lowest_divergence_checkpoint(rows, name) for name in ("1mem", "2mem")}
    steps = [r["step"] for r in rows]
    tsne_steps = tsne_choice(rows, checkpoints["1mem"]["step"], checkpoints["2mem"]["step"])
    scores, embedded = geometry(run, steps, tsne_steps, per_chain, seed)
    print(f"geometry: {len(steps)} checkpoints, t-SNE at {tsne_steps}, {time.time() - t0:.0f} s", flush=True)

    g = torch.Generator().manual_seed(seed + 1)
    seqs_A, seqs_B = patch_pair(tasks, n_patch, cfg.N + 1, g)
    patching = {}
    for name, block in (("2mem", "A2"), ("1mem", "A1")):
        _, _, model, _ = load_run(run, checkpoints[name]["step"])
        patching[name] = patching_matrix(model, tasks, seqs_A, seqs_B, block, two_point=name == "2mem")
    print(f"patching done, {time.time() - t0:.0f} s", flush=True)

    curves, info_runs_by_K = {}, {}
    for d in info_runs:
        K = load_run(d)[0].K
        curves[K], info_runs_by_K[K] = information_curve(d, seed), d
    information = {K: c["fraction"] for K, c in curves.items()}
    print(f"information done, {time.time() - t0:.0f} s", flush=True)

    result = {
        "separability": {s: scores[s]["knn"] for s in steps},
        "silhouette": {s: scores[s]["silhouette"] for s in steps},
        "patching_2mem": patching["2mem"],
        "patching_1mem": patching["1mem"],
        "information": information,
        "information_stderr": {K: c["stderr"] for K, c in curves.items()},
        "information_unpaired": {K: c["fraction_unpaired"] for K, c in curves.items()},
        "information_unpaired_stderr": {K: c["stderr_unpaired"] for K, c in curves.items()},
        "information_pc_dims": {K: c["dims"] for K, c in curves.items()},
        "checkpoints": {**checkpoints, "tsne": tsne_steps},
        "phase": {r["step"]: closest_predictor(r) for r in rows},
        "tsne": {step: np.round(xy.astype(float), 2).tolist() for step, (xy, _) in embedded.items()},  # (n, 2) each
        "tsne_chain": next(iter(embedded.values()))[1].tolist(),  # the same sequences at every step
        "runs": {"geometry_and_patching": run, "information": info_runs_by_K},
        "config": {"K_geometry": cfg.K, "per_chain": per_chain, "patch_seqs": n_patch, "seed": seed,
                   "N_info": N_INFO, "var_kept": VAR_KEPT, "mc_samples": MC_SAMPLES},
        "seconds": round(time.time() - t0, 1),
    }
    text = json.dumps(result, indent=1)
    write_atomic(os.path.join(out, "task_vectors.json"), text)
    plot(json.loads(text), os.path.join(out, "task_vectors.png"))  # from the JSON, as --replot draws it
    for name in ("2mem", "1mem"):
        print(f"patching {name} at step {checkpoints[name]['step']} (rows: condition, columns: {' '.join(PAIRS)})")
        for c in CONDITIONS:
            print(f"  {c:12s} " + " ".join(f"{patching[name][c][p]:.3f}" for p in PAIRS))
    for K in sorted(information):
        last = max(information[K])
        print(f"information K = {K}: I / log2 K = {information[K][last]:.3f} at step {last}")
    print(f"wrote {out}/task_vectors.png and .json in {result['seconds']} s")
    return json.loads(text)


def ledger_figures(name: str, figures: str = "figures", ledgers: str = LEDGERS) -> dict:
    """--ledger: the task vectors of a circuits campaign's memorizing run (Figs. 4, A8), figures/task_vectors_*.png
    and .json (circuits_paper: task_vectors_paper), from ledgers/<name>.json alone."""
    result = records.pieces_of(name, ("circuits",), ledgers)[1]["pieces"][0]["task_vectors"]
    out = os.path.join(figures, name.replace("circuits", "task_vectors"))
    cli.writable_dir(figures, "--figures")
    plot(result, f"{out}.png")
    write_atomic(f"{out}.json", json.dumps(result, indent=1))
    return result


# ----------------------------------------------------------------------------- command line

PRESET_RUNS = {"quick": {"run": 16, "Ks": "4,16,64"},  # the paper: patching at K = 128, t-SNE "up to K = 128"
               "paper": {"run": 128, "Ks": "32,64,128"}}
PLOTTED = ("separability", "silhouette", "phase", "tsne", "tsne_chain", "patching_2mem", "patching_1mem", "information",
           "information_stderr", "information_unpaired", "checkpoints", "config")  # what plot reads


def main(argv: list[str] | None = None):
    """argv: command-line arguments (None: sys.argv)."""
    parser = cli.ArgumentParser(description="Task vectors: t-SNE geometry, patching, information (Fig. 4, A8). Writes "
                                            "FIGURES/task_vectors.png and .json; the default FIGURES, figures, holds "
                                            "the repository's committed copies.", runs=(
        "Default run: 1 min 22 s on the 2-core development VM (2026-11-27) with the quick runs K = 4, 16, 64 in place, "
        "~20 min from a fresh clone, which trains them first (quick preset: geometry and patching at K = 16, "
        "information at K = 4, 16, 64); writes figures/task_vectors.png and figures/task_vectors.json, and a missing "
        "run's runs/K<K>_s0/ (train.py's files).\n--replot: seconds, trains nothing."))
    cli.add_preset(parser, PRESET_RUNS, "which runs: quick K = 16 and information at K = 4, 16, 64, trained on the CPU "
                                        "if missing; paper K = 128 and 32, 64, 128, N = 256, trained on a GPU if missing")
    cli.add_figures(parser)
    cli.add_replot(parser, "FIGURES/task_vectors.json", "the figure")
    parser.add_argument("--run", default=None, help="the memorizing run (default: runs/K16_s0, paper runs/K128_s0)")
    parser.add_argument("--runs", default=None, help="comma-separated runs for the information curves (default: --Ks)")
    parser.add_argument("--Ks", default=None, help="K of the preset's runs for the information curves "
                                                   "(default: quick 4,16,64, paper 32,64,128)")
    parser.add_argument("--per-chain", type=cli.at_least(2), default=64, help="geometry: sequences per chain")
    parser.add_argument("--patch-seqs", type=cli.at_least(1), default=256, help="patching: sequences in S_A and in S_B")
    parser.add_argument("--seed", type=cli.at_least(0), default=0, help="sequences, t-SNE and Monte Carlo draws")
    parser.add_argument("--ledger", default=None, metavar="CAMPAIGN", help="only draw a paper-scale circuits campaign's "
                        "task vectors, FIGURES/task_vectors_*.png and .json, from ledgers/CAMPAIGN.json")
    cli.add_threads(parser, 1, "; t-SNE always runs on one, which keeps its layout the same from run to run")
    args = parser.parse_args(argv)
    preset = cli.preset(args.preset)
    Ks_text = args.Ks or PRESET_RUNS[preset]["Ks"]
    Ks = cli.parse_list("--Ks", Ks_text, rule="K of the information runs: integers >= 2")
    if min(Ks) < 2:
        raise ValueError(f"--Ks: K must be >= 2 (with one chain there is none to recognize), got {Ks_text!r}")
    if args.ledger is not None:
        ledger_figures(args.ledger, args.figures)
        print(f"wrote {args.figures}/{args.ledger.replace('circuits', 'task_vectors')}.png and .json from "
              f"ledgers/{args.ledger}.json")
        return
    cli.writable_dir(args.figures, "--figures")  # before the runs it may train
    if args.replot is not None:
        cli.replot(args, "task_vectors.json", PLOTTED, "task_vectors.py", plot)
        return
    K_run = PRESET_RUNS[preset]["run"]
    found = find_run(args.run, K_run, preset, "--run")
    if args.runs:  # named runs: find_run only checks them
        info = [(0, find_run(d, 0, preset, "--runs")) for d in args.runs.split(",")]
    else:
        info = [(K, find_run(None, K, preset, "--Ks")) for K in Ks]
    pending = {run: K for K, (run, missing) in [(K_run, found), *info] if missing}  # each missing run once
    committed = " (the committed copies; --figures DIR writes elsewhere)" if os.path.normpath(args.figures) == "figures" else ""
    cli.announce(preset, f"geometry and patching of {found[0]}, information curves of "
                         f"{', '.join(run for _, (run, _) in info)}; "
                         + (f"to train first: {', '.join(pending)} ({TRAIN_TIME[preset]} each); " if pending else "")
                         + "the experiments ~3 min on 2 CPU cores at N = 128",
                 f"{args.figures}/task_vectors.png and .json{committed}")
    for K in pending.values():
        train_run(K, preset)
    cli.set_threads(args.threads)
    with threadpool_limits(args.threads):
        experiments(found[0], [run for _, (run, _) in info], args.per_chain, args.patch_seqs, args.seed, args.figures)


if __name__ == "__main__":
    cli.run(main)
