"""HTML and CSV reports from real CheckResults (engine capture/replay with a planted bug)."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import torch
from safetensors import safe_open

from pytest_rocm_parity.reports import report


def test_real_failing_result_names_the_planted_culprit(parity_results: dict[str, Any]) -> None:
    failing, passing = parity_results["failing"], parity_results["passing"]
    assert not failing.passed and failing.culprit == "blocks.2"
    assert passing.passed and passing.culprit is None


def test_write_all_writes_html_and_csv(report_doc: dict[str, Any], tmp_path: Path) -> None:
    written = report.write_all(report_doc, tmp_path)
    assert set(written) == {"html", "layers_csv", "checks_csv"}
    assert written["html"] == tmp_path / "parity-report.html"

    layers = pd.read_csv(tmp_path / "layers.csv")
    n_rows = sum(len(c["layers"]) + len(c["outputs"]) for c in report_doc["checks"])
    assert len(layers) == n_rows
    # every metric produced by records.py is a column
    metric_keys = {k for c in report_doc["checks"] for l in c["layers"] for k in l["metrics"]}
    assert metric_keys <= set(layers.columns)
    culprit = layers[layers["is_culprit"]]
    assert list(culprit["layer"]) == ["blocks.2"] and list(culprit["check"]) == ["tiny"]
    assert culprit["iso_ratio"].iloc[0] > culprit["budget_ratio"].iloc[0]

    checks = pd.read_csv(tmp_path / "checks.csv")
    assert list(checks["check"]) == ["tiny", "tiny_ok"]
    row = checks.set_index("check").loc["tiny"]
    assert row["culprit"] == "blocks.2" and not row["passed"] and "aten::mm" in row["profile_flags"]
    assert "rocm" in row["candidate"] and "cuda" in row["reference"]


def test_the_htmls_failing_count_is_the_csvs_and_drift_is_counted_apart(report_doc: dict[str, Any],
                                                                         tmp_path: Path) -> None:
    """A bug in blocks.2 drifts into the layers after it: those pass (their isolated verdicts do) and
    the HTML counts them apart, so its failing count is layers.csv's."""
    report.write_all(report_doc, tmp_path)
    layers = pd.read_csv(tmp_path / "layers.csv")
    tiny = layers[layers["check"] == "tiny"]
    failing = int((~tiny["passed"]).sum())
    drift = int((tiny["passed"] & ~tiny["prop_passed"].fillna(True).astype(bool)).sum())
    assert drift > 0, tiny[["layer", "passed", "prop_passed"]]
    text = (tmp_path / "parity-report.html").read_text()
    assert f"layers and outputs ({failing} failing, {drift} with drift propagated)" in text


def test_html_is_self_contained(report_doc: dict[str, Any], tmp_path: Path) -> None:
    report.write_all(report_doc, tmp_path)
    text = (tmp_path / "parity-report.html").read_text("utf-8")
    assert "<script" not in text.lower()
    # the only absolute URL is the SVG namespace, which is never fetched
    urls = set(re.findall(r"(?:https?:)?//[^\s\"'<>)]+", text))
    assert urls <= {"http://www.w3.org/2000/svg"}, urls
    assert not re.search(r"""\b(?:src|href)\s*=\s*["'](?:https?:)?//""", text)
    assert "@import" not in text and "url(" not in text
    # per check: two plots, the culprit, both environments, the verdict
    assert text.count("<svg") == 4
    assert "culprit: blocks.2" in text and "AMD Instinct MI300X" in text and "NVIDIA H100" in text
    assert 'class="badge fail"' in text and 'class="badge pass"' in text
    assert "aten::mm" in text  # profiler flags shown
    assert "old_model" in text and "absent_model" in text  # goldens obsolete / missing


def test_html_escapes_names(report_doc: dict[str, Any], tmp_path: Path) -> None:
    doc = dict(report_doc)
    c = dict(doc["checks"][0], name="<img src=x onerror=alert(1)>", culprit="<b>x</b>")
    doc["checks"] = [c]
    text = report.render_html(doc, tmp_path)
    assert "<img src=x" not in text and "<b>x</b>" not in text
    assert "&lt;img src=x onerror=alert(1)&gt;" in text


