"""Campaigns: the paper-scale experiments run a piece at a time, on GPU leases of a few minutes, with a ledger that
accumulates in the repository (engine; the experiments themselves, and their figures, are k1.py's, sweep.py's,
circuits.py's and task_vectors.py's).

A lent GPU comes for ~10 minutes a command, and its run directories are gone after the call. So each piece
trains, evaluates and analyses within one call, and appends what the analysis needs to ledgers/<campaign>.json:
configs, readouts and losses, circuit edges, task-vector results; never checkpoints. Each figure script draws its
campaigns from their ledgers (campaigns/records.py: what they read), so the figures are drawn on any machine.

    python -m campaigns status k1_paper                  # what is done, what remains
    python -m campaigns run k1_paper --budget-min 6       # the next pieces that fit 6 minutes (GPU)
    python -m campaigns call k1_paper tau_paper reweight_paper --budget-min 8 --out OUT   # one process, full ensembles
    python k1.py ledger k1_paper                          # figures/k1_paper.png and .json from the ledger

What each campaign trains and keeps, and what a piece costs, is campaigns/specs.py's; this file runs them. The sizes
of the pieces come from the seconds the committed ledgers measured (SPECS says how); on a card that has
measured pieces of the campaign, the spec's predictions are calibrated by them (calibration: a fixed cost per
ensemble and a factor on the spec's seconds, fit by least squares, plus the fit's largest overrun).

circuits_paper  Figs. 3, 4, A2, A3, A8 at the paper's scale: K = 1024 (1-Gen, 2-Gen) and K = 128 (1-Mem, 2-Mem),
                seed 0, trained together for `iters` steps, then circuits.py and task_vectors.py run on them
                (each its own command, `analyse`) in the same call. One piece.
circuits_mem_paper
                the same for K = 128 alone (1-Mem, 2-Mem), 10^5 steps: circuits_paper's K = 128 is in neither
                phase at 3 x 10^4 (its ledger). One piece, a call of its own (~8 min predicted).
k1_paper        Figs. 7a, A9, 7c: K1* per seed by binary search over integer K (16 control seeds, 4 with task
                injection), 10^4 steps per probe, phi_beta(2) every 100 steps on 4096 sequences (the paper's
                protocol). A round's probes are independent runs: a piece is a round, or as many of its probes as
                fit the budget.
grids           fixed lists of (condition, K, seed) runs with given train settings; a piece is as many runs as fit
                the budget, in the spec's order, trained together (ensembles on CUDA, one-thread processes on a
                CPU); the ledger keeps per run its config, dense readouts and full evaluations. Each is drawn by
                its figure's script (records.drawn_by):
  reweight_paper  Fig. 7c at the paper's w = 1/10: K = 94, 128, 192 x 2 seeds, 10^5 steps (x 1/w) against the
                  control's 10^4; per condition Fig. 7a / A9 (max phi_beta(2), L_gen) and each seed's K1* bracket.
  tau_paper       Fig. 7b: tau_2gen at K = 94 over 64 seeds, 10^4 steps, 'never' counted.
  sweep_paper     Figs. 2b, 2c: K = 2^3..2^10 x 2 seeds, 3 x 10^4 steps with 40 full evaluations: the heat maps
                  of the divergences to the four predictors and the readouts.
The tests run CPU-sized stand-ins of each kind through the same code (tests/stand_ins.py: a campaign interrupted
after every piece gives the same ledger and figures as one uninterrupted call; the figures on known ledgers).
"""
import datetime
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from typing import NamedTuple

import torch

import train
from analysis import runs
from campaigns.records import drawn_by
from campaigns.specs import (DENSE_KEYS, LEDGERS, METRIC_KEYS, SPECS, calibration, card, compact, config_record,
                             grid_config, grid_cost, grid_ensembles, grid_keys, grid_pending, grid_records, k1_configs,
                             k1_ensembles, k1_pending, k1_piece_cost, k1_state, ledger_path, load_ledger, nominal_rate,
                             piece_rate, save_ledger, stamp)
from plumbing import cli
from runners import grids, probes

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # where the figure scripts are

# ----------------------------------------------------------------------------- training a campaign's pieces


