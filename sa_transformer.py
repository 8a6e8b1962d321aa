"""SA-transformer experiments: training, the scaling of tau_2Gen, and the figures (Sec. "The
transition from G1 to G2"; Appendix "Minimal Network for Generalization in the Limit K -> inf",
"Dynamics of the SA-transformer", "Testing predictions"; Figs. 5b-c, 6, A4 (parameters over
training), A7 (near-origin landscapes with the (beta, delta) trajectories) and the w_A..w_D figure).

The model is in analysis/sa_model.py, the theory (F_d, F_1, I, early rates, landscape) in analysis/sa_theory.py, the
fits and figures in analysis/sa_analysis.py. Here:
SGD on fresh chains (K = infinity) at the last position, tau_2Gen as the halfway crossing of the
loss between the 1-Gen plateau and 2-Gen, the control and bias-ablation series of tau_2Gen(N) fitted
against N / log N, and the runs of the non-autoregressive transformer without MLP1 (Fig. 6c bottom; its data,
training and criterion in analysis/transformer_tau.py).

    python sa_transformer.py                 # quick preset (CPU: ~10 min on 2 cores; --transformer: ~2.5 h more, in a
                                             # --figures DIR of its own: the committed record's runs are the paper's)
    python sa_transformer.py --transformer-only --preset paper   # only the transformer's (N, seed) missing from
                                             # figures/sa_scaling.json (CPU: N = 32-128 in 80 min on 2 cores)
    python sa_transformer.py --transformer-only --preset paper --device cuda   # 8 seeds of an N as one batched model
    python sa_transformer.py --preset paper  # the paper's sizes and seeds
    python sa_transformer.py --replot        # only redraw the five figures from figures/sa_scaling.json

figures/sa_scaling.json holds every number the figures draw: the fits, the landscapes and the
trajectories of the dynamics runs ("runs": t, masked loss, beta, delta, w; the first control run's
parameter snapshots) and of the transformer runs ("transformer_runs": t, loss, phi; "transformer_tau" re-reads
them).
"""
import contextlib
import json
import math
import os
import time
from dataclasses import asdict, dataclass

import numpy as np
import torch

from analysis.sa_analysis import (EXPONENT_WINDOWS, fit_rate, fit_tau, fit_tau_censored, plot_dynamics, plot_parameters,
                                  plot_scaling, plot_theory, plot_trajectories, seed_exponents, seed_mean,
                                  summarize_exponents)
from analysis.sa_model import SATransformer, target_loss
from analysis.sa_theory import F1_exact, F_d, I_coefficient, landscape, predicted_rates, w_driven
from analysis.transformer_tau import (TRAINING, crossing, fresh_batch, predictor_levels, rounded_run, tau_2gen_drop,
                                      train_one, train_seeds)
from markov import check_int
from plumbing import cli

# ----------------------------------------------------------------------------- training


def iters_cap(N: int) -> int:
    """Iteration budget: a few times the tau measured at N = 64 (~1800), scaled as N / log N."""
    return int(5000 * (N / math.log(N)) / (64 / math.log(64)))


@dataclass
class Run:
    N: int = 64
    seed: int = 0
    reduced: bool = False
    ablate: bool = False
    iters: int = 4000
    batch: int = 256
    lr: float = 1.0
    eval_every: int = 25
    eval_batch: int = 2048
    freeze_weights: tuple | None = None  # hold (w_A..w_D) fixed (reduced model during the plateau)
    snapshots: tuple = ()  # iterations at which to store P1, P2, M2
    stop_after: float = 0.0  # if > 0, stop at stop_after x tau once the loss has crossed (saves time)
    readout: str = "mixture"  # "softmax", "softmax_scalar": the hybrids of tau_settings.py's ladder (SATransformer)


