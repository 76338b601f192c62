"""Fp8Linear computes what serving kernels compute; conversions keep every value; a rung cast leaves
quantized storage alone."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from pytest_rocm_parity.errors import InvalidArgument
from pytest_rocm_parity.quant.fp8 import (Fp8Linear, activations_unquantized, convert_to_fnuz, ocp_to_fnuz,
                                          quantize_model, quantize_weight)
from pytest_rocm_parity.quant.storage import cast_module, quantized_storage


def _linear(seed: int = 0) -> nn.Linear:
    torch.manual_seed(seed)
    return nn.Linear(64, 32)


@pytest.mark.parametrize("act", ["token", "tensor"])
def test_emulated_gemm_matches_torch_scaled_mm(act: str) -> None:
    """The emulation differs from torch's own FP8 GEMM (here its CPU kernel) only by accumulation order."""
    q = Fp8Linear.from_linear(_linear(), "e4m3fn", "channel", act)
    x = torch.randn(16, 64)
    codes, s = q.quantize_input(x)
    want = torch._scaled_mm(codes, q.weight.t(), scale_a=s.expand(16, 1).contiguous(),
                            scale_b=q.weight_scale.reshape(1, -1).contiguous(), out_dtype=torch.float32)
    got = q._gemm(codes, s, torch.float32, torch.float32)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-6)


def test_ocp_to_fnuz_keeps_every_value() -> None:
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn)
    fnuz, scale = ocp_to_fnuz(codes, torch.tensor(0.5))
    before, after = codes.to(torch.float64) * 0.5, fnuz.to(torch.float64) * scale.double()
    finite = torch.isfinite(before)
    assert torch.equal(after[finite], before[finite])          # -0 becomes +0, which compares equal
    assert fnuz.dtype == torch.float8_e4m3fnuz and scale.item() == 1.0


def test_fnuz_model_means_the_same_weights() -> None:
    def mlp() -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 16))

    ocp = quantize_model(mlp(), activation=None, skip=())
    fnuz = convert_to_fnuz(quantize_model(mlp(), activation=None, skip=()))
    for a, b in zip(ocp.modules(), fnuz.modules()):
        if isinstance(a, Fp8Linear):
            assert b.weight.dtype == torch.float8_e4m3fnuz
            assert torch.equal(a.dequantized_weight(torch.float64), b.dequantized_weight(torch.float64))
    x = torch.randn(4, 64)
    assert torch.equal(ocp(x), fnuz(x))


def test_a_rung_cast_keeps_codes_and_scales() -> None:
    m = quantize_model(nn.Sequential(_linear()), skip=())
    lin = m[0]
    assert quantized_storage(lin) == ["weight", "weight_scale"]
    cast_module(m, dtype=torch.float64)
    assert lin.weight.dtype == torch.float8_e4m3fn and lin.weight_scale.dtype == torch.float32
    assert lin.bias.dtype == torch.float64


def test_activations_unquantized_switches_only_inside() -> None:
    m = quantize_model(nn.Sequential(_linear()), skip=())
    x = torch.randn(8, 64, dtype=torch.float64)
    quantized = m(x)
    with activations_unquantized(m) as any_quantized:
        assert any_quantized
        plain = m(x)
    assert torch.equal(m(x), quantized) and not torch.equal(plain, quantized)
    assert torch.allclose(plain, x @ m[0].dequantized_weight(torch.float64).t() + m[0].bias.double())


def test_bad_arguments_name_the_fix() -> None:
    with pytest.raises(InvalidArgument, match="fmt='e4m3'"):
        quantize_weight(torch.ones(2, 2), "e4m3")
    with pytest.raises(InvalidArgument, match="input_scales"):
        quantize_model(nn.Sequential(_linear()), activation="static", skip=())
    with pytest.raises(InvalidArgument, match="already FNUZ"):
        ocp_to_fnuz(torch.zeros(2).to(torch.float8_e4m3fnuz), torch.tensor(1.0))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_replay_cast_in_place_keeps_codes_and_scales_when_it_moves_them() -> None:
    """cast_in_place swaps each parameter's data: the quantized ones move to the device but keep
    their dtype (a CPU-held FP8 model replayed on a GPU)."""
    from pytest_rocm_parity.runner.wrappers import cast_in_place

    m = quantize_model(nn.Sequential(_linear()), skip=())
    lin = m[0]
    with cast_in_place(m, "cuda", torch.bfloat16):
        assert lin.weight.is_cuda and lin.weight.dtype == torch.float8_e4m3fn
        assert lin.weight_scale.dtype == torch.float32 and lin.bias.dtype == torch.bfloat16
        y = m(torch.randn(4, 64, device="cuda", dtype=torch.bfloat16))
        assert y.dtype == torch.bfloat16 and torch.isfinite(y).all()
    assert lin.weight.device.type == "cpu"


