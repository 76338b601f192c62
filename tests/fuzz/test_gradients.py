"""Gradient fuzzing: a wrapper that returns dx from torch.autograd.grad is compared like any operator,
judged against the magnitude of the backward's terms, and recorded into goldens with the same policy."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings

from pytest_rocm_parity.errors import InvalidArgument
from pytest_rocm_parity.fuzz import strategies as S
from pytest_rocm_parity.fuzz.harness import ErrorModel, check_op, load_golden, record_golden, replay_golden


class _RMSNormFn(torch.autograd.Function):
    """A hand-written RMSNorm backward, as a port rewrites one; ``constant_rstd`` is the bug of treating
    rstd as a constant (dropping the projection term)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor | None, eps: float, constant_rstd: bool) -> torch.Tensor:
        h = x.float()
        rstd = torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, w, rstd)
        ctx.constant_rstd = constant_rstd
        y = h * rstd
        return (y if w is None else y * w.float()).to(x.dtype)

    @staticmethod
    def backward(ctx: Any, gy: torch.Tensor) -> tuple[Any, ...]:
        x, w, rstd = ctx.saved_tensors
        gw = gy.float() if w is None else gy.float() * w.float()
        xhat = x.float() * rstd
        dx = rstd * gw if ctx.constant_rstd else rstd * (gw - xhat * (gw * xhat).mean(-1, keepdim=True))
        return dx.to(x.dtype), None, None, None


def _cotangent(y: torch.Tensor) -> torch.Tensor:
    """A fixed upstream gradient, the same for candidate and reference: -1 to 1 over the output."""
    return torch.linspace(-1.0, 1.0, y.numel(), dtype=torch.float64).reshape(y.shape).to(y.dtype)


def _dx(forward: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """dL/dx of ``forward`` for the fixed cotangent; no torch.enable_grad(): the harness turns grad on."""
    def dx(x: torch.Tensor, shape: tuple[int, ...], w: torch.Tensor | None, eps: float) -> torch.Tensor:
        x = x.detach().requires_grad_(True)
        y = forward(x, shape, w, eps)
        (grad,) = torch.autograd.grad(y, x, _cotangent(y))
        return grad
    return dx


rms_norm_dx = _dx(F.rms_norm)
custom_dx = _dx(lambda x, shape, w, eps: _RMSNormFn.apply(x, w, eps, False))
custom_dx_constant_rstd = _dx(lambda x, shape, w, eps: _RMSNormFn.apply(x, w, eps, True))


def rms_norm_dx_magnitude(x: torch.Tensor, shape: tuple[int, ...], w: torch.Tensor | None, eps: float) -> torch.Tensor:
    """The terms behind dx = rstd * (g*w - xhat * mean(g*w*xhat)), each in absolute value."""
    rstd = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    gw = _cotangent(x).abs() if w is None else (_cotangent(x) * w).abs()
    xhat = (x * rstd).abs()
    return rstd * (gw + xhat * (gw * xhat).mean(-1, keepdim=True))


POLICY = ErrorModel(magnitude=rms_norm_dx_magnitude)


def test_a_gradient_wrapper_runs_without_enable_grad_even_under_no_grad() -> None:
    """The harness turns grad mode on around both functions, so a wrapper calling torch.autograd.grad works
    as written, also from a test that runs under torch.no_grad()."""
    x = torch.randn(3, 40, generator=torch.Generator().manual_seed(0))
    w = torch.rand(40, generator=torch.Generator().manual_seed(1)) + 0.5
    assert check_op(custom_dx, rms_norm_dx, x, (40,), w, 1e-6, device="cpu", dtype_policy=POLICY).passed
    with torch.no_grad():
        result = check_op(custom_dx_constant_rstd, rms_norm_dx, x, (40,), w, 1e-6, device="cpu", dtype_policy=POLICY)
    assert result.error is None and not result.passed, result.summary()


def test_a_correct_backward_needs_the_magnitude_of_its_terms_where_dx_cancels() -> None:
    """For a constant row dx is the difference of two equal terms, about zero: judged against the truth
    itself, a correct backward's rounding of those terms fails; judged against the terms, it passes."""
    x = torch.full((2, 2, 3), 4.165829655317709e16).bfloat16()
    w = torch.ones(3).bfloat16()
    assert not check_op(custom_dx, rms_norm_dx, x, (3,), w, 1e-6, device="cpu").passed
    assert check_op(custom_dx, rms_norm_dx, x, (3,), w, 1e-6, device="cpu", dtype_policy=POLICY).passed


def test_gradient_fuzzing_passes_a_correct_backward_and_finds_a_wrong_one() -> None:
    """Over the RMSNorm draws in three dtypes, the hand-written backward passes against autograd's, and the
    one that treats rstd as a constant fails."""
    wrong: list[bool] = []

    @settings(max_examples=40, derandomize=True, database=None, deadline=None)
    @given(S.rms_norm_args(S.dtypes(), max_side=64, long_side=None))
    def search(case: S.OpArgs) -> None:
        result = check_op(custom_dx, rms_norm_dx, case, device="cpu", dtype_policy=POLICY)
        assert result.passed, result.message()
        wrong.append(not check_op(custom_dx_constant_rstd, rms_norm_dx, case, device="cpu",
                                  dtype_policy=POLICY).passed)

    search()
    assert sum(wrong) >= 10, f"the constant-rstd backward failed {sum(wrong)} of {len(wrong)} examples"


def test_record_golden_takes_the_policy_the_checks_take(tmp_path: Path) -> None:
    """The golden stores the term magnitudes the policy's magnitude gives, so a replay judges the
    backward as compare_op does: the correct one passes every example, the wrong one fails."""
    path = tmp_path / "rms-dx-bf16"
    record_golden(path, rms_norm_dx, rms_norm_dx, S.rms_norm_args(torch.bfloat16, max_side=32, long_side=None),
                  max_examples=15, seed=0, device="cpu", dtype_policy=POLICY)
    assert all(r.passed for r in replay_golden(path, custom_dx, device="cpu"))
    assert not all(r.passed for r in replay_golden(path, custom_dx_constant_rstd, device="cpu"))
    example = load_golden(path).examples[0]
    expected = rms_norm_dx_magnitude(*(a.double() if isinstance(a, torch.Tensor) else a for a in example.args))
    assert torch.allclose(example.scale, expected)
    with pytest.raises(InvalidArgument, match="must be an ErrorModel"):
        record_golden(tmp_path / "other", rms_norm_dx, rms_norm_dx, S.rms_norm_args(torch.bfloat16), max_examples=1,
                      device="cpu", dtype_policy="strict")  # type: ignore[arg-type]
