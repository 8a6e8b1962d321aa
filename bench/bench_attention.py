"""Benchmark (not a test): the Triton relative-position attention against the eager reference and
PyTorch's fused attention, at the paper's training shapes. Needs a CUDA GPU (on a CPU the kernel
only runs in Triton's interpreter, which says nothing about its speed).

Baselines, the fastest PyTorch way to compute the same thing:
  rotary   q and k rotated once into copies, then F.scaled_dot_product_attention with
           is_causal=True ("sdpa causal": no mask tensor, so SDPA may pick its flash backend), SDPA
           with a dense float mask ("sdpa+mask", the plain masked baseline) and FlexAttention with a
           causal block mask ("flex")
  bias     SDPA with a dense float mask holding -inf above the diagonal and bias[h, i - j] below
           ("sdpa+mask": a bias rules out the flash backend), and FlexAttention with the causal
           block mask and a bias score_mod ("flex")

    python bench/bench_attention.py [--sweep] [--json FILE] [--previous FILE]

--sweep first times every kernel alone (captured in a CUDA graph) over a list of candidate tiles (block sizes, warps,
pipeline stages, and for the bias gradient the diagonal method) at each (N, dtype, bias), keeps the
fastest for the comparison, and prints them as a TILES table for kernels/attention.py. "kernel 64x64"
is the kernel with the untuned default tiles; "kernel graphed" the kernel's calls captured in a CUDA
graph (the GPU's time without Python and launch overhead, as in a graphed training step); --previous
times another version of the kernel file (e.g. an earlier commit's) in the same run.

Every method is first checked in every run (not only in the sweep): its output and the gradients of q, k, v (and
the bias) for a random dO against the reference in true fp32, to TOLERANCE; one that fails is not timed, and
FlexAttention's compile is retried with other kernel_options (FLEX_OPTIONS) where it fails. Each method is then
timed eager and graphed ("<method> graphed": captured once in a CUDA graph, the GPU's time alone, as in the
graphed training step), the baselines' rotary tables cached as the kernel's are. Prints forward and
forward+backward milliseconds (the mean of triton.testing.do_bench's repetitions), the ratio of every method's
time to the eager kernel's, measured in the same run, and the method's relative error. --rotate checks every
tile candidate of the rotary pre-pass against the fp32 rotation before timing it.
"""
import functools
import os
import shlex
import sys
import traceback

import torch
import torch.nn.functional as F
import triton

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.bench_train import load_attention, load_attention_module  # noqa: E402
from kernels import attention as attn  # noqa: E402
from kernels.attention import attention  # noqa: E402
from kernels.tiles import Tile, save_tiles  # noqa: E402
from plumbing import cli  # noqa: E402
from plumbing.rundir import write_json  # noqa: E402
from transformer import attend, rotary_tables, rotate  # noqa: E402


def attention_reference(q, k, v, bias=None, rotary=False):
    """The model's attention (transformer.attend) without its weights: the oracle, and the eager baseline."""
    return attend(q, k, v, bias, rotary)[0]


try:
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
except ImportError:
    flex_attention = None

B, H, D = 128, 1, 64
SHAPES = [(N, dtype, mode) for N in (256, 1024) for dtype in (torch.float32, torch.bfloat16) for mode in ("rotary", "bias")]

# sweep candidates per kernel: Tile(block_m, block_n, warps, stages[, diagonal])
CANDIDATES = {
    "fwd": [Tile(64, 64, 4, 2), Tile(64, 32, 4, 2), Tile(128, 64, 8, 2), Tile(128, 32, 4, 2), Tile(64, 64, 4, 3),
            Tile(128, 64, 4, 3), Tile(32, 32, 4, 2), Tile(32, 64, 4, 2), Tile(64, 32, 4, 3), Tile(128, 32, 8, 3)],
    "dkdv": [Tile(32, 64, 4, 2), Tile(64, 64, 4, 2), Tile(32, 128, 8, 2), Tile(64, 128, 8, 2), Tile(16, 64, 4, 2),
             Tile(32, 64, 4, 3), Tile(64, 64, 8, 2), Tile(64, 64, 4, 3), Tile(32, 32, 4, 2), Tile(16, 32, 4, 2),
             Tile(64, 32, 4, 2)],
    "dq": [Tile(64, 64, 4, 2), Tile(128, 64, 8, 2), Tile(128, 32, 4, 2), Tile(64, 32, 4, 2), Tile(64, 64, 4, 3),
           Tile(32, 32, 4, 2), Tile(64, 32, 4, 3), Tile(32, 64, 4, 2), Tile(128, 64, 8, 3)],
    "dq bias": [Tile(16, 16, 4, 2, "mask"), Tile(16, 16, 4, 2), Tile(32, 32, 4, 2), Tile(64, 64, 4, 2),
                Tile(64, 64, 8, 2), Tile(32, 32, 4, 3), Tile(64, 64, 4, 3), Tile(32, 32, 2, 2), Tile(64, 64, 8, 3),
                Tile(64, 64, 4, 2, "store"), Tile(128, 64, 8, 2, "store"), Tile(64, 32, 4, 2, "store"),
                Tile(32, 64, 4, 2, "store"), Tile(128, 32, 4, 2, "store"), Tile(64, 64, 4, 3, "store"),
                Tile(32, 32, 4, 2, "store")],
}
SWEEPS = ("fwd", "dkdv", "dq", "dq bias")  # what --sweep-kernels names


