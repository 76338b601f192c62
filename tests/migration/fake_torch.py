"""Make the installed torch look like a ROCm (or CUDA) build with given GPUs, for one test."""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

ROCM_ARCHS = ["gfx900", "gfx906", "gfx908", "gfx90a", "gfx1030", "gfx1100", "gfx942"]


def patch_torch(mp: pytest.MonkeyPatch, props: dict[str, Any], *, n: int = 1, hip: str | None = "6.2.41133-dd7f95766",
                cuda: str | None = None, version: str = "2.6.0+rocm6.2.4", archs: list[str] | None = None,
                free_frac: float = 0.99) -> None:
    mp.setattr(torch.version, "hip", hip)
    mp.setattr(torch.version, "cuda", cuda)
    mp.setattr(torch, "__version__", version)
    mp.setattr(torch.cuda, "is_available", lambda: True)
    mp.setattr(torch.cuda, "device_count", lambda: n)
    mp.setattr(torch.cuda, "get_device_properties", lambda i: SimpleNamespace(**props))
    mp.setattr(torch.cuda, "get_arch_list", lambda: list(ROCM_ARCHS if archs is None else archs))
    total = int(props["total_memory"])
    mp.setattr(torch.cuda, "mem_get_info", lambda i: (int(total * free_frac), total))
