"""What each paper-scale campaign trains and keeps (campaigns/campaign.py runs them): the specs and the rates they were
sized by, the ledgers (ledgers/<campaign>.json: what a piece trained, never checkpoints), the runs of each kind of
campaign (K1* searches' probes, fixed grids) and what a piece of them is predicted to cost on a card.
"""
import datetime
import json
import os
from typing import NamedTuple

import torch

import train
from analysis import thresholds
from plumbing.rundir import write_json
from runners import probes

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
K1_PROBE = dict(probes.K1_PRESETS["paper"], bf16=True)  # the paper's K1* protocol (its "weight" is w = 1/10)
SPECS = {
    "circuits_paper": dict(kind="circuits", preset="paper", Ks={"gen": 1024, "mem": 128}, seed=0, iters=30_000,
                           train=dict(evals=40, bf16=True), trace_seqs=512, tv_per_chain=16, tv_patch_seqs=256,
                           seconds_per_step=0.006),
    "k1_paper": dict(kind="k1", preset="paper", probe=K1_PROBE, plan={"control": list(range(16)), "inject": list(range(4))},
                     seconds_per_model_step=1 / 1500, seconds_per_probe=8),
    # 1b: circuits_paper's K = 128 is in neither 1-Mem nor 2-Mem at 3 x 10^4 steps (its ledger); alone and longer.
    # A lone model's step is taken at the 2-model ensemble's 3.48 ms (an upper bound), the analysis (two phases
    # traced, the task vectors) at 2 x 13 + 111 s: 10^5 steps predict 348 + 140 = 488 s, a call of its own.
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
    write_json(ledger_path(ledger["campaign"], ledgers), ledger, indent=1)


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
    """The searches replayed from the ledger's probes: (searches, {(condition, K, seed): dense rows}). A search's
    state is a function of its probes alone (estimators.Search), whatever width of rounds they came in."""
    searches = probes.new_searches(spec["probe"], spec["plan"])
    records = {(r["condition"], r["K"], r["seed"]): r for piece in ledger["pieces"] for r in piece["probes"]}
    for (cond, K, seed), record in records.items():
        searches[cond, seed].record(K, probe_generalizes(record))
    return searches, {key: r["rows"] for key, r in records.items()}


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


def flag(spec: dict) -> dict:
    """The probes' train.Config values beyond the experiment preset's own (bf16)."""
    return {"bf16": True} if spec["probe"].get("bf16") else {}


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


# ----------------------------------------------------------------------------- what a piece costs on a card


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
    and a piece of several schedules (control and injected probes) trains several ensembles. A piece that overruns
    the deadline is killed and lost, hence the margin (the fit's largest overrun) and no negative fixed cost. While
    the pieces cannot tell the two terms apart (all of one predicted seconds per ensemble), or if the fit says larger
    pieces are faster, the slowest piece's factor; before any piece on this card, the spec's rate. Pieces shared with
    other campaigns (a call's, "shared") are left out: their seconds are not this spec's alone (call_rate fits them)."""
    return fit_seconds([(ensembles(piece_keys(p)), p["predicted"], p["seconds"])
                        for p in ledger["pieces"] if p["card"] == card_name and "shared" not in p])


def fit_seconds(measured: list[tuple[float, float, float]]) -> Calibration:
    """Calibration(a, c, margin) of y ~ a e + c x over the pieces (e, x, y), by least squares, with no negative a and
    the largest overrun as the margin; where the terms cannot be told apart or c <= 0, the largest y / x alone;
    Calibration(0, 1, 0) without pieces."""
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


def piece_rate(ledgers: dict, card_name: str) -> Calibration:
    """Seconds of a piece on this card ~ a * ensembles + c * model-steps (+ the largest overrun), fit on every piece
    the campaigns' ledgers measured on it (a call's shared piece once); None before any."""
    measured = {}
    for name, ledger in ledgers.items():
        spec = SPECS[name]
        for p in ledger["pieces"]:
            if p["card"] != card_name or "model_steps" not in p or spec["kind"] == "circuits":
                continue
            if "shared" in p:
                measured[p["shared"]["id"]] = (p["shared"]["ensembles"], p["shared"]["model_steps"], p["seconds"])
            else:
                keys = piece_keys(p)
                ensembles = k1_ensembles(spec, keys) if spec["kind"] == "k1" else grid_ensembles(spec, keys)
                measured[(name, len(measured))] = (ensembles, p["model_steps"], p["seconds"])
    return fit_seconds(list(measured.values())) if measured else None


def nominal_rate(name: str) -> Calibration:
    """The spec's own rate, before any piece on the card: its fixed cost an ensemble and its seconds a model-step
    (a k1 spec's per-probe cost spread over the probe's steps), with no margin."""
    spec = SPECS[name]
    per_step = spec["seconds_per_model_step"]
    if spec["kind"] == "k1":
        per_step += spec["seconds_per_probe"] / spec["probe"]["iters"]
    return Calibration(spec.get("seconds_per_ensemble", K1_RATE["seconds_per_ensemble"]), per_step, 0.0)