cached_tables = functools.lru_cache(rotary_tables)  # the baselines' tables built once, as the kernel's are


def rotated(q, k):
    """q and k rotated to their positions, as copies in their own dtype."""
    cos, sin = cached_tables(q.shape[2], q.shape[3], q.device)
    return rotate(q, cos, sin).to(q.dtype), rotate(k, cos, sin).to(k.dtype)


def sdpa_causal(q, k, v, bias=None, rotary=False):
    """SDPA with is_causal=True on rotated q, k: the baseline for rotary (no bias)."""
    if bias is not None:
        raise ValueError("sdpa_causal has no bias; use sdpa_mask")
    if rotary:
        q, k = rotated(q, k)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def sdpa_mask(q, k, v, bias=None, rotary=False):
    """SDPA with an explicit float mask: -inf above the diagonal plus bias[h, i - j] below."""
    B, H, N, d = q.shape
    if rotary:
        q, k = rotated(q, k)
    rel = torch.arange(N, device=q.device).view(N, 1) - torch.arange(N, device=q.device).view(1, N)
    mask = torch.zeros(H, N, N, device=q.device) if bias is None else bias[:, rel.clamp(min=0)]
    mask = mask.masked_fill(rel < 0, float("-inf")).to(q.dtype)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask.unsqueeze(0))


# FlexAttention's compile is retried with these kernel_options where the defaults fail (its bf16 backward with a
# bias gradient ran out of shared memory on the H100): smaller tiles for the forward (M, N) and both backward
# passes (M1, N1, M2, N2), one pipeline stage
FLEX_OPTIONS = [None,
                dict(BLOCK_M=64, BLOCK_N=32, BLOCK_M1=32, BLOCK_N1=64, BLOCK_M2=64, BLOCK_N2=32, num_stages=1),
                dict(BLOCK_M=32, BLOCK_N=32, BLOCK_M1=16, BLOCK_N1=32, BLOCK_M2=32, BLOCK_N2=16, num_stages=1),
                dict(BLOCK_M=16, BLOCK_N=16, BLOCK_M1=16, BLOCK_N1=16, BLOCK_M2=16, BLOCK_N2=16, num_stages=1, num_warps=4)]


def make_flex(N, device, options=None):
    """FlexAttention with a causal block mask (and the bias as a score_mod), compiled with kernel_options."""
    block_mask = create_block_mask(lambda b, h, q, kv: q >= kv, B=None, H=None, Q_LEN=N, KV_LEN=N, device=device)
    compiled = torch.compile(flex_attention)

    def flex(q, k, v, bias=None, rotary=False):
        if rotary:
            q, k = rotated(q, k)
        score_mod = None if bias is None else (lambda score, b, h, qi, ki: score + bias[h, qi - ki])
        return compiled(q, k, v, score_mod=score_mod, block_mask=block_mask, kernel_options=options)

    return flex


def with_tiles(fn, tiles):
    """fn run with kernels/attention.py's TILES replaced by `tiles` for the call."""
    def call(*args):
        saved, attn.TILES = attn.TILES, tiles
        try:
            return fn(*args)
        finally:
            attn.TILES = saved
    return call


def grad_out(q):
    """The gradient dO fed to every backward: random, so that no term of a gradient cancels by symmetry."""
    return torch.randn(q.shape, device=q.device, generator=torch.Generator(q.device).manual_seed(1)).to(q.dtype)


