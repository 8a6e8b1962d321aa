"""Benchmark (not a test): training throughput of train.py's loop body (sample each model's batch, one
AdamW step) in model-steps/s, for a single run and for ensembles (engine/ensemble.py), each against the single
eager run timed in the same process. Also GFLOP/s against this machine's matmul rate.

    python bench/bench_train.py                       # CUDA: single eager / graphed, ensembles of 8, 32, 64 graphed
    python bench/bench_train.py --device cpu --threads 1   # CPU: single run and a 2-model ensemble
    python bench/bench_train.py --previous OLD.py          # CUDA: also with an earlier kernel file
    python bench/bench_train.py --only "this,bf16,bf16 scan sampling" --runs 3   # CUDA: a few rows for a short lease

"step only" replays one fixed batch (the model's cost); "with sampling" draws every model's batch each
step as train.py does (the rate a run gets: graphed, the sampler inside the step's CUDA graph). On CUDA,
variants put one earlier piece back in the same run (torch's layer norm, the residual adds apart from it,
torch's MLP, torch's embedding, the walk along the chains as fastdata's scan instead of kernels/markov_walk.py,
the sampler outside the graph, per-member sampling, an earlier attention kernel), so that each row's ratio says what that piece bought; "compiled" is the baseline of a
torch.compile'd whole step of the plain model (no kernels of ours), graphed the same way.

Each case is timed --runs times (default 5) over --repeats steps after a warm-up: rates are the median, with
the runs' spread (max - min) / median, so that a difference smaller than the spread is not read as one.
GFLOP/s count causal attention (a position attends to itself and the positions before it) and are set against
the matmul rate of the row's precision measured at the start of the run (bf16 rows: a bf16 matmul).
"""
import gc
import importlib.util
import os
import platform
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from engine import fastdata  # noqa: E402
from engine.ensemble import Ensemble, GraphedStep, Single, sampled_step  # noqa: E402
from engine.fastdata import batches  # noqa: E402
from engine.fastpath import Kernels  # noqa: E402
from kernels import attention as attention_kernel  # noqa: E402
from markov import TaskSet  # noqa: E402
from plumbing import cli  # noqa: E402
from train import PRESETS  # noqa: E402
from transformer import Transformer  # noqa: E402


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.machine()


def load_attention(path):
    """`attention` of another version of kernels/attention.py (load_attention_module)."""
    return load_attention_module(path).attention


