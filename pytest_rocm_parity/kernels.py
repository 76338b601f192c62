"""One fused pass over (candidate, reference, truth residual) for every statistic the judgement needs.

Why a kernel: the replay compares every selected module's output while the model runs. Done with
separate torch ops that is about fifteen kernels and fifteen round trips through device memory per
module, which costs more than the module itself on a fast GPU; one Triton program per tile reads
each input once. Partial sums go to a per-tile buffer and are added in a fixed order afterwards, so
the result is deterministic (no atomics). Triton runs on CUDA and on ROCm builds of PyTorch alike;
without a GPU (or without Triton) the same arithmetic runs as chunked torch ops.

Columns of the per-block result (float64): see compare.STAT_COLS.
"""
from __future__ import annotations

import functools
from typing import Any

TILE = 2048
NCOLS = 8
# The many-leaf kernel's shape, chosen on the H200 by bench/bench_stats_kernel.py (docs/benchmarks.md,
# session 7: with the vectorised loop, 0.381 ms for a 1.1B pass's 1 GB against 0.436 for the shape
# before, 1024 x 8 warps; session 8, one program per chunk with elements: 0.315 ms). 1024 elements
# over 4 warps of 32 lanes: 8 bf16 (16 bytes) per lane per load. On AMD's 64-lane wavefronts the
# same shape loads 8 bytes per lane (tests/unit/test_kernel_codegen.py); not tuned there: no AMD
# GPU has run it.
CHUNK = 1 << 17        # elements per program (a 4M-element block: 32 programs)
MANY_BLOCK = 1024      # elements per loop step; sums kept per lane
MANY_WARPS = 4
# 16-byte-aligned leaves (nearly all: the caching allocator hands out 512-byte-aligned blocks) take
# the kernel's vectorised loop (triton_stats.stats_many_kernel, ALIGNED); tests and benchmarks switch
# it off to compare
ALIGNED_LOADS = True
ALIGN = 16   # bytes: what triton_stats' tl.multiple_of(p, 16) promises; not a knob (the kernel hard-codes it)


def aligned(ptrs: Any) -> bool:
    """Whether every address in ``ptrs`` (an iterable of ints) suits the vectorised loop."""
    return ALIGNED_LOADS and all(p % ALIGN == 0 for p in ptrs)


@functools.lru_cache(maxsize=1)
def triton_kernel() -> Any:
    """The jitted kernel; with TRITON_INTERPRET=1 set before Triton is imported, Triton's CPU
    interpreter runs it instead, which is how CI tests it (tests/unit/test_stats_kernel.py)."""
    import triton

    from pytest_rocm_parity import triton_stats

    return triton.jit(triton_stats.stats_kernel)


@functools.lru_cache(maxsize=1)
def triton_many_kernel() -> Any:
    import triton

    from pytest_rocm_parity import triton_stats

    return triton.jit(triton_stats.stats_many_kernel)


@functools.lru_cache(maxsize=1)
def triton_columns_kernel() -> Any:
    import triton

    from pytest_rocm_parity import triton_stats

    return triton.jit(triton_stats.columns_kernel)


def columns_meta(layouts: list[tuple[int, int]], numels: list[int], confs: list[float], dev: Any) -> tuple[Any, Any]:
    """What columns_launch needs besides the sums, on ``dev``: int64 (first rows, block counts) and
    float64 (element counts, confidences), each the leaves' values one after the other."""
    import numpy as np
    import torch

    nbs = np.array([nb for nb, _ in layouts], dtype=np.int64)
    ints = np.concatenate([np.cumsum(nbs) - nbs, nbs])
    floats = np.array([float(n) for n in numels] + [float(c) for c in confs], dtype=np.float64)
    # pinned and asynchronous (as _table's): a plain copy from pageable memory would make a first
    # (eager) judgement wait here for the pass's tail before it could even launch the formulas
    if dev.type != "cuda":
        return torch.from_numpy(ints), torch.from_numpy(floats)
    return (torch.from_numpy(ints).pin_memory().to(dev, non_blocking=True),
            torch.from_numpy(floats).pin_memory().to(dev, non_blocking=True))


