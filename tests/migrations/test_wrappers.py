"""Wrappers are transparent: DataParallel, PEFT and accelerate's hooks map to the golden's module
names, and the candidate's own code (the wrapper's forward) is what runs."""
from __future__ import annotations

import copy

import pytest
import torch

from parity_models import capture_then_replay, llama, plant, tokens, verdicts
from pytest_rocm_parity import CheckSpec, GoldenStale


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


def _trained_lora() -> torch.nn.Module:
    """The 2-layer Llama with a LoRA adapter on q and v whose B matrices are not zero (trained)."""
    peft = pytest.importorskip("peft")
    model = peft.get_peft_model(llama("sdpa"), peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"],
                                                                lora_alpha=8, init_lora_weights=False))
    return model.eval()


def test_an_adapter_merged_on_one_side_is_judged_by_its_outputs_and_a_wrong_merge_is_named() -> None:
    """Serving merges the adapter into the base weights (merge_and_unload): those weights differ by
    the merge, not as another checkpoint, and the modules compute what the adapter did, so the
    replay judges them (both ways round). A merge that forgets the adapter's scale is named; a
    changed weight of a module without an adapter is still another model."""
    res = capture_then_replay(_trained_lora, _trained_lora().merge_and_unload().eval(), tokens(),
                              CheckSpec(name="m", dtypes=["float32", "bfloat16"]))
    assert all(r.passed for r in res), verdicts(res)
    assert any("merged into the base weights on one side" in n for n in res[0].notes), res[0].notes
    res = capture_then_replay(lambda: _trained_lora().merge_and_unload().eval(), _trained_lora(), tokens())
    assert res[0].passed, verdicts(res)

    wrong = _trained_lora()
    for layer in wrong.base_model.model.model.layers:
        layer.self_attn.v_proj.scaling["default"] = 1.0   # alpha / r = 2 forgotten by the merge
    res = capture_then_replay(_trained_lora, wrong.merge_and_unload().eval(), tokens())
    assert not res[0].passed and res[0].culprit == "model.layers.0.self_attn.v_proj", verdicts(res)

    other = _trained_lora().merge_and_unload().eval()
    with torch.no_grad():
        other.model.layers[1].mlp.down_proj.weight.mul_(1.01)
    with pytest.raises(GoldenStale, match=r"weights changed: model\.layers\.1\.mlp\.down_proj\.weight "):
        capture_then_replay(_trained_lora, other, tokens())


def test_accelerate_hooks_on_the_candidate_pass() -> None:
    """accelerate's dispatch wraps each module's forward with its hooks (device placement, offload);
    the module names and the computation stay."""
    accelerate = pytest.importorskip("accelerate")
    cand = llama("sdpa")
    cand = accelerate.dispatch_model(cand, device_map={"": "cpu"}, force_hooks=True)
    res = capture_then_replay(lambda: llama("sdpa"), cand, tokens("left"))
    assert res[0].passed, verdicts(res)
