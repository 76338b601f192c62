"""FP8 Linear layers as serving stacks run them, and the conversions between FP8 families.

An ``Fp8Linear`` holds the checkpoint's FP8 weight codes and float32 scales and computes as the
serving kernel does: weight-only (dequantize, then a matmul in the activation dtype) or weight and
activation (the activation quantized with a dynamic per-token or per-tensor scale, or a static
calibrated one, then an FP8 GEMM). The GEMM is ``torch._scaled_mm`` where the device multiplies FP8
(CUDA sm_89+, ROCm gfx942/gfx950) and an exact emulation elsewhere: FP8 products are exact in float32,
so the emulation differs from the hardware only in the accumulation order.

The same module run in float64 is the truth of the quantized computation (docs/fp8.md): the codes and
scales are the reference's, the activation is quantized from the float64 input as the module says,
and all arithmetic is float64. ``activations_unquantized`` turns the activation quantization off; the
difference it makes is the quantization noise a correct candidate in another format is allowed.
"""
from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import nn

from pytest_rocm_parity.errors import InvalidArgument
from pytest_rocm_parity.quant.formats import FORMATS, Fp8Format

ACTIVATION_SCHEMES = (None, "token", "tensor", "static")
WEIGHT_SCHEMES = ("channel", "tensor")
# the smallest amax a dynamic scale is computed from: an all-zero row quantizes to zeros, not NaN
_AMAX_FLOOR = 1e-12


def fp8_format(dtype: Any) -> Fp8Format:
    """The format of an FP8 torch dtype."""
    for f in FORMATS.values():
        if getattr(torch, f.dtype_name, None) == dtype:
            return f
    raise InvalidArgument(f"{dtype} is not an FP8 dtype: use one of "
                          f"{', '.join('torch.' + f.dtype_name for f in FORMATS.values())}")


def _format_of(fmt: Any) -> Fp8Format:
    if isinstance(fmt, Fp8Format):
        return fmt
    if isinstance(fmt, torch.dtype):
        return fp8_format(fmt)
    if fmt not in FORMATS:
        raise InvalidArgument(f"fmt={fmt!r}: not an FP8 format; use one of {', '.join(FORMATS)}")
    return FORMATS[fmt]


def frozen(t: torch.Tensor) -> nn.Parameter:
    """A parameter that takes no gradient: quantized codes and scales are not trained."""
    return nn.Parameter(t, requires_grad=False)


def quantize_weight(w: torch.Tensor, fmt: str | Fp8Format = "e4m3fn",
                    scheme: str = "channel") -> tuple[torch.Tensor, torch.Tensor]:
    """(codes, scale) of a float weight: scale = amax / the format's max, per output channel (shape
    (out, 1)) or per tensor (shape ()), codes rounded to nearest and saturated."""
    f = _format_of(fmt)
    if scheme not in WEIGHT_SCHEMES:
        raise InvalidArgument(f"weight={scheme!r}: use one of {', '.join(WEIGHT_SCHEMES)}")
    wf = w.detach().to(torch.float32)
    amax = wf.abs().amax(dim=1, keepdim=True) if scheme == "channel" else wf.abs().amax()
    scale = amax.clamp(min=_AMAX_FLOOR) / f.max
    codes = (wf / scale).clamp(-f.max, f.max).to(f.dtype())
    return codes, scale


