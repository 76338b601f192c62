"""Triton kernels tuned on an A100."""
import torch
import triton
import triton.language as tl

WARP_SIZE = 32  # expect: RP208


@triton.autotune(
    configs=[
        triton.Config({"BLOCK": 128}, num_warps=4),  # expect: RP207
        triton.Config({"BLOCK": 256}, num_warps=8),  # expect: RP207
    ],
    key=["n"],
)
@triton.jit  # expect: RP205
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)


def threads_per_program(num_warps: int) -> int:
    return num_warps * 32  # expect: RP206


def fp8_scale(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float8_e4m3fn)  # expect: RP225
