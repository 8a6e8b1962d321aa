"""Ensembles (engine/ensemble.py, grids.train_ensemble): every member is the single run with its K and seed,
a killed ensemble resumes exactly, grids on the command line, the kernel's vmap rule."""
import os

import pytest
import torch

import evaluation
import train
import transformer
from analysis import runs
from engine import ensemble, fastdata
from kernels import attention as attn
from markov import TaskSet
from plumbing.cli import parse_list
from runners import grids
from stand_ins import run  # noqa: F401 (a fixture: a script's command line in this process)
from train import Config, eval_steps
from transformer import Transformer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# CPU: float32 rounding (batched matmuls may sum in another order); CUDA: TF32 dots and the kernels
REL = 1e-5 if DEVICE == "cpu" else 2e-3
GRID = [(3, 0), (3, 1), (5, 0), (5, 1)]  # two K (so two task sets S), two seeds


def tiny(out, **kw) -> Config:
    return Config(**{**dict(K=4, N=12, iters=30, batch=8, D=16, evals=3, eval_train=16, eval_gen=16, eval_dense=8,
                            ckpt_every=10, device=DEVICE, out=str(out)), **kw})


def grid(root, **kw) -> list[Config]:
    return [tiny(root / f"K{K}_s{seed}", K=K, seed=seed, **kw) for K, seed in GRID]


def assert_same_state(a: dict, b: dict):
    """Two single-run checkpoints (ckpt.pt) hold the same weights, AdamW state and RNG state."""
    for k in a["model"]:
        torch.testing.assert_close(a["model"][k], b["model"][k], rtol=REL, atol=REL)
    for i, state in a["optimizer"]["state"].items():
        for k, v in state.items():
            torch.testing.assert_close(v, b["optimizer"]["state"][i][k], rtol=REL, atol=REL)
    assert torch.equal(a["rng"], b["rng"]) and a["step"] == b["step"]


def ckpt(run_dir):
    return torch.load(os.path.join(run_dir, "ckpt.pt"), weights_only=True)


def test_members_at_one_K_build_their_held_out_sets_once(tmp_path, monkeypatch):
    """An ensemble's seeds at one K evaluate on one S with the same seeded sets: each set is built once per K (two
    K here), not once per member (test_members_are_the_single_runs: still each member's single run)."""
    built = []
    for name in ("make_eval_data", "make_dense_data", "make_per_chain_data"):
        real = getattr(evaluation, name)
        monkeypatch.setattr(evaluation, name, lambda cfg, *a, _real=real, _name=name, **kw: built.append((_name, cfg.K)) or _real(cfg, *a, **kw))
    grids.train_ensemble(grid(tmp_path, iters=4, eval_every=2, per_chain=2), str(tmp_path / "ckpt.pt"), quiet=True)
    assert sorted(built) == sorted((name, K) for name in ("make_eval_data", "make_dense_data", "make_per_chain_data")
                                   for K in (3, 5))


def test_members_are_the_single_runs(tmp_path, same_numbers):
    cfgs = grid(tmp_path / "ens", iters=100, eval_every=25)
    rows = grids.train_ensemble(cfgs, str(tmp_path / "ens" / "ckpt_group0.pt"), quiet=True)
    for cfg, member_rows in zip(cfgs, rows):
        single = tiny(tmp_path / "single" / os.path.basename(cfg.out), K=cfg.K, seed=cfg.seed, iters=100, eval_every=25)
        assert same_numbers(member_rows, train.train(single, quiet=True), rel=REL)
        assert_same_state(ckpt(cfg.out), ckpt(single.out))
        full = runs.read_metrics(cfg.out)[1]
        dense = runs.read_metrics(cfg.out, dense=True)[1]
        assert [r["step"] for r in full] == eval_steps(100, 3)
        assert [r["step"] for r in dense] == [0, 25, 50, 75, 100]
        assert all(set(r) == {"step", "dense", "train_loss", "gen_loss", "phi_delta_1", "phi_delta_2", "phi_beta_1",
                              "phi_beta_2", "train_loss_2gen"} for r in dense)
        for name in ["config.json", "fig2a.png", "model_0000100.pt"]:
            assert os.path.exists(os.path.join(cfg.out, name))
        runs.load_run(cfg.out)
    assert rows[0] != rows[1] and rows[0] != rows[2]  # the members really differ (seed, K)


