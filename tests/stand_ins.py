"""What only the tests use, kept out of the modules they test: a script's command line run in this process,
CPU-sized campaigns, a K1* search run to its end against a rule, and the engine's memorizing predictor with
separate posterior and state sequences."""
import importlib.util
import os
import sys
from collections.abc import Callable

import pytest
import torch

from analysis.estimators import Search
from campaigns import campaign
from engine import fastdata
from plumbing import cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ----------------------------------------------------------------------------- a script's command line, in this process
#
# A script's main() runs here as its __main__ does (through cli.run): a subprocess per case costs ~4 s of imports
# (torch, matplotlib, scipy) on the CI's 2 cores, this ~0.1 s. test_cli.py runs the real processes once.


def load(script):
    """The script as a module (bench/ scripts are not importable by name)."""
    name, path = os.path.splitext(os.path.basename(script))[0], os.path.join(ROOT, script)
    if getattr(sys.modules.get(name), "__file__", None) == path:  # not the standard library's trace
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[name] = module  # one module per script: what a test patches is what main() runs
    return module


class Result:
    def __init__(self, returncode, stdout, stderr):
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


@pytest.fixture
def run(monkeypatch, capsys):
    """run(script, *args, cwd=...): `python script args` as its __main__ runs it, in this process (torch's thread
    count, which --threads sets, put back after; the default --threads as on an idle machine, whatever else runs
    beside the suite, so that two runs of a test compute alike)."""
    threads = torch.get_num_threads()
    monkeypatch.setattr(cli, "busy_cores", lambda: 0)

    def call(script, *args, cwd=ROOT):
        module = load(script)
        monkeypatch.chdir(cwd)
        monkeypatch.setattr(sys, "argv", [script, *map(str, args)])
        capsys.readouterr()
        try:
            cli.run(lambda: module.main())
            code = 0
        except SystemExit as e:
            code = e.code or 0
        finally:
            torch.set_num_threads(threads)
        out, err = capsys.readouterr()
        return Result(code, out, err)
    return call


def assert_one_line_error(proc, *words):
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and len(lines) == 1, proc.stderr
    for word in words:
        assert word in lines[0], lines[0]


# ----------------------------------------------------------------------------- CPU-sized campaigns

# campaigns/campaign.py's kinds (circuits, k1, grid) through the same code path on a CPU in seconds
TINY_TRAIN = dict(N=16, batch=16, evals=6, eval_train=64, eval_gen=64, D=16)
TINY_PROBE = dict(N=8, batch=4, lr=1e-3, iters=6, eval_every=3, eval_dense=4, evals=1, eval_train=4, eval_gen=4, D=8,
                  lo=2, hi=9, ratio=1.0, weight=0.5)
TINY_RATE = dict(seconds_per_ensemble=1, seconds_per_model_step=0.01)
GRID_PROBE = dict(TINY_PROBE, evals=2)  # a final full evaluation besides step 0: Fig. A9's L_gen
TINY_SPECS = {
    "circuits_tiny": dict(kind="circuits", preset="quick", Ks={"gen": 64, "mem": 4}, seed=0, iters=60, train=TINY_TRAIN,
                          trace_seqs=16, tv_per_chain=6, tv_patch_seqs=8, seconds_per_step=0.02, seconds_analysis=5),
    "circuits_mem_tiny": dict(kind="circuits", preset="quick", Ks={"mem": 4}, seed=0, iters=60, train=TINY_TRAIN,
                              trace_seqs=16, tv_per_chain=6, tv_patch_seqs=8, seconds_per_step=0.02, seconds_analysis=5),
    "k1_tiny": dict(kind="k1", preset="quick", probe=TINY_PROBE, plan={"control": [0, 1], "inject": [0]},
                    seconds_per_model_step=0.01, seconds_per_probe=1),
    "reweight_tiny": dict(kind="grid", report="reweight", preset="quick", train=GRID_PROBE,
                          conditions=["control", "reweight"], Ks=[3, 6], seeds=[0, 1], **TINY_RATE),
    "tau_tiny": dict(kind="grid", report="tau", preset="quick", train=GRID_PROBE, conditions=["control"], Ks=[4],
                     seeds=[0, 1, 2], **TINY_RATE),
    "tau_same_tiny": dict(kind="grid", report="tau", preset="quick", train=TINY_PROBE, conditions=["control"], Ks=[4],
                          seeds=[0, 1, 2], **TINY_RATE),  # trains as k1_tiny's control probes do: one ensemble with them
    "sweep_tiny": dict(kind="grid", report="sweep", preset="quick",
                       train=dict(N=8, batch=4, iters=6, evals=2, eval_train=8, eval_gen=8, D=8),
                       conditions=["control"], Ks=[2, 4, 8], seeds=[0, 1], **TINY_RATE),
}


@pytest.fixture
def tiny_campaigns(monkeypatch):
    """campaign.SPECS with the CPU-sized campaigns besides the paper's."""
    for name, spec in TINY_SPECS.items():
        monkeypatch.setitem(campaign.SPECS, name, spec)


def search_threshold(generalizes: Callable[[int], bool], lo: int, hi: int, ratio: float = 1.0) -> dict:
    """One estimators.Search run to the end with a function K -> generalizes."""
    search = Search(lo, hi, ratio)
    while todo := search.pending():
        for K in todo:
            search.record(K, generalizes(K))
    return search.result()


def fast_mixed_mem(post_seqs: torch.Tensor, state_seqs: torch.Tensor, T: torch.Tensor, two_point: bool = True) -> torch.Tensor:
    """bayes.mixed_mem by the engine's anchored sums (fastdata._memorizing): the posterior from post_seqs, the
    current state from state_seqs. Returns (B, L, C)."""
    return fastdata._memorizing(post_seqs, T, two_point, state_seqs)