def load_attention_module(path):
    """Another version of kernels/attention.py as a module (the kernel imports nothing of ours but kernels/common.py). A version
    with a tile table reads the tiles.json beside its own file (put the table of its time there); where there
    is none it gets this one's block sizes, warps and stages, so that the comparison is of the code, not of
    the tiles (except where this table's bias gradient stores dS, a method earlier versions lack: there the
    earlier version keeps its default tile)."""
    spec = importlib.util.spec_from_file_location("attention_previous", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if hasattr(module, "TILES") and not module.TILES:
        gather = "gather" in module.Tile._fields  # its diagonal method, a bool then
        module.TILES = {key: module.Tile(*tile[:4], *([tile.diagonal == "gather"] if gather else []))
                        for key, tile in attention_kernel.TILES.items() if tile.diagonal != "store"}
    return module


# variant -> the pieces of the fast path (fastpath.Kernels) it turns off; "bf16 <variant>" is the same in mixed precision
VARIANTS = {
    "torch LN": Kernels(layer_norm=False, fuse_add=False),  # torch's layer norm and separate residual adds
    "unfused add": Kernels(fuse_add=False),
    "torch MLP": Kernels(mlp=False),
    "torch embedding": Kernels(embedding=False),
    "unfused QKV": Kernels(fuse_qkv=False),
    "norm of x0": Kernels(norm_table=False),
    "previous kernel": Kernels(fuse_qkv=False),  # an earlier kernel file has no attention_packed
}


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed(fn, device, repeats, runs=1) -> list[float]:
    """Seconds per call of fn, one number per run of `repeats` calls, after one warm-up call."""
    fn()
    sync(device)
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        for _ in range(repeats):
            fn()
        sync(device)
        times.append((time.perf_counter() - t0) / repeats)
    return times


def rate(seconds: list[float], E: int) -> tuple[float, float]:
    """(median model-steps/s, spread of the runs' rates: (max - min) / median)."""
    rates = [E / t for t in seconds]
    median = statistics.median(rates)
    return median, (max(rates) - min(rates)) / median


def step_flops(B: int, N: int, C: int, D: int) -> float:
    """FLOPs of one training step (forward + backward ~ 3x forward): the weight matmuls per token, plus the
    two attention products QK^T and AV per layer over the causal map (position n attends to n + 1 keys: (N + 1) / 2
    on average)."""
    weight_macs = 2 * (3 * D * D + 8 * D * D) + D * C  # per token: W_Q, W_K, W_V, MLP in/out per layer; W_U
    attention_macs = 2 * 2 * (N + 1) / 2 * D  # per token: two layers of (q . k over its keys) + (sum of their values)
    return 3 * 2 * B * N * (weight_macs + attention_macs)


def setup(E: int, graph: bool, N: int, B: int, device, bf16: bool = False, kernels: Kernels | None = Kernels(),
          compiled: bool = False):
    """(trainer, tasks, generators) for E models of different K: the single run or the ensemble train.py would
    build (bf16: in mixed precision, train.py --bf16; kernels: the fast path's pieces on CUDA, None: the plain
    model; compiled: the trainer's whole step through torch.compile), and each member's task set and generator."""
    tasks = [TaskSet.create(K, device=device) for K in torch.linspace(64, 128, E).int().tolist()]
    gens = [torch.Generator(device).manual_seed(e) for e in range(E)]
    models = [Transformer(max_len=N).to(device) for _ in range(E)]
    adamw = dict(lr=1e-3, betas=(0.9, 0.95), weight_decay=1e-3, capturable=graph)
    trainer = Ensemble(models, bf16=bf16, kernels=kernels, **adamw) if E > 1 else Single(models[0], bf16=bf16, kernels=kernels, **adamw)
    if compiled:
        trainer.step = torch.compile(trainer.step)
    return trainer, tasks, gens


def bench(E: int, graph: bool, N: int, B: int, device, repeats: int, runs_: int, sampling: str = "graph",
          bf16: bool = False, kernels: Kernels | None = Kernels(), compiled: bool = False):
    """(seconds per step with a fixed batch, with sampling: a list per run each; peak GiB on CUDA) of E models.
    sampling: "graph" as train.py samples (graphed: the sampler inside the step's graph, ensemble.sampled_step),
    "scan" the same with fastdata's scan instead of the walk kernel (fastdata.WALK_KERNEL off), "host" fastdata.batches outside the graph, "loop" one TaskSet.batch call per member outside it (as before
    fastdata.batches existed). The peak counts what this case allocates (weights, optimizer, graphs, activations),
    not earlier cases' leftovers; the fixed-batch graph is freed before the sampling one is captured."""
    if device.type == "cuda":
        gc.collect()  # the previous case's trainer and graph may sit in reference cycles
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    fastdata.WALK_KERNEL = sampling != "scan"
    trainer, tasks, gens = setup(E, graph, N, B, device, bf16, kernels, compiled)
    shape = (E, B, N + 1)

    def sample():
        if sampling == "loop":
            return [torch.stack(x) for x in zip(*(t.batch(B, N + 1, g) for t, g in zip(tasks, gens)))]
        return batches(tasks, B, N + 1, gens)  # seqs, chains

    step = GraphedStep(trainer, shape, device).step if graph else trainer.step
    batch = sample()
    fixed = timed(lambda: step(*batch), device, repeats, runs_)
    if graph and sampling in ("graph", "scan"):
        del step
        gc.collect()
        sampling_step = sampled_step(trainer, tasks, gens, shape, device, graph)
    else:
        sampling_step = lambda: step(*sample())  # noqa: E731
    sampled = timed(sampling_step, device, repeats, runs_)
    peak = f"{(torch.cuda.max_memory_allocated() - before) / 2**30:.2f}" if device.type == "cuda" else "-"
    return fixed, sampled, peak


def profile(E: int, N: int, B: int, device, bf16: bool = False):
    """The GPU kernels that take most of one eager step of E models (after two warm-up steps)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    trainer, tasks, gens = setup(E, False, N, B, device, bf16=bf16)
    seqs, chains = batches(tasks, B, N + 1, gens)
    for _ in range(2):
        trainer.step(seqs, chains)
    sync(device)
    with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
        trainer.step(seqs, chains)
        sync(device)
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    print(f"{len(kernels)} GPU kernels, {sum(e.time_range.elapsed_us() for e in kernels) / 1e3:.2f} ms of GPU time")
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=25, max_name_column_width=110))


def main():
    parser = cli.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1])
    cli.add_device(parser)
    cli.add_threads(parser)
    cli.add_preset(parser, PRESETS, "the sequence length N: quick 128, paper 256")
    parser.add_argument("--repeats", type=cli.at_least(1), default=None, help="timed steps per run (default 30 on CUDA, 5 on a CPU)")
    parser.add_argument("--runs", type=cli.at_least(1), default=5, help="timed runs per case: the median and the spread (default 5)")
    parser.add_argument("--sizes", default=None, help="ensemble sizes (default 8,32,64 on CUDA, 2 on a CPU)")
    parser.add_argument("--tf32", action="store_true", help="CUDA: matmuls in TF32 (train.py --tf32)")
    parser.add_argument("--profile", action="store_true",
                        help="CUDA: also list the 25 GPU kernels that take most of an eager step of the largest ensemble "
                        "(in this precision, then in bf16) and of the single run (bf16)")
    parser.add_argument("--only", default=None, help="only these variants, comma-separated as the variant column "
                        "names them (e.g. 'this,bf16,bf16 scan sampling'): a short lease's rows; the single eager run, "
                        "every row's baseline, always runs")
    parser.add_argument("--previous", default=None, help="CUDA: another kernels/attention.py, timed in the same run "
                        "for the single graphed run and the largest ensemble, in both precisions (what the kernel's rewrite bought)")
    args = parser.parse_args()
    device = torch.device(cli.device(args.device))
    cli.set_threads(args.threads)
    sizes = cli.parse_list("--sizes", args.sizes or ("8,32,64" if device.type == "cuda" else "2"),
                           rule="ensemble sizes: integers >= 1")
    if min(sizes) < 1:
        raise ValueError(f"--sizes: ensemble sizes must be >= 1, got {args.sizes!r}")
    cuda = device.type == "cuda"
    torch.backends.cuda.matmul.allow_tf32 = args.tf32
    name = torch.cuda.get_device_name() if cuda else f"{cpu_name()}, {os.cpu_count()} cores"
    print(f"device: {name}, torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"matmuls in {'TF32' if args.tf32 else 'fp32'}")
    peaks = {}  # the matmul rate of each precision the rows run in: the denominator of "of peak"
    for dtype in (torch.float32,) + (torch.bfloat16,) * cuda:
        a = torch.randn(4096, 4096, device=device, dtype=dtype)
        peaks[dtype] = 2 * 4096**3 / min(timed(lambda: a @ a, device, 5, 3)) / 1e9
        name = "bf16" if dtype == torch.bfloat16 else "tf32" if args.tf32 else "fp32"
        print(f"{name} matmul 4096^3: {peaks[dtype]:.0f} GFLOP/s")

    preset = args.preset or ("paper" if cuda else "quick")  # the preset of the device timed
    N, B = PRESETS[preset]["N"], 128
    repeats = args.repeats or (30 if cuda else 5)
    if args.previous and not (cuda and os.path.isfile(args.previous)):
        raise ValueError(f"--previous needs CUDA and a kernel file, got {args.previous!r}")
    # (models, graphed, variant): "this" is the code as it is; each other variant puts one earlier piece back,
    # for the single graphed run and the largest ensemble, to show what that piece bought
    E_max = max(sizes)
    cases = [(1, False, "this")] + [(1, True, "this")] * cuda + [(E, cuda, "this") for E in sizes]
    if cuda:
        cases += [(1, False, "torch LN"), (1, True, "torch LN"), (E_max, True, "torch LN"), (E_max, True, "loop sampling")]
        cases += [(1, False, "bf16"), (1, True, "bf16")] + [(E, True, "bf16") for E in sizes]
        cases += [(E, True, f"{precision}{piece}") for piece in ("scan sampling", "host sampling")
                  for precision in ("", "bf16 ") for E in (1, E_max)]
        cases += [(1, True, f"{precision}compiled") for precision in ("", "bf16 ")]
        # the MLP kernel takes fp32 only with TF32 allowed: without --tf32 its fp32 rows would time the baseline
        pieces = ("torch MLP", "unfused add", "torch embedding", "unfused QKV", "norm of x0")
        cases += [(E, True, f"{precision}{piece}") for piece in pieces
                  for precision in ("", "bf16 ") if precision or args.tf32 or piece != "torch MLP" for E in (1, E_max)]
    if args.previous:
        cases += [(E, True, f"{precision}previous kernel") for precision in ("", "bf16 ") for E in (1, E_max)]
    if args.only:
        names, known = {v.strip() for v in args.only.split(",")}, {v for _, _, v in cases}
        if names - known:
            raise ValueError(f"--only: no variant {', '.join(sorted(names - known))} here; these are: {', '.join(sorted(known))}")
        cases = cases[:1] + [case for case in cases[1:] if case[2] in names]
    flops = step_flops(B, N, 10, 64)
    print(f"{preset} preset (B = {B}, N = {N}), model-steps/s, the median of {args.runs} runs of {repeats} steps and "
          f"their spread; x = against the single eager run")
    print("variants: torch LN = F.layer_norm and separate residual adds instead of kernels/layer_norm.py; unfused add = "
          "the residual adds apart from the layer norm kernel (and x2 stored in fp32, then cast for W_U); torch MLP = "
          "torch's matmuls and GELU instead of kernels/mlp.py; torch embedding = F.embedding instead of "
          "kernels/embedding.py; unfused QKV = three projections W_Q, W_K, W_V and the attention kernel on q, k, v "
          "apart, instead of one projection read in place; norm of x0 = layer 1's LN on x0's B N rows instead of "
          "LN(W_E)[s]; scan sampling = the sampler in the graph with fastdata's scan instead of "
          "kernels/markov_walk.py's walk; host sampling = fastdata.batches outside the step's CUDA graph, its batch "
          "copied in; loop sampling = one TaskSet.batch call per member, outside the graph; previous kernel = "
          "attention from --previous, on three projections (against 'unfused QKV'); compiled = torch.compile of the "
          "plain model's whole step (no kernels of ours), graphed; bf16 = mixed precision (train.py --bf16)")
    print(f"{'models':>6} {'graph':>5} {'variant':>20} | {'step only':>9} {'spread':>6} {'x':>5} {'GFLOP/s':>8} {'of peak':>7} "
          f"| {'with sampling':>13} {'spread':>6} {'x':>5} | peak GiB")
    base = None
    this_attention = attention_kernel.attention
    for E, graph, variant in cases:
        bf16 = variant.startswith("bf16")
        piece = variant.removeprefix("bf16").strip()
        # an earlier kernel file replaces the attention function for its rows (the fast path calls it by name when
        # the projections are apart, VARIANTS)
        attention_kernel.attention = load_attention(args.previous) if piece == "previous kernel" else this_attention
        sampling = {"scan sampling": "scan", "host sampling": "host", "loop sampling": "loop"}.get(piece, "graph")
        try:
            fixed, sampled, mem = bench(E, graph, N, B, device, repeats, args.runs, sampling, bf16,
                                        None if piece == "compiled" else VARIANTS.get(piece, Kernels()), piece == "compiled")
        except Exception as e:  # a baseline that does not compile or capture on this torch: the other rows still run
            print(f"{E:>6} {'yes' if graph else 'no':>5} {variant:>20} | failed ({type(e).__name__}: "
                  f"{(str(e).splitlines() or [''])[0][:100]})", flush=True)
            continue
        (r, spread), (r_sampled, spread_sampled) = rate(fixed, E), rate(sampled, E)
        base = base or (r, r_sampled)
        peak = peaks[torch.bfloat16 if bf16 else torch.float32]
        print(f"{E:>6} {'yes' if graph else 'no':>5} {variant:>20} | {r:9.1f} {spread:6.1%} {r / base[0]:5.2f} "
              f"{flops * r / 1e9:8.1f} {flops * r / 1e9 / peak:7.0%} | {r_sampled:13.1f} {spread_sampled:6.1%} "
              f"{r_sampled / base[1]:5.2f} | {mem}", flush=True)
        if cuda:
            torch.cuda.empty_cache()
    attention_kernel.attention = this_attention
    if args.profile and cuda:
        for E, bf16 in ((max(sizes), False), (max(sizes), True), (1, True)):
            print(f"one eager step of {E} model{'s' * (E > 1)}{', bf16' if bf16 else ''}:")
            profile(E, N, B, device, bf16)


if __name__ == "__main__":
    cli.run(main)
