"""The likely cause of an FP8 layer's failure, in the words of the conversion that went wrong.

Why: a broken OCP-to-FNUZ port does not crash; its numbers are off by a pattern. The golden holds
the reference's codes and scales (quant/<module>/<tensor>), so a replay can compare what the
candidate's weights mean with what the reference's meant, and quantize the module's golden input
both ways, and say which pattern it sees: a factor of 2 or 1/2 (scales not adjusted), NaN where the
reference was finite (bytes reinterpreted, or a cast without saturation), saturation at 240 where the
reference reached 448, or the reciprocal of the scale (docs/fp8.md).
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from pytest_rocm_parity.judging.records import CheckResult
from pytest_rocm_parity.quant.storage import scheme

# How a weight quantized again (not converted) is named: quant_notes gathers them under one note.
REQUANTIZED = "its weight is quantized otherwise than the golden's"
# A ratio of dequantized weights this close to a power of two is that power of two.
_FACTOR_TOL = 1e-3
# Saturated codes in the candidate's activation beyond twice the reference's share plus this share of
# the elements are a saturation change, not rounding at the edge of the range: a per-token recipe
# saturates one code per token on either side, while a static input_scale left for 448 on FNUZ codes
# saturates only the activations' tail, under a percent (tests/quant/test_fp8.py -k static_input_scale).
_SATURATION_EXCESS = 0.001


def _dequantize(codes: Any, scale: Any) -> Any:
    import torch

    c = codes.to(torch.float64)
    s = scale.to(torch.float64)
    if s.dim() and s.shape != c.shape and s.dim() == c.dim():   # block scales: one per tile
        for d in range(c.dim()):
            if s.shape[d] != c.shape[d] and s.shape[d] != 1:
                s = s.repeat_interleave(-(-c.shape[d] // s.shape[d]), dim=d).narrow(d, 0, c.shape[d])
    return c * s


def _family(codes: Any) -> str:
    from pytest_rocm_parity.quant.fp8 import fp8_format

    return fp8_format(codes.dtype).family


def _fnuz_max(codes: Any) -> float:
    from pytest_rocm_parity.quant.fp8 import fp8_format

    f = fp8_format(codes.dtype)
    return (f if f.family == "fnuz" else f.counterpart).max


def _reference_twin(entry: dict[str, Any], get: Callable[[str], Any]) -> Any:
    """An Fp8Linear holding the reference's codes and scales (None when the golden's module is not
    one quant.fp8 can stand for)."""
    import torch

    from pytest_rocm_parity.quant.fp8 import Fp8Linear, fp8_format, frozen

    t = {n: get(k) for n, k in entry["tensors"].items()}
    if set(t) - {"weight", "weight_scale", "input_scale"} or "weight" not in t or "weight_scale" not in t:
        return None
    w = t["weight"]
    twin = Fp8Linear(w.shape[1], w.shape[0], bias=False, fmt=fp8_format(w.dtype),
                     activation=entry.get("activation"))
    twin.weight, twin.weight_scale = frozen(w), frozen(t["weight_scale"].to(torch.float32))
    if "input_scale" in t:
        twin.input_scale = t["input_scale"].to(torch.float32)
    return twin


def _scale_key(entry: dict[str, Any]) -> str:
    """The golden key of the codes' scale: <codes>_scale or <codes>_scale_inv by the usual naming."""
    codes, keys = entry["codes"], entry["tensors"]
    for name in (f"{codes}_scale", f"{codes}_scale_inv", "scale"):
        if name in keys:
            return str(keys[name])
    return str(next((k for n, k in sorted(keys.items()) if n != codes and "input" not in n), ""))


