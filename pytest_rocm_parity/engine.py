"""Capture and replay: the core that works without pytest.

capture(): on the reference device, run the model per dtype rung with hooks that
record every selected module's inputs and outputs, then compute the float64
truth twice: propagated (whole model in float64) and local (each module in
float64 on the recorded inputs, one nesting level at a time).

replay(): on the candidate device, run the model propagated (compare each
module's output as it appears) and isolated (each module fed the golden inputs),
comparing on the device against goldens loaded straight to it.
"""
from __future__ import annotations

import contextlib
import copy
import shlex
import hashlib
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from pytest_rocm_parity import __version__
from pytest_rocm_parity import dtypes as dt
from pytest_rocm_parity.compare import exact_metrics, float_metrics
from pytest_rocm_parity.errors import GoldenStale, InvalidArgument
from pytest_rocm_parity.golden import FORMAT_VERSION, GoldenStore, RungReader
from pytest_rocm_parity.judge import finish, judge_layer
from pytest_rocm_parity.records import CheckResult, LayerRecord, LeafMetrics
from pytest_rocm_parity.selection import Selected, select
from pytest_rocm_parity.tolerance import Tolerance
from pytest_rocm_parity.tree import constant_leaves, map_tensors, tensor_leaves

OUTPUT = "<output>"
VERIFY_HASH_MAX_BYTES = 512 * 1024 * 1024


@dataclass
class CheckSpec:
    """Everything that identifies one check; built by the fixture from its arguments and options."""

    name: str
    test: str = ""
    dtypes: list[str] = field(default_factory=list)
    layers: Sequence[str] | None = None
    drill: int = 2
    tolerance: Tolerance = field(default_factory=Tolerance)
    regen_command: str = ""
    # (batch, seq) of token inputs: per-position errors are kept for layers shaped (batch, seq, ...)
    positions: tuple[int, int] | None = None
    # capture: fn(rung, model, args, kwargs) -> (json meta, {key: tensor}) stored under "extra/"
    extra_capture: Callable[[str, Any, Any, Any], tuple[dict[str, Any], dict[str, Any]]] | None = None
    # replay: fn(rung, model, args, kwargs, output, reader, meta, result) adds to result.extra
    extra_judge: Callable[..., None] | None = None
    manifest_extra: dict[str, Any] = field(default_factory=dict)
    profile: bool = False            # profiler parity (--parity-profile)
    sketch: int = 0                  # >0: sketch golden with this group size (pytest_rocm_parity/sketch.py)
    report_dir: Any = None           # where obtained tensors of failing layers are saved


def shell_quote(text: str) -> str:
    """Always single-quoted, safe to paste into a shell (test ids hold [ ] and * globs)."""
    q = shlex.quote(text)
    return q if q.startswith("'") else f"'{text}'"


# ---------------------------------------------------------------------------------------------
# inputs and models

