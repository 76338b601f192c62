"""Faults of a kernel's wrapper rather than its arithmetic, named at the module: one that stores its
right output into its input (the parent's later use of that tensor breaks, every module inside it
passing), and one that returns another dtype (the forward then raises in an operation that names
no module)."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from parity_models import capture_then_replay, verdicts
from pytest_rocm_parity.judging.assertion import message
from pytest_rocm_parity.runner.engine import CheckSpec


class InPlaceNorm(nn.LayerNorm):
    """A LayerNorm whose wrapper writes the normalised rows back into its input and returns it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.copy_(super().forward(x))


class Residual(nn.Module):
    def __init__(self, d: int, norm: type[nn.LayerNorm]) -> None:
        super().__init__()
        self.norm = norm(d)
        self.fc = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc(self.norm(x))


class Net(nn.Module):
    def __init__(self, norm: type[nn.LayerNorm] = nn.LayerNorm) -> None:
        super().__init__()
        self.inp = nn.Linear(16, 16)
        self.blocks = nn.ModuleList(Residual(16, norm) for _ in range(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for b in self.blocks:
            x = b(x)
        return x


def _net(norm: type[nn.LayerNorm] = nn.LayerNorm) -> Net:
    torch.manual_seed(0)
    return Net(norm).eval()


@pytest.mark.parametrize("mode", ["full", "fast"])
def test_a_module_that_writes_its_input_is_named_beside_the_failing_block(mode: str) -> None:
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(0))
    spec = CheckSpec(name="m", dtypes=["float32"], drill=1, replay=mode)
    (res,) = capture_then_replay(_net, _net(InPlaceNorm), x, spec)
    assert not res.passed and res.culprit == "blocks.0", verdicts([res])
    assert all(l.iso_passed for l in res.layers if l.name.startswith("blocks.0."))
    text = message(res)
    assert "blocks.0.norm (args.0) writes its activation input in place" in text, text


def test_a_correct_module_writes_nothing_and_gets_no_such_note() -> None:
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(0))
    (res,) = capture_then_replay(_net, _net(), x, CheckSpec(name="m", dtypes=["float32"], drill=1))
    assert res.passed and not any("in place" in n for n in res.notes)


def test_a_module_returning_another_dtype_is_named_when_the_forward_then_raises() -> None:
    """A wrapper that returns float32 in a bfloat16 model makes the next matmul raise torch's dtype
    error, which names no module: the replay's error names the module and both dtypes."""
    from pytest_rocm_parity.errors import InvalidArgument

    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(0))
    candidate = _net()
    candidate.blocks[0].norm.register_forward_hook(lambda mod, args, out: out.float())
    with pytest.raises(InvalidArgument, match=r"blocks\.0\.norm returned torch\.float32 where the golden recorded "
                                              r"torch\.bfloat16.*out\.to\(x\.dtype\)"):
        capture_then_replay(_net, candidate, x, CheckSpec(name="m", dtypes=["bfloat16"], drill=1))
