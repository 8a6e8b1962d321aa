"""Circuit tracing of the four algorithmic phases by edge mean-ablation (Sec. "Tracing circuits",
Fig. 3; Appendix "Transformer Circuits": Table I, eqs. res3, hatpi and expandedatt2, Figs. A2, A3).

The explicit forward over Table I's 23 edges, with an edge mean-ablated for its target alone, is
analysis/edges.py's run_edges (its docstring defines the sources, the targets and the ablation). The importance
of an edge is the batch mean of D_KL^{S_N}(pi_theta || pi~_theta), pi~ the output with that edge ablated.

    python circuits.py                  # quick runs K = 4, 64, 1024, trained first if missing
    python circuits.py --preset paper   # the paper's K = 1024 and 128 runs (missing ones need a GPU)
    python circuits.py --replot         # only redraw the figure from FIGURES/circuits.json
    python circuits.py --ledger circuits_paper   # the paper-scale runs (campaigns/) from their ledger

It writes figures/circuits.png and .json, the repository's committed copies; --figures DIR writes
elsewhere. Tracing runs on the CPU: ~3 min for the four phases on 2 cores, plus ~5-10 min for each quick
run it has to train first.

Which checkpoint shows a phase: over every evaluation of the runs given, the one whose output is closest to
the phase's predictor relative to the next-closest of the four, i.e. the largest ratio
D(next predictor) / D(phase's predictor) (phase_checkpoint), provided it reaches the floor IN_PHASE = 1.2: the
phase's predictor the closest of the four, the next 20 % farther. A phase no checkpoint reaches is reported as
such (no_checkpoint: the closest checkpoint, its ratio and the predictor closest there) and not traced. The paper
takes the checkpoint with the lowest divergence in its K = 1024 (generalizing) and K = 128 (memorizing) runs (Fig.
A3's caption); the lowest divergence can sit where another predictor is about as close, and a circuit traced there
would mix two phases, so the ratio (stated with each phase, with the margin in nats) picks checkpoints unambiguously
in their phase, from any of the runs. task_vectors.py keeps the paper's rule (lowest_divergence_checkpoint): its
patching needs a checkpoint in its one run and compares it with every memorizing predictor.
"""
import argparse
import os
import time

import matplotlib.pyplot as plt
import numpy as np
import torch
import torch.nn.functional as F
from matplotlib.colors import ListedColormap, Normalize, PowerNorm
from matplotlib.patches import FancyArrowPatch, Rectangle

from analysis.edges import EDGES, SOURCES, TARGETS, parse_edge, run_edges
import train
from analysis.runs import TRAIN_TIME, closest_predictor, find_run, load_run, train_run
from bayes import PREDICTORS, kl_div
from campaigns import records
from campaigns.specs import LEDGERS
from plumbing import cli
from plumbing.records import finite_json
from plumbing.rundir import write_json
from plumbing.style import LABELS
from transformer import Transformer

# ----------------------------------------------------------------------------- edge importance


@torch.no_grad()
def edge_importance(model: Transformer, seqs: torch.Tensor) -> dict[str, float]:
    """{edge: <D_KL^{S_N}(pi_theta || pi~_theta)>} over the batch, pi~ with that edge mean-ablated.
    seqs are the model's inputs (B, N); the batch means are taken over all of them at once."""
    logp = F.log_softmax(run_edges(model, seqs).float(), -1)
    return {edge: kl_div(logp, F.log_softmax(run_edges(model, seqs, ablate=edge).float(), -1)).item() for edge in EDGES}


def connectivity(importance: dict[str, float]) -> np.ndarray:
    """The 7 x 7 matrix of Fig. A3: rows SOURCES, columns TARGETS, NaN where there is no edge."""
    M = np.full((len(SOURCES), len(TARGETS)), np.nan)
    for edge, value in importance.items():
        src, tgt = parse_edge(edge)
        M[SOURCES.index(src), TARGETS.index(tgt)] = value
    return M


