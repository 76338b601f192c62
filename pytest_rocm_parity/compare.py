"""Pure comparison of one tensor leaf against its golden reference and float64 truth.

Runs on whatever device the tensors are on (the candidate's: goldens are loaded
there), in float64, one leaf at a time, and never raises on a mismatch: it
returns LeafMetrics and leaves the verdict to judge.py.
"""
from __future__ import annotations

import math
from typing import Any

from pytest_rocm_parity.records import LeafMetrics
from pytest_rocm_parity.tolerance import FLOOR_ULPS

JACKKNIFE_BLOCKS = 64


def _first_index(mask: Any) -> list[int] | None:
    idx = mask.reshape(-1).nonzero()   # flat, so a 0-dim mask gives [] rather than nothing
    if idx.numel() == 0:
        return None
    return list(_unravel(int(idx[0, 0]), tuple(mask.shape)))


def exact_metrics(leaf: str, cand: Any, ref: Any) -> LeafMetrics:
    """Integer and bool outputs must match exactly."""
    m = LeafMetrics(leaf=leaf, numel=int(ref.numel()), kind="exact")
    if cand.shape != ref.shape:
        m.mismatches = m.numel or 1
        m.note = f"shape {tuple(cand.shape)} != golden {tuple(ref.shape)}"
        return m
    diff = cand.to(ref.device) != ref
    m.mismatches = int(diff.sum())
    if m.mismatches:
        m.first_nonfinite = _first_index(diff)
        m.note = f"{m.mismatches} of {m.numel} elements differ (exact dtype)"
    return m


def float_metrics(leaf: str, cand: Any, ref: Any, truth: Any, unit_roundoff: float,
                  confidence: float = 3.0, nan_policy: str = "equal") -> LeafMetrics:
    """Errors of candidate and reference against the truth, their ratio, and its significance."""
    import torch

    m = LeafMetrics(leaf=leaf, numel=int(ref.numel()))
    if tuple(cand.shape) != tuple(ref.shape) or tuple(truth.shape) != tuple(ref.shape):
        m.note = f"shape {tuple(cand.shape)} != golden {tuple(ref.shape)}"
        m.ratio = m.ratio_lo = math.inf
        return m
    if ref.numel() == 0:
        return m
    dev = ref.device
    c, r, t = (x.to(dev) for x in (cand, ref, truth))
    per = 1   # compared scalars per element (2 for complex: real and imaginary parts)
    if c.is_complex() or r.is_complex() or t.is_complex():
        m.kind = "complex"
        if c.is_complex() != r.is_complex():
            m.note = f"shape/kind: candidate is {cand.dtype}, golden is {ref.dtype} (complex vs real)"
            m.ratio = m.ratio_lo = math.inf
            return m
        per = 2
        c, r, t = (torch.view_as_real(x.to(torch.complex128)) if x.is_complex() else
                   torch.stack([x.to(torch.float64), torch.zeros_like(x, dtype=torch.float64)], -1)
                   for x in (c, r, t))
    # Flattened in their own dtypes: the statistics work chunk by chunk (or tile by tile on a GPU),
    # which bounds the temporaries of a multi-GB layer (docs/benchmarks.md).
    c, r, t = (x.reshape(-1) for x in (c, r, t))

    fin_r = torch.isfinite(r) & torch.isfinite(t)
    fin_c = torch.isfinite(c)
    bad = fin_r & ~fin_c
    if not bool(fin_r.all()):
        # The reference itself is non-finite here. Under "equal" the candidate agrees when it holds
        # the same value (NaN counts as equal to NaN, +inf to +inf); under "fail" it never does.
        same = (c == r) | (torch.isnan(c) & torch.isnan(r))
        odd = ~fin_r & ~same
        if nan_policy == "fail":
            odd = ~fin_r
        bad = bad | odd
    bad_el = bad.view(-1, per).any(1)   # counted per element, not per real/imaginary part
    m.nonfinite = int(bad_el.sum())
    if m.nonfinite:
        flat = int(bad_el.nonzero()[0, 0])
        m.first_nonfinite = list(_unravel(flat, tuple(ref.shape)))
        if bool((bad <= fin_r).all()):
            what = "non-finite candidate value(s) where the reference is finite"
        elif nan_policy == "fail":
            what = "non-finite value(s) (the reference is non-finite there too, and the policy is nan='fail')"
        else:
            what = "value(s) disagreeing on non-finite entries (NaN/Inf in one of candidate and reference only)"
        m.note = f"{m.nonfinite} {what}; first at index {m.first_nonfinite}"
    keep = fin_r & fin_c
    if not bool(keep.all()):
        c, r, t = c[keep], r[keep], t[keep]
    n = int(c.numel())
    if n == 0:
        return m
    if per == 2:
        e = t - r.to(torch.float64)
    else:
        e = t.to(torch.float64) - r.to(torch.float64)
    return _fill(m, host_stats(block_stats(c, r, e)), n, unit_roundoff, confidence)


