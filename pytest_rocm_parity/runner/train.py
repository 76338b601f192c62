"""Training parity: the loss, every selected module's gradients and the optimizer's update, judged
per layer against a float64 truth, with the culprit named.

Why its own path: a custom backward that drops a term still gives a plausible loss curve. The
forward's golden cannot see it; gradients can, judged as the forward is: the candidate's error
against a float64 truth paired with the reference's (compare.residual_metrics), both propagated
(the whole backward) and isolated (each module's backward fed the golden input of its forward and
the golden gradient of its output).

Each rung of the golden holds (keys of the rung's safetensors file):

* ``input/<path>``: the model inputs, cast to the rung; ``loss`` and ``gtruth/loss``;
* per selected module call: ``x/<call>`` its golden input with ``truth/x/<call>``, ``y/<call>`` its
  output with ``truth/y/<call>`` (the step's forward), ``g/<call>`` the golden gradient of its
  output (the propagated reference too) with ``gtruth/go/<call>``, ``ix/<call>`` with
  ``truth/ix/<call>`` (its isolated input gradient) and ``ip/<call>/<param>`` with
  ``truth/ip/<call>/<param>`` (its own parameters' isolated gradients);
* per parameter: ``pg/<param>`` with ``gtruth/pg/<param>`` (the whole backward's gradient), and with
  an optimizer ``upd/<param>`` with ``gtruth/upd/<param>`` (the update after ``steps`` steps) and
  ``iupd/<param>`` with ``truth/iupd/<param>`` (one step from the golden weights and gradients).

``truth``/``gtruth`` entries are residuals (truth - reference), as in the forward's goldens.
"""
from __future__ import annotations

import contextlib
import copy
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

from pytest_rocm_parity import __version__
from pytest_rocm_parity.judging import dtypes as dt
from pytest_rocm_parity.judging.compare import residual_metrics
from pytest_rocm_parity.runner.capture import float64_kernels, residual, truth_errors
from pytest_rocm_parity.runner.engine import (BufferState, CheckSpec, Hooks, autocast_as, autocast_dtype, autocast_note,
                                              autocast_state,
                                              captured_elsewhere, cast_inputs, explained_by, fingerprint,
                                              golden_regen_command, home_device, normalize_inputs, same_structure,
                                              structure_changes, submodule, weights_changed)
from pytest_rocm_parity.errors import BackwardError, GoldenStale, InvalidArgument, ParityError
from pytest_rocm_parity.golden.sketch import leaf_group
from pytest_rocm_parity.golden.reader import RungReader
from pytest_rocm_parity.golden.store import FORMAT_VERSION, GoldenStore, expected_digest
from pytest_rocm_parity.judging.judge import Rule, judge_layer, jumped, minimal_failing, note_undecided
from pytest_rocm_parity.judging.records import CheckResult, LayerRecord, LeafMetrics, module_of
from pytest_rocm_parity.runner.selection import Selected, region_between, select
from pytest_rocm_parity.runner.tree import map_tensors, tensor_leaves
from pytest_rocm_parity.runner.wrappers import (inlines_compiled_children, plain_copy, torch_training_kinds,
                                                training_paths, unwrap)

LOSS = "<loss>"
OPTIMIZER = "optimizer"


def optimizer_factory(optimizer: Any) -> Callable[[list[tuple[str, Any]]], Any] | None:
    """``optimizer`` as a function of the (name, parameter) pairs it trains: a torch.optim class or a
    (class, kwargs) pair gets the parameters alone (any optimizer class takes them); a factory gets the
    pairs, so that it can build parameter groups by name (no weight decay on norms and biases) as a
    training script does with ``model.named_parameters()``."""
    import torch

    if optimizer is None:
        return None
    if isinstance(optimizer, tuple) and len(optimizer) == 2 and isinstance(optimizer[0], type) \
            and isinstance(optimizer[1], dict):
        cls, kw = optimizer
        _probe_optimizer(cls, kw)
        return lambda named: cls([p for _, p in named], **kw)
    if isinstance(optimizer, type):
        _probe_optimizer(optimizer, {})
        return lambda named: optimizer([p for _, p in named])
    if isinstance(optimizer, torch.optim.Optimizer):
        raise InvalidArgument(f"optimizer=<a {type(optimizer).__name__} instance>: built on the model's own "
                              f"parameters; pass its class and settings instead, e.g. ({type(optimizer).__name__}, "
                              f"{{'lr': {optimizer.defaults.get('lr', 1e-3)!r}}}): the check builds one on copies")
    if callable(optimizer):
        def built(named: list[tuple[str, Any]]) -> Any:
            opt = optimizer(list(named))
            if not isinstance(opt, torch.optim.Optimizer):
                raise InvalidArgument(
                    f"optimizer={describe(optimizer)} returned a {type(opt).__name__}, not a torch.optim optimizer "
                    f"(a subclass of torch.optim.Optimizer, whose zero_grad() and step() the check runs); a "
                    f"learning-rate scheduler is not judged: return the optimizer it would drive")
            return opt
        return built
    raise InvalidArgument(f"optimizer={optimizer!r}: give a torch.optim class (torch.optim.AdamW), a pair "
                          f"(torch.optim.AdamW, {{'lr': 1e-3}}) or a function of the (name, parameter) pairs")


def _probe_optimizer(cls: type, kw: dict[str, Any]) -> None:
    """InvalidArgument where ``cls(params, **kw)`` cannot be the step check_train runs: settings the
    class refuses, or a step that needs a closure (LBFGS re-evaluates the loss inside step())."""
    import inspect

    import torch

    shown = f"({cls.__name__}, {kw!r})" if kw else cls.__name__
    if not issubclass(cls, torch.optim.Optimizer):
        raise InvalidArgument(f"optimizer={shown}: {cls.__module__}.{cls.__qualname__} is not a torch.optim "
                              f"optimizer (a subclass of torch.optim.Optimizer), whose zero_grad() and step() the "
                              f"check runs; give one, e.g. (torch.optim.AdamW, {{'lr': 1e-3}}), or a function of "
                              f"the (name, parameter) pairs that returns one")
    try:
        closure = inspect.signature(cls.step).parameters.get("closure")   # type: ignore[attr-defined]
    except (AttributeError, TypeError, ValueError):
        closure = None
    if closure is not None and closure.default is inspect.Parameter.empty:
        raise InvalidArgument(f"optimizer={shown}: its step() needs a closure that re-evaluates the loss; "
                              f"check_train judges one step() on the gradients of one backward, so such an "
                              f"optimizer is not supported")
    try:
        cls([torch.nn.Parameter(torch.zeros(1))], **kw)
    except Exception as exc:   # the class's own refusal of these settings, whatever its type
        raise InvalidArgument(f"optimizer={shown}: {cls.__name__} refused these settings ({type(exc).__name__}: "
                              f"{exc}); give the keyword arguments its constructor takes") from None


def describe(obj: Any) -> str | None:
    """The manifest's words for an optimizer or a clipping function: a function by its qualified name
    (its repr holds an address, which would change the golden's bytes on every capture)."""
    if obj is None:
        return None
    if callable(obj) and not isinstance(obj, type) and hasattr(obj, "__qualname__"):
        return f"{getattr(obj, '__module__', '?')}.{obj.__qualname__}"
    return repr(obj)


def optimizer_settings(opt: Any) -> dict[str, Any]:
    """What an optimizer was built with, for the manifest: its class, its defaults and each parameter
    group's hyper-parameters (with the group's size), as JSON. Why: a factory is recorded by its name
    alone, so without them a factory that changed Adam's betas would look like the golden's."""
    import torch

    def plain(v: Any) -> Any:
        if isinstance(v, torch.Tensor):   # lr or betas given as tensors (capturable optimizers)
            return v.item() if v.numel() == 1 else v.tolist()
        if isinstance(v, (list, tuple)):
            return [plain(x) for x in v]
        if v is None or isinstance(v, (bool, int, float, str)):
            return v
        return describe(v) if callable(v) else repr(v)

    def hyper(d: dict[str, Any]) -> dict[str, Any]:
        return {k: plain(v) for k, v in sorted(d.items()) if k not in ("params", "param_names")}
    return {"class": f"{type(opt).__module__}.{type(opt).__qualname__}", "defaults": hyper(opt.defaults),
            "groups": [{"params": len(g["params"]), **hyper(g)} for g in opt.param_groups]}


def settings_differ(golden: dict[str, Any], cand: dict[str, Any]) -> list[str]:
    """Where the candidate's optimizer_settings differ from the golden's, in words ("betas [0.0, 0.5]
    where the golden's is [0.9, 0.999]"); a setting that differs in every group is said once."""
    if golden.get("class") != cand.get("class"):
        return [f"class {cand.get('class')} where the golden's is {golden.get('class')}"]
    gg, cg = golden.get("groups") or [], cand.get("groups") or []
    if len(gg) != len(cg):
        return [f"{len(cg)} parameter groups where the golden has {len(gg)}"]
    by_key: dict[tuple[str, str, str], list[int]] = {}
    for i, (g, c) in enumerate(zip(gg, cg)):
        for k in sorted(set(g) | set(c)):
            if g.get(k) != c.get(k):
                by_key.setdefault((k, repr(c.get(k)), repr(g.get(k))), []).append(i)
    return [f"{k} {cv} where the golden's is {gv}" + ("" if len(idx) == len(gg) else
                                                       f" (group {', '.join(str(i) for i in idx)})")
            for (k, cv, gv), idx in by_key.items()]


def gradient_clipper(clip_grad_norm: Any, optimizer: Any) -> Callable[[list[Any]], Any] | None:
    """``clip_grad_norm`` as a function of the parameters, run on their gradients before each optimizer
    step: a maximum norm (torch.nn.utils.clip_grad_norm_, the total 2-norm) or the training script's
    own clipping function."""
    if clip_grad_norm is None:
        return None
    if optimizer is None:
        raise InvalidArgument(f"clip_grad_norm={clip_grad_norm!r}: clipping is judged through the optimizer's "
                              f"update; give optimizer= too (torch.optim.SGD, {{'lr': 0.1}})")
    if isinstance(clip_grad_norm, bool) or not (isinstance(clip_grad_norm, (int, float)) or callable(clip_grad_norm)):
        raise InvalidArgument(f"clip_grad_norm={clip_grad_norm!r}: give the maximum total norm (1.0) or a "
                              f"function that clips the gradients of the parameters it is given, in place")
    if callable(clip_grad_norm):
        return clip_grad_norm   # type: ignore[no-any-return]
    if not clip_grad_norm > 0:
        raise InvalidArgument(f"clip_grad_norm={clip_grad_norm!r}: the maximum norm must be positive")

    def clip(params: list[Any]) -> Any:
        import torch

        return torch.nn.utils.clip_grad_norm_(params, float(clip_grad_norm))
    return clip


