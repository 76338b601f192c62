"""pytest-rocm-parity: per-layer numerical parity of PyTorch models across backends.

Importing this package must stay cheap: pytest imports the plugin (and so this
``__init__``) in every run of every project where it is installed.  Heavy names
are therefore resolved lazily through PEP 562 ``__getattr__``.
"""
from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "Tolerance": "pytest_rocm_parity.tolerance",
    "Parity": "pytest_rocm_parity.api",
    "CheckResult": "pytest_rocm_parity.records",
    "LayerRecord": "pytest_rocm_parity.records",
    "ParityError": "pytest_rocm_parity.errors",
    "layer_frame": "pytest_rocm_parity.tables",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'pytest_rocm_parity' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
