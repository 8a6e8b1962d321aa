"""Why the transformer's tau_2Gen(N) does not grow as N / log N (Fig. 6c bottom; Sec. "The transition from G1 to
G2", Appendix "Testing predictions", eq. parameter_dynamics_simplest): Fig. 6c bottom's runs again with one thing
changed, each a rung that can restore tau ~ N / log N (the theory's coordinates' velocities: tau_velocities.py).

The theory's rates (beta's w_C I H_N / N, delta's w_B F_1 / N) assume a zero start (uniform attention), one-hot
states without layer norm, a direct attention matrix and a mixture readout; the transformer of the record (the
committed runs of sa_scaling.py --transformer-only, figures/sa_scaling.json, 8 seeds per N) has none of them, and
is trained by SGD with momentum at settings of ours (the paper says only "SGD with momentum"). Each difference is a
rung, asked from both sides:

    SETTINGS   the transformer, one change: the SGD (the batch, the step, momentum), a position bias or the
               unembedding held, a bias masked, the theory's start, layer 1's position bias pushed as the theory
               pushes delta (its gradient x 32 / N), the data without a unigram signal, or the plateau's readout
               learned first on data without transitions (alone, with drive1, with frozenWU); "record": the
               record's settings at an N it lacks.
    HYBRIDS    the SA-transformer with one part of the transformer's (sa_hybrids.py): its kind of readout, or its
               attention (embeddings, layer norm, factorised W_Q, W_K, W_V, its start); or on unigram_free's data.

A rung restores the law when the head's (the transformer) or tau's (the SA side) slope against N / log N is >= 0.6;
<= 0.3 it does not. A slope reads a large N-independent part of tau as flatness, so each rung is also fitted as
tau = T0 + c N / log N (analysis/sa_fits.offset_fit): c > 0 is the law's part under any offset; and phi_beta(2)'s
early growth against the theory's (H_N / N)^2. The screen: N = 32, 64, 128, seeds 0-1; a confirmation: more seeds.

    python tau_settings.py                   # every rung at N = 32, 64, 128, seeds 0-1, then the figure and JSON
    python tau_settings.py --settings drive1 --seeds 2-7   # a rung's confirmation, added to the committed JSON's
    python tau_settings.py --settings record --N 512   # the record's settings at N = 512 (hours a run; resumable)
    python tau_settings.py --replot          # only redraw from figures/tau_settings.json

A run is kept as ROOT/<rung>_N<N>_s<seed>.json (a killed screen resumes from them), beside the record's (N, seed).
"""
import glob
import json
import math
import os
import re
import textwrap

import matplotlib.pyplot as plt
import numpy as np
import torch

from analysis.estimators import median_ci
from analysis.fresh_chains import eval_set
from analysis.sa_fits import fit_tau_censored, offset_fit, rate_slope
from analysis.transformer_tau import (HEAD_FRACTION, TRAINING, early_rate, phi_beta_last, read_record, rounded_run,
                                      tau_2gen_drop, train_one, transformer_summary)
from plumbing import cli
from plumbing.rundir import write_json
from plumbing.style import number as num
from sa_hybrids import hybrid
from sa_transformer import Run, drive_prediction, harmonic, train_sa

SETTINGS = {  # name: (the SGD settings, what it tests)
    "batch512": ({**TRAINING, "batch": 512}, "gradient noise / 4"),
    "momentum0": ({**TRAINING, "lr": 0.5, "momentum": 0.0}, "no momentum, the same small-lr step"),
    "lr0.0125": ({**TRAINING, "lr": 0.0125}, "a quarter of the step"),
    "lr0.003125": ({**TRAINING, "lr": 0.003125}, "a sixteenth of the step"),
    "frozenP2": ({**TRAINING, "frozen": ["att2.P"]}, "layer 2's position bias held at zero"),
    "frozenWU": ({**TRAINING, "frozen": ["W_U.weight"]}, "the unembedding held at its start: the readout cannot grow"),
    "final_norm": ({**TRAINING, "final_norm": True}, "a layer norm (no gain; GPT-2's ln_f) before the unembedding"),
    "bounded_readout": ({**TRAINING, "final_norm": True, "frozen": ["W_U.weight"]}, "frozenWU behind a layer norm "
                        "(no gain; GPT-2's ln_f): the logits' scale cannot grow"),
    "smallstart": ({**TRAINING, "init": {"scale": {f"att{l}.W_{m}.weight": 0.05 for l in (1, 2) for m in "QK"},
                                         "zero": ["W_U.weight"]}}, "the theory's start: W_Q, W_K x 0.05, W_U at zero"),
    "window1": ({**TRAINING, "trainable": {"att1.P": [0, 1]}}, "layer 1's position bias learns at lags 0-1 only"),
    "drive1": ({**TRAINING, "drive": {"att1.P": 32}}, "layer 1's position bias pushed as the theory's delta: its "
               "gradient x 32 / N"),
    "drive1_keys": ({**TRAINING, "key_drive": 32}, "drive1 on the path that carries the flat push alone: layer 1's "
                    "position bias's gradient through layer 2's keys x 32 / N"),
    "unigram_free": ({**TRAINING, "balance": True}, "no unigram signal: doubly stochastic chains, uniform stationary"),
    "readout_first": ({**TRAINING, "pretrain": 4000}, "the plateau's readout learned first: 4000 steps on the "
                      "chains' states drawn independently (their frequencies, no transitions), the head counted from "
                      "the switch"),
    "readout_first_drive1": ({**TRAINING, "pretrain": 4000, "drive": {"att1.P": 32}}, "readout_first with drive1"),
    "readout_first_frozenWU": ({**TRAINING, "pretrain": 4000, "frozen": ["W_U.weight"]}, "readout_first with frozenWU"),
    "record": (TRAINING, "the record's own settings, at an N it does not hold (--N 512)"),
}
CAPS = {**{name: 20000 + SETTINGS[name][0].get("pretrain", 0) for name in SETTINGS}, "batch512": 6000,
        "momentum0": 6000, "lr0.003125": 40000}  # steps: the record's cap (20000, after any pretraining), or twice