def test_dense_readouts_agree_with_the_full_evaluation(tmp_path):
    """On the same sequences, --eval-every's cheap readouts are the full evaluation's numbers."""
    cfg = tiny(tmp_path)
    model = Transformer(cfg.C, cfg.D, max_len=cfg.N).to(DEVICE)
    data = evaluation.make_eval_data(cfg, TaskSet.create(cfg.K, seed=cfg.task_seed, device=DEVICE))
    full = evaluation.evaluate(model, data)
    with torch.no_grad():
        dense = evaluation.dense_readouts(model, data["train"], data["gen"])
    for k, v in dense.items():
        assert v.item() == pytest.approx(full[k], rel=1e-5 if DEVICE == "cpu" else 1e-3), k


class Killed(Exception):
    pass


@pytest.mark.parametrize("injection", [False, True])
def test_killed_ensemble_resumes_exactly(tmp_path, monkeypatch, same_numbers, injection):
    """A grid killed after 13 steps and resumed from its step-10 checkpoint ends as the straight run; with task
    injection too, whose K = 3 members' tables are padded to K = 5 and saved without the padding."""
    straight = grids.train_ensemble(grid(tmp_path / "straight", task_injection=injection), str(tmp_path / "straight" / "ckpt.pt"), quiet=True)
    # the step the training loop calls: on CUDA the graph's replay (AdamW.step then runs only at the capture)
    target = ensemble.GraphedStep if DEVICE == "cuda" else ensemble.Ensemble
    step = target.step
    count = {"n": 0}

    def dying_step(self, *args, **kwargs):  # the process "dies" after 13 training steps, past the step-10 checkpoint
        if count["n"] == 13:
            raise Killed
        count["n"] += 1
        return step(self, *args, **kwargs)

    monkeypatch.setattr(target, "step", dying_step)
    with pytest.raises(Killed):
        grids.train_ensemble(grid(tmp_path / "killed", task_injection=injection), str(tmp_path / "killed" / "ckpt.pt"), quiet=True)
    assert count["n"] == 13
    monkeypatch.setattr(target, "step", step)
    resumed = grids.train_ensemble(grid(tmp_path / "killed", task_injection=injection), str(tmp_path / "killed" / "ckpt.pt"), resume=True, quiet=True)
    assert same_numbers(resumed, straight)
    for K, seed in GRID:
        name = f"K{K}_s{seed}"
        assert same_numbers(runs.read_metrics(tmp_path / "killed" / name)[1], straight[GRID.index((K, seed))])
        assert_same_state(ckpt(tmp_path / "killed" / name), ckpt(tmp_path / "straight" / name))


def test_ensemble_members_must_share_the_step_shapes(tmp_path):
    with pytest.raises(ValueError, match="N"):
        grids.train_ensemble([tiny(tmp_path / "a"), tiny(tmp_path / "b", N=16)], str(tmp_path / "ckpt.pt"))


@pytest.mark.parametrize("text, values", [("64,80,94", [64, 80, 94]), ("0-3", [0, 1, 2, 3]), ("0-3,7", [0, 1, 2, 3, 7]),
                                          ("5", [5]), ("9-9", [9])])
def test_parse_list(text, values):
    assert parse_list("--K", text) == values


@pytest.mark.parametrize("text, words", [("3-1", "empty range"), ("4,8,4", "more than once"), ("0-3,2", "more than once")])
def test_parse_list_rejects(text, words):
    with pytest.raises(ValueError, match=words):
        parse_list("--seeds", text)


@pytest.mark.parametrize("text, words", [("4,,8", "'' cannot be read"), ("-1", "'-1' is negative"),
                                         ("1.5", "'1.5' is not an integer written in digits"),
                                         ("1e9", "'1e9' is not an integer"), ("", "cannot be read"),
                                         ("abc", "'abc' cannot be read")])
def test_parse_list_names_the_bad_item_and_the_rule(text, words):
    """Each malformed item named with what is wrong with it and the flag's rule (the default, or the caller's)."""
    with pytest.raises(ValueError, match=words + r".*\(integers >= 0 written in digits; a list"):
        parse_list("--seeds", text)
    with pytest.raises(ValueError, match=words + r".*\(K: an integer from 1 to 9, or inf; a list"):
        parse_list("--K", text, inf=True, rule="K: an integer from 1 to 9, or inf")


