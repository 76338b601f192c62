"""One golden directory shared by two projects whose checks have the same (default) name: each
project's golden is its own. A replay of the other project's golden says whose it is (not "the
weights changed"), and neither capture nor --parity-regen overwrites it unasked."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_rocm_parity.options import ALLOW_REFERENCE_CHANGE, REGEN
from manifest_edits import rewrite_manifest

# the default check name, test_model.py::test_model, is the same in both projects
MODEL_TEST = '''
import torch

def test_model(parity):
    torch.manual_seed({seed})
    m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU(), torch.nn.Linear(8, 4)).eval()
    parity.check(m, torch.randn(4, 8, generator=torch.Generator().manual_seed(1)), dtypes=["float32"])
'''


@pytest.fixture
def shared(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Projects a and b, both with tests/test_model.py::test_model (other weights), both with
    parity_golden_dir = <shared>; a has captured its golden there."""
    shared = pytester.path / "shared"
    for project, seed in (("a", 0), ("b", 9)):
        (pytester.path / project / "tests").mkdir(parents=True)
        (pytester.path / project / "pytest.ini").write_text(f"[pytest]\ntestpaths = tests\nparity_golden_dir = {shared}\n")
        (pytester.path / project / "tests" / "test_model.py").write_text(MODEL_TEST.format(seed=seed))
    monkeypatch.chdir(pytester.path / "a")
    pytester.runpytest("--rocm-parity", "--parity-mode=capture").assert_outcomes(passed=1)
    monkeypatch.chdir(pytester.path / "b")
    return shared


