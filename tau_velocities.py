"""How fast the theory's coordinates move on the plateau, in the transformer and in the SA-transformer (Fig. 6c
bottom, why the transformer's tau_2Gen(N) is flat; Appendix "Dynamics of the SA-transformer", eqs. c_delta and
sa_cbeta; the transformer's readouts, eqs. pta and iha): each coordinate's velocity against N, to find the one that
carries the flatness.

The theory is written in beta (layer 2's induction score), delta (layer 1's bias on the previous position) and the
readouts phi_beta(2), phi_delta(1); its rates, at w_B = w_C = 1/3: d beta / dt ~ H_N / N, d delta / dt ~ F_1 / N,
and phi_beta(2)'s early growth ~ (H_N / N)^2 (RESULTS.md derives the square). The record's runs of Fig. 6c bottom and
the SA-transformer's are rerun to half their escape, and at a few stages of the plateau each coordinate's velocity
under gradient flow, dq/dt = -<grad q, grad L> per unit of learning rate, is measured on one large fixed batch per N.
A velocity that is N-flat where the theory's falls with N names the quantity that carries the flatness.

    python tau_velocities.py                # MEASURE's runs (CPU: ~1 h as one process), then
                                            # figures/tau_velocities.png and .json
    python tau_velocities.py --frozen W_U.weight --models transformer --N 32,64,128   # the transformer's runs with
                                            # W_U held at its start (tau_settings.py's frozenWU): where the push went
    python tau_velocities.py --replot       # only redraw from figures/tau_velocities.json

Each run is kept as ROOT/measure_<model>_N<N>_s<seed>.json (a killed measurement resumes from them).
"""
import json
import math
import os

import matplotlib.pyplot as plt
import numpy as np
import torch
import torch.nn.functional as F

from analysis.estimators import median_ci
from analysis.fresh_chains import fresh_batch
from analysis.transformer_paths import PARAMETER_GROUPS, delta_paths, key_push, key_swaps, velocities
from analysis.transformer_tau import (PATHS, TRAINING, phi_beta_last, last_position, model_for, read_record,
                                      rounded_run, train_one, transformer_summary)
from plumbing import cli
from plumbing.rundir import save_atomic, write_json
from plumbing.style import number as num
from sa_transformer import C, Run, SATransformer, harmonic, layers, target_loss, train_sa
from transformer import layer_norm

MEASURE = dict(N=(32, 64, 128, 256), seeds=(0, 1), fractions=(0.0, 0.1, 0.25, 0.5), batch=16384, chunk=1024,
               eval_batch=2048)  # the stages: fractions of the record's head time (tau); eval_batch: the record's
THEORY_POWER = {"beta": 1, "delta": None, "phi_beta2": 2, "phi_delta1": None}  # velocity ~ (H_N / N)^power; None: 1 / N
EVAL_EVERY = {"transformer": TRAINING["eval_every"], "sa": 25}  # a run is measured where it evaluates: the stages' grid
SA_STEP_COST = 0.3  # an SA-transformer step's time as a fraction of the transformer's at the same N (for the ETA only)


def transformer_coordinates(template, params: dict, context: torch.Tensor) -> dict:
    """The theory's coordinates read off the transformer (template: a model_for module that functional_call runs
    with `params`), differentiable in params:
      delta        layer 1's position bias at lag 1, P1[1] (the SA-transformer's delta is its P1[1]);
      beta         the induction score of layer 2 read through the embeddings: for a query of state a,
                   q_a = W_Q2 LN(W_E a), and a key whose layer-1 attention sits on state b, k_b = W_K2 LN(W_V1 LN(W_E b)),
                   the mean of q_a . k_a / sqrt(D) minus the mean over a != b (the SA's beta: M2's h.x diagonal);
      phi_beta2    the induction readout at the last position on `context` (eq. iha at n = N);
      phi_delta1   layer 1's attention of the last position on the previous one (eq. pta at n = N)."""
    E = layer_norm(params["W_E.weight"])  # (C, D)
    q = E @ params["att2.W_Q.weight"].T
    k = layer_norm(E @ params["att1.W_V.weight"].T) @ params["att2.W_K.weight"].T
    S = q @ k.T / math.sqrt(q.shape[1])  # (C, C): query state a, layer-1 content b
    off = ~torch.eye(S.shape[0], dtype=torch.bool)
    _, cache = torch.func.functional_call(template, params, (context,), {"cache": True})
    return {"beta": S.diagonal().mean() - S[off].mean(), "delta": params["att1.P"][0, 1],
            "phi_beta2": phi_beta_last(cache["A2"][:, -1], context), "phi_delta1": cache["A1"][:, -1, -2].mean()}


