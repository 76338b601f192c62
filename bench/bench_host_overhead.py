"""The replay's own host time per direct call, with the modules' compute made negligible.

    python bench/bench_host_overhead.py [--layers 22] [--reps 300] [--out host-overhead.json]

Why: on the H200 the 1.1B forward is bound by the host launching kernels (docs/benchmarks.md,
session 7), so every microsecond the harness spends around a module call is a microsecond of
replay. This measures that microsecond on the CPU, where it is the same Python: a Llama of the
1.1B model's depth with 16-wide layers on 4 tokens, its goldens preloaded as a GPU replay's are,
the replay's queued (GPU) comparison path taken on the CPU (`_StatsQueue.DEFER_ON_CPU`).

Reported (medians, microseconds): ``bare`` (the same modules called on the same golden inputs
by a plain loop: the modules' own host time), ``direct`` (`direct.run_level` with the replay's
comparison of each output: what a pass spends in its direct calls), their difference per call
(``harness_per_call_us``, and ``harness_per_call_paired_us``: the median of each pass's own
difference, steadier when the host's speed drifts),
and ``judge`` (after the flush: the per-layer verdicts). The flush's statistics are left out:
on a GPU they are the Triton kernel, here torch ops on the CPU. ``outside``: the pass less its
direct calls, flush and judging, i.e. the pass's own bookkeeping (its inputs handed out, the
records, the contexts), the same Python as on a GPU: 0.45 ms a pass on the H200's host (session 8,
`bench/diag_fast_pass.py --warm`), a figure to work down here without one.
"""
from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from typing import Any


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    from bench_parity import accumulating, thin_args, thin_llama, write_rows

    a = thin_args(__doc__ or "", argv)
    import torch

    from pytest_rocm_parity import direct, replay as rp
    from pytest_rocm_parity.capture import capture
    from pytest_rocm_parity.engine import CheckSpec
    from pytest_rocm_parity.golden import GoldenStore, RungReader

    model, ids = thin_llama(a.layers)
    inputs = {"input_ids": ids, "use_cache": False}
    store = GoldenStore(tempfile.mkdtemp())
    spec = CheckSpec(name="o", dtypes=["float32"], drill=0, replay="fast", threads=1)
    manifest = capture(model, inputs, spec, store, "cpu", overwrite=True)
    meta = manifest["rungs"]["float32"]
    reader = RungReader(store.rung_file("o", manifest, "float32"), "cpu")
    reader.preload(reader.keys, 1 << 40)
    rp._StatsQueue.DEFER_ON_CPU = True

    times: dict[str, float] = {}
    calls_seen: list[Any] = []

    def timed(name: str, fn: Any) -> Any:
        return accumulating(times, name, fn)

    real_run_level = rp.run_level

    def run_level(model_: Any, calls: list[Any], *args: Any, **kw: Any) -> Any:
        calls_seen[:] = [calls, kw.get("mods") if "mods" in kw else args[4] if len(args) > 4 else None]
        return real_run_level(model_, calls, *args, **kw)
    rp.run_level = timed("direct", run_level)
    rp.judge_layer = timed("judge", rp.judge_layer)
    rp._StatsQueue.flush = timed("flush", rp._StatsQueue.flush)
    one = rp.prepare_rung(model, spec, manifest, meta, reader, "float32", "cpu", {"args": (), "kwargs": inputs},
                          keep_loaded=True)
    one()
    calls, mods = calls_seen
    mods = mods or direct.resolve_modules(model, calls)
    built = [(m, *c.make(reader.get)) for c, m in zip(calls, mods)]

    def bare() -> None:
        with torch.inference_mode():
            for m, args, kwargs in built:
                m(*args, **kwargs)
    samples: dict[str, list[float]] = {"bare": [], "direct": [], "judge": [], "pass": [], "outside": []}
    for _ in range(a.reps):
        t = time.perf_counter()
        bare()
        samples["bare"].append(time.perf_counter() - t)
        times.clear()
        t = time.perf_counter()
        one()
        samples["pass"].append(time.perf_counter() - t)
        samples["direct"].append(times["direct"])
        samples["judge"].append(times["judge"])
        samples["outside"].append(samples["pass"][-1] - times["direct"] - times["judge"] - times.get("flush", 0.0))
    us = {k: statistics.median(v) * 1e6 for k, v in samples.items()}
    # paired: each pass's direct calls less the bare loop run just before it (the host's speed
    # drifts between runs; the difference of two medians carries that drift)
    paired = statistics.median(d - b for d, b in zip(samples["direct"], samples["bare"])) * 1e6
    row = {"model": f"llama-16wide-{a.layers}", "calls": len(calls), **{f"{k}_us": v for k, v in us.items()},
           "harness_per_call_us": (us["direct"] - us["bare"]) / len(calls),
           "harness_per_call_paired_us": paired / len(calls)}
    print(json.dumps(row), flush=True)
    write_rows(a.out, "cpu", [row])
    return 0


if __name__ == "__main__":
    sys.exit(main())
