"""engine/fastpath.py: the accelerated model is the plain one of transformer.py, in values and gradients, with every
kernel wired in where its block was, each switch of fastpath.Kernels on its own, and under an ensemble's vmap.
On the CPU the kernels run in Triton's interpreter (conftest.py), on CUDA compiled."""
import contextlib
import copy

import pytest
import torch
import torch.nn.functional as F

from engine import ensemble, fastpath
from engine.fastpath import Kernels
from kernels import attention as attention_kernel
from kernels import embedding as embedding_kernel
from kernels import layer_norm as layer_norm_kernel
from kernels import mlp as mlp_kernel
from transformer import Transformer

CPU = not torch.cuda.is_available()
interpreter = pytest.mark.skipif(not CPU or mlp_kernel.triton is None,
                                 reason="runs the kernels on CPU tensors in Triton's interpreter; on CUDA the tests below check the path")
cuda = pytest.mark.skipif(CPU, reason="needs CUDA")


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def seqs(B=2, N=21, C=10, seed=0):
    return torch.randint(C, (B, N), generator=gen(seed))


def model_and_copy(seed=3, **options):
    """A random model (a position bias that is not zero, so that its gradient path shows) and an accelerated copy."""
    model = Transformer(D=16, **options)
    model.reset_parameters(gen(seed))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".P"):
                p.normal_(0, 0.5, generator=gen(seed + 1))
    return model, fastpath.accelerate(copy.deepcopy(model))


def loss_and_grads(model, s, task=None):
    logits = model(s[:, :-1], task=task)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), s[:, 1:].reshape(-1))
    return [loss, *torch.autograd.grad(loss, list(model.parameters()))]


def assert_same(got, want):
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@contextlib.contextmanager
def allow_tf32(allow: bool):
    """torch's TF32 switch for CUDA matmuls (train.py --tf32), put back afterwards (monkeypatch cannot: the switch
    is a property of torch's module object)."""
    matmul = torch.backends.cuda.matmul
    old, matmul.allow_tf32 = matmul.allow_tf32, allow
    try:
        yield
    finally:
        matmul.allow_tf32 = old


@pytest.fixture
def tf32():
    """TF32 allowed: the MLP kernel takes fp32 (the interpreter's dots stay exact fp32)."""
    with allow_tf32(True):
        yield


def spy(monkeypatch, *entries) -> dict:
    """Count the calls of kernel entry points (module, name)."""
    calls = {name: 0 for _, name in entries}
    for module, name in entries:
        def counted(*args, _fn=getattr(module, name), _name=name, **kwargs):
            calls[_name] += 1
            return _fn(*args, **kwargs)
        monkeypatch.setattr(module, name, counted)
    return calls


KERNELS = ((attention_kernel, "attention"), (attention_kernel, "attention_packed"), (attention_kernel, "attention_forward"),
           (mlp_kernel, "mlp"), (layer_norm_kernel, "layer_norm"), (layer_norm_kernel, "add_layer_norm"),
           (embedding_kernel, "embedding"))


# (model options, B, N + 1): the paper's model; a position bias; no MLP1; task injection; F = 40, not a multiple of
# the MLP kernel's 64 hidden units; gradient reweighting (layer 1 keeps the reference); one position (N = 1)
CASES = [(dict(), 2, 22), (dict(position="bias", max_len=21), 2, 22), (dict(mlp1=False), 2, 22),
         (dict(n_tasks=3), 2, 22), (dict(mlp_width=40), 3, 18), (dict(prev_weight=0.5), 2, 22), (dict(), 3, 2)]


@interpreter
@pytest.mark.parametrize("options, B, N1", CASES)
def test_accelerated_model_is_the_plain_one(tf32, options, B, N1):
    """Loss and every weight's gradient, and each intermediate of cache=True."""
    plain, fast = model_and_copy(**options)
    s = seqs(B, N1)
    task = torch.arange(B) % 3 if "n_tasks" in options else None
    assert_same(loss_and_grads(fast, s, task), loss_and_grads(plain, s, task))
    with torch.no_grad():
        (logits, got), (ref_logits, want) = (m(s[:, :-1], cache=True, task=task) for m in (fast, plain))
    assert got.keys() == want.keys()
    assert_same([logits, *got.values()], [ref_logits, *want.values()])


