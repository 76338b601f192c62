"""The table route: CheckResult.to_frame / layer_frame (pandas), CSV files, the text printer, atomic writes."""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

import pytest_rocm_parity
from pytest_rocm_parity.atomic import atomic_write
from pytest_rocm_parity.reports.report import write_all
from pytest_rocm_parity.tables import text_table


def test_to_frame_has_one_row_per_layer_in_the_columns_of_layers_csv(parity_results: dict[str, Any]) -> None:
    failing = parity_results["failing"]
    df = failing.to_frame()
    assert isinstance(df, pd.DataFrame)
    layers = df[df["kind"] == "layer"]
    assert layers["layer"].tolist() == [l.name for l in failing.layers]
    assert len(df) == len(failing.layers) + len(failing.outputs)
    for col in ("level", "primary", "passed", "iso_ratio", "iso_ratio_lo", "iso_z", "budget_ratio", "prop_ratio",
                "reason", "is_culprit"):
        assert col in df.columns
    culprit = df[df["is_culprit"]]
    assert culprit["layer"].tolist() == ["blocks.2"]
    row = culprit.iloc[0]
    assert not row["iso_passed"] and row["iso_ratio"] > row["budget_ratio"] and row["iso_ratio_lo"] <= row["iso_ratio"]
    assert row["reason"]
    # the frame answers the usual questions directly
    worst = df.sort_values("iso_ratio", ascending=False).iloc[0]
    assert worst["layer"] == "blocks.2"
    assert parity_results["passing"].to_frame()["passed"].all()


def test_the_columns_do_not_depend_on_the_results(parity_results: dict[str, Any], tmp_path: Path) -> None:
    """A passing check has the failing one's columns (``reason`` among them), in the same order, so
    code written against one run's frame or CSV reads the next."""
    passing, failing = parity_results["passing"].to_frame(), parity_results["failing"].to_frame()
    assert list(passing.columns) == list(failing.columns)
    assert passing["reason"].isna().all() or (passing["reason"] == "").all()
    write_all({"checks": [parity_results["passing"].to_dict()]}, tmp_path)
    assert list(pd.read_csv(tmp_path / "layers.csv").columns) == list(failing.columns)


def test_layer_frame_from_the_package_root_matches_layers_csv(report_doc: dict[str, Any], tmp_path: Path,
                                                             parity_results: dict[str, Any]) -> None:
    written = write_all(report_doc, tmp_path)
    assert "html" in written
    (tmp_path / "parity-report.json").write_text(json.dumps(report_doc), encoding="utf-8")
    from_path = pytest_rocm_parity.layer_frame(tmp_path / "parity-report.json")
    assert pytest_rocm_parity.layer_frame(tmp_path).equals(from_path)   # the --parity-report folder itself
    with pytest.raises(pytest_rocm_parity.InvalidArgument, match="no such file; name a --parity-report folder"):
        pytest_rocm_parity.layer_frame(tmp_path / "elsewhere")
    (tmp_path / "not-a-report.json").write_text("{", encoding="utf-8")
    with pytest.raises(pytest_rocm_parity.InvalidArgument, match="not a parity report"):
        pytest_rocm_parity.layer_frame(tmp_path / "not-a-report.json")
    csv = pd.read_csv(tmp_path / "layers.csv")
    assert list(from_path.columns) == list(csv.columns)
    assert from_path["layer"].tolist() == csv["layer"].tolist()
    assert csv.loc[csv["is_culprit"], "layer"].tolist() == ["blocks.2"]
    one = pytest_rocm_parity.layer_frame(parity_results["failing"])
    assert one.equals(parity_results["failing"].to_frame())
    assert set(one.columns) <= set(csv.columns)   # one schema: a result's frame is its rows of layers.csv
    # CSV files are committed whole: no temporary file is left beside them
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]


def test_root_exports_stay_lazy() -> None:
    code = ("import sys, pytest_rocm_parity as p; assert 'layer_frame' in p.__all__; f = p.layer_frame;"
            "print(sorted(m for m in ('torch', 'pandas') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_text_table_aligns_styles_and_passes_notes_through() -> None:
    rows = [("a", "1.5", "ok"), "  a note that never widens a column", ("longer-name", "12.25", "FAIL")]
    lines = text_table(rows, ("name", "ratio", "verdict"), right=[1], rule=True, indent="  ",
                       style=lambda i, c, cell: cell.upper() if i == 1 and c == 2 else cell)
    assert lines == [
        "  name         ratio  verdict",
        "  -----------  -----  -------",
        "  a              1.5  ok",
        "  a note that never widens a column",
        "  longer-name  12.25  FAIL",
    ]
    fixed = text_table([("x", "overflowing", "y")], widths=(3, 4, None), sep=" ")
    assert fixed == ["x   overflowing y"]


def test_atomic_write_keeps_the_old_file_on_failure(tmp_path: Path) -> None:
    target = tmp_path / "out.json"
    atomic_write(target, '{"a": 1}')
    assert target.read_text() == '{"a": 1}'
    assert stat.S_IMODE(target.stat().st_mode) & 0o044 == 0o044 & ~_umask()   # readable as open() makes it

    def broken(tmp: Path) -> None:
        tmp.write_text("half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic_write(target, broken)
    assert target.read_text() == '{"a": 1}'
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]
    atomic_write(target, b"bytes", durable=True)
    assert target.read_bytes() == b"bytes"


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
