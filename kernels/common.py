"""What the Triton kernels of this package share: the dot operand that works in Triton's interpreter, and the
row slices of a deterministic sum over rows (each program writes its slice's partial sum, torch adds the slices
in a fixed order: no atomics).
"""
import torch

try:
    import triton
    import triton.language as tl
except ImportError:
    triton = None


def row_slices(M: int, groups: int, block: int, device: torch.device, programs: int | None = None) -> tuple[int, int]:
    """(slices, rows per slice) for a sum over M rows done by `groups` x slices programs: slices until about
    `programs` programs run (None: 2 per SM on CUDA, 64 elsewhere), each slice a multiple of `block` rows."""
    programs = programs or (2 * torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 64)
    slices = max(1, min(triton.cdiv(programs, groups), triton.cdiv(M, block)))
    rows = triton.cdiv(triton.cdiv(M, slices), block) * block
    return triton.cdiv(M, rows), rows


if triton is not None:

    @triton.jit
    def operand(x, DT: tl.constexpr, UPCAST: tl.constexpr):
        """x rounded to the inputs' dtype DT for a tensor-core dot (fp32 accumulation). The interpreter's bf16
        dot multiplies raw bit patterns, so there (UPCAST) the rounded values enter as fp32: the same products
        and sums."""
        x = x.to(DT)
        if UPCAST:
            x = x.to(tl.float32)
        return x
