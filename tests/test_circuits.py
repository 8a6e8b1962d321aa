"""circuits.py and the explicit forward it traces (analysis/edges.py): the forward against the model, the A2(.) split and
the ablations against direct computations, and that every ablation bites (a silent no-op is the usual bug of
interpretability code); the runs circuits.py reads (analysis/runs.py's find_run, train_run), its checkpoints and figure."""
import json
import os
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from matplotlib.collections import QuadMesh
from matplotlib.patches import FancyArrowPatch

import circuits
import train
from analysis import edges, runs
from bayes import kl_div
from transformer import Transformer, layer_norm

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FLOOR = 1e-6  # a float32 KL between predictions equal up to rounding is ~1e-8; live edges here are > 1e-3


def random_model(position="rotary", mlp1=True, seed=0, N=24):
    model = Transformer(C=10, D=32, position=position, mlp1=mlp1, max_len=N)
    model.reset_parameters(torch.Generator().manual_seed(seed))
    if position == "bias":  # zero-initialized tables would hide the bias path
        with torch.no_grad():
            for att in (model.att1, model.att2):
                att.P.normal_(0, 1, generator=torch.Generator().manual_seed(seed + 1))
    return model.eval()


def random_seqs(B=16, N=24, seed=1):
    return torch.randint(10, (B, N), generator=torch.Generator().manual_seed(seed))


def test_import_trace_is_the_project_module():
    assert os.path.dirname(os.path.abspath(circuits.__file__)) == ROOT  # not the standard library's line tracer
    assert len(edges.EDGES) == 23 and len(set(edges.EDGES)) == 23


@pytest.mark.parametrize("position,mlp1", [("rotary", True), ("bias", True), ("rotary", False)])
@torch.no_grad()
def test_explicit_forward_matches_model_and_sources_sum_to_the_stream(position, mlp1):
    model, seqs = random_model(position, mlp1), random_seqs()
    logits, acts = edges.run_edges(model, seqs, cache=True)
    want, cache = model(seqs, cache=True)
    torch.testing.assert_close(logits, want, atol=1e-5, rtol=0)
    torch.testing.assert_close(sum(acts[s] for s in edges.SOURCES), cache["x2"], atol=1e-5, rtol=0)
    torch.testing.assert_close(acts["A2(Token)"] + acts["A2(A1)"] + acts["A2(MLP1)"], cache["att2"], atol=1e-5, rtol=0)
    torch.testing.assert_close(acts["weights2"], cache["A2"], atol=1e-6, rtol=0)


@torch.no_grad()
def test_att2_split_matches_a_loop_over_positions():
    """eq. expandedatt2 by hand: A2(c)_n = sum_{i <= n} A2_ni W_V (c_i - mean(c_i)) / sigma(x1_i)."""
    model, seqs = random_model(), random_seqs(B=3, N=9)
    _, acts = edges.run_edges(model, seqs, cache=True)
    _, cache = model(seqs, cache=True)
    x1 = cache["x1"]
    sigma = (x1.var(-1, unbiased=False) + 1e-5).sqrt()
    for name, c in (("Token", cache["x0"]), ("A1", cache["att1"]), ("MLP1", cache["mlp1"])):
        want = torch.zeros_like(c)
        for b in range(3):
            for n in range(9):
                for i in range(n + 1):
                    want[b, n] += cache["A2"][b, n, i] * model.att2.W_V.weight @ ((c[b, i] - c[b, i].mean()) / sigma[b, i])
        torch.testing.assert_close(acts[f"A2({name})"], want, atol=1e-5, rtol=0)


@torch.no_grad()
def test_linear_edges_match_a_direct_computation():
    """For SRC->Linear the importance is KL(model || W_U(x2 - (src - <src>))) with the model's own cache."""
    model, seqs = random_model(), random_seqs()
    _, acts = edges.run_edges(model, seqs, cache=True)
    _, cache = model(seqs, cache=True)
    importance = circuits.edge_importance(model, seqs)
    logp = F.log_softmax(model.W_U(cache["x2"]), -1)
    sources = {"Token": cache["x0"], "A1": cache["att1"], "MLP1": cache["mlp1"], "MLP2": cache["mlp2"],
               **{k: acts[k] for k in ("A2(Token)", "A2(A1)", "A2(MLP1)")}}  # the split is tested above
    for src, x in sources.items():
        logq = F.log_softmax(model.W_U(cache["x2"] - (x - x.mean(0))), -1)
        assert importance[f"{src}->Linear"] == pytest.approx(kl_div(logp, logq).item(), rel=1e-4, abs=1e-7)


