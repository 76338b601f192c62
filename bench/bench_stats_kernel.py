"""The many-leaf statistics kernel against the bandwidth floor, over its launch shapes.

    python bench/bench_stats_kernel.py --model 1b --out stats-kernel.json      (a GPU with Triton)

The leaves are those of one isolated pass of the benchmark's Llama shapes at batch 4 x 512, bf16
(drill 0): embeddings, every block, the final norm and the logits; candidate, reference and bf16
residual per leaf. The floor is the bytes read once (6 per element) over the device-to-device copy
bandwidth measured in the same process. Each shape (CHUNK, MANY_BLOCK, warps, and the vectorised
loop or the plain one: "aligned" false reads the same values through views one element into their
storage, which block_stats_many sends to the plain loop) is checked against the default shape's
sums (relative 1e-5: only the float32 summation order differs) and timed with CUDA events around
ten calls back to back (the host runs ahead, so the events time the device), median of 20 after
warm-up.

``--table-cost`` (any machine; a GPU adds the pinned copy to the device) times what one flush spends
on the host building the launch table for the same leaves: the work a cache of tables would save.

``paths`` compares, on the same leaves, what a replay's flush costs end to end (host and device, one
wait, wall clock; median of 21, the arms run in turn): ``batched`` (each candidate snapshotted, one
launch over every leaf: what the replay does), ``per_leaf`` (one launch per leaf as it appears, no
snapshot) and ``torch`` (the torch ops a process runs before the kernel pays for its start-up, and a
GPU without Triton always: block_stats_torch_many); ``torch_chunk_N``: block_stats_torch leaf by
leaf, N elements per step.
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from typing import Any

SHAPES = {"1b": (2048, 22, 32000), "8b": (4096, 32, 128256), "tiny": (256, 4, 512)}


def leaves_of(model: str, batch: int, seq: int) -> list[tuple[Any, Any, Any]]:
    import torch

    hidden, blocks, vocab = SHAPES[model]
    g = torch.Generator(device="cuda").manual_seed(0)
    sizes = [batch * seq * hidden] * (blocks + 2) + [batch * seq * vocab]
    out = []
    for n in sizes:
        r = torch.randn(n, device="cuda", generator=g).to(torch.bfloat16)
        e = (torch.randn(n, device="cuda", generator=g) * 4e-3).to(torch.bfloat16)
        c = (r.float() + torch.randn(n, device="cuda", generator=g) * 4e-3).to(torch.bfloat16)
        out.append((c, r, e))
    return out


def median_ms(fn: Any, reps: int = 50) -> float:
    import statistics

    import torch

    for _ in range(5):
        fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def paths(leaves: list[tuple[Any, Any, Any]], lays: list[tuple[int, int]], reps: int = 21) -> dict[str, float]:
    """Milliseconds of one flush's statistics by each route (see the module docstring)."""
    import statistics

    import torch

    from pytest_rocm_parity.judging.compare import Stat, block_stats
    from pytest_rocm_parity.runner import kernels

    def batched() -> None:
        snaps = [(c.clone(), r, e) for c, r, e in leaves]
        kernels.block_stats_many(snaps, lays).cpu()

    def per_leaf() -> None:
        torch.cat([block_stats(c, r, e).reshape(-1, len(Stat)) for c, r, e in leaves]).cpu()

    def torch_ops(chunk: int | None = None) -> None:
        if chunk is None:   # the replay's torch route: like-shaped leaves summed together
            kernels.block_stats_torch_many(leaves, lays).cpu()
            return
        torch.cat([kernels.block_stats_torch(c, r, e, *lay, chunk=chunk) for (c, r, e), lay in zip(leaves, lays)]).cpu()

    def ms(fn: Any) -> float:
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3

    arms = {"batched": batched, "per_leaf": per_leaf}
    times: dict[str, list[float]] = {k: [] for k in arms}
    for fn in arms.values():
        fn()
    for _ in range(reps):
        for k, fn in arms.items():
            times[k].append(ms(fn))
    out = {k: statistics.median(v) for k, v in times.items()}
    torch_ops()
    out["torch"] = statistics.median(ms(torch_ops) for _ in range(5))
    for chunk in (1 << 16, 1 << 22, 1 << 24):   # leaf by leaf: the CPU's step (hundreds of ms here) and larger
        out[f"torch_chunk_{chunk}"] = statistics.median(ms(lambda: torch_ops(chunk)) for _ in range(3))
    return out


