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
    finite gives None (the caller takes the masked path) unless ``check_finite`` is off. A replay
    judges every module after one synchronisation, and numpy over the stacked statistics costs the
    same for 25 leaves as for one. The formulas are metric_columns' (docs/judging.md), which a GPU
    replay runs on the device instead (stats_graph.py).
    """
    out: list[LeafMetrics | None] = [None] * len(items)
    live = [i for i, it in enumerate(items) if it[1] > 0]
    if not live:
        return out
    cols = columns_many([items[i][2] for i in live], [items[i][1] for i in live], [items[i][3] for i in live],
                        unit_roundoff)
    done = metrics_from_columns([items[i][0] for i in live], [items[i][1] for i in live], cols[:, :8])
    for i, m, finite in zip(live, done, cols[:, 8].tolist()):
        if finite or not check_finite:
            out[i] = m
    return out


def columns_many(stats: list[Any], numels: list[int], confs: list[float], unit_roundoff: float) -> Any:
    """(L, 9) float64 on the host: metric_columns' eight per leaf, then 1.0 where the leaf's sums
    are finite; ``stats``: each leaf's (nb, 8) block statistics (numpy). Leaves of one block count
    are computed together."""
    import numpy as np

    out = np.zeros((len(stats), 9))
    groups: dict[int, list[int]] = {}
    for i, st in enumerate(stats):
        groups.setdefault(len(st), []).append(i)
    for idx in groups.values():
        st = np.stack([stats[i] for i in idx])                      # (L, nb, 8)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            out[idx, :8] = metric_columns(st, np.array([float(numels[i]) for i in idx]),
                                          np.array([confs[i] for i in idx]), unit_roundoff, NUMPY_OPS)
        out[idx, 8] = np.isfinite(st[:, :, :5]).all(axis=(1, 2))
    return out


def metrics_from_columns(leaves: list[str], numels: list[int], cols: Any) -> list[LeafMetrics]:
    """LeafMetrics from metric_columns' (L, 8) result on the host, as plain Python floats in bulk
    (tolist, not a float() per number). Positional, in LeafMetrics' field order: keywords cost the
    interpreter more, on every leaf of a GPU replay's pass (tests/unit/test_judging.py checks the
    order)."""
    return [LeafMetrics(leaf, n, "float", ec, er, rt, ra, rl, zz, re, dm)
            for leaf, n, (rt, ec, er, ra, rl, re, dm, zz) in zip(leaves, numels, cols.tolist())]


class ArrayOps:
    """The few array operations metric_columns needs, for numpy (host) or torch (device).

    Why not numpy alone: a GPU replay computes the columns on the device, inside the CUDA graph
    that also computes the statistics (stats_graph.py), so one formula serves both. Scalars given
    to ``where`` and ``maximum`` stay Python floats (no host-to-device copy inside a graph).
    """

    def __init__(self, xp: Any, torch: bool) -> None:
        self.xp, self.torch = xp, torch
        self.sqrt, self.log, self.exp, self.square, self.ceil = xp.sqrt, xp.log, xp.exp, xp.square, xp.ceil

    def maximum(self, a: Any, b: Any) -> Any:
        if self.torch and isinstance(b, float):
            return a.clamp(min=b)
        return self.xp.maximum(a, b)

    def where(self, cond: Any, a: Any, b: Any) -> Any:
        if self.torch:
            a = a if not isinstance(a, float) else self.xp.full_like(cond, a, dtype=self.xp.float64)
            b = b if not isinstance(b, float) else self.xp.full_like(cond, b, dtype=self.xp.float64)
        return self.xp.where(cond, a, b)

    def amax(self, a: Any, axis: int) -> Any:
        return a.amax(axis) if self.torch else a.max(axis)

    def mean_keep(self, a: Any, axis: int) -> Any:
        return a.mean(axis, keepdim=True) if self.torch else a.mean(axis, keepdims=True)

    def stack(self, cols: list[Any]) -> Any:
        return self.xp.stack(cols, 1) if self.torch else self.xp.stack(cols, axis=1)


class _NumpyOps(ArrayOps):
    def __init__(self) -> None:
        import numpy as np

        super().__init__(np, torch=False)


class _LazyNumpyOps:
    """NUMPY_OPS without importing numpy at import time: loading the plugin imports no numpy
    (its load cost is in docs/performance.md)."""

    _ops: ArrayOps | None = None

    def __getattr__(self, name: str) -> Any:
        if _LazyNumpyOps._ops is None:
            _LazyNumpyOps._ops = _NumpyOps()
        return getattr(_LazyNumpyOps._ops, name)


NUMPY_OPS: Any = _LazyNumpyOps()


def metric_columns(st: Any, n: Any, conf: Any, unit_roundoff: float, ops: Any) -> Any:
    """(L, 8) columns rms_truth, err_cand, err_ref, ratio, ratio_lo, rel_to_ref, max_abs_to_ref, z
    of L leaves from their (L, nb, 8) block statistics (STAT_COLS), float64; ``n``, ``conf``: (L,).

    The judging formulas (docs/judging.md), on numpy or torch arrays. A GPU runs the same arithmetic
    as one Triton launch (triton_stats.columns_kernel); tests/unit/test_stats_graph.py holds the two
    equal to float64 rounding, so a change here is a change there.
    """
    nb = int(st.shape[1])
    tot = st[:, :, :7].sum(1)
    sc, sr, tt, rr, dd, plus, minus = (tot[:, k] for k in range(7))
    dmax = ops.amax(st[:, :, 7], 1)
    rms_t = ops.sqrt(tt / n)
    floor = unit_roundoff * FLOOR_ULPS * rms_t
    err_c, err_r = ops.sqrt(sc / n), ops.sqrt(sr / n)
    denom = ops.maximum(err_r, floor)
    pos = denom > 0
    ratio = ops.where(pos, err_c / ops.where(pos, denom, 1.0), ops.where(err_c == 0, 0.0, math.inf))
    f2 = floor * floor
    den = ops.maximum(sr, f2 * n)
    theta = 0.5 * (ops.log(sc) - ops.log(den))
    if nb >= 2:
        size = ops.ceil(n / nb)
        # n minus each block's count: n - size for the full blocks, size * (nb - 1) for the last
        rest = (n - size)[:, None] + 0.0 * st[:, :, 0]
        rest[:, -1] = size * (nb - 1)
        loo_num = ops.maximum(sc[:, None] - st[:, :, 0], 1e-300)
        loo_den = ops.maximum(ops.maximum(sr[:, None] - st[:, :, 1], 1e-300), f2[:, None] * rest)
        thetas = 0.5 * (ops.log(loo_num) - ops.log(ops.maximum(loo_den, 1e-300)))
        var = (nb - 1) / nb * ops.square(thetas - ops.mean_keep(thetas, 1)).sum(1)
        lo = ops.exp(theta - conf * ops.sqrt(var))
    else:
        lo = ops.exp(theta)
    lo = ops.where(sc == 0, 0.0, lo)
    lo = ops.where(pos, lo, ratio)
    rms_r = ops.sqrt(rr / n)
    rpos = rms_r > 0
    rel = ops.where(rpos, ops.sqrt(dd / n) / ops.where(rpos, rms_r, 1.0), dmax)
    pm = plus + minus
    z = ops.where(pm > 0, (plus - minus) / ops.sqrt(ops.maximum(pm, 1.0)), 0.0)
    return ops.stack([rms_t, err_c, err_r, ratio, lo, rel, dmax, z])


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
