"""Capture: record a golden on the reference device.

Per dtype rung, run the model with hooks that record every selected module's inputs and outputs,
then compute the float64 truth twice: propagated (whole model in float64) and local (each module in
float64 on the recorded inputs, one nesting level at a time). Rungs are written one at a time.

On CUDA (and ROCm, whose torch.cuda is HIP) the recorded tensors go to pinned host memory on a side
stream while the forward runs on, the float64 model is built on the device when it fits, and the
truth residuals are computed there: only the golden's own bytes come to the host.
"""
from __future__ import annotations

import collections
import contextlib
import copy
import itertools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from pytest_rocm_parity import __version__
from pytest_rocm_parity.judging import dtypes as dt
from pytest_rocm_parity.runner.engine import (
    KEEP_PLACEMENT,
    model_config,
    autocast_dtype,
    OUTPUT,
    BufferState,
    _dev,
    CheckSpec,
    ForwardWrap,
    Hooks,
    _run,
    substitute,
    cast_inputs,
    fingerprint,
    home_device,
    normalize_inputs,
    mode_sensitive,
    numerics,
    prepare_model,
    submodule,
    walk_model,
)
from pytest_rocm_parity.golden.store import FORMAT_VERSION, GoldenStore
from pytest_rocm_parity.runner.padding import Padding, mask_input
from pytest_rocm_parity.runner.choices import choice_like, unselected_inside
from pytest_rocm_parity.runner.selection import Selected, select
from pytest_rocm_parity.runner.tree import constant_leaves, map_tensors, named_fields, split_leaves, tensor_leaves
from pytest_rocm_parity.errors import InvalidArgument
from pytest_rocm_parity.runner.wrappers import inlines_compiled_children, is_exported, plain_copy, unwrap
from pytest_rocm_parity.quant.storage import cast_module, quantized_tensor_ids

# Where the float64 truth model is built: None decides by the device's free memory; True builds it
# on the capture device, False through the host (tests compare the two routes).
TRUTH_ON_DEVICE: bool | None = None
# Device bytes of snapshots whose copy to the host may be in flight at once; past it the recording
# waits for the oldest copies, so copies that lag the forward hold a bounded amount of device memory.
INFLIGHT_BYTES = 1 << 30
# Device snapshots a recording pass keeps on the device, copying them to the host only after the
# forward (while the float64 truth is built), as a fraction of the device's memory; None: that
# fraction, a number: bytes (tests set 0 to stream every copy during the forward, the fallback).
DEVICE_HOLD_FRACTION = 0.05
DEVICE_HOLD_BYTES: int | None = None
# Headroom asked of the device beyond the float64 weights: the float64 activations of one forward.
_TRUTH_MARGIN = 0.25
_TRUTH_SLACK_BYTES = 2 << 30

# ---------------------------------------------------------------------------------------------
# host copies

class HostCopies:
    """Copies of tensors into host memory; asynchronous for CUDA tensors.

    A CUDA tensor is copied into pinned memory from torch's caching host allocator (reused across
    passes) by a side stream that waits for the compute stream, so the forward does not stall on
    the copies. Nothing may read a returned host tensor before finish(). Other devices copy
    synchronously, as capture always did.
    """

    def __init__(self) -> None:
        self._streams: dict[Any, Any] = {}
        self._inflight: collections.deque[tuple[Any, int]] = collections.deque()
        self._inflight_bytes = 0

    def copy(self, t: Any, snapshot: bool = True) -> Any:
        """A contiguous host copy of ``t``.

        ``snapshot``: ``t`` is the model's own tensor, which a later in-place op (ReLU(inplace=True),
        ``out += x``) could change before the side stream reads it; it is first copied on the device,
        in stream order, which costs a device-to-device copy (microseconds) and no host time.
        """
        import torch

        t = t.detach()
        if not t.is_cuda or t.numel() == 0:
            return t.to("cpu", copy=True).contiguous()
        try:
            host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        except RuntimeError:   # pinned memory exhausted: the synchronous copy still works
            return t.to("cpu", copy=True).contiguous()
        src = t.clone(memory_format=torch.contiguous_format) if snapshot or not t.is_contiguous() else t
        compute, stream = self._pair(src.device)
        stream.wait_stream(compute)
        with torch.cuda.stream(stream):
            done = self._issue(host, src, stream)
        self._throttle(done, src.numel() * src.element_size())
        return host

    def copy_many(self, snaps: list[Any]) -> list[Any]:
        """Host copies of contiguous device snapshots that nothing else writes, issued in one go.

        Why: entering a stream context per tensor is host time; after the forward, the snapshots
        are copied while the host goes on to build the float64 truth. No throttle: these snapshots
        are allocated already, so their copies hold no extra device memory.
        """
        import torch

        out: list[Any] = [None] * len(snaps)
        by_dev: dict[Any, list[int]] = {}
        for i, t in enumerate(snaps):
            try:
                out[i] = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
            except RuntimeError:   # pinned memory exhausted: the synchronous copy still works
                out[i] = t.to("cpu", copy=True)
                continue
            by_dev.setdefault(t.device, []).append(i)
        for dev, idx in by_dev.items():
            compute, stream = self._pair(dev)
            stream.wait_stream(compute)
            with torch.cuda.stream(stream):
                for i in idx:
                    self._issue(out[i], snaps[i], stream)
        return out

    def _pair(self, device: Any) -> tuple[Any, Any]:
        """Per device, once per pass: the forward's stream and our copy stream."""
        import torch

        pair = self._streams.get(device)
        if pair is None:
            pair = self._streams[device] = (torch.cuda.current_stream(device), torch.cuda.Stream(device=device))
        return pair

    @staticmethod
    def _issue(host: Any, src: Any, stream: Any) -> Any:
        """host <- src on ``stream`` (the current stream); an event recorded after it."""
        import torch

        host.copy_(src, non_blocking=True)
        done = torch.cuda.Event()
        done.record(stream)
        # the allocator keeps src's memory until the copy has read it; record_stream is declared as
        # mutating, which an inference tensor (the hooks run under inference_mode) allows only there
        if torch.is_inference_mode_enabled():
            src.record_stream(stream)
        else:
            with torch.inference_mode():
                src.record_stream(stream)
        return done

    def _throttle(self, done: Any, nbytes: int) -> None:
        """Forget finished copies; wait for the oldest while more than INFLIGHT_BYTES are in flight."""
        self._inflight.append((done, nbytes))
        self._inflight_bytes += nbytes
        # Only past the cap: an event query per copy is host time the forward would wait for.
        while self._inflight_bytes > INFLIGHT_BYTES and len(self._inflight) > 1:
            event, n = self._inflight[0]
            event.synchronize()
            self._inflight.popleft()
            self._inflight_bytes -= n

    def finish(self) -> None:
        """Wait for every copy issued so far; the host tensors are complete afterwards."""
        for _compute, stream in self._streams.values():
            stream.synchronize()
        self._inflight.clear()
        self._inflight_bytes = 0


def _release_pinned() -> None:
    """Give cached, unused pinned host blocks back to the OS.

    A written rung's host buffers would otherwise stay cached while the next rung (other sizes, so
    other size classes of torch's host allocator) allocates its own, and past the capture.
    """
    import torch

    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return
    empty = getattr(getattr(torch, "accelerator", None), "empty_host_cache", None) \
        or getattr(torch._C, "_host_emptyCache", None)
    if empty is not None:
        empty()


# ---------------------------------------------------------------------------------------------
# capture

