"""pytest-html integration: the parity plot and verdict in pytest-html's report (its extras).

Inactive unless pytest-html is installed. The hook below is meant to be registered by the
session (see ``hook_lines`` in docs/reports.md): after each test's call phase it appends, for
every parity check that test ran, an HTML extra with the verdict, the culprit and the two
plots. The plots are the same inline SVG as parity-report.html, so pytest-html's
self-contained mode keeps them.
"""
from __future__ import annotations

import html
from typing import Any

import pytest


def extras_for(results: list[dict[str, Any]]) -> list[Any]:
    """pytest-html extras (``pytest_html.extras.html``) for check result dicts; [] without pytest-html."""
    try:
        from pytest_html import extras
    except ImportError:
        return []
    from pytest_rocm_parity.reports.report import svg_plot
    from pytest_rocm_parity.reports.summary import error_text

    out = []
    for r in results:
        if r.get("error"):   # no verdict, so no plots: what kept the check from one
            out.append(extras.html(f'<div class="rocm-parity"><p><b style="color:#6a1b9a">ERROR</b> '
                                   f'{html.escape(str(r.get("name")))} [{html.escape(str(r.get("dtype")))}]: '
                                   f'{html.escape(error_text(r))}</p></div>'))
            continue
        verdict = "PASS" if r.get("passed") else "FAIL"
        color = "#2e7d32" if r.get("passed") else "#c62828"
        layers = list(r.get("layers") or [])
        head = (f'<div class="rocm-parity"><p><b style="color:{color}">{verdict}</b> '
                f'{html.escape(str(r.get("name")))} [{html.escape(str(r.get("dtype")))}]'
                + (f' &middot; culprit <b style="color:#c62828">{html.escape(str(r["culprit"]))}</b>'
                   if r.get("culprit") else "")
                + (f' &middot; first divergent {html.escape(str(r["first_divergent"]))}'
                   if r.get("first_divergent") else "") + "</p>")
        plots = (svg_plot(layers, "iso", r.get("culprit"), r.get("first_divergent"), "Isolated", 480, 280)
                 + svg_plot(layers, "prop", r.get("culprit"), r.get("first_divergent"), "Propagated", 480, 280))
        out.append(extras.html(head + plots + "</div>"))
    return out


class HtmlExtras:
    """Registered by the ParitySession as a plugin when pytest-html is present."""

    def __init__(self, session: Any) -> None:
        self.session = session

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[Any]) -> Any:
        outcome = yield
        if call.when != "call":
            return
        report = outcome.get_result()
        mine = [r for r in self.session.results if r.get("test") == item.nodeid]
        new = extras_for(mine)
        if new:
            report.extras = list(getattr(report, "extras", [])) + new


def register(config: pytest.Config, session: Any) -> None:
    """Register the pytest-html hook when pytest-html is loaded; a no-op otherwise."""
    if config.pluginmanager.hasplugin("html"):
        config.pluginmanager.register(HtmlExtras(session), "rocm_parity_html_extras")