def micro_batches(args: Any, kwargs: Any, accumulate: int) -> list[tuple[Any, Any]]:
    """The inputs split into ``accumulate`` micro-batches along dim 0 (every tensor input; other values
    passed to each), as a gradient-accumulation loop feeds them."""
    if isinstance(accumulate, bool) or not isinstance(accumulate, int) or accumulate < 1:
        raise InvalidArgument(f"accumulate={accumulate!r}: the number of micro-batches, an integer of at least 1")
    if accumulate == 1:
        return [(args, kwargs)]
    leaves = tensor_leaves({"args": args, "kwargs": kwargs})
    sizes = {p: (int(t.shape[0]) if t.dim() else None) for p, t in leaves.items()}
    batch = {n for n in sizes.values() if n is not None}
    if len(batch) != 1 or next(iter(batch)) % accumulate or any(n is None for n in sizes.values()):
        raise InvalidArgument(f"accumulate={accumulate}: every tensor input is split along its first dimension "
                              f"into {accumulate} micro-batches, so all need one batch size divisible by "
                              f"{accumulate}; got first dimensions {sizes}")
    n = next(iter(batch)) // accumulate
    out = []
    for i in range(accumulate):
        def rows(_path: str, t: Any, lo: int = i * n) -> Any:
            return t[lo:lo + n]
        part = map_tensors({"args": args, "kwargs": kwargs}, rows)
        out.append((tuple(part["args"]), part["kwargs"]))
    return out


def _loss_of(out: Any, loss: Callable[[Any], Any] | None, accumulate: int = 1) -> Any:
    """The loss to backpropagate: ``loss(out)`` (with accumulation, the micro-batch's share, as the
    training loop returns it), else the model's own loss divided by the number of micro-batches."""
    import torch

    if loss is not None:
        try:
            value = loss(out)
        except (RuntimeError, ValueError, IndexError) as exc:
            if accumulate == 1:
                raise
            # a loss written for the whole batch (targets captured from outside it) meets a micro-batch
            raise InvalidArgument(f"loss: raised on one of the {accumulate} micro-batches ({type(exc).__name__}: "
                                  f"{str(exc)[:200]}); with accumulate={accumulate} the loss gets each "
                                  f"micro-batch's outputs, so targets it closes over must be split too: pass "
                                  f"them in the inputs (labels=), which are split with the batch") from None
        if not (isinstance(value, torch.Tensor) and value.numel() == 1 and (value.is_floating_point()
                                                                             or value.is_complex())):
            what = (f"a {value.dtype} tensor of shape {tuple(value.shape)}" if isinstance(value, torch.Tensor)
                    else type(value).__name__)
            raise InvalidArgument(f"loss: returned {what}; check_train backpropagates one floating number: reduce "
                                  f"it (e.g. .mean() or .sum()) in the function given as loss=")
        return value
    value = getattr(out, "loss", None)
    if value is None and isinstance(out, dict):
        value = out.get("loss")
    if value is None:
        raise InvalidArgument("loss=None uses the model's own loss (a Hugging Face model given labels in its "
                              "inputs); this model returned none: pass labels, or loss=a function of the outputs")
    return value / accumulate if accumulate > 1 else value


def _backward(model: Any, micro: list[tuple[Any, Any]], loss: Callable[[Any], Any] | None) -> Any:
    """Forward and backward of every micro-batch, the gradients accumulating in ``.grad``; the summed
    loss (the full batch's, for a loss that divides as it should)."""
    import torch

    total = None
    with torch.enable_grad():
        for a, kw in micro:
            value = _loss_of(model(*a, **kw), loss, len(micro))
            value.backward()
            total = value.detach() if total is None else total + value.detach()
    return total


def _first_float(tree: dict[str, Any]) -> str | None:
    return next((p for p, t in tree.items() if t.is_floating_point()), None)


def _own_params(mod: Any, selected_names: set[str], name: str) -> dict[str, Any]:
    """The trainable parameters a selected module owns: its own and those of descendants no other
    selected module holds, by full name."""
    out = {}
    for pname, p in mod.named_parameters():
        if not p.requires_grad:
            continue   # frozen (a LoRA fine-tune's base weights): no gradient to judge
        owner = name
        parts = pname.split(".")[:-1]
        for i in range(len(parts), 0, -1):
            sub = ".".join(x for x in [name, *parts[:i]] if x)
            if sub in selected_names:
                owner = sub
                break
        if owner == name:
            out[f"{name}.{pname}" if name else pname] = p
    return out


class _Run:
    """One forward and backward of a model with hooks (one per micro-batch with accumulation): each
    selected call's golden input and call, and the gradient flowing into its primary output. A module
    called again (the next micro-batch) gets the next call key (Hooks.key: ``name#1``)."""

    def __init__(self, model: Any, selected: list[Selected], call: Any = None) -> None:
        # call: what the forward runs through (the candidate's torch.compile or DataParallel wrapper
        # of ``model``), so that the code the candidate runs is the code judged
        self.model, self.selected, self.call = model, selected, model if call is None else call
        self.calls: dict[str, tuple[Any, Any, str, str]] = {}   # key -> (args, kwargs, x path, y path)
        self.x: dict[str, Any] = {}
        self.y: dict[str, Any] = {}   # key -> its primary output in this run's forward
        self.g: dict[str, Any] = {}
        self.gx: set[str] = set()   # call keys whose primary input received its gradient
        self.order: list[str] = []
        # ("start" | "end", key) in the forward's order: which calls had completed when another began
        self.events: list[tuple[str, str]] = []
        # call key -> whether the module itself cut the autograd graph: its primary output carries none
        # (no grad_fn) although an input or a parameter of it required grad (True), or because its
        # inputs carried none, cut before it (False)
        self.graphless: dict[str, bool] = {}
        # call key -> the torch.autocast state the call ran under (autocast_state), which its isolated
        # backward re-enters: a model that opens torch.autocast in its own forward fed its modules
        # bf16 activations that they only accept under it
        self.amp: dict[str, tuple[tuple[str, bool, Any], ...]] = {}

    def forward_backward(self, args: Any, kwargs: Any, loss: Callable[[Any], Any] | None,
                         accumulate: int = 1) -> Any:
        import torch

        def pre(key: str, sel: Selected, a: Any, kw: Any) -> Any:
            leaves = tensor_leaves({"args": a, "kwargs": kw})
            # a module fed integers only (an embedding's token ids) has no input gradient, but its
            # parameters' gradients are its own backward to judge: recorded with no primary input ("")
            xp = _first_float(leaves) or ""
            if xp:
                self.x[key] = leaves[xp].detach().clone()
                if leaves[xp].grad_fn is not None:   # not a leaf: the hook goes with this step's graph
                    leaves[xp].register_hook(lambda g, k=key: self.gx.add(k))
            self.calls[key] = (a, kw, xp, "")
            self.amp[key] = autocast_state()
            self.order.append(key)
            self.events.append(("start", key))
            return None

        def post(key: str, sel: Selected, out: Any) -> None:
            leaves = {"0": out} if isinstance(out, torch.Tensor) else tensor_leaves(out)
            yp = _first_float(leaves)
            if yp is None or key not in self.calls:
                return
            self.y[key] = leaves[yp].detach().clone()
            self.events.append(("end", key))
            a, kw, xp, _ = self.calls[key]
            if not leaves[yp].requires_grad:
                mod = submodule(unwrap(self.model), sel.name)
                self.graphless[key] = any(t.requires_grad for t in tensor_leaves({"a": a, "kw": kw}).values()) \
                    or any(p.requires_grad for p in mod.parameters())
                return
            self.calls[key] = (a, kw, xp, yp)
            leaves[yp].register_hook(lambda g, k=key: self.g.__setitem__(k, g.detach().clone()))

        with Hooks(self.model, self.selected, pre, post):
            try:
                return _backward(self.call, micro_batches(args, kwargs, accumulate), loss)
            except RuntimeError as exc:
                if not self.g:
                    raise   # the forward or the loss raised, or the backward before any module: torch's words
                raise BackwardError(self._backward_failure(exc)) from exc

    def _backward_failure(self, exc: BaseException) -> str:
        """Where the backward raised: in the innermost call whose output received its gradient while
        its input did not (the backward got into it and never out), else between the modules."""
        inside = [k for k in self.order if k in self.g and k not in self.gx]
        torch_said = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        if inside:
            where = (f"inside {inside[-1]}: its output received its gradient and its input did not, so the "
                     f"backward failed in its own computation")
        else:
            where = "in code outside the selected modules (each one's backward either ran whole or was not reached)"
        fix = ("an op with no backward formula needs one: torch.library.register_autograd for a torch.library "
               "custom op, or a torch.autograd.Function around a kernel launched directly"
               if "autograd formula" in str(exc) or "derivative for" in str(exc) else
               "torch's error, in parentheses, says what the backward met")
        return f"the backward raised {where} ({torch_said}). Fix: {fix}"


# A training golden's bytes over the forward golden's estimate (selection.golden_bytes) at the same
# depth: it holds each call's input and output, its output's gradient and the float64 truth of each,
# the parameters' gradients and updates too: docs/judging.md has the measured ratios; the default
# depth takes the larger.
TRAIN_GOLDEN_SCALE = 3.5


