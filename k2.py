"""K2*: transient 2-Gen and partial memorization (Appendix "Transience and Partial Memorization", Figs. 8a-b,
A10). Above K1* a run enters 2-Gen and leaves it for memorization after Delta tau_K steps, which diverges at K2*
(fitted as a (K2* - K)^-gamma, and in the paper's form with a linear offset b + c K); the fraction of memorized
chains has an asymptote that falls with K.

    python k2.py sweep                     # quick preset on the CPU: figures/k2.png and .json
    python k2.py sweep --print-commands    # the paper preset's runs, one command line each
    python k2.py dtau runs/k2_paper        # Delta tau of any K*_s* runs (a grid trained elsewhere)
    python k2.py sweep --replot            # only redraw figures/k2.png from figures/k2.json (or --replot JSON)

Top to bottom: the sweep's runs (PRESETS, k2_runs), its figure (a draw_* per panel, plot_k2 composing them), the
commands (sweep, its redraw, dtau) and their flags.
The analysis of the runs (Delta tau, the divergence fits, epsilon, the memorized fractions corrected by the
fresh-chain null and scored on two sets of sequences) is analysis/memorization.py's, on the rules of
analysis/thresholds.py and the estimators of analysis/estimators.py.
"""
import math
import os
import shlex
import time

import matplotlib.pyplot as plt
import numpy as np

from analysis.estimators import divergence, median_coverage, median_rank
from analysis.memorization import analyze_k2, converged, delta_tau_summary, delta_tau_table
from analysis.runs import run_dirs
from analysis.thresholds import NULL_ALPHA, gaussian_noise_model
from plumbing import cli
from plumbing.records import finite_json
from plumbing.rundir import write_json
from runners.grids import add_grid_flags, grid_args
from runners.probes import finished, probe_command, run_config, run_probes

PRESETS = {
    # sized for the 2-core CPU: the K1* quick setting (N = 64, batch 64, lr 3e-3) with MLPs 8 wide, which store few
    # chains, so that Delta tau diverges inside the K grid within 4000 steps (wider ones: RESULTS.md)
    "quick": dict(N=64, batch=64, lr=3e-3, mlp_width=8, iters=4000, eval_every=100, eval_dense=256, evals=16,
                  eval_train=256, eval_gen=256, per_chain=32, per_chain_tasks=128, Ks=[24, 28, 32, 36, 40, 48], seeds=4,
                  inf_seeds=2, inf_iters=4000, null_chains=256),
    # the paper: N = 256; runs long enough to see Delta tau near K2*; 3 models at K = inf for 10^6 steps, scored
    # on 10^4 fixed chains
    "paper": dict(N=256, batch=128, lr=1e-3, iters=1_000_000, eval_every=1000, eval_dense=1024, evals=60,
                  eval_train=1024, eval_gen=1024, per_chain=64, per_chain_tasks=10_000,
                  Ks=[128, 256, 512, 1024, 2048, 4096], seeds=4, inf_seeds=3, inf_iters=1_000_000, null_chains=1024),
}


# ----------------------------------------------------------------------------- the sweep over K (Figs. 8a-b, A10)


def k2_runs(preset: str, root: str, seeds: list[int], device: str | None = None) -> list:
    """The runs of the K2* experiment, one train.Config each: the preset's K grid x seeds, then the K = inf
    calibration models."""
    p = PRESETS[preset]
    cfgs = [run_config(preset, p, K, seed, os.path.join(root, f"K{K}_s{seed}"), device=device)
            for K in p["Ks"] for seed in seeds]
    return cfgs + [run_config(preset, p, math.inf, seed, os.path.join(root, f"Kinf_s{seed}"), iters=p["inf_iters"],
                              device=device) for seed in range(p["inf_seeds"])]


def per_K(d: dict) -> dict:
    """A per-K dict of analyze_k2's or of k2.json (K as strings), keyed by int K."""
    return {int(K): v for K, v in d.items()}


def one_set_rule(epsilon: float) -> str:
    """The one-set rule in symbols, its epsilon short: e.g. Delta^k < epsilon = -3.8e-4."""
    mantissa, exponent = f"{epsilon:.1e}".split("e")
    return rf"$\Delta^k < \epsilon$ = {mantissa}e{int(exponent)}".replace("-", "−")


