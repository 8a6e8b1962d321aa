"""Evaluation of a training run (Appendix "Phase Identification", "Behavioral readouts", "Mechanistic readouts",
"Transience and Partial Memorization"): the fixed held-out data and what train.py logs on it.

    make_eval_data / evaluate       the full evaluations of Fig. 2a: L_train on sequences from S, L_gen on fresh
                                    chains of D_T, the behavioral divergence D(pi_hat, pi_theta) to each Bayes
                                    predictor, and phi_delta, phi_beta, n_A of both layers
    lm_loss                         the training loss: the cross-entropy of s_{n+1} given s_0..s_n
    make_dense_data / readouts      the smaller held-out set of the dense readouts (--eval-every) and what they read
    make_per_chain_data / per_chain_scores    the memorization score Delta^k of every chain (--per-chain)

`cfg` is a train.Config (N, task_seed, eval_train, eval_gen, eval_dense, per_chain, per_chain_tasks, C). Every
set is drawn from its own seeded generator, so the data of one evaluation never depends on another's flags.
"""
import math

import torch
import torch.nn.functional as F

import bayes
from bayes import PREDICTORS, kl_div, nll
from markov import FreshChains, TaskSet, sample_chains, sample_sequences
from transformer import Transformer, n_A, phi_beta, phi_delta


def predictor_names(tasks: TaskSet | FreshChains) -> tuple[str, ...]:
    """The predictors a run is compared with: all four, or with K = inf (no S) the two generalizing ones."""
    return PREDICTORS if isinstance(tasks, TaskSet) else ("1gen", "2gen")


def make_eval_data(cfg, tasks: TaskSet | FreshChains, predict=bayes.predict) -> dict:
    """Fixed held-out batches from S (with their chains, "train_task"; with K = inf, from fresh chains like the
    training sequences) and from D_T, and the predictors on them (computed once, by `predict`: bayes.predict,
    or the engine's faster fastdata.predict, equal to float32 rounding)."""
    g = torch.Generator(tasks.T.device).manual_seed(1_000_003 * (cfg.task_seed + 1) + 7)
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


def lm_loss(model, seqs: torch.Tensor, task: torch.Tensor | None = None) -> torch.Tensor:
    """The training loss (Appendix "Training Process"): the cross-entropy of s_{n+1} given s_0..s_n, averaged over
    the N predictions of the B sequences seqs (B, N + 1); task (B,): each sequence's chain, read only by a model
    with task injection."""
    logits = model(seqs[:, :-1], task=task)  # (B, N, C)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), seqs[:, 1:].reshape(-1))


def make_dense_data(cfg, tasks: TaskSet | FreshChains) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The smaller held-out set of the dense readouts: eval_dense sequences from S and from D_T, and the
    chains of the S sequences; drawn from their own stream so that the full evaluation's data does not
    depend on --eval-every."""
    g = torch.Generator(tasks.T.device).manual_seed(1_000_003 * (cfg.task_seed + 1) + 11)
    train_seqs, train_task = tasks.batch(cfg.eval_dense, cfg.N + 1, g)
    return train_seqs, tasks.gen_batch(cfg.eval_dense, cfg.N + 1, g)[0], train_task


def readouts(model, train_seqs: torch.Tensor, gen_seqs: torch.Tensor, train_task: torch.Tensor | None = None,
             chunk: int = 256) -> dict[str, torch.Tensor]:
    """The dense readouts of one model (train.py --eval-every; an ensemble's members under vmap): losses on held-out sequences from S and
    from D_T, and the order parameters phi_delta, phi_beta of both layers on the S sequences (Appendix
    "Mechanistic readouts"). 0-dim tensors, so that nothing waits for the device. train_task: the chains of
    train_seqs (task injection); the fresh chains of gen_seqs have none. Chunks of `chunk` sequences keep
    the attention matrices small (the paper's 4096 sequences at N = 256 would be ~1 GB per layer and model);
    every readout is a mean over sequences, so the chunks' means weighted by their sizes are exact."""
    n, out = train_seqs.shape[0], {}

    def add(key: str, value: torch.Tensor, weight: float):
        out[key] = out.get(key, 0.0) + weight * value

    for a in range(0, n, chunk):
        seqs = train_seqs[a : a + chunk]
        task = train_task[a : a + chunk] if train_task is not None else None
        w = seqs.shape[0] / n
        logits, cache = model(seqs[:, :-1], cache=True, task=task)
        add("train_loss", F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), seqs[:, 1:].reshape(-1)), w)
        for layer, A in ((1, cache["A1"]), (2, cache["A2"])):
            add(f"phi_delta_{layer}", phi_delta(A), w)
            add(f"phi_beta_{layer}", phi_beta(A, seqs[:, :-1]), w)
    for a in range(0, gen_seqs.shape[0], chunk):
        seqs = gen_seqs[a : a + chunk]
        add("gen_loss", lm_loss(model, seqs), seqs.shape[0] / gen_seqs.shape[0])
    return {k: out[k] for k in ("train_loss", "gen_loss", "phi_delta_1", "phi_beta_1", "phi_delta_2", "phi_beta_2")}


