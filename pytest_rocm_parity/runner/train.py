"""Training parity: the loss, every selected module's gradients and the optimizer's update, judged
per layer against a float64 truth, with the culprit named.

Why its own path: a custom backward that drops a term still gives a plausible loss curve. The
forward's golden cannot see it; gradients can, judged as the forward is: the candidate's error
against a float64 truth paired with the reference's (compare.residual_metrics), both propagated
(the whole backward) and isolated (each module's backward fed the golden input of its forward and
the golden gradient of its output).

Each rung of the golden holds (keys of the rung's safetensors file):

* ``input/<path>``: the model inputs, cast to the rung; ``loss`` and ``gtruth/loss``;
* per selected module call: ``x/<call>`` its golden input, ``g/<call>`` the golden gradient of its
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
import time
from collections.abc import Callable, Iterator
from typing import Any

from pytest_rocm_parity import __version__
from pytest_rocm_parity.judging import dtypes as dt
from pytest_rocm_parity.judging.compare import residual_metrics
from pytest_rocm_parity.runner.engine import (CheckSpec, Hooks, cast_inputs, fingerprint, home_device, normalize_inputs,
                                       same_structure)
from pytest_rocm_parity.errors import GoldenStale, InvalidArgument
from pytest_rocm_parity.golden.store import FORMAT_VERSION, GoldenStore, RungReader
from pytest_rocm_parity.judging.judge import Rule, judge_layer
from pytest_rocm_parity.judging.records import CheckResult, LayerRecord, LeafMetrics
from pytest_rocm_parity.runner.selection import Selected, select
from pytest_rocm_parity.runner.tree import map_tensors, tensor_leaves
from pytest_rocm_parity.runner.wrappers import plain_copy, unwrap

LOSS = "<loss>"
OPTIMIZER = "optimizer"


def optimizer_factory(optimizer: Any) -> Callable[[Any], Any] | None:
    """``optimizer`` as a function of the parameters: a torch.optim class, a (class, kwargs) pair, or a
    factory already."""
    if optimizer is None:
        return None
    if isinstance(optimizer, tuple) and len(optimizer) == 2 and isinstance(optimizer[1], dict):
        cls, kw = optimizer
        return lambda params: cls(params, **kw)
    if isinstance(optimizer, type) or callable(optimizer):
        return lambda params: optimizer(params)
    raise InvalidArgument(f"optimizer={optimizer!r}: give a torch.optim class (torch.optim.AdamW), a pair "
                          f"(torch.optim.AdamW, {{'lr': 1e-3}}) or a function of the parameters")


def _loss_of(out: Any, loss: Callable[[Any], Any] | None) -> Any:
    if loss is not None:
        return loss(out)
    value = getattr(out, "loss", None)
    if value is None and isinstance(out, dict):
        value = out.get("loss")
    if value is None:
        raise InvalidArgument("loss=None uses the model's own loss (a Hugging Face model given labels in its "
                              "inputs); this model returned none: pass labels, or loss=a function of the outputs")
    return value


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
    """One forward and backward of a model with hooks: each selected call's golden input and call,
    and the gradient flowing into its primary output."""

    def __init__(self, model: Any, selected: list[Selected]) -> None:
        self.model, self.selected = model, selected
        self.calls: dict[str, tuple[Any, Any, str, str]] = {}   # key -> (args, kwargs, x path, y path)
        self.x: dict[str, Any] = {}
        self.g: dict[str, Any] = {}
        self.order: list[str] = []

    def forward_backward(self, args: Any, kwargs: Any, loss: Callable[[Any], Any] | None,
                         swap: dict[str, Any] | None = None) -> Any:
        import torch

        def pre(key: str, sel: Selected, a: Any, kw: Any) -> Any:
            leaves = tensor_leaves({"args": a, "kwargs": kw})
            xp = _first_float(leaves)
            if xp is None:
                return None
            self.x[key] = leaves[xp].detach().clone()
            self.calls[key] = (a, kw, xp, "")
            self.order.append(key)
            return None

        def post(key: str, sel: Selected, out: Any) -> None:
            leaves = {"0": out} if isinstance(out, torch.Tensor) else tensor_leaves(out)
            yp = _first_float(leaves)
            if yp is None or key not in self.calls or not leaves[yp].requires_grad:
                return
            a, kw, xp, _ = self.calls[key]
            self.calls[key] = (a, kw, xp, yp)
            leaves[yp].register_hook(lambda g, k=key: self.g.__setitem__(k, g.detach().clone()))

        with torch.enable_grad(), Hooks(self.model, self.selected, pre, post):
            out = self.model(*args, **kwargs)
            value = _loss_of(out, loss)
            value.backward()
        return value.detach()


def isolated_backward(mod: Any, call: tuple[Any, Any, str, str], x: Any, g: Any,
                      params: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """``mod``'s own backward: called on ``call`` with its primary input replaced by ``x``, the gradient
    ``g`` fed into its primary output; (input gradient, {parameter: gradient})."""
    import torch

    a, kw, xp, yp = call
    xin = x.detach().clone().requires_grad_(True)
    root = map_tensors({"args": a, "kwargs": kw}, lambda p, t: xin if p == xp else t.detach())
    with torch.enable_grad():
        out = mod(*root["args"], **root["kwargs"])
        leaves = {"0": out} if isinstance(out, torch.Tensor) else tensor_leaves(out)
        y = leaves[yp]
        names = list(params)
        got = torch.autograd.grad(y, [xin, *params.values()], grad_outputs=g.to(y.dtype), allow_unused=True)
    dx = got[0] if got[0] is not None else torch.zeros_like(xin)
    return dx.detach(), {n: (t.detach() if t is not None else torch.zeros_like(params[n]))
                         for n, t in zip(names, got[1:])}


def _prepared(model: Any, device: Any, dtype: Any) -> Any:
    """The reference's copy in the rung's dtype; frozen parameters stay frozen (a LoRA fine-tune
    trains its adapters only), the model's own wrappers and compiled calls left out."""
    m = plain_copy(model).to(device=device, dtype=dtype).eval()
    for p in m.parameters():
        p.grad = None
    return m