# ----------------------------------------------------------------------------- the phases' circuits

PRESET_K = {"quick": [4, 64, 1024], "paper": [128, 1024]}  # the runs searched for the four phases (paper: Fig. A3)


def describe_runs(found: dict, preset: str) -> str:
    """'runs/K1024_s0 (found), runs/K4_s0 (to train first: ...)'-style text of find_run's answers {key: (run, to train)}."""
    return ", ".join(f"{run} ({f'to train first: {TRAIN_TIME[preset]}' if missing else 'found'})"
                     for run, missing in found.values())


def closeness(row: dict, phase: str) -> tuple[float, float]:
    """(ratio, margin) of an evaluation row for a phase: the divergence to the next-closest of the four predictors
    over the divergence to the phase's, and their difference in nats (ratio > 1, margin > 0: in the phase)."""
    others = min(row[f"kl_{q}"] for q in PREDICTORS if q != phase)
    return others / max(row[f"kl_{phase}"], 1e-12), others - row[f"kl_{phase}"]


IN_PHASE = 1.2  # the floor: a checkpoint is in a phase when the next-closest predictor is >= 1.2 times as far


def closest_checkpoint(rows: dict[str, list[dict]], phase: str) -> tuple[str, dict]:
    """(run, evaluation row) of the checkpoint, among every run's full evaluations {run: rows}, that is closest to
    the phase's predictor relative to the next-closest predictor (the largest closeness ratio), in the phase or not."""
    return max(((run, r) for run, rs in rows.items() for r in rs), key=lambda item: closeness(item[1], phase)[0])


def phase_checkpoint(rows: dict[str, list[dict]], phase: str, floor: float = IN_PHASE) -> tuple[str, dict] | None:
    """closest_checkpoint when it is in the phase (closeness ratio >= floor); None when no checkpoint is: a phase
    the runs never reached is not traced at the least-bad checkpoint (no_checkpoint says why)."""
    run, row = closest_checkpoint(rows, phase)
    return (run, row) if closeness(row, phase)[0] >= floor else None


def no_checkpoint(rows: dict[str, list[dict]], phase: str, floor: float = IN_PHASE) -> dict:
    """What the JSON and the figure say of a phase no checkpoint is in: the closest checkpoint (run, step, its
    ratio and margin, the predictor closest to it there) and why, in words. step None: nothing traced."""
    run, row = closest_checkpoint(rows, phase)
    ratio, margin = closeness(row, phase)
    nearest = closest_predictor(row)
    name, n = os.path.basename(os.path.normpath(run)), sum(len(rs) for rs in rows.values())
    return {"run": run, "step": None, "in_phase": False, "floor": floor,
            "closest": {"step": row["step"], "ratio": ratio, "margin": margin, "predictor": nearest},
            "why": f"no checkpoint in {LABELS[phase]}: at none of the {n} evaluations is it the closest predictor by "
                   f"x{floor:g} (at most x{ratio:.2f}, {name} step {row['step']}, closest there {LABELS[nearest]})"}


def trace_phases(runs: dict[str, str], n_seqs: int = 512, seed: int = 0, phases: tuple[str, ...] = PREDICTORS) -> dict:
    """For each phase of `phases`: its checkpoint among the runs {name: run directory} (phase_checkpoint), with
    its divergence, closeness ratio and margin, and the importance of every edge on n_seqs held-out sequences
    from that run's S; a phase with no checkpoint in it is not traced, and its entry is no_checkpoint's."""
    rows = {run: load_run(run)[1] for run in runs.values()}
    result = {}
    for phase in phases:
        found = phase_checkpoint(rows, phase)
        if found is None:
            result[phase] = no_checkpoint(rows, phase)
            print(f"{LABELS[phase]}: not traced, {result[phase]['why']}", flush=True)
            continue
        run, best = found
        ratio, margin = closeness(best, phase)
        cfg, _, model, tasks = load_run(run, best["step"])
        g = torch.Generator().manual_seed(seed)  # the same draws for every phase of a run
        seqs, _ = tasks.batch(n_seqs, cfg.N + 1, g)
        t0 = time.time()
        importance = edge_importance(model, seqs[:, :-1])
        print(f"{LABELS[phase]}: {run} step {best['step']} (divergence {best[f'kl_{phase}']:.4f}, next predictor "
              f"x{ratio:.2f}, +{margin:.3f}), {len(EDGES)} ablations in {time.time() - t0:.1f} s; the circuit: "
              + describe_circuit(importance), flush=True)
        result[phase] = {"run": run, "step": best["step"], "divergence": best[f"kl_{phase}"], "ratio": ratio,
                         "margin": margin, "importance": importance, "circuit": circuit_edges(importance)}
    return result