# the steps a smaller step needs in gradient flow (4x, 16x the record's head)
HYBRIDS = {  # the SA-transformer's side of the ladder: name: (its Run's changes, what it tests); "sa", the parent, is
    # the committed record's (figures/sa_scaling.json's tau)
    "sa_softmax": ({"readout": "softmax"}, "the SA-transformer with a learned readout and a softmax (the "
                   "transformer's kind)"),
    "sa_softmax_scalar": ({"readout": "softmax_scalar"}, "sa_softmax without the map between states: a softmax over "
                          "the experts, one learned scalar each"),
    "sa_softmax_matched": ({"readout": "softmax_matched"}, "sa_softmax_scalar started where it equals the mixture to "
                           "first order (a = C / 4), not at zero"),
    "sa_attention": ({"attention": "transformer"}, "the SA-transformer's readout on the transformer's attention "
                     "(embeddings, layer norm, factorised W_Q, W_K, W_V, the seed's start)"),
    "sa_attention_matched": ({"attention": "transformer", "readout": "softmax_matched"}, "sa_attention read out as "
                             "sa_softmax_matched: the transformer's attention and the softmax together"),
    "sa_attention_matched_small": ({"attention": "transformer_small", "readout": "softmax_matched"},
                                   "sa_attention_matched from the theory's start: W_Q, W_K x 0.05"),
    "sa_drive_flat": ({"drive": 32}, "the converse of drive1: the SA-transformer with delta's drive N-flat, P1's "
                      "gradient x N / 32"),
    "sa_unigram_free": ({}, "unigram_free's control: the SA-transformer itself on its doubly stochastic chains"),
}
HYBRID_RUN = {**{name: {"lr": TRAINING["lr"], "momentum": TRAINING["momentum"], "batch": TRAINING["batch"]}
                 for name in ("sa_attention", "sa_attention_matched", "sa_attention_matched_small")},
              "sa_unigram_free": {"balance": True}}  # a hybrid's Run fields where they are not the SA-transformer's:
# the transformer's attention trains at its SGD (at lr 1 its W_Q, W_K blow up in 50 steps); unigram_free's chains
HYBRID_CAP = 12000  # steps; a run stops at 1.2 x its tau
DESCRIBE = {**{name: what for name, (_, what) in SETTINGS.items()}, **{name: what for name, (_, what) in HYBRIDS.items()},
            "sa": "the SA-transformer itself (the record's control tau)"}
SCREEN = dict(N=(32, 64, 128), seeds=(0, 1), eval_batch=2048, eval_every=50)  # eval_batch: the record's eval sets;
# eval_every: the hybrids' (the transformer's is TRAINING's)


def run_path(root: str, name: str, N: int, seed: int) -> str:
    return os.path.join(root, f"{name}_N{N}_s{seed}.json")


def run_job(job: tuple) -> dict:
    """One run of the ladder, job = (root, name, N, seed), kept as ROOT/<name>_N<N>_s<seed>.json."""
    return hybrid_run(job) if job[1] in HYBRIDS else setting_run(job)


