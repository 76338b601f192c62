"""What a replay says where the golden does not hold the quantized model the candidate is: an FP8
candidate of an unquantized golden (the noise allowance needs the noise measured at capture), one
layer quantized against it, a checkpoint quantized again with other scales, a layer the golden
quantizes served unquantized, and activations quantized against a weight-only golden; what
quantize_model leaves unquantized; the e5m2 figures of docs/fp8.md."""
from __future__ import annotations

import tempfile
from collections.abc import Callable

import pytest
import torch
from torch import nn

from parity_models import llama, tokens, verdicts
from pytest_rocm_parity.golden.store import GoldenStore
from pytest_rocm_parity.judging.records import CheckResult
from pytest_rocm_parity.judging.tolerance import Tolerance
from pytest_rocm_parity.quant.fp8 import Fp8Linear, convert_to_fnuz, quantize_model
from pytest_rocm_parity.runner.capture import capture
from pytest_rocm_parity.runner.engine import CheckSpec
from pytest_rocm_parity.runner.replay import replay

TARGET = "model.layers.1.mlp.down_proj"
GOLDENS: dict[str, Callable[[], nn.Module]] = {
    "bf16": llama,
    "w8a8": lambda: quantize_model(llama(), "e4m3fn", weight="channel", activation="token"),
    "w8a16": lambda: quantize_model(llama(), "e4m3fn", weight="channel", activation=None),
}


@pytest.fixture(scope="module")
def store() -> GoldenStore:
    out = GoldenStore(tempfile.mkdtemp(prefix="parity-fp8-goldens-"))
    for name, build in GOLDENS.items():
        capture(build(), tokens("none"), _spec(name), out, "cpu")
    return out


def _spec(name: str) -> CheckSpec:
    return CheckSpec(name=name, dtypes=["bfloat16", "float32"], drill=2, tolerance=Tolerance(quant_noise=3.0))


def _replay(model: nn.Module, golden: str, store: GoldenStore) -> list[CheckResult]:
    return replay(model, tokens("none"), _spec(golden), store, "cpu")


def _set(model: nn.Module, name: str, mod: nn.Module) -> None:
    parent, attr = name.rsplit(".", 1)
    setattr(model.get_submodule(parent), attr, mod)


def test_an_fp8_candidate_of_an_unquantized_golden_says_to_capture_the_quantized_model(store: GoldenStore) -> None:
    from pytest_rocm_parity.judging.assertion import message

    results = _replay(quantize_model(llama(), "e4m3fn", weight="channel", activation="token"), "bf16", store)
    assert results and all(not r.passed for r in results), verdicts(results)
    for r in results:
        print(f"{r.dtype}: culprit {r.culprit}: {next(l.reason for l in r.layers if l.name == r.culprit)}")
        golden = [n for n in r.notes if n.startswith("the golden is of an unquantized model")]
        assert len(golden) == 1 and "quant_noise allows none" in golden[0] and "capture that golden" in golden[0]
        # the culprit's own note says it too, beside it in the message; the other projections are not repeated
        assert sum("the candidate quantizes it" in n for n in r.notes) == 1
        assert f"    likely cause: the candidate quantizes it (float8_e4m3fn)" in message(r)
        assert "capture the quantized model" in message(r)


def test_one_layer_quantized_against_an_unquantized_golden_is_named(store: GoldenStore) -> None:
    model = llama()
    _set(model, TARGET, Fp8Linear.from_linear(model.get_submodule(TARGET), "e4m3fn", "channel", "token"))
    results = _replay(model, "bf16", store)
    assert results and all(not r.passed and r.culprit == TARGET for r in results), verdicts(results)
    for r in results:
        assert any(n.startswith(f"{TARGET}: the candidate quantizes it (float8_e4m3fn); the golden's reference "
                                f"computes it unquantized") for n in r.notes), r.notes
        assert any(n.startswith("the golden is of an unquantized model and the candidate quantizes 1 module "
                                f"({TARGET})") for n in r.notes), r.notes