def k1_train(spec: dict, keys: list, root: str, device: str, jobs: int) -> tuple[dict, int]:
    """The probes `keys` trained (as ensembles of one schedule each on CUDA: the controls of a round together, the
    injected probes together): their ledger records, and the model-steps."""
    cfgs = k1_configs(spec, keys, root, device)
    outcome = probes.run_probes(cfgs, jobs, quiet=False)  # on a GPU the log shows where each ensemble's time went
    return ({"probes": [{"condition": c, "K": K, "seed": s, "rows": compact(rows, DENSE_KEYS)}
                        for (c, K, s), rows in zip(keys, outcome)]}, sum(cfg.iters for cfg in cfgs))


def grid_train(spec: dict, keys: list, root: str, device: str, jobs: int) -> tuple[dict, int]:
    """The runs `keys` trained (ensembles on CUDA, one-thread processes on a CPU): per run its config, dense
    readouts and full evaluations as the ledger keeps them, and the model-steps."""
    cfgs = [grid_config(spec, key, root, device) for key in keys]
    probes.run_probes(cfgs, jobs, quiet=False)
    members = [{"condition": c, "K": K, "seed": s, "config": config_record(cfg),
                "dense": compact(runs.read_metrics(cfg.out, dense=True)[1], DENSE_KEYS),
                "full": compact(runs.read_metrics(cfg.out)[1], METRIC_KEYS)} for (c, K, s), cfg in zip(keys, cfgs)]
    return {"members": members}, sum(cfg.iters for cfg in cfgs)


def run_pieces(ledger: dict, device: str, deadline: float, max_runs: int, max_pieces: int, ledgers: str, noun: str,
               pending, cost, ensembles, train_piece) -> str:
    """Pieces until pending() is empty, the next piece does not fit before `deadline`, or max_pieces are done. A
    piece is the longest head of pending() whose cost(keys) (seconds at the spec's rate), calibrated on this card's
    pieces with ensembles(keys) ensembles, fits the time left, at most max_runs runs; train_piece(keys) returns its
    ledger records and model-steps. The ledger is saved after every piece, so a call killed midway loses only the
    piece it was training. Returns what remains."""
    for _ in range(max_pieces):
        todo = pending()
        if not todo:
            return f"nothing left: every {noun} is done"
        fitted = calibration(ledger, card(device), ensembles)

        def predicted(keys):
            return fitted.seconds(ensembles(keys), cost(keys))

        fit = [key for i, key in enumerate(todo, 1) if predicted(todo[:i]) <= deadline - time.time()]
        take = todo[:min(len(fit), max_runs)]
        if not take:
            return f"{len(todo)} {noun}s pending (~{predicted(todo[:1]):.0f} s for the next); none fits the time left"
        print(f"piece {len(ledger['pieces']) + 1}: {len(take)} of {len(todo)} pending {noun}s "
              f"(~{predicted(take):.0f} s predicted)", flush=True)
        t0 = time.time()
        records, model_steps = train_piece(take)
        seconds = time.time() - t0
        ledger["pieces"].append({**records, **stamp(device, seconds, model_steps),
                                 "predicted": round(cost(take), 1)})  # at the spec's rate: the calibration's regressor
        save_ledger(ledger, ledgers)
        print(f"piece done in {seconds:.0f} s (predicted {predicted(take):.0f})", flush=True)
    left = len(pending())
    return f"{max_pieces} pieces done; {left} {noun}s pending" if left else f"nothing left: every {noun} is done"


# ----------------------------------------------------------------------------- circuits and task vectors


def analyse(script: str, root: str, written: str, *flags) -> dict:
    """The JSON `written` that a figure script writes when run on the campaign's trained runs, in its own process
    (a figure script's command line is its interface: campaigns import none), with every core of this machine."""
    out = os.path.join(root, os.path.splitext(script)[0])
    command = [sys.executable, os.path.join(REPO, script), *map(str, flags), "--figures", out,
               "--threads", str(torch.get_num_threads())]
    subprocess.run(command, check=True)
    with open(os.path.join(out, written)) as f:
        return json.load(f)