def columns_launch(stats: Any, meta: tuple[Any, Any], unit_roundoff: float, out: Any = None) -> Any:
    """(L, 9) float64: compare.metric_columns of every leaf (and the finite flag) from the (rows, 8)
    block sums ``stats``, as one launch (triton_stats.columns_kernel); asynchronously.

    ``out``: where to write them; a graph (stats_graph) gives pinned host memory, which the kernel
    writes through unified addressing, so reading them back needs no copy of its own."""
    import torch

    from pytest_rocm_parity.compare import JACKKNIFE_BLOCKS
    from pytest_rocm_parity.tolerance import FLOOR_ULPS

    ints, floats = meta
    count = ints.numel() // 2
    if out is None:
        out = torch.empty((count, 9), dtype=torch.float64, device=stats.device)
    nbmax = 1 << max(0, (JACKKNIFE_BLOCKS - 1).bit_length())
    triton_columns_kernel()[(count,)](stats, ints[:count], ints[count:], floats[:count], floats[count:], out,
                                      float(unit_roundoff * FLOOR_ULPS), NBMAX=nbmax)
    return out


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
    Returns a (sum of nb, 8) float64 tensor on that GPU, asynchronously.
    """
    import numpy as np
    import torch

    chunk = chunk or CHUNK
    dev = leaves[0][0].device
    total = sum(nb for nb, _ in layouts)
    out = torch.empty((total, NCOLS), dtype=torch.float64, device=dev)
    row0 = np.cumsum([0] + [nb for nb, _ in layouts])
    groups = _groups(leaves)
    for (dc, dr, de), idx in groups.items():
        ptr_rows = [[leaves[i][k].data_ptr() for i in idx] for k in range(3)]
        al = aligned(p for row in ptr_rows for p in row)
        tkey = (dev, tuple(map(tuple, ptr_rows)), tuple(layouts[i] for i in idx),
                tuple(leaves[i][0].numel() for i in idx), tuple(int(row0[i]) for i in idx), chunk, al)
        hit = _TABLES.get(tkey)
        if hit is not None:   # the same leaves as a pass before (the allocator reused their addresses)
            dev_table, grid, rows = hit
        else:
            dev_table, grid, rows = _TABLES.put(tkey, _table(ptr_rows, idx, leaves, layouts, row0, chunk, dev))
        sums = _launch(dev_table, len(idx), grid, (dc, dr, de), dev, al)
        if len(groups) == 1:
            out = sums
        else:
            out[rows] = sums
    return out


def _groups(leaves: list[tuple[Any, Any, Any]]) -> dict[tuple[int, int, int], list[int]]:
    """Leaf indices by dtype combination: one launch each."""
    codes = dtype_codes()
    groups: dict[tuple[int, int, int], list[int]] = {}
    for i, (c, r, e) in enumerate(leaves):
        groups.setdefault((codes[c.dtype], codes[r.dtype], codes[e.dtype]), []).append(i)
    return groups


def _launch(dev_table: Any, k: int, grid: tuple[int, int, int], codes: tuple[int, int, int], dev: Any,
            al: bool, host: Any = None) -> Any:
    """One launch of the many-leaf kernel over a table of k leaves; (blocks, 8) sums, asynchronously.
    ``grid``: _table's (blocks, most chunks in a block, programs); ``al``: every leaf is aligned
    (kernels.aligned): the vectorised loop. ``host``: the 3k addresses in pinned host memory, read
    in place of the table's first 3k entries (ManyLaunch)."""
    import torch

    dc, dr, de = codes
    n_blk, kmax, n_work = grid
    ptrs = dev_table if host is None else host
    # zeros: a block with fewer chunks than kmax leaves rows no program writes, and adding 0.0 (or
    # taking the max with it: the last column is a max of absolute values) changes no sum
    part = torch.zeros((n_blk, kmax, NCOLS), dtype=torch.float64, device=dev)
    triton_many_kernel()[(n_work,)](ptrs[0:k], ptrs[k:2 * k], ptrs[2 * k:3 * k],
                                    dev_table[3 * k:], part, CC=dc, CR=dr, CE=de, F64=_CODES["float64"] in codes,
                                    BLOCK=MANY_BLOCK, ALIGNED=al, num_warps=MANY_WARPS)
    # chunks added in a fixed order (no atomics): the same inputs give the same sums
    return torch.cat([part[:, :, :7].sum(1), part[:, :, 7].amax(1, keepdim=True)], 1)


def host_pointers_usable(dev: Any) -> bool:
    """Whether launches on ``dev`` may read their leaves' addresses from pinned host memory
    (ManyLaunch(host_pointers=True)): HOST_POINTERS, a CUDA build (not ROCm, where it has not run),
    and not switched off here by a failure."""
    import torch

    return HOST_POINTERS and not HOST_POINTER_ERRORS and dev.type == "cuda" and torch.version.hip is None


_STREAM_OBJECTS: dict[Any, Any] = {}