def make_per_chain_data(cfg, tasks: TaskSet | FreshChains, draw: int = 0) -> dict:
    """The fixed sequences of the memorization scores: cfg.per_chain from each chain of S in chain order (with
    K = inf, from per_chain_tasks fixed chains of D_T), and the 2-Gen predictor's loss on each sequence. draw > 0:
    another set of sequences from the same chains, independent of draw 0's (the scores' own noise: k2.py)."""
    seed = 1_000_003 * (cfg.task_seed + 1) + 13
    g = torch.Generator(tasks.T.device).manual_seed(seed)
    T = tasks.T if isinstance(tasks, TaskSet) else sample_chains(cfg.per_chain_tasks, cfg.C, generator=g, device=tasks.T.device)
    if draw:
        g = torch.Generator(tasks.T.device).manual_seed(seed + 7_919 * draw)
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
    model.eval()
    seqs, losses = data["seqs"], []
    for a in range(0, seqs.shape[0], chunk):
        s = seqs[a : a + chunk]
        task = data["chain"][a : a + chunk] if data["chain"] is not None else None
        logq = F.log_softmax(model(s[:, :-1], task=task).float(), -1)
        losses.append(nll(logq, s).mean(1))
    model.train()
    return (torch.cat(losses) - data["loss_2gen"]).view(data["chains"], -1).mean(1)


@torch.no_grad()
def evaluate(model: Transformer, data: dict, chunk: int = 256) -> dict:
    """Losses, behavioral divergences to the predictors, and attention readouts of both layers."""
    model.eval()
    metrics = {}
    kl = {name: 0.0 for name in data["predictors"]}
    readouts = {key: 0.0 for key in ("phi_delta_1", "phi_delta_2", "phi_beta_1", "phi_beta_2", "entropy_1", "entropy_2")}
    for split in ("train", "gen"):
        seqs = data[split]
        n = seqs.shape[0]
        loss = 0.0
        for start in range(0, n, chunk):
            s = seqs[start : start + chunk]
            w = s.shape[0] / n
            task = data["train_task"][start : start + chunk] if split == "train" else None  # D_T: no known chain
            logits, cache = model(s[:, :-1], cache=True, task=task)
            logq = F.log_softmax(logits.float(), -1)
            loss += nll(logq, s).mean().item() * w
            for name in data["predictors"]:  # D(pi_hat, pi_theta) = 1/2 <KL>_S + 1/2 <KL>_{D_T}
                kl[name] += 0.5 * w * kl_div(data[f"{split}_{name}"][start : start + chunk], logq).item()
            if split == "train":  # the mechanistic readouts average over sequences from S
                for layer, A in ((1, cache["A1"]), (2, cache["A2"])):
                    readouts[f"phi_delta_{layer}"] += w * phi_delta(A).item()
                    readouts[f"phi_beta_{layer}"] += w * phi_beta(A, s[:, :-1]).item()
                    readouts[f"entropy_{layer}"] += w * math.log(n_A(A).item())
        metrics[f"{split}_loss"] = loss
        for name in data["predictors"]:
            metrics[f"{split}_loss_{name}"] = data[f"{split}_loss_{name}"]
    metrics.update({f"kl_{name}": kl[name] for name in data["predictors"]})
    for layer in (1, 2):
        metrics[f"phi_delta_{layer}"] = readouts[f"phi_delta_{layer}"]
        metrics[f"phi_beta_{layer}"] = readouts[f"phi_beta_{layer}"]
        metrics[f"n_A_{layer}"] = math.exp(readouts[f"entropy_{layer}"])  # exp of the expected entropy
    model.train()
    return metrics
