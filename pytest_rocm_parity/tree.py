"""Flatten nested outputs (tuples, dicts, ModelOutput, dataclasses) into named tensor leaves.

Leaf paths are stable strings ("0", "logits", "1.0") so a golden written on one
machine names the same leaves on another.  Non-tensor leaves are kept as JSON
constants so structure changes are detected, never compared numerically.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from typing import Any


def _is_tensor(x: Any) -> bool:
    import torch

    return isinstance(x, torch.Tensor)


def iter_leaves(obj: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Yield (path, leaf) pairs in a deterministic order."""
    if _is_tensor(obj):
        yield prefix or "0", obj
        return
    join = (lambda k: f"{prefix}.{k}" if prefix else str(k))
    if isinstance(obj, Mapping) or (hasattr(obj, "keys") and hasattr(obj, "__getitem__") and not isinstance(obj, (str, bytes))):
        # ModelOutput is an OrderedDict subclass: its keys skip None fields.
        for k in list(obj.keys()):
            yield from iter_leaves(obj[k], join(k))
    elif isinstance(obj, (tuple, list)):
        for i, v in enumerate(obj):
            yield from iter_leaves(v, join(i))
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            yield from iter_leaves(getattr(obj, f.name), join(f.name))
    else:
        yield prefix or "0", obj


def tensor_leaves(obj: Any) -> dict[str, Any]:
    return {p: v for p, v in iter_leaves(obj) if _is_tensor(v)}


def constant_leaves(obj: Any) -> dict[str, Any]:
    """Non-tensor leaves as JSON-able summaries (type name for opaque objects)."""
    out: dict[str, Any] = {}
    for p, v in iter_leaves(obj):
        if _is_tensor(v):
            continue
        out[p] = v if isinstance(v, (type(None), bool, int, float, str)) else f"<{type(v).__name__}>"
    return out


def map_tensors(obj: Any, fn: Callable[[str, Any], Any], prefix: str = "") -> Any:
    """Rebuild ``obj`` with each tensor leaf replaced by fn(path, tensor)."""
    if _is_tensor(obj):
        return fn(prefix or "0", obj)
    join = (lambda k: f"{prefix}.{k}" if prefix else str(k))
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(map_tensors(v, fn, join(i)) for i, v in enumerate(obj)))
    if isinstance(obj, (tuple, list)):
        return type(obj)(map_tensors(v, fn, join(i)) for i, v in enumerate(obj))
    if isinstance(obj, dict):
        new = obj.copy()
        for k in list(obj.keys()):
            new[k] = map_tensors(obj[k], fn, join(k))
        return new
    return obj
