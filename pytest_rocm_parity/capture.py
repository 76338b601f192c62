"""Capture: record a golden on the reference device.

Per dtype rung, run the model with hooks that record every selected module's inputs and outputs,
then compute the float64 truth twice: propagated (whole model in float64) and local (each module in
float64 on the recorded inputs, one nesting level at a time). Rungs are written one at a time.
"""
from __future__ import annotations

import copy
import time
from collections.abc import Callable
from typing import Any

from pytest_rocm_parity import __version__
from pytest_rocm_parity import dtypes as dt
from pytest_rocm_parity.engine import (
    KEEP_PLACEMENT,
    OUTPUT,
    CheckSpec,
    Hooks,
    _run,
    _substitute,
    cast_inputs,
    fingerprint,
    home_device,
    normalize_inputs,
    numerics,
    prepare_model,
)
from pytest_rocm_parity.golden import FORMAT_VERSION, GoldenStore
from pytest_rocm_parity.selection import Selected, select
from pytest_rocm_parity.tree import constant_leaves, tensor_leaves

# ---------------------------------------------------------------------------------------------
# capture

class _Pool:
    """Deduplicated host copies of recorded tensors (a block's output is the next block's input)."""

    def __init__(self) -> None:
        self.by_id: dict[int, str] = {}
        self.alive: list[Any] = []
        self.tensors: dict[str, Any] = {}

    def add(self, t: Any) -> str:
        k = self.by_id.get(id(t))
        if k is None:
            k = f"t/{len(self.tensors)}"
            self.by_id[id(t)] = k
            self.alive.append(t)   # keeps id() unique while the pass runs
            self.tensors[k] = t.detach().to("cpu", copy=True).contiguous()
        return k

    def release(self) -> None:
        self.by_id.clear()
        self.alive.clear()


def capture(model: Any, inputs: Any, spec: CheckSpec, store: GoldenStore, device: str,
            overwrite: bool = False, env: dict[str, Any] | None = None) -> dict[str, Any]:
    """Record the golden for every rung of ``spec`` and write it; returns the manifest."""
    import torch

    from pytest_rocm_parity.backend import collect_env

    args0, kwargs0 = normalize_inputs(inputs)
    selected = select(model, spec.layers, spec.drill)
    manifest: dict[str, Any] = {
        "format": FORMAT_VERSION, "name": spec.name, "test": spec.test, "tool_version": __version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "fingerprint": fingerprint(model), "model_class": type(model).__name__,
        "seed": int(torch.initial_seed()), "dtypes": list(spec.dtypes),
        "layers": [{"name": s.name, "level": s.level, "primary": s.primary} for s in selected],
        "drill": spec.drill, "layer_patterns": list(spec.layers) if spec.layers else None,
        "sketch": spec.sketch,
        "reference_env": env or collect_env(str(home_device(model, device))), "rungs": {}, **spec.manifest_extra,
    }
    def producer(rung: str) -> Callable[[], dict[str, Any]]:
        def produce() -> dict[str, Any]:
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
    store.write(spec.name, manifest, {rung: producer(rung) for rung in spec.dtypes}, overwrite=overwrite)
    return manifest