class RecordPool:
    """Deduplicated copies of recorded tensors (a block's output is the next block's input).

    On CUDA a recorded tensor is snapshotted on the device in stream order (a later in-place op
    cannot reach the snapshot) and kept there, up to a hold budget, until start_copies() after the
    forward: the hooks cost a device copy each and no host-side copy work, and the float64 truth
    passes read the snapshots where they are. Past the budget, snapshots stream to pinned host
    memory during the forward as before. Elsewhere tensors are copied to the host at once.
    """

    def __init__(self, resnap: bool = False) -> None:
        """``resnap``: an inference tensor seen again is snapshotted again (see add)."""
        # id -> (key, version counter when recorded; None for an inference tensor, which has none)
        self.by_id: dict[int, tuple[str, int | None]] = {}
        self.resnap = resnap
        # id -> (inference tensor seen again, its key): compared with its first record after the
        # forward (check_repeats); resnap=False
        self.repeats: dict[int, tuple[Any, str]] = {}
        self._changed: list[Any] = []      # check_repeats' answers: bools, or flags on a device
        # (key, earlier key of the same inference tensor object): snapshotted again (resnap=True);
        # the same key if the contents are (resolve())
        self.maybe: list[tuple[str, str]] = []
        self.alive: list[Any] = []
        self.copies = HostCopies()
        self.device: dict[str, Any] = {}   # key -> device snapshot, held until drop_device()
        self._host: dict[str, Any] = {}
        self._unissued: list[str] = []
        self._count = 0
        self._held = 0
        self._budget: int | None = None
        self._pending = False

    @property
    def tensors(self) -> dict[str, Any]:
        """The host copies by key, once every copy has landed (waits for those in flight)."""
        self.finish()
        return self._host

    def key_of(self, t: Any) -> str | None:
        """The key under which this tensor object was recorded, if it was."""
        hit = self.by_id.get(id(t))
        return None if hit is None else hit[0]

    def add(self, t: Any, fresh: bool = False) -> str:
        """The key of ``t``'s copy: a tensor object recorded before and not written since is one key.

        Why: a tensor may be written after it was recorded, and recorded again: a parent's ``h +=
        x`` on its child's output before returning it (ResNet's ``out += identity``), a module that
        returns one buffer it rewrites on every call. Matched by object alone, the later record
        named the earlier contents: the parent's golden would be its child's output, silently. A tensor with a version counter is matched by it. The forward's own tensors
        are inference tensors, which have none. Such a tensor seen again keeps its key, and
        check_repeats() compares it with its first record after the forward; where one differs,
        capture records again with ``resnap``: every such tensor seen again is snapshotted again,
        and resolve() merges the keys whose contents are equal. Why in two steps: run under
        no_grad to keep the counters, the recording forward cost 1.33x the plain one on the H200,
        and snapshotting every repeat 1.10-1.11x what it had cost (a Llama hands each block its
        predecessor's output and the rotary tables); most models write nothing they pass on.
        ``fresh``: a new key whatever (an in-place module's output, its own input
        changed).
        """
        inference = t.is_inference()
        v = None if inference else t._version
        hit = None if fresh else self.by_id.get(id(t))
        if hit is not None:
            if not inference:
                if hit[1] == v:
                    return hit[0]
            elif not self.resnap:
                self.repeats.setdefault(id(t), (t, hit[0]))
                return hit[0]
        k = f"t/{self._count}"
        self._count += 1
        if hit is not None and inference:
            self.maybe.append((k, hit[0]))
        self.by_id[id(t)] = (k, v)
        self.alive.append(t)   # keeps id() unique while the pass runs
        if t.is_cuda and t.numel():
            self._add_cuda(k, t)
        else:
            self._host[k] = self.copies.copy(t)
        return k

    def check_repeats(self) -> None:
        """Queue the comparison of every inference tensor seen again with its first record, as it
        is after the forward (nothing waits; repeats_unchanged() reads the answer). Equal means it
        was not written between the two, so the key it kept is right; a tensor whose first record
        is not held on the device counts as changed. Outside the recording forward: inside it, the
        comparisons' launches (six each; 27 tensors are seen again in a 22-block Llama) cost it
        5-6% on the H200; capture runs them after it, about 1 ms of a 1.1B capture (docs/performance.md)."""
        import torch

        for t, k in self.repeats.values():
            snap = self.device.get(k)
            try:
                if not t.is_cuda:
                    first = self._host[k]
                    self._changed.append(not (first.shape == t.shape and torch.equal(_raw(first), _raw(t))))
                elif snap is None or snap.shape != t.shape or snap.dtype != t.dtype:
                    self._changed.append(True)
                else:   # device time at the forward's end: read both, write a flag per 8 bytes
                    self._changed.append(torch.ne(_raw(t, wide=True), _raw(snap, wide=True)).any())
            except Exception:   # no byte view (a sparse or quantized tensor, a subclass): record again
                self._changed.append(True)
        self.repeats.clear()

    def repeats_unchanged(self) -> bool:
        """Whether no tensor check_repeats() compared had changed (waits for the device's answers)."""
        import torch

        flags = [f for f in self._changed if not isinstance(f, bool)]
        if any(f for f in self._changed if isinstance(f, bool)):
            return False
        by_dev: dict[Any, list[Any]] = {}
        for f in flags:
            by_dev.setdefault(f.device, []).append(f)
        return not any(bool(torch.stack(fs).any()) for fs in by_dev.values())

    def resolve(self) -> dict[str, str]:
        """{key: the earlier key it equals} for the tensors recorded again (``maybe``) whose contents
        had not changed; call after finish(), before drop_device(). Compared bit for bit (every
        dtype, NaNs alike), on the device where both snapshots are held there (one read-back for
        all), else on the host."""
        import torch

        same: dict[str, str] = {}
        on_dev: list[tuple[str, str, Any]] = []
        for k, earlier in self.maybe:
            a, b = self.device.get(k), self.device.get(earlier)
            try:
                if a is None or b is None or a.device != b.device:
                    a, b = self._host[k], self._host[earlier]
                    if a.shape == b.shape and a.dtype == b.dtype and torch.equal(_raw(a), _raw(b)):
                        same[k] = earlier
                elif a.shape == b.shape and a.dtype == b.dtype:
                    on_dev.append((k, earlier, torch.ne(_raw(a, wide=True), _raw(b, wide=True)).any()))
            except Exception:   # no byte view: kept as two keys (correct, a little larger)
                continue
        if on_dev:
            for (k, earlier, _), differs in zip(on_dev, torch.stack([d for *_, d in on_dev]).tolist()):
                if not differs:
                    same[k] = earlier
        for k in list(same):     # chains (one tensor seen three times) to their first key
            root = same[k]
            while root in same:
                root = same[root]
            same[k] = root
        return same

    def _add_cuda(self, k: str, t: Any) -> None:
        import torch

        # detach only what needs it: the forward's own tensors (inference mode) carry no graph, and
        # a detach is a dispatch on every record (host time of the recording forward)
        snap = (t.detach() if t.requires_grad else t).clone(memory_format=torch.contiguous_format)
        n = snap.numel() * snap.element_size()
        if self._budget is None:
            self._budget = DEVICE_HOLD_BYTES if DEVICE_HOLD_BYTES is not None else \
                int(torch.cuda.mem_get_info(snap.device)[1] * DEVICE_HOLD_FRACTION)
        self._pending = True
        if self._held + n <= self._budget:
            self.device[k] = snap
            self._unissued.append(k)
            self._held += n
            self._host[k] = None      # filled by start_copies()
        else:
            self._host[k] = self.copies.copy(snap, snapshot=False)

    def start_copies(self) -> None:
        """Issue the host copies of the snapshots held on the device (they land while the host goes on)."""
        if self._unissued:
            for k, h in zip(self._unissued, self.copies.copy_many([self.device[k] for k in self._unissued])):
                self._host[k] = h
            self._unissued.clear()

    def finish(self) -> None:
        """Wait for the copies in flight (a no-op once done, or when nothing was on CUDA)."""
        if self._pending:
            self.start_copies()
            self.copies.finish()
            self._pending = False

    def on(self, k: str, device: Any) -> Any:
        """The device snapshot of ``k`` if it is held on ``device``, else the host copy (waits)."""
        snap = self.device.get(k)
        if snap is not None and snap.device == _dev(device):
            return snap
        return self.tensors[k]

    def release(self) -> None:
        self.by_id.clear()
        self.alive.clear()

    def drop_device(self) -> None:
        """Free the device snapshots (their host copies are complete first)."""
        self.finish()
        self.device.clear()
        self._held = 0


