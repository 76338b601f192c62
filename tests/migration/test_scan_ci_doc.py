"""The scan job of docs/ci.md: it installs the CPU build of torch before the plugin."""
from __future__ import annotations

import re
from pathlib import Path

CI_DOC = (Path(__file__).resolve().parents[2] / "docs" / "ci.md").read_text("utf-8")


def _scan_job_steps() -> list[str]:
    """The `run:` commands of the workflow's `scan:` job, in order."""
    job = re.search(r"^  scan:.*?(?=^  \S|^```)", CI_DOC, re.S | re.M)
    assert job is not None, "docs/ci.md has no scan job"
    return [m.group(1).split("#")[0].strip() for m in re.finditer(r"^\s+- run: (.*)$", job.group(0), re.M)]


def test_the_scan_job_installs_cpu_torch_before_the_plugin() -> None:
    """torch is a hard dependency: installing the plugin first pulls PyPI's torch, the multi-GB CUDA build."""
    steps = _scan_job_steps()
    plugin = next(i for i, s in enumerate(steps) if "pytest-rocm-parity" in s)
    torch = [i for i, s in enumerate(steps)
             if re.fullmatch(r"pip install torch --index-url https://download\.pytorch\.org/whl/cpu", s)]
    assert torch and torch[0] < plugin, steps
    assert any(s.startswith("rocm-parity scan") for s in steps[plugin:])
