"""Evaluation of a training run (Appendix "Phase Identification", "Behavioral readouts", "Mechanistic readouts",
"Transience and Partial Memorization"): the fixed held-out data and what train.py logs on it.

    make_eval_data / evaluate       the full evaluations of Fig. 2a: L_train on sequences from S, L_gen on fresh
                                    chains of D_T, the behavioral divergence D(pi_hat, pi_theta) to each Bayes
                                    predictor, and phi_delta, phi_beta, n_A of both layers
    lm_loss                         the training loss: the cross-entropy of s_{n+1} given s_0..s_n
    make_dense_data / dense_readouts    the smaller held-out set of the dense readouts (--eval-every) and what they read
    make_per_chain_data / per_chain_scores    the memorization score Delta^k of every chain (--per-chain)
    held_out_sets                   all of a run's held-out sets, as train.py builds them

`cfg` is a train.Config (N, task_seed, eval_train, eval_gen, eval_dense, per_chain, per_chain_tasks, C). Every
set is drawn from its own seeded generator (held_out_generator), so the data of one evaluation never depends on
another's flags. Evaluations are means over sequences, taken over chunks of them (chunked_means) so that the
attention matrices stay small; a chunk's mean weighted by its share of the sequences makes the whole mean exact.
"""
import math
from functools import partial

import torch
import torch.nn.functional as F

import bayes
from bayes import PREDICTORS, kl_div, nll
from markov import FreshChains, TaskSet, sample_chains, sample_sequences
from transformer import Transformer, n_A, phi_beta, phi_delta

# the held-out sets' streams: arbitrary distinct primes, fixed once (every run's held-out data hangs on them);
# DRAW_STRIDE, a prime past them, spaces the per-chain set's further draws (PER_CHAIN + DRAW_STRIDE x draw)
EVAL, DENSE, PER_CHAIN, DRAW_STRIDE = 7, 11, 13, 7_919


def held_out_generator(task_seed: int, tasks: TaskSet | FreshChains, stream: int) -> torch.Generator:
    """The generator of one held-out set (stream EVAL, DENSE or PER_CHAIN, or PER_CHAIN plus an offset for another
    draw of the per-chain sequences), on the device of the task set; 1_000_003 (a prime past any stream) keeps the
    streams of different task seeds apart."""
    return torch.Generator(tasks.T.device).manual_seed(1_000_003 * (task_seed + 1) + stream)


def chunked_means(n: int, chunk: int, readouts, sums: dict | None = None) -> dict:
    """Means over n sequences of what readouts(part) gives for each chunk part (a slice of at most `chunk` of them), a
    dict of means over its sequences (floats, or 0-dim tensors that do not wait for the device): each chunk weighted
    by its share of the n, so the means are exact while a chunk's attention matrices stay small. sums: means to add
    to (those of another set)."""
    sums = {} if sums is None else sums
    for a in range(0, n, chunk):
        w = min(chunk, n - a) / n
        for key, value in readouts(slice(a, a + chunk)).items():
            sums[key] = sums.get(key, 0.0) + w * value
    return sums


def predictor_names(tasks: TaskSet | FreshChains) -> tuple[str, ...]:
    """The predictors a run is compared with: all four, or with K = inf (no S) the two generalizing ones."""
    return PREDICTORS if isinstance(tasks, TaskSet) else ("1gen", "2gen")


# ----------------------------------------------------------------------------- the full evaluations (Fig. 2a)


def make_eval_data(cfg, tasks: TaskSet | FreshChains, predict=bayes.predict) -> dict:
    """Fixed held-out batches from S (with their chains, "train_task"; with K = inf, from fresh chains like the
    training sequences) and from D_T, and the predictors on them (computed once, by `predict`: bayes.predict,
    or the engine's faster fastdata.predict, equal to float32 rounding)."""
    g = held_out_generator(cfg.task_seed, tasks, EVAL)
    data = dict(zip(("train", "train_task"), tasks.batch(cfg.eval_train, cfg.N + 1, g)))
    data["gen"] = tasks.gen_batch(cfg.eval_gen, cfg.N + 1, g)[0]
    data["predictors"] = predictor_names(tasks)
    for split in ("train", "gen"):
        seqs = data[split]
        for name in data["predictors"]:
            logp = predict(name, seqs, tasks.T)[:, :-1]  # aligned with the model's N predictions
            data[f"{split}_{name}"] = logp
            data[f"{split}_loss_{name}"] = nll(logp, seqs).mean().item()
    return data


