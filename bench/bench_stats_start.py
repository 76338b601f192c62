"""Host time of starting one part of a replay's statistics on the GPU, piece by piece.

    python bench/bench_stats_start.py --leaves 4 --numel 4194304 --iters 200

A replay starts a part of its statistics every _StatsQueue.LAUNCH_BYTES of outputs
(stats_graph.start). On the H200 in session 6 a part cost about 0.2 ms of host time, more than
the device time it hid, so the parts made the 1.1B pass slower (docs/benchmarks.md). This times
each piece of a graphed start (address table rewrite, graph replay, copy to the host, event) and a
graph of the statistics kernel alone, host and device time, so the next step is chosen on figures.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--leaves", type=int, default=4)
    p.add_argument("--numel", type=int, default=4 * 512 * 2048)
    p.add_argument("--iters", type=int, default=200)
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    import torch

    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    from bench_parity import write_rows

    from pytest_rocm_parity import kernels, stats_graph
    from pytest_rocm_parity.compare import block_layout

    dev = torch.device("cuda", torch.cuda.current_device())
    g = torch.Generator(device=dev).manual_seed(0)
    leaves = []
    for _ in range(a.leaves):
        t = torch.randn(a.numel, device=dev, generator=g, dtype=torch.float64)
        r = t.to(torch.bfloat16)
        leaves.append(((t * 1.001).to(torch.bfloat16), r, (t - r.double()).to(torch.bfloat16)))
    lays = [block_layout(a.numel)] * a.leaves
    confs = [3.0] * a.leaves
    u = 2.0 ** -8
    for _ in range(3):                          # eager, captured, then a graph
        stats_graph.start(leaves, lays, confs, u).columns()
    key = next(k for k, v in stats_graph._CACHE._d.items() if isinstance(v, stats_graph._Graphed))
    got = stats_graph._CACHE.get(key)
    many = got.launch.many
    # a graph of the statistics kernel alone (no judging formulas), for the replay cost by size
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    small = torch.cuda.CUDAGraph()
    with torch.cuda.stream(side):
        small.capture_begin()
        many.run()
        small.capture_end()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()

    ev, main = torch.cuda.Event(), torch.cuda.current_stream(dev)

    def signature(leaves: list[Any]) -> Any:   # as stats_graph._start makes it
        ptrs = [x.data_ptr() for leaf in leaves for x in leaf]
        return (kernels.aligned(ptrs), tuple(confs),
                tuple((c.numel(), c.dtype, r.dtype, e.dtype) for c, r, e in leaves))

    def timed(fn: Any) -> float:
        ts = []
        for _ in range(a.iters):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
            torch.cuda.synchronize()
        return statistics.median(ts) * 1e6

    rows = {
        "start (graphed), us": timed(lambda: stats_graph.start(leaves, lays, confs, u)),
        "point_at, us": timed(lambda: many.point_at(leaves)),
        "graph replay (statistics and formulas), us": timed(got.graph.replay),
        "graph replay (statistics kernel alone), us": timed(small.replay),
        "copy to pinned host, us": timed(lambda: stats_graph._to_host(got.launch.out)),
        "event record, us": timed(lambda: stats_graph._recorded(dev)),
        "eager block_stats_many, us": timed(lambda: kernels.block_stats_many(leaves, lays)),
        "pinned empty, us": timed(lambda: torch.empty(12, dtype=torch.int64, pin_memory=True)),
        # the pieces a start repeats that do not depend on its leaves (session 10)
        "current_stream(device), us": timed(lambda: torch.cuda.current_stream(dev)),
        "current_stream(), us": timed(torch.cuda.current_stream),
        "kernels.current_stream(device), us": timed(lambda: kernels.current_stream(dev)),
        "event record on a held stream, us": timed(lambda: ev.record(main)),
        "addresses, signature and alignment (Python), us": timed(lambda: signature(leaves)),
    }
    def device_us(fn: Any) -> float:
        """Device time of fn's work, from events around 50 back-to-back calls."""
        fn()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(50):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e3 / 50

    rows["device: graph (statistics and formulas), us"] = device_us(got.graph.replay)
    rows["device: graph (statistics kernel alone), us"] = device_us(small.replay)
    row = {"leaves": a.leaves, "numel": a.numel, **{k: round(v, 1) for k, v in rows.items()}}
    print(json.dumps(row, indent=1))
    write_rows(a.out, "cuda", [row])
    return 0


if __name__ == "__main__":
    sys.exit(main())
