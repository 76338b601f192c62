"""triton_targets: a kernel compiled, as a launch specialises it, for GPUs this machine lacks, by
Triton's own NVIDIA and AMD compilers (nothing here runs on a GPU)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.triton

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")
if os.environ.get("TRITON_INTERPRET") == "1":
    pytest.skip("this module defines kernels at import: run it without TRITON_INTERPRET", allow_module_level=True)
import triton.language as tl  # noqa: E402

from pytest_rocm_parity.errors import InvalidArgument  # noqa: E402
from pytest_rocm_parity.fuzz.triton_targets import (  # noqa: E402
    TritonTargetError, assert_compiles_for, compile_for, launch_signature)
from interpreted import run_interpreted  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@triton.jit
def _ptx_copy(X, Y, N, BLOCK: tl.constexpr):
    """A CUDA-only kernel, as ports meet them: inline PTX, which AMD's assembler cannot read."""
    offs = tl.arange(0, BLOCK)
    m = offs < N
    x = tl.load(X + offs, mask=m)
    y = tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True, pack=1)
    tl.store(Y + offs, y, mask=m)


@triton.jit
def _scale(X, Y, N, factor, OUT_DTYPE: tl.constexpr, BLOCK: tl.constexpr, EVEN: tl.constexpr = False):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < N
    tl.store(Y + offs, (tl.load(X + offs, mask=m) * factor).to(OUT_DTYPE), mask=m)


