"""The Triton layer norm against torch's: forward and gradient, rows and widths that are not multiples of
the tile, and under torch.func.vmap (the ensemble's path). On the CPU through Triton's interpreter
(conftest.py), on CUDA compiled."""
import pytest
import torch
import torch.nn.functional as F
from torch.func import vmap

from engine import fastpath
from kernels import layer_norm as ln

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def reference(x):
    return F.layer_norm(x.float(), x.shape[-1:], eps=1e-5).to(x.dtype)


def value_and_grad(fn, x, seed=1):
    x = x.detach().requires_grad_()
    y = fn(x)
    dy = torch.randn(y.shape, generator=torch.Generator().manual_seed(seed)).to(y)
    return y, torch.autograd.grad(y, x, dy)[0]


def data(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (3 * torch.randn(*shape, generator=g) + 2).to(DEVICE, dtype)  # mean and scale far from 0 and 1


# (rows of a 64-row tile: 1, 67 = one tile and three rows; D = 100 and 10 pad to 128 and 16; D = 1: y = 0)
@pytest.mark.parametrize("shape", [(1, 64), (67, 64), (2, 3, 100), (5, 10), (4, 1), (3, 2, 7, 64)])
def test_matches_torch_fp32(shape):
    x = data(*shape)
    got, want = value_and_grad(ln.layer_norm, x), value_and_grad(reference, x)
    for name, a, b in zip(("y", "dx"), got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5, msg=lambda m: f"{name}: {m}")


def test_matches_torch_bf16():
    x = data(67, 64, dtype=torch.bfloat16)
    for name, a, b in zip(("y", "dx"), value_and_grad(ln.layer_norm, x), value_and_grad(reference, x)):
        assert a.dtype == torch.bfloat16
        torch.testing.assert_close(a.float(), b.float(), rtol=2e-2, atol=2e-2, msg=lambda m: f"{name}: {m}")


def test_non_contiguous_input():
    x = data(64, 67).T  # rows of 64, strided
    for a, b in zip(value_and_grad(ln.layer_norm, x), value_and_grad(reference, x)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("in_dim", [0, 1, 2])
def test_vmap_equals_a_loop(in_dim):
    """Every member axis position, including the last physical axis (which the rule must move away from
    the normalized one): the value and the gradient of each slice are those of the slice alone."""
    x = data(3, 5, 64) if in_dim < 2 else data(5, 64, 3)
    got = value_and_grad(lambda t: vmap(ln.layer_norm, in_dims=in_dim)(t), x)
    want = value_and_grad(lambda t: torch.stack([reference(s) for s in t.unbind(in_dim)]), x)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_bad_input():
    with pytest.raises(ValueError, match="non-empty last axis"):
        ln.layer_norm(torch.zeros(3, 0, device=DEVICE))
    with pytest.raises(ValueError, match="got torch.float64"):
        ln.layer_norm(torch.zeros(3, 4, device=DEVICE, dtype=torch.float64))


@pytest.mark.parametrize("in_dim", [None, 1])
def test_bf16_output_of_an_fp32_input(in_dim):
    """out_dtype, the model's path under autocast (train.py --bf16), also under vmap: y is torch's fp32 result
    rounded to bf16, the gradient comes back in x's fp32."""
    def fn(t):
        return ln.layer_norm(t, out_dtype=torch.bfloat16)

    x = data(5, 67, 64)
    y, dx = value_and_grad(fn if in_dim is None else vmap(fn, in_dims=in_dim, out_dims=in_dim), x)
    y_ref, dx_ref = value_and_grad(reference, x)
    assert y.dtype == torch.bfloat16 and dx.dtype == torch.float32
    torch.testing.assert_close(y, y_ref.to(torch.bfloat16))
    torch.testing.assert_close(dx, dx_ref, rtol=2e-2, atol=2e-2)


@pytest.mark.skipif(DEVICE == "cpu", reason="the model's CUDA path (on a CPU it is torch's layer norm)")
def test_the_models_layer_norm_stores_the_autocast_dtype():
    x = data(4, 64)
    with torch.autocast("cuda", torch.bfloat16):
        assert fastpath.layer_norm(x, fastpath.Kernels()).dtype == torch.bfloat16
    assert fastpath.layer_norm(x, fastpath.Kernels()).dtype == torch.float32


# ----------------------------------------------------------------------------- the residual add fused in


def add_reference(x, r):
    s = x + r
    return s, reference(s.float()).to(s.dtype)


def values_and_grads(fn, x, r, use=(True, True), seed=1):
    """fn(x, r) -> (s, y); the gradients of <ds, s> + <dy, y> (a term left out when its output is unused)."""
    x, r = x.detach().requires_grad_(), r.detach().requires_grad_()
    outputs = fn(x, r)
    g = torch.Generator().manual_seed(seed)
    loss = sum((t.float() * torch.randn(t.shape, generator=g).to(t.device)).sum() for t, u in zip(outputs, use) if u)
    return (*outputs, *torch.autograd.grad(loss, (x, r)))


@pytest.mark.parametrize("shape", [(1, 64), (67, 64), (2, 3, 100), (5, 10), (4, 1)])
@pytest.mark.parametrize("use", [(True, True), (True, False), (False, True)])
def test_add_layer_norm_matches_torch_fp32(shape, use):
    """s = x + r, y = LN(s) and both inputs' gradients, when both outputs are used and when only one is
    (the backward's three paths)."""
    x, r = data(*shape), data(*shape, seed=1)
    got = values_and_grads(ln.add_layer_norm, x, r, use)
    want = values_and_grads(add_reference, x, r, use)
    for name, a, b in zip(("s", "y", "dx", "dr"), got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5, msg=lambda m: f"{name}: {m}")


def test_add_layer_norm_mixed_precision():
    """The model under autocast: fp32 stream + bf16 block output -> fp32 sum (exactly torch's), bf16 LN; the
    gradients come back in each input's dtype."""
    x, r = data(5, 67, 64), data(5, 67, 64, dtype=torch.bfloat16, seed=1)
    s, y, dx, dr = values_and_grads(lambda a, b: ln.add_layer_norm(a, b, out_dtype=torch.bfloat16), x, r)
    s_ref, y_ref, dx_ref, dr_ref = values_and_grads(add_reference, x, r)
    assert (s.dtype, y.dtype, dx.dtype, dr.dtype) == (torch.float32, torch.bfloat16, torch.float32, torch.bfloat16)
    torch.testing.assert_close(s, s_ref, rtol=0, atol=0)
    torch.testing.assert_close(y, y_ref.to(torch.bfloat16))
    torch.testing.assert_close(dx, dx_ref, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(dr, dx_ref.to(torch.bfloat16), rtol=2e-2, atol=2e-2)


def test_add_layer_norm_normalizes_the_sum_it_stores():
    """bf16 summands: s is their sum rounded to bf16 (the interpreter's casts truncate, so to one unit in the last
    place), and y (asked for in fp32 here) is LN of that stored s, as torch's x + r followed by a layer norm would
    give, not LN of the exact sum (which differs by ~1e-2)."""
    x, r = data(67, 64, dtype=torch.bfloat16), data(67, 64, dtype=torch.bfloat16, seed=1)
    s, y = ln.add_layer_norm(x, r, out_dtype=torch.float32)
    assert s.dtype == torch.bfloat16
    torch.testing.assert_close(s, x + r, rtol=2 ** -7, atol=0)
    torch.testing.assert_close(y, reference(s.float()), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("in_dims", [(0, 0), (0, 1), (1, None), (None, 0)])
def test_add_layer_norm_vmap_equals_a_loop(in_dims):
    """Member axes at different positions, and a summand shared by all members (None)."""
    def make(dim, seed):
        return data(3, 5, 64, seed=seed) if dim == 0 else data(5, 3, 64, seed=seed) if dim == 1 else data(5, 64, seed=seed)

    x, r = make(in_dims[0], 0), make(in_dims[1], 1)

    def loop(a, b):
        slices = [add_reference(a.select(in_dims[0], e) if in_dims[0] is not None else a,
                                b.select(in_dims[1], e) if in_dims[1] is not None else b) for e in range(3)]
        return tuple(torch.stack(t) for t in zip(*slices))

    got = values_and_grads(lambda a, b: vmap(ln.add_layer_norm, in_dims=in_dims)(a, b), x, r)
    for name, a, b in zip(("s", "y", "dx", "dr"), got, values_and_grads(loop, x, r)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5, msg=lambda m: f"{name}: {m}")


def test_add_layer_norm_bad_input():
    with pytest.raises(ValueError, match="one shape"):
        ln.add_layer_norm(torch.zeros(3, 4, device=DEVICE), torch.zeros(1, 4, device=DEVICE))
    with pytest.raises(ValueError, match="got torch.float32 \\+ torch.float64"):
        ln.add_layer_norm(torch.zeros(3, 4, device=DEVICE), torch.zeros(3, 4, device=DEVICE, dtype=torch.float64))