def test_plot_handles_nonfinite_and_exact_layers() -> None:
    layers = [
        {"name": "a", "passed": True, "iso_passed": True, "prop_passed": True,
         "metrics": {"level": 0, "budget_ratio": 4.0, "budget_propagated": 3.0, "iso_kind": "float",
                     "iso_err_cand": 0.0, "iso_err_ref": 0.0, "iso_rms_truth": 0.0, "iso_ratio": 0.0}},
        {"name": "b", "passed": False, "iso_passed": False, "prop_passed": True,
         "metrics": {"level": 0, "budget_ratio": 4.0, "budget_propagated": 3.0, "iso_kind": "float",
                     "iso_err_cand": float("nan"), "iso_err_ref": 1e-7, "iso_rms_truth": 1.0,
                     "iso_ratio": float("inf"), "iso_nonfinite": 3}},
        {"name": "c", "passed": False, "iso_passed": False, "prop_passed": True,
         "metrics": {"level": 0, "budget_ratio": 4.0, "budget_propagated": 3.0, "iso_kind": "exact",
                     "iso_err_cand": 0.0, "iso_err_ref": 0.0, "iso_mismatches": 5}},
    ]
    svg = report.svg_plot(layers, "iso", "b", None, "t")
    assert svg.startswith("<svg") and svg.endswith("</svg>") and "nan" not in svg.split("<title>")[0]
    assert "culprit: b" in svg
    assert report.svg_plot([], "prop", None, None, "empty").count("no float layers") == 1


def test_write_all_never_raises(report_doc: dict[str, Any], tmp_path: Path) -> None:
    (tmp_path / "parity-report.html").mkdir()  # the HTML cannot be written: the CSVs still are
    with pytest.warns(RuntimeWarning, match="could not write the html report"):
        written = report.write_all(report_doc, tmp_path)
    assert set(written) == {"layers_csv", "checks_csv"}
    # a document with holes still renders
    assert "<svg" in report.render_html({"checks": [{"name": "x", "layers": None, "outputs": None}]})


def test_save_failing_tensors(parity_results: dict[str, Any], report_doc: dict[str, Any], tmp_path: Path) -> None:
    failing = parity_results["failing"]
    tensors = {"blocks.2/0/isolated": torch.randn(16, 32), "blocks.2/0/propagated": torch.randn(16, 32),
               "inp/0/isolated": torch.randn(16, 32),          # passing layer: left out
               "blocks.20/0/isolated": torch.randn(2)}        # a name prefix, not the layer: left out
    saved = dict(failing.extra)
    try:
        path = report.save_failing_tensors(failing, tensors, tmp_path)
        assert path == report.failing_tensors_path(tmp_path, "tiny", "float32") and path.is_file()
        assert failing.extra["failing_tensors"] == "tensors/tiny-float32.safetensors"
        with safe_open(str(path), framework="pt") as f:
            assert set(f.keys()) == {"blocks.2/0/isolated", "blocks.2/0/propagated"}
            meta = f.metadata()
            assert meta["culprit"] == "blocks.2" and meta["check"] == "tiny"
            assert torch.equal(f.get_tensor("blocks.2/0/isolated"), tensors["blocks.2/0/isolated"])
        doc = dict(report_doc, checks=[failing.to_dict()] + report_doc["checks"][1:])
        report.write_all(doc, tmp_path)
        text = (tmp_path / "parity-report.html").read_text("utf-8")
        assert 'href="tensors/tiny-float32.safetensors"' in text
    finally:
        failing.extra.clear()
        failing.extra.update(saved)
    # a passing check saves nothing; neither does a failing one with no matching key
    assert report.save_failing_tensors(parity_results["passing"], tensors, tmp_path / "p") is None
    assert report.save_failing_tensors(failing.to_dict(), {"inp/0": torch.zeros(1)}, tmp_path / "q") is None


def test_save_failing_tensors_respects_byte_budget(parity_results: dict[str, Any], tmp_path: Path) -> None:
    d = parity_results["failing"].to_dict()
    path = report.save_failing_tensors(d, {"blocks.2/a": torch.zeros(10), "blocks.2/b": torch.zeros(1000)},
                                       tmp_path, max_bytes=100)
    with safe_open(str(path), framework="pt") as f:
        assert set(f.keys()) == {"blocks.2/a"} and "blocks.2/b" in f.metadata()["skipped_over_budget"]


