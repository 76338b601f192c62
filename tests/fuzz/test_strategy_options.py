"""Options of the op strategies that a port's kernels need: rotary head dims and Hugging Face's
cos/sin layout, a softmax held to its last dimension, an RMSNorm weight kept contiguous."""
from __future__ import annotations

import pytest
import torch
from hypothesis import Phase, find, given, settings

from pytest_rocm_parity.errors import InvalidArgument
from pytest_rocm_parity.fuzz import strategies as S
from pytest_rocm_parity.fuzz.harness import check_op

FAST = settings(max_examples=40, derandomize=True, database=None, deadline=None)
# find() without shrinking: the tests ask whether a strategy draws a case, not for its smallest one
QUICK = settings(max_examples=300, derandomize=True, database=None, deadline=None, phases=[Phase.generate])


@pytest.mark.parametrize("d", [128, 96])
def test_rotary_args_draws_llamas_head_dim_and_a_non_power_of_two(d: int) -> None:
    case = find(S.rotary_args(torch.float32), lambda c: c.args[0].shape[-1] == d, settings=QUICK)
    x, cos, sin = case.args
    assert cos.shape == sin.shape == (x.shape[2], d)
    assert x.numel() <= 2 * 3 * 40 * 64     # a larger head takes fewer positions, not more elements


def test_rotary_args_takes_the_head_dims_to_draw() -> None:
    @FAST
    @given(S.rotary_args(torch.float32, head_dims=(80,)))
    def only_80(case: S.OpArgs) -> None:
        assert case.args[0].shape[-1] == 80 == case.args[1].shape[-1]

    only_80()
    for bad in ((), (7,), (0, 8)):
        with pytest.raises(InvalidArgument, match="give even head dims"):
            find(S.rotary_args(torch.float32, head_dims=bad), lambda c: True, settings=QUICK)


def hf_apply_rotary_pos_emb(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """transformers' apply_rotary_pos_emb (unsqueeze_dim=1) for one tensor, as written there."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return x * cos + S.rotate_half(x) * sin


def first_sequence_positions(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """A kernel that reads one (T, D) table for the whole batch: right for a shared table only."""
    return S.apply_rotary(x, cos[0], sin[0])


def test_rotary_args_batched_gives_cos_sin_as_hugging_face_passes_them() -> None:
    @FAST
    @given(S.rotary_args(torch.float32, cos_layout="batched"))
    def batched(case: S.OpArgs) -> None:
        x, cos, sin = case.args
        b, _, t, d = x.shape
        assert cos.shape == sin.shape == (b, t, d)
        assert torch.equal(S.apply_rotary(x, cos, sin), hf_apply_rotary_pos_emb(x, cos, sin))
        assert check_op(S.apply_rotary, hf_apply_rotary_pos_emb, case, device="cpu").passed

    batched()
    # each sequence at its own positions: a kernel that takes the first sequence's for all is found
    case = find(S.rotary_args(torch.float32, cos_layout="batched"),
                lambda c: not check_op(first_sequence_positions, S.apply_rotary, c, device="cpu").passed,
                settings=QUICK)
    assert case.args[0].shape[0] == 2
    with pytest.raises(InvalidArgument, match=r"cos_layout='hf'\): choose from \('table', 'batched'\)"):
        find(S.rotary_args(torch.float32, cos_layout="hf"), lambda c: True, settings=QUICK)


@FAST
@given(S.softmax_args(torch.float32, dim=-1))
def test_softmax_args_can_hold_the_reduction_to_the_last_dimension(case: S.OpArgs) -> None:
    assert case.kwargs["dim"] == -1 and case.reduction_length == case.args[0].shape[-1]


def test_softmax_args_draws_other_dimensions_by_default_and_refuses_another_fixed_one() -> None:
    assert find(S.softmax_args(torch.float32), lambda c: c.kwargs["dim"] != -1, settings=QUICK).kwargs["dim"] < -1
    with pytest.raises(InvalidArgument, match=r"softmax_args\(dim=0\) must be -1"):
        find(S.softmax_args(torch.float32, dim=0), lambda c: True, settings=QUICK)


@FAST
@given(S.rms_norm_args(torch.float32, affine=True, layouts=("strided", "offset"), weight_layouts=("contiguous",)))
def test_rms_norm_args_keeps_the_weight_contiguous_whatever_x_is(case: S.OpArgs) -> None:
    x, _, w, _ = case.args
    assert x.stride(-1) in (2, 3) or x.storage_offset() > 0      # a strided or offset view
    assert w.stride() == (1,) and w.storage_offset() == 0


def test_rms_norm_args_layouts_alone_still_apply_to_the_weight() -> None:
    case = find(S.rms_norm_args(torch.float32, affine=True, layouts=("strided",)), lambda c: True, settings=QUICK)
    assert case.args[2].stride(-1) in (2, 3)
    with pytest.raises(InvalidArgument, match="unknown"):
        find(S.rms_norm_args(torch.float32, affine=True, weight_layouts=("sparse",)), lambda c: True, settings=QUICK)


def test_every_default_caller_draws_as_before() -> None:
    """The options default to the old draws: a table of (T, D), a softmax over any dim, one layout list."""
    @FAST
    @given(S.rotary_args(), S.softmax_args(), S.rms_norm_args(affine=True, layouts=("contiguous",)))
    def defaults(rot: S.OpArgs, soft: S.OpArgs, rms: S.OpArgs) -> None:
        assert rot.args[1].dim() == 2 and "dim" in soft.kwargs and rms.args[2].is_contiguous()

    defaults()