# what one forward of the paper's model calls: the embedding for x0 and for LN(x0) = LN(W_E)[s], the layer norm
# on W_E's table, attention per layer on the fused projection's output, each MLP, the fused add + LayerNorm after
# each block but the last
CALLS = dict(attention=0, attention_packed=2, attention_forward=0, mlp=2, layer_norm=1, add_layer_norm=3, embedding=2)


@interpreter
def test_each_block_calls_its_kernel(monkeypatch, tf32):
    """The calls of CALLS; one MLP fewer without MLP1; a LayerNorm alone where no add precedes it (MLP1's input
    under task injection); with cache=True the weights from the forward's log-sum-exp. Gradient reweighting keeps
    layer 1 on the reference."""
    s = seqs()
    for options, changes in ((dict(), {}), (dict(mlp1=False), dict(mlp=1, add_layer_norm=2)),
                             (dict(n_tasks=3), dict(layer_norm=2))):
        _, fast = model_and_copy(**options)
        calls = spy(monkeypatch, *KERNELS)
        fast(s, task=torch.tensor([0, 2]) if "n_tasks" in options else None)
        assert calls == {**CALLS, **changes}
        monkeypatch.undo()
    calls = spy(monkeypatch, *KERNELS)
    fast(s, cache=True, task=torch.tensor([0, 2]))
    assert (calls["attention_packed"], calls["attention_forward"]) == (0, 2)
    _, reweighted = model_and_copy(prev_weight=0.5)
    reweighted(s)
    assert calls["attention_packed"] == 1  # layer 2 only


# a switch of Kernels -> the calls that change with it off (the others stay CALLS')
SWITCHES = {"embedding": dict(embedding=0),  # and LN(x0) on x0's rows
            "attention": dict(attention_packed=0), "mlp": dict(mlp=0),
            "fuse_add": dict(add_layer_norm=0, layer_norm=4),  # the adds apart, a LayerNorm after each
            "layer_norm": dict(layer_norm=0, add_layer_norm=0, embedding=1),
            "fuse_qkv": dict(attention_packed=0, attention=2),  # three projections, the kernel on q, k, v
            "norm_table": dict(embedding=1)}  # the layer norm on x0's rows instead of the table's


@interpreter
@pytest.mark.parametrize("piece", SWITCHES)
def test_each_kernel_switches_off_alone(monkeypatch, tf32, piece):
    """Kernels(piece=False) (bench_train.py's variants): the kernels called change as SWITCHES says, and the model
    is still the plain one."""
    plain, _ = model_and_copy()
    off = dict(layer_norm=False, fuse_add=False) if piece == "layer_norm" else {piece: False}
    fast = fastpath.accelerate(copy.deepcopy(plain), Kernels(**off))
    calls = spy(monkeypatch, *KERNELS)
    s = seqs()
    got = loss_and_grads(fast, s)
    assert calls == {**CALLS, **SWITCHES[piece]}
    assert_same(got, loss_and_grads(plain, s))


@pytest.mark.parametrize("vmapped", [False, True])
def test_last_add_is_stored_in_the_autocast_dtype(monkeypatch, vmapped):
    """x2 = y2 + MLP2(y2) for W_U under autocast: the fp32 sum rounded once to bf16, the bits of the add followed by
    autocast's cast; the gradient back in each summand's dtype, as autograd's add and cast would give it."""
    g = gen(5)
    y2 = torch.randn(3, 2, 7, 16, generator=g).requires_grad_()
    mlp2 = torch.randn(3, 2, 7, 16, generator=g).to(torch.bfloat16).requires_grad_()
    monkeypatch.setattr(fastpath, "_autocast_dtype", lambda: torch.bfloat16)
    fn = lambda y, m: fastpath.add_cast(y, m, Kernels())  # noqa: E731
    x2 = torch.func.vmap(fn)(y2, mlp2) if vmapped else fn(y2, mlp2)
    want = (y2 + mlp2).to(torch.bfloat16)
    assert x2.dtype == torch.bfloat16 and torch.equal(x2, want)
    dx2 = torch.randn(x2.shape, generator=g).to(torch.bfloat16)
    for a, b in zip(torch.autograd.grad(x2, (y2, mlp2), dx2), torch.autograd.grad(want, (y2, mlp2), dx2), strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b)
    assert fastpath.add_cast(y2, mlp2, Kernels(fuse_add=False)).dtype == torch.float32  # the plain add
    monkeypatch.setattr(fastpath, "_autocast_dtype", lambda: None)
    assert fastpath.add_cast(y2, mlp2, Kernels()).dtype == torch.float32  # no autocast: no cast