def _plot_layers(errs: list[tuple[float, float]]) -> list[dict[str, Any]]:
    return [{"name": f"blocks.{i}", "iso_passed": True, "prop_passed": True,
             "metrics": {"level": 0, "budget_ratio": 10.0, "iso_err_ref": r, "iso_err_cand": c, "iso_rms_truth": 1.0,
                         "iso_ratio": (c / r) if r else 0.0}} for i, (r, c) in enumerate(errs)]


def test_zero_errors_are_marked_exact_not_plotted_at_the_floor() -> None:
    svg = report.svg_plot(_plot_layers([(1e-7, 1.1e-7), (0.0, 0.0), (1e-7, 1.2e-7), (2e-7, 2e-7)]), "iso",
                          None, None, "Isolated")
    band = re.search(r'<rect class="exact-band" x="[\d.]+" y="([\d.]+)" width="[\d.]+" height="([\d.]+)"', svg)
    assert band, "the plot has an exact band"
    top, bottom = float(band.group(1)), float(band.group(1)) + float(band.group(2))
    zeros = re.findall(r'<circle class="exact-zero" cx="[\d.]+" cy="([\d.]+)"', svg)
    assert len(zeros) == 2 and all(top <= float(y) <= bottom for y in zeros)
    # the log-scale series are broken at the zero: no line is drawn down to a floor
    for pts in re.findall(r'<polyline class="series-(?:ref|cand)" points="([^"]+)"', svg):
        assert all(float(p.split(",")[1]) <= top + 0.05 for p in pts.split())
    assert ">exact<title>" in svg


def test_x_labels_keep_full_names_as_titles_and_never_crowd() -> None:
    names = [f"model.layers.{i}.self_attn.q_proj" for i in range(120)]
    layers = _plot_layers([(1e-7, 1e-7)] * 120)
    for l, n in zip(layers, names):
        l["name"] = n
    svg = report.svg_plot(layers, "iso", names[77], None, "Isolated")
    labels = re.findall(r'<text class="xlabel" transform="translate\(([\d.]+),[\d.]+\) rotate\(-90\)"[^>]*>'
                        r'([^<]*)<title>([^<]*)</title>', svg)
    xs = sorted(float(x) for x, _, _ in labels)
    assert len(labels) >= 20 and all(b - a >= report.LABEL_PITCH - 0.05 for a, b in zip(xs, xs[1:]))
    assert names[77] in {t for _, _, t in labels}         # the culprit is always labelled
    assert all(t in names and (s == t or "…" in s) for _, s, t in labels)
    # a shortened label keeps the layer's index: the stack's members stay apart
    assert all(t.split(".")[2] in s.replace("…", "").split(".") for _, s, t in labels)


def test_every_failing_point_is_labelled_before_passing_blocks() -> None:
    """A failing point is ringed red; its name comes before the passing blocks' when labels must be
    thinned."""
    names = [f"model.layers.{i // 4}" + ("" if i % 4 == 0 else f".mlp.fc{i % 4}") for i in range(120)]
    layers = _plot_layers([(1e-7, 1e-7)] * 120)
    for i, (l, n) in enumerate(zip(layers, names)):
        l["name"], l["metrics"]["level"] = n, 0 if i % 4 == 0 else 1
    failing = [names[k] for k in (5, 41, 86)]
    for l in layers:
        if l["name"] in failing:
            l["iso_passed"] = l["passed"] = False
    svg = report.svg_plot(layers, "iso", None, None, "Isolated")
    titles = set(re.findall(r'<text class="xlabel"[^>]*>[^<]*<title>([^<]*)</title>', svg))
    assert set(failing) <= titles, sorted(set(failing) - titles)


