"""The tolerance a failure's message suggests passes when pasted as printed: it names every failing
layer, and it widens only the failing rung (a plain ratio would also set float32's budget of 10 to a
bf16 ratio)."""
from __future__ import annotations

import copy
import tempfile
from dataclasses import replace
from typing import Any

import pytest
import torch
from torch import nn

from parity_models import VOCAB, llama, suggested_tolerances, verdicts
from pytest_rocm_parity import Tolerance
from pytest_rocm_parity.golden.store import GoldenStore
from pytest_rocm_parity.judging.assertion import message
from pytest_rocm_parity.runner.capture import capture
from pytest_rocm_parity.runner.engine import CheckSpec
from pytest_rocm_parity.runner.replay import replay

NORMS = ["model.layers.0.input_layernorm", "model.layers.0.post_attention_layernorm",
         "model.layers.1.input_layernorm", "model.layers.1.post_attention_layernorm", "model.norm"]


def rounds_worse_at_bf16(model: nn.Module) -> nn.Module:
    """Every RMSNorm's bf16 output off by 2^-8 of itself, alternating in sign along the hidden
    dimension: about 3.6x the reference's error, a precision-only defect (float32 unchanged)."""
    def hook(_m: nn.Module, _a: Any, out: torch.Tensor) -> torch.Tensor:
        if out.dtype != torch.bfloat16:
            return out
        sign = torch.ones(out.shape[-1])
        sign[1::2] = -1
        return (out.float() * (1 + 2.0**-8 * sign)).to(out.dtype)
    for name in NORMS:
        model.get_submodule(name).register_forward_hook(hook)
    return model


@pytest.fixture(scope="module")
def golden() -> tuple[GoldenStore, CheckSpec, dict[str, torch.Tensor]]:
    ids = {"input_ids": torch.randint(3, VOCAB, (2, 64), generator=torch.Generator().manual_seed(0))}
    spec = CheckSpec(name="m", dtypes=["bfloat16", "float32"])
    store = GoldenStore(tempfile.mkdtemp(prefix="parity-suggest-"))
    capture(llama(), copy.deepcopy(ids), spec, store, "cpu")
    return store, spec, ids


def test_each_suggested_tolerance_passes_as_printed_and_leaves_float32_at_its_budget(
        golden: tuple[GoldenStore, CheckSpec, dict[str, torch.Tensor]]) -> None:
    store, spec, ids = golden
    bf16, fp32 = replay(rounds_worse_at_bf16(llama()), ids, spec, store, "cpu")
    assert not bf16.passed and fp32.passed, verdicts([bf16, fp32])
    assert sorted(l.name for l in bf16.layers if not l.iso_passed) == sorted(NORMS), verdicts([bf16])
    text = message(bf16)
    whole, per_layer = suggested_tolerances(text)
    assert set(per_layer.layers) == set(NORMS), text   # every failing layer, not the first few
    for tol in (whole, per_layer):
        again = replay(rounds_worse_at_bf16(llama()), ids, replace(spec, tolerance=tol), store, "cpu")
        assert all(r.passed for r in again), verdicts(again)
        budgets = {l.budget for l in again[1].layers if l.iso is not None}
        assert budgets == {10.0}, (tol, budgets)   # the float32 rung is judged as before


def test_a_per_rung_ratio_widens_only_the_rungs_it_names() -> None:
    tol = Tolerance(ratio={"bf16": 3})
    assert (tol.ratio_for("bfloat16"), tol.ratio_for("float16"), tol.ratio_for("float32")) == (3.0, 1.75, 10.0)
    from pytest_rocm_parity.errors import InvalidArgument

    with pytest.raises(InvalidArgument, match="'int8' is not a rung"):
        Tolerance(ratio={"int8": 2})
    with pytest.raises(InvalidArgument, match="the bfloat16 ratio 0.5 must be a number >= 1.0"):
        Tolerance(ratio={"bfloat16": 0.5})


def test_the_html_report_suggests_the_culprits_ratio_for_its_rung_alone(
        golden: tuple[GoldenStore, CheckSpec, dict[str, torch.Tensor]], tmp_path: Any) -> None:
    import html

    from pytest_rocm_parity.reports import report

    store, spec, ids = golden
    bf16, _fp32 = replay(rounds_worse_at_bf16(llama()), ids, spec, store, "cpu")
    culprit = next(l for l in bf16.layers if l.name == bf16.culprit)
    report.write_all({"schema": 1, "checks": [bf16.to_dict()]}, tmp_path)
    text = html.unescape((tmp_path / "parity-report.html").read_text("utf-8"))
    assert f'would pass with Tolerance(ratio={{"bfloat16": {culprit.would_pass_ratio:g}}})' in text
