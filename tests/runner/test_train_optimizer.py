"""The optimizer's settings in a training golden: a factory (the form that builds parameter groups)
is recorded by what it built, so a changed setting is said as it is for a (class, kwargs) pair."""
from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from pytest_rocm_parity.golden.store import GoldenStore
from pytest_rocm_parity.runner.engine import CheckSpec
from pytest_rocm_parity.runner.train import capture_train, replay_train


def net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.LayerNorm(64), nn.Tanh(), nn.Linear(64, 8))


X = torch.randn(16, 32, generator=torch.Generator().manual_seed(2))


def _loss(out: torch.Tensor) -> torch.Tensor:
    return out.pow(2).mean()


def adamw(betas: tuple[float, float] = (0.9, 0.999), norm_decay: float = 0.0) -> Any:
    """A training script's factory: AdamW, no weight decay on the norm (unless ``norm_decay``)."""
    def build(named: list[tuple[str, torch.nn.Parameter]]) -> torch.optim.Optimizer:
        norm = [p for n, p in named if n.startswith("1.")]
        rest = [p for n, p in named if not n.startswith("1.")]
        return torch.optim.AdamW([{"params": rest}, {"params": norm, "weight_decay": norm_decay}], lr=1e-2,
                                 betas=betas, weight_decay=0.1)
    return build


@pytest.fixture(scope="module")
def golden(tmp_path_factory: Any) -> tuple[GoldenStore, CheckSpec]:
    spec = CheckSpec(name="opt", dtypes=["float32"])
    store = GoldenStore(tmp_path_factory.mktemp("opt"))
    capture_train(net(), X, spec, store, "cpu", loss=_loss, optimizer=adamw())
    return store, spec


def _notes(golden: tuple[GoldenStore, CheckSpec], optimizer: Any) -> list[str]:
    store, spec = golden
    (r,) = replay_train(net(), X, spec, store, "cpu", loss=_loss, optimizer=optimizer)
    return [n for n in r.notes if "built otherwise" in n or "the candidate's optimizer" in n]


def test_a_factory_with_other_betas_is_said(golden) -> None:  # type: ignore[no-untyped-def]
    (note,) = _notes(golden, adamw(betas=(0.0, 0.5)))
    assert "the candidate's optimizer is built otherwise than the golden's: betas [0.0, 0.5] where the golden's " \
           "is [0.9, 0.999]" in note, note
    assert "(group" not in note   # every group has them: said once


def test_a_setting_of_one_group_is_said_with_its_group(golden) -> None:  # type: ignore[no-untyped-def]
    (note,) = _notes(golden, adamw(norm_decay=0.1))
    assert "weight_decay 0.1 where the golden's is 0.0 (group 1)" in note, note


def test_the_same_factory_gets_no_note(golden) -> None:  # type: ignore[no-untyped-def]
    assert _notes(golden, adamw()) == []


def test_the_manifest_records_what_the_factory_built(golden) -> None:  # type: ignore[no-untyped-def]
    store, spec = golden
    built = store.read_manifest(spec.name)["rungs"]["float32"]["optimizer_settings"]
    assert built["class"] == "torch.optim.adamw.AdamW" and built["defaults"]["betas"] == [0.9, 0.999]
    assert [(g["params"], g["weight_decay"]) for g in built["groups"]] == [(4, 0.1), (2, 0.0)]


def adamw_losing_state(named: list[tuple[str, torch.nn.Parameter]]) -> torch.optim.Optimizer:
    """A "fused" AdamW that drops its moments and step count before every step: each step is a first."""
    opt = torch.optim.AdamW([p for _, p in named], lr=1e-2, betas=(0.9, 0.999), weight_decay=0.1)
    opt.register_step_pre_hook(lambda o, args, kwargs: o.state.clear())
    return opt


def adamw_plain(betas: tuple[float, float] = (0.9, 0.999), **kw: Any) -> Any:
    def build(named: list[tuple[str, torch.nn.Parameter]]) -> torch.optim.Optimizer:
        return torch.optim.AdamW([p for _, p in named], lr=1e-2, betas=betas, weight_decay=0.1, **kw)
    return build


@pytest.fixture(scope="module")
def three_steps(tmp_path_factory: Any) -> tuple[GoldenStore, CheckSpec]:
    spec = CheckSpec(name="opt3", dtypes=["bfloat16", "float32"])
    store = GoldenStore(tmp_path_factory.mktemp("opt3"))
    capture_train(net(), X, spec, store, "cpu", loss=_loss, optimizer=adamw_plain(), steps=3)
    return store, spec


def _replay3(golden: tuple[GoldenStore, CheckSpec], optimizer: Any) -> list[Any]:
    store, spec = golden
    return replay_train(net(), X, spec, store, "cpu", loss=_loss, optimizer=optimizer, steps=3)


def _worst_update(r: Any) -> float:
    """The largest error ratio among the optimizer's judged updates, every step's (docs/training.md)."""
    return max(o.iso.ratio for o in r.outputs if o.name.startswith("optimizer:") and o.iso is not None)


@pytest.mark.parametrize("alternate", [{}, {"foreach": True}, {"fused": True}], ids=["same", "foreach", "fused"])
def test_every_step_of_a_correct_optimizer_passes(three_steps, alternate: dict[str, Any]) -> None:  # type: ignore[no-untyped-def]
    for r in _replay3(three_steps, adamw_plain(**alternate)):
        assert r.passed, (r.dtype, r.notes)
        leaves = [o for o in r.outputs if o.name.startswith("optimizer:")]
        assert leaves and all(o.iso is not None for o in leaves)
        print(f"{alternate or 'same'} {r.dtype}: worst update {_worst_update(r):.3g}x")   # docs/training.md (-s)


@pytest.mark.parametrize("optimizer", [adamw_plain(betas=(0.0, 0.999)), adamw_losing_state],
                         ids=["no-momentum", "state-dropped"])
def test_a_bug_only_the_optimizers_state_carries_fails_from_the_second_step(three_steps, optimizer: Any,  # type: ignore[no-untyped-def]
                                                                          request: pytest.FixtureRequest) -> None:
    """Adam's first step is the same whatever beta1 and whatever state came before: only the later
    steps, on the golden's gradients of each step, show them."""
    for r in _replay3(three_steps, optimizer):
        print(f"{request.node.callspec.id} {r.dtype}: worst update {_worst_update(r):.3g}x")   # docs/training.md (-s)
        assert not r.passed and r.culprit is None and not all(r.extra["optimizer"].values()), (r.dtype, r.notes)
        assert all(l.passed for l in r.layers), r.dtype   # the model's backward passes
        (note,) = [n for n in r.notes if "out of bounds" in n]
        assert "3 steps from the golden weights on the golden gradients of each step" in note, note
        assert "within bounds at the first step and out from a later one: what the optimizer's state carries" \
            in note, note
