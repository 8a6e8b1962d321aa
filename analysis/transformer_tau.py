"""tau_2Gen(N) of the transformer (Fig. 6c bottom; Sec. "The transition from G1 to G2", Appendix "Testing
predictions": the transformer's tau_2Gen against N / log N), trained on fresh chains (K = infinity) scored at the last
position against the Bayes predictors (analysis/fresh_chains.py, the SA-transformer's data too).

The model: the 2-layer transformer of transformer.py without MLP1 and with additive relative-position biases,
trained non-autoregressively at the last position by SGD with momentum. Its layer-2 attention at the last position
gives the induction readout phi_beta(2) of eq. (iha) at n = N (`induction`).

tau_2Gen (`tau_2gen_drop`): the loss's sustained drop below the halfway level between the 1-point plateau and 2-Gen, the
readout confirming that the induction head formed; a run that does not drop for good within its step cap is
censored (the cap a lower bound), never a value. The first halfway crossing (`crossing`) is kept beside it.

On CUDA the seeds of one N train as one batched model (`train_seeds`: torch.func.vmap over stacked parameters, each
seed's data drawn from its own generator), each seed equal to float rounding to itself trained alone (`train_one`).
"""
import json
import math
import os
import time

import numpy as np
import torch
import torch.nn.functional as F

from analysis.fresh_chains import C, crossing, eval_set, fresh_batch, predictor_levels
from analysis.sa_fits import fit_tau_censored
from engine import fastdata
from plumbing import cli
from plumbing.rundir import save_atomic
from transformer import Transformer, attention_scores, layer_norm

# ----------------------------------------------------------------------------- the criterion

# The window a drop must hold for: every evaluation from the crossing through (1 + WINDOW_FRACTION) tau, and at least
# WINDOW_EVALS of them. A fraction of the elapsed steps, because tau itself spans 2000 to 6000+ steps over N and the
# plateau's excursions last longer the longer the plateau (the momentum's memory, ~1 / (1 - 0.9) steps, is short next
# to them); 0.25 covers the 1.2 tau at which 4 of 12 quick runs were back above the level, with margin. The minimum
# count keeps a drop from passing on one or two evaluations when tau is small.
WINDOW_FRACTION = 0.25
WINDOW_EVALS = 5
# phi_beta(2) at the last position, the layer-2 attention on the positions that followed earlier occurrences of s_N:
# at uniform attention it is the fraction of such positions, sum_mu p_mu^2 ~ 0.1-0.2 for chains of D_T; an
# induction head puts most of the attention there. The drop counts only if max phi over the run up to the window's end
# reaches PHI_FORMED (Sec. "K1* is determined by a kinetic competition" reads max_t phi_beta(2) the same way).
PHI_FORMED = 0.5


def halfway(levels: dict) -> float:
    """The level tau is measured at: halfway from the best smoothed 1-point predictor (the transformer's plateau) to
    the Bayes 2-Gen loss, both at the last position over all samples."""
    return 0.5 * (levels["loss_best_1gen"] + levels["loss_2gen"])


def sustained_drop(t: list, loss: list, level: float, fraction: float = WINDOW_FRACTION,
                   evals: int = WINDOW_EVALS) -> tuple[float, float]:
    """(tau, end): the first downward crossing of `level` (interpolated between evaluations) after which the loss
    stays below it at every evaluation through t >= (1 + fraction) tau, and at least `evals` evaluations from the
    crossing on; end is the window's last evaluation. A crossing the loss comes back from is no tau; one whose window
    runs past the last evaluation is not decided yet. (nan, nan) when none held."""
    for i in range(1, len(t)):
        if not loss[i] < level <= loss[i - 1]:
            continue
        tau = t[i - 1] + (loss[i - 1] - level) / (loss[i - 1] - loss[i]) * (t[i] - t[i - 1])
        k = i + evals - 1
        while k < len(t) and t[k] < (1 + fraction) * tau:
            k += 1
        if k >= len(t):
            return math.nan, math.nan
        if all(y < level for y in loss[i:k + 1]):
            return tau, t[k]
    return math.nan, math.nan


