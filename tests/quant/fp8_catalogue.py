"""An FP8-quantized decoder (a small seeded Llama whose Linear layers compute in FP8, the lm_head
kept in bf16 as FP8 checkpoints keep it) and the ways a port to MI300 (FNUZ) or another FP8 stack
goes right or wrong.

Each case turns the reference model into a candidate: correct alternates must pass, each bug must
fail with the module it plants named as the culprit. Bugs touch one module (``module``) so that the
culprit is decided by the judgement, not by execution order.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from parity_models import llama
from pytest_rocm_parity.quant.fp8 import Fp8Linear, convert_to_fnuz, frozen, ocp_to_fnuz, quantize_model

TARGET = "model.layers.1.mlp.down_proj"      # 128 -> 64
SQUARE = "model.layers.1.self_attn.o_proj"   # 64 -> 64: a wrong-axis broadcast runs silently there
GATE, UP = "model.layers.1.mlp.gate_proj", "model.layers.1.mlp.up_proj"
STATIC = "model.layers.0.mlp.down_proj"      # calibrated on a quieter batch: it saturates


def reference(weight_only: bool = False) -> nn.Module:
    """The OCP (e4m3fn) checkpoint: per-tensor weight scales, dynamic per-token activation scales,
    one static (calibrated) activation scale, or weight-only. A few small negative weights in TARGET
    quantize to OCP's negative zero (0x80), as trained weights do."""
    m = llama("sdpa")
    with torch.no_grad():
        m.get_submodule(TARGET).weight[:3, :5] = -1e-7
    if weight_only:
        return quantize_model(m, "e4m3fn", weight="tensor", activation=None)
    quantize_model(m, "e4m3fn", weight="tensor", activation="token")
    # a static scale calibrated at 1/3 of the activations' real range: the reference saturates there
    with torch.no_grad():
        lin = m.get_submodule(STATIC)
        lin.activation = "static"
        lin.register_buffer("input_scale", torch.tensor(0.035 / 448, dtype=torch.float32))
    return m


def _as(mod: nn.Module, cls: type) -> None:
    mod.__class__ = cls


# -- candidate module behaviours -------------------------------------------------------------------

