"""A culprit whose own arithmetic is exact but whose caller built its index input otherwise (T5's
relative position buckets off by one): the failure says where the difference starts."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from parity_models import capture_then_replay, plant, verdicts
from pytest_rocm_parity.judging.assertion import message
from pytest_rocm_parity.runner.engine import CheckSpec


class PositionBias(nn.Module):
    def __init__(self, shift: int = 0) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.proj = nn.Linear(16, 16)
        self.bias = nn.Embedding(12, 16)
        self.shift = shift

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        idx = (torch.arange(x.shape[1]) + self.shift) % 12   # built here, not from the model's input
        return self.proj(x) + self.bias(idx)


def _x() -> torch.Tensor:
    return torch.randn(2, 8, 16, generator=torch.Generator().manual_seed(1))


def test_an_index_built_otherwise_by_the_caller_is_named_as_the_start() -> None:
    (r,) = capture_then_replay(PositionBias, PositionBias(shift=1), _x(), CheckSpec(name="m", dtypes=["float32"]))
    assert not r.passed and r.culprit == "bias", verdicts([r])
    (note,) = [n for n in r.notes if "built by its caller" in n]
    assert note.startswith("bias: its input args.0 (") and "the code that builds it" in note


def test_a_bug_in_the_module_itself_gets_no_such_note() -> None:
    (r,) = capture_then_replay(PositionBias, plant(PositionBias(), "bias"), _x(), CheckSpec(name="m", dtypes=["float32"]))
    assert not r.passed and r.culprit == "bias", verdicts([r])
    assert not [n for n in r.notes if "built by its caller" in n]


class Biased(nn.Module):
    """An attention-like module given a float bias its caller builds (an ALiBi bias)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.proj = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return self.proj(x) + bias


class BuildsBias(nn.Module):
    """The caller: builds the bias from positions and slopes (not from the model's input)."""

    def __init__(self, slope: float = 0.5) -> None:
        super().__init__()
        self.inner = Biased()
        self.slope = slope

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(x.shape[1], dtype=x.dtype)
        bias = (self.slope * pos)[None, :, None].expand(x.shape[0], -1, 16)
        return self.inner(x, bias)


def test_a_float_input_the_caller_builds_otherwise_is_named_as_the_start() -> None:
    """Slopes 2% off (an ALiBi built wrong by the model's own forward): the module given the bias
    fails while its projection passes, and the failure names the bias, built before it, as the likely
    cause, not the module's own code between its children."""
    spec = CheckSpec(name="m", dtypes=["float32"], layers=["inner", "inner.*"])
    (r,) = capture_then_replay(BuildsBias, BuildsBias(slope=0.51), _x(), spec)
    assert not r.passed and r.culprit == "inner", verdicts([r])
    (note,) = [n for n in r.notes if "built by its caller" in n]
    assert note.startswith("inner: its input args.1 (224 of 256 elements)"), note
    text = message(r)
    assert "likely cause: its input args.1" in text and "own forward's code" not in text, text


def test_a_float_input_built_alike_to_a_rounding_gets_no_such_note() -> None:
    """The bias one rounding off everywhere (another formula for the same table) is not named; the
    module's own bug is."""
    class OneUlp(BuildsBias):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            pos = torch.arange(x.shape[1], dtype=x.dtype)
            bias = torch.nextafter(self.slope * pos, torch.tensor(float("inf")))[None, :, None].expand(x.shape[0], -1, 16)
            return self.inner(x, bias)
    spec = CheckSpec(name="m", dtypes=["float32"], layers=["inner"])
    candidate = OneUlp()
    plant(candidate, "inner.proj")
    (r,) = capture_then_replay(BuildsBias, candidate, _x(), spec)
    assert not r.passed and r.culprit == "inner", verdicts([r])
    assert not [n for n in r.notes if "built by its caller" in n], r.notes


@pytest.mark.parametrize(("replay_kind", "drill", "culprit"), [("full", 1, "model.layers.0.self_attn"),
                                                           ("fast", 0, "model.layers.0")])
def test_a_model_level_mask_that_drops_the_padding_is_named_as_the_start(monkeypatch, replay_kind, drill,
                                                                         culprit) -> None:
    """A left-padded Llama whose own forward builds its attention mask without the padding (the
    mask builder given no attention_mask): every attention fails alike, and the culprit's note says
    its mask, built by its caller, is missing where the reference's call had one; in a fast replay
    of the blocks alone too (the default above 1B parameters), where only one level is judged."""
    import tempfile

    from transformers.models.llama import modeling_llama

    from parity_models import llama
    from pytest_rocm_parity.golden.store import GoldenStore
    from pytest_rocm_parity.runner.capture import capture
    from pytest_rocm_parity.runner.replay import replay

    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[0, :5] = 0
    inputs = {"input_ids": ids, "attention_mask": mask, "use_cache": False}
    spec = CheckSpec(name="m", dtypes=["float32"], drill=drill, replay=replay_kind)
    store = GoldenStore(tempfile.mkdtemp(prefix="parity-mask-"))
    capture(llama(vocab_size=64), inputs, spec, store, "cpu")
    built = modeling_llama.create_causal_mask

    def without_padding(*args, **kwargs):
        kwargs["attention_mask"] = None
        return built(*args, **kwargs)
    monkeypatch.setattr(modeling_llama, "create_causal_mask", without_padding)
    (r,) = replay(llama(vocab_size=64), inputs, spec, store, "cpu")
    assert not r.passed and r.culprit == culprit, verdicts([r])
    (note,) = [n for n in r.notes if "built by its caller" in n]
    assert "attention_mask (none on the candidate's call" in note and "the padding is not masked" in note, note
    assert "likely cause: its input kwargs.attention_mask" in message(r)
