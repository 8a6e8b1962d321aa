"""Benchmark (not a test): the Triton relative-position attention against the eager reference and
PyTorch's fused attention, at the paper's training shapes. Needs a CUDA GPU (on a CPU the kernel
only runs in Triton's interpreter, which says nothing about its speed).

Baselines, the fastest PyTorch way to compute the same thing:
  rotary   q and k rotated once into copies, then F.scaled_dot_product_attention(is_causal=True)
           ("sdpa causal": no mask tensor, so SDPA may pick its flash backend) and FlexAttention
           with a causal block mask ("flex")
  bias     SDPA with a dense float mask holding -inf above the diagonal and bias[h, i - j] below
           ("sdpa+mask": a bias rules out the flash backend), and FlexAttention with the causal
           block mask and a bias score_mod ("flex")

    python bench/bench_attention.py [--stages S] [--only-kernel]

Prints forward and forward+backward milliseconds (median of triton.testing.do_bench) and the
ratio of every method's time to the kernel's, measured in the same run.
"""
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import cli  # noqa: E402
from kernels import attention as kernel_module  # noqa: E402
from markov import check_int  # noqa: E402
from kernels.attention import _rotate_reference, attention, attention_reference, rotary_tables  # noqa: E402

try:
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
except ImportError:
    flex_attention = None


def rotated(q, k):
    """q and k rotated to their positions, as copies in their own dtype."""
    cos, sin = rotary_tables(q.shape[2], q.shape[3], q.device)
    return _rotate_reference(q, cos, sin).to(q.dtype), _rotate_reference(k, cos, sin).to(k.dtype)


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


def make_flex(N, device):
    if flex_attention is None:
        return None
    block_mask = create_block_mask(lambda b, h, q, kv: q >= kv, B=None, H=None, Q_LEN=N, KV_LEN=N, device=device)
    compiled = torch.compile(flex_attention)

    def flex(q, k, v, bias=None, rotary=False):
        if rotary:
            q, k = rotated(q, k)
        score_mod = None if bias is None else (lambda score, b, h, qi, ki: score + bias[h, qi - ki])
        return compiled(q, k, v, score_mod=score_mod, block_mask=block_mask)

    return flex


def bench(fn, q, k, v, bias, rotary, backward):
    from triton.testing import do_bench

    leaves = [q, k, v] + ([bias] if bias is not None else [])

    def step():
        out = fn(q, k, v, bias, rotary)
        if backward:
            torch.autograd.grad(out, leaves, torch.ones_like(out))

    return do_bench(step, warmup=25, rep=100)


def main():
    parser = cli.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("--stages", type=int, default=kernel_module.STAGES, help="the kernels' num_stages")
    parser.add_argument("--only-kernel", action="store_true", help="time the kernel alone (a tuning sweep)")
    args = parser.parse_args()
    kernel_module.STAGES = check_int("--stages", args.stages, 1)
    if not torch.cuda.is_available():
        raise ValueError("bench_attention.py needs a CUDA GPU: on a CPU the kernel runs in Triton's interpreter, "
                         "whose speed means nothing (the CPU tests check its numbers)")
    torch.backends.cuda.matmul.allow_tf32 = True
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, kernel num_stages {args.stages}")
    print(f"{'shape':>28} {'mode':>8} {'method':>12} {'fwd ms':>8} {'fwd+bwd ms':>11} {'fwd / kernel':>13} {'f+b / kernel':>13}")
    for N in (256, 1024):
        for dtype in (torch.float32, torch.bfloat16):
            for mode in ("rotary", "bias"):
                B, H, d = 128, 1, 64
                g = torch.Generator(device="cuda").manual_seed(0)
                q, k, v = (torch.randn(B, H, N, d, device="cuda", generator=g, dtype=dtype).requires_grad_() for _ in range(3))
                bias = (0.1 * torch.randn(H, N, device="cuda", generator=g)).requires_grad_() if mode == "bias" else None
                rotary = mode == "rotary"
                methods = {"kernel": attention}
                if not args.only_kernel:
                    methods["eager"] = attention_reference
                    if rotary:
                        methods["sdpa causal"] = sdpa_causal
                    else:
                        methods["sdpa+mask"] = sdpa_mask
                    flex = make_flex(N, "cuda")
                    if flex is not None:
                        methods["flex"] = flex
                times = {}
                for name, fn in methods.items():
                    try:
                        times[name] = (bench(fn, q, k, v, bias, rotary, False), bench(fn, q, k, v, bias, rotary, True))
                    except Exception as e:  # e.g. FlexAttention without a bias gradient on this torch
                        print(f"{name}: failed ({type(e).__name__}: {str(e).splitlines()[0][:80]})")
                if "kernel" not in times:
                    continue
                base = times["kernel"]
                shape = f"B={B} H={H} N={N} d={d} {str(dtype)[6:]}"
                for name, (fwd, both) in times.items():
                    print(f"{shape:>28} {mode:>8} {name:>12} {fwd:8.3f} {both:11.3f} {fwd / base[0]:13.2f} {both / base[1]:13.2f}")


if __name__ == "__main__":
    cli.run(main)