@dataclass
class Recording:
    """What the recording forward leaves: per call entries, model outputs, call order, host tensors."""

    entries: dict[str, dict[str, Any]]
    outputs: dict[str, Any]
    order: list[str]
    pool: RecordPool
    unread: list[str]   # the padding-mask inputs no operation of the forward read (DataFlow.watch)
    watch: list[str]    # the calls of unselected modules that made choices (recording_pass), in order


def _raw(t: Any, wide: bool = False) -> Any:
    """``t``'s bytes, flat (bit-for-bit comparison of any dtype); ``wide``: as 8-byte words where
    they divide evenly (an eighth of the elements to compare)."""
    import torch

    flat = t.reshape(-1).view(torch.uint8)
    return flat.view(torch.int64) if wide and flat.numel() % 8 == 0 and flat.data_ptr() % 8 == 0 else flat


class DataFlow:
    """Which tensors of a forward carry activations: values computed from a floating model input or
    from a selected module's output, through any torch operation (a torch function mode).

    Why: the isolated replay feeds each module the golden values of its activations and lets the
    candidate build the rest itself (attention masks in its own format, position ids, rotary tables
    made outside a selected module), so that a correct migration to another attention
    implementation is not judged on the reference's calling conventions. Identity alone misses an
    activation that passes through glue code (an attention's reshape before its output projection);
    names would guess. Integer inputs (token ids, a padding mask) start nothing: what the model
    builds from them alone is its own convention.
    """

    def __init__(self) -> None:
        import torch
        import torch.overrides

        # id -> weak reference (tensors compare elementwise, so no WeakSet); a dead id is dropped
        self._carriers: dict[int, Any] = {}
        self._paused = 0
        self.blinded = 0   # inside blind(): no operation is seen
        # operations that made a discrete choice on activations so far (_decides); a module call
        # that ran none cannot flip at a near-tie (judging.md, "Confined faults fail")
        self.decisions = 0
        # the model inputs watched for a read (watch): id -> (path, tensor); the paths read so far
        self._watched: dict[int, tuple[str, Any]] = {}
        self.read: set[str] = set()
        outer = self

        class _Mode(torch.overrides.TorchFunctionMode):
            def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
                out = func(*args, **(kwargs or {}))
                if torch.compiler.is_compiling():   # a kernel compiled inside the model (FlexAttention)
                    return out
                if outer._watched and not outer._paused:
                    outer.saw(args, kwargs)
                if not outer._paused and outer._carriers and outer._any_carrier(args, kwargs):
                    leaves = _leaves_of(out)
                    outer.mark(leaves)
                    if _decides(func, out, leaves, kwargs) and outer._any_carrier(args, kwargs, floating=True):
                        outer.decisions += 1
                return out
        self._mode = _Mode()

    def _any_carrier(self, args: Any, kwargs: Any, floating: bool = False) -> bool:
        """Whether an activation is among the arguments (``floating``: a floating one: integer work on
        a router's indices chooses nothing new)."""
        carriers = self._carriers
        for x in _leaves_of((args, kwargs)):
            r = carriers.get(id(x))
            if r is not None and r() is x and (not floating or x.is_floating_point() or x.is_complex()):
                return True
        return False

    def mark(self, tensors: Any, floating_only: bool = False) -> None:
        import weakref

        carriers = self._carriers
        def forget(i: int) -> Callable[[Any], None]:
            return lambda _ref: carriers.pop(i, None)

        for t in tensors.values() if isinstance(tensors, dict) else tensors:
            if not floating_only or t.is_floating_point() or t.is_complex():
                carriers[id(t)] = weakref.ref(t, forget(id(t)))

    def carries(self, t: Any) -> bool:
        r = self._carriers.get(id(t))
        return r is not None and r() is t

    def watch(self, inputs: dict[str, Any]) -> None:
        """Note which of these model inputs (path -> tensor) any operation of the forward reads: a
        padding mask the model never reads (Whisper's encoder ignores its attention_mask) pads
        nothing, and its "padded" positions are computed like any other (ignored_masks confirms it)."""
        self._watched.update((id(t), (p, t)) for p, t in inputs.items())

    def saw(self, args: Any, kwargs: Any) -> None:
        """Mark the watched inputs among an operation's (or a blinded module's) arguments as read."""
        for x in _leaves_of((args, kwargs)):
            hit = self._watched.get(id(x))
            if hit is not None and hit[1] is x:
                self.read.add(hit[0])

    @contextlib.contextmanager
    def blind(self) -> Iterator[None]:
        """The mode off while a module whose fused path it would turn off runs (engine.mode_sensitive);
        its inputs' floating leaves count as activations meanwhile, as nothing inside is traced."""
        import torch.overrides as overrides

        self.blinded += 1
        try:
            if overrides._get_current_function_mode() is self._mode:
                with overrides._pop_mode_temporarily():
                    yield
            else:
                yield
        finally:
            self.blinded -= 1

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Our own hook code's torch calls are not the model's data flow."""
        self._paused += 1
        try:
            yield
        finally:
            self._paused -= 1

    def __enter__(self) -> DataFlow:
        self._mode.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._mode.__exit__(*exc)


# Operations whose result jumps where their floating input crosses a threshold: rounding, the sign,
# and the truth value of a tensor (data-dependent control flow). Comparisons, arg-max/top-k/sort
# indices and casts to integers show in their integer or bool result instead.
_DISCRETE = frozenset({"round", "round_", "floor", "floor_", "ceil", "ceil_", "trunc", "trunc_", "fix", "fix_",
                       "sign", "sign_", "sgn", "sgn_", "heaviside", "__bool__"})


def _decides(func: Any, out: Any, leaves: list[Any], kwargs: Any) -> bool:
    """Whether an operation on floating activations made a discrete choice: an integer or bool result
    (a comparison, a router's top-k indices, a cast to integers), or one of _DISCRETE. A sum asked
    to accumulate in an integer dtype (``cumsum(counts, dtype=torch.int32)``: an experts kernel's
    offsets from its token counts) is arithmetic, not a choice."""
    name = getattr(func, "__name__", "")
    if name in _DISCRETE or isinstance(out, bool):
        return True
    if kwargs and kwargs.get("dtype") is not None and name not in ("to", "type"):
        return False
    return any(not (t.is_floating_point() or t.is_complex()) for t in leaves)


def _leaves_of(obj: Any) -> list[Any]:
    """The tensors in nested tuples, lists and dicts (an op's arguments or results)."""
    import torch

    out: list[Any] = []
    stack = [obj]
    while stack:
        x = stack.pop()
        if isinstance(x, torch.Tensor):
            out.append(x)
        elif isinstance(x, (tuple, list)):
            stack.extend(x)
        elif isinstance(x, dict):
            stack.extend(x.values())
    return out


def _record_fields(entry: dict[str, Any], leaves: Any) -> None:
    """``entry["fields"]``, the order of an output's named fields (tree.named_fields), where it has
    any: a positional output needs none, and its manifest entry stays as it was."""
    fields = named_fields(leaves)
    if fields:
        entry["fields"] = fields


def ignored_masks(m: Any, args: Any, kwargs: Any, unread: list[str]) -> list[str]:
    """The padding masks among ``unread`` (no operation the data flow saw read them) that the model
    ignores: its outputs are the same, bit for bit, with each set to all ones. Code the torch function
    mode cannot see (a C++ extension, TorchScript) may read a mask: then the outputs change, and the
    mask pads as any other."""
    if not unread:
        return []
    import torch

    def ones(p: str, t: Any) -> Any:
        return torch.ones_like(t) if p in unread else t
    given = tensor_leaves(_run(m, *_copies(args, kwargs)))
    unmasked = map_tensors({"args": args, "kwargs": kwargs}, ones)
    ignoring = tensor_leaves(_run(m, *_copies(tuple(unmasked["args"]), unmasked["kwargs"])))
    same = given.keys() == ignoring.keys() and all(torch.equal(given[k], ignoring[k]) for k in given)
    return list(unread) if same else []


def recording_pass(m: Any, selected: list[Selected], args: Any, kwargs: Any, resnap: bool = False) -> Recording:
    """One forward of ``m`` that copies every selected module call's input and output leaves to the host.

    Exactly the recording capture runs (a benchmark times this function); run it under
    ``numerics(rung, tf32)``. On CUDA the recorded tensors are device snapshots in ``pool.device``
    when it returns: ``pool.start_copies()`` sends them to the host without waiting (capture does so
    once the float64 model's construction is queued, so issuing them costs the forward nothing), and
    ``pool.tensors`` issues what is left and waits for all of them. Then ``pool.check_repeats()``
    and, where ``pool.repeats_unchanged()`` is false (a tensor seen again may have been written in
    between), record again with ``resnap`` (see RecordPool.add), as capture does.
    """
    pool = RecordPool(resnap)
    entries: dict[str, dict[str, Any]] = {}

    inputs: dict[str, Any] = {}    # this call's input leaves until its output is recorded
    started: dict[str, int] = {}   # the data flow's decision count at each open call's start

    flow = DataFlow()
    given = tensor_leaves({"args": args, "kwargs": kwargs})
    flow.mark({p: t for p, t in given.items() if not mask_input(p)}, floating_only=True)
    masks = {p: t for p, t in given.items() if mask_input(p)}
    flow.watch(masks)

    def rec_in(key: str, sel: Selected, a: Any, kw: Any) -> None:
        with flow.paused():
            kinds: dict[str, str] = {}
            leaves, consts = split_leaves({"args": a, "kwargs": kw}, kinds)
            inputs[key] = leaves
            entries[key] = {"name": sel.name, "key": key, "level": sel.level, "primary": sel.primary,
                            "in": {p: pool.add(t) for p, t in leaves.items()}, "const_in": consts, "in_tree": kinds,
                            "act": sorted(p for p, t in leaves.items() if flow.carries(t)
                                          or flow.blinded and (t.is_floating_point() or t.is_complex()))}
            started[key] = flow.decisions
        return None

    def rec_out(key: str, sel: Selected, out: Any) -> None:
        with flow.paused():
            ins = {pool.key_of(t) for t in inputs.pop(key, {}).values()} - {None}
            leaves, consts = split_leaves(out)
            entries[key]["out"] = {p: pool.add(t, fresh=pool.key_of(t) in ins) for p, t in leaves.items()}
            _record_fields(entries[key], leaves)
            entries[key]["const_out"] = consts
            entries[key]["decides"] = flow.decisions > started.pop(key)
            flow.mark(leaves)

    # The unselected modules inside selected ones that make choices of their own (a router below the
    # drill depth): their outputs are kept, that a replay may tell a near-tie moved inside an
    # isolated ancestor from a fault (choices.Decisions). Per open call: the decision count at its
    # start and the decisions made in watched calls inside it.
    open_calls: list[list[int]] = []
    watch: list[str] = []

    def watch_in(key: str, sel: Selected, a: Any, kw: Any) -> None:
        open_calls.append([flow.decisions, 0])
        return None

    def watch_out(key: str, sel: Selected, out: Any) -> None:
        start, inside = open_calls.pop()
        made = flow.decisions - start
        if open_calls:
            open_calls[-1][1] += made
        if made <= inside:
            return
        with flow.paused():
            leaves = tensor_leaves(out)
            if not choice_like(leaves):
                return
            entries[key] = {"name": sel.name, "key": key, "level": sel.level, "primary": sel.primary,
                            "out": {p: pool.add(t) for p, t in leaves.items()}}
            _record_fields(entries[key], leaves)
            watch.append(key)

    def unseen(inner: Callable[..., Any]) -> Callable[..., Any]:
        def forward(*a: Any, **kw: Any) -> Any:
            carried = flow._any_carrier(a, kw)
            flow.saw(a, kw)   # nothing inside is seen: a mask it is given counts as read
            with flow.blind():
                out = inner(*a, **kw)
            if carried:
                flow.mark(_leaves_of(out), floating_only=True)
            return out
        return forward

    with contextlib.ExitStack() as stack:
        for mod in mode_sensitive(unwrap(m)):
            stack.callback(ForwardWrap(mod, unseen).remove)
        stack.enter_context(Hooks(m, unselected_inside(unwrap(m), selected), watch_in, watch_out))
        with Hooks(m, selected, rec_in, rec_out) as hooks, flow:
            out = _run(m, args, kwargs)
            order = list(hooks.order)
    outs = tensor_leaves(out)
    outputs = {"out": {p: pool.add(t) for p, t in outs.items()}, "const": constant_leaves(out)}
    _record_fields(outputs, outs)
    pool.release()
    return Recording(entries, outputs, order, pool, sorted(set(masks) - flow.read), watch)


@inlines_compiled_children
def capture(model: Any, inputs: Any, spec: CheckSpec, store: GoldenStore, device: str,
            overwrite: bool = False, env: dict[str, Any] | None = None) -> dict[str, Any]:
    """Record the golden for every rung of ``spec`` and write it; returns the manifest."""
    import torch

    from pytest_rocm_parity.guards import require_inputs
    from pytest_rocm_parity.migration.backend import collect_env

    require_inputs(inputs)
    args0, kwargs0 = normalize_inputs(inputs)
    model = unwrap(model)
    if is_exported(model):   # the truth runs a float64 copy in eval mode, which such a module refuses
        raise InvalidArgument(
            "model: a torch.export program's module cannot be captured (its mode and dtypes are fixed in its "
            "graph). Capture the eager model it was exported from; the exported module replays against that "
            "golden where its module tree is the eager model's")
    if any(getattr(mod, "_compiled_call_impl", None) is not None for mod in model.modules()):
        model = plain_copy(model)   # copies of it must not call compiled code bound to the original
    selected = select(model, spec.layers, spec.drill)
    manifest: dict[str, Any] = {
        "format": FORMAT_VERSION, "name": spec.name, "test": spec.test, "tool_version": __version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "fingerprint": fingerprint(model), "model_class": type(model).__name__, "config": model_config(model),
        "seed": int(torch.initial_seed()), "dtypes": list(spec.dtypes),
        "layers": [{"name": s.name, "level": s.level, "primary": s.primary} for s in selected],
        "drill": spec.drill, "layer_patterns": list(spec.layers) if spec.layers else None,
        "sketch": spec.sketch, "autocast": autocast_dtype(home_device(model, device)),
        "reference_env": env or collect_env(str(home_device(model, device))), "rungs": {}, **spec.manifest_extra,
    }
    def producer(rung: str) -> Callable[[], dict[str, Any]]:
        def produce() -> dict[str, Any]:
            if rung != spec.dtypes[0]:
                _release_pinned()   # the previous rung is on disk: its host buffers can go
            if spec.sketch:
                manifest["rungs"][rung], tensors = _capture_rung_sketch(
                    model, args0, kwargs0, selected, rung, device, spec.tolerance.tf32, spec.sketch)
            else:
                manifest["rungs"][rung], tensors = _capture_rung(
                    model, args0, kwargs0, selected, rung, device, spec.tolerance.tf32, spec.extra_capture,
                    spec.profile)
            return tensors
        return produce

    # one rung at a time: each is written to disk before the next is captured
    try:
        store.write(spec.name, manifest, {rung: producer(rung) for rung in spec.dtypes}, overwrite=overwrite)
    finally:
        _release_pinned()
    return manifest


@contextlib.contextmanager
def _rung_failures(m: Any, rung: str, model_dtype: Any) -> Iterator[None]:
    """A failure of the rung's run on the reference is a CaptureError that names the rung, the
    model's own line and the likely cause: forwards patched on the instance (the likely cause where
    there are any), or an operator without a kernel in the rung's dtype where the rung casts the
    model to another dtype than its own."""
    try:
        yield
    except Exception as exc:
        from pytest_rocm_parity.errors import CaptureError, ParityError

        if isinstance(exc, ParityError):
            raise
        hint = patched_forwards(m, f"{rung} copy of the model")
        if not hint and model_dtype is not None and dt.to_torch(rung) != model_dtype:
            hint = (f" The model is in {dt.name_of(model_dtype)}: if it does not run in {rung} (an operator "
                    f"without a {rung} kernel), leave {rung} out of dtypes=, or cast up around that operator in "
                    f"the forward, as a model served in {rung} must.")
        raise CaptureError(f"the {rung} recording run of {type(m).__name__} failed: {type(exc).__name__}: "
                           f"{str(exc)[:300]}{_model_frame(exc)}.{hint} Nothing was written.") from exc


@contextlib.contextmanager
def no_random_draws(m: Any) -> Iterator[None]:
    """CaptureError where the forward run inside draws random numbers: its outputs then change from
    run to run and follow each backend's own random stream, so neither a golden nor a float64 truth
    (which draws its own numbers) can stand for them, and every judgement would measure the noise."""
    import torch

    from pytest_rocm_parity.errors import CaptureError

    gpus = torch.cuda.is_available() and torch.cuda.is_initialized()   # a forward on a GPU has set it up

    def states() -> list[Any]:
        return [torch.default_generator.get_state(), *(torch.cuda.get_rng_state_all() if gpus else [])]

    before = states()
    yield
    after = states()
    if any(not torch.equal(a, b) for a, b in zip(before, after)):
        which = "CPU" if not torch.equal(before[0], after[0]) else "GPU"
        raise CaptureError(
            f"the forward of {type(m).__name__} drew random numbers while it was recorded (torch's default "
            f"{which} generator advanced), so its outputs change from run to run and follow each backend's "
            f"own random stream: no golden can stand for them. Make the forward deterministic in eval mode "
            f"(noise and sampling only when self.training), or draw the noise outside and pass it in as an "
            f"input; nothing was written")


def _capture_rung(model: Any, args0: Any, kwargs0: Any, selected: list[Selected], rung: str,
                  device: str, tf32: bool, extra: Any = None, profile: bool = False) -> tuple[dict[str, Any], dict[str, Any]]:
    import torch

    dtype = dt.to_torch(rung)
    rdt = dt.to_torch(dt.residual_dtype_name(rung))
    tensors: dict[str, Any] = {}
    by_name = {s.name: s for s in selected}

    model_dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), None)
    m, was_training, args, kwargs = _rung_model_and_inputs(model, args0, kwargs0, device, dtype, tensors)
    state = BufferState(walk_model(m).modules)
    const_in = constant_leaves({"args": args, "kwargs": kwargs})
    try:
        with numerics(rung, tf32), no_random_draws(m), _rung_failures(m, rung, model_dtype):
            rec = recording_pass(m, selected, *_copies(args, kwargs))
            rec.pool.check_repeats()
            if not rec.pool.repeats_unchanged():   # a tensor handed on was written: record again, snapshotting repeats
                rec.pool.drop_device()
                state.restore()
                rec = recording_pass(m, selected, *_copies(args, kwargs), resnap=True)
            unread = ignored_masks(m, args, kwargs, rec.unread)
        extra_meta: dict[str, Any] = {}
        if extra is not None:
            state.restore()
            with numerics(rung, tf32):
                extra_meta, extra_t = extra(rung, m, *_copies(args, kwargs))
            tensors.update({f"extra/{k}": v.detach().to("cpu").contiguous() for k, v in extra_t.items()})
        if profile:
            from pytest_rocm_parity.reports.profiling import profile_shares

            state.restore()
            with numerics(rung, tf32):
                extra_meta["profile"] = profile_shares(m, *_copies(args, kwargs), home_device(m, device))
    finally:
        state.restore()   # the float64 truth is built from the model as its forward found it
        m.train(was_training)
    entries, outputs, order = rec.entries, rec.outputs, rec.order
    quant = _quantized_storage(m, tensors)
    rung_model = [m]
    del m
    tm, truth_dev = truth_model(model, device, dtype, rung_model)
    truth_state = BufferState(walk_model(tm).modules)
    pool = rec.pool
    pool.start_copies()            # they land while the device builds and runs the float64 truth
    targs, tkwargs = cast_inputs(args, kwargs, torch.float64, truth_dev)
    copies = HostCopies()         # the residuals' own copies, finished before the rung is returned

    def ref_of(key: str, p: str) -> Any:
        src = outputs["out"] if key == OUTPUT else entries[key]["out"]
        return pool.on(src[p], truth_dev)

    padding = Padding.of(tm, args, kwargs, unread=frozenset(unread))

    def put_truth(name: str, key: str, p: str, t: Any) -> None:
        if t.is_floating_point() or t.is_complex():
            ref = ref_of(key, p)
            _refuse_nonfinite(key, p, t, ref, padding)
            tensors[name] = residual(t, ref, rdt, copies)

    fetch, fdtype = _golden_input_fetch(pool, device, truth_dev)

    def truth_passes(put: Callable[[str, str, str, Any], None]) -> None:
        """The float64 truth, propagated (the whole model) and local (each level fed the golden
        inputs), every floating leaf handed to ``put(tensor name, call key, leaf, truth)``."""
        def store_gtruth(key: str, sel: Selected, out: Any) -> None:
            if sel.level == 0:  # propagated truth for top-level modules only: it locates first divergence
                for p, t in tensor_leaves(out).items():
                    put(f"gtruth/{key}/{p}", key, p, t)
            _finite_padding(key, out, padding)

        with torch.no_grad(), truth_errors(tm, selected):
            truth_state.restore()
            with Hooks(tm, selected, None, store_gtruth):
                tout = _run(tm, *_copies(targs, tkwargs))
            for p, t in tensor_leaves(tout).items():
                put(f"gtruth/{OUTPUT}/{p}", OUTPUT, p, t)
            del tout
            for level in sorted({s.level for s in selected}):
                direct: dict[str, Any] = {}

                def sub(key: str, sel: Selected, a: Any, kw: Any, level: int = level) -> Any:
                    if sel.level != level or key not in entries:
                        return None
                    keys = entries[key]["in"]
                    sa, skw = substitute(a, kw, keys, fetch, fdtype, KEEP_PLACEMENT)
                    if _same_shapes((a, kw), (sa, skw)):
                        return sa, skw
                    # The reference made this call with other shapes: a router that sent it other
                    # tokens, or an experts implementation that calls it once for all experts. Its
                    # truth is the module on the golden inputs, called on its own; the forward goes
                    # on with its own values, whose shapes the rest of it expects.
                    direct[key] = hooks.standalone(submodule(tm, sel.name), sa, skw)
                    return None

                def keep(key: str, sel: Selected, out: Any, level: int = level) -> None:
                    if sel.level == level and key in entries:
                        for p, t in tensor_leaves(direct.pop(key, out)).items():
                            put(f"truth/{key}/{p}", key, p, t)

                truth_state.restore()
                with Hooks(tm, selected, sub, keep) as hooks:
                    _run(tm, *_copies(targs, tkwargs))

    truth_passes(put_truth)
    copies.finish()
    quant_noise = _quantization_noise(tm, truth_passes, ref_of, tensors)
    del tm
    tensors.update(pool.tensors)
    merge_repeats(pool, entries, outputs, tensors)
    pool.drop_device()
    layers = [entries[k] for k in order if k in entries and "out" in entries[k]]
    for e in layers:
        e.pop("gtruth", None)
    meta = {"inputs": {"const": const_in, **({"unread": unread} if unread else {})},
            "layers": layers, **({"watch": [entries[k] for k in rec.watch]} if rec.watch else {}), "outputs": outputs,
            "truth_encoding": "residual", "truth_dtype": dt.name_of(rdt), "tf32": tf32, "order": order,
            "selected": sorted(by_name), "extra": extra_meta}
    if quant:
        meta["quant"], meta["quant_noise"] = quant, quant_noise
    return meta, tensors


