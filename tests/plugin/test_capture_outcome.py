"""A capture is written only when the test that ran it passes: a test that fails after its check (or a run stopped
inside it) never replaces a golden nor creates one, and the terminal says which goldens were not written and why."""
from __future__ import annotations

import json

import pytest

from pytest_rocm_parity.options import REGEN

RAISES_AFTER = '''
import os
import pytest
from conftest import make_model, make_inputs

def test_tiny(parity):
    parity.check(make_model(), make_inputs(), name="tiny", dtypes=["float32"])
    parity.check(make_model(), make_inputs(), name="second", dtypes=["float32"])
    if os.environ.get("RAISE_AFTER"):
        raise RuntimeError("boom after the checks")
    if os.environ.get("SKIP_AFTER"):
        pytest.skip("not ready here")
'''


def snapshot(p: pytest.Pytester) -> dict[str, bytes]:
    g = p.path / "goldens"
    return {str(f.relative_to(g)): f.read_bytes() for f in sorted(g.rglob("*")) if f.is_file()} if g.exists() else {}


@pytest.fixture
def raising(project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """Goldens tiny and second captured; then the model changes (BUG) and the test raises after its checks."""
    project.makepyfile(test_tiny=RAISES_AFTER)
    monkeypatch.delenv("RAISE_AFTER", raising=False)
    project.runpytest("--rocm-parity", "--parity-mode=capture").assert_outcomes(passed=1)
    monkeypatch.setenv("BUG", "1")
    monkeypatch.setenv("RAISE_AFTER", "1")
    return project


@pytest.mark.parametrize("xdist", [[], ["-n", "2"]], ids=["in-process", "xdist"])
def test_regen_of_a_failing_test_keeps_the_goldens(raising: pytest.Pytester, xdist: list[str]) -> None:
    if xdist:
        pytest.importorskip("xdist")
    before = snapshot(raising)
    result = raising.runpytest_subprocess(*xdist, "--rocm-parity", REGEN)
    result.assert_outcomes(failed=1)
    assert snapshot(raising) == before
    result.stdout.fnmatch_lines(["goldens not updated (test_tiny.py::test_tiny failed after the capture; the goldens "
                                 "on disk are as they were; capture again once the test passes): tiny, second"])
    assert "goldens updated" not in result.stdout.str()


def test_the_failure_says_which_goldens_it_did_not_write(raising: pytest.Pytester) -> None:
    result = raising.runpytest("--rocm-parity", REGEN)
    result.assert_outcomes(failed=1)
    d = raising.path / "goldens" / "tiny"
    result.stdout.fnmatch_lines(["*RuntimeError: boom after the checks",
                                 "*rocm-parity: goldens not written*",
                                 f"golden for 'tiny' not updated: test_tiny.py::test_tiny failed after the capture; the "
                                 f"golden at {d} is as it was; capture again once the test passes"])


def test_a_passing_regen_writes(raising: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    before = snapshot(raising)
    monkeypatch.delenv("RAISE_AFTER")
    result = raising.runpytest("--rocm-parity", REGEN)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["goldens updated: tiny, second"])
    assert snapshot(raising) != before
    assert "not updated" not in result.stdout.str()


def test_first_capture_of_a_failing_test_writes_nothing(project: pytest.Pytester,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    project.makepyfile(test_tiny=RAISES_AFTER)
    monkeypatch.setenv("RAISE_AFTER", "1")
    result = project.runpytest("--rocm-parity", "--parity-mode=capture")
    result.assert_outcomes(failed=1)
    assert snapshot(project) == {} and not (project.path / "goldens" / "tiny").exists()
    result.stdout.fnmatch_lines(["goldens not created (test_tiny.py::test_tiny failed after the capture; nothing was "
                                 "written; capture again once the test passes): tiny, second"])
    assert "goldens created" not in result.stdout.str()


def test_a_test_that_skips_itself_after_its_checks_writes_nothing(raising: pytest.Pytester,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A pytest.skip of the test's own after the capture: it did not pass, so neither a regen nor a
    first capture writes (only a skip at a kept golden lets the test's other captures stand)."""
    monkeypatch.delenv("RAISE_AFTER")
    monkeypatch.setenv("SKIP_AFTER", "1")
    before = snapshot(raising)
    result = raising.runpytest("--rocm-parity", REGEN)
    result.assert_outcomes(skipped=1)
    assert snapshot(raising) == before
    result.stdout.fnmatch_lines(["goldens not updated (test_tiny.py::test_tiny skipped after the capture; the goldens "
                                 "on disk are as they were; capture again once the test passes): tiny, second"])
    for d in (raising.path / "goldens").iterdir():
        for f in d.iterdir():
            f.unlink()
        d.rmdir()
    result = raising.runpytest("--rocm-parity", "--parity-mode=capture")
    result.assert_outcomes(skipped=1)
    assert snapshot(raising) == {}
    assert "goldens created" not in result.stdout.str()


def test_xfail_is_a_failure(project: pytest.Pytester) -> None:
    project.makepyfile(test_tiny='''
import pytest
from conftest import make_model, make_inputs

@pytest.mark.xfail(reason="known broken")
def test_tiny(parity):
    parity.check(make_model(), make_inputs(), name="tiny", dtypes=["float32"])
    raise RuntimeError("expected")
''')
    result = project.runpytest("--rocm-parity", "--parity-mode=capture")
    result.assert_outcomes(xfailed=1)
    assert snapshot(project) == {}
    result.stdout.fnmatch_lines(["goldens not created (*): tiny"])


def test_a_kept_golden_after_a_capture_still_writes_it(project: pytest.Pytester) -> None:
    """A later check whose golden exists is passed over (capture never overwrites): the capture before
    it stands, and the test, which captured, passes."""
    project.makepyfile(test_tiny=RAISES_AFTER)
    project.runpytest("--rocm-parity", "--parity-mode=capture").assert_outcomes(passed=1)
    (project.path / "goldens" / "tiny" / "manifest.json").unlink()
    for f in (project.path / "goldens" / "tiny").iterdir():
        f.unlink()
    result = project.runpytest("--rocm-parity", "--parity-mode=capture")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["goldens created: tiny", "goldens kept (*): second"])
    assert json.loads((project.path / "goldens" / "tiny" / "manifest.json").read_text())["name"] == "tiny"


def test_a_golden_written_after_the_test_reads_back_as_captured(project: pytest.Pytester) -> None:
    """The written golden is the staged one, byte for byte: the replay passes and a second regen changes nothing."""
    project.runpytest("--rocm-parity", "--parity-mode=capture").assert_outcomes(passed=1)
    before = snapshot(project)
    project.runpytest("--rocm-parity").assert_outcomes(passed=1)
    result = project.runpytest("--rocm-parity", f"{REGEN}=tiny")
    result.stdout.fnmatch_lines(["goldens unchanged (*): tiny"])
    assert snapshot(project) == before


def test_a_new_check_after_one_whose_golden_exists_is_captured(project: pytest.Pytester) -> None:
    """A check added after one whose golden exists: the capture command its missing golden suggests
    captures it (the kept check is passed over, not the end of the test); a run where every check
    is kept reads skipped, with why."""
    project.makepyfile(test_tiny=RAISES_AFTER.replace('    parity.check(make_model(), make_inputs(), name="second", '
                                                      'dtypes=["float32"])\n', ''))
    project.runpytest("--rocm-parity", "--parity-mode=capture").assert_outcomes(passed=1)
    project.makepyfile(test_tiny=RAISES_AFTER)
    missing = project.runpytest("--rocm-parity")
    missing.assert_outcomes(failed=1)
    missing.stdout.fnmatch_lines(["*GoldenMissing*second*--parity-mode=capture*"])
    result = project.runpytest("--rocm-parity", "--parity-mode=capture")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["goldens created: second", "goldens kept (*): tiny"])
    project.runpytest("--rocm-parity").assert_outcomes(passed=1)
    again = project.runpytest("--rocm-parity", "--parity-mode=capture", "-rs")
    again.assert_outcomes(skipped=1)
    again.stdout.fnmatch_lines(["SKIPPED*golden for 'tiny' exists at *; golden for 'second' exists at *"])
