"""The terminal summary: a line per check (model, dtype, verdict, culprit) and the golden lists."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from pytest_rocm_parity.session import GoldenLog
from pytest_rocm_parity.reports.summary import summary_lines


def _session(results: list[dict[str, Any]], **goldens: Any) -> Any:
    log = GoldenLog(**{k: v for k, v in goldens.items()
                       if k in ("created", "updated", "missing", "corrupt", "stale", "kept", "withheld")})
    return SimpleNamespace(results=results, goldens=log, obsolete=goldens.get("obsolete", []),
                           pruned=goldens.get("pruned", []), options=SimpleNamespace(report_dir=Path("rep")),
                           reports_written=True)


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
    assert ("goldens obsolete (no check of this run uses them: their test is gone or checks other names; "
            "--parity-prune-obsolete deletes): old_model") in text
    assert "report: rep/parity-report.html" in text


def test_summary_empty_session_prints_nothing() -> None:
    assert summary_lines(_session([])) == []


def test_summary_obsolete_only_and_long_lists() -> None:
    names = [f"m{i}" for i in range(25)]
    text = "\n".join(summary_lines(_session([], obsolete=names)))
    assert "goldens obsolete" in text and "m19" in text and "m20" not in text and "(+5)" in text


ERROR_ENTRY = {"test": "tests/test_m.py::test_m", "name": "m", "dtype": "bfloat16,float32", "passed": False,
               "error": {"kind": "corrupt", "type": "GoldenCorrupt", "path": "goldens/m/float32-0.safetensors",
                         "message": "goldens/m/float32-0.safetensors: a git-lfs pointer,\nnot the tensors; git lfs pull"},
               "layers": [], "outputs": [], "extra": {}, "notes": []}


def test_an_error_is_listed_first_and_counted(report_doc: dict[str, Any]) -> None:
    lines = summary_lines(_session(report_doc["checks"] + [ERROR_ENTRY], corrupt=["m"]))
    checks = [l for l in lines[2:] if l.split(" ", 1)[0] in ("ERROR", "FAIL", "PASS")]
    assert [l.split()[:2] for l in checks] == [["ERROR", "m"], ["FAIL", "tiny"], ["PASS", "tiny_ok"]]
    at = lines.index(checks[0])
    assert lines[at + 1] == ("      golden corrupt: goldens/m/float32-0.safetensors: a git-lfs pointer, not the "
                             "tensors; git lfs pull")
    assert "[bfloat16,float32]" in checks[0]
    assert "3 checks: 1 passed, 1 failed, 1 error" in lines
    assert any(l.startswith("goldens corrupt (") and l.endswith("): m") for l in lines)


def test_goldens_not_written_say_which_test_failed() -> None:
    withheld = [{"name": "a", "test": "t.py::test_x", "existed": True, "reason": "t.py::test_x failed after the capture"},
                {"name": "b", "test": "t.py::test_x", "existed": True, "reason": "t.py::test_x failed after the capture"},
                {"name": "c", "test": "t.py::test_y", "existed": False,
                 "reason": "the run stopped before t.py::test_y finished"}]
    text = "\n".join(summary_lines(_session([], withheld=withheld)))
    assert ("goldens not updated (t.py::test_x failed after the capture; the goldens on disk are as they were; "
            "capture again once the test passes): a, b") in text
    assert ("goldens not created (the run stopped before t.py::test_y finished; nothing was written; capture again "
            "once the test passes): c") in text


def test_a_passing_check_names_its_undecided_layers(report_doc: dict[str, Any]) -> None:
    """A layer over budget on too few tokens to judge passes; the check's line says so without -v,
    and the notes that explain it follow with -v."""
    entry = {**report_doc["checks"][1], "extra": {"undecided": ["model.layers.0.mlp"]},
             "notes": ["model.layers.0.mlp: isolated error 27x the reference's"]}
    quiet = summary_lines(_session([entry]))
    line = next(l for l in quiet if l.startswith("PASS"))
    assert line.endswith("undecided: model.layers.0.mlp (over budget on too few tokens to judge; -v for the notes)")
    assert not any("note:" in l for l in quiet)
    loud = _session([entry])
    loud.config = SimpleNamespace(get_verbosity=lambda: 1)
    assert "     note: model.layers.0.mlp: isolated error 27x the reference's" in summary_lines(loud)


def test_the_tables_name_undecided_layers(report_doc: dict[str, Any]) -> None:
    """checks.csv lists them, layers.csv (and layer_frame) flags their rows."""
    from pytest_rocm_parity.judging.records import layer_rows
    from pytest_rocm_parity.reports.report import check_rows

    entry = {**report_doc["checks"][1], "extra": {"undecided": [report_doc["checks"][1]["layers"][0]["name"]]}}
    doc = {**report_doc, "checks": [entry]}
    assert check_rows(doc)[0]["undecided"] == entry["extra"]["undecided"][0]
    flags = [r["is_undecided"] for r in layer_rows(doc)]
    assert flags[0] is True and not any(flags[1:])


def test_an_error_refused_before_its_dtypes_shows_no_empty_brackets() -> None:
    """A check refused over its arguments (dtypes not given or not readable) lists no ``[]``."""
    entry = {**ERROR_ENTRY, "name": "phi", "dtype": ""}
    (line,) = [l for l in summary_lines(_session([entry])) if l.startswith("ERROR")]
    assert line.split() == ["ERROR", "phi"], line


def test_a_long_culprit_reason_is_cut_before_the_output_it_names() -> None:
    """The summary line cuts a long reason, but keeps its end, which output failed: a training
    culprit's "(output grad_input)" says which gradient to look at."""
    reason = ("isolated error 47.5x the reference's (>= 44.1x at 3 sigma; budget 1.75x; sign test z=+76.7) "
              "while its inputs held (output grad_input)")
    r = {"name": "t", "dtype": "float32", "passed": False, "culprit": "m.up", "test": "t.py::t",
         "layers": [{"name": "m.up", "metrics": {"reason": reason}}]}
    (line,) = [l for l in summary_lines(_session([r])) if l.startswith("FAIL")]
    assert line.endswith("… (output grad_input)"), line
    assert "culprit m.up: isolated error 47.5x" in line, line
