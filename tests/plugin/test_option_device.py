"""--parity-device: the candidate device; validated as a usage error."""
from __future__ import annotations

import pytest

from pytest_rocm_parity.options import parse_device


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