def _capture_rung(model: Any, args0: Any, kwargs0: Any, selected: list[Selected], rung: str,
                  device: str, tf32: bool, extra: Any = None, profile: bool = False) -> tuple[dict[str, Any], dict[str, Any]]:
    import torch

    dtype = dt.to_torch(rung)
    rdt = dt.to_torch(dt.residual_dtype_name(rung))
    pool = _Pool()
    tensors: dict[str, Any] = {}
    entries: dict[str, dict[str, Any]] = {}
    by_name = {s.name: s for s in selected}

    m, was_training, args, kwargs = _rung_model_and_inputs(model, args0, kwargs0, device, dtype, tensors)
    const_in = constant_leaves({"args": args, "kwargs": kwargs})

    def rec_in(key: str, sel: Selected, a: Any, kw: Any) -> None:
        leaves = tensor_leaves({"args": a, "kwargs": kw})
        entries[key] = {"name": sel.name, "key": key, "level": sel.level, "primary": sel.primary,
                        "in": {p: pool.add(t) for p, t in leaves.items()},
                        "const_in": constant_leaves({"args": a, "kwargs": kw})}
        return None

    def rec_out(key: str, sel: Selected, out: Any) -> None:
        entries[key]["out"] = {p: pool.add(t) for p, t in tensor_leaves(out).items()}
        entries[key]["const_out"] = constant_leaves(out)

    try:
        with numerics(rung, tf32), Hooks(m, selected, rec_in, rec_out) as hooks:
            out = _run(m, args, kwargs)
            order = list(hooks.order)
        outputs = {"out": {p: pool.add(t) for p, t in tensor_leaves(out).items()}, "const": constant_leaves(out)}
        pool.release()
        del out
        extra_meta: dict[str, Any] = {}
        if extra is not None:
            with numerics(rung, tf32):
                extra_meta, extra_t = extra(rung, m, args, kwargs)
            tensors.update({f"extra/{k}": v.detach().to("cpu").contiguous() for k, v in extra_t.items()})
        if profile:
            from pytest_rocm_parity.profiling import profile_shares

            with numerics(rung, tf32):
                extra_meta["profile"] = profile_shares(m, args, kwargs, home_device(m, device))
    finally:
        m.train(was_training)
    if m is not model:
        del m
    tm, truth_dev = _truth_model(model, device, dtype)
    targs, tkwargs = cast_inputs(args, kwargs, torch.float64, truth_dev)

    def ref_of(key: str, p: str) -> Any:
        src = outputs["out"] if key == OUTPUT else entries[key]["out"]
        return pool.tensors[src[p]]

    def put_truth(name: str, key: str, p: str, t: Any) -> None:
        if t.is_floating_point() or t.is_complex():
            tensors[name] = _residual(t, ref_of(key, p), rdt)

    def store_gtruth(key: str, sel: Selected, out: Any) -> None:
        if sel.level == 0:  # propagated truth for top-level modules only: it locates first divergence
            for p, t in tensor_leaves(out).items():
                put_truth(f"gtruth/{key}/{p}", key, p, t)

    with torch.no_grad():
        with Hooks(tm, selected, None, store_gtruth):
            tout = _run(tm, targs, tkwargs)
        for p, t in tensor_leaves(tout).items():
            put_truth(f"gtruth/{OUTPUT}/{p}", OUTPUT, p, t)
        del tout
        for level in sorted({s.level for s in selected}):
            def sub(key: str, sel: Selected, a: Any, kw: Any, level: int = level) -> Any:
                if sel.level != level or key not in entries:
                    return None
                keys = entries[key]["in"]
                return _substitute(a, kw, keys, lambda k: pool.tensors[k], torch.float64, KEEP_PLACEMENT)

            def keep(key: str, sel: Selected, out: Any, level: int = level) -> None:
                if sel.level == level and key in entries:
                    for p, t in tensor_leaves(out).items():
                        put_truth(f"truth/{key}/{p}", key, p, t)

            with Hooks(tm, selected, sub, keep):
                _run(tm, targs, tkwargs)
    del tm
    tensors.update(pool.tensors)
    layers = [entries[k] for k in order if k in entries and "out" in entries[k]]
    for e in layers:
        e.pop("gtruth", None)
    meta = {"inputs": {"const": const_in}, "layers": layers, "outputs": outputs,
            "truth_encoding": "residual", "truth_dtype": dt.name_of(rdt), "tf32": tf32, "order": order,
            "selected": sorted(by_name), "extra": extra_meta}
    return meta, tensors


def _rung_model_and_inputs(model: Any, args0: Any, kwargs0: Any, device: str, dtype: Any,
                           tensors: dict[str, Any]) -> tuple[Any, bool, Any, Any]:
    """The rung's model in eval mode and its cast inputs, which are stored exactly under input/."""
    m = prepare_model(model, device, dtype)
    was_training = m.training
    m.eval()
    args, kwargs = cast_inputs(args0, kwargs0, dtype, home_device(m, device))
    for path, t in tensor_leaves({"args": args, "kwargs": kwargs}).items():
        tensors[f"input/{path}"] = t.detach().to("cpu").contiguous()
    return m, was_training, args, kwargs


