"""--parity-dtypes and a check's dtypes=: the rungs a check is judged at, validated with the fix."""
from __future__ import annotations

import pytest

from pytest_rocm_parity.options import parse_dtypes


def test_aliases_become_canonical_rungs() -> None:
    assert parse_dtypes("bf16,fp16, fp32") == ["bfloat16", "float16", "float32"]


@pytest.mark.parametrize("value, says", [
    ("fp33", "unknown precision 'fp33'"),
    ("float64", "'float64' is the precision of the truth every rung is judged against, not a rung"),
    ("bf16,fp64", "'fp64' is the precision of the truth"),
    ("float8_e4m3fn", "'float8_e4m3fn' is a storage format, not a rung"),
])
def test_what_is_not_a_rung_is_a_usage_error_listing_the_rungs(value: str, says: str) -> None:
    with pytest.raises(pytest.UsageError) as info:
        parse_dtypes(value)
    assert says in str(info.value) and "allowed: float32, bfloat16, float16" in str(info.value)


@pytest.mark.parametrize("value", ["", " , "])
def test_an_empty_list_is_a_usage_error_not_the_defaults(value: str) -> None:
    """--parity-dtypes=$UNSET_VARIABLE would otherwise judge each check at its own dtypes unsaid."""
    with pytest.raises(pytest.UsageError, match="lists no dtype: give one or more"):
        parse_dtypes(value)


def test_a_float64_rung_in_a_check_is_refused_by_name(project: pytest.Pytester) -> None:
    project.makepyfile(test_f64='''
from conftest import make_model, make_inputs

def test_f64(parity):
    parity.check(make_model(), make_inputs(), name="f64", dtypes=["float64"])
''')
    result = project.runpytest("--rocm-parity", "--parity-mode=capture", "test_f64.py")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*InvalidArgument: dtypes: 'float64' is the precision of the truth*"])
    assert not (project.path / "goldens" / "f64").exists()


def test_the_ini_list_may_be_written_with_spaces_or_one_a_line(project: pytest.Pytester) -> None:
    """parity_dtypes = bfloat16 float32, or one a line: the rungs, as with commas."""
    assert parse_dtypes("bfloat16 float32") == parse_dtypes("bfloat16,\n  float32") == ["bfloat16", "float32"]
    project.makepyfile(test_tiny='''
from conftest import make_model, make_inputs

def test_tiny(parity):
    parity.check(make_model(), make_inputs(), name="tiny")
''')
    project.makeini("[pytest]\nparity_dtypes =\n    bfloat16\n    float32\n")
    project.runpytest("--rocm-parity", "--parity-mode=capture").assert_outcomes(passed=1)
    import json

    assert list(json.loads((project.path / "goldens" / "tiny" / "manifest.json").read_text())["rungs"]) == \
        ["bfloat16", "float32"]
    project.makeini("[pytest]\nparity_dtypes = bfloat16 float33\n")
    result = project.runpytest("--rocm-parity")
    result.stderr.fnmatch_lines(["*--parity-dtypes='bfloat16 float33' (or ini parity_dtypes): *unknown precision 'float33'*"])


def test_a_check_without_dtypes_is_refused_not_passed(project: pytest.Pytester) -> None:
    """An empty list would capture an empty golden and replay nothing, passing."""
    project.makepyfile(test_none='''
from conftest import make_model, make_inputs

def test_none(parity):
    parity.check(make_model(), make_inputs(), name="none", dtypes=[])
''')
    result = project.runpytest("--rocm-parity", "--parity-mode=capture", "test_none.py")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*InvalidArgument: check 'none': dtypes is empty, so nothing would be captured*"])
    assert not (project.path / "goldens" / "none").exists()


def test_the_plain_spec_takes_rung_names_as_the_fixture_does() -> None:
    from pytest_rocm_parity import CheckSpec, InvalidArgument

    assert CheckSpec(name="m", dtypes="bf16").dtypes == ["bfloat16"]
    assert CheckSpec(name="m", dtypes=["fp32", "float32"]).dtypes == ["float32"]
    with pytest.raises(InvalidArgument, match="dtypes is empty"):
        CheckSpec(name="m")
    with pytest.raises(InvalidArgument, match="dtypes is empty"):
        CheckSpec(name="m", dtypes=None)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="unknown precision 'fp33'"):
        CheckSpec(name="m", dtypes=["fp33"])