@pytest.mark.parametrize("args, words", [(["--K", "0,5"], "K must be"), (["--seeds", "3-1"], "empty range"),
                                         (["--K", "4,8,4"], "more than once")])
def test_bad_lists_are_one_line_and_exit_2(run, args, words):
    r = run("sweep.py", *args, "--print-commands")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and words in r.stderr


def test_grid_on_the_command_line(run, tmp_path):
    heat_maps = os.path.join(ROOT, "figures", "fig2bc.png")  # the committed quick sweep's
    stamp = os.path.getmtime(heat_maps) if os.path.exists(heat_maps) else None
    r = run("sweep.py", "--K", "3,5", "--seeds", "0-1", "--ensemble", "--threads", "1", "--iters", "4", "--N", "12", "--batch", "8", "--D", "16",
            "--evals", "2", "--eval-train", "16", "--eval-gen", "16", "--eval-every", "2", "--out", tmp_path)
    assert r.returncode == 0, r.stderr
    assert sorted(os.listdir(tmp_path)) == ["K3_s0", "K3_s1", "K5_s0", "K5_s1", "ckpt_group0.pt"]
    assert (os.path.getmtime(heat_maps) if os.path.exists(heat_maps) else None) == stamp  # a grid is not a sweep
    cfg, rows = runs.read_metrics(tmp_path / "K5_s1")
    assert (cfg["K"], cfg["seed"], rows[-1]["step"]) == (5, 1, 4)
    assert [r["step"] for r in runs.read_metrics(tmp_path / "K5_s1", dense=True)[1]] == [0, 2, 4]


@pytest.mark.skipif(attn.triton is None, reason="needs triton")
@pytest.mark.parametrize("use_bias, dims", [(True, (0, 0, 0)), (False, (0, 0, 0)), (False, (1, 0, None)), (True, (2, None, 0))])
def test_kernel_vmap_rule(use_bias, dims):
    """vmap over the kernel (the ensemble's path on CUDA) = the reference per member, values and gradients:
    members folded into the sequences (no bias) or into the heads (bias), from any member axis, and inputs
    shared by all members (None)."""
    g = torch.Generator().manual_seed(0)
    E, B, H, N, d = 3, 2, 2, 17, 16  # H = 2: a fold that mixes up members and heads shows

    def member_input(dim):  # (E, B, H, N, d) with the member axis at `dim`, or one (B, H, N, d) for all
        x = torch.randn(E, B, H, N, d, generator=g) if dim is not None else torch.randn(B, H, N, d, generator=g)
        return (x.movedim(0, dim) if dim is not None else x).to(DEVICE).requires_grad_()

    q, k, v = (member_input(dim) for dim in dims)
    bias = (0.5 * torch.randn(E, H, N, generator=g)).to(DEVICE).requires_grad_() if use_bias else None
    in_dims = (*dims, 0 if use_bias else None, None)
    out = torch.func.vmap(attn.attention, in_dims=in_dims)(q, k, v, bias, True)
    member = lambda x, dim, e: x.select(dim, e) if dim is not None else x  # noqa: E731
    ref = torch.stack([transformer.attend(*(member(x, dim, e) for x, dim in zip((q, k, v), dims)),
                                          bias[e] if use_bias else None, True)[0] for e in range(E)])
    do = torch.randn(out.shape, generator=g).to(DEVICE)
    leaves = (q, k, v) + ((bias,) if use_bias else ())
    got = [out, *torch.autograd.grad(out, leaves, do)]
    for name, a, b in zip(["out", "dq", "dk", "dv", "dbias"], got, [ref, *torch.autograd.grad(ref, leaves, do)]):
        if DEVICE == "cpu":
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
        else:  # TF32 dots: judged as a whole, as in test_attention.assert_fp32_close (dbias sums B N terms)
            assert (a - b).norm() <= 5e-3 * b.norm(), name
    lse = torch.func.vmap(attn.attention_forward, in_dims=in_dims)(q, k, v, bias, True)[1]
    assert lse.shape == (E, B, H, N)


@pytest.mark.skipif(attn.triton is None, reason="needs triton")
@pytest.mark.parametrize("use_bias, H, dim, rotary", [(False, 1, 0, True), (True, 1, 0, True), (True, 1, 0, False),
                                                      (True, 2, 3, True), (False, 2, 1, False), (True, 1, None, False)])
