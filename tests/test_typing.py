"""The package type-checks: hints are part of how this code is written (docs/architecture.md),
and a hint that has drifted from the code is a wrong comment.

Checked here against our own code only (--no-site-packages: torch, numpy and the rest count as
untyped), so a new release of a dependency's type stubs cannot fail a CI run that changed nothing
of ours; mypy itself is pinned in the test extra for the same reason. The full check, with the
dependencies' types, is `mypy pytest_rocm_parity` (settings in pyproject.toml): clean when this
test was written, worth running before a release."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


def test_the_package_type_checks(tmp_path: Path) -> None:
    pytest.importorskip("mypy")
    root = Path(__file__).resolve().parents[1]
    p = subprocess.run([sys.executable, "-m", "mypy", "--no-site-packages", "--ignore-missing-imports",
                        "--cache-dir", str(tmp_path), "pytest_rocm_parity"],
                       cwd=root, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]
