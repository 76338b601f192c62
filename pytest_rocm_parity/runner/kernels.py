"""One fused pass over (candidate, reference, truth residual) for every statistic the judgement needs.

Why a kernel: the replay compares every selected module's output while the model runs. Done with
separate torch ops that is about fifteen kernels and fifteen round trips through device memory per
module, which costs more than the module itself on a fast GPU; one Triton launch reads each input
of every leaf once. Partial sums go to a per-chunk buffer and are added in a fixed order afterwards,
so the result is deterministic (no atomics). Triton runs on CUDA and on ROCm builds of PyTorch
alike; without a GPU (or without Triton) the same sums run as chunked torch ops, and a GPU process
runs them so too until the kernel pays for Triton's start-up (kernel_route).

Only the per-block sums are computed here, in the columns of judging.columns.Stat; the judging formulas
run on the host (compare.metric_columns).
"""
from __future__ import annotations

import functools
from typing import Any

from pytest_rocm_parity.judging.columns import Stat

# The many-leaf kernel's shape, chosen on the H200 by bench/bench_stats_kernel.py (figures:
# docs/performance.md). 1024 elements over 4 warps of 32 lanes: 8 bf16 (16 bytes) per lane per
# load. On AMD's 64-lane wavefronts the same shape loads 8 bytes per lane
# (tests/runner/test_kernel_codegen.py); not tuned there.
CHUNK = 1 << 17        # elements per program (a 4M-element block: 32 programs)
MANY_BLOCK = 1024      # elements per loop step; sums kept per lane
MANY_WARPS = 4
# Elements per step of the torch statistics (block_stats_torch): small enough on the CPU to stay in
# its caches, a whole 1.1B output on a GPU, where each step is some thirty launches
TORCH_CHUNK_CPU = 1 << 16
TORCH_CHUNK_GPU = 1 << 22
# Triton's first launch in a process costs about 0.6 s of host time (it hashes its own library to
# key its cache), as much as the torch statistics spend over the kernel's on about KERNEL_AFTER
# elements: 17.8 ms more per 1.1B pass of 166M elements on an H100 (docs/performance.md#the-statistics-route).
# A process therefore judges with torch ops until they have read that many elements, then starts the
# kernel: a rent-or-buy rule, never worse than twice the better route, so a CI run of a few goldens
# never pays the start-up. A GPU of faster memory rents for less, and the rule stays within twice.
KERNEL_AFTER = 6_000_000_000
ALIGN = 16   # bytes: what triton_stats' tl.multiple_of(p, 16) promises; not a knob (the kernel hard-codes it)


def aligned(ptrs: Any) -> bool:
    """Whether every address in ``ptrs`` (an iterable of ints) suits the vectorised loop (nearly all
    leaves: the caching allocator hands out 512-byte-aligned blocks); the others take the plain loop."""
    return all(p % ALIGN == 0 for p in ptrs)


@functools.lru_cache(maxsize=1)
def triton_many_kernel() -> Any:
    """The jitted kernel; with TRITON_INTERPRET=1 set before Triton is imported, Triton's CPU
    interpreter runs it instead, which is how CI tests it (tests/runner/test_stats_kernel.py)."""
    import triton

    from pytest_rocm_parity.runner import triton_stats

    return triton.jit(triton_stats.stats_many_kernel)


_CODES = {"bfloat16": 0, "float16": 1, "float32": 2, "float64": 3}


def readable(t: Any) -> bool:
    """Whether block_stats_many reads ``t`` (contiguous, real, of the four float dtypes)."""
    return t.dtype in dtype_codes() and t.is_contiguous()


@functools.lru_cache(maxsize=1)
def dtype_codes() -> dict[Any, int]:
    import torch

    return {getattr(torch, k): v for k, v in _CODES.items()}


