"""torch.autocast around a check is part of what it computes: the golden records it, and a replay
under another autocast than the capture's says so beside its verdict."""
from __future__ import annotations

import tempfile

import pytest
import torch

from parity_models import llama, tokens
from pytest_rocm_parity.errors import InvalidArgument
from pytest_rocm_parity.golden.store import GoldenStore
from pytest_rocm_parity.runner.capture import capture
from pytest_rocm_parity.runner.engine import CheckSpec
from pytest_rocm_parity.runner.replay import replay
from pytest_rocm_parity.runner.train import capture_train, replay_train


def _bf16_autocast(enabled: bool = True) -> torch.autocast:
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=enabled)


def _autocast_notes(notes: list[str]) -> list[str]:
    return [n for n in notes if "autocast" in n]


def _check(captured_under: bool, replayed_under: bool) -> tuple[GoldenStore, CheckSpec, list]:
    spec = CheckSpec(name="m", dtypes=["float32"])
    store = GoldenStore(tempfile.mkdtemp())
    inputs = tokens()
    with _bf16_autocast(captured_under):
        capture(llama(), inputs, spec, store, "cpu")
    with _bf16_autocast(replayed_under):
        return store, spec, replay(llama(), inputs, spec, store, "cpu")


def test_a_candidate_under_autocast_fails_the_float32_rung_and_says_autocast_is_why() -> None:
    store, spec, (r,) = _check(captured_under=False, replayed_under=True)
    assert store.read_manifest(spec.name)["autocast"] is None
    assert not r.passed
    (note,) = _autocast_notes(r.notes)
    assert "torch.autocast (bfloat16) is on around this check and was not at capture" in note
    assert "outside torch.autocast" in note
    # the failure leads with the setting, and says the module it names is where the setting shows
    from pytest_rocm_parity.judging.assertion import message

    lines = message(r).splitlines()
    assert lines[3] == f"  setting: {note}", lines[:5]
    assert lines[4].startswith("  culprit: ") and "the first module the setting above changes" in lines[4]
    assert sum(note in line for line in lines) == 1


def test_the_same_autocast_at_capture_and_replay_passes_without_a_note() -> None:
    store, spec, (r,) = _check(captured_under=True, replayed_under=True)
    assert store.read_manifest(spec.name)["autocast"] == "bfloat16"
    assert r.passed and not _autocast_notes(r.notes)


def test_a_golden_captured_under_autocast_replayed_without_it_is_named() -> None:
    """Its recorded bf16 activations reach the candidate's fp32 matmuls, which refuse them: the error
    says why."""
    with pytest.raises(InvalidArgument, match=r"failed \(RuntimeError: .*captured under torch.autocast \(bfloat16\)"):
        _check(captured_under=True, replayed_under=False)


def test_check_train_under_an_autocast_the_capture_lacked_says_so() -> None:
    spec = CheckSpec(name="t", dtypes=["float32"], drill=1)
    store = GoldenStore(tempfile.mkdtemp())
    inputs = {**tokens(), "labels": tokens()["input_ids"]}
    capture_train(llama(), inputs, spec, store, "cpu")
    with _bf16_autocast():
        (r,) = replay_train(llama(), inputs, spec, store, "cpu")
    assert not r.passed
    (note,) = _autocast_notes(r.notes)
    assert r.extra["setting"] == note   # the failure message leads with it


def test_check_train_of_a_golden_captured_under_autocast_replayed_without_it_names_autocast() -> None:
    spec = CheckSpec(name="t", dtypes=["float32"], drill=1)
    store = GoldenStore(tempfile.mkdtemp())
    inputs = {**tokens(), "labels": tokens()["input_ids"]}
    with _bf16_autocast():
        capture_train(llama(), inputs, spec, store, "cpu")
    (r,) = replay_train(llama(), inputs, spec, store, "cpu")
    (note,) = _autocast_notes(r.notes)
    assert "captured under torch.autocast (bfloat16)" in note


def test_check_train_that_fails_on_a_golden_autocast_activation_names_autocast() -> None:
    """A plain stack: the golden's bf16 activation reaches an fp32 Linear in the isolated backward."""
    def net() -> torch.nn.Module:
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 8))

    spec = CheckSpec(name="t", dtypes=["float32"])
    store = GoldenStore(tempfile.mkdtemp())
    x = torch.randn(16, 32, generator=torch.Generator().manual_seed(1))

    def loss(out: torch.Tensor) -> torch.Tensor:
        return out.float().square().mean()
    with _bf16_autocast():
        capture_train(net(), (x,), spec, store, "cpu", loss=loss)
    with pytest.raises(InvalidArgument, match=r"failed \(RuntimeError: .*captured under torch.autocast \(bfloat16\)"):
        replay_train(net(), (x,), spec, store, "cpu", loss=loss)
