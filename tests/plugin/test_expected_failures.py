"""A planted bug's self-test (the check must fail: pytest.raises, or a test marked xfail) reads as an
expected failure in the summary and the reports, not as a regression beside the real ones."""
from __future__ import annotations

import json

import pandas as pd
import pytest

SELF_TESTS = '''
import os
import pytest
from conftest import make_model, make_inputs


def _planted():
    m = make_model()
    m.blocks[1].act.approximate = "tanh"
    return m


def test_caught(parity):
    with pytest.raises(AssertionError, match="blocks.1.act"):
        parity.check(_planted(), make_inputs(), name="tiny", dtypes=["float32"])


@pytest.mark.xfail(strict=True)
def test_xfail(parity):
    parity.check(_planted(), make_inputs(), name="tiny", dtypes=["float32"])


def test_regression(parity):
    m = make_model() if not os.environ.get("REGRESS") else _planted()
    parity.check(m, make_inputs(), name="tiny", dtypes=["float32"])
'''


def test_expected_failures_are_labelled_apart_from_regressions(project: pytest.Pytester,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    project.runpytest("--rocm-parity", "--parity-mode=capture").assert_outcomes(passed=1)
    project.makepyfile(test_self=SELF_TESTS)
    monkeypatch.setenv("REGRESS", "1")
    result = project.runpytest("--rocm-parity", "--parity-report=rep", "test_self.py")
    result.assert_outcomes(passed=1, failed=1, xfailed=1)
    result.stdout.fnmatch_lines([
        "*rocm-parity summary*",
        "FAIL  tiny (test_regression) [[]float32[]]  culprit blocks.1.act*",
        "XFAIL tiny (test_caught)     [[]float32[]]  its test caught the failure and passed*; culprit blocks.1.act*",
        "XFAIL tiny (test_xfail)      [[]float32[]]  its test is marked xfail and failed as expected; culprit*",
        "3 checks: 0 passed, 1 failed, 2 failed as their tests expected",
    ])
    checks = pd.read_csv(project.path / "rep" / "checks.csv").set_index("test")
    expected = checks["expected"].fillna("").to_dict()
    assert expected == {"test_self.py::test_caught": "caught", "test_self.py::test_xfail": "xfail",
                        "test_self.py::test_regression": ""}
    doc = json.loads((project.path / "rep" / "parity-report.json").read_text())
    assert sorted(c.get("expected", "") for c in doc["checks"]) == ["", "caught", "xfail"]
    html = (project.path / "rep" / "parity-report.html").read_text()
    assert "3 checks, 1 failing, 2 failing as their tests expected" in html
    assert html.count('<span class="badge xfail">XFAIL</span>') >= 2
