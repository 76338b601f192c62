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
    # Flattened in their own dtypes: float64 copies are made chunk by chunk below, which bounds
    # the temporaries of a multi-GB layer (docs/benchmarks.md).
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
    st = _chunked_sums(c, r, t)
    rms_t = math.sqrt(st["tt"] / n)
    floor = unit_roundoff * FLOOR_ULPS * rms_t
    m.rms_truth = rms_t
    m.err_cand = math.sqrt(st["sc"] / n)
    m.err_ref = math.sqrt(st["sr"] / n)
    denom = max(m.err_ref, floor)
    if denom == 0.0:
        m.ratio = m.ratio_lo = 0.0 if m.err_cand == 0.0 else math.inf
    else:
        m.ratio = m.err_cand / denom
        m.ratio_lo = _jackknife_from_blocks(st["bc"], st["br"], st["counts"], floor, confidence)
    rms_r = math.sqrt(st["rr"] / n)
    m.rel_to_ref = math.sqrt(st["dd"] / n) / rms_r if rms_r > 0 else st["dmax"]
    m.max_abs_to_ref = st["dmax"]
    plus, minus = st["plus"], st["minus"]
    m.z = (plus - minus) / math.sqrt(plus + minus) if plus + minus else 0.0
    return m


CHUNK = 1 << 20


def _chunked_sums(c: Any, r: Any, t: Any) -> dict[str, Any]:
    """All sums the judgement needs, in float64, over chunks aligned to the jackknife blocks.

    One pass, accumulated on the tensors' device (no host sync per chunk), with float64
    temporaries bounded by CHUNK elements whatever the layer's size.
    """
    import torch

    n = int(c.numel())
    blocks = min(JACKKNIFE_BLOCKS, n)
    size = -(-n // blocks)
    nb = -(-n // size)
    per_chunk = max(1, CHUNK // size)
    dev = c.device
    acc = torch.zeros(5, dtype=torch.float64, device=dev)        # tt, rr, dd, plus, minus
    dmax = torch.zeros((), dtype=torch.float64, device=dev)
    bcs, brs = [], []
    for b0 in range(0, nb, per_chunk):
        s, e = b0 * size, min(n, (b0 + per_chunk) * size)
        cc, rr, tt = (x[s:e].to(torch.float64) for x in (c, r, t))
        ec = cc - tt
        er = rr - tt
        sc = ec * ec
        sr = er * er
        k = -(-(e - s) // size)
        pad = k * size - (e - s)
        if pad:
            sc = torch.nn.functional.pad(sc, (0, pad))
            sr = torch.nn.functional.pad(sr, (0, pad))
        bcs.append(sc.view(k, size).sum(1))
        brs.append(sr.view(k, size).sum(1))
        d = cc - rr
        ac, ar = ec.abs(), er.abs()
        acc += torch.stack([(tt * tt).sum(), (rr * rr).sum(), (d * d).sum(),
                            (ac > ar).sum().to(torch.float64), (ac < ar).sum().to(torch.float64)])
        dmax = torch.maximum(dmax, d.abs().max())
    bc, br = torch.cat(bcs), torch.cat(brs)
    starts = torch.arange(nb, dtype=torch.float64, device=dev) * size
    counts = torch.clamp(torch.clamp(starts + size, max=float(n)) - starts, min=0.0)
    tot = acc.tolist()
    return {"tt": tot[0], "rr": tot[1], "dd": tot[2], "plus": int(tot[3]), "minus": int(tot[4]),
            "dmax": float(dmax), "sc": float(bc.sum()), "sr": float(br.sum()), "bc": bc, "br": br, "counts": counts}


def _jackknife_from_blocks(bc: Any, br: Any, counts: Any, floor: float, confidence: float) -> float:
    """One-sided lower bound of the RMSE ratio from per-block sums of squared errors.

    Contiguous blocks keep spatially correlated errors together, so the interval
    does not pretend a row of identical errors is many independent samples.
    """
    import torch

    tc, tr, tn = bc.sum(), br.sum(), counts.sum()
    f2 = floor * floor
    if float(tc) == 0.0:
        return 0.0
    den = torch.clamp(tr, min=f2 * tn)
    theta = 0.5 * (torch.log(tc) - torch.log(den))
    k = int(bc.numel())
    if k < 2:
        return float(theta.exp())
    loo_num = torch.clamp(tc - bc, min=1e-300)
    loo_den = torch.maximum(torch.clamp(tr - br, min=1e-300), f2 * (tn - counts))
    loo_den = torch.clamp(loo_den, min=1e-300)
    thetas = 0.5 * (torch.log(loo_num) - torch.log(loo_den))
    var = (k - 1) / k * (thetas - thetas.mean()).square().sum()
    return float(torch.exp(theta - confidence * var.sqrt()))


def _unravel(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    out = []
    for dim in reversed(shape):
        out.append(flat % dim if dim else 0)
        flat //= dim if dim else 1
    return tuple(reversed(out))