def circuits_run(spec: dict, ledger: dict, root: str, device: str, deadline: float, ledgers: str) -> str:
    if ledger["pieces"]:
        return "nothing left: the runs are trained and traced"
    # training, then tracing and task vectors (seconds_analysis: circuits_paper's spec, fixed by its ledger, has none)
    predicted = spec["iters"] * spec["seconds_per_step"] + spec.get("seconds_analysis", 0)
    if predicted > deadline - time.time():
        return f"the piece needs ~{predicted:.0f} s (training and analysis); it does not fit the time left"
    t0 = time.time()
    cfgs = {name: probes.run_config(spec["preset"], {**train.PRESETS[spec["preset"]], **spec["train"]}, K, spec["seed"],
                                    os.path.join(root, f"K{K}_s{spec['seed']}"), device=device, iters=spec["iters"])
            for name, K in spec["Ks"].items()}
    print(f"training K = {', '.join(str(c.K) for c in cfgs.values())} together for {spec['iters']} steps "
          f"(~{predicted:.0f} s predicted)", flush=True)
    rows = grids.train_ensemble(list(cfgs.values()), os.path.join(root, "ckpt_circuits.pt"), overwrite=True)
    seconds_train = time.time() - t0
    run_dirs = {name: cfg.out for name, cfg in cfgs.items()}
    # the figures' own commands on the trained runs: circuits.py traces the phases (a memorizing run alone,
    # circuits_mem_*, in the memorizing phases only), task_vectors.py runs its experiments on the memorizing run
    traced = "1gen,2gen,1mem,2mem" if "gen" in run_dirs else "1mem,2mem"
    phases = analyse("circuits.py", root, "circuits.json", "--runs", ",".join(run_dirs.values()), "--phases", traced,
                     "--n-seqs", spec["trace_seqs"], "--seed", 0, "--preset", spec["preset"])["phases"]
    kind = {d: name for name, d in run_dirs.items()}  # "gen" or "mem"
    piece = {"runs": {name: {"config": config_record(cfg), "rows": compact([r for r in rs if not r.get("dense")], METRIC_KEYS)}
                      for (name, cfg), rs in zip(cfgs.items(), rows)},
             "phases": {ph: {**d, "run": kind[d["run"]]} for ph, d in phases.items()},
             "seconds_train": round(seconds_train, 1)}
    result = analyse("task_vectors.py", root, "task_vectors.json", "--run", run_dirs["mem"], "--runs", run_dirs["mem"],
                     "--per-chain", spec["tv_per_chain"], "--patch-seqs", spec["tv_patch_seqs"], "--seed", 0,
                     "--preset", spec["preset"])
    piece["task_vectors"] = {k: v for k, v in result.items() if k not in ("seconds", "runs")}  # t-SNE layouts included
    ledger["pieces"].append({**piece, **stamp(device, time.time() - t0, spec["iters"] * len(cfgs))})
    save_ledger(ledger, ledgers)
    return f"trained and traced in {time.time() - t0:.0f} s; nothing left"


# ----------------------------------------------------------------------------- a call: ensembles filled across campaigns


class Slot(NamedTuple):
    """One run of a call's piece: its campaign, its key (condition, K, seed) and its train.Config."""
    campaign: str
    key: tuple
    cfg: train.Config


def campaign_runs(name: str, ledger: dict, width: int = 1, root: str = "", device: str = "cpu",
                  configs: dict | None = None) -> list[Slot]:
    """The campaign's pending runs in its order: a k1 campaign's next round of probes (`width` a search), a grid's
    runs not yet in its ledger. configs: a cache of the runs' train.Configs by (campaign, key)."""
    spec, configs = SPECS[name], {} if configs is None else configs
    if spec["kind"] == "k1":
        keys = probes.pending_probes(k1_state(spec, ledger)[0], width)
        make = lambda key: k1_configs(spec, [key], os.path.join(root, name), device)[0]  # noqa: E731
    else:
        keys = grid_pending(spec, ledger)
        make = lambda key: grid_config(spec, key, os.path.join(root, name), device)  # noqa: E731
    for key in keys:
        if (name, key) not in configs:
            configs[name, key] = make(key)
    return [Slot(name, key, configs[name, key]) for key in keys]


def fill(names: list[str], ledgers: dict, slots: int, root: str = "", device: str = "cpu") -> list[Slot]:
    """The runs of the next piece: one ensemble of at most `slots` runs of one schedule (probes.schedule). The
    schedule is the first pending run's, in the campaigns' order; the piece takes every pending run of that
    schedule in that order (the K1* searches' next probes, a fixed grid's runs that train the same way), and where
    slots remain, widens the open searches of that schedule (estimators.Search.pending(width): more K a search in
    one round, the same K1* as the binary search's wherever the rule is monotone in K): the widest round that fits."""
    configs = {}

    def runs_at(width: int) -> list[Slot]:
        return [slot for name in names for slot in campaign_runs(name, ledgers[name], width, root, device, configs)]

    pending = runs_at(1)
    if not pending:
        return []
    lead = probes.schedule(pending[0].cfg)
    piece = [slot for slot in pending if probes.schedule(slot.cfg) == lead][:slots]
    for width in range(2, slots + 1):  # spare slots: the searches of this schedule probe more K a round
        if len(piece) == slots:
            break
        wider = [slot for slot in runs_at(width) if probes.schedule(slot.cfg) == lead]
        if len(wider) > slots:
            break
        if len(wider) > len(piece):  # rounding can leave a width no wider than the one before
            piece = wider
    return piece


