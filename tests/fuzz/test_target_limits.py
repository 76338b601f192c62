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


@triton.jit
def _mm(A, B, C, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """A plain tiled matmul: Triton stages its tiles through LDS, allocated dynamically."""
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    for k in range(0, K, BK):
        a = tl.load(A + rm[:, None] * K + (k + rk)[None, :])
        b = tl.load(B + (k + rk)[:, None] * N + rn[None, :])
        acc += tl.dot(a, b)
    tl.store(C + rm[:, None] * N + rn[None, :], acc.to(C.dtype.element_ty))


def _mm_launch(**tiles: int) -> tuple[tuple, dict]:
    a = torch.randn(512, 512, dtype=torch.bfloat16)
    return (a, a, torch.empty_like(a), 512, 512, 512), tiles


def test_lds_is_the_shared_memory_triton_allocates_not_the_static_segment() -> None:
    """Triton's kernels take their LDS dynamically (metadata.shared); the code object's static
    group_segment_fixed_size is 0 for them, and reporting it said every matmul used no LDS."""
    args, kw = _mm_launch(BM=64, BN=64, BK=32)
    builds = assert_compiles_for(_mm, *args, targets=("gfx942", "gfx90a", "sm_90"), num_stages=2, **kw)
    assert [b.ok for b in builds] == [True, True, True]
    assert builds[0].resources["lds_bytes"] >= 4096 and builds[1].resources["lds_bytes"] >= 4096, builds
    assert builds[2].resources["shared_bytes"] > 0, builds


def test_a_block_over_the_targets_lds_fails_there_and_compiles_where_it_fits() -> None:
    """A 256x256 bf16 tile of B is 128 KiB of LDS on gfx942, which has 64 KiB; a 128x256 one fits it
    exactly, and takes 144 KiB on gfx950, within that GPU's 160 KiB."""
    args, kw = _mm_launch(BM=16, BN=256, BK=256)
    (b,) = compile_for(_mm, *args, targets=("gfx942",), num_stages=2, **kw)
    used = b.resources["lds_bytes"]
    assert not b.ok and used == 256 * 256 * 2, b
    assert (f"the kernel takes {used} bytes of LDS per block on gfx942 (AMD MI300X/MI300A/MI325X), which has 65536 "
            f"(64 KiB)") in b.error and "Lower num_stages" in b.error, b.error
    with pytest.raises(TritonTargetError, match=r"Fix: lower num_stages or the tile sizes for gfx942"):
        assert_compiles_for(_mm, *args, targets=("gfx942",), num_stages=2, **kw)
    args, kw = _mm_launch(BM=16, BN=128, BK=256)
    fits = compile_for(_mm, *args, targets=("gfx942", "gfx950"), num_stages=2, **kw)
    assert [b.ok for b in fits] == [True, True], fits
    assert fits[0].resources["lds_bytes"] == 65536 and 65536 < fits[1].resources["lds_bytes"] <= 160 * 1024, fits


def test_register_spills_are_a_note_and_a_warning_not_a_failure() -> None:
    """The trial's 256x256x128 tile at 8 warps spills hundreds of VGPRs on gfx942: it compiles and
    runs, slower, so the build passes and says so."""
    args, kw = _mm_launch(BM=256, BN=256, BK=128)
    with pytest.warns(Warning) as caught:
        (b,) = assert_compiles_for(_mm, *args, targets=("gfx942",), num_warps=8, num_stages=2, **kw)
    assert b.ok and b.resources["vgpr_spills"] > 0
    assert len(b.notes) == 1 and f"{b.resources['vgpr_spills']} VGPRs" in b.notes[0] and "spill" in b.notes[0]
    said = [str(w.message) for w in caught if type(w.message).__name__ == "TargetResourceWarning"]
    assert said and said[0].startswith("_mm on gfx942 (AMD MI300X/MI300A/MI325X): "), said
