"""A GPU replay's judgement after the pass: statistics and metric columns on the device, as a CUDA graph.

Why: on a GPU a large model's forward is bound by the host launching kernels, so what the host does
after the last module call is added to the replay one to one. After the pass the replay computes
every queued leaf's block statistics (kernels.block_stats_many) and from them the judging formulas
(compare.metric_columns). As host work that was 1.45-1.97 ms per 1.1B pass on the H200's host
(session 5): the launch table's construction, Triton's launcher, the chunk reduction, numpy over
the stacked statistics. Captured as one CUDA graph, the host pays one small copy, one launch and
one read-back: 1.10 ms of flush, most of it waiting for the device's tail (docs/benchmarks.md).

When: a replay's flush sees the same leaf signature (sizes, dtypes, confidences) on every pass over
a loaded golden, but not the same addresses: the caching allocator hands the candidate's outputs
different blocks from pass to pass (on the H200 consecutive passes mostly differed). So the
graph is keyed by signature, and its kernel reads the leaves' addresses from a table that
kernels.ManyLaunch.point_at rewrites before each replay. On CUDA that table and the columns the
graph writes are pinned host memory, read and written by the kernels through unified addressing,
so a start is a write into a numpy array, a graph launch and an event (session 8: the staging
copy, the copy back and a new event per start had cost 0.3 ms of host time inside a pass); a
graph's next start then first waits for its last start's columns. Elsewhere (ROCm, untested
there) the table is device memory rewritten in stream order and the columns are copied back.
The first time a signature is seen it runs eagerly (the statistics kernel, then the formulas
kernel; numpy where that kernel failed); the second time it also is captured; from the third on
the graph is replayed, on the leaves of that pass.

start() only queues the work and returns a Pending, which waits when its columns are read: a
replay may start parts of its statistics during the pass (replay._StatsQueue.LAUNCH_BYTES; off by
default, since on the H200 a part's start cost about as much host time as the device time it hid,
sessions 6 and 8). A graph launch alone costs 3 us of host time; inside a pass 25 us. The
formulas run as one Triton launch (COLUMNS_KERNEL): as torch ops they were ~90 small kernels, 100
us of device time per replay whatever the leaf count; as one kernel 4 us (session 6,
bench/bench_stats_start.py).
"""
from __future__ import annotations

from typing import Any

from pytest_rocm_parity import kernels
from pytest_rocm_parity.compare import ArrayOps, columns_many, metric_columns

GRAPHS = True     # capture launches seen twice (tests switch it off to compare with eager)
NCOLS = 9         # metric_columns' 8, then 1.0 where the leaf's sums are finite
# the judging formulas as one Triton launch (kernels.columns_launch) rather than torch ops (about
# 90 small kernels) or numpy; the first failure (a Triton without float64 log/exp here, say) is
# kept in COLUMNS_ERRORS and the formulas go back to torch on the device and numpy on the host
COLUMNS_KERNEL = True
COLUMNS_ERRORS: list[str] = []


def _columns_kernel_usable() -> bool:
    return COLUMNS_KERNEL and not COLUMNS_ERRORS


def _columns_failed(exc: BaseException) -> None:
    COLUMNS_ERRORS.append(f"{type(exc).__name__}: {exc}")


