"""Quantized storage: the tensors of a quantized module that are the checkpoint itself.

Why a rule of its own: every place the runner casts a model for a rung (the reference's copy, the
float64 truth, the candidate cast in place) must leave FP8 codes and their float32 scales as they
are, and the fingerprint and the golden must see them as the quantized model's meaning, not as
weights in the rung's dtype (docs/fp8.md). No torch import: it reads module objects it is given.
"""
from __future__ import annotations

from typing import Any


def quantized_storage(mod: Any) -> list[str]:
    """Names of ``mod``'s own tensors that keep their dtype when the model is cast for a rung: 8-bit
    float codes (FP8 weights, e8m0 scales) and, in a module holding such codes, its other float
    tensors but the bias (the scales: float32 in the checkpoint and in the kernel). They are the
    quantized model itself; the rung's dtype is that of its activations (docs/fp8.md)."""
    narrow_dtypes = _narrow()
    # runs for every module on every replay pass: the common case (no 8-bit float) in one sweep
    if not any(t is not None and t.dtype in narrow_dtypes
               for d in (mod._parameters, mod._buffers) for t in d.values()):
        return []
    own = [(n, t) for n, t in (*mod._parameters.items(), *mod._buffers.items()) if t is not None]
    narrow = [n for n, t in own if t.dtype in narrow_dtypes]
    return narrow + [n for n, t in own if n not in narrow and n != "bias" and t.is_floating_point()]


_NARROW: frozenset[Any] | None = None


def _narrow() -> frozenset[Any]:
    """The 8-bit float dtypes this torch has (FP8, e8m0 scales)."""
    global _NARROW
    if _NARROW is None:
        import torch

        _NARROW = frozenset(dt for dt in (getattr(torch, n, None) for n in dir(torch) if n.startswith("float8_"))
                            if isinstance(dt, torch.dtype) and dt.itemsize == 1)
    return _NARROW


def quantized_tensor_ids(modules: Any) -> set[int]:
    """ids of every tensor of ``modules`` that quantized_storage keeps."""
    out: set[int] = set()
    for mod in modules:
        for n in quantized_storage(mod):
            t = mod._parameters[n] if n in mod._parameters else mod._buffers[n]
            out.add(id(t))
    return out


def cast_module(model: Any, device: Any = None, dtype: Any = None) -> Any:
    """``model.to(device, dtype)`` in place, its quantized storage (quantized_storage) moved but kept
    in its own dtype; returns the model."""
    import torch

    kept = [(mod, n) for mod in model.modules() for n in quantized_storage(mod)]
    before = [mod._parameters[n] if n in mod._parameters else mod._buffers[n] for mod, n in kept]
    before = [t.data if isinstance(t, torch.nn.Parameter) else t for t in before]
    model.to(device=device, dtype=dtype)
    for (mod, n), t in zip(kept, before):
        restored = t if device is None else t.to(device=device)
        if n in mod._parameters:
            mod._parameters[n].data = restored
        else:
            mod._buffers[n] = restored
    return model


def scheme(mod: Any) -> tuple[str, str | None] | None:
    """(codes dtype name, activation scheme) of a module holding quantized storage, else None: what
    a replay compares to tell whether the candidate quantizes as the reference did."""
    names = quantized_storage(mod)
    if not names:
        return None
    own = {**mod._parameters, **mod._buffers}
    codes = next(own[n] for n in names if own[n].element_size() == 1)
    act = getattr(mod, "activation", None)
    return str(codes.dtype).removeprefix("torch."), act if isinstance(act, str) else None
