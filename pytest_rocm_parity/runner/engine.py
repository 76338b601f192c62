"""What capture and replay share: check specs, inputs, model preparation, numerics and hooks.

capture.py records a golden on the reference device; replay.py judges a candidate against it.
Both run without pytest.
"""
from __future__ import annotations

import contextlib
import copy
import hashlib
import operator
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pytest_rocm_parity.judging import dtypes as dt
from pytest_rocm_parity.errors import InvalidArgument, ParityError
from pytest_rocm_parity.judging.tolerance import Tolerance
from pytest_rocm_parity.runner.tree import floats_as_tensors, map_tensors
from pytest_rocm_parity.quant.storage import cast_module, quantized_tensor_ids

if TYPE_CHECKING:   # selection imports the walk and the numerics from here at run time
    from pytest_rocm_parity.runner.selection import Selected

OUTPUT = "<output>"


@dataclass
class CheckSpec:
    """Everything that identifies one check; built by the fixture from its arguments and options."""

    name: str
    test: str = ""
    dtypes: list[str] = field(default_factory=list)
    layers: Sequence[str] | None = None
    drill: int = 2
    tolerance: Tolerance = field(default_factory=Tolerance)
    command_flags: str = ""   # the flags a printed command repeats (ParityOptions.command_flags)
    # (batch, seq) of token inputs: per-position errors are kept for layers shaped (batch, seq, ...)
    positions: tuple[int, int] | None = None
    # capture: fn(rung, model, args, kwargs) -> (json meta, {key: tensor}) stored under "extra/"
    extra_capture: Callable[[str, Any, Any, Any], tuple[dict[str, Any], dict[str, Any]]] | None = None
    # replay: fn(rung, model, args, kwargs, output, reader, meta, result) adds to result.extra
    extra_judge: Callable[..., None] | None = None
    manifest_extra: dict[str, Any] = field(default_factory=dict)
    profile: bool = False            # profiler parity (--parity-profile)
    sketch: int = 0                  # >0: sketch golden with this group size (pytest_rocm_parity/golden/sketch.py)
    replay: str = "full"             # "full": propagated + isolated passes; "fast": one teacher-forced forward plus deeper levels (--parity-replay)
    report_dir: Any = None           # where obtained tensors of failing layers are saved
    golden_size_limit: int | None = None   # bytes a golden should stay under (--parity-golden-size-limit); None: no limit
    dtypes_from: str = ""            # "check" or "marker": the test set the dtypes itself, and options do not override them

    def __post_init__(self) -> None:
        if isinstance(self.dtypes, str):
            self.dtypes = [self.dtypes]
        elif self.dtypes is None:
            self.dtypes = []
        self.dtypes = list(dict.fromkeys(dt.canonical_name(d) for d in self.dtypes))   # 'bf16' -> 'bfloat16'
        if not self.dtypes:   # an empty golden, and a replay that judges nothing and passes
            raise InvalidArgument(f"check {self.name!r}: dtypes is empty, so nothing would be captured or judged; "
                                  f"name at least one precision, e.g. dtypes=['bfloat16', 'float32']")
        self.sketch = sketch_group(self.sketch)

    @property
    def regen_command(self) -> str:
        """What regenerates this check's golden, for messages."""
        from pytest_rocm_parity.options import regen_command

        return regen_command(self.name, self.test, self.command_flags)


def sketch_group(value: Any) -> int:
    """The sketch group size that ``sketch=`` asks for: 0 (full tensors), True (the default group)
    or a group size of at least 2."""
    if value is None or value is False or value == 0:
        return 0
    if value is True:
        from pytest_rocm_parity.golden.sketch import DEFAULT_GROUP

        return DEFAULT_GROUP
    if isinstance(value, int) and value >= 2:
        return value
    raise InvalidArgument(f"sketch={value!r}: use True (groups of 512) or a group size >= 2")


# ---------------------------------------------------------------------------------------------
# inputs and models

