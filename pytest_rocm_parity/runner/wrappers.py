"""The model a user hands in, seen through its wrappers.

Why: a correct migration often wraps the model (``torch.compile``, ``model.compile()``, regional
compilation, DataParallel, accelerate's device-map hooks, PEFT). Goldens are keyed by the plain
model's module names, and the candidate's own code (its compiled forward included) is what must be
judged, so the plugin hooks the inner model's modules, calls the outer object, and casts weights in
place instead of copying the model (a copy loses compiled call paths and accelerate's hooks).
"""
from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Callable, Iterator
from typing import Any, TypeVar, cast

from pytest_rocm_parity.errors import InvalidArgument


def unwrap(model: Any) -> Any:
    """The plain ``nn.Module`` under compile, data-parallel and PEFT wrappers (itself when none)."""
    seen = 0
    while seen < 8:
        seen += 1
        cls = type(model).__name__
        if cls == "OptimizedModule" and hasattr(model, "_orig_mod"):
            model = model._orig_mod
        elif cls in ("DataParallel", "DistributedDataParallel") and hasattr(model, "module"):
            model = model.module
        elif hasattr(model, "peft_config") and hasattr(model, "base_model") and hasattr(model.base_model, "model"):
            model = model.base_model.model
        else:
            break
    return model


@contextlib.contextmanager
def compiled_children_inlined(model: Any) -> Iterator[None]:
    """Each ``parent.child = torch.compile(child)`` inside ``model`` seen, for the check's duration,
    as ``child.compile()`` with the same options.

    Why: the assignment puts an OptimizedModule between parent and child, which renames everything
    below it (``blocks.1._orig_mod.weight``), so the golden's names stop matching a correct
    candidate; the in-place form runs the same compiled code under the plain names."""
    swaps = [(parent, key, child) for parent in list(model.modules()) for key, child in parent._modules.items()
             if _is_compiled_wrapper(child)]
    previous = [child._orig_mod.__dict__.get("_compiled_call_impl") for _, _, child in swaps]
    for parent, key, child in swaps:
        orig = child._orig_mod
        parent._modules[key] = orig
        orig._compiled_call_impl = child.dynamo_ctx(orig._call_impl)   # what nn.Module.compile() stores
    try:
        yield
    finally:
        for (parent, key, child), prev in zip(reversed(swaps), reversed(previous)):
            parent._modules[key] = child
            child._orig_mod._compiled_call_impl = prev


def _is_compiled_wrapper(mod: Any) -> bool:
    return type(mod).__name__ == "OptimizedModule" and hasattr(mod, "_orig_mod") and hasattr(mod, "dynamo_ctx")


F = TypeVar("F", bound=Callable[..., Any])


def inlines_compiled_children(fn: F) -> F:
    """``fn(model, ...)`` run inside compiled_children_inlined(unwrap(model)), for a model it can run."""
    @functools.wraps(fn)
    def run(model: Any, *args: Any, **kwargs: Any) -> Any:
        refuse_graphs(unwrap(model))
        with compiled_children_inlined(unwrap(model)), room_to_recompile():
            return fn(model, *args, **kwargs)
    return cast(F, run)


# Dynamo's recompile limits while a check runs. The judged modules' hooks break a compiled graph at
# each of them, so Dynamo compiles each module's forward as a frame of its own, once per input shape
# and rung dtype: a net of a dozen conv shapes at three rungs passes the default of 8 per frame, and
# the frames past it run eagerly, so a miscompile passed its check (the compiled code did not run).
RECOMPILE_LIMIT = 256
ACCUMULATED_RECOMPILE_LIMIT = 8192


@contextlib.contextmanager
def room_to_recompile() -> Iterator[None]:
    """Dynamo's recompile limits raised to RECOMPILE_LIMIT (per frame) and ACCUMULATED_RECOMPILE_LIMIT
    for the block, as they were afterwards; nothing where Dynamo is not loaded (no model is compiled)."""
    dynamo = sys.modules.get("torch._dynamo")
    cfg = getattr(dynamo, "config", None)
    if cfg is None:
        yield
        return
    names = {"recompile_limit": RECOMPILE_LIMIT, "accumulated_recompile_limit": ACCUMULATED_RECOMPILE_LIMIT}
    saved = {n: getattr(cfg, n) for n in names if isinstance(getattr(cfg, n, None), int)}
    for n, v in saved.items():
        setattr(cfg, n, max(v, names[n]))
    try:
        yield
    finally:
        for n, v in saved.items():
            setattr(cfg, n, v)