@torch.no_grad()
def evaluate(model: Transformer, data: dict, chunk: int = 256) -> dict:
    """Losses, the behavioral divergence to each predictor,

        D(pi_hat, pi_theta) = 1/2 < KL(pi_hat || pi_theta) >_S + 1/2 < KL(pi_hat || pi_theta) >_{D_T},

    and the attention readouts of both layers on the sequences from S (n_A: exp of the expected entropy)."""

    def readouts(split: str, part: slice) -> dict[str, float]:
        s = data[split][part]
        task = data["train_task"][part] if split == "train" else None  # D_T: no known chain
        logits, cache = model(s[:, :-1], cache=True, task=task)
        logq = F.log_softmax(logits.float(), -1)
        out = {f"{split}_loss": nll(logq, s).mean().item()}
        for name in data["predictors"]:  # half of D from each split
            out[f"kl_{name}"] = 0.5 * kl_div(data[f"{split}_{name}"][part], logq).item()
        for layer in (1, 2) if split == "train" else ():
            A = cache[f"A{layer}"]
            out[f"phi_delta_{layer}"] = phi_delta(A).item()
            out[f"phi_beta_{layer}"] = phi_beta(A, s[:, :-1]).item()
            out[f"entropy_{layer}"] = math.log(n_A(A).item())
        return out

    sums = chunked_means(data["train"].shape[0], chunk, partial(readouts, "train"))
    sums = chunked_means(data["gen"].shape[0], chunk, partial(readouts, "gen"), sums)
    metrics = {}
    for split in ("train", "gen"):
        metrics[f"{split}_loss"] = sums[f"{split}_loss"]
        metrics.update({f"{split}_loss_{name}": data[f"{split}_loss_{name}"] for name in data["predictors"]})
    metrics.update({f"kl_{name}": sums[f"kl_{name}"] for name in data["predictors"]})
    for layer in (1, 2):
        metrics[f"phi_delta_{layer}"] = sums[f"phi_delta_{layer}"]
        metrics[f"phi_beta_{layer}"] = sums[f"phi_beta_{layer}"]
        metrics[f"n_A_{layer}"] = math.exp(sums[f"entropy_{layer}"])
    return metrics


# ----------------------------------------------------------------------------- the training loss


def cross_entropy(logits: torch.Tensor, seqs: torch.Tensor) -> torch.Tensor:
    """The cross-entropy of the model's predictions logits (B, N, C) of s_1..s_N in seqs (B, N + 1), averaged over
    the N predictions of the B sequences (in fp32 whatever the logits' precision)."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), seqs[:, 1:].reshape(-1))


def lm_loss(model, seqs: torch.Tensor, task: torch.Tensor | None = None) -> torch.Tensor:
    """The training loss (Appendix "Training Process"): the cross-entropy of s_{n+1} given s_0..s_n over the
    sequences seqs (B, N + 1); task (B,): each sequence's chain, read only by a model with task injection."""
    return cross_entropy(model(seqs[:, :-1], task=task), seqs)


# ----------------------------------------------------------------------------- the dense readouts (--eval-every)