# ----------------------------------------------------------------------------- figure

THRESHOLD = 0.25  # Fig. 3's cut: edges at or below this fraction of the phase's strongest edge are left out, unless
#                   they complete a path from the input to the output (circuit_edges)
NODE_XY = {"Token": (0, 0), "A1Q": (-1.6, 1), "A1K": (-0.6, 1), "A1": (1.0, 1), "MLP1": (0, 2),  # Att2's outputs
           "A2Q": (-2.6, 3), "A2K": (-1.8, 3), "A2(Token)": (-0.6, 3), "A2(A1)": (1.3, 3), "A2(MLP1)": (2.5, 3),
           "MLP2": (0, 4), "Linear": (0, 5)}  # apart by their labels' widths; the gap right of x = 0 for the long edges
#                                             up the middle column, which bow to the right (draw_circuit)
SUBCIRCUITS = (("A1Q", "A1"), ("A2Q", "A2(MLP1)"))  # the attention blocks, boxed with dashes
NODE_FONT = 8  # points: a node's label


EDGE_CMAP = ListedColormap(plt.cm.viridis(np.linspace(0.85, 0.15, 256)))  # light: weak edge, dark: the strongest


def edge_color(rel: float):
    """An edge's colour for its importance relative to the phase's strongest edge (THRESHOLD..1)."""
    return EDGE_CMAP(Normalize(THRESHOLD, 1)(rel))


# Inside an attention block the output reads its queries and keys and, by its values, its source: Att1's output A1
# the tokens, A2(c) the component c. These links are no edges of Table I (nothing ablates them alone); a path from
# the input to the output may pass through them at no cost.
VALUE_PATHS = {"A1": "Token", "A2(Token)": "Token", "A2(A1)": "A1", "A2(MLP1)": "MLP1"}
BLOCK_LINKS = ([("A1Q", "A1"), ("A1K", "A1")] + [(qk, out) for qk in ("A2Q", "A2K") for out in SOURCES[3:6]]
               + [(src, out) for out, src in VALUE_PATHS.items()])
NODE_ORDER = ("Token", "A1Q", "A1K", "A1", "MLP1", "A2Q", "A2K", "A2(Token)", "A2(A1)", "A2(MLP1)", "MLP2", "Linear")


def _widest(links: list[tuple[str, str, float]], start: str, reverse: bool = False) -> tuple[dict, dict]:
    """Widest paths (the largest smallest link) from `start` over links (u, v, weight) in NODE_ORDER, or to `start`
    with reverse=True: ({node: the path's width}, {node: the link it arrives by (leaves by, reversed)})."""
    order = NODE_ORDER[::-1] if reverse else NODE_ORDER
    width, via = {node: -np.inf for node in order}, {}
    width[start] = np.inf
    for node in order:
        for link in links:
            u, v, w = link
            here, there = (v, u) if reverse else (u, v)
            if there == node and min(width[here], w) > width[node]:
                width[node], via[node] = min(width[here], w), link
    return width, via


