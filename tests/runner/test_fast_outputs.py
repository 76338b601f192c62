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


class Scored(nn.Module):
    """Returns its loss as a Python number (``.item()``), as training-style models often do."""

    def __init__(self, scale: float = 1.0) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin, self.scale = nn.Linear(16, 16), scale

    def forward(self, x: torch.Tensor) -> dict[str, object]:
        y = self.lin(x)
        return {"out": y, "loss": (y.float().square().mean() * self.scale).item(), "count": 3}


@pytest.mark.parametrize("mode", ["fast", "full"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_python_number_among_the_outputs_is_judged_like_a_tensor(mode: str, dtype: str) -> None:
    """A loss returned by ``.item()`` 5% off (13 bf16 roundings) fails at the output, named; the same model passes, and
    an integer constant stays a constant."""
    x = {"x": torch.randn(8, 16, generator=torch.Generator().manual_seed(0))}
    spec = CheckSpec(name="m", dtypes=[dtype], replay=mode)
    ok = capture_then_replay(Scored, Scored(), x, spec)
    assert ok[0].passed and "<output>.loss" in [o.name for o in ok[0].outputs], verdicts(ok)
    assert "<output>.count" not in [o.name for o in ok[0].outputs]
    bad = capture_then_replay(Scored, Scored(1.05), x, spec)
    assert [o.name for o in bad[0].outputs if not o.passed] == ["<output>.loss"], verdicts(bad)
    assert not bad[0].passed


def test_a_golden_that_recorded_a_python_number_unjudged_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    """Goldens captured while numbers were constants hold them under ``const``: the replay says the
    output goes unjudged until the golden is regenerated, rather than passing it silently."""
    import tempfile

    from pytest_rocm_parity.golden.store import GoldenStore
    from pytest_rocm_parity.runner import engine
    from pytest_rocm_parity.runner.capture import capture
    from pytest_rocm_parity.runner.replay import replay

    x = {"x": torch.randn(8, 16, generator=torch.Generator().manual_seed(0))}
    store = GoldenStore(tempfile.mkdtemp(prefix="parity-numbers-"))
    spec = CheckSpec(name="m", dtypes=["float32"], replay="full")
    with monkeypatch.context() as m:
        m.setattr(engine, "floats_as_tensors", lambda out: out)   # the capture of such a golden
        capture(Scored(), x, spec, store, "cpu")
    res = replay(Scored(1.01), x, spec, store, "cpu")
    assert any("output loss as a Python number recorded unjudged" in n and "regenerate" in n
               for n in res[0].notes), res[0].notes