def test_a_checkpoint_quantized_again_is_named_as_the_checkpoint(store: GoldenStore) -> None:
    """Per-tensor weight scales where the golden's were per-channel, same format: every projection
    fails, and the note sends the user to the checkpoint, not a kernel."""
    model = quantize_model(llama(), "e4m3fn", weight="tensor", activation="token")
    results = _replay(model, "w8a8", store)
    assert results and all(not r.passed for r in results), verdicts(results)
    for r in results:
        print(f"{r.dtype}: culprit {r.culprit}: {next(l.reason for l in r.layers if l.name == r.culprit)}")
        own = next(n for n in r.notes if n.startswith(f"{r.culprit}: "))
        print(own)
        assert own.startswith(f"{r.culprit}: its weight is quantized otherwise than the golden's"), r.notes
        assert "one per-tensor scale where the golden's weight has per-channel scales" in own
        assert "of its codes differ" in own and "Load the checkpoint the golden was captured from" in own
        assert any("quantized otherwise than the golden's as well" in n for n in r.notes), r.notes


def test_a_layer_the_golden_quantizes_served_unquantized_passes_with_a_note(store: GoldenStore) -> None:
    model = quantize_model(llama(), "e4m3fn", weight="channel", activation="token")
    _set(model, TARGET, llama().get_submodule(TARGET))   # the original bf16 Linear: an ignore list naming it
    results = _replay(model, "w8a8", store)
    assert results and all(r.passed for r in results), verdicts(results)
    for r in results:
        assert any(n.startswith(f"1 module the golden's reference quantizes ({TARGET}) computes unquantized on "
                                f"the candidate: more accurate than the checkpoint, so not a failure")
                   for n in r.notes), r.notes
    # failing there, its own note says it computes unquantized, not that its weight was quantized again
    with torch.no_grad():
        model.get_submodule(TARGET).weight.mul_(1.5)
    results = _replay(model, "w8a8", store)
    assert results and all(not r.passed and r.culprit == TARGET for r in results), verdicts(results)
    for r in results:
        assert any(n.startswith(f"{TARGET}: it holds an unquantized {r.dtype} weight where the golden's module is "
                                f"float8_e4m3fn codes") for n in r.notes), r.notes


def test_activations_quantized_against_a_weight_only_golden_say_it_recorded_no_noise(store: GoldenStore) -> None:
    model = convert_to_fnuz(quantize_model(llama(), "e4m3fn", weight="channel", activation="token"))
    results = _replay(model, "w8a16", store)
    assert results and all(not r.passed for r in results), verdicts(results)
    for r in results:
        assert any("the golden records no activation-quantization noise" in n for n in r.notes), r.notes


def test_quantize_model_warns_of_expert_weights_it_leaves_unquantized() -> None:
    from transformers import MixtralConfig, MixtralForCausalLM

    torch.manual_seed(0)
    model = MixtralForCausalLM(MixtralConfig(vocab_size=96, hidden_size=32, intermediate_size=48,
                                             num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                                             num_local_experts=4, num_experts_per_tok=2)).eval()
    with pytest.warns(UserWarning, match=r"model\.layers\.0\.mlp\.experts \(MixtralExperts: gate_up_proj 4x96x32"):
        quantize_model(model, "e4m3fn")


