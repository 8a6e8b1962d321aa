"""The Triton walk along Markov chains (kernels/markov_walk.py) against the sampler's scan (fastdata.walk) and
markov.py's loop: the same sequences, bit for bit, from the same uniforms. On the CPU through Triton's
interpreter (conftest.py), on CUDA compiled."""
import pytest
import torch

from engine import fastdata
from kernels import markov_walk
from markov import TaskSet, sample_chains, stationary, uniforms

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def chains_and_uniforms(n, length, C, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    T = sample_chains(n, C, generator=g).to(dtype)
    u0, u = uniforms(n, length, g, dtype, "cpu")
    return T.to(DEVICE), stationary(T).to(DEVICE), u0.to(DEVICE), u.to(DEVICE)


# (n, length, C, dtype): the paper's C = 10 and L = 257 (block 16 x 16 positions); sequences not a multiple of
# BLOCK_N and a single one; a last block running past the end (29 positions in 6 blocks of 5); two positions;
# C = 2, 3 and 16 (the table's padding); float64 task sets
@pytest.mark.parametrize("n, length, C, dtype", [(20, 257, 10, torch.float32), (37, 30, 10, torch.float32),
                                                 (1, 17, 10, torch.float32), (5, 2, 3, torch.float32),
                                                 (16, 40, 16, torch.float32), (9, 12, 2, torch.float64)])
def test_the_walk_draws_the_scans_sequences(n, length, C, dtype):
    T, p, u0, u = chains_and_uniforms(n, length, C, dtype)
    want = fastdata.walk(T, p, u0, u, length)
    got = fastdata.walk(T, p, u0, u, length, kernel=True)
    assert got.dtype == torch.int64 and torch.equal(got, want)
    assert 0 < (got[:, 1:] != got[:, :-1]).float().mean() < 1  # a walk that moves, and not always


def test_batches_with_the_walk_are_the_task_sets_batches():
    """batches(kernel=True) of three members: each member's sequences and chains are TaskSet.batch's."""
    sources = [TaskSet.create(K, seed=s, device=DEVICE) for K, s in ((3, 0), (70, 1), (9, 2))]
    gens = [torch.Generator(DEVICE).manual_seed(s) for s in (5, 6, 7)]
    seqs, chains = fastdata.batches(sources, 6, 21, gens, kernel=True)
    for e, (t, s) in enumerate(zip(sources, (5, 6, 7))):
        want_seqs, want_chains = t.batch(6, 21, torch.Generator(DEVICE).manual_seed(s))
        assert torch.equal(seqs[e], want_seqs) and torch.equal(chains[e], want_chains), e


def test_bad_input_is_one_error():
    T, p, u0, u = chains_and_uniforms(4, 10, 10, torch.float32)
    cdf, s0 = T.cumsum(1), torch.zeros(4, dtype=torch.int64, device=DEVICE)
    with pytest.raises(ValueError, match="walk takes"):
        markov_walk.walk(cdf, s0, u, 12)  # the uniforms cover 9 positions, not 11
    with pytest.raises(ValueError, match="walk takes"):
        markov_walk.walk(cdf.double(), s0, u, 10)  # two dtypes


def test_ties_and_the_last_entry_as_inverse_cdf():
    """A uniform equal to a CDF entry counts it (markov.inverse_cdf's right=True), and the last entry is never
    counted (inverse_cdf clamps to C - 1): on a hand-made table whose columns (1/4, 1/4, 1/4) leave 1/4 of the
    mass out, with uniforms on the steps 1/4, 1/2 and above 3/4."""
    T = torch.full((1, 3, 3), 0.25, device=DEVICE)
    u0 = torch.zeros(1, 1, device=DEVICE)
    u = torch.tensor([0.25, 0.5, 0.875, 0.1, 0.75], device=DEVICE).view(5, 1, 1)  # block 5 x 1 block
    got = fastdata.walk(T, torch.full((1, 3), 1 / 3, device=DEVICE), u0, u, 6, kernel=True)
    assert got.tolist() == [[0, 1, 2, 2, 0, 2]]
    assert torch.equal(got, fastdata.walk(T, torch.full((1, 3), 1 / 3, device=DEVICE), u0, u, 6))
