"""The engine's data path: the fast sampler and the fast memorizing predictors.

Each computes what its plain twin on the reader's path computes, only faster: the sampler bit for bit, the
predictors to float32 rounding (tests/test_markov.py, tests/test_bayes.py pin them):

    batches(sources, n, length, generators)   the batches of E task sources at once, member e's the
                                              sequences of sources[e].batch(n, length, generators[e]),
                                              bit for bit: markov.py's loop over positions, run as a
                                              sqrt(L)-depth scan (on CUDA one Triton walk) and batched
                                              over the members
    fresh_batches(n, length, generators, C)   E batches of K = infinity sequences (each from its own chain),
                                              member e's markov's sample_chains and sample_sequences with
                                              generators[e], bit for bit (Fig. 6c bottom's batched seeds)
    predict(name, seqs, T)                    bayes.predict, with 1-Mem and 2-Mem (one_mem, two_mem)
                                              from anchored log-likelihood sums instead of
                                              bayes.py's cumulative sum over every chain and position

The ensembles (runners/grids.py) and train.py's speed block sample through `batches` (E separate batch() calls cost more
than the step itself); on CUDA its walk along the chains is one Triton launch (kernels/markov_walk.py, the same
numbers; WALK_KERNEL = False keeps the scan). Both pass `predict` to evaluation.make_eval_data (the paper
preset's L_train levels: 8192 sequences of 257 states against K = 1024 chains and more).
"""
import math
import os

import torch
import torch.nn.functional as F

import bayes
from kernels import markov_walk
from markov import TaskSet, check_int, check_seqs, inverse_cdf, sample_chains, stationary, uniforms

# On CUDA, batches walk the chains in kernels/markov_walk.py rather than walk' scan; MARKOV_ICL_WALK=0 in the
# environment keeps the scan (bench/gpu_campaign.sh sets it where the kernel's tests fail on the card)
WALK_KERNEL = os.environ.get("MARKOV_ICL_WALK", "1") != "0"
ANCHOR_EVERY = 8  # positions between the exact log-likelihood anchors of the memorizing predictors

# ----------------------------------------------------------------------------- sampler


def walk(Tb: torch.Tensor, p: torch.Tensor, u0: torch.Tensor, u: torch.Tensor | None, length: int,
            kernel: bool = False) -> torch.Tensor:
    """markov._sample_from's sequences (n, length) from the chains Tb (n, C, C), p (n, C) and the uniforms
    u0 (n, 1), u (block, nb, n) of markov.uniforms, all positions at once.

    With one uniform per position, step t is a fixed map f_t: {0..C-1} -> {0..C-1} (the inverse CDF of
    column mu at u_t), and s_t = f_t o ... o f_1 (s_0): `_compose` runs that as a blocked scan. kernel: the
    walk in one Triton launch instead (kernels/markov_walk.py; C <= 16)."""
    n, C = Tb.shape[0], Tb.shape[-1]
    s0 = inverse_cdf(p.cumsum(-1), u0)  # (n, 1)
    if u is None:
        return s0
    if kernel:
        return markov_walk.walk(Tb.cumsum(1), s0[:, 0], u, length)
    # Position k * block + j + 1 sits at [j, k]. step[j, k, b, mu] is the state there when the previous
    # position holds mu: the number of entries <= u[j, k, b] among the first C - 1 of column mu's CDF.
    block, nb = u.shape[:2]
    cdf = Tb.cumsum(1).transpose(0, 1).contiguous()  # (C_tau, n, C_mu)
    u = u[..., None].expand(block, nb, n, C).contiguous()  # compares that broadcast only the leading axes run faster
    step = torch.zeros(block, nb, n, C, dtype=torch.uint8, device=Tb.device)
    for tau in range(C - 1):  # cheaper than one broadcast compare summed over a short last axis
        step += (cdf[tau] <= u).view(torch.uint8)
    return _compose(s0[:, 0], step)[:, :length]


