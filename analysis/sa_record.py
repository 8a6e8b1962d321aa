"""The record of Figs. 5-6, FIGURES/sa_scaling.json, which two scripts share (Sec. "The transition from G1 to G2";
Appendix "Dynamics of the SA-transformer", "Testing predictions"): sa_dynamics.py writes the SA-transformer's dynamics
(the theory, the dynamics and frozen-weight runs with their exponents and rates, the landscapes: Figs. 5b-c, 6a, A4,
A7), sa_scaling.py the scaling of tau_2Gen with N (the SA-transformer's and the transformer's, with their fits) and the
runs with w held (Fig. 6b-c, whose beta and delta panels draw the dynamics runs). One record, since Fig. 6 draws from
both; here what the two scripts agree on: the presets, the dynamics runs' names in the record, what a stored
trajectory keeps, one preset per record, and a redraw's rule for rewriting it.
"""
import json
import os

from plumbing.rundir import write_json

NAME = "sa_scaling.json"  # in --figures

PRESETS = {
    # N_tau: lengths for tau_2Gen(N), control and bias ablation (sa_scaling.py; the largest also the landscape's);
    # N_dyn: length of the dynamics runs (sa_dynamics.py; seeds_dyn for the full model, seeds_reduced for the reduced
    # and frozen-weight ones); the transformer runs (Fig. 6c bottom, in the quick preset only with --transformer) each
    # to its drop's window's end or its step cap transformer_iters, ~4x the slowest head of 8 seeds at the paper's
    # (RESULTS.md)
    "quick": dict(N_tau=[32, 64, 128, 256], seeds_tau=2, N_dyn=64, seeds_dyn=3, seeds_reduced=2, transformer=False,
                  N_transformer=[24, 32, 48, 64, 128, 256], seeds_transformer=2, transformer_iters=6000,
                  transformer_eval_batch=1024, eval_batch=1024, landscape_batch=4096, mc_chains=200_000, stop_after=1.2),
    "paper": dict(N_tau=[32, 64, 128, 256, 512, 1024], seeds_tau=8, N_dyn=128, seeds_dyn=5, seeds_reduced=5, transformer=True,
                  N_transformer=[32, 64, 128, 256], seeds_transformer=8, transformer_iters=20_000,
                  transformer_eval_batch=2048, eval_batch=4096, landscape_batch=16384, mc_chains=1_000_000, stop_after=2.0),
}

DYNAMICS = {"full_control": (False, False), "full_ablation": (False, True), "reduced_control": (True, False),
            "reduced_ablation": (True, True)}  # the dynamics runs' settings by their name in the record: (reduced, ablate)
FROZEN = ("frozen_control", "frozen_ablation")  # the reduced model's runs with w held at the plateau's
TRAJECTORY = ("t", "masked_loss", "beta", "delta", "w", "levels", "tau", "run")  # what the figures read of a run


def dynamics_runs(record: dict) -> tuple[dict, dict]:
    """The record's dynamics runs as the figures take them: ({name in DYNAMICS: runs}, {name in FROZEN: runs})."""
    runs = record["runs"]
    dyn = {name: runs[name] for name in DYNAMICS}
    return dyn, {name: runs[name] for name in FROZEN}


def previous(path: str) -> dict:
    """The record at path as it stands, for a script to write its part into; {} where none is readable."""
    try:
        with open(path) as f:
            record = json.load(f)
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def check_preset(record: dict, preset: str, path: str):
    """A ValueError (exit 2, before training) unless the record's SA-transformer runs, if it holds any, are of `preset`:
    Fig. 6 draws both scripts' runs side by side, so one record holds one preset's (the transformer's runs have a
    protocol of their own, transformer_tau.check_protocol)."""
    if record.get("preset", preset) != preset:
        raise ValueError(f"{path} holds the {record['preset']} preset's SA-transformer runs: name --preset "
                         f"{record['preset']}, or --figures DIR for a record of the {preset} preset")


def keep(path: str, record: dict, before: dict, drawn: str, redone: str):
    """The end of a redraw that redid some of the record's numbers (`redone`, say "tau refitted"): the record written
    to path only if a number changed beyond float noise (plumbing.records.settle gives `before` back otherwise), so a
    pure redraw leaves a clone's record as it was; and a line saying what was written."""
    figures = os.path.dirname(path)
    if record == before:
        print(f"wrote {figures}/{drawn} from {path} ({redone}: the same numbers, the JSON left as it was)")
        return
    write_json(path, record, indent=1)
    print(f"wrote {figures}/{drawn} and {path} ({redone}, new numbers)")