class _Launch:
    """The device side of one judgement: index tensors made before any capture (host-to-device
    copies cannot be captured), the outputs it writes, and what a graph of it must keep alive."""

    def __init__(self, leaves: list[tuple[Any, Any, Any]], layouts: list[tuple[int, int]],
                 confs: list[float], dev: Any, al: bool, host_side: bool = False) -> None:
        """``host_side``: the leaves' addresses and the columns in pinned host memory (see
        kernels.ManyLaunch; the columns only with the formulas kernel), so a start makes no copy."""
        import torch

        self.count = len(leaves)    # no reference kept: a cached graph must not hold a pass's outputs
        self.many = kernels.ManyLaunch(leaves, layouts, al=al, host_pointers=host_side)
        self.host_side = host_side
        self.stats: Any = None
        self.out: Any = None
        self.host_out: Any = None
        self.meta: Any = None
        self.groups: list[Any] = []
        if _columns_kernel_usable():   # compiled already: an eager judgement of this signature came first
            self.meta = kernels.columns_meta(layouts, [int(c.numel()) for c, _, _ in leaves], confs, dev)
            if host_side:
                self.host_out = torch.empty((self.count, NCOLS), dtype=torch.float64, pin_memory=True)
            return
        groups: dict[int, list[int]] = {}
        for i, (nb, _) in enumerate(layouts):
            groups.setdefault(nb, []).append(i)
        starts, row = [], 0
        for nb, _ in layouts:
            starts.append(row)
            row += nb
        f64 = dict(dtype=torch.float64, device=dev)
        for nb, idx in groups.items():
            rows = [starts[i] + b for i in idx for b in range(nb)]
            contiguous = rows == list(range(rows[0], rows[0] + len(rows)))
            self.groups.append((nb, torch.tensor(idx, device=dev),
                                None if contiguous else torch.tensor(rows, device=dev), rows[0],
                                torch.tensor([float(leaves[i][0].numel()) for i in idx], **f64),
                                torch.tensor([confs[i] for i in idx], **f64)))

    def run(self, unit_roundoff: float) -> None:
        """Queue the statistics and the columns on the current stream (nothing waits)."""
        import torch

        self.stats = self.many.run()
        if self.meta is not None:
            self.out = kernels.columns_launch(self.stats, self.meta, unit_roundoff, self.host_out)
            return
        out = torch.empty((self.count, NCOLS), dtype=torch.float64, device=self.stats.device)
        for nb, pos, rows, row0, n, conf in self.groups:
            st = (self.stats[row0:row0 + len(pos) * nb] if rows is None else self.stats.index_select(0, rows))
            st = st.view(len(pos), nb, -1)
            cols = metric_columns(st, n, conf, unit_roundoff, TORCH_OPS)
            finite = torch.isfinite(st[:, :, :5]).flatten(1).all(1)
            out.index_copy_(0, pos, torch.cat([cols, finite[:, None].to(torch.float64)], 1))
        self.out = out


class _Graphed:
    """A captured launch, its last start's results (``last``) and, for a host-side launch, the event
    its starts record."""

    def __init__(self, graph: Any, launch: _Launch) -> None:
        import torch

        self.graph, self.launch = graph, launch
        self.last: Pending | None = None
        self.event = torch.cuda.Event() if launch.host_side else None


class Pending:
    """One launch's results on their way to the host: columns() waits for them (and nothing else).

    Why apart from the launch: a replay starts the statistics of the leaves queued so far while
    later modules still run (replay._StatsQueue), and reads them all after one wait at the end.
    """

    def __init__(self, host: Any, event: Any, columns_of: Any = None) -> None:
        self._host, self._event, self._columns_of = host, event, columns_of
        self._cols: Any = None

    def columns(self) -> Any:
        """(L, NCOLS) numpy: metric_columns' 8, then 1.0 where the leaf's sums are finite. Read once
        (later calls return the same array): a host-side graph's buffer is its next start's too."""
        if self._cols is None:
            if self._event is not None:
                self._event.synchronize()
            host = self._host.numpy()
            self._cols = self._columns_of(host) if self._columns_of is not None else host.copy()
            self._host = self._event = None
        return self._cols


_SEEN, _FAILED = "seen", "failed"
# key -> _Graphed, _SEEN or _FAILED. A replay that starts its statistics in parts (replay._StatsQueue)
# has one signature per part; parts of the same signature (a run of identical blocks) share a graph
CACHE_SIZE = 32
_CACHE = kernels._TableCache(CACHE_SIZE)
_STREAMS: dict[Any, Any] = {}
TORCH_OPS: Any = None
CAPTURE_ERRORS: list[str] = []      # the last few failed captures, newest first


def start(leaves: list[tuple[Any, Any, Any]], layouts: list[tuple[int, int]], confs: list[float],
          unit_roundoff: float, slot: int = 0) -> Pending:
    """Queue the statistics and judging columns of ``leaves`` on the current stream; nothing waits.

    ``leaves``: (candidate, reference, residual) contiguous, on one GPU, of block_stats_many's dtypes;
    they must stay alive (and unwritten) until the Pending's columns() returns. ``slot``: which of
    a pass's parts this is (replay._StatsQueue): parts of one signature (runs of identical blocks)
    get a graph each, since a host-side graph's next start must wait for its last one's results.

    Callable inside or outside torch.inference_mode (a replay starts parts during its direct calls,
    which run inside it, and at the flush, outside): what it caches is made as normal tensors, since
    a graph's address table is rewritten in place on every later start, wherever that start is.
    Made as inference tensors, the first rewrite outside inference mode raised, which switched the
    Triton kernel off for the process (found on the H200, session 6).
    """
    import torch

    with torch.inference_mode(False):
        return _start(leaves, layouts, confs, unit_roundoff, slot)


