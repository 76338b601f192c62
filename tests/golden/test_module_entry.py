"""``python -m pytest_rocm_parity`` runs the same CLI as the ``rocm-parity`` entry point."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pytest_rocm_parity", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=120)


def test_python_m_gives_the_cli_help(tmp_path: Path) -> None:
    done = _run("--help", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "golden" in done.stdout and done.stdout.startswith("usage:")


def test_python_m_runs_a_golden_command(tmp_path: Path) -> None:
    """A subcommand's error is the CLI's own (exit status and message), not a missing __main__."""
    done = _run("golden", "derive", str(tmp_path / "nowhere"), "a", "--to", "b", cwd=tmp_path)
    assert done.returncode != 0
    assert "no such golden directory" in done.stderr + done.stdout
    assert "__main__" not in done.stderr
