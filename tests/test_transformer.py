"""transformer.py: architecture facts, causality, options, and the readouts against loops."""
import math

import pytest
import torch

from transformer import Transformer, attend, attention_scores, n_A, phi_beta, phi_delta


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def seqs(B=3, N=20, C=10, seed=0):
    return torch.randint(C, (B, N), generator=gen(seed))


def test_parameter_count_and_init():
    model = Transformer(C=10, D=64)
    assert sum(p.numel() for p in model.parameters()) == 91_392
    model.reset_parameters(gen(1))
    assert abs(model.att1.W_Q.weight.std().item() - 1 / 8) < 0.005  # N(0, 1/D)
    assert abs(model.att2.W_V.weight.std().item() - 1 / 16) < 0.003  # writes into the residual stream: N(0, 1/(4D))
    assert abs(model.mlp1.W_out.weight.std().item() - 1 / 16) < 0.003
    assert not any(isinstance(m, torch.nn.LayerNorm) for m in model.modules())  # LayerNorm has no parameters


def test_causality():
    model = Transformer(D=16)
    s = seqs()
    for t in [0, 7, 19]:
        s2 = s.clone()
        s2[:, t] = (s2[:, t] + 1) % 10
        a, b = model(s), model(s2)
        torch.testing.assert_close(a[:, :t], b[:, :t])
        assert not torch.allclose(a[:, t:], b[:, t:])


def test_cache_is_the_residual_stream():
    model = Transformer(D=16)
    s = seqs()
    logits, c = model(s, cache=True)
    torch.testing.assert_close(logits, model(s))
    assert c["A1"].shape == c["A2"].shape == (3, 20, 20)
    torch.testing.assert_close(c["A1"].sum(-1), torch.ones(3, 20))
    assert torch.equal(c["A1"].triu(1), torch.zeros(3, 20, 20))
    torch.testing.assert_close(c["x2"], c["x0"] + c["att1"] + c["mlp1"] + c["att2"] + c["mlp2"])
    torch.testing.assert_close(logits, c["x2"] @ model.W_U.weight.T)
    torch.testing.assert_close(c["y1"], c["x0"] + c["att1"])


def test_options():
    s = seqs()
    base = Transformer(D=16)
    no_mlp1 = Transformer(D=16, mlp1=False)
    assert sum(p.numel() for p in base.parameters()) - sum(p.numel() for p in no_mlp1.parameters()) == 2 * 16 * 64
    assert no_mlp1(s).shape == (3, 20, 10)

    biased = Transformer(D=16, position="bias", max_len=32)
    assert biased.att1.P.shape == (1, 32) and not biased.att1.rotary
    with torch.no_grad():
        biased.att1.W_Q.weight.zero_()  # no content term: scores are the (zero) positional bias
    torch.testing.assert_close(biased(s, cache=True)[1]["A1"][0, 5, :6], torch.full((6,), 1 / 6))
    with torch.no_grad():
        biased.att1.P[0, 1] = 50.0  # P_{i-j} at i - j = 1: previous-token attention
    A1 = biased(s, cache=True)[1]["A1"]
    assert phi_delta(A1) > 0.99

    injected = Transformer(D=16, n_tasks=4)
    a = injected(s, task=torch.tensor([0, 1, 2]))
    b = injected(s, task=torch.tensor([3, 1, 2]))
    assert not torch.allclose(a[0], b[0]) and torch.equal(a[1:], b[1:])
    with pytest.raises(ValueError):
        Transformer(position="alibi")

    narrow = Transformer(D=16, mlp_width=8)  # both MLPs D -> 8 -> D; 0 is the paper's 4 D
    assert narrow.mlp1.W_in.weight.shape == (8, 16) and narrow.mlp2.W_out.weight.shape == (16, 8)
    assert sum(p.numel() for p in base.parameters()) - sum(p.numel() for p in narrow.parameters()) == 2 * 2 * 16 * (64 - 8)
    torch.manual_seed(0)
    default = Transformer(D=16)
    torch.manual_seed(0)
    torch.testing.assert_close(Transformer(D=16, mlp_width=64)(s), default(s))  # 4 D explicitly: the same model
    with pytest.raises(ValueError, match="mlp_width"):
        Transformer(mlp_width=-1)


