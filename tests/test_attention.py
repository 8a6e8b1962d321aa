"""The Triton attention kernels against the PyTorch reference: forward and every gradient.

On the CPU the kernels run in Triton's interpreter (see conftest.py); on CUDA, compiled, with a
tf32 / bf16 tolerance. Shapes are deliberately not multiples of the block sizes."""
import json
import math

import pytest
import torch

import transformer
from engine import fastpath
from kernels import attention as attn
from kernels import bias_gradient, tiles

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
FP32_TOL = dict(rtol=1e-5, atol=1e-5) if DEVICE == "cpu" else dict(rtol=5e-3, atol=5e-3)  # tf32 dots on GPUs

SHAPES = [  # (B, H, N, d, rotary, bias)
    (2, 1, 1, 16, True, True),
    (2, 1, 17, 16, False, True),
    (1, 4, 17, 64, True, False),
    (2, 1, 100, 64, True, True),
    (1, 4, 100, 16, False, False),
    (1, 1, 256, 64, True, True),
    (2, 4, 33, 16, True, True),
    (1, 2, 256, 16, False, True),
]


def reference(q, k, v, bias=None, rotary=False):
    """The model's attention (transformer.attend) without its weights: the oracle the kernels must match."""
    return transformer.attend(q, k, v, bias, rotary)[0]


def inputs(B, H, N, d, use_bias, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, N, d, generator=g).to(DEVICE, dtype).requires_grad_() for _ in range(3))
    bias = (0.5 * torch.randn(H, N, generator=g)).to(DEVICE).requires_grad_() if use_bias else None
    return q, k, v, bias


def run(fn, q, k, v, bias, rotary, seed=1):
    out = fn(q, k, v, bias, rotary)
    do = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed)).to(out)
    leaves = [q, k, v] + ([bias] if bias is not None else [])
    return [out] + list(torch.autograd.grad(out, leaves, do))


def assert_fp32_close(name, got, want):
    """Elementwise to 1e-5 in the interpreter (fp32 arithmetic). On a GPU the kernel's dots run in
    tf32 (10-bit mantissa) and dbias sums B * N such terms per diagonal, so there the error is
    judged as a whole: ||got - want|| <= 5e-3 ||want||. Measured on an H200 at B = 2, N = 100,
    d = 64, rotary and bias: 1.0e-3 (out) to 1.9e-3 (dq, dk), against 3.4e-4 to 5.9e-4 for the
    reference itself with tf32 matmuls. A gradient that is exactly 0 (dq at N = 1: one key, no
    dependence on q) keeps the tf32 rounding of dP - delta, 2.6e-3 in norm there: bound 1e-2."""
    if DEVICE == "cpu":
        torch.testing.assert_close(got, want, **FP32_TOL, msg=lambda m: f"{name}: {m}")
    else:
        err, scale = (got - want).norm().item(), want.norm().item()
        assert err <= (5e-3 * scale if scale > 0 else 1e-2), f"{name}: ||error|| {err:.2e}, ||reference|| {scale:.2e}"


@pytest.mark.parametrize("B, H, N, d, rotary, use_bias", SHAPES)
def test_kernel_matches_reference_fp32(B, H, N, d, rotary, use_bias):
    q, k, v, bias = inputs(B, H, N, d, use_bias)
    got = run(attn.attention, q, k, v, bias, rotary)
    want = run(reference, q, k, v, bias, rotary)
    for name, a, b in zip(["out", "dq", "dk", "dv", "dbias"], got, want):
        assert_fp32_close(name, a, b)


@pytest.mark.parametrize("B, H, N, d, rotary, use_bias", [(2, 1, 100, 64, True, True), (1, 2, 33, 16, False, True)])
def test_kernel_matches_reference_bf16(B, H, N, d, rotary, use_bias):
    q, k, v, bias = inputs(B, H, N, d, use_bias, dtype=torch.bfloat16)
    got = run(attn.attention, q, k, v, bias, rotary)
    want = run(reference, q, k, v, bias, rotary)
    for name, a, b in zip(["out", "dq", "dk", "dv", "dbias"], got, want):
        assert a.dtype == b.dtype
        torch.testing.assert_close(a.float(), b.float(), rtol=3e-2, atol=3e-2, msg=lambda m: f"{name}: {m}")