def record_piece(slots: list[Slot], rows: list[list[dict]], ledgers: dict, device: str, seconds: float, piece_id: str,
                 ledgers_dir: str):
    """Each campaign's share of a call's piece appended to its own ledger, with the piece's whole seconds, model-steps
    and ensembles under "shared" (the calibration's data); the ledgers saved."""
    total = sum(slot.cfg.iters for slot in slots)
    ensembles = len(probes.ensemble_groups([slot.cfg for slot in slots]))
    for name in dict.fromkeys(slot.campaign for slot in slots):
        mine = [(slot, r) for slot, r in zip(slots, rows) if slot.campaign == name]
        spec, keys = SPECS[name], [slot.key for slot, _ in mine]
        if spec["kind"] == "k1":
            records = {"probes": [{"condition": c, "K": K, "seed": s, "rows": compact(r, DENSE_KEYS)}
                                  for (c, K, s), (_, r) in zip(keys, mine)]}
            cost = k1_piece_cost(spec, keys)
        else:
            records = {"members": [{"condition": c, "K": K, "seed": s, "config": config_record(slot.cfg),
                                    "dense": compact(runs.read_metrics(slot.cfg.out, dense=True)[1], DENSE_KEYS),
                                    "full": compact(runs.read_metrics(slot.cfg.out)[1], METRIC_KEYS)}
                                   for (c, K, s), (slot, _) in zip(keys, mine)]}
            cost = grid_cost(spec, keys)
        ledgers[name]["pieces"].append({**records, **stamp(device, seconds, sum(slot.cfg.iters for slot, _ in mine)),
                                        "predicted": round(cost, 1),
                                        "shared": {"id": piece_id, "ensembles": ensembles, "model_steps": total,
                                                   "campaigns": sorted({slot.campaign for slot in slots})}})
        save_ledger(ledgers[name], ledgers_dir)


def pack(out: str, names: list[str], ledgers_dir: str):
    """out/campaign.tar.gz, written atomically: the campaigns' ledgers as the repository keeps them
    (ledgers/<name>.json), so that a call cut short returns every piece it finished."""
    os.makedirs(out, exist_ok=True)
    tmp = os.path.join(out, "campaign.tar.gz.tmp")
    with tarfile.open(tmp, "w:gz") as tar:
        for name in names:
            path = ledger_path(name, ledgers_dir)
            if os.path.exists(path):
                tar.add(path, arcname=os.path.join("ledgers", os.path.basename(path)))
    os.replace(tmp, os.path.join(out, "campaign.tar.gz"))


def check_fillable(names: list[str]):
    for name in names:
        if SPECS[name]["kind"] not in ("k1", "grid"):
            raise ValueError(f"{name} is a {SPECS[name]['kind']} campaign: `python -m campaigns run {name}` trains it")


