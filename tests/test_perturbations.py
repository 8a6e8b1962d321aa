"""The kinetic perturbations of Fig. 7c as train.py flags: gradient reweighting (--prev-weight, with the
x 1/w budget) and task injection (--task-injection); plain settings reproduce the plain run exactly, each
perturbation changes what it should, and bad values are one-line errors."""
import argparse
import os

import pytest
import torch

import bayes
import evaluation
import train
from analysis import runs
from markov import TaskSet
from plumbing import rundir
from runners import grids
from stand_ins import run  # noqa: F401 (a fixture: a script's command line in this process)
from train import Config


def config(out, **flags) -> Config:
    """A tiny run's Config through make_config, as the command line builds it."""
    base = dict(preset="quick", K=4, seed=0, N=12, iters=20, batch=8, D=16, evals=3, eval_train=16, eval_gen=16,
                eval_dense=8, ckpt_every=10, device="cpu", out=str(out))
    names = [f.name for f in train.fields(Config)]
    return train.make_config(argparse.Namespace(**{**{n: None for n in names}, **base, **flags}))


def test_plain_flags_reproduce_the_plain_run(tmp_path, same_numbers):
    plain = train.train(config(tmp_path / "a"), quiet=True)
    flagged = config(tmp_path / "b", prev_weight=1.0, task_injection=False)
    assert flagged.iters == 20 and flagged.base_iters == 0
    assert same_numbers(train.train(flagged, quiet=True), plain)


def test_reweighting_scales_the_budget_and_changes_only_the_gradient(tmp_path):
    cfg = config(tmp_path / "w", prev_weight=0.25)
    assert (cfg.iters, cfg.base_iters) == (80, 20)  # the paper's iterations x 1/w, recorded in config.json
    rows = train.train(cfg, quiet=True)
    plain = train.train(config(tmp_path / "p", iters=80), quiet=True)
    assert rows[0] == plain[0]  # step 0: the forward pass is unchanged
    assert rows[-1]["train_loss"] != plain[-1]["train_loss"]  # the training is not
    resumed = rundir.load_checkpoint(os.path.join(cfg.out, "ckpt.pt"), [config(tmp_path / "w", prev_weight=0.25)])
    assert resumed[0]["config"]["base_iters"] == 20
    with pytest.raises(ValueError, match="does not match"):
        rundir.load_checkpoint(os.path.join(cfg.out, "ckpt.pt"), [config(tmp_path / "w", prev_weight=0.5)])


def test_task_injection_feeds_each_sequence_its_chain(tmp_path):
    cfg = config(tmp_path / "i", task_injection=True)
    model = train.build_model(cfg)
    model.reset_parameters(torch.Generator().manual_seed(0))
    assert model.task_embedding.weight.shape == (cfg.K, cfg.D)
    seqs = torch.randint(10, (3, 12), generator=torch.Generator().manual_seed(1))
    a, b = model(seqs, task=torch.tensor([0, 1, 2])), model(seqs, task=torch.tensor([3, 1, 2]))
    assert (a[0] - b[0]).abs().max() > 1e-3 and torch.equal(a[1:], b[1:])  # each sequence reads its own chain
    # fresh chains (task=None) get the mean embedding: the same as a table whose every row is the mean
    mean = model.task_embedding.weight.mean(0)
    fresh = model(seqs)
    with torch.no_grad():
        model.task_embedding.weight.copy_(mean.expand(cfg.K, -1))
    torch.testing.assert_close(fresh, model(seqs, task=torch.tensor([0, 1, 2])), atol=1e-6, rtol=0)
    injected = train.train(cfg, quiet=True)
    plain = train.train(config(tmp_path / "p"), quiet=True)
    assert injected[-1]["train_loss"] != plain[-1]["train_loss"]  # injection changes the training


def test_injection_ensemble_members_are_the_single_runs(tmp_path, same_numbers):
    """The chains reach every member through the batched (vmapped) step too, also when the members' K differ (their
    (K, D) tables padded to the largest K): the same rows, dense readouts (on fresh chains through the mean of the
    member's own K vectors) and checkpoints (the member's K rows and their AdamW state) as each single run."""
    keys = [(3, 0), (3, 1), (5, 0), (4, 1)]
    cfgs = [config(tmp_path / "e" / f"K{K}_s{s}", K=K, seed=s, task_injection=True, eval_every=10) for K, s in keys]
    rows = grids.train_ensemble(cfgs, str(tmp_path / "e" / "ckpt.pt"), quiet=True)
    for cfg, member in zip(cfgs, rows):
        single = config(tmp_path / "s" / f"K{cfg.K}_s{cfg.seed}", K=cfg.K, seed=cfg.seed, task_injection=True, eval_every=10)
        assert same_numbers(member, train.train(single, quiet=True), rel=1e-5)
        assert same_numbers(runs.read_metrics(cfg.out, dense=True)[1], runs.read_metrics(single.out, dense=True)[1], rel=1e-5)
        a, b = (torch.load(os.path.join(d, "ckpt.pt"), weights_only=True) for d in (cfg.out, single.out))
        assert a["model"]["task_embedding.weight"].shape == (cfg.K, cfg.D)
        for k in b["model"]:
            torch.testing.assert_close(a["model"][k], b["model"][k], rtol=1e-5, atol=1e-6)
        for i, state in b["optimizer"]["state"].items():
            for k, v in state.items():
                torch.testing.assert_close(a["optimizer"]["state"][i][k], v, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("flags,message", [(["--prev-weight", "0"], "prev_weight must be in (0, 1]"),
                                           (["--prev-weight", "1.5"], "prev_weight must be in (0, 1]"),
                                           (["--prev-weight", "x"], "invalid float value"),
                                           (["--task-injection", "yes"], "unrecognized arguments")])
def test_bad_perturbation_flags_are_one_line_errors(run, tmp_path, flags, message):
    out = tmp_path / "run"
    proc = run("train.py", "--K", "4", "--iters", "2", "--out", out, *flags)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and message in proc.stderr, proc.stderr
    assert not out.exists()


def test_evaluation_gives_held_out_S_sequences_their_chains(tmp_path):
    """L_train and phi_beta are read with each held-out sequence's own chain injected; L_gen (fresh chains)
    with the mean embedding."""
    cfg = config(tmp_path / "i", task_injection=True, eval_every=5)
    model = train.build_model(cfg)
    model.reset_parameters(torch.Generator().manual_seed(0))
    with torch.no_grad():
        model.task_embedding.weight.mul_(10)  # make the chain matter
    tasks = TaskSet.create(cfg.K, cfg.C, seed=cfg.task_seed)
    data = evaluation.make_eval_data(cfg, tasks)
    metrics = evaluation.evaluate(model, data)
    with torch.no_grad():
        for split, task in (("train", data["train_task"]), ("gen", None)):
            seqs = data[split]
            logq = torch.log_softmax(model(seqs[:, :-1], task=task), -1)
            assert metrics[f"{split}_loss"] == pytest.approx(bayes.nll(logq, seqs).mean().item(), rel=1e-5)
        seqs, _, chains = evaluation.make_dense_data(cfg, tasks)
        dense = evaluation.dense_readouts(model, seqs, seqs, chains)
        assert dense["train_loss"].item() == pytest.approx(
            evaluation.lm_loss(model, seqs, chains).item(), rel=1e-5)
        assert dense["train_loss"].item() != pytest.approx(evaluation.lm_loss(model, seqs).item(), rel=1e-3)
