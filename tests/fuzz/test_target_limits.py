"""What a GPU refuses only when a compiled kernel is loaded, checked at cross-compilation: the
threads of a block (num_warps x the target's warp) and the shared memory (LDS) a block takes."""
from __future__ import annotations

import os

import pytest

pytestmark = pytest.mark.triton

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")
if os.environ.get("TRITON_INTERPRET") == "1":
    pytest.skip("this module defines kernels at import: run it without TRITON_INTERPRET", allow_module_level=True)
import triton.language as tl  # noqa: E402

from pytest_rocm_parity.fuzz.triton_targets import (  # noqa: E402
    TritonTargetError, assert_compiles_for, compile_for)


@triton.jit
def _row_softmax(X, Y, N, BLOCK: tl.constexpr):
    """One row per program, as a port's softmax is written: launched with many warps on NVIDIA."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(X + row * N + cols, mask=cols < N, other=-float("inf")).to(tl.float32)
    e = tl.exp(x - tl.max(x, axis=0))
    tl.store(Y + row * N + cols, (e / tl.sum(e, axis=0)).to(Y.dtype.element_ty), mask=cols < N)


def _softmax_launch() -> tuple[tuple, dict]:
    x = torch.randn(8, 2048, dtype=torch.bfloat16)
    return (x, torch.empty_like(x), 2048), {"BLOCK": 2048}


def test_num_warps_over_a_wave64_block_fails_naming_the_wavefront_and_the_fix() -> None:
    """num_warps=32 is 1024 threads on NVIDIA (and RDNA's wave32) but 2048 on CDNA's 64-lane
    wavefronts; Triton compiles it, and only loading it on the GPU would refuse."""
    args, kw = _softmax_launch()
    builds = compile_for(_row_softmax, *args, targets=("sm_90", "gfx942", "gfx90a", "gfx1100"), num_warps=32, **kw)
    assert [(b.target, b.ok) for b in builds] == [("sm_90", True), ("gfx942", False), ("gfx90a", False),
                                                   ("gfx1100", True)], builds
    assert ("num_warps=32 makes 2048 threads per block on gfx942 (AMD MI300X/MI300A/MI325X), whose wavefront is "
            "64 lanes") in builds[1].error and "num_warps <= 16 for gfx942" in builds[1].error, builds[1].error
    with pytest.raises(TritonTargetError) as info:
        assert_compiles_for(_row_softmax, *args, targets=("sm_90", "gfx942", "gfx90a"), num_warps=32, **kw)
    text = str(info.value)
    assert "does not compile for gfx942" in text and "it does for sm_90" in text, text
    assert "Fix: lower num_warps (<= 16 for gfx942, gfx90a)" in text, text
    assert all(b.ok for b in assert_compiles_for(_row_softmax, *args, targets=("gfx942", "gfx90a"), num_warps=16, **kw))


def test_num_warps_over_1024_threads_fails_on_nvidia_too() -> None:
    args, kw = _softmax_launch()
    (b,) = compile_for(_row_softmax, *args, targets=("sm_90",), num_warps=64, **kw)
    assert not b.ok and "2048 threads per block on sm_90" in b.error and "num_warps <= 32 for sm_90" in b.error
