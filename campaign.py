"""Campaigns: the paper-scale experiments run a piece at a time, on GPU leases of a few minutes, with a ledger that
accumulates in the repository (engine; the experiments themselves are thresholds.py's, trace.py's and
task_vectors.py's).

A lent GPU comes for ~10 minutes a command, and its run directories are gone after the call. So each piece
trains, evaluates and analyses within one call, and appends what the analysis needs to ledgers/<campaign>.json:
configs, readouts and losses, circuit edges, task-vector results; never checkpoints. The figures are drawn from
the ledger, so they can be redrawn on any machine.

    python campaign.py status k1_paper                  # what is done, what remains
    python campaign.py run k1_paper --budget-min 6       # the next pieces that fit 6 minutes (GPU)
    python campaign.py report k1_paper                   # figures/k1_paper.png and .json from the ledger

circuits_paper  Figs. 3, 4, A2, A3, A8 at the paper's scale: K = 1024 (1-Gen, 2-Gen) and K = 128 (1-Mem, 2-Mem),
                seed 0, trained together for `iters` steps, then trace.py's circuits and task_vectors.py's
                experiments on them in the same call. One piece.
k1_paper        Figs. 7a, A9, 7c: K1* per seed by binary search over integer K (16 control seeds, 4 with task
                injection), 10^4 steps per probe, phi_beta(2) every 100 steps on 4096 sequences (the paper's
                protocol). A round's probes are independent runs: a piece is a round, or as many of its probes as
                fit the budget.
*_tiny          the same on a CPU in seconds (tests/test_campaign.py: a campaign interrupted after every piece
                gives the same ledger and figures as one uninterrupted call).
"""
import datetime
import json
import os
import shutil
import statistics
import time

import matplotlib.pyplot as plt
import numpy as np
import torch

import cli
import probes
import runs
import task_vectors
import thresholds
import trace
import train

LEDGERS = "ledgers"

# A campaign's spec is fixed once its first piece is in the ledger (the ledger keeps a copy and refuses another).
# "train": train.Config values on top of the train preset "preset"; bf16: the K = 94 grid reproduced tau_2gen and
# phi_beta within 0.006 in bf16 on an H100, at ~2x the fp32 rate.
SPECS = {
    "circuits_paper": dict(kind="circuits", preset="paper", Ks={"gen": 1024, "mem": 128}, seed=0, iters=30_000,
                           train=dict(evals=40, bf16=True), trace_seqs=512, tv_per_chain=16, tv_patch_seqs=256,
                           seconds_per_step=0.006),
    "k1_paper": dict(kind="k1", preset="paper", probe=dict(thresholds.PRESETS["paper"], bf16=True),
                     plan={"control": list(range(16)), "inject": list(range(4))},
                     seconds_per_model_step=1 / 1500, seconds_per_probe=8),
    # CPU-sized stand-ins with the same code path, for the tests
    "circuits_tiny": dict(kind="circuits", preset="quick", Ks={"gen": 64, "mem": 4}, seed=0, iters=60,
                          train=dict(N=16, batch=16, evals=6, eval_train=64, eval_gen=64, D=16), trace_seqs=16,
                          tv_per_chain=6, tv_patch_seqs=8, seconds_per_step=0.02),
    "k1_tiny": dict(kind="k1", preset="quick",
                    probe=dict(N=8, batch=4, lr=1e-3, iters=6, eval_every=3, eval_dense=4, evals=1, eval_train=4,
                               eval_gen=4, D=8, lo=2, hi=9, ratio=1.0, weight=0.5),
                    plan={"control": [0, 1], "inject": [0]}, seconds_per_model_step=0.01, seconds_per_probe=1),
}
VOLATILE = ("card", "date", "seconds", "model_steps", "predicted")  # a piece's fields that differ between two identical runs


# ----------------------------------------------------------------------------- the ledger


def ledger_path(name: str, ledgers: str = LEDGERS) -> str:
    return os.path.join(ledgers, f"{name}.json")