def draw_8a(ax, Ks: list[int], dtau: dict, lower: dict, medians: dict, fit: dict, off: dict):
    """Fig. 8a on ax: each seed's Delta tau (gray), the median with its exact interval (an arrow up from its lower
    bound where the median is longer than the run), the seeds still in 2-Gen counted at the bottom, and the two
    divergence fits."""
    for K in Ks:
        seeds = [v for v in dtau[K] if v is not None]
        ax.plot([K] * len(seeds), seeds, ".", color="gray", alpha=0.6)
        med, lo, hi = medians[K]
        if math.isfinite(med):
            ax.errorbar(K, med, yerr=[[med - lo], [min(hi, 10 * med) - med]], fmt="o", color="k", capsize=3)
        elif K in lower:  # longer than the run: an arrow up from its lower bound (what the fit uses)
            ax.annotate("", (K, 2 * lower[K]), (K, lower[K]), arrowprops=dict(arrowstyle="->", color="k"))
        censored = sum(v is None for v in dtau[K])
        if censored:  # still in 2-Gen at the end: Delta tau longer than the run
            ax.annotate(f"{censored}/{len(dtau[K])}", (K, 0.03), ha="center", va="bottom",
                        xycoords=("data", "axes fraction"), fontsize=9)
    n = max(len(dtau[K]) for K in Ks)  # seeds per K
    title = (f"Fig. 8a: time spent in 2-Gen (median; bars: its exact interval from {n} seeds, "
             f"{median_coverage(n, median_rank(n)):.1%})")
    if any(v is None for K in Ks for v in dtau[K]):
        title += "\nk/n at the bottom: seeds still in 2-Gen at the end; arrows: lower bounds"
    if "exponential_rate" in fit:
        title += f"\nno finite K2*: Delta tau ~ exp({fit['exponential_rate']:.3f} K)"
    elif fit["K2_star"] is None:
        title += "\nno fit: " + fit["why"].split(" (")[0][:70]
    ax.set_title(title)
    if fit["K2_star"] is not None:
        grid_K = np.linspace(min(Ks), min(fit["K2_star"] * 0.999, max(Ks) * 1.15), 200)  # the axes' range, up to K2*
        ax.plot(grid_K, divergence(grid_K, fit["log_a"], fit["K2_star"], fit["gamma"]), "k--", lw=1,
                label=f"fit: K2* = {fit['K2_star']:.0f}, gamma = {fit['gamma']:.2f}")
        ax.axvline(fit["K2_star"], color="tab:red", ls=":", lw=1)
    if off["K2_star"] is not None:  # the paper's form, with its linear offset
        grid_K = np.linspace(min(Ks), min(off["K2_star"] * 0.999, max(Ks) * 1.15), 200)
        ax.plot(grid_K, divergence(grid_K, off["log_a"], off["K2_star"], off["gamma"], off["b"], off["c"]), ":",
                color="tab:purple", lw=1, label=f"with offset: K2* = {off['K2_star']:.0f}, gamma = {off['gamma']:.2f}")
    ax.set_xscale("log", base=2)
    ax.set_xlim(min(Ks) / 1.15, max(Ks) * 1.15)  # the arrows and labels of censored K do not autoscale
    shown = [v for K in Ks for v in dtau[K] if v] + list(lower.values())
    bars = [min(hi, 10 * med) for med, lo, hi in medians.values() if math.isfinite(med)]  # the bars' tops
    if shown:  # limits set after the log scale, from the values: a linear autoscale's bottom can be <= 0
        ax.set_yscale("log")
        ax.set_ylim(0.5 * min(shown), 1.5 * max(shown + bars + [2 * max(shown)]))  # every bar and arrow whole
    ax.set_xlabel("K")
    ax.set_ylabel("Delta tau_K = tau_2mem - tau_2gen (steps)")
    if fit["K2_star"] is not None or off["K2_star"] is not None:
        ax.legend(loc="upper left")
    ax.set_xticks(Ks, [str(K) for K in Ks])  # one tick per K: a log-2 axis alone labels only its powers of 2


