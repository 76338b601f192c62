"""The failure message's "Reproduce:" script runs as pasted in a fresh interpreter and raises the same failure."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from pytest_rocm_parity.fuzz import strategies as S
from pytest_rocm_parity.fuzz.harness import check_op, compare_op, record_golden, replay_golden
from pytest_rocm_parity.fuzz.strategies import OpArgs

KERNELS = '''
import torch


def softmax(x, dim=-1):
    """Pads each row to a power-of-two block with 0 instead of -inf."""
    xf = x.float().movedim(dim, -1)
    n = xf.shape[-1]
    block = 1 << (n - 1).bit_length()
    padded = torch.cat([xf, xf.new_zeros(*xf.shape[:-1], block - n)], dim=-1)
    e = torch.exp(padded - padded.amax(-1, keepdim=True))
    return (e[..., :n] / e.sum(-1, keepdim=True)).movedim(-1, dim).to(x.dtype)


def matmul(a, b):
    """Drops the last term of each dot product (a tail block never loaded)."""
    return (a[:, :-1].float() @ b[:-1, :].float()).to(a.dtype)


def drifting(x):
    """A relative error of n^2/1e9 (an accumulation that drifts with the length): fails from n ~ 50."""
    return x * (1 + 1e-9 * x.numel() ** 2)
'''


@pytest.fixture
def kernels(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A user's kernel module, ``fuzzkern.ops``, importable from ``tmp_path`` (the project root)."""
    package = tmp_path / "fuzzkern"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "ops.py").write_text(KERNELS)
    monkeypatch.syspath_prepend(str(tmp_path))
    import fuzzkern.ops  # noqa: PLC0415

    yield fuzzkern.ops
    for name in ("fuzzkern.ops", "fuzzkern"):
        sys.modules.pop(name, None)


def _script(message: str) -> str:
    """The lines under "Reproduce:", as a user copies them out of the message."""
    block = message.split("\nReproduce:\n", 1)[1].split("\nHypothesis keeps", 1)[0]
    return textwrap.dedent(block)