def tau_2gen_drop(run: dict) -> dict:
    """tau_2Gen of one transformer run (Fig. 6c bottom) read from its trajectory ("t", "loss", "phi", "levels"):
    status "tau" with tau the sustained drop's time (sustained_drop at the halfway level) when max phi up to the
    window's end reached PHI_FORMED; "no head" when the loss dropped for good without it; "censored" when no drop
    held within the run, its last step ("bound", the cap) a lower bound on tau. "first_crossing": the first halfway
    crossing, the criterion this replaces (nan if none). "head": when the induction head formed, the same test on phi
    (its sustained rise through PHI_FORMED; None if none held within the run): at N = 32 (seed 0, CPU) the head formed
    at ~2400 steps, the loss falling 0.03 nats within 500 steps, then hovering at the halfway level for 4500 more.
    Every time is counted in steps on the chains (chain_steps: after a run's pretraining, if any)."""
    level, t = halfway(run["levels"]), chain_steps(run)
    tau, end = sustained_drop(t, run["loss"], level)
    head = sustained_drop(t, [-p for p in run["phi"]], -PHI_FORMED)[0]  # phi's rise is -phi's drop
    out = {"first_crossing": crossing(t, run["loss"], level), "steps": t[-1], "head": None if math.isnan(head) else head}
    if not all(math.isfinite(y) for y in run["loss"]):  # the loss went to NaN or infinity: no tau, no bound
        return {**out, "status": "diverged", "tau": None, "bound": None, "phi_max": math.nan}
    if math.isnan(tau):
        return {**out, "status": "censored", "tau": None, "bound": t[-1], "phi_max": max(run["phi"])}
    phi_max = max(phi for s, phi in zip(t, run["phi"]) if s <= end)
    return {**out, "status": "tau" if phi_max >= PHI_FORMED else "no head", "tau": tau, "bound": None, "phi_max": phi_max}


def chain_steps(run: dict) -> list:
    """The run's evaluation steps counted from its first step on the chains: t minus its "pretrain" steps on
    independent states (tau_settings.py's readout_first; none in the record), negative before the switch."""
    return [s - run.get("pretrain", 0) for s in run["t"]]


HEAD_FRACTION = 0.5  # the early rate: phi's slope over the evaluations before this fraction of the head's formation


def early_rate(run: dict) -> float:
    """phi_beta(2)'s growth per step on the plateau: the least-squares slope of phi against t over the evaluations
    before HEAD_FRACTION of the head's formation (all of them on the chains for a run whose head never formed)."""
    head = tau_2gen_drop(run)["head"]
    t, phi = np.asarray(chain_steps(run), float), np.asarray(run["phi"], float)
    keep = (t >= 0) & (t <= HEAD_FRACTION * head if head is not None else True)
    return float(np.polyfit(t[keep], phi[keep], 1)[0]) if keep.sum() >= 2 else math.nan


# ----------------------------------------------------------------------------- the model at the last position


PATHS = ("query", "key", "value", "skip")  # the uses of layer 1's output x1: layer 2's query (at the last position),
# its keys and values (every position), and the residual stream past layer 2 into MLP2 and the unembedding


def scaled_gradient(x: torch.Tensor, s: float) -> torch.Tensor:
    """x in the forward pass (exactly), s x its gradient in the backward pass: the paper's gradient reweighting
    (App. "Gradient Reweighting", s x + (1 - s) detach(x); transformer.py's prev_weight) with x's value untouched by
    rounding."""
    return x.detach() + s * (x - x.detach())


