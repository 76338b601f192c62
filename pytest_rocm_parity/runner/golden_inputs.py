"""The golden inputs handed to the module calls of one level, each call its own copy.

Why a copy: a module may write its input, by torch ops or through a raw pointer (a hand-written
Triton or hipified kernel, numpy) that no version counter sees, and what the reader holds must
stay the golden for every later call. Why all at once: a copy per input costs an allocation and a
launch, most of what swapping in the golden inputs adds to a pass on a GPU host; the held inputs
of a level are copied into one buffer per dtype by one multi-tensor copy
(docs/performance.md#what-a-fast-pass-spends-on-the-gpu-host).
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pytest_rocm_parity.golden.store import RungReader

# Where each copy starts in its buffer: the caching allocator's alignment, so that a kernel picks
# the same (vectorised, or on the CPU SIMD) path on the copy as on the freshly allocated tensor the
# capture ran on, and the replay on the capture's machine stays bit-exact
ALIGN_BYTES = 512
# The most a level holds copied ahead of its calls: a deep level of a large model has gigabytes of
# inputs, and a call's copy used to live only as long as the call
AHEAD_BYTES = 256 << 20


class GoldenInputs:
    """The golden value of each (call key, input path) of a level, a copy made for one use.

    plan() names the level's inputs in call order; take() hands out each input's copy once, and
    copies the held inputs from that one on together (up to ``ahead_bytes``) when it finds none ready.
    An input taken again (a call made a second time) or not held by the reader (read lazily from
    the file) is copied, or read, on its own.
    """

    def __init__(self, reader: RungReader, layers: dict[str, dict[str, Any]], ahead_bytes: int = AHEAD_BYTES) -> None:
        self.reader, self.layers, self.ahead_bytes = reader, layers, ahead_bytes
        self.order: list[tuple[str, str]] = []
        self.index: dict[tuple[str, str], int] = {}
        self.ready: dict[tuple[str, str], Any] = {}
        self.taken: set[tuple[str, str]] = set()

    def plan(self, pairs: Iterable[tuple[str, str]]) -> None:
        """The (call key, input path) pairs of the level about to run, in call order."""
        self.order = list(pairs)
        self.index = {p: i for i, p in enumerate(self.order)}
        self.ready.clear()
        self.taken.clear()

    def take(self, key: str, path: str) -> Any:
        """The golden value of input ``path`` of call ``key``, for this call alone."""
        pair = (key, path)
        hit = self.ready.pop(pair, None)
        if hit is None and pair in self.index and pair not in self.taken:
            self._copy_from(self.index[pair])
            hit = self.ready.pop(pair, None)
        self.taken.add(pair)
        if hit is not None:
            return hit
        gk = self.layers[key]["in"][path]
        t = self.reader.get(gk)
        return t.clone() if self.reader.holds(gk) else t

    def _copy_from(self, first: int) -> None:
        """The held inputs from ``first`` on in call order, copied together: one buffer and one
        multi-tensor copy per dtype and device."""
        import torch

        self.ready.clear()
        reader, total = self.reader, 0
        groups: dict[tuple[Any, Any], list[tuple[tuple[str, str], Any]]] = {}
        for pair in self.order[first:]:
            gk = self.layers[pair[0]]["in"][pair[1]]
            if pair in self.taken or not reader.holds(gk):
                continue
            t = reader.get(gk)
            if not t.is_contiguous():
                continue
            size = t.numel() * t.element_size()
            if groups and total + size > self.ahead_bytes:
                break
            total += size
            groups.setdefault((t.dtype, t.device), []).append((pair, t))
        for (dtype, device), items in groups.items():
            step = max(1, ALIGN_BYTES // items[0][1].element_size())
            offsets, n = [], 0
            for _, t in items:
                offsets.append(n)
                n += -(-t.numel() // step) * step
            buf = torch.empty(n, dtype=dtype, device=device)
            dst = [buf.as_strided(t.shape, t.stride(), off) for (_, t), off in zip(items, offsets)]
            src = [t for _, t in items]
            try:
                torch._foreach_copy_(dst, src)
            except (RuntimeError, NotImplementedError, AttributeError):   # a dtype without a foreach kernel
                for d, s in zip(dst, src):
                    d.copy_(s)
            self.ready.update(zip((pair for pair, _ in items), dst))