def draw_8a_inset(ax, Ks: list[int], medians: dict, fit: dict):
    """Fig. 8a's inset on ax: the finite medians against K2* - K in log-log, with the fit's line of slope -gamma."""
    finite = [K for K in Ks if math.isfinite(medians[K][0])]
    x = np.array([fit["K2_star"] - K for K in finite], float)
    y = [medians[K][0] for K in finite]
    fitted = divergence(fit["K2_star"] - x, fit["log_a"], fit["K2_star"], fit["gamma"])
    ax.loglog(x, y, "ko")
    ax.loglog(x, fitted, "k--", lw=1, label=f"slope -gamma = {-fit['gamma']:.2f}")
    for K, xi, yi, on_fit in zip(finite, x, y, fitted):  # each label on the side of its point away from the falling
        above = yi >= on_fit  # fit line: above and right of a point over it, below and left under it
        ax.annotate(f"K = {K}", (xi, yi), xytext=(5, 4) if above else (-5, -4), textcoords="offset points",
                    ha="left" if above else "right", va="bottom" if above else "top", fontsize=8)
    ax.set_xticks(x, [f"{v:.0f}" for v in x])  # K2* - K often spans less than a decade
    ax.set_xticks([], minor=True)
    for lim, lo, hi in ((ax.set_xlim, min(x), max(x)), (ax.set_ylim, min(y), max(y))):
        pad = (hi / lo) ** 0.22 if hi > lo else 1.5  # room in log for the labels by the first and last points
        lim(lo / pad, hi * pad)
    ax.set_xlabel("K2* - K")
    ax.set_ylabel("median Delta tau_K")
    ax.set_title("Fig. 8a inset: the divergence")
    ax.legend(loc="upper right")


def draw_8b(ax, result: dict, Ks: list[int], null: bool):
    """Fig. 8b on ax: per K the seeds' memorized asymptotes (mean and std over the seeds whose sigmoid fit
    converged) and the line in log K to their zero; with the null, by the two-set rule and by the one-set rule."""
    rules = [("_two_sets", "k", "two sets of sequences (the rule)"), ("", "tab:gray", "one set")] if null else \
        [("", "k", None)]
    failed, notes = 0, []
    for suffix, colour, label in rules:
        values = per_K(result["memorized_asymptote" + suffix])
        fitted = {K: converged(values[K]) for K in Ks}  # the seeds whose sigmoid fit converged
        shown = [K for K in Ks if fitted[K]]
        means = [float(np.mean(fitted[K])) for K in shown]
        ax.errorbar(shown, means, yerr=[float(np.std(fitted[K])) for K in shown], fmt="o-", color=colour, capsize=3,
                    label=label)
        zero = result["memorized_zero" + suffix]
        if zero is not None and zero <= 10 * max(Ks):
            top = int(np.argmax(means))
            ax.plot([shown[top], zero], [means[top], 0], "--", color=colour, lw=1,
                    label=f"{label or 'fraction'}: 0 at K = {zero:.0f} (line in log K)")
        elif zero is not None:  # a line that barely falls: its zero is no estimate, said under the title (no line)
            notes.append(f"{label or 'the fraction'}: a line in log K reaches 0 only at K = {zero:.0e}")
        failed = max(failed, sum(len(values[K]) - len(fitted[K]) for K in Ks))
    if ax.get_legend_handles_labels()[0]:  # inside, at the bottom left: the largest fractions are at the small K
        ax.legend(fontsize=8, loc="lower left")
    ax.set_xscale("log", base=2)
    ax.set_xlim(min(Ks) / 1.15, max(Ks) * 1.15)  # the line to the zero crossing runs on beyond: its K is in the legend
    ax.set_xlabel("K")
    ax.set_ylabel("memorized fraction at convergence\n(sigmoid asymptote)")
    ax.set_title("Fig. 8b: fraction of chains memorized" + "".join(f"\n{note}" for note in notes)
                 + (f"\n{failed} seed(s) left out: the sigmoid fit did not converge" if failed else ""),
                 fontsize=11 if not notes and not failed else 10)
    ax.set_xticks(Ks, [str(K) for K in Ks])  # one tick per K: a log-2 axis alone labels only its powers of 2