# ---------------------------------------------------------------------------------------------
# the fused statistics: one pass, per jackknife block, on the tensors' device

STAT_COLS = ("sc", "sr", "tt", "rr", "dd", "plus", "minus", "dmax")


def block_layout(n: int) -> tuple[int, int]:
    """(number of blocks, elements per block): contiguous blocks, the last one possibly short."""
    blocks = max(1, min(JACKKNIFE_BLOCKS, n))
    size = -(-n // blocks)
    return -(-n // size), size


def block_stats(c: Any, r: Any, e: Any) -> Any:
    """Per-block sums (STAT_COLS) of candidate c, reference r and truth residual e, as (nb, 8) float64.

    Asynchronous on a GPU: nothing here waits for the device, so a replay can queue the statistics of
    every module behind the forward and read them all with one synchronisation (host_stats).
    Arithmetic is float32 for inputs of 32 bits or fewer (differences of close floats are exact there)
    and float64 when any input is float64.
    """
    from pytest_rocm_parity import kernels

    c, r, e = (x.reshape(-1) for x in (c, r, e))
    n = int(c.numel())
    nb, size = block_layout(n)
    if _on_gpu(c) and kernels.triton_usable():
        c, r, e = (x.contiguous() for x in (c, r, e))
        try:
            return kernels.block_stats_triton(c, r, e, nb, size)
        except Exception as exc:   # a Triton that cannot compile the kernel here: the torch path
            kernels.disable_triton(exc)
    return kernels.block_stats_torch(c, r, e, nb, size)


def _on_gpu(t: Any) -> bool:
    return bool(t.is_cuda)


def host_stats(stats: Any) -> Any:
    """The (nb, 8) statistics as a float64 numpy array (this is where a GPU replay synchronises)."""
    return stats.detach().to("cpu").numpy()


def stats_finite(st: Any) -> bool:
    """False when a sum overflowed or met a NaN/Inf: the caller then takes the masked float64 path."""
    import numpy as np

    return bool(np.isfinite(st[:, :5]).all())


def residual_metrics(leaf: str, cand: Any, ref: Any, res: Any, unit_roundoff: float,
                     confidence: float = 3.0, nan_policy: str = "equal", stats: Any = None) -> LeafMetrics:
    """Metrics from the stored residual (truth - reference) without building the float64 truth.

    ``stats``: the host result of block_stats(cand, ref, res), when the caller queued it already.
    Shape mismatches, complex values and non-finite entries go through float_metrics, which masks.
    """
    same_shape = tuple(cand.shape) == tuple(ref.shape) == tuple(res.shape)
    if (not same_shape or ref.numel() == 0 or cand.is_complex() or ref.is_complex() or res.is_complex()):
        return float_metrics(leaf, cand, ref, _truth(ref, res), unit_roundoff, confidence, nan_policy)
    if stats is None:
        stats = host_stats(block_stats(cand.to(ref.device), ref, res.to(ref.device)))
    if not stats_finite(stats):
        return float_metrics(leaf, cand, ref, _truth(ref, res), unit_roundoff, confidence, nan_policy)
    m = LeafMetrics(leaf=leaf, numel=int(ref.numel()))
    return _fill(m, stats, int(ref.numel()), unit_roundoff, confidence)


def metrics_many(items: list[tuple[str, int, Any, float]], unit_roundoff: float,
                 check_finite: bool = True) -> list[LeafMetrics | None]:
    """Ratio, its jackknife lower bound, the sign test and the distances of many leaves at once.

    ``items``: (leaf, numel, host stats from block_stats, confidence). A leaf whose sums are not
    finite gives None (the caller takes the masked path) unless ``check_finite`` is off. The one
    implementation of these formulas (docs/judging.md): a replay judges every module after one
    synchronisation, and numpy over the stacked statistics costs the same for 25 leaves as for one.
    """
    import numpy as np

    out: list[LeafMetrics | None] = [None] * len(items)
    groups: dict[int, list[int]] = {}
    for i, (_, n, st, _) in enumerate(items):
        if n > 0:
            groups.setdefault(len(st), []).append(i)
    for nb, idx in list(groups.items()):
        st = np.stack([items[i][2] for i in idx])                  # (L, nb, 8)
        if check_finite:   # stats_finite, for the whole group at once
            ok = np.isfinite(st[:, :, :5]).all(axis=(1, 2))
            if not ok.all():
                idx = [i for i, good in zip(idx, ok.tolist()) if good]
                st = st[ok]
                if not idx:
                    continue
        n = np.array([float(items[i][1]) for i in idx])
        conf = np.array([items[i][3] for i in idx])
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            tot = st[:, :, :7].sum(1)
            sc, sr, tt, rr, dd, plus, minus = tot.T
            dmax = st[:, :, 7].max(1)
            rms_t = np.sqrt(tt / n)
            floor = unit_roundoff * FLOOR_ULPS * rms_t
            err_c, err_r = np.sqrt(sc / n), np.sqrt(sr / n)
            denom = np.maximum(err_r, floor)
            ratio = np.where(denom > 0, err_c / np.where(denom > 0, denom, 1.0), np.where(err_c == 0, 0.0, np.inf))
            size = np.ceil(n / nb)
            counts = np.repeat(size[:, None], nb, 1)
            counts[:, -1] = n - size * (nb - 1)
            f2 = (floor * floor)[:, None]
            bc, br = st[:, :, 0], st[:, :, 1]
            den = np.maximum(sr, f2[:, 0] * n)
            theta = 0.5 * (np.log(sc) - np.log(den))
            if nb >= 2:
                loo_num = np.maximum(sc[:, None] - bc, 1e-300)
                loo_den = np.maximum(np.maximum(sr[:, None] - br, 1e-300), f2 * (n[:, None] - counts))
                thetas = 0.5 * (np.log(loo_num) - np.log(np.maximum(loo_den, 1e-300)))
                var = (nb - 1) / nb * np.square(thetas - thetas.mean(1, keepdims=True)).sum(1)
                lo = np.exp(theta - conf * np.sqrt(var))
            else:
                lo = np.exp(theta)
            lo = np.where(sc == 0, 0.0, lo)
            lo = np.where(denom > 0, lo, ratio)
            rms_r = np.sqrt(rr / n)
            rel = np.where(rms_r > 0, np.sqrt(dd / n) / np.where(rms_r > 0, rms_r, 1.0), dmax)
            z = np.where(plus + minus > 0, (plus - minus) / np.sqrt(np.maximum(plus + minus, 1.0)), 0.0)
        # plain Python floats in bulk (tolist), not a float() per number
        cols = zip(rms_t.tolist(), err_c.tolist(), err_r.tolist(), ratio.tolist(), lo.tolist(), rel.tolist(),
                   dmax.tolist(), z.tolist())
        for i, (rt, ec, er, ra, rl, re, dm, zz) in zip(idx, cols):
            out[i] = LeafMetrics(leaf=items[i][0], numel=items[i][1], err_cand=ec, err_ref=er, rms_truth=rt,
                                 ratio=ra, ratio_lo=rl, z=zz, rel_to_ref=re, max_abs_to_ref=dm)
    return out


def _truth(ref: Any, res: Any) -> Any:
    import torch

    if ref.is_complex() or res.is_complex():
        return ref.to(torch.complex128) + res.to(ref.device, torch.complex128)
    return ref.to(torch.float64) + res.to(ref.device, torch.float64)


_STAT_FIELDS = ("rms_truth", "err_cand", "err_ref", "ratio", "ratio_lo", "rel_to_ref", "max_abs_to_ref", "z")


def _fill(m: LeafMetrics, st: Any, n: int, unit_roundoff: float, confidence: float) -> LeafMetrics:
    """The statistics of one leaf into ``m`` (which may carry notes already): metrics_many's formulas."""
    (got,) = metrics_many([(m.leaf, n, st, confidence)], unit_roundoff, check_finite=False)
    assert got is not None
    for f in _STAT_FIELDS:
        setattr(m, f, getattr(got, f))
    return m


def _unravel(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    out = []
    for dim in reversed(shape):
        out.append(flat % dim if dim else 0)
        flat //= dim if dim else 1
    return tuple(reversed(out))
