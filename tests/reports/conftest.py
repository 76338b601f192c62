from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from parity_models import block_stack

# imported once here: pytester's in-process runs restore sys.modules, and C extensions
# (pandas, safetensors) must not be imported a second time in one process
import pandas  # noqa: F401
import safetensors.torch  # noqa: F401
import torch.profiler  # noqa: F401

import pytest_rocm_parity.reports.inspect_cmd  # noqa: F401
import pytest_rocm_parity.reports.profiling  # noqa: F401
import pytest_rocm_parity.reports.report  # noqa: F401
import pytest_rocm_parity.reports.summary  # noqa: F401


def _capture_replay(root: Path, name: str, bug_block: int | None, golden_dir: str = "goldens") -> list[Any]:
    from pytest_rocm_parity.runner.capture import capture
    from pytest_rocm_parity.runner.engine import CheckSpec
    from pytest_rocm_parity.runner.replay import replay
    from pytest_rocm_parity.golden.store import GoldenStore

    store = GoldenStore(root / golden_dir)
    spec = CheckSpec(name=name, test=f"tests/test_{name}.py::test_{name}", dtypes=["float32"])
    m, x = block_stack()
    if not store.exists(name):
        capture(m, x, spec, store, "cpu")
    if bug_block is not None:
        m.blocks[bug_block].bug = True
    results = replay(m, x, spec, store, "cpu")
    for r in results:
        r.test = spec.test
    return results


@pytest.fixture(scope="session")
def parity_results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Real CheckResults: one failing (bug planted in blocks.2), one passing; and their golden dir."""
    root = tmp_path_factory.mktemp("engine")
    failing = _capture_replay(root, "tiny", bug_block=2)[0]
    passing = _capture_replay(root, "tiny_ok", bug_block=None)[0]
    # what a CUDA reference and a ROCm candidate would have recorded
    failing.reference_env = {**failing.reference_env, "backend": "cuda", "cuda": "12.4", "device_name": "NVIDIA H100"}
    failing.candidate_env = {**failing.candidate_env, "backend": "rocm", "hip": "6.2",
                             "device_name": "AMD Instinct MI300X"}
    failing.extra["profile"] = [{"op": "aten::mm", "ref_share": 0.10, "cand_share": 0.78, "growth": 7.8,
                                 "factor": 2.0, "note": ""}]
    return {"failing": failing, "passing": passing, "root": root}


@pytest.fixture
def report_doc(parity_results: dict[str, Any]) -> dict[str, Any]:
    checks = [parity_results["failing"].to_dict(), parity_results["passing"].to_dict()]
    return {"schema": 1, "checks": checks,
            "goldens": {"created": [], "updated": [], "missing": ["absent_model"], "kept": [],
                        "used": ["tiny", "tiny_ok"], "obsolete": ["old_model"], "pruned": []}}