def last_position(params: dict, seqs: torch.Tensor, path: str | None = None, key_drive: float = 1.0,
                  final_norm: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits (B, C), A (B, N)): model(seqs)[:, -1] of the transformer without MLP1 and with position biases, and
    its layer-2 attention at the last position, from its parameters by name (dict(model.named_parameters()), or
    stacked ones under vmap). Layer 2's query, MLP2 and the unembedding run at the last position only:
    non-autoregressive training reads nothing else, and MLP2 on all N positions was half the cost. path (one of
    PATHS): the same numbers, with gradients into layer 1 through that use of x1 alone (the others detached); the
    four paths' gradients on a layer-1 parameter sum to its gradient (the chain rule over x1's uses). key_drive:
    the same numbers, with layer 1's position bias's gradient through layer 2's keys times key_drive (its other
    paths, and every other parameter's gradient, as they are). final_norm: a layer norm without gain between the
    residual stream and the unembedding (GPT-2's ln_f; the record's model has none), so that the logits' scale is
    the unembedding's alone (tau_settings.py's bounded_readout)."""
    B, N = seqs.shape
    x0 = F.embedding(seqs, params["W_E.weight"])  # (B, N, D)
    h = layer_norm(x0)
    q1, k1, v1 = (F.linear(h, params[f"att1.{W}.weight"]) for W in ("W_Q", "W_K", "W_V"))

    def layer1(P: torch.Tensor) -> torch.Tensor:  # x1, layer 1's output (no MLP1), with position bias P
        A1 = torch.softmax(attention_scores(q1[:, None], k1[:, None], P[:, :N]), -1)[:, 0]  # (B, N, N)
        return x0 + A1 @ v1

    x1 = layer1(params["att1.P"])
    h = layer_norm(x1)
    h_keys = h if key_drive == 1.0 else layer_norm(layer1(scaled_gradient(params["att1.P"], key_drive)))

    def use(name: str, x: torch.Tensor) -> torch.Tensor:  # x as that use of x1 sees it
        return x if path in (None, name) else x.detach()

    q = F.linear(use("query", h)[:, -1], params["att2.W_Q.weight"])  # (B, D): the last position's query
    k, v = F.linear(use("key", h_keys), params["att2.W_K.weight"]), F.linear(use("value", h), params["att2.W_V.weight"])
    scores = (k @ q.unsqueeze(-1)).squeeze(-1) / math.sqrt(q.shape[-1]) + params["att2.P"][0, :N].flip(0)  # + P[N-1-j]
    A2 = torch.softmax(scores, -1)  # (B, N)
    y2 = use("skip", x1)[:, -1] + (A2.unsqueeze(1) @ v).squeeze(1)  # (B, D)
    mlp2 = F.linear(F.gelu(F.linear(layer_norm(y2), params["mlp2.W_in.weight"])), params["mlp2.W_out.weight"])
    out = layer_norm(y2 + mlp2) if final_norm else y2 + mlp2
    return F.linear(out, params["W_U.weight"]), A2


def last_position_logits(model: Transformer, seqs: torch.Tensor) -> torch.Tensor:
    """model(seqs)[:, -1] (B, C) at the last position only (last_position)."""
    return last_position(dict(model.named_parameters()), seqs)[0]


def phi_beta_last(A2: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
    """phi_beta(2) at the last position (eq. iha at n = N): the layer-2 attention A2 (B, N) of the last position on
    the positions i >= 1 whose previous state s_{i-1} is its own state s_N, summed over i, averaged over the batch."""
    match = context[:, :-1] == context[:, -1:]  # (B, N - 1): entry i - 1 says s_{i-1} = s_N
    return (A2[:, 1:] * match).sum(-1).mean()


# ----------------------------------------------------------------------------- training

TRAINING = dict(lr=0.05, momentum=0.9, batch=128, eval_every=50)  # Fig. 6c bottom's SGD (why: train_one)


def model_for(N: int, seed: int, init: dict | None = None) -> Transformer:
    """The seed's model. init (a knock-out of tau_settings.py): {"scale": {name: factor}} multiplies those
    initial weights, {"zero": [name, ...]} sets them to zero, after the seed's draw (so the rest is the seed's)."""
    model = Transformer(C, 64, position="bias", mlp1=False, max_len=N)
    model.reset_parameters(torch.Generator().manual_seed(seed))
    if init:
        params = dict(model.named_parameters())
        with torch.no_grad():
            for name, factor in init.get("scale", {}).items():
                params[name].mul_(factor)
            for name in init.get("zero", ()):
                params[name].zero_()
    return model


def gradient_factors(params: dict, training: dict, N: int) -> dict:
    """{name: factor} multiplying the gradient of a parameter before each step (tau_settings.py's rungs):
    training["trainable"] {name: [index, ...]}: only those entries along the last axis train (a 0/1 mask; e.g.
    {"att1.P": [0, 1]}: layer 1's position bias learns at lags 0 and 1 only); training["drive"] {name: N0}: the
    gradient times N0 / N, a drive that falls as 1 / N and equals the record's at N = N0 (e.g. {"att1.P": 32}:
    layer 1's position bias pushed as the theory pushes delta, w_B F_1 / N, eq. parameter_dynamics_simplest)."""
    factors = {}
    for name, keep in training.get("trainable", {}).items():
        mask = torch.zeros_like(params[name])
        mask[..., list(keep)] = 1.0
        factors[name] = mask
    for name, N0 in training.get("drive", {}).items():
        factors[name] = factors.get(name, torch.ones_like(params[name])) * (N0 / N)
    return factors


def start(N: int, seed: int, iters: int, eval_batch: int, device, training: dict = TRAINING
          ) -> tuple[dict, torch.Tensor, torch.Tensor]:
    """(the run's record, the eval context and target on `device`): one eval set per N, from its own seed, so every
    seed and device is measured on the same sequences."""
    context, target = eval_set(eval_batch, N, balance=training.get("balance", False))
    run = {"N": N, "seed": seed, "cap": iters, "device": torch.device(device).type, **training, "eval_batch": eval_batch,
           "levels": predictor_levels(context, target), "t": [], "loss": [], "phi": []}
    return run, context.to(device), target.to(device)


def record(run: dict, t: int, logits, A2, context, target) -> bool:
    """Append an evaluation; True once the run is finished: its drop has held through its window, or it diverged."""
    run["t"].append(t)
    run["loss"].append(F.cross_entropy(logits, target).item())
    run["phi"].append(phi_beta_last(A2, context).item())
    return not math.isfinite(run["loss"][-1]) or not math.isnan(sustained_drop(chain_steps(run), run["loss"],
                                                                               halfway(run["levels"]))[0])


def train_one(N: int, seed: int, iters: int, eval_batch: int = 1024, training: dict = TRAINING,
              measure=None, checkpoint: str | None = None) -> dict:
    """One seed on the CPU: SGD with momentum on the last position's cross-entropy, evaluated every eval_every steps,
    run until its drop has held through its window, its loss is no longer finite, or for `iters` steps (the cap).
    training: the SGD settings (TRAINING, or another setting of tau_settings.py; "frozen": parameters left at their
    initial values; "trainable" and "drive": gradient_factors; "key_drive" N0: layer 1's position bias's gradient
    through layer 2's keys alone times N0 / N (last_position); "init": model_for's knock-out; "balance": True
    trains and evaluates on doubly stochastic chains (fresh_chains.balanced); "final_norm": True, a layer norm
    before the unembedding (last_position); "pretrain": S, the first S steps on independent states of the chains
    (fresh_chains.independent), evaluated on the chains as every step).
    measure(t, params), if given, is called at every evaluation, before that step's update. The record: the
    settings, the levels, and the trajectory t, loss (last position, all eval samples) and phi (phi_beta_last).
    checkpoint: a file written atomically at every evaluation (the model, the optimizer, the generator and the record
    so far) and resumed from if it exists, so a run of hours that is killed goes on from its last evaluation with
    the same numbers as a run never stopped; the caller removes it once the run is kept.

    The escape from the plateau is limited by gradient noise (one target per sequence): at N = 32,
    batch 128, momentum 0.9, lr 0.1 the plateau sits 0.02-0.03 above the best 1-point loss and the
    loss is still above the threshold after 4000 steps, while lr 0.05 reaches it at ~3750; batch 64
    at lr 0.05 had not left the plateau by 3500, and at N = 16 lr 0.3 drifts upwards."""
    g = torch.Generator().manual_seed(seed)
    run, eval_context, eval_target = start(N, seed, iters, eval_batch, "cpu", training)
    model = model_for(N, seed, training.get("init"))
    params = dict(model.named_parameters())
    frozen = set(training.get("frozen", ()))  # parameters kept at their initial values (tau_settings.py)
    factors = gradient_factors(params, training, N)  # e.g. entries outside a mask keep their start
    key_drive = training["key_drive"] / N if "key_drive" in training else 1.0
    final_norm = training.get("final_norm", False)
    opt = torch.optim.SGD([p for name, p in params.items() if name not in frozen], lr=training["lr"],
                          momentum=training["momentum"])
    first = 0
    if checkpoint is not None and os.path.exists(checkpoint):  # resume after the last evaluation it holds
        state = torch.load(checkpoint, weights_only=False)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        g.set_state(state["generator"])
        run, first = state["run"], state["run"]["t"][-1]
    for t in range(first, iters + 1):
        if (t % training["eval_every"] == 0 or t == iters) and not (t == first and run["t"]):
            if measure is not None:
                measure(t, params)
            with torch.no_grad():
                done = record(run, t, *last_position(params, eval_context, final_norm=final_norm), eval_context,
                              eval_target)
            if done:
                break
            if checkpoint is not None:
                save_atomic({"model": model.state_dict(), "optimizer": opt.state_dict(), "generator": g.get_state(),
                             "run": run}, checkpoint)
        if t == iters:
            break
        context, target = fresh_batch(training["batch"], N, g, balance=training.get("balance", False),
                                      iid=t < training.get("pretrain", 0))
        loss = F.cross_entropy(last_position(params, context, key_drive=key_drive, final_norm=final_norm)[0], target)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        for name, factor in factors.items():
            params[name].grad.mul_(factor)
        opt.step()
    return run


def train_seeds(N: int, seeds: list, iters: int, eval_batch: int = 1024, device="cpu") -> list[dict]:
    """train_one for every seed at once: the S models' parameters stacked on a leading axis and the forward vmapped
    over it, one SGD over the stacked tensors (elementwise, so each seed's update is its own), each seed's batches
    from its own generator on `device` (fastdata.fresh_batches, bit for bit fresh_batch's). A seed's record stops
    where train_one's would (its drop held through its window); the batch trains on until every seed has, or to the cap. On the CPU each seed equals
    train_one's to float rounding; on CUDA its generator's stream differs from the CPU's of the same seed."""
    generators = [torch.Generator(device).manual_seed(s) for s in seeds]
    runs, eval_context, eval_target = zip(*(start(N, s, iters, eval_batch, device) for s in seeds))
    eval_context, eval_target = eval_context[0], eval_target[0]
    models = [dict(model_for(N, s).named_parameters()) for s in seeds]
    params = {name: torch.stack([m[name].detach() for m in models]).to(device).requires_grad_() for name in models[0]}
    opt = torch.optim.SGD(params.values(), lr=TRAINING["lr"], momentum=TRAINING["momentum"])
    forward, evaluate = torch.func.vmap(last_position), torch.func.vmap(last_position, in_dims=(0, None))
    done = [False] * len(seeds)
    for t in range(iters + 1):
        if t % TRAINING["eval_every"] == 0 or t == iters:
            with torch.no_grad():
                logits, A2 = evaluate(params, eval_context)
                for i, run in enumerate(runs):
                    done[i] = done[i] or record(run, t, logits[i], A2[i], eval_context, eval_target)
            if all(done):
                break
        if t == iters:
            break
        seqs = fastdata.fresh_batches(TRAINING["batch"], N + 1, generators, C)
        context, target = seqs[..., :N], seqs[..., N]
        logits = forward(params, context)[0]  # (S, B, C)
        loss = F.cross_entropy(logits.flatten(0, 1), target.flatten(), reduction="none").view(len(seeds), -1).mean(1)
        opt.zero_grad(set_to_none=True)
        loss.sum().backward()  # seed i's parameters get the gradient of its own loss alone
        opt.step()
    return list(runs)


def rounded_run(run: dict) -> dict:
    """The run's record as stored in the JSON: the trajectory rounded (loss to 1e-5 nats, phi to 1e-4), enough to
    re-read the criterion, whose level gaps are 0.03 nats and more."""
    return {**run, "loss": [round(y, 5) for y in run["loss"]], "phi": [round(p, 4) for p in run["phi"]]}


# ----------------------------------------------------------------------------- the record of Fig. 6c bottom


def _train_one_job(args: tuple) -> dict:
    return train_one(*args)


def train_transformers(P: dict, jobs: int, device: str = "cpu", todo: list | None = None, done=None) -> dict:
    """Fig. 6c bottom: {N: [runs]} of the non-autoregressive transformer without MLP1 at the (N, seed) pairs of
    `todo` (default: every N of P with its seeds_transformer seeds). On CUDA an N's seeds train as one batched model
    (train_seeds), one N after the other; on the CPU every pair is a one-thread process (train_one), `jobs` at a time,
    smallest N first. done(N, runs), if given, is called as runs finish (on the CPU each run, on CUDA each N), so
    that a call cut short keeps what it finished: an N of the paper's protocol takes hours on two cores."""
    if todo is None:
        todo = [(N, s) for N in P["N_transformer"] for s in range(P["seeds_transformer"])]
    cap, eval_batch = P["transformer_iters"], P["transformer_eval_batch"]
    out, t0 = {}, time.time()

    def finished(N, runs):
        runs = [rounded_run(r) for r in runs]
        out.setdefault(N, []).extend(runs)
        print(f"transformer N = {N}, seeds {[r['seed'] for r in runs]}: {[tau_2gen_drop(r)['status'] for r in runs]}, "
              f"{[r['t'][-1] for r in runs]} steps ({time.time() - t0:.0f} s so far)", flush=True)
        if done is not None:
            done(N, runs)

    if device == "cpu":
        jobs_ = [(N, s, cap, eval_batch) for N, s in sorted(todo)]
        # a step's time on one VM core grows about as fast as N (30, 52, 110 and 330-465 ms at N = 32, 64, 128, 256 in
        # the paper-protocol runs, evaluations included): the ETA's weights, the steps a run takes unknown until it ends
        cli.parallel_map(_train_one_job, jobs_, jobs, progress=f"transformer runs ({len(jobs_)})",
                         cost=[N * (1 + N / 128) for N, *_ in jobs_], on_result=lambda job, run: finished(job[0], [run]))
    else:
        by_N = {}
        for N, s in todo:
            by_N.setdefault(N, []).append(s)
        for N, seeds in sorted(by_N.items()):
            finished(N, train_seeds(N, seeds, cap, eval_batch, device))
    return out


def merge_transformer_runs(result: dict, runs: dict):
    """Merge {N: [runs]} into result's "transformer_runs" {N: {seed: run}} and re-read the criterion from them all
    (transformer_summary)."""
    stored = result.setdefault("transformer_runs", {})
    for N, group in runs.items():
        stored.setdefault(str(N), {}).update({str(r["seed"]): r for r in group})
    result["transformer_runs"] = {N: dict(sorted(stored[N].items(), key=lambda kv: int(kv[0])))
                                  for N in sorted(stored, key=int)}
    result["transformer_tau"] = transformer_summary(result["transformer_runs"])


def read_record(figures: str) -> dict:
    """FIGURES/sa_scaling.json, Fig. 6's record that sa_scaling.py writes and the studies of why the transformer's tau
    is flat compare with: the SA-transformer's taus ("tau") and the transformer's runs ("transformer_runs"); one
    line on what is missing or broken."""
    return cli.read_json(os.path.join(figures, "sa_scaling.json"), ("tau", "transformer_runs"), "sa_scaling.py",
                         flag="the record")


def check_protocol(stored: dict, P: dict):
    """A ValueError (exit 2, before training) unless every run of the record's transformer runs {N: {seed: run}} has
    P's protocol: what its numbers depend on besides N and seed (the step cap, the eval set's size, TRAINING). One fit
    over N must not mix two protocols."""
    want = json.dumps({"cap": P["transformer_iters"], "eval_batch": P["transformer_eval_batch"], **TRAINING})
    other = {json.dumps({k: run.get(k) for k in json.loads(want)}) for runs in stored.values() for run in runs.values()}
    if other - {want}:
        raise ValueError(f"sa_scaling.json holds transformer runs of another protocol ({', '.join(sorted(other - {want}))}; "
                         f"this preset's: {want}): name their --preset, or --figures DIR for a record of these")


def add_transformer_runs(result: dict, P: dict, jobs: int, device: str = "cpu", write=None):
    """Train the transformer at the (N, seed) of P that result (sa_scaling.json as loaded) holds no trajectory of
    and merge them in; write(result), if given, as runs finish (train_transformers' done). The record's runs must be
    of P's protocol (check_protocol); the rest of the record stays as it is."""
    stored = result.get("transformer_runs", {})
    check_protocol(stored, P)
    todo = [(N, s) for N in P["N_transformer"] for s in range(P["seeds_transformer"]) if str(s) not in stored.get(str(N), {})]
    print(f"transformer runs (N, seed) = {todo} (at most {P['transformer_iters']} steps, {device}); "
          f"{sum(map(len, stored.values()))} in the record", flush=True)

    def done(N, runs):
        merge_transformer_runs(result, {N: runs})
        if write is not None:
            write(result)

    if todo:
        train_transformers(P, jobs, device, todo, done)


def transformer_summary(stored: dict) -> dict:
    """Fig. 6c bottom re-read from the stored trajectories {N: {seed: run}}: per N, each seed's tau_2gen_drop (status,
    tau or None, the censoring bound, max phi, the head's formation, the first halfway crossing, the steps run), and
    the fits of the sustained-drop tau (fit_tau_censored: medians over seeds, a run without a confirmed drop counted as
    longer than its run) and, beside it, of the head's formation and of the first crossing."""
    per_N = {N: [tau_2gen_drop(r) for r in runs.values()] for N, runs in stored.items()}
    out = {"N": {N: {key: [r[key] for r in rows] for key in rows[0]} | {"seeds": [int(s) for s in stored[N]]}
                 for N, rows in per_N.items()}}
    out["fit"] = fit_tau_censored({N: [r["tau"] if r["status"] == "tau" else None for r in rows]
                                   for N, rows in per_N.items()})
    out["fit_head"] = fit_tau_censored({N: [r["head"] for r in rows] for N, rows in per_N.items()})
    out["fit_first_crossing"] = fit_tau_censored({N: [None if math.isnan(r["first_crossing"]) else r["first_crossing"]
                                                      for r in rows] for N, rows in per_N.items()})
    return out