def _start(leaves: list[tuple[Any, Any, Any]], layouts: list[tuple[int, int]], confs: list[float],
           unit_roundoff: float, slot: int) -> Pending:
    import torch

    global TORCH_OPS
    if TORCH_OPS is None:
        TORCH_OPS = ArrayOps(torch, torch=True)
    dev = leaves[0][0].device
    ptrs = [x.data_ptr() for leaf in leaves for x in leaf]
    key = _key(leaves, confs, unit_roundoff, slot, dev, ptrs)
    al, host_side = key[-3], key[-1]
    got = _CACHE.get(key)
    if isinstance(got, _Graphed):
        launch = got.launch
        if launch.host_side and got.last is not None:
            got.last.columns()   # its address table and columns are about to be rewritten
        launch.many.point_at(leaves, ptrs)
        got.graph.replay()
        if launch.host_out is not None and got.event is not None:   # written by the graph into pinned memory
            got.event.record(kernels.current_stream(dev))
            got.last = Pending(launch.host_out, got.event)
        else:
            # a host buffer per start: the graph's own output is overwritten by its next replay,
            # which may come before this one is read (two parts of one signature in a pass)
            got.last = Pending(_to_host(launch.out), _recorded(dev))
        return got.last
    # not (yet) a graph: the statistics, then the formulas in one launch; without that kernel the
    # statistics come back and the formulas run in numpy (launching torch's ~90 small kernels one
    # by one would cost the host more than numpy does)
    stats = kernels.block_stats_many(leaves, layouts)
    cols = None
    if _columns_kernel_usable():
        try:
            cols = kernels.columns_launch(stats, kernels.columns_meta(
                layouts, [int(c.numel()) for c, _, _ in leaves], confs, dev), unit_roundoff)
        except Exception as exc:   # kept for bug reports; the numpy formulas judge the same
            _columns_failed(exc)
    if got is None:
        _CACHE.put(key, _SEEN)
    elif got == _SEEN and GRAPHS and dev.type == "cuda":
        graphed = _capture(_Launch(leaves, layouts, confs, dev, al, host_side), unit_roundoff, dev)
        if graphed == _FAILED and host_side:
            # device tables from now on: captured again as such, under the key the next starts
            # will look for (host_pointers_usable is false from here on)
            kernels.host_pointers_failed(RuntimeError(CAPTURE_ERRORS[0] if CAPTURE_ERRORS else "capture failed"))
            key = key[:-1] + (False,)
            graphed = _capture(_Launch(leaves, layouts, confs, dev, al), unit_roundoff, dev)
        _CACHE.put(key, graphed)
    if cols is not None:
        return Pending(_to_host(cols), _recorded(dev))
    host = _to_host(stats)
    starts = [0]
    for nb, _ in layouts:
        starts.append(starts[-1] + nb)
    numels = [int(c.numel()) for c, _, _ in leaves]

    def columns_of(stats: Any) -> Any:
        return columns_many([stats[a:b] for a, b in zip(starts, starts[1:])], numels, confs, unit_roundoff)
    return Pending(host, _recorded(dev), columns_of)


def _key(leaves: list[tuple[Any, Any, Any]], confs: list[float], unit_roundoff: float, slot: int, dev: Any,
         ptrs: list[int]) -> tuple[Any, ...]:
    """A launch's signature: what its graph computes, whatever the addresses (point_at sets them per
    pass); whether all are aligned (a graph of the vectorised loop must never be pointed at a leaf
    that is not); whether its tables are host-side. The last three entries: al, slot, host_side."""
    return (dev, kernels.CHUNK, unit_roundoff, _columns_kernel_usable(), tuple(confs),
            tuple((c.numel(), c.dtype, r.dtype, e.dtype) for c, r, e in leaves), kernels.aligned(ptrs), slot,
            kernels.host_pointers_usable(dev))


def restarter(leaves: list[tuple[Any, Any, Any]], layouts: list[tuple[int, int]], confs: list[float],
              unit_roundoff: float, slot: int, names: list[str], numels: list[int]) -> Restart | None:
    """A Restart of the launch start() just made for ``leaves``, if start() keeps it as a graph
    whose address table and columns live in pinned host memory; None otherwise."""
    dev = leaves[0][0].device
    got = _CACHE.get(_key(leaves, confs, unit_roundoff, slot, dev, [x.data_ptr() for leaf in leaves for x in leaf]))
    if not isinstance(got, _Graphed) or got.event is None or got.launch.host_out is None:
        return None
    return Restart(got, leaves, dev, names, numels)