def weight_finding(cand: Any, entry: dict[str, Any], get: Callable[[str], Any]) -> str:
    """What the candidate module's weight means against the reference's, in words ('' if the same)."""
    import torch

    if not _scale_key(entry):
        return ""   # codes without a scale: nothing to tell their meaning by
    codes, scale = get(entry["tensors"][entry["codes"]]), get(_scale_key(entry)).to(torch.float64)
    ref = _dequantize(codes, scale)
    own = {**cand._parameters, **cand._buffers}
    cand_scale = own.get(_scale_key(entry).rsplit("/", 1)[-1])
    if callable(getattr(cand, "dequantized_weight", None)):
        got = cand.dequantized_weight(torch.float64).detach().to(ref.device)
    elif isinstance(own.get(entry["codes"]), torch.Tensor) and isinstance(cand_scale, torch.Tensor):
        # another stack's FP8 layer holding codes and a scale under the reference's names
        got = _dequantize(own[entry["codes"]].detach().cpu(), cand_scale.detach().cpu()).to(ref.device)
    elif isinstance(getattr(cand, "weight", None), torch.Tensor) and cand.weight.element_size() > 1:
        got = cand.weight.detach().to(ref.device, torch.float64)   # served unquantized
        if got.shape != ref.shape or torch.equal(got, ref):
            return ""
        return (f"it holds an unquantized {str(cand.weight.dtype).removeprefix('torch.')} weight where the golden's "
                f"module is {str(codes.dtype).removeprefix('torch.')} codes, {_rel_rms(got, ref):.2%} RMS from "
                f"their meaning: it computes unquantized, which the checkpoint does not (an ignore list of the "
                f"serving config that names it, or a fallback to bf16); serve it quantized as the checkpoint has it")
    else:
        return ""
    if got.shape != ref.shape or torch.equal(got, ref):
        return ""
    bad = ~torch.isfinite(got) & torch.isfinite(ref)
    if bad.any():
        neg_zero = (codes.view(torch.uint8) == 0x80).to(bad.device)
        if _family(codes) == "ocp" and bool(neg_zero.any()) and bool((bad <= neg_zero).all()):
            return (f"its weight holds {int(bad.sum())} NaN exactly where the reference's bytes are 0x80 (OCP's "
                    f"negative zero, FNUZ's NaN): OCP bytes read as FNUZ; convert with quant.fp8.ocp_to_fnuz "
                    f"(0x80 to 0, scales doubled)")
        big = (ref.abs() > _fnuz_max(codes) * scale.abs()).to(bad.device)
        if bool((bad <= big).all()):
            return (f"its weight holds {int(bad.sum())} NaN where the reference's codes exceed FNUZ's maximum (240): "
                    f"the codes were cast by value without saturation (a cast to FNUZ makes NaN past 240); convert "
                    f"the bytes with quant.fp8.ocp_to_fnuz (each byte means half, the scale doubles) instead")
        return f"its weight holds {int(bad.sum())} NaN where the reference's is finite"
    nz = (ref != 0) & (got != 0)
    if not nz.any():
        return ""
    # divided by the scale instead of multiplied: got / ref = 2^k / scale^2 (2^k: a format conversion)
    per_scale = (got / ref * _dequantize(torch.ones_like(codes, dtype=torch.float64), scale) ** 2)[nz]
    k = math.log2(per_scale.median().item()) if per_scale.median().item() > 0 else 0.5
    if abs(k - round(k)) < _FACTOR_TOL and ((per_scale / 2.0 ** round(k)) - 1).abs().max().item() < _FACTOR_TOL \
            and not torch.allclose(scale, torch.ones_like(scale)):
        return ("its dequantized weight is the codes divided by the scale: the reciprocal of the scale is used "
                "(a weight_scale_inv read as weight_scale, or the reverse)")
    ratio = (got[nz] / ref[nz]).median().item()
    spread = ((got[nz] / ref[nz]) / ratio - 1).abs().max().item()
    if spread < _FACTOR_TOL:
        for factor, cause in ((0.5, "FNUZ codes with the OCP scale: the weight scale was not doubled after the "
                                    "OCP-to-FNUZ conversion, or OCP bytes read as FNUZ with no conversion (then "
                                    "its negative zeros, 0x80, are FNUZ's NaN too: quant.fp8.ocp_to_fnuz converts "
                                    "both)"),
                              (2.0, "OCP codes with a doubled scale, or FNUZ bytes read as OCP")):
            if abs(ratio / factor - 1) < _FACTOR_TOL:
                return f"its dequantized weight is {factor:g}x the reference's: {cause}"
        return f"its dequantized weight is {ratio:.4g}x the reference's (one factor throughout: a scale)"
    return _requantized(got, ref, codes, scale, own.get(entry["codes"]), cand_scale)


