"""Campaigns: the paper-scale experiments run a piece at a time, on GPU leases of a few minutes, with a ledger that
accumulates in the repository (engine; the experiments themselves are k1.py's, k2.py's, trace.py's and
task_vectors.py's).

A lent GPU comes for ~10 minutes a command, and its run directories are gone after the call. So each piece
trains, evaluates and analyses within one call, and appends what the analysis needs to ledgers/<campaign>.json:
configs, readouts and losses, circuit edges, task-vector results; never checkpoints. The figures are drawn from
the ledger, so they can be redrawn on any machine.

    python campaign.py status k1_paper                  # what is done, what remains
    python campaign.py run k1_paper --budget-min 6       # the next pieces that fit 6 minutes (GPU)
    python campaign.py report k1_paper                   # figures/k1_paper.png and .json from the ledger

The sizes of the pieces come from the seconds the committed ledgers measured (SPECS says how); on a card that has
measured pieces of the campaign, the spec's predictions are calibrated by them (calibration: a fixed cost per
ensemble and a factor on the spec's seconds, fit by least squares, plus the fit's largest overrun).

circuits_paper  Figs. 3, 4, A2, A3, A8 at the paper's scale: K = 1024 (1-Gen, 2-Gen) and K = 128 (1-Mem, 2-Mem),
                seed 0, trained together for `iters` steps, then trace.py's circuits and task_vectors.py's
                experiments on them in the same call. One piece.
circuits_mem_paper
                the same for K = 128 alone (1-Mem, 2-Mem), 10^5 steps: circuits_paper's K = 128 was in neither
                phase after 3 x 10^4. One piece, a call of its own (~8 min predicted).
k1_paper        Figs. 7a, A9, 7c: K1* per seed by binary search over integer K (16 control seeds, 4 with task
                injection), 10^4 steps per probe, phi_beta(2) every 100 steps on 4096 sequences (the paper's
                protocol). A round's probes are independent runs: a piece is a round, or as many of its probes as
                fit the budget.
grids           fixed lists of (condition, K, seed) runs with given train settings; a piece is as many runs as fit
                the budget, in the spec's order, trained together (ensembles on CUDA, one-thread processes on a
                CPU); the ledger keeps per run its config, dense readouts and full evaluations. Each has its report
                (campaign_reports.py):
  reweight_paper  Fig. 7c at the paper's w = 1/10: K = 94, 128, 192 x 2 seeds, 10^5 steps (x 1/w) against the
                  control's 10^4; per condition Fig. 7a / A9 (max phi_beta(2), L_gen) and each seed's K1* bracket.
  tau_paper       Fig. 7b: tau_2gen at K = 94 over 64 seeds, 10^4 steps, 'never' counted.
  sweep_paper     Figs. 2b, 2c: K = 2^3..2^10 x 2 seeds, 3 x 10^4 steps with 40 full evaluations: the heat maps
                  of the divergences to the four predictors and the readouts.
The tests run CPU-sized stand-ins of each kind through the same code (tests/stand_ins.py: a campaign interrupted
after every piece gives the same ledger and figures as one uninterrupted call; the reports on known ledgers).
"""
import datetime
import json
import os
import shutil
import time
from typing import NamedTuple

import torch

import campaign_reports as reports
import cli
import grids
import k1
import probes
import runs
import task_vectors
import thresholds
import trace
import train
from markov import check_int

LEDGERS = "ledgers"