def circuit_edges(importance: dict[str, float], threshold: float = THRESHOLD) -> dict:
    """The edges a circuit graph draws, and the list its tables give (the one place they are chosen):
    "kept": {edge: importance} above `threshold` of the phase's strongest, strongest first (Fig. 3's cut);
    "path": {edge: importance} under the cut but on the widest path from Token to Linear (the path whose weakest
    edge is strongest; the links inside attention blocks, BLOCK_LINKS, cost nothing) or on the widest such path
    through a kept edge: the strongest path is always drawn, and every drawn edge can be followed from the input
    to the output;
    "value": the value paths (VALUE_PATHS) those paths pass through, as (source, block output)."""
    top = max(importance.values())
    kept = {e: v for e, v in sorted(importance.items(), key=lambda kv: -kv[1]) if v > threshold * top}
    links = [(*parse_edge(e), v) for e, v in importance.items()] + [(u, v, np.inf) for u, v in BLOCK_LINKS]
    into, arrive = _widest(links, "Token")
    out_of, leave = _widest(links, "Linear", reverse=True)
    on_paths, node = set(), "Linear"
    while node != "Token":  # the widest path of all
        on_paths.add(arrive[node])
        node = arrive[node][0]
    for edge in kept:
        src, tgt = parse_edge(edge)
        if min(into[src], out_of[tgt]) == -np.inf:  # no way from the input to it, or from it to the output
            continue
        node = src
        while node != "Token":
            on_paths.add(arrive[node])
            node = arrive[node][0]
        node = tgt
        while node != "Linear":
            on_paths.add(leave[node])
            node = leave[node][1]
    path = {f"{u}->{v}": importance[f"{u}->{v}"] for u, v, w in on_paths if w < np.inf and f"{u}->{v}" not in kept}
    return {"kept": kept, "path": dict(sorted(path.items(), key=lambda kv: -kv[1])),
            "value": sorted((src, out) for out, src in VALUE_PATHS.items() if (src, out, np.inf) in on_paths)}


def describe_circuit(importance: dict[str, float]) -> str:
    """circuit_edges as text, the figure's edges in the order its tables list them."""
    c = circuit_edges(importance)
    text = ", ".join(f"{e.replace('->', '→')} {v:.3f}" for e, v in c["kept"].items())
    if c["path"]:
        text += "; under the cut, on the drawn paths: " + ", ".join(f"{e.replace('->', '→')} {v:.3f}" for e, v in c["path"].items())
    return text


def draw_circuit(ax, importance: dict[str, float], title: str):
    """Fig. 3 / A2: the edges of circuit_edges. Kept edges: width and colour by importance / the phase's largest
    importance (edge_color); edges under the cut that complete a path from Token to Linear: dashed and grey, with
    their ratio; value paths inside the attention blocks: dotted; nodes left without edges greyed out."""
    top = max(importance.values())
    c = circuit_edges(importance)
    used = {node for e in [*c["kept"], *c["path"]] for node in parse_edge(e)} | {n for link in c["value"] for n in link}
    for src, out in c["value"]:
        (xs, ys), (xt, yt) = NODE_XY[src], NODE_XY[out]
        ax.plot([xs, xt], [ys, yt], ls=":", lw=1.2, color="0.55", zorder=0)
    for edge, value in [*c["kept"].items(), *c["path"].items()]:
        rel, under = value / top, edge in c["path"]
        src, tgt = parse_edge(edge)
        (xs, ys), (xt, yt) = NODE_XY[src], NODE_XY[tgt]
        # the long edges bow away from the middle column (MLP1, MLP2), whose nodes they would cross
        rad = 0.0 if yt - ys <= 1 else (0.35 if xs + xt >= 0 else -0.35)
        ax.add_patch(FancyArrowPatch((xs, ys), (xt, yt), connectionstyle=f"arc3,rad={rad}", arrowstyle="-|>",
                                     mutation_scale=8 + 6 * rel, lw=0.5 + 5 * rel, shrinkA=11, shrinkB=11, zorder=1,
                                     color="0.45" if under else edge_color(rel), ls="--" if under else "-",
                                     alpha=0.9))
    if c["path"]:  # the dashed edges' ratios, under the graph
        ax.text(0.5, 0.0, "dashed, under the cut: " + ", ".join(f"{e.replace('->', '→')} {v / top:.3f}"
                                                               for e, v in c["path"].items()),
                transform=ax.transAxes, ha="center", va="top", fontsize=8, color="0.3")
    for node, (x, y) in NODE_XY.items():
        on = node in used
        ax.text(x, y, node, ha="center", va="center", fontsize=NODE_FONT, zorder=2, color="k" if on else "0.45",
                bbox=dict(boxstyle="round,pad=0.25", fc="w" if on else "0.95", ec="k" if on else "0.6", ls="-" if on else "--"))
    ax.set_xlim(-3.2, 3.2)
    ax.set_ylim(-0.5, 5.5)
    ax.axis("off")
    ax.set_title(title, fontsize=9)