def call(names: list[str], budget_min: float, device: str, root: str, jobs: int = 1, slots: int = 64,
         max_pieces: int = 10**6, ledgers_dir: str = LEDGERS, out: str | None = None) -> str:
    """One call of several k1 and grid campaigns in one process: pieces of one filled ensemble each (fill), while the
    next fits the time left before the budget's end (piece_rate on this card, else the lead campaign's own rate).
    After every piece the ledgers are saved and, with out, packed into out/campaign.tar.gz."""
    check_fillable(names)
    ledgers = {name: load_ledger(name, ledgers_dir) for name in names}
    deadline = time.time() + 60 * budget_min
    if os.path.isdir(root):  # run directories of an earlier call are never reused: the ledgers are the record
        shutil.rmtree(root)
    if out:  # what the call starts from, should its first piece not end
        pack(out, names, ledgers_dir)
    message, done = "", 0
    for done in range(max_pieces):
        piece = fill(names, ledgers, slots, root, device)
        if not piece:
            message = "nothing left: every run is done"
            break
        rate = piece_rate(ledgers, card(device)) or nominal_rate(piece[0].campaign)
        while piece and rate.seconds(1, sum(slot.cfg.iters for slot in piece)) > deadline - time.time():
            piece = piece[:-1]  # the runs the campaigns' order puts last wait for the next call
        if not piece:
            message = "the next piece does not fit the time left"
            break
        predicted = rate.seconds(1, sum(slot.cfg.iters for slot in piece))
        counts = {name: sum(slot.campaign == name for slot in piece) for name in names}
        print(f"piece {done + 1}: {len(piece)} runs ({', '.join(f'{n} {c}' for n, c in counts.items() if c)}), "
              f"~{predicted:.0f} s predicted", flush=True)
        t0 = time.time()
        rows = probes.run_probes([slot.cfg for slot in piece], jobs, quiet=False)
        seconds = time.time() - t0
        record_piece(piece, rows, ledgers, device, seconds, f"{datetime.datetime.now().isoformat()}#{done}", ledgers_dir)
        if out:
            pack(out, names, ledgers_dir)
        print(f"piece {done + 1} done in {seconds:.0f} s (predicted {predicted:.0f}); "
              f"{sum(slot.cfg.iters for slot in piece) / seconds:.0f} model-steps/s", flush=True)
    else:
        message = f"{max_pieces} pieces done"
    return message


# ----------------------------------------------------------------------------- command line


def run(name: str, budget_min: float, device: str, root: str, jobs: int = 1, max_probes: int = 10**6,
        max_pieces: int = 10**6, ledgers: str = LEDGERS) -> str:
    """The next pieces of campaign `name` that fit budget_min minutes; appends them to its ledger. max_probes: at
    most this many runs a piece (k1 probes, grid runs)."""
    ledger = load_ledger(name, ledgers)
    spec = SPECS[name]
    deadline = time.time() + 60 * budget_min
    if os.path.isdir(root):  # run directories of an earlier call are never reused: the ledger is the record
        shutil.rmtree(root)
    if spec["kind"] == "circuits":
        return circuits_run(spec, ledger, root, device, deadline, ledgers)
    if spec["kind"] == "k1":
        return run_pieces(ledger, device, deadline, max_probes, max_pieces, ledgers, "probe",
                          lambda: k1_pending(spec, ledger), lambda keys: k1_piece_cost(spec, keys),
                          lambda keys: k1_ensembles(spec, keys), lambda keys: k1_train(spec, keys, root, device, jobs))
    return run_pieces(ledger, device, deadline, max_probes, max_pieces, ledgers, "run",
                      lambda: grid_pending(spec, ledger), lambda keys: grid_cost(spec, keys),
                      lambda keys: grid_ensembles(spec, keys), lambda keys: grid_train(spec, keys, root, device, jobs))


def estimate(ledger: dict, keys: list, cost, ensembles) -> str:
    """status's estimate of `keys` as one piece: calibrated on the card of the ledger's last piece (the card the
    campaign runs on), at the spec's rate before any piece."""
    if not ledger["pieces"]:
        return f"~{cost(keys) / 60:.1f} min at the spec's rate"
    on = ledger["pieces"][-1]["card"]
    seconds = calibration(ledger, on, ensembles).seconds(ensembles(keys), cost(keys)) if keys else 0.0
    return f"~{seconds / 60:.1f} min on {on}"


def status(name: str, ledgers: str = LEDGERS) -> str:
    """What is done and what remains, and the command that draws the figures."""
    return f"{progress(name, ledgers)}; figures: {drawn_by(name)}"


def progress(name: str, ledgers: str = LEDGERS) -> str:
    """The pieces in the ledger, the runs done and pending, and the next piece's predicted time."""
    ledger, spec = load_ledger(name, ledgers), SPECS[name]
    done = f"{len(ledger['pieces'])} pieces in {ledger_path(name, ledgers)}"
    if spec["kind"] == "circuits":
        return f"{done}; " + ("done" if ledger["pieces"] else "the one piece (train, trace, task vectors) remains")
    if spec["kind"] == "grid":
        pending = grid_pending(spec, ledger)
        next_piece = estimate(ledger, pending, lambda keys: grid_cost(spec, keys),
                              lambda keys: grid_ensembles(spec, keys))
        return (f"{done}: {len(grid_records(ledger))}/{len(grid_keys(spec))} runs; next: {len(pending)} runs "
                f"({next_piece})")
    searches, outcomes = k1_state(spec, ledger)
    pending = probes.pending_probes(searches)
    ended = sum(not s.pending() for s in searches.values())
    next_piece = estimate(ledger, pending, lambda keys: k1_piece_cost(spec, keys),
                          lambda keys: k1_ensembles(spec, keys))
    return (f"{done}: {len(outcomes)} probes, {ended}/{len(searches)} searches ended; next: {len(pending)} probes "
            f"({next_piece})")


