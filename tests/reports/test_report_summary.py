"""The terminal summary: a line per check (model, dtype, verdict, culprit) and the golden lists."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from pytest_rocm_parity.session import GoldenLog
from pytest_rocm_parity.reports.summary import summary_lines


def _session(results: list[dict[str, Any]], **goldens: Any) -> Any:
    log = GoldenLog(**{k: v for k, v in goldens.items() if k in ("created", "updated", "missing", "kept")})
    return SimpleNamespace(results=results, goldens=log, obsolete=goldens.get("obsolete", []),
                           pruned=goldens.get("pruned", []), options=SimpleNamespace(report_dir=Path("rep")))


def test_summary_lists_checks_and_goldens(report_doc: dict[str, Any]) -> None:
    s = _session(report_doc["checks"], created=["new_model"], updated=["tiny_ok"], missing=["absent_model"],
                 obsolete=["old_model"])
    lines = summary_lines(s)
    text = "\n".join(lines)
    assert "rocm-parity summary" in lines[1]
    fail = next(l for l in lines if l.startswith("FAIL"))
    assert "tiny" in fail and "[float32]" in fail and "culprit blocks.2" in fail and "first divergent blocks.2" in fail
    assert "isolated error" in fail  # the culprit's reason
    assert any(l.startswith("PASS tiny_ok") and "[float32]" in l for l in lines)
    assert lines.index(fail) < next(i for i, l in enumerate(lines) if l.startswith("PASS"))  # failures first
    assert "profile: share of time grew: aten::mm 10.0%->78.0% (7.8x)" in text
    assert "2 checks: 1 passed, 1 failed" in text
    assert "goldens created: new_model" in text
    assert "goldens updated: tiny_ok" in text
    assert "goldens missing: absent_model" in text
    assert "goldens obsolete (no collected test uses them; --parity-prune-obsolete deletes): old_model" in text
    assert "report: rep/parity-report.html" in text


def test_summary_empty_session_prints_nothing() -> None:
    assert summary_lines(_session([])) == []


def test_summary_obsolete_only_and_long_lists() -> None:
    names = [f"m{i}" for i in range(25)]
    text = "\n".join(summary_lines(_session([], obsolete=names)))
    assert "goldens obsolete" in text and "m19" in text and "m20" not in text and "(+5)" in text
