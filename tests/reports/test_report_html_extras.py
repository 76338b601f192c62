"""pytest-html extras: the plot and verdict appended to pytest-html's report when it is installed."""
from __future__ import annotations

import sys
import types
from typing import Any

import pytest

from pytest_rocm_parity.reports import html_extras


def test_extras_with_a_stand_in_pytest_html(report_doc: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    fake = types.ModuleType("pytest_html")
    fake.extras = types.SimpleNamespace(html=lambda content: {"format_type": "html", "content": content})
    monkeypatch.setitem(sys.modules, "pytest_html", fake)
    monkeypatch.setitem(sys.modules, "pytest_html.extras", fake.extras)
    got = html_extras.extras_for(report_doc["checks"])
    assert len(got) == 2 and all(e["format_type"] == "html" for e in got)
    assert "FAIL" in got[0]["content"] and "culprit" in got[0]["content"] and got[0]["content"].count("<svg") == 2
    assert "PASS" in got[1]["content"]


def test_extras_without_pytest_html(report_doc: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pytest_html", None)  # import fails
    assert html_extras.extras_for(report_doc["checks"]) == []