def load_ledger(name: str, ledgers: str = LEDGERS) -> dict:
    """The campaign's ledger (a new one if none is committed); refuses a ledger of another spec."""
    if name not in SPECS:
        raise ValueError(f"unknown campaign {name!r}; campaigns: {', '.join(SPECS)}")
    spec = json.loads(json.dumps(SPECS[name]))  # as JSON stores it
    path = ledger_path(name, ledgers)
    if not os.path.exists(path):
        return {"campaign": name, "spec": spec, "pieces": []}
    with open(path) as f:
        ledger = json.load(f)
    if ledger.get("spec") != spec:
        raise ValueError(f"{path} was written for another spec of {name}; move it away to start afresh")
    return ledger


def save_ledger(ledger: dict, ledgers: str = LEDGERS):
    """Atomically: a call killed while writing keeps the previous ledger."""
    os.makedirs(ledgers, exist_ok=True)
    path = ledger_path(ledger["campaign"], ledgers)
    with open(path + ".tmp", "w") as f:
        json.dump(ledger, f, indent=1)
    os.replace(path + ".tmp", path)


def card(device: str) -> str:
    return torch.cuda.get_device_name(device) if device.startswith("cuda") else "cpu"


def stamp(device: str, seconds: float, model_steps: int) -> dict:
    return {"card": card(device), "date": datetime.date.today().isoformat(), "seconds": round(seconds, 1),
            "model_steps": model_steps}


def compact(rows: list[dict], keys: tuple[str, ...], digits: int = 5) -> list[dict]:
    """Rows with only `keys`, floats rounded: what the analysis reads, small enough to commit."""
    return [{k: round(r[k], digits) if isinstance(r[k], float) else r[k] for k in keys if k in r} for r in rows]


# ----------------------------------------------------------------------------- K1*: rounds of probes

DENSE_KEYS = ("step", "phi_beta_2", "gen_loss", "train_loss")


def k1_state(spec: dict, ledger: dict):
    """The searches replayed from the ledger's probes: (searches, {(condition, K, seed): dense rows})."""
    searches = probes.new_searches(spec["probe"], spec["plan"])
    records = {(r["condition"], r["K"], r["seed"]): r for piece in ledger["pieces"] for r in piece["probes"]}
    while True:  # record round by round, as the searches asked for them
        todo = [key for key in probes.pending_probes(searches) if key in records]
        if not todo:
            return searches, {key: r["rows"] for key, r in records.items()}
        for cond, K, seed in todo:
            searches[cond, seed].record(K, probe_generalizes(records[cond, K, seed]))


def probe_generalizes(record: dict) -> bool:
    """The paper's rule on a probe of the ledger (tests replace it by a rule on K)."""
    return thresholds.generalizes(record["rows"])


def k1_piece_cost(spec: dict, keys: list) -> float:
    """Predicted seconds of training these probes in one call: model-steps at the measured ensemble rate, and a
    fixed cost per probe (its evaluation data, readouts and files)."""
    iters = spec["probe"]["iters"]
    return len(keys) * (iters * spec["seconds_per_model_step"] + spec["seconds_per_probe"])


