"""Sketch goldens: per-layer CountSketches instead of full tensors, for models too large to keep.

Each float output leaf of each selected module is reduced to one signed sum per group of
``group`` consecutive elements (signs from a counter-based hash, so CUDA, ROCm and the CPU compute
the same signs without any RNG stream). Sketches are linear: ``S(cand) - S(truth)`` is the sketch of
the candidate's error, and ``E ||S(e)||^2 = ||e||^2``, so error ratios, their jackknife bound and the
sign test carry over to sketch entries unchanged. Inputs are not kept, so a sketch golden judges the
propagated run only (docs/golden-format.md; size and detection power in docs/performance.md).
"""
from __future__ import annotations

import hashlib
from typing import Any

DEFAULT_GROUP = 512
_CHUNK_GROUPS = 1 << 14
# A tensor of at most this many groups is kept whole (a group of 1): a sketch of a few entries has too
# little power for the jackknife bound and the sign test, and the whole tensor is still small.
WHOLE_BELOW_GROUPS = 64


def leaf_group(numel: int, group: int, whole_below: int = WHOLE_BELOW_GROUPS) -> int:
    """The group a leaf of ``numel`` elements is sketched with (1: every element its own entry)."""
    return 1 if numel <= group * whole_below else group


def _seed(salt: str) -> int:
    return int(hashlib.sha256(salt.encode()).hexdigest()[:8], 16) & 0x7FFFFFFF


def sketch(x: Any, group: int, salt: str) -> Any:
    """float64 CountSketch of ``x`` on its own device: ceil(numel / group) signed group sums."""
    import torch

    flat = x.detach().reshape(-1)
    if flat.is_complex():
        flat = torch.view_as_real(flat).reshape(-1)
    n = int(flat.numel())
    m = -(-n // group)
    out = torch.zeros(m, dtype=torch.float64, device=flat.device)
    seed = _seed(salt)
    step = group * _CHUNK_GROUPS
    for s in range(0, n, step):
        e = min(n, s + step)
        idx = torch.arange(s, e, dtype=torch.int64, device=flat.device)
        h = (idx * 0x9E3779B1 + seed) & 0xFFFFFFFF
        h = h ^ (h >> 16)
        h = (h * 0x85EBCA6B) & 0xFFFFFFFF
        h = h ^ (h >> 13)
        v = flat[s:e].to(torch.float64) * (1 - 2 * (h & 1)).to(torch.float64)
        pad = (-(e - s)) % group
        if pad:
            v = torch.nn.functional.pad(v, (0, pad))
        g0 = s // group
        out[g0:g0 + v.numel() // group] = v.view(-1, group).sum(1)
    return out