def block_stats_many(leaves: list[tuple[Any, Any, Any]], layouts: list[tuple[int, int]], chunk: int | None = None) -> Any:
    """Per-block statistics of many leaves at once, rows in order: one launch per dtype combination.

    ``leaves``: (c, r, e) contiguous tensors on one GPU, read flat; ``layouts``: (nb, size) of each;
    ``chunk``: elements per program (a multiple of MANY_BLOCK; tests make it small).
    Returns a (sum of nb, len(Stat)) float64 tensor on that GPU, asynchronously.
    """
    import numpy as np
    import torch

    chunk = chunk or CHUNK
    dev = leaves[0][0].device
    groups = _groups(leaves)
    if len(groups) == 1:   # the usual pass: every leaf of the rung's dtype
        return _stats_of(leaves, list(range(len(leaves))), layouts, chunk, dev)
    out = torch.empty((sum(nb for nb, _ in layouts), len(Stat)), dtype=torch.float64, device=dev)
    row0 = np.cumsum([0] + [nb for nb, _ in layouts])
    for idx in groups.values():
        rows = np.concatenate([np.arange(row0[i], row0[i] + layouts[i][0]) for i in idx])
        out[torch.from_numpy(rows).to(dev)] = _stats_of(leaves, idx, layouts, chunk, dev)
    return out


def _stats_of(leaves: list[tuple[Any, Any, Any]], idx: list[int], layouts: list[tuple[int, int]], chunk: int,
              dev: Any) -> Any:
    """One launch over leaves ``idx`` (of one dtype combination): their (blocks, len(Stat)) sums.

    The launch table is built for every launch, not cached: building it costs under a tenth of a
    millisecond of host time, well inside a GPU pass's run-to-run noise (docs/performance.md)."""
    codes = dtype_codes()
    c, r, e = leaves[idx[0]]
    ptr_rows = [[leaves[i][k].data_ptr() for i in idx] for k in range(3)]
    al = aligned(p for row in ptr_rows for p in row)
    dev_table, grid = _table(ptr_rows, idx, leaves, layouts, chunk, dev)
    return _launch(dev_table, len(idx), grid, (codes[c.dtype], codes[r.dtype], codes[e.dtype]), dev, al)


def _groups(leaves: list[tuple[Any, Any, Any]]) -> dict[tuple[int, int, int], list[int]]:
    """Leaf indices by dtype combination: one launch each."""
    codes = dtype_codes()
    groups: dict[tuple[int, int, int], list[int]] = {}
    for i, (c, r, e) in enumerate(leaves):
        groups.setdefault((codes[c.dtype], codes[r.dtype], codes[e.dtype]), []).append(i)
    return groups


def kernel_constants(codes: tuple[int, int, int], aligned: bool) -> dict[str, Any]:
    """The kernel's compile-time arguments for leaves of dtype ``codes`` (candidate, reference,
    residual: _CODES), the same for a launch and for a cross-compile (doctor, the codegen tests);
    NCOLS is the row width of its output, Stat's columns."""
    return {"CC": codes[0], "CR": codes[1], "CE": codes[2], "F64": _CODES["float64"] in codes,
            "BLOCK": MANY_BLOCK, "ALIGNED": aligned, "NCOLS": len(Stat)}


def _launch(dev_table: Any, k: int, grid: tuple[int, int, int], codes: tuple[int, int, int], dev: Any,
            al: bool) -> Any:
    """One launch of the many-leaf kernel over a table of k leaves; (blocks, len(Stat)) sums,
    asynchronously. ``grid``: _table's (blocks, most chunks in a block, programs); ``al``: every
    leaf is aligned (aligned()): the vectorised loop."""
    import torch

    n_blk, kmax, n_work = grid
    # zeros: a block with fewer chunks than kmax leaves rows no program writes, and adding 0.0 (or
    # taking the max with it: MAX_ABS_DIFF is a max of absolute values) changes no sum
    part = torch.zeros((n_blk, kmax, len(Stat)), dtype=torch.float64, device=dev)
    t = dev_table
    triton_many_kernel()[(n_work,)](t[0:k], t[k:2 * k], t[2 * k:3 * k], t[3 * k:], part,
                                    **kernel_constants(codes, al), num_warps=MANY_WARPS)
    return _combine(part)


def _combine(part: Any) -> Any:
    """(blocks, len(Stat)) from (blocks, pieces, len(Stat)) partial results: sums added in a fixed
    order (no atomics: the same inputs give the same sums), MAX_ABS_DIFF (the last column) maxed."""
    import torch

    return torch.cat([part[:, :, :Stat.MAX_ABS_DIFF].sum(1), part[:, :, Stat.MAX_ABS_DIFF:].amax(1)], 1)