@torch.no_grad()
def test_query_and_key_ablations_perturb_only_their_side():
    """A1Q by hand: queries from x0 - (x0 - <x0>) = <x0> under x0's LayerNorm statistics, keys and values from
    x0; then the rest of the model unchanged. A1K the same with the roles swapped."""
    model, seqs = random_model(), random_seqs(B=8, N=12)
    x0 = model.W_E(seqs)
    B, N, D = x0.shape
    mu, sd = x0.mean(-1, keepdim=True), (x0.var(-1, unbiased=False, keepdim=True) + 1e-5).sqrt()
    mean_in = (x0.mean(0, keepdim=True).expand_as(x0) - mu) / sd  # LN of the ablated input, x0's statistics
    h = layer_norm(x0)
    att = model.att1
    for target, hq, hk in (("A1Q", mean_in, h), ("A1K", h, mean_in)):
        q, k, v = att.W_Q(hq), att.W_K(hk), att.W_V(h)
        scores = torch.full((B, N, N), -torch.inf)
        for n in range(N):  # rotary: <R_n q_n, R_i k_i> depends on n - i only
            for i in range(n + 1):
                scores[:, n, i] = (rotate(q[:, n], n) * rotate(k[:, i], i)).sum(-1) / D**0.5
        y1 = x0 + torch.softmax(scores, -1) @ v
        x1 = y1 + model.mlp1(y1)
        y2 = x1 + model.att2(x1)[0]
        want = model.W_U(y2 + model.mlp2(y2))
        torch.testing.assert_close(edges.run_edges(model, seqs, ablate=f"Token->{target}"), want, atol=1e-5, rtol=0)


def rotate(x, n):
    """The rotary embedding at position n, written from its definition: pairs (2f, 2f + 1) rotated by
    n * 10000^(-2f/d)."""
    d = x.shape[-1]
    angle = n * 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float32) / d)
    a, b = x[..., 0::2], x[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2], out[..., 1::2] = a * angle.cos() - b * angle.sin(), a * angle.sin() + b * angle.cos()
    return out


@pytest.mark.parametrize("position", ["rotary", "bias"])
@torch.no_grad()
def test_every_ablation_changes_the_output_of_a_random_model(position):
    model, seqs = random_model(position), random_seqs()
    clean = edges.run_edges(model, seqs)
    for edge in edges.EDGES:
        assert (edges.run_edges(model, seqs, ablate=edge) - clean).abs().max() > 1e-3, edge


@torch.no_grad()
def test_constant_sources_and_zeroed_paths_have_zero_importance():
    model = random_model()
    same = random_seqs(B=1).expand(8, -1)  # every source is constant over this batch
    assert all(v < FLOOR for v in circuits.edge_importance(model, same).values())
    importance = circuits.edge_importance(random_model(mlp1=False), random_seqs())  # no MLP1: its output is 0
    for edge, value in importance.items():
        assert (value == 0) == ("MLP1" in edge), edge  # MLP1->, A2(MLP1)->, ->MLP1
    model = random_model()
    model.att2.W_Q.weight.zero_()  # Att2's scores no longer depend on the stream: Q and K edges are dead
    importance = circuits.edge_importance(model, random_seqs())
    for edge, value in importance.items():
        assert (value < FLOOR) == edge.endswith(("->A2Q", "->A2K")), (edge, value)


@torch.no_grad()
def test_patching_replaces_the_block_output_downstream():
    model, seqs, other = random_model(), random_seqs(seed=1), random_seqs(seed=2)
    clean, acts = edges.run_edges(model, seqs, cache=True)
    _, donor = edges.run_edges(model, other, cache=True)
    for block in ("A1", "A2"):
        same = edges.run_edges(model, seqs, patch={block: acts[block]})
        torch.testing.assert_close(same, clean, atol=1e-6, rtol=0)  # patching a batch into itself: no change
        patched, got = edges.run_edges(model, seqs, patch={block: donor[block]}, cache=True)
        assert torch.equal(got[block], donor[block]) and (patched - clean).abs().max() > 1e-2
    _, got = edges.run_edges(model, seqs, patch={"A2": donor["A2"]}, cache=True)
    torch.testing.assert_close(got["MLP2"], model.mlp2(got["x2"] - got["MLP2"]), atol=1e-6, rtol=0)


def test_bad_arguments_are_value_errors():
    model, seqs = random_model(), random_seqs()
    with pytest.raises(ValueError, match="unknown edge"):
        edges.run_edges(model, seqs, ablate="Token->A2(Token)")
    with pytest.raises(ValueError, match="patch"):
        edges.run_edges(model, seqs, patch={"MLP1": seqs})
    with pytest.raises(ValueError, match="task injection"):
        edges.run_edges(Transformer(D=16, n_tasks=3, max_len=24), seqs)