def setting_run(job: tuple) -> dict:
    """One transformer run of the ladder: Fig. 6c bottom's run of (N, seed) (transformer_tau.train_one) with the
    setting's change, checkpointed as it goes, written whole."""
    root, name, N, seed = job
    path = run_path(root, name, N, seed)
    run = rounded_run(train_one(N, seed, CAPS[name], SCREEN["eval_batch"], training=SETTINGS[name][0],
                                checkpoint=path + ".ckpt"))  # a run of hours resumes from its last evaluation
    write_json(path, run)  # atomic: a killed screen leaves whole runs only
    if os.path.exists(path + ".ckpt"):  # none when the run ended at its first evaluation
        os.remove(path + ".ckpt")
    return run


def hybrid_run(job: tuple) -> dict:
    """One SA-side run of the ladder: sa_transformer.train_sa (lr 1, batch 256, or HYBRID_RUN's) to 1.2 x its tau
    (the masked loss's halfway crossing to 2-Gen) or the cap, with phi_beta(2) beside the loss. The SA side is compared
    by tau: its phi stays below PHI_FORMED (beta of order one, no attention on the matching positions alone)."""
    root, name, N, seed = job
    context = eval_set(SCREEN["eval_batch"], N, balance=HYBRID_RUN.get(name, {}).get("balance", False))[0]  # train_sa's
    phi = []

    def measure(t, model):
        with torch.no_grad():
            phi.append(round(float(phi_beta_last(model.layer_outputs(context)[2], context)), 4))

    out = train_sa(Run(N=N, seed=seed, iters=HYBRID_CAP, eval_every=SCREEN["eval_every"],
                       eval_batch=SCREEN["eval_batch"], stop_after=1.2, **HYBRID_RUN.get(name, {})), measure,
                   hybrid(N, seed, **HYBRIDS[name][0]))
    run = {"N": N, "seed": seed, "cap": HYBRID_CAP, **HYBRIDS[name][0], **HYBRID_RUN.get(name, {}),
           "levels": out["levels"], "t": out["t"], "masked_loss": [round(y, 5) for y in out["masked_loss"]], "phi": phi,
           "tau": None if math.isnan(out["tau"]) else out["tau"]}
    write_json(run_path(root, name, N, seed), run)
    return run


def hybrid_summary(hybrid_runs: dict, record_tau: dict, I: float | None = None) -> dict:
    """The SA side of the ladder: {name: fit_tau_censored of its taus per N, no tau counted as longer than the cap} for
    the hybrids' runs ({name: {N: {seed: run}}}) and for "sa", the record's SA-transformer's control taus. With I
    (eq. sa_cbeta), a rung with a drive also gets the first-order dynamics' prediction ("predicted":
    sa_transformer.drive_prediction)."""
    Ns = sorted({N for by_N in hybrid_runs.values() for N in by_N}, key=int)
    taus = {"sa": {N: list(record_tau[N]) for N in Ns if N in record_tau}}
    taus.update({name: {N: [r["tau"] for r in by_N[N].values()] for N in sorted(by_N, key=int)}
                 for name, by_N in hybrid_runs.items()})
    out = {name: {**fit_tau_censored(t), "offset": offset_fit(t)} for name, t in taus.items()}
    for name in hybrid_runs:
        N0 = HYBRIDS[name][0].get("drive")
        if I is not None and N0 is not None and str(N0) in record_tau:
            predicted = drive_prediction(sorted(map(int, taus[name])), record_tau[str(N0)], N0, I)
            out[name]["predicted"] = {k: {str(N): x for N, x in v.items()} if isinstance(v, dict) else v
                                      for k, v in predicted.items()}  # N as the JSON's keys
    return out


def record_full(transformer_runs: dict, extension: dict | None = None) -> dict:
    """The committed record at every N it holds (8 seeds, N = 32-256), with the "record" setting's runs at the N it
    does not hold (extension, {N: {seed: run}}; e.g. N = 512): the heads and steps run per N, their slope against
    N / log N and their offset_fit, for the ladder's first row beside the screen's N."""
    summary = transformer_summary(dict(sorted({**(extension or {}), **transformer_runs}.items(), key=lambda kv: int(kv[0]))))
    heads = {N: v["head"] for N, v in summary["N"].items()}
    extended = sorted((N for N in extension or {} if N not in transformer_runs), key=int)
    return {"heads": heads, "steps": {N: v["steps"] for N, v in summary["N"].items()}, "extended": extended,
            "fit_head": summary["fit_head"]["vs_N_over_logN"], "offset": offset_fit(heads)}


def head_ratio(run: dict, base: dict) -> float | None:
    """The head's formation in `run` as a multiple of the baseline run's (None where either never formed)."""
    head, base_head = tau_2gen_drop(run)["head"], tau_2gen_drop(base)["head"]
    return None if head is None or base_head is None else head / base_head


