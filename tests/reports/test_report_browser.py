"""The HTML report rendered by a real headless browser (Debian's chromium).

CI: ``apt-get update && apt-get install -y chromium``. Skipped, with the reason, where no
chromium is installed. The screenshot is kept under the test's tmp dir and copied into
``$PARITY_ARTIFACTS`` when that is set.
"""
from __future__ import annotations

import html
import json
import os
import re
import shutil
import struct
import subprocess
from pathlib import Path
from typing import Any

import pytest

from pytest_rocm_parity.reports import report

pytestmark = pytest.mark.browser

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


# ---------------------------------------------------------------------------------------------
# layout, measured in the browser: labels, the exact band, numbers, the LM table, at two widths

LAYOUT_SCRIPT = """
<script>
(function () {
  function box(el) { var r = el.getBoundingClientRect();
                     return {l: r.left, r: r.right, t: r.top, b: r.bottom, w: r.width, h: r.height}; }
  function hit(a, b) { return a.l < b.r - 0.5 && b.l < a.r - 0.5 && a.t < b.b - 0.5 && b.t < a.b - 0.5; }
  var out = {plots: [], wrapped: [], cells: 0, lm: null, overflow: document.documentElement.scrollWidth};
  document.querySelectorAll("svg.plot").forEach(function (svg) {
    var s = box(svg), labels = [], clipped = [], overlaps = [], onLegend = [];
    var others = Array.prototype.filter.call(svg.querySelectorAll(":scope > text"),
                                             function (t) { return !t.classList.contains("xlabel"); });
    svg.querySelectorAll("text.xlabel").forEach(function (t) {
      var b = box(t), title = t.querySelector("title");
      labels.push({text: t.firstChild.nodeValue, title: title ? title.textContent : null, box: b});
      if (b.l < s.l - 0.5 || b.r > s.r + 0.5 || b.t < s.t - 0.5 || b.b > s.b + 0.5) clipped.push(t.firstChild.nodeValue);
      others.forEach(function (o) { if (hit(b, box(o))) onLegend.push(t.firstChild.nodeValue + " / " + o.textContent); });
    });
    for (var i = 0; i < labels.length; i++)
      for (var j = i + 1; j < labels.length; j++)
        if (hit(labels[i].box, labels[j].box)) overlaps.push(labels[i].text + " / " + labels[j].text);
    var cl = svg.querySelector("text.culprit-label"), onTitle = [], culpritClipped = false;
    if (cl) others.forEach(function (o) { if (o !== cl && hit(box(cl), box(o))) onTitle.push(o.textContent); });
    if (cl) { var cb = box(cl); culpritClipped = cb.l < s.l - 0.5 || cb.r > s.r + 0.5; }
    var band = svg.querySelector("rect.exact-band"), bb = band ? box(band) : null, outside = 0, zeros = 0;
    svg.querySelectorAll("circle.exact-zero").forEach(function (c) {
      zeros++; var cb = box(c), cy = (cb.t + cb.b) / 2; if (!bb || cy < bb.t || cy > bb.b) outside++; });
    out.plots.push({mode: svg.getAttribute("data-mode"), check: svg.closest("section").id, width: s.w, labels: labels.length,
                    titled: labels.filter(function (l) { return l.title; }).length,
                    full: labels.map(function (l) { return l.title; }), clipped: clipped, overlaps: overlaps,
                    onLegend: onLegend, culprit: !!cl, culpritOn: onTitle, culpritClipped: culpritClipped,
                    zeros: zeros, zerosOutsideBand: outside});
  });
  document.querySelectorAll("td.num, th").forEach(function (td) {
    if (!td.textContent.trim()) return;
    out.cells++;
    var range = document.createRange(); range.selectNodeContents(td);
    var tops = {}; Array.prototype.forEach.call(range.getClientRects(), function (r) {
      if (r.width > 0) tops[Math.round(r.top)] = 1; });
    if (Object.keys(tops).length > 1) out.wrapped.push(td.textContent);
  });
  out.reasons = []; document.querySelectorAll("td.reason").forEach(function (td) {
    if (td.textContent.length > 60) out.reasons.push({h: box(td.parentNode).h, text: td.textContent}); });
  var lm = document.querySelector("table.lm");
  if (lm) out.lm = {rows: lm.querySelectorAll("tr").length, text: lm.textContent,
                    gen: (document.querySelector("table.lm-gen") || {}).textContent || ""};
  var pre = document.createElement("pre"); pre.id = "layout"; pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
})();
</script>
"""


