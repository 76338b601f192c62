"""The fast replay judges the model outputs that code outside every selected module computes (a
final logit softcap in the model's own forward), from its teacher-forced run; an output that is a
judged module's own tensor is judged with that module only."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from parity_models import capture_then_replay, llama, tokens, verdicts
from pytest_rocm_parity.runner.engine import CheckSpec


def gemma2(cap: float) -> nn.Module:
    """A 2-layer Gemma2, whose CausalLM forward softcaps the head's logits outside any module."""
    from transformers import Gemma2Config, Gemma2ForCausalLM

    torch.manual_seed(0)
    cfg = Gemma2Config(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=8,
                       max_position_embeddings=64, final_logit_softcapping=cap, use_cache=False,
                       attn_implementation="eager")
    return Gemma2ForCausalLM(cfg).eval()


FAST = CheckSpec(name="m", dtypes=["float32"], replay="fast")


def test_a_changed_final_softcap_fails_the_fast_replay_at_the_output() -> None:
    ids = {"input_ids": torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(0)), "use_cache": False}
    res = capture_then_replay(lambda: gemma2(30.0), gemma2(30.0), ids, FAST)
    assert res[0].passed and [o.name for o in res[0].outputs] == ["<output>.logits"], verdicts(res)
    res = capture_then_replay(lambda: gemma2(30.0), gemma2(3.0), ids, FAST)
    assert not res[0].passed and res[0].culprit is None, verdicts(res)
    assert [o.name for o in res[0].outputs if not o.passed] == ["<output>.logits"], verdicts(res)
    assert any("after the last selected module" in n and "propagated" not in n.split(":")[0] for n in res[0].notes), \
        res[0].notes


@pytest.mark.parametrize("mode", ["fast", "full"])
def test_an_output_that_is_the_heads_tensor_is_judged_with_the_head_in_the_fast_replay(mode: str) -> None:
    spec = CheckSpec(name="m", dtypes=["float32"], replay=mode)
    res = capture_then_replay(llama, llama(), tokens("right"), spec)
    assert res[0].passed, verdicts(res)
    assert [o.name for o in res[0].outputs] == ([] if mode == "fast" else ["<output>.logits"])