def main():
    gpu = "paper-scale GPU jobs: on an H100 a k1_paper piece of 1-8 probes took 41-106 s, 2026-11-27"
    parser = cli.ArgumentParser(prog="campaigns", description=__doc__.split("\n\n")[0], runs=(
        "Default run: none, a command is required: status about 5 s on the 2-core development VM, run and call up to "
        f"their --budget-min minutes ({gpu}); writes ledgers/<campaign>.json, scratch runs in "
        "runs/campaign_<campaign>/ (each command's --help: which). The figures: each campaign's script (status names "
        "it)."))
    sub = parser.add_subparsers(dest="command", required=True)
    for command, text, timing in (
            ("status", "what is done and what remains, and the command that draws its figures",
             "Default run: about 5 s on the 2-core development VM (an estimate: a process's imports, ~4 s there by "
             "tests/stand_ins.py), trains nothing; writes nothing, reads ledgers/<campaign>.json."),
            ("run", "run the next pieces that fit the budget, appending to the ledger",
             f"Default run: none, --budget-min is required: up to that many minutes, analysis included ({gpu}); writes "
             "ledgers/<campaign>.json after every piece, scratch runs in runs/campaign_<campaign>/ (emptied by the "
             "next call)."),
            ("call", "one process for several k1 and grid campaigns: pieces of one filled ensemble each",
             f"Default run: none, --budget-min is required: up to that many minutes ({gpu}); writes "
             "ledgers/<campaign>.json after every piece, scratch runs in runs/campaign_<the campaigns joined by _>/; "
             "with --out OUT/campaign.tar.gz too.")):
        p = sub.add_parser(command, help=text, runs=timing)
        if command == "call":
            p.add_argument("campaigns", nargs="+", choices=list(SPECS), metavar="campaign",
                           help="k1 and grid campaigns, in the order their runs fill a piece")
        else:
            p.add_argument("campaign", choices=list(SPECS))
        p.add_argument("--ledgers", default=LEDGERS, help="where the ledgers are (default ledgers/)")
        if command in ("run", "call"):
            p.add_argument("--budget-min", type=float, required=True, help="minutes this call may spend, analysis included")
            p.add_argument("--root", default=None, help="scratch run directories (default runs/campaign_<name>; emptied)")
            p.add_argument("--max-pieces", type=cli.at_least(1), default=10**6,
                           help="k1 and grid campaigns: stop after this many pieces")
            cli.add_device(p)
            cli.add_jobs(p)
        if command == "run":
            p.add_argument("--max-probes", type=cli.at_least(1), default=10**6,
                           help="k1 and grid campaigns: at most this many runs (probes, grid runs) a piece")
        if command == "call":
            p.add_argument("--slots", type=cli.at_least(1), default=64, help="models in a piece's ensemble (default 64)")
            p.add_argument("--out", default=None, help="pack the ledgers into OUT/campaign.tar.gz after every piece (a "
                           "call cut short returns what it finished)")
    args = parser.parse_args()
    if args.command == "status":
        print(status(args.campaign, args.ledgers))
        return
    if not args.budget_min > 0:
        raise ValueError(f"--budget-min must be > 0, got {args.budget_min}")
    device = cli.device(args.device)
    names = args.campaigns if args.command == "call" else [args.campaign]
    if args.command == "call":
        check_fillable(names)
    root = args.root or os.path.join("runs", f"campaign_{'_'.join(names)}")
    cli.announce(SPECS[names[0]]["preset"], f"campaigns {', '.join(names)}, {args.budget_min} min on {device}, "
                 f"scratch runs in {root}", ", ".join(ledger_path(name, args.ledgers) for name in names))
    if args.command == "call":
        print(call(names, args.budget_min, device, root, args.jobs, args.slots, args.max_pieces, args.ledgers, args.out))
    else:
        print(run(args.campaign, args.budget_min, device, root, args.jobs, args.max_probes, args.max_pieces,
                  args.ledgers))
    for name in names:
        print(status(name, args.ledgers))