class Restart:
    """start() again for the same references and residuals, with new candidates of the same sizes
    and dtypes: what start() checks and looks up on every call was settled when this was made.

    Why: a replay's pass over one golden starts the same leaves' statistics on every pass, only its
    candidates' addresses new (the caching allocator's blocks). start() recomputes the signature
    (every leaf's size and dtype, every address's alignment), hashes it, and rewrites the whole
    address table; on the H200's host that was most of the 0.24 ms start of a 1.1B pass (session
    12); restarted, a start took 0.086 ms against start()'s 0.193 (session 13). The caller vouches
    for the candidates' sizes, dtypes and devices (replay's slots check them per output);
    alignment, which the allocator decides, is checked here.
    """

    def __init__(self, graphed: _Graphed, leaves: list[tuple[Any, Any, Any]], dev: Any,
                 names: list[str], numels: list[int]) -> None:
        import numpy as np

        self.graphed, self.dev, self.names, self.numels = graphed, dev, names, numels
        many = graphed.launch.many
        self.al = many.al
        everyone = list(range(len(leaves)))
        # per group of the launch: its address view, its candidate count, which leaves (None: all,
        # in order) and the references' and residuals' addresses, which stay
        self.groups: list[tuple[Any, int, list[int] | None, Any]] = []
        for (_codes, idx, _table, _grid, _rows, _host), view in zip(many.groups, many._views):
            fixed = np.array([leaves[i][k].data_ptr() for k in (1, 2) for i in idx], dtype=np.int64)
            self.groups.append((view, len(idx), None if list(idx) == everyone else list(idx), fixed))

    def start(self, cands: list[Any]) -> Pending | None:
        """start() for these candidates (in the leaves' order); None where one is not aligned as
        the graph's loop needs (start() then makes or finds the launch that suits it)."""
        ptrs = [c.data_ptr() for c in cands]
        if self.al and not kernels.aligned(ptrs):
            return None
        g = self.graphed
        if g.last is not None:
            g.last.columns()   # its address table and columns are about to be rewritten
        many = g.launch.many
        mine = many.owner is self    # the references' addresses are in the table already
        for view, n, pick, fixed in self.groups:
            view[:n] = ptrs if pick is None else [ptrs[i] for i in pick]
            if not mine:
                view[n:] = fixed
        many.owner = self
        g.graph.replay()
        event: Any = g.event     # host-side graphs record one (restarter)
        event.record(kernels.current_stream(self.dev))
        g.last = Pending(g.launch.host_out, event)
        return g.last


def judge_on_device(leaves: list[tuple[Any, Any, Any]], layouts: list[tuple[int, int]], confs: list[float],
                    unit_roundoff: float) -> Any:
    """start(...).columns(): the (L, NCOLS) columns now (one wait)."""
    return start(leaves, layouts, confs, unit_roundoff).columns()


def _to_host(t: Any) -> Any:
    """``t`` copied to the host in stream order (pinned on a GPU, so the copy does not wait)."""
    import torch

    if t.device.type != "cuda":
        return t
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    host.copy_(t, non_blocking=True)
    return host


def _recorded(dev: Any) -> Any:
    import torch

    if dev.type != "cuda":
        return None
    ev = torch.cuda.Event()
    ev.record(torch.cuda.current_stream(dev))
    return ev


def _capture(launch: _Launch, unit_roundoff: float, dev: Any) -> Any:
    """``launch`` captured as a graph (nothing runs now), or _FAILED: it then stays eager."""
    import torch

    stream = _STREAMS.get(dev)
    if stream is None:
        stream = _STREAMS[dev] = torch.cuda.Stream(device=dev)
    main = torch.cuda.current_stream(dev)
    graph = torch.cuda.CUDAGraph()
    stream.wait_stream(main)     # the index tensors were made on the main stream
    try:
        with torch.cuda.device(dev), torch.cuda.stream(stream):
            graph.capture_begin(capture_error_mode="thread_local")
            try:
                launch.run(unit_roundoff)   # its launch tables are cached: no copy to capture
            finally:
                graph.capture_end()
    except Exception as exc:   # kept for `bench/diag_fast_pass.py` and bug reports
        CAPTURE_ERRORS[:] = [f"{type(exc).__name__}: {exc}"][:1] + CAPTURE_ERRORS[:4]
        return _FAILED
    finally:
        main.wait_stream(stream)
    return _Graphed(graph, launch)
