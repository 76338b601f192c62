"""--parity-replay: full (propagated + isolated passes) or fast (one teacher-forced run of the forward)."""
from __future__ import annotations

import json

import pytest


def _capture(project: pytest.Pytester) -> None:
    project.runpytest("--rocm-parity", "--parity-mode=capture").assert_outcomes(passed=1)


def _report(project: pytest.Pytester, *args: str) -> tuple[pytest.RunResult, dict]:
    result = project.runpytest("--rocm-parity", "--parity-report=rep", *args)
    return result, json.loads((project.path / "rep" / "parity-report.json").read_text())


def test_fast_replay_judges_isolated_pass_only(project: pytest.Pytester) -> None:
    _capture(project)
    result, doc = _report(project, "--parity-replay=fast")
    result.assert_outcomes(passed=1)
    check = doc["checks"][0]
    assert any("fast replay" in n for n in check["notes"])
    assert check["outputs"] == []                       # model outputs: not judged end to end
    layers = check["layers"]
    assert layers and all("iso_ratio" in l["metrics"] and "prop_ratio" not in l["metrics"] for l in layers)


def test_full_replay_is_the_default_and_judges_both(project: pytest.Pytester) -> None:
    _capture(project)
    result, doc = _report(project)
    result.assert_outcomes(passed=1)
    check = doc["checks"][0]
    assert check["outputs"] and not any("fast replay" in n for n in check["notes"])
    assert all("prop_ratio" in l["metrics"] for l in check["layers"] if l["metrics"]["level"] == 0)


def test_fast_replay_blames_the_seeded_block(project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    _capture(project)
    monkeypatch.setenv("BUG", "1")
    result, doc = _report(project, "--parity-replay=fast")
    result.assert_outcomes(failed=1)
    assert doc["checks"][0]["culprit"] == "blocks.1.act"


def test_ini_key_and_marker_argument(project: pytest.Pytester) -> None:
    _capture(project)
    project.makeini("[pytest]\nparity_replay = fast\n")
    _, doc = _report(project)
    assert any("fast replay" in n for n in doc["checks"][0]["notes"])
    # the check's own argument wins over the ini key
    project.makepyfile(test_tiny='''
from conftest import make_model, make_inputs

def test_tiny(parity):
    parity.check(make_model(), make_inputs(), name="tiny", dtypes=["float32"], replay="full")
''')
    _, doc = _report(project)
    assert not any("fast replay" in n for n in doc["checks"][0]["notes"])


def test_bad_value_is_a_usage_error(project: pytest.Pytester) -> None:
    result = project.runpytest("--rocm-parity", "--parity-replay=quick")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--parity-replay='quick'*auto*full*fast*"])


def test_bad_argument_names_the_fix(project: pytest.Pytester) -> None:
    _capture(project)
    project.makepyfile(test_tiny='''
from conftest import make_model, make_inputs

def test_tiny(parity):
    parity.check(make_model(), make_inputs(), name="tiny", dtypes=["float32"], replay="quick")
''')
    result = project.runpytest("--rocm-parity")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*replay='quick'*allowed 'auto' or 'full' or 'fast'*"])


def test_auto_is_fast_above_one_billion_parameters() -> None:
    from pytest_rocm_parity import api

    class Sized:
        def __init__(self, n: int) -> None:
            self.n = n

        def parameters(self):  # what replay_kind_of reads: the parameter count
            import torch

            return [torch.empty(1).expand(self.n)]

    assert api.replay_kind_of(Sized(api.AUTO_DRILL_MAX_PARAMS + 1), "auto") == "fast"
    assert api.replay_kind_of(Sized(1000), "auto") == "full"
    assert api.replay_kind_of(Sized(api.AUTO_DRILL_MAX_PARAMS + 1), "full") == "full"
