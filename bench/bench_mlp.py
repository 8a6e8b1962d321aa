"""Benchmark (not a test, CUDA only): the MLP kernel (kernels/mlp.py) against torch's two matmuls and GELU
(what the model ran before it), forward + backward of the paper's MLP block (D = 64, F = 4D, B N = 32768 rows
per model), for one model and for an ensemble's stacked members (torch: the same call under torch.func.vmap,
as engine/ensemble.py runs it), in bf16 and in fp32 with TF32 matmuls. GPU time: each call captured in a CUDA graph
and replayed (bench_attention.gpu_ms).

    python bench/bench_mlp.py                  # E = 1 and 64, bf16 and TF32
    python bench/bench_mlp.py --sweep --write-tiles kernels/mlp_tiles.json
                                               # first time tile sets of each kernel (E = 64, bf16), use the
                                               # fastest and write them where the kernel reads its tiles
    git show <commit>:kernels/mlp.py > .gpu/old_mlp.py; python bench/bench_mlp.py --previous .gpu/old_mlp.py
                                               # an earlier kernel file beside this one, with this one's tiles

Every case also checks the kernel's output against torch's (relative error in norm, fwd and the three gradients).

The memory floor of forward + backward, per model: the kernel reads h and dy and writes y and dh (4 B N D
elements); torch's path moves the F-wide hidden layer ~10 times (B N F elements each).
"""
import importlib.util
import itertools
import os
import sys

import torch
import torch.nn.functional as F
from torch.func import vmap

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_attention import gpu_ms  # noqa: E402

from kernels import mlp as mk  # noqa: E402
from plumbing import cli  # noqa: E402
from plumbing.rundir import write_json  # noqa: E402


def torch_mlp(h, w_in, w_out):
    return F.linear(F.gelu(F.linear(h, w_in)), w_out)


def inputs(E, rows, D, F_, dtype):
    g = torch.Generator("cuda").manual_seed(0)
    h = torch.randn(E, rows, D, device="cuda", generator=g).to(dtype).requires_grad_()
    w_in = (torch.randn(E, F_, D, device="cuda", generator=g) / D ** 0.5).to(dtype).requires_grad_()
    w_out = (torch.randn(E, D, F_, device="cuda", generator=g) / F_ ** 0.5).to(dtype).requires_grad_()
    return h, w_in, w_out


def load_previous(path):
    """An earlier kernels/mlp.py as a module, run with this one's tiles (so that the comparison is of the code)."""
    spec = importlib.util.spec_from_file_location("mlp_previous", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.TILES, module.TILES_DW = dict(mk.TILES), dict(mk.TILES_DW)
    return module


def relative_error(fn, h, w_in, w_out) -> float:
    """The largest relative error in norm of fn's output and three gradients against torch_mlp's, same inputs."""
    dy = torch.randn(h.shape, device=h.device, generator=torch.Generator(h.device).manual_seed(1)).to(h.dtype)

    def run(f):
        call = vmap(f) if h.shape[0] > 1 else lambda *ts: f(*(t[0] for t in ts))[None]
        y = call(h, w_in, w_out)
        return [y, *torch.autograd.grad(y, (h, w_in, w_out), dy)]

    return max(((a.float() - b.float()).norm() / b.float().norm()).item() for a, b in zip(run(fn), run(torch_mlp)))


def fwd_bwd_ms(fn, h, w_in, w_out, backward=True):
    """GPU ms of fn on E weight sets (E = 1: a plain call, as a single run makes it; else under vmap)."""
    dy = torch.randn_like(h)
    call = vmap(fn) if h.shape[0] > 1 else lambda *ts: fn(*(t[0] for t in ts))[None]

    def step():
        y = call(h, w_in, w_out)
        if backward:
            torch.autograd.grad(y, (h, w_in, w_out), dy)

    return gpu_ms(step)


def sweep(rows, D, F_, log=print):
    """Tile sets of the forward + dh kernels (TILES) and of the dW kernel (TILES_DW), each timed in
    forward + backward with the other at its current setting; sets the fastest of each."""
    h, w_in, w_out = inputs(64, rows, D, F_, torch.bfloat16)
    for name in ("TILES", "TILES_DW"):
        times = {}
        for tiles in mk.SWEEP_TILES:
            setattr(mk, name, tiles)
            try:
                times[tuple(tiles.items())] = fwd_bwd_ms(mk.mlp, h, w_in, w_out)
            except Exception as error:  # a tile set that does not fit the GPU's shared memory or registers
                log(f"  {name} {tiles}: failed ({type(error).__name__})")
                continue
            log(f"  {name} {tiles}: {times[tuple(tiles.items())]:.3f} ms")
        best = dict(min(times, key=times.get))
        setattr(mk, name, best)
        log(f"{name} = {best}  ({times[tuple(best.items())]:.3f} ms)")


def main():
    parser = cli.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("--sweep", action="store_true", help="time tile sets first and keep the fastest")
    parser.add_argument("--write-tiles", default=None, help="with --sweep: write the chosen tiles to this JSON file")
    parser.add_argument("--sizes", default="1,64", help="ensemble sizes E (default 1,64)")
    parser.add_argument("--previous", default=None, help="an earlier kernels/mlp.py to time beside this one")
    args = parser.parse_args()
    if args.previous and not os.path.isfile(args.previous):
        raise ValueError(f"--previous: no file {args.previous}")
    if not torch.cuda.is_available() or mk.triton is None:
        raise ValueError("bench_mlp.py needs CUDA and triton")
    sizes = [int(s) for s in args.sizes.split(",")]
    rows, D, F_ = 128 * 256, 64, 256
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}; B N = {rows} rows per model, D = {D}, F = {F_}")
    if args.sweep:
        sweep(rows, D, F_)
        if args.write_tiles:
            write_json(args.write_tiles, {"TILES": mk.TILES, "TILES_DW": mk.TILES_DW, "device": torch.cuda.get_device_name(),
                                          "source": "python bench/bench_mlp.py --sweep (E = 64, bf16, B N = 32768, D = 64, "
                                                    "F = 256)"}, indent=1)
    print(f"tiles: TILES = {mk.TILES}, TILES_DW = {mk.TILES_DW}")
    previous = load_previous(args.previous) if args.previous else None
    methods = {"kernel": mk.mlp, "torch": torch_mlp} | ({"previous": previous.mlp} if previous else {})
    print("GPU ms of the forward and of forward + backward; x = fwd+bwd against the kernel's; error = the largest "
          "relative error in norm of the output and gradients against torch's")
    for E, dtype in itertools.product(sizes, (torch.bfloat16, torch.float32)):
        torch.backends.cuda.matmul.allow_tf32 = True  # fp32 rows: both with TF32 products
        args_ = inputs(E, rows, D, F_, dtype)
        name = "bf16" if dtype == torch.bfloat16 else "tf32"
        base = None
        for method, fn in methods.items():
            f, fb = fwd_bwd_ms(fn, *args_, backward=False), fwd_bwd_ms(fn, *args_)
            base = base or fb
            error = relative_error(fn, *args_) if method != "torch" else 0.0
            print(f"E = {E:>2} {name:>4} {method:>8}: fwd {f:7.3f} ms, fwd+bwd {fb:7.3f} ms, x {fb / base:5.2f}, "
                  f"error {error:.1e}", flush=True)
        del args_
        torch.cuda.empty_cache()


if __name__ == "__main__":
    cli.run(main)
