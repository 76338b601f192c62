"""A port whose forward cuts the autograd graph (a kernel without autograd: a raw Triton/HIP launch,
or a no_grad/detach): the parameters upstream get no gradient, and check_train fails naming them
and, where a selected module's output lost its grad_fn, that module."""
from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from pytest_rocm_parity.golden.store import GoldenStore
from pytest_rocm_parity.judging.assertion import message
from pytest_rocm_parity.judging.records import CheckResult
from pytest_rocm_parity.runner.engine import CheckSpec
from pytest_rocm_parity.runner.train import capture_train, replay_train

WORDS = ("received no gradient on the candidate: the forward detached them — a kernel without autograd (a raw "
         "Triton/HIP launch) or a no_grad/detach in the port")


class Norm(nn.Module):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(1 + 0.1 * torch.randn(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


class Block(nn.Module):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.fc1, self.norm, self.act, self.fc2 = nn.Linear(n, n), Norm(n), nn.GELU(), nn.Linear(n, n)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(self.act(self.norm(self.fc1(x))))


class TwoBlocks(nn.Module):
    """Two blocks and a head; ``cut`` (not a parameter: the golden stays fresh) detaches the first
    block's output in this module's own code, which no selected module's call holds."""

    def __init__(self, n: int = 16) -> None:
        super().__init__()
        self.b0, self.b1, self.head = Block(n), Block(n), nn.Linear(n, 4)
        self.cut = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.b0(x)
        return self.head(self.b1(h.detach() if self.cut else h))


def _model() -> TwoBlocks:
    torch.manual_seed(0)
    return TwoBlocks().eval()


def _without_autograd(mod: nn.Module) -> None:
    """The same values with no grad_fn, as a forward-only kernel launch gives."""
    forward = mod.forward

    def launch(*args: Any) -> Any:
        with torch.no_grad():
            return forward(*args)
    mod.forward = launch  # type: ignore[method-assign]


X = torch.randn(8, 16, generator=torch.Generator().manual_seed(1))
Y = torch.randn(8, 4, generator=torch.Generator().manual_seed(2))


def _loss(out: torch.Tensor) -> torch.Tensor:
    return ((out - Y) ** 2).mean()


def _replay(tmp_path: Any, candidate: nn.Module, sketch: int | None = None) -> CheckResult:
    spec = CheckSpec(name="cut", dtypes=["float32"], sketch=sketch)
    store = GoldenStore(tmp_path)
    capture_train(_model(), X, spec, store, "cpu", loss=_loss)
    assert replay_train(_model(), X, spec, store, "cpu", loss=_loss)[0].passed
    (r,) = replay_train(candidate, X, spec, store, "cpu", loss=_loss)
    return r


@pytest.mark.parametrize("sketch", [None, 64], ids=["full", "sketch"])
def test_a_kernel_without_autograd_is_named_with_the_parameters_it_left_without_gradient(tmp_path, sketch) -> None:  # type: ignore[no-untyped-def]
    """Both blocks' norms run without autograd: the norms and fc1s upstream get no gradient. The check
    fails, names those parameters in words, and blames the norm (the first cut in the backward's
    order), not its block; the parameters' rows fail instead of passing with no ratio."""
    cand = _model()
    _without_autograd(cand.b0.norm)
    _without_autograd(cand.b1.norm)
    r = _replay(tmp_path, cand, sketch)
    rows = {l.name: l for l in r.layers}
    assert not r.passed and r.culprit == "b1.norm", [(l.name, l.reason) for l in r.layers if not l.passed]
    assert set(r.extra["detached"]) == {"b0.norm", "b1.norm"}
    assert {"b0.fc1.weight", "b0.fc1.bias", "b0.norm.weight", "b1.fc1.weight", "b1.norm.weight"} \
        <= set(r.extra["no_gradient"])
    assert not rows["b1.fc1"].passed and "received no gradient on the candidate" in rows["b1.fc1"].reason
    assert "no grad_fn" in rows["b1.norm"].reason and not rows["b1.norm"].passed
    text = message(r)
    assert "culprit: b1.norm" in text and WORDS in text and "b1.fc1.weight" in text, text


def test_a_module_called_on_a_detached_input_is_not_said_uncalled(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The activation after a norm without autograd is called; its output carries no graph because
    its input carries none. Its row says that (not "no call recorded") and it is not blamed."""
    cand = _model()
    _without_autograd(cand.b1.norm)
    r = _replay(tmp_path, cand)
    act = next(l for l in r.layers if l.name == "b1.act")
    assert act.passed and "its input carries none" in act.reason, act.reason
    assert not any("no call recorded" in l.reason for l in r.layers), [(l.name, l.reason) for l in r.layers]
    assert r.culprit == "b1.norm"


def test_a_detach_between_selected_modules_fails_naming_the_parameters(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The model's own code detaches the first block's output: every module's backward is right in
    isolation and the loss is exact, yet b0 trains no more. The check fails naming b0's parameters
    and says the cut lies in code between the selected modules."""
    cand = _model()
    cand.cut = True
    r = _replay(tmp_path, cand)
    assert not r.passed and r.culprit is None
    assert {"b0.fc1.weight", "b0.norm.weight", "b0.fc2.bias"} <= set(r.extra["no_gradient"])
    text = message(r)
    assert WORDS in text and "culprit: none among the selected modules' outputs" in text, text
    assert "in code between the selected modules" in text, text


def _op_without_backward(name: str) -> Any:
    """A torch.library custom op with no registered autograd: its forward builds a graph whose
    backward raises (a port that registered the kernel and not its derivative)."""
    @torch.library.custom_op(f"parity_tests::{name}", mutates_args=())
    def op(x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(x)

    @op.register_fake
    def _(x: torch.Tensor) -> torch.Tensor:
        return torch.empty_like(x)
    return op


def test_an_op_without_a_backward_formula_is_named_at_its_module(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The candidate's b1.act runs a custom op with no backward: the check raises our error naming
    b1.act and the fix, torch's own words kept, where torch's traceback named no module."""
    from pytest_rocm_parity import BackwardError

    op = _op_without_backward("gelu_no_backward")
    cand = _model()
    cand.b1.act.forward = op  # type: ignore[method-assign]
    with pytest.raises(BackwardError) as info:
        _replay(tmp_path, cand)
    text = str(info.value)
    assert text.startswith("the backward raised inside b1.act: its output received its gradient and its input "
                           "did not"), text
    assert "no autograd formula was registered" in text and "torch.library.register_autograd" in text, text


def test_an_op_without_a_backward_between_the_modules_is_placed_outside_them(tmp_path) -> None:  # type: ignore[no-untyped-def]
    op = _op_without_backward("gelu_between_modules")

    class Glue(TwoBlocks):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.b1(op(self.b0(x))))

    from pytest_rocm_parity import BackwardError

    torch.manual_seed(0)
    cand = Glue().eval()
    with pytest.raises(BackwardError, match="the backward raised in code outside the selected modules"):
        _replay(tmp_path, cand)


class _BackwardRaises(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(x)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("the port's backward kernel failed")


def test_a_custom_backward_that_raises_is_named_at_its_module_with_torchs_words(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from pytest_rocm_parity import BackwardError

    cand = _model()
    cand.b1.act.forward = _BackwardRaises.apply  # type: ignore[method-assign]
    with pytest.raises(BackwardError) as info:
        _replay(tmp_path, cand)
    text = str(info.value)
    assert text.startswith("the backward raised inside b1.act"), text
    assert "(RuntimeError: the port's backward kernel failed). Fix: torch's error, in parentheses, says what" in text
