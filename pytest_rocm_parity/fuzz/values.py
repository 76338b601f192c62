"""Tensors and arguments described in words, for reproductions and failure reports (shared by the
harness and the strategies' reprs)."""
from __future__ import annotations

from typing import Any

import torch


def _dname(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def describe_value(value: Any) -> str:
    """A short, reproduction-minded description: dtype, shape, strides, offset, value summary."""
    if isinstance(value, torch.Tensor):
        t = value.detach()
        head = f"{_dname(t.dtype)}{list(t.shape)}"
        if not t.is_contiguous() or t.storage_offset():
            head += f" stride={tuple(t.stride())} offset={t.storage_offset()}"
            head += " (non-contiguous)" if not t.is_contiguous() else ""
        if t.device.type != "cpu":
            head += f" on {t.device}"
        if t.numel() == 0:
            return head + " (empty)"
        if t.dtype.is_floating_point:
            f = t.to("cpu", torch.float64)
            finite = f[torch.isfinite(f)]
            stats = [f"absmax={finite.abs().max().item():.6g}" if finite.numel() else "absmax=n/a"]
            zeros = int((f == 0).sum())
            tiny = float(torch.finfo(t.dtype).tiny)
            subn = int(((f != 0) & (f.abs() < tiny)).sum())
            nan = int(torch.isnan(f).sum())
            inf = int(torch.isinf(f).sum())
            stats += [f"zeros={zeros}"] + [f"{n}={c}" for n, c in (("subnormal", subn), ("nan", nan),
                                                                    ("inf", inf)) if c]
            if t.numel() <= 8:
                stats.append(f"values={[float(v) for v in f.flatten()]}")
            return f"{head} [{', '.join(stats)}]"
        if t.numel() <= 8:
            return f"{head} values={t.flatten().tolist()}"
        return f"{head} [min={t.min().item()}, max={t.max().item()}]"
    if isinstance(value, (list, tuple)):
        inner = ", ".join(describe_value(v) for v in value)
        return (f"({inner}{',' if len(value) == 1 else ''})" if isinstance(value, tuple)   # (2,): Python's tuple
                else f"[{inner}]")
    return repr(value)
