"""Golden size (line, limit, advice, file mode) and progress lines during capture and replay."""
from __future__ import annotations

import io
import os
import stat
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from pytest_rocm_parity.options import GOLDEN_SIZE_LIMIT


@pytest.fixture
def umask_022() -> Iterator[None]:
    old = os.umask(0o022)
    yield
    os.umask(old)


def test_capture_prints_each_golden_size(project: pytest.Pytester) -> None:
    result = project.runpytest("--rocm-parity", "--parity-mode=capture")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([f"parity: tiny: golden *.* KB in 1 file(s) at {project.path / 'goldens' / 'tiny'}"])
    assert "PytestWarning" not in result.stdout.str()   # 0.07 MB is far under the default 50 MB


def test_size_over_the_limit_warns_with_the_ways_to_shrink(project: pytest.Pytester) -> None:
    result = project.runpytest("--rocm-parity", "--parity-mode=capture", f"{GOLDEN_SIZE_LIMIT}=0.01",
                               "--parity-drill=2")
    result.assert_outcomes(passed=1, warnings=1)
    text = " ".join(result.stdout.str().split())
    assert "the golden for 'tiny' is " in text and "over the 10.0 KB limit" in text
    for advice in ("a shallower drill= in parity.check or @pytest.mark.parity (0: block outputs only; this golden is "
                   "drill=2)", "sketch=True", "fewer tokens", "git-lfs",
                   "goldens/**/*.safetensors filter=lfs diff=lfs merge=lfs -text", "parity_golden_size_limit"):
        assert advice in text, advice


def test_the_size_advice_leaves_out_what_the_golden_already_does(project: pytest.Pytester, tmp_path: Any) -> None:
    """A golden at drill 0 is not told to drill shallower; one in a folder outside the repository
    gets no .gitattributes line (a path git cannot use), but a note that git does not hold it."""
    outside = tmp_path / "elsewhere"
    result = project.runpytest("--rocm-parity", "--parity-mode=capture", "--parity-drill=0",
                               f"--parity-golden-dir={outside}", f"{GOLDEN_SIZE_LIMIT}=0.001")
    result.assert_outcomes(passed=1, warnings=1)
    text = " ".join(result.stdout.str().split())
    assert "To shrink it: sketch=True" in text and "shallower drill" not in text, text
    assert "filter=lfs" not in text and f"The golden directory {outside} is outside the repository" in text, text


def test_size_limit_from_the_ini_and_the_flag_over_it(project: pytest.Pytester) -> None:
    project.makeini("[pytest]\nparity_golden_size_limit = 0.01\n")
    result = project.runpytest("--rocm-parity", "--parity-mode=capture")
    result.assert_outcomes(passed=1, warnings=1)
    assert "over the 10.0 KB limit" in " ".join(result.stdout.str().split())
    result = project.runpytest("--rocm-parity", "--parity-regen", f"{GOLDEN_SIZE_LIMIT}=0")   # 0: never
    result.assert_outcomes(passed=1)
    assert "KB limit" not in result.stdout.str()


def test_a_regeneration_that_drills_shallower_says_so(project: pytest.Pytester) -> None:
    """The default depth is the deepest whose golden fits the size limit: a regeneration under a
    smaller limit judges less deep than the golden it replaces, and says so with both depths."""
    project.runpytest("--rocm-parity", "--parity-mode=capture").assert_outcomes(passed=1)
    result = project.runpytest("--rocm-parity", "--parity-regen=tiny", f"{GOLDEN_SIZE_LIMIT}=0.005")
    result.assert_outcomes(passed=1, warnings=2)
    text = " ".join(result.stdout.str().split())
    assert "rocm-parity: tiny: captured at drill 0, where its golden was at drill 1" in text, text
    assert "Keep the depth with drill=1 in the check" in text
    again = project.runpytest("--rocm-parity", "--parity-regen=tiny")
    assert "where its golden was at drill" not in again.stdout.str()


def test_bad_size_limit_is_a_usage_error(project: pytest.Pytester) -> None:
    result = project.runpytest("--rocm-parity", f"{GOLDEN_SIZE_LIMIT}=big")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{GOLDEN_SIZE_LIMIT}='big': a size in MB*"])


def test_golden_files_are_readable_by_others(project: pytest.Pytester, umask_022: None) -> None:
    project.runpytest("--rocm-parity", "--parity-mode=capture").assert_outcomes(passed=1)
    files = list((project.path / "goldens" / "tiny").iterdir())
    assert len(files) == 2
    for p in files:
        assert stat.S_IMODE(p.stat().st_mode) == 0o644, p


def test_progress_lines_during_capture_and_replay(project: pytest.Pytester) -> None:
    result = project.runpytest("--rocm-parity", "--parity-mode=capture")
    result.stdout.fnmatch_lines(["parity: tiny: capture float32 on cpu ...",
                                 "parity: tiny: float32: reference run, float64 truth, wrote * KB in *s"])
    assert "reference run, float64 truth ..." not in result.stdout.str()   # the -v line
    result = project.runpytest("--rocm-parity")
    result.stdout.fnmatch_lines(["parity: tiny: replay float32 on cpu against *tiny ...",
                                 "parity: tiny: float32: verdict PASS"])
    result = project.runpytest("--rocm-parity", "-q")   # pytest's line of dots stays whole
    assert "parity: tiny" not in result.stdout.str() and result.stdout.lines[0].startswith(".")


def test_progress_shows_more_with_verbose(project: pytest.Pytester) -> None:
    result = project.runpytest("--rocm-parity", "--parity-mode=capture", "-v")
    result.stdout.fnmatch_lines(["parity: tiny: capture float32 on cpu ...",
                                 "parity: tiny: float32: reference run, float64 truth ...",
                                 "parity: tiny: float32: reference run, float64 truth, wrote *",
                                 "test_tiny.py::test_tiny PASSED*"])
    result = project.runpytest("--rocm-parity", "-v")
    result.stdout.fnmatch_lines(["parity: tiny: replay float32 on cpu against *",
                                 "parity: tiny: loading float32-*.safetensors (* KB)",
                                 "parity: tiny: float32: verdict PASS",
                                 "test_tiny.py::test_tiny PASSED*"])


def test_progress_names_the_failing_verdict(project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    project.runpytest("--rocm-parity", "--parity-mode=capture").assert_outcomes(passed=1)
    monkeypatch.setenv("BUG", "1")
    result = project.runpytest("--rocm-parity")
    result.stdout.fnmatch_lines(["parity: tiny: float32: verdict FAIL (culprit blocks.1.act)"])


def test_ops_output_is_line_buffered(monkeypatch: pytest.MonkeyPatch) -> None:
    """Piped, stdout is block-buffered: every line of the op suite must reach the pipe as it is printed."""
    from pytest_rocm_parity.fuzz.opsuite import main

    raw = io.BytesIO()
    out = io.TextIOWrapper(raw, encoding="utf-8", line_buffering=False)
    monkeypatch.setattr(sys, "stdout", out)
    main(["--ops", "add", "--dtypes", "float32", "--max-examples", "3", "--device", "cpu"])
    assert out.line_buffering
    assert b"passed" in raw.getvalue() and b" failed on cpu" in raw.getvalue()   # the last line is out already