def train_sa(run: Run, measure=None) -> dict:
    """SGD (lr 1, batch 256) on fresh chains; the trajectory of losses and parameters. measure(t, model), if given,
    is called at every evaluation, before that step's update.

    tau_2Gen: the first time the masked eval loss falls halfway from the model's 1-Gen plateau
    (the raw frequencies its experts compute at beta = delta = 0) to the Bayes 2-Gen loss."""
    g = torch.Generator().manual_seed(run.seed)
    eval_context, eval_target = fresh_batch(run.eval_batch, run.N, torch.Generator().manual_seed(10**6 + run.N), run.ablate)
    levels = predictor_levels(eval_context, eval_target)
    threshold = 0.5 * (levels["masked_loss_frequencies"] + levels["masked_loss_2gen"])
    model = SATransformer(run.N, run.reduced, run.readout)
    if run.freeze_weights is not None:
        model.fixed_weights = torch.tensor(run.freeze_weights, dtype=torch.float32)
        model.logits.requires_grad_(False)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=run.lr)
    traj = {k: [] for k in ("t", "loss", "masked_loss", "beta", "delta", "w")}
    traj["snapshots"] = {}
    for t in range(run.iters + 1):
        if t % run.eval_every == 0 or t == run.iters:
            if measure is not None:
                measure(t, model)
            with torch.no_grad():
                raw, present = target_loss(model(eval_context), eval_target)
            beta, delta = model.beta_delta()
            for key, value in (("t", t), ("loss", raw.mean().item()), ("masked_loss", raw[present].mean().item()),
                               ("beta", beta), ("delta", delta), ("w", model.weights().tolist())):
                traj[key].append(value)
            if t in run.snapshots and not run.reduced:
                traj["snapshots"][t] = {k: v.detach().tolist() for k, v in zip(("M1", "P1", "M2", "P2"), model.attention_parameters())}
            tau = crossing(traj["t"], traj["masked_loss"], threshold)
            if run.stop_after > 0 and t >= run.stop_after * tau:  # nan compares False
                break
        if t == run.iters:
            break
        context, target = fresh_batch(run.batch, run.N, g, run.ablate)
        raw, _ = target_loss(model(context), target)
        opt.zero_grad(set_to_none=True)
        raw.mean().backward()
        opt.step()
    return {"run": asdict(run), "levels": levels, "tau": crossing(traj["t"], traj["masked_loss"], threshold), **traj}


# ----------------------------------------------------------------------------- experiments


PRESETS = {
    # N_tau: lengths for tau_2Gen(N), control and bias ablation; N_dyn: length of the dynamics runs
    # (seeds_dyn for the full model, seeds_reduced for the reduced and frozen-weight ones); the
    # transformer runs (Fig. 6c bottom) run in the quick preset only with --transformer, each to its drop's
    # window's end (transformer_tau.tau_2gen_drop) or its step cap transformer_iters. The paper's cap, 20000: the
    # first halfway crossings of the quick runs at N = 32..256 were 2600-4100 steps at these SGD settings and N-flat,
    # the window ends at 1.25 tau, so 20000 leaves ~4x for the slowest of 8 seeds.
    "quick": dict(N_tau=[32, 64, 128, 256], seeds_tau=2, N_dyn=64, seeds_dyn=3, seeds_reduced=2, transformer=False,
                  N_transformer=[24, 32, 48, 64, 128, 256], seeds_transformer=2, transformer_iters=6000,
                  transformer_eval_batch=1024, eval_batch=1024, landscape_batch=4096, mc_chains=200_000, stop_after=1.2),
    "paper": dict(N_tau=[32, 64, 128, 256, 512, 1024], seeds_tau=8, N_dyn=128, seeds_dyn=5, seeds_reduced=5, transformer=True,
                  N_transformer=[32, 64, 128, 256], seeds_transformer=8, transformer_iters=20_000,
                  transformer_eval_batch=2048, eval_batch=4096, landscape_batch=16384, mc_chains=1_000_000, stop_after=2.0),
}


