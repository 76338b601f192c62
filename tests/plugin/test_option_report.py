"""--parity-report=DIR: parity-report.json with the documented schema, plus JUnit properties."""
from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest


def test_report_json_schema(project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    project.runpytest("--rocm-parity", "--parity-mode=capture").assert_outcomes(passed=1)
    monkeypatch.setenv("BUG", "2")
    project.runpytest("--rocm-parity", "--parity-report=out", "--junitxml=junit.xml").assert_outcomes(failed=1)
    doc = json.loads((project.path / "out" / "parity-report.json").read_text())
    (check,) = doc["checks"]
    assert check["test"] == "test_tiny.py::test_tiny"
    assert check["name"] == "tiny" and check["dtype"] == "float32" and check["passed"] is False
    assert check["culprit"] == "blocks.2.act"
    assert check["first_divergent"] == "blocks.2"
    assert check["reference_env"]["torch"] and check["candidate_env"]["device"] == "cpu"
    names = [layer["name"] for layer in check["layers"]]
    assert names[0] == "emb" and "blocks.2.act" in names and names[-1] == "head"
    bad = next(layer for layer in check["layers"] if layer["name"] == "blocks.2.act")
    assert bad["passed"] is False and bad["metrics"]["iso_ratio"] > 10
    ok = next(layer for layer in check["layers"] if layer["name"] == "blocks.0")
    assert ok["passed"] is True
    props = {p.get("name"): p.get("value") for p in ET.parse(project.path / "junit.xml").iter("property")}
    assert "culprit=blocks.2.act" in props["parity[tiny][float32]"]


def test_a_reused_report_folder_shows_this_runs_failing_tensors_only(project: pytest.Pytester,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A runner that reuses its workspace writes into last run's report folder: the failing tensors
    saved then are gone, and the passing check's HTML links none."""
    project.runpytest("--rocm-parity", "--parity-mode=capture").assert_outcomes(passed=1)
    monkeypatch.setenv("BUG", "2")
    project.runpytest("--rocm-parity", "--parity-report=out").assert_outcomes(failed=1)
    saved = project.path / "out" / "tensors" / "tiny-float32.safetensors"
    assert saved.is_file() and "Obtained tensors" in (project.path / "out" / "parity-report.html").read_text()
    other = project.path / "out" / "tensors" / "mine.safetensors"   # not one of ours: left alone
    other.write_bytes(b"not a safetensors file")
    monkeypatch.delenv("BUG")
    project.runpytest("--rocm-parity", "--parity-report=out").assert_outcomes(passed=1)
    assert not saved.exists() and other.exists()
    assert "Obtained tensors" not in (project.path / "out" / "parity-report.html").read_text()


def test_ini_report_dir(project: pytest.Pytester) -> None:
    project.makeini("[pytest]\nparity_report = rep\n")
    project.runpytest("--rocm-parity", "--parity-mode=capture").assert_outcomes(passed=1)
    project.runpytest("--rocm-parity").assert_outcomes(passed=1)
    doc = json.loads((project.path / "rep" / "parity-report.json").read_text())
    assert doc["checks"][0]["passed"] is True


@pytest.mark.parametrize("given, says", [("report.html", "is a file"), ("new.html", "names a file"),
                                         ("report.html/sub", "not a folder")])
def test_a_report_path_that_is_not_a_folder_is_refused_before_the_run(project: pytest.Pytester, given: str,
                                                                       says: str) -> None:
    """The reports are several files in one folder: a file's name is a usage error at start-up, not
    a crash after the whole suite ran, and nothing is created."""
    (project.path / "report.html").write_text("an older report\n")
    result = project.runpytest("--rocm-parity", f"--parity-report={given}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*--parity-report={given!r}*{says}*--parity-report=parity-report*"])
    assert not (project.path / "new.html").exists() and (project.path / "report.html").is_file()


def test_a_report_folder_where_no_folder_can_be_made_is_refused_before_the_run(project: pytest.Pytester) -> None:
    """/proc takes no new folder, whatever its permission bits tell root: refused at start-up, with
    the reason, and the probe leaves nothing behind where it can write."""
    result = project.runpytest("--rocm-parity", "--parity-report=/proc/parity-report")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--parity-report='/proc/parity-report'*cannot be created (no folder can be made "
                                 "in /proc: *--parity-report=parity-report*"])
    project.runpytest("--rocm-parity", "--parity-mode=capture", "--parity-report=fine").assert_outcomes(passed=1)
    assert not list(project.path.glob(".parity-report-probe-*"))



def test_reports_that_cannot_be_written_at_the_end_are_a_run_error_and_the_summary_prints(
        project: pytest.Pytester) -> None:
    """The folder was fine at start-up and is a file by the end (a test wrote one there): the run
    fails with the reason, and the parity summary still prints."""
    project.runpytest("--rocm-parity", "--parity-mode=capture").assert_outcomes(passed=1)
    project.makepyfile(test_zz_clobber='def test_clobber():\n    open("out", "w").write("not a folder")\n')
    result = project.runpytest("--rocm-parity", "--parity-report=out")
    result.assert_outcomes(passed=2)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*rocm-parity summary*", "PASS tiny*",
                                 "rocm-parity: error: --parity-report *out: the reports could not be written*"])
    assert "parity-report.html (tables" not in result.stdout.str()   # no pointer to files not written


def test_a_capture_run_writes_a_report_that_says_capture_with_a_readable_checks_csv(project: pytest.Pytester) -> None:
    """A capture judges no check: its report says capture, lists the goldens it wrote, and its
    checks.csv is a header that pandas reads as an empty table."""
    pd = pytest.importorskip("pandas")
    project.runpytest("--rocm-parity", "--parity-mode=capture", "--parity-report=out").assert_outcomes(passed=1)
    out = project.path / "out"
    doc = json.loads((out / "parity-report.json").read_text())
    assert doc["mode"] == "capture" and doc["checks"] == [] and doc["goldens"]["created"] == ["tiny"]
    checks = pd.read_csv(out / "checks.csv")
    assert checks.empty and {"test", "check", "dtype", "passed", "culprit", "error"} <= set(checks.columns)
    html = (out / "parity-report.html").read_text()
    assert "<title>rocm-parity report (capture run)</title>" in html and "judges no check" in html
    project.runpytest("--rocm-parity", "--parity-report=out").assert_outcomes(passed=1)
    assert json.loads((out / "parity-report.json").read_text())["mode"] == "replay"
    assert len(pd.read_csv(out / "checks.csv")) == 1