def check(fn, q, k, v, bias, rotary, do) -> float:
    """fn's largest relative error, over its output and the gradients of q, k, v (and bias) for dO = do, against
    attention_reference in true fp32 on the same inputs (TOLERANCE says what passes)."""
    leaves = [q, k, v] + ([bias] if bias is not None else [])
    got = [fn(q, k, v, bias, rotary)]
    got += torch.autograd.grad(got[0], leaves, do)
    ref = [x.detach().float().requires_grad_() for x in leaves[:3]] + ([bias.detach().clone().requires_grad_()] if bias is not None else [])
    tf32, torch.backends.cuda.matmul.allow_tf32 = torch.backends.cuda.matmul.allow_tf32, False
    try:
        want = [attention_reference(*ref[:3], ref[3] if bias is not None else None, rotary)]
        want += torch.autograd.grad(want[0], ref, do.float())
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    return max(relative_error(g, w.detach()) for g, w in zip(got, want))


def bench(fn, q, k, v, bias, rotary, backward, graphed=False):
    """Mean ms of fn (and its backward, for a random dO) over do_bench's repetitions. graphed: the same work
    captured once in a CUDA graph and replayed, so the time is the GPU's alone, without the Python and launch
    overhead of each call."""
    from triton.testing import do_bench

    leaves = [q, k, v] + ([bias] if bias is not None else [])
    do = grad_out(q)

    def step():
        out = fn(q, k, v, bias, rotary)
        if backward:
            torch.autograd.grad(out, leaves, do)

    return gpu_ms(step) if graphed else do_bench(step, warmup=25, rep=100)


def gpu_ms(fn, warmup=25, rep=100):
    """Mean ms of fn's GPU work alone: fn captured once in a CUDA graph, do_bench around the replay.
    Without the graph a call that takes the host longer than the GPU (about 10 us per launch or torch
    op on the lent H100, more than a whole kernel at N = 256) is timed at the host's pace."""
    from triton.testing import do_bench

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return do_bench(graph.replay, warmup=warmup, rep=rep)


@triton.jit
def _empty_kernel(X, n):
    pass


def launch_floor(log):
    """Host time per call of an empty Triton kernel and of a one-element torch add: eager times at
    N = 256 are mostly such calls (the kernel makes 2 launches forward, 2 backward), not GPU work."""
    import time

    x = torch.zeros(1, device="cuda")
    for name, call in [("empty Triton launch", lambda: _empty_kernel[(1,)](x, 1)), ("torch add, 1 element", lambda: x + 1)]:
        for _ in range(100):
            call()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(2000):
            call()
        torch.cuda.synchronize()
        log(f"host floor: {name}: {(time.perf_counter() - t0) / 2000 * 1e6:.1f} us per call")


def make_inputs(N, dtype, mode, seed=0, batch=B):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = (torch.randn(batch, H, N, D, device="cuda", generator=g, dtype=dtype).requires_grad_() for _ in range(3))
    bias = (0.1 * torch.randn(H, N, device="cuda", generator=g)).requires_grad_() if mode == "bias" else None
    return q, k, v, bias


TOLERANCE = {torch.float32: 5e-3, torch.bfloat16: 3e-2}  # ||got - want|| / ||want||: tf32 dots, bf16 operands


def relative_error(got, want):
    return ((got.float() - want).norm() / want.norm().clamp_min(1e-12)).item()


def kernel_runs(q, k, v, bias, rotary):
    """{kernel: tile -> {name: tensor}}: each kernel launched alone with a given tile, on inputs
    (rotated q, k, out, lse, dO, delta) made once with the default tiles."""
    with torch.no_grad():
        qr, kr = attn.rotate_pass(q, k) if rotary else (q, k)
        out, lse = attn.forward_pass(qr, kr, v, bias, attn.DEFAULT_TILE)
        do = torch.randn(out.shape, device=out.device, generator=torch.Generator(out.device).manual_seed(1)).to(out)
        _, delta, _ = attn.backward_dq_pass(qr, kr, v, bias, rotary, out, lse, do, attn.DEFAULT_TILE)

    def fwd(t):
        return {"out": attn.forward_pass(qr, kr, v, bias, t)[0]}

    def dq(t):
        grad, _, dbias = attn.backward_dq_pass(qr, kr, v, bias, rotary, out, lse, do, t)
        return {"dq": grad} | ({"dbias": dbias} if bias is not None else {})

    def dkdv(t):
        return dict(zip(["dk", "dv"], attn.backward_dkdv_pass(qr, kr, v, bias, rotary, lse, delta, do, t)))

    return {"fwd": fwd, "dq": dq, "dkdv": dkdv}, do


