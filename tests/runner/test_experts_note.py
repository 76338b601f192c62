"""A failing MoE experts module (one Hugging Face module for every expert) says whose tokens hold the
excess: one expert's, found by leaving each expert's tokens out, or every expert's."""
from __future__ import annotations

import pytest

from parity_models import capture_then_replay, mixtral, plant_expert, tokens
from pytest_rocm_parity.judging.assertion import message
from pytest_rocm_parity.runner.engine import CheckSpec

EXPERTS = "model.layers.0.mlp.experts"


@pytest.mark.parametrize("rung", ["float32", "bfloat16"])
@pytest.mark.parametrize("mode", ["full", "fast"])
def test_a_fault_in_one_expert_names_that_expert(rung: str, mode: str) -> None:
    inputs = {**tokens(batch=4, seq=32), "use_cache": False}
    spec = CheckSpec(name="moe", dtypes=[rung], replay=mode)
    (res,) = capture_then_replay(mixtral, plant_expert(mixtral(), expert=2), inputs, spec)
    assert not res.passed and res.culprit == EXPERTS, message(res)
    said = [n for n in res.notes if n.startswith(EXPERTS)]
    assert len(said) == 1 and "the excess is on the 77 tokens routed to expert 2: without them the error is 1x" in said[0]
    assert f"likely cause: {said[0][len(EXPERTS) + 2:]}" in message(res)


def test_a_fault_in_every_expert_is_named_common_to_them() -> None:
    inputs = {**tokens(batch=4, seq=32), "use_cache": False}
    (res,) = capture_then_replay(mixtral, plant_expert(mixtral(), expert=None), inputs,
                                 CheckSpec(name="moe", dtypes=["bfloat16"]))
    assert not res.passed and res.culprit == EXPERTS
    assert any(n.startswith(f"{EXPERTS}: the excess is on the tokens of every expert") for n in res.notes), res.notes


def test_a_correct_experts_kernel_gets_no_such_note() -> None:
    inputs = {**tokens(batch=4, seq=32), "use_cache": False}
    (res,) = capture_then_replay(mixtral, mixtral(experts="eager"), inputs, CheckSpec(name="moe", dtypes=["bfloat16"]))
    assert res.passed and not any("the excess is on" in n for n in res.notes)