def compare(runs: dict, baseline: dict) -> dict:
    """Per setting ({name: {N: {seed: run}}}, and "baseline", the committed record's {N: {seed: run}}): the
    head's formation and tau (transformer_summary), each run's head against the baseline run of the same (N, seed)
    (their ratio), and the early rates of phi per N: their medians, and the slope of log median against
    log(H_N / N), which is 2 if phi grows at the theory's rate."""
    out = {}
    for name, by_N in {"baseline": baseline, **runs}.items():
        summary = transformer_summary(by_N)
        rates = {N: [early_rate(r) for r in by_N[N].values()] for N in by_N}
        medians = {N: median_ci(v)[0] for N, v in rates.items()}
        row = {"summary": summary, "early_rate": rates, "early_rate_median": medians,
               "theory_rate": {N: harmonic(int(N)) / int(N) for N in by_N}}
        row["early_rate_slope"], row["early_rate_slope_ci"] = rate_slope(rates, row["theory_rate"])
        row["offset"] = offset_fit({N: v["head"] for N, v in summary["N"].items()})
        if name != "baseline":
            row["head_vs_baseline"] = {N: {s: head_ratio(r, baseline[N][s]) for s, r in by_N[N].items()}
                                       for N in by_N if N in baseline}
        out[name] = row
    return out


RUNG_COLORS = {"baseline": "k", "batch512": "tab:blue", "momentum0": "tab:orange", "lr0.0125": "tab:green",
               "lr0.003125": "tab:olive", "frozenP2": "tab:purple", "smallstart": "tab:red", "window1": "tab:cyan",
               "drive1": "darkgreen", "sa": "tab:brown", "sa_softmax": "tab:pink", "sa_softmax_scalar": "tab:gray",
               "drive1_keys": "navy", "sa_softmax_matched": "gold", "sa_attention": "magenta", "unigram_free": "sienna",
               "sa_attention_matched": "darkorange", "sa_attention_matched_small": "teal", "sa_drive_flat": "lime",
               "sa_unigram_free": "peru", "frozenWU": "crimson", "bounded_readout": "indigo", "final_norm": "slateblue",
               "readout_first": "darkcyan", "readout_first_drive1": "olivedrab", "readout_first_frozenWU": "deeppink"}
RESTORES, DOES_NOT = 0.6, 0.3  # a rung's slope against N / log N that restores the law, and one that does not


def rung(ax, line: dict | None, y: int, colour, marker: str = "o", note: str = ""):
    """One rung of the ladder at height y: its slope against N / log N with its interval, and its seeds per N."""
    if not line:
        ax.annotate("no slope (no head by the cap, or diverged)", (0.5, y), ha="center", va="center", fontsize=7, color=colour)
        return
    lo, hi = line["slope_ci"]
    ax.errorbar(line["slope"], y, xerr=[[line["slope"] - lo], [hi - line["slope"]]], fmt=marker, color=colour, capsize=3)
    ax.annotate(f"{line['slope']:.2f}, seeds {'/'.join(str(k) for k in line['seeds'])}{note}", (line["slope"], y),
                textcoords="offset points", xytext=(0, 6), ha="center", fontsize=7)


def law_part(fit: dict | None) -> str:
    """A rung's offset_fit as the ladder writes it: c, the steps per unit of N / log N, with its interval."""
    return "" if not fit else f"; c {fit['c']:.0f} [{fit['c_ci'][0]:.0f}, {fit['c_ci'][1]:.0f}]"


def shown(name: str) -> str:
    """A setting's name as labels spell it, a space before its number ("lr 0.0125", as the record's "lr 0.05")."""
    return re.sub(r"^(lr|batch|momentum)(?=\d)", r"\1 ", name)


