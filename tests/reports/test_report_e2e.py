"""End to end through pytest: capture, then a replay with --parity-report that finds a planted bug."""
from __future__ import annotations

import json
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pandas as pd
import pytest
from manifest_edits import rewrite_manifest

HERE = Path(__file__).parent

TEST_FILE = '''
import os
import parity_models


def test_tiny(parity):
    bug = os.environ.get("PARITY_TEST_BUG")
    m, x = parity_models.block_stack(int(bug) if bug else None)
    parity.check(m, x, name="tiny", dtypes=["float32"])
'''


def test_capture_then_replay_writes_reports(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    shutil.copy(HERE.parent / "parity_models.py", pytester.path / "parity_models.py")
    monkeypatch.syspath_prepend(str(pytester.path))
    pytester.makepyfile(test_tiny=TEST_FILE)
    cap = pytester.runpytest_inprocess("--rocm-parity", "--parity-mode=capture", "--parity-golden-dir=goldens",
                                       "-p", "no:cacheprovider")
    cap.assert_outcomes(passed=1)
    cap.stdout.fnmatch_lines(["*rocm-parity summary*", "goldens created: tiny"])
    # an old golden that no test uses any more
    old = pytester.path / "goldens" / "old_model"
    shutil.copytree(pytester.path / "goldens" / "tiny", old)
    manifest = json.loads((old / "manifest.json").read_text())
    rewrite_manifest(old / "manifest.json", {**manifest, "name": "old_model"})

    monkeypatch.setenv("PARITY_TEST_BUG", "2")
    rep = pytester.runpytest_inprocess("--rocm-parity", "--parity-golden-dir=goldens", "--parity-device=cpu",
                                       "--parity-report=sub/../rep", "--junitxml=junit.xml", "-p", "no:cacheprovider")
    rep.assert_outcomes(failed=1)
    rep.stdout.fnmatch_lines([
        "*rocm-parity summary*",
        "FAIL tiny [[]float32[]]  culprit blocks.2: isolated error*; first divergent blocks.2",
        "1 check: 0 passed, 1 failed",
        "report: */rep/parity-report.html*",
    ])
    assert "/../" not in next(l for l in rep.outlines if l.startswith("report: "))   # the path as it resolves
    # old_model's test file failed, so this run cannot prove it obsolete (tests/plugin/test_golden_prune.py)
    assert "goldens obsolete" not in rep.stdout.str()
    out = pytester.path / "rep"
    doc = json.loads((out / "parity-report.json").read_text())
    assert doc["checks"][0]["culprit"] == "blocks.2"
    html = (out / "parity-report.html").read_text("utf-8")
    assert "culprit: blocks.2" in html and html.count("<svg") == 2
    layers = pd.read_csv(out / "layers.csv")
    assert layers.loc[layers["is_culprit"], "layer"].tolist() == ["blocks.2"]
    assert pd.read_csv(out / "checks.csv")["culprit"].tolist() == ["blocks.2"]
    # the culprit reaches JUnit XML through record_property
    props = {p.get("name"): p.get("value") for p in ET.parse(pytester.path / "junit.xml").iter("property")}
    assert props["parity[tiny][float32]"] == "FAIL; culprit=blocks.2; first_divergent=blocks.2"
