"""Several tests judged against one golden (a migration's variants as parameters of one test): each
keeps its own failing tensors, its own HTML section and its own row, told apart by its test."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from safetensors import safe_open

from pytest_rocm_parity.reports import report

HERE = Path(__file__).parent
LONG = "sdpa_with_a_long_variant_name"

TEST_FILE = f'''
import os
import pytest
import parity_models


def test_a_ok(parity):
    m, x = parity_models.block_stack()
    parity.check(m, x, name="tiny_ok", dtypes=["float32"])


@pytest.mark.parametrize("attn", ["eager", "{LONG}"])
def test_b_variants(parity, attn):
    bug = os.environ.get("PARITY_TEST_BUG")
    m, x = parity_models.block_stack(int(bug) if bug else None)
    parity.check(m, x, name="tiny", dtypes=["float32"])


def test_c_missing(parity):
    m, x = parity_models.block_stack()
    parity.check(m, x, name="never_captured", dtypes=["float32"])
'''


@pytest.fixture
def variants_run(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Capture tiny from one variant and tiny_ok, then replay all three tests with a bug in blocks.2."""
    shutil.copy(HERE.parent / "parity_models.py", pytester.path / "parity_models.py")
    monkeypatch.syspath_prepend(str(pytester.path))
    pytester.makepyfile(test_variants=TEST_FILE)
    args = ("--rocm-parity", "--parity-golden-dir=goldens", "--parity-device=cpu", "-p", "no:cacheprovider")
    pytester.runpytest_inprocess(*args, "--parity-mode=capture", "-k", "a_ok or eager").assert_outcomes(passed=2)
    monkeypatch.setenv("PARITY_TEST_BUG", "2")
    run = pytester.runpytest_inprocess(*args, "--parity-report=rep")
    run.assert_outcomes(passed=1, failed=3)
    rep = pytester.path / "rep"
    return {"rep": rep, "doc": json.loads((rep / "parity-report.json").read_text()), "stdout": run.stdout.str()}


def _variants(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for c in doc["checks"] if c["name"] == "tiny"]


def test_each_variant_keeps_its_own_failing_tensors(variants_run: dict[str, Any]) -> None:
    checks = _variants(variants_run["doc"])
    assert len(checks) == 2 and not any(c["passed"] for c in checks)
    paths = [c["extra"]["failing_tensors"] for c in checks]
    assert len(set(paths)) == 2, paths
    for c, rel in zip(checks, paths):
        with safe_open(str(variants_run["rep"] / rel), "np") as f:
            assert f.metadata()["test"] == c["test"]
        assert f"failing tensors: {rel}" in variants_run["stdout"]
    assert len(list((variants_run["rep"] / "tensors").glob("*.safetensors"))) == 2


def test_a_default_name_holds_its_parameters_once(tmp_path: Path) -> None:
    name = "test_m.py::test_m[eager]"
    assert (report.failing_tensors_path(tmp_path, name, "float32", f"tests/{name}")
            == report.failing_tensors_path(tmp_path, name, "float32"))
    assert (report.failing_tensors_path(tmp_path, "m", "float32", "tests/test_m.py::test_m[eager]")
            != report.failing_tensors_path(tmp_path, "m", "float32", "tests/test_m.py::test_m[sdpa]"))


def test_each_variant_has_its_own_html_section_and_row(variants_run: dict[str, Any]) -> None:
    text = (variants_run["rep"] / "parity-report.html").read_text("utf-8")
    anchors = re.findall(r'<section class="check[^"]*" id="([^"]+)"', text)
    assert len(anchors) == len(set(anchors)) == 4, anchors
    links = re.findall(r'<td><a href="#([^"]+)">([^<]*)</a></td>', text)
    assert sorted(a for a, _ in links) == sorted(anchors)
    labels = [label for _, label in links]
    assert "tiny (test_b_variants[eager])" in labels and f"tiny (test_b_variants[{LONG}])" in labels


def _terminal_rows(stdout: str) -> list[str]:
    lines = stdout.split("rocm-parity summary", 1)[1].splitlines()
    return [l for l in lines if l.split(" ", 1)[0] in ("ERROR", "FAIL", "PASS")]


def test_the_html_summary_lists_checks_in_the_terminals_order(variants_run: dict[str, Any]) -> None:
    rows = _terminal_rows(variants_run["stdout"])
    terminal = [(l.split()[0], l.split("[float32]")[0].split(None, 1)[1].strip()) for l in rows]
    text = (variants_run["rep"] / "parity-report.html").read_text("utf-8")
    table = text.split('<table class="summary">', 1)[1].split("</table>", 1)[0]
    html_rows = re.findall(r'class="badge \w+">(\w+)</span></td><td><a href="#[^"]+">([^<]*)</a>', table)
    assert [v for v, _ in terminal] == ["ERROR", "FAIL", "FAIL", "PASS"]
    assert html_rows == terminal
    sections = re.findall(r'<section class="check[^"]*" id="([^"]+)"', text)
    assert sections == re.findall(r'<td><a href="#([^"]+)">', table)


def test_the_terminal_columns_stay_aligned_with_a_long_variant(variants_run: dict[str, Any]) -> None:
    rows = _terminal_rows(variants_run["stdout"])
    assert any(LONG in l for l in rows)
    assert len({l.index("[float32]") for l in rows}) == 1, "\n".join(rows)