def _quantization_noise(tm: Any, truth_passes: Callable[[Callable[[str, str, str, Any], None]], None],
                        ref_of: Callable[[str, str], Any], tensors: dict[str, Any]) -> dict[str, float]:
    """Per truth tensor, the RMS of what quantizing the activations changes in it (the truth run
    again with activation quantization off, quant.fp8.activations_unquantized): the error a correct
    candidate that quantizes its activations in another format may add (docs/fp8.md). Empty for a
    model without activation quantization."""
    import torch

    from pytest_rocm_parity.quant.fp8 import activations_unquantized

    noise: dict[str, float] = {}

    def put(name: str, key: str, p: str, t: Any) -> None:
        if name not in tensors or not t.is_floating_point():
            return
        ref = ref_of(key, p).to(t.device, torch.float64)
        d = t.to(torch.float64) - ref - tensors[name].to(t.device, torch.float64)   # unquantized - truth
        d = torch.where(torch.isfinite(d), d, torch.zeros_like(d))
        noise[name] = float(d.square().mean().sqrt()) if d.numel() else 0.0
        if key == OUTPUT:   # the model outputs' whole difference: what check_lm's metrics allow (llm/lm.py)
            tensors[f"qnoise/{OUTPUT}/{p}"] = d.to("cpu", tensors[name].dtype).contiguous()

    with activations_unquantized(tm) as any_quantized:
        if any_quantized:
            truth_passes(put)
    return noise