def _deep_check(n_blocks: int = 16) -> dict[str, Any]:
    """A failing check of a decoder-shaped model: blocks with attention and MLP children (depth 2)."""
    layers: list[dict[str, Any]] = []

    def add(name: str, level: int, err_ref: float, err_cand: float, passed: bool = True, prop_ok: bool = True) -> None:
        m = {"level": level, "budget_ratio": 10.0, "budget_propagated": 3.0}
        for pre in ("iso", "prop"):
            m.update({f"{pre}_kind": "float", f"{pre}_err_ref": err_ref, f"{pre}_err_cand": err_cand,
                      f"{pre}_rms_truth": 1.0, f"{pre}_ratio": (err_cand / err_ref) if err_ref else 0.0,
                      f"{pre}_ratio_lo": 1.0, f"{pre}_z": 0.0, f"{pre}_rel_to_ref": 1.234567e-05,
                      f"{pre}_nonfinite": 0, f"{pre}_mismatches": 0, f"{pre}_note": ""})
        layers.append({"name": name, "passed": passed, "iso_passed": passed, "prop_passed": prop_ok,
                       "primary": name, "metrics": m})

    add("model.embed_tokens", 0, 0.0, 0.0)           # a lookup: exactly the truth on both sides
    for i in range(n_blocks):
        b = f"model.layers.{i}"
        bad = i == n_blocks // 2
        add(b, 0, 1e-7, 4e-6 if bad else 1.1e-7, passed=not bad, prop_ok=i < n_blocks // 2)
        for child in ("self_attn", "self_attn.q_proj", "self_attn.rotary_emb", "mlp", "mlp.down_proj",
                      "input_layernorm"):
            add(f"{b}.{child}", child.count(".") + 1, 0.0 if child.endswith("rotary_emb") else 1e-7,
                0.0 if child.endswith("rotary_emb") else 1.2e-7)
    add("model.norm", 0, 1e-7, 2e-6, prop_ok=False)
    add("lm_head", 0, 1e-7, 2e-6, prop_ok=False)
    culprit = f"model.layers.{n_blocks // 2}"
    lm = {"ppl": 12.3456789, "ppl_ref": 12.3401234, "ppl_truth": 12.3400001, "ppl_rel_delta": 4.5e-4,
          "ppl_rel_delta_truth": 4.6e-4, "ppl_ref_rel_delta_truth": 1e-7, "log_ppl_err": 4.6e-4,
          "log_ppl_err_ref": 1e-7, "log_ppl_budget": 3e-5, "positions": 510, "top1_agreement": 0.9961,
          "flips": 2, "confident_flips": 1, "near_tie_margin": 0.0123, "logit_noise_rms": 0.0041,
          "top5_containment": 1.0, "kl_mean": 1.2e-6, "kl_max": 3.4e-4, "kl_truth_cand_mean": 1.3e-6,
          "kl_truth_ref_mean": 1e-9,
          "generation": {"steps": 16, "first_divergent_step": [None, 7], "exact_match_rows": 1,
                         "confident_divergences": 0, "teacher_forced_agreement": 1.0,
                         "teacher_forced_confident_flips": 0},
          "first_confident_disagreement": {"batch": 1, "position": 40, "ref_token": 311, "cand_token": 290,
                                           "ref_margin": 0.51, "layer": None}}
    return {"test": "tests/test_llama.py::test_llama", "name": "tiny-llama", "dtype": "bfloat16", "passed": False,
            "culprit": culprit, "culprit_block": culprit, "first_divergent": culprit, "kind": "lm",
            "reference_env": {"device": "cuda:0", "device_name": "NVIDIA H200"},
            "candidate_env": {"device": "cuda:0", "device_name": "AMD Instinct MI300X"},
            "golden": "goldens/tiny-llama", "layers": layers, "outputs": [], "extra": {"lm": lm}, "notes": []}


@pytest.mark.parametrize("width", [1280, 480])
def test_report_layout_in_chromium(width: int, report_doc: dict[str, Any], tmp_path: Path) -> None:
    browser = _browser()
    late = _deep_check(3) | {"name": "late", "culprit": "model.layers.2.mlp.down_proj"}   # named near the right edge
    for layer in late["layers"]:
        layer["passed"] = layer["iso_passed"] = layer["name"] != late["culprit"]
    doc = {**report_doc, "checks": [_deep_check(), _deep_check(3) | {"name": "shallow"}, late] + report_doc["checks"]}
    out = tmp_path / "report"
    report.write_all(doc, out)
    page = (out / "parity-report.html").read_text("utf-8").replace("</body>", LAYOUT_SCRIPT + "</body>")
    probe = out / "probe.html"
    probe.write_text(page, "utf-8")
    dom = _run(browser, tmp_path, f"--window-size={width},2000", "--virtual-time-budget=3000", "--dump-dom",
               probe.resolve().as_uri()).stdout
    m = re.search(r'<pre id="layout">(.*?)</pre>', dom, re.S)
    assert m, "the layout probe did not run"
    lay = json.loads(html.unescape(m.group(1)))
    assert len(lay["plots"]) == 10
    for p in lay["plots"]:
        # readable labels: some at every depth, none overlapping, clipped or on the legend
        assert p["labels"] >= 3, p
        assert p["titled"] == p["labels"], "every label carries the full name as a hover title"
        assert not p["overlaps"], p["overlaps"]
        assert not p["clipped"], p["clipped"]
        assert not p["onLegend"], p["onLegend"]
        assert not p["culpritOn"], f"the culprit label covers {p['culpritOn']}"
        assert not p["culpritClipped"], f"the culprit label runs off the plot in {p['check']}"
        assert p["width"] <= width  # the plot scales down with a narrow window
    deep = [p for p in lay["plots"] if p["check"] == "check-tiny-llama-bfloat16"]
    assert len(deep) == 2
    for p in deep:
        assert "model.layers.8" in p["full"]           # the culprit is always labelled
        assert p["labels"] >= 8                        # blocks across the depth, not just the ends
        # exact zeros (embedding, rotary) sit in the exact band, not at the log floor
        assert p["zeros"] >= 2 * 16 and p["zerosOutsideBand"] == 0
    # numbers never wrap mid-value, at either width
    assert lay["cells"] > 100 and not lay["wrapped"], lay["wrapped"][:10]
    # a long reason wraps in a column of its own width, not one word a line down a narrow column
    assert lay["reasons"] and max(r["h"] for r in lay["reasons"]) < 90, sorted(r["h"] for r in lay["reasons"])[-3:]
    assert lay["overflow"] <= width + 1 or width < 600   # at a phone width the tables scroll in their box
    # the LM metrics as a table, no raw dict or Python values
    lm = lay["lm"]
    assert lm and lm["rows"] >= 10
    assert "perplexity" in lm["text"] and "12.3" in lm["text"] and "KL(reference || candidate) max" in lm["text"]
    assert "sequence 1 at step 7" in lm["gen"]
    for text in (lm["text"], lm["gen"]):
        assert "None" not in text and "{" not in text and "[" not in text
