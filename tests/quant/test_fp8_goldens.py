"""What a replay says where the golden does not hold the quantized model the candidate is: an FP8
candidate of an unquantized golden (the noise allowance needs the noise measured at capture), one
layer quantized against it, a checkpoint quantized again with other scales, and activations
quantized against a weight-only golden (docs/fp8.md)."""
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
        assert own.startswith(f"{r.culprit}: its weight is quantized otherwise than the golden's"), r.notes
        assert "one per-tensor scale where the golden's weight has per-channel scales" in own
        assert "of its codes differ" in own and "Load the checkpoint the golden was captured from" in own
        assert any("quantized otherwise than the golden's as well" in n for n in r.notes), r.notes


def test_activations_quantized_against_a_weight_only_golden_say_it_recorded_no_noise(store: GoldenStore) -> None:
    model = convert_to_fnuz(quantize_model(llama(), "e4m3fn", weight="channel", activation="token"))
    results = _replay(model, "w8a16", store)
    assert results and all(not r.passed for r in results), verdicts(results)
    for r in results:
        assert any("the golden records no activation-quantization noise" in n for n in r.notes), r.notes
