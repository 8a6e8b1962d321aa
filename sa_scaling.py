"""Fig. 6b-c end to end: tau_2Gen against N for the SA-transformer (sa_transformer.py) and for the transformer, with
beta(t) and delta(t) beside them (Sec. "The transition from G1 to G2"; Appendix "Testing predictions": tau_2Gen ~
N / log N, and eq. parameter_dynamics_simplest's beta ~ t, delta ~ t or t^2; Fig. 6b (beta and delta against t), 6c
top (the SA-transformer's tau_2Gen(N), control and bias ablation), 6c bottom (the transformer without MLP1,
non-autoregressive)).

The series: the SA-transformer's tau_2Gen(N), control and ablation, fitted against N / log N (analysis/sa_fits.py); the
transformer's runs, whose data, training, criterion and record are analysis/transformer_tau.py's; and Fig. 6b's test of
why beta outgrows t, the full model with its mixture weights held at the theory's (0, 1/3, 1/3, 1/3). The beta and
delta panels draw the dynamics runs that sa_dynamics.py writes into the record both scripts share,
figures/sa_scaling.json (analysis/sa_record.py): it runs first.

    python sa_scaling.py                     # quick preset (CPU: with sa_dynamics.py, ~10 min on 2 cores;
                                             # --transformer: ~2.5 h more, in a --figures DIR of its own: the
                                             # committed record's runs are the paper's)
    python sa_scaling.py --transformer-only --preset paper   # only the transformer's (N, seed) missing from
                                             # figures/sa_scaling.json (CPU: N = 32-128 in 80 min on 2 cores)
    python sa_scaling.py --transformer-only --preset paper --device cuda   # 8 seeds of an N as one batched model
    python sa_scaling.py --w-third           # only Fig. 6b's test, the full model with w held, at the record's preset
                                             # (CPU: ~20 min)
    python sa_scaling.py --preset paper      # the paper's sizes and seeds
    python sa_scaling.py --replot            # only redraw sa_scaling.png from figures/sa_scaling.json

Its part of figures/sa_scaling.json: the taus and their fits ("tau", "tau_ablation", "tau_fits"), the transformer's
trajectories ("transformer_runs": t, loss, phi; "transformer_tau" re-reads them) and the runs with w held ("w_third").
"""
import json
import math
import os
import time

import matplotlib.pyplot as plt
import numpy as np

from analysis.sa_fits import EXPONENT_WINDOWS, fit_tau, seed_mean, summarize_exponents
from analysis.sa_record import DYNAMICS, NAME, PRESETS, TRAJECTORY, check_preset, dynamics_runs, keep, previous
from analysis.transformer_tau import (add_transformer_runs, check_protocol, merge_transformer_runs, train_transformers,
                                      transformer_summary)
from plumbing import cli
from plumbing.records import settle, significant
from plumbing.rundir import write_json
from sa_transformer import Run, iters_cap, train_sa

# ----------------------------------------------------------------------------- the series