def table_cost_us(model: str, batch: int, seq: int, device: str, reps: int = 200) -> float:
    """Host microseconds of building (and, on a GPU, copying) one flush's launch table (median)."""
    import statistics

    import torch

    from pytest_rocm_parity.judging.compare import block_layout
    from pytest_rocm_parity.runner import kernels

    hidden, blocks, vocab = SHAPES[model]
    sizes = [batch * seq * hidden] * (blocks + 2) + [batch * seq * vocab]
    leaves = [tuple(torch.empty(n, dtype=torch.bfloat16, device=device) for _ in range(3)) for n in sizes]
    lays = [block_layout(n) for n in sizes]
    idx = list(range(len(leaves)))
    dev = torch.device(device)
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        ptr_rows = [[leaves[i][k].data_ptr() for i in idx] for k in range(3)]
        kernels._table(ptr_rows, idx, leaves, lays, kernels.CHUNK, dev)
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e6


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="1b", choices=sorted(SHAPES))
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--out", default=None)
    p.add_argument("--no-sweep", action="store_true", help="only the default shape and the flush's routes")
    p.add_argument("--table-cost", action="store_true", help="only the launch table's host cost (CPU or GPU)")
    a = p.parse_args(argv)
    if a.table_cost:
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
        print(json.dumps({"model": a.model, "device": device,
                          "table_us": table_cost_us(a.model, a.batch, a.seq, device)}))
        return 0
    import torch
    import triton

    from pytest_rocm_parity.runner import kernels
    from pytest_rocm_parity.judging.compare import block_layout

    kernels.start_kernel()   # the per-leaf arm through the kernel, not the torch route of a new process
    leaves = leaves_of(a.model, a.batch, a.seq)
    lays = [block_layout(c.numel()) for c, _, _ in leaves]
    nbytes = sum(3 * c.numel() * c.element_size() for c, _, _ in leaves)
    big = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(big)
    copy_gbps = 2 * big.numel() / (median_ms(lambda: dst.copy_(big), 20) * 1e-3) / 1e9
    del big, dst
    floor_ms = nbytes / (copy_gbps * 1e9) * 1e3
    # the same values one element into their storage: misaligned, so the plain loop reads them
    moved = [tuple(torch.cat([x.new_zeros(1), x])[1:] for x in leaf) for leaf in leaves]
    assert kernels.aligned(x.data_ptr() for leaf in leaves for x in leaf)
    assert not kernels.aligned(x.data_ptr() for leaf in moved for x in leaf)
    default = (kernels.CHUNK, kernels.MANY_BLOCK, kernels.MANY_WARPS)
    ref = kernels.block_stats_many(leaves, lays).cpu()
    rows = []
    routes = paths(leaves, lays)
    print(json.dumps({"paths_ms": routes}), flush=True)
    for al, chunk, block, warps in itertools.product((True, False), (1 << 16, 1 << 17), (1024, 2048, 4096),
                                                     (4, 8, 16)):
        if chunk % block or a.no_sweep and not (al and (chunk, block, warps) == default):
            continue
        kernels.CHUNK, kernels.MANY_BLOCK, kernels.MANY_WARPS = chunk, block, warps
        shape = {"aligned": al, "chunk": chunk, "block": block, "warps": warps}
        these = leaves if al else moved

        def ten() -> None:
            for _ in range(10):
                kernels.block_stats_many(these, lays)
        try:
            got = kernels.block_stats_many(these, lays).cpu()
            ok = bool(torch.allclose(got, ref, rtol=1e-5, atol=0))
            ms = median_ms(ten, 20) / 10
        except Exception as exc:   # a shape this GPU cannot compile (registers, shared memory)
            rows.append({**shape, "error": f"{type(exc).__name__}: {exc}"[:200]})
            continue
        chunks = [-(-min(size, c.numel() - b * size) // chunk) for (c, _, _), (nb, size) in zip(leaves, lays)
                  for b in range(nb)]
        shape["programs"] = sum(chunks)                       # one per chunk with elements
        shape["programs_before"] = len(chunks) * max(chunks)  # the blocks x chunks grid it replaced
        rows.append({**shape, "ms": ms, "gbps": nbytes / (ms * 1e-3) / 1e9,
                     "of_floor": floor_ms / ms, "same_sums": ok, "default": al and (chunk, block, warps) == default})
        print(json.dumps(rows[-1]), flush=True)
    kernels.CHUNK, kernels.MANY_BLOCK, kernels.MANY_WARPS = default
    good = [r for r in rows if r.get("same_sums")]
    best = min(good, key=lambda r: r["ms"]) if good else None
    doc = {"date": time.strftime("%Y-%m-%d"), "device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "triton": triton.__version__, "model": a.model, "batch": a.batch, "seq": a.seq, "bytes_read": nbytes,
           "copy_gbps": copy_gbps, "floor_ms": floor_ms, "paths_ms": routes, "rows": rows, "best": best}
    print(f"bytes {nbytes / 1e9:.3f} GB, copy {copy_gbps:.0f} GB/s, floor {floor_ms:.3f} ms; "
          f"default {next((r['ms'] for r in rows if r.get('default')), float('nan')):.3f} ms; best {best}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