def isolated_backward(mod: Any, call: tuple[Any, Any, str, str], x: Any, g: Any,
                      params: dict[str, Any], amp: tuple[tuple[str, bool, Any], ...] | None = None
                      ) -> tuple[Any, dict[str, Any]]:
    """``mod``'s own backward: called on ``call`` with its primary input replaced by ``x``, the gradient
    ``g`` fed into its primary output; (input gradient, {parameter: gradient}). A call with no primary
    input (``x`` None: integer inputs only) has no input gradient (None). ``amp``: the autocast state
    the call ran under in the full forward (autocast_state), re-entered around the call."""
    import torch

    a, kw, xp, yp = call
    xin = x.detach().clone().requires_grad_(True) if xp else None
    root = map_tensors({"args": a, "kwargs": kw}, lambda p, t: xin if xp and p == xp else t.detach())
    with torch.enable_grad(), autocast_as(amp):
        try:
            out = mod(*root["args"], **root["kwargs"])
        except Exception as exc:
            caches = [k for k, v in kw.items() if "cache" in type(v).__name__.lower()]
            if not caches:
                raise
            # the step's forward appended to this cache, so calling the module again sees its keys twice
            raise InvalidArgument(
                f"{type(mod).__name__} could not be called again on its recorded call ({type(exc).__name__}: "
                f"{exc}): the call holds a KV cache ({', '.join(caches)}) that the training step's forward filled. "
                f"A training step needs none: give the model use_cache=False (in the inputs, or its "
                f"config)") from None
        leaves = {"0": out} if isinstance(out, torch.Tensor) else tensor_leaves(out)
        y = leaves[yp]
        names = list(params)
        wrt = ([xin] if xin is not None else []) + list(params.values())
        got: tuple[Any, ...] = torch.autograd.grad(y, wrt, grad_outputs=g.to(y.dtype), allow_unused=True) if wrt else ()
    dx = None
    if xin is not None:
        dx = (got[0] if got[0] is not None else torch.zeros_like(xin)).detach()
        got = got[1:]
    return dx, {n: (t.detach() if t is not None else torch.zeros_like(params[n])) for n, t in zip(names, got)}


def _prepared(model: Any, device: Any, dtype: Any) -> Any:
    """The reference's copy in the rung's dtype; frozen parameters stay frozen (a LoRA fine-tune
    trains its adapters only), the model's own wrappers and compiled calls left out."""
    m = plain_copy(model).to(device=device, dtype=dtype).eval()
    for p in m.parameters():
        p.grad = None
    return m