def draw_heads(ax, result: dict):
    """The left panel: each rung's heads against N (none: at the cap, or a x at the top if it diverged), their medians,
    the SA side's tau (squares) and predictions, the record beyond the screen, N / log N through the baseline's first."""
    band = 0.94  # axes fraction: the band of the diverged runs, above the heads' scale
    top = ax.get_xaxis_transform()  # x in data, y in axes: a diverged run's N, in the band at the panel's top
    capped, diverged = False, []  # what the y label and the legend must explain
    for name, row in result["compare"].items():
        label = "lr 0.05, momentum 0.9, batch 128 (the record)" if name == "baseline" else \
            f"{shown(name)}: {DESCRIBE[name]}"
        heads = row["summary"]["N"]
        Ns = sorted(heads, key=int)
        for N in Ns:
            done = [h for h in heads[N]["head"] if h is not None]
            ax.plot([int(N)] * len(done), done, "o", color=RUNG_COLORS[name], alpha=0.35)
            for status, head, steps in zip(heads[N]["status"], heads[N]["head"], heads[N]["steps"]):
                if head is None and status != "diverged":  # never formed by the cap: the cap, a lower bound
                    ax.plot(int(N), CAPS[name], "^", color=RUNG_COLORS[name])
                    capped = True
                elif status == "diverged":  # no head and no time: a x in a band above the steps' scale
                    ax.plot(int(N), band, "x", color=RUNG_COLORS[name], ms=9, mew=2, transform=top)
                    diverged.append((int(N), steps, RUNG_COLORS[name]))
        if any(s == "diverged" for row_N in heads.values() for s in row_N["status"]):
            label += " (diverged: × in the top band)"
        medians = [median_ci([h for h in heads[N]["head"]])[0] for N in Ns]
        ax.plot([int(N) for N in Ns], medians, "-", color=RUNG_COLORS[name], label=label)
    for name, fit in result.get("hybrids", {}).items():  # the SA side: tau, the SA-transformer's own criterion
        Ns = sorted(fit["N"], key=int)
        ax.plot([int(N) for N in Ns], [fit["N"][N]["median"] for N in Ns], "s--", color=RUNG_COLORS[name],
                label=f"{shown(name)}: {DESCRIBE[name]}, tau (the SA's halfway crossing)")
        if "predicted" in fit:  # the first-order dynamics' tau for the rung
            ax.plot([int(N) for N in Ns], [fit["predicted"]["tau"][N] for N in Ns], ":", color=RUNG_COLORS[name],
                    label=f"{shown(name)}: the first-order dynamics' tau (one constant set at N = "
                          f"{fit['predicted']['N0']})")
    base = result["compare"]["baseline"]
    Ns = np.array(sorted(int(N) for N in base["summary"]["N"]), float)
    heads = result.get("record_full", {}).get("heads", {})  # the record beyond the screen's N
    beyond = [N for N in sorted(heads, key=int) if int(N) > Ns[-1]]
    for N in beyond:
        ax.plot([int(N)] * len(heads[N]), [math.nan if h is None else h for h in heads[N]], "o", mfc="none", color="k")
    if beyond:  # its medians, from the screen's last N on
        line, seeds = [str(int(Ns[-1])), *beyond], ", ".join(f"{len(heads[N])} at N = {N}" for N in beyond)
        ax.plot([int(N) for N in line], [median_ci(heads[N])[0] for N in line], ":", color="k",
                label=f"the record beyond the screen (open circles; seeds: {seeds})")
    first = median_ci(base["summary"]["N"][str(int(Ns[0]))]["head"])[0]
    ax.plot(Ns, first * (Ns / np.log(Ns)) / (Ns[0] / np.log(Ns[0])), "--", color="gray", label="theory: N / log N")
    ticks = sorted({int(N) for fit in result.get("hybrids", {}).values() for N in fit["N"]}
                   | {*map(int, Ns), *map(int, beyond)})
    ax.set_xscale("log", base=2)
    ax.set(yscale="log", xlabel="N")
    ax.set_xticks(ticks, [str(int(n)) for n in ticks])
    ax.set_ylabel("head formed (steps" + ("; ^: not by the cap, drawn at it" if capped else "") + ")"
                  + ("\nSA-transformer rungs (squares): tau" if result.get("hybrids") else ""))
    if diverged:  # the band above the data, its marker's meaning said there and once in the shared legend
        low, high = ax.get_ylim()
        ax.set_ylim(low, high * (high / low) ** 0.15)  # the band: the top ~13 % of the axes, above every head
        ax.axhline(high, color="0.7", lw=0.8, ls=":")
        N, _, colour = max(diverged)
        ax.annotate("diverged", (N, band), xycoords=top, xytext=(8, 0), textcoords="offset points",
                    va="center", fontsize=8, color=colour)
        ax.plot([], [], "x", color="0.3", ms=9, mew=2, ls="none",
                label=f"× in the top band: a run that diverged (by step {max(s for _, s, _ in diverged)}), no head")
    ax.set_title("the induction head's formation against N, per setting")


