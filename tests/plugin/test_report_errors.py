"""A check that reaches no verdict (its golden missing, corrupt or stale) is an ERROR in the summary and in every
report, never left out: a CI artifact must not look all-green when a golden could not be read."""
from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest
from manifest_edits import rewrite_manifest

TWO_CHECKS = '''
from conftest import make_model, make_inputs

def test_broken(parity):
    parity.check(make_model(), make_inputs(), name="broken", dtypes=["float32"])

def test_fine(parity):
    parity.check(make_model(), make_inputs(), name="fine", dtypes=["float32"])
'''

LFS_POINTER = "version https://git-lfs.github.com/spec/v1\noid sha256:4d7a\nsize 35240\n"


def _lfs_pointer(golden: Path) -> None:
    """What a checkout without `git lfs pull` leaves in place of the tensor file."""
    (tensors,) = golden.glob("*.safetensors")
    tensors.write_text(LFS_POINTER)


def _truncated_manifest(golden: Path) -> None:
    m = golden / "manifest.json"
    m.write_text(m.read_text()[:40])


def _other_model(golden: Path) -> None:
    m = golden / "manifest.json"
    doc = json.loads(m.read_text())
    doc["fingerprint"] = {k: "0" * len(str(v)) for k, v in doc["fingerprint"].items()}
    rewrite_manifest(m, doc, indent=1, sort_keys=True)


@pytest.fixture
def two(project: pytest.Pytester) -> pytest.Pytester:
    (project.path / "test_tiny.py").unlink()
    project.makepyfile(test_two=TWO_CHECKS)
    project.runpytest("--rocm-parity", "--parity-mode=capture").assert_outcomes(passed=2)
    return project


@pytest.mark.parametrize("damage, kind, says", [
    (_lfs_pointer, "corrupt", "GoldenCorrupt"),
    (_truncated_manifest, "corrupt", "GoldenCorrupt"),
    (_other_model, "stale", "GoldenStale"),
], ids=["lfs-pointer", "truncated-manifest", "stale"])
def test_unreadable_golden_is_an_error_everywhere(two: pytest.Pytester, damage: Callable[[Path], None], kind: str,
                                                  says: str) -> None:
    damage(two.path / "goldens" / "broken")
    result = two.runpytest("--rocm-parity", "--parity-report=rep", "--junitxml=junit.xml")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines([
        "*rocm-parity summary*",
        "ERROR broken [[]float32[]]",
        f"      golden {kind}: *",
        "PASS  fine   [[]float32[]]",
        "2 checks: 1 passed, 0 failed, 1 error",
        f"goldens {kind} (*): broken",
    ])
    doc = json.loads((two.path / "rep" / "parity-report.json").read_text())
    entry = next(c for c in doc["checks"] if c["name"] == "broken")
    assert entry["passed"] is False and entry["test"] == "test_two.py::test_broken" and entry["dtype"] == "float32"
    assert entry["error"]["kind"] == kind and entry["error"]["type"] == says and entry["error"]["message"]
    assert entry["error"]["message"].count("git lfs pull") <= 1   # one way to restore it, said once
    assert doc["goldens"][kind] == ["broken"]
    checks = pd.read_csv(two.path / "rep" / "checks.csv").set_index("check")
    assert checks.loc["broken", "error"] == kind and not checks.loc["broken", "passed"]
    assert checks.loc["broken", "error_message"].startswith(f"golden {kind}: ")
    html = (two.path / "rep" / "parity-report.html").read_text("utf-8")
    assert "2 checks, 0 failing, 1 error" in html and '<span class="badge error">ERROR</span>' in html
    assert 'id="check-broken-float32"' in html
    props = {p.get("name"): p.get("value") for p in ET.parse(two.path / "junit.xml").iter("property")}
    assert props["parity[broken][float32]"].startswith(f"ERROR; golden {kind}: ")
    assert props["parity[fine][float32]"] == "PASS"


def test_missing_golden_is_an_error_too(two: pytest.Pytester) -> None:
    import shutil

    shutil.rmtree(two.path / "goldens" / "broken")
    result = two.runpytest("--rocm-parity", "--parity-report=rep")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["ERROR broken [[]float32[]]", "      golden missing: no golden for 'broken'*",
                                 "2 checks: 1 passed, 0 failed, 1 error", "goldens missing: broken"])
    doc = json.loads((two.path / "rep" / "parity-report.json").read_text())
    assert [c["error"]["kind"] for c in doc["checks"] if c.get("error")] == ["missing"]


