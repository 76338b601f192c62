"""Profiler parity: which operator's share of the time grew on the candidate.

The migration habit this automates: profile the ported model with torch.profiler
and look for the operator that became slow (a matrix product that takes 40% of
the time because of a layout problem).  Absolute times are not comparable
across machines; *shares* of the forward's self time are.

``profile_shares`` runs the forward under torch.profiler (the CUDA activity on a
``cuda`` device, which is also how ROCm builds expose HIP kernels; the CPU
activity on the CPU) and returns each operator's share of the total self time.
``compare_shares`` flags operators whose share grew by ``factor`` (default 2.0)
or more and that take at least ``min_share`` (default 5%) of the candidate's time.
"""
from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from typing import Any

DEFAULT_FACTOR = 2.0
DEFAULT_MIN_SHARE = 0.05
DEFAULT_TOP = 15
# profiler bookkeeping, not operators
_IGNORED_PREFIXES = ("[", "ProfilerStep", "Activity Buffer", "Runtime Triggered Module Loading")


def _activities_for(device: Any) -> tuple[list[Any], str]:
    from torch.profiler import ProfilerActivity

    kind = str(device).split(":", 1)[0]
    if kind == "cuda":
        # the CPU activity records the operators, the CUDA one their kernels' device time (which the
        # profiler attributes to the operator that launched each kernel); CUDA alone has no operators
        return [ProfilerActivity.CPU, ProfilerActivity.CUDA], "cuda"
    return [ProfilerActivity.CPU], "cpu"


def _self_time(evt: Any, activity: str) -> float:
    if activity == "cuda":
        for attr in ("self_device_time_total", "self_cuda_time_total"):
            v = getattr(evt, attr, None)
            if v is not None:
                return float(v)
        return 0.0
    return float(getattr(evt, "self_cpu_time_total", 0.0) or 0.0)


def _is_operator(evt: Any, activity: str) -> bool:
    name = str(getattr(evt, "key", ""))
    if not name or name.startswith(_IGNORED_PREFIXES):
        return False
    if activity == "cuda":
        # device kernels also appear as their own events; their time is already each launching
        # operator's self device time, so only host-side (operator) events are counted
        dt = getattr(evt, "device_type", None)
        return dt is None or str(dt).endswith("CPU")
    return True


def profile_shares(model: Any, args: Any = (), kwargs: Mapping[str, Any] | None = None, device: Any = "cpu",
                   top: int = DEFAULT_TOP, iters: int = 5, warmup: int = 1) -> dict[str, Any]:
    """Per-operator share of the forward's self time on ``device``.

    ``model`` and the tensors in ``args``/``kwargs`` must already be on ``device``. The forward runs
    ``warmup`` times unprofiled, then ``iters`` times in inference mode, each under its own profiler
    session; an operator's time is its smallest over those runs (interference from other work only
    ever adds time), and its share is that over the sum of all operators' times. Returns::

        {"activity": "cuda" | "cpu", "device": str, "iters": int, "total_us": float,
         "top": int, "shares": {operator: share, ...}}   # the ``top`` largest, descending

    where a share is the operator's self time (device time for the CUDA activity) over the
    total self time of all operators, so shares of the listed operators sum to <= 1; ``total_us``
    is that total (microseconds, one forward).
    """
    import torch
    from torch.profiler import profile

    kwargs = dict(kwargs or {})
    if not isinstance(args, (tuple, list)):
        args = (args,)
    activities, label = _activities_for(device)
    is_cuda = label == "cuda"

    def sync() -> None:
        if is_cuda:
            torch.cuda.synchronize()

    runs: list[dict[str, float]] = []
    with torch.inference_mode():
        for _ in range(max(0, warmup)):
            model(*args, **kwargs)
        sync()
        # one profiler session per forward: each operator's time is its minimum over the runs, so a
        # run slowed by a busy machine (preemption inflates whichever operator was running) does
        # not make that operator look slow
        for _ in range(max(1, iters)):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)  # torch's notes on profiler cycles
                with profile(activities=activities) as prof:
                    model(*args, **kwargs)
                    sync()
            run: dict[str, float] = {}
            for evt in prof.key_averages():
                if _is_operator(evt, label):
                    t = _self_time(evt, label)
                    if t > 0:
                        run[evt.key] = run.get(evt.key, 0.0) + t
            runs.append(run)
    names = {k for r in runs for k in r}
    totals = {k: min(r.get(k, 0.0) for r in runs) for k in names}
    totals = {k: v for k, v in totals.items() if v > 0}
    total = sum(totals.values())
    ranked = sorted(totals.items(), key=lambda kv: -kv[1])[:max(1, int(top))]
    shares = {k: (v / total if total > 0 else 0.0) for k, v in ranked}
    return {"activity": label, "device": str(device), "iters": max(1, iters), "total_us": total,
            "top": int(top), "shares": shares}


