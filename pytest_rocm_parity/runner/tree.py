"""Flatten nested outputs (tuples, dicts, ModelOutput, dataclasses) into named tensor leaves.

Leaf paths are stable strings ("0", "logits", "1.0") so a golden written on one
machine names the same leaves on another.  Non-tensor leaves are kept as JSON
constants so structure changes are detected, never compared numerically.

iter_leaves and map_tensors walk the same containers in the same order, so a path
found by one is the path the other rebuilds.  Two leaves that would share a path
(``{"a.b": x, "a": {"b": y}}``, ``{0: x, "0": y}``) are refused rather than one of
them silently going unchecked, and a container that contains itself ends the walk
as an opaque leaf.
"""
from __future__ import annotations

import copy
import dataclasses
import enum
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from pytest_rocm_parity.errors import InvalidArgument


def _is_tensor(x: Any) -> bool:
    import torch

    return isinstance(x, torch.Tensor)


def _is_mapping(obj: Any) -> bool:
    # ModelOutput is an OrderedDict subclass; other mapping-likes only need keys() and [].
    return isinstance(obj, Mapping) or (hasattr(obj, "keys") and hasattr(obj, "__getitem__")
                                        and not isinstance(obj, (str, bytes, type)))


def _is_dataclass_instance(obj: Any) -> bool:
    return dataclasses.is_dataclass(obj) and not isinstance(obj, type)


def walk_leaves(obj: Any, prefix: str, seen: frozenset[int], kinds: dict[str, str] | None = None) -> Iterator[tuple[str, Any]]:
    if _is_tensor(obj):
        yield prefix or "0", obj
        return
    container = isinstance(obj, (tuple, list)) or _is_mapping(obj) or _is_dataclass_instance(obj)
    if container and id(obj) in seen:
        if kinds is not None and prefix:
            kinds[prefix] = "other"
        yield prefix or "0", obj   # a cycle: stop here, the leaf is summarised as a constant
        return
    if container and kinds is not None and prefix:
        t = type(obj)
        plain_dict = t is dict and all(type(k) is str and "." not in k for k in obj)
        kinds[prefix] = t.__name__ if t in (tuple, list) else "dict" if plain_dict else "other"
    seen = seen | {id(obj)} if container else seen
    join = (lambda k: f"{prefix}.{k}" if prefix else str(k))
    if _is_mapping(obj):
        for k in list(obj.keys()):
            yield from walk_leaves(obj[k], join(k), seen, kinds)
    elif isinstance(obj, (tuple, list)):
        for i, v in enumerate(obj):
            yield from walk_leaves(v, join(i), seen, kinds)
    elif _is_dataclass_instance(obj):
        for f in dataclasses.fields(obj):
            yield from walk_leaves(getattr(obj, f.name), join(f.name), seen, kinds)
    else:
        yield prefix or "0", obj


