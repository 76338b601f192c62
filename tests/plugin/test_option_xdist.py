"""pytest-xdist: one worker per GPU, results merged on the controller, goldens without collisions."""
from __future__ import annotations

import json

import pytest
import torch

from pytest_rocm_parity.errors import BackendUnavailable
from pytest_rocm_parity.options import resolve_device

pytest.importorskip("xdist")

MANY = '''
import pytest
from conftest import make_model, make_inputs

@pytest.mark.parametrize("i", range(4))
def test_many(parity, i):
    parity.check(make_model(), make_inputs(), name=f"m{i}", dtypes=["float32"])
'''


def test_workers_capture_and_report_merge(project: pytest.Pytester) -> None:
    project.makepyfile(test_many=MANY)
    project.runpytest_subprocess("-n", "2", "--rocm-parity", "--parity-mode=capture", "test_many.py").assert_outcomes(passed=4)
    assert sorted(p.name for p in (project.path / "goldens").iterdir()) == ["m0", "m1", "m2", "m3"]
    result = project.runpytest_subprocess("-n", "2", "--rocm-parity", "--parity-report=rep", "test_many.py")
    result.assert_outcomes(passed=4)
    doc = json.loads((project.path / "rep" / "parity-report.json").read_text())
    assert sorted(c["name"] for c in doc["checks"]) == ["m0", "m1", "m2", "m3"]


@pytest.fixture
def fake_gpus(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    chosen: list[int] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    return chosen


def test_one_gpu_per_worker(fake_gpus: list[int]) -> None:
    assert resolve_device("cuda", worker=0) == "cuda:0"
    assert resolve_device("auto", worker=1) == "cuda:1"
    assert fake_gpus == [0, 1]
    assert resolve_device("cuda:1", worker=0) == "cuda:1"   # explicit index: the user's choice
    assert resolve_device("cuda", worker=None) == "cuda"


def test_more_workers_than_gpus_is_refused(fake_gpus: list[int]) -> None:
    with pytest.raises(BackendUnavailable, match="gw2 has no GPU of its own .2 visible.*pytest -n 2"):
        resolve_device("cuda", worker=2)


CRASH = '''
import os, signal
from conftest import make_model, make_inputs

def test_used(parity):
    parity.check(make_model(), make_inputs(), name="used", dtypes=["float32"])

def test_crash():
    if os.environ.get("CRASH"):
        os.kill(os.getpid(), signal.SIGKILL)
'''


def test_a_crashed_worker_leaves_no_golden_called_obsolete(project: pytest.Pytester,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker that ran test_used crashed later: its record of the goldens its checks used is
    lost, so the golden test_used just passed against must not be listed obsolete, and the summary
    and the report say that they lack its checks."""
    project.makepyfile(test_crash=CRASH)
    project.runpytest_subprocess("-n", "1", "--rocm-parity", "--parity-mode=capture",
                                 "test_crash.py").assert_outcomes(passed=2)
    monkeypatch.setenv("CRASH", "1")
    result = project.runpytest_subprocess("-n", "1", "--rocm-parity", "-p", "no:randomly", "--parity-report=rep",
                                          "test_crash.py")
    result.assert_outcomes(passed=1, failed=1)
    assert "goldens obsolete" not in result.stdout.str(), result.stdout.str()
    assert (project.path / "goldens" / "used" / "manifest.json").exists()
    result.stdout.fnmatch_lines(["rocm-parity: incomplete: an xdist worker crashed, and the checks it ran *"])
    doc = json.loads((project.path / "rep" / "parity-report.json").read_text())
    assert doc["incomplete"].startswith("incomplete: an xdist worker crashed")
    assert "an xdist worker crashed" in (project.path / "rep" / "parity-report.html").read_text()


SAME_NAME = '''
from conftest import make_model, make_inputs

def test_{i}(parity):
    parity.check(make_model(), make_inputs(), name="dup", dtypes=["float32"])
'''


def test_two_workers_capturing_one_name_list_it_once(project: pytest.Pytester) -> None:
    """Each worker captures 'dup' (a duplicate name, an error of the run); one writes it and the other
    finds it written: the summary lists it as created only, not also as kept."""
    project.makepyfile(test_d1=SAME_NAME.format(i=1), test_d2=SAME_NAME.format(i=2))
    result = project.runpytest_subprocess("-n", "2", "--dist", "loadfile", "--rocm-parity", "--parity-mode=capture",
                                          "test_d1.py", "test_d2.py")
    result.stdout.fnmatch_lines(["goldens created: dup", "rocm-parity: error: check name 'dup' is used by *"])
    assert "goldens kept" not in result.stdout.str()


def test_merged_golden_logs_list_a_name_written_by_one_worker_and_kept_by_another_once() -> None:
    from pytest_rocm_parity.session import GoldenLog

    for first, second in (({"created": ["dup"]}, {"kept": ["dup"]}), ({"kept": ["dup"]}, {"updated": ["dup"]})):
        log = GoldenLog()
        log.merge(first)
        log.merge(second)
        assert log.kept == [] and log.created + log.updated == ["dup"]


INTERRUPTED = '''
from conftest import make_model, make_inputs

def test_interrupted(parity):
    parity.check(make_model(), make_inputs(), name="held", dtypes=["float32"])
    raise KeyboardInterrupt
'''


def test_a_golden_withheld_by_an_interrupted_worker_is_listed_once(project: pytest.Pytester) -> None:
    """xdist reports an interrupted worker down twice, each time with its output: the golden it
    captured and did not write is one line of the summary and one entry of the report."""
    project.makepyfile(test_interrupted=INTERRUPTED)
    result = project.runpytest_subprocess("-n", "2", "--rocm-parity", "--parity-mode=capture", "--parity-report=rep",
                                          "test_interrupted.py")
    result.stdout.fnmatch_lines(["goldens not created (the run stopped before test_interrupted.py::test_interrupted "
                                 "finished; nothing was written; *): held"])
    doc = json.loads((project.path / "rep" / "parity-report.json").read_text())
    assert [w["name"] for w in doc["goldens"]["withheld"]] == ["held"]
    assert not (project.path / "goldens" / "held").exists()