@pytest.mark.skipif(DEVICE == "cpu", reason="needs a GPU: Triton's interpreter runs programs in a fixed order, so "
                    "only a GPU can show an order-dependent reduction; see the next test")
def test_bias_gradient_is_deterministic():
    """On a GPU: repeated runs give the same bits (atomics in the reduction would not)."""
    q, k, v, bias = inputs(2, 2, 100, 16, True)
    first = run(attn.attention, q, k, v, bias, True)[-1]
    for _ in range(2):
        assert torch.equal(run(attn.attention, q, k, v, bias, True)[-1], first)


@pytest.mark.skipif(DEVICE != "cpu", reason="reorders the programs of Triton's interpreter")
def test_gradients_do_not_depend_on_the_order_of_the_programs(monkeypatch):
    """The interpreter runs programs one after another in grid order, so repeating a run cannot reveal
    an order-dependent reduction (atomics). Here the programs run in reverse grid order: every
    gradient, dbias included, must come out with the same bits. 16-wide tiles give 4 query blocks,
    so a per-diagonal sum over tiles in another order would round differently."""
    from triton.runtime import interpreter

    builder = interpreter.interpreter_builder
    set_idx = builder.set_grid_idx

    def reversed_idx(x, y, z):
        gx, gy, gz = builder.grid_dim
        set_idx(gx - 1 - x, gy - 1 - y, gz - 1 - z)

    monkeypatch.setattr(attn, "_tile", lambda *_: attn.Tile(16, 16))
    q, k, v, bias = inputs(1, 1, 64, 16, True)
    forward = run(attn.attention, q, k, v, bias, True)
    monkeypatch.setattr(builder, "set_grid_idx", reversed_idx)
    backward = run(attn.attention, q, k, v, bias, True)
    for name, a, b in zip(["out", "dq", "dk", "dv", "dbias"], forward, backward):
        assert torch.equal(a, b), name


# layouts of a packed qkv (3, B, H, N, d), as the permutation that takes the named buffer there: one projection's
# output (B, N, 3, H, d) (engine/fastpath.py's, with rows 3 H d apart), a stack (3, B, H, N, d), and (B, H, 3, N, d)
PACKINGS = {"projection": (2, 0, 3, 1, 4), "stacked": (0, 1, 2, 3, 4), "per head": (2, 0, 1, 3, 4)}


def packed(q, k, v, packing):
    """q, k, v (B, H, N, d) copied into one buffer of the layout `packing`, seen as (3, B, H, N, d)."""
    perm = PACKINGS[packing]
    stacked = torch.stack([q.detach(), k.detach(), v.detach()])  # (3, B, H, N, d)
    buffer = stacked.permute(*[perm.index(i) for i in range(5)]).contiguous()  # the named layout
    qkv = buffer.permute(*perm)
    assert torch.equal(qkv, stacked)
    return qkv.requires_grad_()


@pytest.mark.parametrize("B, H, N, d, rotary, use_bias, packing", [
    (2, 1, 17, 16, True, True, "projection"), (2, 1, 1, 16, False, True, "projection"),
    (1, 2, 33, 16, True, False, "projection"), (2, 2, 70, 64, False, True, "per head"),
    (3, 2, 21, 32, True, True, "stacked")])
def test_packed_qkv_is_the_reference(B, H, N, d, rotary, use_bias, packing):
    """attention_packed reads q, k, v in place from one buffer and writes their gradient into one tensor of the
    same layout (so that the projection's backward needs no stack): values and gradients against the reference."""
    q, k, v, bias = inputs(B, H, N, d, use_bias)
    want = run(reference, q, k, v, bias, rotary)
    qkv = packed(q, k, v, packing)
    out = attn.attention_packed(qkv, bias, rotary)
    do = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out)
    grads = torch.autograd.grad(out, [qkv] + ([bias] if use_bias else []), do)
    assert grads[0].stride() == qkv.stride()  # the kernels wrote the gradient in qkv's layout
    for name, a, b in zip(["out", "dq", "dk", "dv", "dbias"], [out, *grads[0].unbind(0), *grads[1:]], want):
        assert_fp32_close(name, a, b)