def iter_leaves(obj: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Yield (path, leaf) pairs in a deterministic order; InvalidArgument if two share a path."""
    paths: set[str] = set()
    for path, leaf in walk_leaves(obj, prefix, frozenset()):
        if path in paths:
            raise InvalidArgument(
                f"two leaves of an input or output share the path {path!r} (a key containing '.' or keys "
                f"like 0 and '0'), so one of them could not be checked; rename the key")
        paths.add(path)
        yield path, leaf


def tensor_leaves(obj: Any) -> dict[str, Any]:
    return {p: v for p, v in iter_leaves(obj) if _is_tensor(v)}


def named_fields(paths: Iterable[str]) -> list[str]:
    """The top-level fields of leaf ``paths`` in their order, where any is a name (a ModelOutput or a
    dict); [] where all are positions. A manifest's JSON sorts its keys, so capture records this
    order: a replay that gets the output as a tuple (``return_dict=False``) matches the fields to
    its items by it, as ModelOutput.to_tuple orders them."""
    tops = top_level(paths)
    return [] if all(t.isdigit() for t in tops) else tops


def top_level(paths: Iterable[str]) -> list[str]:
    """The top-level items of leaf ``paths`` (field names or positions), in their order."""
    return list(dict.fromkeys(p.split(".", 1)[0] for p in paths))


def constant_leaves(obj: Any) -> dict[str, Any]:
    """Non-tensor leaves as JSON-able summaries (type name for opaque objects)."""
    return split_leaves(obj)[1]


def _const(v: Any) -> Any:
    if isinstance(v, (type(None), bool, int, float, str)):   # an IntEnum or a StrEnum by its value
        return v
    if isinstance(v, enum.Enum):   # a mode switch: which member is what the forward computes by
        return f"<{type(v).__name__}.{v.name}>"
    return f"<{type(v).__name__}>"


def same_constant(recorded: Any, now: Any) -> bool:
    """Whether a constant leaf as a golden recorded it is ``now``'s: NaN is NaN, and an enum member
    recorded by its type alone (``<Act>``, by goldens written before members were recorded) is any
    member of that type."""
    if recorded == now:
        return True
    if isinstance(recorded, float) and isinstance(now, float):
        return recorded != recorded and now != now
    return (isinstance(recorded, str) and isinstance(now, str) and recorded.startswith("<") and recorded.endswith(">")
            and "." not in recorded and now.startswith(recorded[:-1] + "."))


def split_leaves(obj: Any, kinds: dict[str, str] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(tensor_leaves(obj), constant_leaves(obj)) in one walk: hooks call this on every module.

    ``kinds``: filled with the kind of every container below the root, by path (CONTAINER_KINDS),
    so that a module's call can be rebuilt from its recorded leaves.

    Why a second walker: the recording hook runs this on every module call of a forward that is often
    bound by the host, and the generic walk (a generator per container, a frozenset per level) costs
    tens of microseconds a call. Plain tuples, lists and str-keyed dicts take the fast path; anything
    else, and any path collision, is left to iter_leaves, which decides (and raises) as always.
    """
    tensors: dict[str, Any] = {}
    consts: dict[str, Any] = {}
    try:
        import torch

        count = _fast_split(obj, "", tensors, consts, kinds, torch.Tensor, 0)
        if count == len(tensors) + len(consts):
            return tensors, consts
    except _Generic:
        pass
    tensors.clear()
    consts.clear()
    if kinds is not None:
        kinds.clear()
    for p, v in walk_leaves(obj, "", frozenset(), kinds):
        if p in tensors or p in consts:
            list(iter_leaves(obj))   # raises the shared-path error
        if _is_tensor(v):
            tensors[p] = v
        else:
            consts[p] = _const(v)
    return tensors, consts


# Container kinds recorded beside a module's inputs: what a rebuild can make exactly. "other": a
# mapping-like, dataclass, named tuple, dict with non-str or dotted keys, or a cycle.
CONTAINER_KINDS = ("tuple", "list", "dict", "other")
_PLAIN = (type(None), bool, int, float, str)


class _Generic(Exception):
    """Not a plain container: the generic walk takes over."""


def _fast_split(obj: Any, prefix: str, tensors: dict[str, Any], consts: dict[str, Any],
                kinds: dict[str, str] | None, tensor_type: type, depth: int) -> int:
    """split_leaves' fast path; the number of leaves it met (a shortfall in the dicts is a collision)."""
    if isinstance(obj, tensor_type):
        tensors[prefix or "0"] = obj
        return 1
    t = type(obj)
    if t in _PLAIN:
        consts[prefix or "0"] = obj
        return 1
    if depth > 32:
        raise _Generic()   # deep or cyclic: the generic walk ends cycles
    if t is tuple or t is list:
        if kinds is not None and prefix:
            kinds[prefix] = t.__name__
        n = 0
        for i, v in enumerate(obj):
            n += _fast_split(v, f"{prefix}.{i}" if prefix else str(i), tensors, consts, kinds, tensor_type, depth + 1)
        return n
    if t is dict:
        if kinds is not None and prefix:
            kinds[prefix] = "dict" if all(type(k) is str and "." not in k for k in obj) else "other"
        n = 0
        for k, v in obj.items():
            n += _fast_split(v, f"{prefix}.{k}" if prefix else str(k), tensors, consts, kinds, tensor_type, depth + 1)
        return n
    if _is_mapping(obj) or isinstance(obj, (tuple, list)) or _is_dataclass_instance(obj):
        raise _Generic()
    consts[prefix or "0"] = _const(obj)
    return 1


def map_tensors(obj: Any, fn: Callable[[str, Any], Any], prefix: str = "") -> Any:
    """Rebuild ``obj`` with each tensor leaf replaced by fn(path, tensor).

    Walks exactly the containers iter_leaves walks (dataclasses and mapping-likes too),
    so every tensor that tensor_leaves names is the one replaced here.
    """
    return _map(obj, fn, prefix, frozenset(), _is_tensor)


def _is_float(x: Any) -> bool:
    return isinstance(x, float)


def floats_as_tensors(obj: Any) -> Any:
    """``obj`` with each Python float leaf (a ``loss.item()`` among a model's outputs) made a 0-d
    float64 tensor, on the device of the output's first tensor: a computed number is judged like
    any output, where as a constant it would go unchecked."""
    import torch

    def made(path: str, v: float) -> Any:
        tensors = tensor_leaves(obj) if path != "0" or not isinstance(obj, float) else {}
        device = next(iter(tensors.values())).device if tensors else "cpu"
        return torch.tensor(v, dtype=torch.float64, device=device)

    return _map(obj, made, "", frozenset(), _is_float)


def _map(obj: Any, fn: Callable[[str, Any], Any], prefix: str, seen: frozenset[int],
         leaf: Callable[[Any], bool]) -> Any:
    if leaf(obj):
        return fn(prefix or "0", obj)
    container = isinstance(obj, (tuple, list)) or _is_mapping(obj) or _is_dataclass_instance(obj)
    if not container or id(obj) in seen:
        return obj
    seen = seen | {id(obj)}
    join = (lambda k: f"{prefix}.{k}" if prefix else str(k))
    if _is_mapping(obj):
        new = {k: _map(obj[k], fn, join(k), seen, leaf) for k in list(obj.keys())}
        if all(new[k] is obj[k] for k in new):
            return obj
        if isinstance(obj, dict):
            out = obj.copy()
            for k, v in new.items():
                out[k] = v
            return out
        try:
            return type(obj)(new)
        except Exception:   # a mapping-like that cannot be rebuilt from a dict stays as it was
            return obj
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(_map(v, fn, join(i), seen, leaf) for i, v in enumerate(obj)))
    if isinstance(obj, (tuple, list)):
        return type(obj)(_map(v, fn, join(i), seen, leaf) for i, v in enumerate(obj))
    # a dataclass instance: a shallow copy with its fields replaced (works for frozen ones too)
    out = copy.copy(obj)
    for f in dataclasses.fields(obj):
        object.__setattr__(out, f.name, _map(getattr(obj, f.name), fn, join(f.name), seen, leaf))
    return out


def aligned_leaves(got: dict[str, Any], entry: dict[str, Any]) -> dict[str, Any]:
    """The candidate's output leaves ``got`` named as the golden's (``entry``: its ``out`` leaf paths
    and the ``fields`` order capture recorded) where the two differ by calling convention alone: a
    tuple where the golden holds a ModelOutput (``return_dict=False``), or the reverse. Their
    top-level items are matched by position, as ModelOutput.to_tuple orders the fields that are set
    (a golden without ``fields`` has only its sorted names to go by)."""
    wanted = list(entry["out"])
    if not got or all(p in got for p in wanted):
        return got
    g, w = named_fields(got), entry.get("fields") or named_fields(wanted)
    if bool(g) == bool(w):   # both named, or both positional: nothing to align
        return got
    if not g:
        g = _positions(got)
    else:
        w = _positions(wanted)
    rename = dict(zip(g, w))
    out = {}
    for p, t in got.items():
        top, dot, rest = p.partition(".")
        out[rename.get(top, top) + dot + rest] = t
    return out


def _positions(paths: Any) -> list[str]:
    """The top-level positions of positional leaf paths, in order (a manifest sorts "10" before "2")."""
    return sorted(dict.fromkeys(p.split(".", 1)[0] for p in paths), key=int)
