"""Proof that the fuzzer finds real kernel bugs and shrinks them to a minimal case.

Each planted bug mimics a classic hand-written-kernel mistake in plain torch (so it
runs fast on CPU); its corrected twin must pass the same search.  Assertions are
on the shrunk example that Hypothesis replays last, and on how many examples it
took to find the first failure.
"""
from __future__ import annotations

import math
import os

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from pytest_rocm_parity.fuzz import strategies as S
from pytest_rocm_parity.fuzz.harness import check_op

BLOCK = 32
FIND_WITHIN = 150  # examples allowed before the first failure


# --------------------------------------------------------------------------- implementations


def rms_norm_tail_bug(x, shape, w, eps):
    """Multi-tile path forgets the tail tile when N % BLOCK != 0 (rows <= BLOCK take a masked path)."""
    n = x.shape[-1]
    xf = x.float()
    wf = _weight(w, n)
    if n <= BLOCK:
        ss = (xf * xf).sum(-1, keepdim=True)
        return (xf * torch.rsqrt(ss / n + eps) * wf).to(x.dtype)
    full = n // BLOCK * BLOCK
    ss = (xf[..., :full] ** 2).sum(-1, keepdim=True)
    out = torch.zeros_like(xf)
    out[..., :full] = xf[..., :full] * torch.rsqrt(ss / n + eps) * wf[:full]
    return out.to(x.dtype)


def rms_norm_tiled(x, shape, w, eps):
    """The fixed kernel: the tail tile is masked, never dropped."""
    n = x.shape[-1]
    xf = x.float()
    ss = torch.zeros(xf.shape[:-1] + (1,), dtype=torch.float32)
    for start in range(0, n, BLOCK):
        ss += (xf[..., start:start + BLOCK] ** 2).sum(-1, keepdim=True)
    return (xf * torch.rsqrt(ss / n + eps) * _weight(w, n)).to(x.dtype)


def _weight(w: torch.Tensor | None, n: int) -> torch.Tensor:
    """The weight in float32; ones where the call has none (``rms_norm_args`` draws weight=None too)."""
    return torch.ones(n) if w is None else w.float()


def softmax_without_max(x, dim=-1):
    """Skips the max subtraction: exp(x) overflows float16 once x > ln(65504) = 11.09."""
    e = torch.exp(x.float()).to(x.dtype).float()  # the kernel keeps exp(x) in the storage dtype
    return (e / e.sum(dim, keepdim=True)).to(x.dtype)


def softmax_max_subtracted(x, dim=-1):
    """The fixed kernel: exp(x - max) is at most 1."""
    xf = x.float()
    e = torch.exp(xf - xf.amax(dim, keepdim=True))
    return (e / e.sum(dim, keepdim=True)).to(x.dtype)


def softmax_assumes_contiguous(x, dim=-1):
    """Reads the storage as if the tensor were contiguous (a raw data_ptr kernel given a view)."""
    contiguous_strides = torch.empty(x.shape).stride()
    raw = torch.as_strided(x, x.shape, contiguous_strides, x.storage_offset())
    return torch.softmax(raw.float(), dim=dim).to(x.dtype)


def softmax_stride_aware(x, dim=-1):
    """The fixed kernel: honour the strides (here by making the input contiguous first)."""
    return torch.softmax(x.contiguous().float(), dim=dim).to(x.dtype)


def softmax_pads_with_zero(x, dim=-1):
    """Pads each row to a power-of-two block with 0 instead of -inf, so exp(0 - max) joins the sum."""
    xf = x.float().movedim(dim, -1)
    n = xf.shape[-1]
    block = 1 << (n - 1).bit_length()
    padded = torch.cat([xf, xf.new_zeros(*xf.shape[:-1], block - n)], dim=-1)
    e = torch.exp(padded - padded.amax(-1, keepdim=True))
    return (e[..., :n] / e.sum(-1, keepdim=True)).movedim(-1, dim).to(x.dtype)


# --------------------------------------------------------------------------- search harness


