"""A port often changes the memory layout (channels_last, a permuted view) and its kernels take
another path on it: a module is judged isolated on the golden's activations laid out as the
candidate's own, so a kernel wrong only on the layout the candidate runs is named, and one wrong
only on a layout the candidate never gives it is not."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from parity_models import capture_then_replay, convnet, image
from pytest_rocm_parity.runner.engine import CheckSpec


class WrongOnChannelsLast(nn.BatchNorm2d):
    """A NHWC kernel 5% off: what the candidate runs when the model is channels_last."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = super().forward(x)
        return out * 1.05 if not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last) else out


class WrongOnStrided(nn.LayerNorm):
    """A kernel 5% off on a non-contiguous input, which the candidate's own forward never gives it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = super().forward(x)
        return out if x.is_contiguous() else out * 1.05


class Permuting(nn.Module):
    """A ConvNeXt-style block: a depthwise conv, then channels last for the norm."""

    def __init__(self, norm: type[nn.LayerNorm]) -> None:
        super().__init__()
        self.dw = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.norm = norm(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.dw(x).permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class Net(nn.Module):
    def __init__(self, norm: type[nn.LayerNorm] = nn.LayerNorm) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.block = Permuting(norm)
        self.head = nn.Conv2d(8, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.block(self.stem(x)))


def channels_last_with_bug() -> nn.Module:
    m = convnet(channels_last=True)
    bad = WrongOnChannelsLast(8).eval()
    bad.load_state_dict(m[4].state_dict())
    m[4] = bad
    return m


@pytest.mark.parametrize("replay", ["full", "fast"])
def test_a_kernel_wrong_only_on_channels_last_is_named(replay: str) -> None:
    x = image().contiguous(memory_format=torch.channels_last)
    res = capture_then_replay(lambda: convnet(), channels_last_with_bug(), x,
                              CheckSpec(name="m", dtypes=["float32"], replay=replay))[0]
    assert not res.passed and res.culprit == "4", (res.culprit, [(l.name, l.reason) for l in res.layers])


def test_a_kernel_wrong_only_on_a_layout_the_candidate_never_runs_passes() -> None:
    """The candidate's stem (only) is channels_last, so the block's depthwise conv keeps that layout
    and its norm sees a contiguous tensor; fed a contiguous golden instead, the norm would get a
    permuted view and fail."""
    cand = Net(WrongOnStrided).eval()
    cand.stem.to(memory_format=torch.channels_last)
    res = capture_then_replay(lambda: Net().eval(), cand, image(), CheckSpec(name="m", dtypes=["float32"], drill=1))[0]
    assert res.passed, [(l.name, l.reason) for l in res.layers if not l.passed]


class NormFirst(nn.Module):
    """A norm on the model's own input, then a conv: only the input's layout decides the norm's path."""

    def __init__(self, norm: type[nn.BatchNorm2d] = nn.BatchNorm2d) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.norm, self.conv = norm(3).eval(), nn.Conv2d(3, 4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(self.norm(x))


def test_the_models_own_input_keeps_the_layout_the_test_passed() -> None:
    x = image().contiguous(memory_format=torch.channels_last)
    cand = NormFirst(WrongOnChannelsLast).eval()
    res = capture_then_replay(lambda: NormFirst().eval(), cand, x, CheckSpec(name="m", dtypes=["float32"]))[0]
    assert not res.passed and res.culprit == "norm", (res.culprit, [(l.name, l.reason) for l in res.layers])