@triton.autotune(configs=[triton.Config({"BLOCK": 64}), triton.Config({"BLOCK": 256})], key=["N"])
@triton.jit
def _tuned(X, Y, N, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(Y + offs, tl.load(X + offs, mask=offs < N) * 2, mask=offs < N)


def test_an_autotuned_kernel_compiles_one_configuration_at_a_time() -> None:
    x = torch.zeros(300)
    for block in (64, 256):
        builds = assert_compiles_for(_tuned, x, x, 300, BLOCK=block, targets=("gfx942", "sm_90"))
        assert all(b.ok for b in builds)


def test_any_gfx_or_sm_arch_is_a_target() -> None:
    from pytest_rocm_parity.fuzz.triton_targets import resolve_target

    assert resolve_target("gfx1201") == ("hip", "gfx1201", 32, "AMD gfx1201")
    assert resolve_target("gfx908")[2] == 64 and resolve_target("sm_89") == ("cuda", 89, 32, "NVIDIA sm_89")
    (b,) = compile_for(_scale, torch.zeros(4), torch.zeros(4), 4, 2.0, OUT_DTYPE=tl.float32, BLOCK=32,
                       targets=("gfx1201",))
    assert b.ok, b.error


def _local_kernel():  # noqa: ANN202
    @triton.jit
    def nested(X):  # noqa: ANN001, ANN202
        tl.store(X, 1.0)
    return nested


def _rms_args() -> tuple[tuple, dict]:
    x = torch.randn(4, 96)
    w = torch.ones(96)
    y = torch.empty_like(x)
    return (x, w, y, x.stride(0), y.stride(0), 96, 1e-6), {"BLOCK": 64}


def test_a_portable_kernel_compiles_for_nvidia_and_amd_targets() -> None:
    from conftest_examples.triton_kernels import _rms_norm_kernel

    args, kw = _rms_args()
    builds = assert_compiles_for(_rms_norm_kernel, *args, targets=("sm_90", "gfx942", "gfx90a", "gfx950"), **kw)
    assert [b.target for b in builds] == ["sm_90", "gfx942", "gfx90a", "gfx950"] and all(b.ok for b in builds)
    amd = {b.target: b.resources for b in builds if b.target.startswith("gfx")}
    assert all(r["vgprs"] > 0 and r["vgpr_spills"] == 0 for r in amd.values()), amd


def test_inline_ptx_compiles_for_nvidia_and_is_refused_for_amd_with_the_assemblers_words() -> None:
    x, y = torch.zeros(100), torch.zeros(100)
    builds = compile_for(_ptx_copy, x, y, 100, BLOCK=128, targets=("sm_90", "gfx942"))
    assert [b.ok for b in builds] == [True, False]
    assert "invalid instruction" in builds[1].error and "mov.b32" in builds[1].error, builds[1].error
    with pytest.raises(TritonTargetError) as info:
        assert_compiles_for(_ptx_copy, x, y, 100, BLOCK=128, targets=("sm_90", "gfx942"))
    text = str(info.value)
    assert "_ptx_copy does not compile for gfx942 (AMD MI300X" in text and "it does for sm_90" in text
    assert "inline assembly" in text          # the fix names the construct


def test_a_kernel_no_target_builds_gets_the_compilers_cause_and_no_amd_advice() -> None:
    """BLOCK=300 fails on every GPU (tl.arange needs a power of 2): the error keeps the cause and the
    offending line, and the fix does not blame AMD's wavefronts."""
    x = torch.zeros(300)
    builds = compile_for(_scale, x, x, 300, 2.0, OUT_DTYPE=tl.float32, BLOCK=300, targets=("gfx942", "sm_90"))
    for b in builds:
        assert not b.ok and "power of 2" in b.error and "tl.arange(0, BLOCK)" in b.error, b.error
        assert "in _scale at 2:" in b.error and len(b.error) <= 700, b.error
    with pytest.raises(TritonTargetError) as info:
        assert_compiles_for(_scale, x, x, 300, 2.0, OUT_DTYPE=tl.float32, BLOCK=300, targets=("gfx942", "sm_90"))
    text = str(info.value)
    assert "does not compile for any target" in text and "power of 2" in text, text
    assert "wavefront" not in text and "num_warps" not in text, text


def launch_scale(x: "torch.Tensor") -> "torch.Tensor":
    """A host wrapper, as users write them around their kernels."""
    y = torch.empty_like(x)
    _scale[(1,)](x, y, x.numel(), 2.0, OUT_DTYPE=tl.float32, BLOCK=64)
    return y


def call_launch_scale(x: "torch.Tensor") -> "torch.Tensor":
    return launch_scale(x)


@pytest.mark.parametrize("wrapper", [launch_scale, call_launch_scale])
def test_a_wrapper_passed_for_its_kernel_is_refused_naming_the_kernel(wrapper) -> None:  # noqa: ANN001
    with pytest.raises(InvalidArgument) as info:
        assert_compiles_for(wrapper, torch.zeros(8), targets=("gfx942",))
    text = str(info.value)
    assert f"{wrapper.__name__} is not a @triton.jit kernel" in text, text
    assert "launches tests.fuzz.test_triton_targets._scale" in text or "launches test_triton_targets._scale" in text
    assert "assert_compiles_for(_scale," in text and "wavefront" not in text, text


def double_on_host(x: "torch.Tensor") -> "torch.Tensor":
    return torch.mul(x, 2)


def test_a_host_function_that_launches_nothing_is_refused_naming_what_it_calls() -> None:
    with pytest.raises(InvalidArgument) as info:
        compile_for(double_on_host, torch.zeros(8), targets=("gfx942",))
    text = str(info.value)
    assert "double_on_host is not a @triton.jit kernel: it calls torch.mul" in text, text
    assert "kernel[grid](...)" in text, text


def test_a_launch_maps_to_tritons_signature() -> None:
    x = torch.zeros(8, dtype=torch.bfloat16)
    y = torch.zeros(8, dtype=torch.int64)
    sig, const = launch_signature(_scale, (x, y, 2**40, 0.5), {"OUT_DTYPE": tl.float16, "BLOCK": 32})
    assert sig == {"X": "*bf16", "Y": "*i64", "N": "i64", "factor": "fp32", "OUT_DTYPE": "constexpr",
                   "BLOCK": "constexpr", "EVEN": "constexpr"}
    assert const == {"OUT_DTYPE": {"tl_dtype": "fp16"}, "BLOCK": 32, "EVEN": False}
    sig, _ = launch_signature(_scale, (x, None, 7, True), {"OUT_DTYPE": tl.float32, "BLOCK": 32})
    assert sig["Y"] == "constexpr" and sig["N"] == "i32" and sig["factor"] == "i1"
    import numpy as np

    sig, _ = launch_signature(_scale, (x, x, np.int64(7), np.float32(0.5)), {"OUT_DTYPE": tl.float32, "BLOCK": 32})
    assert sig["N"] == "i32" and sig["factor"] == "fp32"
    assert launch_signature(_scale, (x, x, 1, np.bool_(True)), {"OUT_DTYPE": tl.float32, "BLOCK": 32})[0]["factor"] == "i1"
    # and the dtype constexpr reaches the compiler
    (b,) = compile_for(_scale, x, x, 7, 0.5, OUT_DTYPE=tl.float16, BLOCK=32, targets=("gfx942",))
    assert b.ok, b.error


@pytest.mark.parametrize("call, words", [
    (lambda: launch_signature(_scale, ([1, 2], None, 1, 1.0), {"OUT_DTYPE": tl.float32, "BLOCK": 8}), "argument X"),
    (lambda: launch_signature(_scale, (torch.zeros(2),), {}), "arguments do not match _scale"),
    (lambda: launch_signature(_scale, (torch.zeros(2, dtype=torch.complex64), None, 1, 1.0),
                              {"OUT_DTYPE": tl.float32, "BLOCK": 8}), "complex64"),
    (lambda: compile_for(_scale, torch.zeros(2), None, 1, 1.0, OUT_DTYPE=tl.float32, BLOCK=8, targets=("mi300",)),
     "target 'mi300': unknown"),
    (lambda: launch_signature(torch.nn.ReLU(), (1,), {}), "expected a @triton.jit function"),
    (lambda: compile_for(_local_kernel(), torch.zeros(1), targets=("gfx942",)), "top level of a module"),
])
def test_bad_launches_say_which_argument_and_what_to_pass(call, words) -> None:
    with pytest.raises(InvalidArgument) as info:
        call()
    assert words in str(info.value), str(info.value)


def test_kernels_decorated_in_interpreter_mode_compile_too(tmp_path: Path) -> None:
    """CI runs Triton kernels in the interpreter (TRITON_INTERPRET=1, no GPU), where triton.jit makes
    interpreted functions; the compile must still see the kernel and the device functions it calls."""
    # as conftest_examples/test_triton_fuzz.py does without a GPU: the module turns the interpreter on
    (tmp_path / "kern_with_helper.py").write_text(textwrap.dedent('''
        import os
        os.environ.setdefault("TRITON_INTERPRET", "1")
        import triton
        import triton.language as tl

        @triton.jit
        def _square(x):
            return x * x

        @triton.jit
        def squares(X, Y, N, BLOCK: tl.constexpr):
            offs = tl.arange(0, BLOCK)
            m = offs < N
            tl.store(Y + offs, _square(tl.load(X + offs, mask=m)), mask=m)
    '''))
    script = textwrap.dedent('''
        import json, sys, torch
        sys.path.insert(0, sys.argv[1])
        from conftest_examples.triton_kernels import _rms_norm_kernel
        from kern_with_helper import squares
        from pytest_rocm_parity.fuzz.triton_targets import compile_for
        assert type(_rms_norm_kernel).__name__ == type(squares).__name__ == "InterpretedFunction"
        x = torch.randn(2, 40); y = torch.empty_like(x)
        b = compile_for(_rms_norm_kernel, x, torch.ones(40), y, 40, 40, 40, 1e-6, BLOCK=32, targets=("gfx942",))
        b += compile_for(squares, x, y, 80, BLOCK=128, targets=("gfx942", "sm_90"))
        print(json.dumps([[r.ok, r.error[:300]] for r in b]))
    ''')
    got = run_interpreted(script, str(tmp_path), cwd=ROOT, timeout=600)
    assert [ok for ok, _ in got] == [True, True, True], got


def test_a_script_that_compiles_at_its_top_level_is_told_to_guard_it(tmp_path: Path) -> None:
    """The worker runs a script to find its kernel; a script whose top level compiles would start a
    worker per level. The first worker refuses, and the error says how to guard the script."""
    script = tmp_path / "compile_me.py"
    script.write_text(textwrap.dedent('''
        import torch
        import triton
        import triton.language as tl
        from pytest_rocm_parity.fuzz.triton_targets import compile_for

        @triton.jit
        def double(X, Y, N, BLOCK: tl.constexpr):
            offs = tl.arange(0, BLOCK)
            tl.store(Y + offs, tl.load(X + offs, mask=offs < N) * 2, mask=offs < N)

        x = torch.randn(8)
        compile_for(double, x, torch.empty_like(x), 8, BLOCK=8, targets=("gfx942",))
    '''))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    p = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode != 0
    assert "TritonTargetError" in p.stderr and 'if __name__ == "__main__":' in p.stderr, p.stderr[-2000:]


def test_a_long_compiler_message_keeps_its_head_and_its_cause() -> None:
    """The error is one bounded line: past the bound the middle goes, since the cause comes last."""
    from pytest_rocm_parity.fuzz.triton_targets import _MESSAGE_CHARS, _compiler_message

    text = _compiler_message(RuntimeError("head " + "x" * 5000 + " the cause"))
    assert len(text) <= _MESSAGE_CHARS and text.startswith("RuntimeError: head") and text.endswith("the cause")