def current_stream(dev: Any) -> Any:
    """torch.cuda.current_stream(dev) for a device with an index, one Stream object kept per stream.

    Why: torch makes a new Stream object on every call, after resolving the device. A statistics
    start asked for one for its event inside the pass: 40 us of host time there on the H200
    (session 9's phases); outside a pass 6.0 us against 1.0 us this way, and the event's record
    2.1 us on the kept object (session 10, bench/bench_stats_start.py). Which stream is current is
    still asked of torch every time: a user's stream context may change it.
    """
    import torch

    key = torch._C._cuda_getCurrentStream(dev.index)
    s = _STREAM_OBJECTS.get(key)
    if s is None:
        s = _STREAM_OBJECTS[key] = torch.cuda.Stream(stream_id=key[0], device_index=key[1], device_type=key[2])
    return s


def host_pointers_failed(exc: BaseException) -> None:
    """Keep the device tables from now on in this process (the reason stays for bug reports)."""
    HOST_POINTER_ERRORS.append(f"{type(exc).__name__}: {exc}")


# A graphed launch reads its leaves' addresses from pinned host memory, which the kernel reads
# through unified addressing, so pointing it at a pass's outputs is a write into a numpy array: no
# CUDA call. On the H200 (session 8) the device-table way (a pinned staging buffer and a copy per
# pass) cost 0.18 ms of host time inside a pass. CUDA only: not run on ROCm, whose pinned memory
# is also device-visible but whose coherence for it this project has not checked on a GPU.
HOST_POINTERS = True
HOST_POINTER_ERRORS: list[str] = []


class ManyLaunch:
    """block_stats_many for leaves of one signature (sizes, dtypes, order) whose addresses are set
    per pass (point_at): a CUDA graph of run() then serves every pass, whatever blocks the caching
    allocator hands the candidate's outputs (stats_graph.py).

    The kernel reads the leaves' addresses from a table. ``host_pointers`` (host_pointers_usable):
    that table is pinned host memory, and point_at writes it at once, so the caller must know no
    launch that reads it is still queued (stats_graph waits for a graph's previous results first).
    Otherwise it is device memory, and point_at rewrites it in stream order.
    """

    def __init__(self, leaves: list[tuple[Any, Any, Any]], layouts: list[tuple[int, int]],
                 chunk: int | None = None, al: bool = False, host_pointers: bool = False) -> None:
        """``al``: every leaf of every pass pointed at is aligned (kernels.aligned; the caller keys
        its launches by that, since the vectorised loop must not read a misaligned leaf)."""
        import numpy as np
        import torch

        self.chunk = chunk or CHUNK
        self.dev = leaves[0][0].device
        self.al = al
        row0 = np.cumsum([0] + [nb for nb, _ in layouts])
        self.total = int(row0[-1])
        self.groups = []
        # per group: the flat positions, in the leaves' (c, r, e) order, of its address rows
        self._order: list[list[int]] = []
        for codes, idx in _groups(leaves).items():
            ptr_rows = [[leaves[i][k].data_ptr() for i in idx] for k in range(3)]
            dev_table, grid, rows = _table(ptr_rows, idx, leaves, layouts, row0, self.chunk, self.dev)
            ptrs = None
            if host_pointers:
                ptrs = torch.tensor([p for row in ptr_rows for p in row], dtype=torch.int64)
                ptrs = ptrs.pin_memory() if self.dev.type == "cuda" else ptrs
            self.groups.append((codes, idx, dev_table, grid, rows, ptrs))
            self._order.append([3 * i + k for k in range(3) for i in idx])
        self._views = [g[5].numpy() if g[5] is not None else None for g in self.groups]
        self.owner: Any = None   # who last wrote the host table (stats_graph.Restart; None: point_at)

    def point_at(self, leaves: list[tuple[Any, Any, Any]], ptrs: list[int] | None = None) -> None:
        """Make the next run() read these leaves (of this launch's signature).

        ``ptrs``: their addresses, flat in (c, r, e) order, if the caller has them already.
        Device tables: each call stages the addresses in a pinned buffer of its own (torch's
        caching host allocator keeps it from reuse until the copy has run), so two point_at/run
        pairs may be queued before either runs. Host tables: written now (see the class).
        """
        import torch

        if ptrs is None:
            ptrs = [x.data_ptr() for leaf in leaves for x in leaf]
        self.owner = None
        pin = self.dev.type == "cuda"
        for (_codes, idx, dev_table, _grid, _rows, host), view, order in zip(self.groups, self._views, self._order):
            addresses = [ptrs[j] for j in order]
            if view is not None:
                view[:] = addresses
                continue
            staged = torch.empty(3 * len(idx), dtype=torch.int64, pin_memory=pin)
            staged.numpy()[:] = addresses
            dev_table[:3 * len(idx)].copy_(staged, non_blocking=pin)

    def run(self) -> Any:
        """The (total, 8) statistics of the leaves pointed at, asynchronously."""
        import torch

        if len(self.groups) == 1:
            codes, idx, dev_table, grid, _rows, host = self.groups[0]
            return _launch(dev_table, len(idx), grid, codes, self.dev, self.al, host)
        out = torch.empty((self.total, NCOLS), dtype=torch.float64, device=self.dev)
        for codes, idx, dev_table, grid, rows, host in self.groups:
            out[rows] = _launch(dev_table, len(idx), grid, codes, self.dev, self.al, host)
        return out