def test_lm_metrics_render_as_a_table_without_python_values() -> None:
    lm = {"ppl": 12.5, "ppl_ref": 12.4, "ppl_truth": 12.4, "top1_agreement": 0.99, "flips": 3,
          "confident_flips": 1, "kl_mean": 1e-6, "kl_max": 2e-4, "top5_containment": 1.0,
          "generation": {"steps": 8, "first_divergent_step": [None, None], "exact_match_rows": 2},
          "first_confident_disagreement": {"batch": 0, "position": 3, "ref_token": 5, "cand_token": 9,
                                           "ref_margin": 0.4, "layer": None}}
    text = _lm_block(lm)
    assert "<td>perplexity</td>" in text and "top5 containment" in text
    assert "none (all 2 sequences match)" in text
    assert "None" not in text and "{" not in text and "[" not in text and "ppl=" not in text
    close = _lm_block({**lm, "ppl": 249.0271, "ppl_ref": 248.9598, "ppl_truth": 248.9601})
    assert all(v in close for v in ("249.0271", "248.9598", "248.9601"))   # the digits that differ show


def _page(**check: Any) -> str:
    """The report page of one check with these fields (the rest empty)."""
    return report.render_html({"checks": [{"name": "x", "dtype": "float32", "layers": [], "outputs": [], **check}]})


def _lm_block(lm: dict[str, Any]) -> str:
    """The LLM metrics of a check's section, as the page renders them."""
    text = _page(extra={"lm": lm})
    assert '<table class="lm">' in text
    return text.split('<table class="lm">', 1)[1].split("<h3>Environments</h3>", 1)[0]


def _env_block(ref: dict[str, Any], cand: dict[str, Any]) -> str:
    """The environments table of a check's section, as the page renders it."""
    return _page(reference_env=ref, candidate_env=cand).split("<h3>Environments</h3>", 1)[1].split("<h3>", 1)[0]


def test_a_check_without_verdict_is_an_error_in_html_and_csv(report_doc: dict[str, Any], tmp_path: Path) -> None:
    entry = {"test": "tests/test_m.py::test_m", "name": "m", "dtype": "float32", "passed": False, "kind": "model",
             "error": {"kind": "stale", "type": "GoldenStale", "path": "goldens/m/manifest.json",
                       "message": "stale golden goldens/m/manifest.json for 'm': the model's weights changed"},
             "golden": "goldens/m/manifest.json", "layers": [], "outputs": [], "extra": {}, "notes": []}
    doc = {**report_doc, "checks": report_doc["checks"] + [entry],
           "goldens": {**report_doc["goldens"], "stale": ["m"],
                       "withheld": [{"name": "n", "test": "t.py::t", "existed": True, "reason": "t.py::t failed"}]}}
    report.write_all(doc, tmp_path)
    text = (tmp_path / "parity-report.html").read_text("utf-8")
    assert "<title>rocm-parity report — 1 failing, 1 error</title>" in text
    assert "3 checks, 1 failing, 1 error" in text
    section = text.split('id="check-m-float32"', 1)[1].split("</section>", 1)[0]
    assert 'class="badge error">ERROR' in section and "the model&#x27;s weights changed" in section
    assert text.index('id="check-m-float32"') < text.index('id="check-tiny-float32"')   # errors first
    assert "<td>stale</td><td>m</td>" in text and "<td>not updated</td><td>n: t.py::t failed</td>" in text
    checks = pd.read_csv(tmp_path / "checks.csv").set_index("check")
    assert checks.loc["m", "error"] == "stale" and not checks.loc["m", "passed"]
    assert pd.isna(checks.loc["tiny", "error"])
    assert len(pd.read_csv(tmp_path / "layers.csv")) == sum(len(c["layers"]) + len(c["outputs"])
                                                            for c in report_doc["checks"])


def test_environment_flags_read_in_one_order_on_both_sides() -> None:
    """The SDPA flags of two environments, stored in different key orders, are listed in one order,
    and the row is marked different only where a value differs."""
    ref = {"sdpa": {"flash": True, "math": True, "mem_efficient": True}}
    same = {"sdpa": {"math": True, "mem_efficient": True, "flash": True}}
    cells = re.findall(r"<td>([^<]*)</td>", _env_block(ref, same))
    assert cells[1] == cells[2] == "flash yes; math yes; mem_efficient yes"
    assert 'class="diff"' not in _env_block(ref, same)
    assert 'class="diff"' in _env_block(ref, {"sdpa": {**same, "flash": False}})