def hunt(strategy, candidate, reference, *, max_examples=FIND_WITHIN):
    """Run a derandomized search; return (examples until first failure, shrunk failing case) or (n, None)."""
    failures: list = []
    calls = {"n": 0, "first": None}

    @settings(max_examples=max_examples, derandomize=True, database=None, deadline=None,
              phases=[Phase.generate, Phase.shrink], suppress_health_check=[HealthCheck.too_slow])
    @given(strategy)
    def search(case):
        calls["n"] += 1
        result = check_op(candidate, reference, case, device="cpu")
        if not result.passed:
            if calls["first"] is None:
                calls["first"] = calls["n"]
            failures.append(case)
            raise AssertionError(result.message())

    try:
        search()
    except AssertionError as exc:
        assert "Reproduce:" in str(exc) and "Inputs:" in str(exc)
        return calls["first"], failures[-1]  # Hypothesis replays the minimal example last
    return calls["n"], None


def rms_cases(dtype, **kwargs):
    return S.rms_norm_args(st.just(dtype), max_side=80, **kwargs)


# --------------------------------------------------------------------------- tail block


def test_tail_block_bug_is_found_and_shrunk_to_block_plus_one():
    found_after, case = hunt(rms_cases(torch.float32), rms_norm_tail_bug, F.rms_norm)
    assert case is not None, "the tail-block bug was not found"
    assert found_after <= FIND_WITHIN
    x = case.args[0]
    # minimal: one row of BLOCK + 1 elements, the smallest N that takes the multi-tile path with a tail
    assert x.numel() == BLOCK + 1, x.shape
    assert x.shape[-1] == BLOCK + 1


def test_tiled_rms_norm_with_masked_tail_passes():
    _, case = hunt(rms_cases(torch.float32), rms_norm_tiled, F.rms_norm, max_examples=60)
    assert case is None, case


# --------------------------------------------------------------------------- overflow


def test_overflow_bug_is_found_and_shrunk_to_one_large_element():
    found_after, case = hunt(S.softmax_args(st.just(torch.float16), max_side=40), softmax_without_max,
                             torch.softmax)
    assert case is not None, "the float16 overflow was not found"
    assert found_after <= FIND_WITHIN
    x = case.args[0]
    assert x.numel() == 1, x.shape  # one element: softmax is exactly 1 unless exp(x) overflows
    assert float(x.flatten()[0]) > math.log(65504.0), x


def test_max_subtracted_softmax_passes_with_large_inputs():
    _, case = hunt(S.softmax_args(st.just(torch.float16), max_side=40), softmax_max_subtracted, torch.softmax,
                   max_examples=60)
    assert case is None, case


def test_padding_bug_is_shrunk_to_the_smallest_padded_size():
    """3 is the smallest row a power-of-two block pads; the search may first fail at a block boundary (15)."""
    found_after, case = hunt(S.softmax_args(st.just(torch.float32), max_side=80), softmax_pads_with_zero,
                             torch.softmax)
    assert case is not None, "the padding bug was not found"
    assert found_after <= FIND_WITHIN
    x = case.args[0]
    assert x.numel() == 3 and x.shape[case.kwargs["dim"]] == 3, x.shape


# --------------------------------------------------------------------------- non-contiguous


def test_stride_bug_is_found_and_shrunk_to_two_element_view():
    found_after, case = hunt(S.softmax_args(st.just(torch.float32), max_side=40), softmax_assumes_contiguous,
                             torch.softmax)
    assert case is not None, "the stride bug was not found"
    assert found_after <= FIND_WITHIN
    x = case.args[0]
    assert not x.is_contiguous()
    assert x.numel() == 2, (x.shape, x.stride())


def test_stride_aware_softmax_passes():
    _, case = hunt(S.softmax_args(st.just(torch.float32), max_side=40), softmax_stride_aware, torch.softmax,
                   max_examples=60)
    assert case is None, case


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("ROCM_PARITY_SOAK"), reason="soak test: set ROCM_PARITY_SOAK=1 to run")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_soak_correct_kernels(dtype):
    """Long run: the fixed kernels survive many more examples in every dtype."""
    _, case = hunt(S.rms_norm_args(st.just(dtype), max_side=300), rms_norm_tiled, F.rms_norm, max_examples=1000)
    assert case is None, case
    _, case = hunt(S.softmax_args(st.just(dtype)), softmax_max_subtracted, torch.softmax, max_examples=1000)
    assert case is None, case