# A campaign's spec is fixed once its first piece is in the ledger (the ledger keeps a copy and refuses another).
# "train": train.Config values on top of the train preset "preset"; bf16: the K = 94 grid reproduced tau_2gen and
# phi_beta within 0.006 in bf16 on an H100, at ~2x the fp32 rate.
#
# Sizing, from the seconds the committed ledgers measured on an NVIDIA H100 80GB HBM3 (2026-11-27):
# - k1_paper's four pieces, each one ensemble of 10^4-step probes with phi_beta(2) every 100 steps on 4096
#   sequences (8, 2, 6, 3 probes in 106.1, 51.4, 89.7, 68.3 s), fit by least squares as 38 s per ensemble
#   (compilation, evaluation data) + 0.86 ms per model-step (residuals within 5 s): K1_RATE below;
# - circuits_paper's training, one 2-model ensemble of 3 x 10^4 steps with 40 full evaluations in 104.4 s: less the
#   38 s per ensemble, 1.11 ms per model-step with full evaluations (FULL_RATE), 3.48 ms per step of the ensemble;
#   its analysis, 164 s: four phases traced in 12.5-13.6 s each (the call's log,
#   bench/results/2026-11-27_h100_campaign_d.log) and task_vectors.experiments on the K = 128 run in 111 s.
K1_RATE = dict(seconds_per_ensemble=38, seconds_per_model_step=0.00086)
FULL_RATE = dict(seconds_per_ensemble=38, seconds_per_model_step=0.00111)
K1_PROBE = dict(k1.PRESETS["paper"], bf16=True)  # the paper's K1* protocol (its "weight" is w = 1/10)
SPECS = {
    "circuits_paper": dict(kind="circuits", preset="paper", Ks={"gen": 1024, "mem": 128}, seed=0, iters=30_000,
                           train=dict(evals=40, bf16=True), trace_seqs=512, tv_per_chain=16, tv_patch_seqs=256,
                           seconds_per_step=0.006),
    "k1_paper": dict(kind="k1", preset="paper", probe=K1_PROBE, plan={"control": list(range(16)), "inject": list(range(4))},
                     seconds_per_model_step=1 / 1500, seconds_per_probe=8),
    # 1b: circuits_paper's K = 128 was in neither 1-Mem nor 2-Mem after 3 x 10^4 steps; alone and longer. A lone
    # model's step is taken at the 2-model ensemble's 3.48 ms (an upper bound), the analysis (two phases traced,
    # the task vectors) at 2 x 13 + 111 s: 10^5 steps predict 348 + 140 = 488 s, a call of its own.
    "circuits_mem_paper": dict(kind="circuits", preset="paper", Ks={"mem": 128}, seed=0, iters=100_000,
                               train=dict(evals=40, bf16=True), trace_seqs=512, tv_per_chain=16, tv_patch_seqs=256,
                               seconds_per_step=0.00348, seconds_analysis=140),
    # 3, Fig. 7c: gradient reweighting at the paper's w = 1/10 on a fixed grid, 10^5 steps (x 1/w) against the
    # control's 10^4 at the same K and seeds. The reweighting path's own rate is not measured yet: K1_RATE, corrected
    # after its first pieces (calibration). Controls 38 + 52 s; each reweighted run 86 s.
    "reweight_paper": dict(kind="grid", report="reweight", preset="paper", train=K1_PROBE,
                           conditions=["control", "reweight"], Ks=[94, 128, 192], seeds=[0, 1], **K1_RATE),
    # 4, Fig. 7b: tau_2gen at the paper's K1* ~ 94 over 64 seeds, 10^4 steps: 64 x 8.6 s + 38 s per ensemble,
    # two calls
    "tau_paper": dict(kind="grid", report="tau", preset="paper", train=K1_PROBE, conditions=["control"], Ks=[94],
                      seeds=list(range(64)), **K1_RATE),
    # 5, Figs. 2b, 2c: K = 2^3..2^10, 2 seeds, 3 x 10^4 steps with 40 full evaluations (circuits_paper's runs, whose
    # K = 128 and 1024 of seed 0 these repeat): a seed's 8 runs predict 38 + 266 = 304 s, a piece per call
    "sweep_paper": dict(kind="grid", report="sweep", preset="paper", train=dict(iters=30_000, evals=40, bf16=True),
                        conditions=["control"], Ks=[2**i for i in range(3, 11)], seeds=[0, 1], **FULL_RATE),
}


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


DENSE_KEYS = ("step", "phi_beta_2", "gen_loss", "train_loss")  # what the ledger keeps of the dense readouts
METRIC_KEYS = ("step", "train_loss", "gen_loss", "kl_1gen", "kl_2gen", "kl_1mem", "kl_2mem", "train_loss_1gen",
               "train_loss_2gen", "train_loss_1mem", "train_loss_2mem", "gen_loss_1gen", "gen_loss_2gen",
               "gen_loss_1mem", "gen_loss_2mem", "phi_delta_1", "phi_delta_2", "phi_beta_1", "phi_beta_2", "n_A_1",
               "n_A_2")  # and of the full evaluations


