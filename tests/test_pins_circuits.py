"""circuits.py's ablations into the MLP targets (Figs. 3, A2, A3 put their strongest edges there; the explicit forward
is analysis/edges.py's run_edges) against a hand computation on a tiny random model: the ablated MLP reads
x~ = x - (x_SRC - <x_SRC>_batch) but normalizes it with the statistics of its unperturbed input x, and what it writes
then flows downstream through the model's own blocks (transformer.py), every other reader seeing the stream
unperturbed."""
import pytest
import torch
import torch.nn.functional as F

import circuits
from analysis import edges
from bayes import kl_div
from transformer import Transformer

EPS = 1e-5


def random_model(seed=0, N=12):
    model = Transformer(C=10, D=16, max_len=N)
    model.reset_parameters(torch.Generator().manual_seed(seed))
    return model.eval()


def normalize(v, stats_of):
    """LayerNorm of v with the feature mean and variance of stats_of (both (..., D))."""
    mu = stats_of.mean(-1, keepdim=True)
    var = ((stats_of - mu) ** 2).mean(-1, keepdim=True)
    return (v - mu) / torch.sqrt(var + EPS)


def mlp_on(block, h):
    return block.W_out(F.gelu(block.W_in(h)))


def centred_over_batch(x):
    return x - x.mean(0, keepdim=True)


def att2_parts(model, c):
    """Att2's output split by residual component (eq. expandedatt2): A2 W_V (c - mean_features(c)) / sigma(x1)."""
    sigma = torch.sqrt(c["x1"].var(-1, unbiased=False, keepdim=True) + EPS)
    return {f"A2({name})": c["A2"] @ model.att2.W_V((v - v.mean(-1, keepdim=True)) / sigma)
            for name, v in (("Token", c["x0"]), ("A1", c["att1"]), ("MLP1", c["mlp1"]))}


@torch.no_grad()
def hand_ablations(model, seqs, own_stats=False):
    """{edge: logits} for every SRC->MLP1 and SRC->MLP2 edge, written from the rule. own_stats: the MLP
    normalizes its perturbed input with that input's own statistics instead (the rule's alternative)."""
    _, c = model(seqs, cache=True)
    out = {}
    for src, x in (("Token", c["x0"]), ("A1", c["att1"])):
        y_in = c["y1"] - centred_over_batch(x)
        x1 = c["y1"] + mlp_on(model.mlp1, normalize(y_in, y_in if own_stats else c["y1"]))
        y2 = x1 + model.att2(x1)[0]  # Att2 and everything after it read the stream MLP1 wrote into
        out[f"{src}->MLP1"] = model.W_U(y2 + model.mlp2(y2))
    sources = {"Token": c["x0"], "A1": c["att1"], "MLP1": c["mlp1"], **att2_parts(model, c)}
    for src, x in sources.items():
        y_in = c["y2"] - centred_over_batch(x)
        out[f"{src}->MLP2"] = model.W_U(c["y2"] + mlp_on(model.mlp2, normalize(y_in, y_in if own_stats else c["y2"])))
    return out


@torch.no_grad()
def test_the_hand_split_of_att2_sums_to_its_output():
    """The A2(c) parts written above add up to Att2's output and vary over the batch (live sources to ablate)."""
    model, seqs = random_model(), torch.randint(10, (8, 12), generator=torch.Generator().manual_seed(1))
    _, c = model(seqs, cache=True)
    parts = att2_parts(model, c)
    torch.testing.assert_close(sum(parts.values()), c["att2"], atol=1e-5, rtol=0)
    assert all((v - v.mean(0)).abs().max() > 1e-3 for v in parts.values())


@pytest.mark.parametrize("seed", [0, 3])
@torch.no_grad()
def test_mlp_target_ablations_keep_the_unperturbed_layer_norm_statistics(seed):
    model = random_model(seed)
    seqs = torch.randint(10, (8, 12), generator=torch.Generator().manual_seed(seed + 1))
    want = hand_ablations(model, seqs)
    other_rule = hand_ablations(model, seqs, own_stats=True)
    assert set(want) == {e for e in edges.EDGES if e.endswith(("->MLP1", "->MLP2"))}  # all 2 + 6 of Table I
    logp = F.log_softmax(model(seqs), -1)
    importance = circuits.edge_importance(model, seqs)
    gap = 0.0
    for edge, logits in want.items():
        got = edges.run_edges(model, seqs, ablate=edge)
        torch.testing.assert_close(got, logits, atol=2e-5, rtol=0, msg=edge)
        assert importance[edge] == pytest.approx(kl_div(logp, F.log_softmax(logits, -1)).item(), rel=1e-4, abs=1e-7), edge
        gap = max(gap, (other_rule[edge] - logits).abs().max().item())
    assert gap > 1e-2  # the two normalization rules differ visibly here: the comparison above can tell them apart