def box_blocks(ax):
    """The attention blocks' dashed boxes (SUBCIRCUITS) around their nodes' labels as drawn: called once the figure's
    layout is final, since a label's width in data units depends on the axes' size."""
    renderer = ax.figure.canvas.get_renderer()
    to_data = ax.transData.inverted()
    labels = {t.get_text(): t for t in ax.texts if t.get_text() in NODE_XY}
    for first, last in SUBCIRCUITS:
        row = [n for n, (x, y) in NODE_XY.items()
               if y == NODE_XY[first][1] and NODE_XY[first][0] <= x <= NODE_XY[last][0] and n in labels]
        if not row:
            continue
        extents = [labels[n].get_window_extent(renderer) for n in row]  # the texts; their rounded boxes pad 0.25 em
        pad = 0.25 * NODE_FONT * ax.figure.dpi / 72 + 5  # pixels: the rounded box's pad and a margin beyond it
        (x0, y0), (x1, y1) = to_data.transform([(min(e.x0 for e in extents) - pad, min(e.y0 for e in extents) - pad),
                                                (max(e.x1 for e in extents) + pad, max(e.y1 for e in extents) + pad)])
        ax.add_patch(Rectangle((x0, y0), x1 - x0, y1 - y0, fill=False, ls="--", lw=0.8, ec="0.5"))