# ----------------------------------------------------------------------------- K1*: rounds of probes


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


def k1_configs(spec: dict, keys: list, root: str = "", device: str = "cpu") -> list[train.Config]:
    """The probes (condition, K, seed) `keys` as train.Configs under root."""
    return [probes.probe_config(spec["preset"], spec["probe"], *key, root, device=device, **flag(spec)) for key in keys]


def k1_ensembles(spec: dict, keys: list) -> int:
    """How many ensembles these probes train as on CUDA (k1_train): each pays the fixed cost k1_piece_cost omits."""
    return len(probes.ensemble_groups(k1_configs(spec, keys)))


def k1_pending(spec: dict, ledger: dict) -> list:
    return probes.pending_probes(k1_state(spec, ledger)[0])


def k1_train(spec: dict, keys: list, root: str, device: str, jobs: int) -> tuple[dict, int]:
    """The probes `keys` trained (as ensembles of one schedule each on CUDA: the controls of a round together,
    injected probes per K): their ledger records, and the model-steps."""
    cfgs = k1_configs(spec, keys, root, device)
    outcome = probes.run_probes(cfgs, jobs, quiet=False)  # on a GPU the log shows where each ensemble's time went
    return ({"probes": [{"condition": c, "K": K, "seed": s, "rows": compact(rows, DENSE_KEYS)}
                        for (c, K, s), rows in zip(keys, outcome)]}, sum(cfg.iters for cfg in cfgs))


def flag(spec: dict) -> dict:
    """The probes' train.Config values beyond the experiment preset's own (bf16)."""
    return {"bf16": True} if spec["probe"].get("bf16") else {}


# ----------------------------------------------------------------------------- pieces that fit a budget


class Calibration(NamedTuple):
    """A piece of `ensembles` ensembles that the spec predicts at `predicted` seconds takes
    a * ensembles + c * predicted + margin seconds on the card."""
    a: float  # seconds per ensemble beyond the spec's prediction (compilation, evaluation data)
    c: float  # measured seconds per predicted second
    margin: float  # the most a measured piece took beyond a * ensembles + c * predicted

    def seconds(self, ensembles: int, predicted: float) -> float:
        return self.a * ensembles + self.c * predicted + self.margin


def piece_keys(piece: dict) -> list:
    """The runs (condition, K, seed) a k1 or grid piece of the ledger trained."""
    return [(r["condition"], r["K"], r["seed"]) for r in piece["probes" if "probes" in piece else "members"]]


def calibration(ledger: dict, card_name: str, ensembles) -> Calibration:
    """The spec's predictions corrected by the pieces measured on this card: seconds ~ a * ensembles + c * predicted,
    fit by least squares (ensembles(keys) counts the ensembles a piece trains as). A fixed cost per ensemble, since
    each pays one (k1_paper's ~36 s of compilation and evaluation data) that k1_paper's cost model lacks, so that a
    factor alone (the slowest piece's measured / predicted) put its 8-probe pieces at two to three times their ~99 s;
    and a piece of several schedules (injected probes of several K) trains several ensembles. A piece that overruns
    the deadline is killed and lost, hence the margin (the fit's largest overrun) and no negative fixed cost. While
    the pieces cannot tell the two terms apart (all of one predicted seconds per ensemble), or if the fit says larger
    pieces are faster, the slowest piece's factor; before any piece on this card, the spec's rate."""
    measured = [(ensembles(piece_keys(p)), p["predicted"], p["seconds"])
                for p in ledger["pieces"] if p["card"] == card_name]
    if not measured:
        return Calibration(0.0, 1.0, 0.0)
    # the normal equations of the two-term fit
    see = sum(e * e for e, x, y in measured)
    sex = sum(e * x for e, x, y in measured)
    sxx = sum(x * x for e, x, y in measured)
    sey = sum(e * y for e, x, y in measured)
    sxy = sum(x * y for e, x, y in measured)
    det = see * sxx - sex ** 2  # 0 (to rounding) when the terms are proportional over the pieces
    if det > 1e-9 * see * sxx:
        a, c = (sxx * sey - sex * sxy) / det, (see * sxy - sex * sey) / det
        if a < 0:  # the best fit without a fixed cost
            a, c = 0.0, sxy / sxx
        if c > 0:
            return Calibration(a, c, max(y - a * e - c * x for e, x, y in measured))
    return Calibration(0.0, max(y / x for e, x, y in measured), 0.0)


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