def plot(result: dict, path: str):
    """Left: the heads (draw_heads); middle: phi's early growth rate per rung, (H_N / N)^2 through the baseline's first;
    right: the ladder, each rung's slope against N / log N (nominal 95 %, seeds per N, its law's part)."""
    fig, (left, right, ladder) = plt.subplots(1, 3, figsize=(18, 10), gridspec_kw={"width_ratios": [1, 1, 0.8]})
    draw_heads(left, result)
    full = result.get("record_full", {})  # the record at every N it holds, the ladder's first row
    names = ["record, all N"] * bool(full) + list(result["compare"]) + list(result.get("hybrids", {}))
    if full:
        rung(ladder, full["fit_head"], len(names) - 1, "k", "D", law_part(full["offset"]))
    for name, row in result["compare"].items():  # the rungs' colours are named in draw_heads' legend
        Ns = sorted(row["summary"]["N"], key=int)
        right.plot([int(N) for N in Ns], [row["early_rate_median"][N] for N in Ns], "o-", color=RUNG_COLORS[name])
        rung(ladder, row["summary"]["fit_head"]["vs_N_over_logN"], len(names) - 1 - names.index(name),
             RUNG_COLORS[name], note=law_part(row.get("offset")))
    for name, fit in result.get("hybrids", {}).items():
        rung(ladder, fit["vs_N_over_logN"], len(names) - 1 - names.index(name), RUNG_COLORS[name], "s",
             " (tau)" + law_part(fit.get("offset")))
    base = result["compare"]["baseline"]
    Ns = np.array(sorted(int(N) for N in base["summary"]["N"]), float)
    r0 = base["early_rate_median"][str(int(Ns[0]))]
    right.plot(Ns, [r0 * (harmonic(int(n)) / n / (harmonic(int(Ns[0])) / Ns[0])) ** 2 for n in Ns], "--", color="gray",
               label="theory: (H_N / N)^2")
    right.set_xscale("log", base=2)
    right.set(yscale="log", xlabel="N")
    right.set_xticks(Ns, [str(int(n)) for n in Ns])
    right.set_ylabel("phi_beta(2)'s early growth per step")
    right.set_title(f"phi's growth on the plateau (slope before {HEAD_FRACTION:g} x the head's time)")
    for x, style, text in ((1.0, "--", "theory"), (RESTORES, ":", "restores"), (DOES_NOT, ":", "does not")):
        ladder.axvline(x, color="gray", ls=style, lw=1)
        ladder.annotate(text, (x, len(names) - 0.35), ha="center", va="bottom", fontsize=7, color="gray")
    ladder.set_yticks(range(len(names)), [shown(name) for name in reversed(names)], fontsize=8)
    ladder.set_ylim(-0.6, len(names) + 0.05)  # the three lines' names inside the frame, under its top
    low, high = ladder.get_xlim()
    ladder.set_xlim(low - 0.1, max(high, 1.1))  # room for the leftmost rung's centred label and "theory" at 1
    ladder.set_xlabel("slope of the head's medians against N / log N\n(nominal 95 % interval, seeds per N; c: the "
                      "steps per unit of N / log N\nof tau = T0 + c N / log N, its nominal interval)")
    ladder.set_title("the ladder: does a rung restore tau ~ N / log N?")
    handles, labels = left.get_legend_handles_labels()  # one legend for the panels: the settings' colours are shared
    labels = [textwrap.fill(label, 100) for label in labels]  # long rung names wrapped: two columns that fit
    fig.legend(handles, labels, fontsize=8, loc="lower center", ncol=2, frameon=False)
    right.legend(fontsize=8, loc="lower left")  # the theory's line alone: the rungs' are in the figure's legend
    fig.tight_layout(rect=(0, 0.38, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def table(result: dict) -> list[str]:
    """The comparison as markdown rows (RESULTS.md's table): per setting the head's formation at each N for seeds 0
    and 1, its range as a multiple of the record's run of the same seed, the slope of the head's medians against
    N / log N with its interval and seeds, the law's part c N / log N beside an offset (offset_fit: c, and its share
    of tau at the largest N), and the early rate's slope against H_N / N (the theory's: 2)."""
    def offset(fit: dict | None) -> str:  # offset_fit's c and share (none with fewer than 3 N)
        if not fit:
            return "—"
        return (f"{num(fit['c'], 0)} [{num(fit['c_ci'][0], 0)}, {num(fit['c_ci'][1], 0)}]; {num(fit['share'])} "
                f"[{num(fit['share_ci'][0])}, {num(fit['share_ci'][1])}] at N = {fit['N'][-1]}")

    def slope(line: dict | None) -> str:  # a slope against N / log N with its interval and seeds per N
        if not line:
            return "—"
        return f"{num(line['slope'])} [{num(line['slope_ci'][0])}, {num(line['slope_ci'][1])}], seeds {line['seeds']}"

    rows = []
    if "record_full" in result:  # the record at all its N: the screen's rows below take N = 32-128
        full = result["record_full"]
        line = full["fit_head"]
        Ns = sorted(full["offset"]["N"]) if full["offset"] else []
        added = "".join(f"; N = {N}: " + ", ".join(f"none by {t}" if h is None else f"{h:.0f}"
                                                   for h, t in zip(full["heads"][N], full["steps"][N]))
                        for N in full.get("extended", []))  # the "record" setting's runs
        rows.append(f"| the record at every N (N = {Ns[0]}–{Ns[-1]}) | (figures/sa_scaling.json{added}) | 1 | "
                    f"{slope(line)} | {offset(full['offset'])} | — |")
    for name, row in result["compare"].items():
        by_N = row["summary"]["N"]
        heads = " / ".join(", ".join(f"{h:.0f}" if h is not None else "—" if status == "diverged" else f"none by {t}"
                                     for s, h, status, t in zip(v["seeds"], v["head"], v["status"], v["steps"]) if s < 2)
                           for v in by_N.values())  # a head, a diverged run, or none by the cap
        ratios = [r for by_seed in row.get("head_vs_baseline", {}).values() for r in by_seed.values() if r is not None]
        diverged = [steps for v in by_N.values() for status, steps in zip(v["status"], v["steps"]) if status == "diverged"]
        ci = row["early_rate_slope_ci"]
        rate = "—" if row["early_rate_slope"] is None else f"{num(row['early_rate_slope'])} [{num(ci[0])}, {num(ci[1])}]"
        what = "the record: lr 0.05, momentum 0.9, batch 128" if name == "baseline" else f"{name}: {DESCRIBE[name]}"
        times = "1" if name == "baseline" else f"{min(ratios):.2f}–{max(ratios):.2f}" if ratios else \
            f"diverged by step {max(diverged)}" if diverged else "—"
        rows.append(f"| {what} | {heads} | {times} | {slope(row['summary']['fit_head']['vs_N_over_logN'])} | "
                    f"{offset(row.get('offset'))} | {rate} |")
    for name, fit in result.get("hybrids", {}).items():  # the SA side: its tau (the SA-transformer's criterion)
        taus = result["hybrid_runs"][name] if name in result.get("hybrid_runs", {}) else None
        per_N = " / ".join(", ".join("—" if r["tau"] is None else f"{r['tau']:.0f}" for r in taus[N].values())
                           for N in sorted(taus, key=int)) if taus else \
            " / ".join(f"{fit['N'][N]['median']:.0f}" for N in sorted(fit["N"], key=int)) + " (medians)"
        predicted = fit.get("predicted")
        times = "(the SA's criterion)" if not predicted else "(the SA's criterion) x the parent's, predicted " + \
            " / ".join(f"{predicted['ratio'][N]:.2f}" for N in sorted(predicted["ratio"], key=int))
        rows.append(f"| {name}: {DESCRIBE[name]} | tau {per_N} | {times} | {slope(fit['vs_N_over_logN'])} | "
                    f"{offset(fit.get('offset'))} | — |")
    return rows


def runs_under(root: str) -> dict:
    """{name: {N: {seed: run}}} of the ladder's runs kept under root: each finished run_path, and for a setting's run
    still training its checkpoint's record so far, marked "training": true (a hybrid's checkpoint is no run)."""
    out = {}
    for name in [*SETTINGS, *HYBRIDS]:
        for path in sorted(glob.glob(run_path(glob.escape(root), name, "*", "*")) +
                           (glob.glob(run_path(glob.escape(root), name, "*", "*") + ".ckpt") if name in SETTINGS else [])):
            if path.endswith(".ckpt"):
                if os.path.exists(path[:-5]):  # finished since: the finished run counts
                    continue
                run = {**rounded_run(torch.load(path, weights_only=False)["run"]), "training": True}
            else:
                with open(path) as f:
                    run = json.load(f)
            out.setdefault(name, {}).setdefault(str(run["N"]), {})[str(run["seed"])] = run
    return out


def collect(root: str, figures: str) -> dict:
    """Every run under root (one still training: its checkpoint's record so far) added to, or replacing, the runs
    FIGURES/tau_settings.json holds, beside the record's runs of the same N, into FIGURES/tau_settings.json and .png."""
    record = read_record(figures)
    stored_path = os.path.join(figures, "tau_settings.json")
    stored = cli.read_json(stored_path, ("runs",), "tau_settings.py") if os.path.exists(stored_path) else {}
    runs = {name: by_N for name, by_N in stored.get("runs", {}).items() if name in SETTINGS}
    hybrid_runs = {name: by_N for name, by_N in stored.get("hybrid_runs", {}).items() if name in HYBRIDS}
    for name, by_N in runs_under(root).items():
        for N, by_seed in by_N.items():
            (hybrid_runs if name in HYBRIDS else runs).setdefault(name, {}).setdefault(N, {}).update(by_seed)
    for by_N in [*runs.values(), *hybrid_runs.values()]:  # N and seeds in numerical order
        for N in list(by_N):
            by_N[N] = dict(sorted(by_N[N].items(), key=lambda kv: int(kv[0])))
        order = sorted(by_N, key=int)
        by_N.update({N: by_N.pop(N) for N in order})
    if not runs:
        raise ValueError(f"no runs under {root}: `python tau_settings.py` trains them")
    transformer = record["transformer_runs"]
    rungs = {name: by_N for name, by_N in runs.items() if name != "record"}  # "record" extends the record's N
    baseline = {N: transformer[N] for N in sorted({N for by_N in rungs.values() for N in by_N}, key=int) if N in transformer}
    result = {"settings": {name: SETTINGS[name][0] | {"cap": CAPS[name], "tests": SETTINGS[name][1]} for name in runs},
              "baseline": "figures/sa_scaling.json's transformer_runs (all their seeds)", "runs": runs,
              "compare": compare(rungs, baseline),
              "record_full": record_full(transformer, runs.get("record"))}
    if hybrid_runs:
        result["hybrid_runs"] = hybrid_runs
        result["hybrids"] = hybrid_summary(hybrid_runs, record["tau"], record.get("I"))
    write_json(stored_path, result)
    plot(result, os.path.join(figures, "tau_settings.png"))
    return result


def main():
    parser = cli.ArgumentParser(description=__doc__.split("\n\n")[0], runs=(
        f"Default run: every rung of the screen ({len(SETTINGS) - 1 + len(HYBRIDS)}) x N = 32, 64, 128 x seeds 0, 1, "
        "those in --root skipped: roughly 11.5 h on the 2-core development VM with --jobs 2 (an estimate from its "
        "pieces, not timed whole: the two knock-outs' 12 runs took 1 h 46 min, frozenWU's 6 runs 15, readout_first's "
        "23 min, as one-thread processes, 2026-11-28 to 30; runs that reach the 20000-step cap take longest); writes "
        "runs/tau_settings/<setting>_N<N>_s<seed>.json, figures/tau_settings.png and figures/tau_settings.json.\n"
        "--replot: seconds, trains nothing."))
    parser.add_argument("--root", default=os.path.join("runs", "tau_settings"), help="where each run's JSON goes")
    cli.add_jobs(parser)
    cli.add_figures(parser)
    cli.add_replot(parser, "FIGURES/tau_settings.json", "the figure")
    trainable = [*SETTINGS, *HYBRIDS]
    screen = [name for name in trainable if name != "record"]  # the record's own runs at N = 32-128 are committed
    parser.add_argument("--settings", default=",".join(screen), help=f"the settings and hybrids to train, comma-"
                        f"separated (default the screen's: {','.join(screen)}; also: record, with --N)")
    cli.add_seeds(parser, ",".join(map(str, SCREEN["seeds"])), "the seeds of each setting and N (the screen's: 0,1; "
                  "a rung's confirmation: 0-7)")
    parser.add_argument("--N", default=",".join(map(str, SCREEN["N"])), help="the sequence lengths, comma-separated "
                        "(the screen's: 32,64,128; the record at an N it does not hold: --settings record --N 512)")
    args = parser.parse_args()
    seeds = cli.parse_list("--seeds", args.seeds)
    if min(Ns := cli.parse_list("--N", args.N, rule="N: sequence lengths >= 2")) < 2:
        parser.error(f"--N {args.N}: each N must be at least 2 (a context and its last position)")
    names = args.settings.split(",")
    if any(name not in trainable for name in names):
        parser.error(f"--settings {args.settings}: each must be one of {', '.join(trainable)}")
    cli.writable_dir(args.figures, "--figures")
    if args.replot is not None:
        cli.replot(args, "tau_settings.json", ("compare", "runs"), "tau_settings.py", plot,
                   after=lambda result: print("\n".join(table(result))))
        return
    os.makedirs(args.root, exist_ok=True)
    jobs = [(args.root, name, N, seed) for name in names for N in Ns for seed in seeds
            if not os.path.exists(run_path(args.root, name, N, seed))]
    print(f"Fig. 6c bottom at other settings: {len(jobs)} runs to train ({', '.join(names)}; N = {Ns}, seeds {seeds}), "
          f"{args.jobs} at a time on the CPU; writing {args.root}/ and {args.figures}/tau_settings.png and .json", flush=True)
    cli.parallel_map(run_job, jobs, args.jobs, progress="runs",
                     cost=[CAPS[j[1]] * j[2] if j[1] in CAPS else 0.1 * HYBRID_CAP * j[2] for j in jobs])
    result = collect(args.root, args.figures)
    print(f"wrote {args.figures}/tau_settings.png and .json", *table(result), sep="\n")


if __name__ == "__main__":
    cli.run(main)
