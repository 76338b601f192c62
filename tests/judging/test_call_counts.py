"""A candidate that calls a module more often than the reference did (a loop of another length):
the calls past the golden's count are named, as the ones it left out are."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from parity_models import capture_then_replay, verdicts
from pytest_rocm_parity.runner.engine import CheckSpec


class Loop(nn.Module):
    def __init__(self, steps: int = 4) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.cell, self.out = nn.Linear(16, 16), nn.Linear(16, 16)
        self.steps = steps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(self.steps):
            x = torch.tanh(self.cell(x))
        return self.out(x)


@pytest.mark.parametrize("route", ["fast", "full"])
def test_calls_past_the_goldens_count_are_named(route: str) -> None:
    """The full replay fails on the outputs that the extra step changes; the fast one, which feeds
    every module golden inputs, passes, and a warning says what it did not judge."""
    import warnings

    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(1))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        (res,) = capture_then_replay(Loop, Loop(steps=5), x, CheckSpec(name="loop", dtypes=["float32"], replay=route))
    assert any(n.startswith("1 call the golden does not hold (cell#4): the candidate called the module more often")
               for n in res.notes), verdicts([res])
    warned = [str(w.message) for w in seen if "the golden does not hold" in str(w.message)]
    assert res.passed == (route == "fast") and bool(warned) == (route == "fast"), (verdicts([res]), warned)
    assert all("--parity-replay=full" in w for w in warned), warned


class Named(nn.Module):
    def __init__(self, as_list: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = nn.Linear(16, 16), nn.Linear(16, 4)
        self.as_list = as_list

    def forward(self, x: torch.Tensor) -> object:
        h = self.a(x)
        logits = self.b(torch.relu(h))
        return [h, logits] if self.as_list else {"hidden": h, "logits": logits, "mask": logits > 0}


@pytest.mark.parametrize("route", ["fast", "full"])
def test_outputs_returned_by_position_where_the_reference_named_them_say_the_type_changed(route: str) -> None:
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(1))
    (res,) = capture_then_replay(Named, Named(as_list=True), x, CheckSpec(name="o", dtypes=["float32"], replay=route))
    assert not res.passed
    assert any(n.startswith("the candidate returns 2 outputs by position where the reference returned 3 by name "
                            "(hidden, logits, mask): its return type changed") for n in res.notes), verdicts([res])
