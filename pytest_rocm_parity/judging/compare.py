"""Pure comparison of one tensor leaf against its golden reference and float64 truth.

Runs on whatever device the tensors are on (the candidate's: goldens are loaded
there), in float64, one leaf at a time, and never raises on a mismatch: it
returns LeafMetrics and leaves the verdict to judge.py.
"""
from __future__ import annotations

import math
from typing import Any

from pytest_rocm_parity.judging.columns import Metric, Stat
from pytest_rocm_parity.judging.records import LeafMetrics
from pytest_rocm_parity.judging.tolerance import FLOOR_ULPS

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
    # which bounds the temporaries of a multi-GB layer (peak memory figures: docs/performance.md).
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
        if m.nonfinite:   # no element where both are finite: nothing measures the error but its count
            m.ratio = m.ratio_lo = math.inf
        return m
    if per == 2:
        e = t - r.to(torch.float64)
    else:
        e = t.to(torch.float64) - r.to(torch.float64)
    return _fill(m, host_stats(block_stats(c, r, e)), n, unit_roundoff, confidence)


# ---------------------------------------------------------------------------------------------
# the judging rule: per-block sums on the tensors' device, then the formulas on the host


# the sums of squares: one that is not finite sends the leaf to float_metrics' masked path
_SQUARES = slice(Stat.CAND_ERR2, Stat.DIFF2 + 1)


