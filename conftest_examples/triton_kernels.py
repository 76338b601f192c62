"""A real custom Triton kernel to fuzz: fused RMSNorm (the kind of op a CUDA-to-ROCm port rewrites).

One program per row; the row is walked in ``BLOCK``-wide tiles so a row longer
than one tile exercises the masked tail tile (``N % BLOCK != 0``).  Accumulation is
in float32 whatever the input dtype, so |x| near float16's max cannot overflow.

On a machine without a GPU the same kernel runs on CPU tensors through Triton's
interpreter: set ``TRITON_INTERPRET=1`` before importing this module (the example
test does it for you).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rms_norm_kernel(x_ptr, w_ptr, y_ptr, stride_x, stride_y, n_cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    x_row = x_ptr + row * stride_x
    y_row = y_ptr + row * stride_y
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(x_row + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
        acc += x * x
    rstd = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / n_cols + eps)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < n_cols
        x = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(y_row + cols, (x * rstd * w).to(y_ptr.dtype.element_ty), mask=mask)


def rms_norm(x: torch.Tensor, normalized_shape: tuple[int, ...], weight: torch.Tensor, eps: float = 1e-6,
             *, block: int | None = None) -> torch.Tensor:
    """Drop-in for ``F.rms_norm(x, (N,), weight, eps)`` over the last dimension.

    The kernel indexes rows by stride, so any 2-D row layout works; a non-unit
    stride inside a row is made contiguous first (the kernel assumes it, the
    wrapper guarantees it: exactly the contract a fuzzer should check).
    """
    n = x.shape[-1]
    if tuple(normalized_shape) != (n,):
        raise ValueError(f"rms_norm normalizes the last dimension only; got normalized_shape={normalized_shape!r}")
    if weight.stride(-1) != 1:
        weight = weight.contiguous()
    rows = x.reshape(-1, n) if x.numel() else x.reshape(0, n)
    if rows.numel() and rows.stride(-1) != 1:
        rows = rows.contiguous()
    out = torch.empty(rows.shape, dtype=x.dtype, device=x.device)
    if rows.numel() == 0:
        return out.reshape(x.shape)
    block = block or min(triton.next_power_of_2(n), 1024)
    _rms_norm_kernel[(rows.shape[0],)](rows, weight, out, rows.stride(0), out.stride(0), n, eps, BLOCK=block)
    return out.reshape(x.shape)