def test_kernel_vmap_rule_packed(monkeypatch, use_bias, H, dim, rotary):
    """vmap over the packed kernel (engine/fastpath.py's fused projection in an ensemble) = the reference per member,
    values and gradients, the member axis at `dim` of a projection's output (E, B, N, 3, H, d), or the projection
    shared by all members (None: with a bias per member, an expanded view that must be copied, not folded into
    the heads with stride 0). With one head the members fold into the sequences (no bias) or the heads (bias) as
    a view of that output: no copy."""
    g = torch.Generator().manual_seed(0)
    E, B, N, d = 3, 2, 17, 16
    projection = torch.randn(E, B, N, 3, H, d, generator=g)
    projection = (projection.movedim(0, dim) if dim is not None else projection[0]).to(DEVICE).requires_grad_()
    bias = (0.5 * torch.randn(E, H, N, generator=g)).to(DEVICE).requires_grad_() if use_bias else None
    passed = []
    apply = attn._Attention.apply
    monkeypatch.setattr(attn._Attention, "apply", lambda *a: passed.append(a[0]) or apply(*a))

    def member(x, bias):  # one member's (B, N, 3, H, d) -> the kernel's (3, B, H, N, d)
        return attn.attention_packed(x.permute(2, 0, 3, 1, 4), bias, rotary)

    out = torch.func.vmap(member, in_dims=(dim, 0 if use_bias else None))(projection, bias)
    per_member = projection.movedim(dim, 0) if dim is not None else projection.expand(E, *projection.shape)
    ref = torch.stack([transformer.attend(*per_member[e].permute(2, 0, 3, 1, 4), bias[e] if use_bias else None,
                                          rotary)[0] for e in range(E)])
    do = torch.randn(out.shape, generator=g).to(DEVICE)
    leaves = (projection,) + ((bias,) if use_bias else ())
    for name, a, b in zip(["out", "dqkv", "dbias"], [out, *torch.autograd.grad(out, leaves, do)],
                          [ref, *torch.autograd.grad(ref, leaves, do)]):
        if DEVICE == "cpu":
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
        else:
            assert (a - b).norm() <= 5e-3 * b.norm(), name
    if H == 1 and dim == 0:
        assert passed[-1].data_ptr() == projection.data_ptr()  # the vmap rule's call reads the projection in place


def test_dense_readouts_in_chunks_are_the_whole_batch_readouts(tmp_path):
    """Chunking over sequences (the paper's 4096 held-out sequences) changes no readout beyond rounding,
    with chunks that do not divide the batch."""
    cfg = tiny(tmp_path, eval_dense=10, task_injection=True)
    model = train.build_model(cfg)
    model.reset_parameters(torch.Generator().manual_seed(0))  # a CPU generator, as train.train does
    model.to(DEVICE)
    train_seqs, gen_seqs, chains = evaluation.make_dense_data(cfg, TaskSet.create(cfg.K, seed=cfg.task_seed, device=DEVICE))
    with torch.no_grad():
        whole = evaluation.dense_readouts(model, train_seqs, gen_seqs, chains, chunk=10)
        parts = evaluation.dense_readouts(model, train_seqs, gen_seqs, chains, chunk=3)
    for k, v in whole.items():
        assert parts[k].item() == pytest.approx(v.item(), rel=1e-5), k


def test_the_last_step_has_a_dense_row(tmp_path):
    """A threshold search reads max phi_beta up to the last step, also when --eval-every does not divide it."""
    train.train(tiny(tmp_path, iters=23, eval_every=10), quiet=True)
    assert [r["step"] for r in runs.read_metrics(str(tmp_path), dense=True)[1]] == [0, 10, 20, 23]