def block_layout(n: int) -> tuple[int, int]:
    """(number of blocks, elements per block): contiguous blocks, the last one possibly short."""
    blocks = max(1, min(JACKKNIFE_BLOCKS, n))
    size = -(-n // blocks)
    return -(-n // size), size


def block_stats(c: Any, r: Any, e: Any) -> Any:
    """Per-block sums (Stat columns) of candidate c, reference r and truth residual e, as an
    (nb, len(Stat)) float64 tensor on their device.

    Asynchronous on a GPU: nothing here waits for the device, so a caller can queue the statistics of
    many leaves and read them with one synchronisation (host_stats).
    Arithmetic is float32 for inputs of 32 bits or fewer (differences of close floats are exact there)
    and float64 when any input is float64.
    """
    from pytest_rocm_parity.runner import kernels

    c, r, e = (x.reshape(-1) for x in (c, r, e))
    layout = block_layout(int(c.numel()))
    if c.is_cuda and kernels.kernel_route(int(c.numel())):
        c, r, e = (x.contiguous() for x in (c, r, e))
        if all(kernels.readable(x) for x in (c, r, e)):
            try:
                return kernels.block_stats_many([(c, r, e)], [layout])
            except Exception as exc:   # a Triton that cannot compile the kernel here: the torch path
                kernels.disable_triton(exc)
    return kernels.block_stats_torch(c, r, e, *layout)


def host_stats(stats: Any) -> Any:
    """The (nb, len(Stat)) statistics as a float64 numpy array (where a GPU caller synchronises)."""
    return stats.detach().to("cpu").numpy()


def stats_finite(st: Any) -> bool:
    """False when a sum overflowed or met a NaN/Inf: the caller then takes the masked float64 path."""
    import numpy as np

    return bool(np.isfinite(st[:, _SQUARES]).all())


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
    finite gives None (the caller takes the masked path) unless ``check_finite`` is off. A replay
    judges every module after one synchronisation, and numpy over the stacked statistics costs the
    same for 25 leaves as for one. Leaves of one block count are computed together.
    """
    import numpy as np

    out: list[LeafMetrics | None] = [None] * len(items)
    live = [i for i, it in enumerate(items) if it[1] > 0]
    if not live:
        return out
    cols = np.zeros((len(live), len(Metric)))
    finite = np.zeros(len(live), dtype=bool)
    groups: dict[int, list[int]] = {}
    for k, i in enumerate(live):
        groups.setdefault(len(items[i][2]), []).append(k)
    for idx in groups.values():
        st = np.stack([items[live[k]][2] for k in idx])             # (L, nb, len(Stat))
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            cols[idx] = metric_columns(st, np.array([float(items[live[k]][1]) for k in idx]),
                                       np.array([items[live[k]][3] for k in idx]), unit_roundoff)
        finite[idx] = np.isfinite(st[:, :, _SQUARES]).all(axis=(1, 2))
    done = metrics_from_columns([items[i][0] for i in live], [items[i][1] for i in live], cols)
    for i, m, ok in zip(live, done, finite.tolist()):
        if ok or not check_finite:
            out[i] = m
    return out


def metrics_from_columns(leaves: list[str], numels: list[int], cols: Any) -> list[LeafMetrics]:
    """LeafMetrics from metric_columns' (L, len(Metric)) result on the host, as plain Python floats
    in bulk (tolist, not a float() per number). Positional (Metric is in LeafMetrics' field order):
    keywords cost the interpreter more, on every leaf of a GPU replay's pass."""
    return [LeafMetrics(leaf, n, "float", *row) for leaf, n, row in zip(leaves, numels, cols.tolist())]


def metric_columns(st: Any, n: Any, conf: Any, unit_roundoff: float) -> Any:
    """The judging formulas (docs/judging.md): (L, len(Metric)) float64 columns of L leaves from
    their (L, nb, len(Stat)) block statistics (numpy); ``n``, ``conf``: (L,) element counts and
    confidences. The only implementation of the rule: devices compute the block sums, not these."""
    import numpy as np

    nb = int(st.shape[1])
    tot = st[:, :, :Stat.MAX_ABS_DIFF].sum(1)
    sc, sr = tot[:, Stat.CAND_ERR2], tot[:, Stat.REF_ERR2]
    plus, minus = tot[:, Stat.CAND_FARTHER], tot[:, Stat.CAND_CLOSER]
    dmax = st[:, :, Stat.MAX_ABS_DIFF].max(1)
    rms_t = np.sqrt(tot[:, Stat.TRUTH2] / n)
    floor = unit_roundoff * FLOOR_ULPS * rms_t
    err_c, err_r = np.sqrt(sc / n), np.sqrt(sr / n)
    denom = np.maximum(err_r, floor)
    pos = denom > 0
    ratio = np.where(pos, err_c / np.where(pos, denom, 1.0), np.where(err_c == 0, 0.0, math.inf))
    f2 = floor * floor
    theta = 0.5 * (np.log(sc) - np.log(np.maximum(sr, f2 * n)))
    if nb >= 2:
        size = np.ceil(n / nb)
        # n minus each block's count: n - size for the full blocks, size * (nb - 1) for the last
        rest = np.repeat((n - size)[:, None], nb, 1)
        rest[:, -1] = size * (nb - 1)
        loo_num = np.maximum(sc[:, None] - st[:, :, Stat.CAND_ERR2], 1e-300)
        loo_den = np.maximum(np.maximum(sr[:, None] - st[:, :, Stat.REF_ERR2], 1e-300), f2[:, None] * rest)
        thetas = 0.5 * (np.log(loo_num) - np.log(loo_den))
        var = (nb - 1) / nb * np.square(thetas - thetas.mean(1, keepdims=True)).sum(1)
        lo = np.exp(theta - conf * np.sqrt(var))
    else:
        lo = np.exp(theta)
    lo = np.where(pos, np.where(sc == 0, 0.0, lo), ratio)
    rms_r = np.sqrt(tot[:, Stat.REF2] / n)
    rpos = rms_r > 0
    rel = np.where(rpos, np.sqrt(tot[:, Stat.DIFF2] / n) / np.where(rpos, rms_r, 1.0), dmax)
    pm = plus + minus
    z = np.where(pm > 0, (plus - minus) / np.sqrt(np.maximum(pm, 1.0)), 0.0)
    out = np.empty((len(st), len(Metric)))
    for col, v in ((Metric.ERR_CAND, err_c), (Metric.ERR_REF, err_r), (Metric.RMS_TRUTH, rms_t),
                   (Metric.RATIO, ratio), (Metric.RATIO_LO, lo), (Metric.Z, z), (Metric.REL_TO_REF, rel),
                   (Metric.MAX_ABS_TO_REF, dmax)):
        out[:, col] = v
    return out


def _truth(ref: Any, res: Any) -> Any:
    import torch

    if ref.is_complex() or res.is_complex():
        return ref.to(torch.complex128) + res.to(ref.device, torch.complex128)
    return ref.to(torch.float64) + res.to(ref.device, torch.float64)


def _fill(m: LeafMetrics, st: Any, n: int, unit_roundoff: float, confidence: float) -> LeafMetrics:
    """The statistics of one leaf into ``m`` (which may carry notes already): metrics_many's formulas."""
    (got,) = metrics_many([(m.leaf, n, st, confidence)], unit_roundoff, check_finite=False)
    assert got is not None
    for col in Metric:
        f = col.name.lower()
        setattr(m, f, getattr(got, f))
    return m


def _unravel(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    out = []
    for dim in reversed(shape):
        out.append(flat % dim if dim else 0)
        flat //= dim if dim else 1
    return tuple(reversed(out))
