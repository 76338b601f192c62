"""--parity-mode: capture writes goldens once, replay judges them; bad values are usage errors."""
from __future__ import annotations

import pytest

from pytest_rocm_parity.options import MODE


def test_capture_then_replay_passes(project: pytest.Pytester) -> None:
    project.runpytest("--rocm-parity", f"{MODE}=capture").assert_outcomes(passed=1)
    result = project.runpytest("--rocm-parity")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*PASS tiny [[]float32[]]*"])


def test_replay_names_the_culprit(project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    project.runpytest("--rocm-parity", f"{MODE}=capture").assert_outcomes(passed=1)
    monkeypatch.setenv("BUG", "1")
    result = project.runpytest("--rocm-parity")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*parity check failed: tiny [[]float32[]]*",
        "*culprit: blocks.1.act (inside block blocks.1)*",
        "*first divergent layer (propagated): blocks.1*",
    ])
    # thousands of times the budget: no tolerance would be a fix worth suggesting
    result.stdout.no_fnmatch_line("*would have passed with tolerance*")


def test_missing_golden_prints_capture_command(project: pytest.Pytester) -> None:
    result = project.runpytest("--rocm-parity")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*GoldenMissing: no golden for 'tiny'*pytest --rocm-parity --parity-mode=capture*"])


def test_capture_never_overwrites(project: pytest.Pytester) -> None:
    project.runpytest("--rocm-parity", f"{MODE}=capture").assert_outcomes(passed=1)
    before = (project.path / "goldens" / "tiny" / "manifest.json").read_bytes()
    result = project.runpytest("--rocm-parity", f"{MODE}=capture", "-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*capture never overwrites*--parity-regen='tiny'*"])
    assert (project.path / "goldens" / "tiny" / "manifest.json").read_bytes() == before


def test_bad_mode_is_usage_error(project: pytest.Pytester) -> None:
    result = project.runpytest("--rocm-parity", f"{MODE}=record")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--parity-mode='record': allowed values are replay, capture*"])


def test_bad_ini_mode_is_usage_error(project: pytest.Pytester) -> None:
    project.makeini("[pytest]\nparity_mode = sometimes\n")
    result = project.runpytest("--rocm-parity")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*ini key parity_mode = 'sometimes' in *tox.ini: *"])   # where the value is


def test_ci_refuses_to_write(project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """Whether or not the goldens exist: with them, capture would skip every test and the job pass."""
    monkeypatch.setenv("CI", "true")

    def refused() -> None:
        result = project.runpytest("--rocm-parity", f"{MODE}=capture")
        assert result.ret == pytest.ExitCode.USAGE_ERROR
        result.stderr.fnmatch_lines(["*--parity-mode=capture under CI=true*judges nothing*--parity-allow-write*"])
    refused()
    assert not (project.path / "goldens").exists()
    project.runpytest("--rocm-parity", f"{MODE}=capture", "--parity-allow-write").assert_outcomes(passed=1)
    assert (project.path / "goldens").exists()
    refused()
