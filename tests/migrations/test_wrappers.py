"""Wrappers are transparent: DataParallel, PEFT and accelerate's hooks map to the golden's module
names, and the candidate's own code (the wrapper's forward) is what runs."""
from __future__ import annotations

import copy

import pytest
import torch

from parity_models import capture_then_replay, llama, plant, tokens, verdicts


def test_data_parallel_candidate_passes_and_a_bug_is_named_by_the_plain_name() -> None:
    cand = torch.nn.DataParallel(llama("sdpa"))
    res = capture_then_replay(lambda: llama("sdpa"), cand, tokens("right"))
    assert res[0].passed, verdicts(res)
    bad = torch.nn.DataParallel(plant(llama("sdpa"), "model.layers.1.mlp.down_proj", 1.02))
    res = capture_then_replay(lambda: llama("sdpa"), bad, tokens("right"))
    assert not res[0].passed and res[0].culprit == "model.layers.1.mlp.down_proj", verdicts(res)


def test_peft_wrapped_candidate_maps_to_the_base_model_names() -> None:
    """A LoRA adapter whose B matrices are zero (as peft initialises them) computes the base model:
    it passes against the base model's golden; a trained-looking adapter on one projection is named."""
    peft = pytest.importorskip("peft")
    config = peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], lora_alpha=8)
    cand = peft.get_peft_model(llama("sdpa"), config)
    res = capture_then_replay(lambda: llama("sdpa"), cand, tokens())
    assert res[0].passed, verdicts(res)
    with torch.no_grad():
        cand.base_model.model.model.layers[1].self_attn.v_proj.lora_B["default"].weight.normal_(0, 0.05)
    res = capture_then_replay(lambda: llama("sdpa"), cand, tokens())
    assert not res[0].passed and res[0].culprit == "model.layers.1.self_attn.v_proj", verdicts(res)


def test_accelerate_hooks_on_the_candidate_pass() -> None:
    """accelerate's dispatch wraps each module's forward with its hooks (device placement, offload);
    the module names and the computation stay."""
    accelerate = pytest.importorskip("accelerate")
    cand = llama("sdpa")
    cand = accelerate.dispatch_model(cand, device_map={"": "cpu"}, force_hooks=True)
    res = capture_then_replay(lambda: llama("sdpa"), cand, tokens("left"))
    assert res[0].passed, verdicts(res)