def theory(P: dict) -> dict:
    """F_d, F_1 and I by Monte Carlo (eqs. sa_cdelta, sa_cbeta)."""
    Fd = F_d(20, P["mc_chains"])
    I = I_coefficient(P["mc_chains"])
    print(f"F_1: Monte Carlo {Fd[0]:.5f}, exact {F1_exact():.5f}; I = {I:.5f}", flush=True)
    return {"F1_mc": Fd[0], "F1_exact": F1_exact(), "F_d": Fd, "I": I}


def train_sa_series(P: dict, jobs: int) -> tuple[dict, dict]:
    """All SA-transformer runs in one pool: the four dynamics settings (full / reduced x control /
    ablation) at N_dyn, and tau_2Gen(N) of the full model, control and ablation, at the other N_tau.
    Returns (dyn {(reduced, ablate): runs}, tau_runs {ablate: {N: runs}})."""
    N_dyn, stop = P["N_dyn"], P["stop_after"]
    snaps = tuple(int(f * iters_cap(N_dyn) / 5) for f in (0, 0.5, 1, 1.5, 2, 3))
    settings = {(reduced, ablate): [Run(N=N_dyn, seed=s, reduced=reduced, ablate=ablate, iters=iters_cap(N_dyn) * (2 if ablate else 1),
                                        eval_batch=P["eval_batch"], snapshots=snaps if not reduced else (), stop_after=stop)
                                    for s in range(P["seeds_reduced"] if reduced else P["seeds_dyn"])]
                for reduced in (False, True) for ablate in (False, True)}
    tau_runs = [Run(N=N, seed=s, ablate=ablate, iters=iters_cap(N) * (2 if ablate else 1), eval_batch=P["eval_batch"],
                    eval_every=max(25, N // 4), stop_after=stop)
                for ablate in (False, True) for N in P["N_tau"] if N != N_dyn for s in range(P["seeds_tau"])]
    all_runs = sorted(tau_runs, key=lambda r: -r.N) + [r for runs in settings.values() for r in runs]  # longest first
    t0 = time.time()
    done = dict(zip([id(r) for r in all_runs], cli.parallel_map(train_sa, all_runs, jobs)))
    print(f"{len(all_runs)} SA-transformer runs done in {time.time() - t0:.0f} s", flush=True)
    dyn = {k: [done[id(r)] for r in runs] for k, runs in settings.items()}
    by_N = {ablate: {N_dyn: dyn[(False, ablate)][: P["seeds_tau"]]} for ablate in (False, True)}
    for r in tau_runs:
        by_N[r.ablate].setdefault(r.N, []).append(done[id(r)])
    return dyn, {ablate: dict(sorted(runs.items())) for ablate, runs in by_N.items()}


def plateau_weights(control: list, N_dyn: int) -> tuple[tuple, float]:
    """(w_plateau, tau_control): the full control model's mixture weights w_A..w_D at t = tau / 2 (the evaluation
    at or after it), averaged over its seeds, tau its seeds' mean tau (half the step cap if none crossed)."""
    taus = [r["tau"] for r in control if np.isfinite(r["tau"])]
    tau_control = float(np.mean(taus)) if taus else iters_cap(N_dyn) / 2.0
    w_plateau = tuple(np.mean([r["w"][int(np.searchsorted(r["t"], 0.5 * tau_control))] for r in control], 0).tolist())
    return w_plateau, tau_control


def train_frozen(P: dict, control: list, jobs: int) -> tuple[dict, tuple, float]:
    """The reduced model with w_A..w_D held at the full control model's values at t = tau / 2 (plateau_weights),
    over the plateau only. Returns ({ablate: runs}, w_plateau, the control's mean tau)."""
    w_plateau, tau_control = plateau_weights(control, P["N_dyn"])
    runs = [Run(N=P["N_dyn"], seed=s, reduced=True, ablate=ablate, iters=int(0.75 * tau_control),
                eval_batch=P["eval_batch"], freeze_weights=w_plateau) for ablate in (False, True) for s in range(P["seeds_reduced"])]
    out = cli.parallel_map(train_sa, runs, jobs)
    n = P["seeds_reduced"]
    return {False: out[:n], True: out[n:]}, w_plateau, tau_control


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


def check_protocol(stored: dict, P: dict):
    """A ValueError (exit 2, before training) unless every run of the record's transformer runs {N: {seed: run}} has
    P's protocol: what its numbers depend on besides N and seed (the step cap, the eval set's size, TRAINING). One fit
    over N must not mix two protocols."""
    want = json.dumps({"cap": P["transformer_iters"], "eval_batch": P["transformer_eval_batch"], **TRAINING})
    other = {json.dumps({k: run.get(k) for k in json.loads(want)}) for runs in stored.values() for run in runs.values()}
    if other - {want}:
        raise ValueError(f"sa_scaling.json holds transformer runs of another protocol ({', '.join(sorted(other - {want}))}; "
                         f"this preset's: {want}): name their --preset, or --figures DIR for a record of these")


def previous_transformer_runs(path: str) -> dict:
    """The transformer runs {N: {seed: run}} of the record at path; none if there is no readable record."""
    try:
        with open(path) as f:
            return json.load(f).get("transformer_runs", {})
    except (OSError, ValueError, AttributeError):
        return {}


def add_transformer_runs(result: dict, P: dict, jobs: int, device: str = "cpu", write=None):
    """Train the transformer at the (N, seed) of P that result (sa_scaling.json as loaded) holds no trajectory of
    and merge them in; write(result), if given, as runs finish (train_transformers' done). The record's runs must be
    of P's protocol (check_protocol). The earlier record's runs that kept only tau (no trajectory:
    "tau_transformer") are not runs here, and stay as they are."""
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


def dynamics_summary(dyn: dict, frozen: dict, w_plateau: tuple, tau_control: float, I: float, N_dyn: int) -> dict:
    """Exponents of beta(t), delta(t) over windows of the plateau (fractions of tau), the measured
    early rates against eq. (parameter_dynamics_simplest), and the mixture weights."""
    exponents = {f"{'reduced' if red else 'full'}_{'ablation' if abl else 'control'}":
                 summarize_exponents(runs, EXPONENT_WINDOWS) for (red, abl), runs in dyn.items()}
    exponents.update({f"frozen_{'ablation' if abl else 'control'}": summarize_exponents(runs, EXPONENT_WINDOWS, tau_control)
                      for abl, runs in frozen.items()})  # on the full control model's clock
    default = f"{EXPONENT_WINDOWS[0][0]:g}-{EXPONENT_WINDOWS[0][1]:g}"
    out = {"exponents": exponents, "exponent_window": f"t in [{EXPONENT_WINDOWS[0][0]}, {EXPONENT_WINDOWS[0][1]}] x mean tau"}
    for setting in ("control", "ablation"):
        for key in ("beta", "delta"):
            out[f"{key}_exponent_{setting}"] = exponents[f"full_{setting}"][key][default]
    control = dyn[(False, False)]
    lo, hi = 0.05 * exponents["full_control"]["tau_mean"], 0.5 * exponents["full_control"]["tau_mean"]
    measured = {name: {key: fit_rate(*seed_mean(runs, key), lo, hi) for key in ("beta", "delta")}
                for name, runs in (("full", control), ("frozen", frozen[False]))}
    out["rates"] = {"predicted": {"paper (w_B = w_C = 1/3)": predicted_rates(N_dyn, I),
                                  "at w_plateau": predicted_rates(N_dyn, I, w_plateau[1], w_plateau[2])},
                    "measured": measured, "window": [lo, hi], "w_plateau": w_plateau}
    out["tau_dynamics"] = {"control": [r["tau"] for r in control], "ablation": [r["tau"] for r in dyn[(False, True)]]}
    out["w_final"] = np.mean([r["w"][-1] for r in control], 0).tolist()
    out["w_early"] = np.mean([r["w"][int(np.searchsorted(r["t"], 0.1 * tau_control))] for r in control], 0).tolist()
    return out


def scaling_summary(tau_runs: dict) -> dict:
    """tau_2Gen(N) of the SA-transformer (control, ablation) with their fits against N / log N, and the final losses
    at the largest N. "tau_transformer" (fitted alike) holds the first crossings of earlier records' transformer runs,
    which kept no trajectory; a new record's transformer runs are in "transformer_runs" (merge_transformer_runs)."""
    out = {"tau": {str(N): [r["tau"] for r in runs] for N, runs in tau_runs[False].items()},
           "tau_ablation": {str(N): [r["tau"] for r in runs] for N, runs in tau_runs[True].items()},
           "tau_transformer": {}}
    out["tau_fits"] = {key: fit_tau(out[key]) for key in ("tau", "tau_ablation", "tau_transformer")}
    largest = tau_runs[False][max(tau_runs[False])]
    for key, level in (("final_loss", None), ("loss_2gen", "masked_loss_2gen"), ("loss_1gen", "masked_loss_1gen")):
        out[key] = float(np.mean([r["masked_loss"][-1] if level is None else r["levels"][level] for r in largest]))
    return out


def landscapes(P: dict) -> dict:
    """The reduced model's loss over (beta, delta) with w optimized: at the largest N (Fig. 6a) and
    near the origin at N_dyn, for the original and the bias-ablated data (Fig. A7)."""
    N_land, N_dyn = max(P["N_tau"]), P["N_dyn"]
    context, target = fresh_batch(P["landscape_batch"] // 2, N_land, torch.Generator().manual_seed(123))
    betas, deltas = np.linspace(0, 8, 17), np.linspace(0, 10, 11)
    out = {"landscape": {"N": N_land, "beta": betas.tolist(), "delta": deltas.tolist(),
                         "loss": landscape(context, target, betas, deltas).tolist()}}
    near = np.linspace(-1, 1, 9)
    out["landscape_origin"] = {"N": N_dyn, "beta": near.tolist(), "delta": near.tolist()}
    for setting, ablate in (("control", False), ("ablation", True)):
        context, target = fresh_batch(P["landscape_batch"], N_dyn, torch.Generator().manual_seed(123), ablate=ablate)
        out["landscape_origin"][setting] = landscape(context, target, near, near).tolist()
    return out


SETTINGS = {"full_control": (False, False), "full_ablation": (False, True), "reduced_control": (True, False),
            "reduced_ablation": (True, True)}  # the dynamics runs' names in sa_scaling.json: (reduced, ablate)
TRAJECTORY = ("t", "masked_loss", "beta", "delta", "w", "levels", "tau", "run")  # what the figures read of a run


def significant(value, digits: int = 6):
    """value with every float rounded to `digits` significant digits (the JSON's trajectories)."""
    if isinstance(value, dict):
        return {k: significant(v, digits) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [significant(v, digits) for v in value]
    return float(f"{value:.{digits}g}") if isinstance(value, float) else value


def run_records(dyn: dict, frozen: dict) -> dict:
    """sa_scaling.json's "runs": {setting: [trajectory of each seed]}, the dynamics runs and the frozen-w
    ones; the first control run keeps its parameter snapshots (Fig. 5c, A4)."""
    named = {name: dyn[key] for name, key in SETTINGS.items()}
    named.update({f"frozen_{'ablation' if ablate else 'control'}": runs for ablate, runs in frozen.items()})
    records = {name: [significant({k: r[k] for k in TRAJECTORY}) for r in runs] for name, runs in named.items()}
    records["full_control"][0]["snapshots"] = significant(dyn[(False, False)][0]["snapshots"])
    return records


W_THIRD = dict(N=(64, 128), seeds=5, w=(0.0, 1 / 3, 1 / 3, 1 / 3))  # the theory's 1-Gen weights, held fixed


def train_w_third(result: dict, jobs: int) -> dict:
    """Fig. 6b's exponents with w's drift removed: the full model (eq. base_model) with w_A..w_D held at the
    theory's (0, 1/3, 1/3, 1/3), control and ablation, W_THIRD's N and seeds, each run to 0.75 x the full model's
    mean tau at its N and setting (the record's), its exponents fitted on that tau's clock over EXPONENT_WINDOWS.
    {"runs": {N: {setting: [trajectories]}}, "exponents": {N: {setting: summarize_exponents}}}."""
    taus = {(N, ablate): float(np.mean(result["tau_ablation" if ablate else "tau"][str(N)]))
            for N in W_THIRD["N"] for ablate in (False, True)}
    runs = [Run(N=N, seed=s, ablate=ablate, iters=int(0.75 * taus[N, ablate]), freeze_weights=W_THIRD["w"],
                eval_batch=PRESETS["quick"]["eval_batch"])
            for N in W_THIRD["N"] for ablate in (False, True) for s in range(W_THIRD["seeds"])]
    done = cli.parallel_map(train_sa, runs, jobs, progress="runs with w held at (0, 1/3, 1/3, 1/3)",
                            cost=[r.iters for r in runs])
    out = {"runs": {}, "exponents": {}}
    for N in W_THIRD["N"]:
        for ablate, setting in ((False, "control"), (True, "ablation")):
            group = [d for r, d in zip(runs, done) if r.N == N and r.ablate == ablate]
            out["runs"].setdefault(str(N), {})[setting] = [significant({k: r[k] for k in TRAJECTORY}) for r in group]
            out["exponents"].setdefault(str(N), {})[setting] = summarize_exponents(group, EXPONENT_WINDOWS,
                                                                                   taus[N, ablate])
    return out


def write_figures(result: dict, out: str):
    """The five SA figures from `result` (sa_scaling.json's content, its trajectories under "runs")."""
    runs = result["runs"]
    dyn = {key: runs[name] for name, key in SETTINGS.items()}
    frozen = {ablate: runs[f"frozen_{'ablation' if ablate else 'control'}"] for ablate in (False, True)}
    plot_dynamics(dyn, os.path.join(out, "sa_dynamics.png"))
    plot_parameters(dyn[(False, False)][0], os.path.join(out, "sa_parameters.png"))
    plot_theory(result, os.path.join(out, "sa_theory.png"))
    plot_trajectories(result["landscape_origin"],
                      {setting: {"full model": dyn[(False, ablate)], "reduced model": dyn[(True, ablate)]}
                       for setting, ablate in (("control", False), ("ablation", True))},
                      os.path.join(out, "sa_trajectories.png"))
    plot_scaling(dyn, frozen, result, os.path.join(out, "sa_scaling.png"))


REPLOTTED = ("F_d", "F1_exact", "landscape", "landscape_origin", "tau", "tau_ablation", "tau_transformer", "tau_fits",
             "runs")  # what write_figures reads


def same_numbers(a, b, rel: float = 1e-9) -> bool:
    """Nested dicts and lists equal, floats to `rel` (NaN equal to NaN). A refit on another machine moves the last
    digits (BLAS in polyfit, ~1e-13), which is no reason to rewrite a committed record."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same_numbers(a[k], b[k], rel) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(same_numbers(x, y, rel) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, (int, float)):
        return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=rel)
    return a == b


def settle(new, old, rel: float = 1e-9):
    """new, with every part that differs from old's by float noise alone taken from old: a record rewritten for a new
    number keeps the last digits of the others."""
    if same_numbers(new, old, rel):
        return old
    if isinstance(new, dict) and isinstance(old, dict):
        return {k: settle(v, old[k], rel) if k in old else v for k, v in new.items()}
    if isinstance(new, list) and isinstance(old, list) and len(new) == len(old):
        return [settle(x, y, rel) for x, y in zip(new, old)]
    return new


def write_record(result: dict, path: str):
    """The JSON written whole or not at all (a temporary file renamed over it): a call cut short leaves the last
    complete record."""
    with open(path + ".tmp", "w") as f:
        json.dump(result, f, indent=1)
    os.replace(path + ".tmp", path)


def replot(path: str, train: tuple | None = None, w_third: int | None = None):
    """--replot [JSON]: the five figures from the JSON at path (FIGURES/sa_scaling.json), beside it, tau_2Gen refitted
    and the transformer's criterion re-read from its stored trajectories (cheap; a record without them keeps its first
    crossings); train: (preset, jobs, device) for --transformer-only, whose missing (N, seed) transformer runs are
    trained and merged in first, the JSON written as they finish; w_third: the number of processes for
    train_w_third's runs. The JSON is rewritten only when a number in it changed beyond float noise, and then with the
    others' last digits as they were (settle), so a pure redraw leaves a clone's record as it was."""
    figures = os.path.dirname(path)
    result = cli.read_json(path, REPLOTTED, "sa_transformer.py")
    before = json.loads(json.dumps(result))
    with cli.drawing(path, "sa_transformer.py") if train is None and w_third is None else contextlib.nullcontext():
        result = refit(result, before, path, train, w_third)
    if result == before:
        print(f"wrote {figures}/sa_*.png from {path} (tau refitted: the same numbers, the JSON left as it was)")
        return
    write_record(result, path)
    print(f"wrote {figures}/sa_*.png and {path} (tau refitted, new numbers)")


def refit(result: dict, before: dict, path: str, train: tuple | None, w_third: int | None) -> dict:
    """replot's work: the record's fits redone (and its runs trained first, with train or w_third), the figures drawn
    beside path; returns the record to keep (settle: float noise left as it was)."""
    if train is not None:
        add_transformer_runs(result, *train, write=lambda r: write_record(r, path))
    if "transformer_runs" in result:
        result["transformer_tau"] = transformer_summary(result["transformer_runs"])
    result["tau_fits"] = {key: fit_tau(result[key]) for key in ("tau", "tau_ablation", "tau_transformer")}
    if "runs" in result and "exponents" in result:  # each seed's exponents in the stated window, beside their mean's
        result["exponents_seeds"] = seed_exponents(result["runs"], result["exponents"])
        result["exponents_w_driven"] = {  # eq. (parameter_dynamics_simplest) along each run's own w(t)
            name: summarize_exponents([{**r, **w_driven(r, result["I"]), "tau": r["tau"]} for r in result["runs"][name]],
                                      EXPONENT_WINDOWS, result["exponents"][name]["tau_mean"])
            for name in ("full_control", "full_ablation")}
    if w_third is not None:
        result["w_third"] = train_w_third(result, w_third)
    result = settle(result, before)
    write_figures(result, os.path.dirname(path))
    return result


def main():
    parser = cli.ArgumentParser(description="SA-transformer: dynamics, theory and tau_2Gen scaling (Figs. 5, 6, A4, A7); "
                                            "runs on the CPU, as one-thread processes.", runs=(
        "Default run: 9 min 54 s on the 2-core development VM as two processes (2026-11-26) (quick preset: tau_2Gen at "
        "N = 32, 64, 128, 256, dynamics at N = 64, the theory's landscapes; --transformer ~2.5 h more); writes "
        "figures/sa_dynamics.png, figures/sa_parameters.png, figures/sa_theory.png, figures/sa_trajectories.png, "
        "figures/sa_scaling.png and figures/sa_scaling.json.\n--replot: seconds, trains nothing."))
    cli.add_preset(parser, PRESETS, "quick: tau at N = 32..256, dynamics at N = 64, no transformer; paper: N = 32..1024, "
                                    "dynamics at N = 128, the transformer")
    parser.add_argument("--N", type=int, default=None, help="sequence length of the dynamics runs (default: quick 64, paper 128)")
    parser.add_argument("--transformer", action="store_true", help="quick preset: also time the transformer (Fig. 6c bottom)")
    cli.add_device(parser)
    cli.add_jobs(parser)
    cli.add_threads(parser)
    cli.add_figures(parser)
    cli.add_replot(parser, "FIGURES/sa_scaling.json", "the five figures (sa_*.png)")
    parser.add_argument("--transformer-only", action="store_true",
                        help="only the transformer runs (Fig. 6c bottom) at the preset's (N, seed) whose trajectory "
                             "FIGURES/sa_scaling.json does not hold yet, merged into it as they finish; then --replot. "
                             "On CUDA the seeds of an N train as one batched model")
    parser.add_argument("--w-third", action="store_true",
                        help="only the full model with w held at (0, 1/3, 1/3, 1/3) (W_THIRD: N = 64, 128, 5 seeds, "
                             "control and ablation; CPU ~20 min on one core), into FIGURES/sa_scaling.json; then --replot")
    args = parser.parse_args()
    device = cli.device(args.device)
    if args.replot is not None or args.transformer_only or args.w_third:
        cli.writable_dir(args.figures, "--figures")
        train = (PRESETS[cli.preset(args.preset)], check_int("--jobs", args.jobs, 1), device) if args.transformer_only else None
        replot(cli.replot_path(args, "sa_scaling.json"), train, check_int("--jobs", args.jobs, 1) if args.w_third else None)
        return
    preset = cli.preset(args.preset)
    cli.set_threads(args.threads)
    P = dict(PRESETS[preset], transformer=PRESETS[preset]["transformer"] or args.transformer)
    if args.N is not None:
        P["N_dyn"] = check_int("N", args.N, 2)
    jobs = check_int("--jobs", args.jobs, 1)
    # the record's transformer runs (hours of training) stay in the record this call rewrites; runs of another protocol
    # must not go into one fit with them
    kept = previous_transformer_runs(os.path.join(args.figures, "sa_scaling.json"))
    if P["transformer"]:
        check_protocol(kept, P)
    cli.writable_dir(args.figures, "--figures")
    cli.announce(preset, f"tau_2Gen at N = {P['N_tau']}, dynamics at N = {P['N_dyn']}, {jobs} processes",
                 f"{args.figures}/sa_*.png and sa_scaling.json")
    t0 = time.time()
    result = {"preset": preset, **theory(P)}
    dyn, tau_runs = train_sa_series(P, jobs)
    frozen, w_plateau, tau_control = train_frozen(P, dyn[(False, False)], jobs)
    result.update(dynamics_summary(dyn, frozen, w_plateau, tau_control, result["I"], P["N_dyn"]))
    result.update(scaling_summary(tau_runs))
    if kept:
        result["transformer_runs"] = kept
    if P["transformer"]:
        merge_transformer_runs(result, train_transformers(P, jobs, device))
    elif kept:
        result["transformer_tau"] = transformer_summary(kept)
    result.update(landscapes(P))
    result["runs"] = run_records(dyn, frozen)
    result["seconds"] = round(time.time() - t0, 1)
    write_record(result, os.path.join(args.figures, "sa_scaling.json"))
    write_figures(json.loads(json.dumps(result)), args.figures)  # from the JSON, as --replot draws them
    print(json.dumps({k: result[k] for k in ("tau", "tau_ablation", "tau_transformer", "tau_fits", "beta_exponent_control",
                                             "delta_exponent_control", "beta_exponent_ablation", "delta_exponent_ablation",
                                             "final_loss", "loss_2gen", "w_early", "w_final", "rates", "seconds")}
                      | {"transformer_fit": result.get("transformer_tau", {}).get("fit")}, indent=1))
    print(f"wrote {args.figures}/sa_*.png and sa_scaling.json in {result['seconds'] / 60:.1f} min")

if __name__ == "__main__":
    cli.run(main)