def _quantized_storage(m: Any, tensors: dict[str, Any] | None) -> dict[str, Any]:
    """The reference's quantized weights and scales (quant/storage.py), stored dtype-exact
    under quant/<module>/<tensor>: a replay tells from them whether the candidate's weights mean the
    same values (docs/fp8.md). {module: {"tensors": {name: key}, "format", "activation"}}."""
    from pytest_rocm_parity.quant.storage import scheme, quantized_storage

    out: dict[str, Any] = {}
    for mname, mod in m.named_modules():
        names = quantized_storage(mod)
        if not names:
            continue
        own = {**mod._parameters, **mod._buffers}
        keys: dict[str, str] = {}
        if tensors is not None:
            keys = {n: f"quant/{mname}/{n}" for n in names}
            tensors.update({k: own[n].detach().to("cpu", copy=True).contiguous() for n, k in keys.items()})
        fmt, act = scheme(mod) or ("", None)
        out[mname] = {"tensors": keys, "codes": next(n for n in names if own[n].element_size() == 1),
                      "format": fmt, "activation": act}
    return out


def merge_repeats(pool: RecordPool, entries: dict[str, dict[str, Any]], outputs: dict[str, Any],
                  tensors: dict[str, Any]) -> None:
    """A tensor recorded again unchanged (RecordPool.resolve) named by its first key; the recorded
    tensors renumbered t/0, t/1, ... in the order first seen, as a plain record of each distinct
    value would name them. In place: ``tensors`` (pool.tensors among them), the entries' and the
    model outputs' keys."""
    same = pool.resolve()
    for k in same:
        tensors.pop(k, None)
    name = numbered_in_order(tensors)
    moved = {name[k]: tensors.pop(k) for k in list(name)}
    name.update({k: name[root] for k, root in same.items()})
    tensors.update(moved)
    rename_tensor_keys([*entries.values(), outputs], name)