def _rel_rms(got: Any, ref: Any) -> float:
    return float((got - ref).norm() / ref.norm().clamp_min(1e-300))


def _granularity(scale: Any, codes_shape: Any) -> str:
    """A weight scale's layout in words: per-tensor, per-channel or block."""
    n = int(scale.numel())
    if n == 1:
        return "one per-tensor scale"
    if scale.dim() == len(codes_shape) and all(s in (1, c) for s, c in zip(scale.shape, codes_shape)):
        return f"per-channel scales ({n})"
    return f"block scales ({'x'.join(str(d) for d in scale.shape)})"


def _requantized(got: Any, ref: Any, codes: Any, scale: Any, cand_codes: Any, cand_scale: Any) -> str:
    """The candidate's weight means other values than the golden's with no pattern of a conversion:
    quantized again (another recipe, another source), so the checkpoint differs, not a kernel. What
    differs, codes, format or scale layout, says where to look."""
    import torch

    what = []
    if isinstance(cand_codes, torch.Tensor) and cand_codes.dtype != codes.dtype:
        what.append(f"its codes are {str(cand_codes.dtype).removeprefix('torch.')} where the golden's are "
                    f"{str(codes.dtype).removeprefix('torch.')}")
    elif isinstance(cand_codes, torch.Tensor) and cand_codes.shape == codes.shape:
        moved = (cand_codes.detach().cpu().view(torch.uint8) != codes.cpu().view(torch.uint8)).float().mean().item()
        what.append(f"{moved:.0%} of its codes differ from the golden's")
    if isinstance(cand_scale, torch.Tensor):
        mine, theirs = _granularity(cand_scale, codes.shape), _granularity(scale, codes.shape)
        if mine != theirs:
            what.append(f"it has {mine} where the golden's weight has {theirs}")
    return (f"{REQUANTIZED}{': ' if what else ''}{'; '.join(what)}; its "
            f"dequantized weight is {_rel_rms(got, ref):.2%} RMS from the reference's, with no single factor (not "
            f"a scale conversion): the checkpoint was quantized again (another recipe, or from other weights), "
            f"so the candidate computes another model, not a kernel's error. Load the checkpoint the golden was "
            f"captured from, or capture the golden from this one")


def activation_finding(cand: Any, twin: Any, x: Any) -> str:
    """How the candidate quantizes the module's golden input ``x`` against the reference, in words."""
    import torch

    if not callable(getattr(cand, "quantize_input", None)) or twin is None or twin.activation is None:
        return ""
    x2 = x.detach().reshape(-1, x.shape[-1]).to(torch.float32)
    cq, cs = cand.quantize_input(x2.to(cand.weight.device))
    rq, rs = twin.quantize_input(x2)
    got = cq.to(torch.float64).cpu() * cs.to(torch.float64).cpu()
    ref = rq.to(torch.float64) * rs.to(torch.float64)
    bad = ~torch.isfinite(got) & torch.isfinite(ref)
    cmax, rmax = float(torch.finfo(cq.dtype).max), float(torch.finfo(rq.dtype).max)
    if bad.any():
        at_max = int((rq.to(torch.float32).abs() >= rmax)[bad].sum())
        if at_max == int(bad.sum()):
            return (f"its activation quantization gives {int(bad.sum())} NaN where the reference saturated: a cast "
                    f"without saturation (a cast to FNUZ makes NaN past 240); clamp to the format's max "
                    f"(torch.finfo(dtype).max) before the cast")
        negzero = int((rq.view(torch.uint8) == 0x80)[bad].sum())
        return (f"its activation quantization gives {int(bad.sum())} NaN where the reference's codes are finite"
                + (f", {negzero} of them at the reference's negative zero (0x80, which FNUZ reads as NaN): OCP "
                   f"codes read as FNUZ bytes, or a cast that keeps the sign of zero; convert the codes "
                   f"(convert_to_fnuz) or make -0 +0 before the cast" if negzero else
                   f" and {'only some ' if at_max else 'none '}at the format's max: look at how the codes are made "
                   f"(a scale, a byte reinterpretation)"))
    c_sat = (cq.to(torch.float32).abs() >= cmax).float().mean().item()
    r_sat = (rq.to(torch.float32).abs() >= rmax).float().mean().item()
    if c_sat > 2 * r_sat + _SATURATION_EXCESS:
        seen = (f"{100 * c_sat:.2g}% of its activation codes saturate at {cmax:g} where {100 * r_sat:.2g}% of the "
                f"reference's reach {rmax:g}")
        same_scale = torch.allclose(cs.to(torch.float64).cpu(), rs.to(torch.float64), rtol=1e-3)
        if cmax != rmax and same_scale:
            fix = ("double its input_scale in the conversion, as the weight scales are (convert_to_fnuz does)"
                   if getattr(cand, "activation", None) == "static" else
                   "take the max of the dtype in use, torch.finfo(dtype).max")
            return (f"{seen}: its scales are the reference's, made for {rmax:g}, while its codes are "
                    f"{str(cq.dtype).removeprefix('torch.')} (max {cmax:g}); {fix}")
        return (f"{seen}: its activation scale is too small for its input (computed from another tensor, or a "
                f"stale calibration)")
    return ""