def test_scales_and_names_are_checked() -> None:
    with pytest.raises(InvalidArgument, match="positive finite"):
        Fp8Linear.from_linear(_linear(), activation="static", input_scale=0.0)
    with pytest.raises(InvalidArgument, match="only with activation='static'"):
        quantize_model(nn.Sequential(_linear()), activation="token", skip=(), input_scales={"0": 0.1})
    with pytest.raises(InvalidArgument, match=r"\['1'\].*'0'"):
        quantize_model(nn.Sequential(_linear()), activation="static", skip=(), input_scales={"1": 0.1})
    m = quantize_model(nn.Sequential(_linear()), fmt=torch.float8_e4m3fn, skip=())
    with pytest.raises(InvalidArgument, match="quantized already"):
        quantize_model(m, skip=())
    with pytest.raises(InvalidArgument, match="no Fp8Linear"):
        convert_to_fnuz(nn.Sequential(_linear()))


@pytest.mark.parametrize("arch,codes,native", [
    ("gfx942:sramecc+:xnack-", torch.float8_e4m3fnuz, True),   # MI300: FNUZ in hardware
    ("gfx942", torch.float8_e4m3fn, False),                    # an unconverted OCP checkpoint: emulated
    ("gfx950", torch.float8_e4m3fn, True),                     # MI350: OCP
    ("9.0", torch.float8_e4m3fn, True),                        # Hopper
    ("9.0", torch.float8_e4m3fnuz, False),
    ("gfx90a", torch.float8_e4m3fnuz, False),                  # MI200: no FP8 matrix cores
    ("8.0", torch.float8_e4m3fn, False),                       # A100
])
def test_the_device_gemm_runs_where_the_device_multiplies_the_format(arch: str, codes: torch.dtype,
                                                                     native: bool) -> None:
    from pytest_rocm_parity.quant.fp8 import native_gemm

    assert native_gemm(arch, codes, 256, 384, torch.bfloat16) is native
    assert native_gemm(arch, codes, 250, 384, torch.bfloat16) is False    # not a multiple of 16
    assert native_gemm(arch, codes, 256, 384, torch.float64) is False     # the truth: always emulated


def test_a_static_scale_is_the_one_given_and_saturates() -> None:
    q = Fp8Linear.from_linear(_linear(), "e4m3fn", "channel", "static", input_scale=0.001)
    assert q.input_scale.item() == pytest.approx(0.001)
    x = torch.randn(8, 64)
    codes, s = q.quantize_input(x)
    assert s.item() == pytest.approx(0.001)
    # |x| / 0.001 runs far past 448: the codes saturate at the format's max, no NaN
    assert codes.to(torch.float32).abs().max().item() == 448.0 and not torch.isnan(codes.to(torch.float32)).any()


def test_block_scaled_weights_are_compared_tile_by_tile() -> None:
    """A DeepSeek/Hugging Face style layer: weight_scale_inv with one scale per 128 x 128 tile."""
    from pytest_rocm_parity.quant.diagnosis import weight_finding

    g = torch.Generator().manual_seed(0)
    codes = (torch.randn(200, 300, generator=g) * 50).clamp(-448, 448).to(torch.float8_e4m3fn)
    scale = torch.rand(2, 3, generator=g) + 0.5
    stored = {"quant/l/weight": codes, "quant/l/weight_scale_inv": scale}
    entry = {"tensors": {"weight": "quant/l/weight", "weight_scale_inv": "quant/l/weight_scale_inv"},
             "codes": "weight"}
    cand = nn.Module()
    cand.weight = nn.Parameter(codes.clone(), requires_grad=False)
    cand.weight_scale_inv = nn.Parameter(scale.clone(), requires_grad=False)
    assert weight_finding(cand, entry, stored.__getitem__) == ""
    fnuz, doubled = ocp_to_fnuz(codes, scale)
    cand.weight = nn.Parameter(fnuz, requires_grad=False)      # converted, the scale left as it was
    assert "0.5x the reference's" in weight_finding(cand, entry, stored.__getitem__)
    # the OCP bytes read as FNUZ with no conversion mean the same halves: both causes are named
    raw = codes.view(torch.uint8)
    raw = torch.where(raw == 0x80, torch.zeros_like(raw), raw)   # no negative zero: no NaN to name instead
    cand.weight = nn.Parameter(raw.view(torch.float8_e4m3fnuz), requires_grad=False)
    assert "or OCP bytes read as FNUZ with no conversion" in weight_finding(cand, entry, stored.__getitem__)
    cand.weight = nn.Parameter(fnuz, requires_grad=False)
    cand.weight_scale_inv = nn.Parameter(doubled, requires_grad=False)
    assert weight_finding(cand, entry, stored.__getitem__) == ""


