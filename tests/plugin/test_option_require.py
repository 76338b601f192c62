"""--parity-require (ini parity_require): a run that collects parity tests without --rocm-parity
fails instead of skipping them, so a job that lost the flag cannot pass without judging anything."""
from __future__ import annotations

import pytest

from pytest_rocm_parity.options import ENABLE, REQUIRE

DYNAMIC_ONLY = '''
from conftest import make_model, make_inputs

def test_dynamic(request):
    parity = request.getfixturevalue("parity")
    parity.check(make_model(), make_inputs(), name="tiny", dtypes=["float32"])
'''


@pytest.fixture(autouse=True)
def not_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)   # the rule holds outside CI=true too


@pytest.mark.parametrize("how", ["flag", "ini"])
def test_parity_tests_collected_without_enable_fail_the_run(project: pytest.Pytester, how: str) -> None:
    if how == "ini":
        project.makeini("[pytest]\nparity_require = true\n")
    result = project.runpytest(*([REQUIRE] if how == "flag" else []))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: rocm-parity: {REQUIRE} (or parity_require = true in the ini file) is set, "
                                 f"and {ENABLE} is not given*the parity tests would be skipped*(counted at "
                                 f"collection: 1, *)"])
    assert "given without" not in result.stdout.str() + result.stderr.str()   # not an ignored option


def test_with_enable_or_without_parity_tests_it_changes_nothing(project: pytest.Pytester) -> None:
    project.makeini("[pytest]\nparity_require = true\n")
    project.runpytest(ENABLE, "--parity-mode=capture").assert_outcomes(passed=1)
    project.runpytest(ENABLE).assert_outcomes(passed=1)
    project.makepyfile(test_plain="def test_plain():\n    pass\n")
    project.runpytest("test_plain.py").assert_outcomes(passed=1)   # no parity test collected: nothing to require


def test_a_test_that_takes_parity_through_getfixturevalue_fails(project: pytest.Pytester) -> None:
    (project.path / "test_tiny.py").unlink()
    project.makepyfile(test_dynamic=DYNAMIC_ONLY)
    result = project.runpytest(REQUIRE)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"*{REQUIRE} (or parity_require = true in the ini file) is set*fails the test: "
                                 f"skipped, it would let the job pass without judging anything*"])
    project.runpytest().assert_outcomes(skipped=1)   # without it: the plain skip


def test_without_it_parity_tests_skip_as_before(project: pytest.Pytester) -> None:
    project.runpytest("-rs").assert_outcomes(skipped=1)