class _ActE5M2(Fp8Linear):
    """Activations cast to e5m2 (scaled for its max, 57344) under e4m3 weights: a format change."""

    def quantize_input(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        s = x.abs().amax(dim=-1, keepdim=True).clamp(min=1e-12) / 57344.0
        return (x / s).clamp(-57344, 57344).to(torch.float8_e5m2), s

    def _gemm(self, q: torch.Tensor, s: torch.Tensor, out_dtype: torch.dtype, wide: torch.dtype) -> torch.Tensor:
        acc = q.to(wide) @ self.weight.to(wide).t()
        return (acc * s.to(wide) * self.weight_scale.to(wide).reshape(1, -1)).to(out_dtype)


class _TowardZero(Fp8Linear):
    """Activation codes rounded toward zero instead of to nearest: a kernel's conversion in the wrong
    rounding mode, whose error is biased and twice a correct rounding's."""

    def quantize_input(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        s = self.activation_scale(x)
        v = (x / s).clamp(-self.format.max, self.format.max)
        nearest = v.to(self.weight.dtype)
        over = nearest.to(v.dtype).abs() > v.abs()
        bits = nearest.view(torch.uint8).to(torch.int16)
        mag = torch.where(over & (bits & 0x7F > 0), (bits & 0x7F) - 1, bits & 0x7F)
        sign = torch.where(mag == 0, 0, bits & 0x80)   # no negative zero: FNUZ's 0x80 is its NaN
        return (sign | mag).to(torch.uint8).view(self.weight.dtype), s


class _WholeTensorAmax(Fp8Linear):
    """One activation scale from the whole tensor's amax though the recipe is per-token: coarser, correct."""

    def activation_scale(self, x: torch.Tensor) -> torch.Tensor:
        return x.abs().amax().clamp(min=1e-12) / self.format.max


def _fnuz_port(change: str) -> nn.Module:
    m = quantize_model(llama(), "e4m3fn", weight="channel", activation="token")
    if change == "ocp_e5m2":   # the same bug on the OCP path: the reference's format and scheme, no allowance
        m.get_submodule(TARGET).__class__ = _ActE5M2
        return m
    convert_to_fnuz(m)
    for name, mod in m.named_modules():
        if isinstance(mod, Fp8Linear) and change == "tensor":
            mod.activation = "tensor"
        elif isinstance(mod, Fp8Linear) and change == "whole_amax":
            mod.__class__ = _WholeTensorAmax
    if change == "e5m2":
        m.get_submodule(TARGET).__class__ = _ActE5M2
    if change == "toward_zero":
        m.get_submodule(TARGET).__class__ = _TowardZero
    return m


def test_e5m2_activations_on_the_fnuz_path_are_inside_the_default_budget_and_caught_at_2() -> None:
    """The figures of docs/fp8.md (run with -s to print them): an e5m2 activation cast on the FNUZ
    path is judged against the noise and stays within 3x; quant_noise=2 catches it while the correct
    alternates pass. On the OCP path the same bug is judged by the usual rule and fails. Inputs:
    2 x 32 tokens."""
    ids = {"input_ids": torch.randint(0, 96, (2, 32), generator=torch.Generator().manual_seed(0)), "use_cache": False}
    golden = GoldenStore(tempfile.mkdtemp(prefix="parity-fp8-e5m2-"))
    capture(quantize_model(llama(), "e4m3fn", weight="channel", activation="token"), ids,
            CheckSpec(name="e5m2", dtypes=["bfloat16", "float32"], drill=2), golden, "cpu")
    verdict: dict[tuple[str, float], list[CheckResult]] = {}
    for budget in (3.0, 2.0):
        spec = CheckSpec(name="e5m2", dtypes=["bfloat16", "float32"], drill=2, tolerance=Tolerance(quant_noise=budget))
        for change in ("none", "tensor", "whole_amax", "e5m2", "toward_zero", "ocp_e5m2"):
            results = verdict[change, budget] = replay(_fnuz_port(change), ids, spec, golden, "cpu")
            # the worst leaf judged against the noise; the OCP path's culprit, against the reference's error
            worst = [max((l.iso.ratio for l in r.layers if l.iso is not None
                          and (l.iso.noise > l.iso.err_ref or l.name == TARGET)), default=0.0) for r in results]
            print(f"{change:10s} quant_noise={budget:g}: "
                  + ", ".join(f"{r.dtype} {'PASS' if r.passed else 'FAIL'} worst {w:.3g}x" for w, r in zip(worst, results)))
    assert all(r.passed for change in ("none", "tensor", "whole_amax", "e5m2", "toward_zero")
               for r in verdict[change, 3.0])
    assert all(r.passed for change in ("none", "tensor", "whole_amax") for r in verdict[change, 2.0])
    for change in ("e5m2", "toward_zero"):
        assert all(not r.passed and r.culprit == TARGET for r in verdict[change, 2.0]), verdicts(verdict[change, 2.0])
    assert all(not r.passed and r.culprit == TARGET for r in verdict["ocp_e5m2", 3.0]), verdicts(verdict["ocp_e5m2", 3.0])