def test_codes_without_a_scale_get_no_diagnosis_and_no_error() -> None:
    from pytest_rocm_parity.quant.diagnosis import weight_finding

    codes = torch.ones(4, 4).to(torch.float8_e4m3fn)
    cand = nn.Module()
    cand.weight = nn.Parameter(codes.to(torch.float32).to(torch.float8_e4m3fnuz), requires_grad=False)
    entry = {"tensors": {"weight": "quant/l/weight"}, "codes": "weight"}
    assert weight_finding(cand, entry, {"quant/l/weight": codes}.__getitem__) == ""


def test_skip_names_modules_by_full_name_last_component_or_glob() -> None:
    """One string is one entry (not its characters); an entry that matches no Linear is refused, so a
    misspelt skip cannot quantize a module the user meant to keep."""
    def model() -> nn.Module:
        torch.manual_seed(0)
        return nn.ModuleDict({"layers": nn.ModuleList(nn.ModuleDict({"up": nn.Linear(8, 8), "down": nn.Linear(8, 8)})
                                                      for _ in range(2)), "lm_head": nn.Linear(8, 4)})

    def kept(m: nn.Module) -> set[str]:
        return {n for n, x in m.named_modules() if type(x) is nn.Linear}
    assert kept(quantize_model(model(), skip="lm_head")) == {"lm_head"}
    assert kept(quantize_model(model(), skip=("lm_head", "down"))) == {"lm_head", "layers.0.down", "layers.1.down"}
    assert kept(quantize_model(model(), skip=("layers.0.*",))) == {"layers.0.up", "layers.0.down"}
    with pytest.raises(InvalidArgument, match=r"skip=\['lm_haed'\] matches no nn.Linear of ModuleDict"):
        quantize_model(model(), skip=("lm_haed",))
    with pytest.raises(InvalidArgument, match="model: expected a torch.nn.Module, got str"):
        quantize_model("qwen2")  # type: ignore[arg-type]


class _OcpBytesAsFnuz(Fp8Linear):
    """The reference's OCP activation codes read as FNUZ bytes: OCP's negative zero (0x80) is FNUZ's NaN."""

    def quantize_input(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        s = x.abs().amax(dim=-1, keepdim=True).clamp(min=1e-12) / 448.0
        codes = (x / s).clamp(-448, 448).to(torch.float8_e4m3fn)
        return codes.view(torch.uint8).view(torch.float8_e4m3fnuz), s


def test_activation_nan_at_the_references_negative_zero_is_named_as_such_not_as_saturation() -> None:
    from pytest_rocm_parity.quant.diagnosis import activation_finding

    ref = Fp8Linear.from_linear(_linear(), "e4m3fn", "channel", "token")
    cand = convert_to_fnuz(Fp8Linear.from_linear(_linear(), "e4m3fn", "channel", "token"))
    cand.__class__ = _OcpBytesAsFnuz
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(0))
    x[0, :4] = torch.tensor([-1e-9, -2e-9, 1e-9, 0.0])   # below the smallest code: -0, -0, +0, +0
    text = activation_finding(cand, ref, x)
    assert "NaN where the reference's codes are finite, 2 of them at the reference's negative zero (0x80" in text, text
    assert "saturated" not in text, text


def test_a_static_input_scale_left_for_448_on_fnuz_codes_is_named_from_a_small_share_of_saturated_codes() -> None:
    """The scale made for OCP's 448 on codes that saturate at 240: only the tail of the activations
    saturates (under a percent here), which is still the conversion's missing doubling."""
    from pytest_rocm_parity.quant.diagnosis import activation_finding

    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 64, generator=g)
    x.view(-1)[torch.randperm(x.numel(), generator=g)[:20]] = 15 + 5 * torch.rand(20, generator=g)   # outliers
    scale = float(x.abs().max()) / 448.0 * 1.05   # calibrated with a little headroom: the reference saturates none
    ref = Fp8Linear.from_linear(_linear(), "e4m3fn", "channel", "static", input_scale=scale)
    cand = convert_to_fnuz(Fp8Linear.from_linear(_linear(), "e4m3fn", "channel", "static", input_scale=scale))
    cand.input_scale.data.copy_(ref.input_scale)   # the conversion's doubling undone: the bug
    codes, _ = cand.quantize_input(x)
    share = (codes.to(torch.float32).abs() >= 240).float().mean().item()
    assert 0.001 < share < 0.01, share
    text = activation_finding(cand, ref, x)
    assert "double its input_scale in the conversion" in text and "where 0% of the reference's reach 448" in text, text