def snapshot(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def test_a_replay_of_another_projects_golden_says_whose_it_is(pytester: pytest.Pytester, shared: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "400")   # pytest's short summary cuts its lines at the terminal's width
    result = pytester.runpytest("--rocm-parity", "--parity-report=rep")
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert "weights changed" not in out
    a = (pytester.path / "a").resolve()
    result.stdout.fnmatch_lines([
        "*GoldenStale: the golden for 'test_model.py::test_model' belongs to another project: its manifest "
        f"*manifest.json records the project {a} as the one that captured it*Give this check a name of its own, e.g. "
        "parity.check(..., name='b-test_model.py::test_model')*or give each project a golden directory of its own*"
        f"replace the golden on purpose: *{ALLOW_REFERENCE_CHANGE}",
        "goldens of another project (*): test_model.py::test_model"])
    assert "goldens stale" not in out
    # pytest's short summary, which shows the message's start only, says whose golden it is
    result.stdout.fnmatch_lines(["FAILED *test_model* - Failed: GoldenStale: the golden for "
                                 "'test_model.py::test_model' belongs to another project*"])
    # the reports list it too, beside the check's error
    doc = json.loads((pytester.path / "b" / "rep" / "parity-report.json").read_text())
    assert doc["goldens"]["foreign"] == ["test_model.py::test_model"] and not doc["goldens"]["stale"]
    assert doc["checks"][0]["error"]["kind"] == "foreign"
    html = (pytester.path / "b" / "rep" / "parity-report.html").read_text()
    assert "<tr><td>of another project</td><td>test_model.py::test_model</td></tr>" in html


def test_regen_refuses_to_overwrite_another_projects_golden(pytester: pytest.Pytester, shared: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The stale message's old fix, --parity-regen=NAME, and the bare --parity-regen: refused, the
    other project's golden byte for byte as it was, and its replay still passes."""
    before = snapshot(shared)
    for regen in (f"{REGEN}=test_model.py::test_model", REGEN):
        result = pytester.runpytest("--rocm-parity", regen)
        result.assert_outcomes(failed=1)
        result.stdout.fnmatch_lines(["*ReferenceChange: *the golden for 'test_model.py::test_model' belongs to "
                                     "another project*regenerating it would overwrite that project's golden*"])
        assert snapshot(shared) == before
    result = pytester.runpytest("--rocm-parity", "--parity-mode=capture", "-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["SKIPPED *kept: *belongs to another project*"])
    assert snapshot(shared) == before
    monkeypatch.chdir(pytester.path / "a")
    pytester.runpytest("--rocm-parity").assert_outcomes(passed=1)


OTHER_TEST = MODEL_TEST.replace("def test_model(", "def test_other(")


def test_a_regen_of_one_name_lists_only_that_name_as_another_projects(pytester: pytest.Pytester,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Two colliding names; --parity-regen asks for one: that one is refused and listed as another
    project's golden, the other is kept as every golden the glob does not match is (its skip reason
    still says whose it is)."""
    shared = pytester.path / "shared"
    for project, seed in (("a", 0), ("b", 9)):
        tests = pytester.path / project / "tests"
        tests.mkdir(parents=True)
        (pytester.path / project / "pytest.ini").write_text(f"[pytest]\ntestpaths = tests\nparity_golden_dir = {shared}\n")
        (tests / "test_model.py").write_text(MODEL_TEST.format(seed=seed))
        (tests / "test_other.py").write_text(OTHER_TEST.format(seed=seed))
    monkeypatch.chdir(pytester.path / "a")
    pytester.runpytest("--rocm-parity", "--parity-mode=capture").assert_outcomes(passed=2)
    monkeypatch.chdir(pytester.path / "b")
    before = snapshot(shared)
    result = pytester.runpytest("--rocm-parity", f"{REGEN}=test_model.py::test_model", "-rs")
    result.assert_outcomes(failed=1, skipped=1)
    result.stdout.fnmatch_lines(["*ReferenceChange: the golden for 'test_model.py::test_model' belongs to another "
                                 "project*",
                                 "goldens of another project (*): test_model.py::test_model",
                                 "goldens kept (*does not match them): test_other.py::test_other"])
    result.stdout.fnmatch_lines(["SKIPPED *kept: the golden for 'test_other.py::test_other' belongs to another "
                                 "project*"])
    assert snapshot(shared) == before


def test_the_other_projects_golden_is_replaced_only_on_purpose(pytester: pytest.Pytester, shared: Path) -> None:
    pytester.runpytest("--rocm-parity", REGEN, ALLOW_REFERENCE_CHANGE).assert_outcomes(passed=1)
    (manifest,) = shared.glob("*/manifest.json")
    assert json.loads(manifest.read_text())["project"] == "../b"
    pytester.runpytest("--rocm-parity").assert_outcomes(passed=1)


def test_a_golden_that_records_no_project_is_judged_as_before(pytester: pytest.Pytester, shared: Path) -> None:
    """An older golden (no "project"): stale as it always was, and --parity-regen rewrites it."""
    (manifest,) = shared.glob("*/manifest.json")
    rewrite_manifest(manifest, {k: v for k, v in json.loads(manifest.read_text()).items() if k != "project"})
    result = pytester.runpytest("--rocm-parity")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*GoldenStale: *the model's weights changed*"])
    assert "another project" not in result.stdout.str()
    pytester.runpytest("--rocm-parity", REGEN).assert_outcomes(passed=1)
    pytester.runpytest("--rocm-parity").assert_outcomes(passed=1)


def _git_project(path: Path, origin: str) -> None:
    import subprocess

    subprocess.run(["git", "init", "-q", str(path)], check=True)
    subprocess.run(["git", "-C", str(path), "remote", "add", "origin", origin], check=True)


def test_a_remote_store_names_projects_by_their_git_origin(pytester: pytest.Pytester,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Two projects sharing one fsspec store (no relative path means anything there): the second's
    --parity-regen is refused and the first's golden stays byte for byte; a clone of the first at
    another place, over SSH where the first used HTTPS with a token, is the same project and
    replays it; no credential reaches the manifest."""
    store = pytester.path / "store"
    url = store.as_uri()
    monkeypatch.setenv("XDG_CACHE_HOME", str(pytester.path / "cache"))
    for project, seed, origin in (("a", 0, "https://user:s3cret@github.com/org/a.git"),
                                  ("b", 9, "git@github.com:org/b.git"),
                                  ("a-clone", 0, "git@github.com:org/a.git")):
        (pytester.path / project / "tests").mkdir(parents=True)
        (pytester.path / project / "pytest.ini").write_text(f"[pytest]\ntestpaths = tests\nparity_golden_dir = {url}\n")
        (pytester.path / project / "tests" / "test_model.py").write_text(MODEL_TEST.format(seed=seed))
        _git_project(pytester.path / project, origin)
    monkeypatch.chdir(pytester.path / "a")
    pytester.runpytest("--rocm-parity", "--parity-mode=capture").assert_outcomes(passed=1)
    (manifest,) = store.rglob("manifest.json")
    assert json.loads(manifest.read_text())["project"] == "git github.com/org/a"
    assert "s3cret" not in manifest.read_text()
    before = snapshot(store)
    monkeypatch.chdir(pytester.path / "b")
    result = pytester.runpytest("--rocm-parity", f"{REGEN}=test_model.py::test_model")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*ReferenceChange: *belongs to another project*records the project git "
                                 "github.com/org/a as the one that captured it, and this run's is git github.com/org/b*"])
    assert snapshot(store) == before
    monkeypatch.chdir(pytester.path / "a-clone")
    pytester.runpytest("--rocm-parity").assert_outcomes(passed=1)
