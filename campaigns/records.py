"""A campaign's ledger as the figure scripts read it: the numbers their paper-scale figures draw, from the ledger alone
(no run directory, no GPU). Each figure script draws its own campaigns (`python k1.py ledger k1_paper`, `python
sweep.py --ledger sweep_paper`, ...: drawn_by); this file computes what they share with the ledger's format.
"""
import os
import statistics

from analysis import thresholds
from campaigns.specs import LEDGERS, SPECS, grid_records, k1_state, ledger_path, load_ledger
from runners import probes

VOLATILE = ("card", "date", "seconds", "model_steps", "predicted")  # a piece's fields that differ between two identical runs


def drawn_by(name: str) -> str:
    """The command that draws campaign `name`'s figures and JSON from its ledger."""
    spec = SPECS[name]
    if spec["kind"] == "circuits":
        return f"python circuits.py --ledger {name}; python task_vectors.py --ledger {name}"
    if spec["kind"] == "grid" and spec["report"] == "sweep":
        return f"python sweep.py --ledger {name}"
    return f"python k1.py ledger {name}"  # K1* searches, the reweighting grid, tau_2gen


def pieces_of(name: str, kinds: tuple[str, ...], ledgers: str = LEDGERS) -> tuple[dict, dict]:
    """(spec, ledger) of campaign `name`, one of `kinds` (a spec's "kind", or a grid's "report"), with at least one
    piece; a one-line error otherwise."""
    if name not in SPECS or not {SPECS[name]["kind"], SPECS[name].get("report")} & set(kinds):
        mine = [n for n, s in SPECS.items() if {s["kind"], s.get("report")} & set(kinds)]
        raise ValueError(f"{name!r} is not a campaign this script draws; it draws {', '.join(mine)}")
    ledger = load_ledger(name, ledgers)
    if not ledger["pieces"]:
        path = ledger_path(name, ledgers)
        raise ValueError(f"{path} holds no piece yet: nothing to draw" if os.path.exists(path) else
                         f"no ledger {path} (the repository's ledgers/ is read from where the command runs)")
    return SPECS[name], ledger


def stamps(pieces: list[dict], runs_key: str | None = None) -> list[dict]:
    """Each piece's card, date and timings (and how many runs it trained, under runs_key)."""
    return [{k: p.get(k) for k in VOLATILE} | ({runs_key: len(p[runs_key])} if runs_key else {}) for p in pieces]


def k1_search(spec: dict, ledger: dict) -> dict:
    """Per condition and seed of a k1 campaign: K1* when its search ended, else the bracket so far; the probes'
    summaries (thresholds.k1_runs), each search replayed from the ledger (specs.k1_state)."""
    searches, outcomes = k1_state(spec, ledger)
    seeds = probes.search_rows(searches)
    K1 = {c: [r["K1_star"] for r in rows if r["done"]] for c, rows in seeds.items()}
    p = spec["probe"]
    return {"preset": spec["preset"], "iters": p["iters"], "N": p["N"], "weight": p["weight"], "phi_star": thresholds.PHI_STAR,
            "search": {"lo": p["lo"], "hi": p["hi"], "ratio": p["ratio"]}, "seeds": seeds,
            "median_K1_star": {c: statistics.median([v for v in vs if v is not None]) if any(v is not None for v in vs)
                               else None for c, vs in K1.items()},
            "runs": thresholds.k1_runs(outcomes), "pieces": stamps(ledger["pieces"], "probes")}


def grid_runs(ledger: dict) -> list[dict]:
    """Per run of a grid campaign, in (condition, K, seed) order: its steps, max_t phi_beta(2), whether it entered
    2-Gen (the paper's rule) and tau_2gen from its dense readouts; L_gen and the 2-Gen level at its last full
    evaluation."""
    return [{"condition": m["condition"], "K": m["K"], "seed": m["seed"], "iters": m["config"]["iters"],
             "max_phi_beta": thresholds.max_phi_beta(m["dense"]), "head": thresholds.generalizes(m["dense"]),
             "tau_2gen": thresholds.tau_2gen(m["dense"]), "gen_loss": m["full"][-1]["gen_loss"],
             "gen_loss_2gen": m["full"][-1]["gen_loss_2gen"]}
            for m in sorted(grid_records(ledger), key=lambda m: (m["condition"], m["K"], m["seed"]))]


def margins(rows: dict[str, list[dict]], phases: dict) -> dict:
    """For each traced phase of a circuits piece: the divergence of its checkpoint to the phase's predictor and to
    the runner-up. rows: {run: its full evaluations}."""
    out = {}
    for ph, d in phases.items():
        if d.get("step") is None:  # not traced: no checkpoint in the phase
            continue
        row = next(r for r in rows[d["run"]] if r["step"] == d["step"])
        others = {p: row[f"kl_{p}"] for p in ("1gen", "2gen", "1mem", "2mem") if p != ph}
        runner = min(others, key=others.get)
        out[ph] = {"step": d["step"], "run": d["run"], "divergence": row[f"kl_{ph}"], "runner_up": runner,
                   "runner_up_divergence": others[runner], "margin": others[runner] - row[f"kl_{ph}"]}
    return out