def refuse_graphs(model: Any) -> None:
    """InvalidArgument for a TorchScript module in ``model`` (torch.jit.trace/script/freeze, the model
    or a part): its submodules run inside one graph, where no module hook sees a call, so nothing in
    it could be judged per layer."""
    import torch

    # the module itself, not its name: a scripted model refuses get_submodule
    found = next(((n, m) for n, m in model.named_modules() if isinstance(m, torch.jit.ScriptModule)), None) \
        if isinstance(model, torch.nn.Module) else None
    if found is not None:
        name, scripted = found
        what = "the model" if not name else f"its module {name}"
        raise InvalidArgument(
            f"model: {what} is a TorchScript module ({type(scripted).__name__}), which runs its "
            f"submodules inside one graph where no hook sees them, so no layer of it can be captured or judged. "
            f"Check the eager model it was made from; to judge compiled code, torch.compile it "
            f"(docs/migrations.md)")


def is_exported(model: Any) -> bool:
    """A torch.export program's module (``torch.export.export(...).module()``): its own module tree,
    its mode fixed in its graph (it refuses eval() and train())."""
    return type(model).__name__ == "_StatefulGraphModule" or hasattr(model, "_guards_fn")


def plain_copy(model: Any) -> Any:
    """A deep copy of ``model`` that runs eagerly: ``model.compile()`` stores a compiled ``__call__``
    on each module, which a copy would share with the original (calling the original's weights)."""
    import copy

    m = copy.deepcopy(unwrap(model))
    for mod in m.modules():
        if getattr(mod, "_compiled_call_impl", None) is not None:
            mod._compiled_call_impl = None
    return m


_IN_PLACE: dict[int, tuple[Any, ...]] = {}   # id(model) -> its stamp when last found with nothing to cast


@contextlib.contextmanager
def cast_in_place(model: Any, device: Any, dtype: Any, modules: list[Any] | None = None,
                  stamp: tuple[Any, ...] | None = None) -> Iterator[None]:
    """Every floating parameter and buffer of ``model`` in ``dtype`` (and on ``device`` unless it is
    None), the original tensors put back afterwards. ``modules``: the model's modules, when the
    caller has walked them already. ``stamp``: the model's module tree and the storages and dtypes
    of its tensors (engine.ModelWalk.stamp); a model found with nothing to cast under the same stamp
    is not scanned again (a move or a cast makes new storages, so it changes the stamp).

    The same module objects keep running, so compiled code, hooks and wrappers stay as the user made
    them; Dynamo's guards see the new dtype and recompile.
    """
    import torch

    target = None if device is None else torch.device(device)
    key = None if stamp is None else (str(target), dtype, stamp)
    if key is not None and _IN_PLACE.get(id(model)) == key:
        yield
        return
    mods = modules if modules is not None else list(model.modules())
    from pytest_rocm_parity.quant.storage import quantized_tensor_ids

    found: list[set[int]] = []

    def kept() -> set[int]:
        # quantized storage keeps its dtype; looked for only once a tensor's dtype differs from the
        # rung's, so a model already in place costs no extra walk
        if not found:
            found.append(quantized_tensor_ids(mods))
        return found[0]

    def off(t: Any) -> bool:
        return (t.is_floating_point() and t.dtype != dtype and id(t) not in kept()
                or target is not None and not _on(t, target))

    # the usual case, a model already in the rung's dtype on the device: nothing to swap
    if not any(off(t) for mod in mods for t in (*mod._parameters.values(), *mod._buffers.values()) if t is not None):
        if key is not None:
            if len(_IN_PLACE) > 64:
                _IN_PLACE.clear()
            _IN_PLACE[id(model)] = key
        yield
        return
    params: dict[int, tuple[Any, Any]] = {}
    buffers: list[tuple[Any, str, Any, Any]] = []

    def moved(t: Any, quantized: bool) -> Any:
        cast = t.is_floating_point() and not quantized
        return t.to(device=target if target is not None else t.device, dtype=dtype if cast else t.dtype)

    try:
        with torch.no_grad():
            for mod in mods:
                for p in mod._parameters.values():
                    if p is None or id(p) in params or not off(p):
                        continue
                    params[id(p)] = (p, p.data)
                    p.data = moved(p.data, id(p) in kept())
                for name, b in list(mod._buffers.items()):
                    if b is not None and off(b):
                        mod._buffers[name] = moved(b, id(b) in kept())
                        buffers.append((mod, name, b, mod._buffers[name]))
        yield
    finally:
        for p, old in params.values():
            p.data = old
        for mod, name, old, new in buffers:
            now = mod._buffers.get(name)
            # a module that replaced its buffer meanwhile moved its own state on (a dynamic rotary
            # embedding grown for a longer sequence, with the length it was grown to kept beside it):
            # putting the old one back would leave the two disagreeing
            mod._buffers[name] = old if now is new or now is None else now.to(device=old.device, dtype=old.dtype)


