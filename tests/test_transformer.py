"""transformer.py: architecture facts, causality, options, and the readouts against loops."""
import math

import pytest
import torch

import transformer
from kernels import attention as kernel
from kernels import embedding as embedding_kernel
from kernels import layer_norm as ln_kernel
from kernels import mlp as mlp_kernel
from transformer import Transformer, attend, behavioral_divergence, n_A, phi_beta, phi_delta


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
    out, A = attend(q, q.detach(), torch.randn(1, 1, 6, 16), rotary=True, need_weights=True, prev_weight=0.0)
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
    out, A = attend(q, k, v, rotary=True, need_weights=True, prev_weight=w)
    got = torch.autograd.grad((out * r).sum(), (q, k, v))
    A_plain = torch.softmax(kernel.attention_scores(q, k, rotary=True), -1)
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


def test_use_kernel_is_cuda_with_triton():
    """The switch itself (the CUDA tests below check that the kernel runs)."""
    class Fake:
        def __init__(self, is_cuda):
            self.is_cuda = is_cuda
    assert transformer.use_kernel(Fake(True)) == (kernel.triton is not None)
    assert not transformer.use_kernel(Fake(False))


def spy_on_kernel(monkeypatch) -> dict:
    """Count the calls of the kernel's entry points made by transformer.attend."""
    calls = {"attention": 0, "attention_forward": 0}
    for name in calls:
        fn = getattr(kernel, name)

        def counted(*args, _fn=fn, _name=name, **kwargs):
            calls[_name] += 1
            return _fn(*args, **kwargs)

        monkeypatch.setattr(kernel, name, counted)
    return calls


@pytest.mark.skipif(kernel.triton is None or torch.cuda.is_available(),
                    reason="runs the kernel on CPU tensors in Triton's interpreter; on CUDA the next tests check the path")
def test_attend_takes_the_kernel_when_use_kernel_says_so(monkeypatch):
    """With use_kernel forced on (the interpreter on a CPU) the model calls the kernel, once per layer,
    and gives the reference's numbers; gradient reweighting still takes the reference path."""
    model = Transformer(D=16)
    model.reset_parameters(gen(3))
    s = seqs(B=2, N=20)
    ref_logits, ref_c = model(s, cache=True)
    calls = spy_on_kernel(monkeypatch)
    monkeypatch.setattr(transformer, "use_kernel", lambda q: True)
    logits = model(s)
    assert calls == {"attention": 2, "attention_forward": 0}
    torch.testing.assert_close(logits, ref_logits, rtol=1e-4, atol=1e-4)
    logits, c = model(s, cache=True)
    assert calls == {"attention": 2, "attention_forward": 2}
    torch.testing.assert_close(c["A2"], ref_c["A2"], rtol=1e-4, atol=1e-4)
    reweighted = Transformer(D=16, prev_weight=0.5)
    reweighted.load_state_dict(model.state_dict())
    reweighted(s)
    assert calls["attention"] == 3  # layer 2 only


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


def test_behavioral_divergence_is_the_mean_of_the_two_splits():
    p = torch.log_softmax(torch.randn(2, 5, 10, generator=gen(5)), -1)
    q = torch.log_softmax(torch.randn(2, 5, 10, generator=gen(6)), -1)
    assert behavioral_divergence(p, p, q, q).item() == pytest.approx(0.0, abs=1e-7)
    d = behavioral_divergence(p, q, q, p)
    ref = 0.5 * (p.exp() * (p - q)).sum(-1).mean() + 0.5 * (q.exp() * (q - p)).sum(-1).mean()
    assert d.item() == pytest.approx(ref.item())


def torch_blocks(monkeypatch):
    """The model with torch's layer norm, residual adds and MLP instead of the Triton kernels."""
    monkeypatch.setattr(transformer, "use_layer_norm_kernel", lambda *xs: False)
    monkeypatch.setattr(transformer, "use_mlp_kernel", lambda h, dtype: False)
    monkeypatch.setattr(transformer, "use_embedding_kernel", lambda W: False)


def loss_and_grads(model, s):
    loss = torch.nn.functional.cross_entropy(model(s[:, :-1]).reshape(-1, 10).float(), s[:, 1:].reshape(-1))
    return [loss, *torch.autograd.grad(loss, list(model.parameters()))]


@pytest.mark.skipif(mlp_kernel.triton is None or torch.cuda.is_available(),
                    reason="runs the kernels on CPU tensors in Triton's interpreter; on CUDA the next tests check the path")