@pytest.mark.parametrize("members", [1, 2])
def test_bf16_runs_the_forward_in_bfloat16_and_keeps_fp32_state(members):
    """bf16=True (train.py --bf16): the step's matmuls give bf16 (a hook on an MLP block's output sees it,
    through vmap for an ensemble), the loss differs from the fp32 step's but not by much, and weights and AdamW
    state stay fp32. An ensemble's member 0 takes the single run's bf16 step (to bf16 rounding)."""
    seqs = torch.randint(0, 4, (members, 8, 13), generator=torch.Generator().manual_seed(0)).to(DEVICE)
    task = torch.zeros(members, 8, dtype=torch.long, device=DEVICE)

    def trainer(bf16: bool, E: int):
        models = []
        for e in range(E):
            model = Transformer(C=4, D=16, max_len=12)
            model.reset_parameters(torch.Generator().manual_seed(e))
            models.append(model.to(DEVICE))
        return ensemble.Ensemble(models, bf16=bf16, lr=1e-2) if E > 1 else ensemble.Single(models[0], bf16=bf16, lr=1e-2)

    losses, seen = {}, []
    for bf16 in (False, True):
        t = trainer(bf16, members)
        module = t.template if members > 1 else t.module
        hook = module.mlp2.register_forward_hook(lambda mod, inputs, out: seen.append(out.dtype))
        losses[bf16] = t.step(seqs, task)
        hook.remove()
        assert all(p.dtype == torch.float32 for p in t.parameters())
        assert all(v.dtype == torch.float32 for s in t.opt.state.values() for k, v in s.items() if k != "step")
    assert seen == [torch.float32, torch.bfloat16]
    assert not torch.equal(losses[True], losses[False])
    torch.testing.assert_close(losses[True], losses[False], rtol=2e-2, atol=2e-2)
    if members > 1:
        single = trainer(True, 1).step(seqs[:1], task[:1])
        torch.testing.assert_close(losses[True][:1], single, rtol=1e-2, atol=1e-2)


@pytest.mark.skipif(DEVICE != "cuda", reason="needs CUDA (CUDA graphs)")
@pytest.mark.parametrize("members", [1, 3])
def test_a_graph_that_samples_draws_the_eager_batches(members):
    """A GraphedStep with the sampler captured (ensemble.sampled_step: train.py's and the ensembles' CUDA path): replay
    i draws exactly the batches of the i-th eager fastdata.batches call, i.e. of TaskSet.batch, from the first
    replay on (the warm-up's draws are undone), and leaves every generator where the eager calls leave it."""
    sources = [TaskSet.create(K, seed=s, device=DEVICE) for K, s in ((3, 0), (70, 1), (9, 2))][:members]

    def gens():
        return [torch.Generator(DEVICE).manual_seed(s) for s in (5, 6, 7)[:members]]

    models = []
    for e in range(members):
        model = Transformer(C=10, D=16, max_len=16)
        model.reset_parameters(torch.Generator().manual_seed(e))
        models.append(model.to(DEVICE))
    trainer = (ensemble.Ensemble(models, capturable=True) if members > 1 else ensemble.Single(models[0], capturable=True))
    got, want = gens(), gens()
    step = ensemble.GraphedStep(trainer, (members, 8, 17), torch.device(DEVICE),
                                sample=lambda: fastdata.batches(sources, 8, 17, got), generators=got)
    for i in range(4):
        step.step()
        seqs, chains = fastdata.batches(sources, 8, 17, want)
        assert torch.equal(step.seqs, seqs) and torch.equal(step.task, chains), i
    for a, b in zip(got, want):
        assert torch.equal(a.get_state(), b.get_state())
    with pytest.raises(ValueError, match="draws its own batches"):
        step.step(seqs, chains)


@pytest.mark.parametrize("members", [1, 2])
def test_a_member_state_saved_under_a_cuda_graph_loads_into_a_plain_trainer(members):
    """A member state carries the AdamW capturable flag of the trainer that wrote it (True under a CUDA graph);
    load_member_states gives it the loading trainer's own (ensemble.with_capturable), without which a capturable
    AdamW refuses to step on CPU parameters."""
    models = [Transformer(C=4, D=16, max_len=8) for _ in range(members)]
    trainer = ensemble.Ensemble(models) if members > 1 else ensemble.Single(models[0])
    seqs = torch.randint(4, (members, 2, 9), generator=torch.Generator().manual_seed(0))
    task = torch.zeros(members, 2, dtype=torch.long)
    trainer.step(seqs, task)
    states = [trainer.member_state(e) for e in range(members)]
    for state in states:
        for group in state["optimizer"]["param_groups"]:
            group["capturable"] = True
    trainer.load_member_states(states)
    assert not any(group["capturable"] for group in trainer.opt.param_groups)
    assert trainer.step(seqs, task).isfinite().all()
