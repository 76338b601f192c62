"""The precision ladder: an explicit low-precision dtypes list keeps the float32 rung unless
ladder=False (the check's argument, the marker or the ini key parity_ladder) drops it."""
from __future__ import annotations

import json

import pytest

BF16_ONLY = '''
import pytest
from conftest import make_model, make_inputs

{marker}
def test_tiny(parity):
    parity.check(make_model(), make_inputs(), name="tiny", dtypes=["bfloat16"]{extra})
'''


def _write(project: pytest.Pytester, marker: str = "", extra: str = "") -> None:
    project.makepyfile(test_tiny=BF16_ONLY.format(marker=marker, extra=extra))


def _rungs(project: pytest.Pytester) -> list[str]:
    manifest = json.loads((project.path / "goldens" / "tiny" / "manifest.json").read_text())
    return list(manifest["rungs"])


def test_bf16_alone_keeps_the_float32_rung_and_says_where_the_bug_shows(project: pytest.Pytester,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    _write(project)
    project.runpytest("--rocm-parity", "--parity-mode=capture").assert_outcomes(passed=1)
    assert _rungs(project) == ["bfloat16", "float32"]
    monkeypatch.setenv("BUG", "1")       # an approximate GELU: the same function to bf16's eye
    result = project.runpytest("--rocm-parity", "--parity-report=rep")
    result.assert_outcomes(failed=1)
    doc = json.loads((project.path / "rep" / "parity-report.json").read_text())
    by = {c["dtype"]: c for c in doc["checks"]}
    assert not by["float32"]["passed"] and by["float32"]["culprit"] == "blocks.1.act"
    bf16_notes = " ".join(by["bfloat16"]["notes"])
    if by["bfloat16"]["passed"]:
        assert "found at float32 only" in bf16_notes
        # an approximation and a part run in float16 look alike from the ladder: both are named
        result.stdout.fnmatch_lines(["*note: the bfloat16 rung passed: this change is below the noise*"
                                     "a changed computation, or a part of it run below float32*"])
    else:
        assert "float32 rung fails too" in bf16_notes
        result.stdout.no_fnmatch_line("*would have passed with tolerance*")   # a changed computation


@pytest.mark.parametrize("how", ["argument", "marker", "ini"])
def test_ladder_false_judges_only_the_dtypes_asked_for(project: pytest.Pytester, how: str) -> None:
    if how == "argument":
        _write(project, extra=", ladder=False")
    elif how == "marker":
        _write(project, marker="@pytest.mark.parity(ladder=False)")
    else:
        _write(project)
        project.makeini("[pytest]\nparity_ladder = false\n")
    project.runpytest("--rocm-parity", "--parity-mode=capture").assert_outcomes(passed=1)
    assert _rungs(project) == ["bfloat16"]


def test_a_model_left_in_training_mode_that_computes_the_same_there_gets_no_note(project: pytest.Pytester) -> None:
    """The tiny model is built in training mode (nn.Module's default), and is Linear layers only, which
    compute the same in either mode: no note (tests/runner/test_modes.py has those that differ)."""
    project.runpytest("--rocm-parity", "--parity-mode=capture").assert_outcomes(passed=1)
    project.runpytest("--rocm-parity", "--parity-report=rep").assert_outcomes(passed=1)
    doc = json.loads((project.path / "rep" / "parity-report.json").read_text())
    assert not any("training mode" in n for n in doc["checks"][0]["notes"]), doc["checks"][0]["notes"]


@pytest.mark.parametrize("marker, says", [
    ("@pytest.mark.parity(dtype=['float32'])", "unknown option(s) 'dtype' ('dtype': did you mean 'dtypes'?)"),
    ("@pytest.mark.parity({'dtypes': ['float32']})", "takes keyword options only"),
    ("@pytest.mark.parity(ladder='no')", "ladder='no'): must be True or False"),
])
def test_a_marker_option_it_cannot_use_fails_the_check_instead_of_being_ignored(project: pytest.Pytester, marker: str,
                                                                                 says: str) -> None:
    """A misspelt marker option would run the check with the defaults it was meant to change."""
    _write(project, marker=marker)
    result = project.runpytest("--rocm-parity", "--parity-mode=capture")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"*InvalidArgument: @pytest.mark.parity*{says}*"])
    assert not (project.path / "goldens" / "tiny").exists()