def sa_coordinates(model: SATransformer, context: torch.Tensor) -> dict:
    """The same for the SA-transformer: beta (mean diagonal of M2's h.x block), delta (P1[1]), phi_beta2 (its layer-2
    attention at the last position through `phi_beta_last`)."""
    M1, P1, M2, P2 = model.attention_parameters()
    A2 = layers(context, M1, P1, M2, P2)[2]
    return {"beta": M2[C:, :C].diagonal().mean(), "delta": P1[1], "phi_beta2": phi_beta_last(A2, context)}


def measurement_batches(N: int) -> list:
    """MEASURE["batch"] fresh sequences of length N + 1 in chunks, from their own generator: one set per N, the same
    for every seed, time and model."""
    g = torch.Generator().manual_seed(2 * 10**6 + N)
    return [fresh_batch(MEASURE["chunk"], N, g) for _ in range(MEASURE["batch"] // MEASURE["chunk"])]


def stage_times(figures: str) -> dict:
    """{model: {N: the steps at MEASURE's fractions}}: of the transformer's head (the record's median at N) and of the
    SA-transformer's tau (its control seeds' mean), each rounded down to the model's EVAL_EVERY."""
    record = read_record(figures)
    heads = transformer_summary(record["transformer_runs"])["N"]
    out = {"transformer": {}, "sa": {}}
    for N in MEASURE["N"]:
        scale = {"transformer": median_ci(heads[str(N)]["head"])[0], "sa": float(np.mean(record["tau"][str(N)]))}
        for model, tau in scale.items():
            grid = EVAL_EVERY[model]
            out[model][N] = sorted({int(f * tau // grid * grid) for f in MEASURE["fractions"]})
    return out


def run_path(root: str, model_name: str, N: int, seed: int) -> str:
    """Where a measurement run's JSON is kept."""
    return os.path.join(root, f"measure_{model_name}_N{N}_s{seed}.json")


def params_path(root: str, N: int, seed: int) -> str:
    """Where a transformer measurement run's parameters at its last stage are kept."""
    return run_path(root, "transformer", N, seed)[:-len(".json")] + ".pt"


def figure_name(frozen: list) -> str:
    """The figure's name: tau_velocities, or for transformer runs with parameters held at their start (--frozen)
    tau_velocities_frozen_<their names> (["W_U.weight"]: tau_velocities_frozen_W_U, tau_settings.py's frozenWU)."""
    return "_".join(["tau_velocities"] + (["frozen"] + [p.removesuffix(".weight") for p in frozen] if frozen else []))


def job_cost(job: tuple) -> float:
    """A measurement run's time relative to the others' (parallel_map's ETA): its steps times a step's, N (1 + N / 128)
    as for the transformer's runs (transformer_tau.train_transformers), SA_STEP_COST of that for the SA-transformer."""
    _, model_name, N, _, times, _ = job
    return times[-1] * N * (1 + N / 128) * (SA_STEP_COST if model_name == "sa" else 1)


def _measure_job(job: tuple) -> dict:
    """One (model, N, seed): its run to the last of `times` at the record's settings (the transformer's with the
    parameters named in `frozen` held at their start), the coordinates' values and velocities at each of them, and
    (SA) phi_beta(2) at every evaluation for its early rate."""
    root, model_name, N, seed, times, frozen = job
    batches, rows = measurement_batches(N), {}
    context = batches[0][0]
    if model_name == "transformer":
        template = model_for(N, seed)
        shorter = {n: measurement_batches(n) for n in MEASURE["N"] if n < N}

        def measure(t, params):
            if t in times:
                loss = lambda c, y: F.cross_entropy(last_position(params, c)[0], y)  # noqa: E731
                rows[t] = velocities(loss, transformer_coordinates(template, params, context), params, batches)
                rows[t]["P1"] = params["att1.P"][0, :8].tolist()
                rows[t]["delta_paths"] = delta_paths(params, batches)
                rows[t]["key_push"] = {**key_push(params, shorter), str(N): rows[t]["delta_paths"]["key"]}
            if t == max(times):  # the last stage's parameters, for key_swaps across N (collect_measurements)
                save_atomic({k: p.detach().clone() for k, p in params.items()}, params_path(root, N, seed))

        run = rounded_run(train_one(N, seed, max(times), MEASURE["eval_batch"], measure=measure,
                                    training={**TRAINING, "frozen": frozen}))
        out = {"t": run["t"], "phi": run["phi"], "loss": run["loss"]}
    else:
        phi = []

        def measure(t, model):
            if t in times:
                loss = lambda c, y: target_loss(model(c), y)[0].mean()  # noqa: E731
                rows[t] = velocities(loss, sa_coordinates(model, context), dict(model.named_parameters()), batches)
            with torch.no_grad():
                phi.append(float(sa_coordinates(model, context)["phi_beta2"]))

        run = train_sa(Run(N=N, seed=seed, iters=max(times), eval_every=EVAL_EVERY["sa"], eval_batch=1024), measure)
        out = {"t": run["t"], "phi": phi, "loss": run["masked_loss"]}
    result = {"model": model_name, "N": N, "seed": seed, "frozen": frozen, "times": {str(t): rows[t] for t in times},
              **out}
    write_json(run_path(root, model_name, N, seed), result)
    return result


def theory_slope(name: str, Ns) -> float:
    """The theory's slope of log |velocity| against log N over Ns: THEORY_POWER's power of H_N / N, or 1 / N's -1."""
    power = THEORY_POWER[name]
    if power is None:
        return -1.0
    return float(power * np.polyfit(np.log(Ns), np.log([harmonic(int(N)) / N for N in Ns]), 1)[0])


def stage_slopes(by_N: dict, stages: int, read) -> list[dict]:
    """Per stage of the runs {N: [run, ...]}: {"N", "velocities" (per N, the seeds'), "median", "slope"}, read(one
    time's measurement) the velocity, slope that of log |median| against log N (None with fewer than two nonzero)."""
    Ns, out = sorted(by_N), []
    for i in range(stages):
        v = {N: [read(m["times"][sorted(m["times"], key=int)[i]]) for m in by_N[N]] for N in Ns}
        median = [float(np.median(v[N])) for N in Ns]
        ok = [j for j, x in enumerate(median) if x != 0]
        slope = float(np.polyfit(np.log([Ns[j] for j in ok]), np.log([abs(median[j]) for j in ok]), 1)[0]) \
            if len(ok) >= 2 else None
        out.append({"N": Ns, "velocities": [v[N] for N in Ns], "median": median, "slope": slope})
    return out


def key_transfer_summary(by_N: dict) -> dict:
    """The key path's push at the last stage read at fixed parameters (key_push): "lengths" the N' read; "growth":
    each trained N's push on the shortest sequences (per N the seeds', their median, the slope of log median against
    log N, and "flat_needs", the slope that offsets the theory's dilution, -slope of H_N / N); "dilution": per N
    the lengths read and the seeds' median push at each, each seed's slope of log push against log N' (None with
    one length or a push that is not positive), their median, and the theory's (H_N' / N' over the same N')."""
    Ns = sorted(by_N)
    last = lambda m: m["times"][max(m["times"], key=int)]["key_push"]  # noqa: E731
    shortest = str(Ns[0])
    growth = [[last(m)[shortest]["velocity"] for m in by_N[N]] for N in Ns]
    median = [float(np.median(g)) for g in growth]
    dilution = {}
    for N in Ns:
        lengths = sorted(int(n) for n in last(by_N[N][0]))
        pushes = [[last(m)[str(n)]["velocity"] for n in lengths] for m in by_N[N]]
        fit = lambda y: float(np.polyfit(np.log(lengths), np.log(y), 1)[0]) if len(y) > 1 and min(y) > 0 else None  # noqa: E731
        slopes = [fit(p) for p in pushes]
        known = [x for x in slopes if x is not None]
        dilution[str(N)] = {"lengths": lengths, "median_push": [float(x) for x in np.median(pushes, 0)],
                            "slopes": slopes, "median": float(np.median(known)) if known else None,
                            "theory": fit([harmonic(n) / n for n in lengths])}
    return {"lengths": Ns, "growth": {"N": Ns, "pushes": growth, "median": median,
                                      "slope": float(np.polyfit(np.log(Ns), np.log(median), 1)[0])
                                      if min(median) > 0 else None,
                                      "flat_needs": -theory_slope("beta", Ns)},
            "dilution": dilution}


def measure_summary(measured: list, record: dict) -> dict:
    """{model: {coordinate: [per stage: {"N", "velocities" (per N, the seeds'), "median", "slope", "theory"}]}}: the
    slope of log |median velocity| against log N beside the theory's; "delta_paths" (transformer): delta's velocity
    through each use of layer 1's output, as stage_slopes; "key_transfer" (transformer, runs with key_push):
    key_transfer_summary; "early_phi": phi_beta(2)'s early rate per N
    (its least-squares slope over the measurement run, which ends at half the head's time or tau) and the slope of
    its medians against log(H_N / N) (the theory: 2); "record_match": the largest difference between a transformer
    measurement run's losses and the committed record's run of its (N, seed) (the same run: 0 to rounding)."""
    out = {}
    for model in sorted({m["model"] for m in measured}):
        runs = [m for m in measured if m["model"] == model]
        Ns = sorted({m["N"] for m in runs})
        by_N = {N: [m for m in runs if m["N"] == N] for N in Ns}
        stages = min(len(m["times"]) for m in runs)
        first = runs[0]["times"][next(iter(runs[0]["times"]))]
        row = {name: [{**s, "theory": theory_slope(name, Ns)}
                      for s in stage_slopes(by_N, stages, lambda r, name=name: r[name]["velocity"])]
               for name in first if name not in ("P1", "delta_paths", "key_push")}
        if all("delta_paths" in r for m in runs for r in m["times"].values()):
            row["delta_paths"] = {p: stage_slopes(by_N, stages, lambda r, p=p: r["delta_paths"][p]["velocity"])
                                  for p in PATHS}
        if all("key_push" in r for m in runs for r in m["times"].values()):
            row["key_transfer"] = key_transfer_summary(by_N)
        rates = {N: [float(np.polyfit(m["t"], m["phi"], 1)[0]) for m in by_N[N]] for N in Ns}
        medians = [float(np.median(rates[N])) for N in Ns]
        row["early_phi"] = {"N": Ns, "rates": [rates[N] for N in Ns], "median": medians,
                            "slope_vs_HN_over_N": float(np.polyfit(np.log([harmonic(N) / N for N in Ns]),
                                                                   np.log(medians), 1)[0])
                            if all(x > 0 for x in medians) and len(Ns) >= 2 else None}
        if model == "transformer":
            diffs = []
            for m in runs:
                base = record.get(str(m["N"]), {}).get(str(m["seed"]))
                if base is not None:
                    n = min(len(m["loss"]), len(base["loss"]))
                    diffs.append(max(abs(a - b) for a, b in zip(m["loss"][:n], base["loss"][:n])))
            row["record_match"] = max(diffs) if diffs else None
        out[model] = row
    return out


COORDINATE_LABELS = {"beta": "beta (transformer: layer 2's induction score via the embeddings)",
                     "delta": "delta = P1[1], layer 1's lag-1 bias", "phi_beta2": "phi_beta(2), the induction readout",
                     "phi_delta1": "phi_delta(1), layer 1 on the previous position"}
PATH_LABELS = {"query": "layer 2's query", "key": "layer 2's keys", "value": "layer 2's values",
               "skip": "the skip past layer 2"}  # the uses of layer 1's output (transformer_tau.PATHS)


def plot_velocities(summary: dict, fractions, path: str, frozen: list = ()):
    """One panel per coordinate: |dq/dt| per unit of learning rate against N, the seeds' median at each stage of
    the run (fractions of the head's time or tau; open markers: the velocity is negative), the transformer in black,
    the SA-transformer in blue, and the theory's scaling through the SA's (or the transformer's) middle stage."""
    names = list(COORDINATE_LABELS)
    paths = summary.get("transformer", {}).get("delta_paths")
    transfer = summary.get("transformer", {}).get("key_transfer")
    panels = len(names) + bool(paths) + bool(transfer)
    fig, axes = plt.subplots(1, panels, figsize=(4.2 * panels, 4.4))
    for ax, name in zip(axes, names):
        for model, colour in (("transformer", "k"), ("sa", "tab:blue")):
            for i, stage in enumerate(summary.get(model, {}).get(name, [])):
                if i == 0:
                    continue  # t = 0: the start, not the plateau
                Ns, median = np.array(stage["N"], float), np.array(stage["median"])
                alpha = 0.35 + 0.65 * i / (len(fractions) - 1)
                ax.plot(Ns, np.abs(median), "-", color=colour, alpha=alpha,
                        label=f"{'transformer' if model == 'transformer' else 'SA'} at {fractions[i]:g} x "
                              f"{'head' if model == 'transformer' else 'tau'}"
                              + ("" if stage["slope"] is None else f", slope {stage['slope']:.2f}"))
                for n, m in zip(Ns, median):
                    ax.plot(n, abs(m), "o", color=colour, alpha=alpha, mfc=colour if m > 0 else "none")
        ref = summary.get("sa", {}).get(name) or summary.get("transformer", {}).get(name)
        if ref:
            mid = ref[len(ref) // 2]
            Ns = np.array(mid["N"], float)
            ax.plot(Ns, abs(mid["median"][0]) * (Ns / Ns[0]) ** mid["theory"], "--", color="gray",
                    label=f"theory: slope {mid['theory']:.2f}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        Ns = sorted({N for model in summary.values() for stage in model.get(name, [])[:1] for N in stage["N"]})
        ax.set_xticks(Ns, [str(N) for N in Ns])
        ax.set_xlabel("N")
        ax.set_title(COORDINATE_LABELS[name], fontsize=9)
        ax.legend(fontsize=6.5, loc="lower left")
    if paths:
        draw_delta_paths(axes[len(names)], paths, summary["transformer"]["delta"][-1], fractions[-1])
    if transfer:
        draw_key_transfer(axes[-1], transfer, fractions[-1])
    axes[0].set_ylabel("|d q / d t| per unit of learning rate (median of seeds)")
    held = f"; the transformer with {', '.join(frozen)} held at its start" if frozen else ""
    fig.suptitle(f"How fast the theory's coordinates move on the plateau (open markers: moving down{held})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def draw_delta_paths(ax, paths: dict, total: dict, fraction: float):
    """The transformer's delta velocity at the last stage split by the use of layer 1's output that carries it
    (delta_paths' medians against N; open markers: negative), beside its total."""
    Ns = np.array(total["N"], float)
    ax.plot(Ns, np.abs(total["median"]), "k-", lw=2, alpha=0.4, label="all paths (delta's velocity)")
    for i, (path, label) in enumerate(PATH_LABELS.items()):
        stage = paths[path][-1]
        ax.plot(Ns, np.abs(stage["median"]), "-", color=f"C{i}", label=label + ("" if stage["slope"] is None else
                                                                              f", slope {stage['slope']:.2f}"))
        for n, m in zip(Ns, stage["median"]):
            ax.plot(n, abs(m), "o", color=f"C{i}", mfc=f"C{i}" if m > 0 else "none")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(Ns, [str(int(N)) for N in Ns])
    ax.set_xlabel("N")
    ax.set_title(f"transformer: delta's velocity by path, at {fraction:g} x head", fontsize=9)
    ax.legend(fontsize=6.5, loc="lower left")


def draw_key_transfer(ax, transfer: dict, fraction: float):
    """The key path's push on delta at fixed parameters: each trained N's run at the last stage (the seeds' median)
    read on sequences of every length N' <= N, with the theory's H_N' / N' through the largest N's line. Falling
    lines: the dilution is there at fixed parameters; lines that stack up with N: training took the parameters
    further."""
    Ns = transfer["lengths"]
    for i, N in enumerate(Ns):
        d = transfer["dilution"][str(N)]
        ax.plot(d["lengths"], np.abs(d["median_push"]), "o-", color=plt.cm.viridis(i / max(len(Ns) - 1, 1)),
                label=f"trained at N = {N}" + ("" if d["median"] is None else f", slope {d['median']:.2f} "
                                                                               f"(theory {d['theory']:.2f})"))
    top = transfer["dilution"][str(Ns[-1])]
    n = np.array(top["lengths"], float)
    ax.plot(n, abs(top["median_push"][0]) * np.array([harmonic(int(x)) / x for x in n]) / (harmonic(int(n[0])) / n[0]),
            "--", color="gray", label="theory at fixed parameters: H_N' / N'")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(Ns, [str(N) for N in Ns])
    ax.set_xlabel("N', the length the parameters are read on")
    ax.set_title(f"transformer: delta's push through layer 2's keys,\neach N's run at {fraction:g} x head, "
                 f"read at N' <= N", fontsize=9)
    ax.legend(fontsize=6.5, loc="lower left")


def velocity_table(measured: dict) -> list[str]:
    """The measurement as markdown rows (RESULTS.md's table): per coordinate and model, the slope of log |median
    velocity| against log N at each stage of the plateau (the sign of the medians where any is negative), the theory's
    slope, and phi's early rate's slope against H_N / N (the theory's 2)."""
    rows, fractions = [], measured["measure"]["fractions"]
    for name, label in COORDINATE_LABELS.items():
        for model in ("sa", "transformer"):
            stages = measured["summary"].get(model, {}).get(name)
            if not stages:
                continue
            slopes = ", ".join(num(st["slope"]) + (" (−)" if any(m < 0 for m in st["median"]) else "")
                               for f, st in zip(fractions, stages) if f > 0)
            rows.append(f"| {label} | {'SA-transformer' if model == 'sa' else 'transformer'} | {slopes} | "
                        f"{num(stages[0]['theory'])} |")
    paths = measured["summary"].get("transformer", {}).get("delta_paths", {})
    total = measured["summary"].get("transformer", {}).get("delta", [{}])[-1].get("median")
    for path, stages in paths.items():
        slopes = ", ".join(num(st["slope"]) + (" (−)" if any(m < 0 for m in st["median"]) else "")
                           for f, st in zip(fractions, stages) if f > 0)
        share = ", ".join(num(m / t) for m, t in zip(stages[-1]["median"], total))
        rows.append(f"| delta's velocity through {PATH_LABELS[path]} (its share of delta's at {fractions[-1]:g} x, "
                    f"per N: {share}) | transformer | {slopes} | — |")
    transfer = measured["summary"].get("transformer", {}).get("key_transfer")
    if transfer:
        g, N0 = transfer["growth"], transfer["lengths"][0]
        rows.append(f"| delta's velocity through layer 2's keys, each N's parameters at {fractions[-1]:g} x read on "
                    f"length-{N0} sequences (per N, × 10⁻⁴: {', '.join(num(1e4 * m) for m in g['median'])}) | "
                    f"transformer | {num(g['slope'])} | {num(g['flat_needs'])} would offset the dilution |")
        fixed = [(N, d) for N, d in transfer["dilution"].items() if d["median"] is not None]
        rows.append("| the same at fixed parameters against the length N' ≤ N (the seeds' median slope per trained N: "
                    + ", ".join(f"N = {N}" for N, _ in fixed) + ") | transformer | "
                    + ", ".join(num(d["median"]) for _, d in fixed) + " | "
                    + ", ".join(num(d["theory"]) for _, d in fixed) + " |")
    swaps = measured["summary"].get("transformer", {}).get("key_swaps")
    if swaps:
        order = sorted(swaps["median"], key=lambda k: -swaps["median"][k])
        rows.append(f"| share of each N's extra key push over N = {swaps['N'][0]}'s (same sequences) taken away by "
                    f"N = {swaps['N'][0]}'s values of one part (median of {len(swaps['runs'])} (N, seed)): "
                    + ", ".join(f"{k} {num(swaps['median'][k])}" for k in order) + " | transformer | — | — |")
    for model in ("sa", "transformer"):
        early = measured["summary"].get(model, {}).get("early_phi")
        if early:
            rows.append(f"| phi_beta(2)'s early rate against H_N / N | "
                        f"{'SA-transformer' if model == 'sa' else 'transformer'} | {num(early['slope_vs_HN_over_N'])} | "
                        f"2.00 |")
    return rows


def swap_summary(root: str, measured: list) -> dict | None:
    """key_swaps of each seed's last-stage parameters at every N against its own at the smallest N, on the smallest
    N's measurement batches: {"N", "seeds", "runs": [{"N", "seed", **key_swaps}], "median": {group: the median
    share over those runs}}; None without the parameter files (params_path) of two N for a seed."""
    runs = [m for m in measured if m["model"] == "transformer" and os.path.exists(params_path(root, m["N"], m["seed"]))]
    Ns = sorted({m["N"] for m in runs})
    pairs = [(N, m["seed"]) for N in Ns[1:] for m in runs if m["N"] == N
             and any(b["N"] == Ns[0] and b["seed"] == m["seed"] for b in runs)]
    if not pairs:
        return None
    batches, rows = measurement_batches(Ns[0]), []
    for N, seed in pairs:
        base, other = (torch.load(params_path(root, n, seed)) for n in (Ns[0], N))
        rows.append({"N": N, "seed": seed, **key_swaps(base, other, batches)})
    return {"N": Ns, "seeds": sorted({seed for _, seed in pairs}), "runs": rows,
            "median": {group: float(np.median([r["shares"][group] for r in rows])) for group in PARAMETER_GROUPS}}


def collect_measurements(root: str, figures: str, frozen: list = ()) -> dict:
    """Every measurement run under root into FIGURES/<figure_name(frozen)>.json and .png (with swap_summary where the
    runs' parameters are kept); runs with parameters held (frozen) are not the record's, so no record_match."""
    measured = []
    for name in sorted(os.listdir(root)):
        if name.startswith("measure_") and name.endswith(".json"):
            with open(os.path.join(root, name)) as f:
                run = json.load(f)
            if run.get("frozen", []) != list(frozen):
                raise ValueError(f"{root}/{name} was measured with {run.get('frozen', [])} held, not {list(frozen)}: "
                                 f"give each --frozen its own --root")
            measured.append(run)
    if not measured:
        raise ValueError(f"no measurement runs under {root}: `python tau_velocities.py` trains them")
    record = {} if frozen else read_record(figures)["transformer_runs"]
    result = {"measure": {k: list(v) if isinstance(v, tuple) else v for k, v in MEASURE.items()}, "frozen": list(frozen),
              "runs": measured, "summary": measure_summary(measured, record)}
    swaps = swap_summary(root, measured)
    if swaps is not None:
        result["summary"]["transformer"]["key_swaps"] = swaps
    write_json(os.path.join(figures, figure_name(frozen) + ".json"), result)
    plot_velocities(result["summary"], MEASURE["fractions"], os.path.join(figures, figure_name(frozen) + ".png"), frozen)
    return result


def main():
    parser = cli.ArgumentParser(description=__doc__.split("\n\n")[0], runs=(
        "Default run: about 1 h on the 2-core development VM (the docstring's estimate as one process; 15 of its 16 "
        "runs took 68 min as one one-thread process beside three to four other runs, 2026-11-28) (the transformer and "
        "the SA-transformer, N = 32, 64, 128, 256, seeds 0, 1, each to half its escape; runs in --root skipped); writes "
        "runs/tau_velocities/measure_<model>_N<N>_s<seed>.json, figures/tau_velocities.png and "
        "figures/tau_velocities.json; with --frozen W_U.weight --models transformer --N 32,64,128: 6 runs (their time: "
        "RESULTS.md), figures/tau_velocities_frozen_W_U.png and .json.\n--replot: seconds, trains nothing."))
    parser.add_argument("--root", help="where each run's JSON goes (default runs/<the figure's name>: "
                        "runs/tau_velocities, or runs/tau_velocities_frozen_W_U with --frozen W_U.weight)")
    parser.add_argument("--models", default="sa,transformer", help="comma-separated subset of sa, transformer to run")
    parser.add_argument("--N", default=",".join(map(str, MEASURE["N"])), help="comma-separated subset of "
                        f"{', '.join(map(str, MEASURE['N']))} to run (the summary reads every run under --root)")
    cli.add_jobs(parser)
    cli.add_figures(parser)
    parser.add_argument("--frozen", default="", help="comma-separated parameters of the transformer held at their "
                        "start in its runs (W_U.weight: tau_settings.py's frozenWU), with --models transformer")
    cli.add_replot(parser, "FIGURES/tau_velocities.json (or the --frozen runs' figure)", "the figure")
    args = parser.parse_args()
    models, Ns = args.models.split(","), cli.parse_list("--N", args.N)
    frozen = [p for p in args.frozen.split(",") if p]
    if set(models) - {"sa", "transformer"} or set(Ns) - set(MEASURE["N"]):
        raise ValueError(f"--models: sa, transformer; --N: of {list(MEASURE['N'])}; got {args.models!r}, {args.N!r}")
    if set(frozen) - set(dict(model_for(2, 0).named_parameters())) or (frozen and models != ["transformer"]):
        parser.error(f"--frozen {args.frozen}: the transformer's parameters (e.g. W_U.weight), with --models transformer")
    cli.writable_dir(args.figures, "--figures")
    name = figure_name(frozen)
    path, root = os.path.join(args.figures, name + ".json"), args.root or os.path.join("runs", name)
    if args.replot is not None:
        cli.replot(args, name + ".json", ("measure", "summary"), "tau_velocities.py",
                   lambda measured, png: plot_velocities(measured["summary"], measured["measure"]["fractions"], png,
                                                         measured.get("frozen", [])),
                   after=lambda measured: print("\n".join(velocity_table(measured))))
        return
    os.makedirs(root, exist_ok=True)
    times = stage_times(args.figures)
    jobs = [(root, model, N, seed, times[model][N], frozen) for model in ("sa", "transformer") if model in models
            for N in Ns for seed in MEASURE["seeds"] if not os.path.exists(run_path(root, model, N, seed))]
    print(f"the theory's coordinates measured: {len(jobs)} runs ({args.jobs} at a time; {', '.join(models)}, N = {Ns}, "
          f"seeds {list(MEASURE['seeds'])}), writing {root}/ and {path[:-4]}png and .json", flush=True)
    cli.parallel_map(_measure_job, jobs, args.jobs, progress="runs", cost=[job_cost(j) for j in jobs])
    measured = collect_measurements(root, args.figures, frozen)
    print(f"wrote {path[:-4]}png and .json")
    print("\n".join(velocity_table(measured)))


if __name__ == "__main__":
    cli.run(main)