def quant_notes(result: CheckResult, meta: dict[str, Any], get: Callable[[str], Any], model: Any,
                golden_input: Callable[[str], Any | None]) -> list[str]:
    """Notes on what the golden and the candidate quantize: where the golden cannot judge the
    candidate as a quantized model (golden_notes), and, for a failing check, the likely FP8 cause at
    each failing module that holds quantized storage (or is the culprit): one per module, weights
    first. Runs on every check, since an FP8 candidate of an unquantized golden has no golden
    ``quant`` to tell it by."""
    quant = meta.get("quant") or {}
    if not quant and result.passed:
        return []   # an unquantized golden speaks only to a failing candidate: a pass walks no modules
    mods = dict(model.named_modules())
    cand = {n: s for n, mod in mods.items() if (s := scheme(mod)) is not None}
    if not quant and not cand:
        return []
    notes = golden_notes(meta, cand, mods, result.passed)
    if result.passed:
        return notes
    failing = [l.name for l in result.layers if not l.passed]
    if result.culprit:
        failing.insert(0, result.culprit)
    seen: set[str] = set()
    requantized: list[str] = []   # beyond the first: one note for them all (a checkpoint quantized again)
    for key in failing:
        name = key.split("#")[0]
        if name in seen or name not in mods:
            continue
        seen.add(name)
        if name in quant or name in cand:
            if not quant and name != result.culprit:
                continue   # an unquantized golden: the note on the golden names them all
            why = _module_finding(name, key, mods[name], quant, get, golden_input)
            if why.startswith(REQUANTIZED):
                requantized.append(name)
                if len(requantized) > 1:
                    continue   # the first one's note says it; the others are listed in one note below
            if why:
                notes.append(f"{name}: {why}")
            continue
        # the culprit is not itself quantized (a block, at a shallow drill): the weights of the
        # quantized modules inside it, from the golden's codes (no golden input for them here); only
        # for the culprit, since each check holds a float64 copy of one weight
        if name != result.culprit:
            continue
        inner = [n for n in quant if n.startswith(name + ".") and n in mods and n not in seen] if name else \
            [n for n in quant if n in mods and n not in seen]
        for n in inner:
            why = weight_finding(mods[n], quant[n], get) if quant[n].get("tensors") else ""
            if why:
                seen.add(n)
                notes.append(f"{name}: inside it, {n}: {why}")
    if len(requantized) > 1:
        more = requantized[1:]
        notes.append(f"{len(more)} more failing module{'s' if len(more) > 1 else ''} ({_listed(more)}) "
                     f"{'hold weights' if len(more) > 1 else 'holds a weight'} quantized otherwise than the "
                     f"golden's as well: the checkpoint differs throughout, look at it rather than at a kernel")
    return notes


def _listed(names: list[str], n: int = 3) -> str:
    return ", ".join(names[:n]) + (" ..." if len(names) > n else "")


