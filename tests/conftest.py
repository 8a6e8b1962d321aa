"""The kernel tests run the Triton kernels through the interpreter on the CPU; the flag must be
set before triton is imported anywhere. With CUDA present they run compiled on the GPU instead.

The suite runs with one torch thread: its models are tiny, and on the 2-core CI machine two threads
fighting over a busy CPU made it over 3x slower (6 min 16 s against 1 min 50 s for the same tests).
TEST_THREADS=2 runs it with two, which sums in another order: every pin must hold either way."""
import math
import os

import matplotlib.pyplot as plt
import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
torch.set_num_threads(int(os.environ.get("TEST_THREADS", "1")))


def _same_numbers(a, b, rel=1e-6):
    """Nested dicts/lists equal, floats up to float32 rounding. Seeded runs are bit-identical here, but
    on CI two identical runs in one process once differed by one float32 ulp in a logged loss (probably
    MKL choosing its CPU kernels at run time), so the tests compare to rounding; a seeding or resume
    bug moves the numbers by ~1e-2."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same_numbers(a[k], b[k], rel) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same_numbers(x, y, rel) for x, y in zip(a, b))
    if isinstance(a, float):
        return math.isclose(a, b, rel_tol=rel, abs_tol=rel)
    return a == b


@pytest.fixture(autouse=True)
def close_figures():
    """Close what a test left open: the tests that spy on plt.close keep their figures to look at them, and
    pyplot warns once more than 20 are open in the process."""
    yield
    plt.close("all")


@pytest.fixture
def same_numbers():
    return _same_numbers

