"""The Triton statistics kernel compiled here, without a GPU, for the GPUs the tool runs on: NVIDIA sm_90
(H100/H200) and AMD gfx942 (MI300) and gfx90a (MI250), through Triton's own compilers.

Why: the interpreter (test_stats_kernel.py) checks the arithmetic, not what the compiler accepts
(a loop-carried name that changes shape runs in the interpreter and fails to compile for a GPU),
nor the machine code. Compiled here, the vectorised loop's loads are read from the PTX and the AMD
GCN assembly: with the alignment hint the main loop loads 8 or 16 bytes per lane, without it 2
(bf16); bench/bench_stats_kernel.py times both on a GPU (docs/performance.md).
Nothing here runs on an AMD GPU: it shows the kernels compile for one, and how they load.
"""
from __future__ import annotations

import re
from collections import Counter
from typing import Any

import pytest

pytestmark = pytest.mark.triton

triton = pytest.importorskip("triton")

TARGETS = [("cuda", 90, 32), ("hip", "gfx942", 64), ("hip", "gfx90a", 64)]
# vector loads of 8 or 16 bytes; a bf16 lane loading alone is ld.global.b16 / global_load_ushort
VECTOR = re.compile(r"ld\.global(?:\.\w+)*\.v[24]\.\w+|global_load_dwordx[24]|buffer_load_dwordx[24]")
SCALAR16 = re.compile(r"ld\.global(?:\.\w+)*\.b16|global_load_ushort|buffer_load_ushort")
MANY_SIG = {"PC": "*i64", "PR": "*i64", "PE": "*i64", "WORK": "*i64", "OUT": "*fp64",
            "CC": "constexpr", "CR": "constexpr", "CE": "constexpr", "F64": "constexpr",
            "BLOCK": "constexpr", "ALIGNED": "constexpr", "NCOLS": "constexpr"}


def _compile(fn: Any, sig: dict[str, str], const: dict[str, Any], target: tuple[Any, ...], warps: int) -> str:
    from triton.backends import backends
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    backend = "nvidia" if target[0] == "cuda" else "amd"
    if backend not in backends:
        pytest.skip(f"this Triton has no {backend} backend")
    k = triton.compile(ASTSource(fn, sig, const), target=GPUTarget(*target), options={"num_warps": warps})
    return k.asm["ptx"] if target[0] == "cuda" else k.asm["amdgcn"]


def _loads(asm: str) -> Counter:
    return Counter({"vector": len(VECTOR.findall(asm)), "bf16 scalar": len(SCALAR16.findall(asm))})


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: str(t[1]))
def test_aligned_loop_loads_vectors_and_the_plain_loop_does_not(target: tuple[Any, ...]) -> None:
    from pytest_rocm_parity.runner import kernels

    fn = kernels.triton_many_kernel()
    aligned = _loads(_compile(fn, MANY_SIG, kernels.kernel_constants((0, 0, 0), True), target, kernels.MANY_WARPS))
    plain = _loads(_compile(fn, MANY_SIG, kernels.kernel_constants((0, 0, 0), False), target, kernels.MANY_WARPS))
    # the main loop's three inputs load as vectors; only the masked edges (three loads) stay scalar
    assert aligned["vector"] >= 3 and aligned["bf16 scalar"] == 3, aligned
    assert plain["vector"] == 0 and plain["bf16 scalar"] >= 3, plain


@pytest.mark.parametrize("target", TARGETS[1:], ids=lambda t: str(t[1]))
def test_the_statistics_kernel_keeps_its_registers_on_amd(target: tuple[Any, ...]) -> None:
    """No register spills on MI300/MI250 at the shipped shape, float32 and float64 accumulation
    (a spill to scratch memory would cost the bandwidth the vectorised loop buys)."""
    from pytest_rocm_parity.runner import kernels

    for f64, codes in ((False, (0, 0, 0)), (True, (3, 3, 3))):
        const = kernels.kernel_constants(codes, True)
        assert const["F64"] == f64
        asm = _compile(kernels.triton_many_kernel(), MANY_SIG, const, target, kernels.MANY_WARPS)
        spills = [int(x) for x in re.findall(r"\.(?:vgpr|sgpr)_spill_count:\s+(\d+)", asm)]
        assert spills and not any(spills), (f64, spills)


@pytest.mark.parametrize("codes", [(1, 0, 2), (2, 2, 2), (3, 3, 3)], ids=["f16-bf16-f32", "f32", "f64"])
@pytest.mark.parametrize("aligned", [True, False])
def test_every_dtype_combination_compiles_for_sm90(codes: tuple[int, int, int], aligned: bool) -> None:
    from pytest_rocm_parity.runner import kernels

    asm = _compile(kernels.triton_many_kernel(), MANY_SIG, kernels.kernel_constants(codes, aligned), TARGETS[0],
                   kernels.MANY_WARPS)
    assert (_loads(asm)["vector"] >= 3) == aligned
