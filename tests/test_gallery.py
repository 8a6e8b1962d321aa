"""Every number in the gallery (RESULTS.md's in full, README.md's captions) and in RESULTS.md's result tables,
recomputed from the committed file it comes from (figures/*.json, ledgers/, bench/results/), so that a quoted number
and its file cannot drift apart.

The numbers are read out of the text, not copied here: `numbers` takes every decimal number of a gallery row's
"ours" part (after the " / ") or of a table row, once the names that carry digits are set aside (A1, MLP2's, K1*,
2-Gen, phi_beta(2), 5-NN, dates). Each row's list must equal, in order, the list computed below from its file and
formatted as the text quotes it (its digits, its sign), so a number changed by one unit in its last digit, a
number added without its computation, or a file whose numbers move, fails. Where a table's header or first cell
picks what is shown (which K, which steps), the spec reads that choice from the text and recomputes the rest.
"""
import json
import math
import os
import re
import statistics
from fractions import Fraction

import numpy as np
import pytest

import circuits as circuit_tracing
import sa_dynamics as sd
import sa_scaling as sa
import tau_settings as ts
from analysis import sa_fits, thresholds
from analysis.sa_record import PRESETS
from analysis.estimators import censored_median, median_ci, median_coverage, median_rank
from analysis.thresholds import NULL_ALPHA, PHI_STAR
from analysis.transformer_tau import chain_steps, tau_2gen_drop
from bayes import PREDICTORS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

NOT_QUANTITIES = (
    r"\d{4}-\d{2}-\d{2}",             # dates
    r"\b[12]-(?:Gen|Mem)\b",          # the predictors
    r"\b\d+-(?:NN|point)\b",          # 5-NN, 1-point statistics
    r"\blag-\d+\b",
    r"[A-Za-z_]+\d+[\w*']*",          # A1, MLP2's, Att2K, K1*, K2_hat, F_1, log2, H100
    r"(?<=[A-Za-z_])\(\d\)",          # phi_beta(2), n_A(1)
)
NUMBER = re.compile(r"[+−]?\d{1,3}(?:,\d{3})+(?:\.\d+)?|[+−]?\d+(?:\.\d+)?")


def numbers(text: str) -> list[str]:
    """The quoted numbers of a piece of text, as written (sign and digits), in order."""
    for pattern in NOT_QUANTITIES:
        text = re.sub(pattern, " ", text)
    return NUMBER.findall(text)


def test_numbers_reads_quantities_and_not_names():
    assert numbers("A2(MLP1)→MLP2 0.385; 2-Gen's phi_beta(2) −0.030 at step 1131, ×1.11–1.25, 12,000 steps, "
                   "K1* = 32 (2026-11-27, H100), 5-NN 0.47, t<sup>0.85</sup>") == [
        "0.385", "−0.030", "1131", "1.11", "1.25", "12,000", "32", "0.47", "0.85"]


# ----------------------------------------------------------------------------- formats and files


def f(x: float, digits: int) -> str:
    return f"{x:.{digits}f}".replace("-", "−")


def signed(x: float, digits: int) -> str:
    return f"{x:+.{digits}f}".replace("-", "−")


def n(x) -> str:
    return str(int(round(x)))


def load(path: str) -> dict:
    with open(os.path.join(ROOT, path if "/" in path else os.path.join("figures", path))) as fh:
        return json.load(fh)


def closest(row: dict) -> str:
    return min(PREDICTORS, key=lambda q: row[f"kl_{q}"])


def geomean(values) -> float:
    return float(np.exp(np.mean(np.log(values))))


# ----------------------------------------------------------------------------- the gallery (README.md)


