"""Shared test setup.

torch (and the modules the plugin loads lazily) are imported here, once, because
pytester's in-process runs restore sys.modules afterwards and a second import of
torch's C extension in one process fails.
"""
from __future__ import annotations

from typing import Any

import torch  # noqa: F401
import torch._dynamo  # noqa: F401  (imports triton when installed: C extensions load once)
import torch.profiler  # noqa: F401

import pytest_rocm_parity.api  # noqa: F401
import pytest_rocm_parity.migration.backend  # noqa: F401
import pytest_rocm_parity.runner.engine  # noqa: F401
import pytest_rocm_parity.llm.lm  # noqa: F401
import pytest_rocm_parity.session  # noqa: F401
import pytest_rocm_parity.reports.profiling  # noqa: F401
import pytest_rocm_parity.reports.report  # noqa: F401
import pytest_rocm_parity.reports.summary  # noqa: F401
import pytest_rocm_parity.judging.assertion  # noqa: F401
import pytest_rocm_parity.migration.doctor  # noqa: F401
import pytest_rocm_parity.reports.html_extras  # noqa: F401

try:  # each in-process pytester run would otherwise re-import hypothesis (~5 s)
    import hypothesis  # noqa: F401
except ImportError:  # pragma: no cover
    pass

try:  # the families the in-process projects build: a modeling module first imported inside such a
    # run is dropped after it, and the next import makes a second copy of it and of the hub-kernel
    # registry it decorates its layers with, whose globals Dynamo's guards then cannot find
    import transformers.models.gpt2.modeling_gpt2  # noqa: F401
    import transformers.models.llama.modeling_llama  # noqa: F401
    import transformers.models.qwen2.modeling_qwen2  # noqa: F401
except ImportError:  # pragma: no cover
    pass

try:
    import transformers  # noqa: F401
except ImportError:  # pragma: no cover - the lm extra is optional
    pass

pytest_plugins = ["pytester"]


import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _no_ci_guard(monkeypatch: pytest.MonkeyPatch) -> None:
    """CI sets CI=true, which makes capture refuse to write; tests that capture say so themselves.

    The one test of that guard sets CI again explicitly (tests/plugin/test_option_mode.py).
    """
    monkeypatch.delenv("CI", raising=False)


@pytest.fixture
def set_torch_flag() -> Any:
    """Set a torch.backends flag for one test and restore it afterwards.

    monkeypatch cannot do this on every pytest: torch.backends.cuda.matmul is a module object with
    dynamic attributes, and pytest 9.2's monkeypatch fails to restore it at teardown, which then
    leaves the test's other patches (torch.cuda.is_available) in place for the rest of the run.
    """
    saved: list[tuple[Any, str, Any]] = []

    def setter(obj: Any, name: str, value: Any) -> None:
        saved.append((obj, name, getattr(obj, name)))
        setattr(obj, name, value)

    yield setter
    for obj, name, old in reversed(saved):
        setattr(obj, name, old)


@pytest.fixture
def parity_project(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Factory: a pytester project from a conftest and test files, with the bug-switch variable unset."""

    def make(conftest: str, switch: str, **files: str) -> pytest.Pytester:
        monkeypatch.delenv(switch, raising=False)
        pytester.makeconftest(conftest)
        pytester.makepyfile(**files)
        return pytester

    return make