def test_a_misspelt_keyword_of_check_says_what_was_meant(project: pytest.Pytester) -> None:
    """parity.check(..., ladr=False): Python's TypeError would name 'ladr' only, with a traceback."""
    _write(project, extra=", ladr=False")
    result = project.runpytest("--rocm-parity", "--parity-mode=capture")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*InvalidArgument: check() got unknown keyword argument 'ladr' "
                                 "('ladr': did you mean 'ladder'?); its keywords are name, dtypes, *"])
    assert not (project.path / "goldens" / "tiny").exists()


def test_dtypes_the_check_sets_are_the_ones_its_stale_advice_changes(project: pytest.Pytester) -> None:
    """The check's dtypes= wins over --parity-dtypes, so the advice names the check's argument."""
    _write(project)
    project.runpytest("--rocm-parity", "--parity-mode=capture").assert_outcomes(passed=1)
    project.makepyfile(test_tiny=BF16_ONLY.format(marker="", extra="").replace('"bfloat16"', '"float16"'))
    result = project.runpytest("--rocm-parity", "--parity-dtypes=bfloat16,float32")
    result.assert_outcomes(failed=1)
    assert ("set by the check's dtypes=, which --parity-dtypes does not override). Replay the rungs it holds "
            "(dtypes=['bfloat16', 'float32'] in the check)") in result.stdout.str()


def test_a_rungs_note_names_what_failed_at_float32_where_no_module_is_the_culprit() -> None:
    """A training check whose float32 rung fails on the optimizer alone: the bf16 rung's note says
    so (it said 'culprit the outputs')."""
    from pytest_rocm_parity.api import ladder_notes
    from pytest_rocm_parity.judging.records import CheckResult

    def rung(dtype: str) -> CheckResult:
        return CheckResult(test="t", name="m", dtype=dtype, passed=False,
                           extra={"optimizer": {"optimizer:lm_head": False, "optimizer:model.norm": True}})
    bf16, f32 = rung("bfloat16"), rung("float32")
    ladder_notes([bf16, f32])
    assert "the float32 rung fails too (optimizer update out of bounds (1 of 2 parameter groups))" in bf16.notes[0]
    plain = [CheckResult(test="t", name="m", dtype=d, passed=False) for d in ("bfloat16", "float32")]
    ladder_notes(plain)
    assert "the float32 rung fails too (the model's outputs)" in plain[0].notes[0]


def test_a_failing_bf16_rung_under_the_triton_interpreter_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    """TRITON_INTERPRET=1 (Triton kernels judged on a CPU) truncates float32 to bfloat16: a failing
    bf16 rung says so and where the kernel is judged; without the variable, or on a passing rung, no note."""
    from pytest_rocm_parity.api import ladder_notes
    from pytest_rocm_parity.judging.records import CheckResult

    def rungs() -> list[CheckResult]:
        return [CheckResult(test="t", name="m", dtype="bfloat16", passed=False),
                CheckResult(test="t", name="m", dtype="float32", passed=True)]
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    bf16, f32 = rungs()
    ladder_notes([bf16, f32])
    assert any(n.startswith("TRITON_INTERPRET=1: a Triton kernel here runs in Triton's interpreter, which rounds "
                            "float32 to bfloat16 by truncation") for n in bf16.notes), bf16.notes
    assert not any("TRITON_INTERPRET" in n for n in f32.notes)
    monkeypatch.delenv("TRITON_INTERPRET")
    bf16, f32 = rungs()
    ladder_notes([bf16, f32])
    assert not any("TRITON_INTERPRET" in n for n in bf16.notes)