def test_errors_from_xdist_workers_reach_the_report(two: pytest.Pytester) -> None:
    pytest.importorskip("xdist")
    _lfs_pointer(two.path / "goldens" / "broken")
    result = two.runpytest_subprocess("-n", "2", "--rocm-parity", "--parity-report=rep")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["ERROR broken [[]float32[]]", "2 checks: 1 passed, 0 failed, 1 error",
                                 "goldens corrupt (*): broken"])
    doc = json.loads((two.path / "rep" / "parity-report.json").read_text())
    assert {c["name"]: c.get("error", {}).get("kind") for c in doc["checks"]} == {"broken": "corrupt", "fine": None}
    assert doc["goldens"]["corrupt"] == ["broken"]


def _edit_manifest(golden: Path, edit: Callable[[dict[str, object]], None]) -> None:
    m = golden / "manifest.json"
    doc = json.loads(m.read_text())
    edit(doc)
    rewrite_manifest(m, doc, indent=1, sort_keys=True)


@pytest.mark.parametrize("edit, field", [
    (lambda doc: doc.pop("layers"), "'layers'"),
    (lambda doc: doc.update(dtypes=["float33"]), "'dtypes'*'float33'"),
    (lambda doc: doc.update(dtypes=["float32", "float16"]), "'dtypes' lists float32, float16, but 'rungs' holds float32"),
], ids=["layers-deleted", "unknown-dtype", "dtypes-without-rung"])
def test_a_manifest_field_deleted_or_unknown_is_corrupt_naming_the_file_and_the_field(
        two: pytest.Pytester, edit: Callable[[dict[str, object]], None], field: str) -> None:
    """Read as "no layers", a deleted 'layers' would make every layer look added (stale); an unknown
    dtype name would pass unread. Both are a damaged manifest."""
    _edit_manifest(two.path / "goldens" / "broken", edit)
    result = two.runpytest("--rocm-parity")
    result.assert_outcomes(passed=1, failed=1)
    manifest = two.path / "goldens" / "broken" / "manifest.json"
    result.stdout.fnmatch_lines([f"      golden corrupt: {manifest}: manifest does not describe a golden: *{field}*",
                                 "goldens corrupt (*): broken"])
    assert "stale" not in result.stdout.str()


DROPPED_OUTPUT_TEST = '''
import os, torch
from torch import nn


class Two(nn.Module):
    """Returns its output and a second one, which the candidate drops (DROP=1)."""
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        y = self.lin(x)
        return {"y": y} if os.environ.get("DROP") else {"y": y, "twice": 2 * y}


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.two = Two()
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        return self.head(self.two(x)["y"])


def test_dropped(parity):
    torch.manual_seed(0)
    parity.check(Net(), torch.randn(4, 8, generator=torch.Generator().manual_seed(0)), name="dropped",
                 dtypes=["float32"])
'''


def test_the_json_report_of_an_infinite_ratio_is_strict_json(project: pytest.Pytester,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A main output the candidate drops has an infinite ratio; the JSON report writes it as a string
    every JSON parser reads (Python's bare Infinity is refused by JSON.parse), and layer_frame reads
    it back as the number."""
    from pytest_rocm_parity import layer_frame

    (project.path / "test_tiny.py").unlink()
    project.makepyfile(test_dropped=DROPPED_OUTPUT_TEST)
    project.runpytest("--rocm-parity", "--parity-mode=capture").assert_outcomes(passed=1)
    monkeypatch.setenv("DROP", "1")
    project.runpytest("--rocm-parity", "--parity-report=rep").assert_outcomes(failed=1)
    text = (project.path / "rep" / "parity-report.json").read_text()

    def refuse(constant: str) -> None:
        raise ValueError(f"bare {constant} in the JSON report")
    json.loads(text, parse_constant=refuse)
    assert '"Infinity"' in text
    df = layer_frame(project.path / "rep").set_index("layer")
    assert df.loc["two", "iso_ratio"] == float("inf")