class Fp8Linear(nn.Module):
    """A Linear whose weight is FP8 codes times float32 scales, optionally with FP8 activations.

    ``activation``: None (weight-only), "token" or "tensor" (dynamic scales from the activation's
    absolute maximum) or "static" (a calibrated ``input_scale``). The activation is quantized in the
    weight's format. The format is the weight's dtype, so a conversion swaps buffers and nothing else.
    """

    def __init__(self, in_features: int, out_features: int, *, bias: bool = True, fmt: str | Fp8Format = "e4m3fn",
                 weight: str = "channel", activation: str | None = "token") -> None:
        super().__init__()
        if activation not in ACTIVATION_SCHEMES:
            raise InvalidArgument(f"activation={activation!r}: use one of {ACTIVATION_SCHEMES}")
        if weight not in WEIGHT_SCHEMES:
            raise InvalidArgument(f"weight={weight!r}: use one of {', '.join(WEIGHT_SCHEMES)}")
        f = _format_of(fmt)
        self.in_features, self.out_features = in_features, out_features
        self.activation = activation
        self.quantize_activations = True   # off only while the quantization noise is measured
        # parameters that take no gradient, as checkpoints hold them (and as Hugging Face's FP8
        # layers register them): the model's weights, in the order and place an nn.Linear's were
        self.weight = frozen(torch.zeros(out_features, in_features, dtype=f.dtype()))
        self.weight_scale = frozen(torch.ones((out_features, 1) if weight == "channel" else (), dtype=torch.float32))
        if activation == "static":
            self.register_buffer("input_scale", torch.ones((), dtype=torch.float32))
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None

    @classmethod
    def from_linear(cls, lin: nn.Linear, fmt: str | Fp8Format = "e4m3fn", weight: str = "channel",
                    activation: str | None = "token", input_scale: float | None = None) -> Fp8Linear:
        """``lin`` quantized: its weight to codes and scales, its bias kept in its own dtype."""
        m = cls(lin.in_features, lin.out_features, bias=lin.bias is not None, fmt=fmt, weight=weight,
                activation=activation)
        codes, scale = quantize_weight(lin.weight, fmt, weight)
        m.weight, m.weight_scale = frozen(codes.to(lin.weight.device)), frozen(scale.to(lin.weight.device))
        if activation == "static":
            if input_scale is None:
                raise InvalidArgument("activation='static' needs input_scale= (the calibrated activation "
                                      "amax divided by the format's max)")
            if not (math.isfinite(float(input_scale)) and float(input_scale) > 0):
                raise InvalidArgument(f"input_scale={input_scale!r}: a static activation scale must be a positive "
                                      f"finite number (the calibrated amax divided by the format's max)")
            m.input_scale = torch.tensor(float(input_scale), dtype=torch.float32, device=lin.weight.device)
        elif input_scale is not None:
            raise InvalidArgument(f"input_scale={input_scale!r} with activation={activation!r}: a static scale is "
                                  f"used only with activation='static'")
        if lin.bias is not None:
            assert m.bias is not None
            m.bias = nn.Parameter(lin.bias.detach().clone())
        return m.train(lin.training)

    @property
    def format(self) -> Fp8Format:
        return fp8_format(self.weight.dtype)

    def extra_repr(self) -> str:
        scheme = "channel" if self.weight_scale.dim() else "tensor"
        return (f"in_features={self.in_features}, out_features={self.out_features}, fmt={self.format.name}, "
                f"weight={scheme}, activation={self.activation}")

    def dequantized_weight(self, dtype: Any) -> torch.Tensor:
        """codes x scale, computed in ``dtype`` (exact in float32 and float64)."""
        return self.weight.to(dtype) * self.weight_scale.to(dtype)

    def activation_scale(self, x: torch.Tensor) -> torch.Tensor:
        """The scale the activation ``x`` (2-D, in the computing dtype) is divided by."""
        fmax = self.format.max
        if self.activation == "static":
            return self.input_scale.to(x.dtype)
        amax = x.abs().amax(dim=-1, keepdim=True) if self.activation == "token" else x.abs().amax()
        return amax.clamp(min=_AMAX_FLOOR) / fmax

    def quantize_input(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(codes, scale) of a 2-D activation, saturated to the format's range."""
        fmax = self.format.max
        s = self.activation_scale(x)
        return (x / s).clamp(-fmax, fmax).to(self.weight.dtype), s

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        wide = torch.float64 if x.dtype == torch.float64 else torch.float32
        lead = x.shape[:-1]
        x2 = x.reshape(-1, x.shape[-1])
        if self.activation is None or not self.quantize_activations:
            y = nn.functional.linear(x2, self.dequantized_weight(wide).to(x.dtype))
        else:
            q, s = self.quantize_input(x2.to(wide))
            y = self._gemm(q, s, x.dtype, wide)
        if self.bias is not None:
            y = y + self.bias.to(y.dtype)
        return y.reshape(*lead, self.out_features)

    def _gemm(self, q: torch.Tensor, s: torch.Tensor, out_dtype: Any, wide: Any) -> torch.Tensor:
        rowwise = s.dim() > 0 or self.weight_scale.dim() > 0
        # the device kernel takes per-row scales with a bf16 output only; other cases are emulated
        if _native_gemm(q, self.weight, out_dtype) and (not rowwise or out_dtype == torch.bfloat16):
            m, n = q.shape[0], self.weight.shape[0]
            sa = s.to(torch.float32).expand(m, 1).contiguous() if rowwise else s.to(torch.float32)
            sb = (self.weight_scale.reshape(1, -1).expand(1, n).contiguous() if rowwise
                  else self.weight_scale.to(torch.float32))
            return torch._scaled_mm(q, self.weight.t(), scale_a=sa, scale_b=sb, out_dtype=out_dtype)
        acc = q.to(wide) @ self.weight.to(wide).t()
        return (acc * s.to(wide) * self.weight_scale.to(wide).reshape(1, -1)).to(out_dtype)


def _native_gemm(q: torch.Tensor, w: torch.Tensor, out_dtype: Any) -> bool:
    """Whether the device's own FP8 GEMM runs this product (native_gemm on the device's arch)."""
    if not q.is_cuda:
        return False
    props = torch.cuda.get_device_properties(q.device)
    arch = getattr(props, "gcnArchName", "") if torch.version.hip else f"{props.major}.{props.minor}"
    return native_gemm(arch, w.dtype, q.shape[1], w.shape[0], out_dtype)


def native_gemm(arch: str, codes: Any, k: int, n: int, out_dtype: Any) -> bool:
    """Whether a GPU of ``arch`` (a gfx name or a CUDA capability) multiplies FP8 ``codes`` itself:
    it computes in that format's family (MI300 in FNUZ; Hopper, Ada and MI350 in OCP), the inner and
    output dimensions are multiples of 16, and the output dtype is one the kernel writes. Elsewhere
    the exact emulation runs: an OCP checkpoint on MI300 is converted first (convert_to_fnuz)."""
    from pytest_rocm_parity.quant.formats import device_fp8_formats

    if out_dtype not in (torch.bfloat16, torch.float16, torch.float32):
        return False
    if fp8_format(codes).name not in device_fp8_formats(arch):
        return False
    return k % 16 == 0 and n % 16 == 0


def fp8_modules(model: nn.Module) -> Iterator[tuple[str, Fp8Linear]]:
    for name, mod in model.named_modules():
        if isinstance(mod, Fp8Linear):
            yield name, mod


def quantize_model(model: nn.Module, fmt: str | Fp8Format = "e4m3fn", *, weight: str = "channel",
                   activation: str | None = "token", skip: Iterable[str] = ("lm_head",),
                   input_scales: dict[str, float] | None = None) -> nn.Module:
    """Replace every nn.Linear of ``model`` (in place) by an Fp8Linear, except those ``skip`` names:
    each entry a module's full name, the last component of names ("down_proj": every one), or a
    glob over full names ("model.layers.0.*"); one string is one entry. The default keeps the
    lm_head, which FP8 checkpoints keep in bf16. ``input_scales``: per-module static activation
    scales, for activation="static"."""
    import fnmatch

    if not isinstance(model, nn.Module):
        raise InvalidArgument(f"quantize_model: model: expected a torch.nn.Module, got {type(model).__name__}")
    skip = {skip} if isinstance(skip, str) else set(skip)
    linears = [n for n, m in model.named_modules() if type(m) is nn.Linear]

    def skipped(name: str, entry: str) -> bool:
        return name == entry or name.rsplit(".", 1)[-1] == entry or fnmatch.fnmatchcase(name, entry)
    unmatched = sorted(e for e in skip if not any(skipped(n, e) for n in linears) and e != "lm_head")
    if unmatched:
        raise InvalidArgument(f"quantize_model: skip={unmatched} matches no nn.Linear of {type(model).__name__}; "
                              f"name modules by full name, last component or glob, e.g. {linears[:2]}")
    targets = [(n, m) for n, m in model.named_modules()
               if type(m) is nn.Linear and not any(skipped(n, e) for e in skip)]
    if not targets:
        already = " (it is quantized already)" if any(True for _ in fp8_modules(model)) else ""
        raise InvalidArgument(f"quantize_model: {type(model).__name__} has no nn.Linear outside "
                              f"skip={sorted(skip)}{already}")
    if input_scales and activation != "static":
        raise InvalidArgument(f"quantize_model: input_scales are used only with activation='static' "
                              f"(activation={activation!r})")
    unknown = sorted(set(input_scales or {}) - {n for n, _ in targets})
    if unknown:
        raise InvalidArgument(f"quantize_model: input_scales names {unknown}, which are not quantized Linear "
                              f"layers of the model; use their full names, e.g. {targets[0][0]!r}")
    for name, lin in targets:
        scale = (input_scales or {}).get(name)
        if activation == "static" and scale is None:
            raise InvalidArgument(f"quantize_model: activation='static' needs input_scales[{name!r}] (its "
                                  f"calibrated activation amax divided by the format's max)")
        q = Fp8Linear.from_linear(lin, fmt, weight, activation, scale)
        parent = model.get_submodule(name.rsplit(".", 1)[0]) if "." in name else model
        setattr(parent, name.rsplit(".", 1)[-1], q)
    left = stacked_weights(model)
    if left:
        import warnings

        shown = "; ".join(f"{n} ({type(model.get_submodule(n)).__name__}: {', '.join(p)})" for n, p in left[:3])
        warnings.warn(f"quantize_model: {len(left)} module{'s' if len(left) > 1 else ''} of {type(model).__name__} "
                      f"{'hold' if len(left) > 1 else 'holds'} stacked weights that are not nn.Linear and "
                      f"{'are' if len(left) > 1 else 'is'} left unquantized: {shown}{' ...' if len(left) > 3 else ''}. "
                      f"quantize_model replaces nn.Linear only, so those matmuls (a MoE's experts, most of its "
                      f"weights) compute in the activation dtype and the model is only partly FP8, while FP8 MoE "
                      f"checkpoints quantize their experts. Quantize them with the serving stack's own FP8 expert "
                      f"module, or judge the model as partly quantized knowingly (docs/fp8.md)", stacklevel=2)
    return model


def stacked_weights(model: nn.Module) -> list[tuple[str, list[str]]]:
    """(module name, ["param AxBxC", ...]) of modules that hold 3-D or larger weights but are no
    convolution: stacked expert matrices (transformers' MixtralExperts), which quantize_model, taking
    nn.Linear only, leaves unquantized."""
    out = []
    for name, mod in model.named_modules():
        if isinstance(mod, nn.modules.conv._ConvNd):
            continue
        big = [f"{n} {'x'.join(str(d) for d in p.shape)}" for n, p in mod._parameters.items()
               if p is not None and p.dim() >= 3 and p.is_floating_point() and p.element_size() > 1]
        if big:
            out.append((name, big))
    return out


def ocp_to_fnuz(codes: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """An OCP tensor (codes, scale) as the FNUZ tensor of the same values: the bytes kept, OCP's
    negative zero (0x80, FNUZ's NaN) made zero, the scale doubled (FNUZ's exponent bias is one
    higher, so each byte means half). What vLLM's normalize_e4m3fn_to_e4m3fnuz does."""
    f = fp8_format(codes.dtype)
    if f.family != "ocp":
        raise InvalidArgument(f"ocp_to_fnuz: codes are {f.name}, already FNUZ")
    bits = codes.view(torch.int8).clone()
    bits[bits == -128] = 0
    return bits.view(f.counterpart.dtype()), scale * 2


def convert_to_fnuz(model: nn.Module) -> nn.Module:
    """Every OCP Fp8Linear of ``model`` converted to FNUZ in place (the MI300 path): codes by
    ocp_to_fnuz, weight and static input scales doubled."""
    mods = list(fp8_modules(model))
    if not mods:
        raise InvalidArgument(f"convert_to_fnuz: {type(model).__name__} has no Fp8Linear; quantize it first "
                              f"(quantize_model) or load the FP8 checkpoint into Fp8Linear layers")
    for _name, mod in mods:
        if mod.format.family == "ocp":
            codes, scale = ocp_to_fnuz(mod.weight.detach(), mod.weight_scale.detach())
            mod.weight, mod.weight_scale = frozen(codes), frozen(scale)
            if mod.activation == "static":
                mod.input_scale = mod.input_scale * 2
    return model


@contextlib.contextmanager
def activations_unquantized(model: nn.Module) -> Iterator[bool]:
    """Every quantized module of ``model`` computing on its unquantized activation (its weight still
    the codes times scales); yields whether the model has any activation quantization to turn off.

    A module takes part by having a boolean ``quantize_activations`` attribute (Fp8Linear has one),
    so a serving stack's own FP8 layer can expose the same switch."""
    mods = [m for m in model.modules() if isinstance(getattr(m, "quantize_activations", None), bool)
            and getattr(m, "activation", "") is not None]
    for m in mods:
        m.quantize_activations = False
    try:
        yield bool(mods)
    finally:
        for m in mods:
            m.quantize_activations = True