def _steps(m: Any, args: Any, kwargs: Any, loss: Any, factory: Callable[[Any], Any], steps: int,
           clip: Callable[[list[Any]], Any] | None = None, accumulate: int = 1,
           later: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Parameter updates after ``steps`` optimizer steps (the first on the gradients already there),
    each after the clipping, each later one on a fresh accumulation over the micro-batches.
    ``later``: gets each later step's gradients (before the clipping), by parameter name."""
    before = {n: p.detach().clone() for n, p in m.named_parameters()}
    opt = factory([(n, p) for n, p in m.named_parameters() if p.requires_grad])
    micro = micro_batches(args, kwargs, accumulate)
    for i in range(steps):
        if i:
            opt.zero_grad(set_to_none=True)
            _backward(m, micro, loss)
            if later is not None:
                later.append({n: p.grad.detach().clone() for n, p in m.named_parameters() if p.grad is not None})
        if clip is not None:
            clip([p for p in m.parameters() if p.grad is not None])
        _step(opt)
    return {n: (p.detach() - before[n]) for n, p in m.named_parameters()}


def _step(opt: Any) -> None:
    """``opt.step()``, the optimizer's refusal of these parameters or gradients (SparseAdam: dense
    ones) an argument error naming it."""
    try:
        opt.step()
    except Exception as exc:
        raise InvalidArgument(f"optimizer: {type(opt).__name__}.step() failed on the model's parameters and "
                              f"gradients ({type(exc).__name__}: {str(exc)[:300]}); check_train steps dense "
                              f"gradients of one backward") from None


def _optimizer_steps(params: dict[str, Any], grad_steps: list[dict[str, Any]], factory: Callable[[Any], Any],
                     clip: Callable[[list[Any]], Any] | None = None,
                     settings: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """The update each optimizer step (after the clipping) makes, one optimizer stepping from
    ``params`` on the gradients ``grad_steps`` gives for each step in turn (copies; the factory gets
    their full names). Why the same gradients every run: the optimizer judged apart from the model,
    its state (momentum, Adam's moments) carried from step to step as training carries it.
    ``settings``: gets the built optimizer's (optimizer_settings)."""
    import torch

    ps = {n: torch.nn.Parameter(p.detach().clone()) for n, p in params.items()}
    opt = factory(list(ps.items()))
    if settings is not None:
        settings.append(optimizer_settings(opt))
    out = []
    for grads in grad_steps:
        before = {n: p.detach().clone() for n, p in ps.items()}
        for n, p in ps.items():
            p.grad = grads[n].detach().clone().to(p.dtype)
        if clip is not None:
            clip(list(ps.values()))
        _step(opt)
        out.append({n: (ps[n].detach() - before[n]) for n in ps})
    return out


def _step_key(k: int) -> str:
    """The golden's key prefix of the optimizer's step ``k`` (0-based): none for the first, whose keys
    (``iupd/``, and its gradients ``pg/``) every training golden holds; ``step2/`` for the second."""
    return f"step{k + 1}/" if k else ""


@inlines_compiled_children
def capture_train(model: Any, inputs: Any, spec: CheckSpec, store: GoldenStore, device: str,
                  loss: Callable[[Any], Any] | None = None, optimizer: Any = None, steps: int = 1,
                  overwrite: bool = False, env: dict[str, Any] | None = None, clip_grad_norm: Any = None,
                  accumulate: int = 1) -> dict[str, Any]:
    """Record the training golden of every rung of ``spec`` and write it; returns the manifest.

    With ``accumulate`` the step runs over that many micro-batches (the golden: the full batch's
    gradients of a correct accumulation, every module call of every micro-batch); with
    ``clip_grad_norm`` the gradients are clipped before each optimizer step.

    With ``spec.sketch`` (a group size) every gradient and update is kept as a CountSketch of it and
    of its float64 truth (golden/sketch.py; tensors of up to 64 groups whole): a fraction of the size,
    judged on the propagated step only (no module inputs, so no isolated backward; no weights, so no
    optimizer step).
    """
    import torch

    from pytest_rocm_parity.migration.backend import collect_env

    _check_steps(steps, optimizer)
    inner = unwrap(model)
    factory = optimizer_factory(optimizer)
    clip = gradient_clipper(clip_grad_norm, optimizer)
    args0, kwargs0 = normalize_inputs(inputs)
    micro_batches(args0, kwargs0, accumulate)   # refuse inputs that do not split before any work
    selected = select(inner, spec.layers, spec.drill)
    manifest: dict[str, Any] = {
        "format": FORMAT_VERSION, "kind": "train", "name": spec.name, "test": spec.test, "tool_version": __version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "fingerprint": fingerprint(inner),
        "model_class": type(inner).__name__, "seed": int(torch.initial_seed()), "dtypes": list(spec.dtypes),
        "layers": [{"name": s.name, "level": s.level, "primary": s.primary} for s in selected],
        "drill": spec.drill, "layer_patterns": list(spec.layers) if spec.layers else None,
        "sketch": int(spec.sketch or 0), "steps": steps, "accumulate": accumulate,
        "optimizer": describe(optimizer), "clip_grad_norm": describe(clip_grad_norm),
        "trainable": _trainable(inner), "autocast": autocast_dtype(home_device(inner, device)),
        "reference_env": env or collect_env(str(home_device(inner, device))), "rungs": {},
    }
    names = {s.name for s in selected}

    def producer(rung: str) -> Callable[[], dict[str, Any]]:
        def produce() -> dict[str, Any]:
            dtype = dt.to_torch(rung)
            rdt = dt.to_torch(dt.residual_dtype_name(rung))
            t: dict[str, Any] = {}
            args, kwargs = cast_inputs(args0, kwargs0, dtype, device)
            for p, v in tensor_leaves({"args": args, "kwargs": kwargs}).items():
                t[f"input/{p}"] = v.detach().to("cpu", copy=True).contiguous()
            ref = _prepared(inner, device, dtype)
            # a forward may update buffers (an EMA, a step counter): every pass starts from the buffers
            # the step started from (BufferState), or the truth and each isolated call compute another step
            start = BufferState(list(ref.modules()))
            run = _Run(ref, selected)
            t["loss"] = run.forward_backward(args, kwargs, loss, accumulate).to("cpu").reshape(1)
            stepped = BufferState(list(ref.modules()))   # where a second step's forward starts (_steps)
            start.restore()
            # the float64 truth: the same weights (rounded to the rung), in float64 arithmetic
            tm = copy.deepcopy(ref).to(torch.float64)
            float64_kernels(tm)   # MoE experts' grouped_mm has no float64: the truth takes the eager experts
            tstart = BufferState(list(tm.modules()))
            targs, tkwargs = cast_inputs(args, kwargs, torch.float64, device)
            truth = _Run(tm, selected)
            with truth_errors(tm, selected):
                t["gtruth/loss"] = residual(truth.forward_backward(targs, tkwargs, loss, accumulate).reshape(1),
                                            t["loss"], rdt)
            tstepped = BufferState(list(tm.modules()))
            if spec.sketch:
                manifest["rungs"][rung] = _sketched(t, run, truth, ref, tm, selected, names, factory, args, kwargs,
                                                    targs, tkwargs, loss, steps, int(spec.sketch))
                return t
            layers: list[dict[str, Any]] = []
            for key, name, sel in _judged_calls(run, truth, selected):
                mod, tmod = (m.get_submodule(name) if name else m for m in (ref, tm))
                own, town = _own_params(mod, names, name), _own_params(tmod, names, name)
                x = run.x.get(key)
                if x is not None:
                    t[f"x/{key}"] = x.to("cpu").contiguous()
                t[f"g/{key}"] = run.g[key].to("cpu").contiguous()
                t[f"gtruth/go/{key}"] = residual(truth.g[key], run.g[key], rdt)
                # the step's forward, judged propagated (_forward_fault): what its isolated backward,
                # an eager call of the module, never runs (the candidate's compiled graph, glue code)
                fwd: dict[str, str] = {}
                if key in run.y and key in truth.y and truth.y[key].shape == run.y[key].shape:
                    t[f"y/{key}"] = run.y[key].to("cpu").contiguous()
                    t[f"truth/y/{key}"] = residual(truth.y[key], run.y[key], rdt)
                    fwd["out"] = f"y/{key}"
                if x is not None and key in truth.x and truth.x[key].shape == x.shape:
                    t[f"truth/x/{key}"] = residual(truth.x[key], x, rdt)
                    fwd["in"] = f"x/{key}"
                start.restore()
                dx, dps = isolated_backward(mod, run.calls[key], x, run.g[key], own, run.amp.get(key))
                tstart.restore()
                tdx, tdps = isolated_backward(tmod, truth.calls[key], None if x is None else x.to(torch.float64),
                                              run.g[key].to(torch.float64), town, truth.amp.get(key))
                if dx is not None:
                    t[f"ix/{key}"] = dx.to("cpu").contiguous()
                    t[f"truth/ix/{key}"] = residual(tdx, dx, rdt)
                for pn in own:
                    t[f"ip/{key}/{pn}"] = dps[pn].to("cpu").contiguous()
                    t[f"truth/ip/{key}/{pn}"] = residual(tdps[pn], dps[pn], rdt)
                layers.append({"key": key, "name": name, "level": sel.level, "primary": sel.primary,
                               "in": {run.calls[key][2]: f"x/{key}"} if x is not None else {},
                               "out": {run.calls[key][3]: f"g/{key}"},
                               "params": sorted(own), **({"forward": fwd} if fwd else {})})
            # gradients kept to the selected layers: the parameters the selected modules own
            owned: set[str] = {pn for e in layers for pn in e["params"]}
            params = {pn: p for pn, p in ref.named_parameters() if pn in owned}
            tparams = dict(tm.named_parameters())
            for pn, p in params.items():
                if p.grad is not None and tparams[pn].grad is not None:
                    # a copy: the optimizer's steps below clip .grad in place (to("cpu") of a CPU tensor is itself)
                    t[f"pg/{pn}"] = p.grad.detach().to("cpu", copy=True).contiguous()
                    t[f"gtruth/pg/{pn}"] = residual(tparams[pn].grad, p.grad, rdt)
            meta: dict[str, Any] = {"layers": layers, "order": [e["key"] for e in layers],
                                    "outputs": {"out": {"loss": "loss"}}, "truth_encoding": "residual",
                                    "truth_dtype": dt.name_of(rdt), "inputs": {"const": {}}}
            if factory is not None:
                grads = {pn: p.grad.detach().clone() for pn, p in params.items() if p.grad is not None}
                w = {pn: params[pn].detach().clone() for pn in grads}
                stepped.restore()
                later: list[dict[str, Any]] = []   # the reference's gradients of each step after the first
                upd = _steps(ref, args, kwargs, loss, factory, steps, clip, accumulate, later)
                tstepped.restore()
                tupd = _steps(tm, targs, tkwargs, loss, factory, steps, clip, accumulate)
                # the optimizer apart from the model: every step from the golden weights on the
                # reference's gradients of each step, its state carried (what one step cannot show)
                seq = [grads] + [{pn: g.get(pn, torch.zeros_like(grads[pn])) for pn in grads} for g in later]
                built: list[dict[str, Any]] = []
                iupds = _optimizer_steps(w, seq, factory, clip, built)
                tiupds = _optimizer_steps({pn: v.to(torch.float64) for pn, v in w.items()},
                                          [{pn: v.to(torch.float64) for pn, v in g.items()} for g in seq], factory, clip)
                for pn in grads:
                    t[f"w/{pn}"] = w[pn].to("cpu").contiguous()
                    t[f"upd/{pn}"] = upd[pn].to("cpu").contiguous()
                    t[f"gtruth/upd/{pn}"] = residual(tupd[pn], upd[pn], rdt)
                    for k, (iupd, tiupd) in enumerate(zip(iupds, tiupds)):
                        at = _step_key(k)
                        if k:
                            t[f"{at}pg/{pn}"] = seq[k][pn].to("cpu").contiguous()
                        t[f"{at}iupd/{pn}"] = iupd[pn].to("cpu").contiguous()
                        t[f"{at}truth/iupd/{pn}"] = residual(tiupd[pn], iupd[pn], rdt)
                meta["optimizer_params"] = sorted(grads)
                meta["optimizer_settings"] = built[0]
                meta["optimizer_steps"] = len(seq)
            manifest["rungs"][rung] = meta
            return t
        return produce

    store.write(spec.name, manifest, {r: producer(r) for r in spec.dtypes}, overwrite=overwrite)
    return manifest


def _judged_calls(run: _Run, truth: _Run, selected: list[Selected]) -> Iterator[tuple[str, str, Selected]]:
    """(call key, module name, its selection) of every call whose output gradient both the reference
    and the float64 truth recorded, in the forward's order."""
    for key in run.order:
        if key in run.g and key in truth.g:
            name = key.split("#")[0]
            yield key, name, next(s for s in selected if s.name == name)


def _sketched(t: dict[str, Any], run: _Run, truth: _Run, ref: Any, tm: Any, selected: list[Selected],
              names: set[str], factory: Any, args: Any, kwargs: Any, targs: Any, tkwargs: Any, loss: Any,
              steps: int, group: int) -> dict[str, Any]:
    """A sketch training golden's tensors into ``t`` (sketches of the reference, ``sk/``, and of the
    float64 truth, ``skt/``); returns the rung's meta."""
    from pytest_rocm_parity.golden.sketch import sketch

    def put(kind: str, name: str, ref_t: Any, truth_t: Any) -> str:
        g = leaf_group(ref_t.numel(), group)
        t[f"sk/{kind}/{name}"] = sketch(ref_t, g, f"{kind}/{name}").to("cpu")
        t[f"skt/{kind}/{name}"] = sketch(truth_t, g, f"{kind}/{name}").to("cpu")
        return f"sk/{kind}/{name}"

    layers: list[dict[str, Any]] = []
    for key, name, sel in _judged_calls(run, truth, selected):
        mod = ref.get_submodule(name) if name else ref
        own = _own_params(mod, names, name)
        layers.append({"key": key, "name": name, "level": sel.level, "primary": sel.primary, "in": {},
                       "out": {"grad_output": put("go", key, run.g[key], truth.g[key])}, "params": sorted(own)})
    owned: set[str] = {pn for e in layers for pn in e["params"]}
    params = {pn: p for pn, p in ref.named_parameters() if pn in owned}
    tparams = dict(tm.named_parameters())
    for pn, p in params.items():
        if p.grad is not None and tparams[pn].grad is not None:
            put("pg", pn, p.grad, tparams[pn].grad)
    meta: dict[str, Any] = {"layers": layers, "order": [e["key"] for e in layers], "outputs": {"out": {"loss": "loss"}},
                            "truth_encoding": "sketch", "inputs": {"const": {}}}
    return meta


def _sketch_metric(leaf: str, c: Any, reader: RungReader, kind: str, name: str, group: int, u: float,
                   conf: float, scales: list[Any] | None = None) -> LeafMetrics:
    from pytest_rocm_parity.golden.sketch import sketch
    from pytest_rocm_parity.judging.compare import float_metrics

    ref = reader.get(f"sk/{kind}/{name}")
    group = leaf_group(int(c.numel()), group)
    sk = sketch(c, group, f"{kind}/{name}").to(ref.device)
    if scales is not None:   # a sketch is linear: a factor on the tensor is the same factor on its sketch
        scales.append(_scale_sums(sk, ref))
    m = float_metrics(leaf, sk, ref, reader.get(f"skt/{kind}/{name}").to(ref.device), u, conf)
    m.numel = int(c.numel())
    return m


def _by_module(layers: list[dict[str, Any]]) -> list[tuple[str, list[dict[str, Any]]]]:
    """The golden's call entries grouped by module, in the order of each module's first call: a module
    called once per micro-batch is one record, each call's quantities its leaves."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for e in layers:
        groups.setdefault(e["name"], []).append(e)
    return list(groups.items())


def _tag(leaf: str, key: str, name: str, calls: int) -> str:
    """A leaf's name, with the call (``#1``: the second micro-batch) when its module has several."""
    return leaf + key[len(name):] if calls > 1 else leaf


# The cause and fix every record and note of a cut autograd graph names (_judge_graph, _graph_cut_note)
DETACH_CAUSE = "a kernel without autograd (a raw Triton/HIP launch) or a no_grad/detach in the port"
DETACH_FIX = ("give the kernel a backward (a torch.autograd.Function whose backward computes the gradients the "
              "reference's autograd does) or remove the no_grad/detach")


def no_gradient(params: list[str], grads: dict[str, Any], reader: RungReader, ref_key: str) -> list[str]:
    """The parameters among ``params`` that received no gradient on the candidate while the reference's
    (``<ref_key>/<parameter>`` in the golden) is nonzero. An absent gradient has no error to measure:
    left unjudged, the parameters a detached forward stopped training would pass."""
    return [pn for pn in params if pn not in grads and f"{ref_key}/{pn}" in reader.keys
            and bool(reader.get(f"{ref_key}/{pn}").any())]


def _detached(names: list[str]) -> str:
    """The words for parameters left without a gradient, at a row and in the note alike."""
    n = len(names)
    listed = ", ".join(names[:6]) + (f" ... (+{n - 6})" if n > 6 else "")
    return (f"{listed} received no gradient on the candidate: the forward detached {'it' if n == 1 else 'them'} "
            f"— {DETACH_CAUSE}; the reference's {'gradient is' if n == 1 else 'gradients are'} nonzero")


def _judge_graph(result: CheckResult, rec: LayerRecord, keys: list[str], run: _Run, missing: list[str]) -> None:
    """A module's record where the candidate's forward cut the autograd graph, which no metric sees
    (the values are right; the gradients are absent). A module whose own call cut it (its output has
    no grad_fn although its input or parameters required grad, the reference's had one) fails as its
    own backward does, so the culprit rule names the innermost such module; a module whose parameters
    got no gradient (``missing``: no_gradient) fails propagated; a module called on an input already
    cut is said so, not "no call recorded". ``result.extra`` lists both for _graph_cut_note."""
    called = [k for k in keys if k in run.graphless]
    if any(run.graphless[k] for k in called):
        rec.passed = rec.iso_passed = rec.prop_passed = False
        rec.reason = (f"its output carries no autograd graph on the candidate (no grad_fn) although its input or "
                      f"its parameters required grad, while the reference's output carried one: the forward "
                      f"detached it — {DETACH_CAUSE}; no gradient flows back through it, so its backward could not "
                      f"be run in isolation. Fix: {DETACH_FIX}")
        result.extra.setdefault("detached", []).append(rec.name)
    elif missing:
        rec.passed = rec.prop_passed = False
        rec.reason = (f"{rec.reason}; " if not rec.iso_passed else "") + _detached(missing) + \
            " (the graph is cut after this module)"
    elif called and len(called) == len([k for k in keys if k in run.calls]):
        rec.reason = ("called, but its output carries no autograd graph on the candidate because its input carries "
                      "none (the graph was cut before it): its backward was not run in isolation")
    if missing:
        result.extra.setdefault("no_gradient", []).extend(missing)


def _graph_cut_note(result: CheckResult) -> bool:
    """The note naming the parameters the candidate's forward left without a gradient (_judge_graph)
    and where the graph was cut; whether there are any. Such a step trains less of the model than the
    reference's, so it fails whatever else passed. Called once the culprit is named."""
    missing: list[str] = result.extra.get("no_gradient") or []
    if not missing:
        return False
    from pytest_rocm_parity.reports.summary import plural

    cut: list[str] = result.extra.get("detached") or []
    at = result.culprit if result.culprit in cut else (cut[-1] if cut else None)
    where = (f"The graph is cut at {at}, whose output has no grad_fn on the candidate" if at else
             "No selected module's output lost its grad_fn, so the cut is in code between the selected modules, "
             "downstream of these parameters (a parent's own forward, a .detach() on a hidden state); where it is "
             "inside a module, selecting finer modules (layers=, drill=) names it")
    result.notes.append(f"{plural(len(missing), 'parameter')}: {_detached(missing)}. {where}. Fix: {DETACH_FIX}")
    return True


def _replay_sketch(cand: Any, meta: dict[str, Any], reader: RungReader, spec: CheckSpec, rung: str, args: Any,
                   kwargs: Any, loss: Any, factory: Any, selected: list[Selected], group: int,
                   accumulate: int = 1, call: Any = None) -> CheckResult:
    """A sketch golden: the propagated step judged against sketches, each module by the rule of the
    forward's sketch goldens; the culprit is the first module, in the backward's order, whose own
    parameters' gradients drifted (else whose output gradient did), unless every gradient is off by
    one factor (the loss's scaling, _loss_factor_note)."""
    tol = spec.tolerance
    u = tol.unit_roundoff(rung)
    run = _Run(cand, selected, call)
    value = run.forward_backward(args, kwargs, loss, accumulate)
    grads = {n: p.grad.detach().clone() for n, p in cand.named_parameters() if p.grad is not None}
    result = CheckResult(test=spec.test, name=spec.name, dtype=rung, passed=True, kind="train")
    loss_scale: list[Any] = []
    scales: list[Any] = []
    loss_rec = _judge_loss(result, value, reader, tol, rung, u, loss_scale)
    go_bad: dict[str, str] = {}    # call key -> why its output gradient drifted
    pg_bad: set[str] = set()       # modules whose own parameters' gradients drifted
    records: dict[str, LayerRecord] = {}
    for name, entries in _by_module(meta["layers"]):
        t = tol.for_layer(name)
        rule = Rule.of(t, rung)
        leaves = [(e["key"], _sketch_metric(_tag("grad_output", e["key"], name, len(entries)), run.g[e["key"]],
                                            reader, "go", e["key"], group, u, t.confidence, scales))
                  for e in entries if e["key"] in run.g]
        params = sorted({pn for e in entries for pn in e["params"]})
        leaves += [("", _sketch_metric(f"grad {pn}", grads[pn], reader, "pg", pn, group, u, t.confidence, scales))
                   for pn in params if pn in grads]
        rec = LayerRecord(name=name, level=entries[0]["level"], primary=entries[0]["primary"])
        judge_layer(rec, [], [m for _, m in leaves], rule)
        reasons = [(key, rule.sketch_failure(m)) for key, m in leaves]
        rec.prop_passed = rec.iso_passed = rec.passed = not any(r for _, r in reasons)
        rec.budget, rec.reason = rule.sketch_budget, next((r for _, r in reasons if r), "")
        go_bad.update((key, why) for key, why in reasons if key and why)
        if any(why for key, why in reasons if not key):
            pg_bad.add(name)
        _judge_graph(result, rec, [e["key"] for e in entries], run, no_gradient(params, grads, reader, "sk/pg"))
        records[name] = rec
        result.layers.append(rec)
    drifted = bool(go_bad or pg_bad) or not loss_rec.passed
    missing = bool(result.extra.get("no_gradient"))
    found = _loss_factor_note(scales, loss_scale, accumulate) if drifted and not missing else None
    if found and not found[2] and loss_rec.passed:
        found = None   # the gradients one factor, the loss's value agreeing: no scale, left to the walk
    first = None if found else _sketch_culprit(meta["layers"], go_bad, pg_bad, records,
                                               set(result.extra.get("detached") or []))
    result.culprit = first.name if first else None
    result.culprit_block = first.primary if first else None
    result.first_divergent = next((r.name for r in reversed(result.layers) if not r.passed), None)
    cut = _graph_cut_note(result)
    result.passed = not found and first is None and not cut and loss_rec.passed
    if found:
        if found[2]:
            result.extra["loss_factor"] = found[0]
        elif loss_rec.prop is not None:   # the gradients one factor, the loss another: its computation
            result.extra["loss_otherwise"] = loss_rec.prop.ratio
        result.notes.append(found[1])
    if factory is not None:
        result.notes.append("the optimizer's step is not judged against a sketch golden: Adam's normalised "
                            "update turns gradient rounding into update noise that only a step from the golden "
                            "weights and gradients (a full golden) separates from a bug")
    result.notes.append(f"sketch golden (groups of {group}): the propagated step judged; the culprit is the first "
                        f"module, in the backward's order, whose gradients drifted")
    return result


def _judge_loss(result: CheckResult, value: Any, reader: RungReader, tol: Any, rung: str, u: float,
                loss_scale: list[Any]) -> LayerRecord:
    """The loss judged like a model output (its scale against the golden's kept in ``loss_scale``),
    appended to the result's outputs."""
    rec = LayerRecord(name=LOSS)
    judge_layer(rec, [], [_metric("loss", value.reshape(1), reader, "loss", "gtruth/loss", u, tol.confidence,
                                  loss_scale)], Rule.of(tol.for_layer(LOSS), rung))
    rec.passed = rec.prop_passed
    result.outputs.append(rec)
    return rec


def _sketch_culprit(calls: list[dict[str, Any]], go_bad: dict[str, str], pg_bad: set[str],
                    records: dict[str, LayerRecord], cut: set[str]) -> LayerRecord | None:
    """Walking the backward's order (the last call first): a module whose own parameters' gradients
    drifted while the gradients it received held, or whose output lost its grad_fn (``cut``:
    _judge_graph), where the backward stops, is the culprit; a call whose output gradient
    drifted received it from the call that consumed its output, the next call after it (and after
    its own sub-modules) in the forward's order: that call's module is the culprit, its record says
    so. By calls, not modules: a module called twice in a block (a shared activation) consumes what
    the call before its second call produced."""
    seen: set[str] = set()
    for i in range(len(calls) - 1, -1, -1):
        key, name = calls[i]["key"], calls[i]["name"]
        if key in go_bad:
            nxt = next((c for c in calls[i + 1:] if c["name"] != name and not c["name"].startswith(name + ".")), None)
            if nxt is None:
                return records[name]
            rec = records[nxt["name"]]
            if rec.passed:
                rec.passed = rec.iso_passed = rec.prop_passed = False
                rec.reason = (f"the gradient it passes back to {key}, which it consumes, drifted ({go_bad[key]}), "
                              f"while the gradient it received held")
            return rec
        if name not in seen:
            seen.add(name)
            if name in pg_bad or name in cut:
                return records[name]
    return None


def _scale_sums(c: Any, ref: Any) -> Any:
    """(sum c*ref, sum ref*ref) in float64, on the device: the least-squares factor of ``c`` over
    ``ref`` once divided; read back with all the others at once."""
    import torch

    c64, r64 = c.detach().to(ref.device, torch.float64).reshape(-1), ref.to(torch.float64).reshape(-1)
    return torch.stack([(c64 * r64).sum(), (r64 * r64).sum()])


# A loss scaled by a constant (an accumulation that does not divide, a loss scale not undone) scales
# every gradient by it exactly; rounding moves each gradient's least-squares factor by far less than
# this, and a module's bug moves the gradients upstream of it only, by different amounts.
FACTOR_AGREEMENT = 0.02


def common_factor(sums: list[Any]) -> float | None:
    """The factor every candidate gradient is of the golden's, when one factor (other than 1) fits
    them all; else None. ``sums``: _scale_sums of each gradient."""
    import torch

    if not sums:
        return None
    fs = [cr / rr for cr, rr in torch.stack(sums).cpu().tolist() if rr > 0]
    if len(fs) < 2:
        return None
    mid = sorted(fs)[len(fs) // 2]
    if abs(mid - 1) <= 2 * FACTOR_AGREEMENT or any(abs(f - mid) > FACTOR_AGREEMENT * abs(mid) for f in fs):
        return None
    return mid


def _loss_factor_note(scales: list[Any], loss_scale: list[Any], accumulate: int) -> tuple[float, str, bool] | None:
    """(the factor, plain words, whether the loss moved by it too) for a step whose every gradient is
    off by one factor while each module's own backward is right; None when no one factor fits. Only
    where the loss moved by the same factor is it a scale (accumulation that does not divide, a loss
    scale not undone): a loss computed otherwise (label smoothing: every gradient 0.90x, the loss
    0.997x) can move the gradients by a near-constant factor too, and is named as the loss."""
    factor = common_factor(scales)
    if factor is None:
        return None
    cr, rr = (float(v) for v in loss_scale[0].cpu()) if loss_scale else (0.0, 0.0)
    lf = cr / rr if rr > 0 else float("nan")
    if not abs(lf - factor) <= FACTOR_AGREEMENT * abs(factor):
        return factor, (f"every gradient is {factor:.4g}x the golden's while the loss is {lf:.6g}x: not one "
                        f"constant factor on the loss (a scale moves the loss and every gradient alike), while "
                        f"no module's own backward is out of bounds, so the loss is computed otherwise: a term "
                        f"missing or added (label smoothing, a regulariser, a router's auxiliary loss), another "
                        f"reduction or weighting, or another loss="), False
    text = (f"the loss and every gradient are {factor:.4g}x the golden's, one constant factor, while no "
            f"module's own backward is out of bounds: the loss or its scaling (gradient accumulation that does "
            f"not divide by the number of micro-batches, or a loss scale not undone), not a module")
    if accumulate > 1 and abs(factor - accumulate) <= FACTOR_AGREEMENT * accumulate:
        text += (f"; the factor is accumulate={accumulate}: the loss function should return each micro-batch's "
                 f"share (its loss / {accumulate})")
    return factor, text, True


def _metric(leaf: str, c: Any, reader: RungReader, ref_key: str, res_key: str, u: float, conf: float,
            scales: list[Any] | None = None) -> LeafMetrics:
    ref = reader.get(ref_key)
    if scales is not None:
        scales.append(_scale_sums(c, ref))
    return residual_metrics(leaf, c.detach().to(ref.device, ref.dtype), ref, reader.get(res_key), u, conf)


@inlines_compiled_children
def replay_train(model: Any, inputs: Any, spec: CheckSpec, store: GoldenStore, device: str,
                 loss: Callable[[Any], Any] | None = None, optimizer: Any = None, steps: int = 1,
                 env: dict[str, Any] | None = None, clip_grad_norm: Any = None,
                 accumulate: int = 1) -> list[CheckResult]:
    """Judge the candidate's training step against the golden, one CheckResult per rung (a sketch
    golden: the propagated step only, _replay_sketch). ``loss``, ``optimizer`` and ``clip_grad_norm``
    are the candidate's own (what is judged); ``steps`` and ``accumulate`` must be the golden's."""
    import torch

    from pytest_rocm_parity.migration.backend import collect_env
    _check_steps(steps, optimizer)
    inner = unwrap(model)
    micro_batches(*normalize_inputs(inputs), accumulate)   # refuse inputs that do not split before any work
    manifest = store.read_manifest(spec.name)
    mpath = str(store.manifest_path(spec.name))
    regen = golden_regen_command(manifest, spec)
    if manifest.get("kind") != "train":
        raise GoldenStale(f"{mpath}: the golden of {spec.name!r} is not a training golden; regenerate: {regen}", mpath)
    recorded = manifest.get("fingerprint", {})
    problems = []
    if not same_structure(inner, recorded):
        changes = structure_changes(inner, recorded)
        problems.append(f"the model's structure changed: parameters or buffers {changes}" if changes
                        else "the model's structure changed")
    elif changed := weights_changed(inner, recorded):
        problems.append(changed)
    if manifest.get("steps") != steps:
        problems.append(f"the number of steps changed (golden {manifest.get('steps')}, now {steps})")
    if int(manifest.get("accumulate") or 1) != accumulate:
        problems.append(f"the number of micro-batches changed (golden {int(manifest.get('accumulate') or 1)}, "
                        f"now {accumulate})")
    if int(manifest.get("sketch") or 0) != int(spec.sketch or 0):
        problems.append(f"captured with sketch={manifest.get('sketch') or 0}, asked sketch={spec.sketch or 0}")
    if problems:
        raise GoldenStale(f"stale golden {mpath} for {spec.name!r}: " + "; ".join(problems)
                          + captured_elsewhere(manifest, spec) + f". Regenerate it on the reference machine: {regen}",
                          mpath)
    trainable = _trainable(inner)
    if isinstance(manifest.get("trainable"), list) and manifest["trainable"] != trainable:
        # which parameters train is part of the step: a port that unfreezes a LoRA's base weights trains
        # another model, whatever its numbers
        was, now = set(manifest["trainable"]), set(trainable)

        def some(names: set[str], what: str) -> list[str]:
            listed = sorted(names)
            return [f"{what} ({', '.join(listed[:3])}{' ...' if len(listed) > 3 else ''})"] if listed else []

        differ = some(now - was, f"trains {len(now - was)} the reference froze") + \
            some(was - now, f"freezes {len(was - now)} the reference trained")
        raise GoldenStale(f"golden {mpath} for {spec.name!r} was captured with other parameters trainable: the "
                          f"candidate {'; '.join(differ)}. Set requires_grad as the reference did, or if the change "
                          f"is intended, regenerate: {regen}", mpath)
    setting_notes = _setting_notes(manifest, optimizer, clip_grad_norm) + _mode_notes(inner)
    autocast = autocast_note(manifest, device)
    setting_notes += [autocast] if autocast else []
    factory = optimizer_factory(optimizer)
    clip = gradient_clipper(clip_grad_norm, optimizer)
    selected = select(inner, spec.layers, spec.drill)
    names = {s.name for s in selected}
    results = []
    for rung in spec.dtypes:
        if rung not in manifest["rungs"]:
            raise GoldenStale(f"stale golden {mpath}: dtype {rung} was not captured; regenerate: {regen}", mpath)
        meta = manifest["rungs"][rung]
        dtype = dt.to_torch(rung)
        reader = RungReader(store.rung_file(spec.name, manifest, rung), str(device), expected_digest(meta))
        tmpl = map_tensors({"args": normalize_inputs(inputs)[0], "kwargs": normalize_inputs(inputs)[1]},
                           lambda p, _t: reader.get(f"input/{p}").clone())
        args, kwargs = tuple(tmpl["args"]), tmpl["kwargs"]
        # BufferState: the candidate's buffers as given before each pass and after the last (the
        # caller's model keeps its state, as the forward check leaves it)
        with explained_by(spec.name, autocast), _candidate(inner, device, dtype) as cand, \
                BufferState(list(cand.modules())) as start:
            call = model if model is not inner else cand   # a wrapper runs its own (compiled) forward
            if manifest.get("sketch"):
                result = _replay_sketch(cand, meta, reader, spec, rung, args, kwargs, loss, factory, selected,
                                        int(manifest["sketch"]), accumulate, call)
            else:
                result = _replay_rung(cand, meta, reader, spec, rung, args, kwargs, loss, (factory, clip), selected,
                                      names, device, start, accumulate, call, autocast)
        reader.release()
        result.reference_env = manifest.get("reference_env", {})
        result.candidate_env = env or collect_env(str(device))
        result.golden = str(store.rung_file(spec.name, manifest, rung))
        result.regen = golden_regen_command(manifest, spec)
        result.notes.extend(setting_notes)
        if autocast and not result.passed:   # explains the failure before any module does (assertion.message)
            result.extra["setting"] = autocast
        results.append(result)
    return results


def _check_steps(steps: Any, optimizer: Any) -> None:
    """InvalidArgument for a ``steps`` that is no count of optimizer steps, at capture and replay alike."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise InvalidArgument(f"steps={steps!r}: the number of optimizer steps, an integer of at least 1")
    if steps > 1 and optimizer is None:
        raise InvalidArgument(f"steps={steps}: steps are optimizer steps, and no optimizer= is given, so every "
                              f"step after the first would repeat it; give optimizer= (torch.optim.SGD, "
                              f"{{'lr': 0.1}}) or leave steps at 1 to judge the gradients of one backward")


def _mode_notes(model: Any) -> list[str]:
    """A note where the model came in training mode with modules whose training forward differs
    from the judged one (BatchNorm on the batch's statistics, dropout): the step runs in eval mode
    (docs/training.md), so that path is not judged, and a user who passed a model in train() would
    otherwise believe it was."""
    mods = training_paths(model)
    notes: list[str] = []
    if mods:
        norms, drops = torch_training_kinds()
        kinds = {type(model.get_submodule(n) if n != type(model).__name__ else model) for n in mods}
        norm, drop = any(issubclass(k, norms) for k in kinds), any(issubclass(k, drops) for k in kinds)
        own = not all(issubclass(k, (norms, drops)) for k in kinds)
        how = [w for w, on in (("BatchNorm on its running statistics, which the step does not update, so "
                                "their momentum is not judged either", norm), ("dropout off", drop),
                               ("their own code's eval branch (it reads self.training)", own)) if on]
        notes.append(f"the model came in training mode: {_some(mods)} {'were' if len(mods) > 1 else 'was'} judged "
                     f"in eval mode ({'; '.join(how)}), as every training check runs, so their training-mode path "
                     f"is not judged; docs/training.md says why")
    # Hugging Face's gradient_checkpointing_enable() recomputes only where self.training is true
    checkpointed = [n or "the model" for n, m in model.named_modules()
                    if getattr(m, "gradient_checkpointing", False) is True]
    if checkpointed:
        notes.append(f"gradient checkpointing is on in {_some(checkpointed)} (gradient_checkpointing_enable), "
                     f"which recomputes only in training mode: the step runs in eval mode, so the recomputation "
                     f"is not judged (docs/training.md says how to judge a checkpointed layer)")
    return notes


def _some(names: list[str], shown: int = 3) -> str:
    """The first few names and how many more."""
    return ", ".join(names[:shown]) + (f" and {len(names) - shown} more" if len(names) > shown else "")


def _trainable(model: Any) -> list[str]:
    return sorted(n for n, p in model.named_parameters() if p.requires_grad)


def state_unseen(steps: int) -> str:
    """What a changed optimizer setting does to the verdict, said with every note of one."""
    if steps > 1:
        return (f"its update is judged all the same, {steps} steps from the golden weights on the golden's "
                f"gradients of each step, so a setting that changes a step fails as the optimizer, one that only "
                f"the state carries (momentum, Adam's betas) from the second step on, where the gradients change "
                f"from step to step (docs/training.md)")
    return ("its update is judged all the same, one step from fresh optimizer state, so a setting that changes "
            "that step (lr, eps, weight decay) fails as the optimizer and one that only the state carries "
            "(momentum, Adam's betas) cannot show; steps=2 or more judges the later steps too (docs/training.md)")


def _setting_notes(manifest: dict[str, Any], optimizer: Any, clip_grad_norm: Any) -> list[str]:
    """Where the candidate's optimizer or clipping is described otherwise than the golden's: a note,
    since the candidate's own is what is judged (a fused or ported optimizer), and where an update the
    golden holds goes unjudged for want of an optimizer."""
    notes = []
    golden_opt, golden_clip = manifest.get("optimizer"), manifest.get("clip_grad_norm")
    if optimizer is None and golden_opt is not None:
        notes.append(f"the golden holds an optimizer step ({golden_opt}); this replay passes no optimizer=, so the "
                     f"update is not judged")
    elif optimizer is not None and golden_opt is not None and describe(optimizer) != golden_opt and not any(
            "optimizer_settings" in r for r in manifest.get("rungs", {}).values()):
        # a golden holding the optimizer's settings gets the finer note from them (_judge_optimizer)
        notes.append(f"the candidate's optimizer is {describe(optimizer)}, the golden's {golden_opt}: "
                     f"{state_unseen(int(manifest.get('steps') or 1))}")
    if golden_clip is not None and describe(clip_grad_norm) != golden_clip:
        notes.append(f"the golden's gradients were clipped with {golden_clip}, the candidate's with "
                     f"{describe(clip_grad_norm)}")
    return notes


@contextlib.contextmanager
def _candidate(inner: Any, device: Any, dtype: Any) -> Iterator[Any]:
    """The candidate's own model object (its patched or compiled modules as the user made them), cast
    in place to the rung, in eval mode, its frozen parameters frozen; its parameters' ``.grad`` are
    put back afterwards."""
    from pytest_rocm_parity.runner.engine import eval_mode
    from pytest_rocm_parity.runner.wrappers import cast_in_place

    params = list(inner.parameters())
    saved = [(p, p.requires_grad, p.grad) for p in params]
    try:
        with cast_in_place(inner, device, dtype), eval_mode(inner):
            for p in params:
                p.grad = None
            yield inner
    finally:
        for p, req, grad in saved:
            p.requires_grad_(req)
            p.grad = grad


def _replay_rung(cand: Any, meta: dict[str, Any], reader: RungReader, spec: CheckSpec, rung: str, args: Any,
                 kwargs: Any, loss: Any, step: tuple[Any, Any], selected: list[Selected], names: set[str],
                 device: str, start: BufferState, accumulate: int = 1, call: Any = None,
                 setting: str | None = None) -> CheckResult:
    """One rung: the candidate's backward twice (propagated, and its repeatability), each module's
    own backward in isolation (every call of it), the optimizer's step (``step``: the optimizer
    factory and the clipping). Each pass starts from the buffers ``start`` holds, as the capture's
    did: a forward that updates a buffer (an EMA, a step counter) would otherwise make the second
    run differ from the first, read as a nondeterministic backward that loosens every bound.
    ``setting``: autocast_note's words where the check runs under another autocast than the capture."""
    import torch

    tol = spec.tolerance
    u = tol.unit_roundoff(rung)
    runs = []
    for _ in range(2):   # twice: a backward whose result changes between runs is nondeterministic
        for p in cand.parameters():
            p.grad = None
        start.restore()
        run = _Run(cand, selected, call)
        value = run.forward_backward(args, kwargs, loss, accumulate)
        runs.append((run, value, {n: p.grad.detach().clone() for n, p in cand.named_parameters()
                                  if p.grad is not None}))
    run, value, grads = runs[0]
    result = CheckResult(test=spec.test, name=spec.name, dtype=rung, passed=True, kind="train")
    spread: dict[str, float] = {}   # run-to-run RMS difference of each quantity that is not repeatable
    for what, first, second in (("", run.g, runs[1][0].g), ("grad ", grads, runs[1][2])):
        for k, a in first.items():
            b = second.get(k)
            if b is not None and not torch.equal(a, b):
                spread[what + k] = float((b.double() - a.double()).norm()) / max(a.numel(), 1) ** 0.5

    def judged(m: LeafMetrics, spread_key: str) -> LeafMetrics:
        s_ = spread.get(spread_key)
        if s_ is not None:
            m.allow_spread(s_)
        return m

    loss_scale: list[Any] = []
    scales: list[Any] = []
    # the candidate's gradients by "<module>/<leaf>/<isolated|propagated>", kept only for the
    # failing-tensor export (--parity-report), which writes those of the failing modules
    obtained: dict[str, Any] | None = {} if spec.report_dir is not None else None
    _judge_loss(result, value, reader, tol, rung, u, loss_scale)
    for name, entries in _by_module(meta["layers"]):
        rule = Rule.of(tol.for_layer(name), rung)
        mod = cand.get_submodule(name) if name else cand
        own = _own_params(mod, names, name)
        prop: list[LeafMetrics] = []
        iso: list[LeafMetrics] = []
        for e in entries:
            key = e["key"]

            def tag(leaf: str, key: str = key) -> str:
                return _tag(leaf, key, name, len(entries))
            if key in run.g:
                prop.append(judged(_metric(tag("grad_output"), run.g[key], reader, f"g/{key}", f"gtruth/go/{key}", u,
                                           tol.confidence, scales), key))
                if obtained is not None:
                    obtained[f"{name}/{tag('grad_output')}/propagated"] = run.g[key]
            call = run.calls.get(key)
            if call is None or not call[3]:
                continue
            x = reader.get(f"x/{key}").to(device) if call[2] else None
            g = reader.get(f"g/{key}").to(device)
            start.restore()
            try:
                dx, dps = isolated_backward(mod, call, x, g, own, run.amp.get(key))
            except Exception as exc:
                # explained_by names a setting that differs (an autocast around the check) instead
                err = None if setting is not None or isinstance(exc, ParityError) else \
                    _cast_elsewhere(name, mod, x, exc)
                if err is None:
                    raise
                raise err from None
            if obtained is not None:
                obtained.update({f"{name}/{tag(f'grad {pn}')}/isolated": t for pn, t in dps.items()})
                if dx is not None:
                    obtained[f"{name}/{tag('grad_input')}/isolated"] = dx
            if dx is not None:
                iso.append(_metric(tag("grad_input"), dx, reader, f"ix/{key}", f"truth/ix/{key}", u, tol.confidence))
            iso += [_metric(tag(f"grad {pn}"), dps[pn], reader, f"ip/{key}/{pn}", f"truth/ip/{key}/{pn}", u,
                            tol.confidence) for pn in e["params"] if pn in dps]
        params = sorted({pn for e in entries for pn in e["params"]})
        for pn in params:
            if pn in grads:
                prop.append(judged(_metric(f"grad {pn}", grads[pn], reader, f"pg/{pn}", f"gtruth/pg/{pn}", u,
                                           tol.confidence, scales), f"grad {pn}"))
                if obtained is not None:
                    obtained[f"{name}/grad {pn}/propagated"] = grads[pn]
        rec = LayerRecord(name=name, level=entries[0]["level"], primary=entries[0]["primary"])
        judge_layer(rec, iso, prop, rule)
        _judge_graph(result, rec, [e["key"] for e in entries], run, no_gradient(params, grads, reader, "pg"))
        if not iso:
            rec.reason = rec.reason or "its backward was not run in isolation (no call recorded on the candidate)"
        result.layers.append(rec)
    forward = _forward_records(meta, run, runs[1][0], reader, tol, rung, u)
    outs = [(k, y) for k, (_, y) in forward.items() if y is not None and y.prop is not None]
    if outs:   # the forward's closest call to its budget, passing or not (the JSON report's extra)
        k, y = max(outs, key=lambda ky: ky[1].prop.ratio / max(ky[1].prop_budget, 1e-30))  # type: ignore[union-attr]
        result.extra["forward_worst"] = {"call": k, "output_ratio": y.prop.ratio, "budget": y.prop_budget}  # type: ignore[union-attr]
    _finish_train(result, lambda: _loss_factor_note(scales, loss_scale, accumulate),
                  lambda: _forward_fault(forward, run, cand, names))
    note_undecided(result, tol)
    if spread:
        result.notes.append("nondeterministic backward (two runs on the candidate differ) in: "
                            + ", ".join(sorted(spread)[:8]) + (" ..." if len(spread) > 8 else "")
                            + "; each is judged against the larger of the reference's error and that spread")
    result.extra["nondeterministic"] = spread
    factory, clip = step
    if factory is not None and meta.get("optimizer_params"):
        _judge_optimizer(result, meta, reader, (factory, clip), selected, u, tol, rung, device)
    if obtained and not result.passed and spec.report_dir is not None:
        from pytest_rocm_parity.reports.report import save_failing_tensors

        save_failing_tensors(result, obtained, spec.report_dir)
    return result


def _cast_elsewhere(name: str, mod: Any, x: Any, exc: Exception) -> InvalidArgument | None:
    """The error for a module that refused its golden input in isolation because the input's dtype is
    not its parameters' (torch's dtype message does not say where that dtype came from): the
    reference's forward cast the activation, a torch.autocast in its own forward most often, and the
    candidate's does not. None where the dtypes agree (another failure, raised as it is)."""
    own = {p.dtype for p in mod.parameters() if p.is_floating_point()}
    if x is None or not own or x.dtype in own:
        return None
    return InvalidArgument(
        f"{name or 'the model'} ({type(mod).__name__}) could not be called in isolation on its golden input "
        f"({type(exc).__name__}: {str(exc)[:200]}): the input is {dt.name_of(x.dtype)} and the module's "
        f"parameters {', '.join(sorted(dt.name_of(d) for d in own))}, so the reference's forward cast this "
        f"activation (a torch.autocast opened in the model's own forward, or a .to()) where this model's call "
        f"does not. check_train runs each module's isolated backward under the autocast its call ran under: "
        f"open the same torch.autocast in this model's forward as in the reference's, or regenerate the golden "
        f"from a reference without it")


def _forward_records(meta: dict[str, Any], run: _Run, again: _Run, reader: RungReader, tol: Any, rung: str,
                     u: float) -> dict[str, tuple[LayerRecord | None, LayerRecord | None]]:
    """Each judged call's input and output in the candidate's step, judged propagated against the
    golden's forward and its float64 truth by the layer's rule: call key -> (input, output) records,
    None where the golden (one captured before the forward was recorded) or the run has none. A
    value that differs between the candidate's two runs is judged against that spread too."""
    import torch

    records: dict[str, tuple[LayerRecord | None, LayerRecord | None]] = {}
    for e in meta["layers"]:
        fwd, key = e.get("forward") or {}, e["key"]
        pair: list[LayerRecord | None] = []
        for side, mine, other in (("in", run.x, again.x), ("out", run.y, again.y)):
            at, c = fwd.get(side), mine.get(key)
            if at is None or c is None or tuple(c.shape) != tuple(reader.get(at).shape):
                pair.append(None)
                continue
            m = _metric("input" if side == "in" else "output", c, reader, at, f"truth/{at}", u, tol.confidence)
            b = other.get(key)
            if b is not None and b.shape == c.shape and not torch.equal(b, c):
                m.allow_spread(float((b.double() - c.double()).norm()) / max(c.numel(), 1) ** 0.5)
            rec = LayerRecord(name=key, level=e["level"], primary=e["primary"])
            judge_layer(rec, [], [m], Rule.of(tol.for_layer(e["name"]), rung))
            pair.append(rec)
        if any(r is not None for r in pair):
            records[key] = (pair[0], pair[1])
    return records


def _forward_fault(forward: dict[str, tuple[LayerRecord | None, LayerRecord | None]], run: _Run, model: Any,
                   selected: set[str]) -> dict[str, Any] | None:
    """Where the step's forward first leaves its propagated budget, for a step whose modules' own
    backwards all agree in isolation: the first call, in the order the forward completed them, whose
    output is out of bounds. Its input within bounds: the call itself computes otherwise in the step
    than called alone and eagerly in isolation (a torch.compile graph, a hook or a patch acting only
    in the whole model), the culprit. Its input out of bounds too: the code that ran between it and
    the last call completed before it (the region region_text names). None: the forward agrees, or
    the golden holds no forward."""
    ended = [k for what, k in run.events if what == "end"]
    key = next((k for k in ended if k in forward and (out := forward[k][1]) is not None and not out.prop_passed),
               None)
    if key is None:
        return None
    x_rec, y_rec = forward[key]
    assert y_rec is not None and y_rec.prop is not None
    fault: dict[str, Any] = {"call": key, "output_ratio": y_rec.prop.ratio, "budget": y_rec.prop_budget,
                             "input_ratio": x_rec.prop.ratio if x_rec is not None and x_rec.prop is not None
                             else None}
    if x_rec is None or x_rec.prop_passed:
        fault["culprit"] = module_of(key)
    else:
        began = run.events.index(("start", key))
        after = next((k for what, k in reversed(run.events[:began]) if what == "end"), None)
        fault["region"] = region_between(model, module_of(after) if after else None, module_of(key), selected)
    return fault


def _apply_forward_fault(result: CheckResult, fault: dict[str, Any]) -> None:
    """The failure a forward fault makes (_forward_fault): its culprit's reason, or the region."""
    result.passed = False
    result.extra["forward_fault"] = fault
    key, k = fault["call"], fault["budget"]
    outside = f"{fault['output_ratio']:.3g}x the reference's error (budget {k:g}x)"
    if fault.get("culprit"):
        rec = next(l for l in result.layers if l.name == fault["culprit"])
        rec.passed = False
        seen = "" if fault["input_ratio"] is None else f" ({fault['input_ratio']:.3g}x)"
        rec.reason = (f"its output in the step's forward{' (call ' + key + ')' if key != rec.name else ''} is "
                      f"{outside} where its input is within bounds{seen}, while its own forward and backward "
                      f"called alone agree: the step runs other code for it than an eager call (a torch.compile "
                      f"graph, a hook or a patch that acts only in the whole model)")
        result.culprit, result.culprit_block = rec.name, rec.primary
    else:
        result.extra["unselected_region"] = fault["region"]
        result.notes.append(f"the step's forward leaves its budget first at the input of {key}: {outside}, with "
                            f"every call completed before it within bounds and every module's own backward "
                            f"within bounds in isolation")


def _finish_train(result: CheckResult, factor_note: Callable[[], tuple[float, str, bool] | None],
                  forward_fault: Callable[[], dict[str, Any] | None] = lambda: None) -> None:
    """Culprit: the smallest module whose own backward is out of bounds (or whose output lost its
    grad_fn); first divergent: the first layer, in the backward's order (last module first), whose
    gradients drifted. Parameters left without a gradient fail the step (_graph_cut_note). With no
    module out of bounds and the step off, ``factor_note`` tells a loss off by one factor from
    accumulated drift, and gradients off by one factor the loss does not share from a scale; before
    them, ``forward_fault`` (_forward_fault) names a fault of the step's forward."""
    failing = [l for l in result.layers if not l.iso_passed]
    minimal = minimal_failing(failing)
    result.culprit = minimal[-1].name if minimal else None
    result.culprit_block = minimal[-1].primary if minimal else None
    div = next((l for l in reversed(result.layers) if not l.prop_passed), None)
    result.first_divergent = div.name if div else None
    drifted = div is not None or not all(o.passed for o in result.outputs)
    cut = _graph_cut_note(result)
    result.passed = not failing and not cut and all(o.passed for o in result.outputs)
    if failing or cut:
        return
    # a forward fault changes every gradient after it: named from the forward, not from the loss
    if (fault := forward_fault()) is not None:
        _apply_forward_fault(result, fault)
        return
    if not drifted:
        return
    found = factor_note()
    failed_loss = next((o for o in result.outputs if o.name == LOSS and not o.prop_passed), None)
    if found and found[2]:
        result.passed = False
        result.extra["loss_factor"] = found[0]
        result.notes.append(found[1])
    elif found and failed_loss is not None and failed_loss.prop is not None:
        # the gradients one factor, the loss another: the loss's computation, whatever its ratio
        result.passed = False
        result.extra["loss_otherwise"] = failed_loss.prop.ratio
        result.notes.append(found[1])
    elif (loss := next((o for o in result.outputs if o.name == LOSS and not o.prop_passed and jumped(o)),
                       None)) is not None:
        assert loss.prop is not None
        result.extra["loss_otherwise"] = loss.prop.ratio
        result.notes.append(f"the loss is {loss.prop.ratio:.3g}x the reference's error (budget {loss.prop_budget:g}x) "
                            f"while every module's backward is within bounds in isolation: too far for rounding "
                            f"that adds up. The loss is computed otherwise: a term missing or added (a router's "
                            f"auxiliary loss, label smoothing, a regulariser), another reduction, or another loss=")
    elif div is not None and jumped(div):
        # every module's own backward within bounds, and the gradient it receives far over: one fault
        # in the backward of code no module holds, after it in the forward (the loss, or glue)
        assert div.prop is not None
        later = result.layers[result.layers.index(div) + 1:]
        nxt = next((l.name for l in later if l.level <= div.level), None)
        where = (f"the code between {div.name} and {nxt} in their parent's forward" if nxt else
                 f"the loss (loss= or the model's own) and any code after {div.name} in the forward")
        value_agrees = all(o.passed for o in result.outputs)
        result.passed = False
        result.extra["backward_jump"] = div.name
        result.notes.append(f"the gradient reaching {div.name} is {div.prop.ratio:.3g}x the reference's error "
                            f"(budget {div.prop_budget:g}x) while every module's own backward is within bounds in "
                            f"isolation: too far for rounding that adds up, so "
                            + (f"the backward of {where} is wrong (a fused or hand-written loss kernel's gradient, "
                               f"say), though the loss's value agrees" if value_agrees else
                               f"{where} computes otherwise (a term missing or added, another reduction, or a "
                               f"wrong gradient)"))
    elif not result.passed:
        result.notes.append("the loss drifted beyond budget although no module's backward is out of bounds in "
                            "isolation: accumulated drift")


def _judge_optimizer(result: CheckResult, meta: dict[str, Any], reader: RungReader,
                     step: tuple[Callable[[Any], Any], Callable[[list[Any]], Any] | None], selected: list[Selected],
                     u: float, tol: Any, rung: str, device: str) -> None:
    """The candidate's optimizer (after its gradient clipping) on the golden weights and gradients, one
    step, judged per module (its parameter group) against the float64 step; named apart from the
    model's own layers."""
    factory, clip = step
    pnames = meta["optimizer_params"]
    n_steps = int(meta.get("optimizer_steps") or 1)
    w = {pn: reader.get(f"w/{pn}").to(device) for pn in pnames}
    seq = [{pn: reader.get(f"{_step_key(k)}pg/{pn}").to(device) for pn in pnames} for k in range(n_steps)]
    built: list[dict[str, Any]] = []
    upds = _optimizer_steps(w, seq, factory, clip, built)
    if isinstance(meta.get("optimizer_settings"), dict):
        # a round trip through JSON, as the golden's went (tuples read back as lists)
        differ = settings_differ(meta["optimizer_settings"], json.loads(json.dumps(built[0])))
        if differ:
            result.notes.append(f"the candidate's optimizer is built otherwise than the golden's: "
                                f"{'; '.join(differ[:6])}{' ...' if len(differ) > 6 else ''}: {state_unseen(n_steps)}")
    owner = {}
    for s in sorted(selected, key=lambda s: -len(s.name)):
        for pn in pnames:
            if pn not in owner and (not s.name or pn.startswith(s.name + ".")):
                owner[pn] = s.name
    groups: dict[str, list[LeafMetrics]] = {}
    for pn in pnames:
        for k, upd in enumerate(upds):
            at = _step_key(k)
            groups.setdefault(owner.get(pn, ""), []).append(
                _metric(f"{pn} step {k + 1}" if k else pn, upd[pn], reader, f"{at}iupd/{pn}", f"{at}truth/iupd/{pn}",
                        u, tol.confidence))
    failing: list[LayerRecord] = []
    later_only = 0   # failing groups whose first step is within bounds: what the optimizer's state carries
    for mod, leaves in groups.items():
        rec = LayerRecord(name=f"{OPTIMIZER}:{mod or '<model>'}")
        rule = Rule.of(tol.for_layer(mod), rung)
        judge_layer(rec, leaves, [], rule)
        rec.passed = rec.prop_passed = rec.iso_passed
        if not rec.iso_passed and rec.iso is not None:
            failing.append(rec)
            if n_steps > 1:
                first = LayerRecord(name=rec.name)
                judge_layer(first, leaves[::n_steps], [], rule)   # each parameter's step-1 leaf
                later_only += first.iso_passed
        result.outputs.append(rec)
    result.extra["optimizer"] = {r.name: r.iso_passed for r in result.outputs if r.name.startswith(OPTIMIZER)}
    if failing:
        result.passed = False
        worst = sorted(failing, key=lambda r: -(r.iso.ratio if r.iso is not None else 0.0))
        named = "; ".join(f"{r.name.split(':', 1)[1]} {r.iso.ratio:.3g}x" for r in worst[:3] if r.iso is not None)
        more = f" and {len(failing) - 3} more" if len(failing) > 3 else ""
        clipped = " (gradient clipping included)" if clip is not None else ""
        how = ("one step from the golden weights and gradients, against the float64 step" if n_steps == 1 else
               f"{n_steps} steps from the golden weights on the golden gradients of each step, against the float64 "
               f"steps")
        state = (f"; {'every failing group is' if later_only == len(failing) else f'{later_only} of them are'} "
                 f"within bounds at the first step and out from a later one: what the optimizer's state carries "
                 f"(momentum, Adam's moments and betas, a step count) differs" if later_only else "")
        result.notes.append(f"the optimizer's update{clipped} is out of bounds for {len(failing)} of {len(groups)} "
                            f"parameter groups ({how}): {named}{more} times the reference's error; the model's own "
                            f"backward is judged apart{state}")