# ----------------------------------------------------------------------------- grids: fixed lists of runs


def config_record(cfg: train.Config) -> dict:
    """A run's config as the ledger keeps it: everything but the scratch directory."""
    return {k: v for k, v in vars(cfg).items() if k != "out"}


def grid_keys(spec: dict) -> list:
    """The grid's runs (condition, K, seed) in training order: condition, then seed, then K (so that a piece holds
    runs of one schedule, one ensemble on CUDA)."""
    return [(c, K, s) for c in spec["conditions"] for s in spec["seeds"] for K in spec["Ks"]]


def grid_config(spec: dict, key: tuple, root: str, device: str) -> train.Config:
    """One run of the grid: the condition's train.py run (reweighting multiplies the iterations by 1/w)."""
    return probes.probe_config(spec["preset"], spec["train"], *key, root, device=device)


def grid_records(ledger: dict) -> list[dict]:
    return [m for piece in ledger["pieces"] for m in piece["members"]]


def grid_pending(spec: dict, ledger: dict) -> list:
    done = {(m["condition"], m["K"], m["seed"]) for m in grid_records(ledger)}
    return [key for key in grid_keys(spec) if key not in done]


def grid_ensembles(spec: dict, keys: list) -> int:
    """How many ensembles these runs train as on CUDA (grid_train)."""
    return len(probes.ensemble_groups([grid_config(spec, key, "", "cpu") for key in keys]))


def grid_cost(spec: dict, keys: list) -> float:
    """Predicted seconds of training these runs in one call: a fixed cost per ensemble (compilation, evaluation
    data) and the model-steps at the measured rate."""
    return (spec["seconds_per_ensemble"] * grid_ensembles(spec, keys)
            + spec["seconds_per_model_step"] * sum(grid_config(spec, key, "", "cpu").iters for key in keys))


def grid_train(spec: dict, keys: list, root: str, device: str, jobs: int) -> tuple[dict, int]:
    """The runs `keys` trained (ensembles on CUDA, one-thread processes on a CPU): per run its config, dense
    readouts and full evaluations as the ledger keeps them, and the model-steps."""
    cfgs = [grid_config(spec, key, root, device) for key in keys]
    probes.run_probes(cfgs, jobs, quiet=False)
    members = [{"condition": c, "K": K, "seed": s, "config": config_record(cfg),
                "dense": compact(runs.read_metrics(cfg.out, dense=True)[1], DENSE_KEYS),
                "full": compact(runs.read_metrics(cfg.out)[1], METRIC_KEYS)} for (c, K, s), cfg in zip(keys, cfgs)]
    return {"members": members}, sum(cfg.iters for cfg in cfgs)


# ----------------------------------------------------------------------------- circuits and task vectors


def circuits_run(spec: dict, ledger: dict, root: str, device: str, deadline: float, figures: str,
                 ledgers: str) -> str:
    if ledger["pieces"]:
        return "nothing left: the runs are trained and traced"
    # training, then tracing and task vectors (circuits_paper's spec, fixed by its ledger, predates the latter)
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
    # a memorizing run alone (circuits_mem_*) is traced in the memorizing phases only
    traced = trace.PREDICTORS if "gen" in run_dirs else ("1mem", "2mem")
    phases = trace.trace_phases(run_dirs, spec["trace_seqs"], seed=0, phases=traced)
    kind = {d: name for name, d in run_dirs.items()}  # "gen" or "mem"
    piece = {"runs": {name: {"config": config_record(cfg), "rows": compact([r for r in rs if not r.get("dense")], METRIC_KEYS)}
                      for (name, cfg), rs in zip(cfgs.items(), rows)},
             "phases": {ph: {**d, "run": kind[d["run"]]} for ph, d in phases.items()},
             "seconds_train": round(seconds_train, 1)}
    tv_dir = os.path.join(root, "task_vectors")
    os.makedirs(tv_dir, exist_ok=True)
    result = task_vectors.experiments(run_dirs["mem"], [run_dirs["mem"]], spec["tv_per_chain"], spec["tv_patch_seqs"], 0, tv_dir)
    piece["task_vectors"] = {k: v for k, v in result.items() if k not in ("seconds", "runs")}  # t-SNE layouts included
    ledger["pieces"].append({**piece, **stamp(device, time.time() - t0, spec["iters"] * len(cfgs))})
    save_ledger(ledger, ledgers)
    return f"trained and traced in {time.time() - t0:.0f} s; nothing left"


