"""--parity-device: the candidate device; validated as a usage error."""
from __future__ import annotations

import pytest
import torch

from pytest_rocm_parity.errors import BackendUnavailable
from pytest_rocm_parity.options import parse_device, resolve_device


@pytest.mark.parametrize("value,expected", [("cpu", "cpu"), ("cuda", "cuda"), ("cuda:1", "cuda:1"),
                                            ("hip", "cuda"), ("auto", "auto")])
def test_accepted_forms(value: str, expected: str) -> None:
    assert parse_device(value) == expected


@pytest.mark.parametrize("value", ["gpu", "cuda:x", "rocm0", ""])
def test_rejected_forms(value: str) -> None:
    with pytest.raises(pytest.UsageError, match="allowed forms are auto, cpu, cuda"):
        parse_device(value)


def test_bad_device_is_usage_error(project: pytest.Pytester) -> None:
    result = project.runpytest("--rocm-parity", "--parity-device=tpu")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--parity-device='tpu'*allowed forms*"])


def test_explicit_cpu_device_runs(project: pytest.Pytester) -> None:
    project.runpytest("--rocm-parity", "--parity-mode=capture", "--parity-device=cpu").assert_outcomes(passed=1)
    result = project.runpytest("--rocm-parity", "--parity-device=cpu")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["rocm-parity: mode=replay device=cpu*"])


def test_unavailable_cuda_fails_clearly(project: pytest.Pytester) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU; the no-GPU path is what is tested here")
    project.runpytest("--rocm-parity", "--parity-mode=capture", "--parity-device=cpu").assert_outcomes(passed=1)
    result = project.runpytest("--rocm-parity", "--parity-device=cuda")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*BackendUnavailable*cuda*"])


@pytest.mark.parametrize("build", [("hip", "6.4.43482"), ("cuda", "12.8")])
def test_auto_on_a_gpu_build_that_sees_no_gpu_is_refused_in_ci(monkeypatch: pytest.MonkeyPatch,
                                                               build: tuple[str, str]) -> None:
    """A ROCm job whose container lost /dev/kfd would replay on the CPU and pass: under CI=true,
    'auto' on a GPU build that sees no GPU is an error naming both ways on; elsewhere it is the CPU."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "hip", build[1] if build[0] == "hip" else None)
    monkeypatch.setattr(torch.version, "cuda", build[1] if build[0] == "cuda" else None)
    with pytest.raises(BackendUnavailable, match=rf"--parity-device=auto: this torch is a (ROCm|CUDA) {build[1]} build "
                                                 r"but sees no GPU.*--device=/dev/kfd.*--parity-device=cpu"):
        resolve_device("auto", ci=True)
    assert resolve_device("auto", ci=False) == "cpu"
    assert resolve_device("cpu", ci=True) == "cpu"


def test_auto_on_a_cpu_build_in_ci_is_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.version, "cuda", None)
    assert resolve_device("auto", ci=True) == "cpu"
