"""One rung's tensor file read for a replay: each tensor on demand or preloaded onto the replay's
device, in a thread of its own while the replay's forward runs (docs/golden-format.md,
docs/performance.md#what-a-cold-replay-spends). The file's framing and content hash are checked by
golden.store before and while it is read."""
from __future__ import annotations

import struct
import threading
from pathlib import Path
from typing import Any

from pytest_rocm_parity.errors import GoldenCorrupt
from pytest_rocm_parity.golden.store import (
    ALIGN, BYTE_VIEW_DTYPES, BYTE_VIEWS_KEY, COMPLEX128_KEY, TORCH_DTYPES, BackgroundVerify, check_safetensors,
    is_panic, parse_json, safetensors_refusal,
)
from pytest_rocm_parity.progress import megabytes, progress


class RungReader:
    """Lazy per-key access to one rung's tensors, loaded straight onto ``device``."""

    def __init__(self, path: Path, device: str, expected_sha: str | None = None,
                 background_verify: bool = False) -> None:
        from safetensors import safe_open

        self.path = path
        self.device = str(device)
        self._cache: dict[str, Any] = {}
        self.header = check_safetensors(path, None if background_verify else expected_sha)
        progress(f"loading {path.name} ({megabytes(path.stat().st_size)})", verbose=1)
        # the content hash, checked while the replay runs: verification.result() before any verdict
        self.verification = BackgroundVerify(path, expected_sha if background_verify else None)
        with safetensors_refusal(path):
            self._f = safe_open(str(path), framework="pt", device=str(device))
            self.keys = set(self._f.keys())
        # a map of strings (safetensors refuses anything else), or null, which it reads as none
        meta: dict[str, str] = self.header.get("__metadata__") or {}
        self.metadata = meta
        try:
            listed = parse_json(meta.get(COMPLEX128_KEY, "[]").encode())
        except ValueError:
            listed = None
        if not isinstance(listed, list) or not all(isinstance(k, str) for k in listed):
            raise GoldenCorrupt(f"{path}: bad {COMPLEX128_KEY!r} list in the header metadata; recapture "
                                f"this golden", path)
        self.complex128 = set(listed)
        try:
            views = parse_json(meta.get(BYTE_VIEWS_KEY, "{}").encode())
        except ValueError:
            views = None
        if not isinstance(views, dict) or not all(v in BYTE_VIEW_DTYPES for v in views.values()):
            raise GoldenCorrupt(f"{path}: bad {BYTE_VIEWS_KEY!r} map in the header metadata (dtypes must be "
                                f"among {', '.join(BYTE_VIEW_DTYPES)}); recapture this golden", path)
        self.byte_views: dict[str, str] = views
        with open(path, "rb") as f:
            self._data_start = 8 + struct.unpack("<Q", f.read(8))[0]
        self._loading: _BackgroundLoad | None = None

    def _read_cpu(self, key: str) -> Any:
        """One tensor read into a fresh (aligned) buffer, or None for dtypes torch reads only via safetensors.

        Why not the memory map: pages of a mapped file count in the process's resident memory once
        touched, so comparing a large golden would hold the whole file resident; read() leaves them
        in the page cache, and each buffer is freed after its layer is judged.
        """
        import torch

        info = self.header[key]
        dtype = TORCH_DTYPES.get(info["dtype"])
        if dtype is None:
            return None
        t = torch.empty(info["shape"], dtype=getattr(torch, dtype))
        start, end = info["data_offsets"]
        if end > start:
            buf = t.reshape(-1).view(torch.uint8).numpy()
            with open(self.path, "rb") as f:
                f.seek(self._data_start + int(start))
                if f.readinto(buf.data) != end - start:
                    raise self._cut_short(key)
        return t

    def _cut_short(self, key: str) -> GoldenCorrupt:
        """The error for tensor ``key`` whose bytes end before its header says: the file was truncated."""
        return GoldenCorrupt(f"{self.path}: tensor {key!r} is cut short (file truncated); recapture this golden",
                             self.path)

    def nbytes(self, key: str) -> int:
        start, end = self.header[key]["data_offsets"]
        return int(end) - int(start)

    def preload(self, keys: Any, max_bytes: int, background: bool = False) -> int:
        """Load ``keys`` onto the device, in their order, up to ``max_bytes``; get() then costs nothing.
        ``background``: in a thread of its own (_BackgroundLoad), get() waiting only for a tensor not
        loaded yet; returns the bytes it loads.

        Why: a lazy load inside a forward hook is a blocking host-to-device copy per module, which
        stalls the GPU's queue; loaded up front, comparisons run at the device's own pace. Loaded in
        the background, in the order the replay asks for them, the reads and copies overlap the
        forward's own start in a new process (its kernels and libraries loaded on first use).
        """
        total = 0
        chosen: dict[str, None] = {}   # in order, once each
        for k in keys:
            if k in self._cache or k not in self.keys or k in chosen:
                continue
            size = self.nbytes(k)
            if total + size > max_bytes:
                break
            chosen[k] = None
            total += size
        if background and self._loading is None:
            streamed = [k for k in chosen if TORCH_DTYPES.get(self.header[k]["dtype"]) is not None]
            if streamed:
                self._loading = _BackgroundLoad(self, streamed)
            chosen = {k: None for k in chosen if k not in self._loading.keys} if self._loading else chosen
        for k in chosen:
            self._cache[k] = self.get(k)
        return total

    def release(self) -> None:
        """Every loaded tensor let go, the background load stopped first."""
        try:
            if self._loading is not None:
                self._loading.close()
        finally:
            self._loading = None
            self._cache.clear()

    def holds(self, key: str) -> bool:
        """Whether get(key) returns the tensor preload holds (the same one each time), not a fresh read."""
        return key in self._cache or (self._loading is not None and key in self._loading.keys)

    def _as_stored(self, key: str, t: Any) -> Any:
        """A tensor as read from the file, viewed as what was stored: complex128 from its float64
        pairs, a byte view (float8) in its dtype."""
        import torch

        if key in self.complex128:
            return torch.view_as_complex(t)
        if key in self.byte_views:
            dtype = getattr(torch, self.byte_views[key], None)
            if dtype is None:
                raise GoldenCorrupt(f"{self.path}: tensor {key!r} is {self.byte_views[key]}, which this torch "
                                    f"({torch.__version__}) lacks; upgrade torch to read this golden", self.path)
            return t.view(dtype)
        return t

    def get(self, key: str) -> Any:
        if self._loading is not None and isinstance(key, str) and key in self._loading.keys:
            loaded = self._loading.take(key)
            if loaded is not None:
                return loaded
        hit = self._cache.get(key) if isinstance(key, str) else None
        if hit is not None:
            return hit
        if not isinstance(key, str) or key not in self.keys:
            raise GoldenCorrupt(f"{self.path}: manifest names tensor {key!r} that the file lacks "
                                f"(manifest and tensors do not match); recapture this golden", self.path)
        try:
            t = self._read_cpu(key) if self.device == "cpu" else None
            if t is None:
                t = self._f.get_tensor(key)
            t = self._as_stored(key, t)
            if t.device.type == "cpu" and t.data_ptr() % ALIGN:
                # A tensor read from the file sits at its offset in it; CPU kernels pick their SIMD path
                # by alignment, so an unaligned stored input would make a CPU replay differ from its
                # own capture by an ulp.  A fresh copy is aligned like the tensors the capture used.
                t = t.clone()
            return t
        except GoldenCorrupt:
            raise
        except BaseException as exc:
            if not (isinstance(exc, Exception) or is_panic(exc)):
                raise
            raise GoldenCorrupt(f"{self.path}: cannot read tensor {key!r} ({exc}); recapture this golden",
                                self.path) from None


