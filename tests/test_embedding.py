"""The Triton embedding (kernels/embedding.py) against torch's F.embedding: the rows exactly, the table's
gradient summed by state, over one and many slices of positions, and under torch.func.vmap (the ensemble's
path). On the CPU through Triton's interpreter (conftest.py), on CUDA compiled."""
import pytest
import torch
import torch.nn.functional as F
from torch.func import vmap

from kernels import embedding as ek

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def data(shape, C, D, seed=0, lead=()):
    g = torch.Generator().manual_seed(seed)
    s = torch.randint(C, (*lead, *shape), generator=g)
    w = torch.randn(*lead, C, D, generator=g)
    return s.to(DEVICE), w.to(DEVICE)


def value_and_grad(fn, s, w, seed=1):
    w = w.detach().requires_grad_()
    x = fn(s, w)
    dx = torch.randn(x.shape, generator=torch.Generator().manual_seed(seed)).to(x)
    return x, torch.autograd.grad(x, w, dx)[0]


def check(got, want):
    assert torch.equal(got[0], want[0])  # a lookup: the same numbers
    torch.testing.assert_close(got[1], want[1], rtol=1e-5, atol=1e-5)  # sums in another order


# (shape, C, D): the model's (B, N) with C = 10 and D = 64; one position; C and D padded (17 -> 32, 10 -> 16);
# positions not a multiple of the tile; a state absent from the batch (C = 40 over 30 positions)
@pytest.mark.parametrize("shape, C, D", [((3, 70), 10, 64), ((1, 1), 10, 64), ((2, 33), 17, 10), ((30,), 40, 16)])
def test_matches_torch(shape, C, D):
    s, w = data(shape, C, D)
    check(value_and_grad(ek.embedding, s, w), value_and_grad(F.embedding, s, w))


@pytest.mark.parametrize("programs", [1, 3, 10_000])
def test_gradient_slices(monkeypatch, programs):
    """The table's gradient summed over one slice of positions, several (the last partial), one per tile."""
    monkeypatch.setattr(ek, "PROGRAMS", programs)
    s, w = data((5, 100), 10, 64, seed=2)
    check(value_and_grad(ek.embedding, s, w), value_and_grad(F.embedding, s, w))


@pytest.mark.parametrize("in_dims", [(0, 0), (1, 0), (None, 0), (0, None)])
def test_vmap_equals_a_loop(in_dims):
    """Each member looks up its own states in its own table (or a shared one) and gets its own gradient."""
    s, w = data((4, 37), 10, 64, seed=3, lead=(3,))
    s = s.movedim(0, in_dims[0]) if in_dims[0] is not None else s[0]
    w = w if in_dims[1] is not None else w[0]

    def loop(s, w):
        return torch.stack([F.embedding(s.select(in_dims[0], e) if in_dims[0] is not None else s,
                                        w[e] if in_dims[1] is not None else w) for e in range(3)])

    check(value_and_grad(lambda s, w: vmap(ek.embedding, in_dims=in_dims)(s, w), s, w), value_and_grad(loop, s, w))


@pytest.mark.parametrize("vmapped", [False, True])
def test_rows_in_another_dtype(vmapped):
    """An fp32 table's rows stored in bf16 (engine/fastpath.py's LN(W_E)[s] under autocast): each row W[s] rounded once
    (the interpreter's casts truncate: there to one unit in the last place), and the table's gradient from bf16
    row gradients summed in fp32, returned in fp32 (not rounded to bf16)."""
    s, w = data((3, 70), 10, 64, seed=4, lead=(2,) if vmapped else ())

    def lookup(s, w):
        fn = lambda s, w: ek.embedding(s, w, out_dtype=torch.bfloat16)  # noqa: E731
        return vmap(fn)(s, w) if vmapped else fn(s, w)

    w = w.detach().requires_grad_()
    x = lookup(s, w)
    dx = torch.randn(x.shape, generator=torch.Generator().manual_seed(1)).to(x)
    (dw,) = torch.autograd.grad(x, w, dx)
    want = F.embedding(s, w) if not vmapped else torch.stack([F.embedding(s[e], w[e]) for e in range(2)])
    (dw_want,) = torch.autograd.grad(want, w, dx.float())
    assert x.dtype == torch.bfloat16
    torch.testing.assert_close(x, want.to(torch.bfloat16), rtol=2 ** -7 if DEVICE == "cpu" else 0, atol=0)
    assert dw.dtype == torch.float32
    torch.testing.assert_close(dw, dw_want, rtol=1e-5, atol=1e-5)


def test_bad_input():
    s, w = data((2, 3), 4, 8)
    with pytest.raises(ValueError, match="integer states"):
        ek.embedding(s.float(), w)
    with pytest.raises(ValueError, match="integer states"):
        ek.embedding(s, w.double())
    with pytest.raises(ValueError, match="integer states"):
        ek.embedding(s, w, out_dtype=torch.float64)
