"""The replay's own host time per direct call, with the modules' compute made negligible.

    python bench/bench_host_overhead.py [--layers 22] [--reps 300] [--out host-overhead.json]
    python bench/bench_host_overhead.py --device cuda [--model thin|1b] [--reps 300]

Why: on the H200 the 1.1B forward is bound by the host launching kernels (docs/benchmarks.md,
session 7), so every microsecond the harness spends around a module call is a microsecond of
replay. This measures that microsecond on the CPU, where it is the same Python: a Llama of the
1.1B model's depth with 16-wide layers on 4 tokens, its goldens preloaded as a GPU replay's are,
the replay's queued (GPU) comparison path taken on the CPU (`_StatsQueue.DEFER_ON_CPU`).

``--phases``: also ``fetch`` and ``add``, the direct calls' golden fetches and queued comparisons.

Reported (medians, microseconds): ``bare`` (the same modules called on the same golden inputs
by a plain loop: the modules' own host time), ``direct`` (`direct.run_level` with the replay's
comparison of each output: what a pass spends in its direct calls), their difference per call
(``harness_per_call_us``, and ``harness_per_call_paired_us``: the median of each pass's own
difference, steadier when the host's speed drifts),
and ``judge`` (after the flush: the per-layer verdicts). Since session 13 (slots, kept inputs) the
per-call figures come out below zero on the CPU (-3 to -5 us): the bare loop frees each output
inside its timing, the replay frees them at the flush, so that difference is this benchmark's
floor, and a smaller harness no longer shows here. Hence the split (session 14): ``bare_held``
(the bare loop keeping every output until its end, as a pass does), ``level_noop``
(`direct.run_level` keeping each output, nothing queued), and per call ``hold`` (bare_held less
bare), ``loop`` (level_noop less bare_held) and ``queue`` (direct less level_noop). With
replay.DEFER_SLOTS (on; ``--no-defer`` for off) a level's outputs are queued after its calls,
outside ``direct``: ``queue`` is then the deferral alone and the queueing itself is in ``outside``. The flush's statistics are left out:
on a GPU they are the Triton kernel, here torch ops on the CPU. ``outside``: the pass less its
direct calls, flush and judging, i.e. the pass's own bookkeeping (its inputs handed out, the
records, the contexts), the same Python as on a GPU: 0.45 ms a pass on the H200's host (session 8,
`bench/diag_fast_pass.py --warm`), a figure to work down here without one.

``--device cuda``: the same on a GPU's host, where the CPU proxy's figures were not enough: on the
H200 the modules alone on their golden inputs measured 0.97-0.98x the forward and a one-thread pass
1.07-1.13x over them (session 12, docs/benchmarks.md), far more than this benchmark's CPU harness
time explains. There the
queued comparison is the real GPU path (statistics kernel, graph), ``direct`` and ``bare`` are the
host's time to launch (no synchronisation at their end: the thin model's kernels are short, so the
host is the bound, as at 1.1B), ``flush`` includes the wait for the device, and ``bare_synced``
is the bare loop to the device's end. ``--model 1b``: the 1.1B shape on 4 x 512 in bf16 instead of
the thin model, where the device's time can also hold the host up.
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
    from bench_parity import accumulating, build, sync, thin_args, thin_llama, write_rows

    a = thin_args(__doc__ or "", argv, devices=True,
                  more={"--phases": "time the direct calls' golden fetches (fetch) and queued comparisons (add) "
                                    "apart; their timers add host time of their own",
                        "--no-defer": "replay.DEFER_SLOTS off: each output queued through its slot as its call "
                                      "returns, not with the level's others after the calls"})
    import torch

    from pytest_rocm_parity import direct, replay as rp
    from pytest_rocm_parity.capture import capture
    from pytest_rocm_parity.engine import CheckSpec
    from pytest_rocm_parity.golden import GoldenStore, RungReader

    dev = a.device
    if a.model == "thin":
        model, ids = thin_llama(a.layers)
        model, rung = model.to(dev), "float32"
    else:
        model, rung = build(a.model, dev), "bfloat16"
        ids = torch.randint(0, model.config.vocab_size, (4, 512), generator=torch.Generator().manual_seed(0))
    inputs = {"input_ids": ids.to(dev), "use_cache": False}
    store = GoldenStore(tempfile.mkdtemp())
    spec = CheckSpec(name="o", dtypes=[rung], drill=0, replay="fast", threads=1)
    manifest = capture(model, inputs, spec, store, dev, overwrite=True)
    meta = manifest["rungs"][rung]
    reader = RungReader(store.rung_file("o", manifest, rung), dev)
    reader.preload(reader.keys, 1 << 40)
    rp._StatsQueue.DEFER_ON_CPU = dev == "cpu"
    rp.DEFER_SLOTS = not a.no_defer

    times: dict[str, float] = {}
    calls_seen: list[Any] = []

    def timed(name: str, fn: Any) -> Any:
        return accumulating(times, name, fn)

    real_run_level = rp.run_level

    def run_level(model_: Any, calls: list[Any], *args: Any, **kw: Any) -> Any:
        calls_seen[:] = [calls, kw.get("mods") if "mods" in kw else args[4] if len(args) > 4 else None]
        return real_run_level(model_, calls, *args, **kw)
    rp.run_level = timed("direct", run_level)
    if a.phases:
        rp._StatsQueue.add = timed("add", rp._StatsQueue.add)
        real_fetcher = RungReader.fetcher
        RungReader.fetcher = lambda self, *a: timed("fetch", real_fetcher(self, *a))   # type: ignore[method-assign]
    rp.judge_layer = timed("judge", rp.judge_layer)
    rp._StatsQueue.flush = timed("flush", rp._StatsQueue.flush)
    one = rp.prepare_rung(model, spec, manifest, meta, reader, rung, dev, {"args": (), "kwargs": inputs},
                          keep_loaded=True)
    for _ in range(4):    # a statistics signature is graphed from its third pass
        one()
    calls, mods = calls_seen
    mods = mods or direct.resolve_modules(model, calls)
    built = [(m, *c.make(reader.get)) for c, m in zip(calls, mods)]

    def bare() -> None:
        with torch.inference_mode():
            for m, args, kwargs in built:
                m(*args, **kwargs)
    held: list[Any] = []

    def bare_held() -> None:     # the bare loop keeping every output, as a pass does until its flush
        with torch.inference_mode():
            for m, args, kwargs in built:
                held.append(m(*args, **kwargs))
    level_args = [(args, kwargs) for _m, args, kwargs in built]

    def level_noop() -> None:    # direct.run_level's loop, each output kept and nothing queued
        direct.run_level(model, calls, level_args, lambda _k, o, _s: held.append(o), 1, mods)
    samples: dict[str, list[float]] = {"bare": [], "bare_synced": [], "bare_held": [], "level_noop": [],
                                       "direct": [], "judge": [], "flush": [],
                                       "pass": [], "outside": [], "fetch": [], "add": []}
    for _ in range(a.reps):
        sync(dev)
        t = time.perf_counter()
        bare()
        samples["bare"].append(time.perf_counter() - t)
        sync(dev)
        samples["bare_synced"].append(time.perf_counter() - t)
        for name, fn in (("bare_held", bare_held), ("level_noop", level_noop)):
            sync(dev)
            t = time.perf_counter()
            fn()
            samples[name].append(time.perf_counter() - t)
            sync(dev)
            held.clear()
        times.clear()
        t = time.perf_counter()
        one()
        samples["pass"].append(time.perf_counter() - t)
        samples["direct"].append(times["direct"])
        samples["judge"].append(times["judge"])
        samples["flush"].append(times.get("flush", 0.0))
        samples["fetch"].append(times.get("fetch", 0.0))
        samples["add"].append(times.get("add", 0.0))
        samples["outside"].append(samples["pass"][-1] - times["direct"] - times["judge"] - times.get("flush", 0.0))
    us = {k: statistics.median(v) * 1e6 for k, v in samples.items()}
    # paired: each pass's direct calls less the bare loop run just before it (the host's speed
    # drifts between runs; the difference of two medians carries that drift)
    paired = statistics.median(d - b for d, b in zip(samples["direct"], samples["bare"])) * 1e6
    name = f"llama-16wide-{a.layers}" if a.model == "thin" else a.model
    row = {"model": name, "device": dev, "phases": a.phases, "defer": rp.DEFER_SLOTS, "calls": len(calls), **{f"{k}_us": v for k, v in us.items()},
           "harness_per_call_us": (us["direct"] - us["bare"]) / len(calls),
           "harness_per_call_paired_us": paired / len(calls),
           # the harness per call split: outputs kept to the flush, run_level's own loop, the queueing
           "hold_per_call_us": (us["bare_held"] - us["bare"]) / len(calls),
           "loop_per_call_us": (us["level_noop"] - us["bare_held"]) / len(calls),
           "queue_per_call_us": (us["direct"] - us["level_noop"]) / len(calls)}
    print(json.dumps(row), flush=True)
    write_rows(a.out, dev, [row])
    return 0


if __name__ == "__main__":
    sys.exit(main())