def test_gradient_reweighting_keeps_the_forward_and_scales_the_previous_token_gradient():
    s = seqs(N=12)
    ref = Transformer(D=16)
    ref.reset_parameters(gen(2))
    grads = {}
    for w in (1.0, 0.0):
        model = Transformer(D=16, prev_weight=w)
        model.load_state_dict(ref.state_dict())
        logits, c = model(s, cache=True)
        torch.testing.assert_close(logits, ref(s))
        grads[w] = torch.autograd.grad(logits.square().sum(), model.att1.W_Q.weight)[0]
    assert not torch.allclose(grads[1.0], grads[0.0])
    # reference: with w = 0 the previous-token entries of A1 pass no gradient
    q = torch.randn(1, 1, 6, 16, requires_grad=True)
    out, A = attend(q, q.detach(), torch.randn(1, 1, 6, 16), rotary=True, prev_weight=0.0)
    g = torch.autograd.grad(torch.diagonal(A[0, 0], -1).sum(), q, allow_unused=True)[0]
    assert g is None or torch.equal(g, torch.zeros_like(g))


@pytest.mark.parametrize("w", [0.1, 0.5])
def test_gradient_reweighting_is_the_written_out_formula(w):
    """A_{i,i-1} = w A' + (1 - w) detach(A'): the forward is A', and the gradient reaching the scores
    through the entries (i, i - 1) is w times the plain one. Oracle: backpropagate through the plain
    attention with the cotangent of those entries scaled by w (all other entries unchanged)."""
    g = gen(7)
    q, k, v = (torch.randn(2, 1, 9, 16, generator=g, requires_grad=True) for _ in range(3))
    r = torch.randn(2, 1, 9, 16, generator=g)
    out, A = attend(q, k, v, rotary=True, prev_weight=w)
    got = torch.autograd.grad((out * r).sum(), (q, k, v))
    A_plain = torch.softmax(attention_scores(q, k, rotary=True), -1)
    out_plain = A_plain @ v
    torch.testing.assert_close(out, out_plain)
    torch.testing.assert_close(A, A_plain)
    dA, dv = torch.autograd.grad((out_plain * r).sum(), (A_plain, v), retain_graph=True)
    scale = torch.ones(9, 9)
    scale[torch.arange(1, 9), torch.arange(8)] = w  # the previous-token entries
    dq, dk = torch.autograd.grad(A_plain, (q, k), dA * scale, retain_graph=True)
    for a, b in zip(got, (dq, dk, dv)):
        torch.testing.assert_close(a, b)
    plain = torch.autograd.grad((out_plain * r).sum(), q)[0]
    assert not torch.allclose(got[0], plain, atol=1e-4)  # w < 1 changes the gradient


def test_readouts_on_hand_built_attention():
    B, N = 4, 9
    prev = torch.zeros(B, N, N)
    prev[:, 0, 0] = 1
    prev[:, torch.arange(1, N), torch.arange(N - 1)] = 1
    assert phi_delta(prev).item() == pytest.approx(1.0)
    uniform = torch.tril(torch.ones(N, N)) / torch.arange(1, N + 1).view(N, 1)
    uniform = uniform.expand(B, N, N)
    assert n_A(uniform).item() == pytest.approx(N)
    assert phi_delta(uniform).item() == pytest.approx(sum(1 / n for n in range(2, N + 1)) / (N - 1))


def test_readouts_on_random_attention_match_loops():
    B, N = 3, 11
    A = torch.softmax(torch.randn(B, N, N, generator=gen(3)).masked_fill(torch.ones(N, N).triu(1).bool(), -math.inf), -1)
    s = seqs(B, N, C=3, seed=4)
    ref_delta = sum(A[b, n, n - 1].item() for b in range(B) for n in range(1, N)) / (B * (N - 1))
    ref_beta = sum(A[b, n, i].item() for b in range(B) for n in range(1, N) for i in range(1, n + 1)
                   if s[b, n] == s[b, i - 1]) / (B * N)
    ref_H = -sum(A[b, -1, i].item() * math.log(A[b, -1, i].item()) for b in range(B) for i in range(N)) / B
    assert phi_delta(A).item() == pytest.approx(ref_delta)
    assert phi_beta(A, s).item() == pytest.approx(ref_beta)
    assert n_A(A).item() == pytest.approx(math.exp(ref_H))


def test_a_position_bias_is_as_long_as_max_len():
    """P_{i-j} has max_len entries: a longer sequence is an error, not a silently shorter table."""
    model = Transformer(D=16, position="bias", max_len=12)
    assert model(seqs(N=12)).shape == (3, 12, 10)
    with pytest.raises(ValueError, match="exceeds max_len 12"):
        model(seqs(N=13))
    assert Transformer(D=16, max_len=12)(seqs(N=13)).shape == (3, 13, 10)  # rotary positions have no table