@interpreter
def test_the_mlp_kernel_waits_for_tf32_in_fp32(monkeypatch):
    """Exact fp32 keeps torch's matmuls: the kernel's fp32 dots would be TF32 on a GPU."""
    _, fast = model_and_copy()
    calls = spy(monkeypatch, (mlp_kernel, "mlp"))
    with allow_tf32(False):
        fast(seqs())
    assert calls["mlp"] == 0


@interpreter
@pytest.mark.parametrize("position", ["rotary", "bias"])
def test_ensemble_of_accelerated_members_is_the_plain_ensemble(monkeypatch, tf32, position):
    """The ensemble's step through vmap (members folded into the kernels' sequences, or with a position bias
    into their heads): losses and every member's gradients as the plain ensemble's, and the readouts."""
    members = [model_and_copy(seed, position=position, max_len=16)[0] for seed in (1, 2)]
    s = torch.stack([seqs(2, 17, seed=e) for e in range(2)])
    task = torch.zeros(2, 2, dtype=torch.long)
    steps, readouts = [], []
    for kernels in (None, Kernels()):
        if kernels is not None:  # on a CPU the trainers keep the plain model: accelerate it as on CUDA
            monkeypatch.setattr(ensemble, "on_device", lambda model, kernels: fastpath.accelerate(model, kernels))
        trainer = ensemble.Ensemble([copy.deepcopy(m) for m in members], kernels=kernels, lr=1e-3)
        assert isinstance(trainer.template, fastpath.Transformer) == (kernels is not None)
        steps.append([trainer.step(s, task), *(p.grad for p in trainer.parameters())])
        with torch.no_grad():
            readouts.append(list(trainer.dense_readouts(s, s, task).values()))
    assert_same(*steps)
    assert_same(*readouts)


def test_accelerate_keeps_the_parameters():
    """In place: the same object and parameters (an optimizer made before still steps them), the same
    state_dict keys (checkpoints load both ways)."""
    model = Transformer(D=16, n_tasks=2)
    params, keys = list(model.parameters()), list(model.state_dict())
    assert fastpath.accelerate(model) is model and isinstance(model, fastpath.Transformer)
    assert all(a is b for a, b in zip(model.parameters(), params, strict=True))
    assert list(model.state_dict()) == keys
    Transformer(D=16, n_tasks=2).load_state_dict(model.state_dict())
    assert isinstance(model.W_E, fastpath.Embedding) and isinstance(model.mlp2, fastpath.MLP)
    assert isinstance(model.att1, fastpath.Attention)


def test_accelerate_bad_input():
    with pytest.raises(ValueError, match="layer_norm"):
        Kernels(layer_norm=False)
    with pytest.raises(TypeError, match="Transformer"):
        fastpath.accelerate(torch.nn.Linear(2, 2))


def test_the_trainers_accelerate_only_on_cuda():
    """On a CPU (or with kernels=None) the trainers run the plain model: CPU runs compute what they always did."""
    model = Transformer(D=16)
    assert type(ensemble.Single(model).module) is Transformer
    assert type(ensemble.Ensemble([model, copy.deepcopy(model)]).template) is Transformer
    if not CPU:
        assert type(ensemble.Single(model.cuda(), kernels=None).module) is Transformer
        assert type(ensemble.Single(model).module) is fastpath.Transformer