def plot_circuits(phases: dict, path: str):
    """Top: the connectivity matrices (Fig. A3), on one colour scale: every entry is an importance in nats, comparable
    across the phases (a square-root shading keeps the weakest phase's pattern in view; the numbers are written in
    the cells); bottom: the circuit graphs (Figs. 3, A2), their edges on one colour scale relative to each phase's
    strongest; a phase with no checkpoint in it (no importance: no_checkpoint's entry) says so instead, and a phase's
    "note" (e.g. that its trace is not at the rule's checkpoint) goes under its title. Returns the figure (closed)."""
    fig, axes = plt.subplots(2, len(phases), figsize=(4.75 * len(phases), 12), gridspec_kw={"height_ratios": [1.2, 1.35]},
                             squeeze=False)
    matrices = {phase: connectivity(r["importance"]) for phase, r in phases.items() if "importance" in r}
    shade = PowerNorm(0.5, vmin=0, vmax=max((np.nanmax(M) for M in matrices.values()), default=1.0))
    heat_maps, graphs = [], []
    for col, (phase, result) in enumerate(phases.items()):
        if "importance" not in result:
            for ax in axes[:, col]:
                ax.axis("off")
            closest = result["closest"]
            axes[0, col].set_title(f"{LABELS[phase]}: no checkpoint in this phase", fontsize=10)
            axes[0, col].text(0.5, 0.5, f"at no evaluation is {LABELS[phase]} the closest\npredictor by "
                              f"x{result['floor']:g} or more: not traced\n\nclosest: "
                              f"{os.path.basename(os.path.normpath(result['run']))}, step {closest['step']}, "
                              f"x{closest['ratio']:.2f}\n(there {LABELS[closest['predictor']]} is the closest)"
                              + (f"\n\n{result['note']}" if result.get("note") else ""),
                              ha="center", va="center", fontsize=9, transform=axes[0, col].transAxes)
            continue
        M = matrices[phase]
        ax = axes[0, col]
        im = ax.imshow(M, cmap="Greys", norm=shade)
        for i, j in zip(*np.where(~np.isnan(M))):
            ax.text(j, i, f"{M[i, j]:.3f}", ha="center", va="center", fontsize=8.5,
                    color="w" if shade(M[i, j]) > 0.55 else "k")
        ax.set_xticks(range(len(TARGETS)), TARGETS, rotation=45, fontsize=9)
        ax.set_yticks(range(len(SOURCES)), SOURCES, fontsize=9)
        ax.set_xlabel("target")
        if col == 0:
            ax.set_ylabel("source")
        heat_maps.append(ax)
        name = os.path.basename(os.path.normpath(result["run"]))
        ax.set_title(f"{LABELS[phase]}: {name}, step {result['step']}\n"
                     f"divergence to {LABELS[phase]} {result['divergence']:.3f}"
                     + (f", next x{result['ratio']:.2f}" if "ratio" in result else "")
                     + (f"\n{result['note']}" if result.get("note") else ""), fontsize=10)
        draw_circuit(axes[1, col], result["importance"], f"{LABELS[phase]} circuit")
        graphs.append(axes[1, col])
    fig.suptitle("Edge mean-ablation importance <D_KL(pi_theta || pi~_theta)> (nats). Graphs: edges above "
                 f"{THRESHOLD} of the phase's strongest (dashed: under the cut, on the strongest path; dotted: a value "
                 "path); nodes without edges in grey", fontsize=11)
    fig.tight_layout(rect=(0, 0.08, 0.93, 1))  # the right edge: the heat maps' one colour bar
    if heat_maps:  # beside the last heat map, as tall as the maps are drawn (square cells: narrower than their axes)
        heat_maps[-1].apply_aspect()
        box = heat_maps[-1].get_position()
        bar = fig.add_axes((0.94, box.y0, 0.009, box.height))
        fig.colorbar(im, cax=bar, label=f"importance (nats), one scale for the\n{len(heat_maps)} maps (square-root shading)")
    for ax in graphs:  # the layout is final: the dashed boxes can fit the labels as drawn
        box_blocks(ax)
    bar = fig.add_axes((0.35, 0.05, 0.3, 0.015))  # under the graphs: what an edge's colour means
    fig.colorbar(plt.cm.ScalarMappable(Normalize(THRESHOLD, 1), EDGE_CMAP), cax=bar, orientation="horizontal",
                 label="edge importance / the phase's strongest edge (graphs)")
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ----------------------------------------------------------------------------- command line


def replot(path: str):
    """--replot: the figure again from the JSON at path (FIGURES/circuits.json), the PNG beside it, or one line on what
    is missing or broken."""
    keys = ("run", "step", "divergence", "importance")  # a phase with no checkpoint in it: no_checkpoint's keys
    untraced = ("run", "in_phase", "floor", "closest", "why")
    png = os.path.splitext(path)[0] + ".png"

    def draw(result: dict):
        phases = result["phases"]
        if not isinstance(phases, dict) or set(phases) != set(PREDICTORS) or any(
                not isinstance(p, dict) or set(untraced if p.get("in_phase") is False else keys) - set(p)
                for p in phases.values()):
            raise KeyError(f"the four phases' {', '.join(keys)}")
        plot_circuits({phase: phases[phase] for phase in PREDICTORS}, png)

    cli.redraw(path, ("phases",), "circuits.py", draw)
    print(f"wrote {png} from {path}")