def normalize_inputs(inputs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    import torch

    if isinstance(inputs, torch.Tensor):
        return (inputs,), {}
    if isinstance(inputs, (tuple, list)):
        return tuple(inputs), {}
    if isinstance(inputs, dict):
        return (), dict(inputs)
    raise InvalidArgument(f"inputs: expected a tensor, a tuple of positional inputs or a dict of keyword "
                          f"inputs, got {type(inputs).__name__}")


def cast_inputs(args: Any, kwargs: Any, dtype: Any, device: Any) -> tuple[Any, Any]:
    def fn(_: str, t: Any) -> Any:
        t = t.detach()
        if t.is_floating_point():
            return t.to(device=device, dtype=dtype)
        return t.to(device=device)
    return map_tensors(args, fn), map_tensors(kwargs, fn)


def default_dtypes(model: Any) -> list[str]:
    """The deployed dtype plus the float32 rung of the precision ladder."""
    floats = {dt.name_of(p.dtype) for p in model.parameters() if p.is_floating_point()}
    low = [d for d in ("bfloat16", "float16") if d in floats]
    return [low[0], "float32"] if low else ["float32"]


def fingerprint(model: Any) -> dict[str, str]:
    """Structure hash (names, classes, shapes) and a sampled weight hash (fast at any size)."""
    import torch

    s = hashlib.sha256()
    for name, mod in model.named_modules():
        s.update(f"{name}:{type(mod).__name__};".encode())
    w = hashlib.sha256()
    with torch.no_grad():
        for name, p in list(model.named_parameters()) + list(model.named_buffers()):
            s.update(f"{name}:{tuple(p.shape)};".encode())
            flat = p.detach().reshape(-1)
            if flat.numel() == 0 or not (flat.is_floating_point() or flat.dtype in (torch.int64, torch.int32)):
                continue
            step = max(1, flat.numel() // 1024)
            sample = flat[::step][:1024].to("cpu", torch.float64)
            w.update(name.encode())
            w.update(sample.numpy().tobytes())
    return {"structure": s.hexdigest()[:16], "weights": w.hexdigest()[:16]}


KEEP_PLACEMENT = "model"


def home_device(model: Any, device: Any) -> Any:
    """Where inputs and goldens go: ``device``, or the first parameter's device for a split model."""
    if device != KEEP_PLACEMENT:
        return device
    first = next(iter(model.parameters()), None)
    return first.device if first is not None else "cpu"


def prepare_model(model: Any, device: Any, dtype: Any) -> Any:
    """A copy of the model on ``device`` in ``dtype`` (the model itself when it already is).

    ``device="model"`` keeps the model's own placement (blocks split over GPUs by hand or by
    accelerate's device_map) and only casts the dtype.
    """
    params = list(model.parameters()) + list(model.buffers())
    fl = [p for p in params if p.is_floating_point()]
    if device == KEEP_PLACEMENT:
        if all(p.dtype == dtype for p in fl):
            return model
        return copy.deepcopy(model).to(dtype=dtype)
    if all(p.device == _dev(device) and p.dtype == dtype for p in fl):
        return model
    # Copy on the host side when moving devices, so the source never holds two copies on a GPU.
    m = copy.deepcopy(model)
    return m.to(device=device, dtype=dtype)


def _dev(device: Any) -> Any:
    import torch

    d = torch.device(device)
    if d.type == "cuda" and d.index is None:
        d = torch.device("cuda", torch.cuda.current_device())
    return d


@contextlib.contextmanager
def numerics(rung: str, tf32: bool = False) -> Iterator[None]:
    """fp32 rungs run with TF32 off (unless the policy says it is deployed); restored afterwards."""
    import torch

    old = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    try:
        if rung == "float32":
            torch.backends.cuda.matmul.allow_tf32 = tf32
            torch.backends.cudnn.allow_tf32 = tf32
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


# ---------------------------------------------------------------------------------------------
# hooks

class Hooks:
    """Forward (pre-)hooks on the selected modules, keyed by module name and call index."""

    def __init__(self, model: Any, selected: list[Selected],
                 on_input: Callable[[str, Selected, Any, Any], tuple[Any, Any] | None] | None = None,
                 on_output: Callable[[str, Selected, Any], None] | None = None) -> None:
        self.calls: dict[str, int] = {}
        self.order: list[str] = []
        self.handles: list[Any] = []
        self.on_input = on_input
        self.on_output = on_output
        self._current: dict[str, list[str]] = {}
        for sel in selected:
            mod = model.get_submodule(sel.name) if sel.name else model
            self.handles.append(mod.register_forward_pre_hook(self._pre(sel), with_kwargs=True))
            self.handles.append(mod.register_forward_hook(self._post(sel), with_kwargs=True))

    @staticmethod
    def key(name: str, call: int) -> str:
        return name if call == 0 else f"{name}#{call}"

    def _pre(self, sel: Selected) -> Callable[..., Any]:
        def hook(_mod: Any, args: Any, kwargs: Any) -> Any:
            call = self.calls.get(sel.name, 0)
            self.calls[sel.name] = call + 1
            key = self.key(sel.name, call)
            self._current.setdefault(sel.name, []).append(key)
            self.order.append(key)
            if self.on_input is not None:
                return self.on_input(key, sel, args, kwargs)
            return None
        return hook

    def _post(self, sel: Selected) -> Callable[..., Any]:
        def hook(_mod: Any, _args: Any, _kwargs: Any, output: Any) -> Any:
            key = self._current[sel.name].pop()
            if self.on_output is not None:
                self.on_output(key, sel, output)
            return None
        return hook

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles.clear()

    def __enter__(self) -> Hooks:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


def _run(model: Any, args: Any, kwargs: Any) -> Any:
    import torch

    with torch.inference_mode():
        return model(*args, **kwargs)


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


def _replay_rung_sketch(m: Any, spec: CheckSpec, meta: dict[str, Any], reader: RungReader, rung: str,
                        args0: Any, kwargs0: Any, selected: list[Selected]) -> CheckResult:
    """Propagated replay against sketches: every module's output sketched on the device as it appears."""
    from pytest_rocm_parity.sketch import sketch

    group = int(meta["sketch"])
    tol = spec.tolerance
    u = tol.unit_roundoff(rung)
    layers = {e["key"]: e for e in meta["layers"]}

    def judge_leaves(key: str, out: Any, names: dict[str, str]) -> list[LeafMetrics]:
        got = tensor_leaves(out)
        res = []
        for p, gk in names.items():
            c = got.get(p)
            if c is None:
                res.append(LeafMetrics(leaf=p, numel=0, ratio=float("inf"), ratio_lo=float("inf"),
                                       note=f"shape: output leaf {p!r} missing on the candidate"))
            elif gk.startswith("x/"):
                res.append(exact_metrics(p, c.detach(), reader.get(gk)))
            else:
                ref_s = reader.get(gk)
                t_s = reader.get(f"skt/{key}/{p}").to(ref_s.device)
                c_s = sketch(c, group, f"{key}/{p}").to(ref_s.device)
                mm = float_metrics(p, c_s, ref_s, t_s, u, tol.confidence, tol.nan)
                mm.numel = int(c.numel())
                res.append(mm)
        return res

    prop: dict[str, list[LeafMetrics]] = {}
    with Hooks(m, selected, None, lambda k, s, o: prop.__setitem__(k, judge_leaves(k, o, layers[k]["out"]))
               if k in layers else None):
        out = _run(m, args0, kwargs0)
    result = CheckResult(test=spec.test, name=spec.name, dtype=rung, passed=True)
    for key, rec in _records_in_order(meta, layers):
        judge_layer(rec, [], prop.get(key, []), tol, rung)
        # No inputs in a sketch golden: the propagated verdict is the verdict, judged like an isolated
        # one (jackknife bound and sign test over the sketch entries, which are few) against the larger
        # of the ratio budget and Dynamo's multiplier.
        t = tol.for_layer(key)
        budget = max(t.ratio_for(rung), t.propagated_for(rung))
        reasons = [_sketch_failure(mm, t, rung, budget) for mm in prop.get(key, [])]
        rec.prop_passed = rec.iso_passed = rec.passed = not any(reasons)
        rec.budget = budget
        rec.reason = next((r for r in reasons if r), "")
        result.layers.append(rec)
    for p, mm in zip(meta["outputs"]["out"], judge_leaves(OUTPUT, out, meta["outputs"]["out"])):
        rec = LayerRecord(name=f"{OUTPUT}.{p}")
        judge_layer(rec, [], [mm], tol, rung)
        budget = max(tol.ratio_for(rung), tol.propagated_for(rung))
        rec.reason = _sketch_failure(mm, tol, rung, budget)
        rec.passed = rec.prop_passed = not rec.reason
        result.outputs.append(rec)
    result.notes.append(f"sketch golden (groups of {group}): propagated judgement only; the culprit is the "
                        f"smallest module where the candidate first drifts")
    return finish(result, tol)


def _records_in_order(meta: dict[str, Any], layers: dict[str, dict[str, Any]]) -> Iterator[tuple[str, LayerRecord]]:
    """An empty record for every captured module call, in execution order."""
    for key in meta.get("order", list(layers)):
        e = layers.get(key)
        if e is not None:
            yield key, LayerRecord(name=key, level=e["level"], primary=e["primary"])


def _sketch_failure(m: LeafMetrics, tol: Tolerance, rung: str, budget: float) -> str:
    from pytest_rocm_parity.judge import leaf_failure

    if m.note.startswith("shape") or m.kind == "exact" or m.nonfinite:
        return leaf_failure(m, tol, rung, isolated=True)
    if m.ratio_lo > budget and m.z > tol.z:
        return (f"drift {m.ratio:.3g}x the reference's error (>= {m.ratio_lo:.3g}x at {tol.confidence:g} sigma over "
                f"the sketch; budget {budget:g}x; sign test z={m.z:+.1f})")
    return ""


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


def load_truth(reader: RungReader, name: str, ref: Any) -> Any:
    """Rebuild a float64 truth from its stored residual (see _residual)."""
    import torch

    if ref.is_complex():
        return ref.to(torch.complex128) + reader.get(name).to(ref.device, torch.complex128)
    return ref.to(torch.float64) + reader.get(name).to(ref.device, torch.float64)


def _supports_f64(device: str) -> bool:
    return not str(device).startswith("mps")


def _substitute(args: Any, kwargs: Any, keys: dict[str, str], fetch: Callable[[str], Any],
                fdtype: Any | None, device: Any) -> tuple[Any, Any]:
    """Replace every tensor input leaf by its golden value (recorded at capture)."""
    def fn(path: str, t: Any) -> Any:
        k = keys.get(path)
        if k is None:
            return t
        g = fetch(k)
        if fdtype is not None and g.is_floating_point():
            g = g.to(fdtype)
        # onto the device of the tensor it replaces: for a split model that is the module's own GPU
        return g.to(t.device if device is None or device == KEEP_PLACEMENT else device)
    new = map_tensors({"args": args, "kwargs": kwargs}, fn)
    return tuple(new["args"]), new["kwargs"]


# ---------------------------------------------------------------------------------------------
# replay

def check_stale(model: Any, inputs: Any, spec: CheckSpec, manifest: dict[str, Any], golden_path: str) -> None:
    regen = spec.regen_command or f"pytest --rocm-parity --parity-regen={shell_quote(spec.name)}"
    fp = fingerprint(model)
    old = manifest.get("fingerprint", {})
    problems = []
    if fp.get("structure") != old.get("structure"):
        problems.append("the model's structure (modules or parameter shapes) changed")
    elif fp.get("weights") != old.get("weights"):
        problems.append("the model's weights changed")
    selected = [s.name for s in select(model, spec.layers, spec.drill)]
    old_layers = [l["name"] for l in manifest.get("layers", [])]
    if selected != old_layers:
        added = [n for n in selected if n not in old_layers]
        removed = [n for n in old_layers if n not in selected]
        problems.append(f"the layer list changed (added {added[:5]}, removed {removed[:5]})")
    if int(manifest.get("sketch") or 0) != int(spec.sketch or 0):
        problems.append(f"captured with sketch={manifest.get('sketch') or 0}, asked sketch={spec.sketch or 0}")
    missing = [d for d in spec.dtypes if d not in manifest.get("rungs", {})]
    if missing:
        problems.append(f"dtypes {missing} were not captured (golden holds {list(manifest.get('rungs', {}))})")
    if problems:
        raise GoldenStale(f"stale golden {golden_path} for {spec.name!r}: " + "; ".join(problems)
                          + f". Regenerate this model's golden on the reference machine: {regen}", golden_path)


def _inputs_changed(args0: Any, kwargs0: Any, reader: RungReader, rung: str, meta: dict[str, Any] | None = None) -> str:
    import json as _json

    import torch

    dtype = dt.to_torch(rung)
    args, kwargs = cast_inputs(args0, kwargs0, dtype, "cpu")
    if meta is not None:
        now = _json.loads(_json.dumps(constant_leaves({"args": args, "kwargs": kwargs}), default=str))
        old = meta.get("inputs", {}).get("const", {})
        for p in sorted(set(now) | set(old)):
            a, b = old.get(p), now.get(p)
            same = a == b or (isinstance(a, float) and isinstance(b, float) and a != a and b != b)
            if not same:
                return f"non-tensor input {p} changed ({a!r} -> {b!r})"
    given = tensor_leaves({"args": args, "kwargs": kwargs})
    stored = {k[len("input/"):] for k in reader.keys if k.startswith("input/")}
    if set(given) != stored:
        return f"input names changed ({sorted(given)} vs stored {sorted(stored)})"
    for p, t in given.items():
        g = reader.get(f"input/{p}").to("cpu")
        if g.shape != t.shape or g.dtype != t.dtype:
            return f"input {p}: shape/dtype {tuple(t.shape)}/{t.dtype} vs stored {tuple(g.shape)}/{g.dtype}"
        if not torch.equal(g, t) and not (t.is_floating_point() and torch.equal(g.isnan(), t.isnan())
                                          and torch.equal(g.nan_to_num(), t.nan_to_num())):
            return f"input {p}: values differ from the stored inputs"
    return ""


def replay(model: Any, inputs: Any, spec: CheckSpec, store: GoldenStore, device: str,
           env: dict[str, Any] | None = None) -> list[CheckResult]:
    """Judge the candidate against the golden, one CheckResult per rung."""
    from pytest_rocm_parity.backend import collect_env

    manifest = store.read_manifest(spec.name)
    mpath = str(store.manifest_path(spec.name))
    check_stale(model, inputs, spec, manifest, mpath)
    args0, kwargs0 = normalize_inputs(inputs)
    cand_env = env or collect_env(str(home_device(model, device)))
    results = []
    for rung in spec.dtypes:
        meta = manifest["rungs"][rung]
        path = store.rung_file(spec.name, manifest, rung)
        sha = meta.get("sha256") if int(meta.get("bytes", 0)) <= VERIFY_HASH_MAX_BYTES else None
        reader = RungReader(path, str(home_device(model, device)), sha)
        why = _inputs_changed(args0, kwargs0, reader, rung, meta)
        if why:
            raise GoldenStale(
                f"stale golden {mpath} for {spec.name!r}: {why}. The replay uses the stored inputs; if the "
                f"test's inputs changed on purpose, regenerate: {spec.regen_command or 'pytest --rocm-parity --parity-regen=' + shell_quote(spec.name)}. "
                f"If they differ only by backend RNG, build them on the CPU with a seeded torch.Generator.", mpath)
        result = _replay_rung(model, spec, manifest, meta, reader, rung, device, {"args": args0, "kwargs": kwargs0})
        result.reference_env = manifest.get("reference_env", {})
        result.candidate_env = cand_env
        result.golden = str(path)
        results.append(result)
        del reader
    return results


def _replay_rung(model: Any, spec: CheckSpec, manifest: dict[str, Any], meta: dict[str, Any],
                 reader: RungReader, rung: str, device: str, inputs_template: Any) -> CheckResult:
    dtype = dt.to_torch(rung)
    tol = spec.tolerance
    selected = select(model, spec.layers, spec.drill)
    layers = {e["key"]: e for e in meta["layers"]}
    # The test's inputs are the template (structure and constants); every tensor leaf is the stored one.
    tmpl = map_tensors(inputs_template, lambda p, _t: reader.get(f"input/{p}"))
    args0, kwargs0 = tuple(tmpl["args"]), tmpl["kwargs"]
    u = tol.unit_roundoff(rung)
    prop: dict[str, list[LeafMetrics]] = {}
    iso: dict[str, list[LeafMetrics]] = {}
    pos_err: dict[str, tuple[Any, Any]] = {}
    obtained: dict[str, Any] = {}

    def compare(key: str, out: Any, truth_prefix: str, sink: dict[str, list[LeafMetrics]]) -> None:
        e = layers.get(key)
        if e is None:
            return
        t = tol.for_layer(e["name"])
        got = tensor_leaves(out)
        res = []
        for p, gk in e["out"].items():
            ref = reader.get(gk)
            c = got.get(p)
            if c is None:
                res.append(LeafMetrics(leaf=p, numel=int(ref.numel()), ratio=float("inf"), ratio_lo=float("inf"),
                                       note=f"shape: output leaf {p!r} missing on the candidate"))
                continue
            if spec.report_dir is not None:
                obtained[f"{key}/{p}/{'isolated' if truth_prefix == 'truth' else 'propagated'}"] = c.detach().cpu()
            if ref.is_floating_point() or ref.is_complex():
                tname = f"{truth_prefix}/{key}/{p}"
                if tname not in reader.keys and truth_prefix == "gtruth":
                    continue  # propagated truth is kept for top-level modules only
                truth = load_truth(reader, tname, ref)
                res.append(float_metrics(p, c.detach(), ref, truth, u, t.confidence, t.nan))
                if (spec.positions is not None and truth_prefix == "gtruth" and ref.dim() >= 2
                        and tuple(ref.shape[:2]) == spec.positions and tuple(c.shape) == tuple(ref.shape)
                        and not ref.is_complex() and key not in pos_err):
                    pos_err[key] = _per_position(c.detach(), ref, truth)
            else:
                res.append(exact_metrics(p, c.detach(), ref))
        sink[key] = res

    m = prepare_model(model, device, dtype)
    was_training = m.training
    m.eval()
    if meta.get("sketch"):
        try:
            with numerics(rung, tol.tf32):
                return _replay_rung_sketch(m, spec, meta, reader, rung, args0, kwargs0, selected)
        finally:
            m.train(was_training)
    try:
        with numerics(rung, tol.tf32):
            # propagated
            with Hooks(m, selected, None, lambda k, s, o: compare(k, o, "gtruth", prop)):
                out = _run(m, args0, kwargs0)
            outs = _compare_outputs(out, meta, reader, u, tol)
            if spec.extra_judge is not None:
                pending = out
            del out
            # isolated, one nesting level at a time so no module's own computation is bypassed
            for level in sorted({s.level for s in selected}):
                def sub(key: str, sel: Selected, a: Any, kw: Any, level: int = level) -> Any:
                    if sel.level != level or key not in layers:
                        return None
                    return _substitute(a, kw, layers[key]["in"], reader.get, None, KEEP_PLACEMENT)

                def keep(key: str, sel: Selected, o: Any, level: int = level) -> None:
                    if sel.level == level:
                        compare(key, o, "truth", iso)

                with Hooks(m, selected, sub, keep):
                    _run(m, args0, kwargs0)
    finally:
        m.train(was_training)
    result = CheckResult(test=spec.test, name=spec.name, dtype=rung, passed=True)
    for key, rec in _records_in_order(meta, layers):
        judge_layer(rec, iso.get(key, []), prop.get(key, []), tol, rung)
        if key not in iso:
            # A fused or bypassed sub-module (e.g. q/k/v fused into one GEMM) is judged through its
            # parent; a missing top-level module changes the model's outputs, which are judged too.
            rec.reason = "not called in the candidate (fused or bypassed): judged through its parent and the outputs"
        result.layers.append(rec)
    result.outputs = outs
    finish(result, tol)
    if spec.profile and isinstance(meta.get("extra", {}).get("profile"), dict):
        from pytest_rocm_parity.profiling import compare_shares, profile_shares

        m.eval()
        try:
            with numerics(rung, tol.tf32):
                cand_prof = profile_shares(m, args0, kwargs0, home_device(m, device))
        finally:
            m.train(was_training)
        result.extra["profile"] = {"flags": compare_shares(meta["extra"]["profile"], cand_prof),
                                   "reference": meta["extra"]["profile"], "candidate": cand_prof}
    if spec.report_dir is not None and not result.passed and obtained:
        from pytest_rocm_parity.report import save_failing_tensors

        save_failing_tensors(result, obtained, spec.report_dir)
    obtained.clear()
    if spec.extra_judge is not None:
        result.extra["_pos_err"] = pos_err
        m.eval()
        try:
            with numerics(rung, tol.tf32):
                spec.extra_judge(rung, m, args0, kwargs0, pending, reader, meta, result)
        finally:
            m.train(was_training)
            result.extra.pop("_pos_err", None)
    return result


def _per_position(c: Any, r: Any, t: Any) -> tuple[Any, Any]:
    """RMSE over the feature dims at each (batch, position): where along the sequence a layer drifts."""
    import torch

    dims = tuple(range(2, c.dim()))
    c64, r64, t64 = (x.to(torch.float64) for x in (c, r.to(c.device), t.to(c.device)))
    if not dims:
        return (c64 - t64).abs().cpu(), (r64 - t64).abs().cpu()
    return ((c64 - t64).square().mean(dims).sqrt().cpu(), (r64 - t64).square().mean(dims).sqrt().cpu())


def _compare_outputs(out: Any, meta: dict[str, Any], reader: RungReader, u: float, tol: Tolerance) -> list[LayerRecord]:
    recs = []
    got = tensor_leaves(out)
    for p, gk in meta["outputs"]["out"].items():
        ref = reader.get(gk)
        c = got.get(p)
        rec = LayerRecord(name=f"{OUTPUT}.{p}")
        if c is None:
            rec.passed = rec.prop_passed = False
            rec.reason = f"output leaf {p!r} missing on the candidate"
        else:
            if ref.is_floating_point() or ref.is_complex():
                mm = float_metrics(p, c.detach(), ref, load_truth(reader, f"gtruth/{OUTPUT}/{p}", ref), u, tol.confidence, tol.nan)
            else:
                mm = exact_metrics(p, c.detach(), ref)
            judge_layer(rec, [], [mm], tol, _rung_of(reader))
            rec.passed = rec.prop_passed
        recs.append(rec)
    return recs


def _rung_of(reader: RungReader) -> str:
    return str(reader.header.get("__metadata__", {}).get("dtype", "float32"))