def golden_notes(meta: dict[str, Any], cand: dict[str, tuple[str, str | None]], mods: dict[str, Any],
                 passed: bool) -> list[str]:
    """Where the golden does not hold the quantized model the candidate is, in words: an FP8
    candidate of an unquantized golden (the noise allowance needs noise measured at capture, which
    such a golden has none of), activations quantized against a golden that recorded no noise, and
    modules the golden quantizes that the candidate computes unquantized (more accurate, so they
    pass: a broken ignore list of a serving config shows only here). ``cand``: the candidate's
    quantized modules by name, their scheme (storage.scheme)."""
    quant = meta.get("quant") or {}
    notes = []
    if not quant and cand and not passed:
        names = list(cand)
        notes.append(
            f"the golden is of an unquantized model and the candidate quantizes {len(names)} module"
            f"{'s' if len(names) > 1 else ''} ({_listed(names)}): {'each' if len(names) > 1 else 'it'} is judged "
            f"against the unquantized reference, so its FP8 rounding counts as error, and quant_noise allows none "
            f"of it, since that "
            f"allowance is the activation-quantization noise capture measures on a quantized model and this "
            f"golden holds none. If the model is meant to be served quantized, quantize it on the reference as "
            f"the candidate is (quantize_model with the same format and scales, or load the FP8 checkpoint; "
            f"Fp8Linear emulates the GEMM where the device has no FP8) and capture that golden; a golden of the "
            f"unquantized model judges an unquantized candidate only (docs/fp8.md)")
    elif quant and not meta.get("quant_noise") and not passed:
        # the candidate's activations on another grid than the reference's: only recorded noise allows that
        acts = sorted(n for n, (fmt, act) in cand.items() if act is not None
                      and (quant.get(n, {}).get("format"), quant.get(n, {}).get("activation")) != (fmt, act))
        if acts:
            notes.append(
                f"the candidate quantizes the activations of {len(acts)} module{'s' if len(acts) > 1 else ''} "
                f"({_listed(acts)}) otherwise than the golden's reference, and the golden records no "
                f"activation-quantization noise (its reference quantizes no activations there): quant_noise "
                f"allows nothing, so that rounding counts as error. If the checkpoint's recipe quantizes "
                f"activations so, capture the golden from the model quantized as the candidate is; if it does "
                f"not, the candidate quantizes against the checkpoint")
    dropped = sorted(n for n in quant if n in mods and n not in cand)
    if dropped:
        notes.append(
            f"{len(dropped)} module{'s' if len(dropped) > 1 else ''} the golden's reference quantizes "
            f"({_listed(dropped)}) {'compute' if len(dropped) > 1 else 'computes'} unquantized on the candidate: "
            f"more accurate than the checkpoint, so {'not a failure' if passed else 'not the failure by itself'}, "
            f"but not the model the golden holds (an ignore list of the serving config that names "
            f"{'them' if len(dropped) > 1 else 'it'}, or a fallback to bf16); serve "
            f"{'them' if len(dropped) > 1 else 'it'} quantized as the checkpoint has "
            f"{'them' if len(dropped) > 1 else 'it'}, unless the served model is meant to differ")
    return notes


def _module_finding(name: str, key: str, mod: Any, quant: dict[str, Any], get: Callable[[str], Any],
                    golden_input: Callable[[str], Any | None]) -> str:
    """The likely cause at one quantized (or newly quantized) module, '' when no pattern fits."""
    if name not in quant:
        fmt = scheme(mod)
        if not quant:   # the whole golden is unquantized: the layer, or the golden, may be what is wrong
            return (f"the candidate quantizes it ({fmt[0] if fmt else 'FP8'}); the golden's reference computes it "
                    f"unquantized, as it computes the whole model: if the checkpoint keeps this layer in bf16 (as "
                    f"FP8 checkpoints keep the lm_head), serve it so; if the model is meant to be quantized, "
                    f"capture the quantized model (see the note on the golden)")
        return (f"the candidate quantizes it ({fmt[0] if fmt else 'FP8'}); the reference computes it unquantized "
                f"(FP8 checkpoints keep layers such as the lm_head in bf16): serve it as the checkpoint has it")
    if not quant[name].get("tensors"):
        return ""   # a sketch golden keeps what the module is, not its codes
    why = weight_finding(mod, quant[name], get)
    if not why:
        x = golden_input(key)
        why = activation_finding(mod, _reference_twin(quant[name], get), x) if x is not None else ""
    return why