def test_phase_checkpoint_is_the_one_closest_to_its_predictor_relative_to_the_next():
    """Over every run's rows: the largest D(next-closest predictor) / D(phase's predictor). Run a's step 10 has
    the lowest 1-Gen divergence, but 1-Mem is nearly as close there (x1.1); run b's step 5 is x2 (the paper's
    lowest-divergence rule would pick a's step 10). Below the floor (x1.2) a phase has no checkpoint: 2-Mem's best
    is x1.11 (found with a floor of 1.1), 1-Mem's x0.91 (a's step 10, where 1-Gen is the closest): None, and
    no_checkpoint says where the closest was, by how much, and which predictor is closest there."""
    def row(step, g1, g2, m1, m2):
        return {"step": step, "kl_1gen": g1, "kl_2gen": g2, "kl_1mem": m1, "kl_2mem": m2}

    rows = {"a": [row(0, 0.5, 0.9, 0.6, 0.9), row(10, 0.10, 0.3, 0.11, 0.5), row(20, 0.2, 0.05, 0.3, 0.4)],
            "b": [row(5, 0.15, 0.3, 0.4, 0.5), row(15, 0.3, 0.2, 0.1, 0.09)]}
    assert circuits.phase_checkpoint(rows, "1gen") == ("b", rows["b"][0])
    assert circuits.phase_checkpoint(rows, "2gen") == ("a", rows["a"][2])  # x4
    assert circuits.phase_checkpoint(rows, "2mem") is None  # x1.11, the only row where 2-Mem is closest
    assert circuits.phase_checkpoint(rows, "2mem", floor=1.1) == ("b", rows["b"][1])
    assert circuits.phase_checkpoint(rows, "1mem") is None
    miss = circuits.no_checkpoint(rows, "1mem")
    assert (miss["run"], miss["step"], miss["in_phase"], miss["floor"]) == ("a", None, False, circuits.IN_PHASE)
    assert miss["closest"] == {"step": 10, "ratio": pytest.approx(0.10 / 0.11), "margin": pytest.approx(-0.01),
                               "predictor": "1gen"}
    assert miss["why"] == ("no checkpoint in 1-Mem: at none of the 5 evaluations is it the closest predictor by x1.2 "
                           "(at most x0.91, a step 10, closest there 1-Gen)")
    ratio, margin = circuits.closeness(rows["a"][1], "1gen")
    assert ratio == pytest.approx(1.1) and margin == pytest.approx(0.01)
    assert circuits.closeness(rows["a"][1], "1mem") == (pytest.approx(0.10 / 0.11), pytest.approx(-0.01))  # not in 1-Mem


# ----------------------------------------------------------------------------- the command: runs by preset, the figure


def tiny_run(out, K=3, preset="quick", iters=12):
    """A finished train.py run of a few steps, labelled with `preset` (what find_run checks)."""
    cfg = train.Config(K=K, N=12, iters=iters, batch=8, D=16, evals=4, eval_train=16, eval_gen=16, preset=preset, out=str(out))
    train.train(cfg, quiet=True)
    return cfg