def circuit_phases(spec: dict, piece: dict) -> dict:
    """The piece's traced phases under circuits.py's rule, applied today to the ledger's rows: a phase with no checkpoint
    in it is no_checkpoint's entry, the ledger's trace of it kept apart ("ledger_trace", not drawn); a phase
    traced at another checkpoint than the rule's keeps its trace, with the rule's checkpoint and a note saying so.
    circuit: the figure's edges, chosen once (circuit_edges)."""
    named = {run: f"K{spec['Ks'][run]}" for run in piece["runs"]}
    rows = {named[run]: piece["runs"][run]["rows"] for run in piece["runs"]}
    phases = {}
    for ph, d in piece["phases"].items():
        traced = {**d, "run": named.get(d["run"], d["run"])}
        if "importance" in d:
            row = next(r for r in rows[traced["run"]] if r["step"] == d["step"])
            ratio, margin = closeness(row, ph)
            traced.update(ratio=ratio, margin=margin, circuit=circuit_edges(d["importance"]))
        found = phase_checkpoint(rows, ph)
        if found is None:
            phases[ph] = no_checkpoint(rows, ph) | ({"ledger_trace": traced} if "importance" in d else {})
            if "importance" in d:
                phases[ph]["note"] = (f"the ledger's trace ({traced['run']} step {d['step']}, x{traced['ratio']:.2f}) "
                                      "is in the JSON, not drawn")
            continue
        run, row = found
        phases[ph] = traced
        if (run, row["step"]) != (traced["run"], d["step"]):
            ratio = closeness(row, ph)[0]
            traced["rule_checkpoint"] = {"run": run, "step": row["step"], "ratio": ratio}
            traced["note"] = f"not the rule's checkpoint ({run} step {row['step']}, x{ratio:.2f}: not traced)"
    return phases


def ledger_figures(name: str, figures: str = "figures", ledgers: str = LEDGERS) -> dict:
    """--ledger: a circuits campaign's circuits (Figs. 3, A2, A3: figures/<name>.png and .json) and each run's Fig. 2a
    (fig2a_*_K<K>.png) from ledgers/<name>.json alone (its task vectors: task_vectors.py --ledger)."""
    spec, ledger = records.pieces_of(name, ("circuits",), ledgers)
    piece = ledger["pieces"][0]
    rows = {run: piece["runs"][run]["rows"] for run in piece["runs"]}
    phases = circuit_phases(spec, piece)
    cli.writable_dir(figures, "--figures")
    plot_circuits(phases, os.path.join(figures, f"{name}.png"))
    for run, cfg in piece["runs"].items():
        config = train.Config(**{**cfg["config"], "out": ""})
        train.plot_run(rows[run], config, os.path.join(figures, f"{name.replace('circuits', 'fig2a')}_K{config.K}.png"))
    result = {"iters": spec["iters"], "Ks": spec["Ks"], "phases": phases, "margins": records.margins(rows, piece["phases"]),
              "final": {run: {k: rs[-1][k] for k in ("step", "train_loss", "gen_loss", "kl_1gen", "kl_2gen", "kl_1mem",
                                                        "kl_2mem", "phi_beta_2")} for run, rs in rows.items()},
              "pieces": records.stamps(ledger["pieces"])}
    write_json(os.path.join(figures, f"{name}.json"), finite_json(result), indent=1)
    return result