def numbered_in_order(keys: Any) -> dict[str, str]:
    """The recorded tensors' keys among ``keys`` (t/N) renumbered t/0, t/1, ... in their order: how a
    capture names them, and a golden derived from one (golden/derive.py)."""
    kept = sorted((k for k in keys if k.startswith("t/")), key=lambda k: int(k[2:]))
    return {k: f"t/{i}" for i, k in enumerate(kept)}


def rename_tensor_keys(entries: Any, name: dict[str, str]) -> None:
    """Each entry's ``in`` and ``out`` tensor keys renamed by ``name``, in place."""
    for e in entries:
        for side in ("in", "out"):
            if side in e:
                e[side] = {p: name.get(k, k) for p, k in e[side].items()}


def _same_shapes(call: Any, substituted: Any) -> bool:
    live, golden = tensor_leaves(call), tensor_leaves(substituted)
    return all(t.shape == golden[p].shape for p, t in live.items())


def _golden_input_fetch(pool: RecordPool, device: str, truth_dev: Any) -> tuple[Callable[[str], Any], Any]:
    """(fetch, dtype) for substitute: the recorded inputs, upcast to float64, for the local truth.

    On CUDA they are read where they are: the device snapshots of the recording, or those that
    streamed to pinned memory, sent back without blocking. Upcast on the device: a quarter of the
    bytes of a host-side float64 copy. Upcasting is exact, so the values are the same either way.
    """
    import torch

    if device == KEEP_PLACEMENT or torch.device(truth_dev).type != "cuda":
        return (lambda k: pool.on(k, "cpu")), torch.float64

    def fetch(k: str) -> Any:
        g = pool.on(k, truth_dev)
        if g.is_floating_point():
            return g.to(truth_dev, torch.float64, non_blocking=True)
        return g.to(truth_dev, non_blocking=True, copy=True)   # never the snapshot itself: the model may write it
    return fetch, None


def _copies(args: Any, kwargs: Any) -> tuple[Any, Any]:
    """Fresh copies of the inputs for one pass. Why: a model may write its inputs (through a pointer
    no version counter sees, too), and every pass of a capture (the recordings, the float64 truth)
    must run on the inputs the golden stores, which the replay feeds; the caller's tensors stay
    untouched."""
    def fresh(_p: str, t: Any) -> Any:
        return t.clone()
    return map_tensors(args, fresh), map_tensors(kwargs, fresh)


def _rung_model_and_inputs(model: Any, args0: Any, kwargs0: Any, device: str, dtype: Any,
                           tensors: dict[str, Any]) -> tuple[Any, bool, Any, Any]:
    """The rung's model in eval mode and its cast inputs, which are stored exactly under input/."""
    m = prepare_model(model, device, dtype)
    was_training = m.training
    m.eval()
    args, kwargs = cast_inputs(args0, kwargs0, dtype, home_device(m, device))
    for path, t in tensor_leaves({"args": args, "kwargs": kwargs}).items():
        # a copy: the forward may write its inputs, and the golden keeps them as they were before it
        tensors[f"input/{path}"] = t.detach().to("cpu", copy=True).contiguous()
    return m, was_training, args, kwargs