def gallery_rows(column: str = "ours", readme: bool = False) -> dict:
    """{figure: the "ours" part of its row} of RESULTS.md's full gallery (readme=True: of README.md's one-line
    gallery); column "scale": its scale cell, without the paper's settings in "(paper: ...)" and the dates."""
    path, heading = ("README.md", "## Gallery") if readme else ("RESULTS.md", "## The gallery in full")
    with open(os.path.join(ROOT, path)) as fh:
        text = fh.read().split(heading, 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in text.splitlines():
        if line.startswith("| ["):
            cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
            figure = re.match(r"\[([^\]]+)\]", cells[0]).group(1)
            if column == "scale":
                rows[figure] = re.sub(r"\(paper: [^)]*\)|\d{4}-\d{2}-\d{2}(?: and \d{2})?", " ", cells[3])
                continue
            shows = cells[2].replace("N / log N", "N ÷ log N")  # the paper's law, not the separator
            rows[figure] = shows.split(" / ", 1)[1].replace("N ÷ log N", "N / log N")
    return rows


def predictor_scaling():
    d = load("predictor_scaling.json")
    mem, gen = (np.array(d["loss_vs_K"][p]["mean"]) for p in ("1mem", "2gen"))
    i = int(np.argmax(mem > gen)) - 1  # the last K where 1-Mem is below 2-Gen; the next is above
    return [f(mem[i], 3), f(gen[i], 3), n(d["K"][i]), f(mem[i + 1], 3), f(gen[i + 1], 3), n(d["K"][i + 1])]


def fig2a(K: int) -> tuple[list, dict]:
    rows = load(f"fig2a_K{K}.json")["rows"]
    return rows, rows[-1]


def first_step(rows, rule) -> int:
    return next(r["step"] for r in rows if rule(r))


def fig2a_K256():
    rows, last = fig2a(256)
    return [f(PHI_STAR, 2), n(first_step(rows, lambda r: r["phi_beta_2"] > PHI_STAR)), f(last["gen_loss"], 3),
            f(last["gen_loss_2gen"], 3)]


def fig2a_K1024():
    rows, last = fig2a(1024)
    return [signed(last["train_loss"] - last["train_loss_2gen"], 3), signed(last["gen_loss"] - last["gen_loss_2gen"], 3),
            f(max(r["phi_beta_2"] for r in rows), 2)]


def fig2a_K16():
    _, last = fig2a(16)
    below, above = last["train_loss_2gen"] - last["train_loss"], last["gen_loss"] - last["gen_loss_2gen"]
    assert below > 0 and above > 0
    return [f(below, 3), f(above, 3)]


def fig2a_K64():
    rows, last = fig2a(64)
    below = first_step(rows, lambda r: r["train_loss"] < r["train_loss_2gen"])
    assert all(r["train_loss"] < r["train_loss_2gen"] for r in rows if r["step"] >= below)  # from then on
    return [n(first_step(rows, lambda r: r["phi_beta_2"] > PHI_STAR)), f(max(r["phi_beta_2"] for r in rows), 2),
            n(below), f(last["train_loss"] - last["train_loss_2gen"], 3), n(last["step"])]


def sweep_phases() -> dict:
    """fig2bc.json: {K: the closest predictor at each step}."""
    d = load("fig2bc.json")
    return d, {K: [min(PREDICTORS, key=lambda q: d[f"kl_{q}"][i][j]) for j in range(len(d["step"]))]
               for i, K in enumerate(d["K"])}


def fig2bc():
    d, phases = sweep_phases()
    g2 = [K for K in d["K"] if "2gen" in phases[K]]
    assert phases[g2[0]][-1] == "2gen"  # at K = 64 2-Gen is still the closest; memorizing shows in L_train

    def plateau_1mem(K):  # closer to 1-Mem than to 1-Gen at every evaluation before it enters 2-Gen
        i, end = d["K"].index(K), phases[K].index("2gen") if "2gen" in phases[K] else len(d["step"])
        return all(d["kl_1mem"][i][j] < d["kl_1gen"][i][j] for j in range(end))

    mem_from = min(K for K in d["K"] if all(plateau_1mem(k) for k in d["K"] if k >= K))
    return [n(min(d["K"])), n(max(d["K"])), n(g2[0]), n(mem_from)]


def circuits():
    phases = load("circuits.json")["phases"]
    others = min(phases[p]["ratio"] for p in ("2gen", "1mem", "2mem"))
    return [f(phases["1gen"]["ratio"], 2), f(math.floor(others * 10) / 10, 1)]


def task_vectors():
    p = load("task_vectors.json")["patching_2mem"]
    return [f(p["S_B + phi_A"]["AB"], 2), f(p["S_B"]["BB"], 2)]


def circuits_paper():
    phases = load("circuits_paper.json")["phases"]
    gen = phases["2gen"]["importance"]
    assert max(gen, key=gen.get) == "A2(MLP1)->MLP2"
    return [f(gen["A2(MLP1)->MLP2"], 3), n(phases["2gen"]["step"]), n(phases["2gen"]["rule_checkpoint"]["step"]),
            f(phases["1mem"]["closest"]["ratio"], 2), f(phases["2mem"]["closest"]["ratio"], 2)]


def task_vectors_paper():
    d = load("task_vectors_paper.json")
    p, last = d["patching_2mem"], str(d["checkpoints"]["2mem"]["step"])
    (K,) = d["information"]
    return [K, f(p["S_A"]["BB"], 3), f(p["S_A + phi_B"]["BB"], 3), f(p["S_A"]["BA"], 3), f(p["S_A + phi_B"]["BA"], 3),
            f(d["information"][K][last], 3), f(d["separability"][last], 2)]


def fig2a_paper():
    ledger = load("ledgers/circuits_paper.json")
    final, Ks, rows = load("circuits_paper.json")["final"], ledger["spec"]["Ks"], ledger["pieces"][0]["runs"]["mem"]["rows"]
    return [n(Ks["gen"]), f(final["gen"]["kl_2gen"], 3), n(Ks["mem"]), n(first_step(rows, lambda r: closest(r) == "2gen")),
            n(first_step(rows, lambda r: r["train_loss"] < r["train_loss_2gen"]))]


def grid_brackets(K: dict) -> dict:
    """{seed: (largest K without the head, smallest K with it)} of a fixed grid's per-K max phi_beta(2)."""
    Ks = sorted(K, key=int)
    seeds = K[Ks[0]]["seed"]
    return {s: (max([int(k) for k in Ks if K[k]["max_phi_beta"][i] <= PHI_STAR], default=None),
                min([int(k) for k in Ks if K[k]["max_phi_beta"][i] > PHI_STAR], default=None)) for i, s in enumerate(seeds)}


def k1():
    d, w01 = load("k1.json"), load("k1_grid_w0.1.json")
    median = statistics.median(r["K1_star"] for r in d["seeds"]["control"])
    assert [r["bound"] for r in d["seeds"]["inject"]] == ["above"] * len(d["seeds"]["inject"])  # no head at the top
    half, tenth = Fraction(d["weight"]).limit_denominator(100), Fraction(w01["weight"]).limit_denominator(100)
    brackets = list(grid_brackets(load("k1_grid_h100.json")["table"]["control"]).values())
    common = max(set(brackets), key=brackets.count)
    assert (brackets.count(common), len(brackets)) == (3, 4)  # "for three seeds of four"
    return [n(median), n(d["search"]["hi"] / median), str(half.numerator), str(half.denominator), str(tenth.numerator),
            str(tenth.denominator), n(common[0]), n(common[1])]


def k1_grid_h100():
    K = load("k1_grid_h100.json")["table"]["control"]
    Ks = sorted(K, key=int)
    return [n(K[k]["heads"]) for k in Ks] + [n(len(K[Ks[0]]["seed"]))] + Ks


def k1_grid_w01():
    d = load("k1_grid_w0.1.json")
    t, b = d["table"], d["brackets"]
    only_control = [K for K in d["K"] if t["control"][str(K)]["heads"] == len(d["seeds"]) and t["reweight"][str(K)]["heads"] == 0]
    both = [K for K in d["K"] if t["control"][str(K)]["heads"] == t["reweight"][str(K)]["heads"] == len(d["seeds"])]
    (lo, hi), = {tuple(v) for v in b["reweight"].values()}
    (control_hi,) = {v[1] for v in b["control"].values()}
    assert {v[0] for v in b["control"].values()} == {None}
    iters = {r["iters"] for r in d["runs"] if r["condition"] == "reweight"}
    return [n(only_control[0]), f"{iters.pop():,}", n(both[0]), n(lo), n(hi), n(control_hi)]


def k1_paper():
    d = load("k1_paper.json")
    control = d["seeds"]["control"]
    done = [s for s in control if s["done"]]
    running = next(s for s in control if not s["done"])
    return ([n(sum(s["probes"] for c in d["seeds"].values() for s in c))] + [n(s["seed"]) for s in done]
            + [n(s["K1_star"]) for s in done] + [n(running["seed"]), n(running["bracket"][0]), n(running["bracket"][1])])


def k2():
    d = load("k2.json")
    Ks = d["K"]

    def end(key: str, K: int) -> str:  # the seeds' mean at the end of the runs
        return f(np.mean([r[key] for r in d["runs"] if r["K"] == K]), 2)

    # the K whose median a resample can lose: finite, with a seed still in 2-Gen; the share of resamples that draw
    # that seed twice or more of its n (its median then beyond the run)
    K_c = next(K for K in Ks if d["median"][str(K)][0] is not None and None in d["delta_tau"][str(K)])
    seeds = d["delta_tau"][str(K_c)]
    p, m = seeds.count(None) / len(seeds), len(seeds)
    lost = 1 - (1 - p) ** m - m * p * (1 - p) ** (m - 1)

    def noise_free(K: int) -> str:  # the Gaussian model's noise-free fraction at the end, the seeds' mean
        return f(np.mean([thresholds.gaussian_noise_model(c["fraction_raw"][-1], c["sigma"][-1], c["signal_share"][-1],
                                                         d["epsilon"]["value"])["noise_free"]
                          for c in d["memorized_curves"][str(K)]]), 2)

    return [n(d["fit"]["K2_star"]), n(d["fit"]["K2_star_ci"][0]), n(len(d["delta_tau"][str(Ks[0])])), n(100 * lost),
            n(K_c), f(d["fit"]["gamma"], 1), f(d["fit"]["gamma_ci"][0], 1), end("memorized_final", Ks[0]),
            end("memorized_final", Ks[-1]), end("memorized_two_sets_final", Ks[0]), end("memorized_two_sets_final", Ks[-1]),
            noise_free(Ks[0]), noise_free(Ks[-1]), n(d["memorized_zero"])]


def k2_no_fit(name: str):
    d = load(name)
    assert d["fit"]["K2_star"] is None  # no finite K2*
    return d


def k2_width32_3000():
    return [n(round(k2_no_fit("k2_width32_3000.json")["memorized_zero"], -1))]


def k2_width32_5000():
    d = k2_no_fit("k2_width32_5000.json")
    finite = [K for K in d["K"] if d["median"][str(K)][0] is not None]
    return [n(finite[-1]), n(min(K for K in d["K"] if all(v is None for v in d["delta_tau"][str(K)])))]


def k2_width256_4000():
    d = k2_no_fit("k2_width256_4000.json")
    assert sum(d["median"][str(K)][0] is not None for K in d["K"]) == 3  # three finite medians
    return [n(round(d["memorized_zero"], -1))]


def sa_dynamics():
    w = load("sa_scaling.json")["w_final"]
    return [f(w[0], 3), f(w[2], 2)]


def sa_parameters():
    run = load("sa_scaling.json")["runs"]["full_control"][0]
    t = max(run["snapshots"], key=int)
    return [f(sd.normalized_parameters(run["snapshots"][t])["P1"][1], 2), t]


def sa_theory():
    d = load("sa_scaling.json")
    return [f(d["F1_mc"], 5), f(d["F1_exact"], 5)]


def delta_at_beta(runs: list, beta: float = 1.0) -> float:
    """delta of the seed-mean trajectory where its beta first reaches `beta` (linear between evaluations)."""
    _, b = sa_fits.seed_mean(runs, "beta")
    _, d = sa_fits.seed_mean(runs, "delta")
    i = int(np.argmax(b >= beta))
    return float(np.interp(beta, b[: i + 1], d[: i + 1]))


def sa_trajectories():
    runs = load("sa_scaling.json")["runs"]
    return [f(delta_at_beta(runs["reduced_ablation"]), 2), f(delta_at_beta(runs["reduced_control"]), 2), "1"]


def sa_scaling():
    d = load("sa_scaling.json")
    e, fits, tt = d["exponents"], d["tau_fits"], d["transformer_tau"]
    Ns = list(tt["N"])
    drop, head = tt["fit"], tt["fit_head"]
    line, head_line = drop["vs_N_over_logN"], head["vs_N_over_logN"]
    seeds = PRESETS["paper"]["seeds_transformer"]  # an N with fewer is said so: "k of its 8 seeds"
    windows = e["full_ablation"]["delta"].values()
    agree = max(fits[k]["slope_vs_N_over_logN_range"][1] - fits[k]["slope_vs_N_over_logN_range"][0]
                for k in ("tau", "tau_ablation"))
    held = [v[key]["0.05-0.5"] for by_N in d["w_third"]["exponents"].values() for v in by_N.values()
            for key in ("beta",)]
    held_delta = [by_N["ablation"]["delta"]["0.05-0.5"] for by_N in d["w_third"]["exponents"].values()]
    return [f(e["full_ablation"]["beta"]["0.05-0.5"], 1), f(e["full_ablation"]["delta"]["0.05-0.5"], 2),
            f(min(windows), 2), f(max(windows), 2), f(min(d["exponents_seeds"]["full_ablation"]["delta"]), 2),
            f(max(d["exponents_seeds"]["full_ablation"]["delta"]), 2), n(len(d["exponents_seeds"]["full_ablation"]["delta"])),
            f(e["full_control"]["beta"]["0.05-0.5"], 1), f(e["full_control"]["delta"]["0.05-0.5"], 2),
            "1", "3", f(min(held), 2), f(max(held), 2), f(min(held_delta), 2), f(max(held_delta), 2),  # w at 1/3
            f(fits["tau"]["slope_vs_N_over_logN"], 2), f(fits["tau_ablation"]["slope_vs_N_over_logN"], 2),
            f(fits["tau"]["slope_vs_N_over_HN"], 2), f(fits["tau_ablation"]["slope_vs_N_over_HN"], 2), f(agree, 3),
            n(seeds)] + [n(head["N"][N]["median"]) for N in Ns] + Ns \
        + [f(head_line["slope"], 2), f(head_line["slope_ci"][0], 2), f(head_line["slope_ci"][1], 2)] \
        + [n(drop["N"][N]["median"]) for N in Ns] \
        + [f(line["slope"], 2), f(line["slope_ci"][0], 2), f(line["slope_ci"][1], 2), Ns[0], Ns[-1]] \
        + sum(([n(drop["N"][N]["seeds"]), n(seeds)] for N in Ns if drop["N"][N]["seeds"] < seeds), []) \
        + [n(N) for N in PRESETS["paper"]["N_transformer"] if str(N) not in tt["N"]]  # what awaits a GPU


def mem_depth_ratios(name: str, min_D_phi: int = 0) -> dict:
    g = {k: {int(D): geomean(v) for D, v in by.items()} for k, by in load(name)["K2_hat"].items()}
    Ds = [D for D in g["1,1"] if D >= min_D_phi]
    return g, {"MLP2": [g[f"{l1},2"][D] / g[f"{l1},1"][D] for l1 in (1, 2) for D in Ds],
               "MLP1": [g[f"2,{l2}"][D] / g[f"1,{l2}"][D] for l2 in (1, 2) for D in Ds]}


def mem_heatmaps():
    g, r = mem_depth_ratios("mem_minimal.json")
    every = [v for by in g.values() for v in by.values()]
    return [f(min(every), 1), f(max(every), 1), f(min(r["MLP2"]), 2), f(max(r["MLP2"]), 2), f(min(r["MLP1"]), 2),
            f(max(r["MLP1"]), 2)]


def mem_depths_6000():
    g, _ = mem_depth_ratios("mem_depths_6000.json")
    _, r = mem_depth_ratios("mem_depths_6000.json", min_D_phi=8)
    every = [v for by in g.values() for v in by.values()]
    return [f(min(every), 1), f(max(every), 1), f(min(r["MLP2"]), 2), f(max(r["MLP2"]), 2), "8"]


def mem_trend():
    d = load("mem_trend.json")
    return [n(d["K"]), n(d["D_phi"]), f(d["train_minus_2gen"][-1], 3), n(d["iters"][-1])]


def tau_settings():
    d = load("tau_settings.json")
    c, hybrids = d["compare"], d["hybrids"]

    def head(name):
        return [f(c[name]["summary"]["fit_head"]["vs_N_over_logN"]["slope"], 2)]

    def law(fit):  # offset_fit's c with its interval
        return [f(fit["c"], 0), f(fit["c_ci"][0], 0), f(fit["c_ci"][1], 0)]

    def ratios(name):  # its heads as multiples of the record's runs of the same (N, seed)
        return [r for by_seed in c[name]["head_vs_baseline"].values() for r in by_seed.values()]

    def hybrid(name):  # an SA-side rung's slope and its law's part
        return [f(hybrids[name]["vs_N_over_logN"]["slope"], 2), f(hybrids[name]["offset"]["c"], 0)]

    own = ("record", "drive1", "drive1_keys", "unigram_free", "frozenWU", "bounded_readout", "final_norm",
           "readout_first", "readout_first_drive1", "readout_first_frozenWU")
    screen = [name for name in d["runs"] if name not in own]  # "record" extends the record; the others have their
    # own seeds
    keys = d["runs"]["drive1_keys"]  # and drive1 on the runs' (N, seed) the key-path rung has, fitted alike
    paired = sa_fits.offset_fit({N: [tau_2gen_drop(d["runs"]["drive1"][N][s])["head"] for s in by_seed]
                                 for N, by_seed in keys.items()})
    seeds = sorted({len(by_seed) for name in screen for by_seed in d["runs"][name].values()})  # "2", or "1–2"
    drive_seeds = [len(by_seed) for by_seed in d["runs"]["drive1"].values()]
    Ns = sorted({int(N) for name in screen for N in d["runs"][name]})
    softmax = [hybrids[name] for name in hybrids if name.startswith("sa_softmax")]
    slopes = [h["vs_N_over_logN"]["slope"] for h in softmax]
    laws, offsets = [h["offset"]["c"] for h in softmax], [h["offset"]["T0"] for h in softmax]
    flat, sa = hybrids["sa_drive_flat"], hybrids["sa"]  # the converse, against the SA-transformer's medians
    later = [N for N in sorted(flat["N"], key=int) if int(N) > flat["predicted"]["N0"]]
    measured = [flat["N"][N]["median"] / sa["N"][N]["median"] for N in later]
    full = d["record_full"]  # the record at every N, with the N = 512 runs of the record setting
    free = d["runs"]["unigram_free"]  # no head by the cap at each N it was run at: the cap, then the N
    assert all(tau_2gen_drop(r)["head"] is None for by_seed in free.values() for r in by_seed.values())
    free = [n(ts.CAPS["unigram_free"])] + sorted(free, key=int)
    assert all(tau_2gen_drop(r)["head"] is None for by_seed in d["runs"]["final_norm"].values() for r in by_seed.values())
    first = [h for h in full["heads"]["512"] if h is not None][0]
    return ([n(Ns[0]), n(Ns[-1])] + [n(k) for k in seeds] + [f(ts.RESTORES, 1), n(d["settings"]["batch512"]["batch"])]
            + head("batch512") + head("lr0.0125") + head("lr0.003125") + head("frozenP2") + head("smallstart")
            + head("window1") + [n(ts.SETTINGS["drive1"][0]["drive"]["att1.P"])] + head("drive1")
            + [n(k) for k in sorted(set(drive_seeds))]  # "8", or "2", "8"
            + law(c["drive1"]["offset"]) + law(c["baseline"]["offset"]) + [n(max(c["baseline"]["offset"]["seeds"]))]
            + head("drive1_keys") + [n(k) for k in sorted({len(by_seed) for by_seed in keys.values()})]
            + law(c["drive1_keys"]["offset"]) + [f(paired["c"], 0)]
            + hybrid("sa") + [f(min(slopes), 2), f(max(slopes), 2),
                              n(max(max(h["vs_N_over_logN"]["seeds"]) for h in softmax)), f(min(laws), 0),
                              f(max(laws), 0), n(round(min(offsets), -2)), n(round(max(offsets), -2))]
            + hybrid("sa_attention") + hybrid("sa_attention_matched")
            + hybrid("sa_drive_flat") + [n(min(flat["vs_N_over_logN"]["seeds"])), n(min(map(int, flat["N"]))),
                                         n(max(map(int, flat["N"])))]
            + [f(m, 2) for m in measured] + later + [f(flat["predicted"]["ratio"][N], 2) for N in later]
            + free + hybrid("sa_unigram_free")
            + [n(k) for k in sorted({len(by_seed) for by_seed in d["runs"]["frozenWU"].values()})] + head("frozenWU")
            + [f(c["frozenWU"]["offset"]["c"], 0)] + head("bounded_readout")
            + [n(ts.CAPS["final_norm"])] + sorted(d["runs"]["final_norm"], key=int)
            + [n(ts.SETTINGS["readout_first"][0]["pretrain"])]
            + [n(k) for k in sorted({len(by_seed) for by_seed in d["runs"]["readout_first"].values()})]
            + [f(min(ratios("readout_first")), 2), f(max(ratios("readout_first")), 2)] + head("readout_first")
            + [f(c["readout_first"]["offset"]["c"], 0)] + [n(ts.SETTINGS["readout_first_drive1"][0]["drive"]["att1.P"])]
            + head("readout_first_drive1") + [f(c["readout_first_drive1"]["offset"]["c"], 0)]
            + head("readout_first_frozenWU")
            + [n(k) for k in sorted({len(by_seed) for by_seed in d["runs"]["readout_first_frozenWU"].values()})]
            + [n(full["offset"]["N"][0]), n(full["offset"]["N"][-1])] + law(full["offset"]) + ["512", n(first)])


def tau_velocities():
    d = load("tau_velocities.json")
    sa, tr = d["summary"]["sa"], d["summary"]["transformer"]
    stages = [i for i, fr in enumerate(d["measure"]["fractions"]) if fr > 0]  # the plateau's stages, not the start

    def slopes(model, name):
        return [model[name][i]["slope"] for i in stages]

    late = [i for i in stages if d["measure"]["fractions"][i] >= 0.25]
    keys = [k / t for k, t in zip(tr["delta_paths"]["key"][-1]["median"], tr["delta"][-1]["median"])]  # its share
    return [f(max(slopes(sa, "beta")), 2), f(min(slopes(sa, "beta")), 2), f(max(slopes(sa, "delta")), 2),
            f(min(slopes(sa, "delta")), 2), f(sa["early_phi"]["slope_vs_HN_over_N"], 2),
            f(d["measure"]["fractions"][late[0]], 2)] + [f(tr["delta"][i]["slope"], 2) for i in late] \
        + [n(min(tr["delta"][0]["N"])), n(max(tr["delta"][0]["N"])), f(tr["early_phi"]["slope_vs_HN_over_N"], 2)] \
        + [n(round(100 * min(keys))), n(round(100 * max(keys))), f(tr["delta_paths"]["skip"][-1]["slope"], 2)] \
        + [f(tr["key_transfer"]["dilution"][N]["median"], 2) for N in ("64", "128", "256")] + ["64", "128", "256"] \
        + [f(tr["key_transfer"]["dilution"][N]["theory"], 2) for N in ("64", "256")] \
        + [f(tr["key_transfer"]["growth"]["slope"], 2), f(tr["key_transfer"]["growth"]["flat_needs"], 2),
           n(tr["key_swaps"]["N"][0]), f(tr["key_swaps"]["median"]["W_U"], 2)]


def tau_velocities_frozen():
    d = load("tau_velocities_frozen_W_U.json")
    tr, record = d["summary"]["transformer"], load("tau_velocities.json")["summary"]["transformer"]
    late = [i for i, fr in enumerate(d["measure"]["fractions"]) if fr >= 0.25]
    keys = [k / t for k, t in zip(tr["delta_paths"]["key"][-1]["median"], tr["delta"][-1]["median"])]  # its share
    assert d["frozen"] == ["W_U.weight"] and all(r["frozen"] == ["W_U.weight"] for r in d["runs"])
    return [f(tr["delta"][i]["slope"], 2) for i in late] + [f"{d['measure']['fractions'][i]:g}" for i in late] \
        + [n(min(tr["delta"][0]["N"])), n(max(tr["delta"][0]["N"])), n(round(100 * min(keys))),
           n(round(100 * max(keys))), f(tr["key_transfer"]["growth"]["slope"], 2),
           f(record["key_transfer"]["growth"]["slope"], 2)]


GALLERY = {
    "predictor_scaling.png": predictor_scaling, "fig2a_K256.png": fig2a_K256, "fig2a_K1024.png": fig2a_K1024,
    "fig2a_K16.png": fig2a_K16, "fig2a_K64.png": fig2a_K64, "fig2bc.png": fig2bc, "circuits.png": circuits,
    "task_vectors.png": task_vectors, "circuits_paper.png": circuits_paper, "task_vectors_paper.png": task_vectors_paper,
    "fig2a_paper_K1024.png": fig2a_paper, "k1.png": k1, "k1_grid_h100.png": k1_grid_h100,
    "k1_grid_w0.1.png": k1_grid_w01, "k1_paper.png": k1_paper, "k2.png": k2, "k2_width32_3000.png": k2_width32_3000,
    "k2_width32_5000.png": k2_width32_5000, "k2_width256_4000.png": k2_width256_4000, "sa_dynamics.png": sa_dynamics,
    "sa_parameters.png": sa_parameters, "sa_theory.png": sa_theory, "sa_trajectories.png": sa_trajectories,
    "sa_scaling.png": sa_scaling, "mem_heatmaps.png": mem_heatmaps, "mem_depths_6000.png": mem_depths_6000,
    "mem_trend.png": mem_trend, "tau_settings.png": tau_settings, "tau_velocities.png": tau_velocities,
    "tau_velocities_frozen_W_U.png": tau_velocities_frozen,
}


def power_of_ten(steps: int) -> list[str]:
    """3 x 10<sup>4</sup> as the text writes it: ["3", "10", "4"] (["10", "4"] for 10<sup>4</sup>)."""
    e = int(math.floor(math.log10(steps)))
    mantissa = steps / 10**e
    assert mantissa == int(mantissa), steps
    return ([] if mantissa == 1 else [n(mantissa)]) + ["10", n(e)]


def iters_of(command: str) -> int:
    return int(re.search(r"--iters (\d+)", command).group(1))


def scale_circuits():
    Ks = [run_K(d["run"]) for d in load("circuits.json")["phases"].values()]
    return list(dict.fromkeys(Ks))  # in the phases' order, each once


def scale_circuits_paper():
    spec = load("ledgers/circuits_paper.json")["spec"]
    return [n(spec["Ks"]["gen"]), n(spec["Ks"]["mem"])] + power_of_ten(spec["iters"])


def scale_task_vectors_paper():
    spec = load("ledgers/circuits_paper.json")["spec"]
    return [n(spec["Ks"]["mem"])] + power_of_ten(spec["iters"])


def scale_k2(name: str, width: bool = True):
    d = load(name)
    return ([n(d["mlp_width"])] if width else []) + [n(d["iters"])]


SCALE = {  # the scale column: the preset's sizes that the row's file records
    "predictor_scaling.png": lambda: [n(load("predictor_scaling.json")["config"]["N_for_K"]),
                                      n(load("predictor_scaling.json")["config"]["dists"])],
    "fig2a_K256.png": lambda: [n(load("fig2a_K256.json")["config"]["N"]), n(load("fig2a_K256.json")["config"]["iters"])],
    "fig2bc.png": lambda: [n(K) for K in load("fig2bc.json")["K"]] + [n(max(load("fig2bc.json")["step"]))],
    "circuits.png": scale_circuits,
    "task_vectors.png": lambda: [n(load("task_vectors.json")["config"]["K_geometry"])],
    "circuits_paper.png": scale_circuits_paper,
    "task_vectors_paper.png": scale_task_vectors_paper,
    "k1.png": lambda: [n(load("k1.json")["N"]), n(load("k1.json")["iters"])],
    "k1_grid_h100.png": lambda: power_of_ten(iters_of(load("k1_grid_h100.json")["command"])),
    "k1_grid_w0.1.png": lambda: [n(K) for K in load("k1_grid_w0.1.json")["K"]] + [n(len(load("k1_grid_w0.1.json")["seeds"]))],
    "k1_paper.png": lambda: [n(len(v)) for v in load("ledgers/k1_paper.json")["spec"]["plan"].values()],
    "k2.png": lambda: scale_k2("k2.json"),
    "k2_width32_3000.png": lambda: scale_k2("k2_width32_3000.json"),
    "k2_width32_5000.png": lambda: scale_k2("k2_width32_5000.json"),
    "k2_width256_4000.png": lambda: scale_k2("k2_width256_4000.json", width=False),
    "sa_dynamics.png": lambda: [n(load("sa_scaling.json")["runs"]["full_control"][0]["run"]["N"])],
    "sa_parameters.png": lambda: [n(load("sa_scaling.json")["runs"]["full_control"][0]["run"]["N"])],
    "sa_scaling.png": lambda: [n(min(load("sa_scaling.json")["tau_fits"]["tau"]["N"])),
                               n(max(load("sa_scaling.json")["tau_fits"]["tau"]["N"])),
                               min(load("sa_scaling.json")["transformer_tau"]["N"], key=int),
                               max(load("sa_scaling.json")["transformer_tau"]["N"], key=int)],
    "mem_heatmaps.png": lambda: [n(load("mem_minimal.json")["iters"])],
    "mem_depths_6000.png": lambda: [n(load("mem_depths_6000.json")["config"]["iters"])],
    "mem_trend.png": lambda: [n(load("mem_trend.json")["iters"][0]), n(load("mem_trend.json")["iters"][-1])],
}


def test_every_gallery_row_has_its_computation():
    assert sorted(gallery_rows()) == sorted(GALLERY)
    assert set(SCALE) <= set(GALLERY)


@pytest.mark.parametrize("figure", sorted(GALLERY))
def test_a_gallery_rows_numbers_are_its_files(figure):
    assert numbers(gallery_rows()[figure]) == GALLERY[figure](), figure
    assert numbers(gallery_rows("scale")[figure]) == (SCALE[figure]() if figure in SCALE else []), figure


def test_the_readmes_captions_quote_only_numbers_of_the_full_rows():
    """README.md's gallery: a row per figure of the full gallery, each caption's numbers among its full row's (as many
    times), so a caption's number is pinned wherever the full row's is."""
    short, full = gallery_rows(readme=True), gallery_rows()
    assert sorted(short) == sorted(full)
    for figure, caption in short.items():
        left = list(numbers(full[figure]))
        for x in numbers(caption):
            assert x in left, f"README's {figure}: {x} is not in RESULTS.md's row"
            left.remove(x)


# ----------------------------------------------------------------------------- RESULTS.md's tables


def results_table(anchor: str, nth: int = 0) -> list[list[str]]:
    """The rows (lists of cells; the |---| line left out) of the nth markdown table after the one place in
    RESULTS.md where `anchor` occurs (whitespace and line breaks in it free)."""
    with open(os.path.join(ROOT, "RESULTS.md")) as fh:
        text = fh.read()
    found = [m.end() for m in re.finditer(r"\s+".join(map(re.escape, anchor.split())), text)]
    assert len(found) == 1, (anchor, len(found))
    tables, rows = [], None
    for line in text[found[0]:].splitlines():
        s = line.strip()
        if s.startswith("|"):
            rows = [] if rows is None else rows
            if not set(s) <= set("|-: "):
                rows.append([c.strip() for c in s.strip("|").split(" | ")])
        elif rows is not None:
            tables.append(rows)
            rows = None
            if len(tables) > nth:
                return tables[nth]
    raise AssertionError(f"no table {nth} after {anchor!r}")


def row_numbers(row: list[str]) -> list[str]:
    return [x for cell in row for x in numbers(cell)]


def table_predictor_scaling(rows):
    d = load("predictor_scaling.json")
    Ks = [int(k) for k in numbers(" ".join(rows[0][1:]))]
    idx = [d["K"].index(K) for K in Ks]
    return [[n(K) for K in Ks]] + [[f(d["loss_vs_K"][p]["mean"][i], 3) for i in idx] for p in PREDICTORS]


def table_fig2a_ends(rows):
    out = [[]]
    for row in rows[1:]:
        K = int(numbers(row[0])[0])
        rs, last = fig2a(K)
        line = [n(K), signed(last["train_loss"] - last["train_loss_2gen"], 3),
                signed(last["gen_loss"] - last["gen_loss_2gen"], 3), f(max(r["phi_beta_2"] for r in rs), 2)]
        if closest(last) != "2gen":  # memorizing: L_train and the 2-Mem level
            line += [f(last["train_loss"], 3), f(last["train_loss_2mem"], 3)]
        out.append(line)
    return out


def table_fig2bc(rows):
    d, phases = sweep_phases()
    steps = d["step"]

    def first(K, p, after=0):
        return next(s for s, q in zip(steps, phases[K]) if q == p and s >= after)

    out = [[]]
    for i, K in enumerate(d["K"]):
        try:
            rs, last = fig2a(K)
            losses = [signed(last["train_loss"] - last["train_loss_2gen"], 3), signed(last["gen_loss"] - last["gen_loss_2gen"], 3)]
        except FileNotFoundError:  # K = 4: no metrics file committed; its losses are not quoted
            losses = []
        line = [n(K)] + losses + [f(max(d["phi_beta_2"][i]), 2), f(d["phi_delta_1"][i][-1], 2)]
        if "2gen" not in phases[K]:  # memorizing: when 1-Mem, then 2-Mem, became the closest (unless tied at the end)
            tied = abs(d["kl_1mem"][i][-1] - d["kl_2mem"][i][-1]) < 1e-4
            line += [n(first(K, "1mem"))] + ([n(first(K, "2mem"))] if phases[K][-1] == "2mem" and not tied else [])
        elif phases[K][0] != "1gen" and "1gen" in phases[K]:  # a 1-Gen stretch, then 1-Mem, then 2-Gen
            gen = [s for s, q in zip(steps, phases[K]) if q == "1gen"]
            line += [n(gen[0]), n(gen[-1]), n(first(K, "2gen"))]
        else:
            line += [n(first(K, "2gen"))]
        out.append(line)
    return out


def run_K(run: str) -> str:
    return re.search(r"K(\d+)", run).group(1)


def edge_values(importance: dict) -> list[str]:
    c = circuit_tracing.circuit_edges(importance)
    return [f(v, 3) for v in [*c["kept"].values(), *c["path"].values()]]


def table_circuits(rows):
    phases = load("circuits.json")["phases"]
    return [[]] + [[run_K(d["run"]), n(d["step"]), f(d["divergence"], 3), f(d["ratio"], 2), signed(d["margin"], 3)]
                   + [f(v, 3) for v in circuit_tracing.circuit_edges(d["importance"])["kept"].values()] for d in phases.values()]


def table_circuits_paper(rows):
    d = load("circuits_paper.json")
    out = [[]]
    for p, ph in d["phases"].items():
        m = d["margins"][p]
        traced = ph.get("ledger_trace", ph)
        head = [run_K(traced["run"]), n(traced["step"])]
        if "rule_checkpoint" in ph:
            rule = ph["rule_checkpoint"]
            head += ([run_K(rule["run"])] if rule["run"] != ph["run"] else []) + [n(rule["step"])]
        out.append(head + [f(m["divergence"], 3), f(m["runner_up_divergence"], 3), signed(m["margin"], 3)]
                   + edge_values(traced["importance"]))
    return out


def table_patching(name: str, key: str):
    def spec(rows):
        d = load(name)
        return [[n(d["checkpoints"][key]["step"])]] + [[f(v, 3) for v in r.values()] for r in d[f"patching_{key}"].values()]
    return spec


def table_separability(rows):
    d = load("task_vectors.json")
    steps = numbers(" ".join(rows[0][1:]))
    return [steps, [], [f(d["separability"][s], 2) for s in steps], [f(d["silhouette"][s], 2) for s in steps]]


def table_information(rows):
    steps = numbers(" ".join(rows[0][1:]))
    info = {**load("task_vectors.json")["information"], **load("task_vectors_K4.json")["information"]}
    out = [steps]
    for row in rows[1:]:
        K = numbers(row[0])[0]
        out.append([K] + [f(info[K][s], 3) for s in steps])
    return out


def table_k1(rows):
    d = load("k1.json")
    K1 = {c: [r["K1_star"] for r in rows] for c, rows in d["seeds"].items()}
    control, reweight = ([[n(r["K1_star"]), n(r["K1_star"]), n(r["above"])] for r in d["seeds"][c]]
                         for c in ("control", "reweight"))
    w = Fraction(d["weight"]).limit_denominator(100)
    hi = d["search"]["hi"]
    inject = max(r["max_phi_beta"] for r in d["runs"] if r["condition"] == "inject" and r["K"] == hi)
    return [[], sum(control, []) + [n(statistics.median(K1["control"]))],
            [str(w.numerator), str(w.denominator), n(d["iters"] / d["weight"])] + sum(reweight, [])
            + [n(statistics.median(K1["reweight"]))],
            [n(hi)] * len(d["seeds"]["inject"]) + [n(hi), f(inject, 2), n(hi)]]


def table_k1_grid(rows):
    d = load("bench/results/2026-11-26_h100_k1_grid_d.json")
    by_K = {}
    for m in d["members"].values():
        by_K.setdefault(m["K"], []).append(m)
    seeds = sorted(m["seed"] for m in next(iter(by_K.values())))
    out = [[n(s) for s in seeds] + [f(d["phi_star"], 2)]]
    for K in sorted(by_K):
        ms = sorted(by_K[K], key=lambda m: m["seed"])
        heads = [m for m in ms if m["max_phi_beta_2_dense"] > d["phi_star"]]
        out.append([n(K)] + [f(m["max_phi_beta_2_dense"], 3) for m in ms] + [n(len(heads)), n(len(ms))]
                   + [n(m["tau_2gen_dense"]) for m in heads])
    return out


def per_seed(values: list, bounds: list) -> list[str]:
    """A "Delta tau per seed" cell: the values, a censored seed as "> its steps in 2-Gen"; two or more censored
    as "> lowest (×count)" after the finite ones, or "> lowest–highest (×count)" when all are."""
    censored = [b for v, b in zip(values, bounds) if v is None]
    if len(censored) <= 1:
        return [n(b if v is None else v) for v, b in zip(values, bounds)]
    finite = [n(v) for v in values if v is not None]
    spread = [n(min(censored))] + ([n(max(censored))] if not finite and max(censored) > min(censored) else [])
    return finite + spread + [n(len(censored))]


def median_cell(values: list, bounds: list, with_interval: bool = True) -> list[str]:
    m, lo, hi = median_ci(values)
    if not math.isfinite(m):
        return [n(censored_median(values, bounds)[0])]
    return [n(m)] + ([n(lo)] + ([n(hi)] if math.isfinite(hi) else []) if with_interval else [])


def k2_rows(d: dict, bounds: dict, medians: str = "range") -> list:
    """The rows every K2* table starts with: K, Delta tau per seed, and the median (with its exact interval and
    that interval's coverage in the row's name, or alone)."""
    Ks = [str(K) for K in d["K"]]
    cover = {median_coverage(len(d["delta_tau"][K]), median_rank(len(d["delta_tau"][K]))) for K in Ks}
    (cover,) = cover
    return [Ks, sum((per_seed(d["delta_tau"][K], bounds[K]) for K in Ks), []),
            ([f"{100 * cover:g}"] if medians == "range" else [])
            + sum((median_cell(d["delta_tau"][K], bounds[K], medians == "range") for K in Ks), [])]


def dtau_bounds(d: dict) -> dict:
    """{K: the seeds' steps in 2-Gen where censored} from a k2.py dtau JSON's runs."""
    out = {}
    for r in sorted(d["runs"], key=lambda r: r["seed"]):
        out.setdefault(str(r["K"]), []).append(r.get("censored_after"))
    return out


def memorized_rows(d: dict, name_numbers: list[list[str]], false_positives: bool = False, specific: bool = False):
    Ks = [int(K) for K in d["K"]]
    runs = {K: [r for r in d["runs"] if r["K"] == K] for K in Ks}
    seeds = n(len(runs[Ks[0]]))
    rows = [[n(d["iters"]), seeds] + [f(np.mean([r["memorized_final"] for r in runs[K]]), 2) for K in Ks]]
    if false_positives:
        rows.append([n(d["iters"]), seeds] + sum(([f(np.mean(fp), 3), f(max(fp), 3)] for fp in
                                                  ([r["false_positive_final"] for r in runs[K]] for K in Ks)), []))
    a = d["memorized_asymptote"]
    rows.append(sum(([f(np.mean(a[str(K)]), 2), f(np.std(a[str(K)]), 2), f(np.median(a[str(K)]), 2)] for K in Ks), []))
    if specific:
        rows.append([n(100 * (1 - NULL_ALPHA)), n(d["iters"]), seeds]
                    + [f(np.mean([r["specific_final"] for r in runs[K]]), 2) for K in Ks])
    return rows


def two_set_rows(d: dict) -> list:
    """The K2* table's rows of the two-set rule (k2.py: each chain scored on two sets of sequences): the memorized
    fraction at the end, its asymptotes, the chains that pass on one set only, the share of the chains' spread that
    is not noise, and one set's noise sigma."""
    Ks = [int(K) for K in d["K"]]
    runs = {K: [r for r in d["runs"] if r["K"] == K] for K in Ks}
    head = [n(d["iters"]), n(len(runs[Ks[0]]))]

    def mean(key: str, digits: int) -> list:
        return [f(np.mean([r[key] for r in runs[K]]), digits) for K in Ks]

    a = {K: [v for v in d["memorized_asymptote_two_sets"][str(K)] if v is not None] for K in Ks}
    return [head + mean("memorized_two_sets_final", 2),
            sum(([f(np.mean(a[K]), 2), f(np.std(a[K]), 2), f(np.median(a[K]), 2)] for K in Ks), []),
            head + mean("disagree_final", 2), head + mean("signal_share_final", 2), head + mean("sigma_final", 4)]


def table_k2(rows):
    d = load("k2.json")
    return (k2_rows(d, d["censored_after"]) + memorized_rows(d, rows, false_positives=True, specific=True)
            + two_set_rows(d))


def table_k2_wall8(rows):
    d = load("k2_width8_6000_wall.json")
    steps = [int(s) for s in numbers(rows[3][0])[:-1]]
    gaps = {s: [] for s in steps}
    quick = load("k2.json")
    gap_K = [K for K in d["K"] if str(K) in {str(k) for k in quick["K"]}]
    for r in quick["runs"]:
        if r["K"] in gap_K:
            for s, g in r["gap_to_2gen"]:
                if s in gaps:
                    gaps[s].append(g)
    return k2_rows(d, dtau_bounds(d)) + [[n(s) for s in steps] + [n(len(gaps[steps[0]]))]
                                          + [signed(np.mean(gaps[s]), 4) for s in steps]]


def table_k2_width32(rows):
    d = load("k2_width32_3000.json")
    return k2_rows(d, d["censored_after"]) + memorized_rows(d, rows)


def table_k2_width32_5000(rows):
    d = load("k2_width32_5000.json")
    return k2_rows(d, d["censored_after"], medians="alone")


def table_k2_wall32(rows):
    d = load("k2_width32_6000_wall.json")
    return k2_rows(d, dtau_bounds(d))


def table_k2_width256(rows):
    d = load("k2_width256_4000.json")
    return k2_rows(d, d["censored_after"]) + memorized_rows(d, rows)


def table_dtau_paper(rows):
    d = load("dtau_paper_h100.json")
    assert d["root"] == "bench/results/2026-11-26_h100_k2_paper_f.json"
    return k2_rows(d, dtau_bounds(d))


def table_sa_tau(rows):
    d = load("sa_scaling.json")
    Ns = list(d["tau"])
    return [Ns] + [sum(([n(t) for t in d[key][N]] for N in Ns), []) for key in ("tau", "tau_ablation")]


def table_exponents(rows):
    e = load("sa_scaling.json")["exponents"]
    windows = ("0.05-0.5", "0.02-0.3", "0.1-0.7")
    return [[]] + [sum(([f(e[f"{model}_{setting}"][key][w], 2) for w in windows]
                        for key in ("beta", "delta") for setting in ("control", "ablation")), [])
                   for model in ("full", "reduced", "frozen")]


def table_transformer_tau(rows):
    d = load("sa_scaling.json")
    Ns = list(d["tau_transformer"])
    levels = d["transformer_levels"]
    return [Ns, sum(([n(t) for t in d["tau_transformer"][N]] for N in Ns), []),
            [f(levels[N]["loss_best_1gen"] - levels[N]["loss_2gen"], 3) for N in Ns]]


def table_transformer_sustained(rows):
    """The paper protocol's transformer runs re-read (`transformer_tau`): per N the seeds, the runs without a tau, the
    sustained drop's median with its exact interval and that interval's coverage, the head's formation and the first
    crossing (medians), the most steps a run took, and 2-Gen's gain over the best 1-point loss on the N's eval set."""
    d = load("sa_scaling.json")
    tt, runs = d["transformer_tau"], d["transformer_runs"]
    Ns = list(tt["N"])
    fit = tt["fit"]["N"]
    gain = {N: next(iter(runs[N].values()))["levels"] for N in Ns}
    return [Ns, [n(fit[N]["seeds"]) for N in Ns], [n(fit[N]["no_tau"]) for N in Ns],
            sum(([n(fit[N]["median"]), n(fit[N]["interval"][0]), n(fit[N]["interval"][1]),
                  f(100 * fit[N]["coverage"], 1)] for N in Ns), []),
            [n(tt["fit_head"]["N"][N]["median"]) for N in Ns], [n(tt["fit_first_crossing"]["N"][N]["median"]) for N in Ns],
            [n(max(tt["N"][N]["steps"])) for N in Ns],
            [f(gain[N]["loss_best_1gen"] - gain[N]["loss_2gen"], 3) for N in Ns]]


def table_mem_heatmap(rows):
    h = load("mem_minimal.json")["heatmap"]
    Ks = [n(K) for K in h["K"]]
    return [Ks + Ks] + [[n(D)] + [signed(v, 3) for v in h["train_minus_2gen"][i]] + [signed(v, 3) for v in h["gen_minus_2gen"][i]]
                        for i, D in enumerate(h["D_phi"])]


def table_K2_hat_D8(rows):
    K = load("mem_minimal.json")["K2_hat"]
    seeds = [0, 1]
    return [[n(s) for s in seeds]] + [[*pair.split(","), *[f(K[pair]["8"][s], 1) for s in seeds], f(geomean(K[pair]["8"][:2]), 1)]
                                       for pair in ("1,1", "1,2", "2,1", "2,2")]


def table_fig8f(name: str):
    def spec(rows):
        K = load(name)["K2_hat"]
        Ds = list(K["1,1"])
        return [Ds] + [[*pair.split(",")] + sum(([f(geomean(K[pair][D]), 1)] + [f(v, 1) for v in K[pair][D]] for D in Ds), [])
                       for pair in ("1,1", "1,2", "2,1", "2,2")]
    return spec


TABLES = {  # an anchor in RESULTS.md (and which table after it): how its numbers are computed
    ("Losses against K at N = 256", 0): table_predictor_scaling,
    ("End of the runs (the JSONs' last rows):", 0): table_fig2a_ends,
    ("its losses, in no committed file, are not quoted):", 0): table_fig2bc,
    ("and the JSON states it with the margin in nats:", 0): table_circuits,
    ("listed in the table's last two rows, not as circuits of 1-Mem and 2-Mem.", 0): table_circuits_paper,
    ("`patching_2mem`, `patching_1mem`):", 0): table_patching("task_vectors.json", "2mem"),
    ("`patching_2mem`, `patching_1mem`):", 1): table_patching("task_vectors.json", "1mem"),
    ("phase = the closest predictor):", 0): table_separability,
    ("`figures/task_vectors_K4.json` for K = 1024):", 0): table_information,
    ("K1* per seed (`figures/k1.json`):", 0): table_k1,
    ("Max phi_beta(2) over the dense readouts per seed 0–3", 0): table_k1_grid,
    ("Width 8, 4000 steps (`figures/k2.json`):", 0): table_k2,
    ("the wall runs' metrics beyond step 4000 are not kept):", 0): table_k2_wall8,
    ("which should bring a capacity-limited K2* within a CPU budget.", 0): table_k2_width32,
    ("had made its log scale start at 0).", 0): table_k2_width32_5000,
    ("--json figures/k2_width32_6000_wall.json`:", 0): table_k2_wall32,
    ("![k2 at the paper's width](figures/k2_width256_4000.png)", 0): table_k2_width256,
    ("`figures/dtau_paper_h100.json`, `median_ci`, `median_coverage`):", 0): table_dtau_paper,
    ("**tau_2Gen(N), Fig. 6c top**", 0): table_sa_tau,
    ("brackets: windows [0.02, 0.3] and [0.1, 0.7]):", 0): table_exponents,
    ("every run stopped at 1.2 tau, at most 4400 of its 6000 steps, so none is censored):", 0): table_transformer_tau,
    ("the `paper` preset's runs (`transformer_tau`, re-read from `transformer_runs`):", 0): table_transformer_sustained,
    ("map is seed 0 (`figures/mem_minimal.json`, `heatmap`):", 0): table_mem_heatmap,
    ("(`figures/mem_minimal.json`, `K2_hat`):", 0): table_K2_hat_D8,
    ("seeds in brackets; `figures/mem_minimal.json`):", 0): table_fig8f("mem_minimal.json"),
    ("![mem_depths_6000](figures/mem_depths_6000.png)", 0): table_fig8f("mem_depths_6000.json"),
}


@pytest.mark.parametrize("anchor, nth", sorted(TABLES))
def test_a_results_tables_numbers_are_its_files(anchor, nth):
    rows = results_table(anchor, nth)
    expected = TABLES[anchor, nth](rows)
    assert len(expected) == len(rows), anchor
    for row, want in zip(rows, expected):
        assert row_numbers(row) == want, (anchor, row[0])


def test_the_intervals_and_slopes_results_states_in_prose_are_their_files():
    """Numbers RESULTS.md gives in its text rather than a table: what K2*'s intervals rest on, the SA slopes against
    N / H_N, the Gaussian model of the scores' noise, and the sixteenth step's heads against the quarter step's, each
    recomputed from its JSON."""
    with open(os.path.join(ROOT, "RESULTS.md")) as fh:
        text = " ".join(fh.read().split())
    wide = load("k2_width32_5000.json")["fit"]
    assert f"from the {wide['resamples_fitted']} of 1000 resamples that could be fitted; the other " \
           f"{1000 - wide['resamples_fitted']} have" in text
    assert f"K2* in [{n(wide['K2_star_ci'][0])}, ∞)" in text
    fits = load("sa_scaling.json")["tau_fits"]
    assert (f"{f(fits['tau']['slope_vs_N_over_HN'], 2)} control, {f(fits['tau_ablation']['slope_vs_N_over_HN'], 2)} "
            "ablation") in text
    d = load("k2.json")
    model = {K: [thresholds.gaussian_noise_model(c["fraction_raw"][-1], c["sigma"][-1], c["signal_share"][-1],
                                                 d["epsilon"]["value"]) for c in d["memorized_curves"][str(K)]]
             for K in d["K"]}
    two = ", ".join(f(np.mean([m["two_sets"] for m in model[K]]), 2) for K in d["K"])
    free = ", ".join(f(np.mean([m["noise_free"] for m in model[K]]), 2) for K in d["K"])
    assert f"reproduces the two-set fractions ({two} against" in text and f"noise-free fraction of {free}:" in text
    runs = load("tau_settings.json")["runs"]
    steps = [tau_2gen_drop(run)["head"] / tau_2gen_drop(runs["lr0.0125"][N][seed])["head"]
             for N, by_seed in runs["lr0.003125"].items() for seed, run in by_seed.items()]
    assert f"takes {f(min(steps), 2)}–{f(max(steps), 2)} × the quarter's steps for the same (N, seed)" in text


def test_fig6b_reason_as_results_states_it_is_its_file():
    """RESULTS.md's test of why beta outgrows t (Fig. 6b): the first-order theory along the runs' own w(t) and the
    full model with w held at 1/3, each exponent recomputed from sa_scaling.json."""
    with open(os.path.join(ROOT, "RESULTS.md")) as fh:
        text = " ".join(fh.read().split())
    d = load("sa_scaling.json")
    e, held = d["exponents_w_driven"], d["w_third"]["exponents"]
    beta = [e[k]["beta"] for k in ("full_control", "full_ablation")]
    windows = [x for b in beta for x in b.values()]
    assert (f"β ~ t<sup>{f(beta[0]['0.05-0.5'], 2)}</sup> (control and ablation {f(beta[0]['0.05-0.5'], 2)}, "
            f"{f(beta[1]['0.05-0.5'], 2)}; over the three windows {f(min(windows), 2)}–{f(max(windows), 2)}) and δ ~ "
            f"t<sup>{f(e['full_control']['delta']['0.05-0.5'], 2)}</sup> (control)") in text

    def x(N, setting, key):
        return f(held[N][setting][key]["0.05-0.5"], 2)

    assert (f"β grows as t<sup>{x('64', 'control', 'beta')}</sup> (control) and t<sup>{x('64', 'ablation', 'beta')}"
            f"</sup> (ablation) at N = 64, t<sup>{x('128', 'control', 'beta')}</sup> and t<sup>"
            f"{x('128', 'ablation', 'beta')}</sup> at N = 128, against the free model's t<sup>"
            f"{f(d['beta_exponent_control'], 2)}</sup> and t<sup>{f(d['beta_exponent_ablation'], 2)}</sup>") in text
    assert (f"t<sup>{x('64', 'ablation', 'delta')}</sup> at N = 64 and t<sup>{x('128', 'ablation', 'delta')}</sup> at "
            f"N = 128 (control {x('64', 'control', 'delta')}, {x('128', 'control', 'delta')})") in text
    assert sa.W_THIRD["seeds"] == 5 and "(5 seeds at N = 64 and 128" in text


def test_the_measurement_as_results_states_it_is_its_file():
    """RESULTS.md's reading of the theory's coordinates measured (tau_velocities.json): the SA-transformer's slopes,
    the transformer's N-flat drive on its lag-1 bias with its medians, the last position's layer-1 attention times N,
    and phi's early rates."""
    with open(os.path.join(ROOT, "RESULTS.md")) as fh:
        text = " ".join(fh.read().split())
    d = load("tau_velocities.json")
    sa, tr, fr = d["summary"]["sa"], d["summary"]["transformer"], d["measure"]["fractions"]
    plateau = [i for i, x in enumerate(fr) if x > 0]

    def sup(x):
        return f"N<sup>{f(x, 2)}</sup>"

    for name in ("beta", "delta"):
        s = [sa[name][i]["slope"] for i in plateau]
        assert f"falls as {sup(max(s))} to {sup(min(s))}" in text or f"as {sup(max(s))} to {sup(min(s))}" in text, name
    assert (f"δ's velocity falls as {sup(tr['delta'][plateau[0]]['slope'])} at {fr[plateau[0]]:g} of the head's time, "
            f"then is flat, {sup(tr['delta'][plateau[1]]['slope'])} and {sup(tr['delta'][plateau[2]]['slope'])} at "
            f"{fr[plateau[1]]:g} and {fr[plateau[2]]:g}") in text
    last = tr["delta"][plateau[-1]]
    medians = ", ".join(f(m * 1e4, 1) for m in last["median"])
    assert f"(its medians {medians} × 10<sup>−4</sup> at N = {', '.join(map(str, last['N']))} at" in text
    scaled = [r["N"] * list(r["times"].values())[-1]["phi_delta1"]["value"] for r in d["runs"]
              if r["model"] == "transformer"]
    assert f"N φ<sub>δ</sub>(1) is {f(min(scaled), 2)}–{f(max(scaled), 2)} at every N" in text
    assert f"(H<sub>N</sub> / N)<sup>{f(sa['early_phi']['slope_vs_HN_over_N'], 2)}</sup>, the derived 2" in text
    assert f"{f(tr['early_phi']['slope_vs_HN_over_N'], 2)} in the measurement runs" in text
    assert sum(r["model"] == "transformer" for r in d["runs"]) == 8 and "16 runs" in text
    paths, total = tr["delta_paths"], tr["delta"][plateau[-1]]
    share = [k / t for k, t in zip(paths["key"][-1]["median"], total["median"])]
    assert (f"**{n(round(100 * min(share)))}–{n(round(100 * max(share)))} % of it comes through layer 2's keys**, "
            + ", ".join(f(m * 1e4, 1) for m in paths["key"][-1]["median"])) in text
    assert f"(slope {f(paths['key'][-1]['slope'], 2)}: flat)" in text
    assert f"falls as {sup(paths['skip'][-1]['slope'])} ({f(paths['skip'][-1]['median'][0] * 1e4, 2)} → " \
           f"{f(paths['skip'][-1]['median'][-1] * 1e4, 2)} × 10<sup>−4</sup>; {sup(paths['skip'][1]['slope'])} and " \
           f"{sup(paths['skip'][2]['slope'])} at 0.1 and 0.25)" in text


def test_the_ladders_prose_in_results_is_its_file():
    """RESULTS.md's words on the knock-outs and the hybrid: the theory's start's heads, the hybrid's tau against the
    SA-transformer's, its growth over N and its readout's reach, each recomputed from tau_settings.json."""
    with open(os.path.join(ROOT, "RESULTS.md")) as fh:
        text = " ".join(fh.read().split())
    d = load("tau_settings.json")
    heads = {N: [tau_2gen_drop(r)["head"] for r in by_seed.values()] for N, by_seed in d["runs"]["smallstart"].items()}
    assert f"later at N = 32 ({n(heads['32'][0])}, {n(heads['32'][1])}) than at 64 and 128 " \
           f"({n(min(heads['64'] + heads['128']))}–{n(max(heads['64'] + heads['128']))})" in text
    runs = d["hybrid_runs"]["sa_softmax"]
    taus = {N: [r["tau"] for r in by_seed.values()] for N, by_seed in runs.items()}
    sa_32 = np.mean(load("sa_scaling.json")["tau"]["32"])
    assert f"tau is ×{f(np.median(taus['32']) / sa_32, 1)} the SA-transformer's at N = 32 ({n(taus['32'][0])}, " \
           f"{n(taus['32'][1])}) and grows only from {n(np.median(taus['32']))} to {n(np.median(taus['256']))} up to " \
           f"N = 256, where N / log N grows ×{f((256 / math.log(256)) / (32 / math.log(32)), 1)}" in text
    reach = [max(r["phi"]) for by_seed in runs.values() for r in by_seed.values()]
    assert f"Its φ<sub>β</sub>(2) reaches {f(min(reach), 2)}–{f(max(reach), 2)}" in text
    assert all(abs(a - b) / a < 0.01 for a, b in (v for v in taus.values() if len(v) == 2))  # "agree within 1 %"


def test_the_push_at_fixed_parameters_and_without_a_unigram_signal_as_results_states_them():
    """RESULTS.md's reading of key_push and key_swaps (tau_velocities.json), of the plateau's 1-point gains
    (sa_scaling.json's levels) and of the unigram-free rung and its SA control (tau_settings.json)."""
    with open(os.path.join(ROOT, "RESULTS.md")) as fh:
        text = " ".join(fh.read().split())
    tr = load("tau_velocities.json")["summary"]["transformer"]
    transfer, swaps = tr["key_transfer"], tr["key_swaps"]
    dil = [transfer["dilution"][N]["median"] for N in ("64", "128", "256")]
    assert f"slopes {', '.join(f(x, 2) for x in dil)} against log N' for the runs at N = 64, 128, 256" in text
    theory = [transfer["dilution"][N]["theory"] for N in ("64", "256")]
    assert f"H<sub>N'</sub> / N' has {f(theory[0], 2)} to {f(theory[1], 2)}:" in text
    g = transfer["growth"]
    assert (f"{', '.join(f(1e4 * m, 2) for m in g['median'])} × 10<sup>−4</sup> at N = "
            f"{', '.join(map(str, g['N'][:-1]))}, {g['N'][-1]}, slope {f(g['slope'], 2)} against log N, where "
            f"{f(g['flat_needs'], 2)}") in text
    share = swaps["median"]
    assert (f"(median of {len(swaps['runs'])} (N, seed)): the unembedding W<sub>U</sub> {f(share['W_U'], 2)}, layer 2's "
            f"values {f(share['V2'], 2)}, layer 1's values {f(share['V1'], 2)}, layer 2's W<sub>Q</sub>, W<sub>K</sub> "
            f"{f(share['QK2'], 2)}, the embeddings {f(share['W_E'], 2)}, MLP2 {f(share['MLP2'], 2)}, the position "
            f"biases and layer 1's W<sub>Q</sub>, W<sub>K</sub> none ({f(share['P2'], 2)}, {f(share['P1'], 2)}, "
            f"{f(share['QK1'], 2)})") in text
    record = load("sa_scaling.json")["transformer_runs"]
    gains = [math.log(10) - record[N]["0"]["levels"]["loss_best_1gen"] for N in sorted(record, key=int)]
    assert f"gains {', '.join(f(x, 3) for x in gains)} nats over uniform at N = 32, 64, 128, 256" in text
    d = load("tau_settings.json")
    free, control = d["runs"]["unigram_free"], d["hybrid_runs"]["sa_unigram_free"]
    runs = [("32", "0"), ("32", "1"), ("64", "0")]
    assert sorted((N, s) for N, by_seed in free.items() for s in by_seed) == runs
    phi = ", ".join(f(max(free[N][s]["phi"]), 2) for N, s in runs[:2]) + f" and {f(max(free['64']['0']['phi']), 2)}"
    heads = [n(tau_2gen_drop(record[N][s])["head"]) for N, s in runs]
    assert (f"(φ<sub>β</sub>(2) at most {phi}; the record's runs of the same seeds: {heads[0]}, {heads[1]} and "
            f"{heads[2]} steps)") in text
    taus = " / ".join(", ".join(n(r["tau"]) for r in control[N].values()) for N in ("32", "64", "128"))
    sa = d["hybrids"]["sa"]["N"]
    assert (f"τ = {taus} (its record's medians {n(sa['32']['median'])}, {n(sa['64']['median'])}, "
            f"{n(sa['128']['median'])})") in text
    fit = d["hybrids"]["sa_unigram_free"]
    ci, c_ci = fit["vs_N_over_logN"]["slope_ci"], fit["offset"]["c_ci"]
    assert (f"slope {f(fit['vs_N_over_logN']['slope'], 2)} [{f(ci[0], 2)}, {f(ci[1], 2)}] and c = "
            f"{f(fit['offset']['c'], 0)} [{f(c_ci[0], 0)}, {f(c_ci[1], 0)}] (the record's "
            f"{f(d['hybrids']['sa']['offset']['c'], 0)};") in text


def test_the_readout_rungs_as_results_states_them():
    """RESULTS.md's reading of the rungs that stop the readout's growth (tau_settings.json: frozenWU, bounded_readout,
    final_norm) and of the measurement with the unembedding held (tau_velocities_frozen_W_U.json)."""
    with open(os.path.join(ROOT, "RESULTS.md")) as fh:
        text = " ".join(fh.read().split())
    d = load("tau_settings.json")
    c = d["compare"]

    def heads(name):
        return [tau_2gen_drop(r)["head"] for by_seed in d["runs"][name].values() for r in by_seed.values()]

    def ratios(name):
        return [r for by_seed in c[name]["head_vs_baseline"].values() for r in by_seed.values()]

    def fit(name):
        line, law = c[name]["summary"]["fit_head"]["vs_N_over_logN"], c[name]["offset"]
        return (f"slope {f(line['slope'], 2)} [{f(line['slope_ci'][0], 2)}, {f(line['slope_ci'][1], 2)}]",
                f"c = {f(law['c'], 0)} [{f(law['c_ci'][0], 0)}, {f(law['c_ci'][1], 0)}]")

    slope, law = fit("frozenWU")
    assert [len(s) for s in d["runs"]["frozenWU"].values()] == [4, 4, 4]
    assert (f"the head forms at {n(min(heads('frozenWU')))}–{n(max(heads('frozenWU')))} steps, "
            f"{f(min(ratios('frozenWU')), 2)}–{f(max(ratios('frozenWU')), 2)} × the record's run of the same seed, "
            f"{slope} against N / log N, {law}.") in text
    assert f"at N-flat steps all the same ({slope})" in text
    slope, law = fit("bounded_readout")
    seeds = ", ".join(str(len(s)) for s in d["runs"]["bounded_readout"].values())
    assert (f"heads {f(min(ratios('bounded_readout')), 2)}–{f(max(ratios('bounded_readout')), 2)} × the record's, "
            f"{n(min(heads('bounded_readout')))}–{n(max(heads('bounded_readout')))} steps, {slope}, {law} ({seeds} "
            f"seeds at N = 32, 64, 128") in text
    losses = [r["loss"] for r in d["runs"]["final_norm"]["32"].values()]
    assert all(h is None for h in heads("final_norm")) and min(min(x) for x in losses) > math.log(10) - 0.002
    later = [float(np.mean(x[len(x) // 2:])) for x in losses]
    assert (f"({f(min(losses[0]), 3)} and {f(min(losses[1]), 3)} at best, {f(min(later), 2)} on average over each "
            f"run's second half)") in text and f(min(later), 2) == f(max(later), 2)
    v = load("tau_velocities_frozen_W_U.json")
    tr = v["summary"]["transformer"]
    stages = [i for i, fr in enumerate(v["measure"]["fractions"]) if fr > 0]
    fractions = [f"{v['measure']['fractions'][i]:g}" for i in stages]
    assert (f"slopes {', '.join(f(tr['delta'][i]['slope'], 2) for i in stages)} against log N at "
            f"{', '.join(fractions[:-1])} and {fractions[-1]} of the head's time") in text
    assert f"(δ's velocity {f(tr['delta'][-1]['slope'], 2)} against log N at half the head's time)" in text
    keys = [k / t for k, t in zip(tr["delta_paths"]["key"][-1]["median"], tr["delta"][-1]["median"])]
    assert f"{n(round(100 * min(keys)))}–{n(round(100 * max(keys)))} % of it through layer 2's keys" in text
    g, dil = tr["key_transfer"]["growth"], tr["key_transfer"]["dilution"]
    assert (f"{', '.join(f(1e4 * m, 2) for m in g['median'])} × 10<sup>−4</sup> at N = 32, 64, 128 (slope "
            f"{f(g['slope'], 2)}; the record's ") in text
    assert f"falls with N' ({f(dil['64']['median'], 2)}, {f(dil['128']['median'], 2)} for the runs at N = 64, 128)" in text
    assert (f"its φ's early rate against H<sub>N</sub> / N is {f(tr['early_phi']['slope_vs_HN_over_N'], 2)}, the "
            f"theory's 2") in text


def plateau_share(run: dict, start: float, end: float) -> float:
    """The share of the best 1-point predictor's gain over uniform (log C) that a run's mean loss holds over its
    evaluations from `start` to before `end` (steps on the chains)."""
    loss = [y for t, y in zip(chain_steps(run), run["loss"]) if start <= t < end]
    return (math.log(10) - float(np.mean(loss))) / (math.log(10) - run["levels"]["loss_best_1gen"])


def test_the_readout_first_rung_as_results_states_it():
    """RESULTS.md's reading of readout_first (tau_settings.json, beside the record's runs of the same (N, seed) in
    sa_scaling.json): where its plateau is at the switch, its heads after it, their fit, the steps it saves."""
    with open(os.path.join(ROOT, "RESULTS.md")) as fh:
        text = " ".join(fh.read().split())
    d, record = load("tau_settings.json"), load("sa_scaling.json")["transformer_runs"]
    runs = [(record[N][s], r) for N, by_seed in d["runs"]["readout_first"].items() for s, r in by_seed.items()]
    assert [len(s) for s in d["runs"]["readout_first"].values()] == [4, 4, 4]
    assert ts.SETTINGS["readout_first"][0]["pretrain"] == 4000 and "4000 steps of the record's SGD" in text
    heads = [(tau_2gen_drop(base)["head"], tau_2gen_drop(r)["head"]) for base, r in runs]
    at_switch = [plateau_share(r, -1000, 0) for _, r in runs]
    before_head = [plateau_share(base, h - 1000, h) for (base, _), (h, _) in zip(runs, heads)]
    assert (f"the loss holds {f(min(at_switch), 2)}–{f(max(at_switch), 2)} of the best 1-point predictor's gain over "
            f"uniform (median {f(float(np.median(at_switch)), 2)}; its last 1000 steps), the record's runs "
            f"{f(min(before_head), 2)}–{f(max(before_head), 2)} (median {f(float(np.median(before_head)), 2)}) over the "
            f"1000 steps before their heads") in text
    ratios = [h / h0 for h0, h in heads]
    line, law = d["compare"]["readout_first"]["summary"]["fit_head"]["vs_N_over_logN"], d["compare"]["readout_first"]["offset"]
    assert (f"The heads then form {n(round(min(h for _, h in heads)))}–{n(round(max(h for _, h in heads)))} steps "
            f"after the switch, {f(min(ratios), 2)}–{f(max(ratios), 2)} × the record's run of the same seed, and as "
            f"flat in N: slope {f(line['slope'], 2)} [{f(line['slope_ci'][0], 2)}, {f(line['slope_ci'][1], 2)}], "
            f"c = {f(law['c'], 0)} [{f(law['c_ci'][0], 0)}, {f(law['c_ci'][1], 0)}]") in text
    saved = [h0 - h for h0, h in heads]
    assert f"So {n(round(min(saved)))}–{n(round(max(saved)))} steps of the record's head time" in text
    assert f"per N), {n(round(min(saved)))}–{n(round(max(saved)))} steps of it go at every N" in text  # the summary


def test_readout_first_drive1_as_results_states_it_beside_its_prediction():
    """RESULTS.md's prediction for readout_first_drive1 (each (N, seed): readout_first's head plus the steps drive1
    adds to the record's run) and its measurement, both recomputed from tau_settings.json and sa_scaling.json."""
    with open(os.path.join(ROOT, "RESULTS.md")) as fh:
        text = " ".join(fh.read().split())
    d, record = load("tau_settings.json"), load("sa_scaling.json")["transformer_runs"]
    both = d["runs"]["readout_first_drive1"]
    assert [len(s) for s in both.values()] == [4, 4, 4]
    head = lambda run: tau_2gen_drop(run)["head"]  # noqa: E731
    predicted = {N: [head(d["runs"]["readout_first"][N][s]) + head(d["runs"]["drive1"][N][s]) - head(record[N][s])
                     for s in by_seed] for N, by_seed in both.items()}
    measured = {N: [head(r) for r in by_seed.values()] for N, by_seed in both.items()}

    def fits(heads):
        line, law = sa_fits.fit_tau_censored(heads)["vs_N_over_logN"], sa_fits.offset_fit(heads)
        return (f"{', '.join(n(round(float(np.median(v)))) for v in heads.values())}",
                f"slope {f(line['slope'], 2)} [{f(line['slope_ci'][0], 2)}, {f(line['slope_ci'][1], 2)}]",
                f"c = {f(law['c'], 0)} [{f(law['c_ci'][0], 0)}, {f(law['c_ci'][1], 0)}]", law)

    medians, slope, law, _ = fits(predicted)
    assert (f"heads at medians {medians} steps after the switch at N = 32, 64, 128, {slope} against N / log N and "
            f"{law}.") in text
    medians, slope, law, fit = fits(measured)
    big = lambda heads: f"{n(round(min(heads['128'])))}–{n(round(max(heads['128'])))}"  # noqa: E731
    assert (f"Measured: medians {medians} (at N = 128 {big(measured)} against {big(predicted)} predicted), {slope} "
            f"and **{law} steps per unit of N / log N**, the law's part {f(fit['share'], 2)} of the head's time at "
            f"N = 128") in text
    sa_law = d["hybrids"]["sa"]["offset"]["c"]  # the SA-transformer's c
    assert (f"under an N-independent T0 of {n(round(fit['T0']))} steps, and c is {f(fit['c'] / sa_law, 2)} of the "
            f"SA-transformer's {f(sa_law, 0)}") in text
    assert d["compare"]["readout_first_drive1"]["offset"]["c"] == pytest.approx(fit["c"])
    assert f"the formation grows with N, {law} (4 seeds per N)" in text  # the summary
    held = d["runs"]["readout_first_frozenWU"]  # and with the unembedding held instead
    heads = " / ".join(", ".join(n(round(head(r))) for r in by_seed.values()) for by_seed in held.values())
    ratios = [r for by_seed in d["compare"]["readout_first_frozenWU"]["head_vs_baseline"].values() for r in by_seed.values()]
    line = d["compare"]["readout_first_frozenWU"]["summary"]["fit_head"]["vs_N_over_logN"]
    law = d["compare"]["readout_first_frozenWU"]["offset"]
    assert (f"heads {heads} steps after the switch at N = {', '.join(held)}, {f(min(ratios), 2)}–{f(max(ratios), 2)}"
            f" × the record's runs, slope {f(line['slope'], 2)} [{f(line['slope_ci'][0], 2)}, "
            f"{f(line['slope_ci'][1], 2)}], c = {f(law['c'], 0)} [{f(law['c_ci'][0], 0)}, {f(law['c_ci'][1], 0)}] "
            f"({len(held['32'])} seeds per N, nominal)") in text