def _shares_of(x: Mapping[str, Any]) -> tuple[dict[str, float], int | None]:
    if "shares" in x and isinstance(x["shares"], Mapping):
        return {str(k): float(v) for k, v in x["shares"].items()}, x.get("top")
    return {str(k): float(v) for k, v in x.items()}, None


# Totals of one forward on the same kind of device further apart than this: one profile ran on a busy
# machine (a CPU's threads contending with other processes) or under another thread count
PROFILE_TOTALS_APART = 10.0


def totals_note(ref: Mapping[str, Any], cand: Mapping[str, Any]) -> str:
    """A note where the reference's and the candidate's profiles, taken on the same kind of device,
    differ in total time by over PROFILE_TOTALS_APART-fold: their operator shares then describe the
    conditions as much as the code, so the flags may be spurious or missing."""
    a, b = ref.get("total_us"), cand.get("total_us")
    if ref.get("activity") != cand.get("activity") or not isinstance(a, (int, float)) \
            or not isinstance(b, (int, float)) or min(a, b) <= 0:
        return ""
    apart = max(a, b) / min(a, b)
    if apart <= PROFILE_TOTALS_APART:
        return ""
    which = "reference's" if a > b else "candidate's"
    return (f"profiler parity: the {which} forward took {apart:.0f}x the other's ({a:.0f} us against {b:.0f} us "
            f"on the same kind of device), so one profile ran on a busy machine or under another thread count "
            f"(OMP_NUM_THREADS) and its operator shares describe that as much as the code: profile both on an "
            f"otherwise idle machine with the same thread settings")


def compare_shares(ref: Mapping[str, Any], cand: Mapping[str, Any], factor: float = DEFAULT_FACTOR,
                   min_share: float = DEFAULT_MIN_SHARE) -> list[dict[str, Any]]:
    """Operators whose share of time grew ``factor``-fold or more on the candidate.

    ``ref`` and ``cand`` are ``profile_shares`` results (or plain ``{op: share}`` mappings). An
    operator is flagged when its candidate share is at least ``min_share`` and at least ``factor``
    times its reference share. An operator absent from the reference's top list is compared with
    the smallest share that list holds when the list was cut at ``top`` (its share was at most
    that), else with 0 (a new operator). Returns one dict per flagged operator, largest growth
    first: ``{"op", "ref_share", "cand_share", "growth", "factor", "note"}`` (``ref_share`` None
    and ``growth`` inf for an operator the reference never ran).
    """
    if factor <= 1.0:
        raise ValueError(f"compare_shares(factor={factor!r}): must be > 1")
    rs, rtop = _shares_of(ref)
    cs, _ = _shares_of(cand)
    cut = bool(rtop) and len(rs) >= int(rtop or 0)
    bound = min(rs.values()) if (cut and rs) else 0.0
    flags = []
    for op, c in cs.items():
        if c < min_share:
            continue
        if op in rs:
            r, note = rs[op], ""
        elif bound > 0:
            r, note = bound, f"not in the reference's top {rtop}: its share there was at most {bound:.1%}"
        else:
            r, note = 0.0, "not run by the reference"
        growth = c / r if r > 0 else math.inf
        if growth >= factor:
            flags.append({"op": op, "ref_share": r if (op in rs or bound > 0) else None, "cand_share": c,
                          "growth": growth, "factor": factor, "note": note})
    flags.sort(key=lambda f: (-float(f["growth"]), -float(f["cand_share"])))  # type: ignore[arg-type]
    return flags


def format_flags(flags: list[dict[str, Any]]) -> str:
    """One line for the terminal summary: ``aten::mm 12.0%->61.0% (5.1x)``."""
    parts = []
    for f in flags:
        r = f.get("ref_share")
        g = f.get("growth")
        parts.append(f"{f.get('op')} {'new' if r is None else f'{100 * float(r):.1f}%'}->"
                     f"{100 * float(f.get('cand_share') or 0):.1f}%"
                     + ("" if g is None or not math.isfinite(float(g)) else f" ({float(g):.1f}x)"))
    return ", ".join(parts)