# bytes per pinned buffer of a GPU's background load (two of them, each filled while the other's
# copy runs); a tensor larger than one is copied in pieces
STREAM_CHUNK = 32 << 20


class _BackgroundLoad:
    """RungReader.preload's tensors read in a thread, in the order given, onto the reader's device.

    On a GPU the bytes go through two pinned buffers, each copied to the device on a stream of the
    load's own while the other fills, and each tensor's copy ends in an event: take() makes the
    caller's stream wait for it there, not the host. The tensors are allocated on the stream that
    started the load, where the replay uses and frees them, and each copy waits for the work that
    stream held when its tensor was allocated. Damage (a file cut short, a read that fails) is
    raised by take() for every tensor not loaded before it; any other failure (the device's memory
    or pinned memory running out) leaves those tensors to be read when asked for, as without a
    preload.
    """

    def __init__(self, reader: RungReader, keys: list[str]) -> None:
        import torch

        self.reader = reader
        self.keys = frozenset(keys)
        self._order = list(keys)
        self._pending = set(keys)
        self._events: dict[str, Any] = {}
        self._cond = threading.Condition()
        self._stop = False
        self.corrupt: GoldenCorrupt | None = None
        self.failed: BaseException | None = None
        self.device = torch.device(reader.device)
        cuda = self.device.type == "cuda"
        if cuda and self.device.index is None:   # the thread sets its device: an index, not "cuda"
            self.device = torch.device("cuda", torch.cuda.current_device())
        self._home = torch.cuda.current_stream(self.device) if cuda else None
        self._side = torch.cuda.Stream(self.device) if cuda else None
        self._thread = threading.Thread(target=self._run, daemon=True, name="parity-load")
        self._thread.start()

    def take(self, key: str) -> Any | None:
        """``key``'s tensor once loaded, the caller's stream made to wait for its copy until the
        copy is seen done (a stream waits only for what it is told to, so every call until then);
        None where the load stopped before it."""
        with self._cond:
            while key in self._pending and self.corrupt is None and self.failed is None:
                self._cond.wait()
            if key in self._pending:
                if self.corrupt is not None:
                    raise GoldenCorrupt(str(self.corrupt), self.reader.path) from self.corrupt
                return None
            event = self._events.get(key)
            if event is not None and event.query():
                # landed: no stream need wait for it again (a replay reads each tensor several
                # times a pass)
                del self._events[key]
                event = None
        if event is not None:
            import torch

            torch.cuda.current_stream(self.device).wait_event(event)
        return self.reader._cache[key]

    def close(self) -> None:
        """Stop after the tensor being read, and wait for the copies already queued and for every
        stream's work: a tensor freed after this is read by no queued kernel, on whatever stream the
        replay read it (so take() need not record_stream each read)."""
        self._stop = True
        self._thread.join()
        if self._side is not None:
            import torch

            self._side.synchronize()
            torch.cuda.synchronize(self.device)

    def _run(self) -> None:
        try:
            if self._side is None:
                for k in self._order:
                    if self._stop:
                        return
                    self._publish(k, self.reader._as_stored(k, self.reader._read_cpu(k)), None)
            else:
                self._stream()
        except BaseException as exc:   # handed to the replay's thread by take()
            with self._cond:
                if isinstance(exc, GoldenCorrupt):
                    self.corrupt = exc
                elif isinstance(exc, OSError) or is_panic(exc):
                    self.corrupt = GoldenCorrupt(f"{self.reader.path}: cannot read its tensors ({exc}); recapture "
                                                 f"this golden", self.reader.path)
                else:
                    self.failed = exc
                self._cond.notify_all()

    def _publish(self, key: str, t: Any, event: Any) -> None:
        with self._cond:
            self.reader._cache[key] = t
            if event is not None:
                self._events[key] = event
            self._pending.discard(key)
            self._cond.notify_all()

    def _stream(self) -> None:
        import torch

        r, dev, side = self.reader, self.device, self._side
        assert side is not None   # _run streams on a GPU only
        torch.cuda.set_device(dev)
        bufs = [torch.empty(STREAM_CHUNK, dtype=torch.uint8, pin_memory=True) for _ in range(2)]
        done: list[Any] = [None, None]   # each buffer's last copy, awaited before it is filled again
        which, fill = 0, 0
        try:
            with open(r.path, "rb") as f:
                for k in self._order:
                    if self._stop:
                        return
                    info = r.header[k]
                    with torch.cuda.stream(self._home):
                        t = torch.empty(info["shape"], dtype=getattr(torch, TORCH_DTYPES[info["dtype"]]), device=dev)
                        # the block may be one the replay freed with its kernels still queued: the copy
                        # waits for what the replay's stream holds now
                        free = torch.cuda.Event()
                        free.record(self._home)
                    side.wait_event(free)
                    dst = t.reshape(-1).view(torch.uint8)
                    start, end = (int(x) for x in info["data_offsets"])
                    f.seek(r._data_start + start)
                    at = 0
                    with torch.cuda.stream(side):
                        while at < end - start:
                            if fill == STREAM_CHUNK:
                                done[which] = torch.cuda.Event()
                                done[which].record(side)
                                which, fill = 1 - which, 0
                                if done[which] is not None:
                                    done[which].synchronize()
                            n = min(end - start - at, STREAM_CHUNK - fill)
                            piece = bufs[which][fill:fill + n]
                            if f.readinto(piece.numpy().data) != n:
                                raise r._cut_short(k)
                            dst[at:at + n].copy_(piece, non_blocking=True)
                            at += n
                            fill += n
                        landed = torch.cuda.Event()
                        landed.record(side)
                    self._publish(k, r._as_stored(k, t), landed)
        finally:
            side.synchronize()   # the pinned buffers are freed on return
