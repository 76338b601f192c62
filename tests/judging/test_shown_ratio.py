"""The propagated ratio a record shows (the table, layers.csv, the report) is the one its verdict
used: floored at one rounding of the output, so an exact reference does not make a passing row
show a ratio over its budget."""
from __future__ import annotations

import torch
from torch import nn

from parity_models import capture_then_replay, verdicts
from pytest_rocm_parity.runner.engine import CheckSpec


class Double(nn.Module):
    def __init__(self, roundabout: bool) -> None:
        super().__init__()
        self.roundabout = roundabout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x * 2 is exact in float32; the roundabout way is the same function with a few roundings
        return ((x * 3) / 1.5 * 1.7) / 1.7 * 1.3 / 1.3 if self.roundabout else x * 2


class Model(nn.Module):
    def __init__(self, roundabout: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.d, self.l = Double(roundabout), nn.Linear(64, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.l(self.d(x))


def test_a_passing_rows_propagated_ratio_is_within_its_budget() -> None:
    x = torch.randn(64, 64, generator=torch.Generator().manual_seed(0))
    res, = capture_then_replay(Model, Model(roundabout=True), x, CheckSpec(name="m", dtypes=["float32"], drill=0))
    row = next(l for l in res.layers if l.name == "d")
    assert row.prop is not None and row.prop.err_ref < row.prop.err_cand, verdicts([res])   # an exact reference
    assert row.prop_passed == (row.prop.ratio <= row.prop_budget), (row.prop.ratio, row.prop_budget)
    assert res.to_frame().set_index("layer").loc["d", "prop_ratio"] == row.prop.ratio



def test_a_propagated_failure_just_over_its_budget_shows_digits_that_read_over_it() -> None:
    """3.0004x against a budget of 3x reads '3.0004x', not '3x (budget 3x)', which hides the verdict."""
    from pytest_rocm_parity.judging.judge import Rule
    from pytest_rocm_parity.judging.records import LeafMetrics
    from pytest_rocm_parity.judging.tolerance import Tolerance

    rule = Rule.of(Tolerance(), "bfloat16")
    m = LeafMetrics(leaf="0", numel=1024, err_cand=rule.k * 1.0001 * 1e-3, err_ref=1e-3, rms_truth=0.01)
    assert rule.failure(m, isolated=False) == f"propagated error {rule.k * 1.0001:.5g}x the reference's (budget 3x)"
    far = LeafMetrics(leaf="0", numel=1024, err_cand=12.3456e-3, err_ref=1e-3, rms_truth=0.01)
    assert rule.failure(far, isolated=False) == "propagated error 12.3x the reference's (budget 3x)"