@pytest.mark.parametrize("mlp1, n_tasks", [(True, 0), (False, 0), (True, 3)])
def test_model_with_the_layer_norm_and_mlp_kernels(monkeypatch, mlp1, n_tasks):
    """With the embedding, layer norm (residual add fused) and MLP kernels forced on (the interpreter on a CPU), the
    model's loss and every weight's gradient are torch's: the kernels are wired in where the blocks were."""
    model = Transformer(D=16, mlp1=mlp1, n_tasks=n_tasks)  # with task injection MLP1 reads LN(y1 + task vector)
    model.reset_parameters(gen(3))
    s = seqs(B=2, N=21)
    calls = {"mlp": 0, "add_layer_norm": 0, "embedding": 0}
    for module, name in ((mlp_kernel, "mlp"), (ln_kernel, "add_layer_norm"), (embedding_kernel, "embedding")):
        def counted(*args, _fn=getattr(module, name), _name=name, **kwargs):
            calls[_name] += 1
            return _fn(*args, **kwargs)
        monkeypatch.setattr(module, name, counted)
    monkeypatch.setattr(transformer, "use_layer_norm_kernel", lambda *xs: True)
    monkeypatch.setattr(transformer, "use_mlp_kernel", lambda h, dtype: True)
    monkeypatch.setattr(transformer, "use_embedding_kernel", lambda W: True)
    got = loss_and_grads(model, s)
    assert calls == {"mlp": 1 + mlp1, "add_layer_norm": 2 + mlp1, "embedding": 1}
    torch_blocks(monkeypatch)
    for a, b in zip(got, loss_and_grads(model, s)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("precision", ["bf16", "tf32"])
def test_cuda_model_kernels_match_torch_blocks(monkeypatch, precision):
    """Compiled, in the two precisions that take the MLP kernel: loss and gradients with the kernels against
    the same model with torch's embedding, layer norm, adds and MLP (relative error of each gradient, in norm)."""
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", precision == "tf32")
    model = Transformer(D=64).cuda()
    model.reset_parameters(torch.Generator("cuda").manual_seed(1))
    s = seqs(B=8, N=100).cuda()

    def run():
        with torch.autocast("cuda", torch.bfloat16, enabled=precision == "bf16"):
            return loss_and_grads(model, s)

    calls = {"mlp": 0, "embedding": 0}
    for module, name in ((mlp_kernel, "mlp"), (embedding_kernel, "embedding")):
        def counted(*args, _fn=getattr(module, name), _name=name, **kwargs):
            calls[_name] += 1
            return _fn(*args, **kwargs)
        monkeypatch.setattr(module, name, counted)
    got = run()
    assert calls == {"mlp": 2, "embedding": 1}
    torch_blocks(monkeypatch)
    for i, (a, b) in enumerate(zip(got, run())):
        assert (a - b).float().norm() <= 2e-2 * b.float().norm() + 1e-6, f"output {i}"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_model_uses_the_kernel_with_the_reference_numerics(monkeypatch):
    model = Transformer(D=64).cuda()
    s = seqs(B=8, N=100).cuda()
    calls = spy_on_kernel(monkeypatch)
    logits, c = model(s, cache=True)
    assert calls["attention_forward"] == 2  # the kernel ran, in both layers
    ref = Transformer(D=64)
    ref.load_state_dict({k: v.cpu() for k, v in model.state_dict().items()})
    ref_logits, ref_c = ref(s.cpu(), cache=True)
    torch.testing.assert_close(logits.cpu(), ref_logits, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(c["A2"].cpu(), ref_c["A2"], rtol=2e-2, atol=2e-2)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("position", ["rotary", "bias"])
def test_cuda_model_gradients_match_the_reference(position):
    """A training step's gradients through the compiled kernel match the CPU reference path."""
    model = Transformer(D=64, position=position)
    model.reset_parameters(gen(1))
    with torch.no_grad():  # a bias that is not zero, so its gradient path is exercised too
        for name, p in model.named_parameters():
            if name.endswith(".P"):
                p.normal_(0, 0.5, generator=gen(2))
    s = seqs(B=8, N=100)
    grads = []
    for device in ("cuda", "cpu"):
        m = Transformer(D=64, position=position)
        m.load_state_dict(model.state_dict())
        m.to(device)
        x = s.to(device)
        loss = torch.nn.functional.cross_entropy(m(x[:, :-1]).reshape(-1, 10), x[:, 1:].reshape(-1))
        grads.append([g.cpu() for g in torch.autograd.grad(loss, list(m.parameters()))])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=2e-2, atol=2e-3)


def test_tf32_read_from_either_of_torchs_switches():
    """train.py --tf32 sets torch's older allow_tf32 flag; a process may set the newer fp32_precision switch
    instead, after which reading the older flag raises. The MLP dispatch reads either, and only for CUDA tensors:
    a CPU model still runs."""
    matmul = torch.backends.cuda.matmul
    if not hasattr(matmul, "fp32_precision"):
        pytest.skip("this torch has only the older switch")
    old = matmul.fp32_precision
    try:
        matmul.fp32_precision = "tf32"
        assert transformer._tf32()
        assert Transformer(D=16)(seqs()).shape == (3, 20, 10)
    finally:
        matmul.fp32_precision = old
    assert not transformer._tf32()