def draw_a10(ax, Ks: list[int], curves_by_K: dict, null: bool, rule: str):
    """Fig. A10 on ax: the memorized fraction against step, each seed thin and their mean thick, a colour per K; with
    the null the two-set rule's, else the one-set rule's (rule: one_set_rule's)."""
    cmap = plt.get_cmap("viridis")
    color = {K: cmap(i / max(len(Ks) - 1, 1)) for i, K in enumerate(Ks)}
    key = "two_sets" if null else "fraction"
    for K in Ks:
        curves = curves_by_K[K]
        for c in curves:
            ax.plot(np.maximum(c["step"], 1), c[key], color=color[K], lw=0.5, alpha=0.6)
        ax.plot(np.maximum(curves[0]["step"], 1), np.mean([c[key] for c in curves], 0), color=color[K], lw=2,
                label=f"K = {K}")
    ax.set_xscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("memorized: the two-set rule\n(corrected by the fresh-chain null)" if null else
                  f"fraction of trained chains memorized\n({rule})")
    ax.set_title("Fig. A10: memorized fraction over training")
    ax.legend(ncol=2)


def draw_null(ax, result: dict, Ks: list[int], curves_by_K: dict, rule: str):
    """The fresh-chain null on ax, per K at the end of the runs (seed means): the one-set rule on the trained chains
    (S, the K chains a model trained on) and on fresh chains, the chain-specific advantage, and the scores' own noise
    (S's chains on two sets of sequences)."""
    def at_end(key):
        return [float(np.mean([c[key][-1] for c in curves_by_K[K]])) for K in Ks]

    ax.plot(Ks, at_end("fraction_raw"), "ko-", label=f"trained chains memorized\n({rule}, one set)")
    ax.plot(Ks, at_end("false_positive"), "x--", color="tab:red",
            label="fresh chains passing that rule\n(false positives)")
    ax.plot(Ks, at_end("specific"), "s:", color="tab:blue",
            label=f"trained chains below the fresh chains'\n{NULL_ALPHA:.0%} quantile of $\\Delta^k$ (corrected)")
    ax.plot(Ks, at_end("disagree"), "^-", color="tab:orange",
            label="trained chains passing on only one\nof the two sets of sequences")
    ax.plot(Ks, at_end("signal_share"), "v-.", color="tab:green",
            label="share of the spread of the trained\nchains' $\\Delta^k$ that is not noise")
    ax.plot(Ks, at_end("two_sets_raw"), "D-", color="tab:purple",
            label="trained chains memorized by the\ntwo-set rule (uncorrected)")
    ax.set_xscale("log", base=2)
    ax.set_xticks(Ks, [str(K) for K in Ks])
    ax.set_ylim(-0.05, 1.05)
    ax.set_xlabel("K")
    ax.set_ylabel("fraction of chains at the end")
    eps = result["epsilon"]
    ax.set_title(f"the null: each model on its K trained chains and on {result['null']['chains']} fresh "
                 f"chains\n($\\epsilon$ from {len(eps['per_model'])} models at K = inf)", fontsize=10)


def draw_epsilon(ax, eps: dict):
    """epsilon's calibration on ax, for a sweep scored without the null: the K = inf models' Delta^k on fixed fresh
    chains and epsilon = their mean - 2 std."""
    ax.hist(eps["scores"], bins=40, color="tab:blue")
    ax.axvline(eps["value"], color="tab:red", ls="--",
               label=f"$\\epsilon$ = mean − 2 std\n= {eps['value']:.3g}".replace("-", "−"))
    ax.set_xlabel("$\\Delta^k$ of K = inf models on fixed fresh chains\n(loss above 2-Gen's on chain k)")
    ax.set_ylabel("chains")
    ax.set_title(f"$\\epsilon$ from {len(eps['per_model'])} models at K = inf\nmean {eps['mean']:.3g}, std {eps['std']:.3g}")