def make_dense_data(cfg, tasks: TaskSet | FreshChains) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The smaller held-out set of the dense readouts: eval_dense sequences from S and from D_T, and the
    chains of the S sequences; drawn from their own stream so that the full evaluation's data does not
    depend on --eval-every."""
    g = held_out_generator(cfg.task_seed, tasks, DENSE)
    train_seqs, train_task = tasks.batch(cfg.eval_dense, cfg.N + 1, g)
    return train_seqs, tasks.gen_batch(cfg.eval_dense, cfg.N + 1, g)[0], train_task


def dense_readouts(model, train_seqs: torch.Tensor, gen_seqs: torch.Tensor, train_task: torch.Tensor | None = None,
                   chunk: int = 256) -> dict[str, torch.Tensor]:
    """The dense readouts of one model (train.py --eval-every; an ensemble's members under vmap): losses on held-out
    sequences from S and from D_T, and the order parameters phi_delta, phi_beta of both layers on the S sequences
    (Appendix "Mechanistic readouts"). 0-dim tensors, so that nothing waits for the device. train_task: the chains
    of train_seqs (task injection); the fresh chains of gen_seqs have none. In chunks: the paper's 4096 sequences at
    N = 256 would be ~1 GB of attention per layer and model."""

    def on_train(part: slice) -> dict[str, torch.Tensor]:
        seqs = train_seqs[part]
        logits, cache = model(seqs[:, :-1], cache=True, task=train_task[part] if train_task is not None else None)
        out = {"train_loss": cross_entropy(logits, seqs)}
        for layer in (1, 2):
            out[f"phi_delta_{layer}"] = phi_delta(cache[f"A{layer}"])
            out[f"phi_beta_{layer}"] = phi_beta(cache[f"A{layer}"], seqs[:, :-1])
        return out

    def on_gen(part: slice) -> dict[str, torch.Tensor]:
        return {"gen_loss": lm_loss(model, gen_seqs[part])}

    out = chunked_means(gen_seqs.shape[0], chunk, on_gen, chunked_means(train_seqs.shape[0], chunk, on_train))
    return {k: out[k] for k in ("train_loss", "gen_loss", "phi_delta_1", "phi_beta_1", "phi_delta_2", "phi_beta_2")}


# ----------------------------------------------------------------------------- the memorization scores (--per-chain)


def make_per_chain_data(cfg, tasks: TaskSet | FreshChains, draw: int = 0) -> dict:
    """The fixed sequences of the memorization scores: cfg.per_chain from each chain of S in chain order (with
    K = inf, from per_chain_tasks fixed chains of D_T), and the 2-Gen predictor's loss on each sequence. draw > 0:
    another set of sequences from the same chains, independent of draw 0's (the scores' own noise: k2.py)."""
    g = held_out_generator(cfg.task_seed, tasks, PER_CHAIN)
    T = tasks.T if isinstance(tasks, TaskSet) else sample_chains(cfg.per_chain_tasks, cfg.C, generator=g,
                                                                 device=tasks.T.device)
    if draw:
        g = held_out_generator(cfg.task_seed, tasks, PER_CHAIN + DRAW_STRIDE * draw)
    chain = torch.arange(T.shape[0], device=T.device).repeat_interleave(cfg.per_chain)  # (n_chains * per_chain,)
    seqs, _ = sample_sequences(T, chain.numel(), cfg.N + 1, g, chain_idx=chain)
    loss_2gen = nll(bayes.predict("2gen", seqs, T)[:, :-1], seqs).mean(1)  # (n,) one loss per sequence
    return {"seqs": seqs, "chain": chain if isinstance(tasks, TaskSet) else None, "loss_2gen": loss_2gen,
            "chains": T.shape[0], "T": T}


@torch.no_grad()
def per_chain_scores(model: Transformer, data: dict, chunk: int = 256) -> torch.Tensor:
    """The memorization score of every chain (Appendix "Transience and Partial Memorization"),

        Delta^k = < L(pi_theta, S) - L(pi_2Gen, S) >_{S ~ T^(k)},

    L the autoregressive cross-entropy of a sequence; Delta^k < 0: the model beats 2-Gen on chain k, which
    in-context inference alone cannot do. Returns (chains,)."""
    seqs, losses = data["seqs"], []
    for a in range(0, seqs.shape[0], chunk):
        part = slice(a, a + chunk)
        s, task = seqs[part], data["chain"][part] if data["chain"] is not None else None
        logq = F.log_softmax(model(s[:, :-1], task=task).float(), -1)
        losses.append(nll(logq, s).mean(1))
    return (torch.cat(losses) - data["loss_2gen"]).view(data["chains"], -1).mean(1)


# ----------------------------------------------------------------------------- a run's held-out sets


def held_out_sets(cfg, tasks: TaskSet | FreshChains, predict=bayes.predict) -> dict:
    """A run's held-out data: the full evaluations' sequences with the predictors on them (by
    `predict`: bayes.predict, or the engine's equal fastdata.predict); with --eval-every the dense readouts' and the
    2-Gen predictor's loss on their sequences from S (the level of thresholds.tau_2mem); with --per-chain the
    per-chain scores'. Each set comes from its own seeded generator: runs of one S share them."""
    sets = {"eval": make_eval_data(cfg, tasks, predict=predict)}
    if cfg.eval_every:
        sets["dense"] = make_dense_data(cfg, tasks)
        seqs = sets["dense"][0]
        sets["dense_2gen"] = nll(bayes.predict("2gen", seqs, tasks.T)[:, :-1], seqs).mean().item()
    if cfg.per_chain:
        sets["per_chain"] = make_per_chain_data(cfg, tasks)
    return sets