def k1_run(spec: dict, ledger: dict, root: str, device: str, deadline: float, jobs: int, max_probes: int,
           max_pieces: int, ledgers: str) -> str:
    """Pieces until the searches end, the next one does not fit before `deadline`, or max_pieces are done.
    Returns what remains."""
    for _ in range(max_pieces):
        searches, _ = k1_state(spec, ledger)
        pending = probes.pending_probes(searches)
        if not pending:
            return "nothing left: every search has ended"
        # the spec's rate, corrected by the slowest piece measured on this card so far
        scale = max([p["seconds"] / p["predicted"] for p in ledger["pieces"] if p["card"] == card(device)] or [1.0])
        fit = [key for i, key in enumerate(pending, 1) if scale * k1_piece_cost(spec, pending[:i]) <= deadline - time.time()]
        take = pending[:min(len(fit), max_probes)]
        if not take:
            return (f"{len(pending)} probes pending in this round (~{scale * k1_piece_cost(spec, pending[:1]):.0f} s "
                    f"each); none fits the time left")
        predicted = scale * k1_piece_cost(spec, take)
        # ensembles of one group each: the controls of a round train together, injected probes per K
        cfgs = [probes.probe_config(spec["preset"], spec["probe"], *key, root, device=device, **flag(spec)) for key in take]
        t0 = time.time()
        print(f"piece {len(ledger['pieces']) + 1}: {len(take)} of {len(pending)} pending probes "
              f"(~{predicted:.0f} s predicted)", flush=True)
        outcome = probes.run_probes(cfgs, jobs)
        seconds = time.time() - t0
        ledger["pieces"].append({"probes": [{"condition": c, "K": K, "seed": s, "rows": compact(rows, DENSE_KEYS)}
                                            for (c, K, s), rows in zip(take, outcome)],
                                 **stamp(device, seconds, sum(cfg.iters for cfg in cfgs)),
                                 "predicted": round(k1_piece_cost(spec, take), 1)})  # at the spec's rate
        save_ledger(ledger, ledgers)
        print(f"piece done in {seconds:.0f} s (predicted {predicted:.0f})", flush=True)
    searches, _ = k1_state(spec, ledger)
    pending = probes.pending_probes(searches)
    return f"{max_pieces} pieces done; {len(pending)} probes pending" if pending else "nothing left: every search has ended"


def flag(spec: dict) -> dict:
    """The probes' train.Config values beyond the experiment preset's own (bf16)."""
    return {"bf16": True} if spec["probe"].get("bf16") else {}


def k1_report(spec: dict, ledger: dict) -> dict:
    """Per condition and seed: K1* when its search ended, else the bracket so far; the probes' summaries."""
    searches, outcomes = k1_state(spec, ledger)
    probe_runs = thresholds.k1_runs(outcomes)
    seeds = {}
    for (cond, seed), s in searches.items():
        below = [K for K, up in s.probes.items() if not up]
        above = [K for K, up in s.probes.items() if up]
        seeds.setdefault(cond, []).append({
            "seed": seed, "done": not s.pending(), **(s.result() if not s.pending() else {}),
            "bracket": [max(below) if below else None, min(above) if above else None], "probes": len(s.probes)})
    K1 = {c: [r.get("K1_star") for r in rows if r["done"]] for c, rows in seeds.items()}
    p = spec["probe"]
    return {"preset": spec["preset"], "iters": p["iters"], "N": p["N"], "phi_star": thresholds.PHI_STAR,
            "search": {"lo": p["lo"], "hi": p["hi"], "ratio": p["ratio"]}, "seeds": seeds,
            "median_K1_star": {c: statistics.median([v for v in vs if v is not None]) if any(v is not None for v in vs)
                               else None for c, vs in K1.items()},
            "runs": probe_runs, "pieces": [{k: piece.get(k) for k in VOLATILE} | {"probes": len(piece["probes"])}
                                     for piece in ledger["pieces"]]}