def _table(ptr_rows: list[list[int]], idx: list[int], leaves: list[tuple[Any, Any, Any]],
           layouts: list[tuple[int, int]], chunk: int, dev: Any) -> tuple[Any, tuple[int, int, int]]:
    """(device table, (blocks, most chunks in a block, programs)) of one launch over leaves ``idx``."""
    import numpy as np
    import torch

    ptrs = np.array(ptr_rows, dtype=np.int64)
    # (leaf, start, end) per block, built with numpy: a Python loop over every block of every
    # module would cost a millisecond per pass
    nbs = np.array([layouts[i][0] for i in idx], dtype=np.int64)
    sizes = np.array([layouts[i][1] for i in idx], dtype=np.int64)
    ns = np.array([leaves[i][0].numel() for i in idx], dtype=np.int64)
    leaf_of = np.repeat(np.arange(len(idx), dtype=np.int64), nbs)
    first = np.repeat(np.cumsum(nbs) - nbs, nbs)
    b_in_leaf = np.arange(len(leaf_of), dtype=np.int64) - first
    starts = b_in_leaf * sizes[leaf_of]
    ends = np.minimum(starts + sizes[leaf_of], ns[leaf_of])
    # one program per chunk that holds elements, (leaf, start, end, row of the partial sums): a grid
    # of blocks x the largest leaf's chunks would be mostly empty programs (a 1.1B pass: 10,752 of
    # 12,800, since only the logits' blocks span several chunks)
    counts = -(-(ends - starts) // chunk)
    kmax = int(max(1, counts.max()))
    blk_of = np.repeat(np.arange(len(leaf_of), dtype=np.int64), counts)
    j = np.arange(len(blk_of), dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
    w_start = starts[blk_of] + j * chunk
    work = np.stack([leaf_of[blk_of], w_start, np.minimum(w_start + chunk, ends[blk_of]), blk_of * kmax + j], 1)
    table = np.concatenate([ptrs.reshape(-1), work.reshape(-1)])
    host = torch.from_numpy(table)
    dev_table = host.pin_memory().to(dev, non_blocking=True) if dev.type == "cuda" else host
    return dev_table, (len(leaf_of), kmax, len(work))


_DISABLED: list[str] = []


class RentOrBuy:
    """Torch statistics until they have read ``after`` elements, then the kernel for good."""

    def __init__(self, after: int) -> None:
        self.after, self.read, self.bought = after, 0, False

    def kernel(self, n: int) -> bool:
        """Whether statistics over ``n`` more elements take the kernel."""
        if not self.bought:
            self.read += n
            self.bought = self.read > self.after
        return self.bought


ROUTE = RentOrBuy(KERNEL_AFTER)   # this process's


def kernel_route(n: int) -> bool:
    """Whether the statistics of ``n`` more elements on a GPU go through the Triton kernel (ROUTE)."""
    return triton_usable() and ROUTE.kernel(n)


def start_kernel() -> None:
    """Take the kernel route from now on in this process, for a process that knows it will judge
    many passes (the benchmarks of a warm replay); the start-up is paid at its next launch."""
    ROUTE.bought = True


def disable_triton(exc: BaseException) -> None:
    """Use the torch statistics from now on in this process, and say why once (a warning, not an
    error: the torch path computes the same sums, only slower)."""
    import warnings

    if not _DISABLED:
        _DISABLED.append(f"{type(exc).__name__}: {exc}")
        warnings.warn(f"rocm-parity: the Triton statistics kernel failed on this GPU ({_DISABLED[0][:300]}); "
                      f"using torch ops instead (slower replays, same results). Check the Triton version "
                      f"matches torch (`rocm-parity doctor`).", RuntimeWarning, stacklevel=2)
    triton_usable.cache_clear()


@functools.lru_cache(maxsize=1)
def triton_usable() -> bool:
    """Triton importable and a GPU it can compile for (CUDA or ROCm), unless it failed here before."""
    if _DISABLED:
        return False
    try:
        import torch
        import triton  # noqa: F401
    except Exception:
        return False
    return bool(torch.cuda.is_available())


def block_stats_torch(c: Any, r: Any, e: Any, nb: int, size: int, chunk: int | None = None) -> Any:
    """block_stats_many's sums for one leaf with torch ops, chunk by chunk (temporaries bounded by
    ``chunk`` elements; by default TORCH_CHUNK_CPU or _GPU): (nb, len(Stat)) float64 on the leaf's
    device."""
    import torch

    chunk = chunk or (TORCH_CHUNK_GPU if c.is_cuda else TORCH_CHUNK_CPU)
    c, r, e = (x.reshape(-1) for x in (c, r, e))   # blocks run over the flattened leaf
    n = int(c.numel())
    cdt = torch.float64 if torch.float64 in (c.dtype, r.dtype, e.dtype) else torch.float32
    out = torch.empty((nb, len(Stat)), dtype=torch.float64, device=c.device)
    full = n // size if size else 0          # complete blocks; the last one may be short
    per = max(1, chunk // max(size, 1))
    spans = [(b0, min(full, b0 + per)) for b0 in range(0, full, per)]
    if full < nb:
        spans.append((full, nb))
    for b0, b1 in spans:
        s, t_end = b0 * size, min(n, b1 * size)
        k = b1 - b0
        cc, rr, ee = (x[s:t_end].to(cdt) for x in (c, r, e))
        if t_end - s != k * size:     # the short last block
            cc, rr, ee = (x.view(1, -1) for x in (cc, rr, ee))
        else:
            cc, rr, ee = (x.view(k, size) for x in (cc, rr, ee))
        d = cc - rr            # candidate - reference
        ec = d - ee            # candidate - truth (truth = reference + residual)
        t = rr + ee
        part = out[b0:b1]
        part[:, Stat.CAND_ERR2] = (ec * ec).sum(1)
        part[:, Stat.REF_ERR2] = (ee * ee).sum(1)
        part[:, Stat.TRUTH2] = (t * t).sum(1)
        part[:, Stat.REF2] = (rr * rr).sum(1)
        part[:, Stat.DIFF2] = (d * d).sum(1)
        ac, ar = ec.abs_(), ee.abs()
        part[:, Stat.CAND_FARTHER] = (ac > ar).sum(1)
        part[:, Stat.CAND_CLOSER] = (ac < ar).sum(1)
        part[:, Stat.MAX_ABS_DIFF] = d.abs_().amax(1)
    return out


def block_stats_torch_many(leaves: list[tuple[Any, Any, Any]], layouts: list[tuple[int, int]],
                           chunk: int | None = None) -> Any:
    """block_stats_many's result with torch ops. Leaves of one dtype combination and block size, each
    of whole blocks, are concatenated up to ``chunk`` elements (block_stats_torch's) and summed
    together: each step is some thirty launches, so a pass's two dozen like-shaped outputs cost a
    few steps instead of one each."""
    import torch

    out: list[Any] = [None] * len(leaves)
    groups: dict[tuple[Any, ...], list[list[int]]] = {}
    for i, ((c, r, e), (nb, size)) in enumerate(zip(leaves, layouts)):
        step = chunk or (TORCH_CHUNK_GPU if c.is_cuda else TORCH_CHUNK_CPU)
        runs = groups.setdefault((c.dtype, r.dtype, e.dtype, c.device, size), [[]])
        if c.numel() != nb * size or c.numel() >= step:   # a short last block, or a chunk by itself
            out[i] = block_stats_torch(c, r, e, nb, size, step)
            continue
        if sum(layouts[j][0] * size for j in runs[-1]) + c.numel() > step:
            runs.append([])
        runs[-1].append(i)
    for (_, _, _, _, size), runs in groups.items():
        for idx in runs:
            if not idx:
                continue
            flat = [torch.cat([leaves[i][k].reshape(-1) for i in idx]) if len(idx) > 1 else leaves[idx[0]][k]
                    for k in range(3)]
            st = block_stats_torch(flat[0], flat[1], flat[2], sum(layouts[i][0] for i in idx), size, chunk)
            for i, rows in zip(idx, st.split([layouts[i][0] for i in idx])):
                out[i] = rows
    return torch.cat(out)