def normalize_inputs(inputs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    import torch

    if isinstance(inputs, torch.Tensor):
        return (inputs,), {}
    if isinstance(inputs, tuple):
        _refuse_one_shot(inputs, "args")
        return inputs, {}
    if isinstance(inputs, dict):
        _refuse_one_shot(inputs, "kwargs")
        return (), dict(inputs)
    if isinstance(inputs, list):
        # a forward that takes a list of tensors as one argument and one that takes them one by one
        # both read [a, b] naturally: spread, the first would run another computation, silently
        raise InvalidArgument(f"inputs is a list of {len(inputs)}: pass a tuple, ({'xs' if inputs else ''},) "
                              f"for a forward that takes the list as its one argument, or tuple(xs) for one that "
                              f"takes its items as positional arguments")
    raise InvalidArgument(f"inputs: expected a tensor, a tuple of positional inputs or a dict of keyword "
                          f"inputs, got {type(inputs).__name__}")


def _refuse_one_shot(obj: Any, path: str) -> None:
    """InvalidArgument for an iterator among the inputs (a generator, map(), iter(list)): every pass of
    a check calls the model again on the same inputs, and the first pass uses an iterator up."""
    from collections.abc import Iterator

    if isinstance(obj, Iterator):
        raise InvalidArgument(f"inputs: {path} is {type(obj).__name__}, an iterator: each pass of a check calls "
                              f"the model again on the same inputs, and the first pass would use it up; pass a "
                              f"list or tuple of its items (list(...))")
    if isinstance(obj, (tuple, list)):
        for i, x in enumerate(obj):
            _refuse_one_shot(x, f"{path}.{i}")
    elif isinstance(obj, dict):
        for k, x in obj.items():
            _refuse_one_shot(x, f"{path}.{k}")


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


def fingerprint(model: Any, classes: bool = False, weights: bool = True,
                computed_buffers: bool = False) -> dict[str, str]:
    """Structure hash (module names, parameter names and shapes) and a sampled weight hash (fast at
    any size), of the model as it is without adapters (wrappers.plain_view).

    Module classes are left out: a port that swaps in its own class under the same name (a fused
    LayerNorm, a Triton MLP) is judged by its numbers, not refused as another model. ``classes``:
    the hash goldens recorded before that, which included them (same_structure accepts both).
    The weight hash covers what a checkpoint holds: parameters and persistent buffers. A
    non-persistent buffer (a rotary table built from the config) is computed by the code under
    test, so a candidate that computes it otherwise is judged, not refused as another model;
    ``computed_buffers``: the hash goldens recorded before that, which included them (same_weights).
    ``weights=False``: the structure hash alone (the weight hash ""), without reading a weight.
    """
    import torch

    from pytest_rocm_parity.runner.wrappers import plain_view

    mods, tensors = plain_view(model)
    # Quantized storage (quant/storage.py) is judged by what it means, from the golden's
    # copy of it (docs/fp8.md): its codes count in the structure, its scales' layout and all its
    # values do not, so a correct conversion (OCP to FNUZ, per-tensor to per-channel scales) matches.
    modules = list(model.modules()) if hasattr(model, "modules") else []
    quantized = quantized_tensor_ids(modules)
    s = hashlib.sha256()
    for name, cls in mods:
        s.update(f"{name}:{cls};".encode() if classes else f"{name};".encode())
    w = hashlib.sha256()
    # parameters, then buffers, as named_parameters() and named_buffers() list them (tied ones once)
    params = [(n, t) for n, t in tensors if isinstance(t, torch.nn.Parameter)]
    buffers = [(n, t) for n, t in tensors if not isinstance(t, torch.nn.Parameter)]
    computed = set() if computed_buffers else {
        id(b) for m in modules for n in m._non_persistent_buffers_set if (b := m._buffers.get(n)) is not None}
    seen: set[int] = set()
    entries: list[str] = []   # the hashed "name:shape" of each tensor, kept so a mismatch can be named
    samples: list[tuple[str, Any]] = []
    dtypes: set[str] = set()  # of the floating parameters: a model loaded in another dtype is named as such
    with torch.no_grad():
        for name, p in params + buffers:
            if id(p) in seen:
                continue
            seen.add(id(p))
            if id(p) in quantized and p.element_size() != 1:
                continue
            entries.append(f"{name}:{tuple(p.shape)}")
            s.update(f"{entries[-1]};".encode())
            if isinstance(p, torch.nn.Parameter) and p.is_floating_point() and id(p) not in quantized:
                dtypes.add(str(p.dtype).removeprefix("torch."))
            if id(p) in quantized or id(p) in computed or not weights:
                continue
            flat = p.detach().reshape(-1)
            if flat.numel() == 0 or not (flat.is_floating_point() or flat.dtype in (torch.int64, torch.int32)):
                continue
            step = max(1, flat.numel() // 1024)
            samples.append((name, flat[::step][:1024]))
        # the samples of each device and dtype gathered by one cat and cast to float64 once, then one
        # copy to the host per device: a cast and a copy per tensor are some four hundred launches
        # on a GPU, which a cold replay pays with each kernel's first use. The bytes hashed are the
        # same as tensor by tensor.
        on_host: dict[int, Any] = {}
        groups: dict[tuple[str, Any], list[int]] = {}
        for i, (_, t) in enumerate(samples):
            groups.setdefault((str(t.device), t.dtype), []).append(i)
        for dev in {d for d, _ in groups}:
            order = [i for (d, _), idx in groups.items() if d == dev for i in idx]
            flat_all = torch.cat([torch.cat([samples[i][1] for i in idx]).to(torch.float64)
                                  for (d, _), idx in groups.items() if d == dev]).to("cpu").numpy()
            at = 0
            for i in order:
                n = samples[i][1].numel()
                on_host[i] = flat_all[at:at + n]
                at += n
        digests = []   # each tensor's own, so that a mismatch can be named (weights_changed)
        for i, (name, _t) in enumerate(samples):
            w.update(name.encode())
            w.update(on_host[i].tobytes())
            digests.append(f"{name}={hashlib.sha256(on_host[i].tobytes()).hexdigest()[:8]}")
    out = {"structure": s.hexdigest()[:16], "weights": w.hexdigest()[:16] if weights else "",
           "tensors": ";".join(entries), "dtypes": ",".join(sorted(dtypes))}
    adapted = adapter_modules(model)
    if adapted:
        out["adapted"] = ";".join(adapted)
    if weights:
        out["weight_digests"] = ";".join(digests)
    if not computed_buffers:
        out["weights_of"] = WEIGHTS_OF
    return out


# what a golden's weight hash covers (fingerprint); goldens without the key hashed computed buffers too
WEIGHTS_OF = "checkpoint"


def same_weights(model: Any, recorded: dict[str, Any]) -> bool:
    """Whether ``model`` has the weights a golden's fingerprint recorded, hashed as that golden hashed them."""
    return weights_now(model, recorded)["weights"] == recorded.get("weights")


# a Hugging Face config's fields that name how a run computes, not what the model is: another
# attention implementation or dtype is a migration the replay judges, not a changed model
_RUN_SETTINGS = frozenset({"attn_implementation", "dtype", "torch_dtype", "transformers_version", "use_cache",
                           "return_dict", "output_attentions", "output_hidden_states", "architectures",
                           "name_or_path", "experts_implementation"})


def model_config(model: Any) -> dict[str, Any] | None:
    """The scalar fields of a model's Hugging Face config (``model.config.to_dict()``), those that say
    what it computes (an eps, a rope theta, a softcap); None for a model without one."""
    to_dict = getattr(getattr(model, "config", None), "to_dict", None)
    if not callable(to_dict):
        return None
    try:
        d = to_dict()
    except Exception:   # a config that cannot serialise itself tells nothing
        return None
    if not isinstance(d, dict):
        return None
    return {k: v for k, v in sorted(d.items())
            if isinstance(k, str) and not k.startswith("_") and k not in _RUN_SETTINGS
            and (v is None or isinstance(v, (bool, int, float, str)))}


def config_changes(recorded: dict[str, Any] | None, now: dict[str, Any] | None) -> list[str]:
    """``field: before -> now`` for each config field the golden recorded that differs now."""
    if not recorded or now is None:
        return []
    return [f"{k}: {recorded[k]!r} -> {now[k]!r}" for k in sorted(recorded) if k in now and recorded[k] != now[k]]


def weights_now(model: Any, recorded: dict[str, Any]) -> dict[str, str]:
    """``model``'s fingerprint, its weights hashed as the golden that recorded ``recorded`` hashed them."""
    return fingerprint(model, computed_buffers=recorded.get("weights_of") != WEIGHTS_OF)


def adapter_modules(model: Any) -> list[str]:
    """Names of the modules that carry a PEFT adapter (wrappers.is_adapter_layer)."""
    from pytest_rocm_parity.runner.wrappers import is_adapter_layer

    if not hasattr(model, "named_modules"):
        return []
    return [n for n, m in model.named_modules() if is_adapter_layer(m)]


def merged_adapters(model: Any, recorded: dict[str, Any], now: dict[str, str] | None = None) -> list[str]:
    """Modules that carry an adapter on one side only: merged into the base weight on the other
    (``merge_and_unload`` for serving), so their weights differ by the merge while they compute
    the same function, which the replay judges by their outputs. ``now``: the model's fingerprint,
    where the caller has it (its adapters are listed there)."""
    was = recorded.get("adapted")
    before = set(was.split(";")) if isinstance(was, str) and was else set()
    adapted = adapter_modules(model) if now is None else [n for n in now.get("adapted", "").split(";") if n]
    return sorted(before.symmetric_difference(adapted))


def weights_changed(model: Any, recorded: dict[str, Any], merged: list[str] | tuple[str, ...] = (),
                    now: dict[str, str] | None = None) -> str:
    """'' when ``model`` has the weights a golden's fingerprint recorded, else what changed, in words:
    a model loaded in another dtype than the captured one is named as such, else the tensors whose
    sampled values differ (goldens that recorded each tensor's digest). ``merged``: modules whose
    own tensors may differ (merged_adapters); ``now``: weights_now(model, recorded), where the
    caller has it."""
    now_fp = now if now is not None else weights_now(model, recorded)
    if now_fp["weights"] == recorded.get("weights"):
        return ""
    was, dtypes = recorded.get("dtypes"), now_fp["dtypes"]
    if isinstance(was, str) and was and dtypes and dtypes != was:
        return (f"the model's weights changed: its floating parameters are {dtypes.replace(',', ', ')}, the captured "
                f"model's were {was.replace(',', ', ')}. Give the replay the model in the dtype it was captured "
                f"from (the replay casts it to each rung itself)")
    before = _digests(recorded.get("weight_digests"))
    if not before:
        return "the model's weights changed"
    after = _digests(now_fp.get("weight_digests"))
    if after == before:
        # every tensor the same under the same name, hashed in another order: a port that declares
        # the same modules in another order (the weight hash follows named_parameters())
        return ""
    differ = [n for n, d in after.items() if before.get(n, d) != d]
    if not differ:
        return "the model's weights changed"
    differ = [n for n in differ if n.rpartition(".")[0] not in merged]
    if not differ:
        return ""
    names = f"{', '.join(differ[:3])}{f' and {len(differ) - 3} more' if len(differ) > 3 else ''}"
    return (f"the model's weights changed: {names} ({len(differ)} of {len(after)} tensors) "
            f"{'differs' if len(differ) == 1 else 'differ'} from the captured model's (a checkpoint loaded or "
            f"converted otherwise on this machine fails the same way: compare those tensors with the reference's "
            f"before regenerating)")


def _digests(text: Any) -> dict[str, str]:
    if not isinstance(text, str) or not text:
        return {}
    return dict(part.rsplit("=", 1) for part in text.split(";") if "=" in part)


def structure_changes(model: Any, recorded: dict[str, Any]) -> str:
    """In words, which parameters and buffers a model added, removed or reshaped against a golden's
    fingerprint ('' when the golden did not record them, or when only module names differ)."""
    old = recorded.get("tensors")
    if not isinstance(old, str) or not old:
        return ""

    def shapes(entries: str) -> dict[str, str]:
        return dict(e.rsplit(":", 1) for e in entries.split(";") if ":" in e)
    a, b = shapes(old), shapes(fingerprint(model, weights=False)["tensors"])
    added = [n for n in b if n not in a]
    parts = [f"{what} {names[:5]}{' ...' if len(names) > 5 else ''}" for what, names in (
        ("added", added), ("removed", [n for n in a if n not in b]),
        ("reshaped", [f"{n} {a[n]} -> {b[n]}" for n in a if n in b and a[n] != b[n]])) if names]
    return ", ".join(parts) + _untied(model, added, a, b)


def _untied(model: Any, added: list[str], recorded: dict[str, str], now: dict[str, str]) -> str:
    """Where the parameter added is the output embedding, and the golden holds the input embedding of
    its shape: the captured model tied the two (named_parameters() lists a tied weight once), and
    this one does not. A checkpoint loaded into a config that unties them leaves the head as it was
    initialised: regenerating would approve a model whose outputs are noise."""
    out_fn, in_fn = getattr(model, "get_output_embeddings", None), getattr(model, "get_input_embeddings", None)
    if not added or not callable(out_fn) or not callable(in_fn):
        return ""
    try:
        head, emb = out_fn(), in_fn()
    except (AttributeError, NotImplementedError, TypeError):
        return ""
    names = {id(p): n for n, p in model.named_parameters(remove_duplicate=False)}
    h, e = names.get(id(getattr(head, "weight", None))), names.get(id(getattr(emb, "weight", None)))
    if h is None or e is None or h not in added or e not in recorded or recorded[e] != now.get(h):
        return ""
    return (f" ({h} is a weight of its own here; the captured model had it tied to {e}, which it lists alone: "
            f"a checkpoint loaded with tie_word_embeddings=False leaves {h} as it was initialised, so compare "
            f"the config with the reference's before regenerating)")


def same_structure(model: Any, recorded: dict[str, Any], now: dict[str, str] | None = None) -> bool:
    """Whether ``model`` has the structure a golden's fingerprint recorded (either hash: see
    fingerprint); ``now``: the model's fingerprint without classes, where the caller has it."""
    want = recorded.get("structure")
    if now is not None and now["structure"] == want:
        return True
    return any(fingerprint(model, classes, weights=False)["structure"] == want
               for classes in ((True,) if now is not None else (False, True)))


KEEP_PLACEMENT = "model"


def home_device(model: Any, device: Any) -> Any:
    """Where inputs and goldens go: ``device``, or the first parameter's device for a split model."""
    if device != KEEP_PLACEMENT:
        return device
    first = next(iter(model.parameters()), None)
    return first.device if first is not None else "cpu"


@dataclass
class ModelWalk:
    """One walk of a model's module tree, shared by what a pass needs to know of it.

    Why: preparing the model, entering eval mode and checking the layer selection each walked the
    tree (a quarter of a millisecond each for a 300-module model), on every pass of a replay whose
    forward is bound by the host.
    """

    modules: list[Any]
    tensors: list[Any]      # every parameter and buffer (a tied one twice)
    structure: tuple[Any, ...]   # child names and module identities in walk order: the tree's signature
    # any module in training mode at the walk: what eval_mode(model, walk) acts on, read here while
    # the walk touches every module anyway (read again per pass, after a forward has evicted the
    # modules from the host's caches, it cost 50-61 us at 293 modules: bench/bench_pass_contexts.py)
    training: bool = False

    def stamp(self) -> tuple[Any, ...] | None:
        """The tree's signature with the data pointer and dtype of every tensor: equal only while no
        module was swapped and no tensor moved or cast (either makes new storages). None where a
        tensor has no storage of its own (a wrapper subclass)."""
        try:
            ptrs = tuple(map(_DATA_PTR, self.tensors))
        except (RuntimeError, NotImplementedError):
            return None
        return self.structure, ptrs, tuple(map(_DTYPE, self.tensors))


def walk_model(model: Any) -> ModelWalk:
    mods: list[Any] = []
    names: list[Any] = []
    tensors: list[Any] = []
    stack = [model]
    pop, push, keep, name, add = stack.pop, stack.extend, mods.append, names.append, tensors.extend
    training = False
    while stack:
        mod = pop()
        keep(mod)
        training = training or mod.training
        kids = mod._modules
        if kids:
            name(tuple(kids))
            push(reversed([c for c in kids.values() if c is not None]))
        else:
            name(None)
        if mod._parameters:
            add(t for t in mod._parameters.values() if t is not None)
        if mod._buffers:
            add(t for t in mod._buffers.values() if t is not None)
    return ModelWalk(mods, tensors, (tuple(names), tuple(map(id, mods)), tuple(map(type, mods))), training)


_DATA_PTR = operator.methodcaller("data_ptr")
_DTYPE = operator.attrgetter("dtype")
_PLACED: dict[int, tuple[Any, ...]] = {}   # id(model) -> stamp of a model found in place (see prepare_model)


def prepare_model(model: Any, device: Any, dtype: Any, walk: ModelWalk | None = None) -> Any:
    """A copy of the model on ``device`` in ``dtype`` (the model itself when it already is).

    ``device="model"`` keeps the model's own placement (blocks split over GPUs by hand or by
    accelerate's device_map) and only casts the dtype.
    """
    # every parameter and buffer (a tied one twice): the module walk, without named_parameters'
    # de-duplication, which costs most of a millisecond on a 1B model
    walk = walk or walk_model(model)
    params = walk.tensors
    # The same storages as when this model was last found in place: nothing moved or was cast (a
    # move or a cast makes new storages). Saves a device/dtype check per tensor on every pass.
    stamp = (str(device), str(dtype), tuple(p.data_ptr() for p in params))
    if _PLACED.get(id(model)) == stamp:
        return model
    kept = quantized_tensor_ids(walk.modules)
    fl = [p for p in params if p.is_floating_point() and id(p) not in kept]
    if device == KEEP_PLACEMENT:
        if all(p.dtype == dtype for p in fl):
            _PLACED[id(model)] = stamp
            return model
        return cast_module(copy.deepcopy(model), dtype=dtype)
    target = _dev(device)
    if all(p.device == target and p.dtype == dtype for p in fl):
        _PLACED[id(model)] = stamp
        return model
    # Copy on the host side when moving devices, so the source never holds two copies on a GPU.
    return cast_module(copy.deepcopy(model), device, dtype)


def _dev(device: Any) -> Any:
    import torch

    d = torch.device(device)
    if d.type == "cuda" and d.index is None:
        d = torch.device("cuda", torch.cuda.current_device())
    return d


_TRAINING = operator.attrgetter("training")


def set_eval(model: Any) -> Any:
    """``model.eval()``, or each module's flag set where the model refuses eval() (torch.export's
    module: the mode it was exported in is in its graph); returns the model."""
    try:
        model.eval()
    except NotImplementedError:
        for mod in model.modules():
            mod.training = False
    return model


@contextlib.contextmanager
def eval_mode(model: Any, walk: ModelWalk | None = None) -> Iterator[None]:
    """Eval mode for the block, each module's own flag restored afterwards.

    Module.train() walks and sets every submodule (milliseconds on a large model), so a model that
    is in eval mode already, the usual case, is left untouched. ``walk``: of this very model, taken
    since its last change of mode (the replay's, for its passes): its ``training``
    then decides, with no look at the modules.
    """
    mods = walk.modules if walk is not None else list(model.modules())
    training = walk.training if walk is not None else any(map(_TRAINING, mods))   # map: in C
    if not training:
        yield
        return
    flags = [(mod, mod.training) for mod in mods]
    set_eval(model)
    try:
        yield
    finally:
        for mod, f in flags:
            mod.training = f


# The bytes of buffer copies a check keeps to put its model's state back between passes (BufferState)
BUFFER_COPY_BYTES = 64 << 20


class BufferState:
    """The buffers of a model's modules as they were before a check's first forward, written back
    before each later pass and after the last.

    Why: a module may update a buffer in place in its forward in eval mode (a running average, a
    step counter). Each pass of a check (a recording again, the float64 truth, each isolated level)
    must start from the state the reference's forward started from, or it computes something else
    than the golden records; and the caller's model is left as it was given. A buffer the module
    replaced with a new tensor is its own state moved on (a dynamic rotary table grown, its length
    kept beside it) and stays. Writes through a raw pointer bump no version counter and are not seen;
    an inference tensor keeps none, so such a buffer is written back before every pass. Copies are
    kept of the smallest buffers up to BUFFER_COPY_BYTES in all: state a forward updates is small
    (statistics, counters), while a quantized model's packed weights or a static KV cache, which
    may be buffers of gigabytes, are not copied.
    """

    def __init__(self, modules: Sequence[Any]) -> None:
        self._kept: list[tuple[Any, int | None, Any]] = []
        found = {id(b): b for mod in modules for b in mod._buffers.values() if b is not None}
        room = BUFFER_COPY_BYTES
        for b in sorted(found.values(), key=lambda t: t.numel() * t.element_size()):
            room -= b.numel() * b.element_size()
            if room < 0:
                break
            self._kept.append((b, None if b.is_inference() else b._version, b.detach().clone()))

    def restore(self) -> None:
        """Write back every buffer written since the snapshot (or since the last restore)."""
        import torch

        for i, (b, version, saved) in enumerate(self._kept):
            if version is None:
                with torch.inference_mode():
                    b.copy_(saved)
            elif b._version != version:
                with torch.no_grad():
                    b.copy_(saved)
                self._kept[i] = (b, b._version, saved)

    def __enter__(self) -> BufferState:
        return self

    def __exit__(self, *exc: object) -> None:
        self.restore()


@contextlib.contextmanager
def numerics(rung: str, tf32: bool = False) -> Iterator[None]:
    """fp32 rungs run with TF32 off (unless the policy says it is deployed); restored afterwards.
    Other rungs touch nothing (reading and restoring the flags cost 22-24 us a pass after a forward:
    bench/bench_pass_contexts.py)."""
    import torch

    if rung != "float32":
        yield
        return
    old = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    try:
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


def autocast_dtype(device: Any) -> str | None:
    """The dtype ``torch.autocast`` casts to around this call on ``device``'s type, None when it is
    off. It is part of what a check computes (autocast runs a float32 model's matmuls in bf16), so
    the golden records it and a replay compares (autocast_note)."""
    import torch

    kind = torch.device(device).type
    try:
        if not torch.is_autocast_enabled(kind):
            return None
        return dt.name_of(torch.get_autocast_dtype(kind))
    except (RuntimeError, TypeError, ValueError):   # a device type autocast does not know
        return None


# The device types whose torch.autocast state a module call is recorded under (ROCm's is "cuda")
AUTOCAST_DEVICES = ("cpu", "cuda")


def autocast_state() -> tuple[tuple[str, bool, Any], ...]:
    """(device type, enabled, dtype) of torch.autocast for each of AUTOCAST_DEVICES, as it is now."""
    import torch

    return tuple((kind, torch.is_autocast_enabled(kind), torch.get_autocast_dtype(kind)) for kind in AUTOCAST_DEVICES)


@contextlib.contextmanager
def autocast_as(state: tuple[tuple[str, bool, Any], ...] | None) -> Iterator[None]:
    """torch.autocast as ``state`` (autocast_state) had it, for the device types where it differs from
    now. Why: a module's isolated call runs outside its parent's forward, so an autocast the model
    opens in its own forward (AMP as training scripts write it) is off there, and the module would
    meet its bf16 golden input with float32 weights, or compute in another precision than it did."""
    import torch

    with contextlib.ExitStack() as stack:
        for kind, enabled, dtype in state or ():
            if (torch.is_autocast_enabled(kind), torch.get_autocast_dtype(kind)) != (enabled, dtype):
                stack.enter_context(torch.autocast(kind, dtype=dtype, enabled=enabled))
        yield


def autocast_note(manifest: dict[str, Any], device: Any) -> str | None:
    """Why a replay's numbers may differ from the golden's for a reason that is not the backend: the
    candidate ran under another torch.autocast than the capture. A note, not an error: a rung at or
    below the autocast dtype computes the same either way."""
    ref, now = manifest.get("autocast"), autocast_dtype(device)
    if ref == now:
        return None
    if ref is None:
        return (f"torch.autocast ({now}) is on around this check and was not at capture: the ops it covers "
                f"(matmuls, convolutions) ran in {now} here and in each rung's own dtype on the reference, "
                f"so a wider rung fails as drift; run the check outside torch.autocast, or capture it under "
                f"the same autocast")
    if now is None:
        return (f"the golden was captured under torch.autocast ({ref}) and this check runs without it: the ops "
                f"autocast covers ran in {ref} on the reference and in each rung's own dtype here; run the "
                f"check under the same torch.autocast, or regenerate the golden without it")
    return (f"torch.autocast casts to {now} around this check and cast to {ref} at capture; use the "
            f"capture's autocast dtype, or regenerate the golden with this one")


@contextlib.contextmanager
def explained_by(name: str, why: str | None | Callable[[], str | None]) -> Iterator[None]:
    """A replay that raises while a setting differs from the capture's (``why``, autocast_note's):
    the error names the setting. A golden bf16 activation fed to an fp32 matmul fails in torch with
    a dtype message that does not say where the bf16 came from. ``why`` may be a function, read
    when the error comes (what the replay saw before it raised)."""
    try:
        yield
    except Exception as exc:
        if callable(why):
            why = why()
        if why and not isinstance(exc, ParityError):
            raise InvalidArgument(f"the replay of {name!r} failed ({type(exc).__name__}: {str(exc)[:300]}): "
                                  f"{why}") from exc
        raise


# ---------------------------------------------------------------------------------------------
# hooks

def submodule(model: Any, name: str) -> Any:
    """``model.get_submodule(name)`` read from the ``_modules`` dicts: get_submodule's checks cost
    more than the lookup, for each selected module on every pass."""
    return _descend(model, name)[0]


def _descend(model: Any, name: str, kinds: tuple[type, ...] = ()) -> tuple[Any, bool]:
    """Module ``name`` of ``model``, and whether it or a module on the way to it is one of ``kinds``."""
    mod = model
    inside = isinstance(mod, kinds)
    for part in name.split(".") if name else ():
        nxt = mod._modules.get(part)
        if nxt is None:
            return model.get_submodule(name), False   # its error names what is missing
        mod = nxt
        inside = inside or isinstance(mod, kinds)
    return mod, inside


class Hooks:
    """Forward (pre-)hooks on the selected modules, keyed by module name and call index.

    One pre-hook and one post-hook function serve every selected module, finding its selection
    entry by the module's identity: each function passed through outside_dynamo is a wrapper
    built by torch._dynamo.disable, which costs more than registering the hook.
    """

    def __init__(self, model: Any, selected: list[Selected],
                 on_input: Callable[[str, Selected, Any, Any], tuple[Any, Any] | None] | None = None,
                 on_output: Callable[[str, Selected, Any], None] | None = None,
                 golden: dict[str, dict[str, Any]] | None = None) -> None:
        self.calls: dict[str, int] = {}
        # module name -> {call key: its recorded constants}, for modules whose calls the golden tells
        # apart by a constant argument: their order may change between processes (a loop over a set
        # of strings, whose order follows the hash seed), so a call takes the key of its constants
        self._by_const = _calls_by_constant(golden) if golden else {}
        self._taken: dict[str, set[str]] = {}
        self.order: list[str] = []
        self.handles: list[Any] = []
        self.on_input = on_input
        self.on_output = on_output
        self._current: dict[str, list[str]] = {}
        self._selected: dict[int, Selected] = {}   # id(module) -> its entry (a module is selected once)
        from pytest_rocm_parity.runner.wrappers import outside_dynamo, unwrap

        model = self._model = unwrap(model)
        pre, post = outside_dynamo(self._pre), outside_dynamo(self._post)
        kinds = hook_sensitive_kinds()
        post_unnested = None
        for sel in selected:
            mod, fused = _descend(model, sel.name, kinds)
            self._selected[id(mod)] = sel
            if fused:
                post_unnested = post_unnested or outside_dynamo(self._post_unnested)
                self.handles.append(ForwardWrap(mod, _hooked(mod, pre, post_unnested)))
                continue
            self.handles.append(mod.register_forward_pre_hook(pre, with_kwargs=True))
            self.handles.append(mod.register_forward_hook(post, with_kwargs=True))

    @staticmethod
    def key(name: str, call: int) -> str:
        return name if call == 0 else f"{name}#{call}"

    def _pre(self, mod: Any, args: Any, kwargs: Any) -> Any:
        sel = self._selected.get(id(mod))
        if sel is None:
            # a copy of a selected module made inside the forward (copy.deepcopy carries its hooks:
            # a BatchNorm folded on the fly): not the module the golden names, so not judged itself;
            # its effect is, in the modules and outputs around it
            return None
        call = self.calls.get(sel.name, 0)
        self.calls[sel.name] = call + 1
        key = self.key(sel.name, call)
        if sel.name in self._by_const:
            key = self._key_by_constants(sel.name, key, args, kwargs)
        self._current.setdefault(sel.name, []).append(key)
        self.order.append(key)
        if self.on_input is not None:
            return self.on_input(key, sel, args, kwargs)
        return None

    def _key_by_constants(self, name: str, key: str, args: Any, kwargs: Any) -> str:
        """The first key of ``name`` not yet taken whose recorded constants are this call's; ``key``
        (the call's place in order) where it matches or none does."""
        from pytest_rocm_parity.runner.tree import split_leaves

        recorded = self._by_const[name]
        consts = _canonical(split_leaves({"args": args, "kwargs": kwargs})[1])
        taken = self._taken.setdefault(name, set())
        if recorded.get(key) != consts:
            key = next((k for k, c in recorded.items() if c == consts and k not in taken), key)
        taken.add(key)
        return key

    def _post(self, mod: Any, _args: Any, _kwargs: Any, output: Any) -> Any:
        sel = self._selected.get(id(mod))
        if sel is None:   # a copy made inside the forward (_pre)
            return None
        key = self._current[sel.name].pop()
        if self.on_output is not None:
            return self.on_output(key, sel, output)   # not None: replaces the module's output
        return None

    def _post_unnested(self, mod: Any, args: Any, kwargs: Any, output: Any) -> Any:
        """_post for a module inside a fused-path one, where the nested tensors of
        nn.TransformerEncoder appear (a property read here under the data flow's mode would count as
        one of the model's operations, so the check stays off every other module)."""
        if id(mod) in self._selected and \
                any(getattr(t, "is_nested", False) for t in (output if isinstance(output, (tuple, list)) else (output,))):
            sel = self._selected[id(mod)]
            self._current[sel.name].pop()
            encoder = self._encoder_above(sel.name)
            fix = (f"Build it with enable_nested_tensor=False (the model is the encoder itself, so no module above "
                   f"its layers can be judged instead)" if encoder == "" else
                   f"Judge the encoder as a whole (layers=[{encoder or 'its name'!r}], drill=0: its output is a padded "
                   f"tensor again), or build it with enable_nested_tensor=False")
            raise InvalidArgument(
                f"{sel.name} returned a nested tensor (nn.TransformerEncoder(enable_nested_tensor=True) given a "
                f"src_key_padding_mask hands its layers one), whose padded positions are not stored, so it "
                f"cannot be compared position by position. {fix}")
        return self._post(mod, args, kwargs, output)

    def _encoder_above(self, name: str) -> str | None:
        """The name of the innermost nn.TransformerEncoder on the way to module ``name`` ("" where it is
        the model itself), None where there is none."""
        import torch

        mod, found, path = self._model, None, []
        if isinstance(mod, torch.nn.TransformerEncoder):
            found = ""
        for part in name.split(".") if name else ():
            mod = mod._modules.get(part)
            if mod is None:
                break
            path.append(part)
            if isinstance(mod, torch.nn.TransformerEncoder):
                found = ".".join(path)
        return found

    def standalone(self, mod: Any, args: Any, kwargs: Any) -> Any:
        """``mod.forward(*args, **kwargs)`` called from inside one of these hooks, on its own: the
        modules it calls are neither seen nor counted, so the forward's own calls keep their keys."""
        calls, order = dict(self.calls), len(self.order)
        taken = {n: set(t) for n, t in self._taken.items()}
        on_input, on_output = self.on_input, self.on_output
        self.on_input = self.on_output = None
        try:
            return mod.forward(*args, **kwargs)
        finally:
            self.calls.clear()
            self.calls.update(calls)
            self._taken = taken
            del self.order[order:]
            self.on_input, self.on_output = on_input, on_output

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles.clear()

    def __enter__(self) -> Hooks:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


def _canonical(consts: dict[str, Any]) -> str:
    """A call's constants as one string, the None ones left out: an input one implementation leaves
    None (no mask where the attention is causal anyway) and another fills with a tensor tells no
    call from another, and keyed by it a candidate's first call would take a later call's key."""
    import json

    return json.dumps({k: v for k, v in consts.items() if v is not None}, sort_keys=True, default=str)


def _calls_by_constant(golden: dict[str, dict[str, Any]]) -> dict[str, dict[str, str]]:
    """Module name -> {key: canonical constants} where a module's recorded calls differ in them
    (only a module called more than once can: the others are not canonicalised on every pass)."""
    keys_of: dict[str, list[str]] = {}
    for key, entry in golden.items():
        keys_of.setdefault(entry["name"], []).append(key)
    by_name = {n: {k: _canonical(golden[k].get("const_in", {})) for k in keys}
               for n, keys in keys_of.items() if len(keys) > 1}
    return {n: calls for n, calls in by_name.items() if len(set(calls.values())) > 1}


# torch.nn modules whose forward takes its fused inference path only when no hook is registered on
# it or on a module inside it (TransformerEncoderLayer's "forward pre-/hooks are attached to the
# module") and no torch function mode is active (TransformerEncoder's nested-tensor path too):
# instrumented that way, the candidate would be judged on a Python path it does not run in production
_HOOK_SENSITIVE = ("TransformerEncoderLayer",)
_MODE_SENSITIVE = ("TransformerEncoder", "TransformerEncoderLayer")


def hook_sensitive_kinds() -> tuple[type, ...]:
    """The module classes that a hook registered on them, or on a module inside them, would take
    off a fused path: a selected module is wrapped instead of hooked when it is one of them or lies
    inside one (found on the way down to it, not by walking the whole model on every pass)."""
    import torch

    return tuple(getattr(torch.nn, n) for n in _HOOK_SENSITIVE)


def mode_sensitive(model: Any) -> list[Any]:
    """The outermost modules of ``model`` whose fused path a torch function mode turns off."""
    import torch

    kinds = tuple(getattr(torch.nn, n) for n in _MODE_SENSITIVE)
    inside: set[int] = set()
    found = []
    for m in model.modules():   # parents before children
        if isinstance(m, kinds) and id(m) not in inside:
            found.append(m)
            inside.update(id(sub) for sub in m.modules())
    return found


class ForwardWrap:
    """``wrap(forward)`` set as one module's forward on the instance, where neither the hook check of
    a fused path nor a module's own hooks see it; ``remove`` puts the forward back."""

    def __init__(self, mod: Any, wrap: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
        self.mod, self.own = mod, vars(mod).get("forward")
        forward = wrap(mod.forward)
        forward.parity_wrapper = True   # type: ignore[attr-defined]   # not the user's patch (capture.patched_forwards)
        mod.forward = forward

    def remove(self) -> None:
        if self.own is not None:
            self.mod.forward = self.own
        else:
            vars(self.mod).pop("forward", None)


def captured_elsewhere(manifest: dict[str, Any], spec: CheckSpec) -> str:
    """What a stale message adds where another test captured the golden: two tests of one name (the
    default leaves the directory out) would each make the other's golden stale, and a regeneration
    from one replaces the other's."""
    from pytest_rocm_parity.options import default_name

    owner = manifest.get("test")
    if not isinstance(owner, str) or not owner or not spec.test or owner == spec.test:
        return ""
    defaulted = spec.name.split("#", 1)[0] == default_name(spec.test)
    return (f". It was captured by {owner}, and this check runs in {spec.test}: if that is another test "
            f"with the same name{' (the default leaves the directory out)' if defaulted else ''}, give one of "
            f"them its own name= instead of regenerating")


def golden_regen_command(manifest: dict[str, Any], spec: CheckSpec) -> str:
    """The command that regenerates the golden ``spec`` was judged against: from the test that
    captured it where that is another test (variants judged against one golden), since this test's
    capture would write its own outputs for all of them."""
    from pytest_rocm_parity.options import regen_command

    owner = manifest.get("test")
    if isinstance(owner, str) and owner and spec.test and owner != spec.test:
        return regen_command(spec.name, owner, spec.command_flags)
    return spec.regen_command


def _hooked(mod: Any, pre: Callable[..., Any], post: Callable[..., Any]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A forward that calls ``pre`` and ``post`` as forward hooks with kwargs would be called."""
    def wrap(inner: Callable[..., Any]) -> Callable[..., Any]:
        def forward(*args: Any, **kwargs: Any) -> Any:
            swapped = pre(mod, args, kwargs)
            if swapped is not None:
                args, kwargs = swapped
            out = inner(*args, **kwargs)
            replaced = post(mod, args, kwargs, out)
            return out if replaced is None else replaced
        return forward
    return wrap


def _run(model: Any, args: Any, kwargs: Any) -> Any:
    import torch

    with torch.inference_mode():
        return floats_as_tensors(model(*args, **kwargs))



def substitute(args: Any, kwargs: Any, keys: dict[str, str], fetch: Callable[[str], Any],
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
        want = t.device if device is None or device == KEEP_PLACEMENT else device
        return g if g.device == want else g.to(want)
    import torch

    root: Any = {"args": args, "kwargs": kwargs}
    try:   # the common shapes (tensors in plain tuples, lists and dicts), without walking every leaf
        root = _patch(root, _plan(keys), fn, torch.Tensor)
    except _NotPlain:
        root = map_tensors({"args": args, "kwargs": kwargs}, fn)
    return tuple(root["args"]), root["kwargs"]


# A plan node: (part, its position in a tuple or list or -1, the node below it or the leaf's full path)
_Plan = tuple[tuple[str, int, Any], ...]
_PLANS: dict[tuple[str, ...], _Plan] = {}


def _plan(keys: dict[str, str]) -> _Plan:
    """The leaf paths of ``keys`` as a tree, each part's position parsed once. Made once per set of
    paths: a model's calls share a few, and every pass swaps the inputs of every selected call."""
    paths = tuple(keys)
    hit = _PLANS.get(paths)
    if hit is not None:
        return hit
    tree: dict[str, Any] = {}
    for path in paths:
        node = tree
        parts = path.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = path

    def freeze(node: dict[str, Any]) -> _Plan:
        return tuple((part, int(part) if part.isdigit() else -1, sub if isinstance(sub, str) else freeze(sub))
                     for part, sub in node.items())
    if len(_PLANS) > 4096:
        _PLANS.clear()
    _PLANS[paths] = hit = freeze(tree)
    return hit


def _patch(obj: Any, plan: _Plan | str, fn: Callable[[str, Any], Any], tensor: type) -> Any:
    """``obj`` with each planned leaf replaced by fn(path, tensor); each container on the way copied once.

    ``plan``: a node of _plan, or at a leaf the leaf's full path. ``tensor``: torch.Tensor.
    """
    if isinstance(plan, str):
        if not isinstance(obj, tensor):
            raise _NotPlain(plan)
        return fn(plan, obj)
    kind = type(obj)
    if kind is tuple or kind is list:
        items = list(obj)
        for part, i, sub in plan:
            if not 0 <= i < len(items):
                raise _NotPlain(part)
            items[i] = _patch(items[i], sub, fn, tensor)
        return items if kind is list else tuple(items)
    if kind is dict and all(type(k) is str for k in obj):
        out = dict(obj)
        for part, _i, sub in plan:
            if part not in obj:
                raise _NotPlain(part)
            out[part] = _patch(obj[part], sub, fn, tensor)
        return out
    raise _NotPlain(str(kind))


class _NotPlain(Exception):
    """A path through a container _patch does not rebuild: map_tensors walks it instead."""