def test_what_the_kernels_take(monkeypatch):
    """The kernels run on CUDA tensors, or on CPU tensors in Triton's interpreter, and only in the dtypes they take."""
    x = torch.zeros(2, 16)
    monkeypatch.setattr(fastpath, "INTERPRET", True)
    assert fastpath._takes(layer_norm_kernel, x) == (layer_norm_kernel.triton is not None)
    assert not fastpath._takes(layer_norm_kernel, x.double())
    monkeypatch.setattr(fastpath, "INTERPRET", False)
    assert not fastpath._takes(layer_norm_kernel, x)


def test_tf32_read_from_either_of_torchs_switches():
    """train.py --tf32 sets torch's older allow_tf32 flag; a process may set the newer fp32_precision switch
    instead, after which reading the older flag raises. The MLP's choice reads either, and a model still runs."""
    matmul = torch.backends.cuda.matmul
    if not hasattr(matmul, "fp32_precision"):
        pytest.skip("this torch has only the older switch")
    old = matmul.fp32_precision
    try:
        matmul.fp32_precision = "tf32"
        assert fastpath._tf32()
        assert fastpath.accelerate(Transformer(D=16))(seqs(N=8)).shape == (2, 8, 10)
    finally:
        matmul.fp32_precision = old
    assert not fastpath._tf32()


# ----------------------------------------------------------------------------- compiled on a GPU


@cuda
@pytest.mark.parametrize("precision", ["bf16", "tf32"])
def test_cuda_kernels_match_torch_blocks(monkeypatch, precision):
    """Compiled, in the two precisions that take the MLP kernel: loss and gradients with the kernels against
    the same model with torch's embedding, layer norm, adds and MLP (relative error of each gradient, in norm)."""
    model = Transformer(D=64).cuda()
    model.reset_parameters(torch.Generator("cuda").manual_seed(1))
    torch_blocks = fastpath.accelerate(copy.deepcopy(model), Kernels(embedding=False, mlp=False, layer_norm=False, fuse_add=False))
    fastpath.accelerate(model)
    s = seqs(B=8, N=100).cuda()

    def run(m):
        with allow_tf32(precision == "tf32"), torch.autocast("cuda", torch.bfloat16, enabled=precision == "bf16"):
            return loss_and_grads(m, s)

    calls = spy(monkeypatch, (mlp_kernel, "mlp"), (embedding_kernel, "embedding"))
    got = run(model)
    assert calls == {"mlp": 2, "embedding": 2}
    for i, (a, b) in enumerate(zip(got, run(torch_blocks))):
        assert (a - b).float().norm() <= 2e-2 * b.float().norm() + 1e-6, f"output {i}"


@cuda
def test_cuda_model_uses_the_kernel_with_the_reference_numerics(monkeypatch):
    model = fastpath.accelerate(Transformer(D=64).cuda())
    s = seqs(B=8, N=100).cuda()
    calls = spy(monkeypatch, (attention_kernel, "attention_forward"))
    logits, c = model(s, cache=True)
    assert calls["attention_forward"] == 2  # the kernel ran, in both layers
    ref = Transformer(D=64)
    ref.load_state_dict({k: v.cpu() for k, v in model.state_dict().items()})
    ref_logits, ref_c = ref(s.cpu(), cache=True)
    torch.testing.assert_close(logits.cpu(), ref_logits, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(c["A2"].cpu(), ref_c["A2"], rtol=2e-2, atol=2e-2)


@cuda
@pytest.mark.parametrize("position", ["rotary", "bias"])
def test_cuda_model_gradients_match_the_reference(position):
    """A training step's gradients through the compiled kernels match the plain model on the CPU."""
    model = Transformer(D=64, position=position)
    model.reset_parameters(gen(1))
    with torch.no_grad():  # a bias that is not zero, so its gradient path is exercised too
        for name, p in model.named_parameters():
            if name.endswith(".P"):
                p.normal_(0, 0.5, generator=gen(2))
    s = seqs(B=8, N=100)
    fast = fastpath.accelerate(copy.deepcopy(model).cuda())
    for a, b in zip(loss_and_grads(fast, s.cuda()), loss_and_grads(model, s)):
        torch.testing.assert_close(a.cpu(), b, rtol=2e-2, atol=2e-3)