def plot_k2(result: dict, path: str):
    """Fig. 8a (Delta tau against K with the divergence fit, and against K2* - K), Fig. 8b (memorized
    asymptotes against K), Fig. A10 (memorized fraction against step) and, below them, the fresh-chain null at the
    end of the runs (epsilon's calibration for a sweep scored without it). result: analyze_k2's, or k2.json as
    loaded (K as strings, null for an unbounded value). The inset is left out when there is no finite K2* to plot
    against."""
    Ks, fit = [int(K) for K in result["K"]], result["fit"]
    medians = {K: (math.nan if m is None else m, math.nan if lo is None else lo, math.inf if hi is None else hi)
               for K, (m, lo, hi) in per_K(result["median"]).items()}
    curves_by_K = per_K(result["memorized_curves"])
    # a sweep scored without the fresh-chain null and the second set of sequences (figures/k2_width*.json) has
    # neither's numbers: one rule, uncorrected, and epsilon's calibration in the null's panel
    null = "null" in result
    rule = one_set_rule(result["epsilon"]["value"])
    with plt.rc_context({"font.size": 11, "axes.titlesize": 11, "legend.fontsize": 9}):
        # 1300 px: read at a README's ~900 px width. Constrained layout, each row its own grid, three rows: Fig. 8a
        # and its inset; Fig. 8b and A10; the null, its legend in a slot of its own beside it (in two rows the
        # legend's width leaves Fig. 8b's K ticks touching)
        fig = plt.figure(figsize=(13, 12.6), layout="constrained")
        rows = fig.add_gridspec(3, 1)
        top, middle = rows[0].subgridspec(1, 2, width_ratios=[2, 1]), rows[1].subgridspec(1, 2)
        bottom = rows[2].subgridspec(1, 2, width_ratios=[1.6, 1])
        ax8a = fig.add_subplot(top[0] if fit["K2_star"] is not None else rows[0])
        inset = fig.add_subplot(top[1]) if fit["K2_star"] is not None else None
        ax8b, ax10 = fig.add_subplot(middle[0]), fig.add_subplot(middle[1])
        axeps, keys = fig.add_subplot(bottom[0]), fig.add_subplot(bottom[1])
        keys.axis("off")
        draw_8a(ax8a, Ks, per_K(result["delta_tau"]), per_K(result["median_lower_bound"]), medians, fit,
                result["fit_offset"])
        if inset is not None:
            draw_8a_inset(inset, Ks, medians, fit)
        draw_8b(ax8b, result, Ks, null)
        draw_a10(ax10, Ks, curves_by_K, null, rule)
        if null:
            draw_null(axeps, result, Ks, curves_by_K, rule)
        else:
            draw_epsilon(axeps, result["epsilon"])
        keys.legend(*axeps.get_legend_handles_labels(), loc="center left", fontsize=9)  # beside: no point hidden
        width = f"MLPs {result['mlp_width']} wide" if result["mlp_width"] else "MLPs 4 D wide"  # 0: the paper's 4 D
        fig.suptitle(f"K2*: transient 2-Gen and partial memorization (preset {result['preset']}, N = {result['N']}, "
                     f"{width}, {result['iters']} steps)", fontsize=12)
        fig.savefig(path, dpi=100)
    plt.close(fig)


