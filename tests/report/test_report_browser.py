"""The HTML report rendered by a real headless browser (Debian's chromium).

CI: ``apt-get update && apt-get install -y chromium``. Skipped, with the reason, where no
chromium is installed. The screenshot is kept under the test's tmp dir and copied into
``$PARITY_ARTIFACTS`` when that is set.
"""
from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
from pathlib import Path
from typing import Any

import pytest

from pytest_rocm_parity import report

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "chrome")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars"]


def _browser() -> str:
    env = os.environ.get("PARITY_CHROMIUM")
    for name in ((env,) if env else ()) + BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    pytest.skip("no chromium to render the HTML report (Debian/Ubuntu: apt-get install -y chromium; "
                "or set PARITY_CHROMIUM to a Chrome/Chromium binary)")


def _run(browser: str, tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [browser, *FLAGS, f"--user-data-dir={tmp / 'profile'}", *args]
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=True)
    except subprocess.CalledProcessError as exc:
        pytest.fail(f"{' '.join(cmd)} exited {exc.returncode}:\n{exc.stderr[-2000:]}")


def _png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", "screenshot is not a PNG"
    return struct.unpack(">II", head[16:24])


def test_report_renders_plot_and_culprit_in_chromium(report_doc: dict[str, Any], tmp_path: Path) -> None:
    browser = _browser()
    out = tmp_path / "report"
    report.write_all(report_doc, out)
    url = (out / "parity-report.html").resolve().as_uri()

    dom = _run(browser, tmp_path, "--virtual-time-budget=2000", "--dump-dom", url).stdout
    # the plots are live SVG in the rendered DOM: 2 per check, with their series and points
    assert len(re.findall(r"<svg\b", dom)) == 4
    assert len(re.findall(r'<polyline class="series-cand"', dom)) == 4
    assert len(re.findall(r"<circle\b", dom)) > 40
    assert 'class="culprit-band"' in dom
    # the culprit and the verdict are rendered as text
    assert re.search(r'class="culprit-label"[^>]*>culprit: blocks\.2<', dom)
    assert re.search(r'<span class="culprit">blocks\.2</span>', dom)
    assert ">FAIL<" in dom and ">PASS<" in dom
    assert "AMD Instinct MI300X" in dom and "NVIDIA H100" in dom

    shot = tmp_path / "parity-report.png"
    _run(browser, tmp_path, "--window-size=1280,1600", f"--screenshot={shot}", url)
    assert shot.is_file() and shot.stat().st_size > 20_000  # a blank page compresses to a few KiB
    assert _png_size(shot) == (1280, 1600)
    artifacts = os.environ.get("PARITY_ARTIFACTS")
    if artifacts:
        Path(artifacts).mkdir(parents=True, exist_ok=True)
        shutil.copy2(shot, Path(artifacts) / "parity-report.png")
        shutil.copy2(out / "parity-report.html", Path(artifacts) / "parity-report.html")
