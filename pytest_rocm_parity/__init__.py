"""pytest-rocm-parity: per-layer numerical parity of PyTorch models across backends.

Importing this package must stay cheap: pytest imports the plugin (and so this
``__init__``) in every run of every project where it is installed.  Heavy names
are therefore resolved lazily through PEP 562 ``__getattr__``.
"""
from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

# The public API: everything the README and docs/ tell users to import, from the package root.
# Anything else is internal and may move.
_LAZY = {
    # results and the judging policy
    "Tolerance": "pytest_rocm_parity.judging.tolerance",
    "CheckResult": "pytest_rocm_parity.judging.records",
    "LayerRecord": "pytest_rocm_parity.judging.records",
    "layer_frame": "pytest_rocm_parity.reports.report",
    # the pytest fixture's object, and the plain core that works without pytest
    "Parity": "pytest_rocm_parity.api",
    "CheckSpec": "pytest_rocm_parity.runner.engine",
    "GoldenStore": "pytest_rocm_parity.golden.store",
    "capture": "pytest_rocm_parity.runner.capture",
    "replay": "pytest_rocm_parity.runner.replay",
    "capture_train": "pytest_rocm_parity.runner.train",
    "replay_train": "pytest_rocm_parity.runner.train",
    # operator fuzzing and Triton cross-compilation
    "compare_op": "pytest_rocm_parity.fuzz.harness",
    "check_op": "pytest_rocm_parity.fuzz.harness",
    "OpResult": "pytest_rocm_parity.fuzz.harness",
    "record_golden": "pytest_rocm_parity.fuzz.harness",
    "load_golden": "pytest_rocm_parity.fuzz.harness",
    "replay_golden": "pytest_rocm_parity.fuzz.harness",
    "ErrorModel": "pytest_rocm_parity.fuzz.harness",
    "assert_compiles_for": "pytest_rocm_parity.fuzz.triton_targets",
    "compile_for": "pytest_rocm_parity.fuzz.triton_targets",
    # FP8 quantization (docs/fp8.md)
    "Fp8Linear": "pytest_rocm_parity.quant.fp8",
    "quantize_model": "pytest_rocm_parity.quant.fp8",
    "convert_to_fnuz": "pytest_rocm_parity.quant.fp8",
    "ocp_to_fnuz": "pytest_rocm_parity.quant.fp8",
    "native_fp8_family": "pytest_rocm_parity.quant.formats",
    # reports
    "save_failing_tensors": "pytest_rocm_parity.reports.report",
    "profile_shares": "pytest_rocm_parity.reports.profiling",
    "compare_shares": "pytest_rocm_parity.reports.profiling",
    # errors: every one the plugin raises (docs/reliability.md), for except clauses and pytest.raises
    **{name: "pytest_rocm_parity.errors" for name in (
        "ParityError", "BackwardError", "InvalidArgument", "InputError", "LayerSelectionError", "DuplicateCheckName",
        "GoldenError", "GoldenMissing", "GoldenCorrupt", "GoldenTooNew", "GoldenStale", "GoldenExists",
        "GoldenWriteError", "WriteForbidden", "ReferenceChange", "BackendUnavailable", "CaptureError")},
}
# modules users import whole (``from pytest_rocm_parity import strategies as S``)
_MODULES = {"strategies": "pytest_rocm_parity.fuzz.strategies"}

__all__ = ["__version__", *_LAZY, *_MODULES]


def __getattr__(name: str) -> Any:
    import importlib

    if name in _MODULES:
        return importlib.import_module(_MODULES[name])
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'pytest_rocm_parity' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    """The public API, for dir() and tab completion (the lazy names are not module attributes)."""
    return sorted(set(globals()) | set(__all__))