def _truth_model(model: Any, device: str, dtype: Any) -> tuple[Any, Any]:
    """The rung's model in float64 (weights already rounded to the rung: only arithmetic differs)."""
    import torch

    if device == KEEP_PLACEMENT:   # a split model keeps its split in float64 too
        tm = copy.deepcopy(prepare_model(model, device, dtype)).to(dtype=torch.float64).eval()
        return tm, home_device(tm, device)
    truth_dev = device if _supports_f64(device) else "cpu"
    tm = copy.deepcopy(prepare_model(model, "cpu", dtype)).to(device=truth_dev, dtype=torch.float64).eval()
    return tm, truth_dev


def _capture_rung_sketch(model: Any, args0: Any, kwargs0: Any, selected: list[Selected], rung: str,
                         device: str, tf32: bool, group: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """Reference and float64-truth sketches of every selected module's outputs (no inputs kept)."""
    import torch

    from pytest_rocm_parity.sketch import sketch

    dtype = dt.to_torch(rung)
    tensors: dict[str, Any] = {}
    entries: dict[str, dict[str, Any]] = {}

    def keep(prefix: str, key: str, out: Any, into: dict[str, str]) -> None:
        for p, t in tensor_leaves(out).items():
            if t.is_floating_point() or t.is_complex():
                name = f"{prefix}/{key}/{p}"
                tensors[name] = sketch(t, group, f"{key}/{p}").cpu()
            else:
                name = f"x/{key}/{p}"
                tensors[name] = t.detach().to("cpu", copy=True).contiguous()
            into[p] = name

    def rec_out(key: str, sel: Selected, out: Any) -> None:
        entries[key] = {"name": sel.name, "key": key, "level": sel.level, "primary": sel.primary,
                        "in": {}, "out": {}, "const_in": {}, "const_out": constant_leaves(out)}
        keep("sk", key, out, entries[key]["out"])

    m, was_training, args, kwargs = _rung_model_and_inputs(model, args0, kwargs0, device, dtype, tensors)
    try:
        with numerics(rung, tf32), Hooks(m, selected, None, rec_out) as hooks:
            out = _run(m, args, kwargs)
            order = list(hooks.order)
        outputs: dict[str, Any] = {"out": {}, "const": constant_leaves(out)}
        keep("sk", OUTPUT, out, outputs["out"])
        del out
    finally:
        m.train(was_training)
    tm, truth_dev = _truth_model(model, device, dtype)
    targs, tkwargs = cast_inputs(args, kwargs, torch.float64, truth_dev)
    truth_names: dict[str, str] = {}
    with torch.no_grad(), Hooks(tm, selected, None, lambda k, s, o: keep("skt", k, o, truth_names)):
        tout = _run(tm, targs, tkwargs)
        keep("skt", OUTPUT, tout, truth_names)
    del tm, tout
    layers = [entries[k] for k in order if k in entries]
    meta = {"inputs": {"const": constant_leaves({"args": args, "kwargs": kwargs})}, "layers": layers,
            "outputs": outputs, "truth_encoding": "sketch", "sketch": group, "tf32": tf32, "order": order,
            "selected": sorted(s.name for s in selected), "extra": {}}
    return meta, tensors


def _residual(truth: Any, ref: Any, rdt: Any) -> Any:
    """The float64 truth stored as its difference from the reference: half the bytes, same statistics.

    The residual is as small as the reference's error, so rounding it to ``rdt`` perturbs the
    error statistics by one rounding of the error (2^-9 relative for bfloat16), not of the value.
    """
    import torch

    if truth.is_complex() or ref.is_complex():
        d = truth.detach().to("cpu", torch.complex128) - ref.to(torch.complex128)
        return d.to(torch.complex128 if rdt == torch.float64 else torch.complex64).contiguous()
    d = truth.detach().to("cpu", torch.float64) - ref.to(torch.float64)
    return d.to(rdt).contiguous()



def _supports_f64(device: str) -> bool:
    return not str(device).startswith("mps")


