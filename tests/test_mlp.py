"""The Triton MLP block (kernels/mlp.py) against torch's two matmuls and GELU: forward and the three gradients,
rows, widths and hidden sizes that are not multiples of the tiles, every tile set in use, the weight gradients'
row slices, and under torch.func.vmap (the ensemble's path). On the CPU through Triton's interpreter
(conftest.py), on CUDA compiled."""
import pytest
import torch
import torch.nn.functional as F
from torch.func import vmap

from kernels import mlp as mk

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def reference(h, w_in, w_out):
    return F.linear(F.gelu(F.linear(h.double(), w_in.double())), w_out.double()).to(h.dtype)


def assert_matches(got, want):
    """fp32 outputs and gradients. The interpreter multiplies in fp32: elementwise to 1e-4. Compiled, fp32
    products are TF32 (10-bit mantissas): each tensor's error in norm within 5e-3 of its norm (measured on
    the H100 ~1e-3; elementwise, a weight gradient summed over hundreds of rows can cancel to near zero
    while TF32's error of ~4e-4 per product does not)."""
    for name, a, b in zip(("y", "dh", "dW_in", "dW_out"), got, want):
        assert a.dtype == b.dtype, name
        if DEVICE == "cpu":
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=lambda m: f"{name}: {m}")
        else:
            assert (a - b).norm() <= 5e-3 * b.norm(), f"{name}: relative error {((a - b).norm() / b.norm()).item():.2e}"


def data(M, D, F_, dtype=torch.float32, seed=0, lead=()):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(*lead, M, D, generator=g)
    w_in = torch.randn(*lead, F_, D, generator=g) / D ** 0.5
    w_out = torch.randn(*lead, D, F_, generator=g) / F_ ** 0.5
    return tuple(t.to(DEVICE, dtype) for t in (h, w_in, w_out))


def value_and_grads(fn, inputs, seed=1):
    inputs = [t.detach().requires_grad_() for t in inputs]
    y = fn(*inputs)
    dy = torch.randn(y.shape, generator=torch.Generator().manual_seed(seed)).to(y)
    return (y, *torch.autograd.grad(y, inputs, dy))


# (M, D, F): one row; rows not a multiple of 64; the paper's D = 64, F = 4D; F not a multiple of the 64-unit
# chunk; D = 10 padded to 16; a single hidden unit
@pytest.mark.parametrize("shape", [(1, 64, 256), (67, 64, 256), (130, 64, 100), (50, 10, 40), (17, 16, 1)])
def test_matches_torch_fp32(shape):
    inputs = data(*shape)
    assert_matches(value_and_grads(mk.mlp, inputs), value_and_grads(reference, inputs))


def torch_mlp(h, w_in, w_out):
    return F.linear(F.gelu(F.linear(h, w_in)), w_out)


def test_bf16_as_accurate_as_torchs():
    """Under autocast the model runs it in bf16: products in bf16, sums in fp32, the hidden layer rounded to
    bf16 before W_out, as in torch's bf16 matmuls and GELU. Each output's largest error against the float64
    result is at most 1.5x that of torch's bf16 path on the same inputs; 3x in the interpreter, whose
    fp32 -> bf16 casts truncate (up to one unit in the last place where rounding errs by half of one)."""
    inputs = data(67, 64, 256, dtype=torch.bfloat16)
    exact = value_and_grads(reference, [t.double() for t in inputs])
    for name, a, b, want in zip(("y", "dh", "dW_in", "dW_out"), value_and_grads(mk.mlp, inputs),
                                value_and_grads(torch_mlp, inputs), exact):
        assert a.dtype == torch.bfloat16, name
        ours, torchs = ((t.double() - want).abs().max().item() for t in (a, b))
        assert ours <= (3 if mk.INTERPRET else 1.5) * torchs, f"{name}: largest error {ours:.3g} against torch bf16's {torchs:.3g}"


@pytest.mark.parametrize("tiles", mk.SWEEP_TILES + [dict(BLOCK_M=16, BLOCK_F=16, num_warps=1)])
def test_other_tiles(monkeypatch, tiles):
    """Every tile set the sweep may write to the table, and the smallest: rows and hidden units across
    several tiles, the last of each partial."""
    monkeypatch.setattr(mk, "TILES", tiles)
    monkeypatch.setattr(mk, "TILES_DW", tiles)
    inputs = data(150, 64, 100, seed=3)
    assert_matches(value_and_grads(mk.mlp, inputs), value_and_grads(reference, inputs))


@pytest.mark.parametrize("programs", [1, 4, 10_000])
def test_weight_gradient_slices(monkeypatch, programs):
    """The weight gradients summed over one slice of rows, over several (the last one partial), and over as
    many slices as there are row blocks."""
    monkeypatch.setattr(mk, "PROGRAMS", programs)
    inputs = data(300, 64, 128, seed=4)
    assert_matches(value_and_grads(mk.mlp, inputs), value_and_grads(reference, inputs))


@pytest.mark.parametrize("in_dims", [(0, 0, 0), (1, 0, 0), (0, None, None), (None, 0, 0)])
def test_vmap_equals_a_loop(in_dims):
    """Members at the front or behind the rows, weights shared by all members, rows shared by all members:
    every member's output and gradients are those of its own call (its own weights, its own rows)."""
    h, w_in, w_out = data(70, 64, 96, lead=(3,), seed=5)
    inputs = [t if d == 0 else t[0] if d is None else t.movedim(0, d) for t, d in zip((h, w_in, w_out), in_dims)]

    def loop(*ts):
        return torch.stack([reference(*(t.select(d, e) if d is not None else t for t, d in zip(ts, in_dims)))
                            for e in range(3)])

    got = value_and_grads(lambda *ts: vmap(mk.mlp, in_dims=in_dims)(*ts), inputs)
    assert_matches(got, value_and_grads(loop, inputs))


def test_bad_input():
    h, w_in, w_out = data(4, 8, 16)
    with pytest.raises(ValueError, match="W_out"):
        mk.mlp(h, w_in, w_out.T)
    with pytest.raises(ValueError, match="one dtype"):
        mk.mlp(h, w_in.double(), w_out)