class _TableCache:
    """The last few launch tables on the device, by the exact leaves they describe.

    Why: building a table (numpy, a pinned buffer, a host-to-device copy) is most of the host time
    of an eager launch, and the same leaves judged again (a repeated flush, the same tensors in
    another check) reuse it. The key holds every address, size and layout the table encodes, so a
    hit is the same table. A replay's candidate outputs mostly land at other addresses from pass to
    pass (measured on the H200 in session 5), so replays rely on stats_graph's tables instead,
    whose addresses are rewritten per pass (ManyLaunch). Also the LRU store of stats_graph.
    """

    def __init__(self, size: int = 8) -> None:
        self.size = size
        self._d: dict[Any, Any] = {}

    def get(self, key: Any) -> Any:
        return self._d.get(key)

    def put(self, key: Any, value: Any) -> Any:
        if len(self._d) >= self.size:
            self._d.pop(next(iter(self._d)))
        self._d[key] = value
        return value


_TABLES = _TableCache()


def _table(ptr_rows: list[list[int]], idx: list[int], leaves: list[tuple[Any, Any, Any]],
           layouts: list[tuple[int, int]], row0: Any, chunk: int, dev: Any) -> tuple[Any, tuple[int, int, int], Any]:
    """(device table, (blocks, most chunks in a block, programs), output rows) of one launch over
    leaves ``idx``."""
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
    rows = torch.from_numpy(np.concatenate([np.arange(row0[i], row0[i] + layouts[i][0]) for i in idx])).to(dev)
    table = np.concatenate([ptrs.reshape(-1), work.reshape(-1)])
    host = torch.from_numpy(table)
    dev_table = host.pin_memory().to(dev, non_blocking=True) if dev.type == "cuda" else host
    return dev_table, (len(leaf_of), kmax, len(work)), rows


_DISABLED: list[str] = []


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


def block_stats_triton(c: Any, r: Any, e: Any, nb: int, size: int) -> Any:
    """Per-block statistics of flat contiguous c, r, e (any float dtypes) as an (nb, 8) float64 tensor."""
    import torch

    f64 = torch.float64 in (c.dtype, r.dtype, e.dtype)
    tiles = -(-size // TILE)
    part = torch.empty((nb, tiles, NCOLS), dtype=torch.float64, device=c.device)
    triton_kernel()[(nb, tiles)](c, r, e, part, c.numel(), size, tiles, F64=f64, BLOCK=TILE)
    if tiles == 1:
        return part[:, 0, :]
    out = part[:, :, :7].sum(1)
    return torch.cat([out, part[:, :, 7].amax(1, keepdim=True)], 1)


def block_stats_torch(c: Any, r: Any, e: Any, nb: int, size: int, chunk: int = 1 << 16) -> Any:
    """The same statistics with torch ops, chunk by chunk (temporaries bounded by ``chunk`` elements)."""
    import torch

    n = int(c.numel())
    cdt = torch.float64 if torch.float64 in (c.dtype, r.dtype, e.dtype) else torch.float32
    out = torch.empty((nb, NCOLS), dtype=torch.float64, device=c.device)
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
        d = cc - rr
        ec = d - ee
        t = rr + ee
        cols = [(ec * ec).sum(1), (ee * ee).sum(1), (t * t).sum(1), (rr * rr).sum(1), (d * d).sum(1)]
        ac, ar = ec.abs_(), ee.abs()
        cols += [(ac > ar).sum(1), (ac < ar).sum(1), d.abs_().amax(1)]
        out[b0:b1] = torch.stack([x.to(torch.float64) for x in cols], 1)
    return out