def truth_model(model: Any, device: str, dtype: Any, rung: list[Any]) -> tuple[Any, Any]:
    """The rung's model in float64 (weights already rounded to the rung: only arithmetic differs).

    ``rung`` holds the rung's model and is emptied here; with no other reference left, the rung's
    device copy is freed before a float64 copy built through the host lands on the device. The
    float64 model is built on the device when it fits beside the rung's (no host memory at all),
    else through one host copy in the rung's dtype, tensor by tensor. Casting to float64 is exact,
    so both routes give the same weights.
    """
    import torch

    if device == KEEP_PLACEMENT:   # a split model keeps its split in float64 too
        rung.clear()
        tm = cast_module(copy.deepcopy(prepare_model(model, device, dtype)), dtype=torch.float64).eval()
        float64_kernels(tm)
        return tm, home_device(tm, device)
    truth_dev = device if _supports_f64(device) else "cpu"
    m = rung.pop()
    if truth_on_device(m, truth_dev):
        tm = _copy_tensors(m, lambda t, quantized: t.to(device=truth_dev, copy=True) if quantized
                           else _widened(t.to(device=truth_dev)))
    else:
        tm = _copy_tensors(m, lambda t, _quantized: t.to("cpu", copy=True))
    del m
    # catches what the copy left in the rung's dtype (parameter subclasses); a no-op otherwise
    tm = cast_module(tm, truth_dev, torch.float64).eval()
    float64_kernels(tm)
    return tm, truth_dev


# Kernels without a float64 version, and the implementation of the same function the float64 truth
# uses instead (docs/migrations.md): Hugging Face's MoE experts ("grouped_mm": torch._grouped_mm takes
# float32/bf16/fp16 only) and FlexAttention (no float64 on the CPU).
TRUTH_EXPERTS = "eager"
TRUTH_ATTENTION = {"flex_attention": "sdpa"}


def float64_kernels(tm: Any) -> None:
    """Switch the float64 truth model to implementations that run in float64, where Hugging Face
    lets a model choose them. The truth is what the module computes; the reference and the candidate
    keep their own kernels."""
    get_experts = getattr(tm, "get_experts_implementation", None)
    if callable(get_experts):
        try:
            impls = get_experts()
            if any(v not in (None, TRUTH_EXPERTS) for v in impls.values()):
                tm.set_experts_implementation({k: TRUTH_EXPERTS for k in impls})
        except (ValueError, AttributeError, TypeError):
            pass
    cfg = getattr(tm, "config", None)
    attn = getattr(cfg, "_attn_implementation", None)
    if attn in TRUTH_ATTENTION and callable(getattr(tm, "set_attn_implementation", None)):
        try:
            tm.set_attn_implementation(TRUTH_ATTENTION[attn])
        except (ValueError, AttributeError, TypeError, ImportError):
            pass


def truth_on_device(m: Any, truth_dev: Any) -> bool:
    """Whether the float64 copy of ``m`` fits on ``truth_dev`` beside ``m`` (and its activations)."""
    import torch

    if TRUTH_ON_DEVICE is not None:
        return TRUTH_ON_DEVICE
    dev = torch.device(truth_dev)
    if dev.type == "cpu":
        return True
    if dev.type != "cuda":
        return False   # no free-memory query there: through the host, as before
    need = sum(t.numel() * (8 if t.is_floating_point() or t.is_complex() else t.element_size())
               for t in itertools.chain(m.parameters(), m.buffers()))
    free, _total = torch.cuda.mem_get_info(dev)
    cached = torch.cuda.memory_reserved(dev) - torch.cuda.memory_allocated(dev)
    return free + cached >= need * (1 + _TRUTH_MARGIN) + _TRUTH_SLACK_BYTES


def _widened(t: Any) -> Any:
    """A new float64 tensor of ``t``, converted as Module.to(dtype=float64) converts (others copied)."""
    import torch

    if t.is_floating_point() or t.is_complex():
        return t.to(dtype=torch.float64, copy=True)
    return t.clone()


def _copy_tensors(m: Any, fn: Callable[[Any, bool], Any]) -> Any:
    """A deep copy of ``m`` whose parameters and buffers are ``fn(tensor)``, made one tensor at a time.

    ``copy.deepcopy(m).to(...)`` holds two full copies at its peak; handing deepcopy the converted
    tensors through its memo allocates only the new model. A weight tied in ``m`` is one memo entry,
    so it stays tied. Parameter and buffer subclasses are left to deepcopy.
    """
    import torch

    memo: dict[int, Any] = {}
    kept = quantized_tensor_ids(m.modules())   # fn's second argument: quantized storage, not cast
    for p in m.parameters():
        if type(p) is torch.nn.Parameter:
            memo[id(p)] = torch.nn.Parameter(fn(p.detach(), id(p) in kept), requires_grad=p.requires_grad)
    for b in m.buffers():
        if type(b) is torch.Tensor:
            memo[id(b)] = fn(b.detach(), id(b) in kept)
    return copy.deepcopy(m, memo)