def train_tau_series(P: dict, jobs: int) -> dict:
    """tau_2Gen(N) of the full model, control and ablation, seeds_tau seeds at each N of N_tau, in one pool (longest
    first): each to the step cap (twice it in the ablation) or stop_after x its tau, evaluated every max(25, N / 4)
    steps. Returns {"control" or "ablation": {N: runs}}."""
    runs = sorted([Run(N=N, seed=s, ablate=ablate, iters=iters_cap(N) * (2 if ablate else 1),
                       eval_batch=P["eval_batch"], eval_every=max(25, N // 4), stop_after=P["stop_after"])
                   for ablate in (False, True) for N in P["N_tau"] for s in range(P["seeds_tau"])], key=lambda r: -r.N)
    t0 = time.time()
    done = cli.parallel_map(train_sa, runs, jobs)
    print(f"{len(runs)} SA-transformer runs done in {time.time() - t0:.0f} s", flush=True)
    by_N = {"control": {}, "ablation": {}}
    for r, d in zip(runs, done):
        by_N["ablation" if r.ablate else "control"].setdefault(r.N, []).append(d)
    return {setting: dict(sorted(groups.items())) for setting, groups in by_N.items()}


TAU_SERIES = ("tau", "tau_ablation")  # each fitted against N / log N (fit_tau)


def scaling_summary(tau_runs: dict) -> dict:
    """tau_2Gen(N) of the SA-transformer (control, ablation) with their fits against N / log N, and the final losses
    at the largest N (the transformer's runs are whole trajectories in "transformer_runs", merge_transformer_runs)."""
    out = {"tau": {str(N): [r["tau"] for r in runs] for N, runs in tau_runs["control"].items()},
           "tau_ablation": {str(N): [r["tau"] for r in runs] for N, runs in tau_runs["ablation"].items()}}
    out["tau_fits"] = {key: fit_tau(out[key]) for key in TAU_SERIES}
    largest = tau_runs["control"][max(tau_runs["control"])]
    for key, level in (("final_loss", None), ("loss_2gen", "masked_loss_2gen"), ("loss_1gen", "masked_loss_1gen")):
        out[key] = float(np.mean([r["masked_loss"][-1] if level is None else r["levels"][level] for r in largest]))
    return out


W_THIRD = dict(N=(64, 128), seeds=5, w=(0.0, 1 / 3, 1 / 3, 1 / 3))  # the theory's 1-Gen weights, held fixed


def train_w_third(result: dict, P: dict, jobs: int) -> dict:
    """Fig. 6b's exponents with w's drift removed: the full model (eq. base_model) with w_A..w_D held at the
    theory's (0, 1/3, 1/3, 1/3), control and ablation, W_THIRD's N and seeds, each run to 0.75 x the full model's
    mean tau at its N and setting (the record's, of preset P), evaluated on P's eval_batch, its exponents fitted on
    that tau's clock over EXPONENT_WINDOWS.
    {"runs": {N: {setting: [trajectories]}}, "exponents": {N: {setting: summarize_exponents}}}."""
    series = {"control": "tau", "ablation": "tau_ablation"}  # each setting's taus in the record
    taus = {(N, setting): float(np.mean(result[key][str(N)])) for N in W_THIRD["N"] for setting, key in series.items()}
    runs = {(N, setting): [Run(N=N, seed=s, ablate=setting == "ablation", iters=int(0.75 * taus[N, setting]),
                               freeze_weights=W_THIRD["w"], eval_batch=P["eval_batch"])
                           for s in range(W_THIRD["seeds"])]
            for N in W_THIRD["N"] for setting in series}
    every = [r for group in runs.values() for r in group]
    done = iter(cli.parallel_map(train_sa, every, jobs, progress="runs with w held at (0, 1/3, 1/3, 1/3)",
                                 cost=[r.iters for r in every]))
    out = {"runs": {}, "exponents": {}}
    for (N, setting), group in runs.items():
        trained = [next(done) for _ in group]
        out["runs"].setdefault(str(N), {})[setting] = [significant({k: r[k] for k in TRAJECTORY}) for r in trained]
        out["exponents"].setdefault(str(N), {})[setting] = summarize_exponents(trained, EXPONENT_WINDOWS,
                                                                               taus[N, setting])
    return out


# ----------------------------------------------------------------------------- the figure

SETTING_COLORS = {"control": "tab:blue", "ablation": "tab:red"}


PAPER_EXPONENTS = {"beta": ("t", "t"), "delta": ("t", "t$^2$")}  # control, ablation (Sec. "Testing predictions")


def held(result: dict, part: str) -> dict:
    """The full model with w held at 1/3 (train_w_third) at the dynamics runs' N, by setting: its runs (part "runs")
    or their exponents ("exponents"); {} where it did not run there."""
    if "w_third" not in result:
        return {}
    return result["w_third"][part].get(str(result["runs"]["full_control"][0]["run"]["N"]), {})


def exponent_title(key: str, result: dict) -> str:
    """A beta or delta panel's title, in words: the full model's exponents in the stated window, their range over the
    three windows the fits were tried in and over the seeds, the full model's with w held at 1/3, and the paper's."""
    lines, windows = [], [f"{a:g}-{b:g}" for a, b in EXPONENT_WINDOWS]  # the first: the stated window
    for setting in ("control", "ablation"):
        value = result[f"{key}_exponent_{setting}"]
        fits = list(result["exponents"][f"full_{setting}"][key].values())  # the seeds' mean, in each window
        seeds = result["exponents_seeds"][f"full_{setting}"][key]  # each seed's, in the stated window
        lines.append(f"{setting} t$^{{{value:.2f}}}$ (in the {len(fits)} fit windows {min(fits):.2f} to "
                     f"{max(fits):.2f}; each of {len(seeds)} seeds alone {min(seeds):.2f} to {max(seeds):.2f})"
                     if value is not None and np.isfinite(value) else f"{setting}: not fitted")
    paper = PAPER_EXPONENTS[key]
    w_held = ", ".join(f"{setting} t$^{{{e[key][windows[0]]:.2f}}}$" for setting, e in held(result, "exponents").items())
    return (f"$\\{key}(t)$ of the full model: the seeds' mean fitted as a power of t over t = {windows[0]} x tau\n"
            + "\n".join(lines) + (f"\nthe full model with w held at 1/3: {w_held}" if w_held else "")
            + f"\n(fit windows: t = {', '.join(windows)} x the mean tau); paper: {paper[0]} (control), {paper[1]} (ablation)")


def positive(runs: list, key: str) -> tuple[np.ndarray, np.ndarray]:
    """The seeds' mean of `key` against t where a log axis shows it (t > 0 and the mean > 0)."""
    t, mean = seed_mean(runs, key)
    shown = (t > 0) & (mean > 0)
    return t[shown], mean[shown]


def draw_parameter(ax, key: str, dyn: dict, frozen: dict, result: dict):
    """Fig. 6b's panel of beta or delta (key) against t: the full and reduced models, control and ablation, the
    reduced model with w frozen, the full model with w held at 1/3, and guides through the control's first point."""
    for name, runs in dyn.items():
        reduced, ablate = DYNAMICS[name]
        ax.loglog(*positive(runs, key), color=SETTING_COLORS["ablation" if ablate else "control"],
                  ls=":" if reduced else "-", label=name.replace("_", ", "))
    for name, runs in frozen.items():
        setting = name.removeprefix("frozen_")
        ax.loglog(*positive(runs, key), color=SETTING_COLORS[setting], ls="--", lw=1,
                  label=f"reduced, w frozen, {setting}")
    for setting, runs in held(result, "runs").items():
        ax.loglog(*positive(runs, key), color=SETTING_COLORS[setting], ls=(0, (5, 1, 1, 1, 1, 1)), lw=1.2,
                  label=f"full, w held at 1/3, {setting}")
    t, mean = positive(dyn["full_control"], key)
    if len(t):  # guides through the control curve's first point
        t_ref = np.array([t[0], t[-1]])
        ax.loglog(t_ref, mean[0] * (t_ref / t_ref[0]), "k:", lw=0.8, label=r"$\propto t$")
        ax.loglog(t_ref, mean[0] * (t_ref / t_ref[0]) ** 2, "k-.", lw=0.8, label=r"$\propto t^2$")
    ax.set_ylim(bottom=max(1e-5, ax.get_ylim()[0]))
    ax.set_xlabel("iteration t")
    ax.set_ylabel(f"$\\{key}$ (mean over seeds)")
    ax.set_title(exponent_title(key, result), fontsize=9)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=3, frameon=False)  # off the curves


def draw_tau(ax, result: dict):
    """Fig. 6c top: the SA-transformer's tau_2Gen against N, control and ablation, each seed and the paper's law a N /
    log N fitted (fit_tau), with the fitted power's slope."""
    slopes = []
    for key, setting in (("tau", "control"), ("tau_ablation", "ablation")):
        points = [(int(N), tau) for N, taus in result[key].items() for tau in taus if np.isfinite(tau)]
        fit = result["tau_fits"][key]
        if not points or not np.isfinite(fit["prefactor"]):
            continue
        ax.plot(*zip(*points), "o", color=SETTING_COLORS[setting], alpha=0.5, label=f"{setting} (seeds)")
        Ns = np.array(fit["N"], float)
        ax.plot(Ns, fit["prefactor"] * Ns / np.log(Ns), "--", color=SETTING_COLORS[setting],
                label=f"{fit['prefactor']:.0f} N / log N")
        slopes.append(f"{setting} {fit['slope_vs_N_over_logN']:.2f}")
    if not slopes:
        ax.text(0.5, 0.5, "no transition within the budget", ha="center", transform=ax.transAxes)
        ax.set_title("SA-transformer")
        return
    Ns = sorted({int(N) for key in TAU_SERIES for N in result[key]})
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(Ns, [str(N) for N in Ns])
    ax.set_xlabel("N")
    ax.set_ylabel("tau_2Gen (iterations)")
    ax.set_title(f"SA-transformer\nslope vs N / log N: {', '.join(slopes)}", fontsize=10)
    ax.legend(fontsize=8)


def plot_scaling(dyn: dict, frozen: dict, result: dict, path: str):
    """Fig. 6b-c: beta and delta against t (draw_parameter) above; tau_2Gen against N below, of the SA-transformer
    (control and ablation, Fig. 6c top; draw_tau) and of the transformer (Fig. 6c bottom; plot_transformer_tau, where
    the record holds its runs). Returns the figure (closed)."""
    fig, axes = plt.subplots(2, 2, figsize=(14, 10.5))
    axes = axes.ravel()
    for ax, key in zip(axes[:2], ("beta", "delta")):
        draw_parameter(ax, key, dyn, frozen, result)
    draw_tau(axes[2], result)
    if "transformer_tau" in result:  # the transformer's runs and their criterion
        plot_transformer_tau(axes[3], result["transformer_tau"])
    else:
        axes[3].text(0.5, 0.5, "not run (add --transformer)", ha="center", transform=axes[3].transAxes)
        axes[3].set_title("transformer, no MLP1, non-AR")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return fig


def plot_transformer_tau(ax, summary: dict):
    """Fig. 6c bottom from the transformer's runs re-read (transformer_tau.transformer_summary): each seed's
    sustained-drop tau (filled), its first halfway crossing (hollow, a noisier reading), the head's formation
    (x, phi's sustained rise), runs without a tau
    as triangles at their bound (censored at the cap; 'no head': the drop's time, unconfirmed by phi), the medians
    with their order-statistic intervals, and the power law in N / log N through the medians with its slope's
    bootstrap interval and the seeds it rests on."""
    fit = summary["fit"]
    for N, row in summary["N"].items():
        n = int(N)
        for status, tau, bound, first, head in zip(row["status"], row["tau"], row["bound"], row["first_crossing"],
                                                   row["head"]):
            if status == "tau":
                ax.plot(n, tau, "o", color=SETTING_COLORS["control"], alpha=0.5)
            elif status != "diverged":
                ax.plot(n, bound if status == "censored" else tau, "^", color="k" if status == "censored" else "tab:orange")
            if math.isfinite(first):
                ax.plot(n, first, "o", mfc="none", color="gray", alpha=0.6)
            if head is not None:
                ax.plot(n, head, "x", color="tab:purple", alpha=0.7)
        m = fit["N"][N]
        if math.isfinite(m["median"]):
            ax.errorbar(n, m["median"], [[m["median"] - m["interval"][0]], [max(0.0, m["interval"][1] - m["median"])]],
                        fmt="s", color="k", capsize=3)
    ax.plot([], [], "o", color=SETTING_COLORS["control"], alpha=0.5, label="sustained drop, phi confirmed")
    ax.plot([], [], "o", mfc="none", color="gray", label="first halfway crossing")
    head = summary["fit_head"]["vs_N_over_logN"]
    ax.plot([], [], "x", color="tab:purple", label="head formed (phi's rise)" if head is None else  # the 95 % bootstrap
            f"head formed: slope {head['slope']:.2f} (95 % interval\n{head['slope_ci'][0]:.2f} to {head['slope_ci'][1]:.2f})")
    statuses = {status for row in summary["N"].values() for status in row["status"]}  # a marker in the legend if drawn
    if "censored" in statuses:
        ax.plot([], [], "^", color="k", label="censored at the cap (bound)")
    if "no head" in statuses:
        ax.plot([], [], "^", color="tab:orange", label="drop, no head (phi below PHI_FORMED)")
    ax.errorbar([], [], [], fmt="s", color="k", label="median over seeds, bar: its\nexact order-statistic interval")
    line = fit["vs_N_over_logN"]
    Ns = np.array(sorted(int(N) for N in summary["N"]), float)
    title = "transformer (no MLP1, non-AR): tau_2Gen = the loss's sustained drop"
    if line is not None:
        kept = np.array([N for N in Ns if int(N) not in fit["left_out"]])
        x = kept / np.log(kept)
        medians = np.array([fit["N"][str(int(N))]["median"] for N in kept])
        a = np.exp(np.mean(np.log(medians) - line["slope"] * np.log(x)))
        ax.plot(kept, a * x ** line["slope"], "-", color=SETTING_COLORS["control"],
                label=f"fit: (N / log N)^{line['slope']:.2f}")
        ax.plot(kept, fit["prefactor"] * x, "--", color="gray", label=f"paper's law, {fit['prefactor']:.0f} N / log N")
        lo, hi = line["slope_ci"]
        seeds = set(line["seeds"])
        title += (f"\nslope vs N / log N {line['slope']:.2f} (95 % bootstrap interval {lo:.2f} to {hi:.2f}; paper: 1)"
                  f"\nslope vs N {fit['vs_N']['slope']:.2f}"
                  + (f", {seeds.pop()} seeds per N" if len(seeds) == 1 else f", seeds per N {line['seeds']}"))
    if fit["left_out"]:
        title += f"; left out (median beyond the runs): N = {fit['left_out']}"
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(Ns, [str(int(N)) for N in Ns])
    ax.set_xlabel("N")
    ax.set_ylabel("tau_2Gen (iterations)")
    ax.set_title(title, fontsize=9)
    # the legend in a band below the runs: the lowest points (the head's formation) sit at the bottom of the data
    ys = [y for artist in ax.get_lines() for y in artist.get_ydata() if 0 < y < math.inf]
    if ys:
        low, high = min(ys), max(ys)
        ax.set_ylim(low / (high / low) ** 0.6, high * (high / low) ** 0.08)
    ax.legend(fontsize=7, ncol=2, loc="lower center")


REPLOTTED = (*TAU_SERIES, "tau_fits")  # what plot_scaling reads of this script's part
DYNAMICS_READ = ("runs", "exponents", "exponents_seeds", *(f"{key}_exponent_{setting}" for key in ("beta", "delta")
                                                            for setting in ("control", "ablation")))  # and of sa_dynamics.py's


def read_drawn(path: str) -> dict:
    """The record at path, which must hold what replot draws: this script's part and sa_dynamics.py's runs and
    exponents (the beta and delta panels')."""
    result = cli.read_json(path, REPLOTTED, "sa_scaling.py")
    cli.read_json(path, DYNAMICS_READ, "sa_dynamics.py")
    return result


def replot(path: str):
    """--replot [JSON]: Fig. 6b-c from the JSON at path, sa_scaling.png beside it, tau_2Gen refitted and the
    transformer's criterion re-read from its stored trajectories (cheap). A consistency check: the JSON is rewritten
    only when a number in it changed beyond float noise, and then with the others' last digits as they were (settle,
    sa_record.keep)."""
    result = read_drawn(path)
    before = json.loads(json.dumps(result))
    with cli.drawing(path, "sa_scaling.py"):
        if "transformer_runs" in result:
            result["transformer_tau"] = transformer_summary(result["transformer_runs"])
        result["tau_fits"].update({key: fit_tau(result[key]) for key in TAU_SERIES})  # what else it holds stays
        result = settle(result, before)
        plot_scaling(*dynamics_runs(result), result, os.path.join(os.path.dirname(path), "sa_scaling.png"))
    keep(path, result, before, "sa_scaling.png", "tau refitted")


def run_transformer_only(path: str, P: dict, jobs: int, device: str):
    """--transformer-only: the transformer's (N, seed) of preset P that the record at path holds no trajectory of,
    trained and merged into it, the JSON written as each N finishes (add_transformer_runs)."""
    result = read_drawn(path)
    add_transformer_runs(result, P, jobs, device, write=lambda r: write_json(path, r, indent=1))


def run_w_third(path: str, preset: str, jobs: int):
    """--w-third: train_w_third's runs, clocked by the taus of the record at path, which must be of `preset`
    (check_preset), written into it as "w_third"."""
    result = read_drawn(path)
    check_preset(result, preset, path)
    result["w_third"] = train_w_third(result, PRESETS[preset], jobs)
    write_json(path, result, indent=1)


def main():
    parser = cli.ArgumentParser(description="SA-transformer and transformer: tau_2Gen(N), with beta(t) and delta(t) "
                                            "beside it (Fig. 6b-c); runs on the CPU, as one-thread processes.", runs=(
        "Default run: not timed on its own; with sa_dynamics.py's runs, 9 min 54 s on the 2-core development VM as two "
        "processes (2026-11-26) (quick preset: tau_2Gen at N = 32, 64, 128, 256; --transformer ~2.5 h more); reads the "
        "dynamics runs sa_dynamics.py wrote, writes figures/sa_scaling.png and its part of figures/sa_scaling.json.\n"
        "--replot: seconds, trains nothing."))
    cli.add_preset(parser, PRESETS, "quick: tau at N = 32..256, no transformer; paper: N = 32..1024, the transformer")
    parser.add_argument("--transformer", action="store_true", help="quick preset: also time the transformer (Fig. 6c bottom)")
    cli.add_device(parser)
    cli.add_jobs(parser)
    cli.add_threads(parser)
    cli.add_figures(parser)
    cli.add_replot(parser, f"FIGURES/{NAME}", "Fig. 6b-c (sa_scaling.png)")
    parser.add_argument("--transformer-only", action="store_true",
                        help="only the transformer runs (Fig. 6c bottom) at the preset's (N, seed) whose trajectory "
                             "FIGURES/sa_scaling.json does not hold yet, merged into it as they finish; then --replot. "
                             "On CUDA the seeds of an N train as one batched model")
    parser.add_argument("--w-third", action="store_true",
                        help="only the full model with w held at (0, 1/3, 1/3, 1/3) (W_THIRD: N = 64, 128, 5 seeds, "
                             "control and ablation; CPU ~20 min on one core), into FIGURES/sa_scaling.json, whose preset "
                             "--preset must name (its taus clock the runs, its eval batch theirs); then --replot")
    args = parser.parse_args()
    device = cli.device(args.device)
    cli.writable_dir(args.figures, "--figures")
    preset = cli.preset(args.preset)
    if args.replot is not None or args.transformer_only or args.w_third:  # the training modes end in a redraw
        path = cli.replot_path(args, NAME)
        if args.transformer_only:
            run_transformer_only(path, PRESETS[preset], args.jobs, device)
        if args.w_third:
            run_w_third(path, preset, args.jobs)
        replot(path)
        return
    cli.set_threads(args.threads)
    P = dict(PRESETS[preset], transformer=PRESETS[preset]["transformer"] or args.transformer)
    path = os.path.join(args.figures, NAME)
    record = cli.read_json(path, ("runs",), "sa_dynamics.py", flag="the record (sa_dynamics.py writes it first)")
    check_preset(record, preset, path)
    if P["transformer"]:  # the record's transformer runs (hours of training) stay; one fit never mixes two protocols
        check_protocol(record.get("transformer_runs", {}), P)
    cli.announce(preset, f"tau_2Gen at N = {P['N_tau']}, {args.jobs} processes",
                 f"{args.figures}/sa_scaling.png and {NAME}")
    t0 = time.time()
    part = {"preset": preset, **scaling_summary(train_tau_series(P, args.jobs))}
    runs = train_transformers(P, args.jobs, device) if P["transformer"] else {}
    part["seconds_scaling"] = round(time.time() - t0, 1)
    record = {**previous(path), **json.loads(json.dumps(part))}  # sa_dynamics.py's part kept as it is
    if runs or "transformer_runs" in record:  # the transformer's criterion re-read from all its runs
        merge_transformer_runs(record, runs)
    write_json(path, record, indent=1)
    plot_scaling(*dynamics_runs(record), json.loads(json.dumps(record)), os.path.join(args.figures, "sa_scaling.png"))
    printed = ("tau", "tau_ablation", "tau_fits", "final_loss", "loss_2gen", "seconds_scaling")
    print(json.dumps({k: record[k] for k in printed} | ({"transformer_fit": record["transformer_tau"]["fit"]}
                                                        if "transformer_tau" in record else {}),
                     indent=1))
    print(f"wrote {args.figures}/sa_scaling.png and {NAME} in {part['seconds_scaling'] / 60:.1f} min")


if __name__ == "__main__":
    cli.run(main)