def _run_pasted(script: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``python -`` in the project root: the way a snippet pasted into a shell or REPL runs."""
    return subprocess.run([sys.executable, "-"], input=script, cwd=cwd, capture_output=True, text=True, timeout=300,
                          check=False)


def _shrunk_failure(strategy: st.SearchStrategy[OpArgs], candidate, reference) -> str:
    """The failure message of the example Hypothesis shrank to (the one it replays last)."""
    messages: list[str] = []

    @settings(max_examples=100, derandomize=True, database=None, deadline=None, phases=[Phase.generate, Phase.shrink])
    @given(strategy)
    def search(case: OpArgs) -> None:
        result = check_op(candidate, reference, case, device="cpu")
        if not result.passed:
            messages.append(result.message())
            raise AssertionError(messages[-1])

    with pytest.raises(AssertionError):
        search()
    return messages[-1]


def test_reproduction_of_a_fuzzed_module_function_runs_as_pasted(kernels, tmp_path: Path) -> None:
    message = _shrunk_failure(S.softmax_args(st.just(torch.float32), max_side=40), kernels.softmax, F.softmax)
    script = _script(message)
    assert "import fuzzkern.ops" in script and "candidate = fuzzkern.ops.softmax" in script
    proc = _run_pasted(script, tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert "AssertionError: Operator outputs are not close to the float64 truth!" in proc.stderr
    # the same failure: the same element counts and the same worst element and tolerance
    for line in message.splitlines():
        if "Mismatched elements" in line or "Greatest error/tolerance" in line:
            assert line.strip() in proc.stderr, (line, proc.stderr)


def test_a_direct_checks_reproduction_of_large_inputs_runs_as_pasted(kernels, tmp_path: Path) -> None:
    """Outside Hypothesis there is no example to replay: inputs over 64 elements are written to a file
    named by their contents, which the script loads, so it raises the same failure again."""
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(0))
    result = check_op(kernels.drifting, torch.clone, x, device="cpu")
    assert not result.passed
    script = result.reproduction
    assert "load_file(" in script and "= ..." not in script, script
    proc = _run_pasted(script, tmp_path)
    assert proc.returncode == 1, proc.stderr
    worst = result.message().split("Greatest error/tolerance: ", 1)[1].split(" at index", 1)[0]
    assert f"Greatest error/tolerance: {worst} at index" in proc.stderr, proc.stderr[-2000:]
    again = check_op(kernels.drifting, torch.clone, x + 1, device="cpu")   # other inputs: another file
    assert again.reproduction.split("load_file(")[1][:80] != script.split("load_file(")[1][:80]


def test_the_worst_example_seen_is_reproduced_as_pasted(kernels, tmp_path: Path) -> None:
    """Shrinking ends at a barely failing example; the worst one the search met gets its own script, its
    tensors too large to print loaded from a file, and that script raises the worst failure again."""
    messages: list[str] = []

    @settings(max_examples=100, derandomize=True, database=None, deadline=None)
    @given(st.integers(1, 2048))
    def search(n: int) -> None:
        result = check_op(kernels.drifting, torch.clone, torch.arange(n, dtype=torch.float32), device="cpu")
        if not result.passed:
            messages.append(result.message())
            raise AssertionError(messages[-1])

    with pytest.raises(AssertionError):
        search()
    message = messages[-1]
    worst_line = next(line for line in message.splitlines() if line.startswith("Worst seen in this search:"))
    worst = float(worst_line.split("err/tol ", 1)[1].split(" ", 1)[0])
    block = message.split("\n  Reproduce the worst seen:\n", 1)[1].split("\nCandidate: ", 1)[0]
    script = textwrap.dedent(block)
    assert "load_file(" in script and "candidate = fuzzkern.ops.drifting" in script, script
    proc = _run_pasted(script, tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert f"Greatest error/tolerance: {worst:.3g} at index" in proc.stderr, (worst_line, proc.stderr[-2000:])
    shrunk = float(message.split("Greatest error/tolerance: ", 1)[1].split(" ", 1)[0])
    assert worst > 10 * shrunk


def test_reproduction_keeps_the_cases_error_model(kernels, tmp_path: Path) -> None:
    """K and the magnitude function of an ``OpArgs`` reach the pasted ``compare_op``, so it judges alike."""
    a = torch.linspace(-1, 1, 40, dtype=torch.float16).reshape(2, 20)
    b = torch.linspace(1, -1, 60, dtype=torch.float16).reshape(20, 3)
    case = OpArgs((a, b), reduction_length=20, magnitude=S.matmul_magnitude, names=("a", "b"))
    with pytest.raises(AssertionError) as info:
        compare_op(kernels.matmul, torch.matmul, case, device="cpu")
    script = _script(str(info.value))
    assert ("dtype_policy=ErrorModel(reduction_length=20, "
            "magnitude=pytest_rocm_parity.fuzz.strategies.matmul_magnitude)") in script
    proc = _run_pasted(script, tmp_path)
    assert proc.returncode == 1 and "Operator outputs are not close" in proc.stderr, proc.stderr
    expected = [line.strip() for line in str(info.value).splitlines() if "Greatest error/tolerance" in line]
    assert expected and all(line in proc.stderr for line in expected), proc.stderr


def test_reproduction_names_torch_builtins_by_their_public_path() -> None:
    result = check_op(lambda t: torch.softmax(t, -1) + 1, torch.softmax, torch.ones(3), -1, device="cpu")
    script = result.reproduction
    assert "reference = torch.softmax" in script
    assert "candidate = ...  # " in script and "is not importable" in script   # a lambda: the user assigns it
    ops = check_op(torch.ops.aten.exp.default, lambda t: t.exp() * 2, torch.ones(2), device="cpu").reproduction
    assert "candidate = torch.ops.aten.exp.default" in ops
    q = torch.ones(1, 2, 3)   # a builtin whose own module is private (torch._C._nn): its public name
    sdpa = check_op(lambda a, b, c: F.scaled_dot_product_attention(a, b, c) * 2, F.scaled_dot_product_attention,
                    q, q, q, device="cpu").reproduction
    assert "reference = torch.nn.functional.scaled_dot_product_attention" in sdpa and "torch._C" not in sdpa


def test_reproduction_of_a_golden_replay_runs_as_pasted(kernels, tmp_path: Path) -> None:
    golden = record_golden(tmp_path / "goldens" / "softmax", F.softmax, F.softmax,
                           S.softmax_args(st.just(torch.float32), max_side=40), max_examples=6, seed=1, device="cpu")
    failing = [r for r in replay_golden(golden, kernels.softmax, device="cpu") if not r.passed]
    assert failing, "no recorded example pads a row"
    script = _script(failing[0].message())
    assert "import fuzzkern.ops" in script and ".compare(candidate, device='cpu')" in script
    proc = _run_pasted(script, tmp_path)
    assert proc.returncode == 1 and "Operator outputs are not close" in proc.stderr, proc.stderr
    worst = [line.strip() for line in failing[0].message().splitlines() if "Greatest error/tolerance" in line]
    assert worst and all(line in proc.stderr for line in worst), proc.stderr


def test_reproduction_sets_the_triton_interpreter_the_failing_process_ran(monkeypatch: pytest.MonkeyPatch) -> None:
    """A kernel fuzzed under TRITON_INTERPRET=1 runs elsewhere without it (no GPU on the CPU machine):
    the script sets it before any import."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    script = check_op(lambda t: torch.softmax(t, -1) + 1, torch.softmax, torch.ones(3), -1, device="cpu").reproduction
    lines = script.splitlines()
    at = lines.index("os.environ['TRITON_INTERPRET'] = '1'")
    assert lines[at - 1] == "import os" and at < min(i for i, l in enumerate(lines) if l.startswith("import torch"))
    monkeypatch.delenv("TRITON_INTERPRET")
    script = check_op(lambda t: torch.softmax(t, -1) + 1, torch.softmax, torch.ones(3), -1, device="cpu").reproduction
    assert "TRITON_INTERPRET" not in script


CUSTOM_OPS = '''
import torch


@torch.library.custom_op("rpfuzz::bad_rms", mutates_args=())
def bad_rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """eps 1e-3 where the caller asked for eps."""
    r = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-3)
    return (x.float() * r * weight.float()).to(x.dtype)


def rms_ref(x, weight, eps):
    return torch.nn.functional.rms_norm(x, (x.shape[-1],), weight, eps)


_lib = torch.library.Library("rpfuzzlib", "DEF")
_lib.define("scale(Tensor x) -> Tensor")
_lib.impl("scale", lambda x: x * 1.01, "CompositeExplicitAutograd")
'''


@pytest.fixture(scope="module")
def custom_ops(tmp_path_factory: pytest.TempPathFactory):
    """``rpfuzz_ops``: a user's module that registers torch.library operators on import (once per
    process: torch refuses a second registration)."""
    root = tmp_path_factory.mktemp("customops")
    (root / "rpfuzz_ops.py").write_text(CUSTOM_OPS)
    sys.path.insert(0, str(root))
    try:
        import rpfuzz_ops  # noqa: PLC0415

        yield root, rpfuzz_ops
    finally:
        sys.path.remove(str(root))


@pytest.mark.parametrize("form", ["packet", "overload", "custom_op_def"])
def test_a_custom_op_is_named_and_its_reproduction_imports_its_module(custom_ops, form: str) -> None:
    root, module = custom_ops
    candidate = {"packet": torch.ops.rpfuzz.bad_rms, "overload": torch.ops.rpfuzz.bad_rms.default,
                 "custom_op_def": module.bad_rms}[form]
    result = check_op(candidate, module.rms_ref, torch.full((1, 4), 0.01), torch.ones(4), 1e-6, device="cpu")
    assert not result.passed and result.candidate == "rpfuzz::bad_rms"
    script = result.reproduction
    expected = "torch.ops.rpfuzz.bad_rms.default" if form == "overload" else "torch.ops.rpfuzz.bad_rms"
    assert "import rpfuzz_ops" in script.splitlines() and f"candidate = {expected}" in script.splitlines()
    proc = _run_pasted(script, root)
    assert proc.returncode == 1 and "Operator outputs are not close" in proc.stderr, proc.stderr
    worst = [line.strip() for line in result.message().splitlines() if "Greatest error/tolerance" in line]
    assert worst and all(line in proc.stderr for line in worst), proc.stderr


def test_an_op_defined_through_a_library_object_imports_its_module(custom_ops) -> None:
    root, _ = custom_ops
    result = check_op(torch.ops.rpfuzzlib.scale, torch.clone, torch.ones(3), device="cpu")
    assert not result.passed and result.candidate == "rpfuzzlib::scale"
    assert "import rpfuzz_ops" in result.reproduction.splitlines()
    proc = _run_pasted(result.reproduction, root)
    assert proc.returncode == 1 and "Operator outputs are not close" in proc.stderr, proc.stderr