def plot_k1_campaign(result: dict, path: str):
    """Fig. 7a (max phi_beta(2) against K), A9 (min L_gen against K) per seed, and each seed's K1* or bracket."""
    colors = {"control": "k", "reweight": "tab:blue", "inject": "tab:red"}
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for cond in result["seeds"]:
        for seed in sorted({r["seed"] for r in result["runs"] if r["condition"] == cond}):
            rs = sorted((r for r in result["runs"] if r["condition"] == cond and r["seed"] == seed), key=lambda r: r["K"])
            style = dict(color=colors[cond], marker=".", lw=0.8, alpha=0.7)
            axes[0].plot([r["K"] for r in rs], [r["max_phi_beta"] for r in rs], **style)
            axes[1].plot([r["K"] for r in rs], [r["min_gen_loss"] for r in rs], **style)
        axes[0].plot([], [], color=colors[cond], label=cond)
    axes[0].axhline(result["phi_star"], color="gray", ls="--", lw=1, label="phi_beta* = 0.45")
    for ax, label in ((axes[0], "max_t phi_beta(2)"), (axes[1], "min_t L_gen")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("K")
        ax.set_ylabel(label)
    axes[0].legend(fontsize=8)
    axes[0].set_title("Fig. 7a: max phi_beta(2) per probe")
    axes[1].set_title("Fig. A9: min L_gen per probe")
    ax = axes[2]
    for i, (cond, rows) in enumerate(result["seeds"].items()):
        xs = i + np.linspace(-0.25, 0.25, len(rows)) if len(rows) > 1 else [i]
        for x, r in zip(xs, rows):
            lo, hi = r["bracket"]
            if r["done"] and r.get("K1_star") is not None:
                ax.plot(x, r["K1_star"], "o", color=colors[cond])
            elif r["probes"]:  # a search still running (or outside [lo, hi]): its bracket; none yet: nothing
                ax.vlines(x, lo or result["search"]["lo"] / 1.3, hi or result["search"]["hi"] * 1.3, color=colors[cond],
                          lw=2, alpha=0.5)
        if result["median_K1_star"].get(cond) is not None:
            ax.hlines(result["median_K1_star"][cond], i - 0.3, i + 0.3, color=colors[cond])
    ax.axhline(94, color="gray", ls=":", lw=1, label="the paper's K1* ~ 94")
    ax.set_xticks(range(len(result["seeds"])), list(result["seeds"]))
    ax.set_yscale("log", base=2)
    ax.set_ylabel("K1* (dot) or its bracket so far (bar)")
    ax.set_title("Fig. 7c: K1* per seed (line: median of the ended searches)")
    ax.legend(fontsize=8)
    done = sum(r["done"] for rows in result["seeds"].values() for r in rows)
    total = sum(len(rows) for rows in result["seeds"].values())
    fig.suptitle(f"K1* at the paper's scale (N = {result['N']}, {result['iters']} steps per probe): {done}/{total} "
                 f"searches ended, {len(result['runs'])} probes", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# ----------------------------------------------------------------------------- circuits and task vectors

METRIC_KEYS = ("step", "train_loss", "gen_loss", "kl_1gen", "kl_2gen", "kl_1mem", "kl_2mem", "train_loss_1gen",
               "train_loss_2gen", "train_loss_1mem", "train_loss_2mem", "gen_loss_1gen", "gen_loss_2gen",
               "gen_loss_1mem", "gen_loss_2mem", "phi_delta_1", "phi_delta_2", "phi_beta_1", "phi_beta_2", "n_A_1",
               "n_A_2")


def circuits_run(spec: dict, ledger: dict, root: str, device: str, deadline: float, figures: str,
                 ledgers: str) -> str:
    if ledger["pieces"]:
        return "nothing left: the runs are trained and traced"
    predicted = spec["iters"] * spec["seconds_per_step"]
    if predicted > deadline - time.time():
        return f"the piece needs ~{predicted:.0f} s of training; it does not fit the time left"
    t0 = time.time()
    cfgs = {name: probes.run_config(spec["preset"], {**train.PRESETS[spec["preset"]], **spec["train"]}, K, spec["seed"],
                                    os.path.join(root, f"K{K}_s{spec['seed']}"), device=device, iters=spec["iters"])
            for name, K in spec["Ks"].items()}
    print(f"training K = {', '.join(str(c.K) for c in cfgs.values())} together for {spec['iters']} steps "
          f"(~{predicted:.0f} s predicted)", flush=True)
    rows = runs.train_ensemble(list(cfgs.values()), os.path.join(root, "ckpt_circuits.pt"), overwrite=True)
    seconds_train = time.time() - t0
    run_dirs = {name: cfg.out for name, cfg in cfgs.items()}
    phases = trace.trace_phases(run_dirs, spec["trace_seqs"], seed=0)
    piece = {"runs": {name: {"config": {k: v for k, v in vars(cfg).items() if k != "out"},
                             "rows": compact([r for r in rs if not r.get("dense")], METRIC_KEYS)}
                      for (name, cfg), rs in zip(cfgs.items(), rows)},
             "phases": {ph: {**d, "run": "gen" if d["run"] == run_dirs["gen"] else "mem"} for ph, d in phases.items()},
             "seconds_train": round(seconds_train, 1)}
    tv_dir = os.path.join(root, "task_vectors")
    os.makedirs(tv_dir, exist_ok=True)
    result = task_vectors.experiments(run_dirs["mem"], [run_dirs["mem"]], spec["tv_per_chain"], spec["tv_patch_seqs"], 0, tv_dir)
    piece["task_vectors"] = {k: v for k, v in result.items() if k not in ("seconds", "runs")}  # t-SNE layouts included
    ledger["pieces"].append({**piece, **stamp(device, time.time() - t0, spec["iters"] * len(cfgs))})
    save_ledger(ledger, ledgers)
    return f"trained and traced in {time.time() - t0:.0f} s; nothing left"


def margins(rows: list[dict], phases: dict) -> dict:
    """For each traced phase: the divergence of its checkpoint to the phase's predictor and to the runner-up."""
    out = {}
    for ph, d in phases.items():
        row = next(r for r in rows[d["run"]] if r["step"] == d["step"])
        others = {p: row[f"kl_{p}"] for p in ("1gen", "2gen", "1mem", "2mem") if p != ph}
        runner = min(others, key=others.get)
        out[ph] = {"step": d["step"], "run": d["run"], "divergence": row[f"kl_{ph}"], "runner_up": runner,
                   "runner_up_divergence": others[runner], "margin": others[runner] - row[f"kl_{ph}"]}
    return out


def circuits_report(spec: dict, ledger: dict, figures: str, name: str) -> dict | None:
    if not ledger["pieces"]:
        return None
    piece = ledger["pieces"][0]
    rows = {run: piece["runs"][run]["rows"] for run in piece["runs"]}
    phases = {ph: {**d, "run": f"K{spec['Ks'][d['run']]}"} for ph, d in piece["phases"].items()}
    trace.plot_circuits(phases, os.path.join(figures, f"{name}.png"))
    for run, cfg in piece["runs"].items():
        config = train.Config(**{**cfg["config"], "out": ""})
        train.plot_run(rows[run], config, os.path.join(figures, f"{name.replace('circuits', 'fig2a')}_K{config.K}.png"))
    tv_name = name.replace("circuits", "task_vectors")
    task_vectors.plot(piece["task_vectors"], os.path.join(figures, f"{tv_name}.png"))
    with open(os.path.join(figures, f"{tv_name}.json"), "w") as f:
        json.dump(piece["task_vectors"], f, indent=1)
    return {"iters": spec["iters"], "Ks": spec["Ks"], "phases": phases, "margins": margins(rows, piece["phases"]),
            "final": {run: {k: rs[-1][k] for k in ("step", "train_loss", "gen_loss", "kl_1gen", "kl_2gen", "kl_1mem",
                                                      "kl_2mem", "phi_beta_2")} for run, rs in rows.items()},
            "pieces": [{k: p.get(k) for k in VOLATILE} for p in ledger["pieces"]]}


# ----------------------------------------------------------------------------- command line


def run(name: str, budget_min: float, device: str, root: str, jobs: int = 1, max_probes: int = 10**6,
        max_pieces: int = 10**6, figures: str = "figures", ledgers: str = LEDGERS) -> str:
    """The next pieces of campaign `name` that fit budget_min minutes; appends them to its ledger."""
    ledger = load_ledger(name, ledgers)
    spec = SPECS[name]
    deadline = time.time() + 60 * budget_min
    if os.path.isdir(root):  # run directories of an earlier call are never reused: the ledger is the record
        shutil.rmtree(root)
    if spec["kind"] == "k1":
        return k1_run(spec, ledger, root, device, deadline, jobs, max_probes, max_pieces, ledgers)
    return circuits_run(spec, ledger, root, device, deadline, figures, ledgers)


def report(name: str, figures: str = "figures", ledgers: str = LEDGERS) -> dict | None:
    """figures/<name>.png and .json (and their companions) from the ledger alone."""
    ledger, spec = load_ledger(name, ledgers), SPECS[name]
    os.makedirs(figures, exist_ok=True)
    result = k1_report(spec, ledger) if spec["kind"] == "k1" else circuits_report(spec, ledger, figures, name)
    if result is None:
        return None
    if spec["kind"] == "k1":
        plot_k1_campaign(result, os.path.join(figures, f"{name}.png"))
    with open(os.path.join(figures, f"{name}.json"), "w") as f:
        json.dump(thresholds.finite_json(result), f, indent=1)
    return result


def status(name: str, ledgers: str = LEDGERS) -> str:
    ledger, spec = load_ledger(name, ledgers), SPECS[name]
    done = f"{len(ledger['pieces'])} pieces in {ledger_path(name, ledgers)}"
    if spec["kind"] == "circuits":
        return f"{done}; " + ("done" if ledger["pieces"] else "the one piece (train, trace, task vectors) remains")
    searches, outcomes = k1_state(spec, ledger)
    pending = probes.pending_probes(searches)
    ended = sum(not s.pending() for s in searches.values())
    return (f"{done}: {len(outcomes)} probes, {ended}/{len(searches)} searches ended; next: {len(pending)} probes "
            f"(~{k1_piece_cost(spec, pending) / 60:.1f} min at the spec's rate)")


def main():
    parser = cli.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for command, text in (("status", "what is done and what remains"),
                          ("run", "run the next pieces that fit the budget, appending to the ledger"),
                          ("report", "draw the campaign's figures and JSON from its ledger")):
        p = sub.add_parser(command, help=text)
        p.add_argument("campaign", choices=list(SPECS))
        p.add_argument("--ledgers", default=LEDGERS, help="where the ledgers are (default ledgers/)")
        if command == "run":
            p.add_argument("--budget-min", type=float, required=True, help="minutes this call may spend, analysis included")
            p.add_argument("--root", default=None, help="scratch run directories (default runs/campaign_<name>; emptied)")
            p.add_argument("--max-probes", type=int, default=10**6, help="k1: at most this many probes a piece")
            p.add_argument("--max-pieces", type=int, default=10**6, help="k1: stop after this many pieces")
            cli.add_device(p)
            cli.add_jobs(p)
        if command in ("run", "report"):
            cli.add_figures(p)
    args = parser.parse_args()
    if args.command == "status":
        print(status(args.campaign, args.ledgers))
    elif args.command == "run":
        if not args.budget_min > 0:
            raise ValueError(f"--budget-min must be > 0, got {args.budget_min}")
        device = cli.device(args.device)
        root = args.root or os.path.join("runs", f"campaign_{args.campaign}")
        cli.announce(SPECS[args.campaign]["preset"], f"campaign {args.campaign}, {args.budget_min} min on {device}, "
                     f"scratch runs in {root}", ledger_path(args.campaign, args.ledgers))
        print(run(args.campaign, args.budget_min, device, root, args.jobs, args.max_probes, args.max_pieces, args.figures,
                  args.ledgers))
        print(status(args.campaign, args.ledgers))
    else:
        result = report(args.campaign, args.figures, args.ledgers)
        print(f"wrote {args.figures}/{args.campaign}.png and .json" if result else "the ledger has no piece yet")


if __name__ == "__main__":
    cli.run(main)