def trace_circuits(args):
    """The command: the preset's runs (or --runs), found or trained, each phase's checkpoint traced edge by edge
    (trace_phases); figures/circuits.png and .json."""
    preset = cli.preset(args.preset)
    if args.runs:  # K is only read for a default run
        found = {run: find_run(run, 0, preset, "--runs") for run in args.runs.split(",")}
    else:
        found = {K: find_run(None, K, preset, "--runs") for K in PRESET_K[preset]}
    committed = " (the committed copies; --figures DIR writes elsewhere)" if os.path.normpath(args.figures) == "figures" else ""
    cli.announce(preset, f"circuits of {describe_runs(found, preset)}; "
                         f"4 x {len(EDGES)} ablations on {args.n_seqs} sequences, ~3 min on 2 CPU cores at N = 128",
                 f"{args.figures}/circuits.png and .json{committed}")
    runs = {str(key): train_run(key, preset) if missing else run for key, (run, missing) in found.items()}
    t0 = time.time()
    phases = trace_phases(runs, args.n_seqs, args.seed, args.phases)
    plot_circuits(phases, os.path.join(args.figures, "circuits.png"))
    write_json(os.path.join(args.figures, "circuits.json"),
               {"preset": preset, "n_seqs": args.n_seqs, "seed": args.seed, "edges": list(EDGES), "phases": phases}, indent=1)
    print(f"traced in {time.time() - t0:.0f} s; wrote {args.figures}/circuits.png and circuits.json")


def phase_list(text: str) -> tuple[str, ...]:
    """An argparse type, --phases: distinct names of PREDICTORS, in PREDICTORS' order."""
    names = [t.strip() for t in text.split(",")]
    if not names or set(names) - set(PREDICTORS) or len(set(names)) < len(names):
        raise argparse.ArgumentTypeError(f"distinct names among {', '.join(PREDICTORS)}, got {text!r}")
    return tuple(p for p in PREDICTORS if p in names)


def main():
    parser = cli.ArgumentParser(
        description="Trace the four phases' circuits (Figs. 3, A2, A3). Writes FIGURES/circuits.png and .json; the "
                    "default FIGURES, figures, holds the repository's committed copies.",
        runs="Default run: 2 min 19 s on the 2-core development VM (--threads 1, beside a K2* run; 2026-11-27), the "
             "quick runs in place; a missing one is trained first, 5-10 min each (quick preset: 4 phases x 23 edge "
             "ablations on 512 sequences of runs/K<K>_s0/, K = 4, 64, 1024); writes figures/circuits.png and "
             "figures/circuits.json, and a missing run's runs/K<K>_s0/ (train.py's files).\n--replot: seconds, "
             "trains nothing.")
    cli.add_preset(parser, PRESET_K, "which runs: quick K = 4, 64, 1024, trained on the CPU if missing; "
                                     "paper K = 1024 and 128, N = 256, 10^6 steps, trained on a GPU if missing")
    cli.add_figures(parser)
    cli.add_replot(parser, "FIGURES/circuits.json", "the figure")
    parser.add_argument("--runs", default=None, help="comma-separated run directories whose checkpoints the four phases "
                        "are picked from (default: the preset's runs/K<K>_s0: quick K = 4, 64, 1024; paper K = 128, 1024)")
    parser.add_argument("--n-seqs", type=cli.at_least(2), default=512,  # a mean over one sequence ablates nothing
                        help="held-out sequences from S to trace on (the paper: 512)")
    parser.add_argument("--seed", type=cli.at_least(0), default=0, help="generator seed of the held-out sequences "
                        "(the models keep their runs' seeds)")
    parser.add_argument("--phases", type=phase_list, default=PREDICTORS, help="comma-separated phases to trace, of "
                        f"{', '.join(PREDICTORS)} (default: all four)")
    parser.add_argument("--ledger", default=None, metavar="CAMPAIGN", help="only draw a paper-scale circuits campaign's "
                        "figures, FIGURES/CAMPAIGN.png and .json and its runs' Fig. 2a, from ledgers/CAMPAIGN.json")
    cli.add_threads(parser)
    args = parser.parse_args()
    cli.set_threads(args.threads)
    if args.ledger is not None:
        ledger_figures(args.ledger, args.figures)
        print(f"wrote {args.figures}/{args.ledger}.png and .json from ledgers/{args.ledger}.json")
        return
    cli.writable_dir(args.figures, "--figures")
    if args.replot is not None:
        replot(cli.replot_path(args, "circuits.json"))
        return
    trace_circuits(args)


if __name__ == "__main__":
    cli.run(main)