def _capture_rung_sketch(model: Any, args0: Any, kwargs0: Any, selected: list[Selected], rung: str,
                         device: str, tf32: bool, group: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """Reference and float64-truth sketches of every selected module's outputs (no inputs kept)."""
    import torch

    from pytest_rocm_parity.golden.sketch import WHOLE_BELOW_GROUPS, leaf_group, sketch

    dtype = dt.to_torch(rung)
    tensors: dict[str, Any] = {}
    entries: dict[str, dict[str, Any]] = {}

    def keep(prefix: str, key: str, out: Any, into: dict[str, str], exact: bool = True) -> None:
        """Sketch each floating leaf under ``prefix``; with ``exact``, keep the others whole (the
        reference's: the truth's router indices are not what the rung computed)."""
        for p, t in tensor_leaves(out).items():
            if t.is_floating_point() or t.is_complex():
                name = f"{prefix}/{key}/{p}"
                tensors[name] = sketch(t, leaf_group(t.numel(), group), f"{key}/{p}").cpu()
            elif not exact:
                continue
            else:
                name = f"x/{key}/{p}"
                tensors[name] = t.detach().to("cpu", copy=True).contiguous()
            into[p] = name

    def rec_out(key: str, sel: Selected, out: Any) -> None:
        entries[key] = {"name": sel.name, "key": key, "level": sel.level, "primary": sel.primary,
                        "in": {}, "out": {}, "const_in": {}, "const_out": constant_leaves(out)}
        keep("sk", key, out, entries[key]["out"])
        _record_fields(entries[key], entries[key]["out"])

    m, was_training, args, kwargs = _rung_model_and_inputs(model, args0, kwargs0, device, dtype, tensors)
    state = BufferState(walk_model(m).modules)
    try:
        with numerics(rung, tf32), no_random_draws(m), Hooks(m, selected, None, rec_out) as hooks:
            out = _run(m, *_copies(args, kwargs))
            order = list(hooks.order)
        outputs: dict[str, Any] = {"out": {}, "const": constant_leaves(out)}
        keep("sk", OUTPUT, out, outputs["out"])
        _record_fields(outputs, outputs["out"])
        del out
    finally:
        state.restore()
        m.train(was_training)
    quant = _quantized_storage(m, None)   # what each module is, not its tensors: a sketch stays small
    rung_model = [m]
    del m
    tm, truth_dev = truth_model(model, device, dtype, rung_model)
    truth_state = BufferState(walk_model(tm).modules)
    targs, tkwargs = cast_inputs(args, kwargs, torch.float64, truth_dev)
    truth_names: dict[str, str] = {}
    with torch.no_grad(), Hooks(tm, selected, None, lambda k, s, o: keep("skt", k, o, truth_names, exact=False)):
        tout = _run(tm, *_copies(targs, tkwargs))
        keep("skt", OUTPUT, tout, truth_names, exact=False)
    del tout
    truth_state.restore()
    noise = _sketch_quantization_noise(tm, selected, targs, tkwargs, tensors, group)
    del tm
    layers = [entries[k] for k in order if k in entries]
    meta = {"inputs": {"const": constant_leaves({"args": args, "kwargs": kwargs})}, "layers": layers,
            "outputs": outputs, "truth_encoding": "sketch", "sketch": group, "whole_below": WHOLE_BELOW_GROUPS,
            "tf32": tf32, "order": order,
            "selected": sorted(s.name for s in selected), "extra": {}}
    if quant:
        meta["quant"], meta["quant_noise"] = quant, noise
    return meta, tensors


def _sketch_quantization_noise(tm: Any, selected: list[Selected], targs: Any, tkwargs: Any,
                               tensors: dict[str, Any], group: int) -> dict[str, float]:
    """_quantization_noise for a sketch golden: per output, the RMS over its sketch of what turning
    activation quantization off changes (keyed gtruth/<call>/<leaf>, as the propagated truth is)."""
    import torch

    from pytest_rocm_parity.golden.sketch import leaf_group, sketch
    from pytest_rocm_parity.quant.fp8 import activations_unquantized

    noise: dict[str, float] = {}

    def put(key: str, out: Any) -> None:
        for p, t in tensor_leaves(out).items():
            stored = tensors.get(f"skt/{key}/{p}")
            if stored is None or not t.is_floating_point():
                continue
            d = sketch(t, leaf_group(t.numel(), group), f"{key}/{p}").cpu().to(torch.float64) - stored.to(torch.float64)
            d = torch.where(torch.isfinite(d), d, torch.zeros_like(d))
            noise[f"gtruth/{key}/{p}"] = float(d.square().mean().sqrt()) if d.numel() else 0.0

    with activations_unquantized(tm) as any_quantized:
        if any_quantized:
            with torch.no_grad(), Hooks(tm, selected, None, lambda k, s, o: put(k, o)):
                put(OUTPUT, _run(tm, *_copies(targs, tkwargs)))
    return noise


def residual(truth: Any, ref: Any, rdt: Any, copies: HostCopies | None = None) -> Any:
    """The float64 truth stored as its difference from the reference: half the bytes, same statistics.

    The residual is as small as the reference's error, so rounding it to ``rdt`` perturbs the
    error statistics by one rounding of the error (2^-9 relative for bfloat16), not of the value.
    A CUDA truth is differenced on its device (``ref`` goes there from pinned memory) and only the
    rounded residual is copied back through ``copies``: float64 subtraction and one rounding are
    exact IEEE operations, so the bytes are those of the host computation.
    """
    import torch

    if truth.is_complex() or ref.is_complex():
        wide = torch.complex128
        narrow = torch.complex128 if rdt == torch.float64 else torch.complex64
    else:
        wide, narrow = torch.float64, rdt
    if copies is None or not truth.is_cuda:
        d = truth.detach().to("cpu", wide) - ref.detach().to("cpu", wide)
        return d.to(narrow).contiguous()
    d = truth.detach().to(wide) - ref.to(truth.device, non_blocking=True).to(wide)
    return copies.copy(d.to(narrow), snapshot=False)


def _finite_padding(key: str, out: Any, padding: Padding | None) -> None:
    """Non-finite values of ``out`` at padded positions set to 0, in place (the float64 truth model's
    own tensors). Why: a fully masked softmax row (left padding, eager attention) is NaN in float64;
    handed on, 0 x NaN spreads it into every position of the next attention. Padded positions are not
    judged, so what they hold in the truth does not matter as long as it is finite."""
    import torch

    if padding is None:
        return None
    for p, t in tensor_leaves(out).items():
        pad = padding.padded(key, p, t) if t.is_floating_point() else None
        if pad is None:
            continue
        bad = pad & ~torch.isfinite(t)
        if bool(bad.any()):
            t.masked_fill_(bad, 0.0)
    return None


def _refuse_nonfinite(key: str, leaf: str, truth: Any, ref: Any, padding: Padding | None) -> None:
    """A float64 truth must be finite wherever the reference is (padded positions aside): a NaN there
    would make every candidate pass or fail for no reason of its own."""
    import torch

    if truth.is_complex() or ref.is_complex() or tuple(truth.shape) != tuple(ref.shape):
        return
    bad = ~torch.isfinite(truth) & torch.isfinite(ref.to(truth.device))
    pad = padding.padded(key, leaf, truth) if padding is not None else None
    if pad is not None:
        bad = bad & ~pad
    n = int(bad.sum())
    if n:
        from pytest_rocm_parity.errors import CaptureError

        first = [int(i) for i in bad.nonzero()[0]]
        raise CaptureError(
            f"the float64 truth of {key} (output {leaf}) is not finite at {n} element(s) where the reference "
            f"is finite (first at {first}); the golden would judge nothing there. Usually a mask built in "
            f"float64 overflows: capture with another attention implementation (attn_implementation=\"sdpa\"), "
            f"or select fewer layers around {key} with layers=[...]")


@contextlib.contextmanager
def truth_errors(tm: Any, selected: list[Selected]) -> Iterator[None]:
    """An exception of the float64 truth run as a CaptureError naming the innermost selected module
    that was running (a kernel without float64 support: grouped_mm experts, flex_attention on the CPU)."""
    stack: list[str] = []
    handles = []

    def leave(_m: Any, _a: Any, _o: Any) -> None:   # None: a forward hook's return replaces the output
        if stack:
            stack.pop()
    for sel in selected:
        mod = tm.get_submodule(sel.name) if sel.name else tm
        handles.append(mod.register_forward_pre_hook(lambda _m, _a, n=sel.name: stack.append(n)))
        handles.append(mod.register_forward_hook(leave))
    try:
        yield
    except Exception as exc:
        from pytest_rocm_parity.errors import CaptureError, ParityError

        if isinstance(exc, ParityError):
            raise
        where = stack[-1] if stack else type(tm).__name__
        hint = patched_forwards(tm, "float64 copy")
        raise CaptureError(
            f"the float64 truth run failed in {where}: {type(exc).__name__}: {str(exc)[:300]}{_model_frame(exc)}.{hint} "
            f"The plugin runs the whole model in float64 on {_device_of(tm)} for its truth, every module its "
            f"forward calls, whatever layers= selects. Usual causes: a kernel without a float64 version there, "
            f"or code that assumes the reference's dtype (a cast to it, a dtype check). Fix: capture with an "
            f"implementation that runs in float64 (Hugging Face: attn_implementation=\"sdpa\" instead of "
            f"flex_attention; experts_implementation=\"eager\" for MoE experts; the candidate may still use "
            f"the fast kernel), or give the custom op a float64 path (a reference implementation it falls back "
            f"to for float64); docs/migrations.md lists the known cases.") from exc
    finally:
        for h in handles:
            h.remove()


def patched_forwards(m: Any, copy_name: str) -> str:
    """' NAMES have forwards assigned on the instance: ...' where ``m`` has any, else ''. Such a forward
    (m.forward = lambda x: ...) is copied as the same function: its closure still calls the original
    model's modules, in the reference's dtype, which a rung's or the truth's copy does not expect."""
    patched = [n or type(m).__name__ for n, sub in m.named_modules()
               if "forward" in vars(sub) and not getattr(vars(sub)["forward"], "parity_wrapper", False)]
    if not patched:
        return ""
    return (f" {', '.join(patched[:3])}{' ...' if len(patched) > 3 else ''} "
            f"{'have forwards' if len(patched) > 1 else 'has a forward'} assigned on the instance: the {copy_name} "
            f"calls the same function, whose closure may hold the original modules and their weights in the "
            f"reference's dtype; make the patch a module (a wrapper nn.Module or a subclass) so that copies carry it.")


def _model_frame(exc: BaseException) -> str:
    """' (at file:line: code)' of the innermost frame outside torch and this plugin: where the model's
    own code was when it failed (the traceback itself is chained, but pytest shows it last)."""
    import os
    import traceback

    import torch

    skip = (os.path.dirname(torch.__file__), os.path.dirname(os.path.dirname(__file__)))
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith(skip)]
    if not frames:
        return ""
    f = frames[-1]
    return f" (at {f.filename}:{f.lineno}: {(f.line or '').strip()[:120]})"


def _device_of(m: Any) -> str:
    p = next(iter(m.parameters()), None)
    return str(p.device) if p is not None else "cpu"


def _supports_f64(device: str) -> bool:
    return not str(device).startswith("mps")