def _compose(s0: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
    """States s_t = step_t o ... o step_1 (s_0) for s0 (n,) and per-position maps step (block, nb, n, C)
    of any integer dtype.

    Depth ~3 sqrt(L) instead of L, each step vectorized over blocks and sequences: (1) every block's
    whole map, for all blocks at once (block - 1 compositions of C-entry maps); (2) the state entering
    each block, carried from block to block (nb - 1 steps); (3) the states inside all blocks, run
    forward from their entry states (block steps on single states). Only (1) touches whole maps, and it
    keeps one (nb, n, C) map, not one per position. Returns (n, 1 + nb * block)."""
    block, nb, n, C = step.shape
    whole = step[0].long()  # (nb, n, C): block entry -> position j of the block
    for j in range(1, block):
        whole = step[j].gather(2, whole).long()
    start = s0.new_empty(nb, n, 1)  # state entering each block
    start[0, :, 0] = s0
    for k in range(1, nb):
        start[k] = whole[k - 1].gather(1, start[k - 1])
    inside = s0.new_empty(n, nb, block)
    s = start
    for j in range(block):
        s = step[j].gather(2, s).long()
        inside[:, :, j] = s[..., 0].T
    return torch.cat([s0[:, None], inside.reshape(n, nb * block)], 1)


def batches(sources: list, n: int, length: int, generators: list, kernel: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch from each of E task sources at once: (seqs (E, n, length), chain_idx (E, n)), member e's being
    exactly sources[e].batch(n, length, generators[e]). Each member's random numbers are drawn from its own
    generator in the order batch() draws them, its chains looked up in its own task set; the work after
    that (inverse CDFs, the scan) is batched over the members, one launch per operation instead of E.
    K = inf sources draw their chains by rejection, so a list with one goes member by member. kernel: the walk in
    kernels/markov_walk.py (default: WALK_KERNEL on CUDA with Triton there, else the scan)."""
    if len(generators) != len(sources):
        raise ValueError(f"batches() needs one generator per source, got {len(generators)} for {len(sources)}")
    if not all(isinstance(t, TaskSet) for t in sources):
        return tuple(torch.stack(x) for x in zip(*(t.batch(n, length, g) for t, g in zip(sources, generators))))
    check_int("n", n, 1)
    check_int("length", length, 1)
    if len({(t.C, t.T.device, t.p.dtype) for t in sources}) != 1:
        raise ValueError("batches() needs task sets with one number of states C, one device and one dtype")
    chain_idx, T, p, u0, u = [], [], [], [], []
    for t, g in zip(sources, generators):
        chain_idx.append(torch.randint(t.K, (n,), generator=g, device=t.T.device))
        T.append(t.T[chain_idx[-1]])  # per member: concatenating all members' chains would copy them every step
        p.append(t.p[chain_idx[-1]])
        first, later = uniforms(n, length, g, t.p.dtype, t.T.device)
        u0.append(first)
        u.append(later)
    u = torch.cat(u, 2) if length > 1 else None  # (block, nb, E n): sequence e n + b, as T and p
    device = sources[0].T.device
    if kernel is None:
        kernel = WALK_KERNEL and device.type == "cuda" and markov_walk.triton is not None and sources[0].C <= 16
    seqs = walk(torch.cat(T), torch.cat(p), torch.cat(u0), u, length, kernel)
    return seqs.view(len(sources), n, length), torch.stack(chain_idx)


def fresh_batches(n: int, length: int, generators: list, C: int, alpha: float = 1.0) -> torch.Tensor:
    """E batches of n sequences at once, each sequence from its own fresh chain of D_T (K = infinity: the data of
    Fig. 6c bottom's batched seeds), (E, n, length): member e's exactly markov's sample_chains(n, C, alpha, g) then
    sample_sequences(T, n, length, g, chain_idx=arange(n)) with g = generators[e], its random numbers from its own
    generator in that order; the walk runs once over all E n sequences (on CUDA one Triton launch)."""
    T, u0, u = [], [], []
    for g in generators:
        T.append(sample_chains(n, C, alpha, g))
        first, later = uniforms(n, length, g, T[-1].dtype, T[-1].device)
        u0.append(first)
        u.append(later)
    T = torch.cat(T)
    kernel = WALK_KERNEL and T.device.type == "cuda" and markov_walk.triton is not None and C <= 16
    seqs = walk(T, stationary(T), torch.cat(u0), torch.cat(u, 2) if length > 1 else None, length, kernel)
    return seqs.view(len(generators), n, length)


# ----------------------------------------------------------------------------- memorizing predictors


def _memorizing(seqs: torch.Tensor, T: torch.Tensor, two_point: bool, state_seqs: torch.Tensor | None = None) -> torch.Tensor:
    """bayes._memorizing: the Bayes predictor with the uniform prior over the K chains T (K, C, C), in T's
    dtype; the posterior at n from seqs[:, :n+1], the current state from state_seqs[:, n] (default: seqs).

    The log-likelihood of s_0..s_n under chain k is a sum of one term per position,
    log theta_k[stat_i]: log p_k(s_0), then log T_k[s_i, s_{i-1}] (2-Mem) or log p_k(s_i) (1-Mem).
    It is computed for all K chains at once as an anchor, the sum over the whole blocks of
    ANCHOR_EVERY positions before n (counts times log theta: one matrix product for all blocks),
    plus the at most ANCHOR_EVERY terms since (an embedding_bag sum of rows of log theta). No
    chain or term is dropped: beyond float rounding, the one approximation is that posterior
    weights below 2^-115 of the best chain's are raised to it. Positions are grouped
    by their state s_n, so that the mixture sum_k P(k | s_0..s_n) T_k[:, s_n] is one small
    product per state. Chunks hold at most bayes.CHUNK_ELEMENTS elements.
    """
    K, C = T.shape[0], T.shape[-1]
    log_p = stationary(T).log()  # (K, C); also checks T
    seqs = check_seqs(seqs, C).to(T.device)
    B, L = seqs.shape
    state_seqs = seqs if state_seqs is None else check_seqs(state_seqs, C, "state_seqs").to(T.device)
    if state_seqs.shape != seqs.shape:
        raise ValueError(f"state_seqs must have the shape of seqs {tuple(seqs.shape)}, got {tuple(state_seqs.shape)}")
    if two_point:  # statistic s_0 for the first state, C + mu*C + tau for a transition mu -> tau
        log_theta = torch.cat([log_p, T.log().transpose(1, 2).reshape(K, C * C)], 1)
        stat = torch.cat([seqs[:, :1], C + seqs[:, :-1] * C + seqs[:, 1:]], 1)
    else:
        log_theta, stat = log_p, seqs
    # A zero probability becomes a large finite penalty, since 0 * -inf would be NaN in a product.
    # Centering over the chains shifts every chain's log-likelihood by the same amount (the
    # posterior is unchanged) and keeps the float32 sums small, hence accurate. Base 2, because
    # exp2 is ~1.6x faster than exp on the CPU.
    log_theta = log_theta.clamp(min=-1e4)
    log_theta = ((log_theta - log_theta.mean(0)) / math.log(2)).T.contiguous()  # (S, K)
    S = log_theta.shape[0]
    # mixture[mu]: T_k[tau, mu] in columns tau < C, ones in column C (the posterior's normalizer),
    # zeros up to a multiple of 16 columns (MKL's products with 11 columns are ~5x slower than with 16)
    width = -(-(C + 1) // 16) * 16
    mixture = T.new_zeros(C, K, width)
    mixture[..., :C] = T.permute(2, 0, 1)
    mixture[..., C] = 1.0
    out = torch.empty(B * L, C, dtype=T.dtype, device=T.device)
    A, dev = ANCHOR_EVERY, T.device
    nb = -(-L // A)  # blocks per sequence
    per_chunk = max(1, bayes.CHUNK_ELEMENTS // (nb * K))  # sequences whose anchors fit a chunk
    step = max(1, bayes.CHUNK_ELEMENTS // K)  # positions whose weights fit a chunk
    for s0 in range(0, B, per_chunk):
        s, st = state_seqs[s0 : s0 + per_chunk], stat[s0 : s0 + per_chunk]
        b = s.shape[0]
        # anchors: the log-likelihood of the blocks before block q, for every block q
        block_stat = torch.arange(L, device=dev) // A * S + st
        counts = torch.zeros(b, nb * S, dtype=T.dtype, device=dev)
        counts = counts.scatter_add_(1, block_stat, torch.ones_like(st, dtype=T.dtype)).view(b, nb, S)
        counts = counts.cumsum(1) - counts  # counts over the blocks before block q
        anchors = counts.view(b * nb, S) @ log_theta
        table = torch.cat([log_theta, anchors, log_theta.new_zeros(1, K)])  # terms, anchors, a zero row
        # positions grouped by their state s_n (from state_seqs); the bag of position n of sequence i:
        # its anchor, the terms of positions qA..n (q = n // A), and the zero row for the rest of the block
        states = s.reshape(-1)
        order = torch.argsort(states, stable=True)
        bounds = [0] + torch.bincount(states, minlength=C).cumsum(0).tolist()
        i, n = (order // L).unsqueeze(1), (order % L).unsqueeze(1)
        pos = n - n % A + torch.arange(A, device=dev)  # (b*L, A): the positions of n's block
        terms = torch.where(pos <= n, st.reshape(-1)[i * L + pos.clamp(max=L - 1)], S + b * nb)
        bags = torch.cat([S + i * nb + n // A, terms], 1)  # (b*L, A + 1)
        for r0 in range(0, b * L, step):
            r1 = min(b * L, r0 + step)
            weight = F.embedding_bag(bags[r0:r1], table, mode="sum")  # log2-likelihoods (r1 - r0, K)
            weight -= weight.amax(1, keepdim=True)  # relative to the best chain
            # unnormalized posterior; the clamp (2^-115 ~ e^-80) keeps exp2() clear of float32
            # denormals, which are slow on CPUs
            weight.clamp_(min=-115.0).exp2_()
            pred = weight.new_empty(r1 - r0, width)
            for mu in range(C):
                a, e = max(r0, bounds[mu]) - r0, min(r1, bounds[mu + 1]) - r0
                if a < e:
                    torch.mm(weight[a:e], mixture[mu], out=pred[a:e])
            out[s0 * L + order[r0:r1]] = pred[:, :C] / pred[:, C : C + 1]
    return out.view(B, L, C).log_()


def one_mem(seqs: torch.Tensor, T: torch.Tensor) -> torch.Tensor:
    """bayes.one_mem. Returns (B, L, C)."""
    return _memorizing(seqs, T, two_point=False)


def two_mem(seqs: torch.Tensor, T: torch.Tensor) -> torch.Tensor:
    """bayes.two_mem. Returns (B, L, C)."""
    return _memorizing(seqs, T, two_point=True)


def predict(name: str, seqs: torch.Tensor, T: torch.Tensor) -> torch.Tensor:
    """bayes.predict with the fast memorizing predictors: log-probabilities of `name` in bayes.PREDICTORS."""
    if name == "1mem":
        return one_mem(seqs, T)
    if name == "2mem":
        return two_mem(seqs, T)
    return bayes.predict(name, seqs, T)
