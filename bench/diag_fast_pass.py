"""Where the wall time of one fast replay pass goes, phase by phase, beside the plain forward.

    python bench/diag_fast_pass.py --device cuda --model 1b [--threads 1] [--launch-mb 32] [--profile prof.txt]

Wraps the pass's phases (golden preload check, the hooked forward, the statistics flush and its
parts, the judgement) with host timers and runs passes interleaved with plain forwards; prints the
median of each phase. ``--profile``: then cProfile over as many passes, the functions that take
the host's time written to that file (profiled passes run slower; their shares are what it says).
Diagnostic for issue 8: a ratio over 1.05x with little extra device time is
host time, and this says which host time.
"""
from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys
import tempfile
import time
from typing import Any


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--model", default="1b")
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--threads", default="auto", help="--parity-threads: auto or a count")
    p.add_argument("--launch-mb", type=float, default=None,
                   help="_StatsQueue.LAUNCH_BYTES in MiB (0: every statistic at the flush); default: the code's")
    p.add_argument("--host-pointers", default=None, choices=("on", "off"),
                   help="kernels.HOST_POINTERS (graphs read addresses from pinned host memory); default: the code's")
    p.add_argument("--side-stream", default=None, choices=("on", "off"),
                   help="_StatsQueue.SIDE_STREAM (parts beside the calls); default: the code's")
    p.add_argument("--part-before-blocks", default=None, choices=("on", "off"),
                   help="_StatsQueue.PART_BEFORE_BLOCKS (the other calls' statistics beside the blocks); default: the code's")
    p.add_argument("--warm", action="store_true",
                   help="set the rung up once and time its passes (as the benchmarks' fast pass); default: set-up per pass")
    p.add_argument("--profile", default=None, help="write cProfile's host-time tables here")
    p.add_argument("--trace", default=None, help="write the device timeline's summary (torch.profiler) here")
    p.add_argument("--sync-debug", action="store_true",
                   help="count the operations that make the host wait for the device, per pass and per forward")
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    import torch

    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    from bench_parity import accumulating, build, sync

    from pytest_rocm_parity import kernels, replay as rp, stats_graph
    from pytest_rocm_parity.capture import capture
    from pytest_rocm_parity.engine import CheckSpec, _run
    from pytest_rocm_parity.golden import GoldenStore, RungReader

    if a.launch_mb is not None:
        rp._StatsQueue.LAUNCH_BYTES = int(a.launch_mb * (1 << 20))
    if a.host_pointers is not None:
        kernels.HOST_POINTERS = a.host_pointers == "on"
    if a.side_stream is not None:
        rp._StatsQueue.SIDE_STREAM = a.side_stream == "on"
    if a.part_before_blocks is not None:
        rp._StatsQueue.PART_BEFORE_BLOCKS = a.part_before_blocks == "on"
    model = build(a.model, a.device)
    ids = torch.randint(0, model.config.vocab_size, (4, 512), generator=torch.Generator().manual_seed(0))
    inputs = {"input_ids": ids, "use_cache": False}
    store = GoldenStore(tempfile.mkdtemp())
    threads = 0 if a.threads == "auto" else int(a.threads)
    spec = CheckSpec(name="d", dtypes=["bfloat16"], drill=0, replay="fast", threads=threads)
    manifest = capture(model, inputs, spec, store, a.device, overwrite=True)
    meta = manifest["rungs"]["bfloat16"]
    reader = RungReader(store.rung_file("d", manifest, "bfloat16"), a.device)
    tmpl = {"args": (), "kwargs": inputs}
    dev_inputs = {"input_ids": ids.to(a.device), "use_cache": False}

    phases: dict[str, list[float]] = collections.defaultdict(list)
    current: dict[str, float] = collections.defaultdict(float)

    def timed(name: str, fn: Any) -> Any:
        return accumulating(current, name, fn)

    rp._preload = timed("preload", rp._preload)
    rp._run = timed("forward (hooked)", rp._run)
    rp.run_level = timed("isolated calls (direct)", rp.run_level)
    rp.prepare_rung = timed("setup (prepare_rung)", rp.prepare_rung)
    rp._StatsQueue.flush = timed("flush", rp._StatsQueue.flush)
    parts_per_pass: list[int] = []        # leaves per started part, in the last pass
    real_launch = rp._StatsQueue._launch

    def counted(self: Any, items: list[Any], *rest: Any) -> Any:
        parts_per_pass.append(len(items))
        return real_launch(self, items, *rest)
    rp._StatsQueue._launch = counted
    rp._StatsQueue._launch = timed("statistics started (parts, during the calls and at the flush)",
                                   rp._StatsQueue._launch)
    stats_graph.start = timed("  of which stats_graph.start", stats_graph.start)
    stats_graph.Restart.start = timed("  of which stats_graph.Restart.start", stats_graph.Restart.start)  # type: ignore[method-assign]
    # the pieces of a start and of the read-back (session 8: a start cost 0.31 ms inside a pass
    # against 55-89 us alone in session 6; which calls grow)
    kernels.ManyLaunch.point_at = timed("    start: point_at (address table)", kernels.ManyLaunch.point_at)
    kernels.aligned = timed("    start: aligned check", kernels.aligned)
    stats_graph._to_host = timed("    start: copy to the host", stats_graph._to_host)
    stats_graph._recorded = timed("    start: event", stats_graph._recorded)
    torch.cuda.CUDAGraph.replay = timed("    start: graph launch", torch.cuda.CUDAGraph.replay)
    rp.metrics_from_columns = timed("flush: metrics_from_columns", rp.metrics_from_columns)
    torch.cuda.Event.record = timed("    start: event record", torch.cuda.Event.record)
    torch.cuda.current_stream = timed("    start: current_stream", torch.cuda.current_stream)
    stats_graph.Pending.__init__ = timed("    start: Pending", stats_graph.Pending.__init__)
    kernels.host_pointers_usable = timed("    start: host_pointers_usable", kernels.host_pointers_usable)
    stats_graph.Pending.columns = timed("flush: waiting for the device, reading back", stats_graph.Pending.columns)
    stats_graph.columns_many = timed("flush: formulas in numpy (not a graph yet)", stats_graph.columns_many)
    kernels.block_stats_many = timed("block_stats_many (not a graph yet)", kernels.block_stats_many)
    rp.metrics_many = timed("flush: metrics_many (CPU path)", rp.metrics_many)
    puts: list[str] = []
    real_put = stats_graph._CACHE.put
    stats_graph._CACHE.put = lambda k, v: puts.append(v if isinstance(v, str) else "graph") or real_put(k, v)
    rp.finish = timed("finish", rp.finish)
    rp.judge_layer = timed("judge_layer", rp.judge_layer)
    rp.select = timed("select", rp.select)
    rp.prepare_model = timed("prepare_model", rp.prepare_model)
    rp.walk_model = timed("walk_model", rp.walk_model)

    prepared: list[Any] = []

    def one_pass() -> None:
        parts_per_pass.clear()
        if not a.warm:
            rp._replay_rung(model, spec, manifest, meta, reader, "bfloat16", a.device, tmpl, keep_loaded=True)
            return
        if not prepared:    # set up once, as bench_parity's fast pass and bench_direct_threads do
            prepared.append(rp.prepare_rung(model, spec, manifest, meta, reader, "bfloat16", a.device, tmpl,
                                            keep_loaded=True))
        prepared[0]()

    for _ in range(3):
        one_pass()
        _run(model, (), dev_inputs)
    fwd, total = [], []
    for _ in range(a.reps):
        sync(a.device)
        t = time.perf_counter()
        _run(model, (), dev_inputs)
        sync(a.device)
        fwd.append(time.perf_counter() - t)
        current.clear()
        sync(a.device)
        t = time.perf_counter()
        one_pass()
        sync(a.device)
        total.append(time.perf_counter() - t)
        for k, v in current.items():
            phases[k].append(v)
    rows = {"forward": statistics.median(fwd), "pass": statistics.median(total)}
    rows.update({k: statistics.median(v) for k, v in phases.items()})
    # what the top-level phases leave unexplained, pass by pass (the bookkeeping between them)
    top = [k for k in ("setup (prepare_rung)", "forward (hooked)", "isolated calls (direct)", "flush",
                       "judge_layer", "finish") if k in phases]
    rows["outside the phases above"] = statistics.median(
        t - sum(phases[k][i] for k in top if i < len(phases[k])) for i, t in enumerate(total))
    for k, v in rows.items():
        print(f"{k:40s} {v * 1e3:8.3f} ms")
    graphs = {"cache puts": puts, "capture errors": stats_graph.CAPTURE_ERRORS,
              "host pointers": kernels.HOST_POINTERS, "host pointer errors": kernels.HOST_POINTER_ERRORS,
              "launch bytes": rp._StatsQueue.LAUNCH_BYTES,
              "side stream": rp._StatsQueue.SIDE_STREAM, "parts per pass": parts_per_pass}
    print(json.dumps(graphs))
    if a.profile:
        import cProfile
        import io
        import pstats

        prof = cProfile.Profile()
        prof.enable()
        for _ in range(a.reps):
            one_pass()
        sync(a.device)
        prof.disable()
        text = io.StringIO()
        st = pstats.Stats(prof, stream=text)
        st.sort_stats("tottime").print_stats(45)
        st.sort_stats("cumulative").print_stats("pytest_rocm_parity|triton", 45)
        # this package's functions by their own time, and what the per-call ones call (the harness's
        # time per direct call on a GPU's host was 3-7 times the CPU proxy's: session 12)
        st.sort_stats("tottime").print_stats("pytest_rocm_parity", 40)
        st.sort_stats("tottime").print_callees(r"replay.py.*\((compare|add)\)|golden.py.*\((fetch|get_fresh|get)\)"
                                               r"|direct.py.*\(run_level\)")
        # what the flush's own functions spend, callee by callee (session 8: 0.2 ms of a start was
        # in none of the pieces timed above)
        st.sort_stats("tottime").print_callees(r"stats_graph.py.*\(_start\)|replay.py.*\((_launch|flush|results)\)")
        with open(a.profile, "w") as f:
            f.write(f"{a.reps} passes, --parity-threads={a.threads}\n" + text.getvalue())
    syncs: dict[str, Any] = {}
    if a.sync_debug:
        syncs = {"pass": host_waits(a.reps, one_pass), "forward": host_waits(a.reps, lambda: _run(model, (), dev_inputs))}
        print(json.dumps({"host waits": syncs}))
    if a.trace:
        summary = device_timeline(a.device, a.reps, one_pass, lambda: _run(model, (), dev_inputs))
        print(json.dumps(summary, indent=1))
        with open(a.trace, "w") as f:
            json.dump({"threads": a.threads, **summary}, f, indent=1)
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"model": a.model, "device": a.device, "torch": torch.__version__, "threads": a.threads, "graphs": graphs, "host_waits": syncs, "ms": {k: v * 1e3 for k, v in rows.items()}}, f, indent=1)
    return 0