def k2(args):
    """The default command: the preset's (K, seed) runs trained where missing, Delta tau_K and the memorized fractions
    analysed (analysis/memorization.py), K2* fitted (Figs. 8a-b, A10); figures/k2.png and .json (--replot: from it)."""
    if args.replot is not None:
        return replot(args)
    preset, root, p, jobs, device, seeds = grid_args(args, PRESETS, "k2")
    cfgs = k2_runs(preset, root, seeds, device)
    if args.print_commands:
        print("\n".join(shlex.join(probe_command(cfg)) for cfg in cfgs if not finished(cfg)))
        return
    cli.writable_dir(args.figures, "--figures")
    todo = [cfg for cfg in cfgs if not finished(cfg)]
    cli.announce(preset, f"K2*: {len(cfgs)} runs of {p['iters']} steps ({len(todo)} to train) in {root}",
                 f"{args.figures}/k2.png and .json")
    t0 = time.time()
    run_probes(cfgs, jobs)
    result = {"preset": preset, "N": p["N"], "mlp_width": p.get("mlp_width", 0), "iters": p["iters"], "seeds": seeds,
              **analyze_k2(cfgs, p["null_chains"], jobs),
              "minutes_this_call": round((time.time() - t0) / 60, 1)}  # finished runs are reused, not timed
    plot_k2(result, os.path.join(args.figures, "k2.png"))
    write_json(os.path.join(args.figures, "k2.json"), finite_json(result), indent=1)
    fit = result["fit"]
    for K in result["K"]:
        print(f"K = {K}: Delta tau {result['delta_tau'][K]}, memorized asymptote (two sets; one set) "
              f"{[a if a is None else round(a, 3) for a in result['memorized_asymptote_two_sets'][K]]}; "
              f"{[a if a is None else round(a, 3) for a in result['memorized_asymptote'][K]]}"
              + (f" (seeds {result['memorized_not_converged'][K]}: the sigmoid fit did not converge)"
                 if result["memorized_not_converged"][K] else ""))
    for name, f in (("fit", fit), ("fit with the linear offset", result["fit_offset"])):
        print(f"{name}: K2* = {f['K2_star']} ({f['K2_star_ci']}), gamma = {f['gamma']} ({f['gamma_ci']}); nominal 95 % "
              f"bootstrap intervals over {f.get('seeds')} seeds per K"
              + ("" if f["K2_star"] else f"; {f.get('why', '')}"))
    print(f"memorized fraction reaches 0 at K = {result['memorized_zero_two_sets']} (the two-set rule), "
          f"{result['memorized_zero']} (one set); epsilon {result['epsilon']['value']:.4g}")
    print(f"wrote {args.figures}/k2.png and k2.json in {result['minutes_this_call']} min")


def replot(args):
    """sweep --replot [JSON]: redraw a sweep's figure from its JSON (bare: FIGURES/k2.json), the PNG beside it; then
    the memorized fractions at the end (memorized_at_the_end)."""
    cli.replot(args, "k2.json", ("K", "fit", "fit_offset", "delta_tau", "median", "memorized_curves", "epsilon",
                                 "mlp_width"), "k2.py sweep", plot_k2, after=memorized_at_the_end)


def memorized_at_the_end(result: dict):
    """Per K at the end (seed means, raw): one set's fraction, the two-set rule's, and a Gaussian model's prediction
    of the latter and of the noise-free fraction (gaussian_noise_model); nothing for a sweep scored on one set
    (figures/k2_width*.json: no second set, no noise to model)."""
    for K in result["K"] if "null" in result else []:
        cs = result["memorized_curves"][str(K)]
        model = [gaussian_noise_model(c["fraction_raw"][-1], c["sigma"][-1], c["signal_share"][-1],
                                      result["epsilon"]["value"]) for c in cs]
        print(f"K = {K} at the end: one set {np.mean([c['fraction_raw'][-1] for c in cs]):.2f}, two-set rule "
              f"{np.mean([c['two_sets_raw'][-1] for c in cs]):.2f}; Gaussian model: two-set rule "
              f"{np.mean([m['two_sets'] for m in model]):.2f}, noise-free {np.mean([m['noise_free'] for m in model]):.2f}")


