"""The package type-checks: hints are part of how this code is written (docs/architecture.md),
and a hint that has drifted from the code is a wrong comment. mypy's settings are in pyproject.toml
(third-party packages without type information are skipped there); the version is pinned in the
test extra, since a newer mypy may judge the same code differently."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


def test_the_package_type_checks(tmp_path: Path) -> None:
    pytest.importorskip("mypy")
    root = Path(__file__).resolve().parents[1]
    p = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path), "pytest_rocm_parity"],
                       cwd=root, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]