def _steps(m: Any, args: Any, kwargs: Any, loss: Any, factory: Callable[[Any], Any], steps: int,
           first: Any) -> dict[str, Any]:
    """Parameter updates after ``steps`` optimizer steps (the first on the gradients already there)."""
    import torch

    before = {n: p.detach().clone() for n, p in m.named_parameters()}
    opt = factory(list(m.parameters()))
    for i in range(steps):
        if i:
            opt.zero_grad(set_to_none=True)
            with torch.enable_grad():
                _loss_of(m(*args, **kwargs), loss).backward()
        opt.step()
    return {n: (p.detach() - before[n]) for n, p in m.named_parameters()}


def _one_step(params: dict[str, Any], grads: dict[str, Any], factory: Callable[[Any], Any]) -> dict[str, Any]:
    """The update one optimizer step makes from ``params`` with gradients ``grads`` (copies)."""
    import torch

    ps = {n: torch.nn.Parameter(p.detach().clone()) for n, p in params.items()}
    for n, p in ps.items():
        p.grad = grads[n].detach().clone().to(p.dtype)
    factory(list(ps.values())).step()
    return {n: (ps[n].detach() - params[n].detach()) for n in ps}


def _residual(truth: Any, ref: Any, rdt: Any) -> Any:
    import torch

    return (truth.detach().to("cpu", torch.float64) - ref.detach().to("cpu", torch.float64)).to(rdt).contiguous()