def test_packed_qkv_in_bf16():
    q, k, v, bias = inputs(2, 1, 40, 64, True, dtype=torch.bfloat16)
    want = run(reference, q, k, v, bias, True)
    qkv = packed(q, k, v, "projection")
    out = attn.attention_packed(qkv, bias, True)
    do = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out)
    dqkv, dbias = torch.autograd.grad(out, [qkv, bias], do)
    for name, a, b in zip(["out", "dq", "dk", "dv", "dbias"], [out, *dqkv.unbind(0), dbias], want):
        assert a.dtype == b.dtype
        torch.testing.assert_close(a.float(), b.float(), rtol=3e-2, atol=3e-2, msg=lambda m: f"{name}: {m}")


def test_packed_qkv_expanded():
    """A qkv with a stride-0 axis (one sequence expanded over the batch): its gradient cannot be written with its
    strides, so the kernels get a copy, and the expanded axis's gradient is the sum over it."""
    q, k, v, _ = inputs(1, 1, 17, 16, False)
    base = packed(q, k, v, "stacked")
    out = attn.attention_packed(base.expand(3, 2, 1, 17, 16), None, True)
    do = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out)
    (grad,) = torch.autograd.grad(out, base, do)
    ref = reference(*(x.expand(2, -1, -1, -1) for x in (q, k, v)), None, True)
    for name, a, b in zip(["dq", "dk", "dv"], grad.unbind(0), torch.autograd.grad(ref, [q, k, v], do)):
        assert_fp32_close(name, a, b)


def test_packed_qkv_bad_shape():
    with pytest.raises(ValueError, match=r"\(3, B, H, N, d\)"):
        attn.attention_packed(torch.zeros(2, 1, 1, 4, 16))


def test_readout_rows_from_saved_lse():
    q, k, v, bias = inputs(2, 1, 70, 64, True)
    out, lse = attn.attention_forward(q, k, v, bias, rotary=True)
    rows = [0, 1, 37, 69]
    A = fastpath.attention_rows(q, k, lse, bias, rotary=True, rows=rows)
    full = torch.softmax(transformer.attention_scores(q, k, bias, rotary=True), -1)
    torch.testing.assert_close(A, full[:, :, rows], **FP32_TOL)
    torch.testing.assert_close(out, reference(q, k, v, bias, True), **FP32_TOL)


def test_reference_is_causal_softmax_attention():
    """The oracle itself against an explicit loop over query positions (no rotary: plain scores + bias)."""
    q, k, v, bias = inputs(1, 2, 9, 16, True)
    out = reference(q, k, v, bias)
    for i in range(9):
        s = (q[:, :, i : i + 1] @ k[:, :, : i + 1].transpose(-1, -2)) / 4.0 + bias[:, :i + 1].flip(-1)[None, :, None]
        torch.testing.assert_close(out[:, :, i : i + 1], torch.softmax(s, -1) @ v[:, :, : i + 1])