def test_find_run_takes_the_presets_runs_and_refuses_what_it_cannot_train(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(runs.torch.cuda, "is_available", lambda: False)
    assert runs.find_run(None, 16, "quick", "--runs") == (os.path.join("runs", "K16_s0"), True)  # trained on the CPU
    with pytest.raises(ValueError, match="need a GPU.*--runs"):
        runs.find_run(None, 128, "paper", "--runs")
    tiny_run(tmp_path / "runs" / "K3_s0", preset="quick")
    assert runs.find_run(None, 3, "quick", "--runs") == (os.path.join("runs", "K3_s0"), False)
    with pytest.raises(ValueError, match="holds a quick run"):  # never resumed with the paper's hyper-parameters
        runs.find_run(None, 3, "paper", "--runs")
    assert runs.find_run(str(tmp_path / "runs" / "K3_s0"), 3, "paper", "--runs") == (str(tmp_path / "runs" / "K3_s0"), False)
    with pytest.raises(ValueError, match="not a run directory"):
        runs.find_run(str(tmp_path / "nothing"), 3, "quick", "--runs")


def test_a_missing_paper_run_is_trained_with_the_paper_preset_where_cuda_is(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(runs.torch.cuda, "is_available", lambda: True)
    trained = []
    monkeypatch.setattr(runs.train, "train", lambda cfg, **kw: trained.append((cfg, kw)))
    run, missing = runs.find_run(None, 128, "paper", "--runs")
    assert missing and runs.train_run(128, "paper") == run == os.path.join("runs", "K128_s0")
    (cfg, kw), = trained
    paper = runs.train.PRESETS["paper"]
    assert (cfg.preset, cfg.K, cfg.N, cfg.iters, cfg.eval_gen, cfg.out) == ("paper", 128, paper["N"], paper["iters"],
                                                                             paper["eval_gen"], run)
    assert cfg.eval_train == 8 * 128 and kw == {"resume": False, "overwrite": True}  # the paper's 8 K sequences


def test_circuits_command_announces_its_runs_and_replots_from_its_json(tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    tiny_run(run)
    argv = ["circuits.py", "--preset", "quick", "--runs", f"{run},{run}", "--n-seqs", "4",
            "--figures", str(tmp_path / "figs")]
    monkeypatch.setattr(sys, "argv", argv)
    circuits.main()
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith(f"preset quick: circuits of {run} (found);")
    assert first.endswith(f"writing {tmp_path / 'figs'}/circuits.png and .json")  # not figures/: no warning about it
    figures = []
    monkeypatch.setattr(circuits.plt, "close", figures.append)
    monkeypatch.setattr(sys, "argv", ["circuits.py", "--replot", "--figures", str(tmp_path / "figs")])
    circuits.main()
    saved = json.load(open(tmp_path / "figs" / "circuits.json"))
    assert saved["preset"] == "quick" and set(saved["phases"]) == set(circuits.PREDICTORS)
    titles = [ax.get_title() for ax in figures[0].axes]
    for phase, d in saved["phases"].items():  # a graph for a traced phase; a phase the run never reached: said so
        traced = "importance" in d
        assert (f"{circuits.LABELS[phase]} circuit" in titles) == traced
        assert (f"{circuits.LABELS[phase]}: no checkpoint in this phase" in titles) == (not traced)


def test_an_edges_colour_is_read_off_the_figures_colour_bar(tmp_path, monkeypatch):
    """draw_circuit colours an edge by its importance / the strongest; the colour bar under the graphs must
    use the same map, so that a reader can read the ratio back from the colour."""
    importance = {edge: 0.0 for edge in edges.EDGES}
    importance.update({"Token->A1K": 1.0, "A1->MLP1": 0.5, "MLP1->Linear": 0.3})
    phases = {phase: {"run": "runs/K3_s0", "step": 1, "divergence": 0.1, "importance": importance} for phase in circuits.PREDICTORS}
    figures = []
    monkeypatch.setattr(circuits.plt, "close", figures.append)
    circuits.plot_circuits(phases, str(tmp_path / "c.png"))
    fig = figures[0]
    bar = next(ax for ax in fig.axes if "edge importance" in ax.get_xlabel())
    solids = next(c for c in bar.collections if isinstance(c, QuadMesh))  # the bar's colours, on its own scale
    graph = next(ax for ax in fig.axes if ax.get_title() == "1-Gen circuit")
    colours = sorted(tuple(np.round(p.get_edgecolor()[:3], 6)) for p in graph.patches if isinstance(p, FancyArrowPatch))
    expected = sorted(tuple(np.round(solids.to_rgba(rel)[:3], 6)) for rel in (1.0, 0.5, 0.3))
    assert colours == expected


def all_paths(links, node="Token"):
    """Every path from `node` to Linear over links (u, v, weight), as lists of links (brute force: the graph is small)."""
    if node == "Linear":
        return [[]]
    return [[link, *rest] for link in links if link[0] == node for rest in all_paths(links, link[1])]


def committed_phases():
    phases = []
    for name in ("circuits.json", "circuits_paper.json"):
        with open(os.path.join(ROOT, "figures", name)) as f:
            # a phase with no checkpoint in it: the ledger's trace of a checkpoint outside it, still a graph to draw
            phases += [(f"{name}:{phase}", d["importance"] if "importance" in d else d["ledger_trace"]["importance"])
                       for phase, d in json.load(f)["phases"].items()]
    return phases


def random_importances(n=40):
    rng = np.random.default_rng(0)
    return [(f"random {i}", dict(zip(edges.EDGES, rng.exponential(1, len(edges.EDGES)) ** 3))) for i in range(n)]


@pytest.mark.parametrize("name, importance", committed_phases() + random_importances())
def test_every_drawn_edge_lies_on_a_drawn_path_and_the_strongest_path_is_drawn(name, importance):
    """Every drawn edge can be followed from Token to Linear over drawn edges and the attention blocks' links, and a
    path as strong as the strongest of all (brute force) is among them: the 0.25 cut alone would leave circuits_paper's
    2-Gen graph with no edge into Linear (MLP2 -> Linear 0.061) and its 2-Mem graph an A2(MLP1) fed by nothing."""
    c = circuits.circuit_edges(importance)
    top = max(importance.values())
    assert c["kept"] == {e: v for e, v in importance.items() if v > circuits.THRESHOLD * top}
    assert all(v <= circuits.THRESHOLD * top for v in c["path"].values())
    qk = [(u, v) for u, v in circuits.BLOCK_LINKS if u in ("A1Q", "A1K", "A2Q", "A2K")]  # the dashed boxes show these
    drawn = [(*edges.parse_edge(e), v) for e, v in {**c["kept"], **c["path"]}.items()]
    drawn += [(u, v, np.inf) for u, v in [*c["value"], *qk]]
    drawn_paths = all_paths(drawn)
    for u, v, w in drawn:
        if w < np.inf:
            assert any((u, v, w) in p for p in drawn_paths), (name, u, v)
    every = [(*edges.parse_edge(e), v) for e, v in importance.items()] + [(u, v, np.inf) for u, v in circuits.BLOCK_LINKS]
    strongest = max(min(w for *_, w in p) for p in all_paths(every))
    assert max(min(w for *_, w in p) for p in drawn_paths) == strongest


def test_the_paper_scale_graphs_can_be_followed_from_the_input_to_the_output():
    """The two cases the cut alone gets wrong, by name: 2-Gen reaches Linear through the dashed MLP2 -> Linear (0.16 of its
    strongest edge) and A2(MLP1) -> Linear (0.21); in 2-Mem, MLP1 reaches A2(MLP1) by Att2's value path."""
    with open(os.path.join(ROOT, "figures", "circuits_paper.json")) as f:
        phases = json.load(f)["phases"]
    gen, mem = circuits.circuit_edges(phases["2gen"]["importance"]), circuits.circuit_edges(phases["2mem"]["ledger_trace"]["importance"])
    assert list(gen["path"]) == ["A2(MLP1)->Linear", "MLP2->Linear"] and ("MLP1", "A2(MLP1)") in gen["value"]
    assert mem["path"] == {} and ("MLP1", "A2(MLP1)") in mem["value"]


def test_the_graph_draws_circuit_edges_and_the_trace_lists_them(tmp_path, monkeypatch, capsys):
    """One choice of edges for the figure and for every list of them: the graph's arrows are circuit_edges' kept
    (solid) and path (dashed) edges, and trace_phases' JSON and its printed line give the same."""
    with open(os.path.join(ROOT, "figures", "circuits_paper.json")) as f:
        phases = json.load(f)["phases"]
    figures = []
    monkeypatch.setattr(circuits.plt, "close", figures.append)
    circuits.plot_circuits(phases, str(tmp_path / "c.png"))
    for phase, d in phases.items():
        titles = [ax.get_title() for ax in figures[0].axes]
        if "importance" not in d:  # no checkpoint in the phase: said, and no graph
            assert f"{circuits.LABELS[phase]}: no checkpoint in this phase" in titles
            assert f"{circuits.LABELS[phase]} circuit" not in titles
            continue
        graph = next(ax for ax in figures[0].axes if ax.get_title() == f"{circuits.LABELS[phase]} circuit")
        arrows = [p for p in graph.patches if isinstance(p, FancyArrowPatch)]
        c = circuits.circuit_edges(d["importance"])
        assert len(arrows) == len(c["kept"]) + len(c["path"])
        assert sum(p.get_linestyle() == "--" for p in arrows) == len(c["path"])
    run = tmp_path / "run"
    tiny_run(run)
    results = circuits.trace_phases({"r": str(run)}, n_seqs=4)  # 12 steps: no checkpoint is in any phase
    out = capsys.readouterr().out
    for phase, result in results.items():  # not traced, and said so
        assert set(result) == {"run", "step", "in_phase", "floor", "closest", "why"} and result["step"] is None
        assert f"{circuits.LABELS[phase]}: not traced, {result['why']}" in out
    monkeypatch.setattr(circuits, "phase_checkpoint", circuits.closest_checkpoint)  # the least-bad checkpoint, traced
    result = circuits.trace_phases({"r": str(run)}, n_seqs=4, phases=("2gen",))["2gen"]
    assert result["circuit"] == circuits.circuit_edges(result["importance"])
    assert circuits.describe_circuit(result["importance"]) in capsys.readouterr().out