# ----------------------------------------------------------------------------- command line


def run(name: str, budget_min: float, device: str, root: str, jobs: int = 1, max_probes: int = 10**6,
        max_pieces: int = 10**6, figures: str = "figures", ledgers: str = LEDGERS) -> str:
    """The next pieces of campaign `name` that fit budget_min minutes; appends them to its ledger. max_probes: at
    most this many runs a piece (k1 probes, grid runs)."""
    ledger = load_ledger(name, ledgers)
    spec = SPECS[name]
    deadline = time.time() + 60 * budget_min
    if os.path.isdir(root):  # run directories of an earlier call are never reused: the ledger is the record
        shutil.rmtree(root)
    if spec["kind"] == "circuits":
        return circuits_run(spec, ledger, root, device, deadline, figures, ledgers)
    if spec["kind"] == "k1":
        return run_pieces(ledger, device, deadline, max_probes, max_pieces, ledgers, "probe",
                          lambda: k1_pending(spec, ledger), lambda keys: k1_piece_cost(spec, keys),
                          lambda keys: k1_ensembles(spec, keys), lambda keys: k1_train(spec, keys, root, device, jobs))
    return run_pieces(ledger, device, deadline, max_probes, max_pieces, ledgers, "run",
                      lambda: grid_pending(spec, ledger), lambda keys: grid_cost(spec, keys),
                      lambda keys: grid_ensembles(spec, keys), lambda keys: grid_train(spec, keys, root, device, jobs))


def report(name: str, figures: str = "figures", ledgers: str = LEDGERS) -> dict | None:
    """figures/<name>.png and .json (and their companions) from the ledger alone; None while it has no piece."""
    ledger, spec = load_ledger(name, ledgers), SPECS[name]
    if not ledger["pieces"]:
        return None
    os.makedirs(figures, exist_ok=True)
    if spec["kind"] == "k1":
        result = reports.k1_search(spec, *k1_state(spec, ledger), ledger["pieces"])
        reports.plot_k1_campaign(result, os.path.join(figures, f"{name}.png"))
    elif spec["kind"] == "circuits":
        result = reports.circuits(spec, ledger["pieces"], figures, name)
    else:
        result = reports.GRID[spec["report"]](spec, grid_records(ledger), ledger["pieces"], figures, name)
    with open(os.path.join(figures, f"{name}.json"), "w") as f:
        json.dump(thresholds.finite_json(result), f, indent=1)
    return result


def estimate(ledger: dict, keys: list, cost, ensembles) -> str:
    """status's estimate of `keys` as one piece: calibrated on the card of the ledger's last piece (the card the
    campaign runs on), at the spec's rate before any piece."""
    if not ledger["pieces"]:
        return f"~{cost(keys) / 60:.1f} min at the spec's rate"
    on = ledger["pieces"][-1]["card"]
    seconds = calibration(ledger, on, ensembles).seconds(ensembles(keys), cost(keys)) if keys else 0.0
    return f"~{seconds / 60:.1f} min on {on}"


def status(name: str, ledgers: str = LEDGERS) -> str:
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
            p.add_argument("--max-probes", type=int, default=10**6,
                           help="k1 and grid campaigns: at most this many runs (probes, grid runs) a piece")
            p.add_argument("--max-pieces", type=int, default=10**6, help="k1 and grid campaigns: stop after this many pieces")
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
        check_int("--max-probes", args.max_probes, 1)
        check_int("--max-pieces", args.max_pieces, 1)
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