class _ParentBug(torch.nn.Module):
    """Two linears; the parent's own code between them scales by ``factor`` (no module computes it)."""

    def __init__(self, factor: float = 1.0) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b, self.factor = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8), factor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x) * self.factor)


def test_a_fault_in_the_parents_code_is_located_in_the_html_and_not_called_drift(tmp_path: Path) -> None:
    from parity_models import capture_then_replay
    from pytest_rocm_parity.runner.engine import CheckSpec

    spec = CheckSpec(name="m", dtypes=["float32"])
    x = torch.randn(16, 8, generator=torch.Generator().manual_seed(2))
    res = capture_then_replay(_ParentBug, _ParentBug(1.05), x, spec)[0]   # the plain replay, no fixture
    assert not res.passed and res.culprit is None
    assert not any("accumulated drift" in n for n in res.notes), res.notes   # one jump, not drift
    report.write_all({"schema": 1, "checks": [res.to_dict()]}, tmp_path)
    html = (tmp_path / "parity-report.html").read_text()
    assert "the fault lies between a (last agreeing) and b (first divergent), in no module" in html


def test_a_cpus_environment_is_said_once_in_checks_csv(report_doc: dict[str, Any]) -> None:
    """A CPU's device name is its arch: the tables say it once, as the failure message does."""
    env = {"backend": "cpu", "device": "cpu", "device_name": "x86_64", "arch": "x86_64", "torch": "2.13.0+cpu"}
    doc = {**report_doc, "checks": [{**report_doc["checks"][0], "reference_env": env, "candidate_env": env}]}
    row = report.check_rows(doc)[0]
    assert row["reference"] == row["candidate"] == "cpu x86_64 torch 2.13.0+cpu"


def test_the_layer_tables_rel_to_ref_column_has_its_key_under_the_table(report_doc: dict[str, Any]) -> None:
    """The column the terminal's failure table calls rel->ref has that name here too, and a one-line key
    under each layer table says what it measures; a check with no layer table has no key."""
    import html

    text = report.render_html(report_doc)
    assert "<th>rel-&gt;ref</th>" in text and "rel to ref" not in text
    key = html.escape(report.rel_to_ref_legend(report.REL_TO_REF_RUN_HTML))
    assert text.count(key) == len(report_doc["checks"])
    tables = text.split("<h3>Layers</h3>")[1:]
    assert all(t.index("</table></div>") < t.index(key) < t.index("</details>") for t in tables)
    error = {"test": "t.py::t", "name": "m", "dtype": "float32", "passed": False, "layers": [], "outputs": [],
             "error": {"kind": "missing", "type": "GoldenMissing", "message": "no golden"}}
    assert "rel-&gt;ref =" not in report.render_html({"checks": [error]})


def test_a_failing_model_output_reads_failed_propagated_in_the_html(report_doc: dict[str, Any],
                                                                     tmp_path: Path) -> None:
    """A model output has only a propagated run: failing there, its row is a failure (as checks.csv
    counts it), not the drift a passing layer carries, and it shows no isolated budget."""
    report.write_all(report_doc, tmp_path)
    text = (tmp_path / "parity-report.html").read_text()
    row = re.search(r"<tr[^>]*><td class=\"num\">\d+</td><td><code>&lt;output&gt;\.0</code></td>.*?</tr>", text)
    assert row is not None
    cells = re.findall(r"<td[^>]*>(.*?)</td>", row.group(0))
    assert cells[3] == "FAIL propagated", cells
    assert cells[7] == "–" and float(cells[9]) == 3.0, cells   # budget (isolated): none; prop budget: 3