def _on(t: Any, target: Any) -> bool:
    if t.device.type != target.type:
        return False
    return target.index is None or t.device.index == target.index


def outside_dynamo(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` made opaque to Dynamo when Dynamo is loaded: a hook of ours inside a compiled region is
    a graph break, never traced (tracing its dict updates broke guards). Without Dynamo loaded no
    model can be compiled, and the hook stays a plain function."""
    if "torch._dynamo" not in sys.modules:
        return fn
    import torch._dynamo

    return torch._dynamo.disable(fn, recursive=True)


def torch_training_kinds() -> tuple[Any, Any]:
    """torch.nn's modules whose training forward differs from eval's: BatchNorm (the batch's
    statistics) and dropout (with p > 0)."""
    import torch

    return torch.nn.modules.batchnorm._BatchNorm, torch.nn.modules.dropout._DropoutNd


def training_paths(model: Any, modules: list[Any] | None = None) -> list[str]:
    """Names of the modules in training mode whose training forward differs from the judged (eval)
    one: BatchNorm on the batch's statistics, dropout with p > 0, and a module of a class outside
    torch.nn whose own forward reads ``training`` (a Hugging Face attention's dropout, a router's
    jitter). A Linear left in training mode computes the same, and is not named. ``modules``: the
    model's, when walked already (the names are looked up only when one is in training mode)."""
    import torch

    if not any(m.training for m in (modules if modules is not None else model.modules())):
        return []
    norms, drops = torch_training_kinds()

    def differs(m: Any) -> bool:
        if isinstance(m, norms):
            return True
        if isinstance(m, drops):
            return bool(m.p)
        if type(m).__module__.startswith("torch."):   # nn.MultiheadAttention's own dropout
            return isinstance(getattr(m, "dropout", None), float) and m.dropout > 0
        code = getattr(type(m).forward, "__code__", None)
        return code is not None and "training" in code.co_names

    return [n or type(model).__name__ for n, m in model.named_modules() if m.training and differs(m)]


def is_adapter_layer(mod: Any) -> bool:
    """A PEFT tuner layer (LoRA and its kin): the plain module it replaced is its ``base_layer``."""
    return hasattr(mod, "base_layer") and type(mod).__module__.startswith("peft.")


def is_dispatched_experts(mod: Any) -> bool:
    """A Hugging Face MoE experts module, whose forward is chosen by ``experts_implementation``: the
    modules below it are called once for all experts or once per expert, as that choice says."""
    return hasattr(type(mod), "_apply_gate") and hasattr(getattr(mod, "config", None), "_experts_implementation")


def plain_view(model: Any) -> tuple[list[tuple[str, str]], list[tuple[str, Any]]]:
    """(module name, class name) and (tensor name, tensor) of ``model`` as the model without its
    adapters: an adapter layer stands for its base layer, under the base layer's class and with the
    base layer's parameters and buffers; the adapter's own modules and weights are left out.

    Why: a golden is captured on the plain model; the same model with a PEFT adapter attached must
    match its structure, so that the adapter's effect is judged as numbers, module by module.
    """
    mods: list[tuple[str, str]] = []
    tensors: list[tuple[str, Any]] = []
    seen: set[int] = set()   # each module once, under its first name, as named_modules() gives them

    def walk(prefix: str, mod: Any) -> None:
        if id(mod) in seen:
            return
        seen.add(id(mod))
        shown = mod.base_layer if is_adapter_layer(mod) else mod
        mods.append((prefix, type(shown).__name__))
        for n, t in list(shown._parameters.items()) + list(shown._buffers.items()):
            if t is not None:
                tensors.append((f"{prefix}.{n}" if prefix else n, t))
        for n, child in shown._modules.items():
            if child is not None:
                walk(f"{prefix}.{n}" if prefix else n, child)
    walk("", model)
    return mods, tensors