class _NoClampCast(Fp8Linear):
    """Quantizes by a plain cast: OCP's cast saturates on this torch, FNUZ's makes NaN past 240."""

    def quantize_input(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        s = self.activation_scale(x)
        return (x / s).to(self.weight.dtype), s


class _OcpMaxOnFnuz(Fp8Linear):
    """Scales computed for OCP's 448 while the codes are FNUZ (max 240): the top saturates."""

    def activation_scale(self, x: torch.Tensor) -> torch.Tensor:
        return super().activation_scale(x) * self.format.max / 448.0


class _WrongAxis(Fp8Linear):
    """Per-token scales taken over the tokens (one per feature) and applied to the output's columns:
    shapes agree only because the projection is square."""

    def activation_scale(self, x: torch.Tensor) -> torch.Tensor:
        return x.abs().amax(dim=0, keepdim=True).clamp(min=1e-12) / self.format.max

    def _gemm(self, q: torch.Tensor, s: torch.Tensor, out_dtype: torch.dtype, wide: torch.dtype) -> torch.Tensor:
        acc = q.to(wide) @ self.weight.to(wide).t()
        return (acc * s.to(wide) * self.weight_scale.to(wide).reshape(1, -1)).to(out_dtype)


class _ReciprocalScale(Fp8Linear):
    """The weight scale read as its reciprocal (a weight_scale_inv checkpoint read as weight_scale)."""

    def dequantized_weight(self, dtype: torch.dtype) -> torch.Tensor:
        return self.weight.to(dtype) / self.weight_scale.to(dtype)

    def _gemm(self, q: torch.Tensor, s: torch.Tensor, out_dtype: torch.dtype, wide: torch.dtype) -> torch.Tensor:
        acc = q.to(wide) @ self.weight.to(wide).t()
        return (acc * s.to(wide) / self.weight_scale.to(wide).reshape(1, -1)).to(out_dtype)


class _Fp16Accumulation(Fp8Linear):
    """A GEMM that accumulates in fp16 (16 products at a time, the running sum rounded to fp16)."""

    def _gemm(self, q: torch.Tensor, s: torch.Tensor, out_dtype: torch.dtype, wide: torch.dtype) -> torch.Tensor:
        qf, wf = q.to(torch.float32), self.weight.to(torch.float32)
        acc = torch.zeros(q.shape[0], wf.shape[0], dtype=torch.float16)
        for k in range(0, qf.shape[1], 16):
            acc = (acc.float() + qf[:, k:k + 16] @ wf[:, k:k + 16].t()).half()
        return (acc.float() * s.float() * self.weight_scale.float().reshape(1, -1)).to(out_dtype)


class _SplitK(Fp8Linear):
    """A correct alternate: the GEMM in two halves of K, summed (another accumulation order)."""

    def _gemm(self, q: torch.Tensor, s: torch.Tensor, out_dtype: torch.dtype, wide: torch.dtype) -> torch.Tensor:
        h = q.shape[1] // 2
        qf, wf = q.to(wide), self.weight.to(wide)
        acc = (qf[:, h:] @ wf[:, h:].t()) + (qf[:, :h] @ wf[:, :h].t())
        return (acc * s.to(wide) * self.weight_scale.to(wide).reshape(1, -1)).to(out_dtype)


class _DequantInActivationDtype(Fp8Linear):
    """A correct alternate for weight-only FP8: codes and scale cast to the activation dtype and
    multiplied there (rounded twice), then the matmul."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight.to(x.dtype) * self.weight_scale.to(x.dtype)
        y = nn.functional.linear(x, w)
        return y + self.bias.to(y.dtype) if self.bias is not None else y


# -- cases -----------------------------------------------------------------------------------------

def _fnuz(m: nn.Module) -> None:
    convert_to_fnuz(m)


def _fnuz_scale_not_doubled(m: nn.Module) -> None:
    convert_to_fnuz(m)
    lin = m.get_submodule(TARGET)
    lin.weight_scale = frozen(lin.weight_scale / 2)


def _fnuz_target_codes(convert: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[nn.Module], None]:
    """The model converted to FNUZ, but TARGET's codes made from the OCP ones by ``convert`` and its
    OCP scale kept."""
    def apply(m: nn.Module) -> None:
        convert_to_fnuz(m)
        lin, ocp = m.get_submodule(TARGET), reference().get_submodule(TARGET)
        lin.weight = frozen(convert(ocp.weight.detach()))
        lin.weight_scale = frozen(ocp.weight_scale.detach().clone())
    return apply


# the OCP bytes as they were, read as FNUZ: no scale doubling, 0x80 left as it is (FNUZ's NaN)
_fnuz_reinterpreted = _fnuz_target_codes(lambda w: w.view(torch.uint8).view(torch.float8_e4m3fnuz))
# the OCP codes cast by value to FNUZ: right up to 240, NaN above
_fnuz_value_cast = _fnuz_target_codes(lambda w: w.to(torch.float32).to(torch.float8_e4m3fnuz))


def _patch(name: str, cls: type, fnuz: bool = True) -> Callable[[nn.Module], None]:
    def apply(m: nn.Module) -> None:
        if fnuz:
            convert_to_fnuz(m)
        _as(m.get_submodule(name), cls)
    return apply


def _scale_before_residual(m: nn.Module) -> None:
    """The MLP's activation scale taken from the attention output before the residual add (a fused
    add+norm+quant kernel reading the wrong tensor), as a static scale for gate and up."""
    convert_to_fnuz(m)
    layer = m.get_submodule("model.layers.1")
    seen: dict[str, torch.Tensor] = {}

    def keep(_mod: nn.Module, _a: object, out: object) -> None:
        h = out[0] if isinstance(out, tuple) else out
        seen["s"] = h.detach().abs().amax().to(torch.float32) / 240.0

    layer.self_attn.register_forward_hook(keep)
    for name in (GATE, UP):
        lin = m.get_submodule(name)
        lin.activation = "static"
        lin.register_buffer("input_scale", torch.ones((), dtype=torch.float32))
        orig = lin.activation_scale
        lin.activation_scale = lambda x, orig=orig: seen["s"].to(x.dtype) if "s" in seen else orig(x)  # type: ignore[method-assign]


def _lm_head_quantized(m: nn.Module) -> None:
    convert_to_fnuz(m)
    head = m.get_submodule("lm_head")
    m.lm_head = Fp8Linear.from_linear(head, "e4m3fnuz", "tensor", "token")


def _per_channel_equal(m: nn.Module) -> None:
    convert_to_fnuz(m)
    lin = m.get_submodule(TARGET)
    lin.weight_scale = frozen(lin.weight_scale.detach().reshape(1, 1).expand(lin.out_features, 1).clone())


@dataclass(frozen=True)
class Case:
    id: str
    module: str | None          # the planted module (the expected culprit); None for an alternate
    make: Callable[[nn.Module], None]
    weight_only: bool = False
    cause: str = ""             # a phrase the format-aware note must hold

    @property
    def bug(self) -> bool:
        return self.module is not None


CASES = [
    Case("alt_fnuz_converted", None, _fnuz),
    Case("alt_fnuz_per_channel_equal_scales", None, _per_channel_equal),
    Case("alt_split_k_accumulation", None, _patch(TARGET, _SplitK)),
    Case("alt_ocp_same_format", None, lambda m: None),
    Case("alt_weight_only_dequant_in_bf16", None, lambda m: [_as(mod, _DequantInActivationDtype)
                                                            for mod in m.modules() if isinstance(mod, Fp8Linear)],
         weight_only=True),
    Case("bug_fnuz_scale_not_doubled", TARGET, _fnuz_scale_not_doubled, cause="scale"),
    Case("bug_ocp_bytes_read_as_fnuz", TARGET, _fnuz_reinterpreted, cause="0x80"),
    Case("bug_ocp_codes_cast_by_value", TARGET, _fnuz_value_cast, cause="cast by value"),
    Case("bug_cast_without_saturation", STATIC, _patch(STATIC, _NoClampCast), cause="NaN"),
    Case("bug_ocp_max_on_fnuz", TARGET, _patch(TARGET, _OcpMaxOnFnuz), cause="saturat"),
    Case("bug_per_token_scale_wrong_axis", SQUARE, _patch(SQUARE, _WrongAxis)),
    Case("bug_reciprocal_scale", TARGET, _patch(TARGET, _ReciprocalScale), cause="scale"),
    Case("bug_scale_before_residual_add", GATE, _scale_before_residual),
    Case("bug_fp16_accumulation", TARGET, _patch(TARGET, _Fp16Accumulation, fnuz=False)),
    Case("bug_lm_head_quantized", "lm_head", _lm_head_quantized),
]


def candidate(case: Case) -> nn.Module:
    m = reference(case.weight_only)
    case.make(m)
    return m


__all__ = ["CASES", "Case", "candidate", "reference", "ocp_to_fnuz"]