def rope_scores_by_hand(q, k):
    """<R_i q_i, R_j k_j> / sqrt(d) for one head, (N, d) each, with complex numbers: the pair
    (x_{2f}, x_{2f+1}) is x_{2f} + i x_{2f+1}, rotated at position n by exp(i n theta_f),
    theta_f = 10000^(-2f/d) (RoFormer), and <a, b> = Re(sum_f a_f conj(b_f))."""
    N, d = q.shape
    theta = [10000.0 ** (-2 * f / d) for f in range(d // 2)]  # d = 16: 1, 0.316, 0.1, ..., 10000^(-7/8)
    zq = torch.complex(q[:, 0::2].double(), q[:, 1::2].double())  # (N, d/2)
    zk = torch.complex(k[:, 0::2].double(), k[:, 1::2].double())
    out = torch.full((N, N), float("-inf"), dtype=torch.float64)
    for i in range(N):
        for j in range(i + 1):
            rq = zq[i] * torch.tensor([complex(math.cos(i * t), math.sin(i * t)) for t in theta])
            rk = zk[j] * torch.tensor([complex(math.cos(j * t), math.sin(j * t)) for t in theta])
            out[i, j] = (rq * rk.conj()).sum().real / math.sqrt(d)
    return out


@pytest.mark.parametrize("N, seqs, block", [(70, 4, 64), (1, 4, 64), (64, 16, 64), (70, 1, 16), (33, 8, 32)])
def test_rotary_pre_pass_matches_the_reference_rotation(N, seqs, block):
    """The rotary kernel ((seqs, block, d) tiles per program) against the reference rotation: positions past a
    block, a last program with fewer sequences (10 sequences in programs of 4 or 8), N = 1."""
    q, k, _, _ = inputs(2, 5, N, 16, False)
    cos, sin = transformer.rotary_tables(N, 16, q.device)
    for got, x in zip(attn.rotate_pass(q.detach(), k.detach(), seqs, block), (q, k)):
        torch.testing.assert_close(got, transformer.rotate(x.detach(), cos, sin), **FP32_TOL)


def test_rotary_matches_an_explicit_complex_rotation():
    """Reference scores, and the kernel's output, against rotations written out with their angles: a wrong angle
    in both the kernel's and the model's rotary_tables would pass the other tests."""
    B, H, N, d = 1, 2, 40, 16
    q, k, v, _ = inputs(B, H, N, d, False, seed=4)
    want = torch.stack([rope_scores_by_hand(q[0, h].detach().cpu(), k[0, h].detach().cpu()) for h in range(H)])
    got = transformer.attention_scores(q, k, rotary=True)[0].cpu().double()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # the rotation matters: without it the scores differ by O(1)
    assert (transformer.attention_scores(q, k, rotary=False)[0].cpu().double() - want)[:, 1:, 0].abs().max() > 0.1
    out = attn.attention(q, k, v, rotary=True)
    expected = torch.softmax(want, -1) @ v[0].detach().cpu().double()
    assert_fp32_close("out", out[0].detach().cpu().double(), expected)


@pytest.mark.parametrize("N, d", [(1, 16), (70, 64), (257, 128)])
def test_kernel_rotary_tables_are_the_models(N, d):
    """The kernels keep their own copy of the rotary angles (they import nothing of the model's): the same bits."""
    for got, want in zip(attn.rotary_tables(N, d, DEVICE), transformer.rotary_tables(N, d, DEVICE)):
        assert torch.equal(got, want)


def test_rotary_scores_depend_only_on_relative_position():
    g = torch.Generator().manual_seed(3)
    q0, k0 = torch.randn(1, 1, 1, 16, generator=g), torch.randn(1, 1, 1, 16, generator=g)
    q, k = q0.expand(1, 1, 40, 16).contiguous(), k0.expand(1, 1, 40, 16).contiguous()
    s = transformer.attention_scores(q, k, rotary=True)[0, 0]
    torch.testing.assert_close(torch.diagonal(s, -5), torch.full((35,), s[5, 0].item()), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape, bias_shape", [((2, 1, 8, 24), None), ((2, 1, 8, 16), (1, 9))])
def test_bad_shapes(shape, bias_shape):
    q = torch.randn(shape)
    with pytest.raises(ValueError):
        attn.attention(q, q, q, torch.zeros(bias_shape) if bias_shape else None)


TILE_SETS = {  # kernel -> Tile: rectangular tiles both ways, small and large, the three diagonal methods
    "square 16, mask diagonals": {"fwd": attn.Tile(16, 16), "dq": attn.Tile(16, 16, diagonal="mask"), "dkdv": attn.Tile(16, 16)},
    "rectangular, dS stored": {"fwd": attn.Tile(16, 32), "dq": attn.Tile(32, 16, diagonal="store"), "dkdv": attn.Tile(32, 16)},
    "rectangular, other way, dS stored": {"fwd": attn.Tile(32, 16), "dq": attn.Tile(16, 64, diagonal="store"), "dkdv": attn.Tile(64, 16)},
    "square 32, gather": {"fwd": attn.Tile(32, 32), "dq": attn.Tile(32, 32), "dkdv": attn.Tile(32, 32)},
    "rectangular": {"fwd": attn.Tile(32, 16), "dq": attn.Tile(16, 16), "dkdv": attn.Tile(16, 32)},
    "rectangular, other way": {"fwd": attn.Tile(16, 32), "dq": attn.Tile(64, 64), "dkdv": attn.Tile(32, 16)},
}


@pytest.mark.parametrize("tiles", TILE_SETS, ids=list(TILE_SETS))
@pytest.mark.parametrize("use_bias", [True, False])
def test_other_tiles(monkeypatch, tiles, use_bias):
    """Every kernel with tiles that are not the interpreter's default 64 x 64 (the GPU's table,
    TILES, picks others), N = 50 not a multiple of any of them."""
    monkeypatch.setattr(attn, "_tile", lambda kernel, *_: TILE_SETS[tiles][kernel])
    q, k, v, bias = inputs(2, 2, 50, 16, use_bias)
    got = run(attn.attention, q, k, v, bias, True)
    want = run(reference, q, k, v, bias, True)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, **FP32_TOL)


def test_rectangular_dq_tiles_with_bias_are_refused(monkeypatch):
    """The skew of _diagonal_sums is only defined for square tiles (storing dS takes any shape)."""
    monkeypatch.setattr(attn, "_tile", lambda kernel, *_: attn.Tile(32, 16))
    q, k, v, bias = inputs(1, 1, 20, 16, True)
    out = attn.attention(q, k, v, bias)
    with pytest.raises(ValueError, match="square"):
        out.sum().backward()


def test_unknown_diagonal_method_is_refused(monkeypatch):
    monkeypatch.setattr(attn, "_tile", lambda kernel, *_: attn.Tile(16, 16, diagonal="skew"))
    q, k, v, bias = inputs(1, 1, 20, 16, True)
    with pytest.raises(ValueError, match="diagonal method"):
        attn.attention(q, k, v, bias).sum().backward()


@pytest.mark.parametrize("N", [1, 17, 64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_stored_ds_bias_gradient(monkeypatch, N, dtype):
    """The "store" method (dS written by the dq kernel, summed along diagonals by torch) at N = 1, N not
    a multiple of the block, and one full block, with rotary too: every gradient against the reference."""
    monkeypatch.setattr(attn, "_tile", lambda kernel, *_: attn.Tile(32, 32, diagonal="store") if kernel == "dq" else attn.Tile(32, 32))
    q, k, v, bias = inputs(2, 2, N, 16, True, dtype)
    got = run(attn.attention, q, k, v, bias, True)
    want = run(reference, *(x.detach().float().requires_grad_() for x in (q, k, v, bias)), True)
    for name, a, b in zip(["out", "dq", "dk", "dv", "dbias"], got, want):
        if dtype == torch.float32:
            assert_fp32_close(name, a.float(), b)
        else:  # bf16 operands and a bf16 dS: judged as a whole, like test_kernel_matches_reference_bf16
            assert (a.float() - b).norm() <= 3e-2 * b.norm() + 1e-3, name


def test_diagonal_sums_match_a_loop():
    """The slot layout (lower / upper sums per block lag) against dS summed along diagonals by a
    loop, on a dS with no zeros (the causal mask would hide a mixed-up upper half)."""
    B, H, N, block = 2, 1, 40, 16
    g = torch.Generator().manual_seed(5)
    ds = torch.randn(B, H, N, N, generator=g)
    nb = -(-N // block)
    slots = torch.zeros(B * H, nb, nb + 1, 2, block)  # a padding lag; the kernel writes zeros where it has no tile
    padded = torch.zeros(B, H, nb * block, nb * block)
    padded[:, :, :N, :N] = ds.tril()
    for m in range(nb):
        for n in range(m + 1):
            tile = padded[:, :, m * block:(m + 1) * block, n * block:(n + 1) * block].reshape(B * H, block, block)
            for t in range(block):
                slots[:, m, m - n, 0, t] = tile.diagonal(-t, 1, 2).sum(-1)
                if t:
                    slots[:, m, m - n, 1, t] = tile.diagonal(block - t, 1, 2).sum(-1)
    want = torch.stack([ds.tril().diagonal(-r, 2, 3).sum((0, -1)) for r in range(N)], -1)  # (H, N)
    torch.testing.assert_close(bias_gradient._sum_slots(slots, B, H, N), want)


@pytest.mark.parametrize("tiles", [attn.Tile(16, 16), attn.Tile(32, 32)])
def test_the_bias_gradient_needs_no_initialized_buffer(monkeypatch, tiles):
    """The dq kernel writes every slot of the bias gradient's buffer (zeros where a query block has no tile), so
    the buffer is torch.empty: filled with NaN here, any slot left unwritten would show in dbias."""
    empty = torch.empty
    monkeypatch.setattr(bias_gradient.torch, "empty", lambda *a, **k: empty(*a, **k).fill_(float("nan")))
    monkeypatch.setattr(attn, "_tile", lambda *_: tiles)
    q, k, v, bias = inputs(2, 1, 70, 16, True)
    got = run(attn.attention, q, k, v, bias, False)[-1]
    want = run(reference, q, k, v, bias, False)[-1]
    assert_fp32_close("dbias", got, want)


def test_sum_of_stored_ds_matches_a_loop():
    """_sum_stored against a loop over diagonals, with NaN above the diagonal (where the dq kernel
    never writes): it must neither read those entries nor mix up the diagonals."""
    B, H, N = 3, 2, 23
    ds = torch.randn(B * H, N, N, generator=torch.Generator().manual_seed(6))
    want = torch.zeros(H, N)
    for h in range(H):
        for r in range(N):
            for i in range(r, N):
                want[h, r] += sum(ds[b * H + h, i, i - r] for b in range(B))
    above = torch.ones(N, N, dtype=torch.bool).triu(1)
    torch.testing.assert_close(bias_gradient._sum_stored(ds.masked_fill(above, float("nan")), B, H, N), want)


def test_tile_table_round_trip(monkeypatch, tmp_path):
    """The table bench_attention.py --sweep writes is the table _tile reads on a GPU."""
    table = {("dq", "bfloat16", True, False): attn.Tile(32, 32, 8, 3, "mask"), ("fwd", "float32", False, True): attn.Tile(128, 64, 8, 2)}
    path = str(tmp_path / "tiles.json")
    tiles.save_tiles(table, path, device="test")
    assert tiles.load_tiles(path) == table
    monkeypatch.setattr(attn, "INTERPRET", False)
    monkeypatch.setattr(attn, "TILES", tiles.load_tiles(path))
    assert attn._tile("dq", torch.bfloat16, True, 256) == attn.Tile(32, 32, 8, 3, "mask")
    assert attn._tile("fwd", torch.float32, False, 1024) == attn.Tile(128, 64, 8, 2)
    assert attn._tile("fwd", torch.float32, False, 513) == attn.Tile(128, 64, 8, 2)  # long: N > 512
    assert attn._tile("fwd", torch.float32, False, 512) == attn.DEFAULT_TILE
    legacy = json.load(open(path))  # a table written before "store" existed: a bool, gather or not
    legacy["tiles"][0]["tile"][4] = False
    json.dump(legacy, open(path, "w"))
    assert tiles.load_tiles(path)[("dq", "bfloat16", True, False)] == attn.Tile(32, 32, 8, 3, "mask")


def test_large_bias_gives_finite_gradients():
    """Rows past N (the last block's padding) must get P = 0 whatever the scores: with a bias of 100
    exp(score - lse) overflowed there when lse was read as 0, and inf * 0 made dk, dv, dbias NaN."""
    q, k, v, _ = inputs(1, 1, 17, 16, False)
    bias = torch.full((1, 17), 100.0, device=DEVICE).requires_grad_()
    got = run(attn.attention, q, k, v, bias, True)
    want = run(reference, q, k, v, bias, True)
    for name, a, b in zip(["out", "dq", "dk", "dv", "dbias"], got, want):
        assert_fp32_close(name, a, b)


def test_rotary_tables_first_built_in_a_capture_are_not_cached(monkeypatch):
    """Tables made inside a CUDA graph capture hold nothing until the replay: they must not be cached
    for later eager calls (simulated on the CPU by reporting a capture)."""
    monkeypatch.setattr(attn, "_TABLES", {})
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    fake_cuda = torch.device("cuda", 0)
    monkeypatch.setattr(attn, "rotary_tables", lambda N, d, device: (torch.ones(N, d // 2), torch.zeros(N, d // 2)))
    attn._kernel_rotary_tables(8, 16, fake_cuda)
    assert attn._TABLES == {}
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    attn._kernel_rotary_tables(8, 16, fake_cuda)
    assert list(attn._TABLES) == [(8, 16, fake_cuda)]


def test_backward_gets_no_zero_gradients_for_the_extra_outputs(monkeypatch):
    """lse and the rotated q, k are outputs without gradients: autograd must not build zero tensors
    of their shapes on every backward (two of them are as large as q and k)."""
    seen = []
    backward = attn._Attention.backward

    def spy(ctx, *grads):
        seen.append(grads)
        return backward(ctx, *grads)

    monkeypatch.setattr(attn._Attention, "backward", staticmethod(spy))
    q, k, v, bias = inputs(1, 1, 17, 16, True)
    run(attn.attention, q, k, v, bias, True)
    assert len(seen) == 1 and seen[0][0] is not None and all(g is None for g in seen[0][1:])