def dtau(args):
    """dtau ROOT: Delta tau of the runs in ROOT (delta_tau_table), or of the per-run rows of a JSON this command
    wrote; printed, and written to --json."""
    if os.path.isfile(args.root):  # a JSON this command wrote: its analysis redone from its per-run rows
        saved = cli.read_json(args.root, ("runs",), "k2.py dtau", flag="dtau")
        try:
            for r in saved["runs"]:  # rows without censored_after, as bench/results/*_k2_paper_f.json's
                r.setdefault("censored_after", r["iters"] - r["tau_2gen"] if r["status"] == "censored" else None)
            result = delta_tau_summary(saved["runs"])
        except (AttributeError, KeyError, TypeError, ValueError) as e:  # AttributeError: a row that is no object
            raise ValueError(f"dtau: {args.root} does not hold k2.py dtau's per-run rows ({type(e).__name__}: {e})") \
                from None
        result = {"root": saved.get("root", args.root), **result}  # where the runs were, not this JSON
    else:
        found = run_dirs(args.root)
        if not found:
            raise ValueError(f"{args.root!r} holds no run directories (each with a metrics.jsonl)")
        result = delta_tau_table(found)
    for r in result["runs"]:
        print(f"{r['run']:>12}: tau_2gen {r['tau_2gen']}, tau_2mem {r['tau_2mem']}, Delta tau {r['delta_tau']} ({r['status']})")
    for K in result["K"]:
        m, lo, hi = result["median_ci"][K]
        print(f"K = {K}: Delta tau {result['delta_tau'][K]}, median {m:g} [{lo:g}, {hi:g}] "
              f"({result['median_coverage'][K]:.1%}, exact)")
    print(f"fit: {result['fit']}")
    print(f"fit with the linear offset: {result['fit_offset']}")
    print(f"line through the medians: {result['line']}")
    if args.json:
        write_json(args.json, finite_json({"root": args.root} | result), indent=1)
        print(f"wrote {args.json}")


# ----------------------------------------------------------------------------- the command line


def add_sweep(sub):
    """k2.py sweep (k2): its flags."""
    p = sub.add_parser("sweep", help="Delta tau_K, its divergence at K2*, memorized fractions and epsilon (Fig. 8a, 8b, A10)",
                       runs="Default run: 87 min 9 s on the 2-core development VM, shared for its first hour "
                            "(2026-11-27): the runs ~69 min, then 18.3 min of scores (quick preset: K = 24, 28, 32, 36, "
                            "40, 48 x seeds 0-3 and 2 runs at K = inf, N = 64, MLPs 8 wide, 4000 steps); writes "
                            "runs/k2_quick/K<K>_s<seed>/ (config.json, metrics.jsonl, per_chain*.jsonl, ckpt.pt, "
                            "model_<step>.pt), figures/k2.png and figures/k2.json; a rerun reuses them, ~10 s.\n"
                            "--replot: seconds, trains nothing.")
    cli.add_preset(p, PRESETS, "quick: calibrated on the CPU, N = 64, MLPs 8 wide, 4000 steps, K = 24..48; "
                               "paper: N = 256, 10^6 steps, K = 128..4096, needs a GPU")
    p.add_argument("--root", default=None, help="where the runs go (default runs/k2_<preset>)")
    add_grid_flags(p, "seeds at every K (default: 0-3)")
    cli.add_replot(p, "FIGURES/k2.json", "a sweep's figure (figures/k2*.json)")


def add_dtau(sub):
    """k2.py dtau (dtau): its flags."""
    p = sub.add_parser("dtau", help="Delta tau_K, its medians and the divergence fit of the runs K*_s*/ in ROOT (any flags)",
                       runs="Default run: none, ROOT is required; about 10 s on the 2-core development VM (an estimate: "
                            "a rerun of sweep on its cached scores, this analysis and more, ~10 s), trains nothing; reads "
                            "ROOT/K*_s*/metrics.jsonl and writes only --json FILE (e.g. figures/dtau_paper_h100.json).")
    p.add_argument("root", help="a directory of train.py runs with dense rows, e.g. a grid's --out, or a JSON this "
                   "command wrote (its analysis redone from the per-run rows)")
    p.add_argument("--json", default=None, help="also write everything to this JSON file")


def main():
    parser = cli.ArgumentParser(description=__doc__.split("\n\n")[0], runs=(
        "Default run: k2.py sweep, 87 min 9 s on the 2-core development VM (2026-11-27); writes figures/k2.png and "
        "figures/k2.json and its runs under runs/k2_quick/ (dtau: its --help)."))
    sub = parser.add_subparsers(dest="command", required=True)
    add_sweep(sub)
    add_dtau(sub)
    args = parser.parse_args()
    cli.set_threads(getattr(args, "threads", None))
    {"sweep": k2, "dtau": dtau}[args.command](args)


if __name__ == "__main__":
    cli.run(main)