def sweep_name(kernel, has_bias):
    return "dq bias" if kernel == "dq" and has_bias else kernel


def candidates(kernel, has_bias):
    return CANDIDATES[sweep_name(kernel, has_bias)]


def compile_one(dtype, mode, kernels=SWEEPS):
    """Compile every candidate of one (dtype, mode) into Triton's on-disk cache (a worker process)."""
    q, k, v, bias = make_inputs(256, dtype, mode, batch=1)
    runs, _ = kernel_runs(q, k, v, bias, mode == "rotary")
    failed = 0
    for kernel, run in runs.items():
        if sweep_name(kernel, bias is not None) not in kernels:
            continue
        for tile in candidates(kernel, bias is not None):
            try:
                with torch.no_grad():
                    run(tile)
            except Exception:  # reported by the sweep itself
                failed += 1
    return failed


def sweep(log, jobs, kernels=SWEEPS, shapes=SHAPES):
    """Each kernel alone over CANDIDATES at every shape, timed as a CUDA graph (the GPU's time, as in a
    graphed training step); the fastest tile that computes the fp32 reference's numbers (to TOLERANCE)
    per (kernel, dtype, bias, long) goes into attn.TILES. Returns the table of times. `kernels` (names
    of SWEEPS) and `shapes` (of SHAPES) limit the sweep; the table then keeps its other entries."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    keys = sorted({(dtype, mode) for _, dtype, mode in shapes}, key=str)
    with ProcessPoolExecutor(min(jobs, len(keys)), mp_context=multiprocessing.get_context("spawn")) as pool:
        failed = sum(pool.map(compile_one, *zip(*keys), [kernels] * len(keys)))  # N = 256 and 1024 share the compiled kernels
    log(f"compiled the candidates of {len(keys)} (dtype, mode) pairs in {jobs} processes ({failed} failed)")
    if set(kernels) == set(SWEEPS) and shapes == SHAPES:
        attn.TILES = {}  # the table holds what this sweep measured, nothing from an earlier one
    results = []
    for N, dtype, mode in shapes:
        q, k, v, bias = make_inputs(N, dtype, mode)
        rotary = mode == "rotary"
        runs, do = kernel_runs(q, k, v, bias, rotary)
        # the fp32 reference on the same inputs: a candidate tile must compute the same numbers
        leaves = [x.detach().float().requires_grad_() for x in (q, k, v)]
        if bias is not None:
            leaves.append(bias.detach().clone().requires_grad_())
        tf32, torch.backends.cuda.matmul.allow_tf32 = torch.backends.cuda.matmul.allow_tf32, False  # true fp32
        want_out = attention_reference(*leaves[:3], leaves[3] if bias is not None else None, rotary)
        want = dict(zip(["dq", "dk", "dv", "dbias"], torch.autograd.grad(want_out, leaves, do.float())), out=want_out.detach())
        torch.backends.cuda.matmul.allow_tf32 = tf32
        dt = str(dtype).removeprefix("torch.")
        for kernel, run in runs.items():
            if sweep_name(kernel, bias is not None) not in kernels:
                continue
            times = {}
            for tile in candidates(kernel, bias is not None):
                try:
                    with torch.no_grad():
                        err = max(relative_error(got, want[name]) for name, got in run(tile).items())
                        if not err <= TOLERANCE[dtype]:
                            raise ValueError(f"wrong result: relative error {err:.1e}")
                        times[tile] = gpu_ms(lambda: run(tile), warmup=10, rep=40)
                except Exception as e:  # a tile that does not fit the card (shared memory) or compile
                    log(f"  {kernel} {tuple(tile)} N={N} {dt} {mode}: failed ({type(e).__name__}: {(str(e).splitlines() or [''])[0][:90]})")
            if not times:
                continue
            best = min(times, key=times.get)
            attn.TILES[(kernel, dt, bias is not None, N > 512)] = best
            results.append({"kernel": kernel, "N": N, "dtype": dt, "mode": mode, "best": list(best),
                            "times_ms": {str(tuple(t)): ms for t, ms in times.items()}})
            log(f"{kernel:>5} N={N:<5} {dt:>8} {mode:>6}: best {tuple(best)} {times[best]:.4f} ms, default "
                f"{times.get(attn.DEFAULT_TILE, float('nan')):.4f} ms, range {min(times.values()):.4f}-{max(times.values()):.4f}")
    log("TILES = {")
    for key, tile in sorted(attn.TILES.items()):
        log(f"    {key!r}: {tile!r},")
    log("}")
    return results


ROTATE_CANDIDATES = [(32, 4), (64, 1), (64, 2), (32, 2), (16, 8), (16, 4), (8, 8), (128, 1)]  # (positions, sequences)


def rotate_sweep(log, previous=None, S=64 * 128, N=256):
    """The rotary pre-pass alone at a 64-model ensemble's shape (S = 64 x 128 sequences of N = 256, d = 64),
    GPU time of a graphed call: every (block, seqs) candidate, the --previous file's pre-pass, and a clone of q
    and k (the same bytes read and written: the bandwidth the pre-pass can reach)."""
    results = {}
    for dtype in (torch.float32, torch.bfloat16):
        q, k = (torch.randn(S, 1, N, D, device="cuda", dtype=dtype) for _ in range(2))
        gb = 4 * q.numel() * q.element_size() / 1e9  # q, k read, their rotations written
        methods = {f"kernel {b}x{s}": (lambda b=b, s=s: attn.rotate_pass(q, k, s, b)) for b, s in ROTATE_CANDIDATES}
        methods["clone q, k"] = lambda: (q.clone(), k.clone())
        if previous is not None:
            rotate = getattr(previous, "rotate_pass", None) or previous._rotate  # an older file's name for it
            methods["previous"] = lambda: rotate(q, k)
        cos, sin = rotary_tables(N, D, q.device)
        want = [rotate(x[:64], cos, sin) for x in (q, k)]  # the first sequences: the reference is fp32
        for name, fn in methods.items():
            if name != "clone q, k":  # every candidate computes the rotation, or its time is not reported
                err = max(relative_error(got[:64], w) for got, w in zip(fn(), want))
                if not err <= TOLERANCE[dtype]:
                    log(f"rotate {str(dtype).removeprefix('torch.'):>8} {name:>16}: WRONG, relative error {err:.1e}")
                    continue
            ms = gpu_ms(fn)
            results[f"{str(dtype).removeprefix('torch.')} {name}"] = ms
            log(f"rotate {str(dtype).removeprefix('torch.'):>8} {name:>16}: {ms:.3f} ms, {gb / ms:.2f} TB/s")
        del q, k
    return results


def main():
    parser = cli.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("--sweep", action="store_true", help="tune the tiles first (see above)")
    parser.add_argument("--sweep-kernels", default=",".join(SWEEPS),
                        help=f"--sweep: only these of {', '.join(SWEEPS)} (comma-separated); the others keep their tiles")
    parser.add_argument("--compile-jobs", type=cli.at_least(1), default=8, help="--sweep: processes that compile the candidates")
    parser.add_argument("--write-tiles", default=None, help="--sweep: write the winning table here (kernels/tiles.json is the one the kernel reads)")
    parser.add_argument("--json", default=None, help="write every number (sweep and comparison) to this file")
    parser.add_argument("--previous", default=None, help="another kernels/attention.py to time in the same run")
    parser.add_argument("--only-kernel", action="store_true", help="time the kernel alone")
    parser.add_argument("--rotate", action="store_true", help="first time the rotary pre-pass alone (rotate_sweep)")
    parser.add_argument("--N", default="256,1024", help="the sequence lengths of the sweep and the comparison")
    args = parser.parse_args()
    jobs = args.compile_jobs
    kernels = args.sweep_kernels.split(",")
    lengths = set(cli.parse_list("--N", args.N))
    if not lengths <= {N for N, _, _ in SHAPES}:
        raise ValueError(f"--N: lengths among {sorted({N for N, _, _ in SHAPES})}, got {args.N!r}")
    shapes = [shape for shape in SHAPES if shape[0] in lengths]
    if not set(kernels) <= set(SWEEPS):
        raise ValueError(f"--sweep-kernels: names among {', '.join(SWEEPS)}, got {args.sweep_kernels!r}")
    if args.previous and not os.path.isfile(args.previous):
        raise ValueError(f"--previous: no file {args.previous}")
    if not torch.cuda.is_available():
        raise ValueError("bench_attention.py needs a CUDA GPU: on a CPU the kernel runs in Triton's interpreter, "
                         "whose speed means nothing (the CPU tests check its numbers)")
    torch.backends.cuda.matmul.allow_tf32 = True
    log = lambda s: print(s, flush=True)  # noqa: E731
    log(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    record = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "B": B, "H": H, "d": D}
    launch_floor(log)
    if args.rotate:
        record["rotate"] = rotate_sweep(log, load_attention_module(args.previous) if args.previous else None)
    if args.sweep:
        try:
            record["sweep"] = sweep(log, jobs, kernels, shapes)
        except Exception:  # on a lease, a broken sweep should still leave the comparison with the defaults
            traceback.print_exc()
            attn.TILES = {}
        if args.write_tiles and attn.TILES:
            save_tiles(attn.TILES, args.write_tiles, device=record["device"], torch=torch.__version__,
                            triton=triton.__version__, source="python " + shlex.join(["bench/bench_attention.py", *sys.argv[1:]]))
    tuned = dict(attn.TILES)
    record["tiles"] = {repr(k): list(v) for k, v in tuned.items()}
    log(f"{'shape':>28} {'mode':>7} {'method':>22} {'fwd ms':>8} {'fwd+bwd ms':>11} {'fwd / kernel':>13} {'f+b / kernel':>13} "
        f"{'rel. error':>9}")
    rows = []
    for N, dtype, mode in shapes:
        q, k, v, bias = make_inputs(N, dtype, mode)
        rotary = mode == "rotary"
        methods = {"kernel": [attention]}  # name -> candidates: the first that computes the reference's numbers is timed
        if not args.only_kernel:
            if tuned:
                methods["kernel 64x64"] = [with_tiles(attention, {})]
            if args.previous:
                methods["previous"] = [load_attention(args.previous)]
            methods["eager"] = [attention_reference]
            if rotary:
                methods["sdpa causal"] = [sdpa_causal]
            methods["sdpa+mask"] = [sdpa_mask]
            if flex_attention is not None:
                methods["flex"] = [make_flex(N, "cuda", options) for options in FLEX_OPTIONS]
        times, errors, do = {}, {}, grad_out(q)
        for name, candidates in methods.items():
            for i, fn in enumerate(candidates):
                try:  # correctness first, in every run: output and gradients against the fp32 reference
                    errors[name] = check(fn, q, k, v, bias, rotary, do)
                    break
                except Exception as e:  # e.g. FlexAttention's compile out of shared memory: its next kernel_options
                    log(f"{name}{f' (kernel_options {FLEX_OPTIONS[i]})' if name == 'flex' else ''}: failed "
                        f"({type(e).__name__}: {(str(e).splitlines() or [''])[0][:80]})")
            else:
                continue
            if not errors[name] <= TOLERANCE[dtype]:
                log(f"{name}: WRONG, relative error {errors[name]:.1e} against the fp32 reference; not timed")
                continue
            for label, graphed in ((name, False), (f"{name} graphed", True)):  # eager, and the GPU's time alone
                try:
                    times[label] = tuple(bench(fn, q, k, v, bias, rotary, backward, graphed) for backward in (False, True))
                except Exception as e:
                    log(f"{label}: failed ({type(e).__name__}: {(str(e).splitlines() or [''])[0][:80]})")
        if "kernel" not in times:
            continue
        base = times["kernel"]
        shape = f"B={B} H={H} N={N} d={D} {str(dtype)[6:]}"
        for name, (fwd, both) in times.items():
            err = errors[name.removesuffix(" graphed")]
            log(f"{shape:>28} {mode:>7} {name:>22} {fwd:8.3f} {both:11.3f} {fwd / base[0]:13.2f} {both / base[1]:13.2f} {err:9.1e}")
            rows.append({"N": N, "dtype": str(dtype)[6:], "mode": mode, "method": name, "fwd_ms": fwd, "fwd_bwd_ms": both,
                         "relative_error": err})
        record["rows"] = rows
        if args.json:  # after every shape, so that a run stopped by a time limit keeps what it measured
            write_json(args.json, record, indent=1)


if __name__ == "__main__":
    cli.run(main)