def test_a_run_that_did_not_judge_a_row_is_na_in_the_frame_and_layers_csv(parity_results: dict[str, Any],
                                                                          report_doc: dict[str, Any],
                                                                          tmp_path: Path) -> None:
    """Sub-modules have no propagated run and model outputs no isolated one: their run's verdict is
    NA, so a filter on it counts only the rows that run judged."""
    df = parity_results["failing"].to_frame()
    sub = df[df["layer"].str.count(r"\.") == 2]
    assert len(sub) and sub["prop_passed"].isna().all() and sub["iso_passed"].notna().all()
    out = df[df["kind"] == "output"]
    assert out["iso_passed"].isna().all() and not out["prop_passed"].any()
    drifted = df[df["prop_passed"] == False]   # noqa: E712 (a nullable column: NA rows drop out)
    assert set(drifted["layer"]) == {"blocks.2", "blocks.3", "norm", "head", "<output>.0"}
    report.write_all(report_doc, tmp_path)
    csv = pd.read_csv(tmp_path / "layers.csv")
    tiny = csv[csv["check"] == "tiny"].set_index("layer")
    assert pd.isna(tiny.loc["blocks.2.fc1", "prop_passed"]) and pd.isna(tiny.loc["<output>.0", "iso_passed"])


def test_a_non_finite_failure_says_so_in_its_rows_verdict(tmp_path: Path) -> None:
    """Ratios are computed on the finite elements, so a failure by NaN shows ratio 1 and z 0: the
    verdict cell names the non-finite values, in the failure table and the HTML."""
    from parity_models import tiny, tiny_inputs
    from pytest_rocm_parity.golden.store import GoldenStore
    from pytest_rocm_parity.judging.assertion import message
    from pytest_rocm_parity.runner.capture import capture
    from pytest_rocm_parity.runner.engine import CheckSpec
    from pytest_rocm_parity.runner.replay import replay

    def nan_at_0_1(mod: Any, args: Any, out: torch.Tensor) -> torch.Tensor:
        out = out.clone()
        out[0, 1] = float("nan")
        return out

    store, spec = GoldenStore(tmp_path / "g"), CheckSpec(name="nan", dtypes=["float32"])
    m = tiny()
    capture(m, tiny_inputs(), spec, store, "cpu")
    m.fc1.register_forward_hook(nan_at_0_1)
    (res,) = replay(m, tiny_inputs(), spec, store, "cpu")
    assert not res.passed and res.culprit == "fc1"
    text = message(res)
    assert "FAIL isolated; drift propagated (1 non-finite)  <- culprit" in text, text
    report.write_all({"schema": 1, "checks": [res.to_dict()]}, tmp_path / "r")
    html_text = (tmp_path / "r" / "parity-report.html").read_text()
    assert "<td>FAIL isolated; drift propagated (1 non-finite)</td>" in html_text


def test_the_failing_tensors_file_holds_the_reference_and_the_truth_beside_the_candidate(tmp_path: Path) -> None:
    """A failing leaf's file holds what the verdict compared: the candidate's output, the
    reference's and the float64 truth, so the ratio can be recomputed from the file alone."""
    from parity_models import tiny, tiny_inputs
    from pytest_rocm_parity.golden.store import GoldenStore
    from pytest_rocm_parity.runner.capture import capture
    from pytest_rocm_parity.runner.engine import CheckSpec
    from pytest_rocm_parity.runner.replay import replay

    store = GoldenStore(tmp_path / "g")
    spec = CheckSpec(name="scaled", dtypes=["float32"], report_dir=str(tmp_path / "r"))
    m = tiny()
    capture(m, tiny_inputs(), spec, store, "cpu")
    m.fc1.register_forward_hook(lambda mod, args, out: out * 1.05)
    (res,) = replay(m, tiny_inputs(), spec, store, "cpu")
    assert not res.passed and res.culprit == "fc1"
    with safe_open(str(tmp_path / "r" / res.extra["failing_tensors"]), framework="pt") as f:
        assert {"fc1/0/isolated", "fc1/0/reference", "fc1/0/isolated_truth"} <= set(f.keys())
        cand, ref, truth = (f.get_tensor(f"fc1/0/{k}") for k in ("isolated", "reference", "isolated_truth"))
    assert truth.dtype == torch.float64 and cand.shape == ref.shape == truth.shape
    ratio = (cand.double() - truth).norm() / (ref.double() - truth).norm()
    fc1 = next(l for l in res.layers if l.name == "fc1")
    assert fc1.iso is not None and float(ratio) == pytest.approx(fc1.iso.ratio, rel=1e-6)