def capture_train(model: Any, inputs: Any, spec: CheckSpec, store: GoldenStore, device: str,
                  loss: Callable[[Any], Any] | None = None, optimizer: Any = None, steps: int = 1,
                  overwrite: bool = False, env: dict[str, Any] | None = None) -> dict[str, Any]:
    """Record the training golden of every rung of ``spec`` and write it; returns the manifest.

    With ``spec.sketch`` (a group size) every gradient and update is kept as a CountSketch of it and
    of its float64 truth (golden/sketch.py; tensors of up to 64 groups whole): a fraction of the size,
    judged on the propagated step only (no module inputs, so no isolated backward; no weights, so no
    optimizer step).
    """
    import torch

    from pytest_rocm_parity.migration.backend import collect_env

    if steps < 1:
        raise InvalidArgument(f"steps={steps!r}: at least one optimizer step")
    inner = unwrap(model)
    factory = optimizer_factory(optimizer)
    args0, kwargs0 = normalize_inputs(inputs)
    selected = select(inner, spec.layers, spec.drill)
    manifest: dict[str, Any] = {
        "format": FORMAT_VERSION, "kind": "train", "name": spec.name, "test": spec.test, "tool_version": __version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "fingerprint": fingerprint(inner),
        "model_class": type(inner).__name__, "seed": int(torch.initial_seed()), "dtypes": list(spec.dtypes),
        "layers": [{"name": s.name, "level": s.level, "primary": s.primary} for s in selected],
        "drill": spec.drill, "layer_patterns": list(spec.layers) if spec.layers else None,
        "sketch": int(spec.sketch or 0), "steps": steps, "optimizer": repr(optimizer) if optimizer is not None else None,
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
            run = _Run(ref, selected)
            t["loss"] = run.forward_backward(args, kwargs, loss).to("cpu").reshape(1)
            # the float64 truth: the same weights (rounded to the rung), in float64 arithmetic
            tm = copy.deepcopy(ref).to(torch.float64)
            targs, tkwargs = cast_inputs(args, kwargs, torch.float64, device)
            truth = _Run(tm, selected)
            t["gtruth/loss"] = _residual(truth.forward_backward(targs, tkwargs, loss).reshape(1), t["loss"], rdt)
            if spec.sketch:
                manifest["rungs"][rung] = _sketched(t, run, truth, ref, tm, selected, names, factory, args, kwargs,
                                                    targs, tkwargs, loss, steps, int(spec.sketch))
                return t
            layers: list[dict[str, Any]] = []
            for key, name, sel in _judged_calls(run, truth, selected):
                mod, tmod = (m.get_submodule(name) if name else m for m in (ref, tm))
                own, town = _own_params(mod, names, name), _own_params(tmod, names, name)
                t[f"x/{key}"] = run.x[key].to("cpu").contiguous()
                t[f"g/{key}"] = run.g[key].to("cpu").contiguous()
                t[f"gtruth/go/{key}"] = _residual(truth.g[key], run.g[key], rdt)
                dx, dps = isolated_backward(mod, run.calls[key], run.x[key], run.g[key], own)
                tdx, tdps = isolated_backward(tmod, truth.calls[key], run.x[key].to(torch.float64),
                                              run.g[key].to(torch.float64), town)
                t[f"ix/{key}"] = dx.to("cpu").contiguous()
                t[f"truth/ix/{key}"] = _residual(tdx, dx, rdt)
                for pn in own:
                    t[f"ip/{key}/{pn}"] = dps[pn].to("cpu").contiguous()
                    t[f"truth/ip/{key}/{pn}"] = _residual(tdps[pn], dps[pn], rdt)
                layers.append({"key": key, "name": name, "level": sel.level, "primary": sel.primary,
                               "in": {run.calls[key][2]: f"x/{key}"}, "out": {run.calls[key][3]: f"g/{key}"},
                               "params": sorted(own)})
            # gradients kept to the selected layers: the parameters the selected modules own
            owned: set[str] = {pn for e in layers for pn in e["params"]}
            params = {pn: p for pn, p in ref.named_parameters() if pn in owned}
            tparams = dict(tm.named_parameters())
            for pn, p in params.items():
                if p.grad is not None and tparams[pn].grad is not None:
                    t[f"pg/{pn}"] = p.grad.detach().to("cpu").contiguous()
                    t[f"gtruth/pg/{pn}"] = _residual(tparams[pn].grad, p.grad, rdt)
            meta: dict[str, Any] = {"layers": layers, "order": [e["key"] for e in layers],
                                    "outputs": {"out": {"loss": "loss"}}, "truth_encoding": "residual",
                                    "truth_dtype": dt.name_of(rdt), "inputs": {"const": {}}}
            if factory is not None:
                grads = {pn: p.grad.detach().clone() for pn, p in params.items() if p.grad is not None}
                w = {pn: params[pn].detach().clone() for pn in grads}
                iupd = _one_step(w, grads, factory)
                tiupd = _one_step({pn: v.to(torch.float64) for pn, v in w.items()},
                                  {pn: v.to(torch.float64) for pn, v in grads.items()}, factory)
                upd = _steps(ref, args, kwargs, loss, factory, steps, None)
                tupd = _steps(tm, targs, tkwargs, loss, factory, steps, None)
                for pn in grads:
                    t[f"w/{pn}"] = w[pn].to("cpu").contiguous()
                    t[f"iupd/{pn}"] = iupd[pn].to("cpu").contiguous()
                    t[f"truth/iupd/{pn}"] = _residual(tiupd[pn], iupd[pn], rdt)
                    t[f"upd/{pn}"] = upd[pn].to("cpu").contiguous()
                    t[f"gtruth/upd/{pn}"] = _residual(tupd[pn], upd[pn], rdt)
                meta["optimizer_params"] = sorted(grads)
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
        g = sketch_group(ref_t.numel(), group)
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


# A tensor this many groups or smaller is kept whole (a sketch of groups of one): a bias of 128
# elements in groups of 64 would leave two entries, too few for the jackknife bound and the sign test.
WHOLE_BELOW_GROUPS = 64


def sketch_group(numel: int, group: int) -> int:
    return 1 if numel <= group * WHOLE_BELOW_GROUPS else group


def _sketch_metric(leaf: str, c: Any, reader: RungReader, kind: str, name: str, group: int, u: float,
                   conf: float) -> LeafMetrics:
    from pytest_rocm_parity.golden.sketch import sketch
    from pytest_rocm_parity.judging.compare import float_metrics

    ref = reader.get(f"sk/{kind}/{name}")
    group = sketch_group(int(c.numel()), group)
    m = float_metrics(leaf, sketch(c, group, f"{kind}/{name}").to(ref.device), ref,
                      reader.get(f"skt/{kind}/{name}").to(ref.device), u, conf)
    m.numel = int(c.numel())
    return m


def _replay_sketch(cand: Any, meta: dict[str, Any], reader: RungReader, spec: CheckSpec, rung: str, args: Any,
                   kwargs: Any, loss: Any, factory: Any, selected: list[Selected], group: int,
                   steps: int) -> CheckResult:
    """A sketch golden: the propagated step judged against sketches, each module by the rule of the
    forward's sketch goldens; the culprit is the first module, in the backward's order, whose own
    parameters' gradients drifted (else whose output gradient did)."""
    from pytest_rocm_parity.runner.replay import _sketch_failure

    tol = spec.tolerance
    u = tol.unit_roundoff(rung)
    run = _Run(cand, selected)
    value = run.forward_backward(args, kwargs, loss)
    grads = {n: p.grad.detach().clone() for n, p in cand.named_parameters() if p.grad is not None}
    result = CheckResult(test=spec.test, name=spec.name, dtype=rung, passed=True, kind="train")
    loss_rec = LayerRecord(name=LOSS)
    judge_layer(loss_rec, [], [_metric("loss", value.reshape(1), reader, "loss", "gtruth/loss", u, tol.confidence)],
                Rule.of(tol.for_layer(LOSS), rung))
    loss_rec.passed = loss_rec.prop_passed
    result.outputs.append(loss_rec)
    drift: list[tuple[bool, bool]] = []   # per record: (its output gradient drifted, its parameters' did)
    for e in meta["layers"]:
        key, name = e["key"], e["name"]
        t = tol.for_layer(name)
        budget = max(t.ratio_for(rung), t.propagated_for(rung))
        leaves = []
        if key in run.g:
            leaves.append(("go", _sketch_metric("grad_output", run.g[key], reader, "go", key, group, u, t.confidence)))
        leaves += [("pg", _sketch_metric(f"grad {pn}", grads[pn], reader, "pg", pn, group, u, t.confidence))
                   for pn in e["params"] if pn in grads]
        rec = LayerRecord(name=key, level=e["level"], primary=e["primary"])
        judge_layer(rec, [], [m for _, m in leaves], Rule.of(t, rung))
        reasons = [(kind, _sketch_failure(m, t, rung, budget)) for kind, m in leaves]
        rec.prop_passed = rec.iso_passed = rec.passed = not any(r for _, r in reasons)
        rec.budget, rec.reason = budget, next((r for _, r in reasons if r), "")
        drift.append((any(r for kind, r in reasons if kind == "go"), any(r for kind, r in reasons if kind == "pg")))
        result.layers.append(rec)
    first = _sketch_culprit(result.layers, drift)
    result.culprit = first.name if first else None
    result.culprit_block = first.primary if first else None
    result.first_divergent = next((r.name for r in reversed(result.layers) if not r.passed), None)
    result.passed = first is None and loss_rec.passed
    if factory is not None:
        result.notes.append("the optimizer's step is not judged against a sketch golden: Adam's normalised "
                            "update turns gradient rounding into update noise that only a step from the golden "
                            "weights and gradients (a full golden) separates from a bug")
    result.notes.append(f"sketch golden (groups of {group}): the propagated step judged; the culprit is the first "
                        f"module, in the backward's order, whose gradients drifted")
    return result


def _sketch_culprit(records: list[LayerRecord], drift: list[tuple[bool, bool]]) -> LayerRecord | None:
    """Walking the backward's order (the last module first): a module whose own parameters' gradients
    drifted while its output gradient held is the culprit; a module whose output gradient drifted
    received it from the module that consumed its output, the next call after it (and after its
    own sub-modules) in the forward's order."""
    n = len(records)
    for i in range(n - 1, -1, -1):
        go_bad, pg_bad = drift[i]
        if go_bad:
            name = records[i].name
            nxt = next((r for r in records[i + 1:] if not r.name.startswith(name + ".")), None)
            return nxt or records[i]
        if pg_bad:
            return records[i]
    return None


def _metric(leaf: str, c: Any, reader: RungReader, ref_key: str, res_key: str, u: float, conf: float) -> LeafMetrics:
    ref = reader.get(ref_key)
    return residual_metrics(leaf, c.detach().to(ref.device, ref.dtype), ref, reader.get(res_key), u, conf)


def replay_train(model: Any, inputs: Any, spec: CheckSpec, store: GoldenStore, device: str,
                 loss: Callable[[Any], Any] | None = None, optimizer: Any = None, steps: int = 1,
                 env: dict[str, Any] | None = None) -> list[CheckResult]:
    """Judge the candidate's training step against the golden, one CheckResult per rung (a sketch
    golden: the propagated step only, _replay_sketch)."""
    import torch

    from pytest_rocm_parity.migration.backend import collect_env
    from pytest_rocm_parity.runner.engine import shell_quote

    inner = unwrap(model)
    manifest = store.read_manifest(spec.name)
    mpath = str(store.manifest_path(spec.name))
    regen = spec.regen_command or f"pytest --rocm-parity --parity-regen={shell_quote(spec.name)}"
    if manifest.get("kind") != "train":
        raise GoldenStale(f"{mpath}: the golden of {spec.name!r} is not a training golden; regenerate: {regen}", mpath)
    recorded = manifest.get("fingerprint", {})
    if (not same_structure(inner, recorded) or fingerprint(inner).get("weights") != recorded.get("weights")
            or manifest.get("steps") != steps or int(manifest.get("sketch") or 0) != int(spec.sketch or 0)):
        raise GoldenStale(f"stale golden {mpath} for {spec.name!r}: the model or the number of steps changed; "
                          f"regenerate it on the reference machine: {regen}", mpath)
    factory = optimizer_factory(optimizer)
    selected = select(inner, spec.layers, spec.drill)
    names = {s.name for s in selected}
    results = []
    for rung in spec.dtypes:
        if rung not in manifest["rungs"]:
            raise GoldenStale(f"stale golden {mpath}: dtype {rung} was not captured; regenerate: {regen}", mpath)
        meta = manifest["rungs"][rung]
        dtype = dt.to_torch(rung)
        reader = RungReader(store.rung_file(spec.name, manifest, rung), str(device), meta.get("sha256"))
        tmpl = map_tensors({"args": normalize_inputs(inputs)[0], "kwargs": normalize_inputs(inputs)[1]},
                           lambda p, _t: reader.get(f"input/{p}").clone())
        args, kwargs = tuple(tmpl["args"]), tmpl["kwargs"]
        with _candidate(inner, device, dtype) as cand:
            if manifest.get("sketch"):
                result = _replay_sketch(cand, meta, reader, spec, rung, args, kwargs, loss, factory, selected,
                                        int(manifest["sketch"]), steps)
            else:
                result = _replay_rung(cand, meta, reader, spec, rung, args, kwargs, loss, factory, selected, names,
                                      device)
        reader.release()
        result.reference_env = manifest.get("reference_env", {})
        result.candidate_env = env or collect_env(str(device))
        result.golden = str(store.rung_file(spec.name, manifest, rung))
        results.append(result)
    return results


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
                 kwargs: Any, loss: Any, factory: Any, selected: list[Selected], names: set[str],
                 device: str) -> CheckResult:
    """One rung: the candidate's backward twice (propagated, and its repeatability), each module's
    own backward in isolation, the optimizer's step."""
    import torch

    tol = spec.tolerance
    u = tol.unit_roundoff(rung)
    runs = []
    for _ in range(2):   # twice: a backward whose result changes between runs is nondeterministic
        for p in cand.parameters():
            p.grad = None
        run = _Run(cand, selected)
        value = run.forward_backward(args, kwargs, loss)
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
    loss_rec = LayerRecord(name=LOSS)
    judge_layer(loss_rec, [], [_metric("loss", value.reshape(1), reader, "loss", "gtruth/loss", u, tol.confidence)],
                Rule.of(tol.for_layer(LOSS), rung))
    loss_rec.passed = loss_rec.prop_passed
    result.outputs.append(loss_rec)
    for e in meta["layers"]:
        key, name = e["key"], e["name"]
        rule = Rule.of(tol.for_layer(name), rung)
        prop: list[LeafMetrics] = []
        if key in run.g:
            prop.append(_metric("grad_output", run.g[key], reader, f"g/{key}", f"gtruth/go/{key}", u, tol.confidence))
        for pn in e["params"]:
            if pn in grads:
                prop.append(_metric(f"grad {pn}", grads[pn], reader, f"pg/{pn}", f"gtruth/pg/{pn}", u, tol.confidence))
        iso: list[LeafMetrics] = []
        call = run.calls.get(key)
        if call is not None and call[3]:
            mod = cand.get_submodule(name) if name else cand
            own = _own_params(mod, names, name)
            x = reader.get(f"x/{key}").to(device)
            g = reader.get(f"g/{key}").to(device)
            dx, dps = isolated_backward(mod, call, x, g, own)
            iso.append(_metric("grad_input", dx, reader, f"ix/{key}", f"truth/ix/{key}", u, tol.confidence))
            for pn in e["params"]:
                if pn in dps:
                    iso.append(_metric(f"grad {pn}", dps[pn], reader, f"ip/{key}/{pn}", f"truth/ip/{key}/{pn}",
                                       u, tol.confidence))
        for m in prop:   # a nondeterministic quantity is judged against its own run-to-run spread
            s_ = spread.get(key if m.leaf == "grad_output" else m.leaf)
            if s_ is not None:
                m.err_ref = max(m.err_ref, s_)
        rec = LayerRecord(name=key, level=e["level"], primary=e["primary"])
        judge_layer(rec, iso, prop, rule)
        if not iso:
            rec.reason = rec.reason or "its backward was not run in isolation (no call recorded on the candidate)"
        result.layers.append(rec)
    _finish_train(result)
    if spread:
        result.notes.append("nondeterministic backward (two runs on the candidate differ) in: "
                            + ", ".join(sorted(spread)[:8]) + (" ..." if len(spread) > 8 else "")
                            + "; each is judged against the larger of the reference's error and that spread")
    result.extra["nondeterministic"] = spread
    if factory is not None and meta.get("optimizer_params"):
        _judge_optimizer(result, cand, meta, reader, factory, selected, names, u, tol, rung, device)
    return result