def host_waits(reps: int, fn: Any) -> dict[str, Any]:
    """Where ``fn`` makes the host wait for the device (torch.cuda.set_sync_debug_mode's warnings):
    per pass, how many and from which lines. In a forward bound by the host, each such wait
    drains the device's queue and the host then launches into an idle device."""
    import warnings

    import torch

    where: collections.Counter[str] = collections.Counter()
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            for _ in range(reps):
                fn()
        finally:
            torch.cuda.set_sync_debug_mode(0)
    for w in got:
        if "synchroniz" in str(w.message):
            where[f"{w.filename.rsplit('site-packages/', 1)[-1]}:{w.lineno}"] += 1
    return {"per_pass": sum(where.values()) / reps, "where": dict(where.most_common(12))}


def device_timeline(device: str, reps: int, one_pass: Any, forward: Any) -> dict[str, Any]:
    """The device's side of a pass beside a forward's, from torch.profiler's trace (medians, ms).

    Each pass and forward runs between synchronisations inside a named range, so the kernels that
    start within a range's host interval are its own. Per window: ``wall`` (host, with the final
    wait), ``busy`` (the union of its kernels' intervals), ``lead`` (from the range's start to its
    first kernel), ``tail`` (from its last kernel's end to the range's end: host work after the
    device finished), ``idle`` (wall - busy - lead - tail: gaps in the middle, where the device
    waited for the host), ``host waits`` (the host's synchronising CUDA calls, the closing one
    included), ``final wait`` (from the host's last launch to the device's last kernel end: what
    the host waits for at the end), and the device time of the statistics and formulas kernels. A pass
    whose busy time exceeds the forward's pays in device time; one with more idle, in host time.
    """
    import tempfile as tf

    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    from bench_parity import sync

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for i in range(reps):
            for name, fn in (("forward", forward), ("pass", one_pass)):
                sync(device)
                with record_function(f"win:{name}:{i}"):
                    fn()
                    sync(device)
    with tf.NamedTemporaryFile(suffix=".json", delete=False) as handle:
        path = handle.name
    prof.export_chrome_trace(path)
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    # the host's ranges (the profiler also draws each range on the device's track: not those)
    wins = [(e["name"].split(":")[1], e["ts"], e["ts"] + e["dur"]) for e in events
            if e.get("ph") == "X" and str(e.get("name", "")).startswith("win:")
            and e.get("cat") != "gpu_user_annotation"]
    kernels = sorted((e["ts"], e["ts"] + e["dur"], e["name"]) for e in events
                     if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"))
    waits = sorted(e["ts"] for e in events if e.get("ph") == "X" and e.get("cat") == "cuda_runtime"
                   and ("Synchronize" in str(e.get("name")) or str(e.get("name")) == "cudaMemcpy"))
    launches = sorted(e["ts"] for e in events if e.get("ph") == "X" and e.get("cat") == "cuda_runtime"
                      and "Launch" in str(e.get("name")))
    rows: dict[str, list[dict[str, float]]] = collections.defaultdict(list)
    for name, t0, t1 in wins:
        ks = [k for k in kernels if t0 <= k[0] < t1]
        if not ks:
            continue
        busy, end = 0.0, -1.0
        for s, e, _ in ks:          # the union of the intervals (streams may overlap)
            if e > end:
                busy += e - max(s, end)
                end = e
        lead, tail = ks[0][0] - t0, t1 - max(e for _, e, _ in ks)
        rows[name].append({"wall": t1 - t0, "busy": busy, "lead": lead, "tail": tail,
                           "idle": (t1 - t0) - busy - lead - tail, "kernels": len(ks),
                           # host waits for the device, the window's closing one included
                           "host waits": sum(t0 <= w < t1 for w in waits),
                           "final wait": max(e for _, e, _ in ks) - max((x for x in launches if t0 <= x < t1), default=t0),
                           "statistics kernel": sum(e - s for s, e, n in ks if "stats_many" in n),
                           "formulas kernel": sum(e - s for s, e, n in ks if "columns_kernel" in n)})
    out: dict[str, Any] = {"torch": torch.__version__}
    for name, rs in rows.items():
        out[name] = {k: (statistics.median(r[k] for r in rs) / 1e3 if k not in ("kernels", "host waits")
                     else statistics.median(r[k] for r in rs))
                     for k in rs[0]}
    return out


if __name__ == "__main__":
    sys.exit(main())