def _finish_train(result: CheckResult) -> None:
    """Culprit: the smallest module whose own backward is out of bounds; first divergent: the first
    layer, in the backward's order (last module first), whose gradients drifted."""
    failing = [l for l in result.layers if not l.iso_passed]
    minimal = [l for l in failing if not any(o is not l and o.name.startswith(l.name + ".") for o in failing)]
    result.culprit = minimal[-1].name if minimal else None
    result.culprit_block = minimal[-1].primary if minimal else None
    div = next((l for l in reversed(result.layers) if not l.prop_passed), None)
    result.first_divergent = div.name if div else None
    result.passed = not failing and all(o.passed for o in result.outputs)
    if not failing and not result.passed:
        result.notes.append("the loss drifted beyond budget although no module's backward is out of bounds in "
                            "isolation: accumulated drift")


def _judge_optimizer(result: CheckResult, cand: Any, meta: dict[str, Any], reader: RungReader,
                     factory: Callable[[Any], Any], selected: list[Selected], names: set[str], u: float,
                     tol: Any, rung: str, device: str) -> None:
    """The candidate's optimizer on the golden weights and gradients, one step, judged per module (its
    parameter group) against the float64 step; named apart from the model's own layers."""
    pnames = meta["optimizer_params"]
    w = {pn: reader.get(f"w/{pn}").to(device) for pn in pnames}
    grads = {pn: reader.get(f"pg/{pn}").to(device) for pn in pnames}
    upd = _one_step(w, grads, factory)
    owner = {}
    for s in sorted(selected, key=lambda s: -len(s.name)):
        for pn in pnames:
            if pn not in owner and (not s.name or pn.startswith(s.name + ".")):
                owner[pn] = s.name
    groups: dict[str, list[LeafMetrics]] = {}
    for pn in pnames:
        groups.setdefault(owner.get(pn, ""), []).append(
            _metric(pn, upd[pn], reader, f"iupd/{pn}", f"truth/iupd/{pn}", u, tol.confidence))
    failing: list[LayerRecord] = []
    for mod, leaves in groups.items():
        rec = LayerRecord(name=f"{OPTIMIZER}:{mod or '<model>'}")
        judge_layer(rec, leaves, [], Rule.of(tol.for_layer(mod), rung))
        rec.passed = rec.prop_passed = rec.iso_passed
        if not rec.iso_passed and rec.iso is not None:
            failing.append(rec)
        result.outputs.append(rec)
    result.extra["optimizer"] = {r.name: r.iso_passed for r in result.outputs if r.name.startswith(OPTIMIZER)}
    if failing:
        result.passed = False
        worst = sorted(failing, key=lambda r: -(r.iso.ratio if r.iso is not None else 0.0))
        named = "; ".join(f"{r.name.split(':', 1)[1]} {r.iso.ratio:.3g}x" for r in worst[:3] if r.iso is not None)
        more = f" and {len(failing) - 3} more" if len(failing) > 3 else ""
        result.notes.append(f"the optimizer's update is out of bounds for {len(failing)} of {len(groups)} parameter "
                            f"groups (one step from the golden weights and gradients, against the float64 step): "
                            f"{named}{more} times the reference's error; the model's own backward is judged apart")
